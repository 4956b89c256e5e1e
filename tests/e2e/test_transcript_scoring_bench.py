"""``gentorrent bench transcript-scoring --quick`` (verifier/bench/transcript_scoring.py): it prints
exactly the figures listed here, every figure is a finite number, and rule 9 of
verifier/audit/transcripts.py keeps its promises in every quick run: a round's scored cost is the
budget on average, the unflooded cheater keeps its share under a flood of other nodes'
transcripts, the budget is used whenever it binds, no round scores more than rule 8 alone, and
the second draw only adds rounds in which a boosted cheater's users' sets can cap it. No timing
is asserted."""

from __future__ import annotations

import math
from typing import Any

import pytest

pytestmark = pytest.mark.slow

NAME = "transcript-scoring"
QUICK_SYBILS = (0, 64)
QUICK_BOOSTERS = (0, 15)
ENGINE_KEYS = {"typical_cost_mean", "typical_score_s_mean", "typical_score_cpu_s_mean", "typical_cost_per_s",
               "long_cost", "long_score_s", "long_score_cpu_s", "long_cost_per_s", "round_budget_typical_s",
               "round_budget_long_s", "trigger_share"}
PER_SYBILS = ("old_round_cost", "old_round_s", "new_round_cost_mean", "new_round_cost_max", "new_round_s_max",
              "new_cheater_scored_mean", "new_cheater_scored_min", "new_honest_node_scored_mean")
PER_BOOSTERS = ("new_cheater_honest_share", "cheater_honest_share_counted", "cheater_honest_donor_share",
                "cheater_user_sets_scored_mean", "cheater_two_user_sets_first_share", "cheater_two_user_sets_share")


@pytest.fixture(scope="module")
def out() -> dict[str, Any]:
    """One quick run's JSON (``tests.conftest.quick_bench``)."""
    from tests.conftest import quick_bench
    from verifier.bench import transcript_scoring
    from verifier.bench.audit_evasion import USER_PROMPTS

    if not USER_PROMPTS.is_file():
        pytest.skip(f"{USER_PROMPTS} is missing (../shared/data next to the repository)")
    return quick_bench(NAME, transcript_scoring.run, timeout=900)


def _keys(sybils: tuple[int, ...], boosters: tuple[int, ...]) -> set[str]:
    return ENGINE_KEYS | {f"{k}_sybils{a}" for k in PER_SYBILS for a in sybils} \
        | {f"{k}_boosters{b}" for k in PER_BOOSTERS for b in boosters}


def test_prints_exactly_the_expected_keys_and_docs_list_a_full_runs(out: dict[str, Any], helpers: Any) -> None:
    from verifier.bench.transcript_scoring import BOOSTERS, SYBILS

    p = out["params"]
    assert out["bench"] == NAME and p["quick"] is True
    assert (tuple(p["sybils"]), tuple(p["boosters"])) == (QUICK_SYBILS, QUICK_BOOSTERS)
    assert set(out["figures"]) == _keys(QUICK_SYBILS, QUICK_BOOSTERS)
    assert helpers.documented_figures(NAME) == _keys(SYBILS, BOOSTERS)


def test_figures_are_finite_numbers(out: dict[str, Any]) -> None:
    f = out["figures"]
    assert all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in f.values()), f
    assert all(v > 0 for k, v in f.items() if k in ENGINE_KEYS), f
    for b in QUICK_BOOSTERS:
        for k in PER_BOOSTERS:
            if k != "cheater_user_sets_scored_mean":
                assert 0.0 <= f[f"{k}_boosters{b}"] <= 1.0
        if b == 0:
            assert f[f"new_cheater_honest_share_boosters{b}"] == f[f"cheater_honest_share_counted_boosters{b}"] == 1.0
        # the second draw only adds: rounds with two of the users' sets scored are at least as many
        assert f[f"cheater_two_user_sets_share_boosters{b}"] >= f[f"cheater_two_user_sets_first_share_boosters{b}"]


def test_rule_9_bounds_a_round_and_keeps_the_cheater_scored(out: dict[str, Any]) -> None:
    """A round costs the budget on average (never more than the budget plus one of the longest
    transcripts a node); the cheater, never flooded, keeps its share under the flood; rule 9
    never scores more than rule 8 alone."""
    p, f = out["params"], out["figures"]
    for a in QUICK_SYBILS:
        assert f[f"new_round_cost_max_sybils{a}"] <= p["round_budget"] + p["nodes"] * p["flood_cost"]
        assert f[f"new_round_cost_mean_sybils{a}"] <= 1.25 * p["round_budget"]
        assert f[f"new_cheater_scored_min_sybils{a}"] >= 1
        assert f[f"new_cheater_scored_mean_sybils{a}"] >= 0.9 * f["new_cheater_scored_mean_sybils0"]
        assert f[f"new_round_cost_mean_sybils{a}"] <= f[f"old_round_cost_sybils{a}"]
        assert f[f"new_honest_node_scored_mean_sybils{a}"] <= p["honest_per_node"]


def test_without_sybils_rule_9_scores_all_it_can(out: dict[str, Any]) -> None:
    """With no flood, rule 9 scores all that rule 8 kept, or the whole budget on average (less at
    most one typical transcript a node, a loose bound). The 32 nodes' honest donors alone hand in
    more than one thread's budget a round, so rule 9 binds even here."""
    p, f = out["params"], out["figures"]
    old, new = f["old_round_cost_sybils0"], f["new_round_cost_mean_sybils0"]
    assert new >= min(old, p["round_budget"]) - p["nodes"] * max(p["typical_costs"])
