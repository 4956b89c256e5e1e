"""Audit transactions on the committee chain (issue 14 items 2 and 5; docs/committee.md "Audits").

The one codec of the audit protocol: the verifiers' audit loop encodes and signs with it, the
committee's application (:mod:`verifier.audit`) decodes with it. Pure: no state, no clock.

A raw audit transaction is :data:`AUDIT_TAG` followed by one msgpack array ``[kind, *fields]``:

- kind 1 :class:`VrfProof` ``[1, epoch, validator_pk, proof]`` — unsigned: the 80-byte ECVRF proof
  over :func:`verifier.vrf.leader_alpha` of (epoch, the epoch's seed) authenticates itself.
- kind 2 :class:`ChallengeCommit` ``[2, epoch, leader_pk, [[node_id, commitment, [sealed, ...]], ...],
  signature]`` — the challenges FOR ``epoch``, sent by the leader of ``epoch - 1``.
- kind 3 :class:`EpochReport` ``[3, epoch, leader_pk, [entry, ...], signature]`` with each entry
  ``[0, node_id, index, opening, [[text, [token ids]], ...], reply_signature, signed_at_ms, score,
  raw_score]`` (:class:`ReplyEntry`) or ``[1, node_id, index, reason]`` (:class:`SilentEntry`), and
  ``opening`` the array of :meth:`Opening.to_wire`.
- kind 4 :class:`Attestation` ``[4, epoch, validator_pk, report_hash, [score, ...], signature]``.
- kind 5 :class:`SilenceConfirm` ``[5, epoch, validator_pk, node_id, answered, signature]``.

Signatures (kinds 2–5) are Ed25519 by the validator's CometBFT key over
``AUDIT_CONTEXT || len(chain_id) (u8) || chain_id || kind (u8) || msgpack([fields without the
signature])``, so a signature binds one chain and one kind.

Decoding is strict: exact types (bool is not int, a float is a 64-bit float), every length and
count bounded, integers in range, no trailing bytes, and the canonical re-encoding must equal the
input (so a transaction has exactly one byte form and :func:`report_hash` is well defined). The
body is read by shape, the kind first (its byte limit applies before the rest is read), then each
field as its kind's schema has it: a value where a value belongs, each array bounded before its
items, so no transaction builds more objects than its schema allows (docs/fuzzing.md).
Errors are :class:`verifier.tx.TxError` with MALFORMED (shape, types, encoding), INVALID_FIELD
(a value out of range), OVERSIZE or BAD_SIGNATURE, and a reason. Membership, leadership, windows
and content rules are the application's (:mod:`verifier.audit`).

A challenge's plaintext (:class:`Opening`) never goes on the chain before the report reveals it:
the commit carries its :meth:`Opening.commitment` and one sealed box of it per validator
(:func:`overlay.crypto.seal_to_ed25519`), so every validator can open it but no model node can.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import msgpack

from overlay import crypto, signing
from overlay.messages import REQUEST_ID_LEN, ChatMessage, Request, SamplingParams
from verifier import vrf
from verifier.reputation import SCALE
from verifier.tx import DECODE_ERRORS, MAX_CHAIN_ID, MAX_MODEL_ID, Code, TxError, pack

AUDIT_TAG = b"GTAUDIT1"
AUDIT_CONTEXT = b"gentorrent/audit/v1\x00"
KIND_PROOF, KIND_COMMIT, KIND_REPORT, KIND_ATTESTATION, KIND_SILENCE = 1, 2, 3, 4, 5
KIND_NAMES = {KIND_PROOF: "VRF proof", KIND_COMMIT: "challenge commit", KIND_REPORT: "epoch report",
              KIND_ATTESTATION: "attestation", KIND_SILENCE: "silence confirmation"}
ENTRY_REPLY, ENTRY_SILENT = 0, 1

MAX_AUDITED_NODES = 32  # model nodes audited per epoch
MAX_CHALLENGES_PER_NODE = 4
MAX_CHALLENGES = MAX_AUDITED_NODES * MAX_CHALLENGES_PER_NODE
MAX_SEALED = 128  # sealed boxes per challenge (one per validator: the committee's size for audits)
MAX_REPORT_BYTES = 512 * 1024
MAX_COMMIT_BYTES = 1024 * 1024 - 1024  # under CometBFT's default mempool limit on one transaction (1 MiB)
MAX_SMALL_TX_BYTES = 4096  # proofs, attestations, silence confirmations

# Challenge limits (an Opening)
SALT_LEN = 16
COMMITMENT_LEN = 32
PROMPT_KEY_LEN = 16
NODE_ID_LEN = 20
MIN_TOKENS, MAX_TOKENS = 1, 128
MAX_MESSAGES = 4
MAX_CONTENT_BYTES = 4096
MAX_OPENING_BYTES = 64 + MAX_MODEL_ID + MAX_MESSAGES * (MAX_CONTENT_BYTES + 32) + 64
MAX_SEALED_BYTES = MAX_OPENING_BYTES + crypto.SEALED_OVERHEAD
ROLES = ("system", "user", "assistant")
MAX_TEMPERATURE = 5.0
MAX_TOP_K = 1000
MAX_SEED = 2**32 - 1

# Reply limits (a ReplyEntry)
MAX_CHUNKS = 2 * MAX_TOKENS + 4
MAX_REPLY_TOKENS = 2 * MAX_TOKENS
MAX_CHUNK_TEXT = 16 * 1024
MAX_REASON = 200

_CHALLENGE_PERSON = b"gt-challenge"
_PROMPT_PERSON = b"gt-prompt"
_SPACES = re.compile(r"\s+")


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


# msgpack's first bytes of arrays (fixarray, array 16/32), and of maps (fixmap, map 16/32)
_ARRAY_HEADS = frozenset((*range(0x90, 0xA0), 0xDC, 0xDD))
_CONTAINER_HEADS = _ARRAY_HEADS | frozenset((*range(0x80, 0x90), 0xDE, 0xDF))
_MAX_ARRAY = max(MAX_CHUNKS, MAX_CHALLENGES, MAX_SEALED) + 8  # no array anywhere is longer
_T = TypeVar("_T")


class _Reader:
    """A msgpack body read by shape, one item at a time: a value (nil, bool, int, float, str,
    bytes) where the schema has a value, an array header where it has an array, bounded before
    its items are read. An array where a value belongs is refused before it is built, so no
    transaction builds more objects than its schema allows, whatever its bytes (unpacking the
    whole body first let 1 MiB of nested empty arrays take 66 MB, docs/fuzzing.md). msgpack's own
    errors propagate: :func:`_read` maps them to MALFORMED."""

    def __init__(self, raw: bytes | memoryview, max_bin: int) -> None:
        self.raw = raw
        self._u = msgpack.Unpacker(raw=False, strict_map_key=True, max_buffer_size=max(len(raw), 1),
                                   max_bin_len=max_bin, max_str_len=max_bin, max_array_len=_MAX_ARRAY,
                                   max_map_len=0, max_ext_len=0)
        self._u.feed(raw)

    def _head(self) -> int:
        """The first byte of the next item (-1 at the end)."""
        at: int = self._u.tell()
        return self.raw[at] if at < len(self.raw) else -1

    def value(self, why: str = "") -> Any:
        """The next item, a value; MALFORMED (``why``, if given) if it is an array or a map."""
        if self._head() in _CONTAINER_HEADS:
            raise _bad(why or f"an array or map where a value belongs (byte {self._u.tell()})")
        return self._u.unpack()

    def values(self, n: int, why: str = "") -> list[Any]:
        """The next ``n`` items, values: :meth:`value` in one loop (token ids come by the thousand)."""
        raw, u, out = self.raw, self._u, []
        for _ in range(n):
            at = u.tell()
            if at < len(raw) and raw[at] in _CONTAINER_HEADS:
                raise _bad(why or f"an array or map where a value belongs (byte {at})")
            out.append(u.unpack())
        return out

    def header(self, why: str) -> int:
        """The length of the next item, an array, whose items follow; MALFORMED ``why`` if it is none."""
        try:
            n: int = self._u.read_array_header()
        except ValueError:  # "Unexpected type header": no array
            raise _bad(why) from None
        if n > _MAX_ARRAY:  # what msgpack's max_array_len raises, which read_array_header does not check
            raise ValueError(f"{n} exceeds max_array_len({_MAX_ARRAY})")
        return n

    def array(self, most: int, what: str) -> int:
        """:meth:`header` of an array of at most ``most`` items (INVALID_FIELD if more)."""
        n = self.header(f"{what}: expected an array")
        if n > most:
            raise _invalid(f"{what}: {n} items, at most {most}")
        return n

    def shaped(self, n: int, why: str) -> None:
        """The header of an array of exactly ``n`` items; MALFORMED ``why`` otherwise."""
        if self.header(why) != n:
            raise _bad(why)

    def done(self) -> bool:
        """Whether every byte was read."""
        at: int = self._u.tell()
        return at == len(self.raw)


def _read(raw: bytes | memoryview, max_bin: int, why: str, read: Callable[[_Reader], _T]) -> _T:
    """``read`` of a :class:`_Reader` of ``raw``, which must take every byte; msgpack's errors and
    trailing bytes are MALFORMED ``why (error)``."""
    r = _Reader(raw, max_bin)
    try:
        out = read(r)
    except DECODE_ERRORS as exc:
        raise _bad(f"{why} ({type(exc).__name__})") from None
    if not r.done():
        raise _bad(f"{why} (ExtraData)")
    return out


# =========================================================================== the challenge


def _check_params(p: SamplingParams) -> None:
    if type(p.temperature) is not float or not math.isfinite(p.temperature) \
            or not 0.0 <= p.temperature <= MAX_TEMPERATURE:
        raise _invalid(f"challenge temperature must be a float within 0..{MAX_TEMPERATURE:g}")
    if type(p.top_p) is not float or not math.isfinite(p.top_p) or not 0.0 < p.top_p <= 1.0:
        raise _invalid("challenge top_p must be a float within (0, 1]")
    if type(p.top_k) is not int or not 0 <= p.top_k <= MAX_TOP_K:
        raise _invalid(f"challenge top_k must be within 0..{MAX_TOP_K}")
    if type(p.max_tokens) is not int or not MIN_TOKENS <= p.max_tokens <= MAX_TOKENS:
        raise _invalid(f"challenge max_tokens must be within {MIN_TOKENS}..{MAX_TOKENS}")
    if p.seed is not None and (type(p.seed) is not int or not 0 <= p.seed <= MAX_SEED):
        raise _invalid(f"challenge seed must be nil or within 0..{MAX_SEED}")


def normalise_prompt(text: str) -> str:
    """The form a prompt is compared in for reuse: stripped, casefolded, whitespace runs as one space."""
    return _SPACES.sub(" ", text.strip().casefold())


@dataclass(frozen=True, slots=True)
class Opening:
    """The plaintext of one challenge: a salt, the model, the chat messages (the last is the user's
    question) and the sampling parameters. Not a transaction: it travels sealed in a
    :class:`ChallengeCommit` and in the clear in the :class:`EpochReport` that answers it.

    Limits: 1 to :data:`MAX_MESSAGES` messages, each of role system/user/assistant and at most
    :data:`MAX_CONTENT_BYTES` UTF-8 bytes, the last from the user; max_tokens 1..128; the other
    parameters within what model nodes accept. :meth:`check` raises :class:`TxError` otherwise."""

    salt: bytes
    model: str
    messages: tuple[ChatMessage, ...]
    params: SamplingParams

    def check(self) -> None:
        if type(self.salt) is not bytes or len(self.salt) != SALT_LEN:
            raise _bad(f"challenge salt must be {SALT_LEN} bytes")
        if type(self.model) is not str or not 0 < len(self.model.encode()) <= MAX_MODEL_ID:
            raise _invalid(f"challenge model id must be 1-{MAX_MODEL_ID} bytes")
        if not 1 <= len(self.messages) <= MAX_MESSAGES:
            raise _invalid(f"a challenge has 1 to {MAX_MESSAGES} messages")
        for m in self.messages:
            if type(m.role) is not str or m.role not in ROLES or type(m.content) is not str:
                raise _invalid(f"a challenge message's role is one of {', '.join(ROLES)}")
            if len(m.content.encode("utf-8", errors="surrogatepass")) > MAX_CONTENT_BYTES:
                raise _invalid(f"a challenge message holds at most {MAX_CONTENT_BYTES} bytes")
        if self.messages[-1].role != "user" or not self.messages[-1].content.strip():
            raise _invalid("a challenge's last message is the user's (non-empty) question")
        _check_params(self.params)

    def to_wire(self) -> list[Any]:
        p = self.params
        return [self.salt, self.model, [[m.role, m.content] for m in self.messages],
                [p.temperature, p.top_p, p.top_k, p.max_tokens, p.seed]]

    def encode(self) -> bytes:
        """The canonical msgpack of :meth:`to_wire` (what is sealed to each validator)."""
        self.check()
        return pack(self.to_wire())

    @classmethod
    def from_wire(cls, f: Any) -> Opening:
        """The opening from its wire array; :class:`TxError` if anything is off."""
        f = _list(f, 4, "opening")
        if len(f) != 4:
            raise _bad("an opening is [salt, model, messages, params]")
        salt = _bytes(f[0], SALT_LEN, "challenge salt")
        model = _typed(f[1], str, "challenge model")
        msgs = []
        for m in _list(f[2], MAX_MESSAGES, "challenge messages"):
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
        opening.check()
        return opening

    @classmethod
    def decode(cls, raw: bytes) -> Opening:
        """Strictly decode :meth:`encode`'s bytes (a sealed box's content); :class:`TxError` if off."""
        if len(raw) > MAX_OPENING_BYTES:
            raise TxError(Code.OVERSIZE, f"a challenge opening of {len(raw)} bytes, at most {MAX_OPENING_BYTES}")
        opening = cls.from_wire(_read(raw, MAX_OPENING_BYTES, "the challenge opening is not msgpack", _read_opening))
        if pack(opening.to_wire()) != raw:
            raise _bad("the challenge opening is not in canonical msgpack form")
        return opening

    def request(self, request_id: bytes = bytes(REQUEST_ID_LEN), k: int = 3) -> Request:
        """The request a model node receives for this challenge (no continuation, no return paths:
        the sender adds its own paths; the digest covers neither)."""
        return Request(request_id=request_id, model=self.model, messages=self.messages, params=self.params,
                       k=k, return_paths=(), continuation="")

    def digest(self) -> bytes:
        """:func:`overlay.signing.request_digest` of :meth:`request`: what the node's reply signs."""
        return signing.request_digest(self.request())

    def commitment(self) -> bytes:
        """BLAKE2b-256(salt || request digest), personalised ``gt-challenge``: what the commit holds."""
        return crypto.blake2b(self.salt + self.digest(), size=COMMITMENT_LEN, person=_CHALLENGE_PERSON)

    def prompt_key(self) -> bytes:
        """BLAKE2b-128 of the last user message normalised (:func:`normalise_prompt`), personalised
        ``gt-prompt``: prompts are never reused, and the chain remembers used keys."""
        last = next(m.content for m in reversed(self.messages) if m.role == "user")
        return crypto.blake2b(normalise_prompt(last).encode("utf-8", errors="surrogatepass"), size=PROMPT_KEY_LEN,
                              person=_PROMPT_PERSON)


