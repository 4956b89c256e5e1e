"""Audit transactions on the committee chain (decision 0013; docs/committee.md "Audits").

The one codec of the audit protocol: the verifiers' audit loop encodes and signs with it, the
committee's application (:mod:`verifier.audit.chain`) decodes with it. Pure: no state, no clock.

A raw audit transaction is :data:`AUDIT_TAG` followed by one msgpack array ``[kind, *fields]``:

- kind 1 :class:`PlanCommit` ``[1, epoch, validator_pk, [model, ...], plan_hash, signature]``: a
  verifier's secret plan for ``epoch``, as a hash (:func:`plan_hash`), and the models it holds.
- kind 2 :class:`AuditReport` ``[2, epoch, validator_pk, salt, [entry, ...], signature]``: the
  plan revealed once its challenges were answered. Each entry is ``[node_id, opening, outcome,
  [earlier reply, ...]]`` with ``opening`` the array of :meth:`Opening.to_wire`, ``outcome``
  either ``[0, served_by, [[text, [token ids]], ...], reply_signature, signed_at_ms, score,
  tries]`` (:class:`ReplyOutcome`) or ``[1, kind, tries]`` (:class:`FailOutcome`), and the
  earlier replies (each a :class:`ReplyOutcome`) those of the opening's turns before the last one
  sent: a challenge is a *script* of user turns, replayed turn by turn, each after the node's reply
  to the one before (decision 0025); ``outcome`` is what the last turn sent got.
- kind 3 :class:`TranscriptScores` ``[3, epoch, validator_pk, [[node_id, [score, ...]], ...], signature]``:
  the validator's scores of users' transcripts that count (decision 0015,
  :mod:`verifier.audit.transcripts`), per node that signed them, node ids ascending, scores in
  fixed point. Only the scores: the prompts and replies stay with the verifiers.

Signatures are Ed25519 by the validator's CometBFT key over ``AUDIT_CONTEXT || len(chain_id) (u8)
|| chain_id || kind (u8) || msgpack([fields without the signature])``, so a signature binds one
chain and one kind.

Decoding is strict: exact types (bool is not int, a float is a 64-bit float), every length and
count bounded, integers in range, no trailing bytes, and the canonical re-encoding must equal the
input (a transaction has exactly one byte form). The body is read by shape with the wire codec's
:class:`overlay.wire.codec.ShapeReader`: the kind first (its byte limit applies before the rest is
read), then each field as the kind's schema has it, each array bounded before its items, so no
transaction builds more objects than its schema allows (docs/fuzzing.md). Errors are
:class:`overlay.directory.registration.TxError` with MALFORMED (shape, types, encoding), INVALID_FIELD (a value out of
range), OVERSIZE or BAD_SIGNATURE, and a reason. Membership, windows and content rules are the
application's (:mod:`verifier.audit.chain`).

A challenge's plaintext (:class:`Opening`) is known only to the verifier that sends it until its
report reveals it: the commit holds a hash of the whole plan, salted.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from overlay.anon import signing
from overlay.directory import transcripts
from overlay.directory.registration import DECODE_ERRORS, MAX_MODEL_ID, Code, TxError, pack
from overlay.wire import codec, crypto
from overlay.wire.constants import MAX_CHAIN_ID
from overlay.wire.identity import NODE_ID_LEN
from overlay.wire.messages import REQUEST_ID_LEN, ChatMessage, Request, SamplingParams
from verifier.audit.reputation import SCALE

AUDIT_TAG = b"GTAUDIT2"
AUDIT_CONTEXT = b"gentorrent/audit/v2\x00"
KIND_COMMIT, KIND_REPORT, KIND_TRANSCRIPTS = 1, 2, 3
KIND_NAMES = {KIND_COMMIT: "plan commit", KIND_REPORT: "audit report", KIND_TRANSCRIPTS: "transcript scores"}
OUTCOME_REPLY, OUTCOME_FAIL = 0, 1
FAIL_KINDS = ("busy", "silent", "lost", "error", "unverified", "incomplete", "empty", "other")

MAX_AUDITED_NODES = 32  # model nodes in one verifier's plan
MAX_CHALLENGES_PER_NODE = 4
MAX_CHALLENGES = MAX_AUDITED_NODES * MAX_CHALLENGES_PER_NODE
MAX_MODELS_HELD = 8  # models one verifier declares
MAX_TRIES = 3  # sends of one challenge (a busy or silent node is tried again later in the epoch)
MAX_REPORT_BYTES = 1024 * 1024 - 4096  # under CometBFT's default mempool limit on one transaction (1 MiB)
MAX_COMMIT_BYTES = 4096
MAX_TRANSCRIPT_NODES = 256  # nodes in one TranscriptScores
MAX_TRANSCRIPTS_PER_NODE = 64  # scores per node in one TranscriptScores
MAX_TRANSCRIPTS_BYTES = 64 + MAX_TRANSCRIPT_NODES * (24 + 5 * MAX_TRANSCRIPTS_PER_NODE + 4) + 64

# Challenge limits (an Opening): what users' clients may send
SALT_LEN = 16
COMMITMENT_LEN = 32
PLAN_HASH_LEN = 32
PROMPT_KEY_LEN = 16
MIN_TOKENS, MAX_TOKENS = transcripts.MIN_TOKENS, transcripts.MAX_TOKENS  # the limits: overlay/directory/transcripts.py
MAX_MESSAGES = transcripts.MAX_MESSAGES
MAX_TURNS = transcripts.MAX_TURNS  # user turns in a challenge's script (decisions 0025, 0027)
MAX_CONTENT_BYTES = transcripts.MAX_CONTENT_BYTES
MAX_OPENING_BYTES = 64 + MAX_MODEL_ID + MAX_MESSAGES * (MAX_CONTENT_BYTES + 32) + 64
ROLES = transcripts.ROLES
MAX_TEMPERATURE = transcripts.MAX_TEMPERATURE
MAX_TOP_K = transcripts.MAX_TOP_K
MAX_SEED = transcripts.MAX_SEED

# Reply limits (a ReplyOutcome)
MAX_CHUNKS = transcripts.MAX_CHUNKS
MAX_REPLY_TOKENS = transcripts.MAX_REPLY_TOKENS
MAX_CHUNK_TEXT = transcripts.MAX_CHUNK_TEXT

# A user's transcript, kept by a verifier in an Opening and a ReplyOutcome, has wider limits
# (decision 0032: overlay/directory/transcripts.py); it never goes on the chain
MAX_TRANSCRIPT_BYTES = 64 + MAX_MODEL_ID + transcripts.TRANSCRIPT_PROMPT_BYTES \
    + transcripts.TRANSCRIPT_MAX_MESSAGES * 32 + 64

_CHALLENGE_PERSON = b"gt-challenge"
_PROMPT_PERSON = b"gt-prompt"
_PLAN_PERSON = b"gt-audit-plan"
_TRY_PERSON = b"gt-challenge-id"
_SPACES = re.compile(r"\s+")
_T = TypeVar("_T")


def _bad(why: str) -> TxError:
    return TxError(Code.MALFORMED, why)


def _invalid(why: str) -> TxError:
    return TxError(Code.INVALID_FIELD, why)


def _typed(value: Any, tp: type, what: str) -> Any:
    if type(value) is not tp:
        raise _bad(f"{what}: expected {tp.__name__}, got {type(value).__name__}")
    return value


def _bytes(value: Any, n: int, what: str) -> bytes:
    if type(value) is not bytes or len(value) != n:
        raise _bad(f"{what}: expected {n} bytes")
    return value


def _int(value: Any, lo: int, hi: int, what: str) -> int:
    if type(value) is not int:
        raise _bad(f"{what}: expected int, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise _invalid(f"{what} {value} outside {lo}..{hi}")
    return value


def _list(value: Any, most: int, what: str) -> list[Any]:
    if type(value) is not list:
        raise _bad(f"{what}: expected an array")
    if len(value) > most:
        raise _invalid(f"{what}: {len(value)} items, at most {most}")
    return value


def _array(r: codec.ShapeReader, most: int, what: str) -> int:
    """The item count of the next item, an array of at most ``most`` items (INVALID_FIELD if more)."""
    n = r.array()
    if n > most:
        raise _invalid(f"{what}: {n} items, at most {most}")
    return n


def _shaped(r: codec.ShapeReader, n: int, why: str) -> None:
    """The header of an array of exactly ``n`` items; MALFORMED ``why`` otherwise."""
    if r.array() != n:
        raise _bad(why)


def _values(r: codec.ShapeReader, n: int) -> list[Any]:
    return [r.value() for _ in range(n)]


def _read(raw: bytes | memoryview, max_bin: int, why: str, read: Callable[[codec.ShapeReader], _T]) -> _T:
    """``read`` of a :class:`overlay.wire.codec.ShapeReader` of ``raw``, which must take every byte;
    a shape the reader refuses, msgpack's errors and trailing bytes are MALFORMED ``why (error)``."""
    r = codec.ShapeReader(raw, max_bin)
    try:
        out = read(r)
    except codec.ShapeError as exc:
        raise _bad(f"{why} ({exc})") from None
    except DECODE_ERRORS as exc:
        raise _bad(f"{why} ({type(exc).__name__})") from None
    if not r.done():
        raise _bad(f"{why} (ExtraData)")
    return out


