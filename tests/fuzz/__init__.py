"""Fuzzing every listener (issue 15 item 8): hostile input to every entry point of every role.

``mutate`` makes inputs, ``targets`` defines what each entry point must do with them,
``test_fuzz`` runs them in CI (a short, derandomized run), ``python -m tests.fuzz`` runs them
long. docs/fuzzing.md lists the entry points and their contracts.
"""
