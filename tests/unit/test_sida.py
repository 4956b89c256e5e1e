"""S-IDA cloves (overlay.anon.sida, paper §3.2): recovery, robustness, wire strictness, reassembly."""

from __future__ import annotations

import dataclasses
import itertools
import random
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from overlay.anon import sida
from overlay.anon.sida import (
    FP_LEN,
    MAX_MESSAGE,
    MAX_N,
    Clove,
    Reassembler,
    SidaError,
    decode_clove,
    encode_clove,
    fragment_len,
    recover,
    split,
)
from overlay.wire import codec
from overlay.wire.crypto import blake2b
from overlay.wire.messages import Ping

rng = random.Random(1234)


def rand_bytes(n: int) -> bytes:
    return rng.randbytes(n)


def boundary_sizes(k: int) -> list[int]:
    """0, 1 and sizes around whole fragments for threshold k (block = ceil((L + 17) / k))."""
    out = {0, 1, 2}
    for blocks in (1, 2, 7, 64):
        edge = blocks * k - 17
        out.update(s for s in (edge - 1, edge, edge + 1) if s >= 0)
    return sorted(out)


def reforge(cloves: list[Clove], *, share: bytes | None = None, fragment_xor: int = 0) -> list[Clove]:
    """Self-consistent cloves with a recomputed fingerprint vector but a wrong key
    (``share``) or ciphertext (``fragment_xor``): they group together, then fail AEAD."""
    n = cloves[0].n
    frags = [bytes([c.fragment[0] ^ fragment_xor]) + c.fragment[1:] for c in cloves]
    shares = [share or c.share for c in cloves]
    frag_fp = [blake2b(f, size=FP_LEN, person=b"gt-sida-frag") for f in frags]
    share_fp = [blake2b(s, size=FP_LEN, person=b"gt-sida-share") for s in shares]
    fps = b"".join(frag_fp + share_fp)
    assert len(cloves) == n
    return [
        dataclasses.replace(c, fragment=f, share=s, fingerprints=fps)
        for c, f, s in zip(cloves, frags, shares, strict=True)
    ]


# --------------------------------------------------------------------------- any k of n


def test_every_k_subset_recovers_for_n_up_to_6() -> None:
    for n in range(1, 7):
        for k in range(1, n + 1):
            for size in boundary_sizes(k):
                m = rand_bytes(size)
                cloves = split(m, n, k)
                assert len(cloves) == n
                assert len({c.msg_id for c in cloves}) == 1
                assert [c.index for c in cloves] == list(range(n))
                assert {len(c.fragment) for c in cloves} == {fragment_len(size, k)}
                for sub in itertools.combinations(cloves, k):
                    assert recover(sub) == m
                    assert recover(reversed(sub)) == m
                if k > 1:
                    for sub in itertools.combinations(cloves, k - 1):
                        with pytest.raises(SidaError):
                            recover(sub)


def test_sampled_subsets_recover_for_n_up_to_16() -> None:
    for n in range(7, MAX_N + 1):
        for k in range(1, n + 1):
            m = rand_bytes(rng.choice([0, 1, 100, 1000, 5000]))
            cloves = split(m, n, k)
            for _ in range(3):
                assert recover(rng.sample(cloves, k)) == m
            assert recover(cloves) == m
            if k > 1:
                with pytest.raises(SidaError):
                    recover(rng.sample(cloves, k - 1))


@pytest.mark.parametrize(
    ("size", "n", "k"),
    [(MAX_MESSAGE, 4, 3), (MAX_MESSAGE, 16, 16), (MAX_MESSAGE, 5, 1), (256 * 1024 + 1, 16, 9), (65536, 4, 3)],
)
def test_large_messages(size: int, n: int, k: int) -> None:
    m = rand_bytes(size)
    cloves = split(m, n, k)
    assert recover(cloves[-k:]) == m
    assert recover(cloves[:k]) == m
    assert decode_clove(encode_clove(cloves[0])) == cloves[0]


def test_k_equals_1_and_n_equals_k() -> None:
    m = b"hello"
    for c in split(m, 5, 1):
        assert recover([c]) == m
    cloves = split(m, 3, 3)
    assert recover(cloves) == m
    with pytest.raises(SidaError):
        recover(cloves[:2])
    assert recover(split(m, 1, 1)) == m


