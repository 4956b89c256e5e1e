"""Users' transcripts for the committee's audits (decision 0015): what both sides compute, and
the wire format between a donor's client (``user_client/transcripts.py``) and a verifier
(``verifier/abci_app.py``, which feeds :mod:`verifier.audit.transcripts`' book).

A donor's client commits to a request before sending it; a verifier's book checks the transcript
against that commitment later. The commitment, the one value both sides derive, lives here so
the user's side needs nothing from the verifier's. Pure: no I/O, no clock (times are passed in).

Wire format (msgpack with bin types for bytes; canonical: :func:`decode_commit` and
:func:`decode_reveal` refuse any other encoding of the same values, and trailing bytes)::

    commit    = [1, donor_node_id(20), verifier_key(32), sent_ms(int), commitment(32), signature(64)]
                signature: Ed25519(donor's node key, COMMIT_CONTEXT + msgpack([donor, verifier_key,
                                                                               sent_ms, commitment]))
    sealed    = seal_to_ed25519(verifier_key, reveal)          (at most MAX_REVEAL_BYTES)
    reveal    = [1, donor_node_id(20), verifier_key(32), body, signature(64)]
                signature: Ed25519(donor's node key, REVEAL_CONTEXT + msgpack([donor, verifier_key, body]))
    body      = [0, commitment(32)]                                  "no reply came"
              | [1, node_id(20), nonce(16), model(str), [[role, content], ...],
                 [temperature(float), top_p(float), top_k(int), max_tokens(int), seed(int|nil)],
                 request_id(16), served_by(20), [[text, [token id, ...]], ...],
                 reply_signature(64), signed_at_ms(int)]              a transcript

The commit goes in the clear (``abci_query`` :data:`COMMIT_PATH`): it shows the verifier only
the donor and a hash. Both messages name the verifier's validator key, so one verifier cannot
hand a donor's commit or reveal to another; ``sent_ms`` (the donor's clock) lets a verifier refuse
a commit replayed later (:data:`MAX_SKEW_MS`), which would otherwise stand unrevealed and burn
the donor. The reveal is sealed to the verifier's key, like a donated prompt
(:mod:`overlay.directory.donation`): only that verifier reads the prompt and the reply.

Limits: a commit at most :data:`MAX_COMMIT_BYTES`; a sealed reveal at most
:data:`MAX_REVEAL_BYTES`; 1 to :data:`TRANSCRIPT_MAX_MESSAGES` messages, a model id of 1 to
:data:`MAX_MODEL_ID` bytes, at most :data:`TRANSCRIPT_MAX_CHUNKS` chunks and
:data:`TRANSCRIPT_MAX_REPLY_TOKENS` token ids (each < 2^32), a chunk's text at most
:data:`MAX_CHUNK_TEXT` characters, any other string at most :data:`TRANSCRIPT_PROMPT_BYTES`.
Two sets of request limits are defined here, once: an audit challenge's (:func:`opening_problem`,
tight: a challenge goes on the chain; verifier/audit/tx.py takes them) and a user's transcript's
(:func:`transcript_problem`, decision 0032: every request model nodes serve by default, so that
no request is known to go unchecked). :func:`fits` adds "no seed": the check a donor's client
makes before choosing a request (a transcript that breaks them voids the donor's set).

Every refusal of :func:`decode_commit`, :func:`unseal`, :func:`decode_reveal`,
:func:`verify_commit` and :func:`verify_reveal` is a :class:`TranscriptError` with a reason;
nothing else is raised on any input (``tests/fuzz/targets.py`` ``TranscriptWireTarget``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from overlay.directory.donation import Signer
from overlay.directory.registration import MAX_MODEL_ID
from overlay.wire import codec, crypto
from overlay.wire.identity import NODE_ID_LEN, node_id_of
from overlay.wire.messages import REQUEST_ID_LEN, ChatMessage, Request, SamplingParams

COMMITMENT_LEN = 32
NONCE_LEN = 16
_PERSON = b"gt-transcript"

TRANSCRIPT_VERSION = 1
COMMIT_CONTEXT = b"gentorrent/transcript-commit/v1\x00"
REVEAL_CONTEXT = b"gentorrent/transcript-reveal/v1\x00"
BODY_NO_REPLY, BODY_TRANSCRIPT = 0, 1
SIGNATURE_LEN = 64
KEY_LEN = 32
# The verifier's CometBFT RPC queries (abci_query): the commit (in the clear), then the sealed reveal.
# The key to seal to is the donation key (overlay.directory.donation.KEY_PATH, "/audit/donate_key").
COMMIT_PATH = "/audit/transcript_commit"
REVEAL_PATH = "/audit/transcript_reveal"
MAX_SKEW_MS = 300_000  # a commit's sent_ms within 5 minutes of the verifier's clock

# Sizes of the wire format
MAX_COMMIT_BYTES = 256
MAX_REVEAL_BYTES = 256 * 1024  # sealed; as hex in an RPC URL, well under CometBFT's 1 MB header limit
# An audit challenge's limits, here once (overlay imports no role package; verifier/audit/tx.py,
# the Opening's and the ReplyOutcome's, takes them from here)
MAX_MESSAGES = 16  # 8 user turns with their replies (decision 0027; was 8)
MAX_TURNS = MAX_MESSAGES // 2  # user turns in a challenge's script, and in a donation (decision 0027)
MAX_CONTENT_BYTES = 8192
MIN_TOKENS, MAX_TOKENS = 1, 1024
MAX_TEMPERATURE = 5.0
MAX_TOP_K = 1000
MAX_SEED = 2**32 - 1
ROLES = ("system", "user", "assistant")
MAX_CHUNKS = 2 * MAX_TOKENS + 4
MAX_REPLY_TOKENS = 2 * MAX_TOKENS
MAX_CHUNK_TEXT = 16 * 1024
MAX_TOKEN_ID = 2**32 - 1
# A user's transcript's limits (decision 0032): every request a model node serves by default, not
# only those an audit challenge may be. A request outside them is never checked by anyone: a node
# that has read these numbers would serve exactly those cheaply (the longest, dearest ones).
TRANSCRIPT_MAX_MESSAGES = 256  # what one overlay Request carries (overlay.wire.messages.Request)
TRANSCRIPT_MAX_TOKENS = 4096  # model nodes' default ceiling (model_node.server: max_tokens_limit)
TRANSCRIPT_PROMPT_BYTES = 128 * 1024  # the messages' UTF-8 bytes: a reveal holds them and the longest reply
TRANSCRIPT_MAX_CHUNKS = 2 * TRANSCRIPT_MAX_TOKENS + 4
TRANSCRIPT_MAX_REPLY_TOKENS = 2 * TRANSCRIPT_MAX_TOKENS

__all__ = [
    "COMMITMENT_LEN", "COMMIT_PATH", "MAX_COMMIT_BYTES", "MAX_REVEAL_BYTES", "NONCE_LEN", "REVEAL_PATH", "Commit",
    "NoReply", "Reveal", "Revealed", "TranscriptError", "commitment", "decode_commit", "decode_reveal",
    "encode_commit", "encode_reveal", "fits", "opening_problem", "seal_reveal", "transcript_problem", "unseal",
    "verify_commit", "verify_reveal",
]


def commitment(nonce: bytes, node_id: bytes, reply_digest: bytes) -> bytes:
    """BLAKE2b-256(nonce ‖ node id ‖ reply digest), personalised ``gt-transcript``: what a donor
    commits before sending the request to ``node_id``; ``reply_digest`` is
    :func:`overlay.anon.signing.request_digest` of the request (its id included) addressed to that node."""
    if len(nonce) != NONCE_LEN or len(node_id) != NODE_ID_LEN or len(reply_digest) != 32:
        raise ValueError("a transcript commitment takes a 16-byte nonce, a 20-byte node id and a 32-byte digest")
    return crypto.blake2b(nonce + node_id + reply_digest, size=COMMITMENT_LEN, person=_PERSON)


def committed_digest(model: str, messages: Sequence[ChatMessage], params: SamplingParams, request_id: bytes,
                     target: bytes) -> bytes:
    """:func:`overlay.anon.signing.request_digest` of the request with these values (no return paths,
    no continuation: the digest covers neither) addressed to ``target``: what the reply signs and
    the commitment binds."""
    from overlay.anon.signing import request_digest

    req = Request(request_id=request_id, model=model, messages=tuple(messages), params=params, k=1,
                  return_paths=(), continuation="")
    return request_digest(req, target)


class TranscriptError(Exception):
    """A commit or reveal that is not in this format, does not open or does not verify; ``reason``
    says why. ``unsupported_version``: only its version is not :data:`TRANSCRIPT_VERSION`."""

    def __init__(self, reason: str, *, unsupported_version: bool = False) -> None:
        self.reason = reason
        self.unsupported_version = unsupported_version
        super().__init__(reason)


# --------------------------------------------------------------------------- messages


@dataclass(frozen=True, slots=True)
class Commit:
    """A donor's commitment to one verifier (``verifier``: its Ed25519 validator key), made at
    ``sent_ms`` on the donor's clock."""

    donor: bytes
    verifier: bytes
    sent_ms: int
    value: bytes
    signature: bytes = b""

    def signed(self) -> list[Any]:
        return [self.donor, self.verifier, self.sent_ms, self.value]


