"""What every simulation shares: progress lines, the result files and the plot backend."""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

DEFAULT_OUT = Path(__file__).parent / "results"


@dataclass
class Progress:
    """Progress lines on ``stream`` (stderr): ``name: step i/n: what (t s)``, at most one per
    ``every`` seconds unless the step is the last."""

    name: str
    total: int
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    every: float = 1.0
    done: int = 0
    _start: float = field(default_factory=time.perf_counter)
    _last: float = -1e9

    def step(self, what: str = "") -> None:
        self.done += 1
        now = time.perf_counter()
        if now - self._last >= self.every or self.done >= self.total:
            self._last = now
            self.stream.write(f"{self.name}: {self.done}/{self.total} {what} ({now - self._start:.1f} s)\n")
            self.stream.flush()


@dataclass
class Result:
    """A simulation's output: ``params`` (what was simulated), ``figures`` (the headline numbers
    docs/simulations.md quotes) and ``series`` (the curves the plot draws)."""

    name: str
    params: dict[str, Any]
    figures: dict[str, float]
    series: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "params": self.params, "figures": self.figures, "series": self.series}


def new_figure(ncols: int = 1, width: float = 6.0) -> tuple[Figure, Any]:
    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, 4.0), squeeze=False)
    return fig, axes[0]


def write(result: Result, fig: Figure, out: Path) -> tuple[Path, Path]:
    """``out/NAME.json`` and ``out/NAME.png``; returns both paths."""
    out.mkdir(parents=True, exist_ok=True)
    js, png = out / f"{result.name}.json", out / f"{result.name}.png"
    js.write_text(json.dumps(result.to_json(), indent=1, sort_keys=True) + "\n")
    fig.tight_layout()
    fig.savefig(png, dpi=80)
    plt.close(fig)
    return js, png


@dataclass(frozen=True)
class SimRelay:
    """A directory entry as the product's relay choice reads it (only its id)."""

    node_id: bytes


class Population:
    """``n_nodes`` user nodes known by index, and a user's paths drawn with ``choose`` — the
    product's :func:`overlay.anon.paths.choose_relays` unless a test injects another."""

    def __init__(self, n_nodes: int, rng: random.Random, choose: Callable[..., Sequence[Any]]) -> None:
        self.rng = rng
        self.choose = choose
        self.ids = [i.to_bytes(4, "big") for i in range(n_nodes)]
        self.directory = [SimRelay(x) for x in self.ids]
        self.index = {x: i for i, x in enumerate(self.ids)}

    def collusion_rank(self) -> list[int]:
        """A random order of the nodes: the first ``f * n`` of it collude, for every ``f``."""
        rank = list(range(len(self.ids)))
        self.rng.shuffle(rank)
        return rank

    def paths_of(self, user: int, n_paths: int) -> list[list[int]]:
        """``n_paths`` paths of ``user`` (relay indexes, first hop first), as the product builds
        them: no relay on two of a user's paths."""
        in_use: set[bytes] = set()
        out = []
        for _ in range(n_paths):
            relays = self.choose(self.directory, self.ids[user], in_use, lambda _r: False, self.rng)
            in_use.update(r.node_id for r in relays)
            out.append([self.index[r.node_id] for r in relays])
        return out
