"""``gentorrent devnet``: a whole local network on loopback, in one command.

It generates identities, a registry signed by 4 registry keys (standing in for
the verifier committee; clients pin them and need more than 2/3), starts
``--relays`` user nodes (``gentorrent user relay``) and ``--models`` model
nodes (``gentorrent model-node``, llama.cpp with the default SmolLM2 model; or
``--engine echo``, the diagnostic) as separate processes, waits until all are
up, then holds a short multi-turn demo chat through the anonymous overlay
(``gentorrent user chat --prompt ... --prompt ...``): 3-hop onion paths, 4
S-IDA cloves, any 3 rebuild the prompt and each reply chunk; replies are signed
by the serving node and follow-ups go back to it. It keeps the network up until
Ctrl-C (or ``--duration``), printing how to chat with it, then stops every node.

Devnet spawns processes rather than importing roles, so ``overlay`` still
imports no role package.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from overlay.cli import CliError, common_flags, resolve_config, run_async
from overlay.clock import Clock, TrioClock
from overlay.identity import load_or_create
from overlay.tools.localnet import LocalNet, LocalNetError, cli
from overlay.tools.status import format_rows, query_all
from overlay.transport import TLSTransport

REGISTRY_KEYS = 4
DEFAULT_MODEL = "smollm2-135m-instruct"  # what `gentorrent model-node --engine llama.cpp` serves by default
DEMO_TURNS = {
    "llama.cpp": ["What is the capital of France? Answer in one sentence.",
                  "And what is the capital of Italy?"],
    "echo": ["Hello from an anonymous user: this prompt crossed three relays on each of four paths.",
             "A second turn goes back to the node that signed the first reply."],
}


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "devnet", help="run a local network of every part that exists, on loopback",
        description=(
            "Start a local GenTorrent network on 127.0.0.1: --relays user nodes and --models model nodes "
            "(llama.cpp with SmolLM2-135M-Instruct by default), with a registry signed by 4 registry "
            "keys. Once all nodes are up it holds a two-turn demo chat through the anonymous overlay, "
            "prints how to chat yourself, and runs until Ctrl-C (or --duration seconds). "
            "State and logs: DATA_DIR/devnet."
        ),
    )
    common_flags(p)
    p.add_argument("--relays", type=int, default=15,
                   help="number of relay user nodes (default: 15; the demo chat needs at least 12)")
    p.add_argument("--duration", type=float, default=None,
                   help="stop after this many seconds instead of waiting for Ctrl-C")
    p.add_argument("--ready-timeout", type=float, default=60.0,
                   help="seconds to wait for the nodes to come up (default: 60)")
    p.add_argument("--models", type=int, default=2, help="number of model nodes (default: 2)")
    p.add_argument("--engine", choices=["llama.cpp", "echo"], default="llama.cpp",
                   help="model nodes' engine (default: llama.cpp with the SmolLM2 model; 'echo' is a "
                        "diagnostic that streams prompts back)")
    p.add_argument("--no-demo", action="store_true", help="skip the demo chat")
    p.set_defaults(run=_run)


async def wait_up(net: LocalNet, timeout: float, *, clock: Clock | None = None) -> dict[str, Any]:
    """Poll every started node's status over authenticated TLS until all answer (or ``timeout``
    seconds on ``clock``, default :class:`~overlay.clock.TrioClock`)."""
    import trio

    clock = clock or TrioClock()
    transport = TLSTransport(load_or_create(net.root / "observer"))
    started = [net.entries[n] for n in net.relays + net.models]
    deadline = clock.monotonic() + timeout
    while True:
        results = await query_all(transport, started, 5.0)
        done = all(not isinstance(r, str) for r in results.values())
        if done or clock.monotonic() > deadline:
            return {"ok": done, "results": results, "entries": started}
        await trio.sleep(0.5)


def demo_chat(net: LocalNet, config: Path, engine: str) -> int:
    turns = [a for t in DEMO_TURNS[engine] for a in ("--prompt", t)]
    cmd = cli("user", "chat", "--config", str(config), *turns, "--verbose", "--max-tokens", "48", "--temperature", "0",
              "--log-level", "warning",
              "--timeout", "30")
    return subprocess.run(cmd, timeout=180).returncode


def _run(args: argparse.Namespace) -> int:
    cfg = resolve_config(args)
    if not 4 <= args.relays <= 200:
        raise CliError("--relays must be between 4 and 200 (paths need 3 distinct relays each)")
    if not args.no_demo and args.relays < 12:
        raise CliError("the demo chat keeps 4 proxy paths of 3 distinct relays: it needs --relays 12 or more "
                       "(or pass --no-demo)")
    root = cfg.data_path / "devnet"
    if not 1 <= args.models <= 8:
        raise CliError("--models must be between 1 and 8")
    model = DEFAULT_MODEL if args.engine == "llama.cpp" else "echo"
    net = LocalNet(root, args.relays, users=("you",), models=args.models, model=model, engine=args.engine,
                   registry_keys=REGISTRY_KEYS, ping_interval=5.0, echo_delay=0.02)
    chat_config = net.config_toml("you", root / "chat.toml")
    print(f"devnet: starting {args.relays} relays and {args.models} model node(s) ({args.engine}, {model}) "
          f"on 127.0.0.1 (state in {root})",
          flush=True)
    try:
        net.start(timeout=args.ready_timeout)
        state = run_async(wait_up, net, args.ready_timeout)
        for row in format_rows(state["entries"], state["results"]):
            print(row)
        if not state["ok"]:
            print(f"devnet: not every node came up within {args.ready_timeout}s; see the logs in {root}",
                  file=sys.stderr)
            return 1
        print(f"devnet: {len(state['entries'])} nodes up. Registry: {net.registry_file} "
              f"(signed by {REGISTRY_KEYS} registry keys)", flush=True)
        if not args.no_demo:
            print("devnet: demo chat through the anonymous overlay "
                  "(3-hop proxy paths, (4,3) S-IDA cloves):", flush=True)
            if demo_chat(net, chat_config, args.engine) != 0:
                print(f"devnet: the demo chat FAILED; see the messages above and the logs in {root}",
                      file=sys.stderr)
                return 1
        exe = Path(sys.executable).parent / "gentorrent"
        print(f"devnet: chat yourself, from another terminal:\n"
              f"    {exe if exe.exists() else 'gentorrent'} user chat --config {chat_config}", flush=True)
        if args.duration is None:
            print("devnet: running; press Ctrl-C to stop.", flush=True)
            while True:
                time.sleep(3600)
        else:
            time.sleep(args.duration)
        return 0
    except KeyboardInterrupt:
        return 0
    except LocalNetError as exc:
        raise CliError(str(exc)) from None
    finally:
        n = len(net.procs)
        net.stop()
        print(f"devnet: stopped {n} nodes.", flush=True)