# =========================================================================== the challenge


def script_of(messages: Sequence[ChatMessage]) -> tuple[ChatMessage, ...]:
    """A donated conversation as a challenge's script (decision 0025): its system messages before
    the first user turn and its first :data:`MAX_TURNS` user turns; the replies it carries (another
    node's) are dropped, as the challenged node's own replies take their places."""
    users = [i for i, m in enumerate(messages) if m.role == "user"]
    head = [m for m in messages[:users[0]] if m.role == "system"] if users else []
    return (*head, *(messages[i] for i in users[:MAX_TURNS]))


def normalise_prompt(text: str) -> str:
    """The form a prompt is compared in for reuse: stripped, casefolded, whitespace runs as one space."""
    return _SPACES.sub(" ", text.strip().casefold())


@dataclass(frozen=True, slots=True)
class Opening:
    """The plaintext of one challenge: a salt, the model, its *script* and the sampling
    parameters. The script is system messages, then 1 to :data:`MAX_TURNS` user turns; no
    assistant message: the node's own replies take those places when the turns are replayed one
    after another (:meth:`turn_messages`, decision 0025). Not a transaction: its commitment is in
    a :class:`PlanCommit`'s hash, and it is in the clear in the :class:`AuditReport` that answers it.

    Limits: 1 to :data:`MAX_MESSAGES` messages, each at most :data:`MAX_CONTENT_BYTES` UTF-8
    bytes; the parameters within what model nodes accept (the users' transcript limits,
    :func:`overlay.directory.transcripts.opening_problem`). :meth:`check` raises :class:`TxError` otherwise."""

    salt: bytes
    model: str
    messages: tuple[ChatMessage, ...]
    params: SamplingParams

    def check(self, *, transcript: bool = False) -> None:
        """A challenge's limits; ``transcript``: a user's transcript's, which are wider (decision
        0032, :func:`overlay.directory.transcripts.transcript_problem`)."""
        if type(self.salt) is not bytes or len(self.salt) != SALT_LEN:
            raise _bad(f"challenge salt must be {SALT_LEN} bytes")
        problem = transcripts.transcript_problem if transcript else transcripts.opening_problem
        why = problem(self.model, self.messages, self.params)
        if why is not None:
            raise _invalid(f"{'transcript' if transcript else 'challenge'}: {why}")

    def check_script(self) -> None:
        """:meth:`check`, and the script's own rules (a challenge's opening, decision 0025; a user's
        transcript, which carries its conversation's replies, is checked by :meth:`check` only):
        system messages, then 1 to :data:`MAX_TURNS` distinct, non-empty user turns."""
        self.check()
        self._check_script_rules()

    def _check_script_rules(self) -> None:
        roles = [m.role for m in self.messages]
        first_user = roles.index("user")
        if any(r != "system" for r in roles[:first_user]) or any(r != "user" for r in roles[first_user:]):
            raise _invalid("challenge: a script is system messages, then user turns (no assistant message: the "
                           "node's own replies take their places)")
        if len(roles) - first_user > MAX_TURNS:
            raise _invalid(f"challenge: a script has at most {MAX_TURNS} user turns")
        if any(not m.content.strip() for m in self.messages[first_user:]):
            raise _invalid("challenge: a user turn is empty")
        if len(set(self.prompt_keys())) < len(roles) - first_user:
            raise _invalid("challenge: a script repeats a user turn (a prompt is used once)")

    def turns(self) -> int:
        """How many user turns the script has."""
        return sum(m.role == "user" for m in self.messages)

    def turn_messages(self, turn: int, replies: Sequence[str] = ()) -> tuple[ChatMessage, ...]:
        """The messages of the script's ``turn`` (0-based) as sent: the system messages, then each
        earlier user turn followed by the node's reply to it (``replies``, one per earlier turn),
        then this turn. Turn 0 of a one-turn script is the script itself."""
        system = [m for m in self.messages if m.role == "system"]
        users = [m for m in self.messages if m.role == "user"]
        if not 0 <= turn < len(users) or len(replies) != turn:
            raise ValueError(f"turn {turn} of a {len(users)}-turn script needs {turn} earlier replies, not "
                             f"{len(replies)}")
        out = list(system)
        for u, text in zip(users, replies, strict=False):
            out += [u, ChatMessage("assistant", text)]
        out.append(users[turn])
        return tuple(out)

    def to_wire(self) -> list[Any]:
        p = self.params
        return [self.salt, self.model, [[m.role, m.content] for m in self.messages],
                [p.temperature, p.top_p, p.top_k, p.max_tokens, p.seed]]

    def encode(self, *, transcript: bool = False) -> bytes:
        """The canonical msgpack of :meth:`to_wire` (what is sealed to each validator; a
        ``transcript`` request, checked by its own limits, is what a verifier's book keeps)."""
        self.check(transcript=transcript)
        return pack(self.to_wire())

    @classmethod
    def from_wire(cls, f: Any, *, transcript: bool = False) -> Opening:
        """The opening from its wire array; :class:`TxError` if anything is off."""
        f = _list(f, 4, "opening")
        if len(f) != 4:
            raise _bad("an opening is [salt, model, messages, params]")
        salt = _bytes(f[0], SALT_LEN, "challenge salt")
        model = _typed(f[1], str, "challenge model")
        msgs = []
        for m in _list(f[2], _max_messages(transcript), "challenge messages"):
            if type(m) is not list or len(m) != 2 or type(m[0]) is not str or type(m[1]) is not str:
                raise _bad("a challenge message is [role, content]")
            msgs.append(ChatMessage(m[0], m[1]))
        p = _list(f[3], 5, "challenge params")
        if len(p) != 5:
            raise _bad("challenge params are [temperature, top_p, top_k, max_tokens, seed]")
        temp = _typed(p[0], float, "temperature")
        top_p = _typed(p[1], float, "top_p")
        top_k = _typed(p[2], int, "top_k")
        max_tokens = _typed(p[3], int, "max_tokens")
        seed = p[4] if p[4] is None else _typed(p[4], int, "seed")
        opening = cls(salt, model, tuple(msgs), SamplingParams(temp, top_p, top_k, max_tokens, seed))
        opening.check(transcript=transcript)
        return opening

    @classmethod
    def decode(cls, raw: bytes, *, transcript: bool = False) -> Opening:
        """Strictly decode :meth:`encode`'s bytes (a sealed box's content; a ``transcript``
        request by its own limits); :class:`TxError` if off."""
        limit = MAX_TRANSCRIPT_BYTES if transcript else MAX_OPENING_BYTES
        if len(raw) > limit:
            raise TxError(Code.OVERSIZE, f"a challenge opening of {len(raw)} bytes, at most {limit}")
        max_messages = _max_messages(transcript)
        opening = cls.from_wire(_read(raw, limit, "the challenge opening is not msgpack",
                                    lambda r: _read_opening(r, max_messages)), transcript=transcript)
        if pack(opening.to_wire()) != raw:
            raise _bad("the challenge opening is not in canonical msgpack form")
        return opening

    def request(self, request_id: bytes = bytes(REQUEST_ID_LEN), k: int = 3) -> Request:
        """The request a model node receives for this challenge (no continuation, no return paths:
        the sender adds its own paths; the digest covers neither)."""
        return Request(request_id=request_id, model=self.model, messages=self.messages, params=self.params,
                       k=k, return_paths=(), continuation="")

    def digest(self) -> bytes:
        """:func:`overlay.anon.signing.request_digest` of :meth:`request` with an all-zero request id and
        target: the challenge's content, which :meth:`commitment` binds (the tries' ids are derived
        from the salt, and the target is the entry's node)."""
        return signing.request_digest(self.request(), bytes(NODE_ID_LEN))

    def request_id(self, tries: int = 1, turn: int = 0) -> bytes:
        """The request id of the ``tries``-th send of the script's ``turn``: BLAKE2b-128(salt ||
        tries (u8) [|| turn (u8) after the first]), personalised ``gt-challenge-id``. Random-looking
        to the node, fresh for every try and turn (a node answers each id once), and derived so the
        chain can check the reply of the try reported."""
        return crypto.blake2b(self.salt + bytes([tries & 0xFF]) + (bytes([turn & 0xFF]) if turn else b""),
                              size=REQUEST_ID_LEN, person=_TRY_PERSON)

    def turn_request(self, turn: int, replies: Sequence[str], request_id: bytes, k: int = 3) -> Request:
        """The request a model node receives for the script's ``turn`` (:meth:`turn_messages`)."""
        return Request(request_id=request_id, model=self.model, messages=self.turn_messages(turn, replies),
                       params=self.params, k=k, return_paths=(), continuation="")

    def reply_digest(self, node_id: bytes, tries: int = 1, turn: int = 0, replies: Sequence[str] = ()) -> bytes:
        """What the reply to the ``tries``-th send of ``turn`` to ``node_id`` signs:
        :func:`overlay.anon.signing.request_digest` of :meth:`turn_request` with :meth:`request_id`
        of that try and turn, the node's ``replies`` to the earlier turns in place, addressed to ``node_id``."""
        return signing.request_digest(self.turn_request(turn, replies, self.request_id(tries, turn)), node_id)

    def commitment(self) -> bytes:
        """BLAKE2b-256(salt || request digest), personalised ``gt-challenge``: what the commit holds."""
        return crypto.blake2b(self.salt + self.digest(), size=COMMITMENT_LEN, person=_CHALLENGE_PERSON)

    def prompt_key(self) -> bytes:
        """BLAKE2b-128 of the first user turn normalised (:func:`normalise_prompt`), personalised
        ``gt-prompt``: prompts are never reused, and the chain remembers used keys (of every turn:
        :meth:`prompt_keys`)."""
        return self.prompt_keys()[0]

    def prompt_keys(self) -> tuple[bytes, ...]:
        """:meth:`prompt_key` of every user turn, in order."""
        return tuple(crypto.blake2b(normalise_prompt(m.content).encode("utf-8", errors="surrogatepass"),
                                    size=PROMPT_KEY_LEN, person=_PROMPT_PERSON)
                     for m in self.messages if m.role == "user")


