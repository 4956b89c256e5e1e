"""A verifier's audits (decision 0013; docs/committee.md "Audits: running a verifier with audits").

Every verifier audits on a secret plan of its own; the chain takes a per-node median of the
verifiers' reports (:mod:`verifier.audit.chain`). Two layers, as everywhere in this project:

- :class:`Auditor`, the **I/O-free planner**. Given this verifier's validator key, the committee's
  ``/audit`` view (:class:`AuditView`, committed state) at a height, and what it has done so far,
  :meth:`Auditor.plan` says what to do next:

  - in the epoch's commit window, a **secret plan**: for each model this verifier holds and each
    node the view lists for it, ``challenges_per_node`` fresh challenges (users' donated prompts
    first, :mod:`verifier.audit.pool`; then the operator's private prompts,
    :mod:`verifier.audit.corpus`; else the built-in generator, which is recognisable and is
    logged), entries by node id ascending, a random salt; a :class:`Submit` of the signed
    :class:`~verifier.audit.tx.PlanCommit`, which holds only the plan's salted hash and the
    models. Each challenge gets a random send height in the send window and one of the
    verifier's :data:`PERSONAS` (decision 0026), whose paths it goes over.
  - in the send window, a :class:`Send` for each challenge whose height has come. Its outcome
    comes back through :meth:`Auditor.result`: a reply (scored by this verifier's engine) is final;
    a busy, silent, lost, incomplete or error outcome is tried again later at a new random height
    of the window, at most :data:`~verifier.audit.tx.MAX_TRIES` sends in all.
  - from the report window on, a :class:`Submit` of the signed
    :class:`~verifier.audit.tx.AuditReport`: every planned entry with its reply or failure, each
    reply's score capped by the pooled significance of all this verifier's replies from its node
    this epoch (:func:`pooled_caps`, decision 0023). A
    challenge still out is waited for until :func:`grace_height` (a 256-token reply on a loaded
    node may take many blocks), then reported silent. Sends fall anywhere in the send window
    (:func:`last_send`): a narrower schedule would tell a node when challenges cannot come.

  - from the report window on, once this verifier's report is on the chain: users' transcripts
    (decision 0015; :mod:`verifier.audit.transcripts`). The book the ABCI application fills
    (``/audit/transcript_commit`` and ``/audit/transcript_reveal``, :mod:`verifier.abci_app`) is
    closed for every epoch before this one (commitments of epoch e-1 had all of epoch e to be
    revealed); a :class:`ScoreTranscripts` asks the driver to score each counted transcript of a
    model this verifier holds with its engine, caps each node's scores by its donors' sets
    (:func:`~verifier.audit.transcripts.capped_by_donor`, decision 0028), and
    :meth:`Auditor.transcript_scores` turns the scores into one signed :class:`~verifier.audit.tx.TranscriptScores` (kind 3) for the nodes
    that signed the replies (none when nothing counted). Scores of nodes with too few are held in
    the book's :class:`~verifier.audit.transcripts.ScoreCarry`, and so are scores the chain refused
    as after their epoch's end: those go out at the next report, before its round is scored
    (decision 0043). The book, carry included, is
    what ``gentorrent verifier`` keeps in ``DATA_DIR/audit-transcripts.msgpack``
    (:func:`verifier.run.book_keeper`) and takes back when it restarts.

  The plan is kept in memory and written (:meth:`Auditor.snapshot`, ``DATA_DIR/audit-plan.msgpack``,
  mode 0600) before its commit is sent, and after each outcome, so a restarted verifier reports
  the plan it committed (:meth:`Auditor.restore`); rule 9's suspect nodes go in the same file, so a
  restart does not give a suspect cheater a round without its second draw.
- :class:`verifier.audit.loop.AuditDriver`, the **thin trio driver** (its own module): it polls
  the verifier's CometBFT RPC, sends the challenges over the overlay, scores replies and users'
  transcripts with this verifier's engine and broadcasts the transactions;
  :func:`verifier.audit.loop.run_audits` runs it inside ``gentorrent verifier --audit``.

What counts as an answer: a complete reply (its last chunk ``done``) whose every chunk verified
against the signature of the node that served it. A node answers for what it returns (decision
0013 §2): a reply signed by another node (the challenged node forwarded it, Algorithm 2) counts for
the challenged node, with the signer as ``served_by``.
"""

from __future__ import annotations

import logging
import math
import os
import random
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

import msgpack

from overlay.directory import transcripts as tw
from overlay.wire import failures
from overlay.wire.identity import NODE_ID_LEN, short_id
from overlay.wire.messages import ChatMessage
from verifier.audit.chain import MAX_REPORT_BLOCKS
from verifier.audit.challenges import ChallengeGenerator

if TYPE_CHECKING:
    from verifier.audit.corpus import ChallengeCorpus
    from verifier.audit.pool import DonationPool
    from verifier.audit.transcripts import Counted, ScoreCarry, TranscriptBook
    from verifier.audit.tx import AuditReport, FailOutcome, Opening, ReplyOutcome, ReportEntry

log = logging.getLogger("gentorrent.audit")

MAX_VIEW_BYTES = 4 * 1024 * 1024
REPORT_MARGIN_BLOCKS = 2  # a report waits for challenges still out until this many blocks before the epoch's end
HELD_MARGIN_BLOCKS = 4  # and this many more when held transcript scores go out after it (decision 0043)
RETRY_KINDS = frozenset({"busy", "silent", "lost", "incomplete", "error"})  # tried again later in the window
MAX_REPORT_FIXES = 3  # a refused report with one bad entry is sent again with that entry failed, this often
PLAN_FILE = "audit-plan.msgpack"
GENERATOR_WARNING = ("challenges from the built-in generator are recognisable by a cheating node "
                     "(docs/threat-model.md); ask users to --donate-prompts, or give this verifier private "
                     "prompts with --challenge-prompts")
_PLAN_VERSION = 5  # 2: outcomes as their transaction bytes, no in-flight flag; 3: each reply's z, earlier turns;
# 4: each challenge's persona; 5: rule 9's suspects after the plan
_PLAN_VERSIONS = (2, 3, 4, 5)  # what restore takes
MAX_SUSPECTS = 4096  # suspect nodes a saved plan may carry (a node is one for at most SUSPECT_EPOCHS + 1 rounds)
OPENING_ROOM = (1024 * 1024 - 4096) // 4  # bytes a plan's openings may take of its report (tx.MAX_REPORT_BYTES)
GENERATED_OPENING_BYTES = 512  # room kept for each challenge still to plan (a generated opening takes < 400)
PERSONAS = 4  # user-like senders a verifier's challenges of an epoch are spread over, each on its own held
# paths: as many as challenges a node, at most this many (decision 0027)
_ENTRY_RE = re.compile(r"\bentry (\d+):")
SOURCES = ("donated", "corpus", "generator")  # where a challenge's prompt comes from, in the order tried


