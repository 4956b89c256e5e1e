"""The product's forwarding rule since issue 29: least predicted time to first token, ties to
the node idle the longest; load reports pushed between rounds, rate-limited by the driver;
the ``idle_ms`` a load report carries, validated. The simulation behind each piece:
docs/simulations.md, "Against an oracle" (``least_ttft``, ``Variant`` in
simulations/forwarding.py)."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any, cast

import pytest
import trio
import trio.testing

from model_node.forwarding import (
    MATCH_PROBE_TOKENS,
    REF_PREFILL_RATE,
    TTFT_TIE,
    Load,
    least_ttft,
    with_group_rates,
)
from model_node.group import (
    MAX_IDLE_MS,
    MAX_RTT,
    RTT_SAMPLES,
    GroupConfig,
    GroupState,
    load_of,
    load_problem,
    report_of,
)
from model_node.group_service import PUSH_INTERVAL, GroupService
from model_node.hrtree import ChunkLengths, Match
from model_node.messages import LoadReport, SubtreeUpdate
from overlay.wire.clock import FakeClock
from overlay.wire.codec import decode, encode

L = ChunkLengths(bits=16)  # 256-token chunks, 16-bit hashes: no collisions in these cases
ME, P1, P2, P3 = b"\x10" * 20, b"\x01" * 20, b"\x02" * 20, b"\x03" * 20
_rng = random.Random(7)
SYSTEM = [_rng.randrange(100_000) for _ in range(1024)]  # 4 chunks
HIT = SYSTEM + [_rng.randrange(100_000) for _ in range(300)]  # 1,324 tokens, 1,024 of them matched
MISS = [_rng.randrange(100_000, 200_000) for _ in range(1324)]
RATE = REF_PREFILL_RATE  # an unmeasured capacity-1 node's prompt tokens per second


def report(seq: int, prefill: int = 0, *, idle_ms: int = -1, match_wait_ms: int = -1, capacity: int = 1,
           mtps: int = 0) -> LoadReport:
    return LoadReport(seq, 0, 1 if prefill else 0, 0, capacity, 0, 0, 0, prefill_tokens=prefill, prefill_mtps=mtps,
                      match_wait_ms=match_wait_ms, idle_ms=idle_ms)


def group(me: Load | None = None, holders: tuple[bytes, ...] = (), threshold: float = 10.0,
          **peers: LoadReport) -> GroupState:
    ids = {"p1": P1, "p2": P2, "p3": P3}
    gs = GroupState(ME, [ME, P1, P2, P3], lengths=L, config=GroupConfig(load_threshold=threshold))
    gs.set_local_load(me or Load())
    for name, msg in peers.items():
        assert gs.on_message(ids[name], msg, 0.0) == []
    for h in holders:
        if h == ME:
            gs.set_local_prefixes([SYSTEM + [7] * 10])
        else:
            assert gs.on_message(h, SubtreeUpdate(1, 0, True, 0, L.digest, (L.path(SYSTEM + [7] * 300),), ()),
                                 0.0) == []
    assert not gs.dropped
    return gs


# --------------------------------------------------------------------------- the rule


def test_a_holder_evaluates_only_the_tokens_past_the_matched_chunks() -> None:
    """P1 holds SYSTEM and has 10 s of prompt work; P2 is idle without it. P1: 10 s + 300
    tokens; P2: the whole 1,324-token prompt. The holder wins while its wait is shorter than
    the prefill it saves, and loses (``match-overloaded``) once it is not."""
    busy_me = Load(active=1, prefill_tokens=int(60 * RATE))  # 60 s of work here: never the choice
    saved = (len(HIT) - 300) / RATE  # 25.6 s of prompt the holder need not evaluate
    gs = group(busy_me, (P1,), 100.0, p1=report(1, int((saved - 1) * RATE)), p2=report(1))
    d = gs.decide(HIT)
    assert (d.target, d.reason, d.depth) == (P1, "match", 4)
    gs = group(busy_me, (P1,), 100.0, p1=report(1, int((saved + 1) * RATE)), p2=report(1))
    d = gs.decide(HIT)
    assert (d.target, d.reason) == (P2, "match-overloaded")
    assert dict(gs.decisions) == {"match-overloaded": 1}
    # a miss: nobody holds it; P2 now carries the prompt just forwarded to it (26.6 + 33.1 s for
    # P1 against 33.1 + 33.1 s for P2): P1
    d = gs.decide(MISS)
    assert (d.target, d.reason, d.depth) == (P1, "miss", 0)


def test_a_node_whose_wait_reaches_the_threshold_would_refuse_and_is_skipped() -> None:
    """A holder 12 s from a free engine would still give the earliest first token (12 + 7.5 s
    against 33.1 s), but its admission refuses a first token that late (the load threshold is
    that limit): the request goes to the idle node. With every node over it, the least cost."""
    gs = group(Load(active=1, prefill_tokens=int(60 * RATE)), (P1,), p1=report(1, int(12 * RATE)), p2=report(1))
    d = gs.decide(HIT)
    assert (d.target, d.reason) == (P2, "match-overloaded")
    gs = group(Load(active=1, prefill_tokens=int(60 * RATE)), (P1,), p1=report(1, int(12 * RATE)),
               p2=report(1, int(11 * RATE)))
    d = gs.decide(HIT)
    assert (d.target, d.reason) == (P1, "match")  # 19.5 s against 11 + 33.1 s
    # a holder with every slot taken reports a match_wait of at least the limit: skipped too
    gs = group(Load(), (P1,), p1=report(1, match_wait_ms=10_000))
    assert gs.decide(HIT).serve_locally


def test_costs_as_the_simulation_computes_them() -> None:
    """``least_ttft`` directly: a holder reporting ``match_wait`` waits that (it counts a probe's
    prompt) plus the prefill of the rest past the probe; a node that does not report it waits
    its whole relative load; a non-holder waits its relative load plus the whole prompt."""
    holder = Load(prefill_tokens=400, match_wait=2.0)  # relative 10 s, but a cached prompt waits 2 s
    other = Load(prefill_tokens=40)  # relative 1 s
    found = Match(4, frozenset({P1}))
    table = {ME: Load(prefill_tokens=10**6), P1: holder, P2: other}
    # holder: 2 + (1324 - 1024 - 64) / 40 = 7.9 s; other: 1 + 1324 / 40 = 34.1 s
    assert least_ttft(ME, table, found, 1324, tau_c=1, matched_tokens=1024).target == P1
    # without match_wait the holder waits its whole relative load: 10 + 300 / 40 = 17.5 s, still the least
    table[P1] = Load(prefill_tokens=400)
    assert least_ttft(ME, table, found, 1324, tau_c=1, matched_tokens=1024).target == P1
    # with only 100 tokens matched the holder lacks 1,224: 10 + 30.6 = 40.6 s > 34.1 s
    d = least_ttft(ME, table, found, 1324, tau_c=1, matched_tokens=100)
    assert (d.target, d.reason) == (P2, "match-overloaded")
    # a depth under tau_c is no match
    assert least_ttft(ME, table, found, 1324, tau_c=5, matched_tokens=1024).reason == "miss"
    assert least_ttft(ME, table, found, 1324, tau_c=1, matched_tokens=1024, forwarded=True).reason == "forwarded"
    assert least_ttft(ME, {ME: Load()}, found, 1324, tau_c=1, matched_tokens=1024).reason == "alone"


def test_a_peer_within_one_percent_is_a_tie_and_the_entry_keeps_the_request() -> None:
    """The peer's cost is under 1 % below ours (its rate came rounded in the report, say): the
    request stays here. Past the margin it goes to the peer. (The simulation: without the
    margin every entry forwarded every request, all to the same peer.)"""
    me = Load(prefill_rate=100.0)  # measured: 13.24 s for the miss
    near = round(100.0 * (1 + TTFT_TIE / 2) * 1000)  # 0.5 % faster: 13.17 s
    far = round(100.0 * (1 + 2 * TTFT_TIE) * 1000)  # 2 % faster: 12.98 s
    gs = group(me, p1=report(1, mtps=near))
    assert gs.decide(MISS).serve_locally
    assert dict(gs.decisions) == {"miss": 1}
    gs = group(me, p1=report(1, mtps=far))
    assert gs.decide(MISS).target == P1


def test_a_tie_goes_to_the_node_idle_the_longest() -> None:
    """Three idle nodes with the same cost: the one idle the longest (its ``idle_ms`` plus the
    time since its report) wins, over ourselves too; a node that holds work, or was sent a
    forward since its report, is not idle."""
    gs = group(Load(idle_ms=3000), p1=report(1, idle_ms=1000), p2=report(1, idle_ms=5000), p3=report(1))
    assert gs.idle_seconds(0.0) == {ME: 3.0, P1: 1.0, P2: 5.0, P3: -1.0}
    assert gs.decide(MISS, now=0.0).target == P2
    # P2 now has a forward pending: no longer idle; at t = 3 P1 (1 + 3 s) beats ourselves (3 s)
    assert gs.idle_seconds(3.0) == {ME: 3.0, P1: 4.0, P2: -1.0, P3: -1.0}
    assert gs.decide(MISS, now=3.0).target == P1
    # without a clock reading the reports stand as they are: ourselves (3 s) over the rest
    gs = group(Load(idle_ms=3000), p1=report(1, idle_ms=1000), p3=report(1))
    assert gs.decide(MISS).serve_locally
    # nodes that never held work report MAX_IDLE_MS: equally idle whatever the reports' ages, the entry keeps it
    gs = group(Load(idle_ms=MAX_IDLE_MS), p1=report(1, idle_ms=MAX_IDLE_MS), p2=report(1, idle_ms=MAX_IDLE_MS))
    assert gs.decide(MISS, now=60.0).serve_locally
    # nobody idle (or nobody saying): the entry keeps its tie
    gs = group(Load(), p1=report(1), p2=report(1))
    assert gs.decide(MISS, now=9.0).serve_locally


def test_a_peer_s_round_trip_is_part_of_its_cost() -> None:
    """An idle holder of the prompt across an ocean (150 ms away) against serving here, idle,
    without the prefix: a fast engine (the prompt's prefill here is 10 ms) keeps the request,
    since the hop costs more than the prefill it saves; a slow one (1,324 tokens at 40 tokens
    a second, 33 s) forwards it all the same. Before issue 29's fix the hop was free and every
    entry sent such requests to the one holder."""
    fast = 1324 / 0.010  # prompt tokens per second: 10 ms for the whole prompt
    gs = group(Load(prefill_rate=fast), (P1,), p1=report(1, mtps=round(fast * 1000)))
    assert gs.decide(HIT).target == P1  # no round trip measured yet: the hop is free
    gs.set_rtt(P1, 0.150)
    assert gs.hops() == {P1: 0.150}
    d = gs.decide(HIT)
    assert (d.target, d.reason) == (None, "match-overloaded")
    gs = group(Load(), (P1,), p1=report(1))  # unmeasured rates: 40 tokens/s, 33 s to save
    gs.set_rtt(P1, 0.150)
    assert gs.decide(HIT).target == P1
    # a near peer's hop keeps it within the tie when everything else is equal, a far one's does not
    table = {ME: Load(idle_ms=0), P1: Load(idle_ms=5000)}
    assert least_ttft(ME, table, Match(0, frozenset()), 100, tau_c=2, matched_tokens=0,
                      idle={ME: 0.0, P1: 5.0}, hops={P1: 0.0002}).target == P1
    assert least_ttft(ME, table, Match(0, frozenset()), 100, tau_c=2, matched_tokens=0,
                      idle={ME: 0.0, P1: 5.0}, hops={P1: 0.150}).serve_locally


def test_round_trips_are_kept_per_member_and_the_least_recent_one_counts() -> None:
    gs = group()
    for rtt in (0.30, 0.12, 0.20):  # queueing only ever adds: the least is the link's
        gs.set_rtt(P1, rtt)
    assert gs.hops() == {P1: 0.12}
    for _ in range(RTT_SAMPLES):  # older samples fall out of the window
        gs.set_rtt(P1, 0.25)
    assert gs.hops() == {P1: 0.25}
    # not a member, ourselves, nonsense: ignored; absurdly long: capped
    outsider = b"\x99" * 20
    for peer, value in ((outsider, 0.1), (ME, 0.1), (P2, -1.0), (P2, float("nan")), (P2, float("inf"))):
        gs.set_rtt(peer, value)
    assert set(gs.hops()) == {P1}
    gs.set_rtt(P3, 10 * MAX_RTT)
    assert gs.hops()[P3] == MAX_RTT
    gs.set_members([ME, P1, P2])  # P3 left the group: its round trips go with it
    assert set(gs.hops()) == {P1}


def test_unmeasured_rates_are_the_group_s_per_capacity_median() -> None:
    table = {ME: Load(capacity=2), P1: Load(prefill_rate=1000.0, decode_rate=50.0),
             P2: Load(capacity=2, prefill_rate=4000.0), P3: Load(prefill_rate=3000.0, decode_rate=70.0)}
    est = with_group_rates(table)
    # per capacity point: prefill 1000, 2000, 3000 -> 2000; decode 50, 70 -> 60
    assert (est[ME].prefill_rate, est[ME].decode_rate) == (4000.0, 120.0)
    assert (est[P2].prefill_rate, est[P2].decode_rate) == (4000.0, 120.0)  # its measured rate stays
    assert est[P1] is table[P1] and est[P3] is table[P3]
    assert table[ME].prefill_rate == 0  # the table given is not changed
    unmeasured = {ME: Load(), P1: Load(capacity=3)}
    assert with_group_rates(unmeasured) == unmeasured


def test_an_entry_that_has_not_measured_its_rate_does_not_send_everything_to_one_that_has() -> None:
    """The testbed's funnel (issue 29): echo model nodes evaluate a prompt in well under a
    millisecond, so a node measures its rate only after serving several. An entry that had not
    counted the reference 40 tokens a second for itself (2.2 s for the testbed's 87-token prompt)
    against a measured peer's microseconds, forwarded every request to it, and so never
    measured. With the group's rate it counts what its peers measured: the prompt costs it
    about what it costs them, and it keeps it (a tie, or the hop, decides)."""
    prompt = list(range(87))
    fast = 87 / 0.0005  # 87 tokens in half a millisecond
    gs = group(Load(), p1=report(1, mtps=round(fast * 1000), idle_ms=5000), p2=report(1, mtps=round(fast * 1000)))
    gs.set_rtt(P1, 0.150)
    gs.set_rtt(P2, 0.080)
    assert gs.decide(prompt).serve_locally
    assert gs.table()[ME].prefill_rate == 0  # the reported table is as it was


def test_algorithm_2_is_still_there_on_request() -> None:
    gs = GroupState(ME, [ME, P1], lengths=L, config=GroupConfig(rule="alg2", load_threshold=2.0))
    gs.on_message(P1, report(1, int(5 * RATE)), 0.0)
    gs.on_message(P1, SubtreeUpdate(1, 0, True, 0, L.digest, (L.path(SYSTEM + [7] * 300),), ()), 0.0)
    assert gs.decide(HIT).reason == "match-overloaded"  # over the threshold: Algorithm 2 ignores the holder
    with pytest.raises(ValueError, match="unknown forwarding rule"):
        GroupState(ME, [ME], config=GroupConfig(rule="fastest"))


# --------------------------------------------------------------------------- pushed load reports


def loads(sends: list[Any]) -> list[LoadReport]:
    return [s.msg for s in sends if isinstance(s.msg, LoadReport)]


def test_pushed_reports_reach_every_member_and_keep_the_subtree_deltas_chained() -> None:
    """P1 ticks, pushes its load twice, ticks again: ME takes every load report (their numbers
    only grow) and applies the second round's subtree as a delta on the first (the round's
    number did not move with the pushes)."""
    me, p1 = GroupState(ME, [ME, P1, P2], lengths=L), GroupState(P1, [ME, P1, P2], lengths=L, initial_seq=100)
    p1.set_local_prefixes([SYSTEM])

    def deliver(sends: list[Any], now: float) -> None:
        for s in sends:
            if s.peer == ME:
                assert me.on_message(P1, s.msg, now) == []

    first = p1.tick(0.0)
    assert [r.seq for r in loads(first)] == [101, 101]
    deliver(first, 0.0)
    p1.set_local_load(Load(active=1, prefill_tokens=500))
    pushed = p1.report_load(0.5)
    assert sorted(s.peer for s in pushed) == sorted([ME, P2]) and all(r.seq == 102 for r in loads(pushed))
    deliver(pushed, 0.5)
    assert me.table()[P1].prefill_tokens == 500
    p1.set_local_load(Load())
    deliver(p1.report_load(0.7), 0.7)
    assert (p1.seq, p1.load_seq, p1.loads_pushed) == (101, 103, 2)
    p1.set_local_prefixes([SYSTEM, MISS])
    second = p1.tick(5.0)
    update = next(s.msg for s in second if isinstance(s.msg, SubtreeUpdate) and s.peer == ME)
    assert (update.full, update.base_seq, update.seq) == (False, 101, 102)  # a delta on the last round
    assert loads(second)[0].seq == 104  # after the pushes, not the round's 102
    deliver(second, 5.0)
    assert not me.dropped
    assert me.tree.paths(P1) == p1.tree.paths(P1) and me.search(MISS).candidates == {P1}
    # a late pushed report (an older number) is dropped as stale, as a late round's report is
    me.on_message(P1, loads(pushed)[0], 5.1)
    assert dict(me.dropped) == {"stale-load": 1}


def test_a_restarted_node_s_reports_are_newer_than_its_pushed_ones() -> None:
    """Round numbers start at the wall clock in ms; pushes add one each, far slower than ms."""
    old = GroupState(P1, [ME, P1], lengths=L, initial_seq=1_700_000_000_000)
    for _ in range(50):
        old.report_load(0.0)
    me = GroupState(ME, [ME, P1], lengths=L)
    for s in old.tick(1.0):
        me.on_message(P1, s.msg, 1.0)
    restarted = GroupState(P1, [ME, P1], lengths=L, initial_seq=1_700_000_010_000)  # 10 s later
    for s in restarted.tick(11.0):
        me.on_message(P1, s.msg, 11.0)
    assert not me.dropped and me.peers[P1].load_seq == 1_700_000_010_001


class _Node:
    def __init__(self) -> None:
        self.node_id = ME
        self.peers: dict[bytes, Any] = {}
        self.sent: list[tuple[bytes, Any]] = []

    def send_nowait(self, peer: bytes, msg: Any) -> bool:
        self.sent.append((peer, msg))
        return True

    def on(self, *_: Any) -> None:
        pass


def service(clock: Any, load: Load | None = None) -> tuple[GroupService, _Node]:
    node = _Node()
    entries = [SimpleNamespace(node_id=i, region="eu", trusted=True) for i in (ME, P1, P2)]
    registry = SimpleNamespace(models=lambda model: entries)
    svc = GroupService(cast(Any, node), cast(Any, registry), "m", load=lambda: load or Load(),
                       prefixes=lambda: [], on_forwarded=lambda conn, req: None, clock=clock,
                       config=GroupConfig(sync_interval=5.0))
    return svc, node


def test_load_changes_are_pushed_at_most_every_push_interval() -> None:
    clock = FakeClock(monotonic=10.0)
    state = Load(idle_ms=0)
    svc, node = service(clock, state)
    svc.load_changed()
    assert [p for p, m in node.sent] == [P1, P2] and svc.pushes == 1 and svc.pushes_skipped == 0
    clock.advance(PUSH_INTERVAL / 2)
    svc.load_changed()
    svc.load_changed()
    assert len(node.sent) == 2 and svc.pushes_skipped == 2  # held back: a later push covers them
    clock.advance(PUSH_INTERVAL)
    state.active = 1
    svc.load_changed()
    assert len(node.sent) == 4 and svc.pushes == 2
    assert [m.active for _, m in node.sent[2:]] == [1, 1]  # the load read now, not a stale one
    # a round's report counts as the last report: a change right after it waits too
    svc.round()
    svc.load_changed()
    assert svc.pushes == 2 and svc.pushes_skipped == 3


async def test_a_held_back_change_goes_out_when_the_interval_is_over(autojump_clock: trio.testing.MockClock) -> None:
    """Under trio's mock clock: a change within the interval is pushed once it is over, so the
    last change always reaches the peers before the next round."""
    state = Load(active=1)
    svc, node = service(None, state)
    async with trio.open_nursery() as nursery:
        await nursery.start(svc.run)
        sent = len(node.sent)  # the first round
        state.active = 0
        svc.load_changed()  # within the interval of the round: held back
        assert len(node.sent) == sent and svc.pushes_skipped == 1
        await trio.sleep(PUSH_INTERVAL * 1.5)
        assert svc.pushes == 1 and [m.active for _, m in node.sent[sent:]] == [0, 0]
        await trio.sleep(1.0)
        assert svc.pushes == 1  # nothing more changed: nothing more sent
        nursery.cancel_scope.cancel()


# --------------------------------------------------------------------------- the wire field


@pytest.mark.parametrize("idle, ok", [(-1, True), (0, True), (MAX_IDLE_MS, True), (-2, False),
                                      (MAX_IDLE_MS + 1, False), (-(2**40), False)])
def test_idle_ms_in_a_report_is_bounded(idle: int, ok: bool) -> None:
    msg = report(2, idle_ms=idle)
    assert (load_problem(msg) is None) == ok
    gs = group(p1=report(1, idle_ms=5))
    gs.on_message(P1, decode(encode(msg)), 1.0)  # through the codec, as a peer sends it
    if ok:
        assert not gs.dropped and gs.table()[P1].idle_ms == idle
    else:
        assert dict(gs.dropped) == {"bad-load": 1} and gs.table()[P1].idle_ms == 5  # the old row stays


def test_idle_ms_round_trips_through_a_report() -> None:
    for idle in (-1, 0, 1234):
        load = Load(capacity=2, idle_ms=idle)
        msg = decode(encode(report_of(load, 7, 0, 0)))
        assert msg.idle_ms == idle and load_of(msg).idle_ms == idle
    assert report_of(Load(idle_ms=MAX_IDLE_MS * 2), 1, 0, 0).idle_ms == MAX_IDLE_MS
    assert LoadReport(1, 0, 0, 0, 1, 0, 0, 0).idle_ms == -1  # not reported
    with pytest.raises(ValueError, match="idle_ms"):
        GroupState(ME, [ME]).set_local_load(Load(idle_ms=-5))


def test_match_probe_tokens_are_not_counted_twice() -> None:
    """(The holder's cost subtracts the probe that ``match_wait`` already counts.)"""
    holder = Load(match_wait=1.0)
    found = Match(1, frozenset({P1}))
    table = {ME: Load(prefill_tokens=10**6), P1: holder, P2: Load(prefill_tokens=10**6)}
    left = 200
    d = least_ttft(ME, table, found, 256 + left, tau_c=1, matched_tokens=256)
    assert d.target == P1
    assert holder.cached_wait + holder.prefill_seconds(left - MATCH_PROBE_TOKENS) == pytest.approx(
        1.0 + (left - MATCH_PROBE_TOKENS) / RATE)
