"""Model nodes' reputation (paper §4.3 with the fix of issue 14 item 4; decision 0010).

I/O-free and deterministic. Every value is an integer in fixed point, :data:`SCALE` = 10^6
meaning 1.0: the table is meant to live in the committee's application state, where every
verifier must compute byte-identical values; float rounding differs across platforms and
compilers, integers do not. Scores arrive as floats from the engine (:mod:`verifier.audit.scoring`)
and are converted once, at the boundary, by :func:`to_fixed`.

The rule, per model node and per epoch T in which it was audited:

- ``C(T)``: the mean of the epoch's calibrated scores of the node's challenge replies
  (:func:`epoch_mean`, rounded half up to a fixed-point unit).
- ``C(T) < τ`` is **abnormal**. The node keeps the abnormal flags of its last ``W`` audited
  epochs, the current one included; ``c`` counts the abnormal ones (before ``W`` epochs have
  passed, the missing ones count as normal).
- If ``c / W ≥ γ`` (the paper writes "above"; at its lenient γ = 1 that could never trigger):
  ``R(T) = α·R(T−1) + (W+1) / (W + c/γ + 2) · C(T)``; otherwise ``R(T) = α·R(T−1) + β·C(T)``.
  α = 0.4, β = 0.6, W = 5, γ = 1/5 (paper §4.3). Each product is rounded down, so R never
  exceeds 1.
- ``R(0)`` = :data:`R0` = 0.5 for a node the committee has never audited: it is listed (so
  users' requests, and with them the audits, reach it) but one clearly abnormal epoch removes it,
  and trust above that is earned by answering audits.
- ``R < 0.4`` (:data:`TRUST_LINE`): untrusted; the node stays on the signed model list (so that
  audits reach it and an honest node can climb back), marked by its reputation, and no client
  sends it requests (decision 0013).

An epoch in which a node was not audited leaves its reputation and window unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction

import msgpack

from overlay.wire.constants import REPUTATION_SCALE, TRUST_LINE

SCALE = REPUTATION_SCALE  # fixed point: SCALE means 1.0 (overlay/wire/constants.py)
ALPHA = 400_000  # paper §4.3
BETA = 600_000
WINDOW = 5
GAMMA = Fraction(1, 5)
R0 = 500_000
TAU = 750_000  # abnormal below C = 0.75: chosen from the measured scores, decision 0010


class ReputationError(ValueError):
    """A parameter or a score out of range (a caller's bug, not a node's misbehaviour)."""


def to_fixed(x: float) -> int:
    """A score in [0, 1] as a fixed-point integer (round half to even, clamped into range).
    NaN is refused: it would hide an engine fault as a score."""
    if math.isnan(x):
        raise ReputationError("a NaN score cannot enter the reputation table; rescore the reply")
    return min(SCALE, max(0, round(x * SCALE)))


def to_float(v: int) -> float:
    """A fixed-point value as a float, for display and plots only."""
    return v / SCALE


@dataclass(frozen=True, slots=True)
class Params:
    """The rule's constants; the defaults are the paper's, with τ from decision 0010."""

    alpha: int = ALPHA
    beta: int = BETA
    window: int = WINDOW
    gamma: Fraction = GAMMA
    tau: int = TAU
    r0: int = R0
    trust_line: int = TRUST_LINE

    def __post_init__(self) -> None:
        if not (0 <= self.alpha <= SCALE and 0 <= self.beta <= SCALE and self.alpha + self.beta <= SCALE):
            raise ReputationError("need 0 <= alpha, beta and alpha + beta <= 1 (fixed point) so that R stays in [0, 1]")
        if self.window < 1:
            raise ReputationError("the window W must hold at least one epoch")
        if not 0 < self.gamma <= 1:
            raise ReputationError("gamma must be in (0, 1]")
        for name in ("tau", "r0", "trust_line"):
            if not 0 <= getattr(self, name) <= SCALE:
                raise ReputationError(f"{name} must be a fixed-point value in [0, {SCALE}]")


@dataclass(frozen=True, slots=True)
class NodeReputation:
    """One model node's reputation ``value`` (fixed point) and its abnormal flags for its last
    audited epochs, oldest first (at most W)."""

    value: int = R0
    window: tuple[bool, ...] = ()
    epochs: int = 0  # epochs in which the node was audited

    def trusted(self, params: Params = Params()) -> bool:
        return self.value >= params.trust_line


def epoch_mean(scores: Sequence[int]) -> int:
    """C(T): the mean of an epoch's fixed-point scores, rounded half up."""
    if not scores:
        raise ReputationError("an epoch mean needs at least one score")
    for s in scores:
        if not 0 <= s <= SCALE:
            raise ReputationError(f"score {s} outside the fixed-point range [0, {SCALE}]")
    n = len(scores)
    return (2 * sum(scores) + n) // (2 * n)


def punished(abnormal: int, params: Params) -> bool:
    """Whether ``c`` abnormal epochs in the window trigger the punishment: c / W ≥ γ."""
    return Fraction(abnormal, params.window) >= params.gamma


def update(prev: NodeReputation, scores: Sequence[int], params: Params = Params()) -> NodeReputation:
    """R(T) from R(T−1) and the epoch's fixed-point scores (see the module docstring)."""
    c_t = epoch_mean(scores)
    window = (*prev.window, c_t < params.tau)[-params.window:]
    c = sum(window)
    kept = params.alpha * prev.value // SCALE
    if punished(c, params):
        # (W+1) / (W + c/γ + 2) with γ = n/d: (W+1)·n / ((W+2)·n + c·d), exactly.
        n, d = params.gamma.numerator, params.gamma.denominator
        gained = c_t * (params.window + 1) * n // ((params.window + 2) * n + c * d)
    else:
        gained = params.beta * c_t // SCALE
    return NodeReputation(value=min(SCALE, kept + gained), window=window, epochs=prev.epochs + 1)


@dataclass(frozen=True)
class ReputationTable:
    """The committee's reputation of every model node it has audited (node id → reputation)."""

    params: Params = Params()
    nodes: Mapping[bytes, NodeReputation] = field(default_factory=dict)

    def get(self, node_id: bytes) -> NodeReputation:
        """A node's reputation; R(0) for a node never audited."""
        return self.nodes.get(node_id) or NodeReputation(value=self.params.r0)

    def apply_epoch(self, scores: Mapping[bytes, Sequence[int]]) -> ReputationTable:
        """The table after an epoch: every node in ``scores`` (node id → its fixed-point challenge
        scores this epoch, at least one) updated, the others unchanged."""
        nodes = dict(self.nodes)
        for node_id in sorted(scores):
            nodes[node_id] = update(self.get(node_id), scores[node_id], self.params)
        return replace(self, nodes=nodes)

    def trusted(self, node_ids: Iterable[bytes]) -> list[bytes]:
        """The given nodes that are trusted (R ≥ the trust line), in the order given."""
        return [n for n in node_ids if self.get(n).trusted(self.params)]

    def canonical_bytes(self) -> bytes:
        """One byte form of the table (for the app hash): msgpack of the parameters and of the
        nodes sorted by id."""
        p = self.params
        return bytes(msgpack.packb([
            [p.alpha, p.beta, p.window, p.gamma.numerator, p.gamma.denominator, p.tau, p.r0, p.trust_line],
            [[nid, r.value, [int(a) for a in r.window], r.epochs] for nid, r in sorted(self.nodes.items())],
        ], use_bin_type=True))
