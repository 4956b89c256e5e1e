"""Layer 1: what crosses the network and what every node is (codec, messages, crypto, identity,
clock, failure codes, shared constants). Imports nothing above it."""
