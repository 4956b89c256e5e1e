"""The anonymous overlay with real processes on loopback over authenticated TLS.

Relays and the echo model node are separate processes (``gentorrent user relay``,
``gentorrent model-node --engine echo``); the user is an in-process UserNode
registered in the same signed registry.
"""

from __future__ import annotations

import pytest
import trio

from gentorrent.tools.localnet import LocalNet
from overlay.anon.client import AnonError
from overlay.net.transport import TLSTransport
from overlay.usernode import UserNode
from overlay.wire.messages import ChatMessage, SamplingParams

pytestmark = pytest.mark.slow

PARAMS = SamplingParams(max_tokens=4096)


async def ask(client, text: str, chunk_timeout: float = 20.0) -> tuple[str, int]:
    parts = []
    async for chunk in client.request("echo", [ChatMessage("user", text)], PARAMS, chunk_timeout=chunk_timeout):
        parts.append(chunk.text)
    return "".join(parts), len(parts)


@pytest.fixture
def net15(tmp_path):
    with LocalNet(tmp_path, 15, users=("client",)) as net:
        net.start()
        yield net


async def start_user(nursery, net: LocalNet, **kw) -> UserNode:
    ident = net.identities["client"]
    host, port = net.entries["client"].address.rsplit(":", 1)
    user = UserNode(ident, TLSTransport(ident), net.registry, build_timeout=5.0, **kw)
    await nursery.start(user.serve, host, int(port))
    assert user.paths is not None
    with trio.fail_after(30):
        await user.paths.wait_ready(4)
    return user


async def test_hundred_requests_stream_through_15_relay_processes(net15):
    async with trio.open_nursery() as nursery:
        user = await start_user(nursery, net15)
        assert user.client is not None and user.paths is not None
        for i in range(100):
            text = f"request {i}: " + " ".join(f"w{j}" for j in range(40))
            reply, chunks = await ask(user.client, text)
            assert reply == text
            assert chunks >= 2  # streamed: first piece alone, then batches
        # every path of ours crosses 3 distinct relays and no two paths share one
        relays = [r.node_id for p in user.paths.ready_paths() for r in p.relays]
        assert len(relays) == len(set(relays)) == 12
        nursery.cancel_scope.cancel()


async def test_killing_paths_mid_run(tmp_path):
    # 22 relays: after killing the 3 + 6 relays of three paths, 13 remain for 4 disjoint paths.
    with LocalNet(tmp_path, 22, users=("client",), echo_delay=0.05) as net:
        net.start()
        by_id = {e.node_id: name for name, e in net.entries.items()}
        async with trio.open_nursery() as nursery:
            user = await start_user(nursery, net)
            assert user.paths is not None
            client = user.client
            assert client is not None
            long_text = " ".join(f"w{j}" for j in range(60))  # ~3 s of streaming at 50 ms/word

            # 1 of the 4 paths loses all its relays mid-reply: k = 3 paths still carry it.
            async def kill_one_path_soon(path_relays):
                await trio.sleep(0.5)
                for r in path_relays:
                    net.kill(by_id[r.node_id])

            victims = user.paths.ready_paths()[0].relays
            nursery.start_soon(kill_one_path_soon, victims)
            reply, _ = await ask(client, long_text)
            assert reply == long_text

            # Let the manager replace the dead path, then kill 2 of the 4 in use mid-reply.
            with trio.fail_after(30):
                await user.paths.wait_ready(4)
            ready = user.paths.ready_paths()

            async def kill_two_paths_soon():
                await trio.sleep(0.5)
                for p in ready[:2]:
                    for r in p.relays:
                        if by_id[r.node_id] in net.procs:
                            net.kill(by_id[r.node_id])

            nursery.start_soon(kill_two_paths_soon)
            with pytest.raises(AnonError) as err:
                await ask(client, long_text, chunk_timeout=5.0)
            assert "fewer than k=3" in str(err.value)

            # The paths are rebuilt on the surviving relays and requests succeed again.
            with trio.fail_after(30):
                await user.paths.wait_ready(4)
            alive = {net.entries[n].node_id for n in net.procs}
            for p in user.paths.ready_paths():
                assert all(r.node_id in alive for r in p.relays)
            reply, _ = await ask(client, "back again after the rebuild")
            assert reply == "back again after the rebuild"
            nursery.cancel_scope.cancel()