def persona_count(k: int) -> int:
    """Personas a verifier sends an epoch's challenges as, at ``k`` challenges a node: one per
    challenge up to :data:`PERSONAS` (decision 0027)."""
    return max(1, min(PERSONAS, k))


class AuditViewError(ValueError):
    """The ``/audit`` answer does not decode as the view described in docs/committee.md."""


# --------------------------------------------------------------------------- the /audit view


@dataclass(frozen=True, slots=True)
class AuditView:
    """The committee's ``/audit`` query answer (committed state), decoded strictly."""

    epoch: int
    epoch_blocks: int
    start_height: int
    commit_until: int
    report_from: int
    end_height: int
    seed: bytes
    challenges_per_node: int
    validators: tuple[tuple[bytes, int], ...]
    total_power: int
    committed: tuple[bytes, ...]
    reported: tuple[bytes, ...]
    declared: tuple[tuple[bytes, tuple[str, ...]], ...]
    audited_models: tuple[str, ...]
    nodes: tuple[tuple[str, tuple[bytes, ...]], ...]  # (model, node ids in the chain's order)
    outcomes: tuple[tuple[int, str, str, int], ...]  # (epoch, "applied"|"empty", reason, height)
    misses: tuple[tuple[bytes, int], ...]
    reply_window_s: int = tw.DEFAULT_REPLY_WINDOW_S  # the chain's (decision 0040); absent before it
    transcribed: tuple[bytes, ...] = ()  # the validators whose transcript scores this epoch took

    def nodes_of(self, model: str) -> tuple[bytes, ...]:
        return next((ids for m, ids in self.nodes if m == model), ())


def _t(value: Any, tp: type, what: str) -> Any:
    if type(value) is not tp:
        raise AuditViewError(f"/audit: {what} is {type(value).__name__}, not {tp.__name__}")
    return value


def _bytes(value: Any, what: str, size: int | None = None) -> bytes:
    b: bytes = _t(value, bytes, what)
    if size is not None and len(b) != size:
        raise AuditViewError(f"/audit: {what} has {len(b)} bytes, not {size}")
    return b


def _list(value: Any, what: str, size: int | None = None) -> list[Any]:
    out: list[Any] = _t(value, list, what)
    if size is not None and len(out) != size:
        raise AuditViewError(f"/audit: {what} has {len(out)} items, not {size}")
    return out


def _unpack(raw: bytes, path: str) -> Any:
    """The msgpack document of the ``path`` query's answer ``raw``, at most :data:`MAX_VIEW_BYTES`."""
    if len(raw) > MAX_VIEW_BYTES:
        raise AuditViewError(f"{path} answer over {MAX_VIEW_BYTES} bytes")
    try:
        return msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise AuditViewError(f"{path} answer does not decode ({exc})") from None


def parse_view(raw: bytes) -> AuditView:
    """The ``/audit`` msgpack map as an :class:`AuditView`; :class:`AuditViewError` for anything else."""
    doc = _unpack(raw, "/audit")
    if not isinstance(doc, dict):
        raise AuditViewError("/audit answer is not a map")

    def pairs(key: str, what: str) -> list[list[Any]]:
        return [_list(x, what, 2) for x in _list(doc[key], key)]

    try:
        return AuditView(
            epoch=_t(doc["epoch"], int, "epoch"),
            epoch_blocks=_t(doc["epoch_blocks"], int, "epoch_blocks"),
            start_height=_t(doc["start_height"], int, "start_height"),
            commit_until=_t(doc["commit_until"], int, "commit_until"),
            report_from=_t(doc["report_from"], int, "report_from"),
            end_height=_t(doc["end_height"], int, "end_height"),
            seed=_bytes(doc["seed"], "seed", 32),
            challenges_per_node=_t(doc["challenges_per_node"], int, "challenges_per_node"),
            validators=tuple((_bytes(k, "validator key", 32), _t(p, int, "power"))
                             for k, p in pairs("validators", "validator")),
            total_power=_t(doc["total_power"], int, "total_power"),
            committed=tuple(_bytes(k, "committed key", 32) for k in _list(doc["committed"], "committed")),
            reported=tuple(_bytes(k, "reported key", 32) for k in _list(doc["reported"], "reported")),
            declared=tuple((_bytes(k, "declaring key", 32), tuple(_t(m, str, "declared model")
                                                                  for m in _list(ms, "declared models")))
                           for k, ms in pairs("declared", "declaration")),
            audited_models=tuple(_t(m, str, "audited model") for m in _list(doc["audited_models"], "audited_models")),
            nodes=tuple((_t(m, str, "model"), tuple(_bytes(n, "node id", 20) for n in _list(ids, "node ids")))
                        for m, ids in pairs("nodes", "model's nodes")),
            outcomes=tuple((_t(o[0], int, "outcome epoch"), _t(o[1], str, "status"), _t(o[2], str, "reason"),
                            _t(o[3], int, "outcome height"))
                           for o in (_list(x, "outcome", 4) for x in _list(doc["outcomes"], "outcomes"))),
            misses=tuple((_bytes(n, "missing node", 20), _t(c, int, "misses")) for n, c in pairs("misses", "miss")),
            reply_window_s=_t(doc.get("reply_window_s", tw.DEFAULT_REPLY_WINDOW_S), int, "reply_window_s"),
            transcribed=tuple(_bytes(k, "transcribed key", 32) for k in _list(doc["transcribed"], "transcribed")),
        )
    except KeyError as exc:
        raise AuditViewError(f"/audit answer lacks {exc}") from None


def parse_revealed(raw: bytes, epoch: int) -> tuple[bytes, ...]:
    """The prompt keys of a ``/audit/revealed/E`` answer for ``epoch``
    (:func:`verifier.audit.chain.query_revealed`); :class:`AuditViewError` for anything else."""
    from verifier.audit.tx import PROMPT_KEY_LEN

    e, keys = _list(_unpack(raw, f"/audit/revealed/{epoch}"), f"/audit/revealed/{epoch} answer", 2)
    if _t(e, int, "revealed epoch") != epoch:
        raise AuditViewError(f"/audit/revealed/{epoch} answered for epoch {e}")
    return tuple(_bytes(k, "revealed prompt key", PROMPT_KEY_LEN) for k in _list(keys, "revealed prompt keys"))


# --------------------------------------------------------------------------- actions and results


@dataclass(frozen=True, slots=True)
class Submit:
    """Broadcast ``raw`` (an audit transaction); ``key`` identifies it for :meth:`Auditor.submitted`."""

    raw: bytes
    what: str
    key: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Send:
    """Send ``turn`` of challenge ``index`` of the plan of ``epoch`` (``opening``, a script) to
    ``node_id``, the node's replies to the earlier turns (``history``) in place, score the reply and
    hand the outcome to :meth:`Auditor.result`. ``attempt``: 1 for a turn's first send."""

    epoch: int
    index: int
    node_id: bytes
    opening: Opening
    attempt: int
    turn: int = 0
    history: tuple[str, ...] = ()
    persona: int = 0  # whose held paths it goes over (decision 0026)

    def messages(self) -> tuple[ChatMessage, ...]:
        """What this send asks: the script's turn with the node's own earlier replies (decision 0025)."""
        return self.opening.turn_messages(self.turn, self.history)


