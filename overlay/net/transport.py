"""Authenticated connections between nodes: TLS 1.3 over TCP, or in memory for tests.

Both transports give the same :class:`Connection` (typed messages in and out,
``peer_id`` authenticated) and the same listener contract::

    addr = await nursery.start(transport.serve, handler)   # ready when it returns
    conn = await transport.dial(addr, expected_id)

Authentication (docs/decisions/0001-tls-identity-pinning.md): the server's TLS
certificate is self-signed with its Ed25519 identity key and the dialer pins it
to ``expected_id``; the dialer then proves its own id by signing the server's
nonce together with the hash of the server certificate (:mod:`overlay.net.handshake`).

Every network await has a timeout (:class:`Timeouts`); a bad frame or failed proof earns the
peer an :class:`~overlay.wire.messages.Error` frame and a closed connection, never a crash.

**Admission** (:class:`Admission`, issue 15 item 5, issue 28 item 4). A listener caps its
connections, and one host must not keep honest peers out, neither with many silent or half-open
connections nor with many authenticated ones under fresh keys: a connection is *pending* until
the peer has proved its identity, which it must do within ``Timeouts.accept`` (5 s); pending
connections are capped in total, per source address and per network prefix, and a newcomer over
a cap evicts the oldest pending connection of the heaviest source. Once the peer has proved its
identity, the node's ``registered`` predicate (its current directory; ``None``: everyone counts
as registered) decides its class: unregistered peers share at most a quarter of the slots, with
caps per address and per prefix, and are evicted (oldest first, from the heaviest prefix) to
make room for a registered peer; registered peers are never evicted and have no per-source cap
(the committee caps registrations per address). When every slot holds a registered peer, the
newcomer is refused.
"""

from __future__ import annotations

import abc
import errno
import ipaddress
import itertools
import logging
import math
import os
import ssl
import tempfile
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any

import trio
import trio.testing

from overlay.net import handshake
from overlay.wire import codec, crypto
from overlay.wire.clock import Clock, SystemClock, TrioClock
from overlay.wire.codec import RemoteProtocolError
from overlay.wire.identity import Identity, short_id
from overlay.wire.messages import NONCE_LEN, AuthChallenge, AuthOk, AuthProof, Error

log = logging.getLogger("gentorrent.transport")

_READ_CHUNK = 64 * 1024


class TransportError(Exception):
    """A connection could not be made or was lost (refused, timed out, closed)."""


class PeerAuthError(TransportError):
    """The peer's identity did not check out (wrong certificate, failed proof)."""


class ListenError(Exception):
    """This node cannot listen on its address (in use, not this machine's, not allowed)."""


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Seconds. ``handshake`` covers a dial: TCP connect + TLS + proof of identity;
    ``accept`` is what a listener allows a connecting peer for TLS and its proof (short, so
    a silent connection holds a slot only briefly)."""

    handshake: float = 10.0
    accept: float = 5.0
    send: float = 10.0
    receive: float = 60.0


def parse_address(address: str) -> tuple[str, int]:
    """``"host:port"`` (``"[::1]:port"`` for IPv6) → ``(host, port)``."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"address {address!r} is not host:port")
    p = int(port)
    if not 0 <= p <= 65535:
        raise ValueError(f"port {p} out of range")
    return host.strip("[]"), p


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


VIA_ENV = "GENTORRENT_VIA"


@dataclass(frozen=True)
class Via:
    """Where a dial really goes: rules ``FROM=TO`` between IPv4 networks of one prefix length; a
    dial to an address in ``FROM`` goes to the address at the same offset in ``TO``, same port
    (the first rule that matches wins; an address no rule names is dialled as it is).

    The wide-area testbed (docs/testbed.md) gives every node one Toxiproxy "access link" per source
    region: node ``127.1.A.B:P`` is reached from region ``r`` at ``127.(10+r).A.B:P``, whose proxy
    adds that pair of regions' delay. A node in region ``r`` runs with
    ``GENTORRENT_VIA=127.1.0.0/16=127.(10+r).0.0/16``, so every dial it makes crosses the link the
    pair of regions would, while the addresses it registers, lists and pins stay the real ones.
    Only the TCP destination changes: peers are still pinned by key, so a wrong rule costs a
    failed dial, never a wrong peer."""

    rules: tuple[tuple[ipaddress.IPv4Network, ipaddress.IPv4Network], ...] = ()

    @classmethod
    def parse(cls, text: str) -> Via:
        """``"127.1.0.0/16=127.11.0.0/16,..."``; :class:`ValueError` saying what is wrong."""
        rules = []
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            src, sep, dst = part.partition("=")
            if not sep:
                raise ValueError(f"{VIA_ENV}: {part!r} is not FROM=TO (two IPv4 networks, e.g. "
                                 "127.1.0.0/16=127.11.0.0/16)")
            try:
                a, b = ipaddress.IPv4Network(src.strip()), ipaddress.IPv4Network(dst.strip())
            except ValueError as exc:
                raise ValueError(f"{VIA_ENV}: {part!r}: {exc}") from None
            if a.prefixlen != b.prefixlen:
                raise ValueError(f"{VIA_ENV}: {part!r}: both networks need the same prefix length")
            rules.append((a, b))
        return cls(tuple(rules))

    @classmethod
    def from_env(cls) -> Via:
        return cls.parse(os.environ.get(VIA_ENV, ""))

    def __call__(self, address: str) -> str:
        if not self.rules:
            return address
        host, port = parse_address(address)
        try:
            ip = ipaddress.IPv4Address(host)
        except ValueError:
            return address
        for src, dst in self.rules:
            if ip in src:
                return format_address(str(dst.network_address + (int(ip) - int(src.network_address))), port)
        return address


