"""A verifier's audit loop (issue 14 items 2 and 5; docs/committee.md "Audits: running a verifier
with audits").

Two layers, as everywhere in this project:

- :class:`Auditor`, the **I/O-free planner**. Given this verifier's validator key, the committee's
  ``/audit`` view (:class:`AuditView`, committed state) at a height, and what it has already done,
  :meth:`Auditor.plan` says what to do next: transactions to submit (:class:`Submit`: the epoch's
  VRF proof, the next epoch's :class:`~verifier.audit_tx.ChallengeCommit` when this verifier
  leads), challenges to send (:class:`RunChallenges`: the leader opens the committed challenges
  sealed to it), a report to rescore (:class:`Attest`) and silent nodes to check with a fresh
  challenge of its own (:class:`ConfirmSilence`). Results come back through
  :meth:`Auditor.report`, :meth:`Auditor.attestation` and :meth:`Auditor.silence`, which build the
  signed transactions. Each piece of work is handed out once per epoch (a submission that could not
  reach the verifier is handed out again at the next plan; one the chain refused is not).
- :class:`AuditDriver`, the **thin trio driver**: it polls the verifier's own CometBFT RPC
  (``/abci_query`` ``/audit``, about once a block), runs what the planner asks (challenges through
  the overlay's anonymous request API, the very code users run, to ONE node with no failover:
  :func:`send_challenge`; scoring with this verifier's own llama.cpp engine: :func:`score_tokens`),
  and broadcasts the transactions (``/broadcast_tx_sync``). :func:`run_audits` sets the driver up
  inside ``gentorrent verifier --audit``: a user node of the overlay registered with the committee
  as a user (like ``gentorrent user chat``; its identity in ``DATA_DIR/audit-user``) and the audit
  model loaded with llama.cpp. Every failure is logged with the node and peer; nothing here can
  stop the verifier (:func:`run_audits` restarts after a failure).

What counts as an answer: a complete reply (its last chunk ``done``) whose every chunk verified
against the signature of the node that served it: the challenged node, or the member of its group
it forwarded the challenge to (Algorithm 2 may forward any request, one hop). A forwarded reply is
reported with its serving node (``ReplyEntry.server``): the chain checks it against that node's
registered key and scores that node, and a silence check counts it as answered.
"""

from __future__ import annotations

import base64
import logging
import random
from collections.abc import Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgpack
import trio

from model_node.engine import EngineError
from overlay.anon import AnonClient, AnonError, failure_kind
from overlay.identity import short_id
from verifier.challenges import ChallengeGenerator

if TYPE_CHECKING:
    from model_node.engine import Engine
    from verifier.audit_tx import Opening

log = logging.getLogger("gentorrent.audit")

POLL_S = 1.0  # about once a block
CHALLENGE_TIMEOUT_S = 60.0  # first chunk; a challenge reply is 48-96 tokens
MAX_VIEW_BYTES = 4 * 1024 * 1024
RESTART_S = 10.0  # run_audits waits this long after a failure before starting again


class AuditViewError(ValueError):
    """The ``/audit`` answer does not decode as the view described in audit-spec / docs/committee.md."""


# --------------------------------------------------------------------------- the /audit view


@dataclass(frozen=True, slots=True)
class AuditView:
    """The committee's ``/audit`` query answer (committed state), decoded strictly."""

    epoch: int
    epoch_blocks: int
    start_height: int
    seed: bytes
    proof_until: int
    leader: bytes | None
    validators: tuple[tuple[bytes, int], ...]
    challenges: tuple[tuple[bytes, bytes, tuple[bytes, ...]], ...]  # (node_id, commitment, sealed boxes)
    next_committed: bool
    report_hash: bytes | None
    agree_power: int
    total_power: int
    silent: tuple[tuple[bytes, int, int], ...]  # (node_id, silent power, answered power)
    outcomes: tuple[tuple[int, str, str, int], ...]  # (epoch, "applied"|"aborted", reason, height)
    model: str
    challenges_per_node: int
    audit_nodes_next: tuple[bytes, ...]
    # Optional keys (absent: derived as stated): validators whose proof this epoch holds; whether the
    # proof window has closed (height > proof_until); the keys this epoch's boxes are sealed to, in
    # order (the validators); validators that attested the report; "open" / "applied" / "aborted".
    proofs: tuple[bytes, ...] = ()
    leader_known: bool | None = None
    sealed_to: tuple[bytes, ...] = ()
    attested: tuple[bytes, ...] = ()
    status: str = "open"

    @property
    def end_height(self) -> int:
        return self.start_height + self.epoch_blocks - 1


