"""How much a framer gains by choosing its prompts (decision 0015, "What a framer can still do":
"picks prompts on which honest replies score badly"), measured on the real llama.cpp engine.

``python -m simulations.measure_prompt_choice [--prompts N] [--replies R] [--worst K] [--out FILE]``

A framer who commits users' requests to frame an honest node can first try prompts on its own
copy of the model and keep those whose honest replies score worst. Whether that helps depends on
how much of an honest reply's score is the prompt's and how much the sampling's. This measures it:

- Verifier: the default SmolLM2-135M-Instruct Q4_1 GGUF with ``score_fresh`` (as the auditor
  loads it); node: the same GGUF honouring the sampling parameters (an honest node).
- Prompts: the first N of ``/work/shared/data/user-prompts.jsonl`` (``../shared`` from the
  repository; at most 600 characters, one user message each; read at run time, not copied here).
- Setting: the framer's (``verifier.bench.audit_evasion.FRAMER_PARAMS``' temperature 1.0, top-p
  1, no top-k), 128 tokens (as ``simulations/data/audit_scores.json``); R replies per prompt,
  each with its own seed. Each reply's two-sided score (:func:`verifier.audit.scoring.score_reply`).
- **The framer's choice, cross-validated**: the framer ranks prompts by the mean score of the
  first half of their replies (its own trials) and keeps the K worst; the figure is the mean
  score, and the share under τ, of the *other* half of those prompts' replies (what the node's
  fresh replies would score), against the same over every prompt. Also the share of the score's
  variance that lies between prompts (one-way analysis of variance).

Output: JSON on stdout (and ``--out`` if given). Progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import trio

from gentorrent.bench.stats import cpu_model
from model_node.llama import LlamaCppEngine, resolve_model
from overlay.wire.messages import ChatMessage, SamplingParams
from simulations.measure_audit_scores import MAX_TOKENS, user_prompts
from simulations.measure_scores import _generate
from verifier.audit import reputation as rep
from verifier.audit import scoring


def choice(scores: list[list[float]], worst: int, tau: float) -> dict[str, float]:
    """The cross-validated figures of a framer's choice from per-prompt reply scores (each list in
    reply order; the first half is the framer's trials, the second the node's fresh replies)."""
    half = [len(s) // 2 for s in scores]
    trials = [statistics.fmean(s[:h]) for s, h in zip(scores, half, strict=True)]
    fresh = [s[h:] for s, h in zip(scores, half, strict=True)]
    chosen = sorted(range(len(scores)), key=lambda i: (trials[i], i))[:worst]
    picked = [x for i in chosen for x in fresh[i]]
    every = [x for f in fresh for x in f]
    return {"fresh_mean_all": statistics.fmean(every), "fresh_mean_chosen": statistics.fmean(picked),
            "fresh_below_tau_all": sum(x < tau for x in every) / len(every),
            "fresh_below_tau_chosen": sum(x < tau for x in picked) / len(picked),
            "chosen_prompts": float(worst)}


def between_share(scores: list[list[float]]) -> float:
    """The share of the scores' variance between prompts (one-way ANOVA's between-group sum of
    squares over the total)."""
    every = [x for s in scores for x in s]
    grand = statistics.fmean(every)
    total = sum((x - grand) ** 2 for x in every)
    between = sum(len(s) * (statistics.fmean(s) - grand) ** 2 for s in scores)
    return between / total if total > 0 else 0.0


async def _measure(n_prompts: int, replies: int) -> tuple[list[dict[str, Any]], list[list[float]]]:
    model_id, path = resolve_model(None)
    verifier = LlamaCppEngine(path, model_id=model_id, n_threads=1, slots=4, n_ctx=2048, score_fresh=True)
    node = LlamaCppEngine(path, model_id=model_id, n_ctx=1024, n_threads=1, cache_bytes=0)
    prompts = user_prompts(n_prompts)
    scores: list[list[float]] = []
    t0 = time.perf_counter()
    try:
        for pi, prompt in enumerate(prompts):
            ids = verifier.chat_prompt([ChatMessage("user", prompt["text"])])
            got = []
            for r in range(replies):
                params = SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_tokens=MAX_TOKENS,
                                        seed=10_000 * (pi + 1) + r)
                reply = await _generate(node, ids, params)
                if reply:
                    got.append((reply, params))
            scored = await verifier.score_batch([(ids, reply, params) for reply, params in got])
            scores.append([scoring.score_reply(s).score for s in scored])
            print(f"measure_prompt_choice: prompt {pi + 1}/{len(prompts)}: mean {statistics.fmean(scores[-1]):.3f} "
                  f"over {len(scores[-1])} replies ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    finally:
        verifier.close()
        node.close()
    return prompts, scores


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulations.measure_prompt_choice", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--replies", type=int, default=8, help="replies per prompt (even: half trials, half fresh)")
    parser.add_argument("--worst", type=int, default=4, help="prompts the framer keeps")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.replies < 2 or args.replies % 2 or not 1 <= args.worst <= args.prompts:
        parser.error("--replies must be even and at least 2; --worst within 1..--prompts")
    t0 = time.perf_counter()
    prompts, scores = trio.run(_measure, args.prompts, args.replies)
    scores = [s for s in scores if len(s) >= 2]
    tau = rep.TAU / rep.SCALE
    out = {"how": f"python -m simulations.measure_prompt_choice --prompts {args.prompts} --replies {args.replies} "
                  f"--worst {args.worst}: SmolLM2-135M-Instruct Q4_1 node and verifier (score_fresh), T 1.0, "
                  f"top-p 1, {MAX_TOKENS} tokens, one seed per reply",
           "cpu": cpu_model(), "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "seconds": round(time.perf_counter() - t0), "tau": tau,
           "between_prompt_variance_share": between_share(scores),
           "per_prompt_mean": [round(statistics.fmean(s), 4) for s in scores],
           "scores": scores, "prompt_lines": [p["line"] for p in prompts],
           **choice(scores, args.worst, tau)}
    text = json.dumps(out, indent=1)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
