"""Audit scores from token scores (verifier/audit/scoring.py)."""

from __future__ import annotations

import math

import pytest

from model_node.engine import TokenScore
from overlay.wire.messages import SamplingParams
from verifier.audit.scoring import (
    FULL_TOKENS,
    MIN_VARIANCE,
    Z_HIGH,
    ScoringError,
    calibrated,
    length_weighted,
    pooled_cap,
    pooled_z,
    raw_inv_ppl,
    score_reply,
    two_sided,
    z_score,
)


def ts(logprob: float, expected: float, token: int = 1, argmax: int = 1, var: float = 0.0) -> TokenScore:
    return TokenScore(token, logprob, expected, argmax, var)


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
    assert score_reply([ts(-0.1, -0.9, var=1.0)]).score == 1.0  # z = 0.8: within sampling luck
    assert calibrated(-0.1, -0.9) == 1.0
    assert calibrated(-3.0, -1.0) == pytest.approx(math.exp(-2.0))


def test_empty_and_non_finite_refused() -> None:
    with pytest.raises(ScoringError, match="failed challenge"):
        score_reply([])
    with pytest.raises(ScoringError, match="non-finite"):
        score_reply([ts(float("-inf"), -1.0)])
    with pytest.raises(ScoringError, match="non-finite"):
        score_reply([ts(-1.0, float("nan"))])
    with pytest.raises(ScoringError, match="non-finite"):
        score_reply([ts(-1.0, -1.0, var=float("nan"))])
    with pytest.raises(ScoringError, match="non-finite"):
        score_reply([ts(-1.0, -1.0, var=-1.0)])


def test_raw_score_is_the_papers() -> None:
    assert raw_inv_ppl([ts(math.log(0.5), 0.0), ts(math.log(0.5), 0.0)]) == pytest.approx(0.5)


def test_challenge_prompts_are_distinct() -> None:
    from simulations.measure_scores import TEMPLATES, TOPICS, prompts

    ps = prompts(len(TEMPLATES) * len(TOPICS))
    assert len(set(ps)) == len(ps) == 72
    assert prompts(24) == ps[:24]
    with pytest.raises(ValueError, match="distinct"):
        prompts(73)


# --------------------------------------------------------------------------- the two-sided score


def _reply(n: int, rng_seed: int, temperature: float, greedy: bool = False) -> list[TokenScore]:
    """A reply over fixed random next-token distributions, scored under ``temperature``: drawn
    at that temperature (an honest node) or, with ``greedy``, the argmax everywhere (a node that
    ignores the temperature asked)."""
    np = pytest.importorskip("numpy")
    from model_node.engine import logprob_moments

    rng = np.random.default_rng(rng_seed)
    params = SamplingParams(temperature=temperature)
    out = []
    for _ in range(n):
        logits = rng.normal(0.0, 2.5, size=200)
        lp = logits - np.log(np.exp(logits).sum())
        q = np.exp(lp / temperature)
        q /= q.sum()
        drawn = int(rng.choice(200, p=q))
        tok = int(lp.argmax()) if greedy else drawn
        mean, var = logprob_moments(lp, params)
        out.append(TokenScore(tok, float(lp[tok]), mean, int(lp.argmax()), var))
    return out


def test_z_is_the_sum_of_differences_over_the_standard_deviation() -> None:
    r = score_reply([ts(-0.5, -1.0, var=0.25), ts(-1.0, -1.0, var=0.5), ts(-0.5, -1.0, var=0.25)])
    assert r.z == pytest.approx(1.0 / math.sqrt(1.0))
    assert z_score(3.0, 4.0) == pytest.approx(1.5)
    assert z_score(3.0, MIN_VARIANCE / 2) == 0.0  # no spread: nothing to measure


def test_greedy_reply_to_a_sampled_request_scores_low() -> None:
    """A node decoding greedily although T = 0.7 is asked: every token is the argmax, far more
    likely than sampling gives; its one-sided C is 1, its two-sided score is not."""
    scores = [ts(-0.3, -1.1, var=0.9) for _ in range(64)]  # like a greedy reply at T = 0.7
    r = score_reply(scores)
    assert r.calibrated == 1.0
    assert r.z == pytest.approx(64 * 0.8 / math.sqrt(64 * 0.9)) and r.z > Z_HIGH
    # As far below as it is above (exp(−0.8)), and capped by how sure that is (z ≈ 6.7).
    assert r.score == pytest.approx(min(math.exp(-0.8), math.exp(Z_HIGH - r.z)))
    assert r.score < 0.75  # τ: one such reply makes an abnormal epoch on its own
    assert two_sided(-0.3, -1.1, r.z) == r.score


