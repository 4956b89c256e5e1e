"""A node: listens, authenticates peers, dispatches their messages, pings its peers.

Every role builds on this. Handlers are registered per message type::

    node.on(Ping, handle_ping)         # async (conn, msg) -> reply message | None

Connections in both directions (accepted and dialed) run the same receive loop,
so a peer can talk on whichever connection exists. A peer that sends a bad
frame gets an ``Error`` frame and a closed connection; the node counts the
reason (``node.rejected``) and keeps serving everyone else.

Outboxes (:meth:`Node.send_nowait`) are bounded per peer in frames (:data:`OUTBOX_FRAMES`) and
bytes (:data:`OUTBOX_BYTES`), and all together in bytes (:data:`OUTBOXES_BYTES`, of which the
last quarter only takes frames for peers whose queue is short, :data:`OUTBOX_SHORT`): a frame
over a bound is dropped and counted (``outbox-full``, ``outbox-bytes``, ``outboxes-bytes``). A
frame counts from the moment it is queued until its write has finished or failed.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import trio

from overlay.net.peers import PeerEntry
from overlay.net.transport import Connection, Transport, TransportError
from overlay.wire import codec, crypto
from overlay.wire.clock import Clock, TrioClock
from overlay.wire.codec import RemoteProtocolError
from overlay.wire.identity import Identity, short_id
from overlay.wire.messages import Echo, EchoReply, Error, PeerSeen, PeerStatus, PeerStatusRequest, Ping, Pong

log = logging.getLogger("gentorrent.node")

MessageHandler = Callable[[Connection, Any], Awaitable[Any]]

MAX_PENDING_PINGS = 4096
OUTBOX_FRAMES = 2048  # frames queued per peer before new ones are dropped
OUTBOX_BYTES = 8 * 1024 * 1024  # bytes queued per peer (four of the largest frames, codec.MAX_FRAME)
OUTBOXES_BYTES = 256 * 1024 * 1024  # bytes queued for all peers together
OUTBOX_SHORT = 1024 * 1024  # a queue holding less may use the last quarter of OUTBOXES_BYTES
OUTBOX_IDLE = 120.0   # seconds an idle outbox writer lingers


class Directory(Protocol):
    """What :func:`listed_in` reads: a directory's entries by node id (a
    :class:`~overlay.directory.registry.Registry`, updated in place)."""

    @property
    def by_id(self) -> Mapping[bytes, object]: ...


def listed_in(directory: Directory) -> Callable[[bytes], bool]:
    """The ``registered`` predicate for a node whose directory is ``directory``: a peer is
    registered if ``directory`` lists it, read at each call (lists refresh in place). While the
    directory is empty (a node whose lists come from the committee, before the first one) every
    peer counts as registered, as with no predicate: nothing is preferred before anything is
    known, and the connections taken meanwhile are counted again once the list arrives."""

    def registered(peer_id: bytes) -> bool:
        listed = directory.by_id
        return not listed or peer_id in listed

    return registered


class _Outbox:
    """One peer's queue of frames and the bytes it holds (queued or being written)."""

    __slots__ = ("bytes", "send")

    def __init__(self, send: trio.MemorySendChannel[bytes]) -> None:
        self.send = send
        self.bytes = 0


