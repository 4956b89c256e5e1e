"""``gentorrent bench wide-area``: the whole network with wide-area delays and churn (issue 29;
docs/testbed.md; docs/benchmarks.md "wide-area").

One run of the testbed (:func:`gentorrent.bench.testbed_run.run_plan`): 100 user relays, 6 echo model
nodes (the engine that isolates the network) and 4 verifiers, each on its own loopback address in
one of six regions behind Toxiproxy access links with published inter-region delays
(:mod:`gentorrent.tools.regions`); nine in-process clients (three regions x (n,k) = (1,1), (4,3),
(4,4)) keeping exactly n paths each, so the paths a request crosses are known and its
propagation floor (the k-th fastest path's one-way floor, there and back) is computed beside its
time to first token. Then a model node crashes and requests sent to it are timed until another
answers (failover), then relays (5 % a minute, :data:`CHURN_PER_MIN`: five times the issue's
10 % per 10 minutes, so that a 5-minute phase sees some 25 departures; Poisson departures after
the paper's churn model, half crashes, half clean leaves) and one model node leave and come back
while the (4,3) clients keep asking. Figures also carry the committee's block interval,
registration -> verified signed list, 3-hop path builds, and memory and CPU per process.

The forwarding figures come from the simulation's oracle comparison
(:func:`simulations.forwarding.oracle_ratios`): HR-tree forwarding against a central router that
knows every node's exact cache and load, per workload and load level.

``--quick``: 16 relays, 2 model nodes, 2 requests per client, 20 s of churn; its figures mean
little. The run's report.json and ttft_cdf.png stay in the printed ``report_dir`` param.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gentorrent.bench.stats import cpu_model

CHURN_PER_MIN = 0.05  # 5x the 10 % of relays per 10 minutes: a 5-minute phase at 1 % gives too few events


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run(quick: bool) -> tuple[dict[str, Any], dict[str, float]]:
    from gentorrent.bench.testbed_run import Plan, run_plan

    plan = Plan(relays=16, models=2, requests=2, path_builds=4, churn_s=20.0, relay_leave_per_min=0.05,
                mean_downtime_s=10.0, failover_requests=1) if quick else Plan(
        relays=100, models=6, requests=10, path_builds=30, churn_s=300.0, relay_leave_per_min=CHURN_PER_MIN,
        mean_downtime_s=60.0, failover_requests=3)
    root = Path(tempfile.mkdtemp(prefix="gentorrent-wide-area-")) / time.strftime("run-%Y%m%d-%H%M%S")
    params, figures, _, files = run_plan(root, plan, say=_say, show=False)
    params.update({"cpu": cpu_model(), "quick": quick, "report_dir": str(root),
                   "report_files": [f.name for f in files]})
    for n, k in plan.configs:
        key = f"ttft_{n}_{k}"
        floor = figures.get(f"{key}_floor_p50_ms")
        if floor is not None and f"{key}_p50_ms" in figures:
            figures[f"{key}_goal_bound_p50_ms"] = 1.15 * floor + 30.0  # the goal: p50 <= this
    for other in ("1_1", "4_4"):
        if f"ttft_{other}_p99_ms" in figures and "ttft_4_3_p99_ms" in figures:
            figures[f"ttft_p99_ratio_4_3_vs_{other}"] = figures["ttft_4_3_p99_ms"] / figures[f"ttft_{other}_p99_ms"]
    try:
        from simulations.forwarding import oracle_ratios
    except ImportError as exc:  # simulations ship with the source tree, not the wheel
        _say(f"bench wide-area: no forwarding oracle figures ({exc})")
    else:
        figures.update(oracle_ratios(seed=0, quick=True))
    return params, figures
