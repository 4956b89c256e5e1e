"""The shared substrate, in layers; each imports only the layers below it (tests/unit/test_layering.py):

- :mod:`overlay.wire`: what crosses the network and what every node is: the codec and messages,
  crypto, identities, the clock, failure codes, the directory's shared numbers;
- :mod:`overlay.net`: authenticated links: transport (TLS, in-memory), the handshake, a node
  with its connection slots, peer entries;
- :mod:`overlay.anon`: the anonymity protocol: onion paths, relays, S-IDA cloves, sealing,
  signed replies, the user's request client and the model node's responder;
- :mod:`overlay.directory`: the committee's client side: registration, signed lists,
  membership, users' donations;
- :mod:`overlay.usernode` (a user node: relay plus client) and :mod:`overlay.testing` (the test kit).

Imports no role package (``user_client``, ``model_node``, ``verifier``) and nothing of
``gentorrent`` (the command line and the whole-network tools).
"""
