"""Injected clocks: drivers read time only through the ``clock=`` they are given.

Each test moves time by hand (``FakeClock``) or with trio's ``MockClock`` and
checks that a timeout, TTL or stamp follows it. A module that read the system
clock again would see no time pass (or wall-clock time) and fail these tests.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import trio
import trio.testing

from overlay.anon import onion, sida
from overlay.anon.paths import SUSPECT_SECONDS, PathManager
from overlay.anon.responder import Responder
from overlay.anon.seal import seal_to
from overlay.net.node import Node
from overlay.net.peers import PeerEntry
from overlay.net.transport import MemoryNetwork, MemoryTransport
from overlay.wire.clock import FakeClock, TrioClock
from overlay.wire.identity import Identity
from overlay.wire.messages import PROXY_PATH_ID_LEN, Create, Deliver, PeerStatus, PeerStatusRequest

# --------------------------------------------------------------------------- the clocks themselves


def test_fake_clock_moves_both_clocks_forward_only() -> None:
    clock = FakeClock(monotonic=5.0, unix=1_000.0)
    clock.advance(2.5)
    assert (clock.monotonic(), clock.unix()) == (7.5, 1_002.5)
    with pytest.raises(ValueError, match="does not go back"):
        clock.advance(-1)


def test_trio_clocks_of_one_run_agree_on_unix_time_after_a_jump() -> None:
    """Two TrioClocks first read at different trio times (a MockClock jump between them)
    still agree: the wall-clock anchor is per run, not per instance."""
    mock = trio.testing.MockClock()

    async def main() -> tuple[float, float, float]:
        a = TrioClock()
        first = a.unix()
        mock.jump(3600)
        b = TrioClock()
        return first, a.unix(), b.unix()

    first, a_later, b_later = trio.run(main, clock=mock)
    assert a_later == pytest.approx(first + 3600)
    assert b_later == a_later


# --------------------------------------------------------------------------- PathManager


class _Sink:
    """Stands in for a Node: records frames, knows its own id."""

    def __init__(self) -> None:
        self.node_id = os.urandom(20)
        self.sent: list[tuple[bytes, Any]] = []

    def send_nowait(self, peer: bytes, msg: Any) -> bool:
        self.sent.append((peer, msg))
        return True


def _relays(n: int) -> tuple[list[Identity], list[PeerEntry]]:
    idents = [Identity.generate() for _ in range(n)]
    return idents, [PeerEntry.of(i, f"mem:{i.node_id.hex()[:8]}") for i in idents]


def test_path_manager_stamps_onions_with_its_clock() -> None:
    idents, entries = _relays(3)
    clock = FakeClock(unix=1_800_000_000.0)
    pm = PathManager(_Sink(), lambda: entries, path_ttl=600, clock=clock)
    path = pm.start_build()
    ((peer, create),) = pm.node.sent
    assert isinstance(create, Create) and peer == path.first
    by_id = {i.node_id: i for i in idents}
    packet, expiries = create.onion, []
    for r in path.relays:  # each hop's expiry: path_ttl on the clock's unix time plus its own jitter
        routing = onion.peel_onion(by_id[r.node_id].x25519, packet)
        expiries.append(routing.expires)
        packet = routing.next_onion
    assert all(1_800_000_600 <= e < 1_800_000_600 + pm.expiry_jitter for e in expiries)
    assert path.created == clock.monotonic()


def test_path_manager_avoids_a_failed_paths_relays_for_the_suspect_period_of_its_clock() -> None:
    _, entries = _relays(6)
    clock = FakeClock(monotonic=0.0)  # near 0, as trio's MockClock starts
    pm = PathManager(_Sink(), lambda: entries, clock=clock)
    failed = pm.start_build()
    pm.on_peer_lost(failed.first)  # the path dies: its 3 relays become suspects
    suspects = {r.node_id for r in failed.relays}
    assert failed.dead
    assert not {r.node_id for r in pm.start_build().relays} & suspects  # only 3 others left
    pm.close()
    clock.advance(SUSPECT_SECONDS - 1)
    for _ in range(10):  # still suspect: every build takes the 3 others
        p = pm.start_build()
        assert not {r.node_id for r in p.relays} & suspects
        pm.close()
    clock.advance(2)
    seen: set[bytes] = set()
    for _ in range(40):  # suspect period over: the failed path's relays are drawn again
        p = pm.start_build()
        seen |= {r.node_id for r in p.relays}
        pm.close()
    assert seen & suspects


# --------------------------------------------------------------------------- Responder


class _Conn:
    def __init__(self, peer: bytes) -> None:
        self.peer = peer
        self.peer_id = peer


async def test_responder_reassembler_ttl_follows_trio_mock_clock(autojump_clock: trio.testing.MockClock) -> None:
    """k−1 cloves of a request wait in the reassembler; once trio's (mock) clock passes the
    TTL, the responder's sweep drops them. On the system clock no time would have passed."""
    ident = Identity.generate()
    responder = Responder(ident, lambda peer, msg: True, lambda node_id: None)
    cloves = sida.split(b"a request that never completes", 4, 3)
    async with trio.open_nursery() as nursery:
        await nursery.start(responder.run)
        for c in cloves[:2]:
            sealed = seal_to(ident.x25519_public, sida.encode_clove(c))
            assert await responder.on_deliver(_Conn(os.urandom(20)), Deliver(os.urandom(PROXY_PATH_ID_LEN), sealed)) is None
        assert len(responder.reassembler) == 1
        await trio.sleep(responder.reassembler.ttl - 1)
        assert len(responder.reassembler) == 1  # swept every 10 s, but not yet expired
        await trio.sleep(15)
        assert len(responder.reassembler) == 0
        assert responder.reassembler.stats["expired"] == 1
        nursery.cancel_scope.cancel()