# =========================================================================== transactions


@dataclass(frozen=True, slots=True)
class VrfProof:
    """Kind 1: a validator's VRF proof for the leader election of ``epoch`` (unsigned)."""

    epoch: int
    validator_pk: bytes
    proof: bytes

    KIND = KIND_PROOF

    def fields(self) -> list[Any]:
        return [self.epoch, self.validator_pk, self.proof]


@dataclass(frozen=True, slots=True)
class Challenge:
    """One committed challenge: the audited node, the opening's commitment, and the opening sealed
    to each validator (``sealed[i]`` to the i-th of the committee's validators, sorted as
    ``CommitteeState.validators``, when the commit was made)."""

    node_id: bytes
    commitment: bytes
    sealed: tuple[bytes, ...]

    def to_wire(self) -> list[Any]:
        return [self.node_id, self.commitment, list(self.sealed)]

    def open(self, index: int, ed25519_seed32: bytes) -> Opening:
        """The opening in ``sealed[index]``, opened with this validator's seed and checked against
        the commitment. :class:`TxError` (INVALID_FIELD) if the box does not open, does not decode
        or does not match: the committer sealed something else to this validator."""
        if not 0 <= index < len(self.sealed):
            raise _invalid(f"no sealed box {index} in this challenge ({len(self.sealed)} boxes)")
        try:
            raw = crypto.open_sealed_ed25519(ed25519_seed32, self.sealed[index])
        except crypto.CryptoError as exc:
            raise _invalid(f"challenge for node {self.node_id.hex()[:8]}: sealed box {index} does not open "
                           f"({exc})") from None
        opening = Opening.decode(raw)
        if opening.commitment() != self.commitment:
            raise _invalid(f"challenge for node {self.node_id.hex()[:8]}: the sealed opening does not match "
                           "its commitment")
        return opening


