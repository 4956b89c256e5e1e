"""Every cryptographic primitive GenTorrent uses, in one place to review.

No other module imports ``cryptography``, ``hashlib`` or ``hmac`` for security
purposes: they call the functions here. The set is deliberately small:

- Ed25519 signatures (node identity, signed replies, registry lists),
- X25519 key agreement (onion layers, sealed clove headers),
- HKDF-SHA256 (key derivation), BLAKE2b (fingerprints, keyed hashes), SHA-256,
- AEAD: AES-256-GCM and ChaCha20-Poly1305 with 96-bit nonces,
- a self-signed X.509 certificate bound to an Ed25519 key (TLS transport),
- anonymous sealed boxes to Ed25519 keys (libsodium through PyNaCl: audit challenges).

Errors: a failed signature or AEAD check raises :class:`CryptoError`; callers
turn it into a protocol error naming the peer.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import os
from collections.abc import Container, Iterable

from cryptography import x509
from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.asymmetric.x25519 import (
    X25519PrivateKey,
    X25519PublicKey,
)
from cryptography.hazmat.primitives.ciphers import Cipher as _Cipher
from cryptography.hazmat.primitives.ciphers import algorithms as _algorithms
from cryptography.hazmat.primitives.ciphers import modes as _modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.x509.oid import NameOID

__all__ = [
    "AEAD_KEY_LEN",
    "AEAD_NONCE_LEN",
    "AEAD_TAG_LEN",
    "ED25519_PK_LEN",
    "ED25519_SIG_LEN",
    "SEALED_OVERHEAD",
    "X25519_PK_LEN",
    "Aead",
    "BlockPermutation",
    "CryptoError",
    "SigningKey",
    "StreamCipher",
    "X25519Key",
    "blake2b",
    "cert_ed25519_public_key",
    "ct_equal",
    "ed25519_verify",
    "hkdf",
    "mac16",
    "open_sealed_ed25519",
    "random_bytes",
    "seal_to_ed25519",
    "self_signed_cert",
    "sha256",
    "stream_xor",
    "x25519_exchange",
]

ED25519_PK_LEN = 32
ED25519_SIG_LEN = 64
X25519_PK_LEN = 32
AEAD_KEY_LEN = 32
AEAD_NONCE_LEN = 12
AEAD_TAG_LEN = 16


class CryptoError(Exception):
    """A signature, key or ciphertext failed to verify."""


def random_bytes(n: int) -> bytes:
    """``n`` bytes from the operating system's CSPRNG."""
    return os.urandom(n)


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def blake2b(data: bytes | memoryview, *, size: int = 32, key: bytes = b"", person: bytes = b"") -> bytes:
    """BLAKE2b with optional key (≤ 64 B) and personalisation (≤ 16 B); ``data`` may be a
    memoryview, so callers hash slices without copying them."""
    return hashlib.blake2b(data, digest_size=size, key=key, person=person).digest()


def ct_equal(a: bytes, b: bytes) -> bool:
    """Constant-time equality for secrets and MACs."""
    return hmac.compare_digest(a, b)


def hkdf(secret: bytes, *, info: bytes, length: int = 32, salt: bytes | None = None) -> bytes:
    """HKDF-SHA256 (RFC 5869)."""
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=salt, info=info).derive(secret)


# --------------------------------------------------------------------------- Ed25519


class SigningKey:
    """An Ed25519 private key: the root of a node's identity."""

    __slots__ = ("_sk", "public_bytes")

    def __init__(self, sk: Ed25519PrivateKey) -> None:
        self._sk = sk
        self.public_bytes: bytes = sk.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )

    @classmethod
    def generate(cls) -> SigningKey:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_bytes(cls, raw: bytes) -> SigningKey:
        if len(raw) != 32:
            raise CryptoError(f"Ed25519 private key must be 32 bytes, got {len(raw)}")
        return cls(Ed25519PrivateKey.from_private_bytes(raw))

    def private_bytes(self) -> bytes:
        return self._sk.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )

    def sign(self, message: bytes) -> bytes:
        return self._sk.sign(message)

    @property
    def _key(self) -> Ed25519PrivateKey:
        return self._sk


def ed25519_verify(public: bytes, signature: bytes, message: bytes) -> None:
    """Raise :class:`CryptoError` unless ``signature`` is ``public``'s over ``message``."""
    if len(public) != ED25519_PK_LEN or len(signature) != ED25519_SIG_LEN:
        raise CryptoError("malformed Ed25519 key or signature length")
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, message)
    except (InvalidSignature, ValueError) as exc:
        raise CryptoError("bad Ed25519 signature") from exc



