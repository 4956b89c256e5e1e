"""Verifier role: the BFT committee on CometBFT that scores model nodes and keeps reputations."""
