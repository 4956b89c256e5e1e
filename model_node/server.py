"""A model node: answers anonymous requests arriving as cloves through proxies."""

from __future__ import annotations

import logging
from contextlib import aclosing
import math
from collections.abc import AsyncIterator
from typing import Any

import trio

from overlay.anon import Responder
from overlay.identity import Identity
from overlay.messages import Deliver, ReplyChunk, Request
from overlay.node import Node
from overlay.registry import Registry
from overlay.transport import Transport

log = logging.getLogger("gentorrent.model")

CHUNK_PIECES = 16  # pieces per reply chunk after the first (which goes out alone, for TTFT)


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
    return None


class ModelNode:
    def __init__(
        self,
        identity: Identity,
        transport: Transport,
        registry: Registry,
        engine: Any,
        model: str,
        *,
        max_tokens_limit: int = 4096,
    ) -> None:
        self.identity = identity
        self.engine = engine
        self.model = model
        self.max_tokens_limit = max_tokens_limit
        self.node = Node(identity, transport, peers=registry.entries, ping_interval=0)
        self.responder = Responder(identity, self._handle, self.node.send_nowait, registry.by_id.get)
        self.node.on(Deliver, self.responder.on_deliver)
        self.node.on(Request, self._on_direct)

    async def _on_direct(self, conn: Any, req: Request) -> None:
        """A direct, NON-anonymous request over authenticated TLS: the reply chunks come
        back on the same connection. For benchmarks (the overlay's baseline) and diagnostics."""
        async with aclosing(self._handle(req)) as chunks:
            async for chunk in chunks:
                await conn.send(chunk)
                if chunk.done:
                    break

    async def _handle(self, req: Request) -> AsyncIterator[ReplyChunk]:
        def chunk(seq: int, text: str, done: bool, error: str = "") -> ReplyChunk:
            return ReplyChunk(request_id=req.request_id, seq=seq, text=text, token_ids=(), done=done, error=error)

        if req.model != self.model:
            yield chunk(0, "", True, f"this node serves {self.model!r}, not {req.model!r}")
            return
        why = check_params(req, self.max_tokens_limit)
        if why:
            yield chunk(0, "", True, why)
            return
        seq, buf = 0, []
        async for piece in self.engine.stream(req.messages, req.params):
            buf.append(piece)
            if seq == 0 or len(buf) >= CHUNK_PIECES:
                yield chunk(seq, "".join(buf), False)
                seq, buf = seq + 1, []
        yield chunk(seq, "".join(buf), True)

    async def serve(
        self, host: str = "127.0.0.1", port: int = 0, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
    ) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self.responder.run)
            address = await nursery.start(self.node.serve, host, port)
            task_status.started(address)
