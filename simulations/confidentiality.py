"""Item 3 — message confidentiality against colluding relays (paper §4.2, Fig. 11).

The paper's model: a colluding relay on a path sees the clove that path carries. For each of
``TRIALS`` requests a random user's paths are chosen (:func:`overlay.anon.paths.choose_relays`, n = 4
paths of ``onion.HOPS`` = 3 relays; Garlic Cast: n random walks of ``GC_HOPS`` relays) and a
message is split with the real :func:`overlay.anon.sida.split` (n, k) = (4, 3). The colluders
collect the cloves of the paths they sit on and try the real :func:`overlay.anon.sida.recover`:

- *with brute force*: on every clove of the message they saw (as if they had tried every
  combination of the cloves passing through them and kept the one that decodes);
- *without brute force*: only on cloves they can tie together by an identifier they see on
  the wire: Garlic Cast's message id is the same on every walk, so all its cloves group; ours
  travel under a different id per path (per link, as built), so each group holds the cloves of
  one path — one clove, below k.

Confidentiality = 1 − P(recovered). The closed form for "≥ k of n paths carry a colluder",
Σ_{i≥k} C(n,i) qⁱ(1−q)ⁿ⁻ⁱ with q = 1 − (1 − f)^hops (:func:`simulations.metrics.binomial_tail`;
with one observing node per path, q = f, the brief's form), is printed beside the Monte Carlo.
Our clove headers (msg_id, fingerprints) are the same in all n cloves of a message, so a relay
that could read them could group them without brute force; the overlay seals each clove to the
model node (DESIGN.md), so relays see only the sealed bytes — the model above is the paper's,
stricter than the product.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from overlay.anon import onion, sida
from overlay.anon.paths import choose_relays
from simulations.common import Population, Progress, Result, SimRelay, new_figure
from simulations.metrics import binomial_tail

N_NODES = 10_000
TRIALS = 4000
N, K = 4, 3
GC_HOPS = 4
F_VALUES = tuple(round(0.025 * i, 3) for i in range(13))
PAPER_AT_010 = {"ours_brute_force": 0.88, "garlic_cast_brute_force": 0.73}
DESIGNS = ("ours_brute_force", "ours_no_brute_force", "garlic_cast_brute_force", "garlic_cast_no_brute_force")



def recovered(cloves: Sequence[sida.Clove], groups: Sequence[Sequence[int]]) -> bool:
    """Whether any group of clove indexes the colluders formed decodes with ``sida.recover``."""
    for g in groups:
        if not g:
            continue
        try:
            sida.recover([cloves[i] for i in g])
        except sida.SidaError:
            continue
        return True
    return False


def simulate(seed: int, *, n_nodes: int = N_NODES, trials: int = TRIALS, n: int = N, k: int = K,
             f_values: Sequence[float] = F_VALUES, choose: Callable[..., Sequence[SimRelay]] = choose_relays,
             split: Callable[..., list[sida.Clove]] = sida.split, progress: Progress | None = None) -> Result:
    """Run the confidentiality simulation; ``choose`` and ``split`` default to the product's."""
    rng = random.Random(seed)
    population = Population(n_nodes, rng, choose)
    rank = population.collusion_rank()
    requests = []
    for t in range(trials):
        user = rng.randrange(n_nodes)
        ours = population.paths_of(user, n)
        gc = [[rng.randrange(n_nodes) for _ in range(GC_HOPS)] for _ in range(n)]
        cloves = split(b"prompt %d: " % t + rng.randbytes(48), n, k, msg_id=rng.randbytes(sida.MSG_ID_LEN))
        requests.append((ours, gc, cloves))
    series: dict[str, list[float]] = {d: [] for d in DESIGNS}
    closed: dict[str, list[float]] = {"ours": [], "garlic_cast": []}
    for f in f_values:
        cut = f * n_nodes
        leaks = dict.fromkeys(DESIGNS, 0)
        for ours, gc, cloves in requests:
            seen_ours = [i for i, p in enumerate(ours) if any(rank[x] < cut for x in p)]
            seen_gc = [i for i, p in enumerate(gc) if any(rank[x] < cut for x in p)]
            leaks["ours_brute_force"] += recovered(cloves, [seen_ours])
            leaks["ours_no_brute_force"] += recovered(cloves, [[i] for i in seen_ours])
            gc_leak = recovered(cloves, [seen_gc])
            leaks["garlic_cast_brute_force"] += gc_leak
            leaks["garlic_cast_no_brute_force"] += gc_leak  # one message id: grouping is free
        for d in DESIGNS:
            series[d].append(1 - leaks[d] / trials)
        closed["ours"].append(1 - binomial_tail(n, k, 1 - (1 - f) ** onion.HOPS))
        closed["garlic_cast"].append(1 - binomial_tail(n, k, 1 - (1 - f) ** GC_HOPS))
        if progress is not None:
            progress.step(f"f = {f:.3f}: " + ", ".join(f"{d} {series[d][-1]:.3f}" for d in DESIGNS))
    figures: dict[str, float] = {}
    for i, f in enumerate(f_values):
        for d in DESIGNS:
            figures[f"confidentiality_{d}_f{f:.3f}"] = series[d][i]
        figures[f"closed_form_ours_f{f:.3f}"] = closed["ours"][i]
        figures[f"closed_form_garlic_cast_f{f:.3f}"] = closed["garlic_cast"][i]
    params: dict[str, Any] = {"nodes": n_nodes, "requests": trials, "n": n, "k": k, "hops": onion.HOPS,
                              "garlic_cast_hops": GC_HOPS, "f": list(f_values), "seed": seed,
                              "paper_f0.10": PAPER_AT_010}
    return Result("confidentiality", params, figures,
                  {"f": list(f_values), "confidentiality": series, "closed_form": closed})


def plot(result: Result) -> Any:
    fig, (ax,) = new_figure()
    f = result.series["f"]
    for d in DESIGNS:
        ax.plot(f, result.series["confidentiality"][d], marker=".", label=d)
    for d, v in result.series["closed_form"].items():
        ax.plot(f, v, linestyle=":", color="gray", label=f"closed form, {d}")
    for d, v in PAPER_AT_010.items():
        ax.plot([0.1], [v], marker="x", color="black")
        ax.annotate(f"paper {d}", (0.1, v), fontsize=6)
    ax.set_xlabel("malicious fraction f")
    ax.set_ylabel("P(message stays confidential)")
    ax.set_title(f"Confidentiality, (n,k) = ({result.params['n']},{result.params['k']})")
    ax.legend(fontsize=7)
    return fig


def run(seed: int, quick: bool) -> tuple[Result, Any]:
    kw: dict[str, Any] = {"trials": 300, "f_values": (0.0, 0.1, 0.2, 0.3)} if quick else {}
    result = simulate(seed, progress=Progress("confidentiality", len(kw.get("f_values", F_VALUES))), **kw)
    return result, plot(result)
