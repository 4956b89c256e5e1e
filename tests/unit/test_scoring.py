"""Audit scores from token scores (verifier/scoring.py)."""

from __future__ import annotations

import math

import pytest

from model_node.engine import TokenScore
from verifier.scoring import ScoringError, calibrated, raw_inv_ppl, score_reply


def ts(logprob: float, expected: float, token: int = 1, argmax: int = 1) -> TokenScore:
    return TokenScore(token, logprob, expected, argmax)


def test_greedy_reply_of_the_same_model_scores_one() -> None:
    scores = [ts(-0.2, -0.2), ts(-1.5, -1.5), ts(-0.01, -0.01)]
    r = score_reply(scores)
    assert r.calibrated == 1.0
    assert r.raw_inv_ppl == pytest.approx(math.exp(-(0.2 + 1.5 + 0.01) / 3))
    assert r.argmax_agreement == 1.0 and r.tokens == 3


def test_less_likely_tokens_lower_the_score_by_the_missing_likelihood() -> None:
    scores = [ts(-2.0, -0.5, token=5, argmax=1), ts(-1.0, -0.5)]
    r = score_reply(scores)
    assert r.calibrated == pytest.approx(math.exp(-1.0))  # mean -1.5 vs expected -0.5
    assert r.argmax_agreement == 0.5


def test_more_likely_than_expected_is_capped_at_one() -> None:
    """A sampled reply can be luckier than the model's expectation: C stays at 1."""
    assert score_reply([ts(-0.1, -0.9)]).calibrated == 1.0
    assert calibrated(-0.1, -0.9) == 1.0
    assert calibrated(-3.0, -1.0) == pytest.approx(math.exp(-2.0))


def test_empty_and_non_finite_refused() -> None:
    with pytest.raises(ScoringError, match="failed challenge"):
        score_reply([])
    with pytest.raises(ScoringError, match="non-finite"):
        score_reply([ts(float("-inf"), -1.0)])
    with pytest.raises(ScoringError, match="non-finite"):
        score_reply([ts(-1.0, float("nan"))])


def test_raw_score_is_the_papers() -> None:
    assert raw_inv_ppl([ts(math.log(0.5), 0.0), ts(math.log(0.5), 0.0)]) == pytest.approx(0.5)


def test_challenge_prompts_are_distinct() -> None:
    from simulations.measure_scores import TEMPLATES, TOPICS, prompts

    ps = prompts(len(TEMPLATES) * len(TOPICS))
    assert len(set(ps)) == len(ps) == 72
    assert prompts(24) == ps[:24]
    with pytest.raises(ValueError, match="distinct"):
        prompts(73)
