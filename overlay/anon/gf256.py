"""GF(2^8) arithmetic and byte-wise k-of-n Shamir secret sharing (paper §3.2, step 3).

S-IDA splits the message key K with Shamir's scheme [Shamir 1979]; GenTorrent
does it byte-wise over GF(2^8): byte ``t`` of every share is a point of its own
random polynomial of degree ≤ k−1 whose constant term is byte ``t`` of the
secret. Any k shares rebuild the secret by Lagrange interpolation at x = 0;
any k−1 shares are uniformly distributed whatever the secret (information-
theoretic secrecy, checked exhaustively by ``tests/unit/test_gf256.py``).

The field is GF(2)[x]/(x^8 + x^4 + x^3 + x + 1) (the AES polynomial, 0x11B)
with generator 0x03. Speed comes from whole-row operations, not per-byte
Python loops: multiplying a byte string by a constant ``c`` is
``data.translate(MUL[c])`` (a 256-byte table per constant, built at import),
and adding (XOR) rows goes through Python integers. Splitting a 32-byte key
4 ways costs a few microseconds (see docs/decisions/0002-sida.md).

Share ``i`` (0-based) is the evaluation at x = i + 1, so x-coordinates are
1..255 and never 0 (the secret's own point).
"""

from __future__ import annotations

from collections.abc import Sequence

from overlay.wire.crypto import random_bytes

__all__ = [
    "EXP",
    "GENERATOR",
    "LOG",
    "MUL",
    "POLY",
    "add",
    "combine",
    "div",
    "eval_shares",
    "inv",
    "lagrange_at_zero",
    "mul",
    "pow_",
    "split",
]

POLY = 0x11B
GENERATOR = 0x03


def _build_tables() -> tuple[list[int], list[int]]:
    exp = [0] * 510
    log = [0] * 256
    x = 1
    for i in range(255):
        exp[i] = x
        log[x] = i
        # x *= 3  ==  x ^ (x * 2), reduced modulo POLY
        x2 = x << 1
        if x2 & 0x100:
            x2 ^= POLY
        x ^= x2
    for i in range(255, 510):
        exp[i] = exp[i - 255]
    return exp, log


EXP, LOG = _build_tables()
"""``EXP[i] = 3^i`` for i in 0..509 (doubled so ``EXP[LOG[a] + LOG[b]]`` needs no modulo);
``LOG[a]`` for a ≠ 0 (``LOG[0]`` is 0 and meaningless)."""


def _build_mul_rows() -> tuple[bytes, ...]:
    log_bytes = bytes(LOG)
    exp_bytes = bytes(EXP)
    rows = [bytes(256)]
    for c in range(1, 256):
        lc = LOG[c]
        # row[v] = EXP[LOG[c] + LOG[v]] for v != 0, and row[0] = 0.
        row = bytearray(log_bytes.translate(exp_bytes[lc:lc + 256]))
        row[0] = 0
        rows.append(bytes(row))
    return tuple(rows)


MUL: tuple[bytes, ...] = _build_mul_rows()
"""``MUL[c]`` is the ``bytes.translate`` table of multiplication by ``c``:
``MUL[c][v] == mul(c, v)``, so ``data.translate(MUL[c])`` multiplies every byte."""


def add(a: int, b: int) -> int:
    """Field addition (and subtraction): XOR."""
    return a ^ b


def mul(a: int, b: int) -> int:
    return MUL[a][b]


def inv(a: int) -> int:
    """Multiplicative inverse; ``ZeroDivisionError`` for 0."""
    if a == 0:
        raise ZeroDivisionError("0 has no inverse in GF(2^8)")
    return EXP[255 - LOG[a]]


def div(a: int, b: int) -> int:
    if b == 0:
        raise ZeroDivisionError("division by 0 in GF(2^8)")
    if a == 0:
        return 0
    return EXP[LOG[a] + 255 - LOG[b]]


def pow_(a: int, e: int) -> int:
    """``a`` to the power ``e`` ≥ 0 (``0^0 == 1``)."""
    if e == 0:
        return 1
    if a == 0:
        return 0
    return EXP[(LOG[a] * e) % 255]


