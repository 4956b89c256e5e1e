"""Item 6 (beyond the paper) — linking users to destinations by timing.

``N_NODES`` users, each holding ``N_PATHS`` = 4 paths of ``onion.HOPS`` relays chosen with
:func:`overlay.anon.paths.choose_relays`, send requests (Poisson, ``RATE_PER_USER`` each) to one of
``MODELS`` model nodes; a request's n cloves leave at once, one per path. A fraction f of the
users collude. They see a clove *enter* when they are the first hop of its path (they know
the sending user and the time) and *leave* when they are its proxy (they know the time and the
model node it goes to). Each link adds a latency drawn from a log-normal (median
``LINK_MEDIAN_S``, σ ``LINK_SIGMA``); with the defence, every relay also holds each clove for a
uniform random delay in [0, D].

The adversary matches each exit it sees to the entry, among those it saw, whose elapsed time
is closest to the delay it expects (two links and three relay holds: 2·E[link] + 3·D/2), and
links the request's user to the destination when that entry is the request's own user — from
any of the request's paths (the n cloves leave together). Reported: the fraction of all
requests linked, per f, today (D = 0) and with each D of ``DELAYS_S``, and the latency a delay
adds (3·D/2 on average each way). This adversary is simple; a stronger one (likelihoods,
many requests per user) only links more, so these are lower bounds on the leak.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Callable, Sequence
from typing import Any

from overlay.anon import onion
from overlay.anon.paths import choose_relays
from simulations.common import Population, Progress, Result, SimRelay, new_figure

N_NODES = 3000
N_PATHS = 4
MODELS = 50
RATE_PER_USER = 1 / 30.0  # requests per second per user: 100 requests/s in all
DURATION_S = 60.0
LINK_MEDIAN_S = 0.020
LINK_SIGMA = 0.5
DELAYS_S = (0.0, 0.010, 0.050, 0.200)
F_VALUES = (0.0, 0.05, 0.1, 0.15, 0.2, 0.3)



def link_rate(entries: Sequence[tuple[float, int]], exits: Sequence[tuple[float, int, int]],
              expected: float, n_requests: int) -> float:
    """Fraction of ``n_requests`` linked: ``entries`` are (time, user) seen at a colluding first
    hop, sorted by time; ``exits`` (time, request's user, request id) seen at a colluding proxy.
    Each exit is matched to the entry whose elapsed time is closest to ``expected``."""
    times = [t for t, _ in entries]
    linked: set[int] = set()
    for t_out, user, req in exits:
        target = t_out - expected
        i = bisect.bisect_left(times, target)
        best = None
        for j in (i - 1, i):
            if 0 <= j < len(times) and times[j] <= t_out and (best is None or
                                                              abs(times[j] - target) < abs(times[best] - target)):
                best = j
        if best is not None and entries[best][1] == user:
            linked.add(req)
    return len(linked) / n_requests if n_requests else 0.0


def simulate(seed: int, *, n_nodes: int = N_NODES, duration_s: float = DURATION_S,
             f_values: Sequence[float] = F_VALUES, delays_s: Sequence[float] = DELAYS_S,
             choose: Callable[..., Sequence[SimRelay]] = choose_relays, progress: Progress | None = None) -> Result:
    """Run the timing-correlation simulation; ``choose`` defaults to the product's relay choice."""
    rng = random.Random(seed)
    population = Population(n_nodes, rng, choose)
    paths = [population.paths_of(u, N_PATHS) for u in range(n_nodes)]
    requests: list[tuple[float, int]] = []
    for u in range(n_nodes):
        t = rng.expovariate(RATE_PER_USER)
        while t < duration_s:
            requests.append((t, u))
            t += rng.expovariate(RATE_PER_USER)
    requests.sort()
    rank = population.collusion_rank()
    mu = math.log(LINK_MEDIAN_S)
    mean_link = math.exp(mu + LINK_SIGMA**2 / 2)
    hops = onion.HOPS
    series: dict[str, list[float]] = {}
    for d in delays_s:
        drng = random.Random(seed * 1000 + round(d * 1e6))
        # per clove: time it reaches the first hop, time the proxy sends it on
        cloves = []
        for req, (t0, u) in enumerate(requests):
            for p in paths[u]:
                t_in = t0 + drng.lognormvariate(mu, LINK_SIGMA)
                t_out = t_in + sum(drng.uniform(0, d) for _ in range(hops))
                t_out += sum(drng.lognormvariate(mu, LINK_SIGMA) for _ in range(hops - 1))
                cloves.append((t_in, t_out, u, req, p[0], p[-1]))
        expected = (hops - 1) * mean_link + hops * d / 2
        key = f"D{round(d * 1000)}ms"
        series[key] = []
        for f in f_values:
            cut = f * n_nodes
            entries = sorted((c[0], c[2]) for c in cloves if rank[c[4]] < cut)
            exits = [(c[1], c[2], c[3]) for c in cloves if rank[c[5]] < cut]
            series[key].append(link_rate(entries, exits, expected, len(requests)))
            if progress is not None:
                progress.step(f"D = {d * 1000:.0f} ms, f = {f}: linked {series[key][-1]:.3f}")
    figures: dict[str, float] = {}
    for key, values in series.items():
        for f, v in zip(f_values, values, strict=True):
            figures[f"linked_{key}_f{f:.2f}"] = v
    for d in delays_s:
        figures[f"added_latency_ms_each_way_D{round(d * 1000)}ms"] = hops * d / 2 * 1000
    params: dict[str, Any] = {"nodes": n_nodes, "paths": N_PATHS, "hops": hops, "models": MODELS,
                              "rate_per_user": RATE_PER_USER, "duration_s": duration_s,
                              "requests": len(requests), "link_median_s": LINK_MEDIAN_S, "link_sigma": LINK_SIGMA,
                              "delays_s": list(delays_s), "f": list(f_values), "seed": seed}
    return Result("timing", params, figures, {"f": list(f_values), "linked": series})


def plot(result: Result) -> Any:
    fig, (ax,) = new_figure()
    for key, values in result.series["linked"].items():
        ax.plot(result.series["f"], values, marker=".", label=f"random delay per hop ≤ {key[1:]}")
    ax.set_xlabel("malicious fraction f")
    ax.set_ylabel("fraction of requests linked")
    ax.set_title(f"Timing correlation, {result.params['requests']} requests")
    ax.legend(fontsize=7)
    return fig


def run(seed: int, quick: bool) -> tuple[Result, Any]:
    kw: dict[str, Any] = {"n_nodes": 500, "duration_s": 20.0, "f_values": (0.0, 0.1, 0.3),
                          "delays_s": (0.0, 0.050)} if quick else {}
    total = len(kw.get("f_values", F_VALUES)) * len(kw.get("delays_s", DELAYS_S))
    result = simulate(seed, progress=Progress("timing", total), **kw)
    return result, plot(result)
