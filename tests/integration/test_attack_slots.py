"""Connection slots (issue 28, item 4): one host opening authenticated connections under fresh
keys cannot take a node's slots; registered peers always get in, unregistered ones are evicted
to make room for them. In memory (trio's MockClock) and over real TLS on loopback."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio
import trio.testing

from overlay.net.node import Node
from overlay.net.transport import Connection, PeerAuthError, TLSTransport, TransportError
from overlay.testing import Net, wait_until
from overlay.usernode import UserNode
from overlay.wire.identity import Identity

ATTACKER = "198.51.100.7"

Dial = Callable[[], Awaitable[Connection]]


async def hold(dial: Dial, n: int) -> tuple[list[Connection], list[str]]:
    """``n`` dials; the connections that authenticated, and why the others were refused."""
    held, refused = [], []
    for _ in range(n):
        try:
            held.append(await dial())
        except (PeerAuthError, TransportError) as exc:
            refused.append(str(exc))
    return held, refused


async def closed_by_peer(conn: Connection) -> bool:
    try:
        await conn.receive(idle_timeout=10)
    except TransportError:
        return True
    return False


async def test_one_host_with_fresh_keys_cannot_lock_registered_peers_out(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, net: Net
) -> None:
    users = net.add_users(24)
    me = users[0]
    relay = UserNode(me, net.transport(me, max_connections=16, max_pending=8, max_pending_per_address=4),
                     net.registry, client=False)
    address = await net.start(nursery, relay)
    transport = relay.node.transport

    def stranger(source: str) -> Dial:
        return lambda: net.transport(Identity.generate(), local_address=source).dial(address, me.node_id)

    # one host: a fresh key per connection; it keeps its per-address share (1 of the 4
    # unregistered slots at 16 connections), every other one is refused after its proof
    attacker, refused = await hold(stranger(ATTACKER), 40)
    assert len(attacker) == 1 and len(refused) == 39
    assert all("unregistered-over-cap" in r for r in refused)
    # hosts elsewhere (a botnet, one per network): the unregistered share, 4 in all
    botnet, _ = await hold_each([stranger(f"10.{i}.0.1") for i in range(20)])
    assert len(botnet) == 3
    adm = transport.admission
    assert adm is not None and adm.unregistered == 4 and adm.established == 4
    # registered peers, all from one address (as a devnet on 127.0.0.1): every one gets in;
    # once the slots are full each evicts an unregistered connection, oldest first
    honest = []
    for ident in users[1:17]:
        honest.append(await net.transport(ident, local_address="127.0.0.1").dial(address, me.node_id))
    assert len(honest) == 16 and adm.established == 16 and adm.unregistered == 0
    assert adm.evicted_unregistered == 4
    assert all([await closed_by_peer(c) for c in attacker + botnet])
    with trio.fail_after(15):
        await wait_until(lambda: transport.rejected["evicted-unregistered"] == 4)
    # every slot holds a registered peer: a newcomer is refused, registered or not
    for ident in (users[17], Identity.generate()):
        try:
            await net.transport(ident).dial(address, me.node_id)
            raise AssertionError("admitted into a node whose slots all hold registered peers")
        except (PeerAuthError, TransportError):
            pass
    assert transport.rejected["unregistered-over-cap"] == 39 + 17
    assert transport.rejected["too-many-connections"] == 2  # (before the handshake: none to evict)
    # the registered connections were never touched and still work
    with trio.fail_after(15):
        await wait_until(lambda: all(not c.closed for c in honest))
    for c in honest + attacker:
        await c.aclose()
    # with slots free again, an unregistered newcomer from elsewhere gets in
    with trio.fail_after(15):
        await wait_until(lambda: adm.established == 0)
    assert await net.transport(Identity.generate()).dial(address, me.node_id)


async def hold_each(dials: list[Dial]) -> tuple[list[Connection], list[str]]:
    held, refused = [], []
    for dial in dials:
        h, r = await hold(dial, 1)
        held += h
        refused += r
    return held, refused


async def test_over_tls_one_address_cannot_take_the_slots(nursery: trio.Nursery) -> None:
    """The same with the real TLS transport: the attacker's sockets leave from 127.0.0.2
    (Linux routes all of 127/8 to loopback), the registered peers' from 127.0.0.1."""
    me = Identity.generate()
    listed = {me.node_id}
    node = Node(me, TLSTransport(me, max_connections=8, max_pending=4, max_pending_per_address=4),
                ping_interval=0, registered=listed.__contains__)
    address = await nursery.start(node.serve, "127.0.0.1", 0)

    async def dial(ident: Identity, source: str) -> Connection:
        return await TLSTransport(ident, local_address=source).dial(address, me.node_id)

    attacker, refused = await hold(lambda: dial(Identity.generate(), "127.0.0.2"), 12)
    assert len(attacker) == 1 and len(refused) == 11  # 8 slots: 2 unregistered, 1 per address
    assert all("unregistered-over-cap" in r for r in refused)
    honest = []
    for _ in range(8):
        ident = Identity.generate()
        listed.add(ident.node_id)
        honest.append(await dial(ident, "127.0.0.1"))
    assert await closed_by_peer(attacker[0])
    with trio.fail_after(15):
        await wait_until(lambda: node.transport.rejected == {"unregistered-over-cap": 11, "evicted-unregistered": 1})
    for c in honest + attacker:
        await c.aclose()