def lagrange_at_zero(xs: Sequence[int]) -> list[int]:
    """Coefficients λ_i with p(0) = Σ λ_i · p(x_i) for every p of degree < len(xs).

    ``xs`` must be distinct and non-zero (``ValueError`` otherwise).
    """
    if len(set(xs)) != len(xs) or 0 in xs:
        raise ValueError("x-coordinates must be distinct and non-zero")
    out = []
    for i, xi in enumerate(xs):
        num = 1
        den = 1
        for j, xj in enumerate(xs):
            if j != i:
                num = MUL[num][xj]
                den = MUL[den][xi ^ xj]
        out.append(div(num, den))
    return out


def eval_shares(secret: bytes, coefficients: Sequence[bytes], xs: Sequence[int]) -> list[bytes]:
    """Evaluate, byte-wise, p(x) = secret + c_1·x + … + c_{k−1}·x^{k−1} at each x in ``xs``.

    Deterministic core of Shamir splitting: ``coefficients`` are the k−1 random
    rows (each as long as ``secret``); the caller draws them from a CSPRNG.
    Exposed for exhaustive tests. Works for any secret length.
    """
    size = len(secret)
    for c in coefficients:
        if len(c) != size:
            raise ValueError("every coefficient row must be as long as the secret")
    s = int.from_bytes(secret, "big")
    out = []
    for tables in _power_tables(tuple(xs), len(coefficients)):
        acc = s
        for c, table in zip(coefficients, tables, strict=True):
            acc ^= int.from_bytes(c.translate(table), "big")
        out.append(acc.to_bytes(size, "big"))
    return out


_POWER_CACHE: dict[tuple[tuple[int, ...], int], tuple[tuple[bytes, ...], ...]] = {}


def _power_tables(xs: tuple[int, ...], degree: int) -> tuple[tuple[bytes, ...], ...]:
    """For each x: the translate tables of x^1..x^degree (cached, bounded)."""
    key = (xs, degree)
    got = _POWER_CACHE.get(key)
    if got is None:
        if not all(0 < x < 256 for x in xs):
            raise ValueError("x-coordinates must be in 1..255")
        got = tuple(tuple(MUL[pow_(x, j)] for j in range(1, degree + 1)) for x in xs)
        if len(_POWER_CACHE) >= 1024:
            _POWER_CACHE.clear()
        _POWER_CACHE[key] = got
    return got


def split(secret: bytes, n: int, k: int) -> list[bytes]:
    """k-of-n Shamir shares of ``secret``: share ``i`` is p(i + 1), for i in 0..n−1.

    Fresh coefficients come from the OS CSPRNG. ``1 ≤ k ≤ n ≤ 255``.
    """
    if not 1 <= k <= n <= 255:
        raise ValueError(f"need 1 <= k <= n <= 255, got n={n}, k={k}")
    size = len(secret)
    rnd = random_bytes(size * (k - 1)) if k > 1 else b""
    coefficients = [rnd[j * size:(j + 1) * size] for j in range(k - 1)]
    return eval_shares(secret, coefficients, range(1, n + 1))


_LAGRANGE_CACHE: dict[tuple[int, ...], tuple[bytes, ...]] = {}
_LAGRANGE_CACHE_MAX = 4096


def combine(points: Sequence[tuple[int, bytes]]) -> bytes:
    """The secret from exactly k points ``(x, share)`` (distinct non-zero x, equal lengths).

    Lagrange interpolation at 0, one ``translate`` and one XOR per share. The
    λ tables are cached per x-set (bounded). ``ValueError`` on malformed input;
    wrong-but-well-formed shares give a wrong secret (S-IDA's AEAD tag and
    fingerprints catch that, not this function).
    """
    if not points:
        raise ValueError("need at least one share")
    xs = tuple(x for x, _ in points)
    tables = _LAGRANGE_CACHE.get(xs)
    if tables is None:
        tables = tuple(MUL[lam] for lam in lagrange_at_zero(xs))
        if len(_LAGRANGE_CACHE) >= _LAGRANGE_CACHE_MAX:
            _LAGRANGE_CACHE.clear()
        _LAGRANGE_CACHE[xs] = tables
    size = len(points[0][1])
    acc = 0
    for (_, y), table in zip(points, tables, strict=True):
        if len(y) != size:
            raise ValueError("shares must have equal lengths")
        acc ^= int.from_bytes(y.translate(table), "big")
    return acc.to_bytes(size, "big")
