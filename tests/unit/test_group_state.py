"""Group state synchronisation (paper §3.3 "State synchronization"): peers' load reports and
subtrees, deltas over lossy links, expiry of silent peers, the group split rule — and every
kind of bad input dropped with a counted reason, leaving the tree and the table unchanged."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from model_node.forwarding import Load
from model_node.group import GroupConfig, GroupState, group_of, split_groups
from model_node.hrtree import MAX_DEPTH, ChunkLengths
from model_node.messages import MAX_PATH_BYTES, LengthProposal, LoadReport, SubtreeRequest, SubtreeUpdate
from overlay.anon.actions import Send
from overlay.wire.codec import RemoteProtocolError, decode, encode
from overlay.wire.messages import Ping

ME, P1, P2, OUT = b"\x10" * 20, b"\x01" * 20, b"\x02" * 20, b"\xee" * 20
L = ChunkLengths()
D = L.digest


def load(seq: int = 1, active: int = 1, queued: int = 0, capacity: int = 2, kv: int = 100, latency: int = 50,
         requests: int = 0, version: int = 0) -> LoadReport:
    return LoadReport(seq, version, active, queued, capacity, kv, latency, requests)


def full(seq: int, *paths: bytes, version: int = 0, digest: bytes = D) -> SubtreeUpdate:
    return SubtreeUpdate(seq, 0, True, version, digest, tuple(paths), ())


def delta(base: int, seq: int, added: tuple[bytes, ...] = (), removed: tuple[bytes, ...] = ()) -> SubtreeUpdate:
    return SubtreeUpdate(seq, base, False, 0, D, added, removed)


def state(max_paths: int = 8) -> GroupState:
    gs = GroupState(ME, [ME, P1, P2], capacity=2, config=GroupConfig(max_paths_per_node=max_paths))
    assert gs.on_message(P1, load(), 0.0) == []
    assert gs.on_message(P1, full(1, b"\x01\x02", b"\x01\x03"), 0.0) == []
    return gs


def snapshot(gs: GroupState) -> Any:
    table = {k: (v.active, v.queued, v.capacity, v.kv_usage_permille, v.latency_ms) for k, v in gs.table().items()}
    return sorted(gs.tree.iter_paths()), gs.tree.tree_node_count(), table, {
        p: (s.load_seq, s.subtree_seq) for p, s in gs.peers.items()}


# --------------------------------------------------------------------------- bad input

BAD: list[tuple[str, bytes, Any, str]] = [
    # (case, sender, message, counted reason)
    ("load from a non-member", OUT, load(seq=2), "non-member"),
    ("subtree from a non-member", OUT, full(2, b"\x09"), "non-member"),
    ("proposal from a non-member", OUT, LengthProposal(5, (100, 16), 256, 8), "non-member"),
    ("a message from ourselves", ME, load(seq=2), "from-self"),
    ("a message of another protocol", P1, Ping(1), "unexpected-message"),
    ("capacity 0", P1, load(seq=2, capacity=0), "bad-load"),
    ("capacity 11", P1, load(seq=2, capacity=11), "bad-load"),
    ("negative active", P1, load(seq=2, active=-1), "bad-load"),
    ("absurd queue", P1, load(seq=2, queued=10**9), "bad-load"),
    ("kv usage over 1000 permille", P1, load(seq=2, kv=1001), "bad-load"),
    ("latency beyond reason", P1, load(seq=2, latency=10**12), "bad-load"),
    ("negative seq", P1, load(seq=-5), "bad-load"),
    ("L version past 2^62", P1, load(seq=2, version=2**62 + 1), "bad-load"),
    ("proposal with a version past 2^62", P1, LengthProposal(2**63 - 1, (100, 16), 256, 8), "bad-proposal"),
    ("late load report", P1, load(seq=1, active=7), "stale-load"),
    ("subtree under an older L version", P1, full(2, b"\x09", version=3), "wrong-l-version"),
    ("subtree under another L of our version", P1, full(2, b"\x09", digest=b"\0" * 8), "wrong-l-digest"),
    ("oversized full subtree", P1, full(2, *[bytes([i]) for i in range(9)]), "oversized"),
    ("oversized delta", P1, delta(1, 2, tuple(bytes([9, i]) for i in range(5)), tuple(bytes([8, i]) for i in range(4))),
     "oversized"),
    ("delta past the per-node limit", P1, delta(1, 2, tuple(bytes([9, i]) for i in range(7))), "oversized"),
    ("empty path", P1, full(2, b""), "malformed-path"),
    ("path deeper than MAX_DEPTH", P1, full(2, b"\x01" * (MAX_DEPTH + 1)), "malformed-path"),
    ("duplicate paths", P1, full(2, b"\x05", b"\x05"), "inconsistent"),
    ("path both added and removed", P1, delta(1, 2, (b"\x05",), (b"\x05",)), "inconsistent"),
    ("full subtree with removals", P1, SubtreeUpdate(2, 0, True, 0, D, (b"\x05",), (b"\x01\x02",)), "inconsistent"),
    ("full subtree with a base", P1, SubtreeUpdate(2, 1, True, 0, D, (b"\x05",), ()), "inconsistent"),
    ("delta going backwards", P1, delta(1, 1), "inconsistent"),
    ("negative sequence", P1, SubtreeUpdate(-2, 0, True, 0, D, (b"\x05",), ()), "inconsistent"),
    ("delta removing a path it never had", P1, delta(1, 2, removed=(b"\x07",)), "inconsistent"),
    ("delta adding a path it already has", P1, delta(1, 2, added=(b"\x01\x02",)), "inconsistent"),
    ("late full subtree", P1, full(1, b"\x05"), "stale-subtree"),
    ("late delta", P1, delta(0, 1, added=(b"\x05",)), "stale-subtree"),
    ("delta on a round we never got", P1, delta(2, 3, added=(b"\x05",)), "delta-gap"),
    ("malformed proposal", P1, LengthProposal(5, (0, 16), 256, 8), "bad-proposal"),
    ("proposal with absurd bits", P1, LengthProposal(5, (100,), 256, 40), "bad-proposal"),
    ("request for another L's subtree", P1, SubtreeRequest(4), "wrong-l-version"),
]


@pytest.mark.parametrize(("case", "sender", "msg", "reason"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_dropped_with_a_reason(case: str, sender: bytes, msg: Any, reason: str) -> None:
    gs = state()
    before = snapshot(gs)
    lengths = gs.lengths
    gs.on_message(sender, msg, 1.0)
    assert dict(gs.dropped) == {reason: 1}
    assert gs.lengths == lengths
    after = snapshot(gs)
    assert after[:3] == before[:3]  # tree and table unchanged


def test_dropped_reasons_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    gs = state()
    with caplog.at_level("DEBUG", logger="gentorrent.model.group"):
        gs.on_message(OUT, load(seq=2), 1.0)
        gs.on_message(P1, load(seq=2, capacity=0), 1.0)
    text = caplog.text
    assert "non-member" in text and "bad-load" in text and "capacity 0" in text
    assert OUT.hex()[:8] in text


def test_the_codec_refuses_oversize_paths_and_lists() -> None:
    """Bounds the codec enforces before the group state even sees the message."""
    huge_path = SubtreeUpdate(1, 0, True, 0, D, (b"\x01" * (MAX_PATH_BYTES + 1),), ())
    many = SubtreeUpdate(1, 0, True, 0, D, tuple(bytes([i % 256, i // 256]) for i in range(1025)), ())
    for msg in (huge_path, many):
        payload = msgpack.packb([1, 301, *[getattr(msg, f) for f in msg.__dataclass_fields__]], use_bin_type=True)
        with pytest.raises(RemoteProtocolError):
            decode(payload, peer="p1")


def test_a_gap_asks_for_the_full_subtree_once_per_round() -> None:
    gs = state()
    out = gs.on_message(P1, delta(2, 3, added=(b"\x05",)), 1.0)
    assert out == [Send(P1, SubtreeRequest(0))]
    assert gs.on_message(P1, delta(3, 4, added=(b"\x06",)), 2.0) == []  # asked already this round
    assert gs.on_message(P1, delta(4, 5, added=(b"\x07",)), 7.0) == [Send(P1, SubtreeRequest(0))]
    assert gs.on_message(P1, full(5, b"\x01\x02", b"\x05", b"\x06", b"\x07"), 7.0) == []
    assert gs.on_message(P1, delta(5, 6, removed=(b"\x05",)), 7.0) == []
    assert sorted(gs.tree.paths(P1)) == [b"\x01\x02", b"\x06", b"\x07"]
    assert gs.dropped == {"delta-gap": 3}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seq=st.integers(-(2**63), 2**64 - 1), base=st.integers(-(2**63), 2**64 - 1), is_full=st.booleans(),
       version=st.integers(0, 3), digest=st.sampled_from([D, b"\0" * 8]),
       added=st.lists(st.binary(max_size=4), max_size=10), removed=st.lists(st.binary(max_size=4), max_size=10),
       nums=st.lists(st.integers(-(2**63), 2**64 - 1), min_size=8, max_size=8))
def test_fuzzed_reports_never_crash_or_poison(seq: int, base: int, is_full: bool, version: int, digest: bytes,
                                              added: list[bytes], removed: list[bytes], nums: list[int]) -> None:
    gs = state()
    before = snapshot(gs)
    update = SubtreeUpdate(seq, base, is_full, version, digest, tuple(added), tuple(removed))
    gs.on_message(P1, update, 1.0)
    gs.on_message(P1, LoadReport(*nums), 1.0)
    paths = dict.fromkeys(p for _, p in gs.tree.iter_paths())
    assert all(L.path_problem(p) is None for p in paths)  # only well-formed paths get in
    assert gs.tree.path_count(P1) <= 8
    if sum(gs.dropped.values()) == 2:
        assert snapshot(gs)[:3] == before[:3]
    for info in gs.table().values():
        assert 1 <= info.capacity <= 10 and info.active >= 0 and info.queued >= 0


# --------------------------------------------------------------------------- synchronisation


def deliver(nodes: dict[bytes, GroupState], sender: bytes, sends: list[Send], now: float,
            lose: Callable[[Send], bool] = lambda s: False) -> int:
    queue, sent_bytes = [(sender, s) for s in sends], 0
    while queue:
        frm, s = queue.pop(0)
        payload = encode(s.msg)
        sent_bytes += len(payload)
        if lose(s) or s.peer not in nodes:
            continue
        queue += [(s.peer, r) for r in nodes[s.peer].on_message(frm, decode(payload), now)]
    return sent_bytes


def test_subtrees_and_loads_flow_as_deltas() -> None:
    rng = random.Random(3)
    ids = [ME, P1, P2]
    nodes = {i: GroupState(i, ids, capacity=3) for i in ids}
    prompts = [[rng.randrange(50_000) for _ in range(rng.randrange(300, 3000))] for _ in range(30)]
    nodes[P1].set_local_prefixes(prompts[:10])
    nodes[P1].set_local_load(Load(active=2, queued=1, capacity=3, kv_usage_permille=400, latency_ms=80))
    sizes = []
    for r in range(4):
        if r == 2:
            nodes[P1].set_local_prefixes(prompts[5:12])  # evict 5, cache 2 more
        sizes.append(deliver(nodes, P1, nodes[P1].tick(5.0 * r), 5.0 * r))
    for other in (ME, P2):
        assert nodes[other].tree.paths(P1) == nodes[P1].tree.paths(P1)
        assert nodes[other].search(prompts[6] + [1] * 5).candidates == {P1}
        assert nodes[other].search(prompts[1]).candidates == frozenset()
        info = nodes[other].table()[P1]
        assert (info.active, info.queued, info.capacity, info.kv_usage_permille, info.latency_ms) == (2, 1, 3, 400, 80)
        assert not nodes[other].dropped
    assert sizes[1] < sizes[0] / 2  # an unchanged round costs a tiny delta, not the subtree
    assert sizes[3] < sizes[0] / 2


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), rounds=st.integers(1, 12), loss=st.floats(0.0, 0.7))
def test_lost_and_late_updates_converge(seed: int, rounds: int, loss: float) -> None:
    """Random cache changes on P1, a lossy link that also delivers late copies; two clean
    rounds after, ME holds exactly P1's subtree."""
    rng = random.Random(seed)
    ids = [ME, P1]
    nodes = {i: GroupState(i, ids, capacity=1, lengths=ChunkLengths(tail=4)) for i in ids}
    pool = [[rng.randrange(1000) for _ in range(rng.randrange(4, 40))] for _ in range(25)]
    late: list[Send] = []
    for r in range(rounds):
        nodes[P1].set_local_prefixes(rng.sample(pool, rng.randrange(0, 10)))
        sends = nodes[P1].tick(5.0 * r)
        late += [s for s in sends if rng.random() < loss / 2]
        deliver(nodes, P1, sends, 5.0 * r, lose=lambda s: rng.random() < loss)
        deliver(nodes, ME, nodes[ME].tick(5.0 * r), 5.0 * r)
        if late and rng.random() < 0.5:
            deliver(nodes, P1, [late.pop(0)], 5.0 * r)  # an old message arrives now
    for r in range(rounds, rounds + 2):
        deliver(nodes, P1, nodes[P1].tick(5.0 * r), 5.0 * r)
        deliver(nodes, ME, nodes[ME].tick(5.0 * r), 5.0 * r)
    assert nodes[ME].tree.paths(P1) == nodes[P1].tree.paths(P1)
    assert set(nodes[ME].dropped) <= {"delta-gap", "stale-subtree", "stale-load"}