def _t(value: Any, tp: type, what: str) -> Any:
    if type(value) is not tp:
        raise AuditViewError(f"/audit: {what} is {type(value).__name__}, not {tp.__name__}")
    return value


def _bytes(value: Any, what: str, size: int | None = None) -> bytes:
    b: bytes = _t(value, bytes, what)
    if size is not None and len(b) != size:
        raise AuditViewError(f"/audit: {what} has {len(b)} bytes, not {size}")
    return b


def _list(value: Any, what: str) -> list[Any]:
    out: list[Any] = _t(value, list, what)
    return out


def parse_view(raw: bytes) -> AuditView:
    """The ``/audit`` msgpack map as an :class:`AuditView`; :class:`AuditViewError` for anything else."""
    if len(raw) > MAX_VIEW_BYTES:
        raise AuditViewError(f"/audit answer over {MAX_VIEW_BYTES} bytes")
    try:
        doc = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise AuditViewError(f"/audit answer does not decode ({exc})") from None
    if not isinstance(doc, dict):
        raise AuditViewError("/audit answer is not a map")
    try:
        def opt(key: str, size: int | None) -> bytes | None:
            return None if doc[key] is None else _bytes(doc[key], key, size)

        return AuditView(
            epoch=_t(doc["epoch"], int, "epoch"),
            epoch_blocks=_t(doc["epoch_blocks"], int, "epoch_blocks"),
            start_height=_t(doc["start_height"], int, "start_height"),
            seed=_bytes(doc["seed"], "seed", 32),
            proof_until=_t(doc["proof_until"], int, "proof_until"),
            leader=opt("leader", 32),
            validators=tuple((_bytes(v[0], "validator key", 32), _t(v[1], int, "power"))
                             for v in map(lambda x: _list(x, "validator"), _list(doc["validators"], "validators"))),
            challenges=tuple(
                (_bytes(c[0], "challenge node", 20), _bytes(c[1], "commitment", 32),
                 tuple(_bytes(s, "sealed box") for s in _list(c[2], "sealed boxes")))
                for c in map(lambda x: _list(x, "challenge"), _list(doc["challenges"], "challenges"))),
            next_committed=_t(doc["next_committed"], bool, "next_committed"),
            report_hash=opt("report_hash", 32),
            agree_power=_t(doc["agree_power"], int, "agree_power"),
            total_power=_t(doc["total_power"], int, "total_power"),
            silent=tuple((_bytes(s[0], "silent node", 20), _t(s[1], int, "silent power"), _t(s[2], int, "answered"))
                         for s in map(lambda x: _list(x, "silent"), _list(doc["silent"], "silent"))),
            outcomes=tuple((_t(o[0], int, "outcome epoch"), _t(o[1], str, "status"), _t(o[2], str, "reason"),
                            _t(o[3], int, "outcome height"))
                           for o in map(lambda x: _list(x, "outcome"), _list(doc["outcomes"], "outcomes"))),
            model=_t(doc["model"], str, "model"),
            challenges_per_node=_t(doc["challenges_per_node"], int, "challenges_per_node"),
            audit_nodes_next=tuple(_bytes(n, "next node", 20) for n in _list(doc["audit_nodes_next"], "next nodes")),
            proofs=tuple(_bytes(k, "proof key", 32) for k in _list(doc.get("proofs", []), "proofs")),
            leader_known=None if doc.get("leader_known") is None else _t(doc["leader_known"], bool, "leader_known"),
            sealed_to=tuple(_bytes(k, "sealed_to key", 32) for k in _list(doc.get("sealed_to", []), "sealed_to")),
            attested=tuple(_bytes(k, "attested key", 32) for k in _list(doc.get("attested", []), "attested")),
            status=_t(doc.get("status", "open"), str, "status"),
        )
    except (KeyError, IndexError) as exc:
        raise AuditViewError(f"/audit answer lacks {exc}") from None


