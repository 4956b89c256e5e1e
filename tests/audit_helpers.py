"""Shared helpers for audit tests: a 4-validator committee of in-process app cores fed the same
blocks, registered model nodes that sign real replies, and the validators' audit transactions."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from overlay.anon import signing
from overlay.wire import crypto
from overlay.wire.constants import ROLE_MODEL
from overlay.wire.messages import ChatMessage, SamplingParams
from tests.committee_helpers import CHAIN, Node
from verifier.app import CommitteeApp, ListsAt, Result, Validator
from verifier.audit import chain as audits
from verifier.audit import tx as at

T0 = 1_700_000_000
MODEL = "smollm2-135m"  # what tests.committee_helpers.Node registers model nodes with
E = 12  # blocks per epoch (the minimum: commit window 3, report window 3)
K = 2  # challenges per node and verifier
CLOCK = [T0]  # the block time of the last block run (ModelNode signs replies at it by default)


def _pick(score: int | Sequence[int], i: int) -> int:
    return score if isinstance(score, int) else score[i % len(score)]


@dataclass
class Plan:
    """A validator's secret plan: its key, the models it declares, the salt, and (node, opening) per challenge."""

    pk: bytes
    models: tuple[str, ...]
    salt: bytes
    items: list[tuple[bytes, at.Opening]]

    def hash(self) -> bytes:
        return at.plan_hash(self.salt, [(n, op.commitment()) for n, op in self.items])

    def failed(self, kind: str = "silent", tries: int = 3) -> list[at.ReportEntry]:
        return [at.ReportEntry(n, op, at.FailOutcome(kind, tries)) for n, op in self.items]

_prompts = itertools.count()


def fresh_opening(model: str = MODEL, question: str | None = None) -> at.Opening:
    """A challenge with a question never used before (in this process)."""
    n = next(_prompts)
    q = question if question is not None else f"Question {n}: what is {n} plus {n + 1}?"
    return at.Opening(crypto.random_bytes(16), model, (ChatMessage("user", q),),
                      SamplingParams(temperature=0.7, top_p=1.0, top_k=0, max_tokens=32, seed=n % 1000))


def fresh_script(turns: int, model: str = MODEL) -> at.Opening:
    """A challenge script of ``turns`` user turns never used before (decision 0025)."""
    first = fresh_opening(model)
    more = tuple(ChatMessage("user", f"And then {next(_prompts)}?") for _ in range(turns - 1))
    return at.Opening(first.salt, model, first.messages + more, first.params)


@dataclass
class ModelNode:
    """A registered model node that answers challenges with signed replies (overlay/anon/signing.py)."""

    node: Node = field(default_factory=Node)

    @property
    def node_id(self) -> bytes:
        return self.node.node_id

    def reply(self, opening: at.Opening, score: int = 950_000,
              chunks: Sequence[tuple[str, Sequence[int]]] = (("The answer", (791, 4245)), (" is 7.", (318, 767, 13))),
              signed_at_ms: int | None = None, tries: int = 1, target: bytes | None = None, turn: int = 0,
              replies: Sequence[str] = ()) -> at.ReplyOutcome:
        """This node's signed reply to ``opening`` (every chunk signed as it streams), signed at
        ``signed_at_ms`` (default: the clock of :class:`Committee`, i.e. inside the epoch), to the
        challenge sent to ``target`` (default this node; the forwarding node when it forwarded);
        to the script's ``turn``, the node's ``replies`` to the earlier turns in place (decision 0025)."""
        at_ms = CLOCK[0] * 1000 + 123 if signed_at_ms is None else signed_at_ms
        signer = signing.ReplySigner(opening.reply_digest(target or self.node_id, tries, turn, replies), opening.model,
                                     self.node_id)
        sig = b""
        for i, (text, ids) in enumerate(chunks):
            _, sig = signer.add(text, ids, i == len(chunks) - 1, at_ms, self.node.key.sign)
        return at.ReplyOutcome(self.node_id, tuple((t, tuple(ids)) for t, ids in chunks), sig, at_ms, score, tries)


