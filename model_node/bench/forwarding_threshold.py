"""``gentorrent bench forwarding-threshold``: sweep Algorithm 2's load threshold with the real
llama.cpp engine (docs/decisions/0005-hrtree.md).

A cache holder is chosen while its relative load (since issue 19: seconds of work, the prompt
and output tokens it holds at its measured rates, forwards since its report included;
docs/forwarding.md "Load") is under the threshold; above it the request goes to the least loaded node,
which usually has to evaluate the whole prompt. A low threshold spreads load but throws caches
away; a high one queues requests behind a busy holder. The threshold only matters when holders
are busy, so this sweep plays the ``bench forwarding`` workload (same seeded system prompts,
Zipf(1.1) popularity, questions and entry nodes, HR-tree forwarding, three single-threaded
model-node processes, at most 4 cached prefixes each) at ``RATE_FACTORS`` times its arrival rate,
with 150 requests, once per threshold in ``THRESHOLDS``, each on fresh processes.

``--quick``: 8 requests, 3 system prompts of 400–500 tokens, syncs every second, thresholds 5 and
10, one rate.
Full run ≈ 22 minutes on the 2-core dev machine.

Figures, for rate factor ``xF`` and threshold ``T``: ``ttft_xF_tT_{mean,p50,p99}_ms``,
``latency_xF_tT_mean_ms``, ``cache_hit_rate_xF_tT``, ``forwarded_frac_xF_tT``,
``overloaded_frac_xF_tT`` (requests whose prompt matched a holder that was over the threshold),
``busiest_node_share_xF_tT``, ``cpu_utilisation_xF_tT``, ``foreign_cpu_xF_tT``,
``refused_frac_xF_tT`` (requests every node refused as busy), ``lost_xF_tT`` (requests neither
answered nor refused); and, per rate, ``ttft_mean_ratio_xF_tT_vs_t10`` against the default
threshold, 10 s of work (:data:`~model_node.forwarding.DEFAULT_LOAD_THRESHOLD`). Thresholds are
labelled with ``_`` for the decimal point (``t2_5`` is 2.5 s). Requests refused as "busy" by
every node are not in the TTFT figures; the params' ``attempts`` count the requests sent, busy
retries included.
"""

from __future__ import annotations

import math
import os
from typing import Any

from gentorrent.bench.stats import cpu_model, summarize_ms
from model_node.bench.forwarding import (
    QUICK_SYNC_INTERVAL,
    QUICK_SYSTEM_TOKENS,
    RATE,
    SEED,
    SNAPSHOTS,
    SYNC_INTERVAL,
    SYSTEM_PROMPTS,
    SYSTEM_TOKENS,
    ZIPF_S,
    _decisions,
    play,
    prompts,
    workload,
)
from model_node.forwarding import DEFAULT_LOAD_THRESHOLD
from model_node.llama import resolve_model

THRESHOLDS = (2.5, 5.0, 10.0, 20.0)  # seconds of work: a quarter of the default to twice it
QUICK_THRESHOLDS = (5.0, 10.0)
RATE_FACTORS = (2, 4)
RATIO_BASE = DEFAULT_LOAD_THRESHOLD  # ratios are against the default threshold
REQUESTS = 150


def _label(x: float) -> str:
    return f"{x:g}".replace(".", "_")


def run(quick: bool) -> tuple[dict[str, Any], dict[str, float]]:
    thresholds = QUICK_THRESHOLDS if quick else THRESHOLDS
    factors = (2,) if quick else RATE_FACTORS
    n_requests = 8 if quick else REQUESTS
    n_system = 3 if quick else SYSTEM_PROMPTS
    lo, hi = QUICK_SYSTEM_TOKENS if quick else SYSTEM_TOKENS
    sync = QUICK_SYNC_INTERVAL if quick else SYNC_INTERVAL
    model_id, path = resolve_model(None)
    systems, system_tokens, _ = prompts(n_system, lo, hi)
    figures: dict[str, float] = {}
    walls: dict[str, float] = {}
    decisions: dict[str, dict[str, int]] = {}
    attempts: dict[str, int] = {}  # requests sent, busy refusals' retries included
    for f in factors:
        jobs = workload(n_requests, n_system, RATE * f, 3, SEED)
        for t in thresholds:
            key = f"x{f}_t{_label(t)}"
            r = play("hrtree", jobs, systems, 4 if quick else 16, load_threshold=t, sync_interval=sync)
            figures.update(summarize_ms(f"ttft_{key}", r["ttft"]))
            figures[f"latency_{key}_mean_ms"] = 1000 * sum(r["latency"]) / len(r["latency"]) if r["latency"] else math.nan
            d = _decisions(r["stats"])
            for k in ("cache_hit_rate", "forwarded_frac", "busiest_node_share", "cpu_utilisation", "foreign_cpu",
                      "failed_frac"):
                figures[f"{k}_{key}"] = r[k]
            figures[f"overloaded_frac_{key}"] = d.get("match-overloaded", 0) / n_requests
            figures[f"refused_frac_{key}"] = r["refused_frac"]
            figures[f"lost_{key}"] = float(r["lost"])
            walls[key] = round(r["wall"], 1)
            attempts[key] = r["attempts"]
            decisions[key] = d
        base = f"ttft_x{f}_t{_label(RATIO_BASE)}_mean_ms"
        for t in thresholds:
            key = f"x{f}_t{_label(t)}"
            figures[f"ttft_mean_ratio_{key}_vs_t{_label(RATIO_BASE)}"] = (
                figures[f"ttft_{key}_mean_ms"] / figures[base])
    params = {
        "model": f"{model_id} ({path.name})", "engine": "llama.cpp (llama-cpp-python 0.3.36), batch-invariant",
        "policy": "hrtree", "model_nodes": 3, "threads_per_node": 1, "cores": len(os.sched_getaffinity(0)),
        "cpu": cpu_model(), "cached_prefixes_per_node": SNAPSHOTS + 1, "sync_interval_s": sync,
        "capacity_score": 1, "thresholds": list(thresholds), "default_threshold": DEFAULT_LOAD_THRESHOLD,
        "arrival_rates_per_s": {f"x{f}": round(RATE * f, 3) for f in factors}, "requests": n_requests,
        "system_prompts": n_system, "system_prompt_tokens": system_tokens, "popularity": f"Zipf({ZIPF_S})",
        "seed": SEED, "fresh_processes_per_run": True, "wall_s": walls, "decisions": decisions,
        "attempts": attempts,
    }
    return params, figures