def source_of(host: str) -> tuple[str, str]:
    """The ``(address, prefix)`` a listener counts a connection from ``host`` under.

    IPv4: the address and its /24. IPv6: the /64 (one host's share: a host picks any address
    in it) and the /48. An IPv4-mapped IPv6 address (``::ffff:198.51.100.7``) counts as the
    IPv4 address. Anything else (the in-memory transport's names) is its own address and
    prefix."""
    text = host.strip("[]").partition("%")[0]  # no brackets, no IPv6 zone
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return host, host
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if isinstance(ip, ipaddress.IPv4Address):
        return str(ip), str(ipaddress.IPv4Network((ip, 24), strict=False))
    return (str(ipaddress.IPv6Network((ip, 64), strict=False)),
            str(ipaddress.IPv6Network((ip, 48), strict=False)))


@dataclass(slots=True)
class _Slot:
    """An authenticated connection as :class:`Admission` sees it."""

    peer_id: bytes
    address: str
    prefix: str
    registered: bool


class Admission:
    """Which connections a listener keeps (I/O-free; the transport drives it).

    ``admit(key, address, now)`` for every new connection returns ``(admitted, evict)``:
    whether to go on with ``key``'s handshake, and the keys of pending connections to close
    now to make room. ``authenticated(key, peer_id)`` once the peer proved its identity returns
    ``(refusal, evict)``: ``None`` to keep it (else the error code to close it with), and the
    keys of authenticated connections to close now to make room for it. ``closed(key)`` when a
    connection ends (admitted or not, evicted or not; unknown keys are ignored).

    Sources: a connection counts under its source address and its network prefix
    (:func:`source_of`: IPv4 /24, IPv6 /64 as the address and /48 as the prefix).

    Before the handshake: at most ``new_per_s`` new connections a second from one source
    address (a token bucket with ``new_burst``; over it the newcomer is refused before TLS, so
    churning connections cannot burn the listener's CPU on handshakes either); at most
    ``max_pending`` unauthenticated connections, ``max_pending_per_prefix`` of them from one
    prefix and ``max_pending_per_address`` from one address. A newcomer over a cap evicts the
    oldest pending connection of its own address (or prefix) if that one is at its cap, else
    the oldest of the prefix with the most pending connections.

    After the handshake: at most ``max_connections`` authenticated connections. ``registered``
    (``None``: every peer counts as registered) says whether a peer is in the node's current
    directory; it is asked when a peer authenticates and asked again for every connection
    whenever a cap is reached, so a connection counts as what its peer is now. Unregistered
    peers hold at most ``max_unregistered`` connections in all (``unregistered_share`` of
    ``max_connections``), ``max_unregistered_per_prefix`` from one prefix and
    ``max_unregistered_per_address`` from one address; a newcomer over its address's or
    prefix's cap is refused (``unregistered-over-cap``). When the unregistered share (or every
    slot) is full, an unregistered newcomer evicts the oldest unregistered connection of the
    heaviest prefix (most unregistered connections, then its heaviest address) if that prefix
    holds at least two more than the newcomer's own, else it is refused: no prefix can keep
    the share from peers elsewhere. A registered newcomer is never held to these caps; when
    every slot is taken it evicts an unregistered connection chosen the same way, and is
    refused (``too-many-connections``) only when every slot holds a registered peer.
    Registered peers are never evicted.

    So that a registered newcomer can get in while every slot is held, a connection may start
    its handshake beyond ``max_connections`` while fewer connections are over it than there
    are unregistered connections to evict (still within ``max_pending``): the listener holds at
    most ``max_connections + max_pending`` sockets. With ``registered=None`` there is never an
    unregistered connection, and none of this applies: authenticated connections are never
    evicted and have no per-source cap.

    Counters: ``rate_limited``, ``evicted`` (pending connections), ``refused`` (before the
    handshake: every slot taken), ``evicted_unregistered``, ``refused_unregistered`` and
    ``refused_full`` (after the handshake).
    """

    def __init__(self, max_connections: int = 1024, max_pending: int = 128,
                 max_pending_per_address: int = 32, new_per_s: float = 20.0, new_burst: float = 100.0, *,
                 max_pending_per_prefix: int | None = None,
                 registered: Callable[[bytes], bool] | None = None, unregistered_share: float = 0.25,
                 max_unregistered_per_address: int | None = None,
                 max_unregistered_per_prefix: int | None = None) -> None:
        """Defaults derived from the caps given: ``max_pending_per_prefix`` half of
        ``max_pending`` (at least ``max_pending_per_address``); ``max_unregistered_per_address``
        1/16 and ``max_unregistered_per_prefix`` 1/4 of ``max_unregistered`` (at least 1 and
        at least the per-address cap): 256, 64 and 16 at 1,024 connections."""
        if not 1 <= max_pending_per_address <= max_pending <= max_connections:
            raise ValueError("need 1 <= max_pending_per_address <= max_pending <= max_connections")
        if new_per_s <= 0 or new_burst < 1:
            raise ValueError("need new_per_s > 0 and new_burst >= 1")
        if not 0 < unregistered_share <= 1:
            raise ValueError("need 0 < unregistered_share <= 1")
        self.new_per_s = new_per_s
        self.new_burst = new_burst
        self._buckets: dict[str, tuple[float, float]] = {}  # address -> (tokens, time)
        self.max_connections = max_connections
        self.max_pending = max_pending
        self.max_pending_per_address = max_pending_per_address
        self.max_pending_per_prefix = (max(max_pending_per_address, max_pending // 2)
                                       if max_pending_per_prefix is None else max_pending_per_prefix)
        if not max_pending_per_address <= self.max_pending_per_prefix <= max_pending:
            raise ValueError("need max_pending_per_address <= max_pending_per_prefix <= max_pending")
        self.registered = registered
        self.max_unregistered = max(1, int(max_connections * unregistered_share))
        self.max_unregistered_per_address = (max(1, self.max_unregistered // 16)
                                             if max_unregistered_per_address is None
                                             else max_unregistered_per_address)
        self.max_unregistered_per_prefix = (max(self.max_unregistered_per_address, self.max_unregistered // 4)
                                            if max_unregistered_per_prefix is None
                                            else max_unregistered_per_prefix)
        if not (1 <= self.max_unregistered_per_address <= self.max_unregistered_per_prefix
                <= self.max_unregistered):
            raise ValueError("need 1 <= max_unregistered_per_address <= max_unregistered_per_prefix"
                             " <= max_unregistered")
        self._pending: OrderedDict[Hashable, tuple[str, str]] = OrderedDict()  # key -> source, oldest first
        self._pending_per_address: Counter[str] = Counter()
        self._pending_per_prefix: Counter[str] = Counter()
        self._established: dict[Hashable, _Slot] = {}  # oldest first
        self._unregistered = 0
        self._unregistered_per_address: Counter[str] = Counter()
        self._unregistered_per_prefix: Counter[str] = Counter()
        self.rate_limited = 0
        self.evicted = 0
        self.refused = 0
        self.evicted_unregistered = 0
        self.refused_unregistered = 0
        self.refused_full = 0

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def established(self) -> int:
        return len(self._established)

    @property
    def unregistered(self) -> int:
        """Authenticated connections counted as unregistered (as of the last check)."""
        return self._unregistered

    # ------------------------------------------------------------------ before the handshake

    def admit(self, key: Hashable, address: str, now: float = 0.0) -> tuple[bool, list[Hashable]]:
        """``address``: the source host; ``now``: monotonic seconds (for the per-address rate)."""
        address, prefix = source_of(address)
        if not self._take(address, now):
            self.rate_limited += 1
            return False, []
        evict: list[Hashable] = []
        over = self.pending + self.established - self.max_connections  # >= 0: every slot taken
        if self._pending_per_address[address] >= self.max_pending_per_address:
            evict.append(self._oldest_pending(lambda a, p: a == address))
        elif self._pending_per_prefix[prefix] >= self.max_pending_per_prefix:
            evict.append(self._oldest_pending(lambda a, p: p == prefix))
        elif self.pending >= self.max_pending or (over >= 0 and over >= self._unregistered):
            if not self._pending:
                self.refused += 1
                return False, []
            heaviest = max(self._pending_per_prefix, key=lambda p: self._pending_per_prefix[p])
            evict.append(self._oldest_pending(lambda a, p: p == heaviest))
        for k in evict:
            self.closed(k)
        self.evicted += len(evict)
        self._pending[key] = (address, prefix)
        self._pending_per_address[address] += 1
        self._pending_per_prefix[prefix] += 1
        return True, evict

    def _take(self, address: str, now: float) -> bool:
        tokens, stamp = self._buckets.get(address, (self.new_burst, now))
        tokens = min(self.new_burst, tokens + max(0.0, now - stamp) * self.new_per_s)
        ok = tokens >= 1.0
        if len(self._buckets) >= 4 * self.max_connections and address not in self._buckets:
            # bounded: forget buckets refilled by now (they would read the same when next met),
            # and if that is not enough, all of them (a flood of addresses: each gets its burst)
            full = self.new_burst
            self._buckets = {a: (t, st) for a, (t, st) in self._buckets.items()
                             if t + max(0.0, now - st) * self.new_per_s < full}
            if len(self._buckets) >= 4 * self.max_connections:
                self._buckets.clear()
        self._buckets[address] = (tokens - 1.0 if ok else tokens, now)
        return ok

    def _oldest_pending(self, match: Callable[[str, str], bool]) -> Hashable:
        return next(k for k, (a, p) in self._pending.items() if match(a, p))

    def _drop_pending(self, address: str, prefix: str) -> None:
        _decrement(self._pending_per_address, address)
        _decrement(self._pending_per_prefix, prefix)

    # ------------------------------------------------------------------ after the handshake

    def authenticated(self, key: Hashable, peer_id: bytes) -> tuple[str | None, list[Hashable]]:
        """``peer_id`` proved its identity on ``key``. ``("evicted", [])`` if ``key`` was
        closed meanwhile (nothing changes)."""
        source = self._pending.pop(key, None)
        if source is None:
            return "evicted", []
        address, prefix = source
        self._drop_pending(address, prefix)
        registered = self.registered is None or self.registered(peer_id)
        evict: list[Hashable] = []
        if registered:
            if self.established >= self.max_connections:
                self._recount()
                victim = self._victim()
                if victim is None:
                    self.refused_full += 1
                    return "too-many-connections", []
                evict.append(victim)
        else:
            def over_source() -> bool:
                return (self._unregistered_per_address[address] >= self.max_unregistered_per_address
                        or self._unregistered_per_prefix[prefix] >= self.max_unregistered_per_prefix)

            def full() -> bool:
                return self._unregistered >= self.max_unregistered or self.established >= self.max_connections

            if over_source() or full():
                self._recount()
            if over_source():
                self.refused_unregistered += 1
                return "unregistered-over-cap", []
            if full():
                victim = self._victim(prefix)
                if victim is None:
                    self.refused_unregistered += 1
                    return "unregistered-over-cap", []
                evict.append(victim)
        for k in evict:
            self.closed(k)
        self.evicted_unregistered += len(evict)
        self._established[key] = slot = _Slot(peer_id, address, prefix, registered)
        if not registered:
            self._count_unregistered(slot, 1)
        return None, evict

    def _count_unregistered(self, slot: _Slot, n: int) -> None:
        self._unregistered += n
        if n > 0:
            self._unregistered_per_address[slot.address] += n
            self._unregistered_per_prefix[slot.prefix] += n
        else:
            _decrement(self._unregistered_per_address, slot.address)
            _decrement(self._unregistered_per_prefix, slot.prefix)

    def _recount(self) -> None:
        """Ask ``registered`` again for every authenticated connection (the directory changes)."""
        if self.registered is None:
            return
        for slot in self._established.values():
            now_registered = self.registered(slot.peer_id)
            if now_registered != slot.registered:
                slot.registered = now_registered
                self._count_unregistered(slot, -1 if now_registered else 1)

    def _victim(self, newcomer_prefix: str | None = None) -> Hashable | None:
        """The unregistered connection to evict: the oldest of the heaviest address of the
        heaviest prefix; for an unregistered newcomer (``newcomer_prefix``) only if that prefix
        holds at least two more unregistered connections than the newcomer's."""
        if not self._unregistered:
            return None
        count = self._unregistered_per_prefix
        heaviest = max(count, key=lambda p: count[p])
        if newcomer_prefix is not None and count[heaviest] <= count[newcomer_prefix] + 1:
            return None
        of_prefix = [(k, s) for k, s in self._established.items() if not s.registered and s.prefix == heaviest]
        address = max((s.address for _, s in of_prefix), key=lambda a: self._unregistered_per_address[a])
        return next(k for k, s in of_prefix if s.address == address)

    def closed(self, key: Hashable) -> None:
        source = self._pending.pop(key, None)
        if source is not None:
            self._drop_pending(*source)
        slot = self._established.pop(key, None)
        if slot is not None and not slot.registered:
            self._count_unregistered(slot, -1)


def _decrement(counter: Counter[str], key: str) -> None:
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]


class Connection:
    """One authenticated, framed, bidirectional connection.

    ``send`` serialises writers and times out; ``receive`` returns the next
    decoded message, raising :class:`RemoteProtocolError` for a bad frame and
    :class:`TransportError` on EOF or timeout.
    """

    def __init__(
        self,
        stream: trio.abc.Stream,
        *,
        peer_id: bytes,
        peer_ed25519: bytes,
        peer_x25519: bytes,
        address: str,
        timeouts: Timeouts,
        max_frame: int = codec.MAX_FRAME,
        tap: Callable[[bytes | bytearray], None] | None = None,
    ) -> None:
        self._stream = stream
        self.peer_id = peer_id
        self.peer_ed25519 = peer_ed25519
        self.peer_x25519 = peer_x25519
        self.address = address
        self.timeouts = timeouts
        self._decoder = codec.FrameDecoder(max_frame=max_frame, peer=short_id(peer_id))
        self._send_lock = trio.Lock()
        self.closed = False
        self.bytes_in = 0
        self.bytes_out = 0
        self._tap = tap

    @property
    def peer(self) -> str:
        return short_id(self.peer_id)

    def __repr__(self) -> str:
        return f"<Connection peer={self.peer} {self.address}>"

    async def send(self, msg: Any) -> None:
        await self.send_raw(codec.frame(msg))

    async def send_raw(self, data: bytes) -> None:
        """Send pre-framed bytes (one or more whole frames)."""
        if self.closed:
            raise TransportError(f"connection to {self.peer} is closed")
        try:
            with trio.fail_after(self.timeouts.send):
                async with self._send_lock:
                    await self._stream.send_all(data)
        except trio.TooSlowError:
            await self.aclose()
            raise TransportError(f"send to {self.peer} timed out after {self.timeouts.send}s") from None
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, ssl.SSLError) as exc:
            await self.aclose()
            raise TransportError(f"connection to {self.peer} lost while sending: {exc!r}") from None
        self.bytes_out += len(data)

    async def receive(self, idle_timeout: float | None = None) -> Any:
        """The next message; see :meth:`receive_payload`."""
        payload = await self.receive_payload(idle_timeout)
        return codec.decode(payload, peer=self.peer)

    async def receive_payload(self, idle_timeout: float | None = None) -> bytes:
        """The next frame's payload. :class:`TransportError` if the connection fails, or if the
        peer leaves it idle, with no whole frame, for ``idle_timeout`` seconds (default: the
        connection's ``timeouts.receive``; a node's receive loop allows longer, which a caller's
        cancel scope could not)."""
        payload = self._decoder.next_payload()
        if payload is not None:  # fast path: a frame is already buffered (no timer needed)
            return payload
        limit = self.timeouts.receive if idle_timeout is None else idle_timeout
        try:
            with trio.fail_after(limit):
                while True:
                    payload = self._decoder.next_payload()
                    if payload is not None:
                        return payload
                    try:
                        data = await self._stream.receive_some(_READ_CHUNK)
                    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, ssl.SSLError) as exc:
                        raise TransportError(f"connection to {self.peer} lost: {exc!r}") from None
                    if not data:
                        raise TransportError(f"peer {self.peer} closed the connection")
                    self.bytes_in += len(data)
                    if self._tap is not None:
                        self._tap(data)
                    self._decoder.feed(data)
        except trio.TooSlowError:
            raise TransportError(f"peer {self.peer} sent nothing for {limit}s") from None

    async def reject(self, code: str, detail: str) -> None:
        """Best effort: tell the peer why, then close."""
        if not self.closed:
            with trio.move_on_after(1.0):
                try:
                    async with self._send_lock:
                        await self._stream.send_all(codec.frame(Error(code=code, detail=detail[:1024])))
                except Exception:  # noqa: BLE001 - the peer is being dropped anyway
                    pass
        await self.aclose()

    async def aclose(self) -> None:
        if self.closed:
            return
        self.closed = True
        with trio.CancelScope(shield=True):
            with trio.move_on_after(1.0):
                try:
                    await self._stream.aclose()
                except Exception:  # noqa: BLE001 - closing a broken stream; it is gone either way
                    pass


