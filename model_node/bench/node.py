"""Start a model node for a benchmark or test, with what only benchmarks inject.

``python -m model_node.bench.node [--baseline hrtree|load|random|requests] [--echo-delay SECONDS]
MODEL-NODE-FLAGS...`` runs ``gentorrent model-node MODEL-NODE-FLAGS...`` with the forwarding
baseline (:mod:`model_node.bench.policies`) and the echo engine's per-piece delay injected:
neither is a flag of the product's node. :class:`gentorrent.tools.localnet.LocalNet` starts
model nodes this way when given ``bench_args`` or an ``echo_delay``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from model_node.bench.policies import BASELINES, baseline


def main(argv: Sequence[str] | None = None) -> int:
    from gentorrent import config
    from gentorrent.cli import CliError
    from model_node.cli import register
    from model_node.run import run_model_node
    from overlay.net.peers import PeerListError
    from overlay.wire.identity import IdentityError

    pre = argparse.ArgumentParser(prog="python -m model_node.bench.node", add_help=False)
    pre.add_argument("--baseline", choices=BASELINES, default="hrtree")
    pre.add_argument("--echo-delay", type=float, default=0.0)
    ours, rest = pre.parse_known_args(argv)
    if not 0 <= ours.echo_delay <= 60:
        pre.error(f"--echo-delay must be within 0..60 seconds, got {ours.echo_delay}")
    parser = argparse.ArgumentParser(prog="python -m model_node.bench.node")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["model-node", *rest])
    try:
        return run_model_node(args, policy=baseline(ours.baseline), echo_delay=ours.echo_delay)
    except KeyboardInterrupt:
        return 130
    except (CliError, config.ConfigError, IdentityError, PeerListError) as exc:
        print(f"model_node.bench.node: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
