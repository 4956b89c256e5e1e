"""Replay: a proxy that delivers every clove twice does not get a request run twice (replayed
onions at relays are in test_attack_bad_onions.py)."""

from __future__ import annotations

import trio

from .attacks import (
    ask,
    make_evil,
    ready_paths,
    start_secnet,
)


async def test_a_replaying_proxy_does_not_run_a_request_twice(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_secnet(nursery, 15)
        paths = await ready_paths(net.client)
        make_evil(net, paths, [("dup-deliver", 2)] * 4)  # every proxy sends every clove twice
        for i in range(3):
            assert await ask(net.client.client, f"once only {i}") == f"once only {i}"
        responder = net.model.responder
        assert responder.served == 3
        stats = responder.reassembler.stats
        # 8 cloves per request, 3 complete it: the other 5 are late or duplicates, never a rerun
        assert stats["duplicates"] + stats["late"] + responder.dropped.get("request-duplicate", 0) >= 5 * 3
        nursery.cancel_scope.cancel()
