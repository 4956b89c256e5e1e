"""The audit planner (verifier/auditor.py ``Auditor``: I/O-free) and its driver against a fake RPC
and a fake engine."""

from __future__ import annotations

import base64
import logging
import random
from dataclasses import replace
from typing import Any

import msgpack
import pytest
import trio

from model_node.engine import TokenScore
from overlay.crypto import SigningKey
from verifier import audit_tx as at
from verifier import vrf
from verifier.auditor import (
    Attest,
    AuditDriver,
    Auditor,
    AuditView,
    AuditViewError,
    ChallengeResult,
    ConfirmSilence,
    Failure,
    Reply,
    RunChallenges,
    Submit,
    parse_view,
)
from verifier.challenges import ChallengeGenerator

CHAIN = "audit-test"
MODEL = "smollm2-135m-instruct"
SEEDS = [bytes([i + 1]) * 32 for i in range(4)]
PKS = [SigningKey.from_bytes(s).public_bytes for s in SEEDS]
NODES = (b"\x0a" * 20, b"\x0b" * 20)


def view(**kw: Any) -> AuditView:
    base = dict(epoch=3, epoch_blocks=20, start_height=61, seed=b"\x55" * 32, proof_until=65, leader=None,
                validators=tuple((pk, 10) for pk in PKS), challenges=(), next_committed=False, report_hash=None,
                agree_power=0, total_power=40, silent=(), outcomes=(), model=MODEL, challenges_per_node=2,
                audit_nodes_next=NODES)
    base.update(kw)
    return AuditView(**base)  # type: ignore[arg-type]


def auditor(i: int = 0, model: str = MODEL) -> Auditor:
    return Auditor(SEEDS[i], CHAIN, model, ChallengeGenerator(rng=random.Random(i)))


def test_a_non_member_or_another_model_does_nothing(caplog: pytest.LogCaptureFixture) -> None:
    outsider = Auditor(b"\x99" * 32, CHAIN, MODEL)
    assert outsider.plan(view(), 62) == []
    with caplog.at_level(logging.ERROR, "gentorrent.audit"):
        assert auditor(model="other-model").plan(view(), 62) == []
    assert "audits model 'smollm2-135m-instruct'" in caplog.text and "--audit-model" in caplog.text


def test_a_vrf_proof_once_per_epoch_in_the_window_and_again_after_a_network_failure() -> None:
    a = auditor(1)
    (sub,) = a.plan(view(), 62)
    assert isinstance(sub, Submit) and sub.key == ("proof", 3)
    tx = at.decode_audit_tx(sub.raw, CHAIN)
    assert isinstance(tx, at.VrfProof) and tx.epoch == 3 and tx.validator_pk == PKS[1]
    vrf.verify(PKS[1], vrf.leader_alpha(3, b"\x55" * 32), tx.proof)  # raises if it does not verify
    assert a.plan(view(), 63) == []  # once
    a.submitted(sub.key, retry=True)  # never reached the verifier
    assert [s.key for s in a.plan(view(), 64)] == [("proof", 3)]
    a.submitted(sub.key, retry=False)
    assert a.plan(view(), 65) == [] and auditor(2).plan(view(), 66) == []  # window closed
    assert [s.key for s in a.plan(view(epoch=4, start_height=81, proof_until=85), 81)] == [("proof", 4)]


def test_the_leader_commits_the_next_epochs_challenges_sealed_to_every_validator() -> None:
    a = auditor(0)
    acts = a.plan(view(leader=PKS[0]), 70)
    (sub,) = acts
    assert isinstance(sub, Submit) and sub.key == ("commit", 3)
    tx = at.decode_audit_tx(sub.raw, CHAIN)
    assert isinstance(tx, at.ChallengeCommit) and tx.epoch == 4 and tx.leader_pk == PKS[0]
    assert [c.node_id for c in tx.challenges] == [NODES[0]] * 2 + [NODES[1]] * 2
    assert len({c.commitment for c in tx.challenges}) == 4
    for c in tx.challenges:
        opened = {c.open(i, SEEDS[i]) for i in range(4)}  # every validator opens the same opening
        assert len(opened) == 1 and next(iter(opened)).model == MODEL
    assert a.plan(view(leader=PKS[0]), 71) == []
    assert auditor(1).plan(view(leader=PKS[0]), 70) == []  # not the leader
    assert auditor(0).plan(view(leader=PKS[0], next_committed=True), 70) == []


def _challenges(gen: ChallengeGenerator, bad: int | None = None) -> tuple[tuple[bytes, bytes, tuple[bytes, ...]], ...]:
    cs, _ = gen.challenges(MODEL, NODES, 2, PKS)
    out = [(c.node_id, c.commitment, c.sealed) for c in cs]
    if bad is not None:
        node, commitment, sealed = out[bad]
        out[bad] = (node, commitment, (b"garbage" * 20,) + sealed[1:])
    return tuple(out)


