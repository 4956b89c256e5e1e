"""Measure the audit scores of honest and degraded replies on the real llama.cpp engine
(issue 14 item 3; decision 0010 reads its figures).

``python -m simulations.measure_scores [--prompts N] [--max-tokens N] [--out FILE]``

- The verifier's model and the honest node's model: the default SmolLM2-135M-Instruct GGUF
  (Q4_1) that ``make setup`` installs.
- The degraded node's model: the same GGUF re-quantized to Q2_K with llama.cpp's own quantizer
  (``llama_model_quantize``, requantization allowed), written once into the cache folder
  (``$XDG_CACHE_HOME/gentorrent``, default ``~/.cache/gentorrent``; never committed).
- Prompts: N chat questions built from templates × topics (the challenge generator's shape:
  natural questions, never repeated).
- Sampling: greedy, temperature 0.7 and temperature 1.0 (top-p 1, no top-k: the user
  defaults), a fixed seed per (prompt, setting) so a rerun reproduces the replies.

For each setting and prompt, each node (honest, degraded) generates a reply; the verifier's
engine scores its ids in one teacher-forced pass (``Engine.score``) and
:func:`verifier.audit.scoring.score_reply` gives the calibrated score C and the raw 1/PPL.
Writes ``simulations/data/scores.json`` (the samples, summaries, how and where measured);
the reputation simulation and tests draw from it. Progress on stderr.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import trio

from gentorrent.bench.stats import cpu_model
from model_node.llama import LlamaCppEngine, resolve_model
from overlay.wire.messages import ChatMessage, SamplingParams
from verifier.audit.scoring import score_reply

SCORES_FILE = Path(__file__).parent / "data" / "scores.json"
SETTINGS = {"greedy": 0.0, "t0.7": 0.7, "t1.0": 1.0}
TEMPLATES = (
    "Explain {} to a ten-year-old in two sentences.",
    "What are the main advantages and drawbacks of {}?",
    "Give me three practical tips about {}.",
    "Write a short poem about {}.",
    "How would you describe {} to someone who has never heard of it?",
    "What is a common misconception about {}?",
)
TOPICS = (
    "photosynthesis", "public libraries", "learning a second language", "electric bicycles",
    "the water cycle", "compound interest", "volcanoes", "remote work", "honey bees",
    "composting at home", "the history of the printing press", "sleep hygiene",
)


def prompts(n: int) -> list[str]:
    """``n`` distinct questions: template i mod 6 with topic (i·5 + i // 12) mod 12, so the
    first 24 cover every template and every topic twice, without repeating a pair."""
    out: list[str] = []
    seen: set[tuple[int, int]] = set()
    i = 0
    while len(out) < n:
        t, k = i % len(TEMPLATES), (i * 5 + i // len(TOPICS)) % len(TOPICS)
        if (t, k) not in seen:
            seen.add((t, k))
            out.append(TEMPLATES[t].format(TOPICS[k]))
        i += 1
        if i > 10 * len(TEMPLATES) * len(TOPICS):
            raise ValueError(f"at most {len(TEMPLATES) * len(TOPICS)} distinct prompts")
    return out


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gentorrent"


def requantize_q2k(src: Path) -> Path:
    """``src`` re-quantized to Q2_K by llama.cpp's quantizer, cached by source name and size."""
    return requantize(src, "Q2_K")


#: what :func:`requantize` makes: name -> llama.cpp's file type constant's name
FTYPES = {"Q2_K": "LLAMA_FTYPE_MOSTLY_Q2_K", "F32": "LLAMA_FTYPE_ALL_F32"}


def requantize(src: Path, ftype: str) -> Path:
    """``src`` re-quantized to ``ftype`` (:data:`FTYPES`: Q2_K, a cheaper model; F32, the same
    weights dequantized, computed in float32 as another engine would) by llama.cpp's quantizer,
    cached by source name and size."""
    dst = cache_dir() / f"{src.stem}.{src.stat().st_size}.{ftype}.gguf"
    if dst.is_file():
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    import llama_cpp as L  # the engine is llama.cpp's; make setup installs it
    params = L.llama_model_quantize_default_params()
    params.ftype = getattr(L, FTYPES[ftype])
    params.allow_requantize = True
    params.nthread = 1
    tmp = dst.with_suffix(".part")
    rc = L.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({src} -> {ftype}) failed with {rc}")
    tmp.rename(dst)
    return dst


async def _generate(engine: LlamaCppEngine, ids: list[int], params: SamplingParams) -> list[int]:
    gen = engine.generate(ids, params)
    out: list[int] = []
    async for piece in gen:
        out += piece.token_ids
    return out


async def _measure(n_prompts: int, max_tokens: int) -> dict[str, Any]:
    model_id, path = resolve_model(None)
    degraded_path = requantize_q2k(path)
    verifier = LlamaCppEngine(path, model_id=model_id, n_ctx=1024, n_threads=1)
    honest = LlamaCppEngine(path, model_id=model_id, n_ctx=1024, n_threads=1, cache_bytes=0)
    degraded = LlamaCppEngine(degraded_path, model_id=model_id, n_ctx=1024, n_threads=1, cache_bytes=0)
    questions = prompts(n_prompts)
    samples: dict[str, dict[str, list[dict[str, Any]]]] = {s: {"honest": [], "degraded": []} for s in SETTINGS}
    total, done, t0 = len(SETTINGS) * len(questions) * 2, 0, time.perf_counter()
    try:
        for si, (setting, temp) in enumerate(SETTINGS.items()):
            for pi, q in enumerate(questions):
                ids = verifier.chat_prompt([ChatMessage("user", q)])
                params = SamplingParams(temperature=temp, top_p=1.0, top_k=0, max_tokens=max_tokens,
                                        seed=1000 * si + pi + 1)
                for role, node in (("honest", honest), ("degraded", degraded)):
                    reply = await _generate(node, ids, params)
                    if not reply:
                        continue
                    r = score_reply(await verifier.score(ids, reply, params))
                    samples[setting][role].append({
                        "prompt": pi, "calibrated": r.calibrated, "raw_inv_ppl": r.raw_inv_ppl,
                        "mean_logprob": r.mean_logprob, "mean_expected_logprob": r.mean_expected_logprob,
                        "argmax_agreement": r.argmax_agreement, "tokens": r.tokens})
                    done += 1
                    print(f"measure_scores: {done}/{total} {setting} {role} prompt {pi}: C {r.calibrated:.3f} "
                          f"1/PPL {r.raw_inv_ppl:.3f} ({time.perf_counter() - t0:.0f} s)",
                          file=sys.stderr, flush=True)
    finally:
        for e in (verifier, honest, degraded):
            e.close()
    return {
        "samples": samples,
        "summary": summarize(samples),
        "prompts": questions,
        "how": (f"python -m simulations.measure_scores --prompts {n_prompts} --max-tokens {max_tokens}: "
                f"llama.cpp (llama-cpp-python 0.3.36), verifier and honest node {model_id} "
                f"({path.name}), degraded node the same GGUF re-quantized to Q2_K by llama_model_quantize; "
                "each reply scored by the verifier's engine in one teacher-forced pass; "
                "C = exp(min(0, mean logprob - mean expected logprob)), raw = exp(mean logprob); "
                "top_p 1, top_k 0, a fixed seed per (prompt, setting)"),
        "cpu": cpu_model(),
        "measured": time.strftime("%Y-%m-%d"),
    }


def summarize(samples: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, dict[str, dict[str, float]]]:
    """Per setting and role: mean, min, max and median of C and of raw 1/PPL."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for setting, roles in samples.items():
        out[setting] = {}
        for role, rows in roles.items():
            if not rows:
                continue
            c = [r["calibrated"] for r in rows]
            raw = [r["raw_inv_ppl"] for r in rows]
            out[setting][role] = {
                "n": len(rows), "c_mean": statistics.fmean(c), "c_median": statistics.median(c),
                "c_min": min(c), "c_max": max(c), "raw_mean": statistics.fmean(raw), "raw_min": min(raw),
                "raw_max": max(raw)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulations.measure_scores", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--out", type=Path, default=SCORES_FILE)
    args = parser.parse_args(argv)
    result = trio.run(_measure, args.prompts, args.max_tokens)
    from simulations.measure_audit_scores import save  # it imports this module

    return save(args.out, result, result["summary"])


if __name__ == "__main__":
    raise SystemExit(main())
