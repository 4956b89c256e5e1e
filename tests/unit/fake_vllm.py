"""A fake ``vllm`` module (0.33 API) with exactly the names and calls ``model_node.vllm`` uses.

Pass this module as ``VllmEngine(..., vllm_module=fake_vllm)``. Names, signatures and
return shapes follow vLLM 0.33.0 (read from its wheel):

- ``AsyncEngineArgs`` (a dataclass: unknown fields raise ``TypeError``) with the fields the
  adapter may set; ``AsyncLLMEngine.from_engine_args(args)`` (vLLM's alias of ``AsyncLLM``);
  ``engine.model_config.max_model_len``; ``engine.get_tokenizer()`` (sync in 0.33);
  ``engine.generate(prompt, sampling_params, request_id)``, an asyncio async generator of
  ``RequestOutput`` that, like vLLM's, records an abort when cancelled or closed early;
  ``engine.shutdown()``.
- ``TokensPrompt`` (a ``TypedDict``, so calling it builds a dict, as in vLLM).
- ``SamplingParams`` with the fields used; ``sampling_params.RequestOutputKind``.
- ``RequestOutput`` / ``CompletionOutput`` / ``Logprob`` with vLLM's attribute names;
  ``prompt_logprobs`` is ``[None, {token_id: Logprob}, ...]`` holding the top
  ``prompt_logprobs`` alternatives plus the actual token, with 1-based ranks.

Behind it runs a toy deterministic "model" over a 259-token vocabulary (3 special tokens,
then bytes): :func:`logprobs_after` gives the next-token log-probabilities after a context,
so tests can compute expected values independently. Its prefix cache reports
``num_cached_tokens`` as the longest block-aligned (16-token) prefix shared with an
earlier request's prompt.
"""

from __future__ import annotations

import asyncio
import enum
import math
import random
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, TypedDict

from model_node.hrtree import common_prefix

UNK, IM_START, IM_END = 0, 1, 2
SPECIAL = {"<unk>": UNK, "<|im_start|>": IM_START, "<|im_end|>": IM_END}
VOCAB = 3 + 256
EOS = IM_END
BLOCK = 16


# --------------------------------------------------------------------------- vllm.sampling_params


class RequestOutputKind(enum.Enum):
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


sampling_params = SimpleNamespace(RequestOutputKind=RequestOutputKind)


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    max_tokens: int | None = 16
    prompt_logprobs: int | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE

    def __post_init__(self) -> None:  # vLLM's checks on the fields used
        if self.n != 1:
            raise ValueError("fake vLLM: n must be 1")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1 (disable) or at least 0, got {self.top_k}.")
        if self.temperature < 0.0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}.")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}.")


# --------------------------------------------------------------------------- vllm.inputs / outputs


class TokensPrompt(TypedDict):
    prompt_token_ids: list[int]


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: Any
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class RequestOutput:
    def __init__(self, request_id: str, prompt: str | None, prompt_token_ids: list[int] | None,
                 prompt_logprobs: list[dict[int, Logprob] | None] | None, outputs: list[CompletionOutput],
                 finished: bool, metrics: Any = None, lora_request: Any = None, encoder_prompt: str | None = None,
                 encoder_prompt_token_ids: list[int] | None = None, num_cached_tokens: int | None = None) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.prompt_logprobs = prompt_logprobs
        self.outputs = outputs
        self.finished = finished
        self.metrics = metrics
        self.lora_request = lora_request
        self.encoder_prompt = encoder_prompt
        self.encoder_prompt_token_ids = encoder_prompt_token_ids
        self.num_cached_tokens = num_cached_tokens


# --------------------------------------------------------------------------- tokenizer and toy model


class FakeTokenizer:
    """Byte-level, with ChatML control tokens parsed wherever they appear (as HF tokenizers do)."""

    eos_token_id = EOS
    bos_token_id = None

    def encode(self, text: str, truncation: bool | None = None, max_length: int | None = None,
               add_special_tokens: bool = True) -> list[int]:
        ids: list[int] = []
        i = 0
        while i < len(text):
            for name, tid in SPECIAL.items():
                if text.startswith(name, i):
                    ids.append(tid)
                    i += len(name)
                    break
            else:
                ids += [3 + b for b in text[i].encode()]
                i += 1
        return ids

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        names = {v: k for k, v in SPECIAL.items()}
        out = bytearray()
        for t in ([ids] if isinstance(ids, int) else ids):
            if t >= 3:
                out.append(t - 3)
            elif not skip_special_tokens:
                out += names[t].encode()
        return out.decode(errors="replace")

    def apply_chat_template(self, messages: list[dict[str, str]], tools: Any = None, *, tokenize: bool = True,
                            add_generation_prompt: bool = False, **kwargs: Any) -> str | list[int]:
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        if add_generation_prompt:
            text += "<|im_start|>assistant\n"
        return self.encode(text) if tokenize else text


def logprobs_after(context: list[int]) -> list[float]:
    """The toy model: next-token log-probabilities after ``context`` (deterministic)."""
    rng = random.Random(f"{context[-1]}:{len(context)}")
    logits = [rng.gauss(0.0, 2.0) for _ in range(VOCAB)]
    if len(context) % 17 == 0:
        logits[EOS] += 20.0
    m = max(logits)
    lse = m + math.log(sum(math.exp(x - m) for x in logits))
    return [x - lse for x in logits]