def test_a_restarted_peer_with_a_newer_clock_is_accepted() -> None:
    gs = state()
    restarted = GroupState(P1, [ME, P1, P2], capacity=1, initial_seq=1_700_000_000_000)
    for s in restarted.tick(100.0):
        if s.peer == ME:
            gs.on_message(P1, s.msg, 100.0)
    assert gs.tree.paths(P1) == () and gs.table()[P1].capacity == 1
    assert not gs.dropped


def test_silent_peers_expire_from_the_table_and_the_tree() -> None:
    gs = state()
    gs.on_message(P2, load(), 0.0)
    gs.on_message(P2, full(1, b"\x01\x02\x03"), 0.0)
    assert gs.tree.search_path(b"\x01\x02").candidates == {P1, P2}
    for r in range(1, 4):  # P2 keeps talking, P1 falls silent
        gs.on_message(P2, load(seq=1 + r), 5.0 * r)
        assert gs.tick(5.0 * r)
        assert P1 in gs.peers
    gs.on_message(P2, load(seq=10), 20.0)
    gs.tick(20.0)  # P1 last heard at 0: 3 rounds of 5 s missed
    assert P1 not in gs.peers and P1 not in gs.table()
    assert gs.tree.search_path(b"\x01\x02").candidates == {P2}
    assert gs.tree.paths(P1) == ()
    assert gs.expired == 1
    # When it speaks again, it starts over: deltas need a full subtree first.
    assert gs.on_message(P1, delta(1, 2, added=(b"\x05",)), 21.0) == [Send(P1, SubtreeRequest(0))]
    assert gs.on_message(P1, full(3, b"\x05"), 21.0) == []
    assert gs.tree.search_path(b"\x05").candidates == {P1}


