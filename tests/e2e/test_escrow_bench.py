"""``gentorrent bench escrow --quick`` (gentorrent/bench/escrow.py): it prints exactly the figures
listed here and in docs/benchmarks.md, every figure is a finite number, the plans are those the
decision's committees give, the sizes follow from the format, and the timings are positive (how
fast is the bench's to say, not a test's). No timing is compared with another."""

from __future__ import annotations

import math
from typing import Any

import pytest

pytestmark = pytest.mark.slow

NAME = "escrow"
# case: (holders, units, threshold, largest holder's shares)
PLANS = {"eq4": (4, 32, 9, 8), "eq16": (16, 32, 11, 2), "eq64": (64, 64, 22, 1), "skew16": (16, 64, 22, 19)}


@pytest.fixture(scope="module")
def out() -> dict[str, Any]:
    """One quick run's JSON (``tests.conftest.quick_bench``)."""
    from gentorrent.bench import escrow
    from tests.conftest import quick_bench

    return quick_bench(NAME, escrow.run, timeout=300)


def _keys() -> set[str]:
    from gentorrent.bench.escrow import CASES, FIGURES

    return {f"{case}_{f}" for case in CASES for f in FIGURES} | {"node_match_p50_ms", "node_match_scan_p50_ms",
                                                                  "node_match_scan_ratio",
                                                                  "node_store_index_bytes_per_entry",
                                                                  "node_keep_p50_ms", "node_keep_window_p50_ms",
                                                                  "node_keep_window_prompt_bytes",
                                                                  "node_keep_window_disk_bytes",
                                                                  "node_keep_window_per_s"}


def test_prints_exactly_the_expected_keys_and_docs_list_them(out: dict[str, Any], helpers: Any) -> None:
    from gentorrent.bench.escrow import CASES, QUICK_REPS

    assert out["bench"] == NAME and out["params"]["quick"] is True and out["params"]["reps"] == QUICK_REPS
    assert set(out["params"]["cases"]) == set(CASES) == set(PLANS)
    assert set(out["figures"]) == _keys()
    assert helpers.documented_figures(NAME) == _keys()


def test_figures_are_finite_and_in_range(out: dict[str, Any]) -> None:
    f = out["figures"]
    assert all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in f.values()), f
    for case, (holders, units, threshold, largest) in PLANS.items():
        assert f[f"{case}_holders_count"] == holders
        assert f[f"{case}_units_count"] == units
        assert f[f"{case}_threshold_count"] == threshold
        assert f[f"{case}_largest_holder_shares_count"] == largest
        # an array header (1 byte up to 15 items, else 3), then 34 bytes a point, 36 to 38 a share
        head = 1 if threshold < 16 else 3
        assert f[f"{case}_commitments_bytes"] == head + 34 * threshold
        assert 1 + 36 * largest <= f[f"{case}_largest_holder_shares_bytes"] <= 3 + 38 * largest
        for timing in ("plan", "deal", "verify", "verify_each", "recover", "recover_one_forged"):
            assert f[f"{case}_{timing}_p50_ms"] > 0.0, (case, timing)  # measured; how fast is the bench's to say
    assert f["node_match_p50_ms"] > 0.0 and f["node_match_scan_p50_ms"] > 0.0 and f["node_match_scan_ratio"] > 0.0
    assert f["node_keep_p50_ms"] > 0.0 and f["node_keep_window_p50_ms"] > 0.0 and f["node_keep_window_per_s"] > 0
    # a full window of 4,096 tokens of 16 to 32 letters, kept compressed (the vocabulary repeats)
    assert 4_096 * 16 <= f["node_keep_window_prompt_bytes"] <= 4_096 * 32
    assert 0 < f["node_keep_window_disk_bytes"] < f["node_keep_window_prompt_bytes"] / 2
    from model_node.served import _SLOT_BYTES

    assert 100 < f["node_store_index_bytes_per_entry"] <= _SLOT_BYTES  # what the store counts is what it takes
