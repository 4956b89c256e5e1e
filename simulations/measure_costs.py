"""Measure the forwarding simulation's cost constants on the real llama.cpp engine.

``python -m simulations.measure_costs`` loads SmolLM2-135M-Instruct (the project's default
model) with one thread, then times:

- prefill: cold first-token time of prompts of about 1,000 tokens, divided by the tokens
  evaluated (seconds per uncached prompt token);
- decode: 128-token greedy replies, time after the first token divided by the tokens after
  the first (seconds per output token).

It writes ``simulations/data/costs.json`` with the constants, the medians' inputs and the
machine they were measured on. The simulation reads that file; rerun this to refresh it.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import trio

from gentorrent.bench.stats import cpu_model
from model_node.llama import LlamaCppEngine, resolve_model
from overlay.wire.messages import ChatMessage, SamplingParams

COSTS_FILE = Path(__file__).parent / "data" / "costs.json"
TRIALS = 5


async def _measure() -> dict[str, object]:
    model_id, path = resolve_model(None)
    engine = LlamaCppEngine(path, model_id=model_id, n_ctx=2048, cache_bytes=0, n_threads=1)
    prefill, decode = [], []
    try:
        for i in range(TRIALS):
            text = f"[{i}] " + " ".join(f"Rule {j}: check the ledger {i * 100 + j} before noon." for j in range(80))
            ids = engine.chat_prompt([ChatMessage("system", text), ChatMessage("user", "Summarise.")])
            gen = engine.generate(ids, SamplingParams(temperature=0.0, max_tokens=1))
            async for _ in gen:
                pass
            assert gen.stats is not None
            prefill.append(gen.stats.ttft_s / gen.stats.evaluated_prompt_tokens)
            story = engine.chat_prompt([ChatMessage("user", f"Tell me a long story about dragon {i}.")])
            gen = engine.generate(story, SamplingParams(temperature=0.0, max_tokens=128))
            first, count = None, 0
            async for piece in gen:
                now = time.perf_counter()
                if first is None:
                    first, count = now, len(piece.token_ids) - 1
                else:
                    count += len(piece.token_ids)
            assert first is not None and count > 0
            decode.append((time.perf_counter() - first) / count)
            print(f"measure_costs: trial {i + 1}/{TRIALS}", file=sys.stderr, flush=True)
    finally:
        engine.close()
    return {
        "prefill_s_per_token": statistics.median(prefill),
        "decode_s_per_token": statistics.median(decode),
        "prefill_samples": prefill,
        "decode_samples": decode,
        "how": (f"llama.cpp (llama-cpp-python 0.3.36), {model_id}, 1 thread, n_ctx 2048: prefill = cold "
                "time to first token of ~1,000-token prompts / tokens evaluated; decode = time after the first "
                f"token of 128-token greedy replies / tokens after the first; medians of {TRIALS} trials "
                "(python -m simulations.measure_costs)"),
        "cpu": cpu_model(),
        "cores": len(os.sched_getaffinity(0)),
        "measured": time.strftime("%Y-%m-%d"),
    }


def main() -> None:
    costs = trio.run(_measure)
    COSTS_FILE.parent.mkdir(parents=True, exist_ok=True)
    COSTS_FILE.write_text(json.dumps(costs, indent=2) + "\n")
    print(json.dumps({k: costs[k] for k in ("prefill_s_per_token", "decode_s_per_token")}))


if __name__ == "__main__":
    main()
