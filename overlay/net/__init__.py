"""Layer 2: authenticated links (transport, handshake, node, peer entries). Imports only
:mod:`overlay.wire`."""
