"""``gentorrent user relay``: a user node that only relays, until interrupted."""

from __future__ import annotations

import argparse
import logging
import sys

import trio

from gentorrent.cli import CliError, resolve_config, run_async
from gentorrent.config import Config
from overlay.directory.membership import cancel_on_sigterm, directory, node_entry, serve_member
from overlay.directory.registry import RegistryError
from overlay.net.transport import TLSTransport, parse_address
from overlay.usernode import UserNode
from overlay.wire.identity import load_or_create

log = logging.getLogger("gentorrent.user")


def listen_address(cfg: Config) -> tuple[str, int]:
    """``cfg.listen`` as ``(host, port)``; :class:`CliError` naming where it was set if malformed."""
    try:
        return parse_address(cfg.listen)
    except ValueError as exc:
        raise CliError(f"listen: {exc} (set by {cfg.source('listen')})") from None


def run_relay(args: argparse.Namespace) -> int:
    cfg = resolve_config(args)
    identity = load_or_create(cfg.data_path)
    try:
        registry, committee, source = directory(cfg)
    except RegistryError as exc:
        raise CliError(str(exc)) from None
    host, port = listen_address(cfg)
    user = UserNode(identity, TLSTransport(identity), registry, region=cfg.region, client=False,
                    ping_interval=cfg.ping_interval, registered_only=committee is not None)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel_on_sigterm, nursery.cancel_scope)
            address, _ = await nursery.start(
                serve_member, user, host, port, committee, registry,
                lambda address: node_entry(identity, cfg.advertise or address, cfg.region))
            # One machine-readable line so scripts (devnet, tests) learn the address.
            print(f"READY {identity.node_id.hex()} {address}", flush=True)
            log.info("relay %s serving on %s; directory of %d nodes from %s", identity.node_id.hex()[:8], address,
                     len(registry.entries), source)

    try:
        run_async(main, long_lived=True)
    except KeyboardInterrupt:
        print("relay stopped", file=sys.stderr)

    except OSError as exc:
        if user.node.address is not None:
            raise
        raise CliError(f"cannot listen on {cfg.listen}: {exc.strerror or exc}") from None  # port taken
    return 0
