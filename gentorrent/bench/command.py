"""``gentorrent bench NAME --json``: measure, never assert.

Benchmarks register in the ``gentorrent.benches`` entry-point group as
``run(quick: bool) -> (params, figures)``. Output (``--json``) is one object::

    {"bench": NAME, "params": {...}, "figures": {KEY: number, ...}}

``figures`` is flat; every key names its unit (``_ms``, ``_per_s``, ``_MB_per_s``,
``_ratio_...``) and docs/benchmarks.md lists each key. ``--quick`` runs a few
trials only, to check that a benchmark works (its figures mean little).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from importlib.metadata import entry_points
from types import FrameType
from typing import Any

from gentorrent.cli import CliError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    names = sorted(ep.name for ep in entry_points(group="gentorrent.benches"))
    p = sub.add_parser(
        "bench", help="run a benchmark and print its figures",
        description="Run benchmark NAME. Available: " + ", ".join(names) + ". See docs/benchmarks.md.",
    )
    p.add_argument("name", metavar="NAME", nargs="?", help="benchmark to run: " + ", ".join(names))
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--quick", action="store_true", help="few trials: checks the benchmark runs, figures are rough")
    p.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    p.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    eps = {ep.name: ep for ep in entry_points(group="gentorrent.benches")}
    if args.list or not args.name:
        print("\n".join(sorted(eps)))
        return 0 if args.list else 2
    if args.name not in eps:
        raise CliError(f"no benchmark named {args.name!r}; available: {', '.join(sorted(eps))}")
    bench = eps[args.name].load()
    previous = signal.signal(signal.SIGTERM, _interrupt)  # benches stop their processes in `finally`
    try:
        params, figures = bench(args.quick)
    finally:
        signal.signal(signal.SIGTERM, previous)
    emit(args.name, params, figures, as_json=args.json)
    return 0


def emit(name: str, params: dict[str, Any], figures: dict[str, float], *, as_json: bool,
         shown_params: dict[str, Any] | None = None) -> None:
    """Print a bench's result: one JSON object (``as_json``), else the parameters (``shown_params``
    if given: the readable subset) and a line a figure."""
    if as_json:
        json.dump({"bench": name, "params": params, "figures": figures}, sys.stdout)
        print()
    else:
        print(f"bench {name}  params: {json.dumps(params if shown_params is None else shown_params)}")
        for k, v in figures.items():
            print(f"  {k:<48} {v:.4g}")


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGTERM as Ctrl-C: without it a terminated bench left the processes it started running."""
    raise KeyboardInterrupt