class Committee:
    """``n_apps`` app cores of a 4-validator committee with audits on; every block goes to all of
    them (prepare on the first, process/finalize/commit on all) and their app hashes must agree."""

    def __init__(self, powers: Sequence[int] = (10, 10, 10, 10), n_nodes: int = 3, n_apps: int = 4,
                 epoch_blocks: int = E, k: int = K, reply_window_s: int | None = None) -> None:
        self.keys = [crypto.SigningKey.generate() for _ in powers]
        self.seeds = {k.public_bytes: k.private_bytes() for k in self.keys}
        self.validators = [Validator("ed25519", k.public_bytes, p) for k, p in zip(self.keys, powers, strict=True)]
        section: dict[str, int] = {"epoch_blocks": epoch_blocks, "challenges_per_node": k}
        if reply_window_s is not None:
            section["reply_window_s"] = reply_window_s
        app_state = json.dumps({"audit": section}).encode()
        self.apps = [CommitteeApp() for _ in range(n_apps)]
        for a in self.apps:
            a.init_chain(CHAIN, self.validators, app_state)
        self.nodes = [ModelNode(Node(port=9000 + i)) for i in range(n_nodes)]
        self.now = T0
        self.block([n.node.register(ROLE_MODEL) for n in self.nodes])

    # ------------------------------------------------------------------ chain

    @property
    def app(self) -> CommitteeApp:
        return self.apps[0]

    @property
    def audit(self) -> audits.AuditState:
        st = self.app.committed.audit
        assert st is not None
        return st

    @property
    def height(self) -> int:
        return self.app.height

    def pk(self, i: int) -> bytes:
        """The i-th validator key in the committee's order."""
        return self.app.committed.validators[i].public_key

    def block(self, txs: Sequence[bytes]) -> list[Result]:
        """Run one block with ``txs`` (every one must be valid) on every app; their app hashes must agree."""
        a, h = self.app, self.app.height + 1
        self.now += 1
        CLOCK[0] = self.now
        included = a.prepare_proposal(list(txs), 1 << 22, self.now, h)
        assert len(included) == len(txs), [a.check_tx(t) for t in txs]
        block_hash = crypto.sha256(b"".join(included) + h.to_bytes(8, "big"))
        hashes: set[bytes] = set()
        results: list[Result] = []
        for app in self.apps:
            assert app.process_proposal(included, self.now, h, block_hash)
            results, app_hash = app.finalize_block(h, self.now, included, block_hash)
            app.commit()
            hashes.add(app_hash)
        assert len(hashes) == 1, "the apps disagree on the app hash"
        assert len({app.committed.canonical_bytes() for app in self.apps}) == 1
        return results

    def rejected(self, raw: bytes) -> Result:
        """CheckTx's answer for a transaction every rule must refuse; checks that the refusal changes
        nothing and that a block holding it is rejected."""
        before = self.app.committed.canonical_bytes()
        r = self.app.check_tx(raw)
        assert not r.ok and r.log
        assert self.app.committed.canonical_bytes() == before
        h = self.height + 1
        assert not self.app.process_proposal([raw], self.now + 1, h, crypto.sha256(raw + h.to_bytes(8, "big")))
        assert self.app.prepare_proposal([raw], 1 << 22, self.now + 1, h) == []
        return r

    def to_height(self, h: int) -> None:
        while self.height < h:
            self.block([])

    def to_epoch_start(self, epoch: int) -> None:
        """Run empty blocks up to the last block of ``epoch - 1`` (the next block starts ``epoch``)."""
        self.to_height(epoch * self.audit.params.epoch_blocks)
        assert self.audit.epoch == epoch

    # ------------------------------------------------------------------ validators' transactions

    def sign(self, obj: at.AuditTx, pk: bytes) -> bytes:
        return at.sign_tx(obj, CHAIN, self.seeds[pk])

    def plan(self, pk: bytes, node_ids: Sequence[bytes] | None = None, models: Sequence[str] = (MODEL,),
             k: int | None = None) -> Plan:
        """A fresh secret plan of ``pk`` for the current epoch: ``k`` fresh challenges for each node
        (default: every registered model node of :data:`MODEL`, by id)."""
        st = self.audit
        ids = sorted(node_ids if node_ids is not None else dict(audits.nodes_by_model(st, self.app.committed.nodes))
                     .get(MODEL, []))
        per = st.params.challenges_per_node if k is None else k
        return Plan(pk, tuple(sorted(models)), crypto.random_bytes(16),
                    [(n, fresh_opening()) for n in ids for _ in range(per)])

    def commit_tx(self, plan: Plan, epoch: int | None = None) -> bytes:
        e = self.audit.epoch if epoch is None else epoch
        return self.sign(at.PlanCommit(e, plan.pk, plan.models, plan.hash()), plan.pk)

    def answers(self, plan: Plan, score: int | Sequence[int] = 950_000, **kw: Any) -> list[at.ReportEntry]:
        """Every planned challenge answered by its node with a signed reply (``score`` per entry, or one for all)."""
        by_id = {n.node_id: n for n in self.nodes}
        scores = [score] * len(plan.items) if isinstance(score, int) else list(score)
        return [at.ReportEntry(n, op, by_id[n].reply(op, score=s, **kw))
                for (n, op), s in zip(plan.items, scores, strict=True)]

    def report_tx(self, plan: Plan, entries: Sequence[at.ReportEntry], epoch: int | None = None) -> bytes:
        e = self.audit.epoch if epoch is None else epoch
        return self.sign(at.AuditReport(e, plan.pk, plan.salt, tuple(entries)), plan.pk)

    def epoch(self, scores: dict[bytes, int | Sequence[int]] | None = None, pks: Sequence[bytes] | None = None,
              entries: Callable[[Plan], Sequence[at.ReportEntry]] | None = None) -> audits.Outcome:
        """One whole epoch from its first block: every validator in ``pks`` (default all) commits a
        plan over every model node, every node answers every challenge (score per node from
        ``scores``, default 0.95), each reports; runs to the epoch's last block. Its outcome."""
        e = self.audit.epoch
        assert self.height == self.audit.start_height() - 1, "call at the last block of the previous epoch"
        plans = [self.plan(pk) for pk in (pks if pks is not None else self.pks())]
        self.block([self.commit_tx(p) for p in plans])
        self.to_height(self.audit.report_from() - 1)
        reports = []
        for p in plans:
            if entries is not None:
                got = list(entries(p))
            else:
                by = scores or {}
                got = [at.ReportEntry(n, op, self.node(n).reply(op, score=_pick(by.get(n, 950_000), i)))
                       for i, (n, op) in enumerate(p.items)]
            reports.append(self.report_tx(p, got))
        self.block(reports)
        self.to_height(self.audit.end_height())
        return self.outcome(e)

    def node(self, node_id: bytes) -> ModelNode:
        return next(n for n in self.nodes if n.node_id == node_id)

    def pks(self) -> list[bytes]:
        return [v.public_key for v in self.app.committed.validators]

    # ------------------------------------------------------------------ reading

    def reputation(self, node_id: bytes) -> int:
        return self.audit.reputation.get(node_id).value

    def listed_models(self) -> list[list[Any]]:
        """The model list's records as the committee signs them (ListsAt)."""
        import msgpack

        return list(msgpack.unpackb(ListsAt.of(self.app.committed).models))

    def outcome(self, epoch: int) -> audits.Outcome:
        return next(o for o in self.audit.outcomes if o.epoch == epoch)