@dataclass(frozen=True, slots=True)
class NoReply:
    """The committed request ``value`` got no complete reply (the set it belongs to is void)."""

    value: bytes

    def wire(self) -> list[Any]:
        return [BODY_NO_REPLY, self.value]


@dataclass(frozen=True, slots=True)
class Revealed:
    """A committed request and its reply: the node addressed, the commitment's nonce, the request
    (model, messages, parameters, id) and the reply as the donor got it (the signer, every chunk's
    text and token ids, the final chunk's signature and signing time)."""

    node_id: bytes
    nonce: bytes
    model: str
    messages: tuple[ChatMessage, ...]
    params: SamplingParams
    request_id: bytes
    served_by: bytes
    chunks: tuple[tuple[str, tuple[int, ...]], ...]
    signature: bytes
    signed_at_ms: int

    def wire(self) -> list[Any]:
        p = self.params
        return [BODY_TRANSCRIPT, self.node_id, self.nonce, self.model, [[m.role, m.content] for m in self.messages],
                [p.temperature, p.top_p, p.top_k, p.max_tokens, p.seed], self.request_id, self.served_by,
                [[t, list(ids)] for t, ids in self.chunks], self.signature, self.signed_at_ms]


Body = NoReply | Revealed


@dataclass(frozen=True, slots=True)
class Reveal:
    """A donor's reveal to one verifier: a transcript or "no reply" for one of its commitments."""

    donor: bytes
    verifier: bytes
    body: Body
    signature: bytes = b""

    def signed(self) -> list[Any]:
        return [self.donor, self.verifier, self.body.wire()]