# --------------------------------------------------------------------------- actions and results


@dataclass(frozen=True, slots=True)
class Submit:
    """Broadcast ``raw`` (an audit transaction); ``key`` identifies the work for :meth:`Auditor.submitted`."""

    raw: bytes
    what: str
    key: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class ChallengeJob:
    index: int  # position in the epoch's committed challenges
    node_id: bytes
    opening: Opening | None  # None: the box sealed to this verifier did not open (``why``)
    why: str = ""


@dataclass(frozen=True, slots=True)
class RunChallenges:
    """This verifier leads ``epoch``: send each job's challenge to its node, score the replies, and
    hand the results to :meth:`Auditor.report`."""

    epoch: int
    jobs: tuple[ChallengeJob, ...]


@dataclass(frozen=True, slots=True)
class Attest:
    """Fetch the report ``report_hash`` of ``epoch`` (``/audit/report``), rescore every reply with
    this verifier's engine and hand the scores to :meth:`Auditor.attestation`."""

    epoch: int
    report_hash: bytes


@dataclass(frozen=True, slots=True)
class ConfirmSilence:
    """Send ``opening`` (a fresh challenge of this verifier's own, never on chain) to ``node_id``,
    which the report of ``epoch`` calls silent; hand the outcome to :meth:`Auditor.silence`."""

    epoch: int
    node_id: bytes
    opening: Opening


Action = Submit | RunChallenges | Attest | ConfirmSilence


@dataclass(frozen=True, slots=True)
class Reply:
    """A complete, verified reply to a challenge: every chunk's (text, token ids) in order, the final
    chunk's signature and signing time."""

    chunks: tuple[tuple[str, tuple[int, ...]], ...]
    signature: bytes
    signed_at_ms: int
    server: bytes = b""  # the node that signed it when not the challenged one (it was forwarded)

    @property
    def token_ids(self) -> list[int]:
        return [t for _, ids in self.chunks for t in ids]


@dataclass(frozen=True, slots=True)
class Failure:
    """No usable reply: ``kind`` ("busy", "silent", "lost", "error", "unverified",
    "incomplete", "empty", "other") and the words."""

    kind: str
    detail: str

    @property
    def reason(self) -> str:
        return f"{self.kind}: {self.detail}"[:200]


@dataclass(frozen=True, slots=True)
class ChallengeResult:
    """One job's outcome: a scored reply (``score``, ``raw_score`` fixed point) or a failure."""

    job: ChallengeJob
    outcome: Reply | Failure
    score: int = 0
    raw_score: int = 0


# --------------------------------------------------------------------------- the planner


