"""The audit protocol's epoch core on the committee chain (issue 14 items 2, 4, 5; docs/committee.md "Audits").

I/O-free and deterministic: an immutable :class:`AuditState` and pure functions that take one
audit transaction (:func:`take`) or end one block (:func:`end_block`) at a height and return the
next state, or raise :class:`verifier.tx.TxError` with a code and a reason. No clock, no float, no
dependence on dict order: every verifier that applies the same blocks holds the same bytes
(:meth:`AuditState.canonical_bytes`, part of the app hash).

Epochs. With ``E`` = ``epoch_blocks``, epoch ``e`` is heights ``[e*E + 1, (e+1)*E]``. Its seed is
the hash of block ``e*E`` (the last block of epoch ``e-1``); ``seed(0)`` = SHA-256(chain id).

- **Leader.** VRF proofs for ``e`` (:class:`verifier.audit_tx.VrfProof`) are taken in the first
  :data:`PROOF_BLOCKS` blocks of the epoch (later ones: LATE). At the end of the last of them the
  leader is :func:`verifier.vrf.leader_for_epoch` over the current validators' powers; None when no
  proof came (the epoch then has no audit).
- **Challenges for e+1.** One :class:`~verifier.audit_tx.ChallengeCommit` by the leader of ``e``, in
  ``e``, after the proof window. The node set is the app's (:func:`audit_nodes`): every registered
  model node serving the audit model, ordered by BLAKE2b(seed(e) || node id), the first
  :data:`~verifier.audit_tx.MAX_AUDITED_NODES`; each exactly ``k`` challenges in a row, distinct
  commitments, one sealed box per current validator.
- **Report for e.** One :class:`~verifier.audit_tx.EpochReport` by the leader of ``e`` after the
  proof window. A report that breaks the format or comes from another key is refused. A report
  from the leader whose content is wrong is taken into the block and ABORTS the epoch with the
  reason (it is signed evidence): a missing, extra or reordered entry (a skipped node), an
  opening that does not match its commitment (a swapped prompt), a reply whose hash chain or
  signature does not verify against the node's registered key (an altered reply, or a reply to
  another prompt), a prompt reused by this same leader as committer. Void entries (not counted,
  noted in the outcome): a node no longer registered as a model node, an opening for another model
  than the audit model, or a reused prompt that another validator committed.
- **Attestations.** Each validator once, for the current report's hash, one score per reply entry
  (void ones included, in order): it agrees when each of its scores for a counted entry is within
  ``tolerance`` of the leader's proposed score. The report is the leader's
  own agreeing attestation. When agreeing power exceeds 2/3 of the total and the report holds no
  silent entry, the reputation update applies at once, in that block. Each counted reply's score
  that applies is the power-weighted lower median of the agreeing attestations' scores, the
  leader's proposal among them, not the proposal itself: a leader cannot shift a score within
  the tolerance while the honest verifiers, who compute identical scores, hold at least half of
  the agreeing power.
- **Silence.** :class:`~verifier.audit_tx.SilenceConfirm` once per validator per node the report
  calls silent. At the epoch's last block: any silent node that validators with more than 2/3 of
  the power got an answer from aborts the epoch (the leader lied); otherwise, with agreement, the
  update applies with score 0 for each silent entry of a node that more than 1/3 confirmed
  silent; unconfirmed silent entries are ignored.
- **End.** At the epoch's last block an epoch still open aborts (no challenges, no leader, no
  report, or no agreement; reason recorded). The last :data:`OUTCOMES` outcomes and the prompt
  keys revealed in the last :data:`PROMPT_EPOCHS` epochs are kept.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import msgpack

from overlay import crypto
from overlay.signing import ReplyVerifyError
from verifier import audit_tx as at
from verifier import vrf
from verifier.reputation import NodeReputation, ReputationTable
from verifier.tx import MAX_MODEL_ID, ROLE_MODEL, Code, TxError, pack

PROOF_BLOCKS = 5
TOLERANCE = 20_000  # 0.02 in fixed point: an attested score agrees within this of the proposed one
OUTCOMES = 16
PROMPT_EPOCHS = 64
DEFAULT_MODEL = "smollm2-135m-instruct"
DEFAULT_EPOCH_BLOCKS = 120
DEFAULT_CHALLENGES_PER_NODE = 3
MIN_EPOCH_BLOCKS = PROOF_BLOCKS + 3  # room for a commit and a report after the proof window
MAX_EPOCH_BLOCKS = 1_000_000
MAX_REASON = 300
_ORDER_PERSON = b"gt-audit-order"

OPEN, APPLIED, ABORTED = "open", "applied", "aborted"
_STATUSES = (OPEN, APPLIED, ABORTED)
# Kinds of a report entry as the state keeps it
E_REPLY, E_SILENT, E_VOID, E_VOID_SILENT = 0, 1, 2, 3  # void: not counted (a reply / a silent entry)


class AuditParamsError(ValueError):
    """The genesis audit section is malformed; the message says which field and what it takes."""


@dataclass(frozen=True, slots=True)
class AuditParams:
    """The audit's parameters, fixed at genesis (``app_state.audit``)."""

    model: str = DEFAULT_MODEL
    epoch_blocks: int = DEFAULT_EPOCH_BLOCKS
    challenges_per_node: int = DEFAULT_CHALLENGES_PER_NODE
    tolerance: int = TOLERANCE

    def __post_init__(self) -> None:
        if type(self.model) is not str or not 0 < len(self.model.encode()) <= MAX_MODEL_ID \
                or not self.model.isprintable() or " " in self.model:
            raise AuditParamsError(f"audit model must be a model id of 1-{MAX_MODEL_ID} printable characters")
        if type(self.epoch_blocks) is not int or not MIN_EPOCH_BLOCKS <= self.epoch_blocks <= MAX_EPOCH_BLOCKS:
            raise AuditParamsError(f"epoch_blocks must be an integer {MIN_EPOCH_BLOCKS}..{MAX_EPOCH_BLOCKS}")
        if type(self.challenges_per_node) is not int \
                or not 1 <= self.challenges_per_node <= at.MAX_CHALLENGES_PER_NODE:
            raise AuditParamsError(f"challenges_per_node must be 1..{at.MAX_CHALLENGES_PER_NODE}")
        if type(self.tolerance) is not int or not 0 <= self.tolerance <= 1_000_000:
            raise AuditParamsError("tolerance must be a fixed-point integer 0..1000000")

    def to_wire(self) -> list[Any]:
        return [self.model, self.epoch_blocks, self.challenges_per_node, self.tolerance]

    def to_json(self) -> dict[str, Any]:
        """The genesis ``app_state.audit`` object."""
        return {"model": self.model, "epoch_blocks": self.epoch_blocks,
                "challenges_per_node": self.challenges_per_node, "tolerance": self.tolerance}

    @classmethod
    def from_json(cls, obj: Any) -> AuditParams:
        if not isinstance(obj, dict):
            raise AuditParamsError("app_state.audit must be an object {model, epoch_blocks, challenges_per_node}")
        unknown = set(obj) - {"model", "epoch_blocks", "challenges_per_node", "tolerance"}
        if unknown:
            raise AuditParamsError(f"app_state.audit has unknown keys {sorted(unknown)}")
        return cls(obj.get("model", DEFAULT_MODEL), obj.get("epoch_blocks", DEFAULT_EPOCH_BLOCKS),
                   obj.get("challenges_per_node", DEFAULT_CHALLENGES_PER_NODE), obj.get("tolerance", TOLERANCE))


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
    """How an epoch ended: ``applied`` or ``aborted``, why, and the height it was decided at."""

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