# =========================================================================== transactions


def plan_hash(salt: bytes, pairs: Sequence[tuple[bytes, bytes]]) -> bytes:
    """BLAKE2b-256(salt || msgpack([[node_id, commitment], ...])), personalised ``gt-audit-plan``:
    what a :class:`PlanCommit` holds of a plan (the node and the opening's commitment of each
    planned challenge, in report order). The salt keeps a plan of known nodes from being guessed."""
    return crypto.blake2b(salt + pack([[n, c] for n, c in pairs]), size=PLAN_HASH_LEN, person=_PLAN_PERSON)


@dataclass(frozen=True, slots=True)
class PlanCommit:
    """Kind 1: ``validator_pk``'s plan for ``epoch`` as a hash, and the models it holds (it audits
    their nodes; a model is audited while holders have more than 2/3 of the power)."""

    epoch: int
    validator_pk: bytes
    models: tuple[str, ...]
    plan_hash: bytes
    signature: bytes = b""

    KIND = KIND_COMMIT

    def fields(self) -> list[Any]:
        return [self.epoch, self.validator_pk, list(self.models), self.plan_hash]


@dataclass(frozen=True, slots=True)
class ReplyOutcome:
    """A challenge answered: every reply chunk's (text, token ids) in order, the final chunk's
    signature and signing time, the node that signed it (the challenged node, or the member of
    its group it forwarded the challenge to), the sender's two-sided score in fixed point
    (:mod:`verifier.audit.scoring`) and how many sends it took."""

    served_by: bytes
    chunks: tuple[tuple[str, tuple[int, ...]], ...]
    signature: bytes
    signed_at_ms: int
    score: int
    tries: int = 1

    def to_wire(self) -> list[Any]:
        return [OUTCOME_REPLY, self.served_by, [[t, list(ids)] for t, ids in self.chunks], self.signature,
                self.signed_at_ms, self.score, self.tries]

    def token_ids(self) -> tuple[int, ...]:
        return tuple(i for _, ids in self.chunks for i in ids)