def seal_challenge(node_id: bytes, opening: Opening, validator_pks: Sequence[bytes]) -> Challenge:
    """The :class:`Challenge` for ``opening`` to ``node_id``, sealed to each validator key in order."""
    raw = opening.encode()
    return Challenge(node_id, opening.commitment(), tuple(crypto.seal_to_ed25519(pk, raw) for pk in validator_pks))


@dataclass(frozen=True, slots=True)
class ChallengeCommit:
    """Kind 2: the challenges for ``epoch``, signed by the leader of ``epoch - 1``."""

    epoch: int
    leader_pk: bytes
    challenges: tuple[Challenge, ...]
    signature: bytes = b""

    KIND = KIND_COMMIT

    def fields(self) -> list[Any]:
        return [self.epoch, self.leader_pk, [c.to_wire() for c in self.challenges]]


@dataclass(frozen=True, slots=True)
class ReplyEntry:
    """One answered challenge in a report: every reply chunk's (text, token ids) in order, the
    final chunk's signature and signing time, and the leader's proposed calibrated score and raw
    1/PPL in fixed point (:func:`verifier.reputation.to_fixed`).

    ``server``: the model node that generated and signed the reply. It is the challenged node
    (``node_id``) unless that node forwarded the challenge to a member of its group, as
    Algorithm 2 lets it do with any request (the one hop of paper §3.3): the reply is then
    checked against, and scored for, the node that served it (empty: ``node_id``)."""

    node_id: bytes
    index: int
    opening: Opening
    chunks: tuple[tuple[str, tuple[int, ...]], ...]
    signature: bytes
    signed_at_ms: int
    score: int
    raw_score: int
    server: bytes = b""

    def __post_init__(self) -> None:
        if self.server == self.node_id:  # one form per entry: empty means the challenged node
            object.__setattr__(self, "server", b"")

    @property
    def served_by(self) -> bytes:
        return self.server or self.node_id

    def to_wire(self) -> list[Any]:
        return [ENTRY_REPLY, self.node_id, self.index, self.opening.to_wire(),
                [[t, list(ids)] for t, ids in self.chunks], self.signature, self.signed_at_ms, self.score,
                self.raw_score, self.served_by]

    def text(self) -> str:
        return "".join(t for t, _ in self.chunks)

    def token_ids(self) -> tuple[int, ...]:
        return tuple(i for _, ids in self.chunks for i in ids)

    def verify(self, ed25519_public: bytes) -> None:
        """:class:`overlay.signing.ReplyVerifyError` unless the chunks, chained from the opening's
        request digest, carry the serving node's (key ``ed25519_public``) final signature."""
        digest = self.opening.digest()
        chain = signing.chain_start(digest)
        for text, ids in self.chunks:
            chain = signing.chain_next(chain, text, ids)
        signing.verify_reply(ed25519_public, self.signature, digest, chain, True, self.opening.model, self.served_by,
                             self.signed_at_ms)