def _pack(obj: object) -> bytes:
    out: bytes = msgpack.packb(obj, use_bin_type=True)
    return out


def commit_signing_bytes(c: Commit) -> bytes:
    return COMMIT_CONTEXT + _pack(c.signed())


def reveal_signing_bytes(r: Reveal) -> bytes:
    return REVEAL_CONTEXT + _pack(r.signed())


# --------------------------------------------------------------------------- making

def encode_commit(signer: Signer, donor: bytes, verifier: bytes, sent_ms: int, value: bytes) -> bytes:
    """The commit of ``value`` from ``donor`` to the verifier whose validator key is ``verifier``,
    signed by ``signer`` (the donor's key: a test may hand another)."""
    c = Commit(donor, verifier, sent_ms, value)
    return _pack([TRANSCRIPT_VERSION, *c.signed(), signer.sign(commit_signing_bytes(c))])


def encode_reveal(signer: Signer, donor: bytes, verifier: bytes, body: Body) -> bytes:
    """The reveal's plaintext (values written as given: floats where the format has floats)."""
    r = Reveal(donor, verifier, body)
    return _pack([TRANSCRIPT_VERSION, *r.signed(), signer.sign(reveal_signing_bytes(r))])


def seal_reveal(verifier: bytes, signer: Signer, donor: bytes, body: Body) -> bytes:
    """:func:`encode_reveal` sealed to ``verifier`` (its Ed25519 validator key);
    :class:`overlay.wire.crypto.CryptoError` for a key that is not a valid point. The size is the
    sender's to keep (at most :data:`MAX_REVEAL_BYTES`)."""
    return crypto.seal_to_ed25519(verifier, encode_reveal(signer, donor, verifier, body))


def fits(model: str, messages: Sequence[ChatMessage], params: SamplingParams) -> str | None:
    """Why a request with these values cannot be a transcript (``None`` when it can): a
    transcript's limits (:func:`transcript_problem`) and no seed (a seeded sample could be searched
    offline). The check a donor's client makes before choosing a request."""
    if params.seed is not None:
        return "the request has a seed"
    return transcript_problem(model, messages, params)