def test_the_leader_opens_the_committed_challenges_and_reports_them_in_order() -> None:
    committed = _challenges(ChallengeGenerator(rng=random.Random(9)), bad=1)
    a = auditor(0)
    acts = a.plan(view(leader=PKS[0], next_committed=True, challenges=committed), 70)
    (run,) = acts
    assert isinstance(run, RunChallenges) and run.epoch == 3
    assert [j.index for j in run.jobs] == [0, 1, 2, 3]
    assert run.jobs[1].opening is None and "did not open" in run.jobs[1].why
    assert all(j.opening is not None and j.opening.commitment() == committed[j.index][1]
               for j in run.jobs if j.index != 1)
    assert a.plan(view(leader=PKS[0], next_committed=True, challenges=committed), 71) == []
    forwarded_to = b"\x42" * 20  # job 3's node forwarded the challenge to a member of its group
    results = [ChallengeResult(run.jobs[3], Reply((("hi", (5, 6)),), b"\x01" * 64, 1234, forwarded_to), 900_000,
                               300_000),
               ChallengeResult(run.jobs[0], Failure("silent", "no reply within 60 s")),
               ChallengeResult(run.jobs[2], Reply((("a", (1,)), ("", (2,))), b"\x02" * 64, 99), 1_000_000, 500_000),
               ChallengeResult(run.jobs[1], Failure("other", run.jobs[1].why))]
    sub = a.report(3, results)
    tx = at.decode_audit_tx(sub.raw, CHAIN)
    assert isinstance(tx, at.EpochReport) and tx.leader_pk == PKS[0] and tx.epoch == 3
    assert [e.index for e in tx.entries] == [0, 1, 2, 3]
    kinds = [type(e).__name__ for e in tx.entries]
    assert kinds == ["SilentEntry", "SilentEntry", "ReplyEntry", "ReplyEntry"]
    assert tx.entries[0].reason == "silent: no reply within 60 s"  # type: ignore[union-attr]
    r2 = tx.entries[2]
    assert isinstance(r2, at.ReplyEntry) and r2.chunks == (("a", (1,)), ("", (2,))) and r2.score == 1_000_000
    assert r2.signed_at_ms == 99 and r2.raw_score == 500_000 and r2.opening == run.jobs[2].opening
    assert r2.served_by == r2.node_id and r2.server == b""
    r3 = tx.entries[3]
    assert isinstance(r3, at.ReplyEntry) and r3.server == forwarded_to and r3.node_id == run.jobs[3].node_id


def test_others_attest_once_and_check_silent_nodes_with_fresh_challenges_of_their_own() -> None:
    v = view(leader=PKS[0], next_committed=True, report_hash=b"\x77" * 32, silent=((NODES[1], 0, 0),))
    a = auditor(2)
    acts = a.plan(v, 75)
    assert [type(x) for x in acts] == [Attest, ConfirmSilence]
    attest, confirm = acts
    assert isinstance(attest, Attest) and attest.report_hash == b"\x77" * 32 and attest.epoch == 3
    assert isinstance(confirm, ConfirmSilence) and confirm.node_id == NODES[1] and confirm.opening.model == MODEL
    assert a.plan(v, 76) == []
    assert auditor(0).plan(v, 75) == []  # the leader's report is its own attestation
    sub = a.attestation(3, b"\x77" * 32, [1, 2])
    tx = at.decode_audit_tx(sub.raw, CHAIN)
    assert isinstance(tx, at.Attestation) and tx.scores == (1, 2) and tx.validator_pk == PKS[2]
    tx2 = at.decode_audit_tx(a.silence(3, NODES[1], False).raw, CHAIN)
    assert isinstance(tx2, at.SilenceConfirm) and tx2.answered is False and tx2.node_id == NODES[1]


def _wire(v: AuditView) -> bytes:
    return msgpack.packb({
        "epoch": v.epoch, "epoch_blocks": v.epoch_blocks, "start_height": v.start_height, "seed": v.seed,
        "proof_until": v.proof_until, "leader": v.leader, "validators": [list(x) for x in v.validators],
        "challenges": [[n, c, list(s)] for n, c, s in v.challenges], "next_committed": v.next_committed,
        "report_hash": v.report_hash, "agree_power": v.agree_power, "total_power": v.total_power,
        "silent": [list(s) for s in v.silent], "outcomes": [list(o) for o in v.outcomes], "model": v.model,
        "challenges_per_node": v.challenges_per_node, "audit_nodes_next": list(v.audit_nodes_next),
    }, use_bin_type=True)


