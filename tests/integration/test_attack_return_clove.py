"""Issue 28, item 6: reply cloves pushed at a proxy by a peer the path never delivered to.

Whoever learns a proxy path id (here: read from the proxies' tables, as a leak would give it)
could push data down the path to the user for the path's lifetime, an active watermark. The
proxy passes a ReturnClove back only from the model node the path delivered to (or a member of
its group, answering a request forwarded to it); the stranger's cloves are dropped and counted
at the proxy, nothing reaches the user, and the user's requests go on being answered.
"""

from __future__ import annotations

import os
from typing import Any

import trio
import trio.testing

from model_node.testing import start_group
from overlay.testing import Net
from overlay.wire.messages import CellBack, ChatMessage, ReplyChunk, ReturnClove, SamplingParams

from .attacks import ask, link_ids, ready_paths, relay_core, start_secnet


def received_cell_backs(net: Net, node_id: bytes) -> int:
    return sum(isinstance(m, CellBack) for m in net.capture(node_id).received_messages())


async def test_a_stranger_cannot_push_reply_cloves_down_a_path(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        net = await start_secnet(nursery, 15)
        user = net.client
        me = user.identity.node_id
        paths = await ready_paths(user)
        assert await ask(user.client, "before the push") == "before the push"  # every proxy delivered
        leaked = []
        for path in paths:
            links = link_ids(net, me, path)
            proxy = path.relays[-1].node_id
            hop = relay_core(net, proxy).by_pred[(path.relays[1].node_id, links[-1])]
            assert hop.proxy_path_id is not None
            leaked.append((proxy, hop.proxy_path_id))
        bad = await net.start_raw_node(nursery)
        forwarded = {proxy: relay_core(net, proxy).forwarded for proxy, _ in leaked}
        seen_by_user = received_cell_backs(net, me)
        for proxy, ppid in leaked:
            await bad.send(proxy, *[ReturnClove(ppid, os.urandom(60_000)) for _ in range(10)])
        for proxy, _ in leaked:
            core = relay_core(net, proxy)
            assert core.dropped["return-clove-stranger"] == 10 * sum(p == proxy for p, _ in leaked)
            assert core.forwarded == forwarded[proxy]
        assert received_cell_backs(net, me) == seen_by_user
        assert not any(p.dead for p in paths)
        assert await ask(user.client, "after the push") == "after the push"
        nursery.cancel_scope.cancel()


async def test_a_group_member_answering_a_forwarded_request_is_not_a_stranger(
    autojump_clock: trio.testing.MockClock
) -> None:
    """Paper §3.3: A forwards a user's request to B (which holds its prompt's prefix), and B
    answers straight to the user's proxies, whose paths delivered only to A. The proxies take
    B's reply cloves: B serves the model A serves (``may_answer``)."""
    async with trio.open_nursery() as nursery:
        net = await start_group(nursery)
        a, b, _ = net.models
        system = "You answer questions about the city archive. " * 20

        async def ask_on(client: Any, node: Any, question: str) -> list[ReplyChunk]:
            messages = [ChatMessage("system", system), ChatMessage("user", question)]
            return [c async for c in client.request("echo", messages, SamplingParams(max_tokens=64),
                                                    node=node.identity.node_id)]

        first = await ask_on(net.users[0].client, b, "first question")  # B caches the prefix
        assert not first[-1].error
        await trio.sleep(30)  # sync rounds carry B's cache to A
        other = net.users[1]  # a client whose paths have never delivered to B
        assert other.paths is not None
        chunks = await ask_on(other.client, a, "where are the letters?")
        assert chunks[-1].node == b.identity.node_id and not chunks[-1].error
        assert a.forwarded_out == 1 and b.forwarded_in == 1
        proxies = {p.relays[-1].node_id for p in other.paths.ready_paths()}
        assert all(net.user(p).relay.core.dropped["return-clove-stranger"] == 0 for p in proxies)
        nursery.cancel_scope.cancel()
