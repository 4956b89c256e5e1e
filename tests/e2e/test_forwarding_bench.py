"""``gentorrent bench forwarding``, ``forwarding-threshold`` and ``forwarding-wide-area`` run with the real engine (their
quick forms), report exactly the figures docs/benchmarks.md documents, and account for every
request. No timing is asserted: benchmarks are not tests."""

from __future__ import annotations

import math
from typing import Any

import pytest

pytestmark = pytest.mark.slow

llama = pytest.importorskip("model_node.llama")
pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'gentorrent[llama]')")


def _requests_decided(decisions: dict[str, int]) -> int:
    """Requests decided at their entry node (a forwarded request is counted again, as
    ``forwarded``, where it lands)."""
    return sum(n for reason, n in decisions.items() if reason != "forwarded")


@pytest.fixture(autouse=True)
def _model_installed() -> None:
    try:
        llama.resolve_model(None)
    except llama.EngineError as exc:
        pytest.skip(str(exc))


def _check(figures: dict[str, float]) -> None:
    assert all(isinstance(v, float) and math.isfinite(v) for v in figures.values()), figures
    # `bench forwarding`'s reduction is 1 − its TTFT ratio: negative when HR-tree forwarding lost
    # (a quick run of 8 requests can); every other figure, of either bench, is a time, a count, a
    # fraction or a ratio of them.
    reduction = "ttft_mean_reduction_hrtree_vs_load"
    if reduction in figures:
        assert figures[reduction] == 1 - figures["ttft_mean_ratio_hrtree_vs_load"], figures
    assert all(v >= 0 for k, v in figures.items() if k != reduction), figures


def test_bench_forwarding_quick(helpers: Any) -> None:
    from model_node.bench.forwarding import POLICIES, run

    params, figures = run(quick=True)
    assert set(figures) == helpers.documented_figures("forwarding")
    _check(figures)
    n = params["requests"]
    for policy in POLICIES:
        d = params["decisions"][policy]
        # one decision at the entry node per request sent (a busy refusal's retry is sent again)
        assert _requests_decided(d) == params["attempts"][policy] >= n, d
        assert d.get("forwarded", 0) == round(figures[f"forwarded_frac_{policy}"] * n)
        assert 0 <= figures[f"cache_hit_rate_{policy}"] <= 1 and figures[f"busiest_node_share_{policy}"] >= 1 / 3
    assert set(params["decisions"]["load"]) <= {"miss", "forwarded"}  # load-only never looks at the tree
    assert set(params["decisions"]["random"]) <= {"random", "forwarded"}
    # 2x and 4x (issue 19); every request at 4x answered, refused as busy, or lost.
    for policy in ("hrtree", "requests"):
        assert _requests_decided(params["decisions_2x"][policy]) == params["attempts_2x"][policy] >= n
    assert _requests_decided(params["decisions_4x"]) == params["attempts_4x"] >= n
    refused_4x = round(figures["refused_frac_4x"] * n)
    assert params["answered_4x"] + refused_4x + figures["lost_4x"] == n


def test_bench_forwarding_threshold_quick(helpers: Any) -> None:
    from model_node.bench.forwarding_threshold import run

    params, figures = run(quick=True)
    keys = helpers.documented_figures("forwarding-threshold")
    assert set(figures) <= keys, set(figures) - keys  # the quick run sweeps a subset
    assert {k for k in keys if "_x2_t5_" in k or "_x2_t10_" in k or k.endswith(("_x2_t5", "_x2_t10"))} <= set(figures)
    _check(figures)
    for key, d in params["decisions"].items():
        assert _requests_decided(d) == params["attempts"][key] >= params["requests"], (key, d)
        assert d.get("match-overloaded", 0) == round(figures[f"overloaded_frac_{key}"] * params["requests"])
    assert figures["ttft_mean_ratio_x2_t10_vs_t10"] == 1.0
    for key in params["decisions"]:
        assert figures[f"lost_{key}"] == 0 and 0 <= figures[f"refused_frac_{key}"] < 1


def test_bench_forwarding_wide_area_quick(helpers: Any) -> None:
    """Two llama.cpp model nodes in two regions behind Toxiproxy access links, two rules."""
    from gentorrent.tools.toxiproxy import ToxiproxyError, find_toxiproxy

    try:
        find_toxiproxy()
    except ToxiproxyError as exc:
        pytest.skip(str(exc))
    from model_node.bench.forwarding_wide_area import run

    params, figures = run(quick=True)
    keys = helpers.documented_figures("forwarding-wide-area")
    assert set(figures) <= keys, set(figures) - keys  # the quick run plays two of the three rules
    assert {k for k in keys if "alg2" not in k} == set(figures)
    _check(figures)
    assert len(set(params["regions"].values())) == params["model_nodes"] == 2  # one region each
    assert all(ms > 0 for ms in params["model_one_way_ms"].values())
    n = params["requests"]
    for rule in params["rules"]:
        d = params["decisions"][rule]
        assert _requests_decided(d) == params["attempts"][rule] >= n, d
        assert d.get("forwarded", 0) == round(figures[f"forwarded_frac_{rule}"] * n)
        assert figures[f"failed_frac_{rule}"] + figures[f"refused_frac_{rule}"] < 1
    assert set(params["decisions"]["load"]) <= {"miss", "forwarded"}
