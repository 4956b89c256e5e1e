"""ECVRF-EDWARDS25519-SHA512-TAI (RFC 9381, suite byte 0x03) and the epoch leader election
(issue 14 item 1; decision 0010).

A verifiable random function: ``prove(sk, alpha)`` gives an 80-byte proof ``pi``; anyone with the
public key checks ``verify(pk, alpha, pi)`` and gets the 64-byte output ``beta``, the same for
every valid proof of that (key, alpha) and unpredictable without the secret key. The committee
uses it to elect each epoch's leader over the previous epoch's final commit hash
(:func:`leader_for_epoch`): no validator can pick the leader, and every validator can check it.

Curve arithmetic is libsodium's, through PyNaCl's ``nacl.bindings`` (``crypto_core_ed25519_*``,
``crypto_scalarmult_ed25519_*noclamp``); this module only hashes, encodes and sequences the RFC's
steps. No field arithmetic is written here.

Keys are Ed25519 keys (RFC 8032): the 32-byte secret seed ``sk``, the 32-byte public key ``pk``.
A validator can use its committee Ed25519 key.

Validation (every byte of ``pk`` and ``pi`` is hostile):

- ``pk`` must be a canonical encoding of a point of the prime-order subgroup other than the
  identity (libsodium's ``crypto_core_ed25519_is_valid_point``). RFC 9381 §5.4.5 only requires
  that the point is not of small order; keys made by RFC 8032 key generation always pass the
  stricter check, so no honest key is refused.
- ``pi`` must be exactly 80 bytes: ``Gamma`` (32, a valid point as above: an honest ``Gamma`` is
  x·H with H in the prime-order subgroup), ``c`` (16), ``s`` (32, canonical: ``s < L``).
- Everything else is the RFC's verification: U = s·B − c·Y, V = s·H − c·Gamma, and ``c`` must
  equal the challenge recomputed from (Y, H, Gamma, U, V).

:class:`VrfError` is raised for a malformed key or proof and for a proof that does not verify;
its message says which.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from nacl import bindings as sodium
from nacl.exceptions import RuntimeError as SodiumError

SUITE = b"\x03"  # ECVRF-EDWARDS25519-SHA512-TAI
PROOF_LEN = 80  # ptLen 32 + cLen 16 + qLen 32
OUTPUT_LEN = 64  # SHA-512
KEY_LEN = 32
C_LEN = 16
# The order of edwards25519's prime-order subgroup, L = 2^252 + 27742317777372353535851937790883648493.
L = (1 << 252) + 27742317777372353535851937790883648493
_P = (1 << 255) - 19  # the base field's prime; only compared against, never computed with
_COFACTOR = 8
_MAX_TRIES = 256  # try-and-increment's counter is one byte (RFC 9381 §5.4.1.1)
_IDENTITY = (1).to_bytes(32, "little")


class VrfError(ValueError):
    """A malformed public key or proof, or a proof that does not verify."""


# --------------------------------------------------------------------------- encodings


def _int(b: bytes) -> int:
    return int.from_bytes(b, "little")


def _scalar(n: int) -> bytes:
    return (n % L).to_bytes(32, "little")


def _valid_point(b: bytes) -> bool:
    """Canonical, on the curve, in the prime-order subgroup, not the identity (libsodium)."""
    return len(b) == 32 and bool(sodium.crypto_core_ed25519_is_valid_point(b))


def _mul(n: int, point: bytes) -> bytes:
    """n·point for a point that passed :func:`_valid_point` (or an encode_to_curve output); the
    identity's encoding for n ≡ 0 (mod L)."""
    n %= L
    if n == 0:
        return _IDENTITY
    return sodium.crypto_scalarmult_ed25519_noclamp(_scalar(n), point)


def _base_mul(n: int) -> bytes:
    """n·B for the base point B; the identity's encoding for n ≡ 0 (mod L)."""
    n %= L
    if n == 0:
        return _IDENTITY
    return sodium.crypto_scalarmult_ed25519_base_noclamp(_scalar(n))


def _add(a: bytes, b: bytes) -> bytes:
    if a == _IDENTITY:
        return b
    if b == _IDENTITY:
        return a
    return sodium.crypto_core_ed25519_add(a, b)


def _sub(a: bytes, b: bytes) -> bytes:
    if b == _IDENTITY:
        return a
    if a == _IDENTITY:
        return _mul(L - 1, b)
    return sodium.crypto_core_ed25519_sub(a, b)