def opening_problem(model: str, messages: Sequence[ChatMessage], params: SamplingParams) -> str | None:
    """Why a request with these values is not one an audit challenge may be (``None`` when it
    is): a model id of 1 to :data:`MAX_MODEL_ID` bytes; 1 to :data:`MAX_MESSAGES` messages of a
    role in :data:`ROLES`, each at most :data:`MAX_CONTENT_BYTES` bytes, the last a non-empty user
    message; the parameters within what model nodes accept, ``max_tokens`` at most
    :data:`MAX_TOKENS`, floats where floats belong, a seed nil or within 0..:data:`MAX_SEED`. The
    one check of an audit challenge's opening (:meth:`verifier.audit.tx.Opening.check`): it goes
    on the chain, so its limits are tight."""
    return _problem(model, messages, params, MAX_MESSAGES, MAX_CONTENT_BYTES, MAX_TOKENS, "a challenge")


def transcript_problem(model: str, messages: Sequence[ChatMessage], params: SamplingParams) -> str | None:
    """Why a request with these values is not one a user's transcript may be (``None`` when it
    is): :func:`opening_problem`'s rules with a transcript's limits (decision 0032), those of the
    requests model nodes serve by default: 1 to :data:`TRANSCRIPT_MAX_MESSAGES` messages,
    :data:`TRANSCRIPT_PROMPT_BYTES` bytes of content in all, ``max_tokens`` at most
    :data:`TRANSCRIPT_MAX_TOKENS`. A transcript stays off the chain (only its score goes there)."""
    return _problem(model, messages, params, TRANSCRIPT_MAX_MESSAGES, TRANSCRIPT_PROMPT_BYTES, TRANSCRIPT_MAX_TOKENS,
                    "a transcript", total=TRANSCRIPT_PROMPT_BYTES)


def _problem(model: str, messages: Sequence[ChatMessage], params: SamplingParams, max_messages: int,
             max_content: int, max_tokens: int, what: str, *, total: int | None = None) -> str | None:
    if type(model) is not str or not 0 < len(model.encode("utf-8", errors="surrogatepass")) <= MAX_MODEL_ID:
        return f"the model id is not 1-{MAX_MODEL_ID} bytes"
    if not 1 <= len(messages) <= max_messages:
        return f"{what} holds 1 to {max_messages} messages"
    size = 0
    for m in messages:
        if type(m.role) is not str or m.role not in ROLES or type(m.content) is not str:
            return f"a message's role is one of {', '.join(ROLES)}"
        n = len(m.content.encode("utf-8", errors="surrogatepass"))
        if n > max_content:
            return f"a message of {what} holds at most {max_content} bytes"
        size += n
    if total is not None and size > total:
        return f"the messages of {what} hold at most {total} bytes in all"
    if messages[-1].role != "user" or not messages[-1].content.strip():
        return "the last message is not a (non-empty) user message"
    p = params
    if type(p.temperature) is not float or not math.isfinite(p.temperature) \
            or not 0.0 <= p.temperature <= MAX_TEMPERATURE:
        return f"temperature is not a float within 0..{MAX_TEMPERATURE:g}"
    if type(p.top_p) is not float or not math.isfinite(p.top_p) or not 0.0 < p.top_p <= 1.0:
        return "top_p is not a float within (0, 1]"
    if type(p.top_k) is not int or not 0 <= p.top_k <= MAX_TOP_K:
        return f"top_k is not within 0..{MAX_TOP_K}"
    if type(p.max_tokens) is not int or not MIN_TOKENS <= p.max_tokens <= max_tokens:
        return f"max_tokens is not within {MIN_TOKENS}..{max_tokens}"
    if p.seed is not None and (type(p.seed) is not int or not 0 <= p.seed <= MAX_SEED):
        return f"the seed is not nil or within 0..{MAX_SEED}"
    return None


# --------------------------------------------------------------------------- taking

def _malformed(what: str, why: str) -> TranscriptError:
    return TranscriptError(f"the {what} is not {why}")


def _bytes(v: Any, n: int, what: str, field: str) -> bytes:
    if type(v) is not bytes or len(v) != n:
        raise _malformed(what, f"well formed: {field} is not {n} bytes")
    return v


def _int(v: Any, lo: int, hi: int, what: str, field: str) -> int:
    if type(v) is not int or not lo <= v <= hi:
        raise _malformed(what, f"well formed: {field} is not an int within {lo}..{hi}")
    return v


def _array(r: codec.ShapeReader, lo: int, hi: int, what: str, field: str) -> int:
    n = r.array()
    if not lo <= n <= hi:
        raise _malformed(what, f"well formed: {field} has {n} items, not {lo}..{hi}")
    return n


