"""The audit loop end to end without processes: four verifiers' planners (verifier/auditor.py
``Auditor``) against the real committee application core (verifier/app.py, verifier/audit.py),
blocks made in memory, two model nodes that sign their replies, and a stand-in for the scoring
engine (an honest node's replies score 1.0, a degraded node's 0.3). Checks that every transaction
the planner makes is one the chain takes: proofs, commits, reports, attestations; that epochs
apply; that the degraded node falls below the trust line within 5 audited epochs while the honest
node stays trusted; and that a leader that skips a node has its epoch aborted."""

from __future__ import annotations

import json
import random
from dataclasses import replace

from overlay import crypto, signing
from overlay.identity import Identity
from overlay.registration import OP_REGISTER, ROLE_MODEL, Entry, make_tx
from verifier import audit_tx as at
from verifier.app import CommitteeApp, Validator
from verifier.audit import decode_query
from verifier.auditor import (
    Attest,
    Auditor,
    ChallengeResult,
    ConfirmSilence,
    Reply,
    RunChallenges,
    Submit,
    parse_view,
)
from verifier.challenges import ChallengeGenerator
from verifier.reputation import TRUST_LINE

CHAIN = "audit-loop"
MODEL = "smollm2-135m-instruct"
E = 12
SEEDS = [bytes([i + 1]) * 32 for i in range(4)]


class Loop:
    def __init__(self) -> None:
        self.app = CommitteeApp()
        vals = [Validator("ed25519", crypto.SigningKey.from_bytes(s).public_bytes, 10) for s in SEEDS]
        self.app.init_chain(CHAIN, vals, json.dumps({"audit": {"model": MODEL, "epoch_blocks": E,
                                                               "challenges_per_node": 3}}).encode())
        self.auditors = [Auditor(s, CHAIN, MODEL, ChallengeGenerator(rng=random.Random(i)))
                         for i, s in enumerate(SEEDS)]
        self.nodes = {"honest": Identity.generate(), "degraded": Identity.generate()}
        self.score = {self.nodes["honest"].node_id: 1_000_000, self.nodes["degraded"].node_id: 300_000}
        self.height = 0
        self.pending: list[bytes] = [
            make_tx(ident.signing, CHAIN, OP_REGISTER, 1,
                    Entry(ROLE_MODEL, ident.x25519.public_bytes, f"127.0.0.1:{7000 + i}", "default", MODEL, 1))
            for i, ident in enumerate(self.nodes.values())]
        self.refused: list[tuple[str, int, str]] = []

    def query(self, path: str) -> bytes:
        result, value = self.app.query(path, b"")
        assert result.ok, (path, result)
        return value

    def reply(self, node_id: bytes, opening: at.Opening) -> Reply:
        ident = next(i for i in self.nodes.values() if i.node_id == node_id)
        signer = signing.ReplySigner(opening.digest(), opening.model, node_id)
        chunks = ((f"answer {self.height}", (11, 12, 13)), ("", (2,)))
        sig = b""
        for n, (text, ids) in enumerate(chunks):
            _, sig = signer.add(text, ids, n == len(chunks) - 1, 1000 + self.height, ident.signing.sign)
        return Reply(chunks, sig, 1000 + self.height)

    def act(self, auditor: Auditor, action: object) -> None:
        if isinstance(action, Submit):
            self.pending.append(action.raw)
        elif isinstance(action, RunChallenges):
            results = [ChallengeResult(j, self.reply(j.node_id, j.opening), self.score[j.node_id], 400_000)
                       for j in action.jobs if j.opening is not None]
            self.pending.append(auditor.report(action.epoch, results).raw)
        elif isinstance(action, Attest):
            report = at.decode_audit_tx(self.query("/audit/report"), CHAIN)
            assert isinstance(report, at.EpochReport)
            scores = [self.score[e.node_id] - 5_000 for e in report.replies()]  # within the tolerance
            self.pending.append(auditor.attestation(action.epoch, action.report_hash, scores).raw)
        else:
            assert isinstance(action, ConfirmSilence), action
            raise AssertionError("no node is silent here")

    def block(self) -> None:
        self.height += 1
        txs, self.pending = self.pending, []
        results, _ = self.app.finalize_block(self.height, 1_000 + self.height, txs,
                                             crypto.sha256(self.height.to_bytes(8, "big")))
        for raw, r in zip(txs, results, strict=True):
            if not r.ok:
                self.refused.append((raw[:8].hex(), int(r.code), r.log))
        self.app.commit()
        view = parse_view(self.query("/audit"))
        for a in self.auditors:
            for action in a.plan(view, self.height):
                self.act(a, action)
                if isinstance(action, Submit):
                    a.submitted(action.key, retry=False)

    def outcomes(self) -> list[list[object]]:
        return decode_query(self.query("/audit"))["outcomes"]

    def reputation(self, name: str) -> int:
        return self.app.committed.reputation(self.nodes[name].node_id)


def test_the_planners_drive_the_committee_through_audited_epochs() -> None:
    loop = Loop()
    while len([o for o in loop.outcomes() if o[1] == "applied"]) < 5:
        loop.block()
        assert loop.height < 12 * E, (loop.outcomes(), loop.refused)
    # Only attestations that came after the epoch had applied (more than 2/3 had already agreed in
    # the same block) are refused; every other transaction the planners made was taken.
    assert all(r[2].endswith("is already applied") for r in loop.refused), loop.refused
    applied = [o for o in loop.outcomes() if o[1] == "applied"]
    assert [o[0] for o in applied] == list(range(applied[0][0], applied[0][0] + 5))  # no epoch lost
    assert loop.reputation("degraded") < TRUST_LINE <= loop.reputation("honest")


def test_a_leader_that_skips_a_node_has_its_epoch_aborted() -> None:
    loop = Loop()
    for a in loop.auditors:
        a.tamper = lambda report: replace(report, entries=report.entries[1:])
    while not any(o[1] == "aborted" and o[0] >= 1 for o in loop.outcomes()):
        loop.block()
        assert loop.height < 6 * E, loop.outcomes()
    aborted = [o for o in loop.outcomes() if o[0] >= 1][0]
    assert aborted[1] == "aborted" and aborted[2], aborted
    assert loop.reputation("degraded") == loop.reputation("honest") == 500_000  # nothing applied
