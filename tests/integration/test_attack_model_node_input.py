"""Bad input at the model node: cloves that do not open, floods of cloves from one proxy, and
overload or engine failure: dropped and counted, or answered with an error; the node keeps
serving."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import AsyncGenerator
from typing import Any

import pytest
import trio

from overlay.anon import sida, signing
from overlay.anon.client import AnonError
from overlay.anon.seal import seal_to
from overlay.testing import flip
from overlay.wire.identity import Identity
from overlay.wire.messages import (
    ChatMessage,
    Deliver,
    ReplyChunk,
    Request,
)

from .attacks import (
    PARAMS,
    ask,
    fingerprint,
    start_secnet,
)


async def test_cloves_that_do_not_open_at_the_model_node_are_dropped(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_secnet(nursery, 15)
        model = net.model
        mid = model.identity.node_id
        responder = model.responder
        bad = await net.start_raw_node(nursery)
        clove = sida.encode_clove(sida.split(b"x" * 100)[0])
        sealed = seal_to(model.identity.x25519_public, clove)
        junk = [
            os.urandom(300),                                          # random bytes
            b"short",                                                 # shorter than a sealed box
            seal_to(Identity.generate().x25519_public, clove),        # sealed to another node
            flip(sealed, 40),                                         # tampered
            sealed[:-1],                                              # truncated
            bytes(32) + sealed[32:],                                  # low-order ephemeral key
            seal_to(model.identity.x25519_public, b"not a clove"),    # opens, but is no clove
        ]
        await bad.send(mid, *[Deliver(os.urandom(16), s) for s in junk])
        assert responder.dropped["clove-unsealable"] == len(junk)
        assert model.node.rejected == Counter()  # a bad clove is no reason to drop the proxy

        # A flood of well-formed, self-consistent forged cloves (each a message of its own)
        # stays within the reassembler's bounds, oldest first out.
        responder.reassembler = sida.Reassembler(max_messages=50)
        forged = []
        for _ in range(300):
            frag, share = os.urandom(sida.fragment_len(300, 3)), os.urandom(32)
            fps = fingerprint(frag, b"gt-sida-frag") + os.urandom(48) + fingerprint(share, b"gt-sida-share") + os.urandom(48)
            c = sida.Clove(os.urandom(16), 0, 4, 3, frag, share, fps)
            forged.append(Deliver(os.urandom(16), seal_to(model.identity.x25519_public, sida.encode_clove(c))))
        await bad.send(mid, *forged)
        assert len(responder.reassembler) == 50 and responder.reassembler.stats["evicted"] == 250
        assert responder.reassembler.bytes_held <= responder.reassembler.max_bytes

        assert await ask(net.client.client, "served after the junk") == "served after the junk"
        nursery.cancel_scope.cancel()


async def test_a_proxy_flooding_the_model_node_with_cloves_is_rate_limited(autojump_clock):
    """Opening a clove costs the model node an X25519: past its per-proxy budget a flooding
    peer's cloves are dropped unopened and counted; other proxies are not affected."""
    async with trio.open_nursery() as nursery:
        net = await start_secnet(nursery, 15)
        model = net.model
        responder = model.responder
        responder.delivers_per_s, responder.deliver_burst = 0.001, 20.0  # no refill within the test
        bad = await net.start_raw_node(nursery)
        junk = [Deliver(os.urandom(16), os.urandom(300)) for _ in range(50)]
        await bad.send(model.identity.node_id, *junk)
        assert responder.dropped["clove-unsealable"] == 20
        assert responder.dropped["deliver-rate-limited"] == 30
        assert model.node.rejected == Counter()  # dropped, not a protocol error: the link stays up
        assert await ask(net.client.client, "served during the flood") == "served during the flood"
        nursery.cancel_scope.cancel()


async def test_a_model_node_at_capacity_or_failing_answers_with_an_error(autojump_clock):
    """Overload and engine failures come back to the user as an error chunk; the model node
    keeps serving."""
    async with trio.open_nursery() as nursery:
        net = await start_secnet(nursery, 15)
        responder = net.model.responder
        responder.max_active = 0
        refusals: list[ReplyChunk] = []
        client = net.client.client
        assert client is not None
        with pytest.raises(AnonError, match="at capacity"):
            async for _ in client.request("echo", [ChatMessage("user", "too busy")], PARAMS,
                                                     chunk_timeout=5, refusals=refusals):
                pass
        (refusal,) = refusals  # signed as the model node's own "busy" (decision 0044)
        req = Request(request_id=refusal.request_id, model="echo", messages=(ChatMessage("user", "too busy"),),
                      params=PARAMS, k=3, return_paths=(), continuation="")
        signing.verify_busy(net.model.identity.ed25519_public, refusal.signature,
                            signing.request_digest(req, net.model.identity.node_id), "echo",
                            net.model.identity.node_id, refusal.signed_at_ms)
        responder.max_active = 64

        async def broken(req: Request, *origin: Any) -> AsyncGenerator[ReplyChunk, None]:
            no_chunks: tuple[ReplyChunk, ...] = ()
            for chunk in no_chunks:  # an async generator, as handle is, that fails before its first chunk
                yield chunk
            raise RuntimeError("the engine fell over")

        net.model.handle = broken
        with pytest.raises(AnonError, match="model node error: RuntimeError"):
            await ask(net.client.client, "crash", chunk_timeout=5)
        del net.model.handle  # the class's again
        assert await ask(net.client.client, "still serving") == "still serving"
        nursery.cancel_scope.cancel()
