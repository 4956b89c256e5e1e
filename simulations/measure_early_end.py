"""What a node gains by stopping its replies early, before and after the verifier scores the end
token such a reply claims (decision 0026, ``verifier.audit.loop.missing_end``).

``python -m simulations.measure_early_end [--prompts N] [--max-tokens M] [--out FILE]``

An honest node (the default model's Q4_1 GGUF, llama.cpp, one thread) answers each of the first
``N`` users' prompts of ``../shared/data/user-prompts.jsonl`` once at each of the clients' default
settings (T = 0.7 and T = 1.0, top-p 1, a seed per reply) with up to ``M`` tokens. A *truncating*
node runs the same weights but stops each reply at a uniformly drawn token before its end
(seeded), without an end token: it saves the rest of the work. The verifier (the same GGUF,
``score_fresh``) scores, per reply: the honest reply (which carries its end token); the cut
reply as it came (the rule before); and the cut reply with the model's end-of-turn token after
it (the rule now). The file (``simulations/data/early_end.json``) keeps, per setting, each
reply's prompt index, full and cut lengths and the three two-sided scores and z (never a text),
and a summary: how many of each fall under τ, and their means.
``tests/unit/test_audit_scores_measured.py`` holds the file to the rule in force.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import trio

from model_node.llama import LlamaCppEngine, resolve_model
from simulations.measure_audit_scores import measured_record, prompt_runs, save, user_prompts
from simulations.measure_scores import _generate
from verifier.audit import reputation as rep
from verifier.audit import scoring

EARLY_END_FILE = Path(__file__).parent / "data" / "early_end.json"
SETTINGS = {"t0.7": 0.7, "t1.0": 1.0}  # the clients' defaults
MAX_TOKENS = 256
KINDS = ("honest", "cut_as_sent", "cut_with_end")


def _row(scores: list[Any]) -> dict[str, float]:
    r = scoring.score_reply(scores)
    return {"score": r.score, "z": r.z, "tokens": r.tokens}


async def _measure(n_prompts: int, max_tokens: int) -> dict[str, Any]:
    model_id, path = resolve_model(None)
    verifier = LlamaCppEngine(path, model_id=model_id, n_threads=1, slots=4, n_ctx=2048, score_fresh=True)
    node = LlamaCppEngine(path, model_id=model_id, n_ctx=1024, n_threads=1, cache_bytes=0)
    end = verifier.end_token()
    assert end is not None
    prompts = user_prompts(n_prompts)
    rng = random.Random("early-end")
    samples: dict[str, list[dict[str, Any]]] = {s: [] for s in SETTINGS}
    t0 = time.perf_counter()
    try:
        for setting, pi, ids, (params,) in prompt_runs(verifier, SETTINGS, prompts, max_tokens):
            reply = await _generate(node, ids, params)
            if len(reply) < 3 or not verifier.is_end(reply[-1]):
                continue  # no room to cut before the end, or it ran to max_tokens
            cut = reply[:rng.randrange(1, len(reply) - 1)]
            rows = await verifier.score_batch([(ids, reply, params), (ids, cut, params), (ids, [*cut, end], params)])
            samples[setting].append({"prompt": pi, "full_tokens": len(reply), "cut_tokens": len(cut),
                                     **{k: _row(r) for k, r in zip(KINDS, rows, strict=True)}})
            print(f"measure_early_end: {setting} prompt {pi + 1}/{len(prompts)}: "
                  + " ".join(f"{k} {samples[setting][-1][k]['score']:.3f}" for k in KINDS)
                  + f" ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    finally:
        verifier.close()
        node.close()
    how = (f"python -m simulations.measure_early_end --prompts {n_prompts} --max-tokens {max_tokens}: llama.cpp "
           f"(llama-cpp-python {importlib.metadata.version('llama_cpp_python')}), {model_id} ({path.name}) as node "
           f"and verifier, 1 thread each, the verifier with score_fresh; end token {end}; cuts uniform in "
           "[1, length - 1) tokens, seeded")
    return measured_record(samples, SETTINGS, max_tokens, prompts, how, t0)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    tau = rep.TAU / rep.SCALE
    out: dict[str, Any] = {"n": len(rows)}
    for k in KINDS:
        out[f"{k}_below_tau"] = sum(r[k]["score"] < tau for r in rows)
        out[f"{k}_score_mean"] = statistics.fmean(r[k]["score"] for r in rows) if rows else 0.0
    out["work_saved_share"] = 1 - sum(r["cut_tokens"] for r in rows) / max(1, sum(r["full_tokens"] for r in rows))
    return out


def resummarize(data: dict[str, Any]) -> dict[str, Any]:
    data["tau"] = rep.TAU / rep.SCALE
    data["summary"] = {s: summarize(rows) for s, rows in data["samples"].items()}
    data["summary"]["all"] = summarize([r for rows in data["samples"].values() for r in rows])
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulations.measure_early_end", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    parser.add_argument("--out", type=Path, default=EARLY_END_FILE)
    args = parser.parse_args(argv)
    result = resummarize(trio.run(_measure, args.prompts, args.max_tokens))
    return save(args.out, result, result["summary"])


if __name__ == "__main__":
    raise SystemExit(main())
