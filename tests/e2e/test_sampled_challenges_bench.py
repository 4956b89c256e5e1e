"""``gentorrent bench sampled-challenges --quick`` (verifier/bench/sampled_challenges.py): it prints
exactly the figures listed here and in docs/benchmarks.md, every figure is a finite number, AUCs and
shares lie in [0, 1], the best detector's AUC is one of the detectors', and the counts agree with
the users' prompts drawn. No timing is asserted."""

from __future__ import annotations

import math
from typing import Any

import pytest

pytestmark = pytest.mark.slow

NAME = "sampled-challenges"
GLOBAL = {"users", "user_tokens_mean", "user_chars_mean", "loglik_plain_mean_users", "loglik_instructed_mean_users"}
PER_VARIANT = ("auc_best", "tpr_at_fpr5_best", "sampled", "sampled_dropped_empty", "sampled_truncated_share",
               "sampled_tokens_mean", "sampled_chars_mean", "loglik_plain_mean", "loglik_instructed_mean")


@pytest.fixture(scope="module")
def out() -> dict[str, Any]:
    """One quick run's JSON (``tests.conftest.quick_bench``)."""
    from tests.conftest import quick_bench
    from verifier.bench import sampled_challenges
    from verifier.bench.audit_evasion import USER_PROMPTS

    if not USER_PROMPTS.is_file():
        pytest.skip(f"{USER_PROMPTS} is missing (../shared/data next to the repository)")
    return quick_bench(NAME, sampled_challenges.run, timeout=900)


def _keys() -> set[str]:
    from verifier.bench.sampled_challenges import DETECTORS, VARIANTS

    return GLOBAL | {f"{k}_{v}" for k in PER_VARIANT for v in VARIANTS} \
        | {f"auc_{d}_{v}" for d in DETECTORS for v in VARIANTS}


def test_prints_exactly_the_expected_keys_and_docs_list_them(out: dict[str, Any], helpers: Any) -> None:
    assert out["bench"] == NAME and out["params"]["quick"] is True
    assert set(out["figures"]) == _keys()
    assert helpers.documented_figures(NAME) == _keys()


def test_figures_are_finite_and_in_range(out: dict[str, Any]) -> None:
    from verifier.bench.sampled_challenges import DETECTORS, VARIANTS

    f = out["figures"]
    assert all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in f.values()), f
    for v in VARIANTS:
        aucs = [f[f"auc_{d}_{v}"] for d in DETECTORS]
        assert all(0.0 <= a <= 1.0 for a in aucs), f
        assert f[f"auc_best_{v}"] in aucs
        assert 0.0 <= f[f"tpr_at_fpr5_best_{v}"] <= 1.0
        assert 0.0 <= f[f"sampled_truncated_share_{v}"] <= 1.0
        assert f[f"sampled_tokens_mean_{v}"] > 0 and f[f"sampled_chars_mean_{v}"] > 0
        assert f[f"loglik_plain_mean_{v}"] < 0 and f[f"loglik_instructed_mean_{v}"] < 0
    assert f["user_tokens_mean"] > 0 and f["user_chars_mean"] > 0
    assert f["loglik_plain_mean_users"] < 0 and f["loglik_instructed_mean_users"] < 0


def test_counts_agree_with_the_users_prompts_drawn(out: dict[str, Any]) -> None:
    from verifier.bench.sampled_challenges import DETECTORS, QUICK_USERS, VARIANTS

    p, f = out["params"], out["figures"]
    assert f["users"] == QUICK_USERS
    for v, (temperature, share) in VARIANTS.items():
        assert f[f"sampled_{v}"] == round(QUICK_USERS * share) == p["variants"][v]["samples"]
        assert p["variants"][v]["temperature"] == temperature
        assert 0 <= f[f"sampled_dropped_empty_{v}"] <= f[f"sampled_{v}"] - 4  # two halves of two left at least
        best = p["best_detector"][v]
        assert best in DETECTORS and f[f"auc_best_{v}"] == f[f"auc_{best}_{v}"]