def valid_signers(signatures: Iterable[tuple[bytes, bytes]], trusted: Container[bytes], message: bytes) -> set[bytes]:
    """The distinct ``trusted`` Ed25519 keys among ``signatures`` (``(public key, signature)``
    pairs) whose signature over ``message`` verifies. Keys not trusted, repeated keys and bad
    signatures are skipped, never an error: a quorum check counts what this returns. The pairs are
    read in order, so an iterator that raises on a malformed pair stops the count there."""
    signers: set[bytes] = set()
    for key, sig in signatures:
        if key in signers or key not in trusted:
            continue
        try:
            ed25519_verify(key, sig, message)
        except CryptoError:
            continue
        signers.add(key)
    return signers

# --------------------------------------------------------------------------- X25519


class X25519Key:
    """An X25519 private key (long-term node key, or an ephemeral one)."""

    __slots__ = ("_sk", "public_bytes")

    def __init__(self, sk: X25519PrivateKey) -> None:
        self._sk = sk
        self.public_bytes: bytes = sk.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )

    @classmethod
    def generate(cls) -> X25519Key:
        return cls(X25519PrivateKey.generate())

    @classmethod
    def from_bytes(cls, raw: bytes) -> X25519Key:
        if len(raw) != 32:
            raise CryptoError(f"X25519 private key must be 32 bytes, got {len(raw)}")
        return cls(X25519PrivateKey.from_private_bytes(raw))

    def private_bytes(self) -> bytes:
        return self._sk.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )

    def exchange(self, peer_public: bytes) -> bytes:
        return x25519_exchange(self, peer_public)


def x25519_exchange(key: X25519Key, peer_public: bytes) -> bytes:
    """Shared secret with ``peer_public``; rejects malformed and low-order points."""
    if len(peer_public) != X25519_PK_LEN:
        raise CryptoError("X25519 public key must be 32 bytes")
    try:
        return key._sk.exchange(X25519PublicKey.from_public_bytes(peer_public))
    except ValueError as exc:  # all-zero shared secret (low-order point)
        raise CryptoError("X25519 exchange failed (low-order point)") from exc


# --------------------------------------------------------------------------- AEAD


class Aead:
    """An AEAD bound to one 32-byte key. ``kind`` is ``"aes-gcm"`` or ``"chacha"``.

    Build one object per key and reuse it: construction is the expensive part.
    """

    __slots__ = ("_cipher",)

    def __init__(self, key: bytes, kind: str = "aes-gcm") -> None:
        if len(key) != AEAD_KEY_LEN:
            raise CryptoError(f"AEAD key must be {AEAD_KEY_LEN} bytes, got {len(key)}")
        if kind == "aes-gcm":
            self._cipher: AESGCM | ChaCha20Poly1305 = AESGCM(key)
        elif kind == "chacha":
            self._cipher = ChaCha20Poly1305(key)
        else:
            raise ValueError(f"unknown AEAD kind {kind!r}")

    def seal(self, nonce: bytes, plaintext: bytes, aad: bytes | None = None) -> bytes:
        return self._cipher.encrypt(nonce, plaintext, aad)

    def open(self, nonce: bytes, ciphertext: bytes | memoryview, aad: bytes | None = None) -> bytes:
        if len(nonce) != AEAD_NONCE_LEN:
            raise CryptoError("AEAD nonce must be 12 bytes")
        try:
            return self._cipher.decrypt(nonce, ciphertext, aad)
        except (InvalidTag, ValueError) as exc:
            raise CryptoError("AEAD authentication failed") from exc


# --------------------------------------------------------------------------- X.509


