"""Only registered nodes use the network (issue 15 item 6): a model node whose lists come from the
committee (``registered_only``) opens no clove from a proxy outside its user list, and a proxy
removed from the list loses access at once; registered proxies are still served."""

from __future__ import annotations

import os

import trio

from overlay.anon import sida
from overlay.anon.client import AnonError
from overlay.anon.seal import seal_to
from overlay.directory.registry import Registry
from overlay.wire.messages import Deliver

from .attacks import ask, start_secnet


async def test_a_model_node_refuses_cloves_from_unregistered_proxies(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_secnet(nursery, 15)
        model = net.model
        responder = model.responder
        stranger = await net.start_raw_node(nursery)
        sealed = seal_to(model.identity.x25519_public, sida.encode_clove(sida.split(b"x" * 100)[0]))
        opened = dict(responder.dropped)
        model.registered_only = True
        await stranger.send(model.identity.node_id, *[Deliver(os.urandom(16), sealed) for _ in range(5)])
        assert responder.dropped["deliver-not-registered"] == 5
        assert {k: v for k, v in responder.dropped.items() if k != "deliver-not-registered"} == opened
        # Registered proxies are still served...
        assert await ask(net.client.client, "served for registered proxies") == "served for registered proxies"
        # ...and a registry update that removes every user cuts them all off.
        registry: Registry = model._registry
        kept = list(registry.entries)
        registry.replace(Registry(registry.version + 1, [e for e in kept if e.role == "model"]))
        try:
            await ask(net.client.client, "refused", chunk_timeout=15)
        except AnonError:
            pass
        else:
            raise AssertionError("a model node served proxies no longer in its lists")
        assert responder.dropped["deliver-not-registered"] > 5
        registry.replace(Registry(registry.version + 1, kept))
        nursery.cancel_scope.cancel()
