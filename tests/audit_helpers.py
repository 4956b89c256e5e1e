"""Shared helpers for audit tests: a 4-validator committee of in-process app cores fed the same
blocks, registered model nodes that sign real replies, and the validators' audit transactions."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from overlay import crypto, signing
from overlay.messages import ChatMessage, SamplingParams
from tests.committee_helpers import CHAIN, Node
from verifier import audit as audits
from verifier import audit_tx as at
from verifier import tx
from verifier.app import CommitteeApp, ListsAt, Result, Validator

T0 = 1_700_000_000
MODEL = "smollm2-135m"  # what tests.committee_helpers.Node registers model nodes with
E = 10  # blocks per epoch
K = 2  # challenges per node

_prompts = itertools.count()


def fresh_opening(model: str = MODEL, question: str | None = None) -> at.Opening:
    """A challenge with a question never used before (in this process)."""
    n = next(_prompts)
    q = question if question is not None else f"Question {n}: what is {n} plus {n + 1}?"
    return at.Opening(crypto.random_bytes(16), model, (ChatMessage("user", q),),
                      SamplingParams(temperature=0.7, top_p=1.0, top_k=0, max_tokens=32, seed=n % 1000))


@dataclass
class ModelNode:
    """A registered model node that answers challenges with signed replies (overlay/signing.py)."""

    node: Node = field(default_factory=Node)

    @property
    def node_id(self) -> bytes:
        return self.node.node_id

    def answer(self, opening: at.Opening, index: int, score: int = 950_000, raw_score: int = 400_000,
               chunks: Sequence[tuple[str, Sequence[int]]] = (("The answer", (791, 4245)), (" is 7.", (318, 767, 13))),
               signed_at_ms: int = 1_700_000_000_123) -> at.ReplyEntry:
        """The report entry for this node's reply to ``opening``: every chunk signed as it streams."""
        signer = signing.ReplySigner(opening.digest(), opening.model, self.node_id)
        sig = b""
        for i, (text, ids) in enumerate(chunks):
            _, sig = signer.add(text, ids, i == len(chunks) - 1, signed_at_ms, self.node.key.sign)
        return at.ReplyEntry(self.node_id, index, opening, tuple((t, tuple(ids)) for t, ids in chunks), sig,
                             signed_at_ms, score, raw_score)


