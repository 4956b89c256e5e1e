"""How often an honest reply's z lies beyond ``Z_HIGH``: the check behind the significance cap
(decision 0019), on the real engine and users' default settings and lengths.

``python -m simulations.measure_honest_z [--prompts N] [--replies R] [--max-tokens M] [--out FILE]
[--node-weights F32]``

An honest node (the default model's Q4_1 GGUF, llama.cpp, one thread) answers each of the first
``N`` users' prompts of ``../shared/data/user-prompts.jsonl`` (at most 600 characters, one user
message) ``R`` times at each of the clients' default settings (``user chat``: T = 0.7; the
gateway: T = 1.0; top-p 1, a seed per reply) with up to ``M`` tokens (256: the clients' default);
the verifier's engine (the same GGUF, ``score_fresh``) scores every reply once. With
``--node-weights F32`` the node runs the same weights dequantized to float32 by llama.cpp's
quantizer (another engine's arithmetic on the same values: ``simulations/data/honest_z_f32.json``,
decision 0023). The file
(``simulations/data/honest_z.json``) keeps, per setting, every reply's prompt index, tokens,
z, C and two-sided score (never a prompt's or a reply's text), and a summary: the mean and sd of
z, its extremes, how many replies lie beyond ``Z_HIGH`` on either side, and how many replies the
cap moved under τ that C alone left above it. ``tests/unit/test_audit_scores_measured.py`` holds
the file to the rule in force.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import trio

from model_node.llama import LlamaCppEngine, resolve_model
from simulations.measure_audit_scores import measured_record, prompt_runs, sample_row, save, user_prompts
from simulations.measure_scores import _generate, requantize
from verifier.audit import reputation as rep
from verifier.audit import scoring

HONEST_Z_FILE = Path(__file__).parent / "data" / "honest_z.json"
#: name -> temperature (top-p 1, no top-k): the clients' defaults.
SETTINGS = {"t0.7": 0.7, "t1.0": 1.0}
MAX_TOKENS = 256


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Figures of one setting's replies under the rule in force (``scoring.two_sided``)."""
    tau = rep.TAU / rep.SCALE
    z = [r["z"] for r in rows]
    return {
        "n": len(rows), "tokens_mean": statistics.fmean(r["tokens"] for r in rows),
        "z_mean": statistics.fmean(z), "z_sd": statistics.stdev(z), "z_min": min(z), "z_max": max(z),
        "beyond_z_high": sum(abs(x) > scoring.Z_HIGH for x in z),
        "score_mean": statistics.fmean(r["score"] for r in rows),
        "below_tau_calibrated": sum(r["calibrated"] < tau for r in rows),
        "below_tau_score": sum(r["score"] < tau for r in rows),
    }


async def _measure(n_prompts: int, replies: int, max_tokens: int, node_weights: str = "") -> dict[str, Any]:
    model_id, path = resolve_model(None)
    node_path = requantize(path, node_weights) if node_weights else path
    verifier = LlamaCppEngine(path, model_id=model_id, n_threads=1, slots=4, n_ctx=2048, score_fresh=True)
    node = LlamaCppEngine(node_path, model_id=model_id, n_ctx=1024, n_threads=1, cache_bytes=0)
    prompts = user_prompts(n_prompts)
    samples: dict[str, list[dict[str, Any]]] = {s: [] for s in SETTINGS}
    t0 = time.perf_counter()
    try:
        for setting, pi, ids, runs in prompt_runs(verifier, SETTINGS, prompts, max_tokens, replies):
            got = [await _generate(node, ids, p) for p in runs]
            todo = [(ids, r, p) for r, p in zip(got, runs, strict=True) if r]
            for row in await verifier.score_batch(todo):
                samples[setting].append(sample_row(pi, row))
            last = samples[setting][-len(todo):]
            print(f"measure_honest_z: {setting} prompt {pi + 1}/{len(prompts)}: z "
                  + " ".join(f"{r['z']:+.2f}" for r in last) + f" ({time.perf_counter() - t0:.0f} s)",
                  file=sys.stderr, flush=True)
    finally:
        verifier.close()
        node.close()
    how = (f"python -m simulations.measure_honest_z --prompts {n_prompts} --replies {replies} "
           f"--max-tokens {max_tokens}" + (f" --node-weights {node_weights}" if node_weights else "")
           + f": llama.cpp (llama-cpp-python {importlib.metadata.version('llama_cpp_python')}), verifier "
           f"{model_id} ({path.name}), node {node_path.name}"
           + (" (the verifier's weights dequantized by llama.cpp's quantizer: the same values, computed "
              "in float32 without the Q4_1 kernels, as another engine computes them)" if node_weights else "")
           + ", 1 thread each, the verifier with score_fresh")
    return measured_record(samples, SETTINGS, max_tokens, prompts, how, t0)


def resummarize(data: dict[str, Any]) -> dict[str, Any]:
    """Recompute every reply's score under the rule in force, then the summaries."""
    for rows in data["samples"].values():
        for r in rows:
            r["score"] = scoring.two_sided(r["mean_logprob"], r["mean_expected_logprob"], r["z"])
    data["z_high"] = scoring.Z_HIGH
    data["tau"] = rep.TAU / rep.SCALE
    data["summary"] = {s: summarize(rows) for s, rows in data["samples"].items()}
    everything = [r for rows in data["samples"].values() for r in rows]
    data["summary"]["all"] = summarize(everything)
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulations.measure_honest_z", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--replies", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    parser.add_argument("--out", type=Path, default=HONEST_Z_FILE)
    parser.add_argument("--node-weights", choices=["F32"], default="",
                        help="the honest node runs the verifier's weights dequantized to this type (F32: the "
                             "same values computed in float32, as vLLM and other engines compute them) instead "
                             "of the verifier's very file")
    parser.add_argument("--rescore", action="store_true",
                        help="recompute scores and summaries of --out from its stored figures (no engine)")
    args = parser.parse_args(argv)
    if args.rescore:
        result = resummarize(json.loads(args.out.read_text()))
    else:
        result = resummarize(trio.run(_measure, args.prompts, args.replies, args.max_tokens, args.node_weights))
    return save(args.out, result, result["summary"])


if __name__ == "__main__":
    raise SystemExit(main())