def _version(r: codec.ShapeReader, n: int, what: str, shape: str) -> None:
    if r.array() != n:
        raise _malformed(what, shape)
    version = r.value()
    if type(version) is not int or version != TRANSCRIPT_VERSION:
        raise TranscriptError(f"{what} version {version!r} is not {TRANSCRIPT_VERSION}", unsupported_version=True)


def _read(raw: Any, limit: int, what: str, read: Any) -> Any:
    """``read`` of a shape reader over ``raw``: every byte taken, the encoding canonical."""
    if type(raw) is not bytes:
        raise _malformed(what, "bytes")
    if len(raw) > limit:
        raise TranscriptError(f"a {what} of {len(raw)} bytes; at most {limit}")
    r = codec.ShapeReader(raw, TRANSCRIPT_PROMPT_BYTES)  # a message's most; a chunk's text is checked apart
    try:
        out, wire = read(r)
    except codec.ShapeError as exc:
        raise _malformed(what, f"in this format ({exc})") from None
    except (ValueError, TypeError, RecursionError, OverflowError, msgpack.UnpackException) as exc:
        raise _malformed(what, f"msgpack ({type(exc).__name__})") from None
    if not r.done():
        raise _malformed(what, "alone (trailing bytes)")
    if _pack(wire) != raw:
        raise _malformed(what, "in canonical msgpack form")
    return out


def _read_commit(r: codec.ShapeReader) -> tuple[Commit, list[Any]]:
    what = "transcript commit"
    _version(r, 6, what, "[version, donor, verifier key, sent_ms, commitment, signature]")
    donor = _bytes(r.value(), NODE_ID_LEN, what, "the donor node id")
    verifier = _bytes(r.value(), KEY_LEN, what, "the verifier key")
    sent_ms = _int(r.value(), 0, 2**63 - 1, what, "sent_ms")
    value = _bytes(r.value(), COMMITMENT_LEN, what, "the commitment")
    sig = _bytes(r.value(), SIGNATURE_LEN, what, "the signature")
    c = Commit(donor, verifier, sent_ms, value, sig)
    return c, [TRANSCRIPT_VERSION, *c.signed(), sig]


def decode_commit(raw: bytes) -> Commit:
    """A commit, decoded strictly (module docstring); its signature is not checked here
    (:func:`verify_commit`). :class:`TranscriptError` with the reason otherwise."""
    out: Commit = _read(raw, MAX_COMMIT_BYTES, "transcript commit", _read_commit)
    return out


def _read_body(r: codec.ShapeReader) -> Body:
    what = "transcript reveal"
    n = r.array()
    kind = r.value() if n else None
    if kind == BODY_NO_REPLY and type(kind) is int and n == 2:
        return NoReply(_bytes(r.value(), COMMITMENT_LEN, what, "the commitment"))
    if kind != BODY_TRANSCRIPT or type(kind) is not int or n != 11:
        raise _malformed(what, "well formed: its body is [0, commitment] or [1, node id, nonce, model, messages, "
                               "params, request id, served by, chunks, signature, signed_at_ms]")
    node_id = _bytes(r.value(), NODE_ID_LEN, what, "the node id")
    nonce = _bytes(r.value(), NONCE_LEN, what, "the nonce")
    model = r.value()
    if type(model) is not str or not 0 < len(model.encode("utf-8", errors="surrogatepass")) <= MAX_MODEL_ID:
        raise _malformed(what, f"well formed: the model is not a string of 1-{MAX_MODEL_ID} bytes")
    messages = []
    for _ in range(_array(r, 1, TRANSCRIPT_MAX_MESSAGES, what, "the messages")):
        if r.array() != 2:
            raise _malformed(what, "well formed: a message is [role, content]")
        role, content = r.value(), r.value()
        if type(role) is not str or type(content) is not str:
            raise _malformed(what, "well formed: a message is [role (str), content (str)]")
        messages.append(ChatMessage(role, content))
    if r.array() != 5:
        raise _malformed(what, "well formed: params are [temperature, top_p, top_k, max_tokens, seed]")
    temp, top_p, top_k, max_tokens, seed = (r.value() for _ in range(5))
    if type(temp) is not float or type(top_p) is not float or type(top_k) is not int \
            or type(max_tokens) is not int or not (seed is None or type(seed) is int):
        raise _malformed(what, "well formed: params are of types [float, float, int, int, int or nil]")
    request_id = _bytes(r.value(), REQUEST_ID_LEN, what, "the request id")
    served_by = _bytes(r.value(), NODE_ID_LEN, what, "the serving node id")
    chunks = []
    tokens = 0
    for _ in range(_array(r, 1, TRANSCRIPT_MAX_CHUNKS, what, "the reply's chunks")):
        if r.array() != 2:
            raise _malformed(what, "well formed: a chunk is [text, token ids]")
        text = r.value()
        if type(text) is not str or len(text) > MAX_CHUNK_TEXT:
            raise _malformed(what, f"well formed: a chunk's text is not a string of at most {MAX_CHUNK_TEXT} "
                                   "characters")
        k = r.array()
        tokens += k
        if tokens > TRANSCRIPT_MAX_REPLY_TOKENS:
            raise _malformed(what, f"well formed: the reply has over {TRANSCRIPT_MAX_REPLY_TOKENS} token ids")
        ids = r.ints(k)
        if any(not 0 <= t <= MAX_TOKEN_ID for t in ids):
            raise _malformed(what, f"well formed: a token id is not within 0..{MAX_TOKEN_ID}")
        chunks.append((text, tuple(ids)))
    sig = _bytes(r.value(), SIGNATURE_LEN, what, "the reply's signature")
    signed_at_ms = _int(r.value(), 0, 2**63 - 1, what, "signed_at_ms")
    return Revealed(node_id, nonce, model, tuple(messages),
                    SamplingParams(temperature=temp, top_p=top_p, top_k=top_k, max_tokens=max_tokens, seed=seed),
                    request_id, served_by, tuple(chunks), sig, signed_at_ms)


