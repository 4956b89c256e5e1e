"""The framer's prompt choice figures (simulations/measure_prompt_choice.py): pure arithmetic on
per-prompt reply scores, cross-validated (the framer ranks by its own trials, the first half;
the figures come from the fresh replies, the second half)."""

from __future__ import annotations

import pytest

from simulations.measure_prompt_choice import between_share, choice


def test_the_choice_is_judged_on_replies_the_framer_did_not_rank_by() -> None:
    # prompt 0 looked worst in its trials (0.1) but its fresh replies are good; prompt 2 is bad in both
    scores = [[0.1, 0.1, 0.9, 0.9], [0.8, 0.8, 0.8, 0.8], [0.3, 0.3, 0.2, 0.2]]
    f = choice(scores, 1, tau=0.75)
    assert f["fresh_mean_chosen"] == pytest.approx(0.9)  # prompt 0's fresh half
    assert f["fresh_mean_all"] == pytest.approx((0.9 * 2 + 0.8 * 2 + 0.2 * 2) / 6)
    assert f["fresh_below_tau_chosen"] == 0.0 and f["fresh_below_tau_all"] == pytest.approx(2 / 6)
    f = choice(scores, 2, tau=0.75)
    assert f["fresh_mean_chosen"] == pytest.approx((0.9 * 2 + 0.2 * 2) / 4)


def test_between_prompt_share_of_the_variance() -> None:
    assert between_share([[0.5, 0.5], [0.5, 0.5]]) == 0.0
    assert between_share([[0.2, 0.2], [0.8, 0.8]]) == pytest.approx(1.0)  # all of it between prompts
    assert between_share([[0.2, 0.8], [0.8, 0.2]]) == pytest.approx(0.0)  # all of it within
    assert 0.0 < between_share([[0.2, 0.4], [0.7, 0.9]]) < 1.0


def test_the_measured_figures_are_what_decision_0015_says() -> None:
    """simulations/data/prompt_choice.json (the real engine, 24 prompts x 8 replies) gives the
    figures docs/decisions/0015 quotes, recomputed from its stored scores."""
    import json
    from pathlib import Path

    data = json.loads((Path(__file__).resolve().parents[2] / "simulations" / "data" / "prompt_choice.json").read_text())
    scores = data["scores"]
    assert len(scores) == 24 and all(len(s) == 8 for s in scores)
    assert round(between_share(scores), 2) == 0.15
    f = choice(scores, 4, tau=data["tau"])
    assert (round(f["fresh_mean_chosen"], 3), round(f["fresh_mean_all"], 3)) == (0.935, 0.947)
    assert (round(f["fresh_below_tau_chosen"], 3), round(f["fresh_below_tau_all"], 3)) == (0.062, 0.083)
    assert f["fresh_mean_chosen"] > f["fresh_mean_all"] - 0.05  # the choice bought the framer nothing to speak of