@dataclass(frozen=True, slots=True)
class AuditState:
    """The audit's part of the committee state (see the module docstring). Immutable: every
    function returns a new state (sharing what did not change)."""

    params: AuditParams
    epoch: int = 0
    seed: bytes = b""
    proofs: tuple[tuple[bytes, bytes], ...] = ()  # (validator key, VRF proof), sorted by key
    leader_known: bool = False  # the proof window has closed
    leader: bytes | None = None
    challenges: tuple[at.Challenge, ...] = ()  # this epoch's, committed in the previous one
    sealed_to: tuple[bytes, ...] = ()  # the validator keys the boxes were sealed to, in order
    committer: bytes | None = None  # who committed this epoch's challenges
    next_challenges: tuple[at.Challenge, ...] | None = None  # None: not committed yet
    next_sealed_to: tuple[bytes, ...] = ()
    report: bytes = b""  # this epoch's raw EpochReport, once taken
    report_hash: bytes = b""
    entries: tuple[tuple[bytes, int, int], ...] = ()  # per report entry: (node id, E_*, proposed score)
    # (validator key, agrees, its score per reply entry), sorted by key; the leader's are the proposed ones
    attested: tuple[tuple[bytes, bool, tuple[int, ...]], ...] = ()
    silence: tuple[tuple[bytes, bytes, bool], ...] = ()  # (node id, validator key, answered), sorted
    status: str = OPEN
    notes: tuple[str, ...] = ()  # void entries of this epoch
    outcomes: tuple[Outcome, ...] = ()  # the last OUTCOMES, oldest first
    used_prompts: tuple[tuple[int, tuple[bytes, ...]], ...] = ()  # (epoch, sorted prompt keys), last PROMPT_EPOCHS
    reputation: ReputationTable = field(default_factory=ReputationTable)

    # ------------------------------------------------------------- heights

    def start_height(self, epoch: int | None = None) -> int:
        e = self.epoch if epoch is None else epoch
        return e * self.params.epoch_blocks + 1

    def proof_until(self) -> int:
        """The last height that takes VRF proofs for the current epoch."""
        return self.start_height() + PROOF_BLOCKS - 1

    def end_height(self) -> int:
        return (self.epoch + 1) * self.params.epoch_blocks

    def epoch_of(self, height: int) -> int:
        return max(0, (height - 1) // self.params.epoch_blocks)

    # ------------------------------------------------------------- derived

    def silent_nodes(self) -> list[bytes]:
        """Nodes with a silent entry in the current report, in report order, once each."""
        out: list[bytes] = []
        for node_id, kind, _ in self.entries:
            if kind == E_SILENT and node_id not in out:
                out.append(node_id)
        return out

    def used(self) -> frozenset[bytes]:
        return frozenset(k for _, keys in self.used_prompts for k in keys)

    # ------------------------------------------------------------- encoding

    def to_wire(self) -> list[Any]:
        rep = self.reputation
        return [
            self.params.to_wire(), self.epoch, self.seed, [[k, p] for k, p in self.proofs], self.leader_known,
            self.leader, [c.to_wire() for c in self.challenges], list(self.sealed_to), self.committer,
            None if self.next_challenges is None else [c.to_wire() for c in self.next_challenges],
            list(self.next_sealed_to), self.report, self.report_hash, [list(e) for e in self.entries],
            [[k, a, list(sc)] for k, a, sc in self.attested], [list(s) for s in self.silence], self.status, list(self.notes),
            [o.to_wire() for o in self.outcomes], [[e, list(keys)] for e, keys in self.used_prompts],
            [[nid, r.value, list(r.window), r.epochs] for nid, r in sorted(rep.nodes.items())],
        ]

    def canonical_bytes(self) -> bytes:
        return pack(self.to_wire())

    @classmethod
    def from_wire(cls, w: Any) -> AuditState:
        """Inverse of :meth:`to_wire` (for persisted state, which the caller re-checks byte for byte);
        raises ValueError/TypeError/KeyError on a malformed one."""
        (params, epoch, seed, proofs, leader_known, leader, chs, sealed_to, committer, next_chs, next_sealed,
         report, rhash, entries, attested, silence, status, notes, outcomes, used, rep) = w
        if status not in _STATUSES:
            raise ValueError(f"unknown epoch status {status!r}")

        def challenges(raw: list[Any]) -> tuple[at.Challenge, ...]:
            return tuple(at.Challenge(bytes(n), bytes(c), tuple(bytes(s) for s in sealed)) for n, c, sealed in raw)

        table = ReputationTable(nodes={bytes(nid): NodeReputation(int(v), tuple(bool(a) for a in win), int(n))
                                       for nid, v, win, n in rep})
        return cls(
            params=AuditParams(*params), epoch=epoch, seed=bytes(seed),
            proofs=tuple((bytes(k), bytes(p)) for k, p in proofs), leader_known=bool(leader_known),
            leader=None if leader is None else bytes(leader), challenges=challenges(chs),
            sealed_to=tuple(bytes(k) for k in sealed_to), committer=None if committer is None else bytes(committer),
            next_challenges=None if next_chs is None else challenges(next_chs),
            next_sealed_to=tuple(bytes(k) for k in next_sealed), report=bytes(report), report_hash=bytes(rhash),
            entries=tuple((bytes(n), int(k), int(s)) for n, k, s in entries),
            attested=tuple((bytes(k), bool(a), tuple(int(x) for x in sc)) for k, a, sc in attested),
            silence=tuple((bytes(n), bytes(k), bool(a)) for n, k, a in silence), status=status,
            notes=tuple(str(n) for n in notes), outcomes=tuple(Outcome(*o) for o in outcomes),
            used_prompts=tuple((int(e), tuple(bytes(k) for k in keys)) for e, keys in used), reputation=table,
        )


def initial(params: AuditParams, chain_id: str) -> AuditState:
    """The audit state at genesis: epoch 0, seed SHA-256(chain id)."""
    return AuditState(params=params, seed=crypto.sha256(chain_id.encode()))


def audit_nodes(st: AuditState, nodes: Mapping[bytes, NodeRecord]) -> list[bytes]:
    """The model nodes the next commit must cover, in order: registered model nodes serving the
    audit model that are trusted (an untrusted node is not in the model list, so relays would not
    deliver a challenge to it: auditing it would only record silence), by BLAKE2b(seed || node id),
    the first :data:`~verifier.audit_tx.MAX_AUDITED_NODES`."""
    model = st.params.model
    rep = st.reputation
    ids = [n for n, rec in nodes.items() if rec.entry.role == ROLE_MODEL and rec.entry.model_id == model
           and rep.get(n).trusted(rep.params)]
    ids.sort(key=lambda n: (crypto.blake2b(st.seed + n, size=32, person=_ORDER_PERSON), n))
    return ids[:at.MAX_AUDITED_NODES]


def _powers(validators: Validators) -> dict[bytes, int]:
    return {pk: p for pk, p in validators}


def _short(key: bytes | None) -> str:
    return "none" if key is None else key.hex()[:16]


def _err(code: Code, why: str) -> TxError:
    return TxError(code, why)


def _note_reason(prefix: str, notes: Sequence[str]) -> str:
    text = prefix if not notes else f"{prefix}; " + "; ".join(notes)
    return text if len(text) <= MAX_REASON else text[:MAX_REASON - 3] + "..."


def _settle(st: AuditState, status: str, reason: str, height: int) -> AuditState:
    outcome = Outcome(st.epoch, status, reason if len(reason) <= MAX_REASON else reason[:MAX_REASON - 3] + "...",
                      height)
    return replace(st, status=status, outcomes=(*st.outcomes, outcome)[-OUTCOMES:])


def _agree_power(st: AuditState, powers: Mapping[bytes, int]) -> int:
    return sum(powers.get(k, 0) for k, agrees, _ in st.attested if agrees)


def _agreed_scores(st: AuditState, powers: Mapping[bytes, int]) -> list[int]:
    """Per reply entry (void ones included, in report order): the power-weighted lower median of
    the agreeing attestations' scores (module docstring)."""
    votes = [(powers.get(k, 0), sc) for k, agrees, sc in st.attested if agrees]
    total = sum(p for p, _ in votes)
    out = []
    for i in range(len(votes[0][1]) if votes else 0):
        acc = 0
        for score, power in sorted((sc[i], p) for p, sc in votes):
            acc += power
            if 2 * acc >= total:
                out.append(score)
                break
    return out


def _apply(st: AuditState, powers: Mapping[bytes, int], height: int) -> AuditState:
    """Apply the epoch's reputation update (agreement already established)."""
    total = sum(powers.values())
    silent_power: dict[bytes, int] = {}
    for node_id, pk, answered in st.silence:
        if not answered:
            silent_power[node_id] = silent_power.get(node_id, 0) + powers.get(pk, 0)
    scores: dict[bytes, list[int]] = {}
    ignored = 0
    agreed = iter(_agreed_scores(st, powers))
    for node_id, kind, _proposed in st.entries:
        score = next(agreed) if kind in (E_REPLY, E_VOID) else 0
        if kind == E_REPLY:
            scores.setdefault(node_id, []).append(score)
        elif kind == E_SILENT:
            if 3 * silent_power.get(node_id, 0) > total:
                scores.setdefault(node_id, []).append(0)
            else:
                ignored += 1
    table = st.reputation.apply_epoch(scores)
    reason = f"{len(scores)} node(s) scored"
    if ignored:
        reason += f", {ignored} unconfirmed silent entr{'y' if ignored == 1 else 'ies'} ignored"
    return _settle(replace(st, reputation=table), APPLIED, _note_reason(reason, st.notes), height)


def _maybe_apply_now(st: AuditState, powers: Mapping[bytes, int], height: int) -> AuditState:
    """Early apply: agreement above 2/3 and no silent entry (silence waits for the epoch's end)."""
    if st.status != OPEN or any(kind == E_SILENT for _, kind, _ in st.entries):
        return st
    if 3 * _agree_power(st, powers) > 2 * sum(powers.values()):
        return _apply(st, powers, height)
    return st


# =========================================================================== transactions


def take(st: AuditState, tx: at.AuditTx, raw: bytes, *, height: int, validators: Validators,
         nodes: Mapping[bytes, NodeRecord]) -> AuditState:
    """The state after audit transaction ``tx`` (decoded from ``raw`` by
    :func:`verifier.audit_tx.decode_audit_tx`, its own signature checked) in block ``height``;
    :class:`TxError` if the rules refuse it (the state is then unchanged)."""
    powers = _powers(validators)
    if isinstance(tx, at.VrfProof):
        return _take_proof(st, tx, height, powers)
    if isinstance(tx, at.ChallengeCommit):
        return _take_commit(st, tx, height, validators, nodes)
    if isinstance(tx, at.EpochReport):
        return _take_report(st, tx, raw, height, powers, nodes)
    if isinstance(tx, at.Attestation):
        return _take_attestation(st, tx, height, powers)
    return _take_silence(st, tx, powers)


def _epoch_is(st: AuditState, epoch: int, what: str) -> None:
    if epoch != st.epoch:
        raise _err(Code.WRONG_EPOCH, f"a {what} for epoch {epoch}; the chain is in epoch {st.epoch}")


def _validator(powers: Mapping[bytes, int], pk: bytes) -> None:
    if pk not in powers:
        raise _err(Code.NOT_VALIDATOR, f"{_short(pk)} is not a current validator")


def _take_proof(st: AuditState, tx: at.VrfProof, height: int, powers: Mapping[bytes, int]) -> AuditState:
    _epoch_is(st, tx.epoch, "VRF proof")
    if height > st.proof_until() or st.leader_known:
        raise _err(Code.LATE, f"VRF proofs for epoch {st.epoch} are taken up to height {st.proof_until()}, "
                              f"not at {height}")
    _validator(powers, tx.validator_pk)
    if any(k == tx.validator_pk for k, _ in st.proofs):
        raise _err(Code.DUPLICATE, f"validator {_short(tx.validator_pk)} already sent its proof for epoch {st.epoch}")
    try:
        vrf.verify(tx.validator_pk, vrf.leader_alpha(st.epoch, st.seed), tx.proof)
    except vrf.VrfError as exc:
        raise _err(Code.BAD_SIGNATURE, f"VRF proof of {_short(tx.validator_pk)} for epoch {st.epoch}: {exc}") from None
    return replace(st, proofs=tuple(sorted((*st.proofs, (tx.validator_pk, tx.proof)))))


def _leader_checks(st: AuditState, pk: bytes, height: int, what: str) -> None:
    if not st.leader_known or height <= st.proof_until():
        raise _err(Code.TOO_EARLY, f"a {what} before the leader of epoch {st.epoch} is known (after height "
                                   f"{st.proof_until()})")
    if st.leader is None:
        raise _err(Code.NOT_LEADER, f"epoch {st.epoch} has no leader (no valid VRF proof came in its proof window)")
    if pk != st.leader:
        raise _err(Code.NOT_LEADER, f"a {what} from {_short(pk)}; the leader of epoch {st.epoch} is "
                                    f"{_short(st.leader)}")


def _take_commit(st: AuditState, tx: at.ChallengeCommit, height: int, validators: Validators,
                 nodes: Mapping[bytes, NodeRecord]) -> AuditState:
    if tx.epoch != st.epoch + 1:
        raise _err(Code.WRONG_EPOCH, f"a challenge commit for epoch {tx.epoch}; in epoch {st.epoch} the leader "
                                     f"commits epoch {st.epoch + 1}'s challenges")
    _leader_checks(st, tx.leader_pk, height, "challenge commit")
    if st.next_challenges is not None:
        raise _err(Code.DUPLICATE, f"epoch {tx.epoch}'s challenges are already committed")
    expected = audit_nodes(st, nodes)
    k = st.params.challenges_per_node
    if len(tx.challenges) != k * len(expected):
        raise _err(Code.INVALID_FIELD, f"the commit holds {len(tx.challenges)} challenges; it must hold {k} for "
                                       f"each of the {len(expected)} audited nodes (query /audit audit_nodes_next)")
    seen: set[bytes] = set()
    for i, ch in enumerate(tx.challenges):
        want = expected[i // k]
        if ch.node_id != want:
            raise _err(Code.INVALID_FIELD, f"challenge {i} names node {ch.node_id.hex()[:8]}; the node set is the "
                                           f"app's: challenge {i} is node {want.hex()[:8]}'s ({k} per node, in "
                                           "/audit audit_nodes_next order)")
        if ch.commitment in seen:
            raise _err(Code.INVALID_FIELD, f"challenge {i} repeats a commitment; each challenge is distinct")
        seen.add(ch.commitment)
        if len(ch.sealed) != len(validators):
            raise _err(Code.INVALID_FIELD, f"challenge {i} holds {len(ch.sealed)} sealed boxes; one per validator "
                                           f"({len(validators)}) is required")
    return replace(st, next_challenges=tx.challenges, next_sealed_to=tuple(pk for pk, _ in validators))


def _report_content(st: AuditState, tx: at.EpochReport, nodes: Mapping[bytes, NodeRecord]
                    ) -> tuple[str | None, tuple[tuple[bytes, int, int], ...], tuple[str, ...], tuple[bytes, ...]]:
    """(abort reason or None, entries, notes, revealed prompt keys) of a report from the leader."""
    keys: list[bytes] = []
    entries: list[tuple[bytes, int, int]] = []
    notes: list[str] = []
    used = st.used()
    chs = st.challenges
    if len(tx.entries) != len(chs):
        return (f"the report has {len(tx.entries)} entries for {len(chs)} committed challenges "
                "(a skipped or invented entry)"), (), (), ()
    for i, (entry, ch) in enumerate(zip(tx.entries, chs, strict=True)):
        node = ch.node_id.hex()[:8]
        if entry.index != i:
            return f"entry {i} carries index {entry.index} (entries out of order)", (), (), ()
        if entry.node_id != ch.node_id:
            return (f"entry {i} names node {entry.node_id.hex()[:8]} but challenge {i} is node {node}'s "
                    "(a skipped node or entries out of order)"), (), (), ()
        rec = nodes.get(ch.node_id)
        registered = rec is not None and rec.entry.role == ROLE_MODEL
        if isinstance(entry, at.SilentEntry):
            if not registered:
                notes.append(f"entry {i} void: node {node} is no longer registered")
            entries.append((ch.node_id, E_SILENT if registered else E_VOID_SILENT, 0))
            continue
        if entry.opening.commitment() != ch.commitment:
            return f"entry {i} (node {node}): the opening does not match its commitment (a swapped prompt)", (), (), ()
        key = entry.opening.prompt_key()
        reused = key in used or key in keys
        keys.append(key)
        server = entry.served_by
        srec = nodes.get(server)
        if server != ch.node_id and (srec is None or srec.entry.role != ROLE_MODEL
                                     or srec.entry.model_id != st.params.model):
            return (f"entry {i} (node {node}): the reply names serving node {server.hex()[:8]}, which is not a "
                    "registered model node of the audited model"), (), (), ()
        if srec is not None and registered:
            try:
                entry.verify(srec.ed25519_public)
            except ReplyVerifyError:
                return (f"entry {i} (node {node}): the reply's hash chain or signature does not verify against the "
                        "serving node's registered key (an altered reply, or a reply to another prompt)"), (), (), ()
        if reused and st.committer == tx.leader_pk:
            return (f"entry {i} (node {node}): a reused prompt (key {key.hex()[:8]}), committed by this same "
                    "leader"), (), (), ()
        if reused:
            notes.append(f"entry {i} void: prompt reused by the committer {_short(st.committer)}")
        elif not registered:
            notes.append(f"entry {i} void: node {node} is no longer registered")
        elif entry.opening.model != st.params.model:
            notes.append(f"entry {i} void: the committer chose model {entry.opening.model[:40]!r}")
        else:  # the score is the serving node's: it generated the reply (the challenged one forwarded it)
            entries.append((server, E_REPLY, entry.score))
            continue
        entries.append((ch.node_id, E_VOID, entry.score))
    return None, tuple(entries), tuple(notes), tuple(keys)


def _take_report(st: AuditState, tx: at.EpochReport, raw: bytes, height: int, powers: Mapping[bytes, int],
                 nodes: Mapping[bytes, NodeRecord]) -> AuditState:
    _epoch_is(st, tx.epoch, "report")
    _leader_checks(st, tx.leader_pk, height, "report")
    if st.report:
        raise _err(Code.DUPLICATE, f"epoch {st.epoch} already has its report")
    if st.status != OPEN:
        raise _err(Code.SETTLED, f"epoch {st.epoch} is already {st.status}")
    if not st.challenges:
        raise _err(Code.CONFLICT, f"no challenges were committed for epoch {st.epoch}; there is nothing to report")
    fault, entries, notes, keys = _report_content(st, tx, nodes)
    used = st.used_prompts
    if keys:
        used = (*used, (st.epoch, tuple(sorted(set(keys)))))
    out = replace(st, report=raw, report_hash=at.report_hash(raw), used_prompts=used)
    if fault is not None:
        return _settle(out, ABORTED, f"leader {_short(tx.leader_pk)}: {fault}", height)
    proposed = tuple(sc for _, kind, sc in entries if kind in (E_REPLY, E_VOID))
    out = replace(out, entries=entries, notes=notes, attested=((tx.leader_pk, True, proposed),))
    return _maybe_apply_now(out, powers, height)


def _after_report(st: AuditState, epoch: int, what: str) -> None:
    _epoch_is(st, epoch, what)
    if not st.report:
        raise _err(Code.TOO_EARLY, f"a {what} before epoch {st.epoch}'s report")
    if st.status != OPEN:
        raise _err(Code.SETTLED, f"epoch {st.epoch} is already {st.status}")


def _take_attestation(st: AuditState, tx: at.Attestation, height: int, powers: Mapping[bytes, int]) -> AuditState:
    _after_report(st, tx.epoch, "attestation")
    if tx.report_hash != st.report_hash:
        raise _err(Code.CONFLICT, f"the attestation is for report {tx.report_hash.hex()[:16]}; epoch {st.epoch}'s "
                                  f"report is {st.report_hash.hex()[:16]}")
    _validator(powers, tx.validator_pk)
    if tx.validator_pk == st.leader:
        raise _err(Code.DUPLICATE, "the leader's report is its attestation")
    if any(k == tx.validator_pk for k, _, _ in st.attested):
        raise _err(Code.DUPLICATE, f"validator {_short(tx.validator_pk)} already attested epoch {st.epoch}")
    replies = [(kind, s) for _, kind, s in st.entries if kind in (E_REPLY, E_VOID)]
    if len(tx.scores) != len(replies):
        raise _err(Code.INVALID_FIELD, f"the attestation holds {len(tx.scores)} scores; the report has "
                                       f"{len(replies)} replies")
    tol = st.params.tolerance
    # void entries count for nothing, so their scores need not agree (a verifier may not score them)
    agrees = all(abs(a - p) <= tol for a, (kind, p) in zip(tx.scores, replies, strict=True) if kind == E_REPLY)
    out = replace(st, attested=tuple(sorted((*st.attested, (tx.validator_pk, agrees, tuple(tx.scores))))))
    return _maybe_apply_now(out, powers, height)


def _take_silence(st: AuditState, tx: at.SilenceConfirm, powers: Mapping[bytes, int]) -> AuditState:
    _after_report(st, tx.epoch, "silence confirmation")
    _validator(powers, tx.validator_pk)
    if tx.node_id not in st.silent_nodes():
        raise _err(Code.INVALID_FIELD, f"epoch {st.epoch}'s report does not call node {tx.node_id.hex()[:8]} silent")
    if any(n == tx.node_id and k == tx.validator_pk for n, k, _ in st.silence):
        raise _err(Code.DUPLICATE, f"validator {_short(tx.validator_pk)} already confirmed node "
                                   f"{tx.node_id.hex()[:8]}")
    return replace(st, silence=tuple(sorted((*st.silence, (tx.node_id, tx.validator_pk, tx.answered)))))


# =========================================================================== blocks


def _settle_at_end(st: AuditState, powers: Mapping[bytes, int], height: int) -> AuditState:
    if st.status != OPEN:
        return st
    total = sum(powers.values())
    if not st.challenges:
        why = (f"no challenges were committed for epoch {st.epoch}" if st.committer is None else
               f"the commit for epoch {st.epoch} named no model node (none served the audit model)")
        return _settle(st, ABORTED, why, height)
    if st.leader is None:
        return _settle(st, ABORTED, "no leader: no valid VRF proof in the proof window", height)
    if not st.report:
        return _settle(st, ABORTED, f"no report from the leader {_short(st.leader)}", height)
    for node_id in st.silent_nodes():
        answered = sum(powers.get(k, 0) for n, k, a in st.silence if n == node_id and a)
        if 3 * answered > 2 * total:
            return _settle(st, ABORTED, f"the leader {_short(st.leader)} called node {node_id.hex()[:8]} silent, "
                                        f"but validators with {answered} of {total} power got its answer", height)
    agreed = _agree_power(st, powers)
    if 3 * agreed <= 2 * total:
        return _settle(st, ABORTED, f"no agreement: validators with {agreed} of {total} power agreed with the "
                                    "report's scores within the tolerance (more than 2/3 needed)", height)
    return _apply(st, powers, height)


def end_block(st: AuditState, height: int, block_hash: bytes, validators: Validators) -> AuditState:
    """The state after block ``height`` (hash ``block_hash``) once its transactions ran: the leader
    is fixed after the proof window's last block, and at the epoch's last block the epoch settles
    and the next one starts with ``block_hash`` as its seed. Returns ``st`` itself when nothing
    changes (most blocks)."""
    out = st
    if not out.leader_known and height >= out.proof_until():
        claim = vrf.leader_for_epoch(_powers(validators), out.epoch, out.seed, dict(out.proofs))
        out = replace(out, leader_known=True, leader=None if claim is None else claim.pk)
    if height < out.end_height():
        return out
    if len(block_hash) != 32:
        raise ValueError(f"block {height} ends epoch {out.epoch}: its 32-byte hash (FinalizeBlock's hash) seeds the "
                         "next epoch")
    out = _settle_at_end(out, _powers(validators), height)
    nxt = max(out.epoch + 1, out.epoch_of(height + 1))  # a chain whose initial height skips epochs
    return replace(
        out, epoch=nxt, seed=block_hash, proofs=(), leader_known=False, leader=None,
        challenges=out.next_challenges or (), sealed_to=out.next_sealed_to if out.next_challenges is not None else (),
        committer=out.leader if out.next_challenges is not None else None, next_challenges=None, next_sealed_to=(),
        report=b"", report_hash=b"", entries=(), attested=(), silence=(), status=OPEN, notes=(),
        used_prompts=tuple(u for u in out.used_prompts if u[0] > nxt - PROMPT_EPOCHS),
    )


# =========================================================================== queries


def query_audit(st: AuditState, validators: Validators, nodes: Mapping[bytes, NodeRecord]) -> bytes:
    """``/audit``: the msgpack map of docs/committee.md "Audits"."""
    powers = _powers(validators)
    silent = []
    for node_id in st.silent_nodes():
        s = sum(powers.get(k, 0) for n, k, a in st.silence if n == node_id and not a)
        a = sum(powers.get(k, 0) for n, k, ans in st.silence if n == node_id and ans)
        silent.append([node_id, s, a])
    return pack({
        "epoch": st.epoch,
        "epoch_blocks": st.params.epoch_blocks,
        "start_height": st.start_height(),
        "end_height": st.end_height(),
        "seed": st.seed,
        "proof_until": st.proof_until(),
        "proofs": [k for k, _ in st.proofs],
        "leader_known": st.leader_known,
        "leader": st.leader,
        "validators": [[pk, p] for pk, p in validators],
        "challenges": [c.to_wire() for c in st.challenges],
        "sealed_to": list(st.sealed_to),
        "committer": st.committer,
        "next_committed": st.next_challenges is not None,
        "report_hash": st.report_hash or None,
        "status": st.status,
        "agree_power": _agree_power(st, powers) if st.report else 0,
        "total_power": sum(powers.values()),
        "attested": [k for k, _, _ in st.attested],
        "silent": silent,
        "outcomes": [o.to_wire() for o in st.outcomes],
        "model": st.params.model,
        "challenges_per_node": st.params.challenges_per_node,
        "tolerance": st.params.tolerance,
        "audit_nodes_next": audit_nodes(st, nodes),
    })


def query_reputation(st: AuditState) -> bytes:
    """``/reputation``: ``[[node_id, value, [window flags], epochs], ...]`` sorted by node id."""
    return pack([[nid, r.value, list(r.window), r.epochs] for nid, r in sorted(st.reputation.nodes.items())])


def decode_query(raw: bytes) -> Any:
    """A query answer decoded (bytes stay bytes): for clients and tests."""
    return msgpack.unpackb(raw, raw=False, strict_map_key=False)
