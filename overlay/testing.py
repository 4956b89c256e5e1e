"""An in-memory GenTorrent network for tests, as :mod:`trio.testing` is for trio.

Everything runs over :class:`~overlay.net.transport.MemoryTransport` in one trio run; under
trio's ``MockClock`` (pytest-trio's ``autojump_clock`` fixture) every timeout, TTL and
refresh is instant, and nothing needs time patched: the nodes read trio's clock
(:class:`~overlay.wire.clock.TrioClock`) unless a test hands them its own ``clock=``.

A test declares who exists, then builds and starts nodes::

    net = Net()
    users = net.add_users(15)                     # registered user nodes
    (m,) = net.add_models(1, model="echo")        # registered model nodes
    relay = net.user_node(users[1], client=False)
    await net.start(nursery, relay)               # under its own cancel scope
    net.kill(relay)                               # abrupt: listener gone, connections cut

or lets :func:`start_overlay` do it (users that relay, the first ``clients`` of them also
sending requests, and model nodes). This module imports no role package: model nodes
(and, later, verifiers) come in through a factory, ``factory(identity, transport,
registry) -> node`` (:mod:`model_node.testing` has the echo ones).

Also here: raw authenticated nodes that speak the protocol by hand (:class:`RawNode`),
raw streams past the fake TLS but before the handshake (:meth:`Net.raw_dial`,
:class:`RawPeer`), bad-frame helpers (:func:`framed`, :func:`flip`), capture hooks
(:class:`Capture`: every byte a node receives and sends), and a spy on the requests a model
node accepts (:func:`record_requests`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio
import trio.testing

from overlay.anon import onion
from overlay.anon.responder import ReplyStream, Responder
from overlay.directory.registry import Registry
from overlay.net.node import Node
from overlay.net.peers import PeerEntry
from overlay.net.transport import Connection, MemoryNetwork, MemoryTransport, Transport
from overlay.usernode import UserNode
from overlay.wire import codec, crypto
from overlay.wire.clock import Clock, TrioClock
from overlay.wire.identity import Identity, node_id_of
from overlay.wire.messages import (
    CellBack,
    CellFwd,
    Create,
    Deliver,
    Destroy,
    PathReady,
    ReplyChunk,
    Request,
    ReturnClove,
)

SETTLE = 1.0  # seconds (of the test's clock) that let every queued frame be delivered and handled
RAW_RECEIVE_S = 15.0  # seconds (of the test's clock) a RawPeer waits for a message: a test fails, never hangs
POLL_S = 0.01  # seconds (of the test's clock) between two looks of wait_until


class Servable(Protocol):
    """What :meth:`Net.start` runs: any node with an identity and a ``serve``."""

    @property
    def identity(self) -> Identity: ...

    async def serve(self, host: str = ..., port: int = ..., *,
                    task_status: trio.TaskStatus[str] = ...) -> None: ...


NodeFactory = Callable[[Identity, Transport, Registry], Any]
"""Builds a node of another role (a model node, a verifier) on the kit's transport and registry."""


# --------------------------------------------------------------------------- capture


@dataclass
class Capture:
    """What one node received and sent, byte for byte.

    ``received``: every chunk the node read, handshakes included, exactly as its
    transport's ``tap`` saw it (complete by construction). ``sent``: ``(peer id, data)``
    for every write on a connection dialed through a :class:`Net` transport (by the
    node or to it; every transport the kit builds is one), as its peer read it.
    """

    received: list[bytes] = field(default_factory=list)
    sent: list[tuple[bytes, bytes]] = field(default_factory=list)

    def tap(self, data: bytes | bytearray) -> None:
        self.received.append(bytes(data))

    def received_bytes(self) -> bytes:
        return b"".join(self.received)

    def sent_bytes(self) -> bytes:
        return b"".join(data for _, data in self.sent)

    def received_messages(self) -> list[Any]:
        """Every message received, decoded; each tapped chunk must hold whole frames (so no
        value can straddle two chunks and hide from a byte search)."""
        return frames_of(self.received)

    def sent_messages(self) -> list[Any]:
        return frames_of([data for _, data in self.sent])


def frames_of(chunks: Iterable[bytes]) -> list[Any]:
    """Decode chunks of framed messages; raises :class:`AssertionError` if a chunk ends
    inside a frame."""
    msgs = []
    for chunk in chunks:
        dec = codec.FrameDecoder()
        dec.feed(chunk)
        while (m := dec.next_message()) is not None:
            msgs.append(m)
        if dec.buffered:
            raise AssertionError("a captured chunk ended inside a frame")
    return msgs


