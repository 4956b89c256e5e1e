"""The audit's part of the committee state (decision 0013; docs/committee.md "Audits").

I/O-free and deterministic: an immutable :class:`AuditState` and pure functions that take one
audit transaction (:func:`take`) or end one block (:func:`end_block`) at a height and block time
and return the next state, or raise :class:`overlay.directory.registration.TxError` with a code and a reason. No
clock but the block time CometBFT hands every validator alike, no float, no dependence on dict
order: every verifier that applies the same blocks holds the same bytes
(:meth:`AuditState.canonical_bytes`, part of the app hash).

Epochs. With ``E`` = ``epoch_blocks``, epoch ``e`` is heights ``[e*E + 1, (e+1)*E]``; its seed is
the hash of block ``e*E`` (``seed(0)`` = SHA-256(chain id)) and orders the nodes in ``/audit``.

- **Commit window** (the first :data:`COMMIT_BLOCKS` blocks): each validator may take one
  :class:`~verifier.audit.tx.PlanCommit`: a hash of its secret plan and the models it holds. Its
  latest declaration is kept across epochs: a model is *audited* while validators holding it
  have more than 2/3 of the power (:func:`audited_models`).
- **Send window**: the validators send their own challenges; nothing happens on the chain.
- **Report window** (the last ``max(3, min(20, E // 6))`` blocks): each validator that committed may take
  one :class:`~verifier.audit.tx.AuditReport` revealing its plan. Refused (state unchanged) unless
  the plan matches the commit's hash, entries come grouped by node id, ascending, exactly
  ``challenges_per_node`` per node, every opening is for a model the commit declared, no prompt
  repeats within the report, and every reply verifies against its serving node's registered key.
  Entries whose node is no longer a registered model node of that model, whose prompt was
  revealed in the last :data:`PROMPT_EPOCHS` epochs, or whose forwarded reply's signer is no
  longer a registered model node of that model, are void (not counted). A reply signed outside
  ``[commit time − SKEW_S, report time + SKEW_S]`` counts as no answer (the paper's timestamp
  check: a precomputed or replayed reply is not an answer to this epoch's challenge).
- **Transcript scores** (the report window, after the validator's report): each validator may
  take one :class:`~verifier.audit.tx.TranscriptScores`, its scores of users' transcripts that
  count (decision 0015), per node that signed the replies; nodes that are not registered model
  nodes are void. They are kept apart from the challenges' tallies: pooled, a few good
  transcripts would hide bad answers to challenges (the bench measured it), and a node silent to
  every challenge would be scored on its users' transcripts instead of missing the epoch.
- **Epoch end** (its last block), per node with counted entries: the reporters are the
  validators with counted entries for it. Reporting power not above 2/3 of the total: the node
  was not audited this epoch. Otherwise, when the reporters that got at least one answer hold
  more than half of the reporting power, ``C(T)`` is the power-weighted median of their per-node
  means (:func:`_median`) and the reputation rule applies; else the node missed the epoch, and
  :data:`MISS_LIMIT` missed epochs in a row score 0. A node answers for what it returns: a
  forwarded reply counts for the challenged node. Where validators holding more than 2/3 of the
  power gave at least :data:`MIN_TRANSCRIPTS` transcript scores each for the node, the
  power-weighted median of their transcript means
  is a second ``C``, and the node's epoch scores the lower of the two (:func:`node_epoch`); with
  no challenge outcome (not audited by challenges) the transcripts' ``C`` alone.

With Byzantine validators below 1/3 of the power, honest ones hold more than half of any
reporting power above 2/3, so the median lies within the honest verifiers' own measurements
whatever the others report; one node's outcome never depends on another's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import msgpack

from overlay.anon.signing import ReplyVerifyError
from overlay.directory import transcripts as tw
from overlay.directory.registration import MAX_MODEL_ID, Code, TxError, pack
from overlay.wire import crypto
from overlay.wire.constants import ROLE_MODEL
from verifier.audit import tx as at
from verifier.audit.reputation import NodeReputation, ReputationTable

COMMIT_BLOCKS = 3
MIN_REPORT_BLOCKS = 3
MAX_REPORT_BLOCKS = 20  # enough for every report to land; a longer window is a span no challenge is sent in
MIN_EPOCH_BLOCKS = 12  # room for a commit window, a send window and a report window
MAX_EPOCH_BLOCKS = 1_000_000
DEFAULT_EPOCH_BLOCKS = 900  # 15 minutes at 1-s blocks: as long as a user's path lives (decisions 0024, 0026)
DEFAULT_CHALLENGES_PER_NODE = 4  # per verifier: with 4 verifiers a node answers 16 challenges an epoch
SKEW_S = 60  # clock skew allowed between a node's signing time and the block times
MISS_LIMIT = 3
MIN_TRANSCRIPTS = 4  # transcript scores a validator needs for a node before they vote (decision 0015)
OUTCOMES = 16
PROMPT_EPOCHS = 64
REVEALED_PATH = "/audit/revealed/"  # + the epoch in decimal: query_revealed
MAX_REASON = 300
_ORDER_PERSON = b"gt-audit-order"

APPLIED, EMPTY = "applied", "empty"


class AuditParamsError(ValueError):
    """The genesis audit section is malformed; the message says which field and what it takes."""


@dataclass(frozen=True, slots=True)
class AuditParams:
    """The audit's parameters, fixed at genesis (``app_state.audit``). ``reply_window_s``: how long
    after its commitment a donated request's reply may be signed and still count; it sets when
    withheld commitments are released and how long epochs must be for model nodes to hand them in
    (:func:`overlay.directory.transcripts.close_after_s`, decision 0040)."""

    epoch_blocks: int = DEFAULT_EPOCH_BLOCKS
    challenges_per_node: int = DEFAULT_CHALLENGES_PER_NODE
    reply_window_s: int = tw.DEFAULT_REPLY_WINDOW_S

    def __post_init__(self) -> None:
        if type(self.epoch_blocks) is not int or not MIN_EPOCH_BLOCKS <= self.epoch_blocks <= MAX_EPOCH_BLOCKS:
            raise AuditParamsError(f"epoch_blocks must be an integer {MIN_EPOCH_BLOCKS}..{MAX_EPOCH_BLOCKS}")
        if type(self.challenges_per_node) is not int \
                or not 1 <= self.challenges_per_node <= at.MAX_CHALLENGES_PER_NODE:
            raise AuditParamsError(f"challenges_per_node must be 1..{at.MAX_CHALLENGES_PER_NODE}")
        if type(self.reply_window_s) is not int \
                or not tw.MIN_REPLY_WINDOW_S <= self.reply_window_s <= tw.MAX_REPLY_WINDOW_S:
            raise AuditParamsError(f"reply_window_s must be an integer {tw.MIN_REPLY_WINDOW_S}.."
                                   f"{tw.MAX_REPLY_WINDOW_S} (seconds)")

    def report_blocks(self) -> int:
        return max(MIN_REPORT_BLOCKS, min(MAX_REPORT_BLOCKS, self.epoch_blocks // 6))

    def reply_window_ms(self) -> int:
        return self.reply_window_s * 1000

    def to_wire(self) -> list[Any]:
        """The state's encoding; the default reply window is left out, so a chain from before
        decision 0040 keeps its bytes (and app hash)."""
        head = [self.epoch_blocks, self.challenges_per_node]
        return head if self.reply_window_s == tw.DEFAULT_REPLY_WINDOW_S else [*head, self.reply_window_s]

    def to_json(self) -> dict[str, Any]:
        """The genesis ``app_state.audit`` object."""
        return {"epoch_blocks": self.epoch_blocks, "challenges_per_node": self.challenges_per_node,
                "reply_window_s": self.reply_window_s}

    @classmethod
    def from_json(cls, obj: Any) -> AuditParams:
        if not isinstance(obj, dict):
            raise AuditParamsError("app_state.audit must be an object {epoch_blocks, challenges_per_node, "
                                   "reply_window_s}")
        unknown = set(obj) - {"epoch_blocks", "challenges_per_node", "reply_window_s"}
        if unknown:
            raise AuditParamsError(f"app_state.audit has unknown keys {sorted(unknown)} (a genesis from before "
                                   "decision 0013 named a model and a tolerance: verifiers now declare their models)")
        return cls(obj.get("epoch_blocks", DEFAULT_EPOCH_BLOCKS),
                   obj.get("challenges_per_node", DEFAULT_CHALLENGES_PER_NODE),
                   obj.get("reply_window_s", tw.DEFAULT_REPLY_WINDOW_S))


def params_from_app_state(app_state: bytes) -> AuditParams | None:
    """The audit parameters in a genesis ``app_state`` (JSON bytes, as InitChain passes them);
    None when it is empty or has no ``audit`` section (audits off). :class:`AuditParamsError` if bad."""
    if not app_state.strip():
        return None
    try:
        doc = json.loads(app_state)
    except ValueError:
        raise AuditParamsError("the genesis app_state is not JSON") from None
    if doc is None:
        return None
    if not isinstance(doc, dict):
        raise AuditParamsError("the genesis app_state must be a JSON object")
    return None if "audit" not in doc else AuditParams.from_json(doc["audit"])


@dataclass(frozen=True, slots=True)
class Outcome:
    """How an epoch ended: ``applied`` (some node scored or missed) or ``empty``, why, and when."""

    epoch: int
    status: str
    reason: str
    height: int

    def to_wire(self) -> list[Any]:
        return [self.epoch, self.status, self.reason, self.height]


class _EntryView(Protocol):
    @property
    def role(self) -> int: ...

    @property
    def model_id(self) -> str: ...


class NodeRecord(Protocol):
    """What the core reads of a registered node (``verifier.app.Record`` is one)."""

    @property
    def ed25519_public(self) -> bytes: ...

    @property
    def entry(self) -> _EntryView: ...


Validators = Sequence[tuple[bytes, int]]  # (Ed25519 public key, power), in the committee's order
Tally = tuple[bytes, tuple[int, ...]]  # (node id, scores of its counted answered entries); () = none answered


@dataclass(frozen=True, slots=True)
class Plan:
    """A validator's commit this epoch: the models it holds, its plan hash, the block time."""

    validator: bytes
    models: tuple[str, ...]
    plan_hash: bytes
    time_s: int