@dataclass(frozen=True, slots=True)
class SilentEntry:
    """A committed challenge the leader got no valid reply to, and why (at most 200 characters)."""

    node_id: bytes
    index: int
    reason: str

    def to_wire(self) -> list[Any]:
        return [ENTRY_SILENT, self.node_id, self.index, self.reason]


Entry = ReplyEntry | SilentEntry


@dataclass(frozen=True, slots=True)
class EpochReport:
    """Kind 3: the leader of ``epoch``'s report, one entry per committed challenge in commit order."""

    epoch: int
    leader_pk: bytes
    entries: tuple[Entry, ...]
    signature: bytes = b""

    KIND = KIND_REPORT

    def fields(self) -> list[Any]:
        return [self.epoch, self.leader_pk, [e.to_wire() for e in self.entries]]

    def replies(self) -> tuple[ReplyEntry, ...]:
        return tuple(e for e in self.entries if isinstance(e, ReplyEntry))


@dataclass(frozen=True, slots=True)
class Attestation:
    """Kind 4: a validator's own calibrated scores (fixed point), one per :class:`ReplyEntry` of
    the report with ``report_hash``, in order (void entries too: any score; they count for nothing)."""

    epoch: int
    validator_pk: bytes
    report_hash: bytes
    scores: tuple[int, ...]
    signature: bytes = b""

    KIND = KIND_ATTESTATION

    def fields(self) -> list[Any]:
        return [self.epoch, self.validator_pk, self.report_hash, list(self.scores)]