def _read_reveal(r: codec.ShapeReader) -> tuple[Reveal, list[Any]]:
    what = "transcript reveal"
    _version(r, 5, what, "[version, donor, verifier key, body, signature]")
    donor = _bytes(r.value(), NODE_ID_LEN, what, "the donor node id")
    verifier = _bytes(r.value(), KEY_LEN, what, "the verifier key")
    body = _read_body(r)
    sig = _bytes(r.value(), SIGNATURE_LEN, what, "the signature")
    out = Reveal(donor, verifier, body, sig)
    return out, [TRANSCRIPT_VERSION, *out.signed(), sig]


def unseal(seed32: bytes, sealed: bytes) -> bytes:
    """The plaintext of a sealed reveal, opened with the verifier's Ed25519 seed;
    :class:`TranscriptError` if it is too large, was sealed to another key or altered."""
    if type(sealed) is not bytes:
        raise _malformed("sealed reveal", "bytes")
    if len(sealed) > MAX_REVEAL_BYTES:
        raise TranscriptError(f"a sealed reveal of {len(sealed)} bytes; at most {MAX_REVEAL_BYTES}")
    try:
        return crypto.open_sealed_ed25519(seed32, sealed)
    except crypto.CryptoError:
        raise TranscriptError("the reveal does not open with this verifier's key (sealed to another key, or "
                              "altered); fetch the key from /audit/donate_key") from None


def decode_reveal(plaintext: bytes) -> Reveal:
    """A reveal's plaintext, decoded strictly (module docstring); its signature is not checked
    here (:func:`verify_reveal`). :class:`TranscriptError` with the reason otherwise."""
    out: Reveal = _read(plaintext, MAX_REVEAL_BYTES, "transcript reveal", _read_reveal)
    return out


def _verify(public: bytes, donor: bytes, signature: bytes, message: bytes, what: str) -> None:
    if type(public) is not bytes or len(public) != crypto.ED25519_PK_LEN or node_id_of(public) != donor:
        raise TranscriptError("the key is not the donor's")
    try:
        crypto.ed25519_verify(public, signature, message)
    except crypto.CryptoError:
        raise TranscriptError(f"the {what}'s signature does not verify with the donor's key") from None


def verify_commit(c: Commit, ed25519_public: bytes) -> None:
    """:class:`TranscriptError` unless ``ed25519_public`` is the donor's key and signed ``c``."""
    _verify(ed25519_public, c.donor, c.signature, commit_signing_bytes(c), "commit")


def verify_reveal(r: Reveal, ed25519_public: bytes) -> None:
    """:class:`TranscriptError` unless ``ed25519_public`` is the donor's key and signed ``r``."""
    _verify(ed25519_public, r.donor, r.signature, reveal_signing_bytes(r), "reveal")
