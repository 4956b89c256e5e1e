"""``gentorrent bench verify-gpu``: what auditing a challenge reply costs on a GPU host, for an
8B-parameter model (issue 14, "Benchmark": "on a GPU host ... verifications per minute for an
8B-parameter model"; paper §3.4, §5: 20.72/min on an A100, 45.04/min on a GH200).

``gentorrent bench verify`` measures the methods on this project's CPU engine (llama.cpp). No GPU
engine of the project runs where the GPU machines are lent: vLLM is not installed there and cannot
be fetched, and nothing can be downloaded, so there are no real weights either. This bench
therefore runs the same three methods on PyTorch + transformers (what those machines have), on a
model of the architecture under test with **randomly initialised weights** (the issue allows it
for throughput; the cost of a forward pass does not depend on the weights' values), in bf16, with
PyTorch's SDPA attention and no CUDA graphs (HF eager):

- **one pass** (the verifier's method): prompt + reply in one teacher-forced forward pass; the
  language-model head runs only on the rows that predict a reply token; then the calibrated score
  (:func:`score_rows_torch`, the same math as :func:`model_node.llama.score_rows`, on the GPU) and
  :func:`verifier.audit.scoring.score_reply`.
- **(a) Algorithm 3 as written** (``algorithm3``): per reply token one completion call over the
  growing context with ``max_tokens = 1`` and 20 log-probabilities, the prefix cache on (each call
  finds the previous context's KV in place and evaluates one new token). A call does what a
  completion API does in-process: the forward step, a log-softmax of the row, drawing the
  discarded token with the challenge's sampling parameters, the top-20 list copied to the host
  and keyed by token (by id: there is no tokenizer for random weights; an API keys by text,
  which costs more), then the lookup with Algorithm 3's ε. No HTTP, no scheduler: a **lower
  bound** on a real completion server's cost. Score: NormalizedPPL.
- **(b) tight token loop** (``token_loop``): the prompt in one prefill, then one forward step of
  one token per reply token with the KV cache kept, each row scored on the GPU, one copy to the
  host at the end: no per-call work at all.
- **batches** (``batchB``): B replies in one padded forward pass (right padding, so no real token
  sees a pad under the causal mask), the head on the reply rows only, every row scored at once.

Each timing ends with ``torch.cuda.synchronize()`` (CUDA) and includes copying the scores to the
host and computing :func:`score_reply`. Every method first runs once over every reply untimed
(kernel and GEMM algorithm selection for each shape, allocator growth). Replies come from the same model (the honest node): sampled at temperature
0.7 (the users' default) with a fixed seed per reply, prompts of random token ids.

Figures, per model (``8b``: Llama-3-8B's architecture; ``135m``: SmolLM2-135M's, the CPU bench's
model; ``tiny`` in ``--quick``, which runs on the CPU when there is no GPU and only checks the
bench works): ``verify_gpu_{m}_{method}_per_min`` (60 s ÷ mean time per verification),
``verify_gpu_{m}_{method}_{mean,p50,p99}_ms``, ratios ``verify_gpu_{m}_one_pass_vs_{algorithm3,token_loop}``
(the other's mean time ÷ one pass's), ``verify_gpu_{m}_batch{B}_per_min`` and
``..._batch{B}_vs_token_loop`` (the token loop's mean time per reply ÷ the batch's),
``verify_gpu_{m}_{token_loop,algorithm3,batch}_logprob_max_abs_diff`` (largest difference of a
token's log-probability from one pass's, nats: bf16 kernels differ with the batch shape, so this
is not 0 as on the batch-invariant CPU engine) and ``verify_gpu_{m}_calibrated_mean`` (the mean
calibrated score C of the honest replies, one pass: near 1 when the scoring is right).
"""

from __future__ import annotations

import math
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from gentorrent.bench.stats import summarize_ms
from gentorrent.cli import CliError
from model_node.engine import TokenScore
from overlay.wire.messages import SamplingParams
from verifier.audit.scoring import score_reply
from verifier.bench.verify import EPSILON, TEMPERATURE, TOP_LOGPROBS, normalized_ppl

# Architectures (transformers LlamaConfig fields). 8b: Meta Llama 3 8B's published shape;
# 135m: SmolLM2-135M-Instruct's (the CPU bench's model); tiny: a smoke-test model.
ARCHS: dict[str, dict[str, Any]] = {
    "8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
               num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
               rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False),
    "135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                 num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                 rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True),
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                 rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False),
}


