"""The audit planner (verifier/audit/auditor.py ``Auditor``: I/O-free) and its driver against a fake
RPC, a fake anonymous client and a fake engine (decision 0013 §1-§3)."""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
import logging
import random
import stat
from pathlib import Path
from typing import Any, cast

import msgpack
import pytest
import trio

from model_node.engine import Engine, TokenScore
from overlay.wire.crypto import SigningKey
from overlay.wire.messages import ChatMessage, SamplingParams
from verifier.audit import pool as pl
from verifier.audit import tx as at
from verifier.audit.auditor import (
    GENERATOR_WARNING,
    OPENING_ROOM,
    PERSONAS,
    PLAN_FILE,
    Action,
    Auditor,
    AuditView,
    AuditViewError,
    Failure,
    Reply,
    Send,
    Submit,
    fit_report,
    grace_height,
    last_send,
    parse_revealed,
    parse_view,
)
from verifier.audit.chain import PROMPT_EPOCHS, REVEALED_PATH
from verifier.audit.challenges import ChallengeError, ChallengeGenerator
from verifier.audit.corpus import USED_FILE, ChallengeCorpus, load_corpus, read_corpus
from verifier.audit.loop import AuditDriver, load_auditor

CHAIN = "audit-test"
MODEL = "smollm2-135m-instruct"
SEEDS = [bytes([i + 1]) * 32 for i in range(4)]
PKS = [SigningKey.from_bytes(s).public_bytes for s in SEEDS]
NODES = (b"\x0c" * 20, b"\x0a" * 20, b"\x0b" * 20)  # the chain's order is not the report's
START, COMMIT_UNTIL, REPORT_FROM, END = 61, 63, 111, 120


def view(**kw: Any) -> AuditView:
    base: dict[str, Any] = dict(
        epoch=1, epoch_blocks=60, start_height=START, commit_until=COMMIT_UNTIL, report_from=REPORT_FROM,
        end_height=END, seed=b"\x55" * 32, challenges_per_node=2, validators=tuple((pk, 10) for pk in PKS),
        total_power=40, committed=(), reported=(), declared=(), audited_models=(MODEL,),
        nodes=((MODEL, NODES), ("other-model", (b"\x0d" * 20,))), outcomes=(), misses=())
    base.update(kw)
    return AuditView(**base)


def wire(v: AuditView) -> bytes:
    """``v`` as the chain's ``/audit`` map (verifier/audit/chain.py ``query_audit``)."""
    data: bytes = msgpack.packb({
        "epoch": v.epoch, "epoch_blocks": v.epoch_blocks, "start_height": v.start_height,
        "commit_until": v.commit_until, "report_from": v.report_from, "end_height": v.end_height, "seed": v.seed,
        "challenges_per_node": v.challenges_per_node, "validators": [list(x) for x in v.validators],
        "total_power": v.total_power, "committed": list(v.committed), "reported": list(v.reported),
        "declared": [[k, list(ms)] for k, ms in v.declared], "audited_models": list(v.audited_models),
        "nodes": [[m, list(ids)] for m, ids in v.nodes], "outcomes": [list(o) for o in v.outcomes],
        "misses": [list(m) for m in v.misses], "transcribed": list(v.transcribed)}, use_bin_type=True)
    return data


def submission(actions: list[Action]) -> Submit:
    """The one action of ``actions``, a transaction to submit."""
    (action,) = actions
    assert isinstance(action, Submit), action
    return action


def plan_commit(s: Submit) -> at.PlanCommit:
    """The plan commit ``s`` submits."""
    commit = at.decode_audit_tx(s.raw, CHAIN)
    assert isinstance(commit, at.PlanCommit), commit
    return commit


def auditor(i: int = 0, **kw: Any) -> Auditor:
    kw.setdefault("generator", ChallengeGenerator(rng=random.Random(100 + i)))
    kw.setdefault("rng", random.Random(i))
    return Auditor(SEEDS[i], CHAIN, (MODEL,), **kw)


def committed(i: int = 0, **kw: Any) -> AuditView:
    return view(committed=(PKS[i],), **kw)


def reply(served_by: bytes, n: int = 0) -> Reply:
    return Reply(((f"answer {n}", (5, 6, 7)), ("", (2,))), b"\x03" * 64, 1_700_000_000_000 + n, served_by)


def run_sends(a: Auditor, v: AuditView, heights: range, answer: Any) -> list[Send]:
    """Plan at each height, answer each send with ``answer(send, height)`` at once; the sends made."""
    sends = []
    for h in heights:
        for act in a.plan(v, h):
            assert isinstance(act, Send), act
            sends.append(act)
            out = answer(act, h)
            if out is not None:
                a.result(act, out, 900_000 if isinstance(out, Reply) else None, h)
    return sends


# --------------------------------------------------------------------------- the view


def test_the_view_decodes_strictly() -> None:
    v = view(committed=(PKS[1],), declared=((PKS[1], (MODEL,)),), outcomes=((0, "applied", "1 node(s)", 60),),
             misses=((NODES[0], 1),), transcribed=(PKS[2],))
    assert parse_view(wire(v)) == v
    assert parse_view(wire(v)).nodes_of(MODEL) == NODES and parse_view(wire(v)).nodes_of("x") == ()
    doc = msgpack.unpackb(wire(v), raw=False)
    for bad in ({**doc, "epoch": "1"}, {**doc, "seed": b"x"}, {k: x for k, x in doc.items() if k != "nodes"},
                {**doc, "nodes": [[MODEL]]}, {**doc, "committed": [b"short"]}, {**doc, "epoch": True},
                {**doc, "transcribed": [b"short"]}, {k: x for k, x in doc.items() if k != "transcribed"}):
        with pytest.raises(AuditViewError):
            parse_view(msgpack.packb(bad, use_bin_type=True))
    for raw in (b"\xc1", b"\x92\x01\x02", b"x" * (4 * 1024 * 1024 + 1)):
        with pytest.raises(AuditViewError):
            parse_view(raw)


def test_the_revealed_prompts_answer_decodes_strictly() -> None:
    keys = [b"\x01" * at.PROMPT_KEY_LEN, b"\x02" * at.PROMPT_KEY_LEN]
    assert parse_revealed(msgpack.packb([7, keys]), 7) == tuple(keys)
    assert parse_revealed(msgpack.packb([7, []]), 7) == ()
    for bad in ([6, keys], [7, [b"short"]], [7, keys, 1], {"7": keys}, [7, "x"], [True, []], [7, [1]]):
        with pytest.raises(AuditViewError):
            parse_revealed(msgpack.packb(bad), 7)
    for raw in (b"\xc1", b"\x92\x07\x90\x00", b"x" * (4 * 1024 * 1024 + 1)):
        with pytest.raises(AuditViewError):
            parse_revealed(raw, 7)


# --------------------------------------------------------------------------- the plan and its commit


def test_a_non_validator_does_nothing(caplog: pytest.LogCaptureFixture) -> None:
    outsider = Auditor(b"\x99" * 32, CHAIN, (MODEL,))
    with caplog.at_level(logging.WARNING, "gentorrent.audit"):
        assert outsider.plan(view(), 61) == [] and outsider.plan(view(), 62) == []
    assert caplog.text.count("not a validator") == 1


def test_the_plan_commits_only_a_salted_hash_and_reveals_no_prompt() -> None:
    a = auditor(0)
    (sub,) = a.plan(view(), START - 1)  # the last block of the previous epoch: the commit lands in time
    assert isinstance(sub, Submit) and sub.key == ("commit", 1)
    tx = at.decode_audit_tx(sub.raw, CHAIN)
    assert isinstance(tx, at.PlanCommit)
    assert (tx.epoch, tx.validator_pk, tx.models) == (1, PKS[0], (MODEL,))
    p = a.current
    assert p is not None and tx.plan_hash == p.hash()
    # the plan: 2 challenges for each of the model's nodes, by node id ascending, another model's node left out
    assert [e.node_id for e in p.entries] == [n for n in sorted(NODES) for _ in range(2)]
    assert all(e.opening.model == MODEL for e in p.entries)
    assert tx.plan_hash == at.plan_hash(p.salt, [(e.node_id, e.opening.commitment()) for e in p.entries])
    # nothing of the plan is in the transaction: no prompt, node id, commitment, salt or send height
    for e in p.entries:
        for m in e.opening.messages:
            assert m.content.encode() not in sub.raw
        assert e.node_id not in sub.raw and e.opening.commitment() not in sub.raw and e.opening.salt not in sub.raw
    assert p.salt not in sub.raw
    # the same plan with another salt has another hash: a known node list cannot be checked against it
    other = at.plan_hash(bytes(16), [(e.node_id, e.opening.commitment()) for e in p.entries])
    assert other != tx.plan_hash
    # once, and again only after a network failure; never a new plan for the same epoch
    assert a.plan(view(), START) == []
    a.submitted(sub.key, retry=True)
    assert plan_commit(submission(a.plan(view(), START))).plan_hash == tx.plan_hash
    # two verifiers plan apart: different prompts, different hashes
    b = auditor(1)
    assert plan_commit(submission(b.plan(view(), START))).plan_hash != tx.plan_hash
    assert b.current is not None
    assert not {e.opening.prompt_key() for e in p.entries} & {e.opening.prompt_key() for e in b.current.entries}


def test_no_commit_once_the_window_is_over_and_no_sends_without_a_commit(caplog: pytest.LogCaptureFixture) -> None:
    assert auditor(0).plan(view(), COMMIT_UNTIL) == []  # a commit sent now would land after the window
    a = auditor(0)
    a.plan(view(), START)
    with caplog.at_level(logging.WARNING, "gentorrent.audit"):
        for h in range(COMMIT_UNTIL, REPORT_FROM + 2):
            assert a.plan(view(), h) == []  # its commit never made it on chain: nothing is sent or reported
    assert caplog.text.count("not on the chain") == 1