def test_an_unreachable_peer_is_forgotten_at_once_and_comes_back_when_it_speaks() -> None:
    gs = state()
    gs.on_message(P2, load(), 0.0)
    gs.on_message(P2, full(1, b"\x01\x02\x03"), 0.0)
    assert gs.forget(P2) and not gs.forget(P2) and not gs.forget(OUT)
    assert P2 not in gs.peers and P2 not in gs.table() and gs.tree.paths(P2) == ()
    assert gs.decide([1] * 600).target is None
    assert gs.on_message(P2, load(seq=2), 1.0) == [] and P2 in gs.table()
    assert gs.on_message(P2, delta(1, 2, added=(b"\x05",)), 1.0) == [Send(P2, SubtreeRequest(0))]


def test_members_leaving_the_group_are_forgotten() -> None:
    gs = state()
    gs.set_members([ME, P2])
    assert P1 not in gs.peers and gs.tree.paths(P1) == ()
    assert gs.on_message(P1, load(seq=9), 1.0) == [] and gs.dropped["non-member"] == 1


def test_tick_sends_every_member_a_load_report_and_a_subtree() -> None:
    gs = GroupState(ME, [ME, P1, P2], capacity=4, initial_seq=100)
    gs.set_local_load(Load(active=1, queued=2, capacity=4, kv_usage_permille=5, latency_ms=9))
    out = gs.tick(0.0)
    assert [(s.peer, type(s.msg).__name__) for s in out] == [
        (P1, "LoadReport"), (P1, "SubtreeUpdate"), (P2, "LoadReport"), (P2, "SubtreeUpdate")]
    assert out[0].msg == LoadReport(101, 0, 1, 2, 4, 5, 9, 0)
    assert out[1].msg.full and out[1].msg.seq == 101
    second = gs.tick(5.0)
    assert not second[1].msg.full and (second[1].msg.base_seq, second[1].msg.seq) == (101, 102)
    gs.on_message(P2, SubtreeRequest(0), 6.0)
    third = gs.tick(10.0)
    assert not third[1].msg.full and third[3].msg.full  # P2 asked for the full subtree
    with pytest.raises(ValueError):
        gs.set_local_load(Load(active=-1, queued=0))
    with pytest.raises(ValueError):
        gs.set_local_load(Load(active=0, queued=0, capacity=11))


