"""``gentorrent bench verify``: what auditing one challenge reply costs (issue 14, "Benchmark";
paper §3.4, Algorithm 3; decision 0010).

One llama.cpp engine (:class:`~model_node.llama.LlamaCppEngine`, default SmolLM2-135M-Instruct
GGUF, batch-invariant) plays the honest model node: it answers ``replies`` chat questions at the
users' default sampling (temperature 0.7, a fixed seed per question, up to ``reply_tokens``
tokens). The same replies are then scored, in the same run and under the same sampling
parameters, by three methods; each gives every reply token's log-probability and the expected
log-probability the calibrated score needs (:class:`~model_node.engine.TokenScore`), and a
verification ends with :func:`verifier.audit.scoring.score_reply` on them:

- **one pass** (what the verifier does): one :meth:`Engine.score` call per reply, which
  evaluates prompt + reply in one teacher-forced pass and returns logits only for the positions
  that predict a reply token.
- **(a) Algorithm 3 as written** (``algorithm3``): one completion call per reply token over the
  growing context, ``GetCompletionLogprobs(context, max_tokens=1)``, through llama-cpp-python's
  own completion API (:class:`CompletionAPI`: ``Llama.create_completion(context, max_tokens=1,
  logprobs=TOP_LOGPROBS)`` with the challenge's sampling parameters) in a ``Llama`` of its own
  over the same GGUF with the engine's context settings, ``logits_all`` on (the API refuses
  log-probabilities without it). Its prefix cache is on: each call finds the previous call's
  context in place and evaluates one new token. ``FindMatchingProbability`` looks the reply
  token's text up in the returned top list (an OpenAI-style API keys it by text); a token not in
  it gets Algorithm 3's ε (:data:`EPSILON`), as does every token at a position where the call
  drew the end-of-generation token (llama-cpp-python then returns no token and no list). The score is the paper's NormalizedPPL, 1/PPL (the
  top list gives no expected log-probability, so no calibrated score).
- **(a′) Algorithm 3 through the engine API** (``algorithm3_engine``; a lower bound on (a)): the
  same loop with ``Engine.score(context, [next_token])`` for each call, which returns the whole
  vocabulary's log-probabilities (so ε never applies) and has none of a completion API's per-call
  work (drawing the discarded token, sorting the vocabulary, building the top list).
- **(b) tight token-by-token loop**: no per-call work at all. The public engine API has no
  "evaluate one more token" call, so the loop runs on llama.cpp's C API directly, in its own
  context over the same GGUF with the engine's settings (batch-invariant: physical batches of
  32 tokens, one thread for one-token steps, flash attention auto): the prompt in one prefill,
  then per reply token one ``llama_decode`` of one token and the log-probabilities of its
  logits row, the KV cache kept between steps.

Every llama.cpp call runs on one thread (:data:`THREADS`; why there).

All three start cold: the verifier engine keeps no KV snapshots (``cache_bytes=0``) and an
unrelated token sequence is evaluated between methods, so no method finds the prompt cached;
the in-place prefix reuse that (a) relies on stays on. The engine serializes calls, so every
timing is one verification alone on the machine's cores (other processes may share them).

Figures: ``verify_{one_pass,algorithm3,algorithm3_engine,token_loop}_per_min`` (60 s ÷ mean time per
verification), ``verify_{...}_{mean,p50,p99}_ms`` (per reply), the ratios
``verify_one_pass_vs_{algorithm3,algorithm3_engine,token_loop}`` (mean time of the other
method ÷ mean time of one pass), the same on CPU time (``verify_{...}_cpu_mean_ms``, ratios
``..._cpu``: this process's CPU seconds, which other load on the cores inflates far less than
wall time), ``verify_{algorithm3,algorithm3_engine,token_loop}_logprob_max_abs_diff``
(largest difference of a token's log-probability from one pass's, nats, over the tokens a method
found: ≈ 0 when the engine is batch-invariant, which shows every method computed the same thing;
(a) returns float32 values) and ``verify_algorithm3_epsilon_share`` (the share of reply tokens
(a) did not find in its top list).

**Batches** (``LlamaCppEngine.score_batch``): the same replies scored in one call by an engine
with B sequences (``batch4``: B = 4, or every reply when fewer; ``batch_all``: B = every reply; a
fresh engine per round, so every prompt is cold): up to B replies are evaluated side by side in
shared ``llama_decode`` batches. Figures ``verify_{batch4,batch_all}_per_min`` (60 s ÷ the call's
time per reply), ``verify_{...}_vs_token_loop`` and ``verify_{...}_vs_one_pass`` (the other
method's mean time per reply ÷ the batch's), and
``verify_batch_logprob_max_abs_diff`` (against one pass: 0 on a batch-invariant engine). Not
measured here: the committee's EpochReport → applied update time (tests/e2e/test_audits.py runs a
committee with audits).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from typing import Any

from gentorrent.bench.stats import cpu_model, summarize_ms
from gentorrent.cli import run_async
from model_node.engine import TokenScore, logprob_moments
from model_node.llama import INVARIANT_UBATCH, N_BATCH, LlamaCppEngine, resolve_model
from overlay.wire.messages import ChatMessage, SamplingParams
from verifier.audit.scoring import score_reply

QUESTIONS = (
    "Explain photosynthesis to a ten-year-old in two sentences.",
    "What are the main advantages and drawbacks of electric bicycles?",
    "Give me three practical tips about composting at home.",
    "Write a short poem about honey bees.",
    "How would you describe volcanoes to someone who has never heard of them?",
    "What is a common misconception about compound interest?",
    "Explain the water cycle to a ten-year-old in two sentences.",
    "What are the main advantages and drawbacks of remote work?",
    "Give me three practical tips about sleep hygiene.",
    "Write a short poem about public libraries.",
    "How would you describe the printing press to someone who has never heard of it?",
    "What is a common misconception about learning a second language?",
)
TEMPERATURE = 0.7  # the users' default (overlay.wire.messages.SamplingParams)
FLUSH_TEXT = "Unrelated text that shares no prefix with a chat prompt."
# One llama.cpp thread for every call, batches included: the dev machine's 2 cores are shared,
# and with 2 threads a batched pass spends most of its time in ggml's barrier spin-waits whenever
# another process holds a core (measured at load ≈ 6: 2.2–4.1 s CPU per one-pass verification
# against 1.0–1.1 s with one thread), which would favour the one-token methods unfairly.
THREADS = 1
METHODS = ("one_pass", "algorithm3", "algorithm3_engine", "token_loop")
TOP_LOGPROBS = 20  # method (a): the top list's length, the most OpenAI's completion API returns
EPSILON = 1e-5  # method (a): Algorithm 3's ε, the probability of a reply token not in the top list


# --------------------------------------------------------------------------- the three methods


async def one_pass(engine: LlamaCppEngine, prompt: list[int], reply: list[int],
                   params: SamplingParams) -> list[TokenScore]:
    """The verifier's method: one teacher-forced ``Engine.score`` call for the whole reply."""
    return await engine.score(prompt, reply, params)