@dataclass(frozen=True, slots=True)
class FailOutcome:
    """A challenge with no usable reply after ``tries`` sends: ``kind`` is one of :data:`FAIL_KINDS`."""

    kind: str
    tries: int = 1

    def to_wire(self) -> list[Any]:
        return [OUTCOME_FAIL, self.kind, self.tries]


@dataclass(frozen=True, slots=True)
class ReportEntry:
    """One planned challenge: the node it was sent to, its opening (a script of turns), the
    replies to the turns before the last one sent (``earlier``, decision 0025) and what that last
    turn got (``outcome``). A one-turn script has no earlier replies."""

    node_id: bytes
    opening: Opening
    outcome: ReplyOutcome | FailOutcome
    earlier: tuple[ReplyOutcome, ...] = ()

    def to_wire(self) -> list[Any]:
        return [self.node_id, self.opening.to_wire(), self.outcome.to_wire(), [e.to_wire() for e in self.earlier]]

    def replies(self) -> tuple[tuple[int, ReplyOutcome], ...]:
        """Every reply in the entry with its turn: the earlier ones, then the last turn's if it got one."""
        out = tuple(enumerate(self.earlier))
        return (*out, (len(self.earlier), self.outcome)) if isinstance(self.outcome, ReplyOutcome) else out

    def verify(self, ed25519_public: bytes, turn: int | None = None) -> None:
        """:class:`overlay.anon.signing.ReplyVerifyError` unless the reply to ``turn`` (the last turn
        sent when None), its chunks chained from that turn's request digest (the node's earlier
        replies in place), carries the final signature of its serving node (key ``ed25519_public``).
        A turn with no reply has nothing to verify (ValueError)."""
        turn = len(self.earlier) if turn is None else turn
        out = self.earlier[turn] if turn < len(self.earlier) else self.outcome
        if turn > len(self.earlier) or not isinstance(out, ReplyOutcome):
            raise ValueError("a failed challenge carries no reply")
        texts = [reply_text(e) for e in self.earlier[:turn]]
        digest = self.opening.reply_digest(self.node_id, out.tries, turn, texts)
        chain = signing.chain_start(digest)
        for text, ids in out.chunks:
            chain = signing.chain_next(chain, text, ids)
        signing.verify_reply(ed25519_public, out.signature, digest, chain, True, self.opening.model, out.served_by,
                             out.signed_at_ms)