@dataclass
class Auditor:
    """The I/O-free audit planner of one verifier (see the module docstring).

    ``seed``: this verifier's Ed25519 validator seed (32 bytes; CometBFT's validator key);
    ``chain_id``: the committee's; ``model``: the model this verifier's engine scores with (it takes
    part only while the chain audits that model); ``generator``: where fresh challenges come from.
    ``tamper`` is a test hook (never a flag): a Byzantine leader's edit of its report before signing
    (``EpochReport -> EpochReport``), to show the committee aborts such an epoch."""

    seed: bytes
    chain_id: str
    model: str
    generator: ChallengeGenerator = field(default_factory=ChallengeGenerator)
    tamper: Callable[[Any], Any] | None = None  # TESTS ONLY: alters each EpochReport before it is signed
    _started: set[tuple[Any, ...]] = field(default_factory=set)
    _warned_model: str = ""

    def __post_init__(self) -> None:
        from overlay.crypto import SigningKey

        self.public_key = SigningKey.from_bytes(self.seed).public_bytes

    def _sign(self, tx: Any) -> bytes:
        from verifier.audit_tx import sign_tx

        return sign_tx(tx, self.chain_id, self.seed)

    def _once(self, key: tuple[Any, ...]) -> bool:
        if key in self._started:
            return False
        self._started.add(key)
        return True

    def submitted(self, key: tuple[Any, ...], *, retry: bool) -> None:
        """A submission is over: ``retry`` (it never reached the chain: a network error) lets the
        next :meth:`plan` hand the work out again while it is still due."""
        if retry:
            self._started.discard(key)

    def plan(self, view: AuditView, height: int) -> list[Action]:
        """What to do at ``height`` given the committed ``view`` (each thing once per epoch)."""
        from verifier.audit_tx import prove_leader

        self._started = {k for k in self._started if k[1] >= view.epoch - 1}  # forget old epochs
        members = {pk for pk, _ in view.validators}
        if self.public_key not in members:
            return []
        if view.model != self.model:
            if self._warned_model != view.model:
                self._warned_model = view.model
                log.error("the committee audits model %r but this verifier's audit model is %r: not taking part "
                          "(restart with --audit-model %s)", view.model, self.model, view.model)
            return []
        e = view.epoch
        out: list[Action] = []
        if height <= view.proof_until and self.public_key not in view.proofs and self._once(("proof", e)):
            out.append(Submit(self._sign(prove_leader(e, view.seed, self.seed)), f"VRF proof for epoch {e}",
                              ("proof", e)))
        window_closed = view.leader_known if view.leader_known is not None else height > view.proof_until
        leading = view.leader == self.public_key and window_closed
        if leading and not view.next_committed and view.audit_nodes_next and self._once(("commit", e)):
            out.append(self._commit(view))
        if leading and view.challenges and view.report_hash is None and view.status == "open" \
                and self._once(("report", e)):
            out.append(RunChallenges(e, self._open(view)))
        if view.report_hash is not None and view.status == "open" and view.leader != self.public_key \
                and self.public_key not in view.attested and self._once(("attest", e, view.report_hash)):
            out.append(Attest(e, view.report_hash))
        if view.leader != self.public_key and view.status == "open":
            for node_id, _, _ in view.silent:
                if self._once(("silence", e, node_id)):
                    out.append(ConfirmSilence(e, node_id, self.generator.opening(view.model)))
        return out

    def _commit(self, view: AuditView) -> Submit:
        from verifier.audit_tx import ChallengeCommit

        challenges, _ = self.generator.challenges(view.model, view.audit_nodes_next, view.challenges_per_node,
                                                  [pk for pk, _ in view.validators])
        tx = ChallengeCommit(epoch=view.epoch + 1, leader_pk=self.public_key, challenges=tuple(challenges),
                             signature=b"")
        return Submit(self._sign(tx), f"{len(challenges)} challenges for epoch {view.epoch + 1}",
                      ("commit", view.epoch))

    def _open(self, view: AuditView) -> tuple[ChallengeJob, ...]:
        """The committed challenges of this epoch, opened with this verifier's key."""
        from verifier.audit_tx import Challenge
        from verifier.tx import TxError

        keys = list(view.sealed_to) or [pk for pk, _ in view.validators]
        mine = keys.index(self.public_key) if self.public_key in keys else len(keys)  # absent: no box opens
        jobs = []
        for i, (node_id, commitment, sealed) in enumerate(view.challenges):
            try:
                opening = Challenge(node_id, commitment, sealed).open(mine, self.seed)
                jobs.append(ChallengeJob(i, node_id, opening))
            except TxError as exc:
                log.warning("audit: epoch %d challenge %d for node %s: %s", view.epoch, i, short_id(node_id), exc)
                jobs.append(ChallengeJob(i, node_id, None, f"the committed challenge did not open: {exc}"))
        return tuple(jobs)

    def report(self, epoch: int, results: Sequence[ChallengeResult]) -> Submit:
        """The signed :class:`~verifier.audit_tx.EpochReport` of ``epoch`` from the challenges' results
        (one per committed challenge, in commit order)."""
        from verifier.audit_tx import EpochReport, ReplyEntry, SilentEntry

        entries: list[ReplyEntry | SilentEntry] = []
        for r in sorted(results, key=lambda r: r.job.index):
            if isinstance(r.outcome, Reply) and r.job.opening is not None:
                entries.append(ReplyEntry(node_id=r.job.node_id, index=r.job.index, opening=r.job.opening,
                                          chunks=r.outcome.chunks, signature=r.outcome.signature,
                                          signed_at_ms=r.outcome.signed_at_ms, score=r.score,
                                          raw_score=r.raw_score, server=r.outcome.server))
            else:
                reason = r.outcome.reason if isinstance(r.outcome, Failure) else r.job.why
                entries.append(SilentEntry(node_id=r.job.node_id, index=r.job.index, reason=reason[:200]))
        tx = EpochReport(epoch=epoch, leader_pk=self.public_key, entries=tuple(entries), signature=b"")
        if self.tamper is not None:
            honest, tx = tx, self.tamper(tx)
            if tx != honest:
                log.warning("audit: TEST HOOK: the report of epoch %d was altered before signing", epoch)
        return Submit(self._sign(tx), f"report of epoch {epoch} ({len(entries)} entries)", ("report-tx", epoch))

    def attestation(self, epoch: int, report_hash: bytes, scores: Sequence[int]) -> Submit:
        from verifier.audit_tx import Attestation

        tx = Attestation(epoch=epoch, validator_pk=self.public_key, report_hash=report_hash, scores=tuple(scores),
                         signature=b"")
        return Submit(self._sign(tx), f"attestation of epoch {epoch}", ("attest-tx", epoch, report_hash))

    def silence(self, epoch: int, node_id: bytes, answered: bool) -> Submit:
        from verifier.audit_tx import SilenceConfirm

        tx = SilenceConfirm(epoch=epoch, validator_pk=self.public_key, node_id=node_id, answered=answered,
                            signature=b"")
        return Submit(self._sign(tx), f"silence check of node {short_id(node_id)} in epoch {epoch}",
                      ("silence-tx", epoch, node_id))


