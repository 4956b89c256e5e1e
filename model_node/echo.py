"""The ``echo`` engine: a labelled DIAGNOSTIC that streams the last user message back.

It exercises the whole anonymous protocol without a model (tests, overlay
benchmarks). It is never a default: ``--engine echo`` must be asked for. Its
"tokens" are UTF-8 bytes, its pieces are words, and its chat template is a
plain ``<|role|>content`` layout, so failover continuations work as with a model.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncGenerator, Sequence

import trio

from model_node.engine import EngineError, GenStats, Piece, TokenScore
from overlay.wire.messages import ChatMessage, SamplingParams

_ASSISTANT = "<|assistant|>"
_PIECES = re.compile(r"\s*\S+|\s+")  # words with their leading whitespace; joins back exactly


class EchoGeneration:
    def __init__(self, engine: EchoEngine, prompt: str, n_prompt: int, params: SamplingParams) -> None:
        self.engine, self.prompt, self.n_prompt, self.params = engine, prompt, n_prompt, params
        self.stats: GenStats | None = None

    async def __aiter__(self) -> AsyncGenerator[Piece, None]:
        t0 = time.perf_counter()
        ttft = 0.0
        user, _, continuation = self.prompt.rpartition(_ASSISTANT)
        user = user.rsplit("<|user|>", 1)[-1].rstrip("\n")
        rest = user[len(continuation):] if user.startswith(continuation) else user
        n_out = 0
        finish = "stop"
        for i, text in enumerate(_PIECES.findall(rest)):
            if i >= self.params.max_tokens:
                finish = "length"
                break
            if self.engine.delay:
                await trio.sleep(self.engine.delay)
            ids = tuple(text.encode())
            if i == 0:
                ttft = time.perf_counter() - t0
            n_out += len(ids)
            yield Piece(text, ids)
        self.stats = GenStats(self.n_prompt, self.n_prompt, n_out, ttft, finish)


class EchoEngine:
    name = "echo"
    context_window = 1 << 20

    def __init__(self, model: str = "echo", delay: float = 0.0) -> None:
        self.model = model
        self.delay = delay  # seconds between pieces, to make streaming visible

    def chat_prompt(self, messages: Sequence[ChatMessage], continuation: str = "") -> list[int]:
        text = "".join(f"<|{m.role}|>{m.content}\n" for m in messages) + _ASSISTANT + continuation
        return list(text.encode())

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> EchoGeneration:
        if len(prompt_ids) > self.context_window:
            raise EngineError(f"prompt of {len(prompt_ids)} tokens exceeds the context window")
        return EchoGeneration(self, bytes(prompt_ids).decode(errors="replace"), len(prompt_ids), params)

    async def score(self, prompt_ids: list[int], continuation_ids: list[int],
                    params: SamplingParams) -> list[TokenScore]:
        return [TokenScore(t, 0.0, 0.0, t) for t in continuation_ids]

    def cached_prefixes(self) -> list[tuple[int, ...]]:
        return []

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return bytes(token_ids).decode(errors="replace")