@dataclass(frozen=True, slots=True)
class Plan:
    """One model's run: ``replies`` replies scored by each per-reply method ``rounds`` times,
    and by each batch size in ``batches``."""

    arch: str
    replies: int
    rounds: int
    prompt_tokens: tuple[int, int]  # drawn uniformly, inclusive
    reply_tokens: tuple[int, int]
    batches: tuple[int, ...]


FULL = (Plan("8b", 16, 2, (32, 56), (48, 64), (1, 4, 16, 64)),
        Plan("135m", 16, 2, (32, 56), (48, 64), (1, 4, 16, 64)))
QUICK = (Plan("tiny", 4, 1, (8, 12), (6, 10), (1, 4)),)


# --------------------------------------------------------------------------- scoring math (torch)


def expected_logprob_torch(lp: Any, params: SamplingParams) -> Any:
    """Per row of ``lp`` (``(n, vocab)`` log-probabilities at temperature 1): the expected
    log-probability of a token drawn with ``params``, the first of :func:`logprob_moments_torch`."""
    return logprob_moments_torch(lp, params)[0]


def logprob_moments_torch(lp: Any, params: SamplingParams) -> tuple[Any, Any]:
    """Per row of ``lp`` (``(n, vocab)`` log-probabilities at temperature 1): the mean and the
    variance of the log-probability of a token drawn with ``params`` —
    :func:`model_node.engine.logprob_moments` for a whole batch of rows on the tensor's device
    (softmax(lp / T) cut to the top-k, then to the smallest top-p nucleus, renormalised; greedy:
    the row's maximum and 0)."""
    import torch

    t, k, p = params.temperature, params.top_k, params.top_p
    if t <= 0.0:
        top = lp.max(dim=-1).values
        return top, torch.zeros_like(top)
    s = lp / t
    vocab = s.shape[-1]
    if 0 < k < vocab:
        kth = torch.topk(s, k, dim=-1).values[:, -1:]
        s = s.masked_fill(s < kth, -math.inf)
    if p < 1.0:
        probs = torch.softmax(s, dim=-1)
        sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        mass = torch.cumsum(sorted_p, dim=-1)
        count = (mass < p).sum(dim=-1, keepdim=True) + 1  # first position where the mass reaches p
        in_nucleus = torch.arange(vocab, device=s.device)[None, :] < count
        keep = torch.zeros_like(in_nucleus).scatter(-1, order, in_nucleus)
        s = s.masked_fill(~keep, -math.inf)
    q = torch.softmax(s, dim=-1)
    live = q > 0
    zero = torch.zeros_like(lp)
    mean = torch.where(live, q * lp, zero).sum(dim=-1)
    var = torch.where(live, q * (lp - mean[:, None]) ** 2, zero).sum(dim=-1)
    return mean, var


def score_rows_torch(logits: Any, targets: Sequence[int], params: SamplingParams) -> list[TokenScore]:
    """:func:`model_node.llama.score_rows` for a torch tensor ``(n, vocab)`` of raw logits on any
    device: per row, ``targets[i]``'s log-probability, the expected log-probability under
    ``params`` and its variance, and the argmax; computed on the tensor's device in float32
    (float64 if given), copied to the host once."""
    import torch

    z = logits if logits.dtype == torch.float64 else logits.float()
    lp = torch.log_softmax(z, dim=-1)
    tgt = torch.as_tensor(list(targets), device=z.device, dtype=torch.long)
    chosen = lp.gather(1, tgt[:, None])[:, 0]
    mean, var = logprob_moments_torch(lp, params)
    rows = torch.stack([chosen.double(), mean.double(), z.argmax(dim=-1).double(), var.double()]).cpu().tolist()
    return [TokenScore(int(tok), rows[0][i], rows[1][i], int(rows[2][i]), rows[3][i])
            for i, tok in enumerate(targets)]


# --------------------------------------------------------------------------- the methods


Reply = tuple[list[int], list[int], SamplingParams]