class _Recording(trio.abc.Stream):
    """A stream that reports what goes each way (the dialer's end of a memory stream pair)."""

    def __init__(self, inner: trio.abc.Stream, on_send: Callable[[bytes], None],
                 on_receive: Callable[[bytes], None]) -> None:
        self.inner, self.on_send, self.on_receive = inner, on_send, on_receive

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self.on_send(bytes(data))
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        data = await self.inner.receive_some(max_bytes)
        if data:
            self.on_receive(bytes(data))
        return data

    async def aclose(self) -> None:
        await self.inner.aclose()


class _KitTransport(MemoryTransport):
    """A memory transport that records both directions of every connection it dials into the
    :class:`Capture` of either end that has one."""

    def __init__(self, identity: Identity, kit: Net, **kw: Any) -> None:
        super().__init__(identity, kit.network, **kw)
        self.kit = kit

    async def _open(self, address: str) -> tuple[trio.abc.Stream, bytes, bytes]:
        stream, server_pk, binding = await super()._open(address)
        me, them = self.identity.node_id, node_id_of(server_pk)
        mine, theirs = self.kit.captures.get(me), self.kit.captures.get(them)
        if mine is None and theirs is None:
            return stream, server_pk, binding

        def sent_by_me(data: bytes) -> None:
            if mine is not None:
                mine.sent.append((them, data))

        def sent_by_them(data: bytes) -> None:
            if theirs is not None:
                theirs.sent.append((me, data))

        return _Recording(stream, sent_by_me, sent_by_them), server_pk, binding


# --------------------------------------------------------------------------- raw peers and frames


