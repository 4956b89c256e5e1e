"""The ``echo`` engine: a labelled DIAGNOSTIC that streams the last user message back.

It exercises the whole anonymous protocol without a model (tests, overlay
benchmarks). It is never a default: ``--engine echo`` must be asked for.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import trio

from overlay.messages import ChatMessage, SamplingParams


class EchoEngine:
    name = "echo"

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay  # seconds between pieces, to make streaming visible

    async def stream(self, messages: tuple[ChatMessage, ...], params: SamplingParams) -> AsyncIterator[str]:
        text = next((m.content for m in reversed(messages) if m.role == "user"), "")
        words = text.split(" ")
        for i, w in enumerate(words[: max(0, params.max_tokens)]):
            if self.delay:
                await trio.sleep(self.delay)
            yield w if i == 0 else " " + w