class Committee:
    """``n_apps`` app cores of a 4-validator committee with audits on; every block goes to all of
    them (prepare on the first, process/finalize/commit on all) and their app hashes must agree."""

    def __init__(self, powers: Sequence[int] = (10, 10, 10, 10), n_nodes: int = 3, n_apps: int = 4,
                 epoch_blocks: int = E, k: int = K, model: str = MODEL) -> None:
        self.keys = [crypto.SigningKey.generate() for _ in powers]
        self.seeds = {k.public_bytes: k.private_bytes() for k in self.keys}
        self.validators = [Validator("ed25519", k.public_bytes, p) for k, p in zip(self.keys, powers, strict=True)]
        app_state = json.dumps({"audit": {"model": model, "epoch_blocks": epoch_blocks,
                                          "challenges_per_node": k}}).encode()
        self.apps = [CommitteeApp() for _ in range(n_apps)]
        for a in self.apps:
            a.init_chain(CHAIN, self.validators, app_state)
        self.nodes = [ModelNode(Node(port=9000 + i)) for i in range(n_nodes)]
        self.now = T0
        self.block([n.node.register(tx.ROLE_MODEL) for n in self.nodes])

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
        """The i-th validator key in the committee's order (the order of sealed boxes)."""
        return self.app.committed.validators[i].public_key

    def block(self, txs: Sequence[bytes]) -> list[Result]:
        """Run one block with ``txs`` (every one must be valid) on every app; their app hashes must agree."""
        a, h = self.app, self.app.height + 1
        self.now += 1
        included = a.prepare_proposal(list(txs), 1 << 22, self.now, h)
        assert len(included) == len(txs), [a.check_tx(t) for t in txs]
        block_hash = crypto.sha256(b"".join(included) + h.to_bytes(8, "big"))
        hashes, results = set(), []
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
        """Run empty blocks up to the last block of ``epoch - 1``."""
        self.to_height(epoch * self.audit.params.epoch_blocks)
        assert self.audit.epoch == epoch

    # ------------------------------------------------------------------ validators' transactions

    def sign(self, obj: at.AuditTx, pk: bytes) -> bytes:
        return at.sign_tx(obj, CHAIN, self.seeds[pk])

    def proof(self, pk: bytes, epoch: int | None = None) -> bytes:
        st = self.audit
        return self.sign(at.prove_leader(st.epoch if epoch is None else epoch, st.seed, self.seeds[pk]), pk)

    def elect(self, leader: int | None = None) -> bytes:
        """At an epoch's first block: proofs from every validator (``leader`` None: the VRF decides)
        or from validator ``leader`` only; then run to the end of the proof window. The leader's key."""
        pks = [v.public_key for v in self.app.committed.validators]
        chosen = pks if leader is None else [self.pk(leader)]
        self.block([self.proof(pk) for pk in chosen])
        self.to_height(self.audit.proof_until())
        assert self.audit.leader_known and self.audit.leader is not None
        return self.audit.leader

    def commit_tx(self, leader: bytes, openings: Sequence[at.Opening] | None = None,
                  node_ids: Sequence[bytes] | None = None) -> tuple[bytes, list[at.Opening]]:
        """The next epoch's challenge commit by ``leader``: ``k`` fresh challenges per node the app
        names (or ``node_ids``), sealed to every validator."""
        st = self.audit
        ids = list(node_ids) if node_ids is not None else audits.audit_nodes(st, self.app.committed.nodes)
        k = st.params.challenges_per_node
        ops = list(openings) if openings is not None else [fresh_opening() for _ in range(k * len(ids))]
        order = [pk for pk, _ in self.app.committed.validator_powers()]
        chs = tuple(at.seal_challenge(ids[i // k] if i // k < len(ids) else ids[-1], op, order)
                    for i, op in enumerate(ops))
        return self.sign(at.ChallengeCommit(st.epoch + 1, leader, chs), leader), ops

    def opened(self, leader: bytes) -> list[at.Opening]:
        """The current epoch's openings as ``leader`` reads them from its sealed boxes."""
        st = self.audit
        me = st.sealed_to.index(leader)
        return [ch.open(me, self.seeds[leader]) for ch in st.challenges]

    def honest_entries(self, leader: bytes, scores: Sequence[int] | None = None) -> list[at.Entry]:
        """The report entries an honest leader makes: each node's signed reply to each challenge."""
        by_id = {n.node_id: n for n in self.nodes}
        out: list[at.Entry] = []
        for i, (ch, op) in enumerate(zip(self.audit.challenges, self.opened(leader), strict=True)):
            out.append(by_id[ch.node_id].answer(op, i, score=950_000 if scores is None else scores[i]))
        return out

    def report_tx(self, leader: bytes, entries: Sequence[at.Entry], epoch: int | None = None) -> bytes:
        return self.sign(at.EpochReport(self.audit.epoch if epoch is None else epoch, leader, tuple(entries)), leader)

    def attest_tx(self, pk: bytes, scores: Sequence[int], report_hash: bytes | None = None) -> bytes:
        st = self.audit
        return self.sign(at.Attestation(st.epoch, pk, report_hash or st.report_hash, tuple(scores)), pk)

    def silence_tx(self, pk: bytes, node_id: bytes, answered: bool) -> bytes:
        return self.sign(at.SilenceConfirm(self.audit.epoch, pk, node_id, answered), pk)

    def others(self, leader: bytes) -> list[bytes]:
        return [v.public_key for v in self.app.committed.validators if v.public_key != leader]

    # ------------------------------------------------------------------ reading

    def reputation(self, node_id: bytes) -> int:
        return self.audit.reputation.get(node_id).value

    def listed_models(self) -> list[bytes]:
        """Node ids on the model list the committee signs (ListsAt: trusted nodes only)."""
        import msgpack

        held = ListsAt.of(self.app.committed)
        return [r[0] for r in msgpack.unpackb(held.models)]

    def outcome(self, epoch: int) -> audits.Outcome:
        return next(o for o in self.audit.outcomes if o.epoch == epoch)
