"""The shared substrate: identity and crypto, wire codec, authenticated transport, nodes.

Imports no role package (``user_client``, ``model_node``, ``verifier``).
"""
