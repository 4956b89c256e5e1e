"""``gentorrent verifier``."""

from __future__ import annotations

import argparse

from overlay.cli import common_flags, not_landed


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verifier", help="join the verifier committee (CometBFT) that scores model nodes",
        description="Run a verifier: a CometBFT validator plus GenTorrent's ABCI application.",
    )
    common_flags(p, "listen", "peers")
    p.set_defaults(run=not_landed("'gentorrent verifier'", "the verifier committee issue"))
