"""``gentorrent bench overlay``: path builds, relay capacity, and the overlay's added latency.

Real node processes on loopback over authenticated TLS; the measuring client
runs in the bench process.

Figures:
- ``path_build_warm_{p50,p99,mean}_ms``: one 3-hop path build (Create onion out,
  PathReady back) by a client whose connections to the relays, and the relays'
  connections to each other, are already open.
- ``path_build_cold_{p50,p99,mean}_ms``: the same from a fresh client identity
  each time (its TLS connection to the first relay is new; relays' links to
  each other may already be open).
- ``relay_1KiB_cells_per_s``: 1 KiB cells forwarded by ONE relay process,
  spread over 2 paths, the sender doing one write per cell, counted at the sink.
- ``e2e_4KiB_{overlay,direct}_{p50,mean,p99}_ms``: a 4 KiB prompt answered by a
  4 KiB reply from the echo model node, through (4,3) garlic over 3-hop paths,
  versus a direct authenticated TLS request to the same node;
  ``e2e_4KiB_added_p50_ms`` and ``e2e_4KiB_p50_ratio_overlay_vs_direct``.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from gentorrent.bench.stats import overlay_vs_direct, summarize_ms
from gentorrent.cli import run_async
from gentorrent.tools.localnet import LocalNet
from overlay.anon import onion
from overlay.net.node import Node
from overlay.net.transport import TLSTransport
from overlay.usernode import UserNode
from overlay.wire import codec
from overlay.wire.clock import SystemClock
from overlay.wire.identity import Identity
from overlay.wire.messages import CellFwd, ChatMessage, Create, ReplyChunk, Request, SamplingParams

PROMPT_4K = ("lorem ipsum dolor sit amet " * 160)[:4096]


async def _path_builds(cluster: LocalNet, client: Identity, trials: int, cold: int) -> dict[str, float]:
    figures: dict[str, float] = {}
    warm: list[float] = []

    def running() -> list[Any]:  # registered users that are not running are never chosen here
        return [cluster.entries[r] for r in cluster.relays]

    async with trio.open_nursery() as nursery:
        user = UserNode(client, TLSTransport(client), cluster.registry, client=True, n=1, k=1, paths=1)
        await nursery.start(user.node.serve, "127.0.0.1", 0)
        await nursery.start(user.relay.run)
        pm = user.paths
        assert pm is not None
        pm.target = 10**6  # builds are driven by hand here
        pm.directory = running
        for i in range(trials + 5):
            t0 = time.perf_counter()
            path = pm.start_build()
            with trio.fail_after(10):
                await path.ready.wait()
            if i >= 5:  # the first builds open the connections
                warm.append(time.perf_counter() - t0)
            pm._kill(path, send_destroy=True)
        nursery.cancel_scope.cancel()
    figures.update(summarize_ms("path_build_warm", warm))
    cold_times: list[float] = []
    for _ in range(cold):
        ident = Identity.generate()
        async with trio.open_nursery() as nursery:
            user = UserNode(ident, TLSTransport(ident), cluster.registry, client=True, n=1, k=1, paths=1)
            await nursery.start(user.node.serve, "127.0.0.1", 0)
            pm = user.paths
            assert pm is not None
            pm.directory = running
            t0 = time.perf_counter()
            path = pm.start_build()
            with trio.fail_after(10):
                await path.ready.wait()
            cold_times.append(time.perf_counter() - t0)
            nursery.cancel_scope.cancel()
    figures.update(summarize_ms("path_build_cold", cold_times))
    return figures


async def _relay_capacity(cluster: LocalNet, sink_ident: Identity, cells: int) -> dict[str, float]:
    """Sender → relay process → sink. The sink is a registered node (the relay forwards only to
    registry nodes) served in-process; it is the onion's next hop and counts the cells."""
    relay = cluster.entries["relay-0"]
    sink_entry = cluster.entries["sink"]
    got = 0
    done = trio.Event()

    async def on_create(conn: Any, msg: Create) -> None:
        return None

    async def on_cell(conn: Any, msg: CellFwd) -> None:
        nonlocal got
        got += 1
        if got >= cells:
            done.set()

    host, port = sink_entry.address.rsplit(":", 1)
    async with trio.open_nursery() as nursery:
        sink = Node(sink_ident, TLSTransport(sink_ident), ping_interval=0)
        sink.on(Create, on_create)
        sink.on(CellFwd, on_cell)
        await nursery.start(sink.serve, host, int(port))
        sender = Identity.generate()
        conn = await TLSTransport(sender).dial(relay.address, relay.node_id)
        links = []
        for _ in range(2):  # two paths through the relay
            link = os.urandom(16)
            pkt, _keys = onion.build_onion(
                [relay.x25519_public, sink_ident.x25519_public, sink_ident.x25519_public],
                [relay.node_id, sink_ident.node_id, sink_ident.node_id], int(SystemClock().unix()) + 600)
            await conn.send(Create(link, pkt))
            links.append(link)
        await trio.sleep(0.5)  # the relay dials the sink and forwards the Creates
        frames = [codec.frame(CellFwd(links[i % 2], os.urandom(16), bytes(1024))) for i in range(64)]
        t0 = time.perf_counter()
        for i in range(cells):
            await conn.send_raw(frames[i % 64])  # one write per cell
        with trio.move_on_after(30):
            await done.wait()
        dt = time.perf_counter() - t0
        nursery.cancel_scope.cancel()
    return {"relay_1KiB_cells_per_s": got / dt, "relay_1KiB_delivered_fraction": got / cells}


