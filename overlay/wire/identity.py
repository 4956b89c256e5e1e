"""Node identity: an Ed25519 signing key and an X25519 key, kept in ``--data-dir``.

The node id is ``BLAKE2b-160(Ed25519 public key)`` (personalised), so anyone
holding the public key can check an id, and the id is short enough to log.
Keys are created on first start and stored in ``identity.key`` with mode
0600 inside a 0700 directory; a key file readable by others is refused.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from overlay.wire import crypto

NODE_ID_LEN = 20
ID_PERSON = b"gentorrent-id"  # node id = BLAKE2b-160(ed25519 key), personalised with this
_KEY_FILE = "identity.key"
_MAGIC = b"GTID1\n"


class IdentityError(Exception):
    """The identity file is missing, corrupt or unsafe."""


def node_id_of(ed25519_public: bytes) -> bytes:
    """The node id derived from an Ed25519 public key."""
    if len(ed25519_public) != crypto.ED25519_PK_LEN:
        raise ValueError("Ed25519 public key must be 32 bytes")
    return crypto.blake2b(ed25519_public, size=NODE_ID_LEN, person=ID_PERSON)


def short_id(node_id: bytes) -> str:
    """First 8 hex digits: for logs and tables."""
    return node_id.hex()[:8]


@dataclass(frozen=True, slots=True)
class Identity:
    signing: crypto.SigningKey
    x25519: crypto.X25519Key

    @property
    def ed25519_public(self) -> bytes:
        return self.signing.public_bytes

    @property
    def x25519_public(self) -> bytes:
        return self.x25519.public_bytes

    @property
    def node_id(self) -> bytes:
        return node_id_of(self.signing.public_bytes)

    @classmethod
    def generate(cls) -> Identity:
        return cls(crypto.SigningKey.generate(), crypto.X25519Key.generate())

    def sign(self, message: bytes) -> bytes:
        return self.signing.sign(message)

    def to_bytes(self) -> bytes:
        return _MAGIC + self.signing.private_bytes() + self.x25519.private_bytes()

    @classmethod
    def from_bytes(cls, raw: bytes) -> Identity:
        if len(raw) != len(_MAGIC) + 64 or not raw.startswith(_MAGIC):
            raise IdentityError("identity file is corrupt (wrong length or header)")
        body = raw[len(_MAGIC) :]
        return cls(crypto.SigningKey.from_bytes(body[:32]), crypto.X25519Key.from_bytes(body[32:]))


def load_or_create(data_dir: str | os.PathLike[str]) -> Identity:
    """Load the identity in ``data_dir``, creating the directory and keys on first start."""
    d = Path(data_dir)
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = d / _KEY_FILE
    if path.exists():
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise IdentityError(
                f"{path} is readable by other users (mode {mode:o}); run: chmod 600 {path}"
            )
        return Identity.from_bytes(path.read_bytes())
    ident = Identity.generate()
    write_private(path, ident.to_bytes())
    return ident


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically and privately: a temporary file beside it, mode 0600
    (set again on the descriptor: a leftover temporary file from a crash keeps its old mode
    otherwise), every byte written and fsynced, renamed over ``path``, the directory fsynced (made
    with mode 0700 if missing). Keys, a verifier's state, its audit plan and donation pool."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
