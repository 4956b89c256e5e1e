"""The Sentry (appendix A3): learning system-prompt lengths, building L, and the group's
agreement on one versioned L (lowest id proposes, highest version wins, members only)."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from model_node.group import MAX_VERSION_STEP, MIN_PROPOSAL_ROUNDS, QUARANTINE_SECONDS, GroupState
from model_node.hrtree import MAX_L_VERSION, ChunkLengths, HRTree, token_bytes
from model_node.messages import LengthProposal, LoadReport, SubtreeUpdate
from model_node.sentry import (
    LengthAgreement,
    Sentry,
    build_lengths,
    proposer,
    shared_prefix_lengths,
    supersedes,
)
from overlay.anon.actions import Send
from overlay.wire.codec import decode, encode

HEADER = [1, 2, 3, 4, 5]  # chat-template tokens every prompt starts with
SYSTEM_LENGTHS = (150, 600, 1200)


def toks(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1000, 100_000) for _ in range(n)]


def traffic(rng: random.Random, n: int, systems: list[list[int]]) -> list[list[int]]:
    """Requests: 70 % start with one of ``systems``, the rest with the bare header; some are
    later turns of a conversation (the previous prompt plus more)."""
    out: list[list[int]] = []
    conversations: list[list[int]] = []
    for _ in range(n):
        if conversations and rng.random() < 0.15:
            c = rng.choice(conversations)
            c.extend(toks(rng, rng.randint(20, 200)))
            out.append(list(c))
            continue
        start = rng.choice(systems) if rng.random() < 0.7 else HEADER
        p = start + toks(rng, rng.randint(10, 400))
        if rng.random() < 0.2:
            conversations.append(list(p))
        out.append(p)
    return out


def systems_of(rng: random.Random, lengths: tuple[int, ...] = SYSTEM_LENGTHS) -> list[list[int]]:
    return [HEADER + toks(rng, n - len(HEADER)) for n in lengths]


# --------------------------------------------------------------------------- L from S


def test_build_lengths_is_the_papers_formula() -> None:
    # l1 = s1, l2 = δ, l3 = s2 − s1 − δ, l4 = δ (chunks no longer than the tail)
    assert build_lengths([100, 300], delta=16, tail=1000) == (100, 16, 184, 16)
    assert build_lengths([300, 100, 100], delta=16, tail=1000) == (100, 16, 184, 16)
    assert build_lengths([], delta=16) == ()
    assert build_lengths([100, 110], delta=16, tail=1000) == (100, 16)  # within δ: merged
    assert build_lengths([100, 117], delta=16, tail=1000) == (100, 16, 1, 16)
    # Beyond the paper: long chunks are cut into tail pieces ending on the boundary.
    assert build_lengths([600], delta=16, tail=256) == (256, 256, 88, 16)
    ends = [sum(build_lengths([150, 600, 1200], delta=16, tail=256)[:i + 1]) for i in range(9)]
    assert {150, 166, 600, 616, 1200, 1216} <= set(ends)
    with pytest.raises(ValueError):
        build_lengths([5], delta=0)


# --------------------------------------------------------------------------- learning


def test_sentry_finds_the_injected_system_prompts() -> None:
    rng = random.Random(5)
    sentry = Sentry()
    for p in traffic(rng, 600, systems_of(rng)):
        sentry.observe(p)
    assert sentry.system_prompt_lengths() == list(SYSTEM_LENGTHS)


def test_learned_L_puts_chunk_boundaries_at_the_system_prompts() -> None:
    """A prompt sharing a system prompt matches every chunk of it, and no more."""
    rng = random.Random(6)
    systems = systems_of(rng)
    sentry = Sentry()
    for p in traffic(rng, 600, systems):
        sentry.observe(p)
    L = sentry.propose(version=1)
    assert L.version == 1 and L.lengths == build_lengths(SYSTEM_LENGTHS)
    tree = HRTree(L)
    for i, s in enumerate(systems):
        tree.insert(bytes([i]) * 20, s + toks(rng, 500))
    for i, s in enumerate(systems):
        depth, nodes = tree.search(s + toks(rng, 500))
        assert L.chunk_ends(10**6)[depth - 1] == len(s)  # matched exactly the system prompt
        assert nodes == {bytes([i]) * 20}


def test_a_lone_conversation_is_no_system_prompt() -> None:
    rng = random.Random(7)
    sentry = Sentry(min_support=4)
    conversation = HEADER + toks(rng, 100)
    for _ in range(30):
        sentry.observe(list(conversation))
        conversation += toks(rng, 50)
    assert sentry.system_prompt_lengths() == []
    for _ in range(3):  # duplicates end at the shared prefix: no divergence either
        sentry.observe(HEADER + [7] * 40)
    assert sentry.system_prompt_lengths() == []


def test_shared_prefix_needs_support_and_divergence() -> None:
    rng = random.Random(8)
    system = toks(rng, 64)
    prompts = [token_bytes(system + toks(rng, 10)) for _ in range(5)]
    assert shared_prefix_lengths(prompts, min_support=5) == [(64, 5)]
    assert shared_prefix_lengths(prompts, min_support=6) == []
    assert shared_prefix_lengths(prompts, min_support=5, min_length=65) == []
    # One continuation holding ≥ 90 % of them: the boundary is further on, not here.
    longer = system + toks(rng, 30)
    skewed = [token_bytes(longer + toks(rng, 10)) for _ in range(10)] + [token_bytes(system + toks(rng, 10))]
    assert shared_prefix_lengths(skewed, min_support=5) == [(94, 10)]


def test_refresh_after_warmup_then_every_refresh_every_requests() -> None:
    sentry = Sentry(warmup=3, refresh_every=5)
    for _ in range(2):
        sentry.observe([1, 2, 3])
    assert not sentry.due()
    sentry.count(1)  # a request another node of the group received
    assert sentry.due()
    sentry.propose(1)
    assert not sentry.due()
    sentry.count(4)
    assert not sentry.due()
    sentry.observe([1])
    assert sentry.due()
    sentry.count(-5)  # nonsense is ignored
    assert sentry.due()


# --------------------------------------------------------------------------- agreement


def test_highest_version_wins_ties_by_digest() -> None:
    v1 = ChunkLengths(version=1, lengths=(100, 16))
    v1b = ChunkLengths(version=1, lengths=(200, 16))
    v2 = ChunkLengths(version=2)
    assert supersedes(v2, v1) and not supersedes(v1, v2)
    assert supersedes(v1, v1b) != supersedes(v1b, v1)  # exactly one of two rivals wins
    assert not supersedes(v1, v1)
    assert proposer([b"\x05" * 20, b"\x01" * 20, b"\x09" * 20]) == b"\x01" * 20
    assert proposer([]) is None


def test_agreement_refuses_outsiders_and_bad_proposals() -> None:
    members = {b"a" * 20, b"b" * 20}
    agreement = LengthAgreement(ChunkLengths())
    assert agreement.offer(b"x" * 20, ChunkLengths(version=5), members) == (False, "non-member")
    assert agreement.offer(b"a" * 20, (3, (0, 5), 256, 8), members) == (False, "bad-proposal")
    assert agreement.offer(b"a" * 20, (3, (5,), 256, 99), members) == (False, "bad-proposal")
    assert agreement.current == ChunkLengths()
    assert agreement.offer(b"a" * 20, (3, (5,), 256, 8), members) == (True, "adopted")
    assert agreement.offer(b"b" * 20, (2, (7,), 256, 8), members) == (False, "not-newer")
    assert agreement.current == ChunkLengths(3, (5,), 256, 8)
    assert agreement.next_version() == 4 and agreement.next_version(highest_seen=10) == 11


# --------------------------------------------------------------------------- a group of nodes

LOW, HIGH, THIRD, OUTSIDER = b"\x01" * 20, b"\x02" * 20, b"\x03" * 20, b"\x7f" * 20


def group(ids: list[bytes], **sentry_kw: int) -> dict[bytes, GroupState]:
    kw = {"warmup": 40, "refresh_every": 100, "min_support": 4, **sentry_kw}
    return {i: GroupState(i, ids, capacity=2, sentry=Sentry(**kw)) for i in ids}


def deliver(nodes: dict[bytes, GroupState], sender: bytes, sends: list[Send], now: float,
            lose: Callable[[Send], bool] = lambda s: False) -> None:
    """Pass messages over a fake link (through the codec), and the replies they cause."""
    queue = [(sender, s) for s in sends]
    while queue:
        frm, s = queue.pop(0)
        if lose(s) or s.peer not in nodes:
            continue
        msg = decode(encode(s.msg))
        queue += [(s.peer, r) for r in nodes[s.peer].on_message(frm, msg, now)]


def round_all(nodes: dict[bytes, GroupState], now: float, lose: Callable[[Send], bool] = lambda s: False) -> None:
    for i, n in nodes.items():
        deliver(nodes, i, n.tick(now), now, lose)


def test_two_nodes_converge_on_one_L() -> None:
    rng = random.Random(9)
    nodes = group([LOW, HIGH])
    round_all(nodes, 0.0)
    systems = systems_of(rng)
    sent: list[Send] = []
    for p in traffic(rng, 40, systems):
        assert nodes[HIGH].observe(p, 1.0) == []  # not the proposer: learns, never proposes
        sent += nodes[LOW].observe(p, 1.0)
    assert [type(s.msg) for s in sent] == [LengthProposal] and sent[0].peer == HIGH
    deliver(nodes, LOW, sent, 1.0)
    a, b = nodes[LOW].lengths, nodes[HIGH].lengths
    assert a == b and a.version == 1 and a.lengths == build_lengths(SYSTEM_LENGTHS)
    # Both rebuilt: subtrees flow again under the new L.
    s = systems[0] + toks(rng, 300)
    nodes[HIGH].set_local_prefixes([s])
    round_all(nodes, 2.0)
    assert nodes[LOW].search(s + toks(rng, 10)).candidates == {HIGH}


def test_a_lost_proposal_is_repaired_by_the_next_round() -> None:
    rng = random.Random(10)
    nodes = group([LOW, HIGH, THIRD])
    round_all(nodes, 0.0)
    sent: list[Send] = []
    for p in traffic(rng, 40, systems_of(rng)):
        sent += nodes[LOW].observe(p, 1.0)
    deliver(nodes, LOW, sent, 1.0, lose=lambda s: s.peer == THIRD)
    assert nodes[THIRD].lengths.version == 0 and nodes[HIGH].lengths.version == 1
    # THIRD's load report says version 0; whoever knows version 1 passes L on.
    deliver(nodes, THIRD, nodes[THIRD].tick(5.0), 5.0)
    assert nodes[THIRD].lengths == nodes[LOW].lengths
    round_all(nodes, 10.0)
    assert len({n.lengths for n in nodes.values()}) == 1


def test_concurrent_proposals_converge() -> None:
    """HIGH has not heard of LOW yet, so both think they propose: the group still ends on one L."""
    rng = random.Random(11)
    nodes = group([LOW, HIGH])
    for node, systems in ((LOW, systems_of(rng, (150,))), (HIGH, systems_of(rng, (700,)))):
        for p in traffic(rng, 40, systems):
            nodes[node].observe(p, 0.0)
    assert nodes[LOW].lengths.version == nodes[HIGH].lengths.version == 1
    assert nodes[LOW].lengths != nodes[HIGH].lengths
    for _ in range(2):
        round_all(nodes, 1.0)
    assert nodes[LOW].lengths == nodes[HIGH].lengths


def test_refresh_without_change_keeps_the_version() -> None:
    rng = random.Random(12)
    nodes = group([LOW, HIGH], warmup=40, refresh_every=40)
    systems = systems_of(rng)
    for p in traffic(rng, 40, systems):
        nodes[LOW].observe(p, 0.0)
    assert nodes[LOW].lengths.version == 1
    out: list[Send] = []
    for p in traffic(rng, 40, systems):
        out += nodes[LOW].observe(p, 1.0)
    assert out == [] and nodes[LOW].lengths.version == 1


def test_the_group_counts_requests_of_other_nodes() -> None:
    nodes = group([LOW, HIGH], warmup=10, refresh_every=10)
    low = nodes[LOW]
    low.on_message(HIGH, LoadReport(1, 0, 0, 0, 1, 0, 0, requests=100), 0.0)  # baseline
    assert not low.sentry.due()
    low.on_message(HIGH, LoadReport(2, 0, 0, 0, 1, 0, 0, requests=109), 0.0)
    assert low.sentry.requests == 9
    low.on_message(HIGH, LoadReport(3, 0, 0, 0, 1, 0, 0, requests=50), 0.0)  # a restart: no credit
    assert low.sentry.requests == 9


def test_proposals_from_outsiders_are_dropped() -> None:
    nodes = group([LOW, HIGH])
    high = nodes[HIGH]
    before = high.lengths
    out = high.on_message(OUTSIDER, LengthProposal(9, (100, 16), 256, 8), 0.0)
    assert out == [] and high.lengths == before and high.dropped["non-member"] == 1
    out = high.on_message(LOW, LengthProposal(9, (0,), 256, 8), 0.0)
    assert out == [] and high.lengths == before and high.dropped["bad-proposal"] == 1
    high.on_message(LOW, LengthProposal(9, (100, 16), 256, 8), 0.0)
    assert high.lengths == ChunkLengths(9, (100, 16), 256, 8)


def test_updates_under_another_L_never_mix() -> None:
    nodes = group([LOW, HIGH])
    high = nodes[HIGH]
    old = ChunkLengths()
    new = ChunkLengths(1, (64, 16))
    high.on_message(LOW, LengthProposal(1, (64, 16), 256, 8), 0.0)  # from the designated proposer
    assert high.lengths == new
    stale = SubtreeUpdate(1, 0, True, 0, old.digest, (b"\x01",), ())
    forged = SubtreeUpdate(2, 0, True, 1, old.digest, (b"\x01",), ())  # version 1 but another L
    high.on_message(LOW, stale, 0.0)
    high.on_message(LOW, forged, 0.0)
    assert high.dropped["wrong-l-version"] == 1 and high.dropped["wrong-l-digest"] == 1
    assert high.tree.node_ids() == []


def test_a_member_pushing_the_version_to_its_limit_cannot_crash_the_proposer(caplog: pytest.LogCaptureFixture) -> None:
    """Past 2^62 a member's reports and proposals are dropped; a report far ahead of our
    version is not credited (issue 15: versions advance by at most MAX_VERSION_STEP), so the
    proposer proposes version 1, not 2^62 + 1; and at the limit itself the proposer keeps
    its L (and says why) instead of failing the request that made the refresh due."""
    rng = random.Random(13)
    nodes = group([LOW, HIGH])
    low = nodes[LOW]
    low.on_message(HIGH, LoadReport(1, MAX_L_VERSION + 1, 0, 0, 1, 0, 0, 0), 0.0)
    low.on_message(HIGH, LengthProposal(2**63 - 1, (100, 16), 256, 8), 0.0)
    assert low.dropped["bad-load"] == 1 and low.dropped["bad-proposal"] == 1
    low.on_message(HIGH, LoadReport(2, MAX_L_VERSION, 0, 0, 1, 0, 0, 0), 0.0)  # valid, but not credited
    assert low.highest_version_seen == 0
    out: list[Send] = []
    for p in traffic(rng, 40, systems_of(rng)):
        out += low.observe(p, 1.0)  # the refresh comes due here
    assert [type(s.msg) for s in out] == [LengthProposal] and low.lengths.version == 1

    low = group([LOW, HIGH])[LOW]
    low.agreement.current = ChunkLengths(version=MAX_L_VERSION)  # the group got there somehow
    before = low.lengths
    out = []
    for p in traffic(rng, 40, systems_of(rng)):
        out += low.observe(p, 1.0)
    assert out == [] and low.lengths == before and low.versions_exhausted
    assert "L version reached" in caplog.text


def test_L_churn_is_refused() -> None:
    """Issue 15, item 7: a member cannot make the group rebuild its trees at will. Only the
    designated proposer's L is adopted; it may advance at most once per MIN_PROPOSAL_ROUNDS
    rounds and by at most MAX_VERSION_STEP; a member that breaks a rule leaves the table for
    QUARANTINE_SECONDS, then comes back when it speaks."""
    nodes = group([LOW, HIGH, THIRD])
    round_all(nodes, 0.0)
    high = nodes[HIGH]
    assert set(high.table()) == {LOW, HIGH, THIRD}
    rebuilds = 0
    real_rebuild = high._rebuild

    def counting() -> None:
        nonlocal rebuilds
        rebuilds += 1
        real_rebuild()

    high._rebuild = counting  # type: ignore[method-assign]
    # A non-designated member pushes a new L every round: refused, no rebuild, not punished.
    for r in range(1, 6):
        high.on_message(THIRD, LengthProposal(r, (100 + r, 16), 256, 8), 5.0 * r)
    assert high.lengths.version == 0 and rebuilds == 0 and high.dropped["not-proposer"] == 5
    assert THIRD in high.table()
    # The designated proposer's L is adopted ...
    high.on_message(LOW, LengthProposal(1, (64, 16), 256, 8), 30.0)
    assert high.lengths.version == 1 and rebuilds == 1
    # ... but a second one a round later is churn: refused, and LOW is quarantined.
    high.on_message(LOW, LengthProposal(2, (65, 16), 256, 8), 35.0)
    assert high.lengths.version == 1 and rebuilds == 1 and high.dropped["churn"] == 1
    assert LOW not in high.table() and high.designated() == HIGH
    high.on_message(LOW, LoadReport(50, 1, 0, 0, 1, 0, 0, 0), 40.0)
    assert high.dropped["quarantined"] == 1 and LOW not in high.table()
    # A load report claiming a version far ahead of ours: quarantined too.
    high.on_message(THIRD, LoadReport(50, 1 + MAX_VERSION_STEP + 1, 0, 0, 1, 0, 0, 0), 41.0)
    assert high.dropped["version-jump"] == 1 and THIRD not in high.table()
    assert high.highest_version_seen == 1
    # After the quarantine LOW is heard again, designated again; a jump past the step is refused.
    later = 35.0 + QUARANTINE_SECONDS + 1
    high.on_message(LOW, LoadReport(60, 1, 0, 0, 1, 0, 0, 0), later)
    assert LOW in high.table() and high.designated() == LOW
    high.on_message(LOW, LengthProposal(1 + MAX_VERSION_STEP + 1, (66, 16), 256, 8), later)
    assert high.lengths.version == 1 and high.dropped["version-jump"] == 2 and rebuilds == 1
    # An honest step, after the interval, from the designated proposer is adopted.
    later += QUARANTINE_SECONDS + 1
    high.on_message(LOW, LoadReport(70, 1, 0, 0, 1, 0, 0, 0), later)
    high.on_message(LOW, LengthProposal(2, (66, 16), 256, 8), later + MIN_PROPOSAL_ROUNDS * 5.0)
    assert high.lengths.version == 2 and rebuilds == 2


def test_an_honest_proposer_waits_out_the_proposal_interval() -> None:
    """Stats flooding (request counters that make the refresh due at once) cannot make the
    designated proposer advance faster than the members accept."""
    rng = random.Random(14)
    nodes = group([LOW, HIGH], warmup=10, refresh_every=10)
    round_all(nodes, 0.0)
    low = nodes[LOW]
    systems = systems_of(rng)
    sent: list[Send] = []
    for p in traffic(rng, 40, systems):
        sent += low.observe(p, 1.0)
    assert low.lengths.version == 1
    deliver(nodes, LOW, sent, 1.0)
    for p in traffic(rng, 40, systems_of(rng, (333,))):  # a new system prompt: a refresh is due
        assert low.observe(p, 2.0) == []  # but within MIN_PROPOSAL_ROUNDS rounds: wait
    later = 1.0 + MIN_PROPOSAL_ROUNDS * 5.0
    sent = []
    for p in traffic(rng, 40, systems_of(rng, (333,))):
        sent += low.observe(p, later)
    assert low.lengths.version == 2
    deliver(nodes, LOW, sent, later)
    assert nodes[HIGH].lengths == low.lengths and nodes[HIGH].dropped["churn"] == 0
