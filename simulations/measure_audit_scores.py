"""Measure the two-sided audit score of honest and cheating model nodes on the real llama.cpp
engine, on real users' prompts (issue 27 item 4; decision 0013 §5 reads its figures).

``python -m simulations.measure_audit_scores [--prompts N] [--max-tokens N] [--out FILE]``
``python -m simulations.measure_audit_scores --rescore`` recomputes every reply's two-sided
score and the summary from the stored figures with the current rule (``Z_HIGH``), no engine.

- Verifier: the default SmolLM2-135M-Instruct Q4_1 GGUF (``make setup``), as the auditor loads
  it (``verifier.audit.loop._engine``: ``score_fresh``, 4 sequences, 2,048 tokens), one
  thread; the replies of one (prompt, setting) are scored in one ``score_batch`` call.
- Node kinds: ``honest`` (the same Q4_1 GGUF, honouring the sampling parameters),
  ``degraded`` (the GGUF re-quantized to Q2_K, :func:`simulations.measure_scores.requantize_q2k`,
  honouring them), ``greedy`` (Q2_K, always greedy whatever temperature is asked),
  ``greedy_honest_weights`` (Q4_1, always greedy).
- Prompts: the first N prompts of ``/work/shared/data/user-prompts.jsonl`` (``../shared`` from
  the repository; real users' requests; read at run time, not copied here) of at most 600
  characters, each as a single user message.
- Settings (:data:`SETTINGS`): ``greedy`` (T = 0), ``t0.7`` (T = 0.7, top-p 1: the user chat
  default), ``t1.0`` (T = 1, top-p 1: the gateway default), ``t0.7p0.9`` (T = 0.7, top-p 0.9);
  ``max_tokens`` 128, no top-k, a fixed seed per (prompt, setting).

The file (``simulations/data/audit_scores.json``) is a JSON object:

- ``samples[setting][kind]``: a list, one object per reply (empty replies are left out), in
  prompt order: ``prompt`` (index into ``prompts``), ``tokens`` (reply tokens), ``calibrated``
  (one-sided C), ``score`` (two-sided, what audits use), ``z``, ``mean_logprob``,
  ``mean_expected_logprob``, ``var_sum`` (Σ per-token variance, nats²), ``argmax_agreement``.
- ``summary[setting][kind]``: ``n``; ``score_{mean,median,min,max}``; ``calibrated_{mean,min,
  max}``; ``z_{mean,min,p01,p50,p99,max}`` (greedy: all 0); ``above_z_high`` (share of replies
  with z > Z_HIGH); ``epoch2_below_tau`` (share of 2-reply epoch means of ``score`` below τ,
  over every ordered pair of this cell's replies, with repetition: exact, not resampled).
- ``mixed[kind]``: the same epoch share when each challenge draws its setting uniformly among
  the clients' two defaults ``t0.7`` and ``t1.0`` (``users``), the three sampled settings
  (``sampled``) or all four (``all``).
- ``settings``, ``kinds``, ``prompts`` (``{"line": index in the JSONL, "sha256": of its text}``:
  the texts stay in ``../shared/data``, whose README forbids copies of them in the project),
  ``z_high``, ``tau``, ``how``, ``cpu``, ``measured`` (date, UTC), ``seconds``.

Progress on stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import math
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import trio

from gentorrent.bench.stats import cpu_model
from model_node.engine import TokenScore
from model_node.llama import LlamaCppEngine, resolve_model
from overlay.wire.messages import ChatMessage, SamplingParams
from simulations.measure_scores import _generate, requantize_q2k
from verifier.audit import reputation as rep
from verifier.audit import scoring

AUDIT_SCORES_FILE = Path(__file__).parent / "data" / "audit_scores.json"
USER_PROMPTS = Path(__file__).resolve().parents[2] / "shared" / "data" / "user-prompts.jsonl"
MAX_PROMPT_CHARS = 600
MAX_TOKENS = 128
#: name -> (temperature, top_p)
SETTINGS: dict[str, tuple[float, float]] = {
    "greedy": (0.0, 1.0), "t0.7": (0.7, 1.0), "t1.0": (1.0, 1.0), "t0.7p0.9": (0.7, 0.9)}
#: name -> (weights: "q4_1" | "q2_k", always greedy)
KINDS: dict[str, tuple[str, bool]] = {
    "honest": ("q4_1", False), "degraded": ("q2_k", False),
    "greedy": ("q2_k", True), "greedy_honest_weights": ("q4_1", True)}
KIND_TEXT = {
    "honest": "the verifier's own Q4_1 GGUF, honouring the sampling parameters",
    "degraded": "the GGUF re-quantized to Q2_K, honouring the sampling parameters",
    "greedy": "Q2_K, always greedy whatever temperature is asked",
    "greedy_honest_weights": "Q4_1, always greedy whatever temperature is asked",
}


def prompt_record(prompt: dict[str, Any]) -> dict[str, Any]:
    """What the results keep of a prompt of :func:`user_prompts`: its line and its text's SHA-256
    (to tell whether the file changed since), never the text (the data's README forbids copies)."""
    return {"line": prompt["line"], "sha256": hashlib.sha256(prompt["text"].encode()).hexdigest()}


def measured_record(samples: dict[str, Any], settings: dict[str, float], max_tokens: int,
                    prompts: list[dict[str, Any]], how: str, t0: float) -> dict[str, Any]:
    """A measurement's file body: its samples, its settings (temperature per name, top-p 1, no
    top-k), the prompts as :func:`prompt_record` keeps them, how it was made, on what CPU, when,
    and how long it took since ``t0`` (``time.perf_counter``)."""
    from gentorrent.bench.stats import cpu_model

    return {
        "samples": samples,
        "settings": {s: {"temperature": t, "top_p": 1.0, "top_k": 0, "max_tokens": max_tokens}
                     for s, t in settings.items()},
        "prompts": [prompt_record(p) for p in prompts],
        "how": how,
        "cpu": cpu_model(),
        "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "seconds": round(time.perf_counter() - t0),
    }


def prompt_runs(engine: LlamaCppEngine, settings: dict[str, float], prompts: list[dict[str, Any]], max_tokens: int,
                replies: int = 1) -> Iterator[tuple[str, int, list[int], list[SamplingParams]]]:
    """For each setting (a temperature, top-p 1, no top-k) and each prompt: the setting's name, the
    prompt's index, its chat prompt under ``engine``, and the parameters of each of ``replies``
    replies, seeded by setting, prompt and reply."""
    for si, (setting, temp) in enumerate(settings.items()):
        for pi, prompt in enumerate(prompts):
            ids = engine.chat_prompt([ChatMessage("user", prompt["text"])])
            yield setting, pi, ids, [SamplingParams(temperature=temp, top_p=1.0, top_k=0, max_tokens=max_tokens,
                                                    seed=100_000 * si + 100 * pi + j + 1) for j in range(replies)]


def save(out: Path, result: dict[str, Any], shown: dict[str, Any]) -> int:
    """Write a measurement's ``result`` to ``out`` (JSON, its folder made) and print ``shown``; 0."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(shown, indent=1))
    return 0


def user_prompts(n: int, path: Path = USER_PROMPTS) -> list[dict[str, Any]]:
    """The first ``n`` prompts of ``path`` (JSON lines with a ``prompt``) of at most
    :data:`MAX_PROMPT_CHARS` characters: ``{"line": index, "text": prompt}``."""
    out: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f):
            if len(out) == n:
                break
            text = json.loads(line)["prompt"]
            if isinstance(text, str) and text.strip() and len(text) <= MAX_PROMPT_CHARS:
                out.append({"line": line_no, "text": text})
    if len(out) < n:
        raise ValueError(f"{path} holds only {len(out)} prompts of at most {MAX_PROMPT_CHARS} characters")
    return out


def sample_row(prompt: int, scores: list[TokenScore]) -> dict[str, Any]:
    r = scoring.score_reply(scores)
    return {"prompt": prompt, "tokens": r.tokens, "calibrated": r.calibrated, "score": r.score, "z": r.z,
            "mean_logprob": r.mean_logprob, "mean_expected_logprob": r.mean_expected_logprob,
            "var_sum": math.fsum(s.var_logprob for s in scores), "argmax_agreement": r.argmax_agreement}


def _position_extras(logp_row: Any, tok: int, params: SamplingParams) -> list[float]:
    """Diagnostics of one scored position under the sampling distribution q (the cut
    :func:`model_node.engine.logprob_moments` applies): q(argmax), the token's mid-rank
    u = q(lp < lp_tok) + q(lp = lp_tok) / 2 (uniform-like with mean 1/2 under honest sampling)
    and u's variance (1 − Σq³) / 12."""
    import numpy as np

    from model_node.engine import _nucleus

    lp = np.asarray(logp_row, dtype=np.float64)
    q = np.zeros_like(lp)
    if params.temperature <= 0.0:
        q[int(lp.argmax())] = 1.0
    else:
        sc = lp / params.temperature
        keep = np.argpartition(-sc, params.top_k - 1)[:params.top_k] if 0 < params.top_k < lp.size else None
        if params.top_p < 1.0:
            keep = _nucleus(sc, keep, params.top_p)
        idx = np.arange(lp.size) if keep is None else np.asarray(keep)
        w = np.exp(sc[idx] - sc[idx].max())
        q[idx] = w / w.sum()
    u = float(q[lp < lp[tok]].sum() + 0.5 * q[lp == lp[tok]].sum())
    return [float(q[int(lp.argmax())]), u, float((1.0 - (q ** 3).sum()) / 12.0)]


def _instrument() -> dict[int, tuple[TokenScore, list[float]]]:
    """Wrap :func:`model_node.llama.score_rows` so every TokenScore it makes is filed (by id)
    with :func:`_position_extras` (diagnostics for ``--tokens-out`` only)."""
    import numpy as np

    import model_node.llama.scoring as llama

    filed: dict[int, tuple[TokenScore, list[float]]] = {}
    inner = llama.score_rows

    def score_rows(logits: Any, targets: Any, params: SamplingParams) -> list[TokenScore]:
        out = inner(logits, targets, params)
        z = np.asarray(logits, dtype=np.float64)
        zmax = z.max(axis=1, keepdims=True)
        logp = z - (zmax + np.log(np.exp(z - zmax).sum(axis=1, keepdims=True)))
        for i, (ts, tok) in enumerate(zip(out, targets, strict=True)):
            filed[id(ts)] = (ts, _position_extras(logp[i], int(tok), params))
        return out

    llama.score_rows = score_rows
    return filed


async def _measure(n_prompts: int, max_tokens: int, tokens_out: Path | None = None) -> dict[str, Any]:
    filed = _instrument() if tokens_out is not None else {}
    model_id, path = resolve_model(None)
    q2k = requantize_q2k(path)
    verifier = LlamaCppEngine(path, model_id=model_id, n_threads=1, slots=4, n_ctx=2048, score_fresh=True)
    nodes = {"q4_1": LlamaCppEngine(path, model_id=model_id, n_ctx=1024, n_threads=1, cache_bytes=0),
             "q2_k": LlamaCppEngine(q2k, model_id=model_id, n_ctx=1024, n_threads=1, cache_bytes=0)}
    prompts = user_prompts(n_prompts)
    samples: dict[str, dict[str, list[dict[str, Any]]]] = {s: {k: [] for k in KINDS} for s in SETTINGS}
    replies: dict[tuple[str, int, float, float, int | None], list[int]] = {}  # generation cache
    per_token: dict[str, dict[str, list[list[list[Any]]]]] = {s: {k: [] for k in KINDS} for s in SETTINGS}
    t0, done, total = time.perf_counter(), 0, len(SETTINGS) * len(prompts)
    try:
        for si, (setting, (temp, top_p)) in enumerate(SETTINGS.items()):
            for pi, prompt in enumerate(prompts):
                ids = verifier.chat_prompt([ChatMessage("user", prompt["text"])])
                params = SamplingParams(temperature=temp, top_p=top_p, top_k=0, max_tokens=max_tokens,
                                        seed=1000 * si + pi + 1)
                got: dict[str, list[int]] = {}
                for kind, (weights, always_greedy) in KINDS.items():
                    run = SamplingParams(temperature=0.0, top_p=1.0, top_k=0, max_tokens=max_tokens,
                                         seed=None) if always_greedy else params
                    key = (weights, pi, run.temperature, run.top_p, run.seed if run.temperature > 0 else None)
                    if key not in replies:
                        replies[key] = await _generate(nodes[weights], ids, run)
                    got[kind] = replies[key]
                distinct = list({tuple(r): r for r in got.values() if r}.values())
                scored = await verifier.score_batch([(ids, r, params) for r in distinct])
                by_reply = {tuple(r): s for r, s in zip(distinct, scored, strict=True)}
                for kind, reply in got.items():
                    if reply:
                        samples[setting][kind].append(sample_row(pi, by_reply[tuple(reply)]))
                        if tokens_out is not None:
                            per_token[setting][kind].append(
                                [[s.token_id, s.logprob, s.expected_logprob, s.var_logprob, s.argmax,
                                  *filed[id(s)][1]] for s in by_reply[tuple(reply)]])
                done += 1
                line = " ".join(f"{k} {samples[setting][k][-1]['score']:.3f}/z {samples[setting][k][-1]['z']:+.1f}"
                                for k in KINDS if got[k])
                print(f"measure_audit_scores: {done}/{total} {setting} prompt {pi}: {line} "
                      f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    finally:
        for e in (verifier, *nodes.values()):
            e.close()
    if tokens_out is not None:
        await trio.Path(tokens_out).write_text(json.dumps(per_token))
    data: dict[str, Any] = {
        "samples": samples,
        "settings": {s: {"temperature": t, "top_p": p, "top_k": 0, "max_tokens": max_tokens}
                     for s, (t, p) in SETTINGS.items()},
        "kinds": KIND_TEXT,
        "prompts": [prompt_record(p) for p in prompts],
        "how": (f"python -m simulations.measure_audit_scores --prompts {n_prompts} --max-tokens {max_tokens}: "
                f"llama.cpp (llama-cpp-python {importlib.metadata.version('llama_cpp_python')}), verifier {model_id} ({path.name}) with score_fresh, 1 thread, "
                "score_batch per (prompt, setting); nodes Q4_1 and Q2_K (llama_model_quantize, requantized), "
                "1 thread each; the first prompts of shared/data/user-prompts.jsonl up to "
                f"{MAX_PROMPT_CHARS} characters, one user message each; a fixed seed per (prompt, setting)"),
        "cpu": cpu_model(),
        "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "seconds": round(time.perf_counter() - t0),
    }
    return rescore(data)


def rescore(data: dict[str, Any]) -> dict[str, Any]:
    """Recompute every sample's ``score`` from its stored figures with the current
    :func:`verifier.audit.scoring.two_sided` and ``Z_HIGH``, then the summaries."""
    for cells in data["samples"].values():
        for rows in cells.values():
            for r in rows:
                r["score"] = scoring.two_sided(r["mean_logprob"], r["mean_expected_logprob"], r["z"])
    data["z_high"] = scoring.Z_HIGH
    data["tau"] = rep.TAU / rep.SCALE
    data["summary"] = summarize(data["samples"])
    data["mixed"] = mixed(data["samples"])
    return data


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def epoch2_below(pool: list[float], tau: float) -> float:
    """The share of 2-reply epoch means below ``tau``, each reply an independent uniform draw from
    ``pool`` (exact over every ordered pair)."""
    n = len(pool)
    return sum((a + b) / 2 < tau for a in pool for b in pool) / (n * n)


def summarize(samples: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, dict[str, dict[str, float]]]:
    tau = rep.TAU / rep.SCALE
    out: dict[str, dict[str, dict[str, float]]] = {}
    for setting, cells in samples.items():
        out[setting] = {}
        for kind, rows in cells.items():
            if not rows:
                continue
            sc, c, z = ([r[f] for r in rows] for f in ("score", "calibrated", "z"))
            out[setting][kind] = {
                "n": len(rows), "score_mean": statistics.fmean(sc), "score_median": statistics.median(sc),
                "score_min": min(sc), "score_max": max(sc), "calibrated_mean": statistics.fmean(c),
                "calibrated_min": min(c), "calibrated_max": max(c), "z_mean": statistics.fmean(z), "z_min": min(z),
                "z_p01": _pct(z, 0.01), "z_p50": statistics.median(z), "z_p99": _pct(z, 0.99), "z_max": max(z),
                "above_z_high": sum(x > scoring.Z_HIGH for x in z) / len(z),
                "epoch2_below_tau": epoch2_below(sc, tau)}
    return out


def mixed(samples: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, dict[str, float]]:
    """Per kind: the 2-reply epoch share below τ when each challenge's setting is uniform among the
    clients' defaults (``users``), the sampled settings (``sampled``) or all of them (``all``); each
    setting's replies weighted equally."""
    tau = rep.TAU / rep.SCALE
    out: dict[str, dict[str, float]] = {}
    for kind in next(iter(samples.values())):
        out[kind] = {}
        for name, settings in (("users", [s for s in ("t0.7", "t1.0") if s in samples]),
                               ("sampled", [s for s in samples if s != "greedy"]), ("all", list(samples))):
            pools = [p for p in ([r["score"] for r in samples[s][kind]] for s in settings) if p]
            below = 0.0
            for a in pools:
                for b in pools:
                    below += sum((x + y) / 2 < tau for x in a for y in b) / (len(a) * len(b))
            out[kind][name] = below / (len(pools) ** 2)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulations.measure_audit_scores", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    parser.add_argument("--out", type=Path, default=AUDIT_SCORES_FILE)
    parser.add_argument("--tokens-out", type=Path, default=None,
                        help="also write every scored position's [token, logprob, expected, variance, argmax, "
                             "q(argmax), mid-rank u, var u] here (a diagnostic)")
    parser.add_argument("--rescore", action="store_true",
                        help="recompute scores and summaries of --out from its stored figures (no engine)")
    args = parser.parse_args(argv)
    if args.rescore:
        result = rescore(json.loads(args.out.read_text()))
    else:
        from model_node.llama import extra_buffers

        result = trio.run(_measure, args.prompts, args.max_tokens, args.tokens_out)
        result["how"] += ("" if extra_buffers() else
                          "; llama.cpp's extra (repacking) buffer types off: the CPU advertises AMX (model_node.llama)")
    return save(args.out, result, {"summary": result["summary"], "mixed": result["mixed"]})


if __name__ == "__main__":
    raise SystemExit(main())
