"""The model node's end of the anonymous request API (paper §3.2 step 4).

:class:`Responder` opens sealed cloves delivered by proxies and reassembles requests from any k
of them (forged or tampered cloves are discarded, never fatal), which it hands back to its
caller; given a request and the stream of its reply chunks, it S-IDA-splits every chunk to the
request's n return paths, each clove sealed with that path's return key. It is called, and calls
only what it was given (the reply stream, the proxy directory, the sender): it knows nothing of
what serves a request. The user's end is :mod:`overlay.anon.client`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio

from overlay.anon import sida
from overlay.anon.relay import TokenBucket
from overlay.anon.replay import AnsweredIds
from overlay.anon.seal import ReturnKey, SealError, open_sealed
from overlay.net.peers import PeerEntry
from overlay.wire import codec
from overlay.wire.clock import Clock, TrioClock
from overlay.wire.failures import Failure
from overlay.wire.identity import Identity
from overlay.wire.messages import (
    Deliver,
    ReplyChunk,
    Request,
    ReturnClove,
)

log = logging.getLogger("gentorrent.anon")


def busy_error(detail: str) -> str:
    """The words of a "busy" refusal (sent with :attr:`Failure.BUSY`): ``busy: <detail>``."""
    return f"busy: {detail}"


TOKEN_REFUSAL = "quota token refused: "  # how a model node's words for a refused usage-quota token start
TOKEN_SPENT = "it was spent already"  # and go on when an issuer says the token was redeemed before


def invalid_error(detail: str) -> str:
    """The words of a refusal no other model node would answer differently (sent with
    :attr:`Failure.INVALID`): ``invalid request: <detail>``."""
    return f"invalid request: {detail}"


ReplyStream = Callable[[Request], AsyncIterator[ReplyChunk]]


async def only(chunk: ReplyChunk) -> AsyncGenerator[ReplyChunk, None]:
    """A reply of the one ``chunk`` (a refusal)."""
    yield chunk


@asynccontextmanager
async def _closing(chunks: AsyncIterator[ReplyChunk]) -> AsyncGenerator[AsyncIterator[ReplyChunk], None]:
    """``contextlib.aclosing`` for any reply stream: an async generator (what handlers are)
    is closed on exit, so an engine stops generating for a request that ended early."""
    try:
        yield chunks
    finally:
        if isinstance(chunks, AsyncGenerator):
            await chunks.aclose()


class Responder:
    """A model node's end of the overlay: cloves in, requests out; requests and their reply
    streams in, reply cloves out.

    :meth:`on_deliver` opens a proxy's clove and returns the request once any k of its cloves
    are in; :meth:`accept` answers a request to its return paths with the reply stream
    ``reply(request)`` its caller gives (chunks with increasing ``seq``).
    ``directory(node_id)`` resolves proxies (registry users only: a request
    cannot steer the model node to arbitrary addresses). ``admits(node_id)``, if given, says
    which proxies' cloves are opened at all (a model node whose lists come from the committee:
    only its listed users); the others' are dropped unopened and counted
    (``deliver-not-registered``). Each proxy may deliver at most
    ``delivers_per_s`` cloves a second (bursts of ``deliver_burst``): opening one costs an
    X25519, so a flooding proxy is cut off before it can take the node's CPU; cloves over the
    limit are dropped and counted (``deliver-rate-limited``), and the user's other cloves
    still arrive through other proxies. ``clock`` (default :class:`~overlay.wire.clock.TrioClock`)
    times the rate limits, the reassembler's TTL and how long request ids are remembered.
    """

    MAX_BUCKETS = 10_000

    def __init__(
        self,
        identity: Identity,
        send: Callable[[bytes, Any], bool],
        directory: Callable[[bytes], PeerEntry | None],
        *,
        admits: Callable[[bytes], bool] | None = None,
        max_active: int = 64,
        delivers_per_s: float = 500.0,
        deliver_burst: float = 1_000.0,
        clock: Clock | None = None,
    ) -> None:
        self.identity = identity
        self.clock: Clock = clock or TrioClock()
        self.send = send
        self.directory = directory
        self.admits = admits
        self.reassembler = sida.Reassembler()
        self.max_active = max_active
        self.active = 0
        self.served = 0
        self.dropped: dict[str, int] = {}
        self.answered = AnsweredIds()  # each request id answered once (overlay/anon/replay.py, decision 0015)
        self._nursery: trio.Nursery | None = None
        self.delivers_per_s = delivers_per_s
        self.deliver_burst = deliver_burst
        self._buckets: dict[bytes, TokenBucket] = {}

    def _drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1
        log.info("dropped: %s", reason)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            while True:
                await trio.sleep(10)
                now = self.clock.monotonic()
                self.reassembler.expire(now)

    async def on_deliver(self, conn: Any, msg: Deliver) -> Request | None:
        """A clove a proxy delivered: the request, once this clove completes one (any k of its
        cloves); ``None`` while it does not, or if the clove was dropped (counted)."""
        if self.admits is not None and not self.admits(conn.peer_id):
            self._drop("deliver-not-registered")
            return None
        bucket = self._buckets.get(conn.peer_id)  # by the whole id: a short id is 32 bits, cheap to collide with
        if bucket is None:
            if len(self._buckets) >= self.MAX_BUCKETS:
                self._buckets.clear()  # bounded; forgotten proxies start again from a full burst
            bucket = self._buckets[conn.peer_id] = TokenBucket(self.delivers_per_s, self.deliver_burst)
        now = self.clock.monotonic()
        if not bucket.take(now):
            self._drop("deliver-rate-limited")
            return None
        try:
            clove = sida.decode_clove(open_sealed(self.identity.x25519, msg.sealed), peer=conn.peer)
        except (SealError, codec.RemoteProtocolError):
            self._drop("clove-unsealable")  # forged or tampered: discarded, never fatal
            return None
        try:
            message = self.reassembler.add(clove, now)
        except sida.SidaError:
            self._drop("clove-rejected")
            return None
        if message is None:
            return None
        try:
            req = codec.decode(message)
        except codec.RemoteProtocolError:
            self._drop("request-malformed")
            return None
        if not isinstance(req, Request):
            self._drop("request-malformed")
            return None
        return req

    def accept(self, req: Request, reply: ReplyStream,
               busy: Callable[[Request, str], ReplyChunk] | None = None) -> bool:
        """Answer ``req`` to its return paths with the chunks of ``reply(req)``, run in the
        background: a request rebuilt by :meth:`on_deliver`, or one another model node handed
        over (forwarding). Over ``max_active`` requests in progress ``reply`` is not called: the
        request is refused with a "busy" error chunk, ``busy(req, why)`` where given (the model
        node's, signed: decision 0044). ``False`` (counted) if it is malformed or a duplicate."""
        if not 1 <= req.k <= len(req.return_paths) <= 16:
            self._drop("request-malformed")
            return False
        if not self.answered.take(req.request_id, self.clock.monotonic()):
            self._drop("request-duplicate")
            return False
        assert self._nursery is not None, "Responder.run() must be running"
        if self.active >= self.max_active:
            why = f"model node is at capacity ({self.active} requests in progress)"
            refusal = busy(req, why) if busy is not None else self._error_chunk(req, 0, busy_error(
                f"{why}; try another model node serving the model, or again in a minute"), Failure.BUSY)
            self._start(req, only(refusal))
            return True
        self._start(req, reply(req))
        return True

    def _start(self, req: Request, chunks: AsyncIterator[ReplyChunk]) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(self._answer, req, chunks)

    def _error_chunk(self, req: Request, seq: int, why: str,
                     failure: Failure = Failure.NODE_ERROR) -> ReplyChunk:
        return ReplyChunk(request_id=req.request_id, seq=seq, text="", token_ids=(), done=True, error=why,
                          node=self.identity.node_id, chain=b"", signature=b"", signed_at_ms=0, failure=failure)

    async def _answer(self, req: Request, chunks: AsyncIterator[ReplyChunk]) -> None:
        self.active += 1
        seq = 0
        try:
            try:
                async with _closing(chunks):
                    async for chunk in chunks:
                        self._send_chunk(req, chunk)
                        seq = chunk.seq + 1
                        if chunk.done:
                            break
            except Exception as exc:
                log.exception("request failed in the engine")
                self._send_chunk(req, self._error_chunk(req, seq, f"model node error: {type(exc).__name__}"))
            self.served += 1
        finally:
            self.active -= 1

    def _send_chunk(self, req: Request, chunk: ReplyChunk) -> None:
        n = len(req.return_paths)
        cloves = sida.split(codec.encode(chunk), n, req.k)
        for rp, clove in zip(req.return_paths, cloves, strict=True):
            if self.directory(rp.proxy) is None:
                self._drop("proxy-not-in-registry")
                continue
            data = ReturnKey(rp.key, rp.tag).seal(sida.encode_clove(clove))
            self.send(rp.proxy, ReturnClove(proxy_path_id=rp.proxy_path_id, data=data))