@dataclass(frozen=True, slots=True)
class SilenceConfirm:
    """Kind 5: whether ``node_id`` answered this validator's own challenge (a fresh prompt of its
    own, not on chain) after the report of ``epoch`` called it silent."""

    epoch: int
    validator_pk: bytes
    node_id: bytes
    answered: bool
    signature: bytes = b""

    KIND = KIND_SILENCE

    def fields(self) -> list[Any]:
        return [self.epoch, self.validator_pk, self.node_id, self.answered]


AuditTx = VrfProof | ChallengeCommit | EpochReport | Attestation | SilenceConfirm
Signed = ChallengeCommit | EpochReport | Attestation | SilenceConfirm


def signing_bytes(chain_id: str, kind: int, fields: list[Any]) -> bytes:
    """What a validator signs: context, chain id (u8 length), kind (u8), msgpack of the fields."""
    chain = chain_id.encode()
    if not 0 < len(chain) <= MAX_CHAIN_ID:
        raise ValueError(f"chain id must be 1-{MAX_CHAIN_ID} bytes")
    return AUDIT_CONTEXT + bytes([len(chain)]) + chain + bytes([kind]) + pack(fields)


def encode_tx(tx: AuditTx) -> bytes:
    """The raw transaction (the signature, if any, as the object holds it)."""
    tail = [] if isinstance(tx, VrfProof) else [tx.signature]
    return AUDIT_TAG + pack([tx.KIND, *tx.fields(), *tail])


