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
