"""Several requests at once on one llama.cpp engine (issue 19 item 3; docs/decisions/0011).

Real model (SmolLM2-135M-Instruct). Every assertion is on token ids, text and the order of
events, never on wall-clock time (the machine is shared).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import aclosing
from typing import Any

import pytest
import trio
import trio.lowlevel

from model_node.engine import EngineError, GenStats
from model_node.hrtree import common_prefix
from overlay.wire.messages import ChatMessage, SamplingParams

pytestmark = pytest.mark.slow

llama = pytest.importorskip("model_node.llama")
pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'gentorrent[llama]')")

ANIMALS = ["dragon", "cat", "robot", "king", "ship", "tree", "fox", "moon"]
SYSTEM = "You are the help desk of a small public library. " + " ".join(
    f"Rule {i}: when asked about section {i}, answer politely, briefly and cite the shelf number {100 + i}."
    for i in range(12))


def model() -> tuple[str, Any]:
    try:
        return llama.resolve_model(None)  # type: ignore[no-any-return]
    except EngineError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    model_id, path = model()
    eng = llama.LlamaCppEngine(path, model_id=model_id, n_ctx=1024, slots=8)
    yield eng
    eng.close()


async def generate(eng: Any, prompt: list[int], params: SamplingParams, events: list[tuple[str, Any]] | None = None,
                   name: Any = None, priority: float = 0.0) -> tuple[list[int], str, GenStats]:
    gen = eng.generate(prompt, params, priority)
    ids: list[int] = []
    text = ""
    async with aclosing(gen.__aiter__()) as pieces:
        async for piece in pieces:
            if events is not None:
                events.append(("first" if not ids else "piece", name))
            ids += piece.token_ids
            text += piece.text
    if events is not None:
        events.append(("done", name))
    assert gen.stats is not None
    return ids, text, gen.stats


def story(i: int) -> list[ChatMessage]:
    return [ChatMessage("user", f"Tell me a short story about a {ANIMALS[i % len(ANIMALS)]}.")]


async def test_eight_concurrent_streams_get_the_replies_they_get_alone(engine: Any) -> None:
    prompts = [engine.chat_prompt(story(i)) for i in range(8)]
    params = [SamplingParams(temperature=0.8, top_p=0.95, top_k=40, seed=100 + i, max_tokens=24) for i in range(8)]
    alone = [await generate(engine, p, sp) for p, sp in zip(prompts, params, strict=True)]
    together: dict[int, tuple[list[int], str, GenStats]] = {}
    events: list[tuple[str, Any]] = []

    async def run(i: int) -> None:
        together[i] = await generate(engine, prompts[i], params[i], events, i)

    async with trio.open_nursery() as nursery:
        for i in range(8):
            nursery.start_soon(run, i)
    for i in range(8):
        assert together[i][0] == alone[i][0] and together[i][1] == alone[i][1]  # same seed, same text
        assert together[i][2].output_tokens == len(alone[i][0])
    assert len({tuple(ids) for ids, _, _ in alone}) == 8  # eight different replies
    # they ran at once: several streams had their first token before any stream ended
    first_done = next(k for k, (kind, _) in enumerate(events) if kind == "done")
    assert sum(kind == "first" for kind, _ in events[:first_done]) >= 4
    # and what was generated beside other sequences scores as generated (greedy re-check)
    greedy = SamplingParams(temperature=0.0, max_tokens=16)

    async def greedy_run(i: int) -> None:
        together[i] = await generate(engine, prompts[i], greedy)

    async with trio.open_nursery() as nursery:
        for i in range(4):
            nursery.start_soon(greedy_run, i)
    for i in range(4):
        scores = await engine.score(prompts[i], together[i][0], greedy)
        assert [s.argmax for s in scores] == together[i][0]


async def test_a_newcomer_gets_its_first_token_while_a_long_reply_runs(engine: Any) -> None:
    long_prompt = engine.chat_prompt([ChatMessage("user", "Count from 1 to 300, one number per line.")])
    # the newcomer's prompt needs several prefill chunks
    newcomer = engine.chat_prompt([ChatMessage("system", SYSTEM), ChatMessage("user", "Where is section 7?")])
    assert len(newcomer) > 2 * engine.prefill_chunk
    events: list[tuple[str, Any]] = []
    started = trio.Event()
    result: dict[str, Any] = {}

    async def long_reply() -> None:
        gen = engine.generate(long_prompt, SamplingParams(temperature=0.0, max_tokens=200))
        n = 0
        async for _piece in gen:
            n += 1
            events.append(("long", n))
            if n == 3:
                started.set()
        events.append(("long", "done"))
        result["long"] = gen.stats

    async def new_request() -> None:
        await started.wait()
        events.append(("new", "submitted"))
        result["new"] = await generate(engine, newcomer, SamplingParams(temperature=0.0, max_tokens=4), events, "new")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(long_reply)
        nursery.start_soon(new_request)
    submitted = events.index(("new", "submitted"))
    first = events.index(("first", "new"))
    assert events.index(("long", "done")) > first  # the long reply had not ended
    # the long reply kept streaming between the newcomer's prefill chunks
    assert sum(who == "long" for who, _ in events[submitted:first]) >= 2
    assert result["new"][2].evaluated_prompt_tokens > 2 * engine.prefill_chunk


@pytest.mark.parametrize("priorities, first", [((0.0, 0.0), "long"), ((9.0, 1.0), "short")])
async def test_prompts_are_evaluated_in_priority_order(priorities: tuple[float, float], first: str) -> None:
    """Prompts in prefill are fed lowest priority first, ties first come first served: with equal
    priorities a cold prompt of many chunks submitted just before a short question gets its
    first token first; with a lower priority the question overtakes it (what the model node's
    admission asks for a mostly cached prompt). A fresh engine with 8-token prompt chunks: the
    question needs more than one step alone, so it can never finish in the step that ends the
    long prompt (whose first tokens would then come in sequence order, not in priority order)."""
    model_id, path = model()
    engine = llama.LlamaCppEngine(path, model_id=model_id, n_ctx=1024, slots=2, prefill_chunk=8, cache_bytes=0)
    try:
        long_prompt = engine.chat_prompt([ChatMessage("system", "Ticket 4242. " + SYSTEM),
                                          ChatMessage("user", "Where is section 3?")])
        short_prompt = engine.chat_prompt([ChatMessage("user", "Hi! I am visitor 4242.")])
        assert len(long_prompt) > 8 * len(short_prompt) and len(short_prompt) > engine.prefill_chunk
        events: list[tuple[str, Any]] = []
        params = SamplingParams(temperature=0.0, max_tokens=2)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(generate, engine, long_prompt, params, events, "long", priorities[0])
            await trio.sleep(0.05)  # the long prompt is submitted first (trio may run new tasks in any order)
            nursery.start_soon(generate, engine, short_prompt, params, events, "short", priorities[1])
    finally:
        engine.close()
    later = "short" if first == "long" else "long"
    assert events.index(("first", first)) < events.index(("first", later)), events


async def test_cancelling_one_of_several_leaves_the_others_alone(engine: Any) -> None:
    prompts = [engine.chat_prompt(story(i)) for i in range(3)]
    params = SamplingParams(temperature=0.7, seed=7, max_tokens=20)
    alone = [await generate(engine, p, params) for p in prompts]
    got: dict[int, Any] = {}
    cancelled_after: list[int] = []

    async def run(i: int) -> None:
        got[i] = await generate(engine, prompts[i], params)

    async def cancelled() -> None:
        with trio.CancelScope() as scope:
            gen = engine.generate(prompts[1], params)
            async with aclosing(gen.__aiter__()) as pieces:
                async for piece in pieces:
                    cancelled_after.append(len(piece.token_ids))
                    if len(cancelled_after) == 2:
                        scope.cancel()
                        await trio.lowlevel.checkpoint()  # the cancellation is delivered here
        assert scope.cancelled_caught

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run, 0)
        nursery.start_soon(cancelled)
        nursery.start_soon(run, 2)
    assert got[0][1] == alone[0][1] and got[2][1] == alone[2][1]
    assert len(cancelled_after) == 2
    _ids, text, _ = await generate(engine, prompts[1], params)  # served again, from a free sequence
    assert text == alone[1][1]
    assert all(s.user is None for s in engine._kv_cache.slots) and not engine._worker.active and not engine._worker.waiting


async def test_a_cached_system_prompt_is_reused_by_another_sequence(engine: Any) -> None:
    p1 = engine.chat_prompt([ChatMessage("system", SYSTEM), ChatMessage("user", "Where is section 3?")])
    p2 = engine.chat_prompt([ChatMessage("system", SYSTEM), ChatMessage("user", "Which shelf holds section 9?")])
    shared = common_prefix(p1, p2)
    assert shared > 250 and len(p2) - shared < 20
    events: list[tuple[str, Any]] = []
    got: dict[str, Any] = {}
    first_out = trio.Event()

    async def one() -> None:
        gen = engine.generate(p1, SamplingParams(temperature=0.0, max_tokens=40))
        async for _ in gen:
            first_out.set()
        got["one"] = gen.stats

    async def two() -> None:
        await first_out.wait()  # p1's sequence holds the system prompt and is still running
        got["two"] = await generate(engine, p2, SamplingParams(temperature=0.0, max_tokens=8), events, "two")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one)
        nursery.start_soon(two)
    assert got["two"][2].evaluated_prompt_tokens == len(p2) - shared  # only the new question
    held = engine.cached_prefixes()
    assert sum(common_prefix(list(p), p1) >= shared for p in held) >= 2  # both sequences hold it


async def test_an_evicted_prefix_disappears_from_cached_prefixes() -> None:
    model_id, path = model()
    eng = llama.LlamaCppEngine(path, model_id=model_id, n_ctx=512, slots=2, max_snapshots=0)
    try:
        def ask(topic: str) -> list[int]:
            ids: list[int] = eng.chat_prompt([ChatMessage("system", f"You only talk about {topic}. " * 20),
                                              ChatMessage("user", "Hello!")])
            return ids

        def holds(prompt: list[int]) -> bool:
            return any(common_prefix(list(p), prompt) >= len(prompt) - 1 for p in eng.cached_prefixes())

        greedy = SamplingParams(temperature=0.0, max_tokens=4)
        a, b, c = ask("apples"), ask("boats"), ask("clocks")
        await generate(eng, a, greedy)
        await generate(eng, b, greedy)  # the other (empty) sequence
        assert holds(a) and holds(b) and not holds(c)
        await generate(eng, c, greedy)  # evicts the least recently used: apples
        assert not holds(a) and holds(b) and holds(c)
        _, _, again = await generate(eng, b, greedy)
        assert again.evaluated_prompt_tokens == 1
    finally:
        eng.close()


def test_bad_engine_settings_are_refused() -> None:
    model_id, path = model()
    with pytest.raises(EngineError, match="slots must be between 1 and 256"):
        llama.LlamaCppEngine(path, model_id=model_id, slots=0)
    with pytest.raises(EngineError, match="prefill_chunk"):
        llama.LlamaCppEngine(path, model_id=model_id, prefill_chunk=0)


async def test_a_closed_engine_says_so() -> None:
    model_id, path = model()
    eng = llama.LlamaCppEngine(path, model_id=model_id, n_ctx=512)
    eng.close()
    with pytest.raises(EngineError, match="closed"):
        await generate(eng, [1, 2, 3], SamplingParams(temperature=0.0, max_tokens=2))
