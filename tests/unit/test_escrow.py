"""Weighted Feldman VSS over edwards25519 (overlay/directory/escrow.py, decision 0037): the plan's
threshold against every coalition, round trips, a dishonest dealer and a colluding holder, the
zero and identity corners libsodium refuses, and the strict codecs on hostile bytes."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from overlay.directory import escrow
from overlay.directory.escrow import EscrowError, L, Plan, Share
from overlay.wire import crypto

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
powers_st = st.lists(st.integers(1, 1000), min_size=1, max_size=8)
seeds = st.integers(0, 2**32 - 1)

# Points libsodium's crypto_core_ed25519_is_valid_point refuses.
IDENTITY = b"\x01" + bytes(31)
ORDER_2 = bytes.fromhex("ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f")  # y = -1
ORDER_8 = bytes.fromhex("26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05")
ORDER_4 = bytes(32)  # y = 0
NON_CANONICAL_Y = bytes.fromhex("edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f")  # y = p


def all_shares(d: escrow.Deal) -> list[Share]:
    return [s for holder in d.shares for s in holder]


def dealt(powers: list[int], seed: int, units: int | None = None) -> tuple[Plan, int, escrow.Deal]:
    rng = random.Random(seed)
    p = escrow.plan(powers, units)
    s = escrow.new_secret(rng)
    return p, s, escrow.deal(s, p, rng)


def dealt_or_reject(powers: list[int], seed: int) -> tuple[Plan, int, escrow.Deal]:
    """:func:`dealt`, the example rejected where the powers cannot be planned, or only with more
    than 64 units (rare; it keeps the share-by-share checks quick)."""
    try:
        got = dealt(powers, seed)
    except EscrowError:
        reject()
    if got[0].units > 64:
        reject()
    return got


def coalitions(n: int) -> itertools.chain[tuple[int, ...]]:
    return itertools.chain.from_iterable(itertools.combinations(range(n), k) for k in range(n + 1))


def brute_threshold(powers: list[int], counts: tuple[int, ...]) -> int:
    total = sum(powers)
    return 1 + max(sum(counts[i] for i in c) for c in coalitions(len(powers)) if 3 * sum(powers[i] for i in c) < total)


# --------------------------------------------------------------------------- plan


@settings(max_examples=150, deadline=None)
@given(powers_st, st.sampled_from([1, 7, 32, 64]))
def test_plan_against_every_coalition(powers: list[int], units: int) -> None:
    total = sum(powers)
    try:
        p = escrow.plan(powers, units)
    except EscrowError:
        # refused only when some coalition above a third holds fewer units than the threshold
        counts = escrow._apportion(powers, units, total)
        t = brute_threshold(powers, tuple(counts))
        assert any(3 * sum(powers[i] for i in c) > total and sum(counts[i] for i in c) < t
                   for c in coalitions(len(powers)))
        return
    assert len(p.counts) == len(powers) and sum(p.counts) == units == p.units
    for count, pw in zip(p.counts, powers, strict=True):
        assert abs(count - Fraction(units * pw, total)) < 1
    assert p.threshold == brute_threshold(powers, p.counts)  # the least safe threshold, exactly
    for c in coalitions(len(powers)):
        power, held = sum(powers[i] for i in c), sum(p.counts[i] for i in c)
        if 3 * power < total:
            assert held < p.threshold
        if 3 * power > total:  # the honest validators among those above two thirds
            assert held >= p.threshold


def test_plan_examples() -> None:
    assert escrow.plan([5, 5, 5, 5]) == Plan((8, 8, 8, 8), 9)
    assert escrow.plan([1, 1, 1, 1], 32) == Plan((8, 8, 8, 8), 9)
    # one validator: only the empty coalition is below a third, so every share is the secret
    assert escrow.plan([10]) == Plan((32,), 1)
    # two or three of equal power: none of them alone is strictly below a third
    assert escrow.plan([1, 1]) == Plan((16, 16), 1)
    assert escrow.plan([1, 1, 1]) == Plan((11, 11, 10), 1)  # the remainder's tie goes to the lower index
    assert escrow.plan([1, 2]) == Plan((11, 21), 1)  # 3·1 is not below 3
    assert escrow.plan([1, 3]) == Plan((8, 24), 9)  # 3·1 < 4: the small one is below a third
    # a holder of tiny power may get no unit
    assert escrow.plan([1000, 1]) == Plan((32, 0), 1)
    assert escrow.plan([1] * 16) == Plan((2,) * 16, 11)
    # one of 16 holds 30 %: with 32 units (10, then 2 or 1 each, t = 15) the big one and a small
    # one, above a third, hold 11; so the default takes 64
    with pytest.raises(EscrowError, match="above a third"):
        escrow.plan([450] + [70] * 15, 32)
    skewed = escrow.plan([450] + [70] * 15)
    assert skewed.units == 64 and skewed.counts[0] == 19 and skewed.threshold == 22
    assert escrow.plan([1] * 64) == escrow.plan([1] * 64, 64) == Plan((1,) * 64, 22)
    assert escrow.plan([1] * 256).units == 256
    assert escrow.plan([1] * 256, 1024).threshold == 1 + 4 * 85


@pytest.mark.parametrize(("powers", "units"), [
    ([], 32), ([0], 32), ([1, 0], 32), ([-1, 5], 32), ([True, 1], 32), ([1.0], 32), ([2**63], 32), ([1] * 257, 32),
    ([1], 0), ([1], 1025), ([1], True), ("ab", 32), (b"\x01\x02", 32), (None, 32), (5, 32),
    # 64 of equal power over 32 units: 32 get none; 21 below a third hold 21 (t = 22), yet
    # 22 above a third may hold none; over 43, one
    ([1] * 64, 32), ([1] * 64, 43),
])
def test_plan_refusals(powers: object, units: object) -> None:
    with pytest.raises(EscrowError):
        escrow.plan(powers, units)  # type: ignore[arg-type]


def test_holder_xs_are_consecutive_in_holder_order() -> None:
    p = escrow.plan([1, 3, 2])
    xs = [escrow.holder_xs(p, i) for i in range(3)]
    assert [x for r in xs for x in r] == list(range(1, 33))
    assert [len(r) for r in xs] == list(p.counts)
    for bad in (-1, 3, "0", True):
        with pytest.raises(EscrowError):
            escrow.holder_xs(p, bad)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- round trips


@FAST
@given(powers_st, seeds, st.randoms(use_true_random=False))
def test_any_t_shares_rebuild_and_t_minus_1_do_not(powers: list[int], seed: int, pick: random.Random) -> None:
    p, s, d = dealt_or_reject(powers, seed)
    shares = all_shares(d)
    assert [sh.x for sh in shares] == list(range(1, p.units + 1))
    assert len(d.commitments) == p.threshold and escrow.opens(d.commitments, s)
    assert all(escrow.verify_holder(p, i, d.commitments, h) for i, h in enumerate(d.shares))
    chosen = pick.sample(shares, p.threshold)
    assert escrow.recover(d.commitments, chosen) == s
    assert escrow.recover(d.commitments, shares) == s
    with pytest.raises(EscrowError):
        escrow.recover(d.commitments, chosen[:-1])
    # t - 1 shares, some repeated: still t - 1 distinct x
    with pytest.raises(EscrowError):
        escrow.recover(d.commitments, chosen[:-1] + chosen[:-1][:1])


def test_threshold_one_every_share_is_the_secret() -> None:
    p, s, d = dealt([10], 1)
    assert p.threshold == 1 and len(d.commitments) == 1
    assert {sh.y for sh in all_shares(d)} == {s}
    assert escrow.recover(d.commitments, [d.shares[0][17]]) == s


def test_deal_with_the_secrets_module_and_refusals() -> None:
    p = escrow.plan([1, 1, 1, 1])
    s = escrow.new_secret()
    assert 1 <= s < L
    d = escrow.deal(s, p)
    assert escrow.recover(d.commitments, all_shares(d)) == s
    for bad_secret in (0, L, -1, 2**256, 1.0, True, None):
        with pytest.raises(EscrowError):
            escrow.deal(bad_secret, p)  # type: ignore[arg-type]
    bad_plans: list[object] = [Plan((), 1), Plan((8, 8), 17), Plan((8, 8), 0), Plan((-1, 9), 2), Plan((2000,), 1),
                               Plan([8, 8], 2), (8, 8)]  # type: ignore[arg-type]
    for bad_plan in bad_plans:
        with pytest.raises(EscrowError):
            escrow.deal(s, bad_plan)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- a dishonest dealer


@FAST
@given(st.lists(st.integers(1, 1000), min_size=2, max_size=8), seeds, st.data())
def test_a_wrong_share_is_caught_by_its_holder_and_skipped_by_recover(powers: list[int], seed: int,
                                                                       data: st.DataObject) -> None:
    p, s, d = dealt_or_reject(powers, seed)
    holders = [i for i, c in enumerate(p.counts) if c]
    victim = data.draw(st.sampled_from(holders))
    k = data.draw(st.integers(0, p.counts[victim] - 1))
    delta = data.draw(st.integers(1, L - 1))
    good = d.shares[victim][k]
    bad = Share(good.x, (good.y + delta) % L)
    given_shares = list(d.shares[victim])
    given_shares[k] = bad
    assert not escrow.verify_share(d.commitments, bad)
    assert not escrow.verify_holder(p, victim, d.commitments, given_shares)
    assert not escrow.verify_shares(d.commitments, given_shares)
    for i, h in enumerate(d.shares):
        assert escrow.verify_holder(p, i, d.commitments, h)
        assert all(escrow.verify_share(d.commitments, sh) for sh in h)
    # the bad share first, then every other share: recover skips it
    others = [sh for sh in all_shares(d) if sh != good]
    if len(others) >= p.threshold:
        assert escrow.recover(d.commitments, [bad, *others]) == s
        assert escrow.recover(d.commitments, [*others[: p.threshold - 1], bad, *others[p.threshold - 1:]]) == s
    # with the good one too (the same x twice): the one that verifies is kept
    assert escrow.recover(d.commitments, [bad, *all_shares(d)]) == s
    # only t - 1 good ones and the bad one: refused, never a wrong secret
    with pytest.raises(EscrowError):
        escrow.recover(d.commitments, [bad, *others[: p.threshold - 1]])


def test_verify_holder_checks_the_degree_and_the_x() -> None:
    p, s, d = dealt([1, 1, 1, 1], 3)
    assert escrow.verify_holder(p, 1, d.commitments, d.shares[1])
    # a dealer of a higher degree (t + 1 commitments): its shares verify, yet t honest shares could not rebuild
    higher = escrow.deal(s, Plan(p.counts, p.threshold + 1), random.Random(4))
    assert escrow.verify_shares(higher.commitments, higher.shares[1])
    assert not escrow.verify_holder(p, 1, higher.commitments, higher.shares[1])
    # the right shares at another holder's x, too few, too many, out of order
    assert not escrow.verify_holder(p, 0, d.commitments, d.shares[1])
    assert not escrow.verify_holder(p, 1, d.commitments, d.shares[1][:-1])
    assert not escrow.verify_holder(p, 1, d.commitments, (*d.shares[1], d.shares[2][0]))
    assert not escrow.verify_holder(p, 1, d.commitments, tuple(reversed(d.shares[1])))
    # two shares' values swapped: each wrong, the batch check catches it
    a, b = d.shares[1][0], d.shares[1][1]
    swapped = (Share(a.x, b.y), Share(b.x, a.y), *d.shares[1][2:])
    assert not escrow.verify_holder(p, 1, d.commitments, swapped)
    # another deal's commitments
    other = escrow.deal(s, p, random.Random(5))
    assert not escrow.verify_holder(p, 1, other.commitments, d.shares[1])


# --------------------------------------------------------------------------- a colluding holder


@FAST
@given(st.lists(st.integers(1, 1000), min_size=2, max_size=8), seeds, st.data())
def test_forged_shares_never_change_what_recover_returns(powers: list[int], seed: int, data: st.DataObject) -> None:
    """Holders that release forged shares (any x, any y, duplicates of honest x, anywhere in the
    list) make recover return the secret or refuse; never another value."""
    p, s, d = dealt_or_reject(powers, seed)
    shares = all_shares(d)
    forged = data.draw(st.lists(st.builds(Share, st.integers(1, p.units), st.integers(0, L - 1)), min_size=1,
                                max_size=4))
    shuffle = data.draw(st.randoms(use_true_random=False))
    honest = shuffle.sample(shares, data.draw(st.integers(max(0, p.threshold - 2), len(shares))))
    mixed = honest + forged
    shuffle.shuffle(mixed)
    enough = len({sh.x for sh in honest}) >= p.threshold
    try:
        got = escrow.recover(d.commitments, mixed)
    except EscrowError:
        assert not enough  # with t honest shares among them it always succeeds
        return
    assert got == s


def test_a_forged_share_with_the_right_x_first_is_skipped() -> None:
    p, s, d = dealt([3, 3, 3, 1], 7)
    shares = all_shares(d)
    forged = Share(shares[0].x, (shares[0].y + 1) % L)
    assert escrow.recover(d.commitments, [forged, *shares[: p.threshold]]) == s
    with pytest.raises(EscrowError):
        escrow.recover(d.commitments, [forged, *shares[1: p.threshold]])


def test_without_verify_recover_takes_the_first_t_or_refuses() -> None:
    """``verify=False`` (the node's reveals: they find a lying verifier by its shares' batch check)
    opens C_0 from the first ``t`` alone and never searches share by share."""
    p, s, d = dealt([3, 3, 3, 1], 7)
    shares = all_shares(d)
    forged = Share(shares[0].x, (shares[0].y + 1) % L)
    assert escrow.recover(d.commitments, shares[: p.threshold], verify=False) == s
    with pytest.raises(EscrowError, match="do not open"):
        escrow.recover(d.commitments, [forged, *shares[1:]], verify=False)
    assert escrow.recover(d.commitments, [forged, *shares[1:]]) == s  # the search finds it


def test_forged_commitments_do_not_open_to_the_secret() -> None:
    p, _s, d = dealt([1, 1, 1, 1], 8)
    other = escrow.deal(escrow.new_secret(random.Random(9)), p, random.Random(10))
    with pytest.raises(EscrowError):
        escrow.recover(other.commitments, all_shares(d))


# --------------------------------------------------------------------------- zero and the identity


def test_a_zero_share_value_and_an_identity_sum_verify() -> None:
    """f(x) = s − s·x: C_1 = −C_0, so f(1) = 0 (0·B is the identity) and C_0 + C_1 is the identity."""
    s = escrow.new_secret(random.Random(11))
    commitments = (escrow._base(s), escrow._base(L - s))
    assert escrow._add(*commitments) == IDENTITY
    z, two = Share(1, 0), Share(2, L - s)
    assert escrow.verify_share(commitments, z) and escrow.verify_share(commitments, two)
    assert not escrow.verify_share(commitments, Share(1, 1))
    assert escrow.verify_shares(commitments, [z, two])
    assert escrow.recover(commitments, [z, two]) == s
    assert escrow.recover(commitments, [Share(1, 5), z, two]) == s


# --------------------------------------------------------------------------- opens, nonces, scalars


def test_opens_and_nonce() -> None:
    _p, s, d = dealt([1, 2, 3], 12)
    assert escrow.opens(d.commitments, s)
    assert not escrow.opens(d.commitments, s + 1 if s + 1 < L else 1)
    for bad in (0, L, -s, "s", None):
        assert not escrow.opens(d.commitments, bad)  # type: ignore[arg-type]
    assert not escrow.opens([], s) and not escrow.opens([IDENTITY], s)
    assert not escrow.opens(b"x" * 32, s)  # type: ignore[arg-type]
    n = escrow.nonce_of(s)
    assert n == escrow.nonce_of(s) and len(n) == escrow.NONCE_LEN == 16 and n != escrow.nonce_of(s % (L - 1) + 1)
    assert escrow.nonce_of(1).hex() == crypto.blake2b((1).to_bytes(32, "little"), size=16,
                                                        person=b"gt-escrow-nonce").hex()
    for not_secret in (0, L, 1.5, None):
        with pytest.raises(EscrowError):
            escrow.nonce_of(not_secret)  # type: ignore[arg-type]


def test_scalar_codec_is_strict() -> None:
    assert escrow.scalar_of(escrow.scalar_bytes(L - 1)) == L - 1
    assert escrow.scalar_bytes(0) == bytes(32)
    for bad in (L, -1, 2**256, True, 1.0):
        with pytest.raises(EscrowError):
            escrow.scalar_bytes(bad)  # type: ignore[arg-type]
    for raw in (L.to_bytes(32, "little"), b"\xff" * 32, bytes(31), bytes(33), bytearray(32), "x" * 32):
        with pytest.raises(EscrowError):
            escrow.scalar_of(raw)  # type: ignore[arg-type]


GARBAGE = [None, 0, "x", b"", b"x" * 32, [b"x"], (IDENTITY,), [ORDER_2], [NON_CANONICAL_Y], [1.5], {1: 2}]


@pytest.mark.parametrize("junk", GARBAGE)
def test_checks_answer_false_or_escrow_error_on_junk(junk: object) -> None:
    p, s, d = dealt([1, 1, 1, 1], 13)
    share = d.shares[0][0]
    assert not escrow.verify_share(junk, share)  # type: ignore[arg-type]
    assert not escrow.verify_share(d.commitments, junk)  # type: ignore[arg-type]
    assert not escrow.verify_shares(junk, [share])  # type: ignore[arg-type]
    assert not escrow.verify_shares(d.commitments, [junk])  # type: ignore[list-item]
    assert not escrow.verify_holder(p, 0, junk, d.shares[0])  # type: ignore[arg-type]
    assert not escrow.verify_holder(junk, 0, d.commitments, d.shares[0])  # type: ignore[arg-type]
    assert not escrow.opens(junk, s)  # type: ignore[arg-type]
    with pytest.raises(EscrowError):
        escrow.recover(junk, all_shares(d))  # type: ignore[arg-type]
    with pytest.raises(EscrowError):
        escrow.recover(d.commitments, junk)  # type: ignore[arg-type]
    for bad in (Share(0, share.y), Share(share.x, L), Share(share.x, -1), Share(True, share.y), Share(1025, 1)):
        assert not escrow.verify_share(d.commitments, bad)
    assert not escrow.verify_shares(d.commitments, [share, share])  # a repeated x


# --------------------------------------------------------------------------- wire


def test_codecs_round_trip() -> None:
    p, _s, d = dealt([450] + [70] * 15, 14)
    raw = escrow.encode_commitments(d.commitments)
    assert len(raw) == (1 if p.threshold < 16 else 3) + 34 * p.threshold
    assert escrow.decode_commitments(raw, p.threshold) == d.commitments
    with pytest.raises(EscrowError):
        escrow.decode_commitments(raw, p.threshold - 1)  # too many items
    for h in d.shares:
        enc = escrow.encode_shares(h)
        assert escrow.decode_shares(enc, len(h)) == h
        with pytest.raises(EscrowError):
            escrow.decode_shares(enc, len(h) - 1)
    assert escrow.decode_shares(escrow.encode_shares(()), 0) == ()
    big = Share(1024, L - 1)
    assert escrow.decode_shares(escrow.encode_shares([Share(1, 0), big]), 2) == (Share(1, 0), big)


def _pack(v: object) -> bytes:
    out: bytes = msgpack.packb(v, use_bin_type=True)
    return out


def _share_raw(x: object, y: object) -> bytes:
    return _pack([[x, y]])


@pytest.mark.parametrize("raw", [
    _share_raw(1, bytes(31)), _share_raw(1, bytes(33)), _share_raw(1, L.to_bytes(32, "little")),
    _share_raw(1, b"\xff" * 32), _share_raw(0, bytes(32)), _share_raw(1025, bytes(32)), _share_raw(-1, bytes(32)),
    _share_raw(True, bytes(32)), _share_raw(1.0, bytes(32)), _share_raw(1, "x" * 32), _share_raw(1, None),
    msgpack.packb([[2, bytes(32)], [1, bytes(32)]], use_bin_type=True),  # x not increasing
    msgpack.packb([[2, bytes(32)], [2, bytes(32)]], use_bin_type=True),  # x repeated
    msgpack.packb([[1, bytes(32), 0]], use_bin_type=True), msgpack.packb([[1]], use_bin_type=True),
    msgpack.packb([1, bytes(32)], use_bin_type=True), msgpack.packb({1: bytes(32)}, use_bin_type=True),
    _share_raw(1, bytes(32)) + b"\x00",  # trailing
    b"\x91\x92\xcd\x00\x01\xc4\x20" + bytes(32),  # x = 1 as a uint16: not canonical
    b"\xdc\x00\x01\x92\x01\xc4\x20" + bytes(32),  # an array16 of one: not canonical
    b"\x91\x92\x01\xc5\x00\x20" + bytes(32),  # a bin16 of 32 bytes: not canonical
    msgpack.packb([[1, bytes(32).decode()]]),  # a str, not a bin
    b"", b"\x91", b"\xc1", b"\x91\x92\x01",
])
def test_decode_shares_refuses(raw: bytes) -> None:
    with pytest.raises(EscrowError):
        escrow.decode_shares(raw, 4)


def test_decode_shares_refuses_too_many_and_bad_bounds() -> None:
    five = escrow.encode_shares([Share(x, x) for x in range(1, 6)])
    assert len(escrow.decode_shares(five, 5)) == 5
    with pytest.raises(EscrowError):
        escrow.decode_shares(five, 4)
    # 21 short shares fit in the byte bound of 20: the count refuses them
    many = escrow.encode_shares([Share(x, x) for x in range(1, 22)])
    with pytest.raises(EscrowError, match="21 shares; at most 20"):
        escrow.decode_shares(many, 20)
    with pytest.raises(EscrowError, match="trailing bytes"):
        escrow.decode_shares(five + b"\xc0", 6)
    for most in (-1, 1025, True, None):
        with pytest.raises(EscrowError):
            escrow.decode_shares(five, most)  # type: ignore[arg-type]
    with pytest.raises(EscrowError):
        escrow.decode_shares(bytearray(five), 5)  # type: ignore[arg-type]
    with pytest.raises(EscrowError):
        escrow.encode_shares([Share(2, 1), Share(1, 1)])
    with pytest.raises(EscrowError):
        escrow.encode_shares([Share(1, L)])


def test_decode_commitments_refuses() -> None:
    _p, _s, d = dealt([1, 1, 1, 1], 15)
    c0 = d.commitments[0]
    pack = _pack
    torsioned = escrow._add(c0, ORDER_8)  # on the curve, canonical, but not in the prime-order subgroup
    bad = [pack([]), pack([IDENTITY]), pack([ORDER_2]), pack([ORDER_4]), pack([ORDER_8]), pack([NON_CANONICAL_Y]),
           pack([torsioned]), pack([c0[:31]]), pack([c0 + b"\x00"]), pack([c0, 5]), pack(c0), pack([[c0]]),
           pack([c0]) + b"\x00", b"\xdc\x00\x01\xc4\x20" + c0, b"\x91\xc5\x00\x20" + c0, pack([c0] * 10)]
    for raw in bad:
        with pytest.raises(EscrowError):
            escrow.decode_commitments(raw, 9)
    for most in (0, 1025, None):
        with pytest.raises(EscrowError):
            escrow.decode_commitments(pack([c0]), most)  # type: ignore[arg-type]
    for junk in ([], [IDENTITY], [torsioned], [c0] * 1025):
        with pytest.raises(EscrowError):
            escrow.encode_commitments(junk)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400), st.integers(0, 40))
def test_decoders_raise_only_escrow_error_on_random_bytes(raw: bytes, most: int) -> None:
    for decode in (escrow.decode_shares, escrow.decode_commitments):
        try:
            decode(raw, max(most, 1))
        except EscrowError:
            pass


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_decoders_raise_only_escrow_error_on_mutated_encodings(data: st.DataObject) -> None:
    _p, _s, d = dealt([1, 2, 3, 4], 16)
    raw = bytearray(data.draw(st.sampled_from([escrow.encode_commitments(d.commitments),
                                               escrow.encode_shares(d.shares[3])])))
    for _ in range(data.draw(st.integers(1, 3))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    codecs: list[tuple[Callable[[bytes, int], Any], Callable[[Any], bytes]]] = [
        (escrow.decode_shares, escrow.encode_shares), (escrow.decode_commitments, escrow.encode_commitments)]
    for decode, encode in codecs:
        for candidate in (bytes(raw), bytes(raw[:cut])):
            try:
                out = decode(candidate, 16)
            except EscrowError:
                continue
            assert encode(out) == candidate  # only the canonical encoding decodes
