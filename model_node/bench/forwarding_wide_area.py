"""``gentorrent bench forwarding-wide-area``: forwarding rules across real llama.cpp model nodes
placed in the wide-area testbed's regions (issue 29; docs/testbed.md; docs/benchmarks.md
"forwarding-wide-area").

``bench forwarding`` compares the rules on loopback, where a forward costs a fraction of a
millisecond. Here each of :data:`MODELS` ``gentorrent model-node --engine llama.cpp`` processes
(the default model) sits in its own region (:mod:`gentorrent.tools.regions`) behind Toxiproxy
access links (:class:`gentorrent.tools.testbed.Testbed`, no relays, no committee: a signed registry
file), so a forward from one node to another, its group sync and its reply pay the published
one-way delays between their regions, and the client (in :data:`CLIENT_REGION`) pays its own to
the entry node. The workload is ``bench forwarding``'s (:func:`model_node.bench.forwarding.workload`:
Zipf-popular system prompts of 800-1,500 tokens, a short question, greedy, 16 tokens, Poisson
arrivals, an entry node chosen uniformly), played once per rule on fresh processes:

- ``hrtree``: the product's rule (:meth:`model_node.group.GroupState.decide`: the least predicted
  time to first token, from the HR-tree's match and the nodes' pushed loads);
- ``alg2``: the paper's Algorithm 2 (:func:`model_node.bench.policies.paper_algorithm2`);
- ``load``: caches ignored, the least queued work (:func:`model_node.bench.policies.least_loaded`).

Neither rule knows the delays: a forward is taken for free. What it costs is in the figures.

Figures, per rule ``P``: ``ttft_P_{mean,p50,p99}_ms`` (request sent -> first reply chunk, the
client's delay to its entry node included), ``latency_P_...``, ``cache_hit_rate_P``,
``prompt_reuse_P``, ``forwarded_frac_P``, ``busiest_node_share_P``, ``failed_frac_P``,
``refused_frac_P``; and ``ttft_{mean,p99}_ratio_hrtree_vs_load``,
``ttft_{mean,p99}_ratio_alg2_vs_load``, ``ttft_mean_ratio_hrtree_vs_alg2``. Params carry each
model node's region, the one-way delays between them and the decisions each rule took.

``--quick``: 2 model nodes, 8 requests, 3 system prompts of 400-500 tokens, syncs every second, rules ``hrtree`` and
``load`` only (checks the bench runs; its figures mean little). Full run: about 25 minutes.
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gentorrent.bench.stats import cpu_model, summarize_ms
from model_node.bench import forwarding as fw
from model_node.llama import DEFAULT_MODEL_ID, resolve_model

MODELS = 6
RULES = ("hrtree", "alg2", "load")
CLIENT_REGION = "eu-west"
RATE = 0.3  # requests/s: six single-thread engines share the same 2 cores as bench forwarding's three
REQUESTS = 100


def play(rule: str, jobs: list[fw.Job], systems: list[str], models: int, warm: int,
         sync_interval: float = fw.SYNC_INTERVAL) -> dict[str, Any]:
    """Play ``jobs`` on ``models`` fresh llama.cpp model nodes in the testbed's regions, forwarding
    by ``rule``; the result of :func:`model_node.bench.forwarding._play` plus the regions."""
    from gentorrent.cli import run_async
    from gentorrent.tools import regions as geo
    from gentorrent.tools.testbed import Testbed, via_rule
    from gentorrent.tools.toxiproxy import Toxiproxy
    from overlay.net.transport import TLSTransport, Via

    args = ("--threads", "1", "--prefix-snapshots", str(fw.SNAPSHOTS), "--sync-interval", str(sync_interval),
            "--accept-direct-requests")
    with tempfile.TemporaryDirectory(prefix=f"gentorrent-bench-fwa-{rule}-") as d:
        root = Path(d)
        net = Testbed(root, relays=0, models=models, verifiers=0, clients=("client",),
                      client_regions={"client": CLIENT_REGION}, engine="llama.cpp", model=DEFAULT_MODEL_ID,
                      model_args=args, bench_args=("--baseline", rule))
        proxy = Toxiproxy()
        proxy.start(log_path=root / "toxiproxy.log")
        with proxy, net:
            net.start_links(proxy)
            net.start(timeout=300)
            transport = TLSTransport(net.identities["client"],
                                     via=Via.parse(via_rule(net.region_number("client"))))
            result: dict[str, Any] = run_async(fw._play, net, jobs, systems, warm, transport, sync_interval)
            result["regions"] = {m: net.region_of[m] for m in net.models}
            result["one_way_ms"] = {f"{a}-{b}": round(net.one_way_ms(a, b), 1)
                                    for i, a in enumerate(net.models) for b in net.models[i + 1:]}
            result["client_one_way_ms"] = {m: round(geo.one_way_ms(CLIENT_REGION, net.region_of[m]), 1)
                                           for m in net.models}
    ttft = result["ttft"]
    print(f"bench forwarding-wide-area: rule {rule}, {len(jobs)} requests over {jobs[-1].at:.0f} s: "
          f"{len(ttft)} answered, {result['refused_frac']:.0%} refused as busy, {result['failed_frac']:.0%} failed, "
          f"mean TTFT {1000 * sum(ttft) / max(1, len(ttft)):.0f} ms, cache hits {result['cache_hit_rate']:.0%}, "
          f"forwarded {result['forwarded_frac']:.0%}, wall {result['wall']:.0f} s", file=sys.stderr, flush=True)
    return result


def run(quick: bool) -> tuple[dict[str, Any], dict[str, float]]:
    models = 2 if quick else MODELS
    rules = ("hrtree", "load") if quick else RULES
    n_requests = 8 if quick else REQUESTS
    n_system = 3 if quick else fw.SYSTEM_PROMPTS
    rate = 0.6 if quick else RATE
    lo, hi = fw.QUICK_SYSTEM_TOKENS if quick else fw.SYSTEM_TOKENS
    sync = fw.QUICK_SYNC_INTERVAL if quick else fw.SYNC_INTERVAL
    model_id, path = resolve_model(None)
    systems, system_tokens, _ = fw.prompts(n_system, lo, hi)
    jobs = fw.workload(n_requests, n_system, rate, models, fw.SEED)
    began = time.perf_counter()
    results = {rule: play(rule, jobs, systems, models, 2 if quick else 8, sync) for rule in rules}
    figures: dict[str, float] = {}
    for p, r in results.items():
        figures.update(summarize_ms(f"ttft_{p}", r["ttft"]))
        figures.update(summarize_ms(f"latency_{p}", r["latency"]))
        for k in ("cache_hit_rate", "prompt_reuse", "forwarded_frac", "busiest_node_share", "failed_frac",
                  "refused_frac"):
            figures[f"{k}_{p}"] = r[k]
    for p in rules:
        if p != "load":
            for stat in ("mean", "p99"):
                figures[f"ttft_{stat}_ratio_{p}_vs_load"] = figures[f"ttft_{p}_{stat}_ms"] / figures[f"ttft_load_{stat}_ms"]
    if "alg2" in results:
        figures["ttft_mean_ratio_hrtree_vs_alg2"] = figures["ttft_hrtree_mean_ms"] / figures["ttft_alg2_mean_ms"]
    if any(math.isnan(v) for v in figures.values()):
        raise RuntimeError(f"a figure is NaN: {figures}")
    first = next(iter(results.values()))
    params: dict[str, Any] = {
        "model": f"{model_id} ({path.name})", "engine": "llama.cpp (llama-cpp-python 0.3.36)",
        "model_nodes": models, "threads_per_node": 1, "cores": len(os.sched_getaffinity(0)), "cpu": cpu_model(),
        "cached_prefixes_per_node": fw.SNAPSHOTS + 1, "sync_interval_s": sync,
        "requests": n_requests, "arrivals": f"Poisson, {rate} requests/s", "system_prompts": n_system,
        "system_prompt_tokens": system_tokens, "popularity": f"Zipf({fw.ZIPF_S})", "max_tokens": fw.MAX_TOKENS,
        "sampling": "greedy", "seed": fw.SEED, "rules": list(rules),
        "regions": first["regions"], "client_region": CLIENT_REGION,
        "model_one_way_ms": first["one_way_ms"], "client_one_way_ms": first["client_one_way_ms"],
        "links": "Toxiproxy access links (gentorrent.tools.testbed), latency +/- 5 % jitter and 52.84 Mbit/s each way",
        "transport": "direct authenticated TLS Requests to an entry node chosen uniformly at random, through the "
                     "client's region's links; forwarded replies come back through the entry node",
        "fresh_processes_per_rule": True,
        "wall_s": {p: round(r["wall"], 1) for p, r in results.items()},
        "decisions": {p: fw._decisions(r["stats"]) for p, r in results.items()},
        "attempts": {p: r["attempts"] for p, r in results.items()},
        "busy_refusals": {p: r["busy_refusals"] for p, r in results.items()},
        "failures": {p: r["failures"] for p, r in results.items() if r["failures"]},
        "run_s": round(time.perf_counter() - began, 1),
    }
    return params, figures
