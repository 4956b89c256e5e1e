"""``gentorrent user relay``: a user node that serves peers until interrupted."""

from __future__ import annotations

import argparse
import logging
import sys

import trio

from overlay import peers as peerlist
from overlay.cli import resolve_config, run_async
from overlay.identity import load_or_create
from overlay.node import Node
from overlay.transport import TLSTransport, parse_address

log = logging.getLogger("gentorrent.user")


def run_relay(args: argparse.Namespace) -> int:
    cfg = resolve_config(args)
    identity = load_or_create(cfg.data_path)
    entries = peerlist.load(cfg.peers) if cfg.peers else []
    host, port = parse_address(cfg.listen)
    node = Node(identity, TLSTransport(identity), peers=entries, ping_interval=cfg.ping_interval)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            address = await nursery.start(node.serve, host, port)
            # One machine-readable line so scripts (devnet, tests) learn the address.
            print(f"READY {identity.node_id.hex()} {address}", flush=True)
            log.info("relay %s serving on %s with %d peers", identity.node_id.hex()[:8], address, len(node.peers))

    try:
        run_async(main)
    except KeyboardInterrupt:
        print("relay stopped", file=sys.stderr)
    return 0