def test_the_view_decodes_strictly() -> None:
    v = view(leader=PKS[1], challenges=_challenges(ChallengeGenerator(rng=random.Random(1))),
             silent=((NODES[0], 10, 0),), outcomes=((2, "applied", "", 60),), report_hash=b"\x01" * 32)
    assert parse_view(_wire(v)) == v
    for bad in (replace(v, epoch=True), replace(v, seed=b"\x00" * 31), replace(v, model=b"x"),  # type: ignore[arg-type]
                replace(v, next_committed=1)):  # type: ignore[arg-type]
        with pytest.raises(AuditViewError):
            parse_view(_wire(bad))
    for raw in (b"\xc1", msgpack.packb([1, 2]), msgpack.packb({"epoch": 1})):
        with pytest.raises(AuditViewError):
            parse_view(raw)


class FakeEngine:
    model = MODEL

    def chat_prompt(self, messages: Any, continuation: str = "") -> list[int]:
        return [1, 2, 3]

    async def score(self, prompt: list[int], ids: list[int], params: Any) -> list[TokenScore]:
        # every token half as likely as the model's own choice: C = 0.5
        return [TokenScore(t, -1.0 - 0.6931471805599453, -1.0, t) for t in ids]


async def test_the_driver_rescoring_a_report_submits_its_own_scores() -> None:
    leader = auditor(0)
    committed = _challenges(ChallengeGenerator(rng=random.Random(4)))
    (run,) = leader.plan(view(leader=PKS[0], next_committed=True, challenges=committed), 70)
    assert isinstance(run, RunChallenges)
    results = [ChallengeResult(j, Reply((("x", (7, 8, 9)),), b"\x03" * 64, 5), 990_000, 400_000) for j in run.jobs]
    report_raw = leader.report(3, results).raw
    v = view(leader=PKS[0], next_committed=True, challenges=committed, report_hash=at.report_hash(report_raw))
    sent: list[bytes] = []

    async def rpc(address: str, method: str, params: dict[str, str]) -> Any:
        if method == "abci_query":
            value = _wire(v) if params["path"] == '"/audit"' else report_raw
            return {"response": {"code": 0, "value": base64.b64encode(value).decode(), "height": "75"}}
        assert method == "broadcast_tx_sync"
        sent.append(bytes.fromhex(params["tx"][2:]))
        return {"code": 0, "log": ""}

    driver = AuditDriver(auditor(3), "127.0.0.1:1", client=None, engine=FakeEngine(), rpc=rpc)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await driver.step(nursery)
    txs = [at.decode_audit_tx(raw, CHAIN) for raw in sent]
    (att,) = [t for t in txs if isinstance(t, at.Attestation)]
    assert att.scores == (500_000,) * 4 and att.report_hash == v.report_hash and att.validator_pk == PKS[3]