async def _e2e(cluster: LocalNet, client: Identity, trials: int) -> dict[str, float]:
    model = cluster.entries["model-0"]
    params = SamplingParams(max_tokens=4096)
    msgs = (ChatMessage("user", PROMPT_4K),)
    overlay_t: list[float] = []
    direct_t: list[float] = []
    async with trio.open_nursery() as nursery:
        user = UserNode(client, TLSTransport(client), cluster.registry, client=True)
        await nursery.start(user.serve, "127.0.0.1", 0)
        assert user.client is not None and user.paths is not None
        with trio.fail_after(30):
            await user.paths.wait_ready(4)
        conn = await TLSTransport(client).dial(model.address, model.node_id)
        for i in range(trials + 3):
            t0 = time.perf_counter()
            text = "".join([c.text async for c in user.client.request("echo", msgs, params, chunk_timeout=20)])
            if i >= 3:
                overlay_t.append(time.perf_counter() - t0)
            assert text == PROMPT_4K
            t0 = time.perf_counter()
            await conn.send(Request(request_id=os.urandom(16), model="echo", messages=msgs, params=params, k=3,
                                    return_paths=(), continuation=""))
            parts = []
            while True:
                c = await conn.receive()
                assert isinstance(c, ReplyChunk)
                parts.append(c.text)
                if c.done:
                    break
            if i >= 3:
                direct_t.append(time.perf_counter() - t0)
            assert "".join(parts) == PROMPT_4K
        nursery.cancel_scope.cancel()
    return overlay_vs_direct("e2e_4KiB", overlay_t, direct_t)


def run(quick: bool) -> tuple[dict[str, Any], dict[str, float]]:
    n_relays = 12
    build_trials, cold_trials = (20, 5) if quick else (300, 30)
    cells = 5_000 if quick else 100_000
    e2e_trials = 10 if quick else 200
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="gentorrent-bench-overlay-") as d:
        with LocalNet(Path(d), n_relays, users=("client",), registry_keys=1,
                      model_args=("--accept-direct-requests",)) as net:  # the direct baseline
            net.start()
            client = net.identities["client"]
            figures.update(run_async(_path_builds, net, client, build_trials, cold_trials))
            figures.update(run_async(_e2e, net, client, e2e_trials))
    with tempfile.TemporaryDirectory(prefix="gentorrent-bench-relay-") as d:
        with LocalNet(Path(d), 1, users=("sink",), models=0, registry_keys=1) as net:
            net.start()
            figures.update(run_async(_relay_capacity, net, net.identities["sink"], cells))
    params = {
        "relays": n_relays, "path_build_trials": build_trials, "path_build_cold_trials": cold_trials,
        "relay_cells": cells, "cell_bytes": 1024, "e2e_trials": e2e_trials, "n": 4, "k": 3, "hops": 3,
        "prompt_bytes": 4096, "reply_bytes": 4096, "transport": "TLS 1.3 over loopback TCP",
    }
    return params, figures