# --------------------------------------------------------------------------- challenges and scoring (I/O)


async def send_challenge(client: AnonClient, node_id: bytes, opening: Opening, *,
                         timeout: float = CHALLENGE_TIMEOUT_S) -> Reply | Failure:
    """Send ``opening`` through the anonymous request API to ``node_id`` only (no failover, no retry
    elsewhere): the complete verified reply signed by that node, or why there is none."""
    chunks: list[tuple[str, tuple[int, ...]]] = []
    last = None
    try:
        stream = client.request(opening.model, opening.messages, opening.params, node=node_id, timeout=timeout,
                                failover=False)
        async with aclosing(stream) as replies:  # type: ignore[type-var]
            async for c in replies:
                if last is not None and c.node != last.node:
                    return Failure("unverified", f"the reply's chunks are signed by nodes {short_id(last.node)} and "
                                                 f"{short_id(c.node)}")
                chunks.append((c.text, tuple(c.token_ids)))
                last = c
                if c.done:
                    break
    except AnonError as exc:
        return Failure(failure_kind(exc), str(exc))
    if last is None or not last.done:
        return Failure("incomplete", "the reply ended before its last chunk")
    if not any(ids for _, ids in chunks):
        return Failure("empty", "the reply holds no tokens")
    return Reply(tuple(chunks), last.signature, last.signed_at_ms, b"" if last.node == node_id else last.node)


