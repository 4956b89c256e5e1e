"""The vLLM adapter against a fake ``vllm`` module that mirrors the 0.33 calls it makes
(``tests/unit/fake_vllm.py``), injected as ``VllmEngine(..., vllm_module=fake_vllm)``."""

from __future__ import annotations

import importlib.util
import math
import threading
from collections.abc import Iterator
from contextlib import aclosing

import pytest
import trio

from model_node.engine import EndsReplies, Engine, EngineError, expected_logprob
from model_node.vllm import SCORE_TOP_LOGPROBS, VllmEngine
from overlay.testing import wait_until
from overlay.wire.messages import ChatMessage, SamplingParams

from . import fake_vllm

GREEDY = SamplingParams(temperature=0.0, max_tokens=64)


@pytest.fixture
def engine() -> Iterator[VllmEngine]:
    fake_vllm.instances.clear()
    eng = VllmEngine("fake/model", n_ctx=256, vllm_module=fake_vllm)
    yield eng
    eng.close()


def fake() -> fake_vllm.FakeAsyncLLM:
    return fake_vllm.instances[-1]


async def run(engine: VllmEngine, prompt: list[int], params: SamplingParams = GREEDY):
    gen = engine.generate(prompt, params)
    pieces = [p async for p in gen]
    return pieces, gen.stats


def greedy_reference(prompt: list[int], max_tokens: int) -> list[int]:
    ctx = list(prompt)
    out: list[int] = []
    while len(out) < max_tokens:
        lps = fake_vllm.logprobs_after(ctx)
        tok = max(range(fake_vllm.VOCAB), key=lambda i: (lps[i], -i))
        ctx.append(tok)
        out.append(tok)
        if tok == fake_vllm.EOS:
            break
    return out


def test_engine_is_built_with_prefix_caching_on_its_asyncio_loop(engine: VllmEngine) -> None:
    assert isinstance(engine, Engine)
    assert engine.name == "vllm" and engine.model == "fake/model" and engine.context_window == 256
    f = fake()
    assert f.created_on_loop
    assert f.args.model == "fake/model" and f.args.enable_prefix_caching is True
    assert f.args.max_logprobs == SCORE_TOP_LOGPROBS and f.args.max_model_len == 256


def test_engine_kwargs_reach_async_engine_args() -> None:
    eng = VllmEngine("m", engine_kwargs={"gpu_memory_utilization": 0.5}, vllm_module=fake_vllm)
    try:
        assert fake().args.gpu_memory_utilization == 0.5
        assert eng.context_window == 512  # the model's own length when n_ctx is not given
    finally:
        eng.close()
    with pytest.raises(EngineError, match="vLLM rejected the engine arguments"):
        VllmEngine("m", engine_kwargs={"no_such_field": 1}, vllm_module=fake_vllm)


def test_chat_prompt_uses_the_tokenizer_template_without_extra_specials(engine: VllmEngine) -> None:
    msgs = [ChatMessage("system", "be brief"), ChatMessage("user", "hi")]
    ids = engine.chat_prompt(msgs)
    tok = fake_vllm.FakeTokenizer()
    text = "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert ids == tok.encode(text)
    assert engine.chat_prompt(msgs, continuation="Hel") == ids + tok.encode("Hel")
    assert engine.detokenize(ids) == text.replace("<|im_start|>", "").replace("<|im_end|>", "")


async def test_generate_streams_deltas_and_reports_stats(engine: VllmEngine) -> None:
    prompt = engine.chat_prompt([ChatMessage("user", "hello there")])
    pieces, stats = await run(engine, prompt)
    ids = [t for p in pieces for t in p.token_ids]
    assert ids == greedy_reference(prompt, 64)
    assert ids[-1] == fake_vllm.EOS  # the stop token is part of the output ids (signed, scored)
    assert isinstance(engine, EndsReplies) and engine.end_token() == fake_vllm.EOS and engine.is_end(ids[-1])
    assert not engine.is_end(ids[0])
    assert len(pieces) == len(ids)  # streamed one delta at a time
    assert "".join(p.text for p in pieces) == engine.detokenize(ids)
    assert stats is not None and stats.finish_reason == "stop" and stats.output_tokens == len(ids)
    assert stats.prompt_tokens == len(prompt) and stats.evaluated_prompt_tokens == len(prompt)
    _rid, vprompt, sp, thread = fake().requests[-1]
    assert vprompt == {"prompt_token_ids": prompt}
    assert sp.output_kind is fake_vllm.RequestOutputKind.DELTA and sp.temperature == 0.0 and sp.max_tokens == 64
    assert thread == "gentorrent-vllm-asyncio" and thread != threading.current_thread().name


async def test_sampling_params_are_passed_through(engine: VllmEngine) -> None:
    prompt = engine.chat_prompt([ChatMessage("user", "x")])
    params = SamplingParams(temperature=0.8, top_p=0.9, top_k=40, max_tokens=3, seed=7)
    a, stats = await run(engine, prompt, params)
    b, _ = await run(engine, prompt, params)
    assert [p.token_ids for p in a] == [p.token_ids for p in b]  # same seed, same tokens
    sp = fake().requests[-1][2]
    assert (sp.temperature, sp.top_p, sp.top_k, sp.seed, sp.max_tokens) == (0.8, 0.9, 40, 7, 3)
    assert stats is not None and stats.output_tokens <= 3


