"""Audit scores of one challenge reply from its teacher-forced token scores (issue 14 item 3;
paper §3.4, §4.3; decision 0010).

A verifier runs the reply's token ids through its own copy of the model once
(``Engine.score``), which gives, per reply token, the token's log-probability and the
log-probability the model *expects* of a token drawn with the challenge's sampling parameters
(:class:`model_node.engine.TokenScore`). From those:

- **raw 1/PPL** (the paper's score): ``exp(mean(logprob))``. It depends on the sampling
  temperature and on how predictable the prompt is, so an honest node's score varies from
  about 0.2 to 0.6 on a small model (decision 0010); it is kept for reports only.
- **calibrated score** ``C = exp(min(0, mean(logprob) − mean(expected_logprob)))``: 1 when the
  reply is as likely under the verifier's model as the model's own samples would be (greedy: the
  argmax at every position), below 1 by the factor of likelihood the reply lacks. A node serving a
  different (cheaper) model picks tokens the verifier's model finds less likely than its own
  choices, so its C falls; an honest node's C stays near 1 at every temperature.

Both are pure functions of the scores: I/O-free and deterministic for the same input (but the
scores themselves are floats from an engine: verifiers agree on them within a tolerance, not
bit for bit; the reputation core quantizes what it keeps, :mod:`verifier.reputation`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from model_node.engine import TokenScore


class ScoringError(ValueError):
    """The scores cannot be turned into an audit score (empty reply, non-finite values)."""


@dataclass(frozen=True, slots=True)
class ReplyScore:
    """The audit figures of one reply: ``calibrated`` (C, in (0, 1]), ``raw_inv_ppl`` (1/PPL, in
    (0, 1]), the mean observed and expected log-probabilities, the share of positions where the
    reply's token is the model's argmax, and the number of scored tokens."""

    calibrated: float
    raw_inv_ppl: float
    mean_logprob: float
    mean_expected_logprob: float
    argmax_agreement: float
    tokens: int


def score_reply(scores: Sequence[TokenScore]) -> ReplyScore:
    """The audit figures of a reply from its per-token scores (one entry per reply token, in
    order). Raises :class:`ScoringError` for an empty reply (there is nothing to judge: the
    audit treats an empty answer to a challenge as a failed challenge, not as a score) or a
    non-finite log-probability (an engine fault, not the node's)."""
    if not scores:
        raise ScoringError("an empty reply has no score: count it as a failed challenge")
    n = len(scores)
    lp = math.fsum(s.logprob for s in scores) / n
    ex = math.fsum(s.expected_logprob for s in scores) / n
    if not (math.isfinite(lp) and math.isfinite(ex)):
        raise ScoringError("the engine returned a non-finite log-probability; rescore the reply "
                           "(a verifier-side fault, not evidence against the node)")
    agree = sum(s.token_id == s.argmax for s in scores) / n
    return ReplyScore(calibrated=calibrated(lp, ex), raw_inv_ppl=math.exp(min(0.0, lp)),
                      mean_logprob=lp, mean_expected_logprob=ex, argmax_agreement=agree, tokens=n)


def calibrated(mean_logprob: float, mean_expected_logprob: float) -> float:
    """C = exp(min(0, observed − expected)) for a reply's mean log-probabilities."""
    return math.exp(min(0.0, mean_logprob - mean_expected_logprob))


def raw_inv_ppl(scores: Sequence[TokenScore]) -> float:
    """The paper's raw score, 1/PPL = exp(mean log-probability), for reports."""
    return score_reply(scores).raw_inv_ppl