def _sample(lps: list[float], sp: SamplingParams, rng: random.Random) -> int:
    if sp.temperature == 0.0:
        return max(range(VOCAB), key=lambda i: (lps[i], -i))
    order = sorted(range(VOCAB), key=lambda i: -lps[i])
    if sp.top_k > 0:
        order = order[:sp.top_k]
    w = [math.exp(lps[i] / sp.temperature) for i in order]
    total = sum(w)
    if sp.top_p < 1.0:
        acc, keep = 0.0, 0
        for x in w:
            acc += x / total
            keep += 1
            if acc >= sp.top_p:
                break
        order, w = order[:keep], w[:keep]
    return rng.choices(order, weights=w)[0]


# --------------------------------------------------------------------------- the engine


@dataclass
class AsyncEngineArgs:
    model: str
    tokenizer: str | None = None
    dtype: str = "auto"
    seed: int = 0
    max_model_len: int | None = None
    enable_prefix_caching: bool | None = None
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int | None = None
    max_logprobs: int = 20
    disable_log_stats: bool = False
    enable_log_requests: bool = False
    trust_remote_code: bool = False


@dataclass
class FakeAsyncLLM:
    """What the fake engine saw: ``requests`` (request_id, prompt, sampling params, thread
    name), ``aborted`` request ids, ``created_on_loop``, ``shut_down``."""

    args: AsyncEngineArgs
    created_on_loop: bool
    model_config: Any = None
    requests: list[tuple[str, Any, SamplingParams, str]] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    seen_prompts: list[list[int]] = field(default_factory=list)
    shut_down: bool = False
    step_delay: float = 0.0

    def __post_init__(self) -> None:
        self.model_config = SimpleNamespace(max_model_len=self.args.max_model_len or 512, model=self.args.model,
                                            get_vocab_size=lambda: VOCAB)
        self._tokenizer = FakeTokenizer()

    @classmethod
    def from_engine_args(cls, engine_args: AsyncEngineArgs, start_engine_loop: bool = True,
                         usage_context: Any = None, stat_loggers: Any = None) -> FakeAsyncLLM:
        try:
            asyncio.get_running_loop()
            on_loop = True
        except RuntimeError:
            on_loop = False
        instances.append(engine := cls(engine_args, on_loop))
        return engine

    def get_tokenizer(self) -> FakeTokenizer:
        return self._tokenizer

    def shutdown(self, timeout: float | None = None) -> None:
        self.shut_down = True

    def _cached(self, prompt: list[int]) -> int:
        if not self.args.enable_prefix_caching:
            return 0
        best = max((common_prefix(seen, prompt) for seen in self.seen_prompts), default=0)
        return (min(best, len(prompt) - 1) // BLOCK) * BLOCK

    async def generate(self, prompt: Any, sampling_params: SamplingParams, request_id: str, *,
                       lora_request: Any = None, priority: int = 0) -> Any:
        asyncio.get_running_loop()  # vLLM's generate runs on an asyncio loop
        ids = list(prompt["prompt_token_ids"])
        sp = sampling_params
        self.requests.append((request_id, prompt, sp, threading.current_thread().name))
        if len(ids) + 1 > self.model_config.max_model_len:
            raise ValueError(f"prompt length {len(ids)} exceeds max_model_len")
        cached = self._cached(ids)
        self.seen_prompts.append(ids)
        plp: list[dict[int, Logprob] | None] | None = None
        if sp.prompt_logprobs is not None and sp.prompt_logprobs > self.args.max_logprobs:
            raise ValueError(f"Requested prompt logprobs of {sp.prompt_logprobs}, "
                             f"which is greater than max allowed: {self.args.max_logprobs}")
        if sp.prompt_logprobs is not None:
            plp = [None]
            for i in range(1, len(ids)):
                lps = logprobs_after(ids[:i])
                order = sorted(range(VOCAB), key=lambda t: (-lps[t], t))
                rank = {t: r + 1 for r, t in enumerate(order)}
                entry = {t: Logprob(lps[t], rank[t], self._tokenizer.decode([t])) for t in order[:sp.prompt_logprobs]}
                entry[ids[i]] = Logprob(lps[ids[i]], rank[ids[i]], self._tokenizer.decode([ids[i]]))
                plp.append(entry)
        rng = random.Random(sp.seed if sp.seed is not None else request_id)
        context = list(ids)
        out_ids: list[int] = []
        text = ""
        try:
            while True:
                await asyncio.sleep(self.step_delay)
                tok = _sample(logprobs_after(context), sp, rng)
                context.append(tok)
                out_ids.append(tok)
                piece = self._tokenizer.decode([tok], skip_special_tokens=sp.skip_special_tokens) if sp.detokenize else ""
                text += piece
                finish = ("stop" if tok == EOS else "length" if len(out_ids) >= (sp.max_tokens or 16)
                          or len(context) >= self.model_config.max_model_len else None)
                kind = sp.output_kind
                if kind == RequestOutputKind.FINAL_ONLY and finish is None:
                    continue
                delta = kind == RequestOutputKind.DELTA
                comp = CompletionOutput(0, piece if delta else text, [tok] if delta else list(out_ids), None, None,
                                        finish)
                first = len(out_ids) == 1 or kind == RequestOutputKind.FINAL_ONLY
                yield RequestOutput(request_id, None, ids, plp if (first or not delta) else None, [comp],
                                    finish is not None, num_cached_tokens=cached)
                if finish is not None:
                    return
        except (asyncio.CancelledError, GeneratorExit):
            self.aborted.append(request_id)  # vLLM aborts the request here
            raise


AsyncLLMEngine = FakeAsyncLLM
instances: list[FakeAsyncLLM] = []
