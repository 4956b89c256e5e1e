"""Item 4 — reputation dynamics (paper §4.3, Fig. 12).

Honest and dishonest model nodes are audited for ``EPOCHS`` = 35 epochs with the punishment
threshold γ = 1, 1/3 and 1/5. Every epoch each node answers ``CHALLENGES`` challenges; each
challenge's sampling setting (greedy, temperature 0.7 or 1.0) is drawn like a user's, and its
score is a calibrated score C **measured on the real engine** (``simulations/data/scores.json``,
written by ``python -m simulations.measure_scores``): an honest node's from the replies of the
verifier's own model (SmolLM2-135M-Instruct Q4_1), a dishonest node's from the replies of the
same model re-quantized to Q2_K, both scored by the verifier's model. The scores go through the
real reputation core (:class:`verifier.audit.reputation.ReputationTable`, its fixed-point rule, τ and
R(0)); only γ changes between runs, and every γ sees the same draws.

For comparison, the paper's raw score (1/PPL of the same replies) is run through the same rule
at γ = 1/5: it shows why the calibrated score is needed (honest nodes fall under the trust line).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

from simulations.common import Progress, Result, new_figure
from verifier.audit import reputation as rep

SCORES_FILE = Path(__file__).parent / "data" / "scores.json"
EPOCHS = 35
N_HONEST = 20
N_DISHONEST = 20
CHALLENGES = 3
GAMMAS = (Fraction(1), Fraction(1, 3), Fraction(1, 5))
PAPER = {"dishonest_below_0.1_by_epoch_5_at_gamma_1/5": "most", "trust_line": 0.4}
TableFactory = Callable[[rep.Params], rep.ReputationTable]


def load_scores(path: Path = SCORES_FILE) -> dict[str, dict[str, list[dict[str, float]]]]:
    """The measured samples: setting → role ("honest", "degraded") → rows with "calibrated" and
    "raw_inv_ppl"."""
    data = json.loads(path.read_text())
    samples: dict[str, dict[str, list[dict[str, float]]]] = data["samples"]
    for setting, roles in samples.items():
        for role in ("honest", "degraded"):
            if not roles.get(role):
                raise ValueError(f"{path}: no {role} samples for {setting}; rerun python -m simulations.measure_scores")
    return samples


def draw_epochs(samples: dict[str, dict[str, list[dict[str, float]]]], rng: random.Random, n_nodes: int,
                role: str, epochs: int, challenges: int, key: str) -> list[list[list[int]]]:
    """Per node, per epoch, the fixed-point scores (``key``: "calibrated" or "raw_inv_ppl") of
    ``challenges`` challenges, each with a uniformly drawn setting and a measured reply of
    ``role``."""
    settings = sorted(samples)
    out = []
    for _ in range(n_nodes):
        node = []
        for _ in range(epochs):
            node.append([rep.to_fixed(rng.choice(samples[rng.choice(settings)][role])[key])
                         for _ in range(challenges)])
        out.append(node)
    return out


def run_rule(draws: dict[bytes, list[list[int]]], params: rep.Params, epochs: int,
             new_table: TableFactory = rep.ReputationTable) -> dict[bytes, list[float]]:
    """R(T) for T = 0..epochs of every node, through the reputation core."""
    table = new_table(params)
    curves = {nid: [rep.to_float(table.get(nid).value)] for nid in draws}
    for t in range(epochs):
        table = table.apply_epoch({nid: d[t] for nid, d in draws.items()})
        for nid in draws:
            curves[nid].append(rep.to_float(table.get(nid).value))
    return curves


def _first_epoch(curves: Sequence[Sequence[float]], below: float) -> int | None:
    """The first epoch by which every curve has fallen below ``below`` (None if never)."""
    worst = None
    for c in curves:
        hit = next((t for t, v in enumerate(c) if v < below), None)
        if hit is None:
            return None
        worst = hit if worst is None else max(worst, hit)
    return worst


def simulate(seed: int, *, n_honest: int = N_HONEST, n_dishonest: int = N_DISHONEST, epochs: int = EPOCHS,
             challenges: int = CHALLENGES, gammas: Sequence[Fraction] = GAMMAS, scores_file: Path = SCORES_FILE,
             new_table: TableFactory = rep.ReputationTable, progress: Progress | None = None) -> Result:
    """Run the reputation simulation; ``new_table`` defaults to the product's table."""
    samples = load_scores(scores_file)
    honest_ids = [b"h%03d" % i for i in range(n_honest)]
    dishonest_ids = [b"d%03d" % i for i in range(n_dishonest)]
    draws: dict[str, dict[bytes, list[list[int]]]] = {"calibrated": {}, "raw_inv_ppl": {}}
    for key in draws:
        sub = random.Random(f"{seed}/{key}")  # the same nodes' replies under both scores
        for ids, role in ((honest_ids, "honest"), (dishonest_ids, "degraded")):
            for nid, node in zip(ids, draw_epochs(samples, sub, len(ids), role, epochs, challenges, key),
                                 strict=True):
                draws[key][nid] = node
    base = rep.Params()
    series: dict[str, Any] = {"epochs": list(range(epochs + 1)), "gamma": {}}
    figures: dict[str, float] = {}
    for g in [*gammas, None]:
        key = "calibrated" if g is not None else "raw_inv_ppl"
        gamma = g if g is not None else Fraction(1, 5)
        frac = str(gamma)  # "1", "1/3", "1/5"
        name = frac if g is not None else f"{frac}, raw 1/PPL (same rule and τ)"
        curves = run_rule(draws[key], rep.Params(gamma=gamma), epochs, new_table)
        honest = [curves[n] for n in honest_ids]
        dishonest = [curves[n] for n in dishonest_ids]
        tag = f"gamma_{gamma.numerator}_{gamma.denominator}" + ("" if g is not None else "_raw")
        figures[f"{tag}_honest_min_R"] = min(min(c[1:]) for c in honest)
        figures[f"{tag}_honest_ever_untrusted"] = sum(min(c[1:]) < rep.to_float(base.trust_line) for c in honest)
        figures[f"{tag}_honest_final_mean_R"] = sum(c[-1] for c in honest) / len(honest)
        figures[f"{tag}_dishonest_mean_R_epoch5"] = sum(c[min(5, epochs)] for c in dishonest) / len(dishonest)
        figures[f"{tag}_dishonest_max_R_epoch5"] = max(c[min(5, epochs)] for c in dishonest)
        figures[f"{tag}_dishonest_below_0.1_by_epoch5"] = (
            sum(min(c[1:6]) < 0.1 for c in dishonest) / len(dishonest))
        figures[f"{tag}_dishonest_final_mean_R"] = sum(c[-1] for c in dishonest) / len(dishonest)
        figures[f"{tag}_dishonest_ever_trusted_after_epoch5"] = sum(
            max(c[6:], default=0.0) >= rep.to_float(base.trust_line) for c in dishonest)
        for line in (0.4, 0.1):
            first = _first_epoch(dishonest, line)
            figures[f"{tag}_all_dishonest_below_{line}_epoch"] = -1 if first is None else first
        series["gamma"][name] = {
            "honest_mean": [sum(c[t] for c in honest) / len(honest) for t in range(epochs + 1)],
            "honest_min": [min(c[t] for c in honest) for t in range(epochs + 1)],
            "dishonest_mean": [sum(c[t] for c in dishonest) / len(dishonest) for t in range(epochs + 1)],
            "dishonest_max": [max(c[t] for c in dishonest) for t in range(epochs + 1)],
        }
        if progress is not None:
            progress.step(f"gamma {name}: honest min R {figures[f'{tag}_honest_min_R']:.3f}, dishonest mean R at "
                          f"epoch 5 {figures[f'{tag}_dishonest_mean_R_epoch5']:.3f}")
    data = json.loads(scores_file.read_text())
    params: dict[str, Any] = {
        "seed": seed, "honest_nodes": n_honest, "dishonest_nodes": n_dishonest, "epochs": epochs,
        "challenges_per_epoch": challenges, "gammas": [str(g) for g in gammas],
        "alpha": rep.to_float(base.alpha), "beta": rep.to_float(base.beta), "window": base.window,
        "tau": rep.to_float(base.tau), "r0": rep.to_float(base.r0), "trust_line": rep.to_float(base.trust_line),
        "scores": {"file": "simulations/data/scores.json", "how": data.get("how"), "summary": data.get("summary")},
        "paper": PAPER,
    }
    return Result("reputation", params, figures, series)