def reply_text(reply: ReplyOutcome) -> str:
    """A reply's text as the next turn's history holds it: its chunks' texts joined."""
    return "".join(t for t, _ in reply.chunks)


@dataclass(frozen=True, slots=True)
class AuditReport:
    """Kind 2: ``validator_pk``'s plan for ``epoch`` revealed, with what each challenge got back."""

    epoch: int
    validator_pk: bytes
    salt: bytes
    entries: tuple[ReportEntry, ...]
    signature: bytes = b""

    KIND = KIND_REPORT

    def fields(self) -> list[Any]:
        return [self.epoch, self.validator_pk, self.salt, [e.to_wire() for e in self.entries]]

    def plan_hash(self) -> bytes:
        return plan_hash(self.salt, [(e.node_id, e.opening.commitment()) for e in self.entries])


@dataclass(frozen=True, slots=True)
class TranscriptScores:
    """Kind 3: ``validator_pk``'s scores, this epoch, of users' transcripts that count (decision
    0015): ``nodes`` is ``((node_id, (score, ...)), ...)``, node ids ascending, each node the signer
    of the replies scored."""

    epoch: int
    validator_pk: bytes
    nodes: tuple[tuple[bytes, tuple[int, ...]], ...]
    signature: bytes = b""

    KIND = KIND_TRANSCRIPTS

    def fields(self) -> list[Any]:
        return [self.epoch, self.validator_pk, [[n, list(sc)] for n, sc in self.nodes]]


