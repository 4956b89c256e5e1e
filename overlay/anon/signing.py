"""Signed replies (DESIGN.md "Forwarding"): the reply hash chain, what a serving model node
signs, and the check. The model node and every client use this one codec.

**Hash chain.** Each reply chunk carries ``chain``, a running hash over everything the node
has sent so far in this reply, in order::

    chain_0 = BLAKE2b-256(CHAIN_CONTEXT || request digest)
    chain_i = BLAKE2b-256(CHAIN_CONTEXT || chain_{i-1}
                          || u32 len(text_i utf-8) || text_i utf-8
                          || u32 count(ids_i) || ids_i as u32 each)

Every field is length-prefixed and the context is fixed, so two different chunk streams
(different text, different ids, or the same bytes cut into chunks differently) never give
the same chain.

**Signature.** Every output chunk is signed, with the node's Ed25519 identity key, over::

    REPLY_CONTEXT || request digest (32) || chain_i (32) || final (1 byte: 0/1)
                  || model (length-prefixed UTF-8) || node id (20) || signed_at_ms (u64)

So a signature on chunk i vouches for all text *and* token ids up to chunk i, and the
final chunk's signature for the whole reply; ``final`` stops a relaying node from passing
a truncated reply off as complete. A node killed mid-reply has still signed every chunk
it sent: after a failover the user holds one signature per part, each over its own
node's text (the next node's request digest covers the earlier part as ``continuation``).

The request digest covers the request's content — model, messages, sampling parameters
and continuation — not its routing (request id, return paths), so anyone holding the
prompt (the user, a verifier re-scoring a challenge) can recompute it. Error chunks are
never an answer; only one kind is signed:

**Signed "busy".** A model node that refuses a request as busy before any output (seq 0) signs,
over the same request digest, that it did::

    BUSY_CONTEXT || request digest (32) || model (length-prefixed UTF-8) || node id (20)
                 || signed_at_ms (u64)

(:func:`busy_signing_bytes`; the signature and time ride in the error chunk's ``signature`` and
``signed_at_ms``, its chain empty). A donor's client reveals it for a committed request the node
refused, which its verifiers take as neither a sample nor a void set (decision 0044). The node
serves no request it signed "busy" for: each request id is answered once (:mod:`overlay.anon.replay`).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence

import msgpack

from overlay.wire import crypto
from overlay.wire.messages import Request

REPLY_CONTEXT = b"gentorrent/reply/v2\x00"
BUSY_CONTEXT = b"gentorrent/busy/v1\x00"
CHAIN_CONTEXT = b"gentorrent/reply-chain/v1\x00"
_CHAIN_PERSON = b"gentorrent-chain"
CHAIN_LEN = 32


class ReplyVerifyError(Exception):
    """A reply's hash chain or signature does not verify: the reply was forged or altered."""


def request_digest(req: Request, target: bytes) -> bytes:
    """What a reply signs of its request: BLAKE2b-256 (person ``gentorrent-req``) of the msgpack of
    ``[request_id, target, model, messages, params, continuation]``, ``target`` being the model
    node the client addressed (the node that forwarded the request, for the member that serves
    it). The request id (random per request and per try) makes a signed reply answer one request,
    not every request with the same text, and the target makes it one node's answer: a node answers
    each id once (:mod:`overlay.anon.replay`) and an honest node signs only its own target or a
    member's, so a client gets one sample per id and node, which is what makes a committed
    transcript an unbiased draw (decision 0015)."""
    p = req.params
    content = [
        req.request_id,
        target,
        req.model,
        [[m.role, m.content] for m in req.messages],
        [p.temperature, p.top_p, p.top_k, p.max_tokens, p.seed],
        req.continuation,
    ]
    return crypto.blake2b(msgpack.packb(content, use_bin_type=True), size=32, person=b"gentorrent-req")


def chain_start(digest: bytes) -> bytes:
    """The chain value before the first chunk of the reply to the request with ``digest``."""
    return crypto.blake2b(CHAIN_CONTEXT + digest, size=CHAIN_LEN, person=_CHAIN_PERSON)


def chain_next(prev: bytes, text: str, token_ids: Sequence[int]) -> bytes:
    """The chain value after a chunk with ``text`` and ``token_ids`` follows ``prev``.
    :class:`ReplyVerifyError` if a token id does not fit in 32 bits."""
    t = text.encode("utf-8", errors="surrogatepass")
    try:
        ids = struct.pack(f">{len(token_ids)}I", *token_ids)
    except struct.error:
        raise ReplyVerifyError("output token ids out of range") from None
    body = CHAIN_CONTEXT + prev + struct.pack(">I", len(t)) + t + struct.pack(">I", len(token_ids)) + ids
    return crypto.blake2b(body, size=CHAIN_LEN, person=_CHAIN_PERSON)