def self_signed_cert(key: SigningKey, common_name: str, now_unix: float) -> tuple[bytes, bytes]:
    """A self-signed certificate for ``key``, valid around ``now_unix``: ``(cert_pem, key_pem)``.

    The TLS transport pins the Ed25519 key inside it, so names and dates
    carry no trust; the validity window is wide to tolerate clock skew.
    """
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.fromtimestamp(now_unix, datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key._key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .sign(key._key, algorithm=None)
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key._key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert_pem, key_pem


def cert_ed25519_public_key(cert_der: bytes) -> bytes:
    """The raw Ed25519 public key of a DER certificate; :class:`CryptoError` otherwise."""
    try:
        cert = x509.load_der_x509_certificate(cert_der)
        pk = cert.public_key()
    except ValueError as exc:
        raise CryptoError("peer certificate does not parse") from exc
    if not isinstance(pk, Ed25519PublicKey):
        raise CryptoError("peer certificate key is not Ed25519")
    return pk.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


# --------------------------------------------------------------------------- length-preserving layers


def stream_xor(key: bytes, iv: bytes, data: bytes) -> bytes:
    """AES-256-CTR: ``data`` XOR the keystream of (``key``, 16-byte ``iv``).

    Used for onion layers, where every hop must keep the size unchanged.
    Integrity comes from a MAC or AEAD at the layer's end, never from this.
    """
    return StreamCipher(key).xor(iv, data)


class StreamCipher:
    """AES-256-CTR bound to one key, for a hop's cells (the key schedule is done once)."""

    __slots__ = ("_aes",)

    def __init__(self, key: bytes) -> None:
        if len(key) != 32:
            raise CryptoError("StreamCipher needs a 32-byte key")
        self._aes = _algorithms.AES(key)

    def xor(self, iv: bytes, data: bytes) -> bytes:
        if len(iv) != 16:
            raise CryptoError("the iv must be 16 bytes")
        enc = _Cipher(self._aes, _modes.CTR(iv)).encryptor()
        return enc.update(data) + enc.finalize()


class BlockPermutation:
    """AES-256 on single 16-byte blocks (a keyed permutation), for per-hop ivs.

    ECB has no state between blocks, so one encryptor and one decryptor serve every call."""

    __slots__ = ("_dec", "_enc")

    def __init__(self, key: bytes) -> None:
        if len(key) != 32:
            raise CryptoError("BlockPermutation needs a 32-byte key")
        c = _Cipher(_algorithms.AES(key), _modes.ECB())
        self._enc = c.encryptor()
        self._dec = c.decryptor()

    def forward(self, block: bytes) -> bytes:
        if len(block) != 16:
            raise CryptoError("block must be 16 bytes")
        return self._enc.update(block)

    def inverse(self, block: bytes) -> bytes:
        if len(block) != 16:
            raise CryptoError("block must be 16 bytes")
        return self._dec.update(block)


def mac16(key: bytes, data: bytes) -> bytes:
    """A 16-byte keyed MAC (keyed BLAKE2b)."""
    return hashlib.blake2b(data, digest_size=16, key=key).digest()


# --------------------------------------------------------------------------- sealed boxes to Ed25519 keys


def seal_to_ed25519(ed25519_public: bytes, plaintext: bytes) -> bytes:
    """An anonymous sealed box (libsodium ``crypto_box_seal``: an ephemeral X25519 key, then
    XSalsa20-Poly1305) of ``plaintext`` to the holder of the Ed25519 key ``ed25519_public``, whose
    X25519 key is derived by libsodium's Ed25519-to-Curve25519 conversion. The ciphertext is
    :data:`SEALED_OVERHEAD` bytes longer than the plaintext. Used to seal a user's donated prompt to
    the one verifier it is for (overlay/directory/donation.py). :class:`CryptoError`
    for a key that is not a valid Ed25519 point."""
    from nacl import bindings as sodium
    from nacl.exceptions import CryptoError as SodiumCryptoError
    from nacl.exceptions import RuntimeError as SodiumRuntimeError
    from nacl.exceptions import TypeError as SodiumTypeError
    from nacl.exceptions import ValueError as SodiumValueError

    if len(ed25519_public) != ED25519_PK_LEN:
        raise CryptoError("a sealed box goes to a 32-byte Ed25519 public key")
    try:
        x_public = sodium.crypto_sign_ed25519_pk_to_curve25519(ed25519_public)
        return bytes(sodium.crypto_box_seal(plaintext, x_public))
    except (SodiumCryptoError, SodiumRuntimeError, SodiumTypeError, SodiumValueError) as exc:
        raise CryptoError(f"cannot seal to this Ed25519 key ({exc})") from None


SEALED_OVERHEAD = 48  # ephemeral X25519 key (32) + Poly1305 tag (16)


def open_sealed_ed25519(ed25519_seed32: bytes, ciphertext: bytes) -> bytes:
    """Open a box from :func:`seal_to_ed25519` with the 32-byte Ed25519 secret seed of its
    recipient; :class:`CryptoError` if it was not sealed to this key or was altered."""
    from nacl import bindings as sodium
    from nacl.exceptions import CryptoError as SodiumCryptoError
    from nacl.exceptions import RuntimeError as SodiumRuntimeError
    from nacl.exceptions import TypeError as SodiumTypeError
    from nacl.exceptions import ValueError as SodiumValueError

    if len(ed25519_seed32) != 32:
        raise CryptoError("opening a sealed box needs the 32-byte Ed25519 seed")
    if len(ciphertext) < SEALED_OVERHEAD:
        raise CryptoError("a sealed box is at least 48 bytes")
    try:
        public, secret64 = sodium.crypto_sign_seed_keypair(ed25519_seed32)
        x_public = sodium.crypto_sign_ed25519_pk_to_curve25519(public)
        x_secret = sodium.crypto_sign_ed25519_sk_to_curve25519(secret64)
        return bytes(sodium.crypto_box_seal_open(ciphertext, x_public, x_secret))
    except (SodiumCryptoError, SodiumRuntimeError, SodiumTypeError, SodiumValueError) as exc:
        raise CryptoError(f"the sealed box does not open with this key ({exc})") from None
