"""The real vLLM engine (the CPU build here) on SmolLM2-135M-Instruct converted from the GGUF the
llama.cpp engine serves: one engine start for the module (~35 s), small requests.

Needs ``make setup-vllm``; skipped without vLLM unless ``GENTORRENT_REQUIRE_VLLM=1`` (CI)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator

import pytest
import trio

from model_node.engine import EngineError, GenStats, Piece
from overlay.testing import wait_until
from overlay.wire.messages import ChatMessage, SamplingParams

if importlib.util.find_spec("vllm") is None and not os.environ.get("GENTORRENT_REQUIRE_VLLM"):
    pytest.skip("vLLM is not installed (make setup-vllm)", allow_module_level=True)

from model_node import convert
from model_node.vllm import VllmEngine, resolve_vllm_model

# vLLM, torch and transformers warn about their own internals at import (not ours to fix)
THIRD_PARTY = r"(torch|vllm|transformers)(\.|$)"
pytestmark = [pytest.mark.vllm, pytest.mark.slow,
              *(pytest.mark.filterwarnings(f"ignore::{w}:{THIRD_PARTY}")
                for w in ("DeprecationWarning", "FutureWarning", "UserWarning")),
              # vLLM 0.32's client leaves a ZMQ context for the garbage collector (VllmEngine.close)
              pytest.mark.filterwarnings("ignore:Unclosed context:ResourceWarning")]

CONTEXT = 1024
BLOCKS = 48  # KV blocks of 32 tokens (1,536 tokens): a few long prompts evict older ones
GREEDY = SamplingParams(temperature=0.0, max_tokens=32)
FRANCE = [ChatMessage("system", "You are a helpful assistant."), ChatMessage("user", "What is the capital of France?")]


@pytest.fixture(scope="module")
def engine() -> Iterator[VllmEngine]:
    convert.convert()  # cached: converts only on a machine that has not yet
    mid, source = resolve_vllm_model(None)
    eng = VllmEngine(source, model_id=mid, n_ctx=CONTEXT, engine_kwargs={"num_gpu_blocks_override": BLOCKS})
    yield eng
    eng.close()


async def collect(engine: VllmEngine, prompt: list[int], params: SamplingParams = GREEDY
                  ) -> tuple[list[Piece], GenStats]:
    gen = engine.generate(prompt, params)
    pieces = [p async for p in gen]
    assert gen.stats is not None
    return pieces, gen.stats


def ids_of(pieces: list[Piece]) -> list[int]:
    return [t for p in pieces for t in p.token_ids]


async def test_generates_and_streams_a_correct_reply(engine: VllmEngine) -> None:
    assert engine.model == "smollm2-135m-instruct" and engine.context_window == CONTEXT
    prompt = engine.chat_prompt(FRANCE)
    pieces, stats = await collect(engine, prompt)
    text = "".join(p.text for p in pieces)
    assert "Paris" in text
    assert len(pieces) > 1  # streamed, not one final blob
    ids = ids_of(pieces)
    assert stats.finish_reason == "stop" and stats.output_tokens == len(ids) and stats.prompt_tokens == len(prompt)
    assert engine.detokenize(ids[-1:]) == ""  # ends with the end-of-turn token, which is part of the ids
    assert engine.detokenize(ids) == text
    assert 0 < stats.ttft_s


async def test_an_honest_reply_ends_with_a_token_the_verifiers_engine_takes_as_its_end(engine: VllmEngine) -> None:
    """Decision 0026: a verifier (llama.cpp, the GGUF this checkpoint was converted from) scores
    its model's end token after a reply that stops short of ``max_tokens`` without one. A vLLM
    node's honest replies that end by themselves must carry an end that engine takes as one, or
    each would be scored with a token it did not send. Fails if vLLM leaves its stop token out of
    the stream, or stops on a token the verifier's engine does not end on."""
    from model_node.llama import LlamaCppEngine, resolve_model
    from verifier.audit.loop import missing_end

    prompt = engine.chat_prompt(FRANCE)
    mid, path = resolve_model(None)
    verifier = LlamaCppEngine(path, model_id=mid, n_threads=1, slots=1, n_ctx=CONTEXT)
    try:
        assert verifier.chat_prompt(FRANCE) == prompt  # both engines see the same prompt tokens
        assert verifier.end_token() == engine.end_token() is not None
        ended = 0
        for seed in range(4):  # sampled as users' requests are by default (temperature 0.7)
            params = SamplingParams(temperature=0.7, max_tokens=128, seed=seed)
            pieces, stats = await collect(engine, prompt, params)
            ids = ids_of(pieces)
            if stats.finish_reason != "stop":
                continue
            ended += 1
            assert engine.is_end(ids[-1]) and verifier.is_end(ids[-1])
            assert missing_end(verifier, len(prompt), ids, params.max_tokens) is None
        assert ended >= 2  # short answers to a short question: most end by themselves
    finally:
        verifier.close()


