"""τ (verifier.audit.reputation.TAU) against the score distributions measured on the real engine
(simulations/data/scores.json), as decision 0010 §4 chose it: an epoch's C(T) is the mean of 3
challenges, each with a setting drawn like a user's (greedy, T = 0.7, T = 1.0 equally likely) and
a reply from that setting. With 24 replies per setting and role, every challenge's score is a
uniform draw from the role's 72 measured scores, so the distribution of epoch means is computed
exactly here (72³ equally likely triples), not resampled."""

from __future__ import annotations

import bisect
import json
from pathlib import Path

from verifier.audit import reputation as rep

SCORES = Path(__file__).resolve().parents[2] / "simulations" / "data" / "scores.json"
CHALLENGES = 3  # per node and epoch (decision 0010)


def _epoch_means(role: str) -> list[float]:
    samples = json.loads(SCORES.read_text())["samples"]
    sizes = {len(samples[s][role]) for s in samples}
    assert len(sizes) == 1, "settings must hold equally many replies for the uniform pool to be exact"
    pool = [row["calibrated"] for s in sorted(samples) for row in samples[s][role]]
    assert CHALLENGES == 3
    return sorted((a + b + c) / 3 for a in pool for b in pool for c in pool)


def _rates(honest: list[float], degraded: list[float], tau: float) -> tuple[float, float]:
    """(share of honest epochs abnormal, share of degraded epochs not abnormal) at ``tau``."""
    return (bisect.bisect_left(honest, tau) / len(honest),
            1 - bisect.bisect_left(degraded, tau) / len(degraded))


def test_tau_separates_the_measured_epoch_means() -> None:
    honest, degraded = _epoch_means("honest"), _epoch_means("degraded")
    tau = rep.TAU / rep.SCALE
    honest_abnormal, degraded_normal = _rates(honest, degraded, tau)
    # Decision 0010: about 1 % of an honest node's epochs are abnormal, about 99 % of a degraded
    # node's are (so its window of 5 nearly always holds one at γ = 1/5).
    assert honest_abnormal < 0.02
    assert degraded_normal < 0.02
    # And τ sits next to the threshold that misclassifies fewest epochs (0.001 steps).
    errors = {t / 1000: sum(_rates(honest, degraded, t / 1000)) for t in range(300, 1001)}
    best = min(errors, key=lambda t: (errors[t], t))
    assert abs(best - tau) <= 0.01, f"the measured scores now favour τ ≈ {best}: revisit decision 0010"
    assert errors[tau] <= errors[best] + 0.005


def test_honest_and_degraded_scores_are_what_decision_0010_reports() -> None:
    """The table of decision 0010 §4 (means of C per setting, 3 decimals) is this file's data."""
    samples = json.loads(SCORES.read_text())["samples"]

    def mean(setting: str, role: str) -> float:
        rows: list[dict[str, float]] = samples[setting][role]
        return round(sum(r["calibrated"] for r in rows) / len(rows), 3)

    assert (mean("greedy", "honest"), mean("t0.7", "honest"), mean("t1.0", "honest")) == (1.000, 0.955, 0.899)
    assert (mean("greedy", "degraded"), mean("t0.7", "degraded"), mean("t1.0", "degraded")) == (0.650, 0.480, 0.277)