class Node:
    def __init__(
        self,
        identity: Identity,
        transport: Transport,
        *,
        peers: list[PeerEntry] | None = None,
        ping_interval: float = 30.0,
        idle_timeout: float = 300.0,
        clock: Clock | None = None,
        registered: Callable[[bytes], bool] | None = None,
    ) -> None:
        """``clock`` (default :class:`~overlay.wire.clock.TrioClock`) times uptime and ping round
        trips (``monotonic``) and stamps when a peer last answered (``unix``). ``registered``
        (``registered(peer_id)``: whether the peer is in this node's current directory) becomes
        the transport's admission predicate (:class:`~overlay.net.transport.Admission`: registered
        peers are preferred; unregistered ones share a bounded part of the connection slots);
        ``None`` leaves the transport's as it is."""
        self.identity = identity
        if registered is not None:
            transport.registered = registered
        self.clock: Clock = clock or TrioClock()
        self.transport = transport
        self.peers = {p.node_id: p for p in (peers or []) if p.node_id != identity.node_id}
        self.ping_interval = ping_interval
        self.idle_timeout = idle_timeout
        self.address: str | None = None
        self.started_at: float | None = None  # clock.monotonic() when serve() started
        self.rejected: Counter[str] = Counter()
        self.seen: dict[bytes, PeerSeen] = {}
        self._handlers: dict[type, MessageHandler] = {}
        self._conns: dict[bytes, Connection] = {}
        self._dial_locks: dict[bytes, trio.Lock] = {}
        self._pings: dict[int, trio.Event] = {}
        self._nursery: trio.Nursery | None = None
        self._outboxes: dict[bytes, _Outbox] = {}
        self.outbox_bytes = OUTBOX_BYTES
        self.outboxes_bytes = OUTBOXES_BYTES
        self.queued_bytes = 0  # in all outboxes
        self._lost_callbacks: list[Callable[[bytes], None]] = []
        self.on(Ping, self._on_ping)
        self.on(Pong, self._on_pong)
        self.on(PeerStatusRequest, self._on_status)
        self.on(Echo, self._on_echo)

    @property
    def node_id(self) -> bytes:
        return self.identity.node_id

    def on(self, msg_type: type, handler: MessageHandler) -> None:
        self._handlers[msg_type] = handler

    # ------------------------------------------------------------------ serving

    async def serve(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Listen and ping peers until cancelled; reports the bound address."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self.started_at = self.clock.monotonic()
            self.address = await nursery.start(self.transport.serve, self._serve_conn, host, port)
            if self.ping_interval > 0:  # also with no peers yet: a committee's lists fill them later
                nursery.start_soon(self._ping_loop)
            task_status.started(self.address)

    async def _serve_conn(self, conn: Connection) -> None:
        old = self._conns.get(conn.peer_id)
        if old is None or old.closed:
            self._conns[conn.peer_id] = conn
        try:
            await self._receive_loop(conn)
        finally:
            await conn.aclose()
            if self._conns.get(conn.peer_id) is conn:
                del self._conns[conn.peer_id]
                self._peer_lost(conn.peer_id)
            await conn.aclose()  # shielded; also when the node stops (dialed connections)

    def on_peer_lost(self, callback: Callable[[bytes], None]) -> None:
        """``callback(peer_id)`` runs when the last connection to a peer closes
        or queued frames for it could not be delivered."""
        self._lost_callbacks.append(callback)

    def _peer_lost(self, peer_id: bytes) -> None:
        for cb in self._lost_callbacks:
            cb(peer_id)

    async def _receive_loop(self, conn: Connection) -> None:
        while not conn.closed:
            try:
                msg = await conn.receive(idle_timeout=self.idle_timeout)
            except RemoteProtocolError as exc:
                self._reject(conn, "bad-frame", str(exc))
                await conn.reject("bad-frame", exc.reason)
                return
            except TransportError as exc:
                log.debug("%s: %s", conn.peer, exc)
                await conn.aclose()
                return
            if isinstance(msg, Error):
                log.info("peer %s reported error %s: %s", conn.peer, msg.code, msg.detail)
                await conn.aclose()
                return
            handler = self._handlers.get(type(msg))
            if handler is None:
                self._reject(conn, "unexpected-message", type(msg).__name__)
                await conn.reject("unexpected-message", f"this node does not accept {type(msg).__name__}")
                return
            try:
                reply = await handler(conn, msg)
                if reply is not None:
                    await conn.send(reply)
            except RemoteProtocolError as exc:
                self._reject(conn, "bad-message", str(exc))
                await conn.reject("bad-message", exc.reason)
                return
            except TransportError as exc:
                log.debug("%s: %s", conn.peer, exc)
                return

    def _reject(self, conn: Connection, reason: str, detail: str) -> None:
        self.rejected[reason] += 1
        log.warning("dropping peer %s (%s): %s: %s", conn.peer, conn.address, reason, detail)

    # ------------------------------------------------------------------ dialing

    async def connection_to(self, peer: PeerEntry) -> Connection:
        """A live connection to ``peer`` (reused, or dialed and pinned to its id)."""
        conn = self._conns.get(peer.node_id)
        if conn is not None and not conn.closed:
            return conn
        lock = self._dial_locks.setdefault(peer.node_id, trio.Lock())
        async with lock:
            conn = self._conns.get(peer.node_id)
            if conn is not None and not conn.closed:
                return conn
            conn = await self.transport.dial(peer.address, peer.node_id)
            self._conns[peer.node_id] = conn
            assert self._nursery is not None, "Node.serve() must be running"
            self._nursery.start_soon(self._serve_conn, conn)
            return conn

    def send_nowait(self, peer_id: bytes, msg: Any) -> bool:
        """Queue ``msg`` for ``peer_id`` without waiting; ``False`` (counted) if dropped.

        Each peer has a bounded outbox drained by one writer task, which dials
        the peer from ``self.peers`` if no connection is open. Relaying uses
        this so a slow next hop never stalls the connection a cell came in on.
        Bounds (module docstring): ``OUTBOX_FRAMES`` frames and ``self.outbox_bytes`` bytes per
        peer, ``self.outboxes_bytes`` bytes in all.
        """
        frame = codec.frame(msg)
        box = self._outboxes.get(peer_id)
        if box is None and peer_id not in self._conns and peer_id not in self.peers:
            self.rejected["unknown-destination"] += 1
            return False
        n, held = len(frame), 0 if box is None else box.bytes
        if held + n > self.outbox_bytes:
            self.rejected["outbox-bytes"] += 1
            return False
        room = self.outboxes_bytes if held < OUTBOX_SHORT else self.outboxes_bytes * 3 // 4
        if self.queued_bytes + n > room:
            self.rejected["outboxes-bytes"] += 1
            return False
        if box is None:
            assert self._nursery is not None, "Node.serve() must be running"
            send, inbox = trio.open_memory_channel[bytes](OUTBOX_FRAMES)
            box = self._outboxes[peer_id] = _Outbox(send)
            self._nursery.start_soon(self._writer, peer_id, box, inbox)
        try:
            box.send.send_nowait(frame)
        except trio.WouldBlock:
            self.rejected["outbox-full"] += 1
            return False
        box.bytes += n
        self.queued_bytes += n
        return True

    def _written(self, box: _Outbox, n: int) -> None:
        box.bytes -= n
        self.queued_bytes -= n

    async def _writer(self, peer_id: bytes, box: _Outbox, inbox: trio.MemoryReceiveChannel[bytes]) -> None:
        try:
            while True:
                first = None
                try:
                    first = inbox.receive_nowait()  # fast path: frames are waiting
                except trio.WouldBlock:
                    with trio.move_on_after(OUTBOX_IDLE):
                        first = await inbox.receive()
                if first is None:
                    return  # idle: the next send_nowait starts a new writer
                batch = [first]
                while len(batch) < 64:
                    try:
                        batch.append(inbox.receive_nowait())
                    except trio.WouldBlock:
                        break
                try:
                    conn = self._conns.get(peer_id)
                    if conn is None or conn.closed:
                        entry = self.peers.get(peer_id)
                        if entry is None:
                            raise TransportError("peer is not connected and not in the directory")
                        conn = await self.connection_to(entry)
                    await conn.send_raw(b"".join(batch))
                except TransportError as exc:
                    self.rejected["send-failed"] += len(batch)
                    log.info("cannot deliver %d frame(s) to %s: %s", len(batch), short_id(peer_id), exc)
                    self._peer_lost(peer_id)
                    return
                finally:
                    self._written(box, sum(len(f) for f in batch))
        finally:
            if self._outboxes.get(peer_id) is box:
                del self._outboxes[peer_id]
            box.send.close()
            while True:  # frames left behind (the writer failed or was cancelled) no longer count
                try:
                    self._written(box, len(inbox.receive_nowait()))
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            inbox.close()

    async def ping(self, peer: PeerEntry, pong_timeout: float = 5.0) -> float:
        """Round-trip time to ``peer`` in seconds; :class:`TransportError` if none: the connection
        fails (within the transport's own limits) or no pong comes within ``pong_timeout`` seconds
        of the ping going out."""
        if len(self._pings) >= MAX_PENDING_PINGS:
            raise TransportError("too many pings in flight")
        conn = await self.connection_to(peer)
        # Random, not a counter: a per-node sequence would be a value peers on different
        # connections (e.g. the relays of different paths) could compare.
        nonce = int.from_bytes(crypto.random_bytes(8), "big") >> 1
        while nonce in self._pings:
            nonce = int.from_bytes(crypto.random_bytes(8), "big") >> 1
        done = trio.Event()
        t0 = self.clock.monotonic()
        self._pings[nonce] = done
        try:
            await conn.send(Ping(nonce=nonce))
            with trio.move_on_after(pong_timeout):
                await done.wait()
            if not done.is_set():
                raise TransportError(f"no pong from {short_id(peer.node_id)} within {pong_timeout}s")
            return self.clock.monotonic() - t0
        finally:
            self._pings.pop(nonce, None)

    async def _ping_loop(self) -> None:
        while True:
            async with trio.open_nursery() as n:
                for peer in list(self.peers.values()):
                    n.start_soon(self._ping_one, peer)
            await trio.sleep(self.ping_interval)

    async def _ping_one(self, peer: PeerEntry) -> None:
        try:
            rtt = await self.ping(peer)
        except TransportError as exc:
            log.info("peer %s at %s unreachable: %s", short_id(peer.node_id), peer.address, exc)
            old = self.seen.get(peer.node_id)
            self.seen[peer.node_id] = PeerSeen(
                node_id=peer.node_id, address=peer.address, rtt_us=-1,
                last_ok_unix=old.last_ok_unix if old else 0.0,
            )
            return
        self.seen[peer.node_id] = PeerSeen(
            node_id=peer.node_id, address=peer.address, rtt_us=int(rtt * 1e6), last_ok_unix=self.clock.unix()
        )

    # ------------------------------------------------------------------ handlers

    async def _on_ping(self, conn: Connection, msg: Ping) -> Pong:
        return Pong(nonce=msg.nonce)

    async def _on_pong(self, conn: Connection, msg: Pong) -> None:
        done = self._pings.get(msg.nonce)
        if done is not None:
            done.set()

    async def _on_echo(self, conn: Connection, msg: Echo) -> EchoReply:
        return EchoReply(nonce=msg.nonce, data=msg.data)

    async def _on_status(self, conn: Connection, msg: PeerStatusRequest) -> PeerStatus:
        return PeerStatus(
            node_id=self.node_id,
            uptime_s=0.0 if self.started_at is None else self.clock.monotonic() - self.started_at,
            peers=tuple(self.seen[k] for k in sorted(self.seen)),
        )