class Methods:
    """The three methods (module docstring) on one transformers causal LM."""

    def __init__(self, model: Any, device: Any) -> None:
        self.model, self.device = model, device

    def _ids(self, tokens: Sequence[int]) -> Any:
        import torch

        return torch.tensor([list(tokens)], dtype=torch.long, device=self.device)

    def _step(self, tokens: Sequence[int], cache: Any) -> tuple[Any, Any]:
        """Evaluate ``tokens`` after ``cache``'s context: (the last row's logits, the cache)."""
        out = self.model(input_ids=self._ids(tokens), past_key_values=cache, use_cache=True, logits_to_keep=1)
        return out.logits[0, -1], out.past_key_values

    def generate(self, prompt: list[int], n: int, seed: int) -> list[int]:
        """``n`` tokens sampled at :data:`TEMPERATURE` (the honest node's reply)."""
        import torch

        gen = torch.Generator(device=self.device).manual_seed(seed)
        row, cache = self._step(prompt, None)
        out: list[int] = []
        for _ in range(n):
            probs = torch.softmax(row.float() / TEMPERATURE, dim=-1)
            tok = int(torch.multinomial(probs, 1, generator=gen))
            out.append(tok)
            row, cache = self._step([tok], cache)
        return out

    def one_pass(self, prompt: list[int], reply: list[int], params: SamplingParams) -> list[TokenScore]:
        return self.batch([(prompt, reply, params)])[0]

    def batch(self, items: Sequence[Reply]) -> list[list[TokenScore]]:
        """One padded forward pass over every item; the head only on the reply-predicting rows."""
        import torch

        longest = max(len(p) + len(r) for p, r, _ in items)
        ids = torch.zeros((len(items), longest), dtype=torch.long)
        rows_b: list[int] = []
        rows_t: list[int] = []
        for b, (p, r, _) in enumerate(items):
            seq = p + r
            ids[b, :len(seq)] = torch.tensor(seq)
            rows_b += [b] * len(r)
            rows_t += range(len(p) - 1, len(seq) - 1)
        hidden = self.model.model(input_ids=ids.to(self.device), use_cache=False).last_hidden_state
        logits = self.model.lm_head(hidden[torch.tensor(rows_b, device=self.device),
                                           torch.tensor(rows_t, device=self.device)])
        out: list[list[TokenScore]] = []
        at = 0
        for _p, r, params in items:  # one params per item (rows of one item share them)
            out.append(score_rows_torch(logits[at:at + len(r)], r, params))
            at += len(r)
        return out

    def token_loop(self, prompt: list[int], reply: list[int], params: SamplingParams) -> list[TokenScore]:
        import torch

        row, cache = self._step(prompt, None)
        rows = []
        for i, tok in enumerate(reply):
            rows.append(row)
            if i + 1 < len(reply):
                row, cache = self._step([tok], cache)
        return score_rows_torch(torch.stack(rows), reply, params)

    def algorithm3(self, prompt: list[int], reply: list[int], params: SamplingParams) -> tuple[list[float | None], float]:
        """Per reply token one in-process completion call (module docstring, method (a));
        returns the log-probabilities found (``None``: not in the top list, ε used) and 1/PPL."""
        import torch

        gen = torch.Generator(device=self.device).manual_seed(params.seed or 0)
        cache = None
        done = 0  # context tokens in the cache
        context = list(prompt)
        found: list[float | None] = []
        for tok in reply:
            row, cache = self._step(context[done:], cache)
            done = len(context)
            logp = torch.log_softmax(row.float(), dim=-1)
            probs = torch.softmax(logp / max(params.temperature, 1e-6), dim=-1)
            torch.multinomial(probs, 1, generator=gen)  # the completion's own (discarded) token
            top = torch.topk(logp, TOP_LOGPROBS)
            table = dict(zip(top.indices.tolist(), top.values.tolist(), strict=True))
            found.append(table.get(tok))
            context.append(tok)
        return found, normalized_ppl(found)


# --------------------------------------------------------------------------- the run


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _build(arch: str, device: Any) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    config = LlamaConfig(**ARCHS[arch])
    causal_lm: Any = LlamaForCausalLM  # typed loosely: mypy sees transformers only where it is installed
    model: Any
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with device:
            model = causal_lm(config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def _max_diff(a: Sequence[TokenScore], b: Sequence[float | None]) -> float:
    return max((abs(x.logprob - y) for x, y in zip(a, b, strict=True) if y is not None), default=0.0)


def _timed(device: Any, fn: Callable[[], Any]) -> tuple[float, Any]:
    _sync(device)
    t0 = time.perf_counter()
    out = fn()
    _sync(device)
    return time.perf_counter() - t0, out


@dataclass
class Timings:
    """What the timed rounds found: seconds per reply of each per-reply method, the largest
    log-prob difference of each method from one pass's, Algorithm 3's tokens out of its table
    (``missed`` of ``counted``), one pass's calibrated scores and its scores of the first round
    (the batches' reference), and the mean seconds per reply of each batch size."""

    times: dict[str, list[float]] = field(default_factory=lambda: {"one_pass": [], "algorithm3": [], "token_loop": []})
    diffs: dict[str, float] = field(default_factory=lambda: {"token_loop": 0.0, "algorithm3": 0.0, "batch": 0.0})
    calibrated: list[float] = field(default_factory=list)
    missed: int = 0
    counted: int = 0
    reference: list[list[TokenScore]] = field(default_factory=list)
    batch_s: dict[int, float] = field(default_factory=dict)


def _generate(plan: Plan, m: Methods, rng: random.Random) -> list[Reply]:
    """The plan's replies, generated by the model to random prompts."""
    vocab = ARCHS[plan.arch]["vocab_size"]
    replies: list[Reply] = []
    for i in range(plan.replies):
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(*plan.prompt_tokens))]
        params = SamplingParams(temperature=TEMPERATURE, max_tokens=plan.reply_tokens[1], seed=1000 + i)
        replies.append((prompt, m.generate(prompt, rng.randint(*plan.reply_tokens), 1000 + i), params))
    return replies