async def test_responder_rate_limit_refills_on_its_clock() -> None:
    """Each proxy's token bucket refills with the injected clock, not the system's."""
    ident = Identity.generate()
    clock = FakeClock()
    responder = Responder(ident, lambda peer, msg: True, lambda node_id: None,
                          delivers_per_s=1.0, deliver_burst=2.0, clock=clock)
    proxy = _Conn(os.urandom(20))
    junk = Deliver(os.urandom(PROXY_PATH_ID_LEN), b"not sealed")
    for _ in range(3):
        await responder.on_deliver(proxy, junk)
    assert responder.dropped == {"clove-unsealable": 2, "deliver-rate-limited": 1}
    clock.advance(1.0)  # one token back
    for _ in range(2):
        await responder.on_deliver(proxy, junk)
    assert responder.dropped == {"clove-unsealable": 3, "deliver-rate-limited": 2}


# --------------------------------------------------------------------------- Node


async def test_node_reports_uptime_on_its_clock() -> None:
    network = MemoryNetwork()
    server_id, asker_id = Identity.generate(), Identity.generate()
    clock = FakeClock(monotonic=100.0)
    server = Node(server_id, MemoryTransport(server_id, network), ping_interval=0, clock=clock)
    asker = Node(asker_id, MemoryTransport(asker_id, network), ping_interval=0)
    got: list[PeerStatus] = []
    answered = trio.Event()

    async def on_status(conn: Any, msg: PeerStatus) -> None:
        got.append(msg)
        answered.set()

    asker.on(PeerStatus, on_status)
    async with trio.open_nursery() as nursery:
        address = await nursery.start(server.serve, "server", 0)
        await nursery.start(asker.serve, "asker", 0)
        clock.advance(42.0)
        conn = await asker.connection_to(PeerEntry.of(server_id, address))
        await conn.send(PeerStatusRequest())
        with trio.fail_after(10):
            await answered.wait()
        nursery.cancel_scope.cancel()
    assert got[0].uptime_s == 42.0



def test_tls_certificate_is_dated_by_the_clock_it_is_given() -> None:
    """``TLSTransport(clock=)`` hands ``clock.unix()`` to the certificate; nothing reads the wall clock."""
    import datetime

    from cryptography import x509

    from overlay.wire import crypto

    cert_pem, _ = crypto.self_signed_cert(Identity.generate().signing, "x", 2_000_000_000.0)
    cert = x509.load_pem_x509_certificate(cert_pem)
    start = datetime.datetime.fromtimestamp(2_000_000_000.0, datetime.UTC)
    assert cert.not_valid_before_utc == start - datetime.timedelta(days=1)
    assert cert.not_valid_after_utc == start + datetime.timedelta(days=3650)