def _signer(tx: Signed) -> bytes:
    return tx.leader_pk if isinstance(tx, ChallengeCommit | EpochReport) else tx.validator_pk


def sign_tx(tx: AuditTx, chain_id: str, seed32: bytes) -> bytes:
    """``tx`` signed with the validator's Ed25519 seed (its CometBFT key), as raw bytes. The key in
    ``tx`` (``leader_pk`` / ``validator_pk``) must be the seed's. A :class:`VrfProof` is only
    encoded (its proof is its signature). Raises ValueError for a mismatched key."""
    key = crypto.SigningKey.from_bytes(seed32)
    if isinstance(tx, VrfProof):
        if tx.validator_pk != key.public_bytes:
            raise ValueError("the VRF proof names another validator key than this seed's")
        return encode_tx(tx)
    if _signer(tx) != key.public_bytes:
        raise ValueError("the transaction names another validator key than this seed's")
    signed = replace(tx, signature=key.sign(signing_bytes(chain_id, tx.KIND, tx.fields())))
    return encode_tx(signed)


def prove_leader(epoch: int, epoch_seed: bytes, seed32: bytes) -> VrfProof:
    """This validator's :class:`VrfProof` for ``epoch`` whose seed is ``epoch_seed`` (``/audit``'s ``seed``)."""
    return VrfProof(epoch, vrf.public_key(seed32), vrf.prove(seed32, vrf.leader_alpha(epoch, epoch_seed)))


def report_hash(report: EpochReport | bytes) -> bytes:
    """SHA-256 of the report's raw transaction (its one canonical byte form)."""
    return crypto.sha256(report if isinstance(report, bytes) else encode_tx(report))


# --------------------------------------------------------------------------- decoding


def _epoch(v: Any) -> int:
    return _int(v, 0, 2**63 - 1, "epoch")


def _score(v: Any, what: str) -> int:
    return _int(v, 0, SCALE, what)


# Each reader below takes one item of the schema from a :class:`_Reader`, in wire order, and checks
# it as it goes (Python evaluates arguments left to right, the order of the fields on the wire).


def _read_opening(r: _Reader) -> list[Any]:
    """An opening's wire array, read by shape for :meth:`Opening.from_wire` to check."""
    if r.array(4, "opening") != 4:
        raise _bad("an opening is [salt, model, messages, params]")
    salt, model = r.value(), r.value()
    messages = [_read_message(r) for _ in range(r.array(MAX_MESSAGES, "challenge messages"))]
    why = "challenge params are [temperature, top_p, top_k, max_tokens, seed]"
    if r.array(5, "challenge params") != 5:
        raise _bad(why)
    return [salt, model, messages, r.values(5, why)]


def _read_message(r: _Reader) -> list[Any]:
    why = "a challenge message is [role, content]"
    r.shaped(2, why)
    return r.values(2, why)


def _read_challenge(r: _Reader, i: int) -> Challenge:
    r.shaped(3, f"challenge {i} is not [node_id, commitment, sealed boxes]")
    node_id = _bytes(r.value(), NODE_ID_LEN, f"challenge {i}'s node id")
    commitment = _bytes(r.value(), COMMITMENT_LEN, f"challenge {i}'s commitment")
    sealed = r.values(r.array(MAX_SEALED, f"challenge {i}'s sealed boxes"))
    for s in sealed:
        if type(s) is not bytes or not crypto.SEALED_OVERHEAD < len(s) <= MAX_SEALED_BYTES:
            raise _bad(f"challenge {i}: a sealed box is {crypto.SEALED_OVERHEAD + 1}..{MAX_SEALED_BYTES} bytes")
    return Challenge(node_id, commitment, tuple(sealed))