def test_honest_sampled_replies_keep_their_one_sided_score() -> None:
    for seed in range(20):
        for t in (0.7, 1.0):
            r = score_reply(_reply(128, seed, t))
            assert r.z <= Z_HIGH
            assert r.score == r.calibrated


def test_greedy_reply_of_random_distributions_is_caught() -> None:
    for seed in range(5):
        r = score_reply(_reply(128, seed, 0.7, greedy=True))
        assert r.calibrated == 1.0 and r.z > Z_HIGH and r.score < 0.75


def test_greedy_requests_keep_the_one_sided_score() -> None:
    """T = 0 (no variance): z is 0 and the score is C, whatever the reply."""
    r = score_reply([ts(-0.2, -0.2), ts(-2.0, -0.5, token=5)])
    assert r.z == 0.0 and r.score == r.calibrated == pytest.approx(math.exp(-0.75))
    assert two_sided(-0.1, -0.9, 0.0) == 1.0


def test_too_likely_scores_as_far_below() -> None:
    assert two_sided(-0.5, -1.5, Z_HIGH + 0.01) == pytest.approx(math.exp(-1.0))
    assert two_sided(-0.5, -1.5, Z_HIGH) == 1.0
    assert two_sided(-2.5, -1.5, Z_HIGH + 5) <= math.exp(-1.0)  # never above C


def test_a_reply_sure_to_be_off_is_capped_on_either_side() -> None:
    """The significance cap (decision 0019): a reply whose mean is close to its expectation (C near
    1) but whose total lies more than Z_HIGH standard deviations away, on either side, scores at
    most exp(−(|z| − Z_HIGH)); within Z_HIGH nothing changes (no cliff at the threshold)."""
    below = score_reply([ts(-1.05, -1.0, var=0.02) for _ in range(128)])  # 0.05 nats under, 128 tokens
    assert below.calibrated == pytest.approx(math.exp(-0.05)) and below.calibrated > 0.9
    assert below.z == pytest.approx(-128 * 0.05 / math.sqrt(128 * 0.02)) and below.z < -Z_HIGH
    assert below.score == pytest.approx(math.exp(Z_HIGH + below.z)) and below.score < 0.75
    assert two_sided(-1.05, -1.0, -Z_HIGH) == pytest.approx(math.exp(-0.05))  # at the threshold: C
    assert two_sided(-1.05, -1.0, -Z_HIGH - 0.01) == pytest.approx(math.exp(-0.05))  # C is lower still
    assert two_sided(-1.05, -1.0, -Z_HIGH - 1) == pytest.approx(math.exp(-1.0))
    assert two_sided(-0.9, -1.0, Z_HIGH + 2) == pytest.approx(math.exp(-2.0))  # above: the cap is lower
    for z in (-Z_HIGH, -2.0, 0.0, 2.0, Z_HIGH):
        assert two_sided(-1.05, -1.0, z) == pytest.approx(math.exp(-0.05))


def test_logprob_moments_hand_computation() -> None:
    """Mean and variance of the sampled token's log-probability (numpy and score_rows)."""
    np = pytest.importorskip("numpy")
    from model_node.engine import expected_logprob, logprob_moments
    from model_node.llama import score_rows

    logits = [2.0, 1.0, 0.0, -1.0]
    lse = math.log(sum(math.exp(x) for x in logits))
    logp = [x - lse for x in logits]
    shuffled = [logp[2], logp[0], logp[3], logp[1]]

    def moments(q: list[float], xs: list[float]) -> tuple[float, float]:
        total = sum(q)
        m = sum(a * x for a, x in zip(q, xs, strict=True)) / total
        return m, sum(a * (x - m) ** 2 for a, x in zip(q, xs, strict=True)) / total

    assert logprob_moments(shuffled, SamplingParams(temperature=0.0)) == pytest.approx((logp[0], 0.0))
    for params, q, keep in (
            (SamplingParams(temperature=1.0), [math.exp(x) for x in logp], 4),
            (SamplingParams(temperature=0.7), [math.exp(x / 0.7) for x in logp], 4),
            (SamplingParams(temperature=0.5, top_k=2), [math.exp(x / 0.5) for x in logp[:2]], 2),
            (SamplingParams(temperature=1.0, top_p=0.85), [math.exp(x) for x in logp[:2]], 2)):
        m, v = moments(q, logp[:keep])
        assert logprob_moments(shuffled, params) == pytest.approx((m, v))
        assert expected_logprob(shuffled, params) == pytest.approx(m)
        (row,) = score_rows(np.array([logits]), [1], params)
        assert row.expected_logprob == pytest.approx(m) and row.var_logprob == pytest.approx(v)
    assert logprob_moments(shuffled, SamplingParams(temperature=1.0, top_p=0.5)) == pytest.approx((logp[0], 0.0))
    assert all(math.isnan(x) for x in logprob_moments([], SamplingParams()))


