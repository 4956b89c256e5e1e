"""Paths and routing: disjoint, regional, never through oneself; refreshed; failed paths' relays
avoided; a proxy cannot steer traffic at non-model nodes; concurrent users get only their own
replies."""

from __future__ import annotations

import os
from collections import Counter

import trio

from overlay.testing import settle
from overlay.wire import codec
from overlay.wire.messages import (
    CellFwd,
    Destroy,
    PathNotice,
    ToModel,
)

from .attacks import (
    ask,
    link_ids,
    ready_paths,
    relay_core,
    start_secnet,
)


async def test_paths_are_disjoint_regional_and_never_through_oneself(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_secnet(nursery, 30, regions=("eu", "eu", "us"), region_min_users=1)
        user = net.client
        paths = await ready_paths(user)
        relays = [r.node_id for p in paths for r in p.relays]
        assert len(relays) == len(set(relays)) == 12
        assert user.identity.node_id not in relays
        assert {net.registry.by_id[r].region for r in relays} == {"eu"}
        assert all(len(u.relay.core) == 0 for u in net.users if u.region == "us")
        assert await ask(user.client, "regional") == "regional"
        nursery.cancel_scope.cancel()


async def test_paths_are_refreshed_and_relays_forget_old_ones(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_secnet(nursery, 20)
        user = net.client
        assert user.paths is not None
        old = await ready_paths(user)
        old_links = {link for p in old for link in link_ids(net, user.identity.node_id, p)}
        await trio.sleep(user.paths.refresh + 5)  # 15 minutes (paper §5.2)
        new = await ready_paths(user)
        assert not {id(p) for p in new} & {id(p) for p in old}
        assert all(p.dead for p in old)
        # the old paths were destroyed hop by hop: no relay keeps their state
        for u in net.users[1:]:
            assert not {k[1] for k in u.relay.core.by_pred} & old_links
        assert sum(len(u.relay.core) for u in net.users) == 12
        assert await ask(user.client, "on fresh paths") == "on fresh paths"
        nursery.cancel_scope.cancel()


async def test_a_failed_paths_relays_are_avoided(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_secnet(nursery, 20)
        user = net.client
        paths = await ready_paths(user)
        victim = paths[0]
        suspects = {r.node_id for r in victim.relays}
        net.kill(victim.relays[1].node_id)  # the middle relay: only its neighbours notice
        await settle()
        assert victim.dead
        new = await ready_paths(user)
        used = {r.node_id for p in new for r in p.relays}
        assert len(used) == 12 and not used & suspects  # we cannot tell which hop failed: avoid all 3
        assert await ask(user.client, "around the failure") == "around the failure"
        nursery.cancel_scope.cancel()


async def test_a_proxy_delivers_only_to_model_nodes(autojump_clock):
    """A path's payload names its destination; a proxy must not hand a Deliver to a user
    node (which would drop the connection between the two relays, and every path on it)."""
    async with trio.open_nursery() as nursery:
        net = await start_secnet(nursery, 18)
        user = net.client
        paths = await ready_paths(user)
        p0 = paths[0]
        mid, proxy = p0.relays[1].node_id, p0.relays[2].node_id
        spare = [e.node_id for e in net.registry.users()
                 if e.node_id not in {r.node_id for p in paths for r in p.relays} | {user.identity.node_id}]
        bad = await net.start_raw_node(nursery)
        first, link, crypt, _ = await bad.build([spare[0], spare[1], mid])  # ends at the victim's middle relay
        assert bad.path_ready(first, link, crypt) is not None
        iv, body = crypt.wrap_forward(codec.encode(ToModel(dest=proxy, sealed=os.urandom(200))))
        await bad.send(first, CellFwd(link, iv, body))
        assert relay_core(net, mid).dropped["unknown-model-node"] == 1
        notices = [m for m in bad.payloads(first, link, crypt) if isinstance(m, PathNotice)]
        assert [n.code for n in notices] == ["unknown-model-node"]
        assert net.user(proxy).node.rejected == Counter() and not p0.dead
        assert await ask(user.client, "path intact") == "path intact"
        nursery.cancel_scope.cancel()


async def test_a_create_cannot_extend_to_a_model_node(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_secnet(nursery, 15)
        paths = await ready_paths(net.client)
        proxy = paths[0].proxy.node_id  # connected to the model node
        model = net.model.identity.node_id
        spare = [e.node_id for e in net.registry.users() if e.node_id not in
                 {r.node_id for p in paths for r in p.relays} | {net.client.identity.node_id}]
        bad = await net.start_raw_node(nursery)
        await bad.build([proxy, model, spare[0]])
        assert relay_core(net, proxy).dropped["bad-next-hop"] == 1
        assert [d.reason for d in bad.received(Destroy)] == ["bad-next-hop"]
        assert net.model.node.rejected == Counter()
        assert await ask(net.client.client, "still fine") == "still fine"
        nursery.cancel_scope.cancel()


async def test_concurrent_users_get_only_their_own_replies(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_secnet(nursery, 20, clients=3)
        results: dict[int, str] = {}

        async def one(i: int) -> None:
            text = " ".join(f"user{i}-word{j}" for j in range(40))
            results[i] = await ask(net.users[i].client, text)
            assert results[i] == text

        async with trio.open_nursery() as inner:
            for i in range(3):
                inner.start_soon(one, i)
        assert len(results) == 3 and net.model.responder.served == 3
        nursery.cancel_scope.cancel()


# --------------------------------------------------------------------------- RelayCore fuzz
