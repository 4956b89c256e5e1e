"""The drivers under hostile input: every handler of a model node, a relaying user node and a
requesting user node, and the pre-authentication handshake, fed random and mutated frames over
the in-memory network (the real node, transport and handler code; trio's MockClock).

Contract: a bad frame closes that connection (counted in ``node.rejected``) and a bad message is
dropped and counted; no input raises out of a handler (that would stop the node); afterwards an
honest user's request still completes through the same nodes. Inputs come from seeded
:class:`RandomSource` (deterministic: CI cannot flake).
"""

from __future__ import annotations

from typing import Any

import trio

from overlay.testing import framed
from overlay.wire import codec
from overlay.wire.messages import AuthChallenge, PathReady
from tests.fuzz import mutate
from tests.fuzz.mutate import RandomSource, chance
from tests.fuzz.targets import CodecTarget
from tests.integration.attacks import ask, start_secnet

FRAMES_PER_NODE = 400  # hostile frames sent to each node in CI


def hostile_frames(seed: int, n: int) -> list[bytes]:
    """``n`` framed payloads: valid messages of every type with random field values, their
    mutations, and garbage (some undecodable: those cost the sender its connection)."""
    out = []
    types = list(CodecTarget.CORPUS)
    for i in range(n):
        src = RandomSource(seed * 100_003 + i)
        if chance(src, 40):  # a decodable message of any registered type (hostile values)
            cls = mutate.choice(src, list(codec.registered_types().values()))
            payload = codec.encode(mutate.message_of(src, cls))
        else:
            payload = mutate.payload(src, types)[1] or b"\0"
        out.append(framed(payload) if chance(src, 90) else mutate.mutate_bytes(src, framed(payload)))
    return out


async def _barrage(bad: Any, target: bytes, frames: list[bytes]) -> None:
    for data in frames:
        await bad.send_raw(target, data)  # redials when the last frame cost the connection


async def test_hostile_frames_to_every_handler_leave_the_nodes_serving(autojump_clock: Any) -> None:
    async with trio.open_nursery() as nursery:
        net = await start_secnet(nursery, 15)
        model = net.model
        client = net.client
        relay = net.users[-1]  # a relay-only user node
        bad = await net.start_raw_node(nursery)
        assert await ask(client.client, "before") == "before"

        await _barrage(bad, model.identity.node_id, hostile_frames(1, FRAMES_PER_NODE))
        await _barrage(bad, relay.identity.node_id, hostile_frames(2, FRAMES_PER_NODE))
        await _barrage(bad, client.identity.node_id, hostile_frames(4, FRAMES_PER_NODE))  # a user's own end
        # Something was refused on each (bad frames close the connection, counted).
        assert sum(model.node.rejected.values()) > 0 and sum(relay.node.rejected.values()) > 0
        # ... and decodable hostile messages reached the handlers, which dropped and counted them.
        assert sum(model.responder.dropped.values()) > 0 and sum(relay.relay.core.dropped.values()) > 0

        # The relay still sets up paths (as a proxy here) and the model node still answers.
        others = [u.identity.node_id for u in net.users[1:-1]][:2]
        first, link, crypt, _ = await bad.build([*others, relay.identity.node_id])
        await trio.sleep(1)
        assert isinstance(bad.path_ready(first, link, crypt), PathReady)
        assert await ask(client.client, "after the barrage") == "after the barrage"
        nursery.cancel_scope.cancel()


async def test_garbage_before_authentication_is_refused(autojump_clock: Any) -> None:
    """Random and mutated bytes in place of the dialer's proof: the listener closes that
    connection and keeps accepting."""
    async with trio.open_nursery() as nursery:
        net = await start_secnet(nursery, 15)
        address = net.address_of(net.model.identity)
        for i, data in enumerate(hostile_frames(3, 40)):
            peer = net.raw_dial(address)
            assert isinstance(await peer.receive(), AuthChallenge)
            await peer.send_raw(data)
            with trio.fail_after(5):
                got = [m for m in await peer.drain()]
            assert all(not isinstance(m, PathReady) for m in got), i  # never past the handshake
            await peer.aclose()
        assert await ask(net.client.client, "still here") == "still here"
        nursery.cancel_scope.cancel()
