"""Forwarding among real model-node processes running llama.cpp with SmolLM2 (paper §3.3).

Three ``gentorrent model-node --engine llama.cpp`` processes (one group, 0.5 s sync rounds)
behind 12 relay processes; the test runs an in-process ``UserNode`` client, as a user would,
and reads the nodes' counters with ``StatsRequest`` over authenticated TLS. One scenario in
order: a prefix cached on B is forwarded there from A and B evaluates only the new tokens; an
overloaded B is bypassed; a killed B expires from A's tree and its prefix's requests are
served elsewhere.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
import trio

from gentorrent.tools.localnet import LocalNet
from model_node.messages import NodeStats
from model_node.testing import node_stats
from overlay.net.peers import PeerEntry
from overlay.net.transport import Connection, TLSTransport
from overlay.usernode import UserNode
from overlay.wire.identity import Identity
from overlay.wire.messages import ChatMessage, ReplyChunk, Request, SamplingParams

pytestmark = pytest.mark.slow

llama = pytest.importorskip("model_node.llama")
pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'gentorrent[llama]')")

SYNC = 0.5
WAIT_S = 30  # the longest Cluster.wait_for waits for a node's stats to show a change
GREEDY = SamplingParams(temperature=0.0, max_tokens=8)
# A long system prompt (about 650 tokens): 2 whole 256-token chunks, τ_c at b = 8.
SYSTEM = "You are the help desk of a small public library. " + " ".join(
    f"Rule {i}: when asked about section {i}, answer politely, briefly and cite the shelf number {100 + i}."
    for i in range(26)
)


def chat(question: str) -> tuple[ChatMessage, ...]:
    return (ChatMessage("system", SYSTEM), ChatMessage("user", question))


class Cluster:
    def __init__(self, net: LocalNet, client: Identity) -> None:
        self.net, self.client = net, client
        self.a, self.b, self.c = (net.entries[m] for m in net.models)
        self._conns: dict[bytes, Connection] = {}

    async def conn(self, e: PeerEntry) -> Connection:
        c = self._conns.get(e.node_id)
        if c is None or c.closed:
            c = self._conns[e.node_id] = await TLSTransport(self.client).dial(e.address, e.node_id)
        return c

    async def stats(self, e: PeerEntry) -> NodeStats:
        conn = await self.conn(e)
        with trio.fail_after(10):
            return await node_stats(conn)

    async def wait_for(self, e: PeerEntry, ok: Callable[[NodeStats], bool], what: str) -> NodeStats:
        """``e``'s stats once ``ok``: asked again every 0.1 s (the node is another process), for at
        most ``WAIT_S`` seconds; past them, an AssertionError with the last stats seen."""
        last: NodeStats | None = None
        with trio.move_on_after(WAIT_S):
            while True:
                last = await self.stats(e)
                if ok(last):
                    return last
                await trio.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}; last stats: {last}")

    async def aclose(self) -> None:
        for c in self._conns.values():
            await c.aclose()


def peer(s: NodeStats, node_id: bytes) -> Any:
    return next((r for r in s.peers if r.node_id == node_id), None)


async def ask(user: UserNode, question: str, node: PeerEntry) -> list[ReplyChunk]:
    assert user.client is not None
    return [c async for c in user.client.request(llama.DEFAULT_MODEL_ID, chat(question), GREEDY,
                                                 node=node.node_id, chunk_timeout=90)]


async def busy_direct(cluster: Cluster, e: PeerEntry, filler: str, done: trio.Event) -> None:
    """A direct request with a long new user message under SYSTEM: it matches e's cache (so e
    keeps it) and costs e seconds of prefill."""
    conn = await TLSTransport(cluster.client).dial(e.address, e.node_id)
    try:
        await conn.send(Request(request_id=os.urandom(16), model=llama.DEFAULT_MODEL_ID, messages=chat(filler),
                                params=GREEDY, k=1, return_paths=(), continuation=""))
        while not (await conn.receive()).done:
            pass
    except Exception:  # noqa: BLE001 - B is killed under it later
        pass
    finally:
        done.set()
        with trio.CancelScope(shield=True):
            await conn.aclose()


# Serial (run alone, after the rest): step 3 asserts that A forwards to B while B's reported wait for a
# mostly cached prompt stays under A's threshold, which B's measured rates decide; a second test run
# beside it on a 2-core machine slowed B enough that A served the request itself ("match-overloaded").
@pytest.mark.serial
async def test_forwarding_between_llama_model_nodes(tmp_path) -> None:
    # Load threshold 2 s of work (not the default): one long new prompt puts B's relative load over it in
    # step 3. A 60 s wait: B keeps ample slack in the promise it gave that long prompt.
    args = ("--sync-interval", str(SYNC), "--threads", "1", "--prefix-snapshots", "3", "--load-threshold", "2",
            "--max-queue-wait", "60", "--accept-direct-requests")  # the client also sends plain requests
    with LocalNet(tmp_path, 12, users=("client",), models=3, registry_keys=1, engine="llama.cpp",
                  model=llama.DEFAULT_MODEL_ID, model_args=args) as net:
        net.start(timeout=120)
        ident = net.identities["client"]
        cluster = Cluster(net, ident)
        a, b, c = cluster.a, cluster.b, cluster.c
        host, port = net.entries["client"].address.rsplit(":", 1)
        try:
            async with trio.open_nursery() as nursery:
                user = UserNode(ident, TLSTransport(ident), net.registry, build_timeout=5.0)
                await nursery.start(user.serve, host, int(port))
                assert user.paths is not None
                with trio.fail_after(60):
                    await user.paths.wait_ready(4)

                # 1. B serves (and caches) the long system prompt; A learns it from B's subtree.
                first = await ask(user, "Where are the books about section 3?", b)
                assert first[-1].node == b.node_id and not first[-1].error
                # A's view of B may first arrive while B is still busy with step 1 (seconds of work at
                # the reference rates B starts from): wait until A also sees B idle again.
                await cluster.wait_for(a, lambda s: (r := peer(s, b.node_id)) is not None and r.paths >= 1
                                       and r.relative_load < 2.0, "A's tree to hold B's prefix, B not overloaded")

                # 2. The same system prompt arrives at A: forwarded to B, which evaluates only the question.
                chunks = await ask(user, "Which shelf holds section 17?", a)
                assert chunks[-1].node == b.node_id and len(chunks[-1].signature) == 64  # verified by the client
                sa, sb = await cluster.stats(a), await cluster.stats(b)
                assert sa.forwarded_out == 1 and {x.name: x.n for x in sa.decisions}.get("match") == 1
                assert sa.served == 0 and sb.forwarded_in == 1 and sb.served == 2
                last = sb.recent[-1]
                assert last.forwarded and last.prompt_tokens > 600
                assert last.evaluated_prompt_tokens < 30, last  # the ~650-token system prompt came from B's cache

                # 3. B busy with a long new prompt under the same system prompt (some 900 tokens to
                #    evaluate: seconds of work at the rate B measured in step 1, over the 2 s
                #    threshold). Its load report also says a mostly cached prompt would get its first
                #    token in about a second (match_wait: B evaluates it ahead of the long one, whose
                #    promise has slack), so A still forwards the next question to B (decision 0009,
                #    third revision; before it, A served it itself as "match-overloaded").
                done = [trio.Event()]
                for i, ev in enumerate(done):
                    filler = f"Summarize this note {i}: " + " ".join(f"item {i}-{j} is shelved under {j}." for j in range(80))
                    nursery.start_soon(busy_direct, cluster, b, filler, ev)
                await cluster.wait_for(a, lambda s: (r := peer(s, b.node_id)) is not None and r.relative_load >= 2.0,
                                       "A to see B overloaded")
                chunks = await ask(user, "Is section 9 open on Sundays?", a)
                assert chunks[-1].node == b.node_id and not chunks[-1].error
                sa = await cluster.stats(a)
                assert {x.name: x.n for x in sa.decisions}.get("match") == 2 and sa.forwarded_out == 2
                assert "match-overloaded" not in {x.name for x in sa.decisions}

                # 4. B is killed: it expires from A's table and tree; its prefix is served elsewhere.
                net.kill("model-1")
                sa = await cluster.wait_for(a, lambda s: peer(s, b.node_id) is None, "B to expire at A")
                assert sa.expired >= 1 and sa.forward_failed == 0  # it expired: no forward to B was even tried
                chunks = await ask(user, "Where can I find maps?", a)
                assert chunks[-1].node in {a.node_id, c.node_id} and not chunks[-1].error
                assert (await cluster.stats(a)).forward_failed == 0  # B's prefix no longer leads A to B
                for ev in done:
                    with trio.fail_after(30):
                        await ev.wait()
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await cluster.aclose()  # a leaked socket would fail the next test


async def test_a_bounded_snapshot_cache_moves_what_it_restores_into_the_context() -> None:
    """``--prefix-snapshots N``: at most N snapshots besides the context. A snapshot restored for
    a new question under its system prompt moves into the context (the same prefix is never held
    twice), which makes room for the context's state."""
    model_id, path = llama.resolve_model(None)
    eng = llama.LlamaCppEngine(path, model_id=model_id, n_ctx=2048, max_snapshots=1)
    try:
        other = "You are a ship's cook who answers in recipes. " + " ".join(
            f"Recipe {i}: boil {i} potatoes with {i + 2} onions and serve them hot." for i in range(40))

        async def run(system: str, question: str) -> Any:
            gen = eng.generate(eng.chat_prompt([ChatMessage("system", system), ChatMessage("user", question)]),
                               GREEDY)
            async for _ in gen:
                pass
            return gen.stats

        def held() -> list[int]:  # which system prompts the cache holds: 0 SYSTEM, 1 other
            text = [eng.detokenize(p) for p in eng.cached_prefixes()]
            return sorted(0 if SYSTEM in t else 1 for t in text)

        await run(SYSTEM, "Where is section 3?")
        await run(other, "What is for dinner?")  # SYSTEM's state goes to the one snapshot
        assert len(eng._kv_cache.snapshots) == 1 and held() == [0, 1]
        third = await run(SYSTEM, "Where is section 4?")  # restored: it moves, `other` takes its place
        assert third.evaluated_prompt_tokens < 30 and len(eng._kv_cache.snapshots) == 1 and held() == [0, 1]
        fourth = await run(other, "And for lunch?")
        assert fourth.evaluated_prompt_tokens < 30 and len(eng._kv_cache.snapshots) == 1 and held() == [0, 1]
        again = await run(other, "And for breakfast?")  # in place: nothing saved, nothing moved
        assert again.evaluated_prompt_tokens < 30 and held() == [0, 1]
    finally:
        eng.close()
