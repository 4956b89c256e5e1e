"""What every simulation shares: progress lines, the result files and the plot backend."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt  # noqa: E402  (the backend is chosen first)
from matplotlib.figure import Figure  # noqa: E402

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
