"""``gentorrent model-node`` runner."""

from __future__ import annotations

import argparse
import logging
import sys

import trio

from overlay.cli import CliError, resolve_config, run_async
from overlay.identity import load_or_create
from overlay.registry import from_config
from overlay.transport import TLSTransport, parse_address

log = logging.getLogger("gentorrent.model")


def run_model_node(args: argparse.Namespace) -> int:
    cfg = resolve_config(args)
    if args.engine != "echo":
        print(f"gentorrent: the {args.engine} engine is not available yet: it arrives with the model-node "
              "issue (issue 6). Only the diagnostic '--engine echo' runs today.", file=sys.stderr)
        return 3
    from model_node.echo import EchoEngine
    from model_node.server import ModelNode

    model = cfg.model or "echo"
    identity = load_or_create(cfg.data_path)
    registry = from_config(cfg)
    me = registry.by_id.get(identity.node_id)
    if me is None or me.role != "model" or model not in me.models:
        raise CliError(
            f"this node ({identity.node_id.hex()[:8]}) is not listed in the registry as a model node serving "
            f"{model!r}; users could not find it"
        )
    try:
        host, port = parse_address(cfg.listen)
    except ValueError as exc:
        raise CliError(f"listen: {exc}") from None
    log.warning("engine 'echo' is a DIAGNOSTIC: it streams prompts back and runs no model")
    node = ModelNode(identity, TLSTransport(identity), registry, EchoEngine(model, args.echo_delay))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            address = await nursery.start(node.serve, host, port)
            print(f"READY {identity.node_id.hex()} {address}", flush=True)

    try:
        run_async(main)
    except KeyboardInterrupt:
        print("model node stopped", file=sys.stderr)
    return 0
