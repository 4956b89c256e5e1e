"""Sealed boxes for cloves, and size padding (I/O-free).

- :func:`seal_to` / :func:`open_sealed`: a request clove sealed to the model
  node's X25519 key (one ephemeral exchange per clove). Relays and proxies see
  only random-looking bytes, so they cannot link cloves of one message by
  message id, index or fingerprints (DESIGN.md, "Anonymous overlay").
- :class:`ReturnKey`: a reply clove sealed with a per-request, per-path key the
  user put in its request; an 8-byte tag lets the user find the key at once.
- :func:`pad` / :func:`unpad`: plaintexts are padded to power-of-two buckets
  (≥ 256 B) so cell sizes reveal only a coarse size class.
"""

from __future__ import annotations

from overlay.wire import crypto

_SEAL_INFO = b"gentorrent/seal/v1"
_ZERO_NONCE = bytes(crypto.AEAD_NONCE_LEN)
TAG_LEN = 8
MIN_BUCKET = 256


class SealError(Exception):
    """A sealed box did not open (not for us, or tampered with)."""


def pad(data: bytes) -> bytes:
    need = len(data) + 4
    size = MIN_BUCKET
    while size < need:
        size *= 2
    return len(data).to_bytes(4, "big") + data + bytes(size - need)


def unpad(data: bytes) -> bytes:
    if len(data) < 4:
        raise SealError("padded block too short")
    n = int.from_bytes(data[:4], "big")
    if n > len(data) - 4:
        raise SealError("padded length exceeds the block")
    return data[4 : 4 + n]


def seal_to(recipient_x25519: bytes, plaintext: bytes) -> bytes:
    eph = crypto.X25519Key.generate()
    key = crypto.hkdf(eph.exchange(recipient_x25519), salt=eph.public_bytes + recipient_x25519, info=_SEAL_INFO)
    return eph.public_bytes + crypto.Aead(key).seal(_ZERO_NONCE, pad(plaintext))


def open_sealed(key: crypto.X25519Key, sealed: bytes) -> bytes:
    if len(sealed) < 32 + crypto.AEAD_TAG_LEN:
        raise SealError("sealed box too short")
    eph = sealed[:32]
    try:
        k = crypto.hkdf(key.exchange(eph), salt=eph + key.public_bytes, info=_SEAL_INFO)
        return unpad(crypto.Aead(k).open(_ZERO_NONCE, sealed[32:]))
    except crypto.CryptoError as exc:
        raise SealError(f"sealed clove does not open: {exc}") from None


class ReturnKey:
    """Seals reply cloves for one request on one path: ``tag || nonce || AEAD``."""

    __slots__ = ("_aead", "key", "tag")

    def __init__(self, key: bytes, tag: bytes) -> None:
        if len(tag) != TAG_LEN:
            raise ValueError("return tag must be 8 bytes")
        self.key, self.tag = key, tag
        self._aead = crypto.Aead(key)

    @classmethod
    def generate(cls) -> ReturnKey:
        return cls(crypto.random_bytes(crypto.AEAD_KEY_LEN), crypto.random_bytes(TAG_LEN))

    def seal(self, plaintext: bytes) -> bytes:
        nonce = crypto.random_bytes(crypto.AEAD_NONCE_LEN)
        return self.tag + nonce + self._aead.seal(nonce, pad(plaintext), self.tag)

    def open(self, data: bytes) -> bytes:
        if len(data) < TAG_LEN + crypto.AEAD_NONCE_LEN + crypto.AEAD_TAG_LEN or data[:TAG_LEN] != self.tag:
            raise SealError("reply clove is not for this key")
        n0 = TAG_LEN
        try:
            return unpad(self._aead.open(data[n0 : n0 + 12], data[n0 + 12 :], self.tag))
        except crypto.CryptoError:
            raise SealError("reply clove does not authenticate") from None
