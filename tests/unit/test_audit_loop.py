"""The audit loop end to end without processes (decision 0013): four verifiers' planners
(verifier/audit/auditor.py ``Auditor``) against the real committee application core (verifier/app.py,
verifier/audit/chain.py), blocks made in memory, model nodes that sign their replies, and a stand-in
for the scoring engine (a reply of the honest model scores 1.0, of the degraded one 0.3).

Checks that every transaction the planners make is one the chain takes (plan commits in the commit
window, reports in the report window, matching their commits); that a node busy at its first try is
tried again and scored; that a node that forwards its challenges answers for the replies it returns
(an honest peer's score, counted for it); that the degraded node falls below the trust line while
the others stay trusted; and that one Byzantine verifier's false scores do not move the median."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from typing import Any

from overlay.anon import signing
from overlay.directory.registration import OP_REGISTER, Entry, make_tx
from overlay.wire import crypto
from overlay.wire.constants import ROLE_MODEL, TRUST_LINE
from overlay.wire.identity import Identity
from overlay.wire.messages import ChatMessage, SamplingParams
from verifier.app import CommitteeApp, Validator
from verifier.audit import pool as pl
from verifier.audit import tx as at
from verifier.audit.auditor import Auditor, Failure, Reply, Send, Submit, parse_revealed, parse_view
from verifier.audit.chain import REVEALED_PATH, decode_query
from verifier.audit.challenges import ChallengeGenerator

CHAIN = "audit-loop"
MODEL = "smollm2-135m-instruct"
E = 12
T0 = 1_700_000_000
SEEDS = [bytes([i + 1]) * 32 for i in range(4)]
NAMES = ("honest", "degraded", "busy", "forwarder")


class Loop:
    def __init__(self) -> None:
        self.app = CommitteeApp()
        vals = [Validator("ed25519", crypto.SigningKey.from_bytes(s).public_bytes, 10) for s in SEEDS]
        self.app.init_chain(CHAIN, vals, json.dumps({"audit": {"epoch_blocks": E, "challenges_per_node": 2}}).encode())
        self.auditors = [Auditor(s, CHAIN, (MODEL,), ChallengeGenerator(rng=random.Random(i)), rng=random.Random(i))
                         for i, s in enumerate(SEEDS)]
        self.nodes = {name: Identity.generate() for name in NAMES}
        self.name = {ident.node_id: name for name, ident in self.nodes.items()}
        self.height = 0
        self.pending: list[bytes] = [
            make_tx(ident.signing, CHAIN, OP_REGISTER, 1,
                    Entry(ROLE_MODEL, ident.x25519.public_bytes, f"127.0.0.1:{7000 + i}", "default", MODEL, 1))
            for i, ident in enumerate(self.nodes.values())]
        self.refused: list[tuple[str, int, str]] = []
        self.reported: list[tuple[int, at.AuditReport]] = []  # (verifier, report) as submitted
        self.tries: dict[str, list[int]] = {}

    def query(self, path: str) -> bytes:
        result, value = self.app.query(path, b"")
        assert result.ok, (path, result)
        return value

    def answer(self, send: Send) -> tuple[Reply | Failure, int | None]:
        """What the challenged node returns, and the verifier's score of it."""
        name = self.name[send.node_id]
        self.tries.setdefault(name, []).append(send.attempt)
        if name == "busy" and send.attempt == 1:
            return Failure("busy", "at capacity"), None
        signer = self.nodes["honest" if name == "forwarder" else name]  # the forwarder hands it to an honest peer
        opening = send.opening
        s = signing.ReplySigner(opening.reply_digest(send.node_id, send.attempt), opening.model, signer.node_id)
        chunks = ((f"answer {self.height}", (11, 12, 13)), ("", (2,)))
        sig = b""
        when = (T0 + self.height) * 1000
        for n, (text, ids) in enumerate(chunks):
            _, sig = s.add(text, ids, n == len(chunks) - 1, when, signer.signing.sign)
        score = 300_000 if signer is self.nodes["degraded"] else 1_000_000
        return Reply(chunks, sig, when, signer.node_id), score

    def block(self) -> None:
        self.height += 1
        txs, self.pending = self.pending, []
        results, _ = self.app.finalize_block(self.height, T0 + self.height, txs,
                                             crypto.sha256(self.height.to_bytes(8, "big")))
        for raw, r in zip(txs, results, strict=True):
            if not r.ok:
                self.refused.append((raw[:8].hex(), int(r.code), r.log))
        self.app.commit()
        view = parse_view(self.query("/audit"))
        for i, a in enumerate(self.auditors):
            for epoch in a.revealed_wanted(view.epoch):  # as the driver reads them
                a.take_revealed(epoch, parse_revealed(self.query(f"{REVEALED_PATH}{epoch}"), epoch))
            for action in a.plan(view, self.height):
                if isinstance(action, Submit):
                    tx = at.decode_audit_tx(action.raw, CHAIN)
                    if isinstance(tx, at.AuditReport):
                        self.reported.append((i, tx))
                    self.pending.append(action.raw)
                    a.submitted(action.key, retry=False)
                else:
                    assert isinstance(action, Send), action  # no user donates transcripts here: nothing to score
                    out, score = self.answer(action)
                    a.result(action, out, score, self.height)

    def applied(self) -> list[list[Any]]:
        return [o for o in decode_query(self.query("/audit"))["outcomes"] if o[1] == "applied"]

    def reputation(self, name: str) -> int:
        return self.app.committed.reputation(self.nodes[name].node_id)

    def run(self, epochs: int) -> None:
        while len(self.applied()) < epochs:
            self.block()
            assert self.height < (epochs + 3) * E, (decode_query(self.query("/audit"))["outcomes"], self.refused)


