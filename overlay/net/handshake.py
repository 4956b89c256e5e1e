"""Proof of identity after TLS (I/O-free).

TLS authenticates the *server*: its self-signed certificate carries its Ed25519
identity key, and the dialer pins that key to the node id it expected (see
docs/decisions/0001-tls-identity-pinning.md). The *dialer* has no certificate;
it proves its id by signing ::

    AUTH_CONTEXT || channel_binding || server_nonce

where ``channel_binding`` is SHA-256 of the server's certificate as the dialer
saw it. A man in the middle that terminates TLS with its own certificate
yields a different binding, so the proof it relays fails at the real server.
"""

from __future__ import annotations

from overlay.wire import crypto
from overlay.wire.identity import Identity, node_id_of
from overlay.wire.messages import AuthProof

AUTH_CONTEXT = b"gentorrent/auth/v1\x00"


class AuthError(Exception):
    """Authentication failed; the message says which check and which peer."""


def _signed_bytes(binding: bytes, nonce: bytes) -> bytes:
    return AUTH_CONTEXT + binding + nonce


def make_proof(identity: Identity, binding: bytes, nonce: bytes) -> AuthProof:
    return AuthProof(
        ed25519_public=identity.ed25519_public,
        x25519_public=identity.x25519_public,
        signature=identity.sign(_signed_bytes(binding, nonce)),
    )


def check_proof(proof: AuthProof, binding: bytes, nonce: bytes) -> bytes:
    """The dialer's node id if ``proof`` is valid for this binding and nonce."""
    try:
        crypto.ed25519_verify(proof.ed25519_public, proof.signature, _signed_bytes(binding, nonce))
    except crypto.CryptoError:
        raise AuthError(
            f"dialer claiming id {node_id_of(proof.ed25519_public).hex()[:8]} failed to prove it "
            "(signature over the nonce and our certificate does not verify)"
        ) from None
    return node_id_of(proof.ed25519_public)


def check_pinned(server_public: bytes, expected_id: bytes | None) -> bytes:
    """The server's node id; :class:`AuthError` if it is not ``expected_id``."""
    got = node_id_of(server_public)
    if expected_id is not None and got != expected_id:
        raise AuthError(
            f"dialed node {expected_id.hex()[:8]} but its certificate is for node {got.hex()[:8]}"
        )
    return got
