"""The long fuzz run: every target for a time budget, inputs from seeded ``random.Random``.

Usage::

    python -m tests.fuzz [--seconds-per-target S] [--seed N] [--only NAME,...] [--json] [--quick]

Prints parameters and figures as ``gentorrent bench`` does (``--json``: one object
``{"bench": "fuzz", "params": {...}, "figures": {...}}``; docs/benchmarks.md "fuzz" lists the
keys). Per target: inputs fed (``TARGET_inputs``), crashes (``TARGET_crashes``: steps that raised
anything but the target's documented error, or broke an invariant), peak traced memory
(``TARGET_peak_MB``, tracemalloc, reset per target) and the memory still held at the end of the
run against the middle (``TARGET_growth_MB``: bounded state stays flat). A stateful target keeps
one state for the whole run, so its limits are reached and held. The first traceback of each
crashing target goes to stderr, with the seed and step that reproduce it.

A step counts as a crash only on an unexpected exception or a failed assertion; inputs refused
with the documented error are the expected outcome (``TARGET_rejected``).
"""

from __future__ import annotations

import argparse
import logging
import platform
import sys
import time
import traceback
import tracemalloc
from typing import Any

from gentorrent.bench.command import emit
from tests.fuzz import targets
from tests.fuzz.mutate import RandomSource

MB = 1024 * 1024


def fuzz_target(cls: type[targets.Target], seconds: float, seed: int) -> dict[str, float]:
    """Run ``cls``'s steps for ``seconds``; its figures (keys without the target prefix)."""
    tracemalloc.reset_peak()
    base, _ = tracemalloc.get_traced_memory()
    target = cls()
    steps = [getattr(target, name) for name in cls.STEPS]
    inputs = crashes = n = 0
    mid_mem: float | None = None
    start = time.monotonic()
    max_state = 0
    while (elapsed := time.monotonic() - start) < seconds:
        src = RandomSource(seed * 1_000_003 + n)
        step_index = src.int(0, len(steps) - 1)
        try:
            inputs += steps[step_index](src)
            target.check()
        except Exception:  # noqa: BLE001 - a crash is what we count; the traceback goes to stderr
            crashes += 1
            if crashes <= 3:
                print(f"CRASH in {cls.NAME} step {cls.STEPS[step_index]} (seed {seed}, example {n}):",
                      file=sys.stderr)
                traceback.print_exc(file=sys.stderr)
            if cls.STATEFUL:  # a broken state would only repeat the failure: start again
                target = cls()
                steps = [getattr(target, name) for name in cls.STEPS]
        n += 1
        max_state = max(max_state, target.state_size())
        if mid_mem is None and elapsed >= seconds / 2:
            mid_mem = tracemalloc.get_traced_memory()[0]
    end_mem, peak = tracemalloc.get_traced_memory()
    return {
        "inputs": inputs,
        "examples": n,
        "crashes": crashes,
        "rejected": target.rejected,
        "peak_MB": round((peak - base) / MB, 2),
        "growth_MB": round((end_mem - (mid_mem if mid_mem is not None else end_mem)) / MB, 3),
        "max_state_entries": max_state,
    }


FIGURES = ("inputs", "crashes", "peak_MB", "growth_MB")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds-per-target", type=float, default=90.0, help="time budget of each target")
    p.add_argument("--seed", type=int, default=1, help="example i of a target uses seed * 1000003 + i")
    p.add_argument("--only", default="", help="comma-separated target names (default: all)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--quick", action="store_true", help="2 s per target: checks the run works")
    args = p.parse_args(argv)
    seconds = 2.0 if args.quick else args.seconds_per_target
    chosen = [c for c in targets.ALL if not args.only or c.NAME in args.only.split(",")]
    if not chosen:
        p.error(f"no target among {args.only!r}; targets: {', '.join(c.NAME for c in targets.ALL)}")
    logger = logging.getLogger("gentorrent")
    level = logger.level
    logger.setLevel(logging.ERROR)  # every drop is logged as a warning: far too many here
    tracemalloc.start()
    figures: dict[str, float] = {}
    details: dict[str, dict[str, float]] = {}
    try:
        for cls in chosen:
            got = fuzz_target(cls, seconds, args.seed)
            details[cls.NAME] = got
            key = cls.NAME.replace("-", "_")
            for f in FIGURES:
                figures[f"{key}_{f}"] = got[f]
            if not args.json:
                print(f"  {cls.NAME:<12} " + "  ".join(f"{k}={v:g}" for k, v in got.items()), flush=True)
    finally:
        tracemalloc.stop()
        logger.setLevel(level)
    figures["inputs_total"] = sum(d["inputs"] for d in details.values())
    figures["crashes_total"] = sum(d["crashes"] for d in details.values())
    figures["peak_MB_max"] = max(d["peak_MB"] for d in details.values())
    params: dict[str, Any] = {
        "seconds_per_target": seconds, "seed": args.seed, "targets": [c.NAME for c in chosen],
        "python": platform.python_version(), "memory": "tracemalloc (Python allocations)",
        "details": details,
    }
    emit("fuzz", params, figures, as_json=args.json,
         shown_params={k: v for k, v in params.items() if k != "details"})
    return 1 if figures["crashes_total"] else 0


if __name__ == "__main__":
    sys.exit(main())