AuditTx = PlanCommit | AuditReport | TranscriptScores


def signing_bytes(chain_id: str, kind: int, fields: list[Any]) -> bytes:
    """What a validator signs: context, chain id (u8 length), kind (u8), msgpack of the fields."""
    chain = chain_id.encode()
    if not 0 < len(chain) <= MAX_CHAIN_ID:
        raise ValueError(f"chain id must be 1-{MAX_CHAIN_ID} bytes")
    return AUDIT_CONTEXT + bytes([len(chain)]) + chain + bytes([kind]) + pack(fields)


def encode_tx(tx: AuditTx) -> bytes:
    """The raw transaction (with the signature the object holds)."""
    return AUDIT_TAG + pack([tx.KIND, *tx.fields(), tx.signature])


def sign_tx(tx: AuditTx, chain_id: str, seed32: bytes) -> bytes:
    """``tx`` signed with the validator's Ed25519 seed (its CometBFT key), as raw bytes. The key in
    ``tx`` must be the seed's (ValueError otherwise)."""
    key = crypto.SigningKey.from_bytes(seed32)
    if tx.validator_pk != key.public_bytes:
        raise ValueError("the transaction names another validator key than this seed's")
    return encode_tx(replace(tx, signature=key.sign(signing_bytes(chain_id, tx.KIND, tx.fields()))))


# --------------------------------------------------------------------------- decoding


def _epoch(v: Any) -> int:
    return _int(v, 0, 2**63 - 1, "epoch")


def _sig(v: Any) -> bytes:
    if type(v) is not bytes:
        raise _bad("signature: expected bytes")
    if len(v) != crypto.ED25519_SIG_LEN:
        raise TxError(Code.BAD_SIGNATURE, f"a signature of {len(v)} bytes, expected {crypto.ED25519_SIG_LEN}")
    return v


# Each reader below takes one item of the schema from a ShapeReader, in wire order, and checks it
# as it goes (Python evaluates arguments left to right, the order of the fields on the wire).


def _read_opening(r: codec.ShapeReader, max_messages: int = MAX_MESSAGES) -> list[Any]:
    """An opening's wire array, read by shape for :meth:`Opening.from_wire` to check."""
    if _array(r, 4, "opening") != 4:
        raise _bad("an opening is [salt, model, messages, params]")
    salt, model = r.value(), r.value()
    messages = [_read_message(r) for _ in range(_array(r, max_messages, "challenge messages"))]
    why = "challenge params are [temperature, top_p, top_k, max_tokens, seed]"
    if _array(r, 5, "challenge params") != 5:
        raise _bad(why)
    return [salt, model, messages, _values(r, 5)]


def _max_messages(transcript: bool) -> int:
    """An opening's most messages: a challenge's, or a user's transcript's (decision 0032)."""
    return transcripts.TRANSCRIPT_MAX_MESSAGES if transcript else MAX_MESSAGES


def _read_message(r: codec.ShapeReader) -> list[Any]:
    _shaped(r, 2, "a challenge message is [role, content]")
    return _values(r, 2)


def _read_commit(r: codec.ShapeReader) -> PlanCommit:
    epoch, key = _epoch(r.value()), _bytes(r.value(), 32, "validator key")
    models = tuple(_typed(m, str, "model") for m in _values(r, _array(r, MAX_MODELS_HELD, "models")))
    return PlanCommit(epoch, key, models, _bytes(r.value(), PLAN_HASH_LEN, "plan hash"), _sig(r.value()))