def _warm_up(plan: Plan, m: Methods, replies: list[Reply], pool: list[Reply]) -> None:
    """Every method over every reply and every batch shape once, untimed, so that first-use costs
    of a shape (kernel and GEMM algorithm selection, allocator growth) stay out of the figures;
    measured on an H100 they doubled one pass's mean without it."""
    for prompt, reply, params in replies:
        m.one_pass(prompt, reply, params)
        m.token_loop(prompt, reply, params)
        m.algorithm3(prompt, reply, params)
    for b in plan.batches:
        for at in range(0, len(pool) - b + 1, b):
            m.batch(pool[at:at + b])


def _time_per_reply(plan: Plan, m: Methods, device: Any, replies: list[Reply], t: Timings) -> None:
    """Time one pass, the token loop and Algorithm 3 on every reply, ``plan.rounds`` times (the
    latter two in alternating order), checking them against one pass."""
    for r in range(plan.rounds):
        for j, (prompt, reply, params) in enumerate(replies):
            dt, one = _timed(device, partial(_scored, m.one_pass, prompt, reply, params))
            t.times["one_pass"].append(dt)
            if r == 0:
                t.reference.append(one)
                t.calibrated.append(score_reply(one).calibrated)
            order = ("token_loop", "algorithm3") if (r + j) % 2 == 0 else ("algorithm3", "token_loop")
            for name in order:
                if name == "token_loop":
                    dt, got = _timed(device, partial(_scored, m.token_loop, prompt, reply, params))
                    t.diffs[name] = max(t.diffs[name], _max_diff(one, [s.logprob for s in got]))
                else:
                    dt, (found, _inv_ppl) = _timed(device, partial(m.algorithm3, prompt, reply, params))
                    t.diffs[name] = max(t.diffs[name], _max_diff(one, found))
                    t.missed += sum(x is None for x in found)
                    t.counted += len(found)
                t.times[name].append(dt)


def _time_batches(plan: Plan, m: Methods, device: Any, pool: list[Reply], t: Timings) -> None:
    """Time the batches of each size over ``pool``, ``plan.rounds`` times, checking them against
    one pass's reference scores."""
    for b in plan.batches:
        per_reply: list[float] = []
        for _ in range(plan.rounds):
            for at in range(0, len(pool) - b + 1, b):
                dt, got_b = _timed(device, partial(_scored_batch, m, pool[at:at + b]))
                per_reply.append(dt / b)
                for k, g in enumerate(got_b, start=at):
                    want = t.reference[k % len(t.reference)]
                    t.diffs["batch"] = max(t.diffs["batch"], _max_diff(want, [x.logprob for x in g]))
        t.batch_s[b] = sum(per_reply) / len(per_reply)


def _figures(arch: str, t: Timings) -> dict[str, float]:
    """The figures of one model's :class:`Timings` (module docstring)."""
    f: dict[str, float] = {}
    key = f"verify_gpu_{arch}"
    mean = {name: sum(v) / len(v) for name, v in t.times.items()}
    for name in t.times:
        f[f"{key}_{name}_per_min"] = 60.0 / mean[name]
    for name, v in t.times.items():
        f.update(summarize_ms(f"{key}_{name}", v))
    for other in ("algorithm3", "token_loop"):
        f[f"{key}_one_pass_vs_{other}"] = mean[other] / mean["one_pass"]
    for b, s in t.batch_s.items():
        f[f"{key}_batch{b}_per_min"] = 60.0 / s
        f[f"{key}_batch{b}_vs_token_loop"] = mean["token_loop"] / s
    for name, d in t.diffs.items():
        f[f"{key}_{name}_logprob_max_abs_diff"] = d
    f[f"{key}_algorithm3_epsilon_share"] = t.missed / max(1, t.counted)
    f[f"{key}_calibrated_mean"] = sum(t.calibrated) / len(t.calibrated)
    return f


