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
              | [2, node_id(20), secret(32), model(str), ...]           an escrowed transcript: kind 1's
                                                                        fields, the secret in the nonce's place
              | [3, node_id(20), nonce(16), model(str), [[role, content], ...], [params...],
                 request_id(16), served_by(20), busy_signature(64), signed_at_ms(int)]
                                                                        "the node refused it as busy" (decision
                                                                        0044): kind 1's fields but the chunks, the
                                                                        node's signed "busy" (busy_signing_bytes);
                                                                        an escrowed commitment's too (by its nonce)

Decision 0037 (an escrowed commitment: the nonce is ``escrow.nonce_of(s)`` of a secret ``s`` the
donor deals among the validators, :mod:`overlay.directory.escrow`) adds version 2's messages,
each decoded strictly by its own ``decode_*`` as above::

    secret    = 32 bytes, little-endian, within 1..L-1 (:func:`overlay.directory.escrow.scalar_of`);
                the body's nonce is escrow.nonce_of(secret); its low 64 bits are the request's
                locator (decision 0038: :func:`escrowed_secret`, :func:`secret_locator`)
    points    = escrow.encode_commitments([C_0, ..., C_{t-1}])     1 to escrow.MAX_UNITS valid points
    shares    = escrow.encode_shares([[x, y], ...])                 0 to escrow.MAX_UNITS shares
    digest    = BLAKE2b-256(points), personalised ``gt-escrow-pts`` (:func:`points_digest`)
    escrow commit = [2, donor_node_id(20), verifier_key(32), sent_ms(int), commitment(32), points(bin),
                     sealed_shares(bin), signature(64)]
                sealed_shares: seal_to_ed25519(verifier_key, shares), that verifier's shares
                signature: Ed25519(donor's node key, ESCROW_COMMIT_CONTEXT + msgpack([donor, verifier_key,
                           sent_ms, commitment, points, sealed_shares]))
    acceptance    = [2, verifier_key(32), donor_node_id(20), commitment(32), digest(32), sent_ms(int),
                     signature(64)]
                signature: Ed25519(verifier's validator key, ACCEPT_CONTEXT + msgpack([verifier_key, donor,
                           commitment, digest, sent_ms]))      the verifier checked its shares (sent_ms
                                                               is the commit's)
    certificate   = [2, donor_node_id(20), commitment(32), sent_ms(int), points(bin), [acceptance(bin), ...]]
                1 to escrow.MAX_HOLDERS acceptances, each the bytes of an encoded acceptance; unsigned
                (each acceptance binds the donor, commitment, digest and sent_ms: :func:`certified_power`)
    node sealed   = seal_to_ed25519(verifier_key, node reveal)  (at most MAX_REVEAL_BYTES)
    node reveal   = [2, node_id(20), verifier_key(32), body, signature(64)]     body: kind 2 only; its
                                                          node_id or served_by the signer's (the node addressed,
                                                          or the member it forwarded to, which signed the reply)
                signature: Ed25519(the model node's identity key, NODE_REVEAL_CONTEXT + msgpack([node_id,
                           verifier_key, body]))
    released      = [2, epoch(int), [[commitment(32), points(bin), shares(bin)], ...]]
                0 to MAX_RELEASED items, commitments strictly increasing; each item's points and shares
                at most MAX_RELEASED_UNITS; the shares in the clear (they are released)

The commit goes in the clear (``abci_query`` :data:`COMMIT_PATH`): it shows the verifier only
the donor and a hash. Both messages name the verifier's validator key, so one verifier cannot
hand a donor's commit or reveal to another; ``sent_ms`` (the donor's clock) lets a verifier refuse
a commit replayed later (:data:`MAX_SKEW_MS`), which would otherwise stand unrevealed and burn
the donor. The reveal is sealed to the verifier's key, like a donated prompt
(:mod:`overlay.directory.donation`): only that verifier reads the prompt and the reply.