def _read_chunks(r: codec.ShapeReader, i: int, transcript: bool = False) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """A reply's [text, token ids] chunks: at most :data:`MAX_CHUNKS`, :data:`MAX_REPLY_TOKENS` ids in all
    (a ``transcript``'s reply: a transcript's limits, decision 0032, and none for a node's signed
    "busy" a transcript book holds, decision 0044)."""
    why, what = f"entry {i}: a chunk is [text, token ids]", f"entry {i}'s token id"
    max_chunks, max_tokens = ((transcripts.TRANSCRIPT_MAX_CHUNKS, transcripts.TRANSCRIPT_MAX_REPLY_TOKENS)
                              if transcript else (MAX_CHUNKS, MAX_REPLY_TOKENS))
    chunks = []
    tokens = 0
    for _ in range(_array(r, max_chunks, f"entry {i}'s chunks")):
        _shaped(r, 2, why)
        text = r.value()
        if type(text) is not str:
            raise _bad(why)
        if len(text) > MAX_CHUNK_TEXT:
            raise _invalid(f"entry {i}: a chunk's text is over {MAX_CHUNK_TEXT} characters")
        n = r.array()
        tokens += n
        if tokens > max_tokens:
            raise _invalid(f"entry {i}: over {max_tokens} reply tokens")
        chunks.append((text, tuple(_int(t, 0, 2**32 - 1, what) for t in r.ints(n))))
    if not chunks and not transcript:
        raise _invalid(f"entry {i}: a reply has at least one chunk (an empty reply is a failed challenge)")
    return tuple(chunks)


def _tries(v: Any, i: int) -> int:
    return _int(v, 1, MAX_TRIES, f"entry {i}'s tries")


def _read_outcome(r: codec.ShapeReader, i: int, transcript: bool = False) -> ReplyOutcome | FailOutcome:
    n = r.array()
    tag = _typed(r.value(), int, f"entry {i}'s outcome kind") if n else None
    if tag == OUTCOME_FAIL and n == 3:
        kind = _typed(r.value(), str, f"entry {i}'s failure kind")
        if kind not in FAIL_KINDS:
            raise _invalid(f"entry {i}: failure kind {kind[:20]!r} is not one of {', '.join(FAIL_KINDS)}")
        return FailOutcome(kind, _tries(r.value(), i))
    if tag != OUTCOME_REPLY or n != 7:
        raise _bad(f"entry {i}'s outcome is [0, served_by, chunks, signature, signed_at_ms, score, tries] or "
                   "[1, kind, tries]")
    return ReplyOutcome(
        served_by=_bytes(r.value(), NODE_ID_LEN, f"entry {i}'s serving node id"),
        chunks=_read_chunks(r, i, transcript),
        signature=_bytes(r.value(), crypto.ED25519_SIG_LEN, f"entry {i}'s reply signature"),
        signed_at_ms=_int(r.value(), 0, 2**64 - 1, f"entry {i}'s signed_at_ms"),
        score=_int(r.value(), 0, SCALE, f"entry {i}'s score"),
        tries=_tries(r.value(), i),
    )


def decode_outcome(raw: bytes, *, transcript: bool = False) -> ReplyOutcome | FailOutcome:
    """An outcome from its canonical msgpack (``pack(outcome.to_wire())``), read as a report's
    entry is (a ``transcript``'s reply by a transcript's limits): :class:`TxError` on anything off
    (an auditor's saved plan and a verifier's transcript book use it)."""
    return _read(raw, MAX_REPORT_BYTES, "the outcome is not strict msgpack",
                 lambda r: _read_outcome(r, 0, transcript))


def _read_entry(r: codec.ShapeReader, i: int) -> ReportEntry:
    _shaped(r, 4, f"report entry {i} is [node_id, opening, outcome, [earlier reply, ...]]")
    node = _bytes(r.value(), NODE_ID_LEN, f"entry {i}'s node id")
    opening = Opening.from_wire(_read_opening(r))  # checked as an opening already
    opening._check_script_rules()
    outcome = _read_outcome(r, i)
    earlier = []
    for _ in range(_array(r, MAX_TURNS - 1, f"entry {i}'s earlier replies")):
        reply = _read_outcome(r, i)
        if not isinstance(reply, ReplyOutcome):
            raise _invalid(f"entry {i}: an earlier turn's outcome is a reply (a script stops at its first failure)")
        earlier.append(reply)
    if len(earlier) >= opening.turns():
        raise _invalid(f"entry {i}: {len(earlier)} earlier replies to a script of {opening.turns()} turns")
    return ReportEntry(node, opening, outcome, tuple(earlier))