async def score_tokens(engine: Engine, opening: Opening, token_ids: Sequence[int]) -> tuple[int, int]:
    """``(calibrated, raw 1/PPL)`` in fixed point for a reply's token ids to ``opening``: one
    teacher-forced pass of this verifier's engine (``Engine.score``) after the prompt the model node
    saw (the chat template of the opening's messages), then :func:`verifier.scoring.score_reply`.
    Raises :class:`~verifier.scoring.ScoringError` or :class:`~model_node.engine.EngineError`."""
    from verifier.reputation import to_fixed
    from verifier.scoring import score_reply

    prompt = engine.chat_prompt(opening.messages)
    scores = await engine.score(prompt, list(token_ids), opening.params)
    r = score_reply(scores)
    return to_fixed(r.calibrated), to_fixed(r.raw_inv_ppl)


async def score_many(engine: Engine, replies: Sequence[tuple[Opening, Sequence[int]]]) -> list[int]:
    """The calibrated scores (fixed point) of several replies: in one ``score_batch`` call when the
    engine has it (llama.cpp: side by side in shared batches, the same numbers), else one
    :func:`score_tokens` each. Raises as :func:`score_tokens` does."""
    from verifier.reputation import to_fixed
    from verifier.scoring import score_reply

    batch = getattr(engine, "score_batch", None)
    if batch is None:
        return [(await score_tokens(engine, o, ids))[0] for o, ids in replies]
    items = [(engine.chat_prompt(o.messages), list(ids), o.params) for o, ids in replies]
    return [to_fixed(score_reply(s).calibrated) for s in await batch(items)]


# --------------------------------------------------------------------------- the driver


class RpcError(Exception):
    """The verifier's RPC did not answer as expected."""


