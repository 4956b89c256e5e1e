"""The anonymous overlay end to end over in-memory transports (MockClock: timeouts are instant)."""

from __future__ import annotations

import trio

from model_node.testing import start_echo_overlay
from overlay.wire.messages import ChatMessage, SamplingParams


async def ask(client, text: str, **kw) -> str:
    out = []
    async for chunk in client.request("echo", [ChatMessage("user", text)], SamplingParams(max_tokens=4096), **kw):
        out.append(chunk.text)
    return "".join(out)


async def test_request_roundtrip_through_three_hop_paths(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_echo_overlay(nursery, 15)
        client = net.users[0].client
        for i in range(5):
            text = f"hello anonymous world {i} " * 20
            assert await ask(client, text.strip()) == text.strip()
        assert net.model.responder.served == 5
        nursery.cancel_scope.cancel()