def test_sends_are_spread_over_the_send_window_each_at_its_own_height() -> None:
    nodes = tuple(bytes([i]) * 20 for i in range(1, 9))
    a = auditor(2)
    v = view(nodes=((MODEL, nodes),), committed=(PKS[2],))
    a.plan(view(nodes=((MODEL, nodes),)), START)
    assert a.current is not None
    planned = [e.send_at for e in a.current.entries]
    assert all(COMMIT_UNTIL < h < REPORT_FROM for h in planned)
    assert len(set(planned)) >= 8  # 16 challenges, not all at one height
    sends = run_sends(a, v, range(START, REPORT_FROM), lambda s, h: reply(s.node_id))
    assert sorted(s.index for s in sends) == list(range(16))  # each once
    heights: dict[int, int] = {}
    b = auditor(2)
    b.plan(view(nodes=((MODEL, nodes),)), START)
    for h in range(START, REPORT_FROM):
        for s in b.plan(v, h):
            assert isinstance(s, Send)
            heights[s.index] = h
    assert b.current is not None
    assert heights == {i: e.send_at for i, e in enumerate(b.current.entries)}  # sent when its height came
    assert max(heights.values()) - min(heights.values()) > (REPORT_FROM - COMMIT_UNTIL) // 2


def test_busy_silent_and_lost_are_tried_again_later_at_most_three_times() -> None:
    a = auditor(0)
    a.plan(view(), START)
    tries: dict[int, list[int]] = {}

    def answer(s: Send, h: int) -> Reply | Failure:
        tries.setdefault(s.index, []).append(h)
        if s.node_id == NODES[1]:
            return Failure("busy", "at capacity")  # always busy
        if s.node_id == NODES[2] and s.attempt == 1:
            return Failure("silent", "no reply")  # answers its second try
        return Failure("unverified", "bad signature") if s.node_id == NODES[0] else reply(s.node_id)

    sends = run_sends(a, committed(), range(START, REPORT_FROM), answer)
    p = a.current
    assert p is not None
    by_node = {n: [i for i, e in enumerate(p.entries) if e.node_id == n] for n in NODES}
    for i in by_node[NODES[1]]:
        assert len(tries[i]) == at.MAX_TRIES and tries[i] == sorted(set(tries[i]))  # later each time
        assert p.entries[i].outcome == at.FailOutcome("busy", 3)
    for i in by_node[NODES[2]]:
        out = p.entries[i].outcome
        assert len(tries[i]) == 2 and isinstance(out, at.ReplyOutcome) and out.tries == 2
    for i in by_node[NODES[0]]:  # not a failure that waiting mends: reported after one try
        assert len(tries[i]) == 1 and p.entries[i].outcome == at.FailOutcome("unverified", 1)
    assert len(sends) == 2 * 3 + 2 * 2 + 2 * 1


def test_a_retry_that_no_longer_fits_the_window_is_final() -> None:
    a = auditor(0)
    a.plan(view(), START)
    p = a.current
    assert p is not None
    for e in p.entries:
        e.send_at = REPORT_FROM - 1
    sends = [s for s in a.plan(committed(), REPORT_FROM - 1) if isinstance(s, Send)]
    for s in sends:
        a.result(s, Failure("busy", "full"), None, REPORT_FROM - 1)
    assert all(e.outcome == at.FailOutcome("busy", 1) for e in p.entries)


def test_the_report_reveals_the_committed_plan_a_forwarded_reply_for_the_node_asked() -> None:
    a = auditor(1)
    commit_sub = submission(a.plan(view(), START))
    commit = at.decode_audit_tx(commit_sub.raw, CHAIN)
    forwarded_to = b"\x0e" * 20

    def answer(s: Send, h: int) -> Reply | None:
        if s.node_id == NODES[0]:
            return reply(forwarded_to, s.index)  # the node asked forwarded it to a member of its group
        if s.node_id == NODES[2] and s.index % 2:
            return None  # still out when the report window opens
        return reply(s.node_id, s.index)

    v = committed(1)
    run_sends(a, v, range(START, REPORT_FROM), answer)
    # a challenge still out: the report waits a few blocks for it
    grace = grace_height(REPORT_FROM, END)
    assert grace == END - 2
    assert a.plan(v, REPORT_FROM) == [] and a.plan(v, grace - 1) == []
    (sub,) = a.plan(v, grace)
    assert isinstance(sub, Submit) and sub.key == ("report", 1)
    report = at.decode_audit_tx(sub.raw, CHAIN)
    assert isinstance(report, at.AuditReport) and isinstance(commit, at.PlanCommit)
    assert report.plan_hash() == commit.plan_hash and report.validator_pk == PKS[1] and report.epoch == 1
    assert [e.node_id for e in report.entries] == [n for n in sorted(NODES) for _ in range(2)]
    for e in report.entries:
        out = e.outcome
        if e.node_id == NODES[0]:
            assert isinstance(out, at.ReplyOutcome) and out.served_by == forwarded_to and out.score == 900_000
        elif e.node_id == NODES[2] and out != at.FailOutcome("silent", 1):
            assert isinstance(out, at.ReplyOutcome) and out.served_by == NODES[2]
    assert sum(e.outcome == at.FailOutcome("silent", 1) for e in report.entries) == 1
    assert a.plan(v, REPORT_FROM + 4) == []  # once
    assert a.plan(view(committed=(PKS[1],), reported=(PKS[1],)), REPORT_FROM + 5) == []


def test_a_report_refused_for_one_entry_is_sent_again_with_that_entry_failed() -> None:
    a = auditor(0)
    a.plan(view(), START)
    run_sends(a, committed(), range(START, REPORT_FROM), lambda s, h: reply(s.node_id, s.index))
    sub = submission(a.plan(committed(), REPORT_FROM))
    a.submitted(sub.key, retry=False)
    a.refused(sub.key, "INVALID_FIELD (8): entry 3: the reply's serving node 0b0b0b0b is not a registered model node")
    again = submission(a.plan(committed(), REPORT_FROM + 1))
    report = at.decode_audit_tx(again.raw, CHAIN)
    assert isinstance(report, at.AuditReport)
    assert [i for i, e in enumerate(report.entries) if isinstance(e.outcome, at.FailOutcome)] == [3]
    a.refused(again.key, "CONFLICT (6): something else")
    assert a.plan(committed(), REPORT_FROM + 2) == []  # not an entry's fault: final


def test_an_auditor_restarted_mid_epoch_reports_the_plan_it_committed() -> None:
    a = auditor(3)
    sub = submission(a.plan(view(), START))
    commit = at.decode_audit_tx(sub.raw, CHAIN)
    half = (REPORT_FROM + START) // 2
    run_sends(a, committed(3), range(START, half), lambda s, h: reply(s.node_id, s.index))
    out = [s for s in a.plan(committed(3), half) if isinstance(s, Send)]  # some out when it stops
    saved = a.snapshot()
    assert not a.changed
    b = auditor(3, generator=ChallengeGenerator(rng=random.Random(999)))
    assert b.restore(saved) and b.current is not None
    sends = run_sends(b, committed(3), range(half, REPORT_FROM), lambda s, h: reply(s.node_id, s.index))
    assert {s.index for s in out} <= {s.index for s in sends}  # what was out is sent again
    rep = submission(b.plan(committed(3), REPORT_FROM))
    report = at.decode_audit_tx(rep.raw, CHAIN)
    assert isinstance(report, at.AuditReport) and isinstance(commit, at.PlanCommit)
    assert report.plan_hash() == commit.plan_hash
    assert all(isinstance(e.outcome, at.ReplyOutcome) for e in report.entries)
    # another verifier's or another chain's plan is not taken
    assert not auditor(2).restore(saved) and not Auditor(SEEDS[3], "other", (MODEL,)).restore(saved)
    assert not auditor(3).restore(b"\xc1garbage")


def test_a_restart_before_the_commit_lands_sends_the_same_plan() -> None:
    a = auditor(0)
    sub = submission(a.plan(view(), START))
    b = auditor(0, generator=ChallengeGenerator(rng=random.Random(5)))
    b.restore(a.snapshot())
    again = submission(b.plan(view(), START + 1))
    assert plan_commit(again).plan_hash == plan_commit(sub).plan_hash


def test_a_verifier_that_lost_its_plan_says_so(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, "gentorrent.audit"):
        assert auditor(0).plan(committed(), START + 5) == []
    assert "no longer holds it" in caplog.text


def test_donated_prompts_come_first_and_the_generator_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    donor = b"\x44" * 20
    pool = pl.DonationPool()
    turns = (ChatMessage("user", "Hi"), ChatMessage("assistant", "Hello!"), ChatMessage("user", "Tell me a joke."))
    own = SamplingParams(temperature=0.2, top_p=0.9, top_k=0, max_tokens=100, seed=3)
    pool.add(pl.Donation(donor, MODEL, turns, own))
    pool.add(pl.Donation(donor, "other-model", (ChatMessage("user", "not this model"),), own))
    a = auditor(0, pool=pool)
    with caplog.at_level(logging.WARNING, "gentorrent.audit"):
        a.plan(view(), START)
        a.plan(view(), START + 1)
    p = a.current
    assert p is not None
    script = (ChatMessage("user", "Hi"), ChatMessage("user", "Tell me a joke."))
    donated = [e for e in p.entries if e.opening.messages == script]
    assert len(donated) == 1 and donated[0].opening.params == own  # as given, its turns kept, the reply dropped
    assert pool.count(MODEL) == 0 and pool.count("other-model") == 1
    assert caplog.text.count(GENERATOR_WARNING) == 1 and "5 of 6 challenges" in caplog.text
    assert "and 2 of 3 nodes got fewer than half of theirs from prompts they cannot recognise" in caplog.text
    caplog.clear()
    full = pl.DonationPool()
    for i in range(6):
        full.add(pl.Donation(bytes([i]) * 20, MODEL, (ChatMessage("user", f"donated {i}"),), own))
    with caplog.at_level(logging.WARNING, "gentorrent.audit"):
        auditor(1, pool=full).plan(view(), START)
    assert GENERATOR_WARNING not in caplog.text and len(full) == 0



