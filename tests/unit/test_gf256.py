"""GF(2^8) tables, field axioms and byte-wise Shamir sharing (overlay.anon.gf256, paper §3.2)."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from overlay.anon import gf256

byte = st.integers(0, 255)
nonzero = st.integers(1, 255)


def slow_mul(a: int, b: int) -> int:
    """Reference carry-less multiplication modulo the AES polynomial."""
    r = 0
    while b:
        if b & 1:
            r ^= a
        a <<= 1
        if a & 0x100:
            a ^= gf256.POLY
        b >>= 1
    return r


# --------------------------------------------------------------------------- tables


def test_generator_spans_the_multiplicative_group() -> None:
    assert sorted(gf256.EXP[:255]) == list(range(1, 256))
    assert gf256.EXP[255:510] == gf256.EXP[:255]
    for a in range(1, 256):
        assert gf256.EXP[gf256.LOG[a]] == a


def test_mul_tables_match_reference_for_every_pair() -> None:
    for a in range(256):
        row = gf256.MUL[a]
        assert len(row) == 256
        assert row == bytes(slow_mul(a, b) for b in range(256))


def test_translate_multiplies_every_byte() -> None:
    data = bytes(range(256)) * 3
    for c in (0, 1, 2, 3, 0x53, 0xCA, 255):
        assert data.translate(gf256.MUL[c]) == bytes(slow_mul(c, v) for v in data)


# --------------------------------------------------------------------------- axioms


@given(byte, byte, byte)
def test_field_axioms(a: int, b: int, c: int) -> None:
    mul, add = gf256.mul, gf256.add
    assert add(a, b) == add(b, a)
    assert add(add(a, b), c) == add(a, add(b, c))
    assert add(a, 0) == a and add(a, a) == 0
    assert mul(a, b) == mul(b, a)
    assert mul(mul(a, b), c) == mul(a, mul(b, c))
    assert mul(a, add(b, c)) == add(mul(a, b), mul(a, c))
    assert mul(a, 1) == a and mul(a, 0) == 0


@given(nonzero, byte)
def test_inverse_and_division(a: int, b: int) -> None:
    assert gf256.mul(a, gf256.inv(a)) == 1
    assert gf256.mul(gf256.div(b, a), a) == b


@given(byte, st.integers(0, 600))
def test_pow_matches_repeated_multiplication(a: int, e: int) -> None:
    r = 1
    for _ in range(e):
        r = gf256.mul(r, a)
    assert gf256.pow_(a, e) == r


def test_zero_has_no_inverse() -> None:
    with pytest.raises(ZeroDivisionError):
        gf256.inv(0)
    with pytest.raises(ZeroDivisionError):
        gf256.div(1, 0)


# --------------------------------------------------------------------------- Shamir


@given(
    st.binary(min_size=0, max_size=64),
    st.integers(1, 16).flatmap(lambda n: st.tuples(st.just(n), st.integers(1, n))),
    st.randoms(use_true_random=False),
)
def test_any_k_shares_rebuild_the_secret(secret: bytes, nk: tuple[int, int], rnd: random.Random) -> None:
    n, k = nk
    shares = gf256.split(secret, n, k)
    assert len(shares) == n and all(len(s) == len(secret) for s in shares)
    chosen = rnd.sample(range(n), k)
    assert gf256.combine([(i + 1, shares[i]) for i in chosen]) == secret


def test_every_subset_small() -> None:
    secret = bytes(range(32))
    for n in range(1, 7):
        for k in range(1, n + 1):
            shares = gf256.split(secret, n, k)
            for sub in itertools.combinations(range(n), k):
                assert gf256.combine([(i + 1, shares[i]) for i in sub]) == secret


def test_k1_shares_are_the_secret() -> None:
    assert gf256.split(b"key", 3, 1) == [b"key"] * 3


def test_eval_shares_is_polynomial_evaluation() -> None:
    rng = random.Random(7)
    for k in range(1, 5):
        secret = bytes(rng.randrange(256) for _ in range(8))
        coeffs = [bytes(rng.randrange(256) for _ in range(8)) for _ in range(k - 1)]
        xs = list(range(1, 10))
        got = gf256.eval_shares(secret, coeffs, xs)
        for x, share in zip(xs, got, strict=True):
            for t in range(8):
                want = secret[t]
                for j, c in enumerate(coeffs, start=1):
                    want ^= slow_mul(c[t], gf256.pow_(x, j))
                assert share[t] == want


def test_malformed_inputs_are_rejected() -> None:
    with pytest.raises(ValueError):
        gf256.split(b"x", 2, 3)
    with pytest.raises(ValueError):
        gf256.split(b"x", 256, 2)
    with pytest.raises(ValueError):
        gf256.combine([(1, b"a"), (1, b"b")])
    with pytest.raises(ValueError):
        gf256.combine([(0, b"a")])
    with pytest.raises(ValueError):
        gf256.combine([(1, b"a"), (2, b"bb")])
    with pytest.raises(ValueError):
        gf256.combine([])
    with pytest.raises(ValueError):
        gf256.eval_shares(b"ab", [b"a"], [1])
    with pytest.raises(ValueError):
        gf256.eval_shares(b"a", [], [0])


# --------------------------------------------------------------------------- secrecy
#
# k−1 shares carry no information about the secret: for every fixed set of
# k−1 x-coordinates and every (y_1..y_{k−1}), each secret byte s is consistent
# with exactly the same number (one) of polynomials. Checked exhaustively over
# GF(2^8) by running eval_shares (the code split uses) on every (s, c_1..c_{k−1})
# at once — the sharing is byte-wise, so each byte position is one polynomial.


def _counts_uniform(ys: list[bytes], per_secret: int) -> bool:
    """``ys[j][i]``: share j of polynomial i, polynomials ordered secret-major.

    True iff for every secret (a block of ``per_secret`` consecutive polynomials)
    the tuples (y_1..y_{k−1}) hit every value exactly once.
    """
    if len(ys) == 1:
        y = ys[0]
        return all(
            len(set(y[s * per_secret:(s + 1) * per_secret])) == per_secret for s in range(256)
        )
    y1, y2 = ys
    z = bytearray(2 * len(y1))
    z[0::2] = y1
    z[1::2] = y2
    pairs = memoryview(z).cast("H")
    return all(
        len(set(pairs[s * per_secret:(s + 1) * per_secret])) == per_secret for s in range(256)
    )


def test_k1_reveals_nothing_with_zero_shares() -> None:
    # k = 1: k − 1 = 0 shares, and the empty view is the same for every secret.
    for s in range(256):
        assert gf256.eval_shares(bytes([s]), [], []) == []


def test_one_share_of_a_2_of_n_sharing_is_independent_of_the_secret() -> None:
    secret = b"".join(bytes([s]) * 256 for s in range(256))  # polynomial i: s = i >> 8
    c1 = bytes(range(256)) * 256  # c_1 = i & 255
    for x in range(1, 256):
        (y,) = gf256.eval_shares(secret, [c1], [x])
        assert _counts_uniform([y], 256), x


@pytest.mark.parametrize("xs", [(1, 2), (3, 4), (1, 16), (15, 16), (7, 200)])
def test_two_shares_of_a_3_of_n_sharing_are_independent_of_the_secret(xs: tuple[int, int]) -> None:
    # All 2^24 (s, c_1, c_2): polynomial i has s = i >> 16, c_1 = (i >> 8) & 255, c_2 = i & 255.
    secret = b"".join(bytes([s]) * 65536 for s in range(256))
    c1 = b"".join(bytes([a]) * 256 for a in range(256)) * 256
    c2 = bytes(range(256)) * 65536
    ys = gf256.eval_shares(secret, [c1, c2], xs)
    assert _counts_uniform(ys, 65536)
