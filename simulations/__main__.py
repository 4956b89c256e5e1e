"""``python -m simulations NAME --seed S [--quick] [--out DIR]``; NAME: churn, anonymity,
confidentiality, reputation, forwarding, timing or all. Writes NAME.json and NAME.png into DIR (default
simulations/results/) and prints progress on stderr and each figure file on stdout."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from simulations import anonymity, churn, confidentiality, forwarding, reputation, timing
from simulations.common import DEFAULT_OUT, Result, write

SIMULATIONS: dict[str, Callable[[int, bool], tuple[Result, Any]]] = {
    "churn": churn.run,
    "anonymity": anonymity.run,
    "confidentiality": confidentiality.run,
    "reputation": reputation.run,
    "forwarding": forwarding.run,
    "timing": timing.run,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulations", description=__doc__)
    parser.add_argument("name", choices=[*SIMULATIONS, "all"])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="small runs (seconds each), for CI")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results folder (default: %(default)s)")
    args = parser.parse_args(argv)
    names = list(SIMULATIONS) if args.name == "all" else [args.name]
    t0 = time.perf_counter()
    for name in names:
        t = time.perf_counter()
        result, fig = SIMULATIONS[name](args.seed, args.quick)
        result.params["wall_s"] = round(time.perf_counter() - t, 1)
        js, png = write(result, fig, args.out)
        print(f"{name}: {js} {png} ({result.params['wall_s']} s)", flush=True)
    print(f"total {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
