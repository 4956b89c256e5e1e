"""``gentorrent bench gateway --quick`` runs in well under a minute and reports exactly the
figures docs/benchmarks.md documents. No timing is asserted: benchmarks are not tests."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

KEYS = {f"{who}_{what}_{stat}_ms" for who in ("direct", "gateway") for what in ("ttft", "total")
        for stat in ("mean", "p50", "p99")} | {
    "gateway_added_ttft_p50_ms", "gateway_added_total_p50_ms", "direct_stream16_req_per_s",
    "gateway_stream16_req_per_s"}


def test_quick_gateway_bench_reports_its_figures():
    r = subprocess.run([sys.executable, "-m", "gentorrent.cli", "bench", "gateway", "--json", "--quick"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["bench"] == "gateway" and out["params"]["concurrency"] == 16
    figures = out["figures"]
    assert set(figures) == KEYS
    assert all(isinstance(v, float) and math.isfinite(v) for v in figures.values())
    assert all(v > 0 for k, v in figures.items() if "added" not in k)  # the added cost may be negative: noise
    assert figures["gateway_added_ttft_p50_ms"] == figures["gateway_ttft_p50_ms"] - figures["direct_ttft_p50_ms"]