def _hash_to_point(candidate: bytes) -> bytes | None:
    """RFC 9381 §5.5 ``interpret_hash_value_as_a_point`` then the cofactor clearing of
    §5.4.1.1: RFC 8032 decoding of ``candidate`` (None where it is not a point), times 8.

    The candidate need not lie in the prime-order subgroup, so the decoding test is libsodium's
    point addition (which checks only that its inputs are on the curve) after our canonicity
    checks of RFC 8032 §5.1.3 (y < p; x = 0 with the sign bit set is invalid)."""
    y = _int(candidate) & ((1 << 255) - 1)
    if y >= _P:
        return None
    if candidate[31] & 0x80 and y in (1, _P - 1):  # the points with x = 0 have no negative x
        return None
    try:
        p2 = sodium.crypto_core_ed25519_add(candidate, candidate)
    except SodiumError:
        return None
    p4 = sodium.crypto_core_ed25519_add(p2, p2)
    return sodium.crypto_core_ed25519_add(p4, p4)


def _encode_to_curve(pk: bytes, alpha: bytes) -> bytes:
    """ECVRF_encode_to_curve_try_and_increment (RFC 9381 §5.4.1.1), salt = the public key."""
    for ctr in range(_MAX_TRIES):
        digest = hashlib.sha512(SUITE + b"\x01" + pk + alpha + bytes([ctr]) + b"\x00").digest()
        h = _hash_to_point(digest[:32])
        if h is not None and h != _IDENTITY:
            return h
    # Each try succeeds with probability about 1/2: 256 failures do not happen.
    raise VrfError("encode_to_curve found no point in 256 tries")


def _challenge(*points: bytes) -> int:
    """ECVRF_challenge_generation (RFC 9381 §5.4.3): the first 16 bytes of SHA-512 over the
    suite, 0x02, the five points and 0x00, as a little-endian integer."""
    digest = hashlib.sha512(SUITE + b"\x02" + b"".join(points) + b"\x00").digest()
    return _int(digest[:C_LEN])


def _expand(sk: bytes) -> tuple[int, bytes]:
    """RFC 8032 §5.1.5: the secret scalar x (clamped) and the nonce key."""
    if len(sk) != KEY_LEN:
        raise VrfError(f"a VRF secret key is {KEY_LEN} bytes (an Ed25519 seed), not {len(sk)}")
    h = bytearray(hashlib.sha512(sk).digest())
    h[0] &= 248
    h[31] &= 127
    h[31] |= 64
    return _int(bytes(h[:32])), bytes(h[32:])


# --------------------------------------------------------------------------- the VRF


def public_key(sk: bytes) -> bytes:
    """The Ed25519 public key of the 32-byte seed ``sk`` (RFC 8032 §5.1.5)."""
    x, _ = _expand(sk)
    return _base_mul(x)


def prove(sk: bytes, alpha: bytes) -> bytes:
    """ECVRF_prove (RFC 9381 §5.1): the 80-byte proof for ``alpha`` under secret seed ``sk``.
    Deterministic (nonce per RFC 9381 §5.4.2.2)."""
    x, nonce_key = _expand(sk)
    y = _base_mul(x)
    h = _encode_to_curve(y, alpha)
    gamma = _mul(x, h)
    k = _int(hashlib.sha512(nonce_key + h).digest()) % L
    c = _challenge(y, h, gamma, _base_mul(k), _mul(k, h))
    s = (k + c * x) % L
    return gamma + c.to_bytes(C_LEN, "little") + s.to_bytes(32, "little")


def proof_to_hash(pi: bytes) -> bytes:
    """ECVRF_proof_to_hash (RFC 9381 §5.2): the 64-byte output of a proof, WITHOUT verifying it.
    Use :func:`verify` on anything received; this is for one's own proofs."""
    gamma, _, _ = _decode_proof(pi)
    return _gamma_to_hash(gamma)


def _gamma_to_hash(gamma: bytes) -> bytes:
    return hashlib.sha512(SUITE + b"\x03" + _mul(_COFACTOR, gamma) + b"\x00").digest()


def _decode_proof(pi: bytes) -> tuple[bytes, int, int]:
    if len(pi) != PROOF_LEN:
        raise VrfError(f"a VRF proof is {PROOF_LEN} bytes, not {len(pi)}")
    gamma, c, s = pi[:32], _int(pi[32:32 + C_LEN]), _int(pi[32 + C_LEN:])
    if s >= L:
        raise VrfError("VRF proof refused: its scalar s is not canonical (s >= L)")
    if not _valid_point(gamma):
        raise VrfError("VRF proof refused: Gamma is not a point of the prime-order subgroup")
    return gamma, c, s