async def test_max_tokens_ends_with_length(engine: VllmEngine) -> None:
    _, stats = await collect(engine, engine.chat_prompt(FRANCE), SamplingParams(temperature=0.0, max_tokens=3))
    assert (stats.finish_reason, stats.output_tokens) == ("length", 3)


async def test_seeds_reproduce_replies(engine: VllmEngine) -> None:
    prompt = engine.chat_prompt([ChatMessage("user", "Write a short poem about the sea.")])

    def params(seed: int) -> SamplingParams:
        return SamplingParams(temperature=1.0, top_p=0.95, max_tokens=24, seed=seed)

    a, b, c = [ids_of((await collect(engine, prompt, params(s)))[0]) for s in (7, 7, 8)]
    assert a == b and a != c


async def test_concurrent_requests_get_their_own_replies(engine: VllmEngine) -> None:
    prompts = [engine.chat_prompt([ChatMessage("user", f"Count from {n} to {n + 5}.")]) for n in (1, 20, 300)]
    alone = [ids_of((await collect(engine, p))[0]) for p in prompts]
    together: dict[int, list[int]] = {}

    async def one(i: int) -> None:
        together[i] = ids_of((await collect(engine, prompts[i]))[0])

    async with trio.open_nursery() as nursery:
        for i in range(len(prompts)):
            nursery.start_soon(one, i)
    # greedy: a batch may change the last bits of the logits, so compare the first tokens only
    assert [together[i][:8] for i in range(3)] == [a[:8] for a in alone]


async def test_leaving_a_stream_aborts_the_request(engine: VllmEngine) -> None:
    gen = engine.generate(engine.chat_prompt([ChatMessage("user", "Tell me a very long story.")]),
                          SamplingParams(temperature=0.8, max_tokens=900, seed=1))
    got = 0
    async with contextlib.aclosing(gen.__aiter__()) as pieces:  # as the model node leaves a stream
        async for _piece in pieces:
            got += 1
            if got == 3:
                break
    assert engine._engine.get_num_unfinished_requests() <= 1
    with trio.fail_after(30):
        await wait_until(lambda: not engine._engine.get_num_unfinished_requests())
    _, stats = await collect(engine, engine.chat_prompt(FRANCE))  # the engine carries on
    assert stats.output_tokens > 0


async def test_prompt_beyond_the_context(engine: VllmEngine) -> None:
    too_long = engine.chat_prompt([ChatMessage("user", "word " * CONTEXT)])
    with pytest.raises(EngineError, match=f"exceeds the context window of {CONTEXT} tokens.*shorten"):
        engine.generate(too_long, GREEDY)
    with pytest.raises(EngineError, match="exceeds the context window"):
        await engine.score(too_long[:CONTEXT - 4], [1, 2, 3, 4], GREEDY)
    edge = too_long[:CONTEXT - 3]
    _, stats = await collect(engine, edge, SamplingParams(temperature=0.0, max_tokens=64))
    assert stats.finish_reason == "length" and stats.output_tokens == 3  # the context filled up


async def test_score_of_a_greedy_reply_finds_the_argmax(engine: VllmEngine) -> None:
    prompt = engine.chat_prompt(FRANCE)
    reply = ids_of((await collect(engine, prompt))[0])
    scores = await engine.score(prompt, reply, SamplingParams(temperature=0.0))
    assert [s.token_id for s in scores] == reply
    assert all(s.argmax == s.token_id for s in scores)
    assert all(abs(s.logprob - s.expected_logprob) < 1e-6 for s in scores)


