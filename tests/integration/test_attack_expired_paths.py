"""Expired paths: cells and return cloves on paths past their lifetime are dropped at every hop,
and the user rebuilds its paths."""

from __future__ import annotations

import os

import pytest
import trio

from overlay.anon import onion
from overlay.anon.actions import Send
from overlay.anon.client import AnonError
from overlay.anon.relay import RelayCore
from overlay.wire import crypto
from overlay.wire.messages import (
    CellBack,
    Create,
    Destroy,
    ReturnClove,
)

from .attacks import (
    SkewClock,
    ask,
    ready_paths,
    relay_core,
    start_secnet,
)


async def test_cloves_on_expired_paths_are_dropped_and_paths_rebuilt(autojump_clock):
    async with trio.open_nursery() as nursery:
        clock = SkewClock()  # the relays' clock, to move past every path's expiry
        net = await start_secnet(nursery, 20, relay_clock=clock)
        user = net.client
        assert user.paths is not None
        old = await ready_paths(user)
        assert await ask(user.client, "before expiry") == "before expiry"
        # An outsider's own path, to play the model node on it later.
        bad = await net.start_raw_node(nursery)
        spare = [e.node_id for e in net.registry.users()
                 if e.node_id not in {r.node_id for p in old for r in p.relays} | {user.identity.node_id}]
        first, link, crypt, _ = await bad.build(spare[:3])
        ready = bad.path_ready(first, link, crypt)
        assert ready is not None
        proxy_core = relay_core(net, spare[2])

        # Each hop is set up to live path_ttl plus its own jitter: move the relays' clock past
        # every expiry.
        clock.skew += user.paths.path_ttl + user.paths.expiry_jitter + 60
        with pytest.raises(AnonError):
            await ask(user.client, "too late", chunk_timeout=5)
        assert sum(relay_core(net, p.first).dropped["path-expired"] for p in old) == 4
        assert all(p.dead for p in old)  # each first relay told the user (Destroy)
        # a return clove for an expired path is dropped at the proxy, not relayed to the user
        n_back = len(bad.received(CellBack))
        await bad.send(spare[2], ReturnClove(ready.proxy_path_id, os.urandom(300)))
        assert proxy_core.dropped["path-expired"] == 1 and len(bad.received(CellBack)) == n_back
        assert ready.proxy_path_id not in proxy_core.by_proxy_path

        # New paths are built at once and requests succeed again; relays hold only live paths.
        new = await ready_paths(user)
        assert not {id(p) for p in new} & {id(p) for p in old}
        assert await ask(user.client, "after the rebuild") == "after the rebuild"
        await trio.sleep(60)  # a relay sweep (every 30 s) clears whatever expired unused
        assert sum(len(u.relay.core) for u in net.users) == 12
        nursery.cancel_scope.cancel()


def test_backward_cells_on_an_expired_path_are_dropped_at_every_hop():
    """I/O-free: a middle relay drops a CellBack for an expired path (and tears it down),
    as it does for forward cells; so does the proxy for a ReturnClove."""
    cores = [RelayCore(os.urandom(20), crypto.X25519Key.generate()) for _ in range(3)]
    user, unix = b"U" * 20, 1_800_000_000
    packet, _ = onion.build_onion([c.static_key.public_bytes for c in cores], [c.node_id for c in cores],
                                  unix + 600)
    queue = [(user, Send(cores[0].node_id, Create(os.urandom(16), packet)))]
    by_id = {c.node_id: c for c in cores}
    while queue:
        src, a = queue.pop(0)
        if a.peer in by_id:
            queue += [(a.peer, s) for s in by_id[a.peer].on_message(src, a.msg, now=0.0, unix=unix)]
    (mid_path,) = cores[1].by_succ.values()
    assert mid_path.succ_link is not None
    out = cores[1].on_message(cores[2].node_id, CellBack(mid_path.succ_link, os.urandom(16), b"x" * 64),
                              now=601.0, unix=unix + 601)
    assert cores[1].dropped["path-expired"] == 1 and len(cores[1]) == 0
    assert {type(s.msg) for s in out} == {Destroy}
    (proxy_path_id,) = cores[2].by_proxy_path
    out = cores[2].on_message(b"M" * 20, ReturnClove(proxy_path_id, b"x" * 64), now=601.0, unix=unix + 601)
    assert cores[2].dropped["path-expired"] == 1 and len(cores[2]) == 0
    assert {type(s.msg) for s in out} == {Destroy}