class AuditDriver:
    """Runs an :class:`Auditor` against one verifier's CometBFT RPC (``rpc_address``), with
    ``client`` (the verifier's user node's anonymous client) and ``engine`` (its audit model).

    ``rpc`` (default :func:`overlay.committee.rpc_call`) is injectable for tests."""

    def __init__(self, auditor: Auditor, rpc_address: str, client: AnonClient, engine: Engine, *,
                 rpc: Any = None, poll: float = POLL_S, challenge_timeout: float = CHALLENGE_TIMEOUT_S) -> None:
        from overlay.committee import rpc_call

        self.auditor = auditor
        self.address = rpc_address
        self.client = client
        self.engine = engine
        self.rpc = rpc or rpc_call
        self.poll = poll
        self.challenge_timeout = challenge_timeout
        self.submitted: list[tuple[str, int, str]] = []  # (what, code, log) for tests and stats

    async def query(self, path: str) -> tuple[bytes, int]:
        """``abci_query path`` on the verifier: ``(value, height)``; :class:`RpcError` for a non-zero code."""
        res = await self.rpc(self.address, "abci_query", {"path": f'"{path}"'})
        try:
            resp = res["response"]
            code = int(resp.get("code", 0))
            value = base64.b64decode(resp.get("value") or "", validate=True)
            height = int(resp.get("height", 0))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise RpcError(f"{self.address} answered abci_query {path} oddly ({exc!r})") from None
        if code:
            raise RpcError(f"{self.address} answered {path} with code {code}: {str(resp.get('log', ''))[:200]}")
        return value, height

    async def broadcast(self, sub: Submit) -> None:
        """``broadcast_tx_sync``; a refusal (CheckTx code) is final, a network error is retried at the
        next plan."""
        from overlay.committee import ListError

        try:
            res = await self.rpc(self.address, "broadcast_tx_sync", {"tx": "0x" + sub.raw.hex()})
            code, why = int(res.get("code", 0)), str(res.get("log", ""))[:300]
        except (OSError, ListError, ValueError, TypeError, AttributeError) as exc:
            log.warning("audit: %s not submitted to %s (will retry): %s", sub.what, self.address, exc)
            self.auditor.submitted(sub.key, retry=True)
            return
        self.submitted.append((sub.what, code, why))
        if code:
            log.warning("audit: the committee refused the %s: code %d: %s", sub.what, code, why)
        else:
            log.info("audit: submitted the %s", sub.what)
        self.auditor.submitted(sub.key, retry=False)

    async def step(self, nursery: trio.Nursery) -> None:
        """One poll: read the view, start what the planner asks (in ``nursery``)."""
        raw, height = await self.query("/audit")
        view = parse_view(raw)
        for action in self.auditor.plan(view, height):
            nursery.start_soon(self._run_action, action, view)

    async def run(self) -> None:
        """Poll forever; a failed poll is logged and retried."""
        from overlay.committee import ListError

        last_error = ""
        async with trio.open_nursery() as nursery:
            while True:
                try:
                    await self.step(nursery)
                    last_error = ""
                except (OSError, ListError, RpcError, AuditViewError) as exc:
                    if str(exc) != last_error:  # once per distinct error, not once a second
                        log.warning("audit: could not read /audit from %s: %s", self.address, exc)
                    last_error = str(exc)
                await trio.sleep(self.poll)

    async def _run_action(self, action: Action, view: AuditView) -> None:
        try:
            if isinstance(action, Submit):
                await self.broadcast(action)
            elif isinstance(action, RunChallenges):
                await self._lead(action, view)
            elif isinstance(action, Attest):
                await self._attest(action)
            else:
                await self._confirm(action)
        except Exception:  # noqa: BLE001 - an audit step must never stop the verifier
            log.exception("audit: %s failed", type(action).__name__)

    async def _challenge(self, job: ChallengeJob) -> ChallengeResult:
        if job.opening is None:
            return ChallengeResult(job, Failure("other", job.why))
        outcome = await send_challenge(self.client, job.node_id, job.opening, timeout=self.challenge_timeout)
        if isinstance(outcome, Failure):
            log.warning("audit: challenge %d to model node %s: %s", job.index, short_id(job.node_id), outcome.reason)
            return ChallengeResult(job, outcome)
        try:
            score, raw = await score_tokens(self.engine, job.opening, outcome.token_ids)
        except ValueError as exc:  # ScoringError: nothing to score
            return ChallengeResult(job, Failure("empty", str(exc)))
        log.info("audit: model node %s answered challenge %d: %d tokens, C = %.3f", short_id(job.node_id),
                 job.index, len(outcome.token_ids), score / 1e6)
        return ChallengeResult(job, outcome, score, raw)

    async def _lead(self, action: RunChallenges, view: AuditView) -> None:
        results: list[ChallengeResult] = []

        async def one(job: ChallengeJob) -> None:
            results.append(await self._challenge(job))

        log.info("audit: leading epoch %d: %d challenges", action.epoch, len(action.jobs))
        async with trio.open_nursery() as nursery:
            for job in action.jobs:
                nursery.start_soon(one, job)
        await self.broadcast(self.auditor.report(action.epoch, results))

    async def _attest(self, action: Attest) -> None:
        from verifier.audit_tx import EpochReport, decode_audit_tx, report_hash

        raw, _ = await self.query("/audit/report")
        if report_hash(raw) != action.report_hash:
            log.info("audit: the report of epoch %d changed under us; attesting at the next poll", action.epoch)
            self.auditor.submitted(("attest", action.epoch, action.report_hash), retry=True)
            return
        report = decode_audit_tx(raw, self.auditor.chain_id)
        if not isinstance(report, EpochReport):
            raise RpcError("/audit/report is not an EpochReport")
        try:
            scores = await score_many(self.engine, [(e.opening, e.token_ids()) for e in report.replies()])
        except (ValueError, EngineError) as exc:
            log.warning("audit: cannot score the report of epoch %d: %s; not attesting", action.epoch, exc)
            return
        proposed = [e.score for e in report.replies()]
        spread = max((abs(a - b) for a, b in zip(scores, proposed, strict=True)), default=0)
        log.info("audit: attesting the report of epoch %d: scores %s, the leader's %s (largest difference %d "
                 "millionths)", action.epoch, scores, proposed, spread)
        await self.broadcast(self.auditor.attestation(action.epoch, action.report_hash, scores))

    async def _confirm(self, action: ConfirmSilence) -> None:
        outcome = await send_challenge(self.client, action.node_id, action.opening, timeout=self.challenge_timeout)
        answered = isinstance(outcome, Reply)
        log.info("audit: silence check of model node %s in epoch %d: %s", short_id(action.node_id), action.epoch,
                 "answered" if answered else outcome.reason if isinstance(outcome, Failure) else "")
        await self.broadcast(self.auditor.silence(action.epoch, action.node_id, answered))