async def wait_for_prefix(engine: VllmEngine, tokens: list[int], present: bool) -> None:
    """Until a cached prefix starts with ``tokens`` (or none does): events arrive asynchronously."""
    with trio.fail_after(20):
        await wait_until(lambda: any(p[:len(tokens)] == tuple(tokens) for p in engine.cached_prefixes()) == present)


async def test_cached_prefixes_follow_the_kv_cache(engine: VllmEngine) -> None:
    system = ChatMessage("system", "You are the help desk of a small public library. " * 8)
    p1 = engine.chat_prompt([system, ChatMessage("user", "Where are the maps?")])
    p2 = engine.chat_prompt([system, ChatMessage("user", "Is it open on Sunday?")])
    _, s1 = await collect(engine, p1, SamplingParams(temperature=0.0, max_tokens=4))
    whole = len(p1) // 32 * 32  # vLLM caches whole blocks of 32 tokens
    await wait_for_prefix(engine, p1[:whole], True)
    _, s2 = await collect(engine, p2, SamplingParams(temperature=0.0, max_tokens=4))
    shared = next(i for i, (a, b) in enumerate(zip(p1, p2, strict=False)) if a != b)
    assert s1.evaluated_prompt_tokens == len(p1)
    assert s2.evaluated_prompt_tokens == len(p2) - shared // 32 * 32  # vLLM's own cached-token count
    assert engine._engine.vllm_config.cache_config.num_gpu_blocks == BLOCKS
    # other prompts fill the 48 blocks: the least recently used, p1's and p2's, are evicted
    for n in range(3):
        await collect(engine, engine.chat_prompt([ChatMessage("user", f"Essay {n}: " + "tell me more. " * 160)]),
                      SamplingParams(temperature=0.0, max_tokens=1))
    await wait_for_prefix(engine, p1[:32], False)


# Measured on SmolLM2 here (docs/decisions/0012-vllm-cpu.md): calibrated scores 0.008, 0.002 and
# 0.040 apart (greedy, T = 0.7, T = 1.0), mean log-probabilities 0.015, 0.006, 0.011 nats.
TOL_CALIBRATED = 0.06
TOL_MEAN_LOGPROB = 0.05


async def test_scores_agree_with_llama_cpp_on_the_same_model(engine: VllmEngine) -> None:
    """The converted checkpoint is the GGUF's model: the same prompt ids, and one-pass scores of the
    same replies (generated by llama.cpp) agree within the stated tolerances."""
    llama = pytest.importorskip("model_node.llama")
    from verifier.audit.scoring import score_reply

    ref = llama.LlamaCppEngine(llama.resolve_model(None)[1], model_id=llama.DEFAULT_MODEL_ID, n_ctx=CONTEXT)
    try:
        for i, (question, params) in enumerate([
                ("What is the capital of France?", SamplingParams(temperature=0.0, max_tokens=48)),
                ("Give me three tips for learning to cook.", SamplingParams(temperature=0.7, max_tokens=48, seed=3)),
                ("Describe a rainy day in a city.", SamplingParams(temperature=1.0, max_tokens=48, seed=5))]):
            msgs = [ChatMessage("user", question)]
            prompt = ref.chat_prompt(msgs)
            assert engine.chat_prompt(msgs) == prompt, "the converted tokenizer or chat template differs"
            gen = ref.generate(prompt, params)
            reply = [t async for p in gen for t in p.token_ids]
            a = score_reply(await ref.score(prompt, reply, params))
            b = score_reply(await engine.score(prompt, reply, params))
            print(f"\nreply {i} T={params.temperature}: C llama {a.calibrated:.4f} vllm {b.calibrated:.4f}; "
                  f"mean logprob {a.mean_logprob:.4f} / {b.mean_logprob:.4f}; argmax agreement "
                  f"{a.argmax_agreement:.3f} / {b.argmax_agreement:.3f}")
            assert abs(a.calibrated - b.calibrated) <= TOL_CALIBRATED
            assert abs(a.mean_logprob - b.mean_logprob) <= TOL_MEAN_LOGPROB
    finally:
        ref.close()
