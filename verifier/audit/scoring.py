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
- **z** ``= Σ(logprob − expected) / √Σ variance`` (decision 0013 §5): how many standard
  deviations the reply's total log-probability lies from what sampling with the challenge's
  parameters gives (the engine reports each position's variance, ``TokenScore.var_logprob``).
  An honest sampled reply has z near 0 (its positions' differences have mean 0 under the
  model's own sampling; measured sd 0.91); a reply decoded greedily by the verifier's own weights
  although a temperature was asked is too likely: z of 2 to 8 on 128 tokens, growing with the
  square root of the length. 0 when there is no variance (greedy requests: the honest reply is the
  argmax everywhere and C alone judges it, as before).
- **two-sided score** (``score``, the one audits use): C while ``z ≤ Z_HIGH``; above it the
  reply is as much evidence as one that far *below* its expectation: ``exp(−(mean(logprob) −
  mean(expected_logprob)))``. ``Z_HIGH`` and the rule come from measurements on the real
  engine (``python -m simulations.measure_audit_scores``, ``simulations/data/audit_scores.json``).
- **the significance cap** (decision 0019): C and its mirror measure how *far* a reply's mean
  lies from what sampling gives, not how *sure* that distance is. A Q2_K node decoding greedily at
  T = 0.7 produces replies whose mean is close to the expectation (C ≈ 0.95) but whose total lies
  3 to 5 standard deviations away, on either side; an honest reply's ``|z|`` stays under
  ``Z_HIGH`` (measured: sd 0.90, |z| at most 2.51 over 72 sampled replies). So a reply with
  ``|z| > Z_HIGH`` scores at most ``exp(−(|z| − Z_HIGH))``: 1 at the threshold (no cliff), 0.37
  one standard deviation past it, 0.14 two past it, and 0.0 (a float's underflow) some 745 past it.
- **the pooled caps**: a verifier's challenge replies from one node in an epoch, together
  (:func:`pooled_cap`, decision 0023); users' transcripts of one node, per donor, when two
  donors' sets are each far off (:func:`donors_cap`, decision 0028).

All are pure functions of the scores: I/O-free and deterministic for the same input (but the
scores themselves are floats from an engine: verifiers agree on them within a tolerance, not
bit for bit; the reputation core quantizes what it keeps, :mod:`verifier.audit.reputation`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from model_node.engine import TokenScore


class ScoringError(ValueError):
    """The scores cannot be turned into an audit score (empty reply, non-finite values)."""


#: A reply whose z is above this is too likely for its sampling parameters (decision 0013 §5).
#: Measured (``simulations/data/audit_scores.json``: SmolLM2 Q4_1 verifier, 128-token replies to
#: real users' prompts): honest sampled replies' z has mean −0.02, sd 0.91, no skew, max 2.30 over
#: 72 (so z > 3 is ~0.1 % of honest replies if normal); a node decoding greedily with the honest
#: weights exceeds 3 in 66 of 72 sampled challenges, one with Q2_K weights in 16 of 72 (at T = 1:
#: 19 of 24; at T = 0.7 its quantization noise makes its argmax as different from the verifier's
#: as sampling would, and nothing "too likely" is left to see).
Z_HIGH = 3.0
#: Below this total variance (nats²) z is 0: nothing to measure (greedy, top-k 1, a tiny nucleus).
MIN_VARIANCE = 1e-9


@dataclass(frozen=True, slots=True)
class ReplyScore:
    """The audit figures of one reply: ``score`` (the two-sided calibrated score, in [0, 1]: the
    one audits use; 0 only for a reply hundreds of standard deviations off), ``calibrated`` (the one-sided C, in (0, 1], for reports), ``z`` (standard
    deviations above the sampling expectation), ``raw_inv_ppl`` (1/PPL, in (0, 1]), the mean
    observed and expected log-probabilities, the share of positions where the reply's token is
    the model's argmax, and the number of scored tokens."""

    calibrated: float
    raw_inv_ppl: float
    mean_logprob: float
    mean_expected_logprob: float
    argmax_agreement: float
    tokens: int
    z: float
    score: float


def score_reply(scores: Sequence[TokenScore]) -> ReplyScore:
    """The audit figures of a reply from its per-token scores (one entry per reply token, in
    order). Raises :class:`ScoringError` for an empty reply (there is nothing to judge: the
    audit treats an empty answer to a challenge as a failed challenge, not as a score) or a
    non-finite log-probability or variance (an engine fault, not the node's)."""
    if not scores:
        raise ScoringError("an empty reply has no score: count it as a failed challenge")
    n = len(scores)
    lp = math.fsum(s.logprob for s in scores) / n
    ex = math.fsum(s.expected_logprob for s in scores) / n
    var = math.fsum(s.var_logprob for s in scores)
    if not (math.isfinite(lp) and math.isfinite(ex) and math.isfinite(var) and var >= 0.0):
        raise ScoringError("the engine returned a non-finite log-probability; rescore the reply "
                           "(a verifier-side fault, not evidence against the node)")
    agree = sum(s.token_id == s.argmax for s in scores) / n
    z = z_score(n * (lp - ex), var)
    return ReplyScore(calibrated=calibrated(lp, ex), raw_inv_ppl=math.exp(min(0.0, lp)),
                      mean_logprob=lp, mean_expected_logprob=ex, argmax_agreement=agree, tokens=n,
                      z=z, score=two_sided(lp, ex, z))


def calibrated(mean_logprob: float, mean_expected_logprob: float) -> float:
    """C = exp(min(0, observed − expected)) for a reply's mean log-probabilities."""
    return math.exp(min(0.0, mean_logprob - mean_expected_logprob))


def z_score(total_difference: float, total_variance: float) -> float:
    """Σ(logprob − expected) / √Σ variance; 0 when the variance is below :data:`MIN_VARIANCE`."""
    if total_variance < MIN_VARIANCE:
        return 0.0
    return total_difference / math.sqrt(total_variance)


def two_sided(mean_logprob: float, mean_expected_logprob: float, z: float, z_high: float = Z_HIGH) -> float:
    """The two-sided score: C while ``z ≤ z_high``; a reply too likely for its sampling
    (``z > z_high``) scores exp(−(observed − expected)), as one that far below would; and a reply
    whose total lies more than ``z_high`` standard deviations from its expectation, on either
    side, scores at most exp(−(|z| − z_high)) (the significance cap, decision 0019)."""
    d = mean_logprob - mean_expected_logprob
    score = math.exp(-abs(d)) if z > z_high else math.exp(min(0.0, d))
    if abs(z) > z_high:
        score = min(score, math.exp(z_high - abs(z)))
    return score


def pooled_z(zs: Sequence[float]) -> float:
    """The pooled significance of a verifier's replies from one node in one epoch (decision 0023):
    ``Σ z²`` over the replies that have a ``z`` (a nonzero one: a greedy request's ``z`` is 0, there
    is nothing to measure), as a standard normal deviate (the Wilson–Hilferty approximation of the
    chi-square with one degree of freedom per reply). About 0 for honest replies, whose ``z`` are
    standard normal; large when the ``z`` are spread wider than sampling spreads them, on either
    side (a Q2_K node decoding greedily at T = 0.7: each reply within ``Z_HIGH``, their spread twice
    an honest one's). 0 with no such reply."""
    measured = [z for z in zs if z != 0.0]
    if not measured:
        return 0.0
    if not all(math.isfinite(z) for z in measured):
        raise ScoringError("a non-finite z cannot be pooled")
    k = len(measured)
    mean_square = math.fsum(z * z for z in measured) / k
    spread = 2.0 / (9.0 * k)
    return float((mean_square ** (1.0 / 3.0) - (1.0 - spread)) / math.sqrt(spread))


def pooled_cap(zs: Sequence[float], z_high: float = Z_HIGH) -> float:
    """The cap on every score of a verifier's replies from one node in one epoch (decision 0023):
    1 while :func:`pooled_z` ≤ ``z_high``, else ``exp(z_high − pooled_z)``, the per-reply cap's
    rule (decision 0019) applied to the replies together. For challenges only: the verifier chose
    those requests, while a donor chooses which transcripts to hand in (and so could pick the
    widest-spread of an honest node's replies)."""
    w = pooled_z(zs)
    return 1.0 if w <= z_high else math.exp(z_high - w)


#: A user's transcript (decision 0015) weighs as a reply of at least this many tokens: a shorter
#: reply's log-score is scaled by ``tokens / FULL_TOKENS`` (decision 0021).
FULL_TOKENS = 128


def length_weighted(score: float, tokens: int, full: int = FULL_TOKENS) -> float:
    """A transcript's score, weighted by its reply's length (decision 0021): ``score`` itself for a
    reply of ``full`` tokens or more; for a shorter one ``score ** (tokens / full)``, as if its
    log-likelihood deficit were spread over ``full`` tokens. The donor chooses the request, and so
    how short the reply may be; a short honest reply's score is far noisier (measured: 30 % of
    4-token honest replies at T = 1 score under τ, against about 6 % of 256-token ones), so without
    the weight a framer who asks for short replies and reveals the bad ones has cheap evidence.
    With it, no reply's log-score spreads more than a ``full``-token reply's."""
    if not 0.0 <= score <= 1.0 or tokens < 1 or full < 1:
        raise ScoringError(f"a score in [0, 1] and at least one token are needed, not {score!r} and {tokens}")
    return score if tokens >= full else score ** (tokens / full)


#: Donors whose transcripts of one node must each be significant before that node's transcripts
#: are capped (decision 0028): two, so that no one donor's luck, or choice, caps a node.
DONORS_TO_CAP = 2


def transcript_z(z: float, tokens: int, full: int = FULL_TOKENS) -> float:
    """A transcript's ``z`` weighted by its reply's length as its score is (decision 0021):
    ``z · √(tokens / full)`` below ``full`` tokens. A few tokens' z is far from normal (4-token
    honest replies: 1 in 96 past 3.3, measured), and the donor chooses how short a reply to ask."""
    if tokens < 1 or full < 1 or not math.isfinite(z):
        raise ScoringError(f"a finite z and at least one token are needed, not {z!r} and {tokens}")
    return z if tokens >= full else z * math.sqrt(tokens / full)


def donor_threshold(donors: int, z_high: float = Z_HIGH) -> float:
    """The pooled z one of ``donors`` honest donors' sets passes with the chance one set passes
    ``z_high`` (a Bonferroni bound: :data:`Z_HIGH` for one donor, 3.75 for 15, 4.69 for 1,000), so
    more donors, sybils included, do not make an honest node's sets likelier to pass."""
    if donors < 1:
        raise ScoringError(f"at least one donor is needed, not {donors}")
    from statistics import NormalDist

    unit = NormalDist()
    return max(z_high, -unit.inv_cdf(unit.cdf(-z_high) / donors))


def donors_cap(sets: Iterable[Sequence[float]], z_high: float = Z_HIGH, need: int = DONORS_TO_CAP) -> float:
    """The cap on every transcript score of one node in one epoch at one verifier (decision 0028),
    from its donors' sets of (:func:`transcript_z`) z: each set's :func:`pooled_z` ``w``; the sets
    with a measured z are the donors, and their :func:`donor_threshold` ``t``; if the ``need``-th
    largest ``w`` is above ``t`` the cap is ``exp(t − w)`` (that ``w``), else 1. Good replies
    cannot lift it: a cheater's own users (*boosters*) handing in honest transcripts of it add
    sets whose ``w`` is about 0 and raise ``t`` only as the log of their number."""
    ws = sorted((pooled_z(zs) for zs in sets if any(z != 0.0 for z in zs)), reverse=True)
    if need < 1 or len(ws) < need:
        return 1.0
    t = donor_threshold(len(ws), z_high)
    w = ws[need - 1]
    return 1.0 if w <= t else math.exp(t - w)


def raw_inv_ppl(scores: Sequence[TokenScore]) -> float:
    """The paper's raw score, 1/PPL = exp(mean log-probability), for reports."""
    return score_reply(scores).raw_inv_ppl
