"""Connection admission (overlay.net.transport.Admission, I/O-free) and byte-bounded outboxes
(overlay.net.node): one host cannot take a node's connection slots, registered peers are preferred,
and queued frames are bounded in bytes (issue 28, items 4 and 7)."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import trio
import trio.testing

from overlay.directory.registry import Registry
from overlay.net.node import OUTBOX_FRAMES, Node, listed_in
from overlay.net.peers import PeerEntry
from overlay.net.transport import Admission, MemoryNetwork, MemoryTransport, source_of
from overlay.testing import wait_until
from overlay.wire import codec
from overlay.wire.identity import Identity
from overlay.wire.messages import Deliver

MiB = 1024 * 1024

_ids = itertools.count()


def peer() -> bytes:
    return next(_ids).to_bytes(20, "big")


class Conns:
    """Drives an Admission as the transport does: each connection is admitted, then proves an
    identity; ``live`` holds the keys the admission has not closed."""

    def __init__(self, adm: Admission) -> None:
        self.adm = adm
        self.live: set[object] = set()

    def connect(self, source: str, peer_id: bytes, now: float = 0.0) -> str | None:
        """A connection from ``source`` that authenticates as ``peer_id``: ``None`` if kept,
        else why not (``"not-admitted"`` before the handshake)."""
        key = object()
        admitted, evict = self.adm.admit(key, source, now)
        self.live -= set(evict)
        if not admitted:
            return "not-admitted"
        refusal, evict = self.adm.authenticated(key, peer_id)
        self.live -= set(evict)
        if refusal is None:
            self.live.add(key)
        else:
            self.adm.closed(key)
        return refusal


def registered_set(ids: set[bytes]) -> Callable[[bytes], bool]:
    return ids.__contains__


def test_sources_count_by_address_and_prefix() -> None:
    assert source_of("198.51.100.7") == ("198.51.100.7", "198.51.100.0/24")
    assert source_of("[::ffff:198.51.100.7]") == source_of("::ffff:198.51.100.7") == source_of("198.51.100.7")
    assert source_of("2001:db8:1:2:3::9") == ("2001:db8:1:2::/64", "2001:db8:1::/48")
    assert source_of("2001:db8:1:2:ffff::1")[0] == source_of("2001:db8:1:2:3::9")[0]
    assert source_of("fe80::1%eth0") == ("fe80::/64", "fe80::/48")
    assert source_of("mem-from-abc") == ("mem-from-abc", "mem-from-abc")


def test_one_address_cannot_take_the_slots_from_registered_peers() -> None:
    """A flood of fresh keys from one address holds at most its per-address cap; registered
    peers (any number, from the same address too: a devnet runs every node on 127.0.0.1) fill
    the rest."""
    honest: set[bytes] = set()
    adm = Admission(64, 16, 8, new_per_s=1e9, new_burst=1e9, registered=registered_set(honest))
    assert (adm.max_unregistered, adm.max_unregistered_per_prefix, adm.max_unregistered_per_address) == (16, 4, 1)
    c = Conns(adm)
    outcomes = [c.connect("203.0.113.9", peer()) for _ in range(200)]
    assert outcomes.count(None) == 1 and outcomes.count("unregistered-over-cap") == 199
    assert adm.refused_unregistered == 199 and adm.unregistered == 1
    for i in range(63):
        honest.add(p := peer())
        assert c.connect("203.0.113.9" if i % 2 else "127.0.0.1", p) is None
    assert adm.established == 64 and adm.refused_full == 0 and adm.evicted_unregistered == 0


def test_a_prefix_and_the_whole_unregistered_share_are_capped() -> None:
    adm = Admission(64, 16, 8, new_per_s=1e9, new_burst=1e9, registered=lambda _: False)
    c = Conns(adm)
    # one /24, many addresses: its prefix cap (4)
    outcomes = [c.connect(f"203.0.113.{i}", peer()) for i in range(1, 50)]
    assert outcomes.count(None) == 4
    # IPv4-mapped IPv6 is the same address and prefix
    assert c.connect("::ffff:203.0.113.200", peer()) == "unregistered-over-cap"
    # one IPv6 /48: every /64 in it is one address; 4 per /48
    outcomes = [c.connect(f"2001:db8:7:{i:x}::1", peer()) for i in range(10)]
    assert outcomes.count(None) == 4
    # other prefixes fill the share (16); then a newcomer from a prefix with fewer evicts the
    # oldest of the heaviest prefix only when that one holds at least two more than its own
    for i in range(8):
        c.connect(f"10.{i}.0.1", peer())
    assert adm.unregistered == 16
    assert c.connect("192.0.2.1", peer()) is None  # 0 against 4: evicts one of 203.0.113/24
    assert adm.evicted_unregistered == 1 and adm.unregistered == 16
    # ... and so on until no prefix holds two more than another: then refused
    for i in range(20):
        c.connect(f"192.0.{3 + i}.1", peer())
    assert adm.unregistered == 16 and max(adm._unregistered_per_prefix.values()) <= 2
    assert c.connect("198.18.0.1", peer()) == "unregistered-over-cap"


def test_a_registered_newcomer_evicts_the_oldest_unregistered_of_the_heaviest_source() -> None:
    honest: set[bytes] = set()
    adm = Admission(16, 8, 4, new_per_s=1e9, new_burst=1e9, registered=registered_set(honest),
                    max_unregistered_per_address=2, max_unregistered_per_prefix=2)
    c = Conns(adm)
    assert adm.max_unregistered == 4
    for src in ("203.0.113.1", "203.0.113.1", "198.51.100.1", "192.0.2.1"):
        assert c.connect(src, peer()) is None
    first = next(k for k, s in adm._established.items() if s.address == "203.0.113.1")
    for _ in range(12):
        honest.add(p := peer())
        assert c.connect("127.0.0.1", p) is None
    assert adm.established == 16 and adm.unregistered == 4
    # every slot taken: a registered newcomer still gets to its handshake (an unregistered one
    # can make room) and evicts the oldest connection of the heaviest prefix
    honest.add(p := peer())
    assert c.connect("127.0.0.1", p) is None
    assert first not in c.live and first not in adm._established
    assert adm.evicted_unregistered == 1 and adm.unregistered == 3 and adm.established == 16
    # an unregistered newcomer cannot evict anyone now (no slot, no heavier prefix)
    assert c.connect("100.64.0.1", peer()) == "unregistered-over-cap"
    for _ in range(3):
        honest.add(p := peer())
        assert c.connect("127.0.0.1", p) is None
    assert adm.unregistered == 0 and adm.evicted_unregistered == 4
    # every slot registered: refused, before the handshake and after it
    honest.add(p := peer())
    assert c.connect("127.0.0.1", p) == "not-admitted" and adm.refused == 1
    key = object()
    # (a connection admitted while pending ones could be evicted, authenticating into a full node)
    assert adm.established == 16 and adm.pending == 0
    adm.max_connections = 17
    assert adm.admit(key, "127.0.0.1")[0]
    adm.max_connections = 16
    assert adm.authenticated(key, p) == ("too-many-connections", [])
    assert adm.refused_full == 1
    adm.closed(key)
    assert adm.pending == 0 and adm.established == 16


def test_connections_count_as_what_their_peer_is_now() -> None:
    """The directory changes: a connection that came in unregistered counts as registered once
    its peer is listed (and the other way round), checked whenever a cap is reached."""
    listed: set[bytes] = set()
    adm = Admission(8, 4, 2, new_per_s=1e9, new_burst=1e9, registered=registered_set(listed))
    c = Conns(adm)
    assert adm.max_unregistered == 2 and adm.max_unregistered_per_address == 1
    early = peer()
    assert c.connect("192.0.2.1", early) is None
    assert c.connect("192.0.2.1", peer()) == "unregistered-over-cap"
    listed.add(early)  # its registration reaches this node's list
    assert c.connect("192.0.2.1", peer()) is None
    assert adm.unregistered == 1
    listed.discard(early)  # it leaves the list: it counts against its address again
    assert c.connect("192.0.2.1", peer()) == "unregistered-over-cap"
    assert adm.unregistered == 2


def test_without_a_predicate_authenticated_connections_are_never_evicted() -> None:
    adm = Admission(8, 4, 4, new_per_s=1e9, new_burst=1e9)
    c = Conns(adm)
    assert [c.connect("203.0.113.9", peer()) for _ in range(10)] == [None] * 8 + ["not-admitted"] * 2
    assert adm.evicted_unregistered == adm.refused_unregistered == 0 and adm.refused == 2


def test_pending_connections_are_capped_per_prefix() -> None:
    """Silent connections from many addresses of one /24 evict each other, not a newcomer from
    elsewhere."""
    adm = Admission(64, 16, 4, new_per_s=1e9, new_burst=1e9)
    assert adm.max_pending_per_prefix == 8
    for i in range(100):
        adm.admit(object(), f"203.0.113.{i % 250}")
    assert adm.pending == 8
    other = object()
    assert adm.admit(other, "198.51.100.1") == (True, [])
    for i in range(100):
        adm.admit(object(), f"203.0.113.{i % 250}")
    assert other in adm._pending and adm.pending == 9


def test_authenticating_a_connection_already_evicted_changes_nothing() -> None:
    adm = Admission(4, 2, 2, new_per_s=1e9, new_burst=1e9)
    key = object()
    adm.admit(key, "192.0.2.1")
    adm.closed(key)
    assert adm.authenticated(key, peer()) == ("evicted", [])
    assert adm.established == adm.pending == 0


def test_listed_in_reads_the_directory_as_it_is_now() -> None:
    a, b = Identity.generate(), Identity.generate()
    reg = Registry(1, [])
    registered = listed_in(reg)
    assert registered(a.node_id)  # no list yet: nobody is preferred
    reg.replace(Registry(2, [PeerEntry.of(b, "mem-b:1")]))
    assert registered(b.node_id) and not registered(a.node_id)


# --------------------------------------------------------------------------- outboxes


async def test_outboxes_are_bounded_in_bytes(autojump_clock: trio.testing.MockClock, nursery: trio.Nursery) -> None:
    """Frames of up to 2 MiB: one peer's queue holds at most OUTBOX_BYTES, all queues together
    at most OUTBOXES_BYTES; drops are counted, and bytes stop counting once written."""
    network = MemoryNetwork()
    me, sink = Identity.generate(), Identity.generate()
    far = [Identity.generate() for _ in range(6)]
    sink_node = Node(sink, MemoryTransport(sink, network), ping_interval=0)
    got: list[int] = []

    async def on_deliver(conn: object, msg: Deliver) -> None:
        got.append(len(msg.sealed))

    sink_node.on(Deliver, on_deliver)
    sink_addr = await nursery.start(sink_node.serve)
    # far peers are listed but not listening: their writers fail to dial, after we queue
    peers = [PeerEntry.of(sink, sink_addr)] + [PeerEntry.of(f, f"mem-nowhere-{i}:1") for i, f in enumerate(far)]
    node = Node(me, MemoryTransport(me, network), peers=peers, ping_interval=0)
    await nursery.start(node.serve)
    clove = Deliver(proxy_path_id=b"p" * 16, sealed=b"x" * MiB)  # a frame of a little over 1 MiB
    # one peer: 8 MiB, i.e. 7 of these frames; the 8th and on are refused (no checkpoint in
    # between: the writer has not taken any yet)
    assert [node.send_nowait(sink.node_id, clove) for _ in range(12)] == [True] * 7 + [False] * 5
    assert node.rejected["outbox-bytes"] == 5
    assert node.queued_bytes == node._outboxes[sink.node_id].bytes > 7 * MiB
    with trio.fail_after(15):
        await wait_until(lambda: len(got) == 7)
    assert got == [MiB] * 7 and node.queued_bytes == 0  # written: no longer counted
    # all outboxes together: 12 MiB here, whose last quarter takes frames only for queues
    # holding less than OUTBOX_SHORT (1 MiB)
    node.outboxes_bytes = 12 * MiB
    assert [[node.send_nowait(f.node_id, clove) for _ in range(4)] for f in far[:2]] == [[True] * 4] * 2
    for f in far[2:4]:  # 9 and 10 frames queued: past 9 MiB, only a short queue gets one more
        assert node.send_nowait(f.node_id, clove) and not node.send_nowait(f.node_id, clove)
    assert node.send_nowait(far[4].node_id, clove)  # 11 frames
    assert not node.send_nowait(far[5].node_id, clove)  # a 12th would pass 12 MiB, short queue or not
    assert node.rejected["outboxes-bytes"] == 3 and node.queued_bytes == 11 * len(codec.frame(clove))
    with trio.fail_after(15):  # the far writers fail: their frames no longer count
        await wait_until(lambda: node.queued_bytes == 0)
    assert node.rejected["send-failed"] == 11 and set(node._outboxes) <= {sink.node_id}  # (idle, lingering)


async def test_outboxes_are_still_bounded_in_frames(autojump_clock: trio.testing.MockClock,
                                                    nursery: trio.Nursery) -> None:
    network = MemoryNetwork()
    me, far = Identity.generate(), Identity.generate()
    node = Node(me, MemoryTransport(me, network), peers=[PeerEntry.of(far, "mem-nowhere:1")], ping_interval=0)
    await nursery.start(node.serve)
    small = Deliver(proxy_path_id=b"p" * 16, sealed=b"x")
    assert sum(node.send_nowait(far.node_id, small) for _ in range(OUTBOX_FRAMES + 10)) == OUTBOX_FRAMES
    assert node.rejected["outbox-full"] == 10