def _read_entry(r: _Reader, i: int) -> Entry:
    n = r.header(f"report entry {i} is not an array")
    if not n:
        raise _bad(f"report entry {i} is not an array")
    tag = _typed(r.value(), int, f"entry {i}'s kind")
    if tag == ENTRY_SILENT:
        if n != 4:
            raise _bad(f"silent entry {i} is [1, node_id, index, reason]")
        return _read_silent(r, i)
    if tag != ENTRY_REPLY:
        raise _bad(f"entry {i}: unknown entry kind {tag}")
    if n != 10:
        raise _bad(f"reply entry {i} is [0, node_id, index, opening, chunks, signature, signed_at_ms, score, "
                   "raw_score, server]")
    return _read_reply(r, i)


def _read_silent(r: _Reader, i: int) -> SilentEntry:
    node_id = _bytes(r.value(), NODE_ID_LEN, f"entry {i}'s node id")
    index = _int(r.value(), 0, MAX_CHALLENGES - 1, f"entry {i}'s index")
    reason = _typed(r.value(), str, f"entry {i}'s reason")
    if len(reason) > MAX_REASON:
        raise _invalid(f"entry {i}'s reason is over {MAX_REASON} characters")
    return SilentEntry(node_id, index, reason)


def _read_reply(r: _Reader, i: int) -> ReplyEntry:
    return ReplyEntry(
        node_id=_bytes(r.value(), NODE_ID_LEN, f"entry {i}'s node id"),
        index=_int(r.value(), 0, MAX_CHALLENGES - 1, f"entry {i}'s index"),
        opening=Opening.from_wire(_read_opening(r)),
        chunks=_read_chunks(r, i),
        signature=_bytes(r.value(), crypto.ED25519_SIG_LEN, f"entry {i}'s reply signature"),
        signed_at_ms=_int(r.value(), 0, 2**64 - 1, f"entry {i}'s signed_at_ms"),
        score=_score(r.value(), f"entry {i}'s score"),
        raw_score=_score(r.value(), f"entry {i}'s raw score"),
        server=_bytes(r.value(), NODE_ID_LEN, f"entry {i}'s serving node id"),
    )


def _read_chunks(r: _Reader, i: int) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """A reply's [text, token ids] chunks: at most :data:`MAX_CHUNKS`, :data:`MAX_REPLY_TOKENS` ids in all."""
    why, what = f"entry {i}: a chunk is [text, token ids]", f"entry {i}'s token id"
    chunks = []
    tokens = 0
    for _ in range(r.array(MAX_CHUNKS, f"entry {i}'s chunks")):
        r.shaped(2, why)
        text = r.value(why)
        if type(text) is not str:
            raise _bad(why)
        if len(text) > MAX_CHUNK_TEXT:
            raise _invalid(f"entry {i}: a chunk's text is over {MAX_CHUNK_TEXT} characters")
        n = r.header(why)
        tokens += n
        if tokens > MAX_REPLY_TOKENS:
            raise _invalid(f"entry {i}: over {MAX_REPLY_TOKENS} reply tokens")
        chunks.append((text, tuple(_int(t, 0, 2**32 - 1, what) for t in r.values(n))))
    if not chunks:
        raise _invalid(f"entry {i}: a reply has at least one chunk (an empty reply is a silent entry)")
    return tuple(chunks)


def _read_proof(r: _Reader) -> VrfProof:
    return VrfProof(_epoch(r.value()), _bytes(r.value(), vrf.KEY_LEN, "validator key"),
                    _bytes(r.value(), vrf.PROOF_LEN, "VRF proof"))


def _read_commit(r: _Reader) -> ChallengeCommit:
    epoch, leader = _epoch(r.value()), _bytes(r.value(), 32, "leader key")
    n = r.array(MAX_CHALLENGES, "challenges")
    return ChallengeCommit(epoch, leader, tuple(_read_challenge(r, i) for i in range(n)), _sig(r.value()))


def _read_report(r: _Reader) -> EpochReport:
    epoch, leader = _epoch(r.value()), _bytes(r.value(), 32, "leader key")
    n = r.array(MAX_CHALLENGES, "report entries")
    return EpochReport(epoch, leader, tuple(_read_entry(r, i) for i in range(n)), _sig(r.value()))


def _read_attestation(r: _Reader) -> Attestation:
    epoch, key = _epoch(r.value()), _bytes(r.value(), 32, "validator key")
    report = _bytes(r.value(), 32, "report hash")
    n = r.array(MAX_CHALLENGES, "attested scores")
    return Attestation(epoch, key, report, tuple(_score(s, "attested score") for s in r.values(n)), _sig(r.value()))


