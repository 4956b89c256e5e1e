"""Layer 3: the anonymity protocol (onion paths, relays, S-IDA, sealing, signed replies, the
user's :mod:`~overlay.anon.client` and the model node's :mod:`~overlay.anon.responder`). Imports
only :mod:`overlay.wire` and :mod:`overlay.net`."""