# --------------------------------------------------------------------------- inside `gentorrent verifier --audit`


@dataclass(frozen=True, slots=True)
class AuditSettings:
    """``gentorrent verifier --audit`` flags: the audit model (id or GGUF path), the user node's
    listen address and region, llama.cpp threads."""

    model: str | None = None
    listen: str = "127.0.0.1:0"
    region: str = "default"
    threads: int = 1
    poll: float = POLL_S
    tamper: Callable[[Any], Any] | None = None  # TESTS ONLY (in-process): see Auditor.tamper


async def run_audits(data_dir: Path, settings: AuditSettings, seed: bytes) -> None:
    """The audit loop of ``gentorrent verifier --audit`` (never returns; never raises: a failure is
    logged and the loop starts again after :data:`RESTART_S`; the model is loaded once)."""
    engine = None
    try:
        while True:
            try:
                if engine is None:
                    engine = await trio.to_thread.run_sync(_engine, settings)
                await _run_audits_once(data_dir, settings, seed, engine)
            except Exception as exc:  # noqa: BLE001 - never crash the verifier
                log.error("audit: the audit loop failed (%s: %s); starting it again in %g s",
                          type(exc).__name__, exc, RESTART_S,
                          exc_info=not isinstance(exc, (OSError, ValueError, EngineError)))
            await trio.sleep(RESTART_S)
    finally:
        if engine is not None:
            engine.close()


def _engine(settings: AuditSettings) -> Any:
    from model_node.llama import LlamaCppEngine, resolve_model

    model_id, path = resolve_model(settings.model)
    # 4 sequences: a report's replies are rescored side by side (score_batch); 2,048 tokens each
    # (the model nodes' default window; ~190 MB of KV cache for SmolLM2).
    # score_fresh: every reply is evaluated from scratch, so every verifier computes the same scores
    # whatever its engine scored before (reused cached prefixes changed them: model_node/llama.py).
    return LlamaCppEngine(path, model_id=model_id, n_threads=settings.threads, slots=4, n_ctx=2048,
                          score_fresh=True)


async def _run_audits_once(data_dir: Path, settings: AuditSettings, seed: bytes, engine: Any) -> None:
    from overlay.committee import load_genesis
    from overlay.identity import load_or_create
    from overlay.membership import CommitteeSettings, Membership, node_entry
    from overlay.registry import Registry
    from overlay.transport import TLSTransport
    from overlay.usernode import UserNode
    from verifier.cometbft import get_toml, home_of

    home = home_of(data_dir)
    chain_id, validators = load_genesis(str(home / "config" / "genesis.json"))
    rpc_address = get_toml((home / "config" / "config.toml").read_text(), "rpc", "laddr").removeprefix("tcp://")
    identity = load_or_create(data_dir / "audit-user")
    registry = Registry(0, [])
    user = UserNode(identity, TLSTransport(identity), registry, region=settings.region, registered_only=True)
    assert user.client is not None
    host, _, port = settings.listen.rpartition(":")
    auditor = Auditor(seed, chain_id, engine.model, ChallengeGenerator(rng=random.SystemRandom()),
                      tamper=settings.tamper)
    driver = AuditDriver(auditor, rpc_address, user.client, engine, poll=settings.poll)
    async with trio.open_nursery() as nursery:
        address = await nursery.start(user.serve, host.strip("[]"), int(port))
        member = Membership(CommitteeSettings((rpc_address,), chain_id, validators), identity, registry,
                            on_update=lambda _: user.directory_changed())
        user.on_unlisted = member.poke
        await nursery.start(member.run, node_entry(identity, address, settings.region))
        log.info("audit: user node %s registered at %s with the committee at %s; auditing model %s",
                 short_id(identity.node_id), address, rpc_address, engine.model)
        await driver.run()
