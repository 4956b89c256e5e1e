"""Scoring many replies in one batch (``LlamaCppEngine.score_batch``) with the real default model:
the same numbers as one ``score`` call per reply, whatever the batch and the engine's sequences."""

from __future__ import annotations

from contextlib import aclosing
from typing import Any

import pytest

from model_node.engine import EngineError
from overlay.wire.messages import ChatMessage, SamplingParams

pytestmark = pytest.mark.slow

llama = pytest.importorskip("model_node.llama")
pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'gentorrent[llama]')")

QUESTIONS = ("What is a volcano?", "Name three birds.", "Why is the sky blue?", "Give me a tip about sleep.",
             "What is compound interest?")
PARAMS = (SamplingParams(temperature=0.0, max_tokens=40), SamplingParams(temperature=0.7, max_tokens=40, seed=3),
          SamplingParams(temperature=1.0, top_p=0.9, max_tokens=40, seed=4))


async def _reply(engine: Any, prompt: list[int], params: SamplingParams) -> list[int]:
    ids: list[int] = []
    async with aclosing(engine.generate(prompt, params).__aiter__()) as pieces:
        async for piece in pieces:
            ids += piece.token_ids
    return ids


async def test_a_batch_scores_exactly_as_one_reply_at_a_time() -> None:
    try:
        model_id, path = llama.resolve_model(None)
    except EngineError as exc:
        pytest.skip(str(exc))
    single = llama.LlamaCppEngine(path, model_id=model_id, n_ctx=1024, slots=1, n_threads=1)
    batched = llama.LlamaCppEngine(path, model_id=model_id, n_ctx=1024, slots=3, n_threads=2)
    try:
        items = []
        for i, q in enumerate(QUESTIONS):
            prompt = single.chat_prompt([ChatMessage("user", q)])
            params = PARAMS[i % len(PARAMS)]
            items.append((prompt, await _reply(single, prompt, params), params))
        items.append((items[0][0], [], PARAMS[0]))  # an empty continuation scores as nothing
        one_by_one = [await single.score(p, c, params) for p, c, params in items]
        together = await batched.score_batch(items)  # 6 jobs on 3 sequences: two groups
        assert together == one_by_one
        assert [len(s) for s in together] == [len(c) for _, c, _ in items]
        assert together[-1] == [] and all(together[:-1])
        again = await batched.score_batch(list(reversed(items)))  # now with cached prefixes
        assert again == list(reversed(one_by_one))
    finally:
        single.close()
        batched.close()
