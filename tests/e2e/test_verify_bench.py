"""The scoring methods of ``gentorrent bench verify`` (verifier/bench/verify.py) on the real
engine: on a batch-invariant engine, Algorithm 3 through the engine API and the raw token loop
compute exactly what one pass computes, token for token, and Algorithm 3 through llama-cpp-python's
completion API finds the same log-probabilities (float32) for the tokens in its top list, so the
bench compares equal work."""

from __future__ import annotations

import math

import pytest

from overlay.wire.messages import ChatMessage, SamplingParams

pytestmark = pytest.mark.slow
pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'gentorrent[llama]')")


@pytest.mark.parametrize("temperature", [0.0, 0.7])
async def test_methods_agree_token_for_token(temperature: float) -> None:
    from model_node.llama import LlamaCppEngine, resolve_model
    from verifier.bench import verify

    model_id, path = resolve_model(None)
    engine = LlamaCppEngine(path, model_id=model_id, cache_bytes=0, n_threads=1)
    loop = verify.TokenLoop(engine, 1)
    api = verify.CompletionAPI(engine, 1)
    try:
        params = SamplingParams(temperature=temperature, max_tokens=12, seed=7)
        prompt = engine.chat_prompt([ChatMessage("user", "Name three colours.")])
        reply = [t async for piece in engine.generate(prompt, params) for t in piece.token_ids]
        assert len(reply) >= 2
        one = await verify.one_pass(engine, prompt, reply, params)
        alg3 = await verify.algorithm3_engine(engine, prompt, reply, params)
        tight = loop.score(prompt, reply, params)
        assert [s.token_id for s in one] == reply
        assert alg3 == one
        assert tight == one
        found, inv_ppl = api.score(prompt, reply, params)
        assert len(found) == len(reply)
        if temperature == 0.0:  # a greedy reply's every token tops the list
            assert None not in found
        assert sum(x is not None for x in found) >= len(reply) // 2
        for x, s in zip(found, one, strict=True):
            if x is not None:
                assert x == pytest.approx(s.logprob, abs=1e-3)
        if None not in found:
            assert inv_ppl == pytest.approx(math.exp(sum(s.logprob for s in one) / len(one)), rel=1e-3)
        # Another reply than the one scored: the methods still agree, and the scores differ.
        other = list(reversed(reply))
        assert await verify.algorithm3_engine(engine, prompt, other, params) == loop.score(prompt, other, params)
        assert loop.score(prompt, other, params) != one
        api.forget()
        assert api.score(prompt, other, params)[0] != found
    finally:
        api.close()
        loop.close()
        engine.close()