def test_a_short_transcript_weighs_as_its_share_of_a_full_one() -> None:
    """Decision 0021: a transcript's log-score is scaled by tokens / FULL_TOKENS below FULL_TOKENS,
    so a framer's short replies (1 to a few tokens, noisy) cannot sink a vote on their own."""
    assert length_weighted(0.6, FULL_TOKENS) == 0.6 and length_weighted(0.6, 10 * FULL_TOKENS) == 0.6
    assert length_weighted(0.03, 4) == pytest.approx(0.03 ** (4 / FULL_TOKENS))
    assert length_weighted(0.03, 4) > 0.75  # a 4-token reply at 0.03 no longer pulls a vote under τ
    assert length_weighted(1.0, 1) == 1.0
    ws = [length_weighted(0.5, n) for n in range(1, FULL_TOKENS + 1)]
    assert ws == sorted(ws, reverse=True) and ws[-1] == 0.5  # longer: nearer the reply's own score
    # spread: a short reply's log-score is never wider than a full one's of the same per-token deficit
    assert math.log(length_weighted(math.exp(-0.5), 16)) == pytest.approx(-0.5 * 16 / FULL_TOKENS)
    for bad in ((-0.1, 4), (1.5, 4), (0.5, 0)):
        with pytest.raises(ScoringError):
            length_weighted(*bad)


def test_a_reply_far_off_at_a_low_temperature_scores_zero_and_stays_scorable() -> None:
    """A reply of random tokens at a low temperature (tiny variance) lies thousands of standard
    deviations off: the cap underflows to 0.0, and as a transcript it still counts as 0 (a
    ScoringError would leave it out, and the cheater's worst reply with it)."""
    r = score_reply([ts(-18.0, -0.2, var=0.01) for _ in range(512)])
    assert r.z < -745 and r.score == 0.0
    assert length_weighted(r.score, r.tokens) == 0.0 and length_weighted(0.0, 4) == 0.0


def test_replies_each_within_z_high_but_spread_too_wide_together_are_capped() -> None:
    """Decision 0023: a Q2_K node decoding greedily at T = 0.7 gives replies each within Z_HIGH on
    either side, but spread about twice as wide as sampling spreads them; pooled, they are capped."""
    wide = [2.8, -2.8, 2.6, -2.7]
    assert all(abs(z) <= Z_HIGH for z in wide)
    assert all(two_sided(-1.0, -1.0, z) == 1.0 for z in wide)  # each alone scores 1
    assert pooled_z(wide) > Z_HIGH + 1
    assert pooled_cap(wide) == pytest.approx(math.exp(Z_HIGH - pooled_z(wide)))
    assert pooled_cap(wide) < 0.3
    honest = [0.4, -1.1, 0.9, -0.2, 1.6, -0.7, 0.1, -1.9]  # standard-normal-like
    assert pooled_z(honest) < 1.0 and pooled_cap(honest) == 1.0


def test_the_pooled_z_grows_with_the_evidence_and_ignores_greedy_requests() -> None:
    # the same spread over more replies is surer
    assert pooled_z([2.0] * 2) < pooled_z([2.0] * 4) < pooled_z([2.0] * 8)
    # a greedy request's z is 0 (nothing to measure): it neither adds nor dilutes
    assert pooled_z([2.0, 2.0, 0.0, 0.0]) == pooled_z([2.0, 2.0])
    assert pooled_z([]) == pooled_z([0.0]) == 0.0 and pooled_cap([]) == 1.0
    # continuous at the threshold, either side of it alike
    assert pooled_cap([3.3, -3.3]) == pooled_cap([-3.3, 3.3]) < 1.0
    with pytest.raises(ScoringError):
        pooled_z([1.0, math.nan])
