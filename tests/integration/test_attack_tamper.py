"""Forging and tampering: malicious relays and proxies on fewer than n-k+1 paths cannot stop or
alter a reply; on more, requests fail with AnonError, never with garbage."""

from __future__ import annotations

import pytest
import trio

from overlay.anon.client import AnonError
from overlay.wire.messages import (
    ReplyChunk,
)

from .attacks import (
    ask,
    make_evil,
    ready_paths,
    relay_core,
    start_secnet,
)


@pytest.mark.parametrize("attack,pos", [("flip", 1), ("random", 0), ("flip", 0), ("proxy", 2)])
async def test_one_malicious_path_of_four_is_tolerated_and_replaced(autojump_clock, attack, pos):
    """Replies stay intact, and the path through the malicious relay is given up after the
    first request that shows it (issue 15, item 4); its relays are avoided afterwards."""
    async with trio.open_nursery() as nursery:
        net = await start_secnet(nursery, 18)  # enough relays to avoid the suspects
        client = net.client.client
        assert client is not None
        paths = await ready_paths(net.client)
        (evil,) = make_evil(net, paths, [(attack, pos)])
        bad = paths[0]
        for i in range(3):
            text = f"request {i}: " + " ".join(f"w{j}" for j in range(50))
            chunks: list[ReplyChunk] = []
            assert await ask(client, text, into=chunks) == text
            assert [c.seq for c in chunks] == list(range(len(chunks))) and chunks[-1].done
            if i == 0:
                assert bad.dead  # replaced after the first request, by paths avoiding its relays
                fresh = await ready_paths(net.client)
                assert all(r.node_id != bad.relays[pos].node_id for p in fresh for r in p.relays)
        assert sum(evil.tampered.values()) > 0
        responder = net.model.responder
        assert responder.served == 3
        proxy = relay_core(net, bad.proxy.node_id)
        if attack in ("flip", "random"):
            # forward cells fail the user<->proxy AEAD at the (honest) proxy; backward cells
            # fail it at the user
            assert proxy.dropped["cell-unauthentic"] >= 1
            assert net.client.paths is not None and net.client.paths.dropped["cell-unauthentic"] >= 1
        else:
            # (a) tampered seals and (b) ill-formed forged cloves (one counter for both)
            assert responder.dropped["clove-unsealable"] >= 2
            assert responder.reassembler.stats["rejected"] >= 1  # (b) wrong fingerprints
            assert responder.reassembler.stats["failed_groups"] >= 1  # (b) forged groups fail the tag
            assert responder.dropped["request-malformed"] >= 1  # (b) authentic S-IDA, not a Request
            assert client.dropped["reply-clove-unauthentic"] >= 1  # (c) tampered return cloves
        # the other paths are clean and stay; no live path uses the malicious relay
        assert all(not p.dead for p in paths[1:])
        for p in paths[1:]:
            assert relay_core(net, p.proxy.node_id).dropped["cell-unauthentic"] == 0
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("attacks", [
    [("flip", 1), ("random", 0)],          # requests never reach the model node
    [("bad-returns", 2), ("bad-returns", 2)],  # requests are served, replies cannot be rebuilt
    [("proxy", 2), ("flip", 0)],
])
async def test_two_malicious_paths_fail_cleanly(autojump_clock, attacks):
    async with trio.open_nursery() as nursery:
        net = await start_secnet(nursery, 15)
        client = net.client.client
        assert client is not None
        paths = await ready_paths(net.client)
        make_evil(net, paths, attacks)
        chunks: list[ReplyChunk] = []
        with pytest.raises(AnonError, match="fewer than k=3"):
            await ask(client, "this must not come back altered " * 5, chunk_timeout=10, into=chunks)
        assert chunks == []  # never garbage, never a partial reply
        if attacks[0][0] == "bad-returns":
            assert net.model.responder.served == 1
            assert client.dropped["reply-clove-unauthentic"] >= 2
            assert client.reassembler.stats["completed"] == 0
        else:
            assert net.model.responder.served == 0
        nursery.cancel_scope.cancel()
