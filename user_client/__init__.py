"""User role: chat REPL, local OpenAI-compatible gateway, and the relay every user runs."""
