"""The inference-engine interface every backend implements (paper §3.3; DESIGN.md "Model nodes").

A model node and a verifier talk to engines only through this interface, so the
same token ids flow end to end: the node tokenizes once (``chat_prompt``), the
engine generates from those ids, the node signs the output ids, and a verifier
re-scores exactly those ids (``score``).

Backends: ``model_node.llama`` (llama.cpp, the CPU default), ``model_node.vllm``
(GPU hosts) and ``model_node.echo`` (a labelled DIAGNOSTIC that runs no model).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from overlay.messages import ChatMessage, SamplingParams


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
    ``argmax``: the most likely token id.
    """

    token_id: int
    logprob: float
    expected_logprob: float
    argmax: int


class Generation(Protocol):
    """One running request: iterate for pieces; ``stats`` is set once it has finished."""

    stats: GenStats | None

    def __aiter__(self) -> AsyncIterator[Piece]: ...


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