@dataclass(frozen=True, slots=True)
class ScoreTranscripts:
    """Score each of ``counted`` (users' transcripts that count, of models this verifier holds) with
    this verifier's engine, then hand the scores to :meth:`Auditor.transcript_scores` for ``epoch``
    (the epoch whose report window it is) and submit what it returns."""

    epoch: int
    counted: tuple[Counted, ...]
    spare: tuple[Counted, ...] = ()  # left out of the first draw: the second draws from them (rule 9)
    reserve: int = 0  # the second draw's budget


Action = Submit | Send | ScoreTranscripts


@dataclass(frozen=True, slots=True)
class Reply:
    """A complete, verified reply to a challenge: every chunk's (text, token ids) in order, the final
    chunk's signature and signing time, and the node that signed it (``served_by``: the challenged
    node, or the member of its group it forwarded the challenge to)."""

    chunks: tuple[tuple[str, tuple[int, ...]], ...]
    signature: bytes
    signed_at_ms: int
    served_by: bytes

    @property
    def token_ids(self) -> list[int]:
        return [t for _, ids in self.chunks for t in ids]


@dataclass(frozen=True, slots=True)
class Failure:
    """No usable reply: ``kind`` (one of :data:`verifier.audit.tx.FAIL_KINDS`) and the words."""

    kind: str
    detail: str

    @property
    def reason(self) -> str:
        return f"{self.kind}: {self.detail}"[:200]


#: The verdict on a challenge by the kind of its failed request (:class:`overlay.wire.failures.Failure`;
#: a challenge goes without failover, so a busy node raises ``ALL_BUSY``); any other kind: "other".
VERDICT = {
    failures.Failure.ALL_BUSY: "busy",
    failures.Failure.UNVERIFIED: "unverified",
    failures.Failure.SILENT: "silent",
    failures.Failure.LOST: "lost",
    failures.Failure.NODE_ERROR: "error",
}


# --------------------------------------------------------------------------- the plan


@dataclass(slots=True)
class Planned:
    """One planned challenge: its node, its opening, the height it goes out at, and what came of it."""

    node_id: bytes
    opening: Opening
    send_at: int
    tries: int = 0
    sending: bool = False
    outcome: ReplyOutcome | FailOutcome | None = None  # what the last turn sent got, once final
    last: str = ""  # the last failed try's kind
    replies: list[ReplyOutcome] = field(default_factory=list)  # the script's earlier turns, answered
    zs: list[float] = field(default_factory=list)  # each reply's z (0: nothing to measure), pooled at the report
    persona: int = 0  # the persona (0..PERSONAS-1) it is sent as: its paths (decision 0026)


@dataclass(slots=True)
class Plan:
    """This verifier's secret plan for one epoch (entries by node id ascending, as reported)."""

    epoch: int
    models: tuple[str, ...]
    salt: bytes
    entries: list[Planned]
    commit_until: int
    report_from: int
    end_height: int
    fixes: int = 0  # refused reports mended (MAX_REPORT_FIXES)

    def hash(self) -> bytes:
        from verifier.audit.tx import plan_hash

        return plan_hash(self.salt, [(e.node_id, e.opening.commitment()) for e in self.entries])


def last_send(commit_until: int, report_from: int) -> int:
    """The last height a challenge is sent (or sent again) at: the send window's last."""
    return max(commit_until + 1, report_from - 1)


def blocks_to_close(reply_window_s: int, block_s: float) -> int:
    """Blocks from an epoch's start to its report window that model nodes need, at ``block_s``
    seconds a block, to hand in what the previous epoch's donors withheld before the report
    closes it (:func:`overlay.directory.transcripts.close_after_s`)."""
    return math.ceil(tw.close_after_s(reply_window_s) / block_s)


def grace_height(report_from: int, end_height: int, held: bool = False) -> int:
    """Until this height a report waits for challenges still out: :data:`REPORT_MARGIN_BLOCKS`
    before the epoch's end (a devnet on 2 cores had 256-token replies arriving 10 blocks into the
    report window), so that the report still lands in the window; :data:`HELD_MARGIN_BLOCKS`
    more when ``held`` transcript scores are to go out after it (the report lands, a poll sees
    it, the scores land: decision 0043)."""
    return max(report_from, end_height - REPORT_MARGIN_BLOCKS - (HELD_MARGIN_BLOCKS if held else 0))


# --------------------------------------------------------------------------- the planner


def pooled_caps(entries: Sequence[Planned]) -> dict[bytes, int]:
    """Per node, the cap (fixed point) on its replies' scores from the ``z`` of all of them this
    epoch (:func:`verifier.audit.scoring.pooled_cap`, decision 0023); nodes with no reply are absent."""
    from verifier.audit.reputation import to_fixed
    from verifier.audit.scoring import pooled_cap
    from verifier.audit.tx import ReplyOutcome

    zs: dict[bytes, list[float]] = {}
    for e in entries:
        if e.replies or isinstance(e.outcome, ReplyOutcome):
            zs.setdefault(e.node_id, []).extend(e.zs)
    return {node: to_fixed(pooled_cap(z)) for node, z in zs.items()}


_O = TypeVar("_O", "ReplyOutcome", "FailOutcome", "ReplyOutcome | FailOutcome")


def fit_report(report: AuditReport) -> tuple[tuple[ReportEntry, ...], int, int]:
    """``report``'s entries cut to fit :data:`~verifier.audit.tx.MAX_REPORT_BYTES` once signed,
    with how many script turns were cut and how many replies dropped. A script's last turns go
    first, from the entry with the most turns (the chain takes a script that ended early, and the
    turns kept still verify); only when every entry is down to one turn are replies reported as
    failures of kind "other" (the verifier's own fault), in an order drawn from the report's secret
    salt: not the largest first, which a node could make its own replies by padding them, and so
    have them left unscored (decision 0027). Unchanged when it fits."""
    from hashlib import blake2b

    from overlay.directory.registration import pack
    from verifier.audit.tx import AUDIT_TAG, MAX_REPORT_BYTES, FailOutcome, ReportEntry, encode_tx

    def size(e: ReportEntry) -> int:
        return len(pack(e.to_wire()))

    entries = list(report.entries)
    room = MAX_REPORT_BYTES + len(AUDIT_TAG) - len(encode_tx(replace(report, entries=(), signature=bytes(64)))) - 5
    sizes = [size(e) for e in entries]
    cut = dropped = 0
    while sum(sizes) > room:
        scripts = [j for j, e in enumerate(entries) if e.earlier]
        replies = [j for j, e in enumerate(entries) if not isinstance(e.outcome, FailOutcome)]
        if scripts:  # the most turns first, then the largest
            i = max(scripts, key=lambda j: (len(entries[j].earlier), sizes[j]))
            e = entries[i]
            entries[i] = ReportEntry(e.node_id, e.opening, e.earlier[-1], e.earlier[:-1])
            cut += 1
        elif replies:  # in the salt's order, which the nodes cannot know
            i = min(replies, key=lambda j: blake2b(report.salt + entries[j].node_id + j.to_bytes(4, "big"),
                                                   digest_size=16).digest())
            e = entries[i]
            entries[i] = ReportEntry(e.node_id, e.opening, FailOutcome("other", e.outcome.tries))
            dropped += 1
        else:
            break  # nothing left to shed: openings alone overflow (a plan keeps them within OPENING_ROOM)
        sizes[i] = size(entries[i])
    return tuple(entries), cut, dropped