def reply_signing_bytes(digest: bytes, chain: bytes, final: bool, model: str, node_id: bytes,
                        signed_at_ms: int) -> bytes:
    """What a node signs for one chunk: the request ``digest``, the ``chain`` value after the
    chunk, whether it is the ``final`` chunk, ``model``, its ``node_id`` and ``signed_at_ms``."""
    if len(chain) != CHAIN_LEN:
        raise ReplyVerifyError(f"the reply chunk's chain value is {len(chain)} bytes, not {CHAIN_LEN}")
    if not 0 <= signed_at_ms < 1 << 64:
        raise ReplyVerifyError("the reply chunk's signing time is out of range")
    m = model.encode()
    return (REPLY_CONTEXT + digest + chain + (b"\x01" if final else b"\x00") + struct.pack(">H", len(m)) + m
            + node_id + struct.pack(">Q", signed_at_ms))


def verify_reply(ed25519_public: bytes, signature: bytes, digest: bytes, chain: bytes, final: bool, model: str,
                 node_id: bytes, signed_at_ms: int) -> None:
    """:class:`ReplyVerifyError` unless ``signature`` is ``node_id``'s (key ``ed25519_public``)
    over :func:`reply_signing_bytes` of the rest."""
    try:
        crypto.ed25519_verify(ed25519_public, signature,
                              reply_signing_bytes(digest, chain, final, model, node_id, signed_at_ms))
    except crypto.CryptoError:
        raise ReplyVerifyError(f"the reply's signature from node {node_id.hex()[:8]} does not verify") from None


def busy_signing_bytes(digest: bytes, model: str, node_id: bytes, signed_at_ms: int) -> bytes:
    """What a node signs when it refuses the request with ``digest`` as busy before any output."""
    if not 0 <= signed_at_ms < 1 << 64:
        raise ReplyVerifyError("the busy refusal's signing time is out of range")
    m = model.encode()
    return BUSY_CONTEXT + digest + struct.pack(">H", len(m)) + m + node_id + struct.pack(">Q", signed_at_ms)


def verify_busy(ed25519_public: bytes, signature: bytes, digest: bytes, model: str, node_id: bytes,
                signed_at_ms: int) -> None:
    """:class:`ReplyVerifyError` unless ``signature`` is ``node_id``'s (key ``ed25519_public``)
    over :func:`busy_signing_bytes` of the rest."""
    try:
        crypto.ed25519_verify(ed25519_public, signature, busy_signing_bytes(digest, model, node_id, signed_at_ms))
    except crypto.CryptoError:
        raise ReplyVerifyError(f"the busy refusal's signature from node {node_id.hex()[:8]} does not verify") from None


class ReplySigner:
    """A model node's side of one reply: feed each chunk's text and ids in order, get its
    chain value and signature (``sign(key_bytes) -> signature``)."""

    def __init__(self, digest: bytes, model: str, node_id: bytes) -> None:
        self.digest, self.model, self.node_id = digest, model, node_id
        self.chain = chain_start(digest)

    def add(self, text: str, token_ids: Sequence[int], final: bool, signed_at_ms: int,
            sign: Callable[[bytes], bytes]) -> tuple[bytes, bytes]:
        """``(chain, signature)`` for the next chunk."""
        self.chain = chain_next(self.chain, text, token_ids)
        return self.chain, sign(reply_signing_bytes(self.digest, self.chain, final, self.model, self.node_id,
                                                    signed_at_ms))


class ReplyChecker:
    """A client's side of one reply from one node: check each chunk in order against the
    chain recomputed from what arrived and against the node's signature; :meth:`check`
    raises :class:`ReplyVerifyError` on the first mismatch."""

    def __init__(self, digest: bytes, model: str, node_id: bytes, ed25519_public: bytes) -> None:
        self.digest, self.model, self.node_id, self.key = digest, model, node_id, ed25519_public
        self.chain = chain_start(digest)
        self.signature = b""
        self.signed_at_ms = 0
        self.chunks = 0

    def check(self, text: str, token_ids: Sequence[int], final: bool, chain: bytes, signature: bytes,
              signed_at_ms: int) -> None:
        expect = chain_next(self.chain, text, token_ids)
        if not crypto.ct_equal(expect, chain):
            raise ReplyVerifyError(f"reply chunk {self.chunks} from node {self.node_id.hex()[:8]} does not match "
                                   "its hash chain (its text or token ids were altered)")
        verify_reply(self.key, signature, self.digest, chain, final, self.model, self.node_id, signed_at_ms)
        self.chain, self.signature, self.signed_at_ms = chain, signature, signed_at_ms
        self.chunks += 1