def test_a_node_is_challenged_only_with_prompts_it_has_not_read(caplog: pytest.LogCaptureFixture) -> None:
    """Decision 0029 through the plan: every donated prompt names the node that served it; no node
    of the plan is sent one it read, and a node that read every prompt left gets the generator's."""
    own = SamplingParams(0.7, 1.0, 0, 256, None)
    pool = pl.DonationPool()
    for i in range(12):  # each of the three nodes read four donors' conversations
        pool.add(pl.Donation(bytes([0x40 + i]) * 20, MODEL, (ChatMessage("user", f"question {i}"),), own,
                             (NODES[i % 3],)))
    a = auditor(0, pool=pool)
    with caplog.at_level(logging.WARNING, "gentorrent.audit"):
        a.plan(view(), START)
    assert a.current is not None
    by_text = {f"question {i}": NODES[i % 3] for i in range(12)}
    donated = [e for e in a.current.entries if e.opening.messages[-1].content in by_text]
    assert len(donated) == 6 and len(pool) == 6  # 2 a node (view's k), the rest left
    assert all(by_text[e.opening.messages[-1].content] != e.node_id for e in donated)
    assert GENERATOR_WARNING not in caplog.text
    only = pl.DonationPool()
    only.add(pl.Donation(b"\x50" * 20, MODEL, (ChatMessage("user", "read by all"),), own, NODES))
    with caplog.at_level(logging.WARNING, "gentorrent.audit"):
        auditor(1, pool=only).plan(view(), START)
    assert len(only) == 1 and GENERATOR_WARNING in caplog.text


def test_a_plan_never_holds_a_user_turn_twice() -> None:
    """Two donors' conversations often share a follow-up ("tell me more"), and the chain refuses a
    whole report that carries any user turn twice (``chain._check_layout``): the epoch's report
    would be lost. A donated prompt sharing a turn with one already planned is dropped."""
    own = SamplingParams(0.7, 1.0, 0, 256, None)
    pool = pl.DonationPool()
    for i in range(6):
        pool.add(pl.Donation(bytes([0x40 + i]) * 20, MODEL, (ChatMessage("user", f"question {i}"),
                                                             ChatMessage("user", "Tell me more.")), own))
    a = auditor(0, pool=pool)
    a.plan(view(), START)
    assert a.current is not None
    keys = [k for e in a.current.entries for k in e.opening.prompt_keys()]
    assert len(keys) == len(set(keys))
    shared = [e for e in a.current.entries if e.opening.messages[-1].content == "Tell me more."]
    assert len(shared) == 1 and len(a.current.entries) == 6  # the others come from the generator


def test_a_donated_prompt_sharing_a_turn_with_an_earlier_challenge_is_not_sent() -> None:
    """The chain voids a challenge carrying a prompt an earlier report revealed (for PROMPT_EPOCHS
    epochs): a donated script sharing a follow-up with one of this verifier's earlier challenges,
    of its last plan or of a plan restored after a restart, is dropped rather than sent void."""
    own = SamplingParams(0.7, 1.0, 0, 256, None)

    def donation(i: int) -> pl.Donation:
        return pl.Donation(bytes([0x40 + i]) * 20, MODEL, (ChatMessage("user", f"question {i}"),
                                                           ChatMessage("user", "Tell me more.")), own)

    later = view(epoch=2, start_height=END + 1, commit_until=END + 3, report_from=END + 51, end_height=END + 60)
    for restarted in (False, True):
        pool = pl.DonationPool()
        pool.add(donation(0))
        a = auditor(0, pool=pool)
        a.plan(view(), START)
        assert "Tell me more." in _contents(a)
        pool.add(donation(1))
        if restarted:
            a, snapshot = auditor(0, pool=pool), a.snapshot()
            assert a.restore(snapshot)
        a.plan(later, END + 1)
        assert "Tell me more." not in _contents(a) and len(pool) == 0


def _key(*turns: str) -> bytes:
    """The prompt key of the last of ``turns`` (a script's user turns)."""
    own = SamplingParams(0.7, 1.0, 0, 256, None)
    return at.Opening(bytes(16), MODEL, tuple(ChatMessage("user", t) for t in turns), own).prompt_keys()[-1]


def test_a_turn_another_verifiers_report_revealed_is_not_planned_until_the_chain_forgets_it() -> None:
    """The chain voids a challenge carrying a user turn any report of its last PROMPT_EPOCHS
    revealed, another verifier's too: a donated script holding one is dropped rather than sent void,
    and a private conversation holding one waits, unused, until the chain has forgotten it."""
    own = SamplingParams(0.7, 1.0, 0, 256, None)
    pool = pl.DonationPool()
    pool.add(pl.Donation(b"\x40" * 20, MODEL, (ChatMessage("user", "question 0"), ChatMessage("user", "Tell me more.")),
                         own))
    corpus = ChallengeCorpus([(ChatMessage("user", "private 0"), ChatMessage("user", "Thanks!"))], "private.jsonl")
    a = auditor(0, pool=pool, corpus=corpus)
    assert a.revealed_wanted(5) == [0, 1, 2, 3, 4]
    for e in range(5):
        a.take_revealed(e, [_key("Tell me more.")] if e == 2 else [_key("Thanks!")] if e == 4 else [])
    assert a.revealed_wanted(5) == []
    v = view(epoch=5)
    a.plan(v, START)
    assert not {"Tell me more.", "Thanks!"} & set(_contents(a)) and len(pool) == 0 and corpus.left() == 1
    b = auditor(0, corpus=corpus)  # a verifier that has not read what the chain revealed sends it void
    b.plan(v, START)
    assert "Thanks!" in _contents(b)
    corpus = ChallengeCorpus([(ChatMessage("user", "private 1"), ChatMessage("user", "Thanks!"))], "private.jsonl")
    a.corpus = corpus
    later = 4 + PROMPT_EPOCHS  # the epoch from which the chain no longer holds epoch 4's reveals
    assert a.revealed_wanted(later) == list(range(5, later))  # epochs 2 and 4 forgotten, the others wanted
    a.plan(view(epoch=later), START)
    assert "Thanks!" in _contents(a) and corpus.left() == 0  # no longer void: sent


def test_what_an_auditor_keeps_does_not_grow_with_the_epochs() -> None:
    """A verifier's audit loop runs for months: its once-an-epoch warnings of past epochs are
    forgotten, and its driver keeps only the latest SUBMITTED_KEPT submissions."""
    from verifier.audit.loop import SUBMITTED_KEPT

    a = auditor(0)
    for epoch in range(1, 200):  # not a validator: warned once an epoch
        a.plan(view(epoch=epoch, validators=tuple((pk, 10) for pk in PKS[1:])), START)
    assert len(a._warned) == 1
    driver = AuditDriver(a, "127.0.0.1:1", client=FakeClient({}), engine=FakeEngine())  # type: ignore[arg-type]
    assert driver.submitted.maxlen == SUBMITTED_KEPT