def test_defaults_are_4_of_3_and_msg_id_is_fresh_or_given() -> None:
    a, b = split(b"x"), split(b"x")
    assert (a[0].n, a[0].k, len(a)) == (4, 3, 4)
    assert a[0].msg_id != b[0].msg_id
    assert a[0].fragment != b[0].fragment  # fresh key every time
    mid = bytes(range(16))
    assert {c.msg_id for c in split(b"x", msg_id=mid)} == {mid}


def test_accepts_bytes_like() -> None:
    assert recover(split(bytearray(b"abc"))) == b"abc"
    assert recover(split(memoryview(b"abc"))) == b"abc"


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((b"x", 4, 0), {}),
        ((b"x", 3, 4), {}),
        ((b"x", 17, 3), {}),
        ((b"x", 0, 0), {}),
        ((b"x", 4.0, 3), {}),
        ((bytes(MAX_MESSAGE + 1),), {}),
        ((b"x",), {"msg_id": b"short"}),
        (("text",), {}),
    ],
)
def test_split_rejects_bad_parameters(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    with pytest.raises(SidaError):
        split(*args, **kwargs)


# --------------------------------------------------------------------------- robustness

TAMPERS = (
    "fragment", "share", "fingerprint_own", "fingerprint_other", "index", "msg_id", "k",
    "index_out_of_range", "k_over_n", "fragment_length",
)


def tamper(c: Clove, how: str, r: random.Random) -> Clove | None:
    def flip(b: bytes, pos: int) -> bytes:
        return b[:pos] + bytes([b[pos] ^ (1 << r.randrange(8))]) + b[pos + 1:]

    try:
        if how == "fragment":
            return dataclasses.replace(c, fragment=flip(c.fragment, r.randrange(len(c.fragment))))
        if how == "share":
            return dataclasses.replace(c, share=flip(c.share, r.randrange(32)))
        if how == "fingerprint_own":
            pos = c.index * FP_LEN + r.randrange(FP_LEN)
            return dataclasses.replace(c, fingerprints=flip(c.fingerprints, pos))
        if how == "fingerprint_other":
            return dataclasses.replace(c, fingerprints=flip(c.fingerprints, r.randrange(len(c.fingerprints))))
        if how == "index":
            return dataclasses.replace(c, index=(c.index + 1 + r.randrange(c.n - 1)) % c.n) if c.n > 1 else None
        if how == "msg_id":
            return dataclasses.replace(c, msg_id=flip(c.msg_id, r.randrange(16)))
        if how == "k":
            return dataclasses.replace(c, k=r.randrange(1, c.n + 1))
        # Ill-formed cloves (decode_clove would refuse them; built directly here).
        if how == "index_out_of_range":
            return dataclasses.replace(c, index=c.n + r.randrange(3))
        if how == "k_over_n":
            return dataclasses.replace(c, k=c.n + 1)
        if how == "fragment_length":
            return dataclasses.replace(c, fragment=c.fragment[:-1])
    except ValueError:
        return None
    raise AssertionError(how)


@st.composite
def attack(draw: st.DrawFn) -> tuple[bytes, int, list[Clove], list[Clove]]:
    """(message, k, cloves as received, the untouched authentic cloves among them)."""
    n = draw(st.integers(1, 8))
    k = draw(st.integers(1, n))
    m = draw(st.binary(max_size=300))
    r = draw(st.randoms(use_true_random=False))
    cloves = split(m, n, k)
    kept = [c for c in cloves if draw(st.integers(0, 3))]  # each lost with p = 1/4
    received: list[Clove] = []
    authentic: list[Clove] = []
    for c in kept:
        how = draw(st.one_of(st.just("none"), st.sampled_from(TAMPERS)))
        if how == "none":
            authentic.append(c)
            received.append(c)
        else:
            t = tamper(c, how, r)
            if t is not None:
                received.append(t)
    # Forgers: fewer than k' cloves of their own split under the same msg_id
    # (maybe with another (n', k')), junk copying the real fingerprint vector,
    # and cloves of another message.
    for _ in range(draw(st.integers(0, 3))):
        n2 = draw(st.integers(1, 8))
        k2 = draw(st.integers(1, n2))
        if k2 > 1:
            forged = split(draw(st.binary(max_size=50)), n2, k2, msg_id=cloves[0].msg_id)
            received.extend(r.sample(forged, draw(st.integers(1, k2 - 1))))
    for _ in range(draw(st.integers(0, 2))):
        c = r.choice(cloves)
        received.append(dataclasses.replace(c, fragment=bytes(len(c.fragment)), share=bytes(32)))
    if k > 1 and draw(st.booleans()):
        received.extend(split(m, n, k)[: k - 1])  # same message, another msg_id: k − 1 only
    if draw(st.booleans()):
        received.extend(reforge(split(m, n, k, msg_id=cloves[0].msg_id), share=bytes(32)))
    r.shuffle(received)
    return m, k, received, authentic


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(attack())
def test_recover_is_robust(case: tuple[bytes, int, list[Clove], list[Clove]]) -> None:
    m, k, received, authentic = case
    try:
        out = recover(received)
    except SidaError:
        assert len(authentic) < k
    else:
        assert out == m  # never garbage, never a forger's fragment of a message


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(attack(), st.randoms(use_true_random=False))
def test_reassembler_is_robust(case: tuple[bytes, int, list[Clove], list[Clove]], r: random.Random) -> None:
    m, k, received, authentic = case
    ra = Reassembler()
    outs = [out for c in received if (out := ra.add(c, 0.0)) is not None]
    if len(authentic) >= k:
        assert outs == [m]
    else:
        assert outs in ([], [m])
    assert ra.bytes_held >= 0


def test_self_consistent_group_that_fails_aead_does_not_stop_the_real_one() -> None:
    m = b"the real prompt"
    real = split(m, 4, 3)
    bad_key = reforge(split(b"other", 4, 3, msg_id=real[0].msg_id), share=bytes(32))
    bad_ct = reforge(real, fragment_xor=1)
    assert recover(bad_key + bad_ct + real[1:]) == m  # larger bad groups are tried first
    with pytest.raises(SidaError, match="failed authentication"):
        recover(bad_key + bad_ct + real[1:2])


def test_forged_group_of_wrong_key_never_returns_garbage() -> None:
    cloves = reforge(split(b"secret", 4, 2), share=bytes(32))
    with pytest.raises(SidaError):
        recover(cloves)


def test_groups_with_another_k_do_not_hide_a_complete_one() -> None:
    # A forged group that is larger but short of *its* k must not end the search.
    m = b"k is one"
    real = split(m, 6, 1)
    forged = split(b"fake", 7, 5, msg_id=real[0].msg_id)
    assert recover([*forged[:4], real[3]]) == m
    ra = Reassembler()
    assert [ra.add(c, 0.0) for c in [*forged[:4], real[3]]][-1] == m


def test_cloves_of_other_messages_never_mix() -> None:
    a_msg, b_msg = b"A" * 100, b"B" * 100
    a, b = split(a_msg, 4, 3), split(b_msg, 4, 3)
    with pytest.raises(SidaError):
        recover([a[0], a[1], b[2], b[3]])
    assert recover([a[0], b[0], a[1], b[1], a[2]]) == a_msg
    # Same msg_id reused for another message (e.g. a forger's): still never mixed.
    c = split(b_msg, 4, 3, msg_id=a[0].msg_id)
    with pytest.raises(SidaError):
        recover([a[0], a[1], c[2], c[3]])


def test_inconsistent_n_k_are_kept_apart() -> None:
    a = split(b"A" * 40, 4, 3)
    other = split(b"A" * 40, 5, 3, msg_id=a[0].msg_id)
    assert recover([other[0], a[0], other[1], a[1], a[2]]) == b"A" * 40
    with pytest.raises(SidaError):
        recover([a[0], a[1], other[2]])


def test_recover_errors() -> None:
    with pytest.raises(SidaError, match="no cloves"):
        recover([])
    with pytest.raises(SidaError):
        recover([b"not a clove"])  # type: ignore[list-item]  # deliberately not cloves


def test_time_is_linear_no_subset_search() -> None:
    # 16 cloves at each of 16 indexes, only one group authentic: a subset search
    # would try C(256, 9) sets; grouping touches each clove once.
    real = split(b"m" * 1000, 16, 9)
    junk = []
    for _ in range(15):
        junk += reforge(split(b"x" * 1000, 16, 9, msg_id=real[0].msg_id), share=bytes(32))
    assert recover(junk + real[:9]) == b"m" * 1000


# --------------------------------------------------------------------------- wire


def raw_fields(c: Clove) -> list[object]:
    return [c.msg_id, c.index, c.n, c.k, c.fragment, c.share, c.fingerprints]


def pack(fields: list[object], code: int = 200) -> bytes:
    data: bytes = msgpack.packb([codec.WIRE_VERSION, code, *fields], use_bin_type=True)
    return data


def test_encode_decode_roundtrip_and_wire_type() -> None:
    for c in split(b"payload" * 10, 6, 4):
        data = encode_clove(c)
        assert decode_clove(data, peer="p") == c
        assert pack(raw_fields(c)) == data
    assert codec.registered_types()[200] is Clove


def test_encoding_is_compact() -> None:
    c = split(bytes(4096), 4, 3)[0]
    overhead = len(encode_clove(c)) - len(c.fragment) - 32 - 2 * 4 * FP_LEN - 16
    assert overhead <= 16


def test_decode_rejects_truncation() -> None:
    data = encode_clove(split(b"x" * 50)[0])
    for cut in range(len(data)):
        with pytest.raises(codec.RemoteProtocolError):
            decode_clove(data[:cut], peer="p")
    with pytest.raises(codec.RemoteProtocolError):
        decode_clove(data + b"\x00")


def _mutations(c: Clove) -> list[tuple[str, list[object]]]:
    f = raw_fields(c)
    n = c.n

    def with_(i: int, v: object) -> list[object]:
        g = list(f)
        g[i] = v
        return g

    return [
        ("msg_id short", with_(0, c.msg_id[:15])),
        ("msg_id str", with_(0, "x" * 16)),
        ("index str", with_(1, "0")),
        ("index bool", with_(1, True)),
        ("index = n", with_(1, n)),
        ("index negative", with_(1, -1)),
        ("n = 0", with_(2, 0)),
        ("n > MAX_N", with_(2, MAX_N + 1)),
        ("k = 0", with_(3, 0)),
        ("k > n", with_(3, n + 1)),
        ("k float", with_(3, 3.0)),
        ("fragment str", with_(4, "abc")),
        ("fragment empty", with_(4, b"")),
        ("fragment too long for k", with_(4, bytes(fragment_len(MAX_MESSAGE, c.k) + 1))),
        ("share 31", with_(5, c.share[:31])),
        ("share 33", with_(5, c.share + b"\x00")),
        ("share none", with_(5, None)),
        ("fingerprints short", with_(6, c.fingerprints[:-1])),
        ("fingerprints for other n", with_(6, bytes(2 * (n + 1) * FP_LEN))),
        ("missing field", f[:-1]),
        ("extra field", [*f, b""]),
    ]


def test_decode_rejects_malformed_fields() -> None:
    c = split(b"x" * 50, 4, 3)[2]
    for name, fields in _mutations(c):
        with pytest.raises(codec.RemoteProtocolError) as info:
            decode_clove(pack(fields), peer="peer-1")
        assert info.value.peer == "peer-1", name


def test_decode_rejects_other_message_types() -> None:
    with pytest.raises(codec.RemoteProtocolError, match="expected a Clove"):
        decode_clove(codec.encode(Ping(nonce=1)))
    with pytest.raises(codec.RemoteProtocolError):
        decode_clove(pack(raw_fields(split(b"x")[0]), code=201))


@settings(max_examples=300)
@given(st.binary(max_size=300))
def test_decode_random_bytes_only_raises_protocol_errors(data: bytes) -> None:
    try:
        decode_clove(data)
    except codec.RemoteProtocolError:
        pass


ILL_FORMED = (
    {"index": 4}, {"index": -1}, {"index": "0"}, {"k": 5}, {"k": 0}, {"n": 17}, {"n": 3},
    {"share": b"a"}, {"share": "x" * 32}, {"fingerprints": b""}, {"fragment": b""},
    {"fragment": bytes(fragment_len(MAX_MESSAGE, 3) + 1)}, {"msg_id": b"short"},
)


def test_ill_formed_cloves_are_explained_and_ignored() -> None:
    m = b"x" * 40
    cloves = split(m)
    assert all(sida.clove_problem(c) is None for c in cloves)
    for kw in ILL_FORMED:
        bad = dataclasses.replace(cloves[0], **kw)
        assert sida.clove_problem(bad), kw
        with pytest.raises(SidaError):
            recover([bad, cloves[1], cloves[2]])
        assert recover([bad, *cloves[1:]]) == m
        ra = Reassembler()
        assert ra.add(bad, 0.0) is None and ra.stats["rejected"] == 1 and len(ra) == 0
        if kw.get("index") == 4 or kw.get("n") == 3:
            # Even a whole set of them never reaches zfec with bad share numbers.
            many = [dataclasses.replace(c, **kw) for c in cloves]
            with pytest.raises(SidaError):
                recover(many)


# --------------------------------------------------------------------------- Reassembler


def test_reassembler_yields_once_at_k() -> None:
    m = b"prompt"
    cloves = split(m, 4, 3)
    ra = Reassembler()
    assert ra.add(cloves[3], 0.0) is None
    assert ra.add(cloves[3], 0.0) is None  # duplicate
    assert ra.add(cloves[1], 0.1) is None
    assert len(ra) == 1
    assert ra.add(cloves[0], 0.2) == m
    assert len(ra) == 0
    assert ra.add(cloves[2], 0.3) is None  # late clove of a finished message
    assert len(ra) == 0 and ra.stats["completed"] == 1 and ra.stats["late"] == 1
    assert ra.bytes_held == 0


def test_reassembler_interleaved_messages() -> None:
    msgs = {rand_bytes(16): rand_bytes(rng.randrange(0, 3000)) for _ in range(60)}
    stream = []
    for mid, m in msgs.items():
        stream += split(m, 5, 3, msg_id=mid)
    rng.shuffle(stream)
    ra = Reassembler()
    got: dict[bytes, bytes] = {}
    for t, c in enumerate(stream):
        out = ra.add(c, t * 0.001)
        if out is not None:
            assert c.msg_id not in got
            got[c.msg_id] = out
    assert got == msgs
    assert len(ra) == 0


def test_forged_first_does_not_block() -> None:
    m = b"real"
    real = split(m, 4, 3)
    ra = Reassembler(max_candidates_per_index=1)
    # A forger fills every index first with self-consistent cloves of its own.
    for i in range(4):
        forged = split(b"fake%d" % i, 4, 3, msg_id=real[0].msg_id)
        assert ra.add(forged[i], 0.0) is None
    assert ra.add(real[0], 0.1) is None
    assert ra.add(real[1], 0.2) is None
    assert ra.add(real[2], 0.3) == m


def test_tampered_cloves_are_dropped_on_arrival() -> None:
    m = b"real"
    real = split(m, 4, 3)
    ra = Reassembler()
    bad = dataclasses.replace(real[0], share=bytes(32))
    assert ra.add(bad, 0.0) is None
    assert ra.stats["rejected"] == 1
    assert ra.add(real[0], 0.0) is None
    assert ra.add(real[1], 0.0) is None
    assert ra.add(real[3], 0.0) == m


def test_reassembler_failed_group_then_real_group() -> None:
    m = b"real"
    real = split(m, 4, 3)
    bad = reforge(split(b"fake", 4, 3, msg_id=real[0].msg_id), share=bytes(32))
    ra = Reassembler()
    for c in bad:
        assert ra.add(c, 0.0) is None
    assert ra.stats["failed_groups"] == 1
    assert ra.add(bad[3], 0.0) is None  # remembered as dead, not decoded again
    assert ra.stats["failed_groups"] == 1
    assert [ra.add(c, 0.0) for c in real] == [None, None, m, None]


def test_reassembler_inconsistent_n_k_cannot_poison() -> None:
    m = b"real"
    real = split(m, 4, 3)
    other = split(b"fake", 6, 2, msg_id=real[0].msg_id)
    ra = Reassembler()
    assert ra.add(other[0], 0.0) is None  # first clove seen has (6, 2)
    assert ra.add(real[0], 0.0) is None
    assert ra.add(real[1], 0.0) is None
    assert ra.add(real[2], 0.0) == m


def test_reassembler_expiry() -> None:
    cloves = split(b"slow", 4, 3)
    ra = Reassembler(ttl=10.0)
    ra.add(cloves[0], 0.0)
    ra.add(cloves[1], 1.0)
    other = split(b"later", 4, 3)
    ra.add(other[0], 5.0)
    assert ra.expire(9.0) == 0
    assert ra.expire(10.5) == 1
    assert len(ra) == 1
    assert ra.add(cloves[2], 11.0) is None  # its first cloves are gone
    assert ra.stats["expired"] == 1
    assert ra.expire(100.0) == 2
    assert len(ra) == 0 and ra.bytes_held == 0


def test_finished_ids_are_forgotten_after_ttl() -> None:
    cloves = split(b"m", 4, 3)
    ra = Reassembler(ttl=5.0)
    assert [ra.add(c, 0.0) for c in cloves[:3]][-1] == b"m"
    assert ra.add(cloves[3], 4.0) is None and len(ra) == 0
    assert ra.add(cloves[3], 6.0) is None and len(ra) == 1  # treated as new, then expires
    assert ra.expire(20.0) == 1


def test_reassembler_bounded_under_flood() -> None:
    ra = Reassembler(max_messages=64, max_candidates_per_index=2)
    junk = split(b"j" * 200, 4, 3)
    for i in range(5000):
        c = junk[i % 4]
        ra.add(dataclasses.replace(c, msg_id=i.to_bytes(16, "big")), i * 1e-4)
        assert len(ra) <= 64
    assert ra.stats["evicted"] == 5000 - 64
    m = b"still works"
    assert [ra.add(c, 1.0) for c in split(m)][2] == m


def test_reassembler_byte_bound() -> None:
    ra = Reassembler(max_bytes=300_000)
    msgs = [split(rand_bytes(100_000), 4, 3) for _ in range(10)]
    for cloves in msgs:
        for c in cloves[:2]:
            ra.add(c, 0.0)
            assert ra.bytes_held <= 300_000
    assert ra.stats["evicted"] > 0
    # The newest message still completes.
    assert ra.add(msgs[-1][2], 0.0) is not None


def test_reassembler_drops_a_clove_over_max_bytes_when_nothing_else_can_go() -> None:
    cloves = split(rand_bytes(1_000), 4, 3)
    ra = Reassembler(max_bytes=sida._clove_cost(cloves[0]) + 1)
    assert ra.add(cloves[0], 0.0) is None
    assert ra.add(cloves[1], 0.0) is None  # only its own message holds bytes: no one to evict
    assert ra.stats["dropped"] == 1 and ra.stats["evicted"] == 0
    assert ra.bytes_held == sida._clove_cost(cloves[0])


def test_reassembler_counts_a_repeated_clove_once() -> None:
    cloves = split(b"twice", 4, 3)
    ra = Reassembler()
    assert ra.add(cloves[0], 0.0) is None
    assert ra.add(cloves[0], 0.0) is None
    assert ra.stats["duplicates"] == 1
    assert ra.add(cloves[1], 0.0) is None and ra.add(cloves[2], 0.0) == b"twice"


def test_reassembler_per_index_bound() -> None:
    real = split(b"x", 4, 3)
    ra = Reassembler(max_candidates_per_index=3)
    for j in range(50):
        forged = split(b"f%d" % j, 4, 3, msg_id=real[0].msg_id)
        ra.add(forged[0], 0.0)
        assert ra.bytes_held <= 3 * sida._clove_cost(forged[0])
    assert ra.add(real[0], 0.0) is None
    assert ra.add(real[1], 0.0) is None
    assert ra.add(real[2], 0.0) == b"x"


def test_reassembler_rejects_non_cloves_and_bad_limits() -> None:
    with pytest.raises(TypeError):
        Reassembler().add(b"bytes", 0.0)  # type: ignore[arg-type]  # deliberately not a Clove
    with pytest.raises(ValueError):
        Reassembler(max_messages=0)