def _read_silence(r: _Reader) -> SilenceConfirm:
    return SilenceConfirm(_epoch(r.value()), _bytes(r.value(), 32, "validator key"),
                          _bytes(r.value(), NODE_ID_LEN, "node id"), _typed(r.value(), bool, "answered"),
                          _sig(r.value()))


_ARITY = {KIND_PROOF: 4, KIND_COMMIT: 5, KIND_REPORT: 5, KIND_ATTESTATION: 6, KIND_SILENCE: 6}
_LIMIT = {KIND_PROOF: MAX_SMALL_TX_BYTES, KIND_COMMIT: MAX_COMMIT_BYTES, KIND_REPORT: MAX_REPORT_BYTES,
          KIND_ATTESTATION: MAX_SMALL_TX_BYTES, KIND_SILENCE: MAX_SMALL_TX_BYTES}
_READERS: dict[int, Callable[[_Reader], AuditTx]] = {
    KIND_PROOF: _read_proof, KIND_COMMIT: _read_commit, KIND_REPORT: _read_report,
    KIND_ATTESTATION: _read_attestation, KIND_SILENCE: _read_silence}


def _read_tx(r: _Reader) -> AuditTx:
    """``[kind, *fields]``: the kind first, then its byte limit and arity, then its fields by shape."""
    why = "an audit transaction is [kind 1-5, ...fields]"
    n = r.header(why)
    kind = r.value(why) if n else None
    if type(kind) is not int or kind not in _ARITY:
        raise _bad(why)
    if len(r.raw) > _LIMIT[kind]:
        raise TxError(Code.OVERSIZE, f"a {KIND_NAMES[kind]} of {len(r.raw)} bytes, at most {_LIMIT[kind]}")
    if n != _ARITY[kind]:
        raise _bad(f"a {KIND_NAMES[kind]} has {_ARITY[kind] - 1} fields, not {n - 1}")
    return _READERS[kind](r)


def decode_audit_tx(raw: bytes, chain_id: str) -> AuditTx:
    """Strictly decode an audit transaction and check its signature against its own key for
    ``chain_id`` (a :class:`VrfProof` is checked by the application, which knows the epoch's seed).
    :class:`TxError` on anything off; never raises anything else. The body is read by shape
    (:class:`_Reader`): its kind's byte limit applies before its fields are read, and it builds no
    more objects than its kind's schema allows."""
    if not raw.startswith(AUDIT_TAG):
        raise _bad("not an audit transaction (no GTAUDIT1 tag)")
    if len(raw) > MAX_COMMIT_BYTES + len(AUDIT_TAG):
        raise TxError(Code.OVERSIZE, f"an audit transaction of {len(raw)} bytes, at most {MAX_COMMIT_BYTES}")
    body = memoryview(raw)[len(AUDIT_TAG):]
    tx = _read(body, MAX_COMMIT_BYTES, "the audit transaction is not strict msgpack", _read_tx)
    kind = tx.KIND
    if encode_tx(tx) != raw:
        raise _bad(f"the {KIND_NAMES[kind]} is not in canonical msgpack form")
    if not isinstance(tx, VrfProof):
        try:
            crypto.ed25519_verify(_signer(tx), tx.signature, signing_bytes(chain_id, kind, tx.fields()))
        except crypto.CryptoError:
            raise TxError(Code.BAD_SIGNATURE, f"the {KIND_NAMES[kind]}'s signature does not verify with its own "
                                              "validator key for this chain") from None
    return tx


def _sig(v: Any) -> bytes:
    if type(v) is not bytes:
        raise _bad("signature: expected bytes")
    if len(v) != crypto.ED25519_SIG_LEN:
        raise TxError(Code.BAD_SIGNATURE, f"a signature of {len(v)} bytes, expected {crypto.ED25519_SIG_LEN}")
    return v


def reply_entry(node_id: bytes, index: int, opening: Opening, chunks: Sequence[tuple[str, Sequence[int]]],
                signature: bytes, signed_at_ms: int, score: float | int, raw_score: float | int) -> ReplyEntry:
    """A :class:`ReplyEntry` from a reply as received (scores as floats in [0, 1] or fixed point)."""
    from verifier.reputation import to_fixed

    def fixed(x: float | int) -> int:
        return x if type(x) is int else to_fixed(float(x))

    return ReplyEntry(node_id, index, opening, tuple((t, tuple(ids)) for t, ids in chunks), signature,
                      signed_at_ms, fixed(score), fixed(raw_score))