def test_donors_of_the_largest_prompts_cannot_fill_the_report_with_openings(caplog: pytest.LogCaptureFixture) -> None:
    """Attack: registered users donate the largest prompts a donation holds (two 7.5 KB turns,
    about 15 KB an opening) so that a plan's 128 openings alone pass the report's 1 MiB, and the
    report, which carries them, can never go out. A plan's openings stay within OPENING_ROOM,
    leaving the rest for replies; past it, large prompts drawn are dropped and the generator's small
    ones take their places."""
    own = SamplingParams(0.7, 1.0, 0, 64, None)
    pool = pl.DonationPool()
    for i in range(200):
        big = (ChatMessage("user", f"{i} " + "x" * 7500), ChatMessage("user", f"{i} again " + "y" * 7500))
        pool.add(pl.Donation(bytes([i % 256, i // 256]) * 10, MODEL, big, own))
    nodes = tuple(bytes([0x20 + j]) * 20 for j in range(32))
    a = auditor(0, pool=pool)
    with caplog.at_level(logging.INFO, "gentorrent.audit"):
        a.plan(view(nodes=((MODEL, nodes),), challenges_per_node=4), START)
    assert a.current is not None
    sizes = [len(e.opening.encode()) for e in a.current.entries]
    assert len(sizes) == 128 and 128 * 15_000 > 1024 * 1024  # unchecked, the openings would not fit
    assert sum(sizes) <= OPENING_ROOM == at.MAX_REPORT_BYTES // 4
    assert sum(n > 15_000 for n in sizes) >= 12  # large prompts are taken while there is room (13 here)
    assert "past their room" in caplog.text



def test_a_verifier_sends_as_as_many_personas_as_challenges_a_node_up_to_personas() -> None:
    """A persona's paths carry about one script to each node an epoch, as a user's carry about one
    session (decision 0027: with fewer personas a node sees their paths come back; with more,
    every path is new at its first script)."""
    nodes = tuple(bytes([0x20 + j]) * 20 for j in range(32))
    for k in (1, 2, 3, 4):
        a = auditor(0)
        a.plan(view(nodes=((MODEL, nodes),), challenges_per_node=k), START)
        assert a.current is not None
        assert {e.persona for e in a.current.entries} == set(range(min(k, PERSONAS)))
    assert PERSONAS == at.MAX_CHALLENGES_PER_NODE


# --------------------------------------------------------------------------- the driver


class FakeEngine:
    """Stands in for the verifier's engine as far as scoring goes (chat_prompt, score)."""

    model = MODEL

    def chat_prompt(self, messages: Any, continuation: str = "") -> list[int]:
        return [1, 2, 3]

    async def score(self, prompt: list[int], ids: list[int], params: Any) -> list[TokenScore]:
        # every token half as likely as the model's own choice: C = 0.5
        return [TokenScore(t, -1.0 - 0.6931471805599453, -1.0, t) for t in ids]


class FakeClient:
    """Stands in for the anonymous client: ``answers[node]`` is the list of (text, ids) chunks a node
    sends, or an exception; another node's id in ``signer`` makes the reply come signed by it."""

    n = 4

    def __init__(self, answers: dict[bytes, Any], signer: dict[bytes, bytes] | None = None) -> None:
        self.answers, self.signer = answers, signer or {}
        self.calls: list[tuple[bytes | None, bool, bool]] = []
        self.held: list[Any] = []  # every path set held, and the ones released
        self.released: list[Any] = []
        self.sent: list[tuple[Any, Any]] = []  # (messages, held paths) of every request

    async def hold_paths(self, wait_s: float = 30.0) -> list[Any]:
        paths = [FakePath() for _ in range(self.n)]
        self.held.append(paths)
        return paths

    def release_paths(self, paths: Any) -> None:
        self.released.append(paths)

    async def request(self, model: str, messages: Any, params: Any = None, *, node: bytes | None = None,
                      chunk_timeout: float = 60.0, paths_timeout: float = 30.0, failover: bool = True,
                      fresh_paths: bool = False, request_id: bytes | None = None, held_paths: Any = None) -> Any:
        from overlay.wire.messages import ReplyChunk

        assert request_id is not None and len(request_id) == 16  # the try's id, which the reply signs
        assert fresh_paths != (held_paths is not None)  # its own paths, or its script's
        self.calls.append((node, failover, fresh_paths))
        self.sent.append((messages, held_paths))
        assert node is not None  # a challenge goes to one node
        got = self.answers[node]
        if isinstance(got, Exception):
            raise got
        for i, (text, ids) in enumerate(got):
            yield ReplyChunk(request_id=bytes(16), seq=i, text=text, token_ids=tuple(ids), done=i == len(got) - 1,
                             error="", node=self.signer.get(node, node), chain=b"c" * 32, signature=b"s" * 64,
                             signed_at_ms=77)


class FakePath:
    """A held path that is up."""

    dead = False

    class ready:  # stands in for trio.Event: is_set
        @staticmethod
        def is_set() -> bool:
            return True


class FakeChain:
    """The verifier's RPC: ``/audit`` at ``height``, and every broadcast transaction."""

    def __init__(self, v: AuditView, height: int) -> None:
        self.view, self.height = v, height
        self.sent: list[bytes] = []
        self.revealed: dict[int, list[bytes]] = {}  # epoch -> the prompt keys its reports revealed
        self.queries: list[str] = []

    async def rpc(self, address: str, method: str, params: dict[str, str]) -> Any:
        if method == "abci_query":
            path = json.loads(params["path"])
            self.queries.append(path)
            if path == "/audit":
                value = wire(self.view)
            else:
                assert path.startswith(REVEALED_PATH), path
                epoch = int(path[len(REVEALED_PATH):])
                value = msgpack.packb([epoch, self.revealed.get(epoch, [])], use_bin_type=True)
            return {"response": {"code": 0, "value": base64.b64encode(value).decode(), "height": str(self.height)}}
        assert method == "broadcast_tx_sync"
        self.sent.append(bytes.fromhex(params["tx"][2:]))
        return {"code": 0, "log": ""}


class WatchedChain(FakeChain):
    """A :class:`FakeChain` that notes how many path sets ``client`` had closed at each broadcast."""

    def __init__(self, v: AuditView, height: int, client: FakeClient) -> None:
        super().__init__(v, height)
        self.client = client
        self.closed_at_broadcast: list[int] = []

    async def rpc(self, address: str, method: str, params: dict[str, str]) -> Any:
        if method == "broadcast_tx_sync":
            self.closed_at_broadcast.append(len(self.client.released))
        return await super().rpc(address, method, params)


async def test_the_driver_runs_an_epoch_over_its_personas_paths_to_one_node_each(tmp_path: Path) -> None:
    """Every challenge goes to one node, no failover, over the paths its persona holds for the
    epoch (decision 0026): one set a persona, closed before the report that labels them goes out."""
    from overlay.anon.client import AllBusy


    client = FakeClient({NODES[0]: [("hello", (5, 6)), ("", (2,))], NODES[1]: AllBusy("busy: full"),
                         NODES[2]: [("fwd", (8,))]}, signer={NODES[2]: b"\x0e" * 20})
    chain = WatchedChain(view(), START, client)
    a = auditor(0)
    driver = AuditDriver(a, "127.0.0.1:1", client=client, engine=FakeEngine(), rpc=chain.rpc,  # type: ignore[arg-type]
                         data_dir=tmp_path)
    async with trio.open_nursery() as nursery:
        await driver.step(nursery)
    (commit,) = [at.decode_audit_tx(raw, CHAIN) for raw in chain.sent]
    assert isinstance(commit, at.PlanCommit)
    path = tmp_path / PLAN_FILE
    assert path.exists() and stat.S_IMODE(path.stat().st_mode) == 0o600  # written before the commit went out
    chain.view = committed(0)
    for h in range(START + 1, REPORT_FROM + 1):
        chain.height = h
        async with trio.open_nursery() as nursery:
            await driver.step(nursery)
    report = at.decode_audit_tx(chain.sent[-1], CHAIN)
    assert isinstance(report, at.AuditReport) and report.plan_hash() == commit.plan_hash
    assert {(n, f, fresh) for n, f, fresh in client.calls} == {(n, False, False) for n in NODES}  # one node, held paths
    assert a.current is not None
    personas = {e.persona for e in a.current.entries}
    assert personas == {0, 1}  # k = 2 challenges a node: 2 personas (decision 0027), both in use here
    assert len(client.held) == len({id(h) for _, h in client.sent}) == len(personas)  # one path set each
    assert client.released == client.held and chain.closed_at_broadcast[-1] == len(personas)  # closed, then reported
    assert [c[0] for c in client.calls].count(NODES[1]) == 2 * at.MAX_TRIES  # busy: three tries each
    outs = {e.node_id: e.outcome for e in report.entries}
    first = outs[NODES[0]]
    assert isinstance(first, at.ReplyOutcome) and first.chunks == (("hello", (5, 6)), ("", (2,)))
    assert first.score == 500_000 and first.signature == b"s" * 64 and first.signed_at_ms == 77
    assert outs[NODES[1]] == at.FailOutcome("busy", 3)
    fwd = outs[NODES[2]]
    assert isinstance(fwd, at.ReplyOutcome) and fwd.served_by == b"\x0e" * 20  # counted for the node asked
    # a restarted verifier takes the saved plan back
    b = auditor(0, generator=ChallengeGenerator(rng=random.Random(1)))
    load_auditor(tmp_path, b)
    assert b.current is not None and b.current.hash() == commit.plan_hash


class BrokenEngine(FakeEngine):
    async def score(self, prompt: list[int], ids: list[int], params: Any) -> list[TokenScore]:
        from model_node.engine import EngineError

        raise EngineError("out of memory")


async def test_the_driver_reads_each_past_epochs_revealed_prompts_once() -> None:
    """The planner learns what the reports of the chain's last PROMPT_EPOCHS epochs revealed, read
    once an epoch (``/audit/revealed/E``), before its plan: a donated follow-up another verifier
    revealed two epochs ago is not sent."""
    own = SamplingParams(0.7, 1.0, 0, 256, None)
    pool = pl.DonationPool()
    pool.add(pl.Donation(b"\x40" * 20, MODEL, (ChatMessage("user", "question 0"), ChatMessage("user", "Tell me more.")),
                         own))
    chain = FakeChain(view(epoch=3), START)
    chain.revealed = {1: [_key("Tell me more.")]}
    a = auditor(0, pool=pool)
    driver = AuditDriver(a, "127.0.0.1:1", client=FakeClient({}), engine=FakeEngine(), rpc=chain.rpc)  # type: ignore[arg-type]
    for h in (START, START + 1):
        chain.height = h
        async with trio.open_nursery() as nursery:
            await driver.step(nursery)
    assert chain.queries == ["/audit", *(f"{REVEALED_PATH}{e}" for e in range(3)), "/audit"]
    assert "Tell me more." not in _contents(a) and len(pool) == 0


async def test_a_failure_on_the_verifiers_side_is_logged_with_the_node_and_stops_nothing(
        caplog: pytest.LogCaptureFixture) -> None:
    from overlay.wire.identity import short_id

    a = auditor(0)
    a.plan(view(), START)
    assert a.current is not None
    send, other, *_ = [s for s in a.plan(committed(), REPORT_FROM - 1) if isinstance(s, Send)]
    client = FakeClient({n: [("x", (1,))] for n in NODES})
    driver = AuditDriver(a, "x:1", client=client, engine=BrokenEngine(), rpc=FakeChain(view(), 0).rpc)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, "gentorrent.audit"):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(driver._run_action, send)
    assert a.current.entries[send.index].outcome == at.FailOutcome("other", 1)
    assert short_id(send.node_id) in caplog.text and "out of memory" in caplog.text
    # a bug in the client: logged, the challenge failed, the driver goes on
    caplog.clear()
    driver.client = None  # type: ignore[assignment]
    with caplog.at_level(logging.ERROR, "gentorrent.audit"):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(driver._run_action, other)
    assert a.current.entries[other.index].outcome == at.FailOutcome("other", 1)
    assert short_id(other.node_id) in caplog.text


def test_the_verifier_command_takes_audit_flags(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from gentorrent.cli import main

    with pytest.raises(SystemExit):
        main(["verifier", "--help"])
    out = capsys.readouterr().out
    for flag in ("--audit ", "--audit-model", "--audit-listen", "--audit-region", "--audit-threads",
                 "--challenge-prompts", "--transcript-budget", "--take-version1-commits"):
        assert flag in out
    from verifier.audit.transcripts import NODE_BUDGET, ROUND_BUDGET

    flat = " ".join(out.split())  # what --transcript-budget's help says a verifier needs is what it warns about
    assert f"Default: {ROUND_BUDGET} per --audit-threads" in flat and f"about {NODE_BUDGET} a model node" in flat
    assert f"one --audit-threads for every {ROUND_BUDGET // NODE_BUDGET} nodes" in flat
    assert main(["verifier", "--data-dir", str(tmp_path), "--audit-model", MODEL]) == 2
    assert "--audit-model needs --audit" in capsys.readouterr().err
    assert main(["verifier", "--data-dir", str(tmp_path), "--audit", "--audit-threads", "0"]) == 2
    assert "--audit-threads must be at least 1" in capsys.readouterr().err
    assert main(["verifier", "--data-dir", str(tmp_path), "--audit", "--transcript-budget", "0"]) == 2
    assert "--transcript-budget must be at least 1" in capsys.readouterr().err
    assert main(["verifier", "--data-dir", str(tmp_path), "--transcript-budget", "9000"]) == 2
    assert "--transcript-budget needs --audit" in capsys.readouterr().err
    assert main(["verifier", "--data-dir", str(tmp_path), "--take-version1-commits"]) == 2
    assert "--take-version1-commits needs --audit" in capsys.readouterr().err
    good = tmp_path / "private.jsonl"
    good.write_text('{"messages": [{"role": "user", "content": "Hi"}]}\n', encoding="utf-8")
    assert main(["verifier", "--data-dir", str(tmp_path), "--challenge-prompts", str(good)]) == 2
    assert "--challenge-prompts needs --audit" in capsys.readouterr().err
    # a bad file stops the verifier before it starts, naming the line
    bad = tmp_path / "bad.jsonl"
    bad.write_text(good.read_text() + '\n{"messages": [{"role": "tool", "content": "x"}]}\n', encoding="utf-8")
    assert main(["verifier", "--data-dir", str(tmp_path), "--audit", "--challenge-prompts", str(bad)]) == 2
    assert f"--challenge-prompts: {bad}:3: message 1: role must be" in capsys.readouterr().err


def test_a_reply_too_likely_for_its_sampling_scores_low() -> None:
    """The auditor scores with the two-sided score (decision 0013 §5): a greedy reply to a T = 0.7
    challenge (every token the argmax, each far above what sampling would give) is not a 1.0."""
    from overlay.wire.messages import SamplingParams
    from verifier.audit.challenges import ChallengeGenerator
    from verifier.audit.loop import score_tokens

    class GreedyReplyEngine(FakeEngine):
        async def score(self, prompt: list[int], ids: list[int], params: Any) -> list[TokenScore]:
            # the token's log-probability -0.1 against -1.0 expected, variance 0.5 a position
            return [TokenScore(t, -0.1, -1.0, t, 0.5) for t in ids]

    opening = ChallengeGenerator().opening(MODEL)
    sampled = dataclasses.replace(opening, params=SamplingParams(0.7, 1.0, 0, 64, None))
    score, _, z = trio.run(score_tokens, cast(Engine, GreedyReplyEngine()), sampled, list(range(40)))
    assert score < 500_000 and z > 3  # the z the report pools (decision 0023)
    honest, _, _ = trio.run(score_tokens, cast(Engine, FakeEngine()), sampled, list(range(40)))  # too unlikely: C = 0.5
    assert honest == 500_000


def test_a_short_transcript_is_weighted_by_its_length_and_a_challenge_reply_is_not() -> None:
    """Decision 0021: the same 4-token reply scores 0.5 as a challenge reply (the verifier chose the
    request) and 0.5 ** (4 / FULL_TOKENS) as a user's transcript (the donor chose it)."""
    from overlay.wire.messages import SamplingParams
    from verifier.audit.challenges import ChallengeGenerator
    from verifier.audit.loop import score_tokens
    from verifier.audit.scoring import FULL_TOKENS

    opening = dataclasses.replace(ChallengeGenerator().opening(MODEL), params=SamplingParams(1.0, 1.0, 0, 4, None))
    as_challenge, _, _ = trio.run(score_tokens, cast(Engine, FakeEngine()), opening, [1, 2, 3, 4])
    as_transcript, _, _ = trio.run(functools.partial(score_tokens, transcript=True), cast(Engine, FakeEngine()),
                                opening, [1, 2, 3, 4])
    assert as_challenge == 500_000
    assert as_transcript == round(0.5 ** (4 / FULL_TOKENS) * 1_000_000)
    long_reply = list(range(FULL_TOKENS))
    assert trio.run(functools.partial(score_tokens, transcript=True), cast(Engine, FakeEngine()), opening,
                    long_reply) == trio.run(score_tokens, cast(Engine, FakeEngine()), opening, long_reply)


def test_sends_fall_anywhere_in_the_send_window_and_the_report_waits_for_late_replies() -> None:
    """Sends are not bunched (a schedule that left part of the window empty would tell a node when
    challenges cannot come); a challenge still out is waited for until 2 blocks before the end (a
    devnet on 2 cores had 256-token replies arriving 10 blocks into the report window)."""
    assert last_send(COMMIT_UNTIL, REPORT_FROM) == REPORT_FROM - 1 and last_send(10, 12) == 11
    assert grace_height(REPORT_FROM, END) == END - 2 and grace_height(10, 11) == 10
    a = auditor(1)
    a.plan(view(), START)
    assert a.current is not None
    assert all(COMMIT_UNTIL < e.send_at < REPORT_FROM for e in a.current.entries)


def test_the_report_caps_a_nodes_replies_by_their_pooled_z_and_no_other_nodes() -> None:
    """Decision 0023: each reply of NODES[0] is within Z_HIGH (z ±2.8) but together they are spread
    too wide: every one of its scores is capped in the report. NODES[1]'s honest-like z are not,
    and neither is NODES[2]'s reply when its other challenge got no answer."""
    from verifier.audit.reputation import to_fixed
    from verifier.audit.scoring import pooled_cap

    a = auditor(0)
    a.plan(view(), START)
    zs: dict[bytes, list[float | None]] = {NODES[0]: [2.8, -2.8], NODES[1]: [0.6, -1.1], NODES[2]: [2.9, None]}
    for h in range(START, REPORT_FROM):
        for act in a.plan(committed(), h):
            assert isinstance(act, Send)
            z = zs[act.node_id].pop(0)
            if z is None:
                a.result(act, Failure("busy", "busy"), None, h)
                zs[act.node_id].append(None)
            else:
                a.result(act, reply(act.node_id, act.index), 900_000, h, z)
    report = at.decode_audit_tx(submission(a.plan(committed(), REPORT_FROM)).raw, CHAIN)
    assert isinstance(report, at.AuditReport)
    scores: dict[bytes, list[int]] = {}
    for e in report.entries:
        if isinstance(e.outcome, at.ReplyOutcome):
            scores.setdefault(e.node_id, []).append(e.outcome.score)
    cap = to_fixed(pooled_cap([2.8, -2.8]))
    assert cap < 800_000
    assert scores == {NODES[0]: [cap, cap], NODES[1]: [900_000, 900_000], NODES[2]: [900_000]}


def test_a_plan_saved_before_replies_kept_their_z_is_taken_back() -> None:
    """A plan file of format 2 (no z, one turn per entry) restores, its replies unpooled; one of
    format 3 (no personas) restores with every challenge as persona 0; one of format 4 (no
    suspects) with none."""
    a = auditor(3)
    a.plan(view(), START)
    run_sends(a, committed(3), range(START, REPORT_FROM), lambda s, h: reply(s.node_id, s.index))
    version, chain_id, pk, body, suspected = msgpack.unpackb(a.snapshot(), raw=False)
    assert version == 5 and suspected == []
    rows = body[-1]
    body[-1] = [row[:-3] for row in rows]  # as format 2 wrote them
    old: bytes = msgpack.packb([2, chain_id, pk, body], use_bin_type=True)
    b = auditor(3)
    assert b.restore(old) and b.current is not None
    assert all(e.zs == [] and e.replies == [] and e.persona == 0 for e in b.current.entries)
    report = at.decode_audit_tx(submission(b.plan(committed(3), REPORT_FROM)).raw, CHAIN)
    assert isinstance(report, at.AuditReport)
    assert all(isinstance(e.outcome, at.ReplyOutcome) and e.outcome.score == 900_000 for e in report.entries)
    body[-1] = [[*row[:-3], [float("nan")], []] for row in rows]
    assert not auditor(3).restore(msgpack.packb([3, chain_id, pk, body], use_bin_type=True))
    # format 3 (no persona) restores as persona 0; a persona out of range does not
    body[-1] = [row[:-1] for row in rows]
    c = auditor(3)
    assert c.restore(msgpack.packb([3, chain_id, pk, body], use_bin_type=True)) and c.current is not None
    assert [e.zs for e in c.current.entries] == [e.zs for e in a.current.entries]  # type: ignore[union-attr]
    assert all(e.persona == 0 for e in c.current.entries)
    body[-1] = [[*row[:-1], PERSONAS] for row in rows]
    assert not auditor(3).restore(msgpack.packb([4, chain_id, pk, body], use_bin_type=True))


QUICK_THINK = (2, 1.0)  # a script's turns 2 + Exp(1) blocks apart: all of them fit in the window


def _script_pool() -> pl.DonationPool:
    pool = pl.DonationPool()
    conversation = (ChatMessage("system", "Be brief."), ChatMessage("user", "Hi"), ChatMessage("assistant", "Hello!"),
                    ChatMessage("user", "Tell me a joke."), ChatMessage("assistant", "Why did..."),
                    ChatMessage("user", "Another one?"))
    pool.add(pl.Donation(b"\x44" * 20, MODEL, conversation, SamplingParams(0.7, 1.0, 0, 64, None)))
    return pool


def test_a_donated_conversation_is_replayed_turn_by_turn_after_the_nodes_own_replies() -> None:
    """Decision 0025: each turn goes out a think time after the node's reply to the one before,
    with the node's replies (not the donor's) in place; a busy turn is tried again; the report
    holds the earlier turns' replies and the last turn's outcome, each score capped as one set."""
    a = auditor(0, pool=_script_pool(), think=QUICK_THINK)
    a.plan(view(), START)
    p = a.current
    assert p is not None
    (idx,) = [i for i, e in enumerate(p.entries) if e.opening.turns() == 3]
    p.entries[idx].send_at = COMMIT_UNTIL + 1
    sent: list[Send] = []
    busy_once = [True]
    for h in range(START, REPORT_FROM):
        for act in a.plan(committed(), h):
            assert isinstance(act, Send)
            if act.index != idx:
                a.result(act, reply(act.node_id, act.index), 900_000, h)
                continue
            sent.append(act)
            if act.turn == 1 and busy_once[0]:
                busy_once[0] = False
                a.result(act, Failure("busy", "busy"), None, h)
                continue
            a.result(act, Reply(((f"My reply {act.turn}.", (5, 6)), ("", (2,))), b"\x03" * 64, 1, act.node_id),
                     800_000 + act.turn, h)
    assert [(s.turn, s.attempt) for s in sent] == [(0, 1), (1, 1), (1, 2), (2, 1)]
    assert sent[-1].history == ("My reply 0.", "My reply 1.")
    assert sent[-1].messages() == (
        ChatMessage("system", "Be brief."), ChatMessage("user", "Hi"), ChatMessage("assistant", "My reply 0."),
        ChatMessage("user", "Tell me a joke."), ChatMessage("assistant", "My reply 1."),
        ChatMessage("user", "Another one?"))
    report = at.decode_audit_tx(submission(a.plan(committed(), REPORT_FROM)).raw, CHAIN)
    assert isinstance(report, at.AuditReport)
    e = report.entries[idx]
    assert [r.score for r in e.earlier] == [800_000, 800_001] and isinstance(e.outcome, at.ReplyOutcome)
    assert e.outcome.score == 800_002 and e.outcome.tries == 1 and e.earlier[1].tries == 2


def test_a_script_whose_next_turn_does_not_fit_the_window_ends_at_the_last_reply() -> None:
    a = auditor(0, pool=_script_pool(), think=(REPORT_FROM, 1.0))  # no next turn fits
    a.plan(view(), START)
    sends = run_sends(a, committed(), range(START, REPORT_FROM), lambda s, h: reply(s.node_id, s.index))
    assert {s.turn for s in sends} == {0}
    report = at.decode_audit_tx(submission(a.plan(committed(), REPORT_FROM)).raw, CHAIN)
    assert isinstance(report, at.AuditReport)
    scripted = [e for e in report.entries if e.opening.turns() == 3]
    assert len(scripted) == 1 and scripted[0].earlier == () and isinstance(scripted[0].outcome, at.ReplyOutcome)


def _script_started() -> tuple[Auditor, int, Send]:
    """An auditor whose plan holds one donated 3-turn script, due at the first send height, with
    short think times: the auditor, the script's entry, and its first send."""
    a = auditor(0, pool=_script_pool(), think=QUICK_THINK)
    a.plan(view(), START)
    assert a.current is not None
    (idx,) = [i for i, e in enumerate(a.current.entries) if e.opening.turns() == 3]
    a.current.entries[idx].send_at = COMMIT_UNTIL + 1
    (first,) = [s for s in a.plan(committed(), COMMIT_UNTIL + 1) if isinstance(s, Send) and s.index == idx]
    return a, idx, first


def test_an_auditor_restarted_mid_script_goes_on_with_the_next_turn() -> None:
    a, idx, first = _script_started()
    a.result(first, reply(first.node_id, 7), 900_000, COMMIT_UNTIL + 1, 1.5)
    b = auditor(0)
    assert b.restore(a.snapshot()) and b.current is not None
    e = b.current.entries[idx]
    assert len(e.replies) == 1 and e.zs == [1.5] and e.outcome is None
    nxt = [s for h in range(COMMIT_UNTIL + 2, REPORT_FROM) for s in b.plan(committed(), h)
           if isinstance(s, Send) and s.index == idx]
    assert nxt and nxt[0].turn == 1 and nxt[0].history == ("answer 7",)


async def test_the_driver_sends_a_scripts_turns_over_its_personas_held_paths(
        tmp_path: Path) -> None:
    """Decision 0025: every turn of a donated script goes over one held path set, with the node's
    replies in place; decision 0026: that set is its persona's, which the persona's one-turn
    challenges go over too, and it is closed before the report."""
    chain = FakeChain(view(), START)
    client = FakeClient({n: [("sure", (5, 6)), ("", (2,))] for n in NODES})
    a = auditor(0, pool=_script_pool(), think=QUICK_THINK)
    driver = AuditDriver(a, "127.0.0.1:1", client=client, engine=FakeEngine(), rpc=chain.rpc,  # type: ignore[arg-type]
                         data_dir=tmp_path)
    async with trio.open_nursery() as nursery:
        await driver.step(nursery)
    assert a.current is not None
    (idx,) = [i for i, e in enumerate(a.current.entries) if e.opening.turns() == 3]
    a.current.entries[idx].send_at = COMMIT_UNTIL + 1
    chain.view = committed(0)
    for h in range(START + 1, REPORT_FROM + 1):
        chain.height = h
        async with trio.open_nursery() as nursery:
            await driver.step(nursery)
    persona = a.current.entries[idx].persona
    scripted = [(msgs, held) for msgs, held in client.sent if msgs[0].content == "Be brief."]
    assert len(scripted) == 3 and len({id(held) for _, held in scripted}) == 1
    assert [m.content for m in scripted[2][0] if m.role == "assistant"] == ["sure", "sure"]
    same = [e for e in a.current.entries if e.persona == persona]
    assert sum(held is scripted[0][1] for _, held in client.sent) == 3 + len(same) - 1  # the persona's others too
    assert all(held is not None for _, held in client.sent) and client.released == client.held
    report = at.decode_audit_tx(chain.sent[-1], CHAIN)
    assert isinstance(report, at.AuditReport) and len(report.entries[idx].earlier) == 2


def test_a_script_whose_next_turn_never_went_out_ends_at_its_last_reply() -> None:
    """A verifier down when a script's next turn was due reports the script as ending at the
    reply it got, not as a turn the node failed."""
    a, idx, first = _script_started()
    a.result(first, reply(first.node_id, 7), 900_000, COMMIT_UNTIL + 1)
    # down until the report window: nothing else sent
    report = at.decode_audit_tx(submission(a.plan(committed(), END - 2)).raw, CHAIN)
    assert isinstance(report, at.AuditReport)
    e = report.entries[idx]
    assert e.earlier == () and isinstance(e.outcome, at.ReplyOutcome) and e.outcome.chunks[0][0] == "answer 7"


def test_a_report_too_large_for_one_transaction_sheds_a_scripts_later_turns_then_a_reply(
        caplog: pytest.LogCaptureFixture) -> None:
    """Eight replies of 192 KB (a 3-turn script and five one-turn challenges) are 1.5 MB, over the
    1 MiB a transaction may hold. The report first ends the script at its first turn (the chain
    takes a script that ended early), then reports one reply as the verifier's own failure; it
    then fits and decodes. Without the cut the chain refuses the whole report."""
    a = auditor(0, pool=_script_pool(), think=QUICK_THINK)
    a.plan(view(), START)

    def huge(s: Send, h: int) -> Reply:
        return Reply(tuple((("x" * 16_000), (5,)) for _ in range(12)), b"\x03" * 64, 1_700_000_000_000, s.node_id)

    sends = run_sends(a, committed(), range(START, REPORT_FROM), huge)
    assert len(sends) == 8
    with caplog.at_level(logging.ERROR, "gentorrent.audit"):
        raw = submission(a.plan(committed(), REPORT_FROM)).raw
    assert len(raw) <= at.MAX_REPORT_BYTES + len(at.AUDIT_TAG)
    report = at.decode_audit_tx(raw, CHAIN)
    assert isinstance(report, at.AuditReport)
    assert [len(e.earlier) for e in report.entries] == [0] * 6
    assert sum(isinstance(e.outcome, at.FailOutcome) for e in report.entries) == 1
    assert "2 scripts' later turns left out, 1 replies reported as 'other'" in caplog.text



def test_a_node_that_pads_its_replies_is_not_the_first_left_unscored_when_a_report_overflows() -> None:
    """Attack: donors' prompts ask for long replies until a report overflows even at one turn an
    entry, and a cheater pads its replies (longer text a token) so that they are the largest, which
    the report used to give up first, as the verifier's own failures: left unscored. The replies
    given up are now drawn from the report's salt, which the node does not know."""
    opening = at.Opening(b"\x01" * 16, MODEL, (ChatMessage("user", "Write a long story."),),
                         SamplingParams(1.0, 1.0, 0, 1024, None))

    def entry(n: int, size: int) -> at.ReportEntry:
        node = n.to_bytes(20, "big")
        chunks = tuple(("x" * (size // 100), (7,)) for _ in range(100))
        return at.ReportEntry(node, opening, at.ReplyOutcome(node, chunks, b"\x03" * 64, 1, 500_000))

    entries = (*(entry(n, 9_000) for n in range(1, 120)), entry(200, 9_500))  # 1.08 MB: over by a few replies
    report = at.AuditReport(1, PKS[0], b"\x09" * 16, entries)
    kept, cut, dropped = fit_report(report)
    assert cut == 0 and 1 <= dropped < 20
    assert isinstance(kept[-1].outcome, at.ReplyOutcome)  # the padder is scored (it was the first given up)
    assert sum(isinstance(e.outcome, at.FailOutcome) for e in kept) == dropped


def test_a_report_that_fits_is_left_whole() -> None:
    a = auditor(0, pool=_script_pool(), think=QUICK_THINK)
    a.plan(view(), START)
    run_sends(a, committed(), range(START, REPORT_FROM), lambda s, h: reply(s.node_id, s.index))
    report = at.decode_audit_tx(submission(a.plan(committed(), REPORT_FROM)).raw, CHAIN)
    assert isinstance(report, at.AuditReport) and fit_report(report) == (report.entries, 0, 0)
    assert sorted(len(e.earlier) for e in report.entries) == [0] * 5 + [2]


class EndingEngine(FakeEngine):
    """A :class:`FakeEngine` that knows its end token (9) and scores it as very unlikely after
    anything; every other token at C = 0.5 as FakeEngine does. ``scored`` keeps what it scored."""

    context_window = 16

    def __init__(self) -> None:
        self.scored: list[list[int]] = []

    def end_token(self) -> int | None:
        return 9

    def is_end(self, token_id: int) -> bool:
        return token_id in (8, 9)

    async def score(self, prompt: list[int], ids: list[int], params: Any) -> list[TokenScore]:
        self.scored.append(list(ids))
        return [TokenScore(t, -12.0 if t == 9 else -1.0 - 0.6931471805599453, -1.0, t) for t in ids]


@pytest.mark.parametrize(("ids", "max_tokens", "scored"), [
    ([5, 6], 64, [5, 6, 9]),  # stopped early without an end token: its end is scored
    ([5, 6, 8], 64, [5, 6, 8]),  # ended with an end token of its own: as it came
    ([5, 6], 2, [5, 6]),  # ran to max_tokens: as it came
    ([5] * 13, 64, [5] * 13),  # prompt 3 + 13 + the end token would not fit the 16-token window
    ([5] * 12, 64, [5] * 12 + [9]),  # ... and just fits
])
async def test_a_reply_that_stops_short_without_its_end_token_is_scored_with_it(
        ids: list[int], max_tokens: int, scored: list[int]) -> None:
    """Decision 0026: a node that stops a reply early saves work; the verifier scores the end of
    turn the reply claims, at the model's own probability of ending there."""
    from verifier.audit.loop import score_tokens

    engine = EndingEngine()
    opening = at.Opening(bytes(16), MODEL, (ChatMessage("user", "q"),), SamplingParams(0.7, 1.0, 0, max_tokens, None))
    score, _, _ = await score_tokens(engine, opening, ids)  # type: ignore[arg-type]
    assert engine.scored == [scored]
    honest, _, _ = await score_tokens(FakeEngine(), opening, ids)  # type: ignore[arg-type]
    assert (score < honest) == (scored != ids)  # an engine that cannot say scores as it came


async def test_a_personas_paths_are_closed_once_a_later_epoch_begins_even_with_no_report(tmp_path: Path) -> None:
    """A verifier that never reported an epoch (it was down in the report window) still closes
    that epoch's persona paths at its first poll of the next epoch: none carries anything again."""
    chain = FakeChain(view(), START)
    client = FakeClient({n: [("x", (1,))] for n in NODES})
    a = auditor(0)
    driver = AuditDriver(a, "127.0.0.1:1", client=client, engine=FakeEngine(), rpc=chain.rpc,  # type: ignore[arg-type]
                         data_dir=tmp_path)
    async with trio.open_nursery() as nursery:
        await driver.step(nursery)
    chain.view = committed(0)
    for h in range(START + 1, REPORT_FROM):  # the send window only: no report
        chain.height = h
        async with trio.open_nursery() as nursery:
            await driver.step(nursery)
    assert client.held and not client.released
    chain.view = view(epoch=2, start_height=END + 1, commit_until=END + 3, report_from=END + 51, end_height=END + 60)
    chain.height = END + 1
    async with trio.open_nursery() as nursery:
        await driver.step(nursery)
    assert client.released == client.held


# --------------------------------------------------------------------------- the operator's private prompts


def _corpus(*texts: str) -> ChallengeCorpus:
    return ChallengeCorpus([(ChatMessage("user", t),) for t in texts], "private.jsonl")


def _contents(a: Auditor) -> list[str]:
    assert a.current is not None
    return [e.opening.messages[-1].content for e in a.current.entries]


def test_private_prompts_come_after_donated_ones_and_before_the_generator(caplog: pytest.LogCaptureFixture) -> None:
    """The first node read the one donated prompt (decision 0029), so it goes to another node; the
    three private prompts come next, and the generator's last, logged with the advice, once. Too few
    to go round twice, they go round once (decision 0031): every node gets one a node cannot
    recognise before any gets a second."""
    first = min(NODES)
    own = SamplingParams(0.2, 0.9, 0, 100, 3)
    pool = pl.DonationPool()
    pool.add(pl.Donation(b"\x44" * 20, MODEL, (ChatMessage("user", "donated"),), own, (first,)))
    private = {"private 1", "private 2", "private 3"}
    corpus = _corpus(*sorted(private))
    a = auditor(0, pool=pool, corpus=corpus)
    with caplog.at_level(logging.INFO, "gentorrent.audit"):
        a.plan(view(), START)
    assert a.current is not None
    got: dict[bytes, list[str]] = {}
    for e in a.current.entries:
        got.setdefault(e.node_id, []).append(e.opening.messages[-1].content)
    assert sorted(got) == sorted(NODES) and all(len(texts) == 2 for texts in got.values())
    (donated,) = [e for e in a.current.entries if e.opening.messages[-1].content == "donated"]
    assert donated.node_id != first and donated.opening.params == own
    assert sorted(t for texts in got.values() for t in texts if t.startswith("private")) == sorted(private)
    for texts in got.values():  # one it cannot recognise each, then the generator's
        assert sum(t in private | {"donated"} for t in texts) >= 1
    assert corpus.left() == 0 and len(pool) == 0
    assert "(1 donated, 3 private, 2 generated)" in caplog.text
    assert caplog.text.count(GENERATOR_WARNING) == 1 and "--challenge-prompts" in GENERATOR_WARNING
    assert caplog.text.count("the 3 private prompts of private.jsonl are all used; add more to private.jsonl") == 1


def test_scarce_donated_prompts_go_round_the_nodes_in_a_secret_order() -> None:
    """A cheater that has read the planner grinds its key for the highest node id: were the openings
    drawn node by node in id order, a pool short of prompts would leave it the generator's alone,
    which it recognises (decision 0031). Each node gets one donated prompt before any gets a second,
    and which nodes get the last ones changes with the plan's secret draws."""
    own = SamplingParams(0.7, 1.0, 0, 256, None)
    last = max(NODES)
    donated_to_last = 0
    for epoch in range(1, 41):
        pool = pl.DonationPool()
        for i in range(4):  # 4 prompts for 3 nodes x 2 challenges
            pool.add(pl.Donation(bytes([0x40 + i]) * 20, MODEL, (ChatMessage("user", f"donated {epoch} {i}"),), own))
        a = auditor(0, pool=pool, rng=random.Random(epoch))
        a.plan(view(), START)
        assert a.current is not None
        per_node = {n: sum(e.opening.messages[-1].content.startswith("donated") for e in a.current.entries
                           if e.node_id == n) for n in NODES}
        assert sorted(per_node.values()) == [1, 1, 2]  # one each, then the fourth to one of them
        donated_to_last += per_node[last] == 2
    assert 0 < donated_to_last < 40  # the second round's order is secret, not by node id


class UsedFileChain(FakeChain):
    """A :class:`FakeChain` that notes the used private prompts file at each broadcast."""

    def __init__(self, v: AuditView, height: int, data: Path) -> None:
        super().__init__(v, height)
        self.data = data
        self.used_at_broadcast: list[bytes | None] = []

    async def rpc(self, address: str, method: str, params: dict[str, str]) -> Any:
        if method == "broadcast_tx_sync":
            path = self.data / USED_FILE
            self.used_at_broadcast.append(path.read_bytes() if path.exists() else None)
        return await super().rpc(address, method, params)


async def test_a_private_prompt_is_never_sent_twice_across_plans_and_restarts(tmp_path: Path) -> None:
    """The used private prompts are on disk before the plan's commit goes out; a restarted
    verifier (the file and the data dir read again) and later epochs never draw them again."""
    path = tmp_path / "private.jsonl"
    path.write_text("".join(f'{{"messages": [{{"role": "user", "content": "private {i}"}}]}}\n' for i in range(8)))
    data = tmp_path / "data"
    chain = UsedFileChain(view(), START, data)
    a = auditor(0, corpus=load_corpus(path, data))
    driver = AuditDriver(a, "127.0.0.1:1", client=FakeClient({}), engine=FakeEngine(), rpc=chain.rpc,  # type: ignore[arg-type]
                         data_dir=data)
    async with trio.open_nursery() as nursery:
        await driver.step(nursery)
    (used,) = chain.used_at_broadcast  # the commit's broadcast
    assert used is not None
    on_disk = read_corpus(path)
    on_disk.take_used(used)
    sent = set(_contents(a))
    assert len(sent) == 6 and on_disk.left() == 2  # the plan's six, written before the commit
    restarted = auditor(0, corpus=load_corpus(path, data))
    restarted.plan(view(epoch=2, start_height=END + 1, commit_until=END + 3, report_from=END + 51,
                        end_height=END + 60), END + 1)
    later = [t for t in _contents(restarted) if t.startswith("private ")]
    assert len(later) == 2 and not sent & set(later)
    restarted.plan(view(epoch=3, start_height=END + 61, commit_until=END + 63, report_from=END + 111,
                        end_height=END + 120), END + 61)
    assert not any(t.startswith("private ") for t in _contents(restarted))


def test_the_used_private_prompts_are_written_before_the_plan(tmp_path: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """A verifier that crashes between the two writes must not come back with a plan holding private
    prompts its used file does not name: that file goes first (here the plan's write fails)."""
    a = auditor(0, corpus=_corpus(*(f"private {i}" for i in range(8))))
    a.plan(view(), START)
    (tmp_path / PLAN_FILE).mkdir()  # the plan cannot be written over a directory
    driver = AuditDriver(a, "127.0.0.1:1", client=FakeClient({}), engine=FakeEngine(),  # type: ignore[arg-type]
                         data_dir=tmp_path)
    with caplog.at_level(logging.ERROR, "gentorrent.audit"):
        driver.persist()
    assert "cannot write the audit plan" in caplog.text
    on_disk = _corpus(*(f"private {i}" for i in range(8)))
    on_disk.take_used((tmp_path / USED_FILE).read_bytes())
    assert on_disk.left() == 2


async def test_no_plan_is_committed_while_its_private_prompts_cannot_be_marked_used(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A verifier that cannot write its used private prompts must not send them: restarted, it
    would draw them again, and a prompt sent twice is one the node (and the chain's reveal) has
    seen. The plan's commit waits, offered again each poll, until the file is written."""
    a = auditor(0, corpus=_corpus(*(f"private {i}" for i in range(8))))
    data = tmp_path / "data"
    data.mkdir()
    (data / USED_FILE).mkdir()  # the file cannot be written over a directory
    chain = FakeChain(view(), START)
    driver = AuditDriver(a, "127.0.0.1:1", client=FakeClient({}), engine=FakeEngine(), rpc=chain.rpc,  # type: ignore[arg-type]
                         data_dir=data)
    with caplog.at_level(logging.ERROR, "gentorrent.audit"):
        for h in (START, START + 1):
            chain.height = h
            async with trio.open_nursery() as nursery:
                await driver.step(nursery)
    assert chain.sent == [] and "the plan is not committed until it can be" in caplog.text
    (data / USED_FILE).rmdir()
    async with trio.open_nursery() as nursery:
        await driver.step(nursery)
    (commit,) = [at.decode_audit_tx(raw, CHAIN) for raw in chain.sent]
    assert isinstance(commit, at.PlanCommit) and a.current is not None and commit.plan_hash == a.current.hash()
    on_disk = _corpus(*(f"private {i}" for i in range(8)))
    on_disk.take_used((data / USED_FILE).read_bytes())
    assert on_disk.left() == 2  # the plan's six


def test_a_private_prompt_over_the_room_left_is_kept_for_a_later_plan() -> None:
    corpus = _corpus("x" * 4000)
    a = auditor(0, corpus=corpus)
    _, source = a._opening(MODEL, NODES[0], 1000)
    assert source == "generator" and corpus.left() == 1
    o, source = a._opening(MODEL, NODES[0], 10_000)
    assert source == "corpus" and o.messages[-1].content == "x" * 4000 and corpus.left() == 0


def test_no_prompt_comes_twice_from_donations_private_prompts_and_the_generator() -> None:
    """A report carrying one prompt twice is refused by the chain, and a prompt revealed once voids
    a challenge: each source's prompt keys are marked used in the others."""
    pool = pl.DonationPool()
    pool.add(pl.Donation(b"\x44" * 20, MODEL, (ChatMessage("user", "Explain tides."),),
                         SamplingParams(0.7, 1.0, 0, 256, None)))
    corpus = _corpus("explain  TIDES.")
    a = auditor(0, pool=pool, corpus=corpus)
    a.plan(view(nodes=((MODEL, (NODES[0],)),)), START)
    assert _contents(a)[0] == "Explain tides." and corpus.left() == 0
    assert _contents(a)[1] != "explain  TIDES."  # the generator's
    # the generator never hands out a private prompt (a space of one prompt, "Q x")
    one = (("",), ("",), ("Q {}",), ("x",), ("",), ("",), ("",))
    b = auditor(1, generator=ChallengeGenerator(rng=random.Random(1), parts=one), corpus=_corpus("q  X"))
    assert b._opening(MODEL, NODES[0], OPENING_ROOM)[1] == "corpus"
    with pytest.raises(ChallengeError):
        b._opening(MODEL, NODES[0], OPENING_ROOM)
    # nor is a private prompt drawn once the generator handed out one of its turns
    shared = ChallengeCorpus([(ChatMessage("user", "q x"), ChatMessage("user", "y" * 4000))], "private.jsonl")
    c = auditor(2, generator=ChallengeGenerator(rng=random.Random(1), parts=one), corpus=shared)
    assert c._opening(MODEL, NODES[0], 1000)[1] == "generator"  # the private one is over the room: kept
    assert shared.left() == 0


def test_a_restored_plan_marks_its_private_prompts_used() -> None:
    texts = [f"private {i}" for i in range(7)]
    a = auditor(0, corpus=_corpus(*texts))
    a.plan(view(), START)
    fresh = _corpus(*texts)  # as if the used file were lost
    b = auditor(0, corpus=fresh)
    assert b.restore(a.snapshot()) and fresh.left() == 1 and fresh.dirty


async def test_the_audit_loop_takes_the_used_private_prompts_before_the_model(
        tmp_path: Path, autojump_clock: Any, caplog: pytest.LogCaptureFixture) -> None:
    """The corpus the command line read gets the used set kept in the data dir before the model
    loads (here it never does: the model file is missing)."""
    from verifier.audit.corpus import save_used
    from verifier.audit.loop import AuditSettings, run_audits

    texts = [f"private {i}" for i in range(3)]
    used = _corpus(*texts)
    assert used.draw(MODEL, random.Random(0)) is not None  # one used before the restart
    save_used(used, tmp_path)
    corpus = _corpus(*texts)
    settings = AuditSettings(model=str(tmp_path / "no-such-model.gguf"), corpus=corpus)
    with caplog.at_level(logging.INFO, "gentorrent.audit"), trio.move_on_after(1):
        await run_audits(tmp_path, settings, SEEDS[0])
    assert corpus.left() == 2
    assert caplog.text.count("3 private challenge prompts from private.jsonl, 2 unused") == 1
    assert caplog.text.index("2 unused") < caplog.text.index("no-such-model")


# --------------------------------------------------------------------------- the short-epoch warning


SHORT = "close before model nodes can hand in"


def test_the_block_pace_is_measured_over_enough_blocks_and_starts_again_on_a_lower_height() -> None:
    from verifier.audit.loop import PACE_MIN_BLOCKS, BlockPace

    pace, t = BlockPace(), 0.0
    for h in range(100, 100 + PACE_MIN_BLOCKS):
        for _ in range(3):  # polls faster than blocks
            pace.saw(h, t)
            t += 0.1
        assert pace.block_s is None
    pace.saw(100 + PACE_MIN_BLOCKS, t)
    assert pace.block_s == pytest.approx(0.3)
    pace.saw(50, t + 1)  # another node, behind: what was measured does not mix with it
    assert pace.block_s is None
    for h in range(50, 50 + 2 * PACE_MIN_BLOCKS):  # a clock that did not move: no pace (not zero)
        pace.saw(h, t + 1)
    assert pace.block_s is None


async def test_the_driver_passes_the_pace_it_measured_to_the_planner(caplog: pytest.LogCaptureFixture) -> None:
    from overlay.wire.clock import FakeClock
    from verifier.audit.loop import PACE_MIN_BLOCKS
    from verifier.audit.transcripts import TranscriptBook

    w = 22  # the hand-in needs 48.4 s: the 50 blocks before the report fit at 1 s a block, not at 0.25
    chain, clock = FakeChain(view(reply_window_s=w), START), FakeClock()
    a = auditor(0, transcripts=TranscriptBook())
    driver = AuditDriver(a, "127.0.0.1:1", client=FakeClient({}), engine=FakeEngine(), rpc=chain.rpc,  # type: ignore[arg-type]
                         clock=clock)
    with caplog.at_level(logging.WARNING, logger="gentorrent.audit"):
        for h in range(START, START + PACE_MIN_BLOCKS + 1):
            chain.height = h
            async with trio.open_nursery() as nursery:
                await driver.step(nursery)
            assert (SHORT in caplog.text) is (h == START + PACE_MIN_BLOCKS)
            clock.advance(0.25)
