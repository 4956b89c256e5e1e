"""Proof of identity after TLS (the I/O-free core of the handshake)."""

from __future__ import annotations

import pytest

from overlay.net import handshake
from overlay.net.handshake import AUTH_CONTEXT, AuthError, check_pinned, check_proof, make_proof
from overlay.wire import codec, crypto
from overlay.wire.identity import Identity, short_id
from overlay.wire.messages import AuthProof

BINDING = crypto.sha256(b"server certificate DER")
NONCE = bytes(range(32))


def test_valid_proof_names_the_dialer() -> None:
    dialer = Identity.generate()
    proof = make_proof(dialer, BINDING, NONCE)
    assert check_proof(proof, BINDING, NONCE) == dialer.node_id
    assert proof.x25519_public == dialer.x25519_public
    assert codec.decode(codec.encode(proof)) == proof  # it fits its wire message


def test_signature_covers_context_binding_and_nonce() -> None:
    dialer = Identity.generate()
    proof = make_proof(dialer, BINDING, NONCE)
    crypto.ed25519_verify(dialer.ed25519_public, proof.signature, AUTH_CONTEXT + BINDING + NONCE)


def test_proof_over_another_channel_binding_fails() -> None:
    """A man in the middle terminating TLS sees another certificate, hence another binding."""
    dialer = Identity.generate()
    relayed = make_proof(dialer, crypto.sha256(b"the MITM's certificate"), NONCE)
    with pytest.raises(AuthError, match="failed to prove") as ei:
        check_proof(relayed, BINDING, NONCE)
    assert short_id(dialer.node_id) in str(ei.value)


def test_replayed_proof_for_another_nonce_fails() -> None:
    proof = make_proof(Identity.generate(), BINDING, NONCE)
    with pytest.raises(AuthError):
        check_proof(proof, BINDING, bytes(32))


def test_bad_signature_fails() -> None:
    proof = make_proof(Identity.generate(), BINDING, NONCE)
    bad = AuthProof(proof.ed25519_public, proof.x25519_public, bytes([proof.signature[0] ^ 1]) + proof.signature[1:])
    with pytest.raises(AuthError):
        check_proof(bad, BINDING, NONCE)


def test_claiming_another_key_fails() -> None:
    victim, attacker = Identity.generate(), Identity.generate()
    own = make_proof(attacker, BINDING, NONCE)
    forged = AuthProof(victim.ed25519_public, attacker.x25519_public, own.signature)
    with pytest.raises(AuthError) as ei:
        check_proof(forged, BINDING, NONCE)
    assert short_id(victim.node_id) in str(ei.value)


def test_invalid_public_key_fails_cleanly() -> None:
    proof = AuthProof(b"\xff" * 32, b"\0" * 32, b"\0" * 64)
    with pytest.raises(AuthError):
        check_proof(proof, BINDING, NONCE)


def test_pinning() -> None:
    server, other = Identity.generate(), Identity.generate()
    assert check_pinned(server.ed25519_public, server.node_id) == server.node_id
    assert check_pinned(server.ed25519_public, None) == server.node_id
    with pytest.raises(AuthError) as ei:
        check_pinned(server.ed25519_public, other.node_id)
    msg = str(ei.value)
    assert short_id(other.node_id) in msg and short_id(server.node_id) in msg


def test_context_is_versioned_and_terminated() -> None:
    assert handshake.AUTH_CONTEXT.startswith(b"gentorrent/auth/")
    assert handshake.AUTH_CONTEXT.endswith(b"\x00")
