"""Failover with real processes (issue 15, item 3): a model node killed mid-reply; the reply
completes from another node, each part checked against its own node's signature. And
``gentorrent bench failover --quick`` reports exactly the figures docs/benchmarks.md
documents (no timing asserted: benchmarks are not tests)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import trio

from gentorrent.tools.localnet import LocalNet
from overlay.net.transport import TLSTransport
from overlay.usernode import UserNode
from overlay.wire.messages import ChatMessage, SamplingParams
from tests.conftest import run_cli

pytestmark = pytest.mark.slow


async def test_a_model_node_killed_mid_reply_is_replaced_by_another(tmp_path):
    with LocalNet(tmp_path, 12, users=("client",), models=2, echo_delay=0.02) as net:
        net.start()
        ident = net.identities["client"]
        host, port = net.entries["client"].address.rsplit(":", 1)
        victim, other = (net.entries[m].node_id for m in net.models)
        text = " ".join(f"w{j}" for j in range(300))  # ~6 s of streaming
        async with trio.open_nursery() as nursery:
            user = UserNode(ident, TLSTransport(ident), net.registry, build_timeout=5.0)
            await nursery.start(user.serve, host, int(port))
            assert user.paths is not None and user.client is not None
            with trio.fail_after(30):
                await user.paths.wait_ready(4)
            got = []
            async for c in user.client.request("echo", [ChatMessage("user", text)], SamplingParams(max_tokens=4096),
                                               node=victim, chunk_timeout=30):
                got.append(c)
                if len(got) == 5:
                    net.kill(net.models[0])
            nursery.cancel_scope.cancel()
        assert "".join(c.text for c in got) == text  # nothing lost, nothing repeated
        nodes = [c.node for c in got]
        switch = nodes.index(other)
        assert set(nodes[:switch]) == {victim} and set(nodes[switch:]) == {other}
        # every chunk was checked on arrival against its own node's signature over the chain
        assert all(len(c.signature) == 64 and len(c.chain) == 32 for c in got) and got[-1].done
        # the proxies' model-lost signals moved the reply, not a silence timeout
        assert user.client.failovers == {"lost": 1}


def test_quick_failover_bench_reports_its_figures(helpers: Any):
    done = run_cli("bench", "failover", "--quick", "--json", timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["bench"] == "failover" and out["params"]["model_nodes"] == 3
    figures = out["figures"]
    assert set(figures) == helpers.documented_figures("failover")
    assert all(isinstance(v, int | float) and math.isfinite(v) for v in figures.values())
    assert figures["crash_replies_complete_ratio"] == 1.0  # every reply came back whole