Version 2's messages go to :data:`ESCROW_COMMIT_PATH` (the commit; the acceptance is the
answer), :data:`CERTIFY_PATH` (the certificate), :data:`NODE_REVEAL_PATH` (a node's sealed reveal)
and :data:`RELEASED_PATH` (a verifier's released shares of an epoch); nothing serves them yet.
Every verifier's commit carries the same points (only the sealed shares differ), so the
certificate carries them once and each acceptance binds their digest.

Limits: a commit at most :data:`MAX_COMMIT_BYTES`; a sealed reveal (a donor's or a node's) at most
:data:`MAX_REVEAL_BYTES`; an escrow commit at most :data:`MAX_ESCROW_COMMIT_BYTES`, an acceptance
:data:`MAX_ACCEPTANCE_BYTES`, a certificate :data:`MAX_CERTIFICATE_BYTES`, released shares
:data:`MAX_RELEASED_BYTES` (each computed from the escrow's limits: the most every field may take;
released items are bounded by :data:`MAX_RELEASED_UNITS` rather than ``escrow.MAX_UNITS``, which
would allow 300 MB); 1 to :data:`TRANSCRIPT_MAX_MESSAGES` messages, a model id of 1 to
:data:`MAX_MODEL_ID` bytes, at most :data:`TRANSCRIPT_MAX_CHUNKS` chunks and
:data:`TRANSCRIPT_MAX_REPLY_TOKENS` token ids (each < 2^32), a chunk's text at most
:data:`MAX_CHUNK_TEXT` characters, any other string at most :data:`TRANSCRIPT_PROMPT_BYTES`.
Two sets of request limits are defined here, once: an audit challenge's (:func:`opening_problem`,
tight: a challenge goes on the chain; verifier/audit/tx.py takes them) and a user's transcript's
(:func:`transcript_problem`, decision 0032: every request model nodes serve by default, so that
no request is known to go unchecked). :func:`fits` adds "no seed": the check a donor's client
makes before choosing a request (a transcript that breaks them voids the donor's set).

Every refusal of :func:`decode_commit`, :func:`unseal`, :func:`decode_reveal`,
:func:`verify_commit`, :func:`verify_reveal` and version 2's :func:`decode_escrow_commit`,
:func:`verify_escrow_commit`, :func:`open_shares`, :func:`decode_acceptance`,
:func:`verify_acceptance`, :func:`decode_certificate`, :func:`decode_node_reveal`,
:func:`verify_node_reveal` and :func:`decode_released` is a :class:`TranscriptError` with a reason;
nothing else is raised on any input (``tests/fuzz/targets.py`` ``TranscriptWireTarget``), and
:func:`certified_power` never raises.
"""

from __future__ import annotations

import itertools
import math
import random
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from overlay.directory import escrow
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
# Version 2 (decision 0037): the escrowed commit, the verifiers' acceptances, the certificate, the node's
# reveal and the released shares. Nothing serves these paths yet.
ESCROW_VERSION = 2
ESCROW_COMMIT_CONTEXT = b"gentorrent/transcript-commit/v2\x00"
ACCEPT_CONTEXT = b"gentorrent/transcript-accept/v2\x00"
NODE_REVEAL_CONTEXT = b"gentorrent/transcript-node-reveal/v2\x00"
BODY_ESCROWED = 2
BODY_BUSY = 3  # decision 0044
SECRET_LEN = escrow.SECRET_LEN
DIGEST_LEN = 32
_POINTS_PERSON = b"gt-escrow-pts"
ESCROW_COMMIT_PATH = "/audit/transcript_escrow_commit"
CERTIFY_PATH = "/audit/transcript_certify"
NODE_REVEAL_PATH = "/audit/transcript_node_reveal"
RELEASED_PATH = "/audit/transcript_released"
MAX_RELEASED = 4096  # withheld commitments one verifier releases for one epoch
MAX_RELEASED_UNITS = 64  # points, and shares, of one released commitment (plans of up to 64 units)
LOCATOR_LEN = 8  # the request digest's first bytes an escrowed secret carries (decision 0038)
_LOCATOR_BITS = 8 * LOCATOR_LEN
_HIDDEN_BITS = 188  # an escrowed secret's uniform bits above its locator: 2**(188 + 64) < escrow.L

# The escrow's timing (decision 0040), from the chain's reply window (genesis ``app_state.audit``,
# ``reply_window_s``): a committed request's reply counts only when signed within the window of its
# commitment's arrival; an epoch's withheld commitments go out that long and a margin (the window
# itself, at most RELEASE_MARGIN_S: clock skew between a node and a verifier) after the next epoch
# began here; a model node polls for them a tenth of the window apart (1 s to 60 s) and has two
# polls to hand the replies in before the verifiers close the epoch's sets.
DEFAULT_REPLY_WINDOW_S = 600
MIN_REPLY_WINDOW_S = 10
MAX_REPLY_WINDOW_S = DEFAULT_REPLY_WINDOW_S  # and the most: a node's served store keeps replies 45 minutes
RELEASE_MARGIN_S = 60


def release_delay_s(window_s: int) -> int:
    """How long after epoch ``e + 1`` began a verifier releases ``e``'s withheld commitments."""
    return window_s + min(RELEASE_MARGIN_S, window_s)


def node_poll_s(window_s: int) -> float:
    """How often a model node asks the verifiers for released commitments."""
    return min(60.0, max(1.0, window_s / 10))


def close_after_s(window_s: int) -> float:
    """The least time from an epoch's start to its report window for a node to hand in what the
    previous epoch's donors withheld: the release and two of the node's polls (780 s by default)."""
    return release_delay_s(window_s) + 2 * node_poll_s(window_s)


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

# Version 2's limits, computed from msgpack's sizes: the most every field may take. A bin's header
# takes 2 bytes up to 255 bytes, 3 up to 65,535; an array's 1 up to 15 items, 3 up to 65,535; an
# int at most 9 (a uint64); a small int (a version, a body kind) 1.
_BIN8, _BIN16, _FIXARRAY, _ARRAY16, _INT, _SMALL = 2, 3, 1, 3, 9, 1


def _bin(n: int) -> int:
    """The bytes of a msgpack bin of ``n`` bytes (at most 65,535)."""
    if n > 0xFFFF:
        raise ValueError("a bin of over 65,535 bytes has a 5-byte header")
    return (_BIN8 if n <= 0xFF else _BIN16) + n


def _points_bytes(most: int) -> int:
    """The most an encoding of ``most`` escrow commitments takes: a header, then 32-byte bins."""
    return (_FIXARRAY if most <= 15 else _ARRAY16) + most * _bin(escrow.POINT_LEN)


def _shares_bytes(most: int) -> int:
    """The most an encoding of ``most`` shares takes: a header, then ``[x, y]`` with ``x`` within
    1..escrow.MAX_UNITS (a uint16, 3 bytes) and ``y`` a 32-byte bin."""
    return (_FIXARRAY if most <= 15 else _ARRAY16) + most * (_FIXARRAY + 3 + _bin(SECRET_LEN))


MAX_POINTS_BYTES = _points_bytes(escrow.MAX_UNITS)  # 34,819
MAX_SHARES_BYTES = _shares_bytes(escrow.MAX_UNITS)  # 38,915
MAX_SEALED_SHARES_BYTES = crypto.SEALED_OVERHEAD + MAX_SHARES_BYTES  # 38,963
MIN_SEALED_SHARES_BYTES = crypto.SEALED_OVERHEAD + 1  # no shares: an empty array
MAX_ESCROW_COMMIT_BYTES = (_FIXARRAY + _SMALL + _bin(NODE_ID_LEN) + _bin(KEY_LEN) + _INT + _bin(COMMITMENT_LEN)
                           + _bin(MAX_POINTS_BYTES) + _bin(MAX_SEALED_SHARES_BYTES) + _bin(SIGNATURE_LEN))  # 73,955
MAX_ACCEPTANCE_BYTES = (_FIXARRAY + _SMALL + _bin(KEY_LEN) + _bin(NODE_ID_LEN) + _bin(COMMITMENT_LEN)
                        + _bin(DIGEST_LEN) + _INT + _bin(SIGNATURE_LEN))  # 201
MAX_CERTIFICATE_BYTES = (_FIXARRAY + _SMALL + _bin(NODE_ID_LEN) + _bin(COMMITMENT_LEN) + _INT
                         + _bin(MAX_POINTS_BYTES)
                         + _ARRAY16 + escrow.MAX_HOLDERS * _bin(MAX_ACCEPTANCE_BYTES))  # 86,860
MAX_RELEASED_ITEM_BYTES = (_FIXARRAY + _bin(COMMITMENT_LEN) + _bin(_points_bytes(MAX_RELEASED_UNITS))
                           + _bin(_shares_bytes(MAX_RELEASED_UNITS)))  # 4,655
MAX_RELEASED_BYTES = _FIXARRAY + _SMALL + _INT + _ARRAY16 + MAX_RELEASED * MAX_RELEASED_ITEM_BYTES  # 19,066,894

__all__ = [
    "ACCEPT_CONTEXT", "BODY_BUSY", "BODY_ESCROWED", "CERTIFY_PATH", "COMMITMENT_LEN", "COMMIT_PATH",
    "DEFAULT_REPLY_WINDOW_S",
    "ESCROW_COMMIT_CONTEXT", "ESCROW_COMMIT_PATH", "ESCROW_VERSION", "LOCATOR_LEN", "MAX_ACCEPTANCE_BYTES",
    "MAX_CERTIFICATE_BYTES", "MAX_COMMIT_BYTES", "MAX_ESCROW_COMMIT_BYTES", "MAX_RELEASED", "MAX_RELEASED_BYTES",
    "MAX_RELEASED_UNITS", "MAX_REPLY_WINDOW_S", "MAX_REVEAL_BYTES", "MIN_REPLY_WINDOW_S", "NODE_REVEAL_CONTEXT",
    "NODE_REVEAL_PATH", "NONCE_LEN", "RELEASED_PATH", "RELEASE_MARGIN_S", "REVEAL_PATH", "Acceptance",
    "Certificate", "Commit", "EscrowCommit", "NoReply", "NodeReveal", "ReleasedItem", "Reveal", "Revealed",
    "TranscriptError", "certified_power", "close_after_s", "commitment", "decode_acceptance", "decode_certificate",
    "decode_commit", "decode_escrow_commit", "decode_node_reveal", "decode_released", "decode_reveal",
    "encode_acceptance", "encode_body", "encode_certificate", "encode_commit", "encode_escrow_commit",
    "encode_node_reveal", "encode_released", "encode_reveal", "escrowed_secret", "fits", "locator", "node_poll_s",
    "open_shares", "opening_problem", "points_digest", "release_delay_s", "released_query", "seal_node_reveal",
    "seal_reveal", "secret_locator", "transcript_problem", "unseal", "verify_acceptance", "verify_commit",
    "verify_escrow_commit", "verify_node_reveal", "verify_reveal",
]


def commitment(nonce: bytes, node_id: bytes, reply_digest: bytes) -> bytes:
    """BLAKE2b-256(nonce ‖ node id ‖ reply digest), personalised ``gt-transcript``: what a donor
    commits before sending the request to ``node_id``; ``reply_digest`` is
    :func:`overlay.anon.signing.request_digest` of the request (its id included) addressed to that node."""
    if len(nonce) != NONCE_LEN or len(node_id) != NODE_ID_LEN or len(reply_digest) != 32:
        raise ValueError("a transcript commitment takes a 16-byte nonce, a 20-byte node id and a 32-byte digest")
    return crypto.blake2b(nonce + node_id + reply_digest, size=COMMITMENT_LEN, person=_PERSON)


def locator(reply_digest: bytes) -> bytes:
    """The request's locator (decision 0038): the first :data:`LOCATOR_LEN` bytes of its digest
    (:func:`overlay.anon.signing.request_digest`), what a model node indexes its served requests by."""
    return bytes(reply_digest[:LOCATOR_LEN])


def escrowed_secret(reply_digest: bytes, rng: random.Random | None = None) -> int:
    """A secret for an escrowed commitment to the request of digest ``reply_digest`` (decision
    0038): its low 64 bits are the request's :func:`locator` (little-endian), the 188 above them
    uniform (from ``secrets`` unless a test's ``rng`` is given). Once the release rebuilds it, the
    node addressed finds the request by one lookup instead of a hash per request it served; until
    then it stays hidden as the rest of the deal (finding 188 bits behind ``s·B`` takes about
    2**94 group operations). ``ValueError`` for a digest that is not 32 bytes."""
    if type(reply_digest) is not bytes or len(reply_digest) != 32:
        raise ValueError("a request digest is 32 bytes")
    low = int.from_bytes(reply_digest[:LOCATOR_LEN], "little")
    while True:
        high = rng.getrandbits(_HIDDEN_BITS) if rng is not None else secrets.randbits(_HIDDEN_BITS)
        secret = (high << _LOCATOR_BITS) | low
        if secret:  # 0 is no secret; the odds of drawing it are 2**-188 and only for a zero locator
            return secret


def secret_locator(secret: int) -> bytes:
    """The locator an escrowed ``secret`` carries: its low 64 bits, little-endian (what the book
    checks a revealed transcript's digest against, and a node looks its store up by)."""
    return (secret & ((1 << _LOCATOR_BITS) - 1)).to_bytes(LOCATOR_LEN, "little")


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
    text and token ids, the final chunk's signature and signing time).

    ``secret`` (decision 0037): empty for a body of kind 1; else the escrowed secret's 32 bytes
    (kind 2), which the wire carries in the nonce's place: decoding sets ``nonce`` to
    ``escrow.nonce_of`` of it, and whoever builds one with a secret sets the nonce so.

    No ``chunks`` (decision 0044, a body of kind 3, :attr:`busy`): the node refused the request as
    busy before any output, and ``signature`` is its signed "busy"
    (:func:`overlay.anon.signing.busy_signing_bytes`), ``served_by`` the node that refused; never
    with a secret (an escrowed commitment's busy is revealed by its nonce)."""

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
    secret: bytes = b""

    @property
    def busy(self) -> bool:
        """Whether this is a signed "busy" (no reply), not a transcript."""
        return not self.chunks

    def wire(self) -> list[Any]:
        p = self.params
        kind, nonce = (BODY_ESCROWED, self.secret) if self.secret else (BODY_TRANSCRIPT, self.nonce)
        head = [self.node_id, nonce, self.model, [[m.role, m.content] for m in self.messages],
                [p.temperature, p.top_p, p.top_k, p.max_tokens, p.seed], self.request_id, self.served_by]
        if self.busy:
            if self.secret:
                raise ValueError("a busy refusal is revealed by the commitment's nonce, never with a secret")
            return [BODY_BUSY, *head, self.signature, self.signed_at_ms]
        return [kind, *head, [[t, list(ids)] for t, ids in self.chunks], self.signature, self.signed_at_ms]


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


@dataclass(frozen=True, slots=True)
class EscrowCommit:
    """A donor's escrowed commitment to one verifier (decision 0037): :class:`Commit`'s fields, the
    dealt secret's public points (``points``, decoded and checked; ``points_raw``, their bytes as
    sent) and the verifier's shares sealed to its key (:func:`open_shares`)."""

    donor: bytes
    verifier: bytes
    sent_ms: int
    value: bytes
    points: tuple[bytes, ...]
    points_raw: bytes
    sealed_shares: bytes
    signature: bytes = b""

    def signed(self) -> list[Any]:
        return [self.donor, self.verifier, self.sent_ms, self.value, self.points_raw, self.sealed_shares]

    def wire(self) -> list[Any]:
        return [ESCROW_VERSION, *self.signed(), self.signature]


@dataclass(frozen=True, slots=True)
class Acceptance:
    """A verifier's signed acceptance of a donor's escrowed commitment ``value`` made at
    ``sent_ms``, whose shares it checked against the points of digest ``digest``."""

    verifier: bytes
    donor: bytes
    value: bytes
    digest: bytes
    sent_ms: int
    signature: bytes = b""

    def signed(self) -> list[Any]:
        return [self.verifier, self.donor, self.value, self.digest, self.sent_ms]

    def wire(self) -> list[Any]:
        return [ESCROW_VERSION, *self.signed(), self.signature]


@dataclass(frozen=True, slots=True)
class Certificate:
    """The acceptances a donor got for one escrowed commitment, as it hands them to every verifier
    (unsigned: :func:`certified_power` counts only what the acceptances bind)."""

    donor: bytes
    value: bytes
    sent_ms: int
    points: tuple[bytes, ...]
    points_raw: bytes
    acceptances: tuple[Acceptance, ...]

    def wire(self) -> list[Any]:
        return [ESCROW_VERSION, self.donor, self.value, self.sent_ms, self.points_raw,
                [_pack(a.wire()) for a in self.acceptances]]


@dataclass(frozen=True, slots=True)
class NodeReveal:
    """A model node's reveal to one verifier of a request addressed to it (or whose reply it signed,
    forwarded to it) whose commitment the donor withheld: the transcript (kind 2: with the secret
    the node rebuilt)."""

    node_id: bytes
    verifier: bytes
    body: Revealed
    signature: bytes = b""

    def signed(self) -> list[Any]:
        return [self.node_id, self.verifier, self.body.wire()]


# One released commitment: the commitment, its points, the releasing verifier's shares of it
ReleasedItem = tuple[bytes, tuple[bytes, ...], tuple[escrow.Share, ...]]


def _pack(obj: object) -> bytes:
    out: bytes = msgpack.packb(obj, use_bin_type=True)
    return out


def commit_signing_bytes(c: Commit) -> bytes:
    return COMMIT_CONTEXT + _pack(c.signed())


def reveal_signing_bytes(r: Reveal) -> bytes:
    return REVEAL_CONTEXT + _pack(r.signed())


def escrow_commit_signing_bytes(c: EscrowCommit) -> bytes:
    return ESCROW_COMMIT_CONTEXT + _pack(c.signed())


def acceptance_signing_bytes(a: Acceptance) -> bytes:
    return ACCEPT_CONTEXT + _pack(a.signed())


def node_reveal_signing_bytes(nr: NodeReveal) -> bytes:
    return NODE_REVEAL_CONTEXT + _pack(nr.signed())


def points_digest(points_raw: bytes) -> bytes:
    """BLAKE2b-256 of an escrow commit's points as sent, personalised ``gt-escrow-pts``: what an
    acceptance binds."""
    return crypto.blake2b(points_raw, size=DIGEST_LEN, person=_POINTS_PERSON)


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


def encode_escrow_commit(signer: Signer, donor: bytes, verifier: bytes, sent_ms: int, value: bytes,
                         points_raw: bytes, shares: Sequence[escrow.Share]) -> bytes:
    """The escrowed commit of ``value`` from ``donor`` to the verifier whose validator key is
    ``verifier``: ``points_raw`` (:func:`overlay.directory.escrow.encode_commitments` of the deal's
    points, written as given) and that verifier's ``shares``, sealed to its key; signed by
    ``signer`` (the donor's key). :class:`overlay.directory.escrow.EscrowError` for malformed
    shares, :class:`overlay.wire.crypto.CryptoError` for a key that is not a valid point."""
    sealed = crypto.seal_to_ed25519(verifier, escrow.encode_shares(shares))
    c = EscrowCommit(donor, verifier, sent_ms, value, (), points_raw, sealed)
    return _pack([ESCROW_VERSION, *c.signed(), signer.sign(escrow_commit_signing_bytes(c))])


def encode_acceptance(signer: Signer, verifier: bytes, donor: bytes, value: bytes, digest: bytes,
                      sent_ms: int) -> bytes:
    """A verifier's acceptance of ``donor``'s escrowed commitment ``value`` (sent at ``sent_ms``,
    its points of digest ``digest``: :func:`points_digest`), signed by ``signer`` (the verifier's
    validator key, whose public key is ``verifier``)."""
    a = Acceptance(verifier, donor, value, digest, sent_ms)
    return _pack([ESCROW_VERSION, *a.signed(), signer.sign(acceptance_signing_bytes(a))])


def encode_certificate(donor: bytes, value: bytes, sent_ms: int, points_raw: bytes,
                       acceptances_raw: Sequence[bytes]) -> bytes:
    """The certificate of ``donor``'s escrowed commitment ``value``: the points as sent and the
    acceptances' bytes as received (written as given)."""
    return _pack([ESCROW_VERSION, donor, value, sent_ms, points_raw, list(acceptances_raw)])


def encode_node_reveal(signer: Signer, node_id: bytes, verifier: bytes, body: Revealed) -> bytes:
    """A node reveal's plaintext, signed by ``signer`` (the node's identity key); ``ValueError``
    unless ``body`` is an escrowed transcript (with its secret)."""
    if not isinstance(body, Revealed) or not body.secret:
        raise ValueError("a node reveals an escrowed transcript (a body with its secret)")
    nr = NodeReveal(node_id, verifier, body)
    return _pack([ESCROW_VERSION, *nr.signed(), signer.sign(node_reveal_signing_bytes(nr))])


def seal_node_reveal(verifier: bytes, signer: Signer, node_id: bytes, body: Revealed) -> bytes:
    """:func:`encode_node_reveal` sealed to ``verifier`` (its Ed25519 validator key), as
    :func:`seal_reveal`; opened with :func:`unseal`."""
    return crypto.seal_to_ed25519(verifier, encode_node_reveal(signer, node_id, verifier, body))


def released_query(epoch: int, after: bytes = b"") -> bytes:
    """The data of a :data:`RELEASED_PATH` query: ``epoch`` (8 bytes, big-endian), then the last
    commitment of the page before (none for the first)."""
    if not 0 <= epoch < 2**64 or (after and len(after) != COMMITMENT_LEN):
        raise ValueError("a released query is an epoch and a commitment (32 bytes) or nothing")
    return epoch.to_bytes(8, "big") + after


def encode_released(epoch: int, items: Sequence[ReleasedItem]) -> bytes:
    """A verifier's released shares of ``epoch``: ``items`` of (commitment, points, shares), written
    in ascending order of commitment. ``ValueError`` for a commitment given twice;
    :class:`overlay.directory.escrow.EscrowError` for malformed points or shares."""
    ordered = sorted(items, key=lambda item: item[0])
    if any(a[0] == b[0] for a, b in itertools.pairwise(ordered)):
        raise ValueError("a commitment is released once")
    return _pack([ESCROW_VERSION, epoch, [[v, escrow.encode_commitments(points), escrow.encode_shares(shares)]
                                          for v, points, shares in ordered]])


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


def _version(r: codec.ShapeReader, n: int, what: str, shape: str, want: int = TRANSCRIPT_VERSION) -> None:
    if r.array() != n:
        raise _malformed(what, shape)
    version = r.value()
    if type(version) is not int or version != want:
        raise TranscriptError(f"{what} version {version!r} is not {want}", unsupported_version=True)


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
    """A donor's reveal's body: kind 0, 1, 2 or 3."""
    what = "transcript reveal"
    n = r.array()
    kind = r.value() if n else None
    if kind == BODY_NO_REPLY and type(kind) is int and n == 2:
        return NoReply(_bytes(r.value(), COMMITMENT_LEN, what, "the commitment"))
    if type(kind) is not int or (kind, n) not in ((BODY_TRANSCRIPT, 11), (BODY_ESCROWED, 11), (BODY_BUSY, 10)):
        raise _malformed(what, "well formed: its body is [0, commitment], [1, node id, nonce, model, messages, "
                               "params, request id, served by, chunks, signature, signed_at_ms], [2, node id, "
                               "secret, ...] or [3, node id, nonce, ..., served by, signature, signed_at_ms]")
    return _read_transcript(r, what, kind)


def _read_escrowed_body(r: codec.ShapeReader, what: str) -> Revealed:
    """A node reveal's body: kind 2 only."""
    n = r.array()
    kind = r.value() if n else None
    if type(kind) is not int or kind != BODY_ESCROWED or n != 11:
        raise _malformed(what, "well formed: its body is [2, node id, secret, model, messages, params, request id, "
                               "served by, chunks, signature, signed_at_ms]")
    return _read_transcript(r, what, kind)


def _read_transcript(r: codec.ShapeReader, what: str, kind: int) -> Revealed:
    """The fields of a body of kind 1, 2 or 3 (no chunks) after its kind."""
    node_id = _bytes(r.value(), NODE_ID_LEN, what, "the node id")
    secret = b""
    if kind == BODY_ESCROWED:
        secret = _bytes(r.value(), SECRET_LEN, what, "the secret")
        try:
            nonce = escrow.nonce_of(escrow.scalar_of(secret))
        except escrow.EscrowError:
            raise _malformed(what, "well formed: the secret is not a canonical scalar within 1..L-1") from None
    else:
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
    for _ in range(0 if kind == BODY_BUSY else _array(r, 1, TRANSCRIPT_MAX_CHUNKS, what, "the reply's chunks")):
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
                    request_id, served_by, tuple(chunks), sig, signed_at_ms, secret)


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


def encode_body(body: Body) -> bytes:
    """A reveal's body alone, as a reveal carries it (a model node's store keeps its served
    replies so: ``model_node.served_log``)."""
    return _pack(body.wire())


def decode_body(raw: bytes) -> Body:
    """A body of :func:`encode_body`, decoded strictly as a reveal's; :class:`TranscriptError`
    with the reason otherwise."""
    def read(r: codec.ShapeReader) -> tuple[Body, list[Any]]:
        body = _read_body(r)
        return body, body.wire()

    out: Body = _read(raw, MAX_REVEAL_BYTES, "transcript body", read)
    return out


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


# --------------------------------------------------------------------------- version 2 (decision 0037)


def _points(v: Any, what: str) -> tuple[tuple[bytes, ...], bytes]:
    """An escrow's points as sent (a bin): decoded strictly, every point checked."""
    if type(v) is not bytes or len(v) > MAX_POINTS_BYTES:
        raise _malformed(what, f"well formed: the points are not a bin of at most {MAX_POINTS_BYTES} bytes")
    try:
        return escrow.decode_commitments(v, escrow.MAX_UNITS), v
    except escrow.EscrowError as exc:
        raise _malformed(what, f"well formed: the points are refused ({exc.reason})") from None


def _read_escrow_commit(r: codec.ShapeReader) -> tuple[EscrowCommit, list[Any]]:
    what = "transcript escrow commit"
    _version(r, 8, what, "[version, donor, verifier key, sent_ms, commitment, points, sealed shares, signature]",
             ESCROW_VERSION)
    donor = _bytes(r.value(), NODE_ID_LEN, what, "the donor node id")
    verifier = _bytes(r.value(), KEY_LEN, what, "the verifier key")
    sent_ms = _int(r.value(), 0, 2**63 - 1, what, "sent_ms")
    value = _bytes(r.value(), COMMITMENT_LEN, what, "the commitment")
    points, points_raw = _points(r.value(), what)
    sealed = r.value()
    if type(sealed) is not bytes or not MIN_SEALED_SHARES_BYTES <= len(sealed) <= MAX_SEALED_SHARES_BYTES:
        raise _malformed(what, f"well formed: the sealed shares are not a bin of {MIN_SEALED_SHARES_BYTES} to "
                               f"{MAX_SEALED_SHARES_BYTES} bytes")
    sig = _bytes(r.value(), SIGNATURE_LEN, what, "the signature")
    c = EscrowCommit(donor, verifier, sent_ms, value, points, points_raw, sealed, sig)
    return c, c.wire()


def decode_escrow_commit(raw: bytes) -> EscrowCommit:
    """An escrowed commit, decoded strictly (module docstring), its points checked to be valid
    points; neither its signature (:func:`verify_escrow_commit`) nor its shares
    (:func:`open_shares`) are checked here. :class:`TranscriptError` with the reason otherwise."""
    out: EscrowCommit = _read(raw, MAX_ESCROW_COMMIT_BYTES, "transcript escrow commit", _read_escrow_commit)
    return out


def verify_escrow_commit(c: EscrowCommit, ed25519_public: bytes) -> None:
    """:class:`TranscriptError` unless ``ed25519_public`` is the donor's key and signed ``c``."""
    _verify(ed25519_public, c.donor, c.signature, escrow_commit_signing_bytes(c), "escrow commit")


def open_shares(seed32: bytes, c: EscrowCommit) -> tuple[escrow.Share, ...]:
    """The shares sealed in ``c``, opened with the verifier's Ed25519 seed and decoded strictly
    (not checked against the points: :func:`overlay.directory.escrow.verify_holder`; nor is
    ``c.verifier`` compared with the seed's key). :class:`TranscriptError` if they were sealed to
    another key, altered, or are not shares."""
    sealed = c.sealed_shares if isinstance(c, EscrowCommit) else None
    if type(sealed) is not bytes or not MIN_SEALED_SHARES_BYTES <= len(sealed) <= MAX_SEALED_SHARES_BYTES:
        raise _malformed("sealed shares", f"a bin of {MIN_SEALED_SHARES_BYTES} to {MAX_SEALED_SHARES_BYTES} bytes")
    if type(seed32) is not bytes:
        raise _malformed("verifier's seed", "bytes")
    try:
        plain = crypto.open_sealed_ed25519(seed32, sealed)
    except crypto.CryptoError:
        raise TranscriptError("the shares do not open with this verifier's key (sealed to another key, or "
                              "altered)") from None
    try:
        return escrow.decode_shares(plain, escrow.MAX_UNITS)
    except escrow.EscrowError as exc:
        raise _malformed("sealed shares", f"shares ({exc.reason})") from None


def _read_acceptance(r: codec.ShapeReader) -> tuple[Acceptance, list[Any]]:
    what = "transcript acceptance"
    _version(r, 7, what, "[version, verifier key, donor, commitment, points digest, sent_ms, signature]",
             ESCROW_VERSION)
    verifier = _bytes(r.value(), KEY_LEN, what, "the verifier key")
    donor = _bytes(r.value(), NODE_ID_LEN, what, "the donor node id")
    value = _bytes(r.value(), COMMITMENT_LEN, what, "the commitment")
    digest = _bytes(r.value(), DIGEST_LEN, what, "the points digest")
    sent_ms = _int(r.value(), 0, 2**63 - 1, what, "sent_ms")
    sig = _bytes(r.value(), SIGNATURE_LEN, what, "the signature")
    a = Acceptance(verifier, donor, value, digest, sent_ms, sig)
    return a, a.wire()


def decode_acceptance(raw: bytes) -> Acceptance:
    """An acceptance, decoded strictly (module docstring); its signature is not checked here
    (:func:`verify_acceptance`). :class:`TranscriptError` with the reason otherwise."""
    out: Acceptance = _read(raw, MAX_ACCEPTANCE_BYTES, "transcript acceptance", _read_acceptance)
    return out


def verify_acceptance(a: Acceptance, verifier_public: bytes) -> None:
    """:class:`TranscriptError` unless ``verifier_public`` is the key ``a`` names and signed it."""
    if type(verifier_public) is not bytes or len(verifier_public) != crypto.ED25519_PK_LEN \
            or verifier_public != a.verifier:
        raise TranscriptError("the key is not the one the acceptance names")
    try:
        crypto.ed25519_verify(verifier_public, a.signature, acceptance_signing_bytes(a))
    except crypto.CryptoError:
        raise TranscriptError("the acceptance's signature does not verify with the verifier's key") from None


def _read_certificate(r: codec.ShapeReader) -> tuple[Certificate, list[Any]]:
    what = "transcript certificate"
    _version(r, 6, what, "[version, donor, commitment, sent_ms, points, acceptances]", ESCROW_VERSION)
    donor = _bytes(r.value(), NODE_ID_LEN, what, "the donor node id")
    value = _bytes(r.value(), COMMITMENT_LEN, what, "the commitment")
    sent_ms = _int(r.value(), 0, 2**63 - 1, what, "sent_ms")
    points, points_raw = _points(r.value(), what)
    acceptances = []
    for i in range(_array(r, 1, escrow.MAX_HOLDERS, what, "the acceptances")):
        v = r.value()
        if type(v) is not bytes:
            raise _malformed(what, "well formed: an acceptance is not a bin")
        try:
            acceptances.append(decode_acceptance(v))
        except TranscriptError as exc:
            raise _malformed(what, f"well formed: acceptance {i}: {exc.reason}") from None
    c = Certificate(donor, value, sent_ms, points, points_raw, tuple(acceptances))
    return c, c.wire()


def decode_certificate(raw: bytes) -> Certificate:
    """A certificate, decoded strictly (module docstring), every acceptance in it too; what the
    acceptances bind and their signatures are not checked here (:func:`certified_power`).
    :class:`TranscriptError` with the reason otherwise."""
    out: Certificate = _read(raw, MAX_CERTIFICATE_BYTES, "transcript certificate", _read_certificate)
    return out


def certified_power(cert: Certificate, validators: Mapping[bytes, int]) -> int:
    """The summed power of the distinct keys of ``validators`` (validator key to voting power) that
    accepted ``cert``'s commitment: an acceptance counts when its key is one of them, it names the
    certificate's donor, commitment, points digest and sent_ms, and its signature verifies. Others
    (unknown keys, a key counted already, mismatches, bad signatures) add nothing. Never raises."""
    try:
        digest = points_digest(cert.points_raw)
        bound = (cert.donor, cert.value, digest, cert.sent_ms)
        acceptances = tuple(cert.acceptances)
    except (AttributeError, TypeError, ValueError):  # not a certificate: nothing certified
        return 0
    counted: set[bytes] = set()
    total = 0
    for a in acceptances:
        try:
            key = a.verifier
            power = validators.get(key)
            if type(key) is not bytes or key in counted or type(power) is not int or power <= 0 \
                    or (a.donor, a.value, a.digest, a.sent_ms) != bound:
                continue
            verify_acceptance(a, key)
        except (TranscriptError, AttributeError, TypeError, ValueError):  # it adds nothing
            continue
        counted.add(key)
        total += power
    return total


def _read_node_reveal(r: codec.ShapeReader) -> tuple[NodeReveal, list[Any]]:
    what = "transcript node reveal"
    _version(r, 5, what, "[version, node id, verifier key, body, signature]", ESCROW_VERSION)
    node_id = _bytes(r.value(), NODE_ID_LEN, what, "the node id")
    verifier = _bytes(r.value(), KEY_LEN, what, "the verifier key")
    body = _read_escrowed_body(r, what)
    sig = _bytes(r.value(), SIGNATURE_LEN, what, "the signature")
    out = NodeReveal(node_id, verifier, body, sig)
    return out, [ESCROW_VERSION, *out.signed(), sig]


def decode_node_reveal(plaintext: bytes) -> NodeReveal:
    """A node reveal's plaintext (:func:`unseal` opens it), decoded strictly (module docstring);
    its signature is not checked here (:func:`verify_node_reveal`). :class:`TranscriptError`
    with the reason otherwise."""
    out: NodeReveal = _read(plaintext, MAX_REVEAL_BYTES, "transcript node reveal", _read_node_reveal)
    return out


def verify_node_reveal(nr: NodeReveal, node_public: bytes) -> None:
    """:class:`TranscriptError` unless ``node_public`` is the key of the node ``nr`` names, the
    transcript is of a request addressed to that node or a reply it signed (a member the addressed
    node forwarded to: a user's forwarded request is answered straight to the user, so only the
    member saw the reply), and the node signed ``nr``."""
    if type(node_public) is not bytes or len(node_public) != crypto.ED25519_PK_LEN \
            or node_id_of(node_public) != nr.node_id:
        raise TranscriptError("the key is not the node's")
    if nr.node_id not in (nr.body.node_id, nr.body.served_by):
        raise TranscriptError("a node reveals only requests addressed to it or replies it signed: the transcript "
                              "names other nodes")
    try:
        crypto.ed25519_verify(node_public, nr.signature, node_reveal_signing_bytes(nr))
    except crypto.CryptoError:
        raise TranscriptError("the node reveal's signature does not verify with the node's key") from None


def _read_released(r: codec.ShapeReader) -> tuple[tuple[int, tuple[ReleasedItem, ...]], list[Any]]:
    what = "transcript released shares"
    _version(r, 3, what, "[version, epoch, [[commitment, points, shares], ...]]", ESCROW_VERSION)
    epoch = _int(r.value(), 0, 2**63 - 1, what, "the epoch")
    items: list[ReleasedItem] = []
    wire: list[list[Any]] = []
    for _ in range(_array(r, 0, MAX_RELEASED, what, "the released commitments")):
        if r.array() != 3:
            raise _malformed(what, "well formed: an item is [commitment, points, shares]")
        value = _bytes(r.value(), COMMITMENT_LEN, what, "the commitment")
        if items and value <= items[-1][0]:
            raise _malformed(what, "well formed: the commitments are not strictly increasing")
        points_raw, shares_raw = r.value(), r.value()
        if type(points_raw) is not bytes or type(shares_raw) is not bytes:
            raise _malformed(what, "well formed: an item's points and shares are not bins")
        try:
            points = escrow.decode_commitments(points_raw, MAX_RELEASED_UNITS)
            shares = escrow.decode_shares(shares_raw, MAX_RELEASED_UNITS)
        except escrow.EscrowError as exc:
            raise _malformed(what, f"well formed: an item is refused ({exc.reason})") from None
        items.append((value, points, shares))
        wire.append([value, points_raw, shares_raw])
    out = (epoch, tuple(items))
    return out, [ESCROW_VERSION, epoch, wire]


def decode_released(raw: bytes) -> tuple[int, tuple[ReleasedItem, ...]]:
    """A verifier's released shares, decoded strictly (module docstring): the epoch and each
    commitment's points and shares (not checked against each other here:
    :func:`overlay.directory.escrow.verify_shares`). :class:`TranscriptError` with the reason
    otherwise."""
    out: tuple[int, tuple[ReleasedItem, ...]] = _read(raw, MAX_RELEASED_BYTES, "transcript released shares",
                                                       _read_released)
    return out
