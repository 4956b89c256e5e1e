"""``gentorrent testbed``: the whole network on this machine with wide-area delays and churn.

Starts Toxiproxy access links (one per node and source region, docs/testbed.md), a committee of
``--verifiers`` CometBFT validators, ``--relays`` user relays and ``--models`` model nodes, each
on its own loopback address in a region, then in-process clients in ``--client-regions`` that
register, time path builds and requests for each (n,k) of ``--configs``, crash a model node to
time failover, and keep asking while relays and model nodes leave and join (``--churn``
seconds). It prints what it does, then the figures; the run's directory gets ``report.json``
(parameters, figures, every request) and ``ttft_cdf.png`` (TTFT CDFs per configuration).
Everything it started is stopped at the end, or on Ctrl-C.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from gentorrent.tools.regions import LOSS
from overlay.wire.clock import SystemClock

if TYPE_CHECKING:
    from gentorrent.bench.testbed_run import Plan

DEFAULT_DIR = ".testbed"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "testbed", help="run the whole network with wide-area delays and churn, and report figures",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--data-dir", metavar="DIR", default=DEFAULT_DIR,
                   help=f"where the run's nodes, logs and report go (default {DEFAULT_DIR}/RUN-TIME)")
    p.add_argument("--relays", type=int, default=100, help="user relays (default 100)")
    p.add_argument("--models", type=int, default=6, help="model nodes (default 6)")
    p.add_argument("--verifiers", type=int, default=4, help="committee validators (default 4)")
    p.add_argument("--engine", choices=("echo", "llama.cpp"), default="echo",
                   help="model nodes' engine: echo isolates the network (default); llama.cpp serves the "
                        "default model (slow on a 2-core machine with 6 of them)")
    p.add_argument("--configs", default="1,1;4,3;4,4", metavar="N,K;...",
                   help="the (n,k) of the clients' requests (default 1,1;4,3;4,4)")
    p.add_argument("--client-regions", default="eu-west,us-east,ap-southeast", metavar="R,...",
                   help="one client per region and configuration (default eu-west,us-east,ap-southeast)")
    p.add_argument("--requests", type=int, default=10, help="timed requests per client (default 10)")
    p.add_argument("--path-builds", type=int, default=20, help="timed 3-hop path builds (default 20)")
    p.add_argument("--churn", type=float, default=120.0, metavar="SECONDS",
                   help="length of the churn phase (default 120; 0: none)")
    p.add_argument("--relay-churn", type=float, default=0.01, metavar="FRACTION",
                   help="share of the relays leaving per minute on average (default 0.01: 10%% per 10 minutes)")
    p.add_argument("--model-leaves", type=int, default=1, help="model nodes leaving during the churn phase (default 1)")
    p.add_argument("--downtime", type=float, default=60.0, metavar="SECONDS",
                   help="mean time a departed node stays away (default 60)")
    p.add_argument("--loss", type=float, default=LOSS, metavar="FRACTION",
                   help=f"share of TCP segments lost on every link, each repaired in TCP's time for "
                        f"that path (default {LOSS}, PingER's figure; 0: none; docs/testbed.md \"Loss\")")
    p.add_argument("--seed", type=int, default=0, help="seeds regions, churn and request order (default 0)")
    p.add_argument("--quiet", action="store_true", help="no progress display, only the figures")
    p.set_defaults(run=_run)


def plan_from(args: argparse.Namespace) -> Plan:
    from gentorrent.bench.testbed_run import Plan
    from gentorrent.cli import CliError
    from gentorrent.tools import regions

    try:
        configs = tuple((int(a), int(b)) for a, b in (c.split(",") for c in args.configs.split(";") if c.strip()))
    except ValueError:
        raise CliError(f"--configs {args.configs!r}: want N,K;N,K... (e.g. 1,1;4,3)") from None
    for n, k in configs:
        if not 1 <= k <= n <= 16:
            raise CliError(f"--configs: ({n},{k}) needs 1 <= k <= n <= 16")
        if n + 3 > args.relays:
            raise CliError(f"--configs: ({n},{k}) needs more than {n + 2} relays")
    client_regions = tuple(r.strip() for r in args.client_regions.split(",") if r.strip())
    for r in client_regions:
        try:
            regions.check_region(r)
        except ValueError as exc:
            raise CliError(f"--client-regions: {exc}") from None
    if args.relays < 5 or args.models < 1 or args.verifiers < 1:
        raise CliError("need at least 5 relays, 1 model node and 1 verifier")
    if args.churn < 0 or not 0 <= args.relay_churn <= 1 or args.downtime <= 0:
        raise CliError("need --churn >= 0, 0 <= --relay-churn <= 1 and --downtime > 0")
    if not 0 <= args.loss <= 1:  # also NaN
        raise CliError(f"--loss {args.loss}: need a fraction of segments in [0, 1]")
    model = "smollm2-135m-instruct" if args.engine == "llama.cpp" else "echo"
    return Plan(relays=args.relays, models=args.models, verifiers=args.verifiers, engine=args.engine, model=model,
                configs=configs, client_regions=client_regions, requests=args.requests,
                path_builds=args.path_builds, churn_s=args.churn, relay_leave_per_min=args.relay_churn,
                model_leaves=args.model_leaves, mean_downtime_s=args.downtime, seed=args.seed, loss=args.loss,
                failover_requests=3 if args.models > 1 else 0)


def _run(args: argparse.Namespace) -> int:
    from gentorrent.bench.command import emit
    from gentorrent.bench.testbed_run import run_plan
    from gentorrent.cli import CliError
    from gentorrent.tools.devnet import sigterm_as_interrupt
    from gentorrent.tools.localnet import LocalNetError
    from gentorrent.tools.toxiproxy import ToxiproxyError, find_toxiproxy

    plan = plan_from(args)
    try:
        find_toxiproxy()
    except ToxiproxyError as exc:
        raise CliError(str(exc)) from None
    root = Path(args.data_dir) / datetime.fromtimestamp(SystemClock().unix()).strftime("run-%Y%m%d-%H%M%S")

    def say(text: str) -> None:
        if not args.quiet:
            print(text, file=sys.stderr, flush=True)

    say(f"testbed: run directory {root}")
    try:
        with sigterm_as_interrupt():
            params, figures, _, files = run_plan(root, plan, say=say, show=not args.quiet and sys.stderr.isatty())
    except (LocalNetError, ToxiproxyError) as exc:
        raise CliError(f"the testbed did not start: {exc} (logs in {root})") from None
    emit("testbed", params, figures, as_json=False)
    print(f"report: {', '.join(str(f) for f in files)}")
    return 0