def test_the_planners_drive_the_committee_through_audited_epochs() -> None:
    loop = Loop()
    loop.run(6)
    assert loop.refused == []  # every commit and report the planners made was taken
    applied = loop.applied()
    assert [o[0] for o in applied] == list(range(applied[0][0], applied[0][0] + len(applied)))  # no epoch lost
    assert all("4 of 4 validators reported" in o[2] for o in applied), applied
    assert loop.reputation("degraded") < TRUST_LINE <= loop.reputation("honest")
    # busy at the first try: tried again within the window and scored like the honest node
    assert set(loop.tries["busy"]) == {1, 2} and loop.reputation("busy") == loop.reputation("honest")
    # a forwarded reply counts for the node that was asked (here: an honest peer's score)
    assert loop.reputation("forwarder") == loop.reputation("honest")
    assert decode_query(loop.query("/audit"))["audited_models"] == [MODEL]  # all four declared it


def test_one_byzantine_verifier_cannot_sink_an_honest_node_or_save_a_degraded_one() -> None:
    loop = Loop()

    def lie(report: at.AuditReport) -> at.AuditReport:
        def flipped(e: at.ReportEntry) -> at.ReportEntry:
            if not isinstance(e.outcome, at.ReplyOutcome):
                return e
            fake = 1_000_000 if e.outcome.served_by == loop.nodes["degraded"].node_id else 0
            return replace(e, outcome=replace(e.outcome, score=fake))
        return replace(report, entries=tuple(flipped(e) for e in report.entries))

    loop.auditors[3].tamper = lie
    loop.run(6)
    assert loop.refused == []  # the lies are well-formed: only the median defeats them
    assert loop.reputation("degraded") < TRUST_LINE <= loop.reputation("honest")


def test_a_turn_one_verifier_revealed_is_not_sent_by_another_while_the_chain_voids_it() -> None:
    """Verifier 1 challenges with a donated "Tell me more."; its report reveals the turn, which the
    chain then voids in any challenge for PROMPT_EPOCHS epochs. Verifier 0, whose pool holds a
    conversation ending in it, reads the reveal (``/audit/revealed/E``) and drops that conversation
    rather than spend a challenge on it."""
    own = SamplingParams(0.7, 1.0, 0, 256, None)

    def pool(*turns: str) -> pl.DonationPool:
        p = pl.DonationPool()
        p.add(pl.Donation(b"\x40" * 20, MODEL, tuple(ChatMessage("user", t) for t in turns), own))
        return p

    loop = Loop()
    loop.auditors[1].pool = pool("Tell me more.")
    loop.run(2)
    (by_1,) = [r for i, r in loop.reported if i == 1 and any(e.opening.messages[-1].content == "Tell me more."
                                                               for e in r.entries)]
    key = next(e.opening.prompt_keys()[-1] for e in by_1.entries if e.opening.messages[-1].content == "Tell me more.")
    assert key in parse_revealed(loop.query(f"{REVEALED_PATH}{by_1.epoch}"), by_1.epoch)
    loop.auditors[0].pool = later = pool("How do plants grow?", "Tell me more.")
    loop.run(4)
    assert len(later) == 0  # drawn, and dropped
    sent_by_0 = {m.content for i, r in loop.reported if i == 0 for e in r.entries for m in e.opening.messages}
    assert "How do plants grow?" not in sent_by_0 and loop.refused == []
    assert loop.query(f"{REVEALED_PATH}{10**6}") == b"\x92\xce\x00\x0fB@\x90"  # [10**6, []]: nothing revealed then
    result, _ = loop.app.query(f"{REVEALED_PATH}x1", b"")
    assert not result.ok and "the epoch in decimal" in result.log