def _read_report(r: codec.ShapeReader) -> AuditReport:
    epoch, key = _epoch(r.value()), _bytes(r.value(), 32, "validator key")
    salt = _bytes(r.value(), SALT_LEN, "plan salt")
    n = _array(r, MAX_CHALLENGES, "report entries")
    return AuditReport(epoch, key, salt, tuple(_read_entry(r, i) for i in range(n)), _sig(r.value()))


def _read_transcripts(r: codec.ShapeReader) -> TranscriptScores:
    epoch, key = _epoch(r.value()), _bytes(r.value(), 32, "validator key")
    nodes = []
    for i in range(_array(r, MAX_TRANSCRIPT_NODES, "transcript nodes")):
        _shaped(r, 2, f"transcript node {i} is [node_id, [score, ...]]")
        node = _bytes(r.value(), NODE_ID_LEN, f"transcript node {i}'s id")
        n = _array(r, MAX_TRANSCRIPTS_PER_NODE, f"transcript node {i}'s scores")
        if n == 0:
            raise _invalid(f"transcript node {i} has no scores")
        nodes.append((node, tuple(_int(v, 0, SCALE, f"transcript node {i}'s score") for v in _values(r, n))))
    ids = [n for n, _ in nodes]
    if any(a >= b for a, b in itertools.pairwise(ids)):
        raise _invalid("transcript nodes come by node id, ascending, each once")
    return TranscriptScores(epoch, key, tuple(nodes), _sig(r.value()))


_ARITY = {KIND_COMMIT: 6, KIND_REPORT: 6, KIND_TRANSCRIPTS: 5}
_LIMIT = {KIND_COMMIT: MAX_COMMIT_BYTES, KIND_REPORT: MAX_REPORT_BYTES, KIND_TRANSCRIPTS: MAX_TRANSCRIPTS_BYTES}
_READERS: dict[int, Callable[[codec.ShapeReader], AuditTx]] = {
    KIND_COMMIT: _read_commit, KIND_REPORT: _read_report, KIND_TRANSCRIPTS: _read_transcripts}


def _read_tx(r: codec.ShapeReader) -> AuditTx:
    """``[kind, *fields]``: the kind first, then its byte limit and arity, then its fields by shape."""
    why = "an audit transaction is [kind 1-3, ...fields]"
    n = r.array()
    kind = r.value() if n else None
    if type(kind) is not int or kind not in _ARITY:
        raise _bad(why)
    if len(r.raw) > _LIMIT[kind]:
        raise TxError(Code.OVERSIZE, f"a {KIND_NAMES[kind]} of {len(r.raw)} bytes, at most {_LIMIT[kind]}")
    if n != _ARITY[kind]:
        raise _bad(f"a {KIND_NAMES[kind]} has {_ARITY[kind] - 1} fields, not {n - 1}")
    return _READERS[kind](r)


def decode_audit_tx(raw: bytes, chain_id: str) -> AuditTx:
    """Strictly decode an audit transaction and check its signature against its own key for
    ``chain_id``. :class:`TxError` on anything off; never raises anything else. The body is read by
    shape: its kind's byte limit applies before its fields are read, and it builds no more objects
    than its kind's schema allows."""
    if not raw.startswith(AUDIT_TAG):
        raise _bad(f"not an audit transaction (no {AUDIT_TAG.decode()} tag)")
    if len(raw) > MAX_REPORT_BYTES + len(AUDIT_TAG):
        raise TxError(Code.OVERSIZE, f"an audit transaction of {len(raw)} bytes, at most {MAX_REPORT_BYTES}")
    body = memoryview(raw)[len(AUDIT_TAG):]
    tx = _read(body, MAX_REPORT_BYTES, "the audit transaction is not strict msgpack", _read_tx)
    kind = tx.KIND
    if encode_tx(tx) != raw:
        raise _bad(f"the {KIND_NAMES[kind]} is not in canonical msgpack form")
    try:
        crypto.ed25519_verify(tx.validator_pk, tx.signature, signing_bytes(chain_id, kind, tx.fields()))
    except crypto.CryptoError:
        raise TxError(Code.BAD_SIGNATURE, f"the {KIND_NAMES[kind]}'s signature does not verify with its own "
                                          "validator key for this chain") from None
    return tx


def reply_outcome(served_by: bytes, chunks: Sequence[tuple[str, Sequence[int]]], signature: bytes,
                  signed_at_ms: int, score: float | int, tries: int = 1) -> ReplyOutcome:
    """A :class:`ReplyOutcome` from a reply as received (the score as a float in [0, 1] or fixed point)."""
    from verifier.audit.reputation import to_fixed

    fixed = score if type(score) is int else to_fixed(float(score))
    return ReplyOutcome(served_by, tuple((t, tuple(ids)) for t, ids in chunks), signature, signed_at_ms, fixed,
                        tries)
