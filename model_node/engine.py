"""The inference-engine interface every backend implements (paper §3.3; DESIGN.md "Model nodes").

A model node and a verifier talk to engines only through this interface, so the
same token ids flow end to end: the node tokenizes once (``chat_prompt``), the
engine generates from those ids, the node signs the output ids, and a verifier
re-scores exactly those ids (``score``).

Backends: ``model_node.llama`` (llama.cpp, the CPU default), ``model_node.vllm``
(GPU hosts) and ``model_node.echo`` (a labelled DIAGNOSTIC that runs no model).
"""

from __future__ import annotations

import math
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from overlay.wire.messages import ChatMessage, SamplingParams


class EngineError(Exception):
    """The engine cannot run this request; the message is shown to the user."""


@dataclass(frozen=True, slots=True)
class Piece:
    """A streamed piece of output: the text of one or more tokens and their ids."""

    text: str
    token_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class GenStats:
    prompt_tokens: int
    evaluated_prompt_tokens: int  # prompt tokens the engine actually ran (the rest came from its cache)
    output_tokens: int
    ttft_s: float  # seconds from the start of the call to the first output token
    finish_reason: str  # "stop" | "length"


@dataclass(frozen=True, slots=True)
class TokenScore:
    """Verifier scoring of one position of a given continuation (one forward pass).

    ``logprob``: log-probability of the given token; ``expected_logprob``: the
    expected log-probability of the token the model itself would sample under
    the request's sampling parameters (for greedy, that of the argmax);
    ``argmax``: the most likely token id; ``var_logprob``: the variance of that
    log-probability under the same sampling distribution (0 for greedy), so a
    verifier can tell how far a reply's total lies from its expectation in standard
    deviations (:mod:`verifier.audit.scoring`, decision 0013 §5).
    """

    token_id: int
    logprob: float
    expected_logprob: float
    argmax: int
    var_logprob: float = 0.0


class Generation(Protocol):
    """One running request: iterate for pieces; ``stats`` is set once it has finished."""

    stats: GenStats | None

    def __aiter__(self) -> AsyncGenerator[Piece, None]: ...


@runtime_checkable
class Engine(Protocol):
    name: str           # "llama.cpp" | "vllm" | "echo"
    model: str          # the model id this engine serves (as in the registry)
    context_window: int  # tokens

    def chat_prompt(self, messages: Sequence[ChatMessage], continuation: str = "") -> list[int]:
        """Token ids of the chat template applied to ``messages`` (from the model's own metadata),
        opened for the assistant's reply; ``continuation`` (a partial reply being resumed after
        failover) is appended so generation continues it without repeating it."""
        ...

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        """Start generating from ``prompt_ids``. Raises :class:`EngineError` for a prompt beyond
        the context window."""
        ...

    async def score(self, prompt_ids: list[int], continuation_ids: list[int],
                    params: SamplingParams) -> list[TokenScore]:
        """Score ``continuation_ids`` after ``prompt_ids`` in one forward pass."""
        ...

    def cached_prefixes(self) -> list[tuple[int, ...]]:
        """Token-id prefixes whose KV state the engine holds now (for the HR-tree)."""
        ...

    def detokenize(self, token_ids: Sequence[int]) -> str: ...


@runtime_checkable
class EndsReplies(Protocol):
    """An engine that knows how its model ends a reply: :meth:`end_token`, the token that ends an
    assistant's turn (None: the model has none), and :meth:`is_end`, whether a token ends
    generation. A verifier scores the end token where a reply stops short of ``max_tokens``
    without one (decision 0026: a node that stops early saves work and must pay for it)."""

    def end_token(self) -> int | None: ...

    def is_end(self, token_id: int) -> bool: ...


@runtime_checkable
class OrdersPrompts(Protocol):
    """An engine that evaluates waiting prompts in the order its callers ask (lowest
    ``priority`` first, ties first come first served) instead of first come first served; the
    model node's admission then places a short prompt ahead of longer ones
    (:mod:`model_node.admission`). ``orders_prompts`` is True on such an engine."""

    orders_prompts: bool

    def generate(self, prompt_ids: list[int], params: SamplingParams, priority: float = 0.0) -> Generation: ...


# --------------------------------------------------------------------------- scoring math (numpy)


def expected_logprob(logprobs: Any, params: SamplingParams) -> float:
    """The expected log-probability of the token a model samples with ``params`` (paper §3.4):
    the first of :func:`logprob_moments`."""
    return logprob_moments(logprobs, params)[0]


def logprob_moments(logprobs: Any, params: SamplingParams) -> tuple[float, float]:
    """The mean and the variance of the log-probability of the token a model samples with
    ``params`` (paper §3.4; decision 0013 §5).

    ``logprobs``: one position's next-token log-probabilities under the model at temperature
    1 (1-D, any order): the whole vocabulary, or only the top alternatives an engine reports
    (the mass beyond them is then ignored). The sampling distribution q is softmax(``logprobs``
    / temperature) cut to the top-k, then to the smallest top-p nucleus, renormalised; the
    result is (Σ q·lp, Σ q·(lp − mean)²). Temperature 0 (greedy): (the largest
    log-probability, 0). No alternatives: (NaN, NaN). Needs numpy (every engine backend has it)."""
    import numpy as np

    lp = np.asarray(logprobs, dtype=np.float64).reshape(-1)
    if lp.size == 0:
        return math.nan, math.nan
    t, k, p = params.temperature, params.top_k, params.top_p
    if t <= 0.0:
        return float(lp.max()), 0.0
    s = lp / t
    keep = np.argpartition(-s, k - 1)[:k] if 0 < k < lp.size else None
    if p < 1.0:
        keep = _nucleus(s, keep, p)
    if keep is not None:
        s, lp = s[keep], lp[keep]
    q = np.exp(s - s.max())
    total = q.sum()
    mean = float((q * lp).sum() / total)
    return mean, float((q * (lp - mean) ** 2).sum() / total)


def _nucleus(s: Any, keep: Any, p: float) -> Any:
    """Indices of the smallest set of highest-probability tokens (among ``keep``, or all)
    whose probability under softmax(``s`` restricted to that pool) reaches ``p``."""
    import numpy as np

    pool = keep
    sp = s[pool] if pool is not None else s
    probs = np.exp(sp - sp.max())
    probs /= probs.sum()
    n = probs.shape[0]
    m_try = min(n, 64)
    while True:  # the nucleus is usually small: sort only the top m_try, widen if needed
        top = np.argpartition(-probs, m_try - 1)[:m_try] if m_try < n else np.arange(n)
        top = top[np.argsort(-probs[top], kind="stable")]
        c = np.cumsum(probs[top])
        if c[-1] >= p or m_try == n:
            cut = int(np.searchsorted(c, p)) + 1  # first position where the mass reaches p
            chosen = top[:min(cut, m_try)]
            return pool[chosen] if pool is not None else chosen
        m_try = min(n, m_try * 8)