def measure(plan: Plan, device: Any) -> tuple[dict[str, float], dict[str, Any]]:
    """One model's figures (module docstring) and its parameters."""
    import torch

    t_build = time.perf_counter()
    model = _build(plan.arch, device)
    n_params = sum(p.numel() for p in model.parameters())
    m = Methods(model, device)
    rng = random.Random(7)
    t = Timings()
    with torch.inference_mode():
        _sync(device)
        build_s = time.perf_counter() - t_build
        _progress(f"{plan.arch}: {n_params / 1e9:.2f} B parameters built in {build_s:.1f} s")
        replies = _generate(plan, m, rng)
        # the batches cycle through the same replies (a forward pass shares nothing between rows)
        pool = [replies[k % len(replies)] for k in range(max(plan.batches))]
        _progress(f"{plan.arch}: {len(replies)} replies generated")
        _warm_up(plan, m, replies, pool)
        _progress(f"{plan.arch}: warmed up")
        _time_per_reply(plan, m, device, replies, t)
        _progress(f"{plan.arch}: per-reply methods timed")
        _time_batches(plan, m, device, pool, t)
    f = _figures(plan.arch, t)
    lengths = [len(r) for _p, r, _s in replies]
    info = {
        "arch": plan.arch, "parameters": n_params, "dtype": str(next(model.parameters()).dtype),
        "attention": getattr(model.config, "_attn_implementation", "?"), "build_s": round(build_s, 1),
        "replies": plan.replies, "rounds": plan.rounds, "batches": list(plan.batches),
        "gpu_peak_GiB": round(torch.cuda.max_memory_allocated(device) / 2**30, 1) if device.type == "cuda" else None,
        "prompt_tokens_mean": round(sum(len(p) for p, _r, _s in replies) / len(replies), 1),
        "reply_tokens_mean": round(sum(lengths) / len(lengths), 1),
    }
    del model, m
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    return f, info


def _progress(line: str) -> None:
    """A line on stderr as each stage ends (a full run takes minutes)."""
    print(f"bench verify-gpu: {line}", file=sys.stderr, flush=True)


def _scored(method: Callable[[list[int], list[int], SamplingParams], list[TokenScore]], prompt: list[int],
            reply: list[int], params: SamplingParams) -> list[TokenScore]:
    """``method``'s scores of one reply, with :func:`score_reply` (part of every verification)."""
    scores = method(prompt, reply, params)
    score_reply(scores)
    return scores


def _scored_batch(m: Methods, items: Sequence[Reply]) -> list[list[TokenScore]]:
    out = m.batch(items)
    for scores in out:
        score_reply(scores)
    return out


def run(quick: bool) -> tuple[dict[str, Any], dict[str, float]]:
    """The ``gentorrent.benches`` entry point: ``(params, figures)``."""
    try:
        import torch
        import transformers
    except ImportError as e:
        raise CliError(f"bench verify-gpu needs PyTorch and transformers ({e}); on a CPU machine "
                       "`make setup-vllm` installs both, on a GPU host install torch and transformers") from e
    cuda = torch.cuda.is_available()
    if not cuda and not quick:
        raise CliError("bench verify-gpu measures a GPU: no CUDA device is visible here. "
                       "`gentorrent bench verify` measures this machine's CPU engine; "
                       "`bench verify-gpu --quick` checks this bench runs (tiny model, CPU)")
    device = torch.device("cuda" if cuda else "cpu")
    figures: dict[str, float] = {}
    per_model: dict[str, Any] = {}
    for plan in QUICK if quick else FULL:
        f, p = measure(plan, device)
        figures.update(f)
        per_model[plan.arch] = p
    params = {
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "torch": torch.__version__, "transformers": transformers.__version__,
        "engine": "transformers LlamaForCausalLM, random weights, eager (no CUDA graphs); "
                  "not the project's engines (module docstring)",
        "threads": torch.get_num_threads(), "load_avg_1m": os.getloadavg()[0],
        "sampling": f"temperature {TEMPERATURE}, top_p 1, no top-k, seed 1000+i (replies and scoring)",
        "algorithm3_api": f"in-process completion call, top {TOP_LOGPROBS} by token id, epsilon {EPSILON:g}",
        "models": per_model,
    }
    return params, figures
