"""Floods at a relay: cells and Creates from one peer are rate limited and its paths capped; the
relay's tables stay bounded and other users are served."""

from __future__ import annotations

import os
from typing import Any

import trio

from overlay.anon import onion
from overlay.anon.relay import RelayLimits
from overlay.net.peers import PeerEntry
from overlay.wire.messages import (
    CellFwd,
    Create,
)

from .attacks import (
    ask,
    ready_paths,
    relay_core,
    start_secnet,
)


async def test_floods_from_one_peer_stay_bounded_and_others_are_served(autojump_clock):
    limits = RelayLimits(cells_per_s=100.0, cell_burst=200.0, creates_per_s=10.0, create_burst=20.0,
                         max_paths_per_peer=5)
    async with trio.open_nursery() as nursery:
        net = await start_secnet(nursery, 18, limits=limits)
        user = net.client
        paths = await ready_paths(user)
        target = paths[0].first
        core, node = relay_core(net, target), net.user(target).node
        bad = await net.start_raw_node(nursery)

        async def flood() -> None:
            await bad.send(target, *[CellFwd(os.urandom(16), os.urandom(16), os.urandom(512)) for _ in range(2000)])
            await bad.send(target, *[Create(os.urandom(16), os.urandom(onion.ONION_LEN)) for _ in range(200)])

        async with trio.open_nursery() as inner:
            inner.start_soon(flood)
            assert await ask(user.client, "served during the flood") == "served during the flood"
        assert core.dropped["unknown-link"] + core.dropped["cell-rate-limited"] == 2000
        assert core.dropped["cell-rate-limited"] >= 1000
        assert core.dropped["onion-bad-mac"] + core.dropped["create-rate-limited"] == 200
        assert core.dropped["create-rate-limited"] >= 100

        # Valid onions too: one peer holds at most max_paths_per_peer paths at a relay.
        spare = [e.node_id for e in net.registry.users()
                 if e.node_id not in {r.node_id for p in paths for r in p.relays} | {user.identity.node_id}]
        for i in range(12):
            await bad.build([target, spare[i % 5], spare[(i + 1) % 5]])
        assert core.per_peer[bad.identity.node_id] == 5 and core.dropped["table-full"] == 7
        assert len(core) == 6 and len(core.replay) <= 6
        neighbours = {user.identity.node_id, paths[0].relays[1].node_id, bad.identity.node_id, *spare[:5]}
        assert set(core._cell_buckets) | set(core._create_buckets) | set(node._outboxes) <= neighbours

        assert await ask(user.client, "served after the flood") == "served after the flood"
        assert not any(p.dead for p in paths)
        nursery.cancel_scope.cancel()


async def test_silent_connections_cannot_lock_out_honest_peers(autojump_clock):
    """Issue 15, item 5, in memory: 2,000 silent connections (past the fake TLS, never sending
    a proof) held against a relay and the model node while requests run: pending connections
    stay capped, the silent ones are evicted oldest first, honest newcomers connect, and
    requests complete. (tests/e2e/test_connection_hold.py does it with real processes.)"""
    async with trio.open_nursery() as nursery:
        net = await start_secnet(nursery, 15)
        user = net.client
        paths = await ready_paths(user)
        relay = net.user(paths[0].relays[1].node_id).node
        model = net.model.node
        held: list[Any] = []
        for target in (relay, model):
            assert target.address is not None
            for i in range(2000):
                held.append(net.raw_dial(target.address))
                if i % 20 == 19:
                    await trio.sleep(0.01)  # let the listener take them (its inbox holds 64)
        await trio.sleep(0.1)
        for target in (relay, model):
            adm = target.transport.admission
            assert adm is not None
            # all from one source: over its rate they are refused before the handshake, the
            # rest evict each other; none is left holding more than the per-address cap
            assert adm.pending <= target.transport.max_pending_per_address
            assert adm.evicted > 0 and adm.evicted + adm.rate_limited >= 2000 - adm.pending
        assert await ask(user.client, "served while held") == "served while held"
        honest = await net.start_node(nursery)
        for target in (relay, model):
            assert target.address is not None
            assert await honest.ping(PeerEntry.of(target.identity, target.address)) >= 0
        assert relay.transport.rejected.get("too-many-connections", 0) == 0
        for peer in held:
            await peer.stream.aclose()
        nursery.cancel_scope.cancel()
