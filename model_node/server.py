"""A model node: answers anonymous requests arriving as cloves through users' proxies.

Requests are queued per node (``active`` / ``queued`` counts, which load
balancing uses); each runs on the engine, streams back as reply chunks, and the
last chunk carries the node's Ed25519 signature over the request digest and
every output token id (:mod:`overlay.signing`), so the user can verify who
answered and send follow-ups there (session affinity).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import trio

from model_node.engine import Engine, EngineError
from overlay.anon import Responder
from overlay.identity import Identity
from overlay.messages import Deliver, ReplyChunk, Request
from overlay.node import Node
from overlay.registry import Registry
from overlay.signing import reply_signing_bytes, request_digest
from overlay.transport import Transport

log = logging.getLogger("gentorrent.model")

# Reply chunking: the first piece goes out alone (time to first token); later pieces are
# coalesced until CHUNK_INTERVAL has passed since the last chunk, so a fast engine sends few
# large chunks (each chunk costs n cloves through the overlay) and a slow one streams each piece.
CHUNK_INTERVAL = 0.010  # seconds
CHUNK_MAX_CHARS = 16 * 1024


def check_params(req: Request, max_tokens_limit: int) -> str | None:
    """Why ``req``'s sampling parameters are unacceptable, or ``None``."""
    p = req.params
    if not (math.isfinite(p.temperature) and 0.0 <= p.temperature <= 5.0):
        return f"temperature must be within 0..5, got {p.temperature}"
    if not (math.isfinite(p.top_p) and 0.0 < p.top_p <= 1.0):
        return f"top_p must be within (0, 1], got {p.top_p}"
    if not 0 <= p.top_k <= 1000:
        return f"top_k must be within 0..1000, got {p.top_k}"
    if not 1 <= p.max_tokens <= max_tokens_limit:
        return f"max_tokens must be within 1..{max_tokens_limit}, got {p.max_tokens}"
    if p.seed is not None and not 0 <= p.seed < 2**32:
        return "seed must be within 0..2^32-1"
    return None


class ModelNode:
    def __init__(
        self,
        identity: Identity,
        transport: Transport,
        registry: Registry,
        engine: Engine,
        *,
        capacity: int = 1,
        max_queue: int = 64,
        max_tokens_limit: int = 4096,
        capacity_score: int = 1,
    ) -> None:
        """``capacity``: requests generated at once (the rest wait in a queue of ``max_queue``);
        ``capacity_score``: the node's hardware score 1–10 that load balancing divides its load
        by (paper §3.3; ``--capacity``), independent of ``capacity``."""
        self.identity = identity
        self.capacity_score = capacity_score
        self.engine = engine
        self.model = engine.model
        self.max_tokens_limit = max_tokens_limit
        self.max_queue = max_queue
        self.active = 0
        self.queued = 0
        self.served = 0
        self._slots = trio.Semaphore(capacity)
        self.node = Node(identity, transport, peers=registry.entries, ping_interval=0)
        self.responder = Responder(identity, self.handle, self.node.send_nowait, self._proxy,
                                   max_active=max_queue + capacity)
        self._registry = registry
        self.node.on(Deliver, self.responder.on_deliver)
        self.node.on(Request, self._on_direct)

    def _proxy(self, node_id: bytes) -> Any:
        """Reply cloves go only to registered user nodes (proxies), never to other model nodes."""
        e = self._registry.by_id.get(node_id)
        return e if e is not None and e.role == "user" else None

    async def _on_direct(self, conn: Any, req: Request) -> None:
        """A direct, NON-anonymous request over authenticated TLS: the reply chunks come
        back on the same connection. For benchmarks (the overlay's baseline) and diagnostics."""
        async with aclosing(self.handle(req)) as chunks:
            async for chunk in chunks:
                await conn.send(chunk)
                if chunk.done:
                    break

    def _chunk(self, req: Request, seq: int, text: str, ids: tuple[int, ...], *, done: bool = False,
               error: str = "", signature: bytes = b"", signed_at_ms: int = 0) -> ReplyChunk:
        return ReplyChunk(request_id=req.request_id, seq=seq, text=text, token_ids=ids, done=done, error=error,
                          node=self.identity.node_id, signature=signature, signed_at_ms=signed_at_ms)

    async def handle(self, req: Request) -> AsyncIterator[ReplyChunk]:
        """Serve one request: validate, queue, generate, stream, sign."""
        if req.model != self.model:
            yield self._chunk(req, 0, "", (), done=True, error=f"this node serves {self.model!r}, not {req.model!r}")
            return
        why = check_params(req, self.max_tokens_limit)
        if why is None:
            try:
                prompt_ids = self.engine.chat_prompt(req.messages, req.continuation)
            except EngineError as exc:
                why = str(exc)
            else:
                ctx = self.engine.context_window
                if len(prompt_ids) + req.params.max_tokens > ctx:
                    why = (f"the prompt ({len(prompt_ids)} tokens) plus max_tokens ({req.params.max_tokens}) "
                           f"exceeds the model's context window of {ctx} tokens")
        if why is None and self.queued >= self.max_queue:
            why = "model node is at capacity; try again later"
        if why is not None:
            yield self._chunk(req, 0, "", (), done=True, error=why)
            return
        self.queued += 1
        try:
            await self._slots.acquire()
        finally:
            self.queued -= 1
        self.active += 1
        try:
            async with aclosing(self._generate(req, prompt_ids)) as chunks:
                async for chunk in chunks:
                    yield chunk
        finally:
            self.active -= 1
            self._slots.release()

    async def _generate(self, req: Request, prompt_ids: list[int]) -> AsyncIterator[ReplyChunk]:
        all_ids: list[int] = []
        seq, buf, ids, size, last = 0, [], [], 0, trio.current_time()
        try:
            gen = self.engine.generate(prompt_ids, req.params)
        except EngineError as exc:
            yield self._chunk(req, 0, "", (), done=True, error=str(exc))
            return
        try:
            async with aclosing(gen.__aiter__()) as pieces:
                async for piece in pieces:
                    buf.append(piece.text)
                    ids.extend(piece.token_ids)
                    size += len(piece.text)
                    now = trio.current_time()
                    if seq == 0 or now - last >= CHUNK_INTERVAL or size >= CHUNK_MAX_CHARS:
                        all_ids.extend(ids)
                        yield self._chunk(req, seq, "".join(buf), tuple(ids))
                        seq, buf, ids, size, last = seq + 1, [], [], 0, now
        except EngineError as exc:  # the engine failed mid-reply: say so (unsigned)
            log.warning("engine failed during a reply: %s", exc)
            yield self._chunk(req, seq, "", (), done=True, error=str(exc))
            return
        all_ids.extend(ids)
        signed_at = int(time.time() * 1000)
        sig = self.identity.sign(
            reply_signing_bytes(request_digest(req), all_ids, self.model, self.identity.node_id, signed_at)
        )
        self.served += 1
        if gen.stats is not None:
            log.info("served %d prompt tokens (%d evaluated), %d output tokens, ttft %.3fs",
                     gen.stats.prompt_tokens, gen.stats.evaluated_prompt_tokens, gen.stats.output_tokens,
                     gen.stats.ttft_s)
        yield self._chunk(req, seq, "".join(buf), tuple(ids), done=True, signature=sig, signed_at_ms=signed_at)

    def load(self) -> dict[str, int]:
        return {"active": self.active, "queued": self.queued}

    async def serve(
        self, host: str = "127.0.0.1", port: int = 0, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
    ) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self.responder.run)
            address = await nursery.start(self.node.serve, host, port)
            task_status.started(address)