Handler = Callable[[Connection], Awaitable[None]]


async def _hard_close(stream: trio.abc.Stream) -> None:
    """Close a connection we drop during admission or the handshake, at once: for TLS, the
    TCP stream underneath (``SSLStream.aclose`` would first finish the TLS handshake — CPU
    spent on a peer we are refusing, and a wait for it)."""
    inner = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
    with trio.CancelScope(shield=True), trio.move_on_after(1.0):
        try:
            await inner.aclose()
        except Exception:  # noqa: BLE001 - closing a dropped peer's stream; it is gone either way
            pass


class _PreAuth:
    """Framing over a raw stream before the peer is known (handshake only)."""

    def __init__(self, stream: trio.abc.Stream, label: str, tap: Callable[[bytes | bytearray], None] | None = None) -> None:
        self.stream = stream
        self.decoder = codec.FrameDecoder(max_frame=4096, peer=label)
        self.tap = tap

    async def send(self, msg: Any) -> None:
        await self.stream.send_all(codec.frame(msg))

    async def receive(self, expected: type) -> Any:
        while True:
            payload = self.decoder.next_payload()
            if payload is not None:
                msg = codec.decode(payload, peer=self.decoder.peer)
                if isinstance(msg, Error):
                    raise PeerAuthError(f"peer refused us: {msg.code}: {msg.detail}")
                if not isinstance(msg, expected):
                    raise RemoteProtocolError(
                        f"expected {expected.__name__} during handshake, got {type(msg).__name__}",
                        peer=self.decoder.peer,
                    )
                return msg
            data = await self.stream.receive_some(_READ_CHUNK)
            if not data:
                raise TransportError(f"{self.decoder.peer} closed the connection during the handshake")
            if self.tap is not None:
                self.tap(data)
            self.decoder.feed(data)


