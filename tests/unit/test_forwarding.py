"""Algorithm 2 (paper §3.3 "Forwarding logic", appendix A2), case by case.

Each case sets up this node and its peers (load reports and cached prefixes arrive as the
wire messages would), asks ``decide`` about one prompt, and checks where it goes and why.
Loads are work (issue 19): in these cases every request a node holds carries one second of
prompt work at the rates a node assumes before measuring (``UNIT`` tokens per capacity point),
so a node's relative load reads as requests per capacity point, in seconds.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass, field

import pytest

from model_node.bench.policies import request_count
from model_node.forwarding import REF_PREFILL_RATE, Decision, Load, Throughput, algorithm2
from model_node.group import GroupConfig, GroupState, load_problem
from model_node.hrtree import ChunkLengths
from model_node.messages import LoadReport, SubtreeUpdate

L = ChunkLengths(bits=16)  # wide hashes: these cases are about Algorithm 2, not collisions
IDS = {"self": b"\x10" * 20, "p1": b"\x01" * 20, "p2": b"\x02" * 20, "p3": b"\x03" * 20}
NAMES = {v: k for k, v in IDS.items()}
_rng = random.Random(42)
SYSTEM = [_rng.randrange(100_000) for _ in range(1024)]  # 4 chunks of 256 tokens
HIT = SYSTEM + [_rng.randrange(100_000) for _ in range(300)]
MISS = [_rng.randrange(100_000, 200_000) for _ in range(1324)]
UNIT = int(REF_PREFILL_RATE)  # prompt tokens: one second of work for an unmeasured capacity-1 node


def load(active: int, queued: int = 0, capacity: int = 1) -> Load:
    """A node holding ``active + queued`` requests of one second of work each (per capacity point)."""
    return Load(active, queued, capacity, prefill_tokens=(active + queued) * UNIT)


def report(seq: int, active: int, queued: int = 0, capacity: int = 1) -> LoadReport:
    """The load report of :func:`load`."""
    return LoadReport(seq, 0, active, queued, capacity, 0, 0, 0, prefill_tokens=(active + queued) * UNIT)


@dataclass
class Case:
    name: str
    me: tuple[int, int, int]  # active, queued, capacity
    peers: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    holders: tuple[str, ...] = ()  # who has SYSTEM's KV cache
    query: str = "hit"
    forwarded: bool = False
    expect: str = "self"  # "self": serve here
    reason: str = "match"
    tau_c: int | None = None  # the default: ⌈16 / b⌉ = 1 for these 16-bit hashes
    silent_holders: tuple[str, ...] = ()  # hold SYSTEM but sent no load report


CASES = [
    Case("match under threshold", (3, 0, 1), {"p1": (0, 0, 1), "p2": (0, 0, 1)}, ("p1",), expect="p1"),
    Case("match: least relatively loaded candidate", (2, 0, 1), {"p1": (1, 0, 1), "p2": (1, 0, 4), "p3": (0, 0, 1)},
         ("p1", "p2"), expect="p2"),
    Case("match: this node holds it and is under the threshold", (1, 0, 1), {"p1": (0, 0, 1)}, ("self",),
         expect="self"),
    Case("match, all over threshold: least loaded overall", (3, 0, 1),
         {"p1": (5, 0, 1), "p2": (2, 0, 1), "p3": (1, 0, 1)}, ("p1", "p2"), expect="p3", reason="match-overloaded"),
    Case("match, all over threshold: this node is least loaded", (0, 0, 1), {"p1": (9, 0, 1)}, ("p1",),
         expect="self", reason="match-overloaded"),
    Case("relative load exactly at the threshold is over it", (4, 0, 1), {"p1": (4, 0, 2), "p2": (3, 0, 2)},
         ("p1",), expect="p2", reason="match-overloaded"),
    Case("miss: least relatively loaded overall", (1, 0, 1), {"p1": (1, 0, 1), "p2": (0, 1, 2)}, ("p1",),
         query="miss", expect="p2", reason="miss"),
    Case("miss: this node is best", (0, 0, 1), {"p1": (1, 0, 1)}, ("p1",), query="miss", expect="self",
         reason="miss"),
    Case("tie: this node wins (no hop)", (1, 0, 2), {"p1": (1, 0, 2)}, query="miss", expect="self", reason="miss"),
    Case("tie among peers: higher capacity wins", (4, 0, 1), {"p1": (1, 0, 2), "p2": (2, 0, 4)}, query="miss",
         expect="p2", reason="miss"),
    Case("tie among equal peers: lowest id wins", (4, 0, 1), {"p2": (1, 0, 2), "p1": (1, 0, 2)}, query="miss",
         expect="p1", reason="miss"),
    Case("tie among candidates: this node wins", (1, 0, 1), {"p1": (1, 0, 1)}, ("p1", "self"), expect="self"),
    Case("capacity weighting: 4 of 8 beats 1 of 1", (9, 0, 1), {"p1": (1, 0, 1), "p2": (4, 0, 8)}, ("p1", "p2"),
         expect="p2"),
    Case("queued requests count as load", (9, 0, 1), {"p1": (0, 5, 1), "p2": (1, 0, 1)}, query="miss",
         expect="p2", reason="miss"),
    Case("already forwarded: served here whatever the load", (50, 50, 1), {"p1": (0, 0, 10)}, ("p1",),
         forwarded=True, expect="self", reason="forwarded"),
    Case("already forwarded, miss", (50, 50, 1), {"p1": (0, 0, 10)}, query="miss", forwarded=True, expect="self",
         reason="forwarded"),
    Case("empty group", (7, 3, 1), {}, query="miss", expect="self", reason="alone"),
    Case("peers without load reports are no choice", (7, 3, 1), {}, silent_holders=("p1",), expect="self",
         reason="alone"),
    Case("a silent holder is skipped", (3, 0, 1), {"p2": (1, 0, 1), "p3": (0, 0, 1)}, ("p2",),
         silent_holders=("p1",), expect="p2"),
    Case("depth below tau_c is a miss", (3, 0, 1), {"p1": (0, 0, 1), "p2": (0, 0, 2)}, ("p1",), tau_c=5,
         expect="p2", reason="miss"),
    Case("depth at tau_c is a match", (3, 0, 1), {"p1": (0, 0, 1), "p2": (0, 0, 2)}, ("p1",), tau_c=4,
         expect="p1"),
]


def build(case: Case) -> GroupState:
    me = IDS["self"]
    everyone = [IDS[n] for n in (*case.peers, *case.silent_holders)]
    # the paper's rule, kept as GroupConfig(rule="alg2"); the product's TTFT rule (issue 29) is tested in test_forwarding_ttft.py
    gs = GroupState(me, everyone, capacity=case.me[2], lengths=L,
                    config=GroupConfig(tau_c=case.tau_c, load_threshold=2.0, rule="alg2"))
    gs.set_local_load(load(*case.me))
    if "self" in case.holders:
        gs.set_local_prefixes([SYSTEM + [7] * 10])
    for name, (active, queued, capacity) in case.peers.items():
        assert gs.on_message(IDS[name], report(1, active, queued, capacity), 0.0) == []
    for name in (*[h for h in case.holders if h != "self"], *case.silent_holders):
        update = SubtreeUpdate(1, 0, True, 0, L.digest, (L.path(SYSTEM + [7] * 300),), ())
        assert gs.on_message(IDS[name], update, 0.0) == []
    assert not gs.dropped
    return gs


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_algorithm_2(case: Case) -> None:
    gs = build(case)
    d = gs.decide(HIT if case.query == "hit" else MISS, forwarded=case.forwarded)
    assert (NAMES[d.target] if d.target else "self", d.reason) == (case.expect, case.reason)
    assert d.serve_locally == (case.expect == "self")
    if case.query == "hit" and (case.holders or case.silent_holders):
        assert d.depth == 4  # the 4 chunks of SYSTEM
    else:
        assert d.depth == 0
    assert gs.decisions[case.reason] == 1


def test_forwards_count_against_the_target_until_its_next_report() -> None:
    """Between two load reports, forwards spread instead of all going to one node."""
    case = Case("spread", (50, 0, 1), {"p1": (0, 0, 1), "p2": (0, 0, 1)}, query="miss")
    gs = build(case)
    targets = [NAMES.get(gs.decide(MISS).target or b"", "self") for _ in range(4)]
    assert targets == ["p1", "p2", "p1", "p2"]
    assert gs.table()[IDS["p1"]].pending_tokens == 2 * len(MISS)  # a forward counts its prompt's work
    gs.on_message(IDS["p1"], report(2, 0), 0.0)  # the report resets the estimate
    assert gs.table()[IDS["p1"]].pending == 0 and gs.table()[IDS["p1"]].pending_tokens == 0
    assert gs.decide(MISS).target == IDS["p1"]


def test_at_most_one_hop_between_two_nodes() -> None:
    """What A forwards to B, B serves — even if B would rather send it back to A."""
    a_id, b_id = IDS["p1"], IDS["p2"]
    a = GroupState(a_id, [a_id, b_id], capacity=1, lengths=L)
    b = GroupState(b_id, [a_id, b_id], capacity=1, lengths=L)
    a.set_local_load(load(9))
    b.set_local_load(load(9))
    a.on_message(b_id, report(1, 0), 0.0)  # A thinks B is idle
    b.on_message(a_id, report(1, 0), 0.0)  # B thinks A is idle
    first = a.decide(MISS)
    assert first.target == b_id
    second = b.decide(MISS, forwarded=True)
    assert second.serve_locally and second.reason == "forwarded"


def test_default_tau_c_at_8_bits_needs_two_chunks() -> None:
    """With 8-bit hashes a single matched chunk is no match (τ_c = 2, measured)."""
    L8 = ChunkLengths()
    me, p1, p2 = IDS["self"], IDS["p1"], IDS["p2"]
    gs = GroupState(me, [me, p1, p2], capacity=1, lengths=L8)
    assert gs.tau_c == 2
    gs.set_local_load(load(3))
    gs.on_message(p1, report(1, 0), 0.0)
    gs.on_message(p2, report(1, 0, capacity=2), 0.0)
    gs.on_message(p1, SubtreeUpdate(1, 0, True, 0, L8.digest, (L8.path(SYSTEM + [7] * 300),), ()), 0.0)
    one_chunk = SYSTEM[:256] + MISS[:300]
    two_chunks = SYSTEM[:512] + MISS[:300]
    d1 = gs.decide(one_chunk)
    assert (d1.depth, d1.reason, d1.target) == (1, "miss", p2)
    d2 = gs.decide(two_chunks)
    assert (d2.depth, d2.reason, d2.target) == (2, "match", p1)
    assert GroupState(me, [me], config=GroupConfig(tau_c=1), lengths=L8).tau_c == 1


# --------------------------------------------------------------------------- work, not requests


def test_a_work_heavy_node_is_avoided_where_a_request_count_would_pick_it() -> None:
    """One request with a 3,000-token prompt to evaluate is more work than three short
    questions: Algorithm 2 sends the next request to the node with three requests, while the
    request-count measure (requests per capacity point) would have picked the other."""
    heavy, light = IDS["p1"], IDS["p2"]
    gs = GroupState(IDS["self"], [heavy, light], lengths=L, config=GroupConfig(load_threshold=2.0))
    gs.set_local_load(load(60))  # 2,400 prompt tokens: at the group's 140 tokens/s, never the choice
    rates = {"prefill_mtps": 140_000, "decode_mtps": 20_000}
    gs.on_message(heavy, LoadReport(1, 0, 0, 1, 1, 0, 0, 0, prefill_tokens=3000, decode_tokens=64, **rates), 0.0)
    gs.on_message(light, LoadReport(1, 0, 1, 2, 1, 0, 0, 0, prefill_tokens=3 * 40, decode_tokens=3 * 64,
                                    **rates), 0.0)
    for holders in ((), (heavy, light)):  # a miss, and a match held by both
        if holders:
            for h in holders:
                gs.on_message(h, SubtreeUpdate(1, 0, True, 0, L.digest, (L.path(SYSTEM + [7] * 300),), ()), 0.0)
        query = HIT if holders else MISS
        table, found = gs.table(), gs.search(query)
        assert table[heavy].relative > table[light].relative
        assert table[heavy].requests_relative < table[light].requests_relative
        by_work = algorithm2(gs.self_id, table, found, tau_c=gs.tau_c, load_threshold=1000.0)
        by_count = algorithm2(gs.self_id, table, found, tau_c=gs.tau_c, load_threshold=1000.0,
                              measure=lambda x: x.requests_relative)
        assert (by_work.target, by_count.target) == (light, heavy)
        assert request_count(gs, query).target == heavy  # the benchmark's request-count baseline
        assert gs.decide(query).target == light


def test_relative_load_is_seconds_of_work_at_the_measured_rates() -> None:
    busy = Load(active=1, queued=1, prefill_tokens=1000, decode_tokens=100, prefill_rate=500.0, decode_rate=50.0)
    assert busy.relative == pytest.approx(1000 / 500 + 100 / 50)
    # Prompts are evaluated one after another whatever the slots: their seconds add up; decoding
    # streams share the work out.
    four = Load(active=2, queued=2, prefill_tokens=1000, decode_tokens=400, prefill_rate=500.0, decode_rate=50.0,
                streams=4)
    assert four.prefill_wait == pytest.approx(2.0) and four.relative == pytest.approx(2.0 + 8.0 / 4)
    assert Load(prefill_tokens=100, pending_tokens=300, prefill_rate=100.0).prefill_wait == pytest.approx(4.0)
    # Before it measures, a node assumes capacity x the reference rates: the score still divides the load.
    assert Load(queued=1, capacity=2, prefill_tokens=UNIT * 4).relative == pytest.approx(2.0)
    assert Load(active=5, queued=5).relative == 0.0  # requests without work are no load


def test_while_a_stream_is_free_decode_work_delays_no_newcomer() -> None:
    """A node interleaving a long prompt with running replies: their per-stream decode rate falls
    to about a token a second, but a newcomer's prompt is fed between decode steps, so only the
    prompts count while a stream is free (the base-rate regression of issue 19's first build)."""
    slow_decode = functools.partial(Load, prefill_tokens=300, decode_tokens=3 * 16, prefill_rate=100.0,
                                    decode_rate=1.0, streams=8)
    free = slow_decode(active=3)
    assert free.relative == pytest.approx(3.0) == free.prefill_wait
    full = slow_decode(active=6, queued=1, pending=1)
    assert full.relative == pytest.approx(3.0 + 48 / 1.0 / 8)


def test_throughput_measures_decode_per_stream_from_recent_requests() -> None:
    t = Throughput(window=2)
    assert (t.prefill_rate, t.decode_rate, t.expected_output(256)) == (0.0, 0.0, 256)  # nothing measured
    t.record(11, 0.5)  # 10 tokens after the first in 0.5 s
    t.record(1, 0.0)  # one output token: no rate sample
    assert t.decode_rate == 20.0
    assert t.expected_output(256) == 6 and t.expected_output(4) == 4  # mean of 11 and 1, capped
    t.record(21, 4.0)
    t.record(21, 4.0)  # the window keeps the last two samples of each kind
    assert (t.decode_rate, t.expected_output(256)) == (5.0, 21)


def test_throughput_measures_prompts_at_the_engine_rate_not_per_stream() -> None:
    """Three prompts of 100 tokens reach a first-come-first-served engine at once and come out
    at 1, 2 and 3 s: the engine evaluates 100 tokens/s. Per stream (tokens ÷ each one's time
    to first token) it would read 100, 50 and 33 tokens/s, counting the prompts ahead again."""
    t = Throughput()
    for _ in range(3):
        t.prefill_started(0.0)
    for end in (1.0, 2.0, 3.0):
        t.prefill_ended(end, 100)
    assert t.prefill_rate == pytest.approx(100.0)
    # Idle time does not count; a request that ends before its first token gives no sample, and
    # its engine time goes to the next one (the rate errs low, so waits are overestimated).
    t = Throughput()
    t.prefill_started(10.0)
    t.prefill_ended(12.0, 200)  # 100 tokens/s
    t.prefill_started(50.0)
    t.prefill_started(50.0)
    t.prefill_ended(51.0, None)  # cancelled after 1 s
    t.prefill_ended(52.0, 100)  # 100 tokens in 2 s counted: 50 tokens/s
    assert t.prefill_rate == pytest.approx(300 / 4)
    t.prefill_ended(60.0, 100)  # more ends than starts: ignored
    assert t.prefill_rate == pytest.approx(300 / 4)


def test_a_fast_engines_short_prompts_are_pooled_into_their_true_rate() -> None:
    """An engine that evaluates each 50-token prompt in 0.2 ms (an echo engine; a GPU on a short
    prompt) is measured at its rate: the phases are pooled, tokens and time, until a millisecond
    has passed. Before, a short phase's tokens were dropped and its time kept for the next sample,
    so this engine read 5 times too slow."""
    t = Throughput()
    for i in range(10):
        t.prefill_started(i * 1.0)
        t.prefill_ended(i * 1.0 + 2e-4, 50)
    assert t.prefill_rate == pytest.approx(500 / 2e-3)
    assert Load(capacity=1, prefill_rate=t.prefill_rate).prefill_seconds(50) < 1e-3


def test_a_holder_busy_with_a_cold_prompt_still_takes_a_match_it_can_put_ahead() -> None:
    """A prefix's holder evaluating a cold 3,000-token prompt holds far more than the threshold
    of prompt work, but reports (``match_wait``) that a mostly cached prompt would get its first
    token in half a second (ahead of the cold one): the match goes there. A holder that reports
    no ``match_wait`` is judged by its whole prompt work, as before."""
    holder, other = IDS["p1"], IDS["p2"]
    gs = GroupState(IDS["self"], [holder, other], lengths=L, config=GroupConfig(load_threshold=10.0))
    gs.set_local_load(load(1))
    rates = {"prefill_mtps": 100_000, "decode_mtps": 20_000}
    gs.on_message(holder, LoadReport(1, 0, 1, 0, 1, 0, 0, 0, prefill_tokens=3000, match_wait_ms=500, **rates), 0.0)
    gs.on_message(other, LoadReport(1, 0, 0, 0, 1, 0, 0, 0, **rates), 0.0)
    gs.on_message(holder, SubtreeUpdate(1, 0, True, 0, L.digest, (L.path(SYSTEM + [7] * 300),), ()), 0.0)
    table = gs.table()
    assert table[holder].relative == pytest.approx(30.0) and table[holder].cached_wait == pytest.approx(0.5)
    assert gs.decide(HIT) == Decision(holder, "match", gs.search(HIT).depth)
    # each forward since the report counts as one more short prompt ahead (64 tokens: 0.64 s)
    assert gs.table()[holder].pending == 1 and gs.table()[holder].cached_wait == pytest.approx(0.5 + 0.64)
    gs.on_message(holder, LoadReport(2, 0, 1, 0, 1, 0, 0, 0, prefill_tokens=3000, **rates), 0.0)  # no match_wait
    assert gs.decide(HIT).reason == "match-overloaded"


@pytest.mark.parametrize("wait, ok", [(-1, True), (0, True), (10_000_000, True), (-2, False), (10_000_001, False)])
def test_match_wait_in_a_report_is_bounded(wait: int, ok: bool) -> None:
    assert (load_problem(LoadReport(1, 0, 0, 0, 1, 0, 0, 0, match_wait_ms=wait)) is None) == ok
