"""Item 2 — sender anonymity against colluding relays (paper §4.1, appendix A4, Fig. 11).

``N_NODES`` = 10,000 users; a fraction f of them (0 … 0.3) collude. For each of ``TRIALS``
requests a random user's paths are chosen — ours with :func:`overlay.anon.paths.choose_relays`
(``onion.HOPS`` = 3 distinct relays per path, no relay shared between a user's paths), Garlic
Cast's as ``GC_HOPS``-relay random walks — and the colluders' view is scored with the A4
metric (:func:`simulations.metrics.a4_entropy`): L, the relays on the paths they can tie to the
request, and Γ, the distinct predecessors of the malicious *chains* they can form. The same
paths serve every f (a node is malicious when its random rank is below f·N), so the curves
differ only by f.

What a chain is depends on which identifiers the colluders share:

- ``onion``: one 3-hop path with a circuit id per link (Tor-style): a chain is a run of
  consecutive malicious relays; L = 3;
- ``garlic_cast``: n = 4 walks carrying one message id end to end: the colluders on a walk
  know they carry the same message, so only the earliest run of each walk has the source as a
  candidate predecessor (Γ: its predecessor), and the walks of one message are linked: L = all
  relays of the n walks;
- ``ours_path_id`` (the paper's protocol, "different IDs for different paths"): one id per
  path — runs on a path are linked (Γ: the predecessor of each path's earliest run), paths
  are not; the A4 text's L is "the nodes on the paths", so L = all n·3 relays;
- ``ours_link_id`` (as built: relays rewrite the link id at every hop, overlay/anon/relay.py):
  colluders link only adjacent relays, so every run is a chain (Γ: every run's predecessor);
  L = n·3.

Figures: the mean normalised entropy and the effective anonymity set 2^H at each f (H in
bits, averaged over requests), and the paper's f = 0.05 values beside ours.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Any

from overlay.anon import onion
from overlay.anon.paths import choose_relays
from simulations.common import Population, Progress, Result, SimRelay, new_figure
from simulations.metrics import a4_entropy

N_NODES = 10_000
TRIALS = 1000
N_PATHS = 4
GC_HOPS = 4
F_VALUES = tuple(round(0.025 * i, 3) for i in range(13))  # 0 … 0.3
DESIGNS = ("onion", "garlic_cast", "ours_path_id", "ours_link_id")
PAPER_AT_005 = {"onion": 0.954, "garlic_cast": 0.903, "ours_path_id": 0.965}



def view(user: int, paths: Sequence[Sequence[int]], bad: Callable[[int], bool], *,
         runs_linked: bool) -> tuple[int, int]:
    """``(L, |Γ|)`` of the colluders' view of a request sent by ``user`` over ``paths`` (relay
    indexes, first hop first). ``runs_linked``: malicious runs on one path are tied together
    (a shared id), so only the earliest run's predecessor is a candidate source; otherwise
    every run's predecessor is one."""
    guesses: set[int] = set()
    for path in paths:
        prev = user
        in_run = False
        for relay in path:
            if bad(relay):
                if not in_run:
                    guesses.add(prev)
                    if runs_linked:
                        break
                in_run = True
            else:
                in_run = False
            prev = relay
    return sum(len(p) for p in paths), len(guesses)


def _other(rng: random.Random, n_nodes: int, user: int) -> int:
    """A uniformly random node other than ``user`` (one step of a walk on a random overlay)."""
    while True:
        x = rng.randrange(n_nodes)
        if x != user:
            return x


def simulate(seed: int, *, n_nodes: int = N_NODES, trials: int = TRIALS, n_paths: int = N_PATHS,
             f_values: Sequence[float] = F_VALUES, choose: Callable[..., Sequence[SimRelay]] = choose_relays,
             progress: Progress | None = None) -> Result:
    """Run the anonymity simulation; ``choose`` is the relay choice (default: the product's)."""
    rng = random.Random(seed)
    population = Population(n_nodes, rng, choose)
    rank = population.collusion_rank()
    requests = []
    for _ in range(trials):
        user = rng.randrange(n_nodes)
        ours = population.paths_of(user, n_paths)
        gc = [[_other(rng, n_nodes, user) for _ in range(GC_HOPS)] for _ in range(n_paths)]
        requests.append((user, ours, gc))
    series: dict[str, list[float]] = {d: [] for d in DESIGNS}
    sets: dict[str, list[float]] = {d: [] for d in DESIGNS}
    log_n = math.log2(n_nodes)
    for f in f_values:
        cut = f * n_nodes

        def bad(x: int, cut: float = cut) -> bool:
            return rank[x] < cut

        sums = dict.fromkeys(DESIGNS, 0.0)
        for user, ours, gc in requests:
            if bad(user):
                continue  # a colluder's own request is not anonymous to it; score honest senders
            views = {
                "onion": view(user, ours[:1], bad, runs_linked=False),
                "garlic_cast": view(user, gc, bad, runs_linked=True),
                "ours_path_id": view(user, ours, bad, runs_linked=True),
                "ours_link_id": view(user, ours, bad, runs_linked=False),
            }
            for d, (length, guesses) in views.items():
                sums[d] += a4_entropy(n_nodes, f, length, guesses)
        honest = sum(1 for user, _, _ in requests if not bad(user))
        for d in DESIGNS:
            h = sums[d] / honest
            series[d].append(h)
            sets[d].append(2 ** (h * log_n))
        if progress is not None:
            progress.step(f"f = {f:.3f}: " + ", ".join(f"{d} {series[d][-1]:.3f}" for d in DESIGNS))
    figures: dict[str, float] = {}
    for i, f in enumerate(f_values):
        for d in DESIGNS:
            figures[f"entropy_{d}_f{f:.3f}"] = series[d][i]
            figures[f"anonymity_set_{d}_f{f:.3f}"] = sets[d][i]
    params: dict[str, Any] = {"nodes": n_nodes, "requests": trials, "paths": n_paths, "hops": onion.HOPS,
                              "garlic_cast_hops": GC_HOPS, "f": list(f_values), "seed": seed,
                              "paper_f0.05": PAPER_AT_005}
    return Result("anonymity", params, figures, {"f": list(f_values), "entropy": series, "anonymity_set": sets})


def plot(result: Result) -> Any:
    fig, (ax1, ax2) = new_figure(2, 5.0)
    f = result.series["f"]
    for d in DESIGNS:
        ax1.plot(f, result.series["entropy"][d], marker=".", label=d)
        ax2.plot(f, result.series["anonymity_set"][d], marker=".", label=d)
    for d, v in PAPER_AT_005.items():
        ax1.plot([0.05], [v], marker="x", color="black")
        ax1.annotate(f"paper {d}", (0.05, v), fontsize=6)
    ax1.set_xlabel("malicious fraction f")
    ax1.set_ylabel("normalised entropy H / log2 N")
    ax1.set_title(f"Anonymity, N = {result.params['nodes']}")
    ax1.legend(fontsize=7)
    ax2.set_xlabel("malicious fraction f")
    ax2.set_ylabel("effective anonymity set 2^H")
    ax2.set_yscale("log")
    return fig


def run(seed: int, quick: bool) -> tuple[Result, Any]:
    kw: dict[str, Any] = {"trials": 100, "f_values": (0.0, 0.05, 0.1, 0.2, 0.3)} if quick else {}
    n_f = len(kw.get("f_values", F_VALUES))
    result = simulate(seed, progress=Progress("anonymity", n_f), **kw)
    return result, plot(result)