class Transport(abc.ABC):
    """Base: the authenticated handshake over whatever raw stream a subclass opens."""

    def __init__(self, identity: Identity, *, timeouts: Timeouts | None = None, max_connections: int = 1024,
                 max_pending: int = 128, max_pending_per_address: int = 32,
                 tap: Callable[[bytes | bytearray], None] | None = None, clock: Clock | None = None,
                 registered: Callable[[bytes], bool] | None = None, local_address: str | None = None,
                 via: Via | None = None) -> None:
        """``tap``, if given, sees every byte this node receives after TLS (tests use it
        to check what a relay learns). ``max_connections``, ``max_pending`` and
        ``max_pending_per_address`` are each listener's :class:`Admission` caps; ``clock``
        (default :class:`~overlay.wire.clock.TrioClock`) times its rate limit. ``registered``
        (``registered(peer_id)``: is the peer in this node's current directory; ``None``: every
        peer counts as registered) is the :class:`Admission` predicate of the listeners started
        after it is set (a :class:`~overlay.net.node.Node` sets it). ``local_address``: the source
        address this transport's dials leave from (TLS: the local IP the socket binds to; in
        memory: the source the listener sees); ``None``: the system's choice (in memory: one
        per identity). ``via``: where TLS dials really go (:class:`Via`; default: the rules in
        the environment variable ``GENTORRENT_VIA``, none when it is unset)."""
        self.identity = identity
        self.via = via if via is not None else Via.from_env()
        self.registered = registered
        self.local_address = local_address
        self.clock: Clock = clock or TrioClock()
        self.timeouts = timeouts or Timeouts()
        self.max_connections = max_connections
        self.max_pending = min(max_pending, max_connections)
        self.max_pending_per_address = min(max_pending_per_address, self.max_pending)
        self.admission: Admission | None = None  # the last listener's, once serving (for counters)
        self.rejected: dict[str, int] = {}
        self.tap = tap

    @abc.abstractmethod
    async def _open(self, address: str) -> tuple[trio.abc.Stream, bytes, bytes]:
        """Connect: ``(stream, server_ed25519_public, channel_binding)``."""

    @abc.abstractmethod
    async def serve(self, handler: Handler, host: str, port: int, *,
                    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Accept connections until cancelled, reporting the bound address."""

    def _count_reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1

    async def dial(self, address: str, expected_id: bytes | None) -> Connection:
        """Connect to ``address`` and authenticate both ends.

        ``expected_id`` pins the server; ``None`` accepts any id (used only by
        ``gentorrent status`` to discover a node's id — never for relaying).
        """
        try:
            with trio.fail_after(self.timeouts.handshake):
                stream, server_pk, binding = await self._open(address)
                try:
                    peer_id = handshake.check_pinned(server_pk, expected_id)
                    pre = _PreAuth(stream, short_id(peer_id), self.tap)
                    challenge = await pre.receive(AuthChallenge)
                    await pre.send(handshake.make_proof(self.identity, binding, challenge.nonce))
                    ok = await pre.receive(AuthOk)
                except BaseException:
                    with trio.CancelScope(shield=True), trio.move_on_after(1.0):
                        await stream.aclose()
                    raise
        except trio.TooSlowError:
            raise TransportError(f"handshake with {address} timed out after {self.timeouts.handshake}s") from None
        except handshake.AuthError as exc:
            raise PeerAuthError(str(exc)) from None
        except RemoteProtocolError as exc:
            raise PeerAuthError(f"{address}: bad handshake: {exc}") from None
        except (OSError, trio.BrokenResourceError, ssl.SSLError) as exc:
            raise TransportError(f"cannot connect to {address}: {exc}") from None
        conn = Connection(
            stream,
            peer_id=peer_id,
            peer_ed25519=server_pk,
            peer_x25519=ok.x25519_public,
            address=address,
            timeouts=self.timeouts,
            tap=self.tap,
        )
        conn._decoder.feed(bytes(pre.decoder._buf))  # anything sent right after AuthOk
        return conn

    async def _accept(self, stream: trio.abc.Stream, binding: bytes, address: str,
                      decide: Callable[[bytes], str | None]) -> Connection | None:
        """Server side of the handshake; ``None`` (logged, counted) when it fails.
        ``decide(peer_id)``, once the peer has proved its identity and before it is told so,
        returns ``None`` to keep it, else the error code it is refused with (``"evicted"``:
        the connection was evicted meanwhile; closed without a word, counted by the caller)."""
        reason = None
        pre = _PreAuth(stream, address, self.tap)
        tls_done = False
        try:
            with trio.fail_after(self.timeouts.accept):
                await self._server_tls(stream)
                tls_done = True
                nonce = crypto.random_bytes(NONCE_LEN)
                await pre.send(AuthChallenge(nonce=nonce))
                proof = await pre.receive(AuthProof)
                peer_id = handshake.check_proof(proof, binding, nonce)
                refusal = decide(peer_id)
                if refusal == "evicted":
                    return None
                if refusal is not None:
                    raise _Refused(refusal)
                await pre.send(AuthOk(x25519_public=self.identity.x25519_public))
        except trio.TooSlowError:
            reason, detail = "timeout", f"no valid handshake within {self.timeouts.accept}s"
        except handshake.AuthError as exc:
            reason, detail = "auth-failed", str(exc)
        except _Refused as exc:
            reason, detail = exc.code, _REFUSALS.get(exc.code, exc.code)
        except RemoteProtocolError as exc:
            reason, detail = "bad-frame", str(exc)
        except (TransportError, OSError, trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError) as exc:
            reason, detail = "handshake-io", repr(exc)
        if reason is not None:
            self._count_reject(reason)
            # (an admission refusal is policy, not a fault: an attacker's flood would fill the log)
            log.log(logging.INFO if reason in _REFUSALS else logging.WARNING,
                    "rejected %s during handshake: %s: %s", address, reason, detail)
            if tls_done:  # (before TLS is up, sending would first finish TLS for a peer we drop)
                with trio.move_on_after(1.0):
                    try:
                        await stream.send_all(codec.frame(Error(code=reason, detail=detail[:1024])))
                    except Exception:  # noqa: BLE001 - a courtesy to a rejected peer; it may be gone
                        pass
            await _hard_close(stream)
            return None
        conn = Connection(
            stream,
            peer_id=peer_id,
            peer_ed25519=proof.ed25519_public,
            peer_x25519=proof.x25519_public,
            address=address,
            timeouts=self.timeouts,
            tap=self.tap,
        )
        conn._decoder.feed(bytes(pre.decoder._buf))
        return conn

    async def _server_tls(self, stream: trio.abc.Stream) -> None:
        """Complete any transport-level handshake before ours (TLS does)."""
        return None  # a hook: none by default (MemoryTransport), TLSTransport overrides it

    def _new_admission(self) -> tuple[Admission, dict[Hashable, trio.CancelScope]]:
        self.admission = Admission(self.max_connections, self.max_pending, self.max_pending_per_address,
                                   registered=self.registered)
        return self.admission, {}

    async def _run_handler(self, handler: Handler, stream: trio.abc.Stream, binding: bytes, address: str,
                           admission: Admission, scopes: dict[Hashable, trio.CancelScope],
                           source: str | None = None) -> None:
        """One accepted connection: admission, handshake, admission of the authenticated peer,
        then ``handler``; evictable throughout (``scopes``: each connection's cancel scope).
        ``source``: the peer's address for the caps (default: the host of ``address``)."""
        key = object()
        if source is None:
            source = address.rpartition(":")[0] or address
        rate_limited_before = admission.rate_limited
        admitted, evict = admission.admit(key, source, self.clock.monotonic())
        for k in evict:
            scope = scopes.pop(k, None)
            if scope is not None:
                scope.cancel()
        if not admitted:
            if admission.rate_limited > rate_limited_before:
                self._count_reject("rate-limited")
                log.info("rejected %s: over %.0f new connections a second from %s", address,
                         admission.new_per_s, source)
            else:
                self._count_reject("too-many-connections")
                log.warning("rejected %s: %d connections already open, all authenticated", address,
                            self.max_connections)
            await _hard_close(stream)
            return
        decided: list[str | None] = []

        def decide(peer_id: bytes) -> str | None:
            refusal, victims = admission.authenticated(key, peer_id)
            for k in victims:
                victim = scopes.get(k)
                if victim is not None:
                    victim.cancel()
            decided.append(refusal)
            return refusal

        try:
            scope = scopes[key] = trio.CancelScope()
            conn = None
            with scope:
                conn = await self._accept(stream, binding, address, decide)
            if scope.cancel_called and (scope.cancelled_caught or conn is not None or decided == ["evicted"]):
                kept = decided == [None]  # evicted after it authenticated, or while it still had to
                self._count_reject("evicted-unregistered" if kept else "evicted")
                log.info("evicted %s: %s", address, "an unregistered peer, for a registered one" if kept
                         else "still unauthenticated when the pending connections were full")
                await _hard_close(stream)
                return
            if conn is None:
                return
            scope = scopes[key] = trio.CancelScope()
            with scope:
                try:
                    await handler(conn)
                finally:
                    await conn.aclose()
            if scope.cancelled_caught:
                self._count_reject("evicted-unregistered")
                log.info("evicted %s (peer %s): an unregistered peer, for a registered one", address, conn.peer)
        finally:
            scopes.pop(key, None)
            admission.closed(key)


class _Refused(Exception):
    """Admission refused a peer that proved its identity (``code``: the error code it gets)."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


_REFUSALS = {
    "unregistered-over-cap": "this node keeps most connections for registered peers, and the share for "
                             "unregistered ones is full (from your address or network, or in all)",
    "too-many-connections": "every connection slot of this node holds a registered peer",
}


# --------------------------------------------------------------------------- TLS


def _tls_contexts(identity: Identity, now_unix: float) -> tuple[ssl.SSLContext, ssl.SSLContext, bytes]:
    cert_pem, key_pem = crypto.self_signed_cert(identity.signing, identity.node_id.hex(), now_unix)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.minimum_version = ssl.TLSVersion.TLSv1_3
    with tempfile.TemporaryDirectory(prefix="gentorrent-tls-") as d:
        cert_path, key_path = os.path.join(d, "c.pem"), os.path.join(d, "k.pem")
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, key_pem)
        os.close(fd)
        with open(cert_path, "wb") as f:
            f.write(cert_pem)
        server.load_cert_chain(cert_path, key_path)
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.minimum_version = ssl.TLSVersion.TLSv1_3
    client.check_hostname = False  # identities are pinned by key, not by name
    client.verify_mode = ssl.CERT_NONE  # no CA: the key is checked after the handshake
    cert_der = ssl.PEM_cert_to_DER_cert(cert_pem.decode())
    return server, client, crypto.sha256(cert_der)


class TLSTransport(Transport):
    """TCP + TLS 1.3; identities pinned from the certificate's Ed25519 key."""

    def __init__(self, identity: Identity, *, clock: Clock | None = None, **kw: Any) -> None:
        super().__init__(identity, clock=clock, **kw)
        # Built outside trio too (CLI, benches), so the certificate is dated by the machine's
        # clock unless one is given.
        now_unix = (clock or SystemClock()).unix()
        self._server_ctx, self._client_ctx, self._binding = _tls_contexts(identity, now_unix)

    async def _open(self, address: str) -> tuple[trio.abc.Stream, bytes, bytes]:
        host, port = parse_address(self.via(address))
        tcp = await trio.open_tcp_stream(host, port, local_address=self.local_address)
        tls = trio.SSLStream(tcp, self._client_ctx, server_hostname=None)
        try:
            await tls.do_handshake()
            der = tls.getpeercert(binary_form=True)
            if not der:
                raise PeerAuthError(f"{address} presented no certificate")
            try:
                server_pk = crypto.cert_ed25519_public_key(der)
            except crypto.CryptoError as exc:
                raise PeerAuthError(f"{address}: {exc}") from None
        except BaseException:
            with trio.CancelScope(shield=True), trio.move_on_after(1.0):
                await tcp.aclose()
            raise
        return tls, server_pk, crypto.sha256(der)

    async def _server_tls(self, stream: trio.abc.Stream) -> None:
        assert isinstance(stream, trio.SSLStream)
        await stream.do_handshake()

    async def serve(
        self,
        handler: Handler,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Listen until cancelled; reports the bound ``host:port`` via ``task_status``;
        :class:`ListenError` when it cannot listen there."""
        try:
            listeners = await trio.open_tcp_listeners(port, host=host)
        except OSError as exc:
            why = exc.strerror or str(exc)
            hint = "" if exc.errno != errno.EADDRINUSE else (
                ": another process listens there (another node with this config or data dir?); stop it, or set "
                "another `listen` address (config or --listen; port 0 picks a free one)")
            raise ListenError(f"cannot listen on {format_address(host, port)}: {why}{hint}") from None
        admission, scopes = self._new_admission()
        sock = listeners[0].socket
        bound = format_address(*sock.getsockname()[:2])

        async def on_tcp(tcp: trio.SocketStream) -> None:
            try:
                peer = format_address(*tcp.socket.getpeername()[:2])
            except OSError:
                peer = "?"
            tls = trio.SSLStream(tcp, self._server_ctx, server_side=True)
            await self._run_handler(handler, tls, self._binding, peer, admission, scopes)

        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, on_tcp, listeners)
            log.info("node %s listening on %s", short_id(self.identity.node_id), bound)
            task_status.started(bound)


# --------------------------------------------------------------------------- memory


class _DelayLine(trio.abc.Stream):
    """One end of an in-memory connection whose writes arrive ``delay()`` seconds after they
    are written (the delay as it is at the time of the write), in order, without holding the
    writer: a link that far. There is no back-pressure: for tests of distance, not of flow."""

    def __init__(self, out: trio.MemorySendChannel[tuple[float, bytes]],
                 into: trio.MemoryReceiveChannel[tuple[float, bytes]], delay: Callable[[], float],
                 clock: Clock) -> None:
        self._out, self._in, self._delay, self._clock = out, into, delay, clock
        self._rest = b""

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        try:
            self._out.send_nowait((self._clock.monotonic() + max(0.0, self._delay()), bytes(data)))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise trio.BrokenResourceError("the other end is closed") from None
        await trio.lowlevel.checkpoint()

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if not self._rest:
            try:
                due, self._rest = await self._in.receive()
            except (trio.EndOfChannel, trio.ClosedResourceError):
                return b""
            await trio.sleep(max(0.0, due - self._clock.monotonic()))
        n = len(self._rest) if max_bytes is None else max_bytes
        out, self._rest = self._rest[:n], self._rest[n:]
        return out

    async def aclose(self) -> None:
        self._out.close()
        self._in.close()
        await trio.lowlevel.checkpoint()


def _delay_line_pair(delay: Callable[[], float], clock: Clock) -> tuple[_DelayLine, _DelayLine]:
    there, arrive = trio.open_memory_channel[tuple[float, bytes]](math.inf)
    back, returns = trio.open_memory_channel[tuple[float, bytes]](math.inf)
    return _DelayLine(there, returns, delay, clock), _DelayLine(back, arrive, delay, clock)


class MemoryNetwork:
    """A fake network of in-memory listeners, for integration tests. ``delay``: if set, the
    connections opened from then on are delay lines (no back-pressure) whose writes, both ways,
    take ``delay(address)`` seconds, ``address`` being the listener's, read at each write (a
    node's access link across a distance, which a test may change); ``None``: plain memory
    streams."""

    def __init__(self) -> None:
        self.listeners: dict[str, tuple[bytes, trio.MemorySendChannel[Any]]] = {}
        self.delay: Callable[[str], float] | None = None
        self._serial = itertools.count()

    def address(self, name: str) -> str:
        return f"mem-{name}:1"


class MemoryTransport(Transport):
    """Same contract as :class:`TLSTransport` over ``trio.testing`` memory streams.

    The fake "certificate" is the listener's public key as registered on the
    :class:`MemoryNetwork`; the proof of identity is the real one.
    """

    def __init__(self, identity: Identity, network: MemoryNetwork, **kw: Any) -> None:
        super().__init__(identity, **kw)
        self.network = network

    async def _open(self, address: str) -> tuple[trio.abc.Stream, bytes, bytes]:
        entry = self.network.listeners.get(address)
        if entry is None:
            raise TransportError(f"cannot connect to {address}: connection refused")
        server_pk, inbox = entry
        delay = self.network.delay
        client: trio.abc.Stream
        server: trio.abc.Stream
        if delay is None:
            client, server = trio.testing.memory_stream_pair()
        else:
            client, server = _delay_line_pair(lambda: delay(address), TrioClock())
        binding = crypto.sha256(b"mem" + server_pk + next(self.network._serial).to_bytes(8, "big"))
        # the source "address" is the dialer's own (one per node), as a host would be, unless given
        source = self.local_address or "mem-from-" + self.identity.node_id.hex()[:12]
        try:
            inbox.send_nowait((server, binding, source))
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            raise TransportError(f"cannot connect to {address}: listener busy or gone") from None
        return client, server_pk, binding

    async def serve(
        self,
        handler: Handler,
        host: str = "mem",
        port: int = 0,
        *,
        name: str | None = None,
        task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        address = self.network.address(name or self.identity.node_id.hex()[:12])
        send, receive = trio.open_memory_channel[Any](64)
        admission, scopes = self._new_admission()
        self.network.listeners[address] = (self.identity.ed25519_public, send)
        try:
            async with trio.open_nursery() as nursery:
                task_status.started(address)
                async for stream, binding, *source in receive:  # raw test dials send no source
                    nursery.start_soon(self._run_handler, handler, stream, binding, address, admission, scopes,
                                       source[0] if source else address)
        finally:
            self.network.listeners.pop(address, None)
