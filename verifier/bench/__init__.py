"""Benchmarks of the verifier committee."""
