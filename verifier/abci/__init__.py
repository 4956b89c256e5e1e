"""CometBFT's ABCI 2.0 socket protocol: generated types, framing, and the server."""