def test_full_subtree_every_full_every_rounds() -> None:
    gs = GroupState(ME, [ME, P1], config=GroupConfig(full_every=3))
    kinds = [gs.tick(5.0 * r)[1].msg.full for r in range(7)]
    assert kinds == [True, False, False, True, False, False, True]


def test_local_prefixes_are_capped() -> None:
    gs = GroupState(ME, [ME], config=GroupConfig(max_paths_per_node=3), lengths=ChunkLengths(tail=2))
    gs.set_local_prefixes([[i, i] for i in range(10)] + [[1]])
    assert gs.tree.path_count(ME) == 3


# --------------------------------------------------------------------------- group split


def ids(n: int, start: int = 0) -> list[bytes]:
    return [i.to_bytes(20, "big") for i in range(start, start + n)]


def test_groups_up_to_50_stay_whole() -> None:
    members = {i: ("eu" if n % 2 else "us") for n, i in enumerate(ids(50))}
    assert split_groups(members) == [tuple(sorted(members))]
    assert split_groups({}) == []


def test_larger_groups_split_by_region() -> None:
    members = {i: "eu" for i in ids(70)} | {i: "us" for i in ids(50, 1000)} | {i: "ap" for i in ids(3, 5000)}
    groups = split_groups(members)
    assert [len(g) for g in groups] == [3, 35, 35, 50]  # ap, eu (70 → 2 × 35), us
    assert all(len({members[n] for n in g}) == 1 for g in groups)
    assert sorted(n for g in groups for n in g) == sorted(members)
    assert split_groups(dict(reversed(list(members.items())))) == groups  # order-independent
    some = ids(70)[40]
    assert some in group_of(some, members) and len(group_of(some, members)) == 35
    assert group_of(b"\xff" * 20, members) == ()
    with pytest.raises(ValueError):
        split_groups(members, max_size=0)


@settings(max_examples=50, deadline=None)
@given(sizes=st.lists(st.integers(1, 160), min_size=1, max_size=5))
def test_split_groups_never_exceed_the_limit(sizes: list[int]) -> None:
    members: dict[bytes, str] = {}
    for r, n in enumerate(sizes):
        members |= {i: f"r{r}" for i in ids(n, 1000 * r)}
    groups = split_groups(members)
    assert all(1 <= len(g) <= 50 for g in groups)
    assert sorted(n for g in groups for n in g) == sorted(members)


@pytest.mark.parametrize(("bits", "tau"), [(8, 2), (16, 1), (4, 4)])
def test_the_hash_width_is_configurable(bits: int, tau: int) -> None:
    gs = GroupState(ME, [ME, P1], config=GroupConfig(bits=bits))
    assert gs.lengths.bits == bits and gs.tau_c == tau
    assert gs.on_message(P1, full(1, b"\x01\x02", digest=ChunkLengths(bits=bits).digest), 0.0) == []
    assert gs.dropped["wrong-l-digest"] == 0  # a peer with the same b shares the version-0 L