async def algorithm3_engine(engine: LlamaCppEngine, prompt: list[int], reply: list[int],
                            params: SamplingParams) -> list[TokenScore]:
    """Paper Algorithm 3 through the engine API: per reply token, one call over the growing
    context, ``Engine.score(context, [next_token])`` (module docstring, method (a′))."""
    context = list(prompt)
    out: list[TokenScore] = []
    for tok in reply:
        out += await engine.score(context, [tok], params)
        context.append(tok)
    return out


def normalized_ppl(found: Sequence[float | None]) -> float:
    """Algorithm 3's NormalizedPPL, 1/PPL, of a reply's token log-probabilities as a completion
    API found them (``None``: not in its top list, :data:`EPSILON` used)."""
    logps = [math.log(EPSILON) if x is None else x for x in found]
    return math.exp(sum(logps) / max(1, len(logps)))


class CompletionAPI:
    """Method (a): paper Algorithm 3 as written, through llama-cpp-python's completion API in a
    ``Llama`` of its own on ``engine``'s GGUF with the engine's context settings (module
    docstring). :meth:`close` frees it."""

    def __init__(self, engine: LlamaCppEngine, threads: int) -> None:
        from llama_cpp import Llama

        from model_node.llama import model_params_for_this_host

        with model_params_for_this_host():  # the engine's own choice of buffer types (AMX hosts)
            self.llm = Llama(str(engine.model_path), n_ctx=engine.context_window, n_batch=N_BATCH,
                             n_ubatch=INVARIANT_UBATCH if engine.batch_invariant else N_BATCH,
                             n_threads=1 if engine.batch_invariant else threads, n_threads_batch=threads,
                             flash_attn=True, logits_all=True, verbose=False)

    def close(self) -> None:
        self.llm.close()

    def forget(self) -> None:
        """Drop the evaluated context, so the next call starts cold (untimed, between methods)."""
        self.llm.reset()  # type: ignore[no-untyped-call]

    def score(self, prompt: list[int], reply: list[int], params: SamplingParams) -> tuple[list[float | None], float]:
        """Algorithm 3: per reply token one ``create_completion(context, max_tokens=1)``, the
        token's log-probability looked up by text in the returned top list (``None``: not found,
        ε used); returns those and NormalizedPPL (1/PPL). Blocking (run it in a worker thread)."""
        context = list(prompt)
        found: list[float | None] = []
        for tok in reply:
            out: Any = self.llm.create_completion(
                context, max_tokens=1, logprobs=TOP_LOGPROBS, temperature=params.temperature, top_p=params.top_p,
                top_k=params.top_k, min_p=0.0, repeat_penalty=1.0, seed=params.seed)
            # no list when the call drew the end-of-generation token (the API returns no token then)
            tops = out["choices"][0]["logprobs"]["top_logprobs"]
            logp = None if not tops else tops[0].get(self.llm.detokenize([tok]).decode("utf-8", errors="ignore"))
            found.append(None if logp is None else float(logp))
            context.append(tok)
        return found, normalized_ppl(found)