def test_the_verifier_command_takes_audit_flags(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from overlay.cli import main

    with pytest.raises(SystemExit):
        main(["verifier", "--help"])
    out = capsys.readouterr().out
    for flag in ("--audit ", "--audit-model", "--audit-listen", "--audit-region", "--audit-threads"):
        assert flag in out
    assert main(["verifier", "--data-dir", str(tmp_path), "--audit-model", MODEL]) == 2
    assert "--audit-model needs --audit" in capsys.readouterr().err
    assert main(["verifier", "--data-dir", str(tmp_path), "--audit", "--audit-threads", "0"]) == 2
    assert "--audit-threads must be at least 1" in capsys.readouterr().err


def test_the_tamper_hook_alters_the_report_before_it_is_signed() -> None:
    committed = _challenges(ChallengeGenerator(rng=random.Random(11)))
    a = auditor(0)
    a.tamper = lambda report: replace(report, entries=report.entries[1:])  # skip a node's first challenge
    (run,) = a.plan(view(leader=PKS[0], next_committed=True, challenges=committed), 70)
    assert isinstance(run, RunChallenges)
    tx = at.decode_audit_tx(a.report(3, [ChallengeResult(j, Failure("silent", "x")) for j in run.jobs]).raw, CHAIN)
    assert isinstance(tx, at.EpochReport) and [e.index for e in tx.entries] == [1, 2, 3]  # signed as altered


def test_what_the_chain_already_holds_is_not_sent_again() -> None:
    assert auditor(1).plan(view(proofs=(PKS[1],)), 62) == []  # its proof is on chain
    v = view(leader=PKS[0], next_committed=True, report_hash=b"\x77" * 32, attested=(PKS[2],),
             silent=((NODES[1], 0, 0),), status="aborted")
    assert auditor(2).plan(v, 75) == []  # attested already; the epoch is settled: no silence checks
    # the leader opens the box sealed to its key in sealed_to's order, not the validators'
    gen = ChallengeGenerator(rng=random.Random(12))
    order = (PKS[3], PKS[2], PKS[1], PKS[0])
    cs, _ = gen.challenges(MODEL, NODES[:1], 1, order)
    committed = tuple((c.node_id, c.commitment, c.sealed) for c in cs)
    (run,) = auditor(0).plan(view(leader=PKS[0], leader_known=True, next_committed=True, challenges=committed,
                                  proofs=(PKS[0],),
                                  sealed_to=order), 64)
    assert isinstance(run, RunChallenges) and run.jobs[0].opening is not None
    assert auditor(0).plan(view(leader=PKS[0], leader_known=False, next_committed=True, challenges=committed,
                                proofs=(PKS[0],)), 66) == []  # the window is still open on chain


class FakeClient:
    """Stands in for the anonymous client: ``answers[node]`` is the list of (text, ids) chunks a node
    sends, or an exception; another node's id in ``signer`` makes the reply come signed by it."""

    def __init__(self, answers: dict[bytes, Any], signer: dict[bytes, bytes] | None = None) -> None:
        self.answers, self.signer, self.calls = answers, signer or {}, []

    async def request(self, model: str, messages: Any, params: Any = None, *, node: bytes | None = None,
                      timeout: float = 60.0, failover: bool = True) -> Any:
        from overlay.messages import ReplyChunk

        self.calls.append((node, failover))
        got = self.answers[node]
        if isinstance(got, Exception):
            raise got
        assert node is not None
        for i, (text, ids) in enumerate(got):
            yield ReplyChunk(request_id=bytes(16), seq=i, text=text, token_ids=tuple(ids), done=i == len(got) - 1,
                             error="", node=self.signer.get(node, node), chain=b"c" * 32, signature=b"s" * 64,
                             signed_at_ms=77)


async def _drive(driver: AuditDriver, action: Any, v: AuditView) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(driver._run_action, action, v)


async def test_the_driver_leads_an_epoch_and_checks_silence_with_one_node_only() -> None:
    from overlay.anon import AllBusy

    committed = _challenges(ChallengeGenerator(rng=random.Random(21)))
    v = view(leader=PKS[0], next_committed=True, challenges=committed, proofs=(PKS[0],))
    sent: list[bytes] = []

    async def rpc(address: str, method: str, params: dict[str, str]) -> Any:
        sent.append(bytes.fromhex(params["tx"][2:]))
        return {"code": 0, "log": ""}

    client = FakeClient({NODES[0]: [("hello", (5, 6)), ("", (2,))], NODES[1]: AllBusy("busy: full")})
    leader = auditor(0)
    (run,) = leader.plan(v, 70)
    driver = AuditDriver(leader, "127.0.0.1:1", client=client, engine=FakeEngine(), rpc=rpc)  # type: ignore[arg-type]
    await _drive(driver, run, v)
    assert sorted(client.calls) == [(NODES[0], False)] * 2 + [(NODES[1], False)] * 2  # each to its node only
    (report,) = [at.decode_audit_tx(raw, CHAIN) for raw in sent]
    assert isinstance(report, at.EpochReport) and [type(e).__name__ for e in report.entries] == \
        ["ReplyEntry", "ReplyEntry", "SilentEntry", "SilentEntry"]
    first = report.entries[0]
    assert isinstance(first, at.ReplyEntry) and first.chunks == (("hello", (5, 6)), ("", (2,)))
    assert first.score == 500_000 and first.signature == b"s" * 64 and first.signed_at_ms == 77
    assert report.entries[2].reason.startswith("busy: ")  # type: ignore[union-attr]
    # a silence check: a reply signed by another node (the challenged node forwarded it to a member
    # of its group) is an answer
    sent.clear()
    other = FakeClient({NODES[1]: [("x", (1,))]}, signer={NODES[1]: NODES[0]})
    checker = auditor(2)
    sv = view(leader=PKS[0], report_hash=b"\x01" * 32, silent=((NODES[1], 0, 0),), attested=(PKS[2],))
    (confirm,) = checker.plan(sv, 80)
    assert isinstance(confirm, ConfirmSilence)
    await _drive(AuditDriver(checker, "x:1", client=other, engine=FakeEngine(), rpc=rpc), confirm, sv)  # type: ignore[arg-type]
    (tx,) = [at.decode_audit_tx(raw, CHAIN) for raw in sent]
    assert isinstance(tx, at.SilenceConfirm) and tx.answered is True and tx.node_id == NODES[1]
