"""The ``gentorrent`` command: the root parser, shared flags, and error reporting.

Roles add their own subcommands through the ``gentorrent.commands`` entry-point
group (see pyproject.toml); each entry point is a ``register(subparsers)``
function in a light module that imports its heavy parts only when run, so
``gentorrent user chat`` never loads an inference engine and ``overlay`` never
imports a role package.

A leaf parser sets ``run=callable(args) -> int`` as its default.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points, version
from typing import Any

from gentorrent import config

_ORDER = ["user", "model-node", "verifier", "devnet", "status", "bench"]


class CliError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


def common_flags(parser: argparse.ArgumentParser, *settings: str) -> None:
    """``--config`` plus a flag per named setting (``data_dir`` and ``log_level`` always)."""
    parser.add_argument(
        "--config", metavar="PATH", default=None,
        help=f"TOML config file (default: DATA_DIR/config.toml if present; env {config.ENV_PREFIX}CONFIG)",
    )
    config.add_flags(parser, "data_dir", "log_level", *settings)


def resolve_config(args: argparse.Namespace) -> config.Config:
    flags = {k: getattr(args, k, None) for k in config.SETTINGS}
    cfg = config.resolve(flags, config_path=getattr(args, "config", None))
    level = getattr(logging, str(cfg.log_level).upper(), None)
    if not isinstance(level, int):
        raise CliError(f"log level {cfg.log_level!r} is not one of debug, info, warning, error")
    logging.basicConfig(
        level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return cfg


def not_landed(what: str, where: str) -> Callable[[argparse.Namespace], int]:
    """The run function of a subcommand whose capability is not built yet."""

    def run(args: argparse.Namespace) -> int:
        print(f"gentorrent: {what} is not available yet: it arrives with {where}.", file=sys.stderr)
        return 3

    return run


def run_async(fn: Callable[..., Any], *args: Any, long_lived: bool = False) -> Any:
    """``trio.run(fn, *args)``, unwrapping exception groups of one error (or of Ctrl-C).

    ``long_lived``: ``fn`` is a node process's whole life (a relay, a model node, a gateway). Its
    start-up garbage is collected and what start-up left (modules, classes, the engine: about
    49,000 objects in a relay) is frozen first (:func:`gc.freeze`), so the cyclic collector's
    full collections walk only what the node makes while it serves. Without it a node's first
    full collection comes soon after start-up (after its tenth generation-1 collection) and
    walks all of them while the node serves nothing: in the overlay bench most relays paused so
    once in the middle of the end-to-end requests."""
    import trio

    if long_lived:
        import gc

        gc.collect()
        gc.freeze()
    try:
        return trio.run(fn, *args)
    except BaseExceptionGroup as group:
        leaves: list[BaseException] = []

        def walk(e: BaseException) -> None:
            if isinstance(e, BaseExceptionGroup):
                for sub in e.exceptions:
                    walk(sub)
            else:
                leaves.append(e)

        walk(group)
        if leaves and all(isinstance(e, KeyboardInterrupt) for e in leaves):
            raise KeyboardInterrupt from None
        if len(leaves) == 1:
            raise leaves[0] from None
        raise


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gentorrent",
        description=(
            "GenTorrent: an anonymous, decentralized LLM serving network. User nodes send prompts "
            "as S-IDA cloves over onion-established paths and relay for others; model nodes serve "
            "LLMs and forward among themselves; verifier nodes keep model nodes honest."
        ),
        epilog="Run 'gentorrent COMMAND --help' for a command's options.",
    )
    try:
        v = version("gentorrent")
    except Exception:  # noqa: BLE001 - running from a source tree
        v = "unknown"
    parser.add_argument("--version", action="version", version=f"gentorrent {v}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    eps = {ep.name: ep for ep in entry_points(group="gentorrent.commands")}
    for name in sorted(eps, key=lambda n: (_ORDER.index(n) if n in _ORDER else len(_ORDER), n)):
        eps[name].load()(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from overlay.directory.registration import RegistrationError
    from overlay.net.peers import PeerListError
    from overlay.net.transport import ListenError
    from overlay.wire.identity import IdentityError

    parser = build_parser()
    args = parser.parse_args(argv)
    run: Any = getattr(args, "run", None)
    if run is None:
        parser.parse_args([*(argv or sys.argv[1:]), "--help"])
        return 2
    try:
        return int(run(args) or 0)
    except KeyboardInterrupt:
        print("gentorrent: interrupted", file=sys.stderr)
        return 130
    except (CliError, config.ConfigError, IdentityError, PeerListError, ListenError) as exc:
        print(f"gentorrent: error: {exc}", file=sys.stderr)
        return 2
    except RegistrationError as exc:
        print(f"gentorrent: error: registration with the committee failed: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    # Run the importable module's main, not this __main__ copy: commands raise
    # gentorrent.cli.CliError, which is a different class from __main__.CliError.
    from gentorrent.cli import main as _main

    sys.exit(_main())