async def test_length_finish(engine: VllmEngine) -> None:
    prompt = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]  # the toy model stops at length 17: 4 tokens fit
    _, stats = await run(engine, prompt, SamplingParams(temperature=0.0, max_tokens=3))
    assert stats is not None and stats.finish_reason == "length" and stats.output_tokens == 3


async def test_shared_prefix_is_not_evaluated_again(engine: VllmEngine) -> None:
    system = ChatMessage("system", "You are a careful assistant. " * 4)
    p1 = engine.chat_prompt([system, ChatMessage("user", "first question")])
    p2 = engine.chat_prompt([system, ChatMessage("user", "second question")])
    await run(engine, p1)
    _, stats = await run(engine, p2)
    shared = next(i for i, (a, b) in enumerate(zip(p1, p2, strict=False)) if a != b)
    cached = shared // fake_vllm.BLOCK * fake_vllm.BLOCK
    assert cached > 0
    assert stats is not None and stats.evaluated_prompt_tokens == len(p2) - cached
    assert engine.cached_prefixes() == []  # no KV events from this vLLM: nothing is claimed (no guess)


async def test_score_of_a_greedy_reply_is_its_argmax(engine: VllmEngine) -> None:
    prompt = engine.chat_prompt([ChatMessage("user", "score me")])
    pieces, _ = await run(engine, prompt)
    reply = [t for p in pieces for t in p.token_ids]
    scores = await engine.score(prompt, reply, SamplingParams(temperature=0.0))
    assert [s.token_id for s in scores] == reply
    for s in scores:
        assert s.argmax == s.token_id and s.logprob == s.expected_logprob
    sp = fake().requests[-1][2]
    assert sp.prompt_logprobs == SCORE_TOP_LOGPROBS and sp.max_tokens == 1
    assert sp.output_kind is fake_vllm.RequestOutputKind.FINAL_ONLY


async def test_score_expectation_over_the_vocabulary(engine: VllmEngine) -> None:
    prompt = engine.chat_prompt([ChatMessage("user", "sampled")])
    reply = [3 + ord(c) for c in "abc"]
    params = SamplingParams(temperature=0.7, top_p=0.9, top_k=10)
    scores = await engine.score(prompt, reply, params)
    ctx = list(prompt)
    for s, tok in zip(scores, reply, strict=True):
        lps = fake_vllm.logprobs_after(ctx)
        order = sorted(range(fake_vllm.VOCAB), key=lambda t: (-lps[t], t))[:10]  # whole vocabulary, then top_k
        w = [math.exp(lps[t] / 0.7) for t in order]
        total, acc, keep = sum(w), 0.0, 0
        for x in w:
            acc += x / total
            keep += 1
            if acc >= 0.9:
                break
        want = sum(x * lps[t] for x, t in zip(w[:keep], order[:keep], strict=True)) / sum(w[:keep])
        assert s.logprob == pytest.approx(lps[tok])
        assert s.expected_logprob == pytest.approx(want)
        assert s.argmax == order[0]
        ctx.append(tok)


def test_expected_logprob_over_top_alternatives_greedy_and_cuts() -> None:
    top = [-2.5, -0.1, -4.0]  # vLLM reports alternatives in no particular order
    assert expected_logprob(top, SamplingParams(temperature=0.0)) == -0.1
    assert expected_logprob(top, SamplingParams(temperature=1.0, top_k=1)) == -0.1
    full = expected_logprob(top, SamplingParams(temperature=1.0))
    assert -4.0 < full < -0.1
    assert math.isnan(expected_logprob([], SamplingParams(temperature=1.0)))


async def test_closing_a_generation_early_aborts_the_vllm_request(engine: VllmEngine) -> None:
    fake().step_delay = 0.01
    prompt = engine.chat_prompt([ChatMessage("user", "a long one")])
    gen = engine.generate(prompt, SamplingParams(temperature=0.0, max_tokens=200))
    async with aclosing(gen.__aiter__()) as pieces:  # as ModelNode does
        async for _piece in pieces:
            break
    rid = fake().requests[-1][0]
    with trio.fail_after(5):
        await wait_until(lambda: rid in fake().aborted)


async def test_cancelled_scoring_aborts_too(engine: VllmEngine) -> None:
    fake().step_delay = 0.5
    prompt = engine.chat_prompt([ChatMessage("user", "slow")])
    with trio.move_on_after(0.1):
        await engine.score(prompt, [5, 6], SamplingParams())
    with trio.fail_after(5):
        await wait_until(lambda: fake().aborted)


def test_prompt_beyond_the_context_window(engine: VllmEngine) -> None:
    with pytest.raises(EngineError, match="context window of 256"):
        engine.generate(list(range(3, 259)), GREEDY)
    with pytest.raises(EngineError, match="empty prompt"):
        engine.generate([], GREEDY)


async def test_vllm_errors_become_engine_errors(engine: VllmEngine) -> None:
    fake().model_config.max_model_len = 8  # the fake rejects what the adapter let through
    with pytest.raises(EngineError, match="vLLM failed"):
        await run(engine, [5, 6, 7, 8, 9, 10, 11, 12, 13, 14], SamplingParams(max_tokens=1))


def test_close_stops_the_asyncio_thread() -> None:
    eng = VllmEngine("m", vllm_module=fake_vllm)
    f = fake()
    eng.close()
    assert f.shut_down and not eng._bridge.thread.is_alive()
    eng.close()  # idempotent


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_missing_vllm_says_how_to_install() -> None:
    with pytest.raises(EngineError, match="make setup-vllm"):
        VllmEngine("m")
