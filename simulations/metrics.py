"""Metric functions of the simulations: entropy (paper appendix A4), the binomial tail of the
confidentiality closed form (§4.2) and percentiles."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def entropy(probabilities: Iterable[float]) -> float:
    """Shannon entropy in bits of a distribution (zeros contribute nothing). Raises
    ``ValueError`` if a probability is negative or they do not sum to 1 (±1e-9)."""
    total, h = 0.0, 0.0
    for p in probabilities:
        if p < 0:
            raise ValueError(f"negative probability {p}")
        total += p
        if p > 0:
            h -= p * math.log2(p)
    if abs(total - 1.0) > 1e-9:
        raise ValueError(f"probabilities sum to {total}, not 1")
    return h


def a4_entropy(n_nodes: int, f: float, on_paths: int, guesses: int) -> float:
    """Normalised entropy H / log2(N) of the attacker's source distribution of appendix A4.

    ``n_nodes``: N; ``f``: the malicious fraction; ``on_paths``: L, the relays on the paths the
    attacker can tie together; ``guesses``: |Γ|, the distinct predecessors of the malicious
    chains. Each of the |Γ| nodes gets 1 / (L + 1 − fL); the rest of the (1 − f)N honest nodes
    share what is left equally. Computed in closed form (the uniform part is one term)."""
    if n_nodes < 2:
        raise ValueError("need at least 2 nodes")
    honest = (1 - f) * n_nodes
    if guesses == 0:
        return math.log2(honest) / math.log2(n_nodes)
    p_guess = min(1.0, 1 / (on_paths + 1 - f * on_paths))
    mass_guess = min(1.0, guesses * p_guess)
    rest = honest - guesses
    h = -mass_guess * math.log2(p_guess)
    if rest > 0 and mass_guess < 1:
        p_rest = (1 - mass_guess) / rest
        h -= (1 - mass_guess) * math.log2(p_rest)
    return h / math.log2(n_nodes)


def binomial_tail(n: int, k: int, p: float) -> float:
    """P(X ≥ k) for X ~ Binomial(n, p): Σ_{i≥k} C(n,i) pⁱ (1−p)ⁿ⁻ⁱ."""
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(max(k, 0), n + 1))


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) by linear interpolation; NaN for no values."""
    if not values:
        return math.nan
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)