def plot(result: Result) -> Any:
    names = list(result.series["gamma"])
    fig, axes = new_figure(len(names), width=4.0)
    t = result.series["epochs"]
    for ax, name in zip(axes, names, strict=True):
        s = result.series["gamma"][name]
        ax.plot(t, s["honest_mean"], color="tab:blue", label="honest, mean")
        ax.plot(t, s["honest_min"], color="tab:blue", linestyle=":", label="honest, min")
        ax.plot(t, s["dishonest_mean"], color="tab:red", label="Q2_K, mean")
        ax.plot(t, s["dishonest_max"], color="tab:red", linestyle=":", label="Q2_K, max")
        ax.axhline(0.4, color="gray", linewidth=0.8)
        ax.axhline(0.1, color="gray", linewidth=0.8, linestyle="--")
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("epoch")
        ax.set_title(f"γ = {name}", fontsize=9)
    axes[0].set_ylabel("reputation R(T)")
    axes[0].legend(fontsize=7)
    return fig


def run(seed: int, quick: bool) -> tuple[Result, Any]:
    kw: dict[str, Any] = {"n_honest": 4, "n_dishonest": 4} if quick else {}
    result = simulate(seed, progress=Progress("reputation", len(GAMMAS) + 1), **kw)
    return result, plot(result)
