"""Signed replies (DESIGN.md "Forwarding"): what a serving model node signs, and the check.

The node signs, with its Ed25519 identity key::

    REPLY_CONTEXT || request digest (32) || SHA-256 of the output token ids (32)
                  || model (length-prefixed UTF-8) || node id (20) || signed_at_ms (u64)

The request digest covers the request's content — model, messages, sampling
parameters and continuation — not its routing (request id, return paths), so
anyone holding the prompt (the user, a verifier re-scoring a challenge) can
recompute it. A user checks the signature against the node's key from the
signed registry before trusting the node for session affinity; verifiers keep
signed replies as evidence.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import msgpack

from overlay import crypto
from overlay.messages import Request

REPLY_CONTEXT = b"gentorrent/reply/v1\x00"


class ReplyVerifyError(Exception):
    """A reply's signature does not verify: the reply was forged or altered."""


def request_digest(req: Request) -> bytes:
    p = req.params
    content = [
        req.model,
        [[m.role, m.content] for m in req.messages],
        [p.temperature, p.top_p, p.top_k, p.max_tokens, p.seed],
        req.continuation,
    ]
    return crypto.blake2b(msgpack.packb(content, use_bin_type=True), size=32, person=b"gentorrent-req")


def reply_signing_bytes(digest: bytes, output_ids: Sequence[int], model: str, node_id: bytes, signed_at_ms: int) -> bytes:
    try:
        ids = struct.pack(f">{len(output_ids)}I", *output_ids)
    except struct.error:
        raise ReplyVerifyError("output token ids out of range") from None
    m = model.encode()
    return (REPLY_CONTEXT + digest + crypto.sha256(ids) + struct.pack(">H", len(m)) + m + node_id
            + struct.pack(">Q", signed_at_ms))


def verify_reply(ed25519_public: bytes, signature: bytes, digest: bytes, output_ids: Sequence[int], model: str,
                 node_id: bytes, signed_at_ms: int) -> None:
    try:
        crypto.ed25519_verify(ed25519_public, signature,
                              reply_signing_bytes(digest, output_ids, model, node_id, signed_at_ms))
    except crypto.CryptoError:
        raise ReplyVerifyError(f"the reply's signature from node {node_id.hex()[:8]} does not verify") from None