@dataclass(frozen=True, slots=True)
class AuditState:
    """The audit's part of the committee state (see the module docstring). Immutable: every
    function returns a new state (sharing what did not change)."""

    params: AuditParams
    epoch: int = 0
    seed: bytes = b""
    plans: tuple[Plan, ...] = ()  # this epoch's commits, sorted by validator key
    reports: tuple[tuple[bytes, tuple[Tally, ...]], ...] = ()  # (validator, tallies by node id), sorted
    declared: tuple[tuple[bytes, tuple[str, ...]], ...] = ()  # each validator's latest models, sorted
    misses: tuple[tuple[bytes, int], ...] = ()  # (node id, missed epochs in a row), sorted
    outcomes: tuple[Outcome, ...] = ()  # the last OUTCOMES, oldest first
    used_prompts: tuple[tuple[int, tuple[bytes, ...]], ...] = ()  # (epoch, sorted prompt keys), last PROMPT_EPOCHS
    reputation: ReputationTable = field(default_factory=ReputationTable)
    transcripts: tuple[tuple[bytes, tuple[Tally, ...]], ...] = ()  # (validator, transcript scores by node), sorted

    # ------------------------------------------------------------- heights

    def start_height(self, epoch: int | None = None) -> int:
        e = self.epoch if epoch is None else epoch
        return e * self.params.epoch_blocks + 1

    def commit_until(self) -> int:
        """The last height that takes plan commits for the current epoch."""
        return self.start_height() + COMMIT_BLOCKS - 1

    def report_from(self) -> int:
        """The first height that takes reports for the current epoch."""
        return self.end_height() - self.params.report_blocks() + 1

    def end_height(self) -> int:
        return (self.epoch + 1) * self.params.epoch_blocks

    def epoch_of(self, height: int) -> int:
        return max(0, (height - 1) // self.params.epoch_blocks)

    # ------------------------------------------------------------- derived

    def plan_of(self, validator: bytes) -> Plan | None:
        return next((p for p in self.plans if p.validator == validator), None)

    def used(self) -> frozenset[bytes]:
        return frozenset(k for _, keys in self.used_prompts for k in keys)

    @property
    def transcribed(self) -> tuple[bytes, ...]:
        """The validators whose transcript scores this epoch took."""
        return tuple(v for v, _ in self.transcripts)

    # ------------------------------------------------------------- encoding

    def to_wire(self) -> list[Any]:
        return [
            self.params.to_wire(), self.epoch, self.seed,
            [[p.validator, list(p.models), p.plan_hash, p.time_s] for p in self.plans],
            [[v, [[n, list(sc)] for n, sc in tallies]] for v, tallies in self.reports],
            [[v, list(models)] for v, models in self.declared], [list(m) for m in self.misses],
            [o.to_wire() for o in self.outcomes], [[e, list(keys)] for e, keys in self.used_prompts],
            [[nid, r.value, list(r.window), r.epochs] for nid, r in sorted(self.reputation.nodes.items())],
            [[v, [[n, list(sc)] for n, sc in tallies]] for v, tallies in self.transcripts],
        ]

    def canonical_bytes(self) -> bytes:
        return pack(self.to_wire())

    @classmethod
    def from_wire(cls, w: Any) -> AuditState:
        """Inverse of :meth:`to_wire` (for persisted state, which the caller re-checks byte for byte);
        raises ValueError/TypeError/KeyError on a malformed one."""
        params, epoch, seed, plans, reports, declared, misses, outcomes, used, rep, transcripts = w
        table = ReputationTable(nodes={bytes(nid): NodeReputation(int(v), tuple(bool(a) for a in win), int(n))
                                       for nid, v, win, n in rep})
        return cls(
            params=AuditParams(*params), epoch=int(epoch), seed=bytes(seed),
            plans=tuple(Plan(bytes(v), tuple(str(m) for m in ms), bytes(h), int(t)) for v, ms, h, t in plans),
            reports=tuple((bytes(v), tuple((bytes(n), tuple(int(x) for x in sc)) for n, sc in tallies))
                          for v, tallies in reports),
            declared=tuple((bytes(v), tuple(str(m) for m in ms)) for v, ms in declared),
            misses=tuple((bytes(n), int(c)) for n, c in misses),
            outcomes=tuple(Outcome(*o) for o in outcomes),
            used_prompts=tuple((int(e), tuple(bytes(k) for k in keys)) for e, keys in used), reputation=table,
            transcripts=tuple((bytes(v), tuple((bytes(n), tuple(int(x) for x in sc)) for n, sc in tallies))
                              for v, tallies in transcripts),
        )


def initial(params: AuditParams, chain_id: str) -> AuditState:
    """The audit state at genesis: epoch 0, seed SHA-256(chain id)."""
    return AuditState(params=params, seed=crypto.sha256(chain_id.encode()))


def _powers(validators: Validators) -> dict[bytes, int]:
    return {pk: p for pk, p in validators}


def _short(key: bytes | None) -> str:
    return "none" if key is None else key.hex()[:16]


def _err(code: Code, why: str) -> TxError:
    return TxError(code, why)


def _serves(rec: NodeRecord | None, model: str) -> bool:
    return rec is not None and rec.entry.role == ROLE_MODEL and rec.entry.model_id == model


def audited_models(st: AuditState | None, validators: Validators) -> frozenset[str]:
    """Models declared, in their latest plan commit, by current validators with more than 2/3 of
    the power (empty when audits are off)."""
    if st is None:
        return frozenset()
    powers = _powers(validators)
    total = sum(powers.values())
    held: dict[str, int] = {}
    for v, models in st.declared:
        for m in models:
            held[m] = held.get(m, 0) + powers.get(v, 0)
    return frozenset(m for m, p in held.items() if 3 * p > 2 * total)


def nodes_by_model(st: AuditState, nodes: Mapping[bytes, NodeRecord]) -> list[tuple[str, list[bytes]]]:
    """Every registered model node (any reputation) per model, models sorted, each model's nodes
    by BLAKE2b(seed || node id), the first :data:`~verifier.audit.tx.MAX_AUDITED_NODES`: the nodes
    a verifier holding the model audits this epoch."""
    by_model: dict[str, list[bytes]] = {}
    for n, rec in nodes.items():
        if rec.entry.role == ROLE_MODEL:
            by_model.setdefault(rec.entry.model_id, []).append(n)
    out = []
    for model in sorted(by_model):
        ids = sorted(by_model[model], key=lambda n: (crypto.blake2b(st.seed + n, size=32, person=_ORDER_PERSON), n))
        out.append((model, ids[:at.MAX_AUDITED_NODES]))
    return out


# =========================================================================== transactions


def take(st: AuditState, tx: at.AuditTx, raw: bytes, *, height: int, time_s: int, validators: Validators,
         nodes: Mapping[bytes, NodeRecord]) -> AuditState:
    """The state after audit transaction ``tx`` (decoded from ``raw`` by
    :func:`verifier.audit.tx.decode_audit_tx`, its own signature checked) in block ``height`` with
    block time ``time_s``; :class:`TxError` if the rules refuse it (the state is then unchanged)."""
    powers = _powers(validators)
    if tx.epoch != st.epoch:
        raise _err(Code.WRONG_EPOCH, f"a {at.KIND_NAMES[tx.KIND]} for epoch {tx.epoch}; the chain is in epoch "
                                     f"{st.epoch}")
    if tx.validator_pk not in powers:
        raise _err(Code.NOT_VALIDATOR, f"{_short(tx.validator_pk)} is not a current validator")
    if isinstance(tx, at.PlanCommit):
        return _take_commit(st, tx, height, time_s)
    if isinstance(tx, at.TranscriptScores):
        return _take_transcripts(st, tx, height, nodes)
    return _take_report(st, tx, height, time_s, nodes)


def _check_models(models: Sequence[str]) -> None:
    if not models:
        raise _err(Code.INVALID_FIELD, "a plan commit declares at least one model")
    if list(models) != sorted(set(models)):
        raise _err(Code.INVALID_FIELD, "a plan commit's models are sorted and distinct")
    for m in models:
        if not 0 < len(m.encode()) <= MAX_MODEL_ID or not m.isprintable() or " " in m:
            raise _err(Code.INVALID_FIELD, f"model {m[:40]!r}: a model id of 1-{MAX_MODEL_ID} printable characters "
                                           "without spaces")


def _take_commit(st: AuditState, tx: at.PlanCommit, height: int, time_s: int) -> AuditState:
    if height > st.commit_until():
        raise _err(Code.LATE, f"plan commits for epoch {st.epoch} are taken up to height {st.commit_until()}, "
                              f"not at {height}")
    if st.plan_of(tx.validator_pk) is not None:
        raise _err(Code.DUPLICATE, f"validator {_short(tx.validator_pk)} already committed its plan for epoch "
                                   f"{st.epoch}")
    _check_models(tx.models)
    plan = Plan(tx.validator_pk, tx.models, tx.plan_hash, time_s)
    declared = {v: ms for v, ms in st.declared}
    declared[tx.validator_pk] = tx.models
    return replace(st, plans=tuple(sorted((*st.plans, plan), key=lambda p: p.validator)),
                   declared=tuple(sorted(declared.items())))


def _check_layout(st: AuditState, tx: at.AuditReport, plan: Plan) -> None:
    """The report's shape against its commit: the plan hash, nodes grouped and ascending with
    ``challenges_per_node`` entries each, declared models, no prompt twice."""
    if tx.plan_hash() != plan.plan_hash:
        raise _err(Code.INVALID_FIELD, "the report's plan (salt, nodes, openings) does not match the hash committed "
                                       f"at the start of epoch {st.epoch}")
    k = st.params.challenges_per_node
    ids = [e.node_id for e in tx.entries]
    if len(ids) % k or any(ids[i] != ids[i - i % k] for i in range(len(ids))) \
            or any(ids[i] <= ids[i - k] for i in range(k, len(ids), k)):
        raise _err(Code.INVALID_FIELD, f"report entries come grouped by node id, ascending, exactly {k} per node")
    if len(ids) // k > at.MAX_AUDITED_NODES:
        raise _err(Code.INVALID_FIELD, f"a report covers at most {at.MAX_AUDITED_NODES} nodes")
    keys = [k for e in tx.entries for k in e.opening.prompt_keys()]
    if len(set(keys)) != len(keys):
        raise _err(Code.INVALID_FIELD, "a prompt appears twice in the report")
    for i, e in enumerate(tx.entries):
        if e.opening.model not in plan.models:
            raise _err(Code.INVALID_FIELD, f"entry {i}: model {e.opening.model[:40]!r} is not one the commit declared")


def _answers(i: int, e: at.ReportEntry, plan: Plan, time_s: int,
             nodes: Mapping[bytes, NodeRecord]) -> tuple[list[int], bool]:
    """The scores of counted entry ``i``'s replies that answer this epoch's challenge, turn by turn
    (decision 0025), and whether any of its replies is countable at all (False: void). A reply is
    not countable when its signer is no longer a registered model node of the opening's model (a
    forwarded reply: its signature cannot be checked, and the challenged node may have forwarded
    in good faith); a reply signed outside the epoch answers nothing. :class:`TxError` for a reply
    that does not verify (an honest verifier checked it on receipt: it is the reporter's lie)."""
    scores: list[int] = []
    countable = isinstance(e.outcome, at.FailOutcome)  # the last turn sent got no answer: that counts
    lo, hi = (plan.time_s - SKEW_S) * 1000, (time_s + SKEW_S) * 1000
    for turn, out in e.replies():
        server = nodes.get(out.served_by)
        if not _serves(server, e.opening.model):
            continue
        assert server is not None
        try:
            e.verify(server.ed25519_public, turn)
        except ReplyVerifyError:
            raise _err(Code.BAD_SIGNATURE, f"entry {i}: turn {turn}'s reply: its hash chain or signature does not "
                                           "verify against its serving node's registered key (an altered reply, or "
                                           "one to another prompt)") from None
        countable = True
        if lo <= out.signed_at_ms <= hi:
            scores.append(out.score)
    return scores, countable


def _take_report(st: AuditState, tx: at.AuditReport, height: int, time_s: int,
                 nodes: Mapping[bytes, NodeRecord]) -> AuditState:
    if height < st.report_from():
        raise _err(Code.TOO_EARLY, f"reports for epoch {st.epoch} are taken from height {st.report_from()}, "
                                   f"not at {height}")
    plan = st.plan_of(tx.validator_pk)
    if plan is None:
        raise _err(Code.CONFLICT, f"validator {_short(tx.validator_pk)} committed no plan for epoch {st.epoch}")
    if any(v == tx.validator_pk for v, _ in st.reports):
        raise _err(Code.DUPLICATE, f"validator {_short(tx.validator_pk)} already reported epoch {st.epoch}")
    _check_layout(st, tx, plan)
    used = st.used()
    tallies: dict[bytes, list[int]] = {}
    for i, e in enumerate(tx.entries):
        if not _serves(nodes.get(e.node_id), e.opening.model) or not used.isdisjoint(e.opening.prompt_keys()):
            continue  # void: the node left (or changed model), or a prompt was revealed before
        scores, countable = _answers(i, e, plan, time_s, nodes)
        if countable:
            tallies.setdefault(e.node_id, []).extend(scores)
    report = (tx.validator_pk, tuple((n, tuple(sc)) for n, sc in sorted(tallies.items())))
    keys = tuple(sorted({k for e in tx.entries for k in e.opening.prompt_keys()}))
    used_prompts = st.used_prompts
    if keys:
        kept = dict(used_prompts)
        kept[st.epoch] = tuple(sorted({*kept.get(st.epoch, ()), *keys}))
        used_prompts = tuple(sorted(kept.items()))
    return replace(st, reports=tuple(sorted((*st.reports, report))), used_prompts=used_prompts)


def _take_transcripts(st: AuditState, tx: at.TranscriptScores, height: int,
                      nodes: Mapping[bytes, NodeRecord]) -> AuditState:
    """A validator's transcript scores (decision 0015), by the node that signed the replies."""
    if height < st.report_from():
        raise _err(Code.TOO_EARLY, f"transcript scores for epoch {st.epoch} are taken from height "
                                   f"{st.report_from()}, not at {height}")
    if all(v != tx.validator_pk for v, _ in st.reports):
        raise _err(Code.CONFLICT, f"validator {_short(tx.validator_pk)} takes transcript scores after its audit "
                                  f"report of epoch {st.epoch}")
    if tx.validator_pk in st.transcribed:
        raise _err(Code.DUPLICATE, f"validator {_short(tx.validator_pk)} already gave transcript scores in epoch "
                                   f"{st.epoch}")
    kept = tuple((n, sc) for n, sc in tx.nodes  # ascending already (the codec's rule)
                 if (rec := nodes.get(n)) is not None and rec.entry.role == ROLE_MODEL)  # else void
    return replace(st, transcripts=tuple(sorted((*st.transcripts, (tx.validator_pk, kept)))))


# =========================================================================== blocks


def _mean(scores: Sequence[int]) -> int:
    n = len(scores)
    return (2 * sum(scores) + n) // (2 * n)


def _median(votes: Sequence[tuple[int, int]]) -> int:
    """The power-weighted median of ``(value, power)`` votes: the value at which the cumulative
    power (values ascending) first reaches half of the total, or, when it reaches exactly half
    there, the midpoint of that value and the next one (rounded half up). With the values of
    validators holding more than half of the power honest, both lie within the honest values:
    the lower median alone would be, with four equal verifiers and one liar reporting 0, the
    lowest honest verifier's mean (a devnet's honest node fell under τ that way)."""
    ordered = sorted(votes)
    total = sum(p for _, p in ordered)
    acc = 0
    for i, (value, power) in enumerate(ordered):
        acc += power
        if 2 * acc > total:
            return value
        if 2 * acc == total:
            return (value + ordered[i + 1][0] + 1) // 2
    raise ValueError("no votes")


def node_epoch(st: AuditState, node_id: bytes, powers: Mapping[bytes, int]) -> int | str | None:
    """One node's epoch: ``"missed"`` when it missed the challenges; else the lower of its
    challenges' ``C(T)`` (:func:`challenge_epoch`) and its transcripts' (:func:`transcript_epoch`),
    whichever exist; None when neither does."""
    challenges = challenge_epoch(st, node_id, powers)
    if challenges == "missed":
        return challenges
    transcripts = transcript_epoch(st, node_id, powers)
    if challenges is None or transcripts is None:
        return transcripts if challenges is None else challenges
    assert isinstance(challenges, int)
    return min(challenges, transcripts)


def transcript_epoch(st: AuditState, node_id: bytes, powers: Mapping[bytes, int]) -> int | None:
    """The power-weighted median of the transcript means of the validators that gave at least
    :data:`MIN_TRANSCRIPTS` transcript scores for ``node_id``, when they hold more than 2/3 of the
    power (so honest ones hold more than half of theirs); else None. The minimum keeps one or two
    unlucky transcripts, which a framer with a few identities can get counted, from being a node's
    whole transcript score (the bench: without it, 2 framing identities an epoch sank an honest
    node whose users donate nothing)."""
    votes = [(_mean(sc), powers.get(v, 0)) for v, t in st.transcripts
             if len(sc := dict(t).get(node_id, ())) >= MIN_TRANSCRIPTS]
    if 3 * sum(p for _, p in votes) <= 2 * sum(powers.values()):
        return None
    return _median(votes)


def challenge_epoch(st: AuditState, node_id: bytes, powers: Mapping[bytes, int]) -> int | str | None:
    """One node's epoch from the challenge reports: its ``C(T)`` (fixed point), ``"missed"``, or
    None (not audited: reporting power not above 2/3 of the total)."""
    total = sum(powers.values())
    tallies = [(powers.get(v, 0), dict(t).get(node_id)) for v, t in st.reports]
    reporting = [(p, sc) for p, sc in tallies if sc is not None]
    rpower = sum(p for p, _ in reporting)
    if 3 * rpower <= 2 * total:
        return None
    answered = [(_mean(sc), p) for p, sc in reporting if sc]
    if 2 * sum(p for _, p in answered) <= rpower:
        return "missed"
    return _median(answered)


def _settle(st: AuditState, powers: Mapping[bytes, int], height: int) -> AuditState:
    """The epoch's end: every reported node's outcome, the reputation update, the outcome record."""
    reported = sorted({n for _, t in (*st.reports, *st.transcripts) for n, _ in t})
    misses = dict(st.misses)
    scores: dict[bytes, list[int]] = {}
    n_missed = n_zero = n_skipped = 0
    for node_id in reported:
        got = node_epoch(st, node_id, powers)
        if got is None:
            n_skipped += 1
        elif got == "missed":
            n_missed += 1
            misses[node_id] = misses.get(node_id, 0) + 1
            if misses[node_id] >= MISS_LIMIT:
                scores[node_id] = [0]
                misses.pop(node_id)
                n_zero += 1
        else:
            assert isinstance(got, int)
            scores[node_id] = [got]
            misses.pop(node_id, None)
    table = st.reputation.apply_epoch(scores) if scores else st.reputation
    reason = (f"{len(scores) - n_zero} node(s) scored, {n_missed} missed"
              + (f" ({n_zero} scored 0 after {MISS_LIMIT} missed epochs in a row)" if n_zero else "")
              + (f", {n_skipped} not audited (reports from 2/3 of the power or less)" if n_skipped else "")
              + f"; {len(st.reports)} of {len(powers)} validators reported"
              + (f", {len(st.transcribed)} with transcript scores" if st.transcribed else ""))
    status = APPLIED if scores or n_missed else EMPTY
    outcome = Outcome(st.epoch, status, reason[:MAX_REASON], height)
    return replace(st, reputation=table, misses=tuple(sorted(misses.items())),
                   outcomes=(*st.outcomes, outcome)[-OUTCOMES:])


def end_block(st: AuditState, height: int, block_hash: bytes, validators: Validators) -> AuditState:
    """The state after block ``height`` (hash ``block_hash``) once its transactions ran: at the
    epoch's last block the epoch settles and the next one starts with ``block_hash`` as its seed.
    Returns ``st`` itself when nothing changes (most blocks)."""
    if height < st.end_height():
        return st
    if len(block_hash) != 32:
        raise ValueError(f"block {height} ends epoch {st.epoch}: its 32-byte hash (FinalizeBlock's hash) seeds the "
                         "next epoch")
    powers = _powers(validators)
    out = _settle(st, powers, height)
    nxt = max(out.epoch + 1, out.epoch_of(height + 1))  # a chain whose initial height skips epochs
    return replace(out, epoch=nxt, seed=block_hash, plans=(), reports=(), transcripts=(),
                   declared=tuple((v, ms) for v, ms in out.declared if v in powers),
                   used_prompts=tuple(u for u in out.used_prompts if u[0] > nxt - PROMPT_EPOCHS))


# =========================================================================== queries


def query_audit(st: AuditState, validators: Validators, nodes: Mapping[bytes, NodeRecord]) -> bytes:
    """``/audit``: the msgpack map of docs/committee.md "Audits". It says who committed and who
    reported, never what a plan holds."""
    return pack({
        "epoch": st.epoch,
        "epoch_blocks": st.params.epoch_blocks,
        "start_height": st.start_height(),
        "commit_until": st.commit_until(),
        "report_from": st.report_from(),
        "end_height": st.end_height(),
        "seed": st.seed,
        "challenges_per_node": st.params.challenges_per_node,
        "reply_window_s": st.params.reply_window_s,
        "validators": [[pk, p] for pk, p in validators],
        "total_power": sum(p for _, p in validators),
        "committed": [p.validator for p in st.plans],
        "reported": [v for v, _ in st.reports],
        "transcribed": list(st.transcribed),
        "declared": [[v, list(ms)] for v, ms in st.declared],
        "audited_models": sorted(audited_models(st, validators)),
        "nodes": [[m, ids] for m, ids in nodes_by_model(st, nodes)],
        "outcomes": [o.to_wire() for o in st.outcomes],
        "misses": [list(m) for m in st.misses],
    })


def query_revealed(st: AuditState, epoch: int) -> bytes:
    """``/audit/revealed/E``: ``[E, [prompt key, ...]]``, sorted, every user turn the reports of
    epoch ``E`` revealed (none for an epoch without reports or past :data:`PROMPT_EPOCHS`). A
    challenge carrying one of them is void until then: a verifier's planner leaves them out."""
    return pack([epoch, list(dict(st.used_prompts).get(epoch, ()))])


def query_reputation(st: AuditState) -> bytes:
    """``/reputation``: ``[[node_id, value, [window flags], epochs], ...]`` sorted by node id."""
    return pack([[nid, r.value, list(r.window), r.epochs] for nid, r in sorted(st.reputation.nodes.items())])


def decode_query(raw: bytes) -> Any:
    """A query answer decoded (bytes stay bytes): for clients and tests."""
    return msgpack.unpackb(raw, raw=False, strict_map_key=False)