def verify(pk: bytes, alpha: bytes, pi: bytes) -> bytes:
    """ECVRF_verify (RFC 9381 §5.3): the 64-byte output ``beta`` if ``pi`` is a valid proof of
    ``alpha`` under public key ``pk``; raises :class:`VrfError` otherwise."""
    if len(pk) != KEY_LEN or not _valid_point(pk):
        raise VrfError("VRF public key refused: not a canonical point of the prime-order subgroup "
                       "(an Ed25519 public key made by RFC 8032 key generation)")
    gamma, c, s = _decode_proof(pi)
    h = _encode_to_curve(pk, alpha)
    u = _sub(_base_mul(s), _mul(c, pk))
    v = _sub(_mul(s, h), _mul(c, gamma))
    if _challenge(pk, h, gamma, u, v) != c:
        raise VrfError("VRF proof refused: it does not verify under this public key and input")
    return _gamma_to_hash(gamma)


# --------------------------------------------------------------------------- leader election

LEADER_CONTEXT = b"gentorrent/epoch-leader/v1\x00"


def leader_alpha(epoch: int, prev_commit_hash: bytes) -> bytes:
    """The VRF input of every validator for ``epoch``: a context string, the epoch number
    (8 bytes, big-endian) and the previous epoch's final commit hash."""
    if not 0 <= epoch < 1 << 64:
        raise ValueError(f"epoch {epoch} is outside 0..2^64-1")
    return LEADER_CONTEXT + epoch.to_bytes(8, "big") + prev_commit_hash


_LOG_BITS = 64  # fractional bits of the fixed-point log2 in tickets


def _neg_log2(beta: bytes) -> int:
    """−log2(u) in fixed point (:data:`_LOG_BITS` fractional bits, rounded down) for
    u = (first 32 bytes of ``beta`` + 1) / 2^256 ∈ (0, 1]: integer arithmetic only (the
    classic bit-by-bit squaring algorithm), so every verifier gets the same value."""
    n_int = int.from_bytes(beta[:32], "big") + 1
    whole = n_int.bit_length() - 1
    f = _LOG_BITS
    m = n_int << (f - whole) if whole <= f else n_int >> (whole - f)  # mantissa in [1, 2), f bits
    frac = 0
    for _ in range(f):
        m = (m * m) >> f
        frac <<= 1
        if m >= 2 << f:
            m >>= 1
            frac |= 1
    return (256 << f) - ((whole << f) | frac)


@dataclass(frozen=True, slots=True)
class LeaderClaim:
    """A validator's verified VRF output for an epoch: its key, its power and its ``beta``."""

    pk: bytes
    power: int
    beta: bytes

    def ticket(self) -> Fraction:
        """The claim's rank, lower wins: −ln(u) / power with u uniform in (0, 1] from ``beta``
        (an exponential race: each validator wins with probability power / total power). Computed
        as the exact rational −log2(u) / power from an integer fixed-point log2, so no float
        enters consensus and every verifier ranks claims identically."""
        return Fraction(_neg_log2(self.beta), self.power)


def leader_for_epoch(validators: Mapping[bytes, int], epoch: int, prev_commit_hash: bytes,
                     proofs: Mapping[bytes, bytes]) -> LeaderClaim | None:
    """The leader of ``epoch``: among the validators (``validators``: Ed25519 public key →
    voting power > 0) whose proof in ``proofs`` (public key → 80-byte VRF proof over
    :func:`leader_alpha`) verifies, the one with the lowest :meth:`LeaderClaim.ticket`; ties
    (which need equal outputs) go to the lower public key. Proofs from keys that are not
    validators, and proofs that do not verify, are ignored: a validator that sends nothing or
    garbage simply does not run. None when no proof verifies (the epoch has no leader; the caller
    waits for proofs or skips the epoch). Pure: every verifier computes the same answer from the
    same inputs."""
    alpha = leader_alpha(epoch, prev_commit_hash)
    claims: list[LeaderClaim] = []
    for pk, pi in proofs.items():
        power = validators.get(pk, 0)
        if power <= 0:
            continue
        try:
            beta = verify(pk, alpha, pi)
        except VrfError:
            continue
        claims.append(LeaderClaim(pk, power, beta))
    if not claims:
        return None
    return min(claims, key=lambda cl: (cl.ticket(), cl.pk))


def rank_validators(claims: Sequence[LeaderClaim]) -> list[LeaderClaim]:
    """Claims in leader order (lowest ticket first): the fallback order when a leader's epoch
    aborts (issue 14 item 5, "the next leader takes over")."""
    return sorted(claims, key=lambda cl: (cl.ticket(), cl.pk))