def capped(outcome: _O, cap: int | None) -> _O:
    """``outcome`` with its score lowered to ``cap`` where that is lower (a reply), else as it is."""
    from verifier.audit.tx import ReplyOutcome

    if cap is None or not isinstance(outcome, ReplyOutcome) or outcome.score <= cap:
        return outcome
    return replace(outcome, score=cap)


THINK_MIN_BLOCKS = 10  # a user's think time between a reply and the next turn: 10 s + Exp(45 s) (the
THINK_MEAN_BLOCKS = 45  # audit-evasion bench's users), in blocks of about a second


def think_blocks(rng: random.Random, least: int = THINK_MIN_BLOCKS, mean_extra: float = THINK_MEAN_BLOCKS) -> int:
    """Blocks between a reply and the script's next turn, drawn as a user's think time:
    ``least`` + Exp(``mean_extra``)."""
    return least + round(rng.expovariate(1.0 / mean_extra))


def _reply(raw: bytes) -> ReplyOutcome:
    from verifier.audit.tx import ReplyOutcome, decode_outcome

    out = decode_outcome(raw)
    if not isinstance(out, ReplyOutcome):
        raise ValueError("a saved earlier turn is not a reply")
    return out


def _persona(value: Any) -> int:
    if type(value) is not int or not 0 <= value < PERSONAS:
        raise ValueError(f"a persona must be 0..{PERSONAS - 1}, not {value!r}")
    return value


def _finite(value: Any) -> float:
    z = float(value)
    if not math.isfinite(z):
        raise ValueError("a saved z is not finite")
    return z


def _suspects(value: Any) -> dict[bytes, int]:
    """A saved plan's rule-9 suspects, ``[[node id, last round a suspect], ...]``, strictly."""
    if not isinstance(value, list) or len(value) > MAX_SUSPECTS:
        raise ValueError(f"suspects: a list of at most {MAX_SUSPECTS} expected")
    out: dict[bytes, int] = {}
    for node, epoch in value:
        if not isinstance(node, bytes) or len(node) != NODE_ID_LEN or type(epoch) is not int or epoch < 0:
            raise ValueError("suspects: [node id, round] pairs expected")
        out[node] = epoch
    return out


def _score_carry() -> ScoreCarry:
    from verifier.audit.transcripts import ScoreCarry

    return ScoreCarry()


