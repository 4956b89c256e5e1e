"""``gentorrent model-node``. Imports no engine until run."""

from __future__ import annotations

import argparse

from overlay.cli import common_flags, not_landed


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "model-node", help="serve an LLM to the network (llama.cpp on CPU, vLLM on GPU)",
        description="Run a model node: a full inference engine answering anonymous requests.",
    )
    p.add_argument("--model", metavar="M", help="model file path or name")
    common_flags(p, "listen", "peers", "region")
    p.set_defaults(run=not_landed("'gentorrent model-node'", "the model-node issue (issue 6)"))
