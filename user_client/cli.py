"""``gentorrent user ...``: chat, serve, relay. Imports nothing heavy until run."""

from __future__ import annotations

import argparse

from overlay.cli import common_flags, not_landed


def register(sub: argparse._SubParsersAction) -> None:
    user = sub.add_parser(
        "user",
        help="run a user node: chat, serve an OpenAI-compatible API, or only relay",
        description="A user node sends prompts anonymously and relays cloves for other users.",
    )
    cmds = user.add_subparsers(dest="user_command", metavar="SUBCOMMAND", required=True)

    chat = cmds.add_parser(
        "chat", help="chat with an LLM through the anonymous overlay",
        description="Interactive chat through onion-established proxy paths (S-IDA cloves).",
    )
    common_flags(chat, "peers", "region")
    chat.set_defaults(run=not_landed("'gentorrent user chat'", "the anonymous overlay (issue 5)"))

    serve = cmds.add_parser(
        "serve", help="serve an OpenAI-compatible API on 127.0.0.1 backed by the overlay",
        description="A local OpenAI-compatible HTTP gateway; every request goes through the overlay.",
    )
    common_flags(serve, "peers", "region")
    serve.set_defaults(run=not_landed("'gentorrent user serve'", "the anonymous overlay (issue 5)"))

    relay = cmds.add_parser(
        "relay", help="run a user node that only relays for others",
        description=(
            "Start a user node that listens on --listen, authenticates every peer by its node key, "
            "answers pings and status requests, and pings the nodes of --peers. Runs until Ctrl-C."
        ),
    )
    common_flags(relay, "listen", "peers", "region", "ping_interval")
    relay.set_defaults(run=_run_relay)


def _run_relay(args: argparse.Namespace) -> int:
    from user_client.relay import run_relay

    return run_relay(args)