@dataclass
class Auditor:
    """The I/O-free audit planner of one verifier (see the module docstring).

    ``seed``: this verifier's Ed25519 validator seed (32 bytes; CometBFT's validator key);
    ``chain_id``: the committee's; ``models``: the models this verifier holds (its engine's: it
    audits their nodes and declares them in its commits); ``generator``: the fallback prompts;
    ``pool``: users' donated prompts (drawn first); ``corpus``: the operator's private prompts
    (drawn next, :mod:`verifier.audit.corpus`); ``rng``: send heights and pool draws (a
    verifier uses :class:`random.SystemRandom`: nobody may predict them); ``urandom``: plan salts.
    ``tamper`` is a test hook (never a flag): a Byzantine verifier's edit of its report before
    signing (``AuditReport -> AuditReport``)."""

    seed: bytes
    chain_id: str
    models: tuple[str, ...]
    generator: ChallengeGenerator = field(default_factory=ChallengeGenerator)
    pool: DonationPool | None = None
    corpus: ChallengeCorpus | None = None
    rng: random.Random = field(default_factory=random.SystemRandom)
    urandom: Callable[[int], bytes] = os.urandom
    tamper: Callable[[Any], Any] | None = None  # TESTS ONLY: alters each AuditReport before it is signed
    think: tuple[int, float] = (THINK_MIN_BLOCKS, THINK_MEAN_BLOCKS)  # a script's turns apart: least + Exp(mean)
    transcripts: TranscriptBook | None = None  # users' committed transcripts (decision 0015), closed here
    transcript_budget: int | None = None  # rule 9's cost scored a round (None: ROUND_BUDGET; decision 0033)
    current: Plan | None = None
    changed: bool = False  # the plan changed since the last snapshot(): the driver writes it
    _started: set[tuple[Any, ...]] = field(default_factory=set)
    _warned: set[tuple[Any, ...]] = field(default_factory=set)
    _taken: dict[int, tuple[int, ...]] = field(default_factory=dict)  # round -> the book's rounds it is scoring
    _scores: Submit | None = None  # the latest transcript scores, handed out again after a network error
    _spent: int = -1  # the latest epoch whose one transcript-scores submission went out (or is on the chain)
    _carry: ScoreCarry = field(default_factory=_score_carry)  # scores held for the chain's minimum
    _suspected: dict[bytes, int] = field(default_factory=dict)  # node -> last round a suspect (rule 9; saved)
    _revealed: dict[int, frozenset[bytes]] = field(default_factory=dict)  # epoch -> prompt keys its reports revealed
    _revealed_all: frozenset[bytes] | None = None  # their union (None: to be made again after a change)

    def __post_init__(self) -> None:
        from overlay.wire.crypto import SigningKey

        self.public_key = SigningKey.from_bytes(self.seed).public_bytes
        self.models = tuple(sorted(set(self.models)))
        if self.transcripts is not None:  # the book's carry: saved with it, kept when the audit loop restarts
            self._carry = self.transcripts.carry

    def _sign(self, tx: Any) -> bytes:
        from verifier.audit.tx import sign_tx

        return sign_tx(tx, self.chain_id, self.seed)

    def _warn_once(self, key: tuple[Any, ...], level: int, msg: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.log(level, msg, *args)

    def _warn_short_epochs(self, view: AuditView, block_s: float) -> None:
        """Warn (once) when, at ``block_s`` seconds a block, an epoch reaches its report window
        before model nodes can hand in what framing donors withheld (:func:`blocks_to_close`)."""
        needed = blocks_to_close(view.reply_window_s, block_s)
        if view.report_from - view.start_height < needed:
            self._warn_once(("short epochs",), logging.WARNING,
                            "audit: epochs of %d blocks close before model nodes can hand in what framing donors "
                            "withheld (the release is %d s into the next epoch, the close at its report): at "
                            "the chain's %.2f s a block, epoch_blocks of about %d or more are needed, or a shorter "
                            "reply_window_s in the genesis (docs/committee.md, 'Timing')", view.epoch_blocks,
                            tw.release_delay_s(view.reply_window_s), block_s, needed + MAX_REPORT_BLOCKS)

    # ------------------------------------------------------------------ what the chain revealed

    def revealed_wanted(self, epoch: int) -> list[int]:
        """The past epochs, of the chain's last :data:`~verifier.audit.chain.PROMPT_EPOCHS` before
        ``epoch``, whose revealed prompt keys this planner does not hold (the driver reads them,
        ``/audit/revealed/E``, and hands them to :meth:`take_revealed`); older ones are forgotten."""
        from verifier.audit.chain import PROMPT_EPOCHS

        first = max(0, epoch - PROMPT_EPOCHS + 1)
        if any(not first <= e < epoch for e in self._revealed):
            self._revealed = {e: keys for e, keys in self._revealed.items() if first <= e < epoch}
            self._revealed_all = None
        return [e for e in range(first, epoch) if e not in self._revealed]

    def take_revealed(self, epoch: int, keys: Iterable[bytes]) -> None:
        """The prompt keys every report of the past ``epoch`` revealed, other verifiers' included:
        until the chain forgets them, a challenge carrying one is void, so none is planned."""
        self._revealed[epoch] = frozenset(keys)
        self._revealed_all = None

    def _is_revealed(self, key: bytes) -> bool:
        if self._revealed_all is None:  # made once an epoch, not once a lookup
            self._revealed_all = frozenset().union(*self._revealed.values())
        return key in self._revealed_all

    # ------------------------------------------------------------------ submissions

    def submitted(self, key: tuple[Any, ...], *, retry: bool) -> None:
        """A submission is over: ``retry`` (it never reached the chain: a network error) lets the
        next :meth:`plan` hand it out again while it is still due; otherwise it is not sent again."""
        if retry:
            self._started.discard(key)

    def refused(self, key: tuple[Any, ...], why: str, code: int = 0) -> None:
        """The chain refused submission ``key`` (CheckTx said ``code``, ``why``). A report refused
        for one entry (``entry N: ...``: a reply the chain cannot verify, say its serving node left
        the registry) is mended, that entry reported as failed ("unverified"), and sent again at the
        next :meth:`plan` (at most :data:`MAX_REPORT_FIXES` times). Transcript scores that came
        after their epoch ended (:attr:`Code.WRONG_EPOCH`: scoring outlasted its last blocks) go
        back to the carry, to be handed out with the next epoch's
        (:meth:`~verifier.audit.transcripts.ScoreCarry.put_back`). Anything else is final."""
        from overlay.directory.registration import Code
        from verifier.audit.tx import FailOutcome, TranscriptScores, decode_audit_tx

        if key[0] == "transcripts" and code == Code.WRONG_EPOCH and self._scores is not None \
                and self._scores.key == key:
            tx = decode_audit_tx(self._scores.raw, self.chain_id)  # what it signed, as add() handed it out
            assert isinstance(tx, TranscriptScores)
            self._carry.put_back(key[1], tx.nodes)
            self._scores = None  # put back once
            log.info("audit: the transcript scores of epoch %d came after its last block; held for the next "
                     "epoch's", key[1])
            return
        p = self.current
        m = _ENTRY_RE.search(why)
        if key[0] != "report" or p is None or key[1] != p.epoch or m is None or p.fixes >= MAX_REPORT_FIXES:
            return
        i = int(m.group(1))
        if not 0 <= i < len(p.entries):
            return
        e = p.entries[i]
        e.outcome = FailOutcome("unverified", max(1, e.tries))
        p.fixes += 1
        self.changed = True
        self._started.discard(key)
        log.warning("audit: the chain refused entry %d (node %s) of the report of epoch %d: %s; reporting it "
                    "as unverified", i, short_id(e.node_id), p.epoch, why[:200])

    # ------------------------------------------------------------------ planning

    def plan(self, view: AuditView, height: int, block_s: float | None = None) -> list[Action]:
        """What to do at ``height`` given the committed ``view``; ``block_s``: the chain's seconds a
        block as the driver measured them (None: not yet), for the short-epoch warning."""
        self._warned = {k for k in self._warned if len(k) < 2 or k[1] >= view.epoch}  # past epochs' go
        if self.public_key not in {pk for pk, _ in view.validators}:
            self._warn_once(("member", view.epoch), logging.WARNING,
                            "audit: this verifier is not a validator in epoch %d: not auditing", view.epoch)
            return []
        if self.transcripts is not None and block_s is not None:
            self._warn_short_epochs(view, block_s)
        p = self.current
        if p is not None and p.epoch < view.epoch:
            self.current = p = None
            self.changed = True
        self._started = {k for k in self._started if k[1] >= view.epoch}
        out: list[Action] = []
        if self.public_key in view.reported and height <= view.end_height:
            out.extend(self._transcripts(view))
        committed = self.public_key in view.committed
        if p is None and not committed and height < view.commit_until:
            p = self.current = self._make_plan(view)
            self.changed = True
        if p is None or p.epoch != view.epoch:
            if committed and self.public_key not in view.reported:
                self._warn_once(("lost", view.epoch), logging.ERROR,
                                "audit: this verifier committed a plan for epoch %d but no longer holds it "
                                "(%s lost?); it cannot report this epoch", view.epoch, PLAN_FILE)
            return out
        if not committed:
            if height < view.commit_until and self._once(("commit", p.epoch)):
                tx = self._commit_tx(p)
                out.append(Submit(self._sign(tx), f"plan commit of epoch {p.epoch} ({len(p.entries)} challenges "
                                                  f"to {len({e.node_id for e in p.entries})} nodes)",
                                  ("commit", p.epoch)))
            elif height >= view.commit_until:
                self._warn_once(("uncommitted", p.epoch), logging.WARNING,
                                "audit: this verifier's plan commit for epoch %d is not on the chain and its window "
                                "has closed; not auditing this epoch", p.epoch)
            return out
        if self.public_key in view.reported:
            return out
        if height < p.report_from:
            out.extend(self._sends(p, height))
            return out
        if any(e.sending for e in p.entries) \
                and height < grace_height(p.report_from, p.end_height, self._carry.ready(view.epoch)):
            return out
        if height <= p.end_height and self._once(("report", p.epoch)):
            out.append(self._report(p))
        return out

    def _transcripts(self, view: AuditView) -> list[Action]:
        """Once this verifier's report of ``view.epoch`` is on the chain: close the book's earlier
        epochs and score what counts (module docstring); the scores again after a network error."""
        epoch = view.epoch
        s = self._scores
        if s is not None and s.key[1] == epoch:
            return [s] if self._once(s.key) else []
        if self.transcripts is None or not self._once(("score", epoch)):
            return []
        from verifier.audit.transcripts import NODE_BUDGET, ROUND_BUDGET, SCORE_BUDGET, first_draw, within_budget
        from verifier.audit.transcripts import PENDING_ROUNDS as KEPT

        # kept in the book until scored, so a restart draws them again; never a round still being scored
        self._taken = {e: rs for e, rs in self._taken.items() if e > epoch - KEPT}
        counted, self._taken[epoch] = self.transcripts.take_round(epoch, {r for rs in self._taken.values() for r in rs})
        mine = [c for c in counted if c.transcript.opening.model in self.models]
        if len(mine) < len(counted):
            log.info("audit: %d counted transcripts are of models this verifier does not hold; not scored",
                     len(counted) - len(mine))
        kept, over = within_budget(mine, self.rng)  # rule 8: bounded scoring work per donor
        if over:
            log.info("audit: %d counted transcripts left unscored, drawn at random: past their donors' budget of "
                     "%d tokens a round", over, SCORE_BUDGET)
        budget = ROUND_BUDGET if self.transcript_budget is None else self.transcript_budget
        first, spare, reserve = first_draw(kept, self.rng, budget)  # rule 9: bounded work per verifier
        if spare:
            log.warning("audit: %d counted transcripts left out of the first draw, node by node: past this "
                        "verifier's budget of %d tokens a round (--transcript-budget); %d more may be drawn for "
                        "suspect nodes", len(spare), budget, reserve)
        # sized for every node the chain lists of the models held, not only this round's: a cheater's
        # boosters make the budget bind in the round they choose (decisions 0034, 0035)
        nodes = len({c.node_id for c in kept} | {n for m in self.models for n in view.nodes_of(m)})
        if budget < NODE_BUDGET * nodes:
            log.warning("audit: this verifier's budget of %d a round leaves each of the %d nodes (listed on the "
                        "chain or with transcripts) about %d; the audits need about %d a node, or a cheater's own "
                        "registered users (boosters) can keep it trusted (docs/committee.md, 'Sizing a verifier'): "
                        "raise --audit-threads or --transcript-budget to %d", budget, nodes, budget // nodes,
                        NODE_BUDGET, NODE_BUDGET * nodes)
        # scores held back (put_back) that reach the minimum alone go out now, before this round is
        # scored: a report that waited for late replies leaves a few blocks, and scoring may take more
        # (decision 0043); this round's scores are then held for the next epoch's
        out: list[Action] = []
        if self.public_key in view.transcribed:  # on the chain already: sent before a restart
            self._spent = max(self._spent, epoch)
        elif self._carry.held():  # nothing held: no carry change, so no book write
            carried = self._carry.add(epoch, ())
            if carried:
                out.append(self._submission(epoch, carried))
                log.info("audit: epoch %d: scores held from earlier epochs go out first; this round's wait for "
                         "the next epoch's", epoch)
        held = tuple(first)
        if held:
            log.info("audit: epoch %d: %d users' transcripts count; scoring them", epoch, len(held))
            return [*out, ScoreTranscripts(epoch, held, tuple(spare), reserve)]
        self.transcripts.scored_rounds(self._taken.pop(epoch, ()))  # none of them this verifier's to score
        return out

    def second_draw(self, action: ScoreTranscripts, scored: Iterable[tuple[bytes, bytes, float]]) -> list[Counted]:
        """Rule 9's second draw: given ``(node, donor, z)`` of the first draw's scored transcripts,
        more of the suspect nodes' (:func:`~verifier.audit.transcripts.suspects`, and those of the
        last rounds: :func:`~verifier.audit.transcripts.remembered`) from the action's spare ones
        within its reserve, then of every node's with what they leave
        (:func:`~verifier.audit.transcripts.second_draw`)."""
        from verifier.audit.transcripts import remembered, second_draw, suspects

        before = dict(self._suspected)
        suspect = remembered(self._suspected, action.epoch, suspects(scored))
        self.changed |= self._suspected != before  # saved with the plan: a restart keeps them
        more = second_draw(action.spare, suspect, self.rng, action.reserve)
        if more:
            log.info("audit: epoch %d: %d suspect nodes; scoring %d more users' transcripts, %d of them theirs",
                     action.epoch, len(suspect), len(more), sum(c.node_id in suspect for c in more))
        return more

    def transcript_scores(self, epoch: int, scored: Sequence[tuple[bytes, int]]) -> Submit | None:
        """The signed :class:`~verifier.audit.tx.TranscriptScores` of ``epoch`` from ``scored``
        (``(signing node, score)`` pairs, fixed point) and the scores held from earlier epochs: the
        nodes with :data:`~verifier.audit.chain.MIN_TRANSCRIPTS` or more (a node with fewer waits,
        :class:`~verifier.audit.transcripts.ScoreCarry`), within the chain's limits (at most
        :data:`~verifier.audit.tx.MAX_TRANSCRIPTS_PER_NODE` scores per node and
        :data:`~verifier.audit.tx.MAX_TRANSCRIPT_NODES` nodes, a random sample of them when there
        are more: none favoured by the donors' ids); None when no node has enough. It is kept and
        handed out again by :meth:`plan` while the report window lasts if it never reached the chain.
        None too when this epoch's one submission went out already (held scores first, or before a
        restart: the chain lists this verifier as transcribed): ``scored`` is then held for the
        next epoch's (:meth:`~verifier.audit.transcripts.ScoreCarry.hold`, decision 0043)."""
        by_node: dict[bytes, tuple[int, ...]] = {}
        if epoch <= self._spent:
            self._carry.hold(epoch, scored)
        else:
            by_node = dict(self._carry.add(epoch, scored))
        if self.transcripts is not None:
            self.transcripts.scored_rounds(self._taken.pop(epoch, ()))  # in the carry now: they leave the book
        return self._submission(epoch, by_node.items()) if by_node else None

    def _submission(self, epoch: int, scores_of: Iterable[tuple[bytes, Sequence[int]]]) -> Submit:
        """The one transcript-scores submission of ``epoch``, of the nodes' scores ``scores_of``,
        sampled to the chain's limits (:meth:`transcript_scores`); kept to be handed out again."""
        from verifier.audit.tx import MAX_TRANSCRIPT_NODES, MAX_TRANSCRIPTS_PER_NODE, TranscriptScores

        by_node = dict(scores_of)
        nodes = sorted(by_node)
        if len(nodes) > MAX_TRANSCRIPT_NODES:
            nodes = sorted(self.rng.sample(nodes, MAX_TRANSCRIPT_NODES))
        rows = []
        for n in nodes:
            scores = by_node[n]
            if len(scores) > MAX_TRANSCRIPTS_PER_NODE:
                scores = self.rng.sample(scores, MAX_TRANSCRIPTS_PER_NODE)
            rows.append((n, tuple(scores)))
        tx = TranscriptScores(epoch, self.public_key, tuple(rows))
        key = ("transcripts", epoch)
        self._spent = max(self._spent, epoch)
        self._scores = Submit(self._sign(tx), f"transcript scores of epoch {epoch} ({sum(len(r) for _, r in rows)} "
                                              f"scores of {len(rows)} nodes)", key)
        self._started.add(key)
        return self._scores

    def _once(self, key: tuple[Any, ...]) -> bool:
        if key in self._started:
            return False
        self._started.add(key)
        return True

    def _commit_tx(self, p: Plan) -> Any:
        from verifier.audit.tx import PlanCommit

        return PlanCommit(p.epoch, self.public_key, p.models, p.hash())

    def _make_plan(self, view: AuditView) -> Plan:
        from verifier.audit.tx import MAX_AUDITED_NODES

        first, last = view.commit_until + 1, last_send(view.commit_until, view.report_from)
        chosen: dict[bytes, str] = {}
        for model in self.models:
            for node in view.nodes_of(model):
                if node not in chosen and len(chosen) < MAX_AUDITED_NODES:
                    chosen[node] = model
        by_node: dict[bytes, list[Planned]] = {node: [] for node in chosen}
        unrecognisable = dict.fromkeys(chosen, 0)  # per node: its challenges not from the generator
        sources = dict.fromkeys(SOURCES, 0)
        room, total = OPENING_ROOM, len(chosen) * view.challenges_per_node
        # about one script a persona to each node an epoch, as a user's paths carry about one
        # session (decision 0027: fewer personas make their paths come back, more make them new)
        personas = persona_count(view.challenges_per_node)
        # Round by round, each node's next challenge, the nodes in a secret order: prompts a node
        # cannot recognise (donated, then private) are spread over the nodes, one each before any
        # node gets a second, when they are too few for all; never first to the lowest node ids,
        # which a node can grind its key for (decision 0031)
        order = sorted(chosen)
        self.rng.shuffle(order)
        planned = 0
        for _ in range(view.challenges_per_node):
            for node in order:
                # the openings leave the report room for the replies, whatever donors sent
                # (decision 0027): a donated prompt over the room left is dropped
                later = total - planned - 1
                opening, source = self._opening(chosen[node], node, room - GENERATED_OPENING_BYTES * later)
                room -= len(opening.encode())
                sources[source] += 1
                unrecognisable[node] += source != "generator"
                planned += 1
                by_node[node].append(Planned(node, opening, self.rng.randint(first, last),
                                             persona=self.rng.randrange(personas)))
        entries = [e for node in sorted(by_node) for e in by_node[node]]  # as the report lists them
        if sources["generator"]:
            # part I of the audit-evasion bench: under half unrecognisable, challenges alone miss a
            # cheater that reads this code (decision 0031)
            short = sum(2 * n < view.challenges_per_node for n in unrecognisable.values())
            self._warn_once(("generator", view.epoch), logging.WARNING,
                            "audit: epoch %d: %d of %d challenges come from the built-in generator, and %d of %d "
                            "nodes got fewer than half of theirs from prompts they cannot recognise: %s", view.epoch,
                            sources["generator"], len(entries), short, len(by_node), GENERATOR_WARNING)
        log.info("audit: epoch %d: planned %d challenges to %d model nodes (%d donated, %d private, %d generated), "
                 "sent between heights %d and %d", view.epoch, len(entries), len(chosen), sources["donated"],
                 sources["corpus"], sources["generator"], first, last)
        return Plan(view.epoch, self.models, self.urandom(16), entries, view.commit_until, view.report_from,
                    view.end_height)

    def _opening(self, model: str, node: bytes, most: int) -> tuple[Opening, str]:
        """A fresh challenge for ``node`` of ``model`` and where it came from (one of
        :data:`SOURCES`): a donated prompt of at most ``most`` bytes encoded, none of whose user
        turns the generator holds as used or a report of the chain's last PROMPT_EPOCHS revealed,
        if the pool holds one the node has not read ("donated"; a larger or overlapping one drawn
        is dropped; decision 0029), else an unused private prompt of at most ``most`` bytes with
        no revealed turn ("corpus"; a larger or revealed one stays unused), else
        the generator's ("generator"). Every challenge's prompt keys are marked used in the
        generator (and the corpus) as it is handed out, so the generator's set holds this plan's
        turns and this verifier's earlier ones: two donors' conversations may share a follow-up
        such as "tell me more", and the chain refuses a report carrying a prompt twice and voids a
        challenge carrying one a report revealed."""
        from overlay.directory.registration import TxError
        from verifier.audit.pool import opening_of

        while self.pool is not None and (d := self.pool.draw(model, self.rng, avoid=node)) is not None:
            o = opening_of(d, self.urandom(16))
            try:
                o.check_script()
            except TxError as exc:  # the limits changed since it was taken
                log.info("audit: a donated prompt no longer fits a challenge (%s); dropped", exc.reason)
                continue
            if (size := len(o.encode())) > most:
                log.info("audit: a donated prompt of %d bytes would take this plan's openings past their room "
                         "(%d bytes left); dropped", size, most)
                continue
            keys = o.prompt_keys()
            if any(self.generator.is_used(k) or self._is_revealed(k) for k in keys):
                log.info("audit: a donated prompt shares a user turn with a challenge of this plan, an earlier one "
                         "of this verifier or one a report revealed (the chain refuses a report carrying a prompt "
                         "twice and voids a challenge carrying a revealed one); dropped")
                continue
            self.generator.mark_used(keys=keys)
            if self.corpus is not None:
                self.corpus.mark_used(keys)
            return o, "donated"
        if self.corpus is not None:
            private = self.corpus.draw(model, self.rng, self.urandom, most, avoid=self._is_revealed)
            if private is not None:
                self.generator.mark_used(keys=private.prompt_keys())
                return private, "corpus"
            if not self.corpus.left():
                self._warn_once(("corpus used",), logging.WARNING, "audit: the %d private prompts of %s are all "
                                "used; add more to %s", len(self.corpus), self.corpus.source, self.corpus.source)
        o = self.generator.opening(model)
        if self.corpus is not None:
            self.corpus.mark_used(o.prompt_keys())
        return o, "generator"

    def _sends(self, p: Plan, height: int) -> list[Action]:
        from verifier.audit.tx import MAX_TRIES, FailOutcome, reply_text

        out: list[Action] = []
        for i, e in enumerate(p.entries):
            if e.outcome is not None or e.sending or e.send_at > height:
                continue
            if e.tries >= MAX_TRIES:  # sent MAX_TRIES times, the last one lost in a restart
                e.outcome = FailOutcome(e.last or "silent", e.tries)
                self.changed = True
                continue
            e.tries += 1
            e.sending = True
            self.changed = True
            out.append(Send(p.epoch, i, e.node_id, e.opening, e.tries, len(e.replies),
                            tuple(reply_text(r) for r in e.replies), e.persona))
        return out

    def result(self, send: Send, outcome: Reply | Failure, score: int | None, height: int, z: float = 0.0) -> None:
        """What came of ``send`` at ``height``: a reply with its score (fixed point) and its ``z``
        (pooled with the node's other replies at the report, decision 0023), after which the
        script's next turn goes out a user's think time later if it still fits in the send window
        (decision 0025); or a failure, retried later in the window while it is worth it (module
        docstring)."""
        from verifier.audit.tx import MAX_TRIES, FailOutcome, ReplyOutcome

        p = self.current
        if p is None or p.epoch != send.epoch or not 0 <= send.index < len(p.entries):
            return
        e = p.entries[send.index]
        if not e.sending or e.outcome is not None or send.turn != len(e.replies):
            return  # reported already (it came too late)
        e.sending = False
        self.changed = True
        last = last_send(p.commit_until, p.report_from)
        if isinstance(outcome, Reply):
            assert score is not None
            reply = ReplyOutcome(outcome.served_by, outcome.chunks, outcome.signature, outcome.signed_at_ms,
                                 score, send.attempt)  # the try whose request id the reply signs
            e.zs.append(z)
            following = height + think_blocks(self.rng, *self.think)
            if send.turn + 1 < e.opening.turns() and following <= last:
                e.replies.append(reply)
                e.tries, e.last, e.send_at = 0, "", following
                return
            e.outcome = reply  # the script's last turn, or the last one that fits in the window
            return
        e.last = outcome.kind
        if outcome.kind in RETRY_KINDS and e.tries < MAX_TRIES and height + 1 <= last:
            e.send_at = self.rng.randint(height + 1, last)
            log.info("audit: challenge %d to model node %s: %s; trying again at height %d (try %d of %d)",
                     send.index, short_id(e.node_id), outcome.reason, e.send_at, e.tries + 1, MAX_TRIES)
            return
        e.outcome = FailOutcome(outcome.kind, e.tries)

    def _report(self, p: Plan) -> Submit:
        from verifier.audit.tx import AuditReport, FailOutcome, ReportEntry

        for e in p.entries:
            if e.outcome is None and e.replies and not e.tries:
                e.outcome = e.replies.pop()  # a script's next turn never went out: it ends at its last reply
                self.changed = True
            elif e.outcome is None:
                # still out after the grace blocks: silent; never sent (this verifier was down): other
                e.outcome = FailOutcome("silent", e.tries) if e.tries else FailOutcome("other", 1)
                self.changed = True
        caps = pooled_caps(p.entries)
        entries = [ReportEntry(e.node_id, e.opening, capped(e.outcome, caps.get(e.node_id)),
                               tuple(capped(r, caps.get(e.node_id)) for r in e.replies))
                   for e in p.entries if e.outcome is not None]
        tx: AuditReport = AuditReport(p.epoch, self.public_key, p.salt, tuple(entries))
        fitted, cut, dropped = fit_report(tx)
        if cut or dropped:
            (log.error if dropped else log.warning)(
                "audit: the report of epoch %d did not fit in one transaction: %d scripts' later turns left out%s",
                p.epoch, cut, f", {dropped} replies reported as 'other' (the verifier's fault)" if dropped else "")
            tx = replace(tx, entries=fitted)
        if self.tamper is not None:
            honest, tx = tx, self.tamper(tx)
            if tx != honest:
                log.warning("audit: TEST HOOK: the report of epoch %d was altered before signing", p.epoch)
        answered = sum(1 for e in entries if not isinstance(e.outcome, FailOutcome))
        return Submit(self._sign(tx), f"report of epoch {p.epoch} ({answered} of {len(entries)} challenges answered)",
                      ("report", p.epoch))

    # ------------------------------------------------------------------ persistence

    def snapshot(self) -> bytes:
        """The current plan as bytes for ``DATA_DIR/audit-plan.msgpack`` (:meth:`restore`); clears
        :attr:`changed`."""
        from overlay.directory.registration import pack

        self.changed = False
        p = self.current
        suspected = [[node, epoch] for node, epoch in sorted(self._suspected.items())]
        if p is None:
            return pack([_PLAN_VERSION, self.chain_id, self.public_key, None, suspected])
        return pack([_PLAN_VERSION, self.chain_id, self.public_key,
                     [p.epoch, list(p.models), p.salt, p.commit_until, p.report_from, p.end_height, p.fixes,
                      [[e.node_id, e.opening.to_wire(), e.send_at, e.tries,
                        None if e.outcome is None else pack(e.outcome.to_wire()), e.last, e.zs,
                        [pack(r.to_wire()) for r in e.replies], e.persona] for e in p.entries]], suspected])

    def restore(self, raw: bytes) -> bool:
        """Take back a :meth:`snapshot` of this verifier on this chain (True); a challenge that was
        out when it was taken is sent again when its turn comes (its try counted). False (nothing
        changes) for another key's or chain's, or bytes that are not one."""
        from overlay.directory.registration import TxError
        from verifier.audit.tx import Opening, decode_outcome

        try:
            version, chain_id, pk, body, *rest = msgpack.unpackb(raw, raw=False, strict_map_key=True)
            if version not in _PLAN_VERSIONS or chain_id != self.chain_id or pk != self.public_key:
                return False
            if len(rest) != (version >= 5):  # rule 9's suspects follow the plan from version 5
                raise ValueError(f"a version {version} plan with {4 + len(rest)} fields")
            suspected = _suspects(rest[0] if rest else [])
            if body is None:
                self._suspected = suspected
                return True
            epoch, models, salt, commit_until, report_from, end_height, fixes, entries = body
            if version < 3:  # before decisions 0023 and 0025: no z kept, one turn a challenge
                entries = [[*row, [], []] for row in entries]
            if version < 4:  # before decision 0026: every challenge as persona 0
                entries = [[*row, 0] for row in entries]
            plan = Plan(int(epoch), tuple(str(m) for m in models), bytes(salt), [
                Planned(bytes(n), Opening.from_wire(o), int(at), int(tries), False,
                        None if out is None else decode_outcome(bytes(out)), str(last),
                        [_reply(bytes(r)) for r in replies], [_finite(z) for z in zs], _persona(persona))
                for n, o, at, tries, out, last, zs, replies, persona in entries],
                int(commit_until), int(report_from), int(end_height), int(fixes))
        except (ValueError, TypeError, KeyError, IndexError, TxError, RecursionError, msgpack.UnpackException) as exc:
            log.warning("audit: the saved plan does not decode (%s: %s); ignored", type(exc).__name__, exc)
            return False
        self.current = plan
        self._suspected = suspected
        keys = [k for e in plan.entries for k in e.opening.prompt_keys()]
        self.generator.mark_used(keys=keys)  # revealed with its report: never a later challenge's
        if self.corpus is not None:  # its private prompts are used, whatever the corpus's file says
            self.corpus.mark_used(keys)
        return True