class RawPeer:
    """Frame I/O over a raw stream, with no handshake logic: for misbehaving peers.
    ``binding`` is the channel binding the listener expects a proof over (set by
    :meth:`Net.raw_dial`)."""

    def __init__(self, stream: trio.abc.Stream, label: str = "server", binding: bytes = b"") -> None:
        self.stream = stream
        self.binding = binding
        self.decoder = codec.FrameDecoder(peer=label)

    async def send(self, msg: Any) -> None:
        await self.stream.send_all(codec.frame(msg))

    async def send_raw(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def receive(self) -> Any | None:
        """The next message, or ``None`` once the other side has closed; :class:`trio.TooSlowError`
        after :data:`RAW_RECEIVE_S` without either (a caller's cancel scope may bound it tighter)."""
        with trio.fail_after(RAW_RECEIVE_S):
            while True:
                msg = self.decoder.next_message()
                if msg is not None:
                    return msg
                try:
                    data = await self.stream.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return None
                if not data:
                    return None
                self.decoder.feed(data)

    async def drain(self) -> list[Any]:
        """Every message until the other side closes (each within :data:`RAW_RECEIVE_S`)."""
        out = []
        while (msg := await self.receive()) is not None:
            out.append(msg)
        return out

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(2):
            try:
                await self.stream.aclose()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass


def framed(payload: bytes) -> bytes:
    """``payload`` behind a 4-byte length prefix: a frame whose body is whatever a test wants."""
    return len(payload).to_bytes(4, "big") + payload


def flip(data: bytes, pos: int) -> bytes:
    """``data`` with one bit of byte ``pos`` flipped."""
    b = bytearray(data)
    b[pos] ^= 0x04
    return bytes(b)


async def settle(seconds: float = SETTLE) -> None:
    """Let every queued frame be delivered and handled (instant under an autojump clock)."""
    await trio.sleep(seconds)


async def wait_until(predicate: Callable[[], object]) -> None:
    """Return once ``predicate()`` is true. The caller bounds the wait on the test's clock::

        with trio.fail_after(15):
            await wait_until(lambda: node.queued_bytes == 0)
    """
    # Polled: the predicate reads whatever state a test names, and that state has no event to
    # wait on (a trio.Event belongs to the code that owns the state, not to a test's helper).
    while True:
        if predicate():
            return
        await trio.sleep(POLL_S)


def warnings_logged(records: Iterable[logging.LogRecord]) -> list[str]:
    """The messages of the WARNING records among ``records`` (pytest's ``caplog.records``)."""
    return [r.getMessage() for r in records if r.levelno == logging.WARNING]


class _Responding(Protocol):
    """A model node, as far as :func:`record_requests` goes: it answers through a responder."""

    @property
    def responder(self) -> Responder: ...


def record_requests(node: _Responding) -> list[Request]:
    """Every request ``node``'s responder accepts from now on, in order (what the model node sees):
    a spy wrapped around :meth:`overlay.anon.responder.Responder.accept`; the list fills as requests come."""
    seen: list[Request] = []
    responder = node.responder
    accept = responder.accept

    def spy(req: Request, reply: ReplyStream, busy: Callable[[Request, str], ReplyChunk] | None = None) -> bool:
        seen.append(req)
        return accept(req, reply, busy)

    responder.accept = spy  # type: ignore[method-assign]
    return seen


# --------------------------------------------------------------------------- the network


class Net:
    """An in-memory network: identities, the registry, nodes of every role, each started
    under its own cancel scope (so :meth:`kill` stops one abruptly), and captures.

    Declare every registered identity (:meth:`add`, :meth:`add_users`, :meth:`add_models`)
    before building a node: the registry is built, once, when a node first needs it.
    """

    def __init__(self, *, registry_version: int = 1) -> None:
        self.network = MemoryNetwork()
        self.registry_version = registry_version
        self.identities: dict[str, Identity] = {}
        self.users: list[UserNode] = []
        self.models: list[Any] = []
        self.scopes: dict[bytes, trio.CancelScope] = {}
        self.captures: dict[bytes, Capture] = {}
        self._entries: list[PeerEntry] = []
        self._registry: Registry | None = None

    # ------------------------------------------------------------------ who exists

    def address_of(self, identity: Identity) -> str:
        """The address a node of ``identity`` listens on (MemoryTransport's default name)."""
        return self.network.address(identity.node_id.hex()[:12])

    def add(self, name: str, *, role: str = "user", region: str = "default", models: tuple[str, ...] = (),
            identity: Identity | None = None) -> Identity:
        """Register a (new, unless given) identity under ``name``. A registered identity
        need not run a node: it can stand for a peer that is down, or a rogue one."""
        if self._registry is not None:
            raise RuntimeError(f"cannot add {name!r}: the registry is already built; add every identity "
                               "before building the first node")
        if name in self.identities:
            raise ValueError(f"{name!r} is already registered")
        ident = identity or Identity.generate()
        self.identities[name] = ident
        self._entries.append(PeerEntry.of(ident, self.address_of(ident), region=region, role=role, models=models))
        return ident

    def add_users(self, n: int, *, regions: Sequence[str] = ("default",), prefix: str = "user") -> list[Identity]:
        """``n`` user identities ``user-0`` ... (regions taken in turn from ``regions``)."""
        start = sum(name.startswith(f"{prefix}-") for name in self.identities)
        return [self.add(f"{prefix}-{start + i}", region=regions[i % len(regions)]) for i in range(n)]

    def add_models(self, n: int, *, model: str = "echo", prefix: str = "model") -> list[Identity]:
        """``n`` model-node identities ``model-0`` ... serving ``model``."""
        start = sum(name.startswith(f"{prefix}-") for name in self.identities)
        return [self.add(f"{prefix}-{start + i}", role="model", models=(model,)) for i in range(n)]

    @property
    def registry(self) -> Registry:
        """The registry of every identity added so far (built on first use, then fixed)."""
        if self._registry is None:
            self._registry = Registry(self.registry_version, list(self._entries))
        return self._registry

    def entry(self, node_id: bytes) -> PeerEntry:
        return self.registry.by_id[node_id]

    # ------------------------------------------------------------------ building nodes

    def capture(self, node_id: bytes) -> Capture:
        """The capture of ``node_id`` (a node built with ``capture=True``)."""
        return self.captures[node_id]

    def transport(self, identity: Identity, *, capture: bool = False, **kw: Any) -> MemoryTransport:
        """A memory transport for ``identity`` on this network (``kw``: ``timeouts``,
        ``max_connections``); ``capture=True`` records what the node receives and sends, as
        does any other transport of an identity already captured."""
        if capture or identity.node_id in self.captures:
            kw["tap"] = self.captures.setdefault(identity.node_id, Capture()).tap
        return _KitTransport(identity, self, **kw)

    def user_node(self, identity: Identity, *, capture: bool = False, **user_kw: Any) -> UserNode:
        """A :class:`UserNode` for a registered identity, in its registered region
        (``user_kw``: ``client``, ``clock``, ``n``, ``k``, ...). Not started."""
        user_kw.setdefault("region", self.entry(identity.node_id).region)
        u = UserNode(identity, self.transport(identity, capture=capture), self.registry, **user_kw)
        self.users.append(u)
        return u

    def model_node(self, identity: Identity, factory: NodeFactory, *, capture: bool = False) -> Any:
        """A node of another role built by ``factory(identity, transport, registry)``. Not started."""
        m = factory(identity, self.transport(identity, capture=capture), self.registry)
        self.models.append(m)
        return m

    def node(self, identity: Identity | None = None, *, peers: Sequence[PeerEntry] | None = None,
             ping_interval: float = 0, clock: Clock | None = None, capture: bool = False,
             **transport_kw: Any) -> Node:
        """A bare authenticated :class:`Node` (a new identity unless given; its peers are
        ``peers``, by default the registry's if one has been built). Not started."""
        ident = identity or Identity.generate()
        if peers is None:
            peers = self.registry.entries if self._registry is not None else []
        return Node(ident, self.transport(ident, capture=capture, **transport_kw), peers=list(peers),
                    ping_interval=ping_interval, clock=clock)

    async def start_node(self, nursery: trio.Nursery, identity: Identity | None = None, **kw: Any) -> Node:
        """:meth:`node`, started (e.g. a registered identity's node that misbehaves)."""
        node = self.node(identity, **kw)
        await self.start(nursery, node)
        return node

    def raw_node(self, identity: Identity | None = None, **kw: Any) -> RawNode:
        """A :class:`RawNode` (see :meth:`node` for ``kw``). Not started."""
        return RawNode(self, self.node(identity, **kw))

    async def start_raw_node(self, nursery: trio.Nursery, identity: Identity | None = None, **kw: Any) -> RawNode:
        """:meth:`raw_node`, started."""
        raw = self.raw_node(identity, **kw)
        await self.start(nursery, raw)
        return raw

    # ------------------------------------------------------------------ running nodes

    async def start(self, nursery: trio.Nursery, node: Servable) -> str:
        """Start ``node`` under its own cancel scope; returns its address."""
        address: str = await nursery.start(self._run_scoped, node)
        return address

    async def _run_scoped(self, node: Servable, *, task_status: trio.TaskStatus[str]) -> None:
        with trio.CancelScope() as scope:
            self.scopes[node.identity.node_id] = scope
            await node.serve(task_status=task_status)

    def kill(self, node: Servable | bytes) -> None:
        """Stop a started node abruptly: its listener disappears, its connections close."""
        node_id = node if isinstance(node, bytes) else node.identity.node_id
        self.scopes[node_id].cancel()

    # ------------------------------------------------------------------ reaching nodes

    @property
    def client(self) -> UserNode:
        """The first user node that sends requests."""
        return next(u for u in self.users if u.client is not None)

    def user(self, node_id: bytes) -> UserNode:
        return next(u for u in self.users if u.identity.node_id == node_id)

    @property
    def model(self) -> Any:
        """The first model node."""
        return self.models[0]

    def spare_users(self, busy: Iterable[bytes]) -> list[bytes]:
        """Registered user node ids not in ``busy`` (e.g. relays of no path of interest)."""
        taken = set(busy)
        return [e.node_id for e in self.registry.users() if e.node_id not in taken]

    async def dial(self, target: Servable | Node | str, identity: Identity | None = None,
                   expected_id: bytes | None = None) -> Connection:
        """An authenticated connection to ``target`` (a node, or an address with
        ``expected_id``) from ``identity`` (default: a new, unregistered one)."""
        if isinstance(target, str):
            address = target
        else:
            expected_id = target.identity.node_id
            address = self.address_of(target.identity)
        return await self.transport(identity or Identity.generate()).dial(address, expected_id)

    def raw_dial(self, address: str) -> RawPeer:
        """A raw stream to the listener at ``address``, past the fake TLS and before the
        handshake (``.binding`` is what an honest proof signs)."""
        server_pk, inbox = self.network.listeners[address]
        client, server = trio.testing.memory_stream_pair()
        binding = crypto.sha256(b"raw" + server_pk)
        inbox.send_nowait((server, binding))
        return RawPeer(client, binding=binding)


# --------------------------------------------------------------------------- a node by hand


class RawNode:
    """An authenticated node that speaks the overlay protocol by hand: sends any frame to
    any registered node, builds its own paths, and records the relay messages it receives
    (``inbox``: ``(peer id, message)``). For misbehaving peers and probes."""

    RECORDED = (CellBack, CellFwd, Create, Destroy, Deliver, ReturnClove)

    def __init__(self, net: Net, node: Node) -> None:
        self.net = net
        self.node = node
        self.inbox: list[tuple[bytes, Any]] = []
        for t in self.RECORDED:
            self.node.on(t, self._record)

    @property
    def identity(self) -> Identity:
        return self.node.identity

    async def _record(self, conn: Connection, msg: Any) -> None:
        self.inbox.append((conn.peer_id, msg))

    async def serve(self, host: str = "mem", port: int = 0, *,
                    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        await self.node.serve(host, port, task_status=task_status)

    async def send(self, node_id: bytes, *msgs: Any) -> None:
        """Send ``msgs`` to a registered node in one write, then :func:`settle`."""
        await self.send_raw(node_id, b"".join(codec.frame(m) for m in msgs))

    async def send_raw(self, node_id: bytes, data: bytes) -> None:
        """Write ``data`` (framed or not) to a registered node, then :func:`settle`."""
        conn = await self.node.connection_to(self.net.entry(node_id))
        await conn.send_raw(data)
        await settle()

    def received(self, kind: type) -> list[Any]:
        return [m for _, m in self.inbox if isinstance(m, kind)]

    async def build(self, relays: list[bytes], *, expires: int | None = None
                    ) -> tuple[bytes, bytes, onion.PathCrypt, bytes]:
        """Build a path through ``relays``; returns (first hop, link id, crypt, packet sent).
        The proxy's PathReady (if any) is in the inbox afterwards."""
        keys = [self.net.entry(r).x25519_public for r in relays]
        packet, hop_keys = onion.build_onion(keys, relays, expires or int(TrioClock().unix()) + 600)
        link = os.urandom(16)
        await self.send(relays[0], Create(link, packet))
        return relays[0], link, onion.PathCrypt(hop_keys), packet

    def payloads(self, first: bytes, link: bytes, crypt: onion.PathCrypt) -> list[Any]:
        """Every message that came back on the path ``(first, link)`` and opens with ``crypt``."""
        out = []
        for peer, m in self.inbox:
            if isinstance(m, CellBack) and peer == first and m.link_id == link:
                try:
                    out.append(codec.decode(crypt.unwrap_backward(m.iv, m.body)))
                except onion.OnionError:
                    pass
        return out

    def path_ready(self, first: bytes, link: bytes, crypt: onion.PathCrypt) -> PathReady | None:
        return next((m for m in self.payloads(first, link, crypt) if isinstance(m, PathReady)), None)


# --------------------------------------------------------------------------- a whole overlay


async def start_overlay(
    nursery: trio.Nursery,
    n_users: int = 15,
    *,
    clients: int = 1,
    regions: Sequence[str] = ("default",),
    models: Sequence[NodeFactory] = (),
    model: str = "echo",
    capture: bool = False,
    relay_clock: Clock | None = None,
    prepare: Callable[[UserNode], object] | None = None,
    net: Net | None = None,
    **user_kw: Any,
) -> Net:
    """``n_users`` user nodes that relay (the first ``clients`` also send requests; regions
    taken in turn from ``regions``) and one node per factory in ``models``, registered as
    model nodes serving ``model``. ``relay_clock`` is the clock of the relay-only users
    (default trio's); ``prepare(user)`` runs on each user node before any node starts;
    ``capture`` records every node's traffic; ``net`` may come with identities already
    added. Relays and model nodes start first, then the clients, so paths are built
    against a full network."""
    net = net or Net()
    user_ids = net.add_users(n_users, regions=regions)
    model_ids = net.add_models(len(models), model=model)
    for i, ident in enumerate(user_ids):
        kw = dict(user_kw)
        if i >= clients and relay_clock is not None:
            kw["clock"] = relay_clock
        u = net.user_node(ident, client=i < clients, capture=capture, **kw)
        if prepare is not None:
            prepare(u)
    for ident, factory in zip(model_ids, models, strict=True):
        net.model_node(ident, factory, capture=capture)
    for u in net.users[clients:]:
        await net.start(nursery, u)
    for m in net.models:
        await net.start(nursery, m)
    for u in net.users[:clients]:
        await net.start(nursery, u)
    return net

