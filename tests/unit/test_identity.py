"""Node identity: stable across restarts, stored 0600, refused when others can read it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from overlay.wire import crypto
from overlay.wire.identity import NODE_ID_LEN, Identity, IdentityError, load_or_create, node_id_of, short_id


def test_identity_survives_a_restart(tmp_path: Path) -> None:
    first = load_or_create(tmp_path / "node")
    second = load_or_create(tmp_path / "node")
    assert first.node_id == second.node_id
    assert first.x25519_public == second.x25519_public
    assert len(first.node_id) == NODE_ID_LEN


def test_key_file_is_private(tmp_path: Path) -> None:
    load_or_create(tmp_path / "node")
    key = tmp_path / "node" / "identity.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "node").stat().st_mode) & 0o077 == 0
    assert not (tmp_path / "node" / "identity.key.tmp").exists()


def test_key_file_is_private_even_with_a_leftover_tmp_file(tmp_path: Path) -> None:
    """A crash can leave identity.key.tmp behind with any mode; the new key must still be 0600."""
    d = tmp_path / "node"
    d.mkdir(mode=0o700)
    leftover = d / "identity.key.tmp"
    leftover.write_bytes(b"junk")
    leftover.chmod(0o644)
    load_or_create(d)
    assert stat.S_IMODE((d / "identity.key").stat().st_mode) == 0o600


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o666])
def test_key_readable_by_others_is_refused(tmp_path: Path, mode: int) -> None:
    load_or_create(tmp_path / "node")
    key = tmp_path / "node" / "identity.key"
    key.chmod(mode)
    with pytest.raises(IdentityError) as ei:
        load_or_create(tmp_path / "node")
    msg = str(ei.value)
    assert str(key) in msg and f"{mode:o}" in msg and "chmod 600" in msg


def test_corrupt_key_file_is_refused(tmp_path: Path) -> None:
    load_or_create(tmp_path / "node")
    key = tmp_path / "node" / "identity.key"
    key.write_bytes(key.read_bytes()[:-1])
    with pytest.raises(IdentityError, match="corrupt"):
        load_or_create(tmp_path / "node")
    key.write_bytes(b"X" * 70)
    with pytest.raises(IdentityError, match="corrupt"):
        load_or_create(tmp_path / "node")


def test_node_id_is_derived_from_the_signing_key() -> None:
    ident = Identity.generate()
    assert ident.node_id == node_id_of(ident.ed25519_public)
    assert Identity.from_bytes(ident.to_bytes()).node_id == ident.node_id
    assert short_id(ident.node_id) == ident.node_id.hex()[:8]
    other = Identity.generate()
    assert other.node_id != ident.node_id
    with pytest.raises(ValueError):
        node_id_of(b"short")


def test_signatures_verify_under_the_identity_key() -> None:
    ident = Identity.generate()
    sig = ident.sign(b"message")
    crypto.ed25519_verify(ident.ed25519_public, sig, b"message")
    with pytest.raises(crypto.CryptoError):
        crypto.ed25519_verify(ident.ed25519_public, sig, b"massage")


def test_data_dir_is_created_private(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        load_or_create(tmp_path / "a" / "b")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a" / "b").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "a" / "b" / "identity.key").stat().st_mode) == 0o600
