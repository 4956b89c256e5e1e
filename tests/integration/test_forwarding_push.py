"""Issue 29 through the driver, in memory on trio's mock clock: a model node pushes its load to
the group when it changes (between rounds), and announces the prompts it took before their
prefill is done (docs/simulations.md, "Against an oracle")."""

from __future__ import annotations

from typing import Any

import trio

from model_node.group import MAX_IDLE_MS
from model_node.server import ModelNode, _Work
from model_node.testing import start_group
from overlay.wire.messages import ChatMessage, ReplyChunk, SamplingParams

SYNC = 5.0  # long rounds: what a peer learns between two of them came pushed
SYSTEM = "You answer questions about the city archive. " + " ".join(
    f"Box {i} holds the letters of year {1900 + i}." for i in range(22))


def nid(m: ModelNode) -> bytes:
    return m.identity.node_id


async def ask(client: Any, question: str, node: ModelNode) -> list[ReplyChunk]:
    return [c async for c in client.request("echo", [ChatMessage("system", SYSTEM), ChatMessage("user", question)],
                                            SamplingParams(max_tokens=64), node=nid(node))]


async def test_a_request_taken_is_pushed_to_the_group_before_the_next_round(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_group(nursery, delays=(0.0, 1.0, 0.0), sync=SYNC)
        a, b, c = net.models
        assert a.group is not None and b.group is not None
        await trio.sleep(SYNC / 2)  # between rounds (at 0, 5, 10 ... s)
        seen = a.group.state.table()[nid(b)]
        assert (seen.active, seen.queued, seen.idle_ms) == (0, 0, MAX_IDLE_MS)  # never held work
        done: list[list[ReplyChunk]] = []
        answered = trio.Event()

        async def slow() -> None:  # ten pieces, a second each, served at B (all idle: the entry keeps it)
            done.append(await ask(net.users[1].client, " ".join(f"w{i}" for i in range(10)), b))
            answered.set()

        rounds = b.group.rounds
        nursery.start_soon(slow)
        await trio.sleep(0.5)
        assert b.group.rounds == rounds  # no round since: A learned it from a pushed report
        seen = a.group.state.table()[nid(b)]
        assert seen.active + seen.queued == 1 and seen.idle_ms == -1 and b.group.pushes >= 1
        with trio.fail_after(60):
            await answered.wait()
        assert done[0][-1].node == nid(b) and not done[0][-1].error
        rounds, pushes = b.group.rounds, b.group.pushes
        await trio.sleep(0.3)  # the end pushed (rate limit included)
        assert b.group.rounds == rounds or b.group.pushes > pushes
        seen = a.group.state.table()[nid(b)]
        assert (seen.active, seen.queued, seen.prefill_tokens) == (0, 0, 0) and 0 <= seen.idle_ms < 1000
        assert c.group is not None and c.group.state.table()[nid(b)].idle_ms >= 0
        nursery.cancel_scope.cancel()


async def test_a_queued_prompt_is_announced_until_its_prefill_is_done(autojump_clock):
    """B holds a request it took but has not started (its engine has not seen the prompt): B
    announces the prompt with its cached prefixes, and after a round A's HR-tree finds B for
    it. Once its prefill is done the prompt is no longer announced for it (the engine's
    cache reports what it keeps)."""
    async with trio.open_nursery() as nursery:
        net = await start_group(nursery, sync=SYNC)
        a, b, _ = net.models
        assert a.group is not None and b.group is not None
        prompt = list(range(1000, 1800))  # 800 tokens: 3 chunks of 256 at b = 8, over τ_c = 2
        assert a.group.state.search(prompt).candidates == frozenset()
        work = _Work(len(prompt), 10, 10, prompt=prompt)
        b._work.add(work)
        assert prompt in b.announced_prefixes()
        b.group.round()
        await trio.sleep(0.1)
        found = a.group.state.search(prompt)
        assert found.depth >= a.group.state.tau_c and found.candidates == {nid(b)}
        work.prefill = 0  # its first token came
        assert prompt not in b.announced_prefixes()
        b._work.discard(work)
        b.group.round()
        await trio.sleep(0.1)
        assert a.group.state.search(prompt).candidates == frozenset()
        nursery.cancel_scope.cancel()
