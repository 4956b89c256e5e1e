"""``gentorrent model-node``. Imports no engine until run."""

from __future__ import annotations

import argparse

from overlay.cli import common_flags


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "model-node", help="serve an LLM to the network (llama.cpp on CPU, vLLM on GPU)",
        description=(
            "Run a model node: a full inference engine answering anonymous requests that arrive as "
            "S-IDA cloves through users' proxies. Prints 'READY <node id> <address>' once listening."
        ),
    )
    common_flags(p, "model", "listen", "registry", "registry_keys", "peers")
    p.add_argument(
        "--engine", choices=["llama.cpp", "vllm", "echo"], default="llama.cpp",
        help="inference engine (default: llama.cpp). 'echo' is a DIAGNOSTIC that streams the prompt "
             "back without any model, for testing the overlay; never use it to serve users",
    )
    p.add_argument("--echo-delay", type=float, default=0.0, help=argparse.SUPPRESS)
    p.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from model_node.run import run_model_node

    return run_model_node(args)