class TokenLoop:
    """Method (b): a llama.cpp context of its own on ``engine``'s GGUF, with the engine's
    context settings, that scores a reply one token per ``llama_decode`` (module docstring).
    Create it after the engine (which initialises llama.cpp's backend and logging);
    :meth:`close` frees it."""

    def __init__(self, engine: LlamaCppEngine, threads: int) -> None:
        import llama_cpp as L

        self._L = L
        from model_node.llama import model_params

        self._model = L.llama_model_load_from_file(str(engine.model_path).encode(), model_params(L))
        if not self._model:
            raise RuntimeError(f"llama.cpp could not load {engine.model_path}")
        self.n_vocab = int(L.llama_vocab_n_tokens(L.llama_model_get_vocab(self._model)))
        cparams = L.llama_context_default_params()
        cparams.n_ctx = engine.context_window
        cparams.n_batch = N_BATCH
        cparams.n_ubatch = INVARIANT_UBATCH if engine.batch_invariant else N_BATCH
        cparams.n_seq_max = 1
        cparams.n_threads = 1 if engine.batch_invariant else threads
        cparams.n_threads_batch = threads
        cparams.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_AUTO
        self._ctx = L.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            L.llama_model_free(self._model)
            raise RuntimeError("llama.cpp could not create the token loop's context")
        self._mem = L.llama_get_memory(self._ctx)
        self._batch = L.llama_batch_init(N_BATCH, 0, 1)
        self._n = 0  # tokens held in the KV cache (positions 0..n-1)

    def close(self) -> None:
        L = self._L
        if self._batch is not None:
            L.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            L.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            L.llama_model_free(self._model)
            self._model = None

    def _decode(self, tokens: Sequence[int]) -> None:
        """Evaluate ``tokens`` (≤ one batch) after the cache's; logits for the last one only."""
        b = self._batch
        b.n_tokens = len(tokens)
        for j, t in enumerate(tokens):
            b.token[j] = t
            b.pos[j] = self._n + j
            b.n_seq_id[j] = 1
            b.seq_id[j][0] = 0
            b.logits[j] = j == len(tokens) - 1
        rc = self._L.llama_decode(self._ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed (code {rc})")
        self._n += len(tokens)

    def score(self, prompt: list[int], reply: list[int], params: SamplingParams) -> list[TokenScore]:
        """Clear the cache, prefill ``prompt``, then per reply token: score it on the last
        logits row and evaluate it (except the last). Blocking (run it in a worker thread)."""
        import numpy as np

        self._L.llama_memory_clear(self._mem, True)
        self._n = 0
        for i in range(0, len(prompt), N_BATCH):
            self._decode(prompt[i:i + N_BATCH])
        out: list[TokenScore] = []
        for i, tok in enumerate(reply):
            row = np.ctypeslib.as_array(self._L.llama_get_logits_ith(self._ctx, -1), shape=(self.n_vocab,))
            z = row.astype(np.float64)
            zmax = z.max()
            logp = z - (zmax + math.log(float(np.exp(z - zmax).sum())))
            mean, var = logprob_moments(logp, params)
            out.append(TokenScore(tok, float(logp[tok]), mean, int(z.argmax()), var))
            if i + 1 < len(reply):
                self._decode([tok])
        return out


# --------------------------------------------------------------------------- the run


async def _replies(engine: LlamaCppEngine, n: int, max_tokens: int) -> list[tuple[list[int], list[int], SamplingParams]]:
    """``n`` (prompt ids, reply ids, sampling params) from the engine as an honest node."""
    out = []
    for i in range(n):
        params = SamplingParams(temperature=TEMPERATURE, max_tokens=max_tokens, seed=1000 + i)
        prompt = engine.chat_prompt([ChatMessage("user", QUESTIONS[i % len(QUESTIONS)])])
        gen = engine.generate(prompt, params)
        reply = [t async for piece in gen for t in piece.token_ids]
        out.append((prompt, reply, params))
    return out


async def _measure(engine: LlamaCppEngine, api: CompletionAPI, loop: TokenLoop, n_replies: int, rounds: int,
                   max_tokens: int) -> tuple[dict[str, float], dict[str, Any]]:
    import trio

    replies = await _replies(engine, n_replies, max_tokens)
    flush = engine.tokenize(FLUSH_TEXT)
    times: dict[str, list[float]] = {m: [] for m in METHODS}
    cpu: dict[str, list[float]] = {m: [] for m in METHODS}
    diffs = {m: 0.0 for m in METHODS[1:]}
    missed = counted = 0
    scores_c: list[float] = []
    for r in range(rounds):
        for j, (prompt, reply, params) in enumerate(replies):
            got: dict[str, list[float | None]] = {}
            k = (r + j) % len(METHODS)
            for m in METHODS[k:] + METHODS[:k]:  # rotate who runs first
                await engine.score(flush[:-1], flush[-1:], params)  # untimed: evict the prompt
                api.forget()
                t0, c0 = time.perf_counter(), time.process_time()
                if m == "algorithm3":
                    logps, _inv_ppl = await trio.to_thread.run_sync(api.score, prompt, reply, params)
                else:
                    if m == "one_pass":
                        s = await one_pass(engine, prompt, reply, params)
                    elif m == "algorithm3_engine":
                        s = await algorithm3_engine(engine, prompt, reply, params)
                    else:
                        s = await trio.to_thread.run_sync(loop.score, prompt, reply, params)
                    c = score_reply(s)
                    logps = [x.logprob for x in s]
                    if m == "one_pass":
                        scores_c.append(c.calibrated)
                times[m].append(time.perf_counter() - t0)
                cpu[m].append(time.process_time() - c0)
                got[m] = logps
            missed += sum(x is None for x in got["algorithm3"])
            counted += len(reply)
            for m in METHODS[1:]:
                diffs[m] = max(diffs[m], max((abs(a - b) for a, b in zip(got["one_pass"], got[m], strict=True)
                                              if a is not None and b is not None), default=0.0))
    f: dict[str, float] = {}
    for m in METHODS:
        f[f"verify_{m}_per_min"] = 60.0 / (sum(times[m]) / len(times[m]))
    for m in METHODS:
        f.update(summarize_ms(f"verify_{m}", times[m]))
    for m in METHODS:
        f[f"verify_{m}_cpu_mean_ms"] = 1e3 * sum(cpu[m]) / len(cpu[m])
    for other in METHODS[1:]:
        f[f"verify_one_pass_vs_{other}"] = sum(times[other]) / sum(times["one_pass"])
        f[f"verify_one_pass_vs_{other}_cpu"] = sum(cpu[other]) / sum(cpu["one_pass"])
    for m in METHODS[1:]:
        f[f"verify_{m}_logprob_max_abs_diff"] = diffs[m]
    f["verify_algorithm3_epsilon_share"] = missed / max(1, counted)
    reference = [await engine.score(p, r, s) for p, r, s in replies]
    f.update(await _measure_batches(engine, replies, reference, rounds, f))
    lengths = [len(reply) for _p, reply, _s in replies]
    extra = {
        "prompt_tokens_mean": round(sum(len(p) for p, _r, _s in replies) / len(replies), 1),
        "reply_tokens_mean": round(sum(lengths) / len(lengths), 1),
        "reply_tokens_min_max": [min(lengths), max(lengths)],
        "calibrated_score_mean": round(sum(scores_c) / len(scores_c), 4),
    }
    return f, extra


async def _measure_batches(engine: LlamaCppEngine, replies: list[tuple[list[int], list[int], SamplingParams]],
                           reference: list[list[TokenScore]], rounds: int, f: dict[str, float]) -> dict[str, float]:
    """Every reply scored in one ``score_batch`` call by fresh engines with B sequences (module
    docstring); ``f`` holds the per-reply means of the other methods."""
    out: dict[str, float] = {}
    diff = 0.0
    one_pass_s = f["verify_one_pass_mean_ms"] / 1e3
    loop_s = f["verify_token_loop_mean_ms"] / 1e3
    for name, b in (("batch4", min(4, len(replies))), ("batch_all", len(replies))):
        per_reply: list[float] = []
        for _ in range(rounds):
            batched = LlamaCppEngine(engine.model_path, model_id=engine.model, n_ctx=1024, slots=b, cache_bytes=0,
                                     n_threads=THREADS)
            try:
                t0 = time.perf_counter()
                got = await batched.score_batch(replies)
                per_reply.append((time.perf_counter() - t0) / len(replies))
            finally:
                batched.close()
            for g, want in zip(got, reference, strict=True):
                diff = max(diff, max((abs(x.logprob - y.logprob) for x, y in zip(g, want, strict=True)), default=0.0))
        mean = sum(per_reply) / len(per_reply)
        out[f"verify_{name}_per_min"] = 60.0 / mean
        out[f"verify_{name}_vs_token_loop"] = loop_s / mean
        out[f"verify_{name}_vs_one_pass"] = one_pass_s / mean
    out["verify_batch_logprob_max_abs_diff"] = diff
    return out


def _llama_cpp_version() -> str:
    from importlib.metadata import version

    return version("llama-cpp-python")


def run(quick: bool) -> tuple[dict[str, Any], dict[str, float]]:
    """The ``gentorrent.benches`` entry point: ``(params, figures)``."""
    n_replies, rounds, max_tokens = (2, 1, 16) if quick else (12, 3, 64)
    model_id, path = resolve_model(None)
    threads = THREADS
    engine = LlamaCppEngine(path, model_id=model_id, cache_bytes=0, n_threads=threads)
    loop: TokenLoop | None = None
    api: CompletionAPI | None = None
    try:
        loop = TokenLoop(engine, threads)
        api = CompletionAPI(engine, threads)
        figures, extra = run_async(_measure, engine, api, loop, n_replies, rounds, max_tokens)
        context = engine.context_window
        invariant = engine.batch_invariant
    finally:
        if loop is not None:
            loop.close()
        if api is not None:
            api.close()
        engine.close()
    params = {
        "model": f"{model_id} ({path.name})",
        "engine": "llama.cpp (llama-cpp-python), " + ("batch-invariant" if invariant else "not batch-invariant")
                  + ", no KV snapshots (cold prompts), in-place prefix reuse on",
        "context_window": context, "threads": threads, "cpu": cpu_model(), "load_avg_1m": os.getloadavg()[0],
        "replies": n_replies, "rounds": rounds, "reply_max_tokens": max_tokens,
        "sampling": f"temperature {TEMPERATURE}, top_p 1, no top-k, seed 1000+i (replies and scoring)",
        "algorithm3_api": f"llama-cpp-python {_llama_cpp_version()} Llama.create_completion(max_tokens=1, "
                          f"logprobs={TOP_LOGPROBS}), logits_all, epsilon {EPSILON:g}",
        **extra,
    }
    return params, figures
