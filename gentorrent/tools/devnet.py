"""``gentorrent devnet``: a whole local network on loopback, in one command.

It starts a verifier committee of ``--verifiers`` (4) CometBFT validators
(``gentorrent verifier init``, ``verifier genesis --install``, ``gentorrent verifier``),
waits until they serve signed lists, then starts ``--relays`` user nodes (``gentorrent user relay``) and ``--models`` model
nodes (``gentorrent model-node``, llama.cpp with the default SmolLM2 model; or
``--engine echo``, the diagnostic) as separate processes, each registering itself with the
committee and taking its peers from the committee's signed lists (no registry file;
``--verifiers 0`` uses the old registry file signed by 4 local keys instead), waits until all are
up, then holds a short multi-turn demo chat through the anonymous overlay
(``gentorrent user chat --prompt ... --prompt ...``): 3-hop onion paths, 4
S-IDA cloves, any 3 rebuild the prompt and each reply chunk; replies are signed
by the serving node and follow-ups go back to it. It keeps the network up until
Ctrl-C (or ``--duration``), printing how to chat with it, then stops every node.

While nodes start it shows a progress display (rich) of which are ready (model nodes load
their model then); ``--quiet`` shows none of it, ``--verbose`` also each node's command and
log. The table it prints then says in plain words whether each node is healthy. ``--chat``
drops into an interactive chat once the network is up; the network stops when it ends.
Ctrl-C (or SIGTERM) stops every node it started, waiting for each to exit: none is left
behind.

State under ``DATA_DIR/devnet`` is reused on the next start: the nodes' keys, and
``devnet.json`` (:data:`STATE_FILE`), which records the committee's chain id and every
node's and verifier's loopback port. A second start on the same data dir resumes the same
chain (same genesis, same CometBFT homes, the blocks committed so far) on the same ports, so
it skips the committee's set-up; ``--fresh`` starts a new chain on new ports instead (keys are
kept). If a recorded port is taken, or the recorded state cannot be resumed, devnet stops
before starting anything and says so, naming ``--fresh``.

Clients use only models the committee audits unless they opt in (``--allow-unaudited``,
decision 0013). A devnet without ``--audits`` audits no model, so its chat config
(``chat.toml``) sets ``allow_unaudited = true`` and devnet says so; with ``--audits`` it does
not, and the chats wait until the committee's model list marks the model audited (the
verifiers' first plan commits, at the start of an epoch).

Devnet spawns processes rather than importing roles, so ``overlay`` still
imports no role package.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gentorrent.cli import CliError, common_flags, resolve_config, run_async
from gentorrent.tools.localnet import DEVNET_CHAIN_ID, LocalNet, LocalNetError, cli, ports_taken
from gentorrent.tools.status import query_all
from overlay.net.peers import PeerEntry
from overlay.net.transport import TLSTransport
from overlay.wire.identity import load_or_create, short_id
from overlay.wire.messages import PeerStatus

REGISTRY_KEYS = 4
STATE_FILE = "devnet.json"
STATE_VERSION = 1
VERIFIERS = 4
EPOCH_BLOCKS = 300  # --audits' default epoch length (120 overloads two CPU nodes: docs/benchmarks.md "devnet --audits")
CHALLENGES_PER_NODE = 2  # --audits' default challenges a verifier sends each model node an epoch
# verifier/audit/tx.py's bound, repeated so that building the CLI stays light (a test checks it)
MAX_CHALLENGES_PER_NODE = 4
# the reply windows (decision 0040) --epoch-blocks' help names: fitting_reply_window(N, 0.5), a test checks them
WINDOWS_SHOWN = "120 blocks give 22 s, 300 give 66 s, 600 give 191 s"
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
            "(llama.cpp with SmolLM2-135M-Instruct by default), after a verifier committee of --verifiers "
            "CometBFT validators with which every node registers itself. Once all nodes are up it holds a two-turn demo chat through the anonymous overlay, "
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
    p.add_argument("--verifiers", type=int, default=VERIFIERS,
                   help=f"verifiers in the committee the nodes register with (default: {VERIFIERS}; 0: no "
                        f"committee, a registry file signed by {REGISTRY_KEYS} local keys instead)")
    p.add_argument("--engine", choices=["llama.cpp", "echo"], default="llama.cpp",
                   help="model nodes' engine (default: llama.cpp with the SmolLM2 model; 'echo' is a "
                        "diagnostic that streams prompts back)")
    p.add_argument("--no-demo", action="store_true", help="skip the demo chat")
    p.add_argument("--chat", action="store_true",
                   help="drop into an interactive chat once the network is up; the network stops when you leave")
    p.add_argument("--audits", action="store_true",
                   help="the committee audits the model nodes (docs/committee.md \"Audits\"): each verifier loads "
                        "the model, and every epoch (--epoch-blocks) sends hidden challenge prompts "
                        "through the overlay and the committee agrees on reputations (gentorrent status --committee "
                        "shows them); the chats wait until the model is audited (the verifiers' first plan "
                        "commits). Donated transcripts (--donate-transcripts) count when their reply is signed "
                        "within the reply window of the commitment, the longest these epochs leave model nodes time "
                        "to hand in what donors withheld (decision 0040). Without it no model is audited, and the chat "
                        "config allows unaudited models "
                        "(allow_unaudited = true). Needs --engine llama.cpp and a committee; a devnet keeps the "
                        "choice it was created with (--fresh to change it)")
    p.add_argument("--epoch-blocks", type=int, default=None, metavar="N",
                   help=f"with --audits: blocks per audit epoch (default {EPOCH_BLOCKS}; a block takes 0.5-1 s "
                        "here), fixed by the committee's genesis when the chain is created: a resumed devnet keeps "
                        "its own. Each verifier sends each model node --challenges-per-node challenges an "
                        "epoch, so longer epochs spread them out, and leave donated transcripts a longer reply "
                        f"window: {WINDOWS_SHOWN}. The chats wait for the first epoch the verifiers plan")
    p.add_argument("--challenges-per-node", type=int, default=None, metavar="K",
                   help=f"with --audits: challenges each verifier sends each model node an epoch (default "
                        f"{CHALLENGES_PER_NODE}; 1 to {MAX_CHALLENGES_PER_NODE}), each a script of up to 8 turns, "
                        "fixed by the genesis as --epoch-blocks is. Two CPU model nodes serve the challenges "
                        "and the chats on the same cores: fewer leave more room for chats and make each epoch's "
                        "verdict rest on fewer replies")
    p.add_argument("--fresh", action="store_true",
                   help="start a new committee chain on new ports instead of resuming the one recorded in "
                        f"DATA_DIR/devnet/{STATE_FILE} (node keys are kept)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--verbose", action="store_true", help="also print each node's command and log file")
    out.add_argument("--quiet", action="store_true", help="no progress display, table or demo: only errors and "
                                                        "how to reach the network")
    p.set_defaults(run=_run)


QUERY_S = 5.0  # seconds for one node to answer a status request, in each round of wait_up
ROUND_PAUSE_S = 0.5  # seconds between two rounds of wait_up


async def wait_up(net: LocalNet, results: dict[bytes, tuple[float, PeerStatus] | str]) -> None:
    """Poll every started node's status over authenticated TLS, a round at a time, until all
    answer. ``results`` holds the last complete round's answers (or why none came), for a caller
    that bounds the wait with a cancel scope (:func:`check_up`)."""
    import trio

    transport = TLSTransport(load_or_create(net.root / "observer"))
    started = started_entries(net)
    while True:
        got = await query_all(transport, started, QUERY_S)
        results.clear()
        results.update(got)
        if all(not isinstance(r, str) for r in got.values()):
            return
        await trio.sleep(ROUND_PAUSE_S)


def started_entries(net: LocalNet) -> list[PeerEntry]:
    """The directory entries of the nodes devnet starts (relays, then model nodes)."""
    return [net.entries[n] for n in net.relays + net.models]


def check_up(net: LocalNet, ready_timeout: float) -> tuple[bool, dict[bytes, tuple[float, PeerStatus] | str]]:
    """``(every node answered?, the last round's answers)``: :func:`wait_up` for at most
    ``ready_timeout`` seconds."""
    import trio

    results: dict[bytes, tuple[float, PeerStatus] | str] = {}

    async def poll() -> bool:
        with trio.move_on_after(ready_timeout):
            await wait_up(net, results)
            return True
        return False

    return bool(run_async(poll)), results


PING_INTERVAL = 5.0  # seconds between a devnet node's pings of its peers


def health(role: str, result: tuple[float, PeerStatus] | str, ping_interval: float = PING_INTERVAL,
           ) -> tuple[bool, str]:
    """(healthy?, what to tell a newcomer) for one node's status answer (or why none came).

    A node is healthy when it answers an authenticated status request. Its pings of its peers
    are reported as information: right after start-up none has run yet, which is normal."""
    if isinstance(result, str):
        return False, f"DOWN: {result}; see its log"
    rtt_s, st = result
    seen = sorted(p.rtt_us for p in st.peers if p.rtt_us >= 0)
    if not st.peers:
        peers = "pings no peers"
    else:
        rtt = f", median {seen[len(seen) // 2] / 1000:.1f} ms" if seen else ""
        peers = (f"pings: {len(seen)} of {len(st.peers)} peers answered so far{rtt} (a round every "
                 f"{ping_interval:g} s; fewer right after start-up is normal)")
    what = "serves the model" if role == "model" else "relays for users"
    return True, f"healthy: {what}; answered status in {rtt_s * 1000:.0f} ms; {peers}"


def health_table(net: LocalNet, results: dict[bytes, tuple[float, PeerStatus] | str]) -> list[str]:
    """One plain line per started node: name, id, address, role, and :func:`health`."""
    rows = [f"    {'node':<9} {'id':<9} {'address':<16} health"]
    for name in net.relays + net.models:
        e = net.entries[name]
        ok, text = health(e.role, results.get(e.node_id, "not queried"))
        rows.append(f"{'ok ' if ok else '!! '} {name:<9} {short_id(e.node_id):<9} {e.address:<16} {text}")
    return rows


@contextmanager
def progress(total: int, what: str, enabled: bool) -> Iterator[Any]:
    """A rich progress bar on stderr (``update(done, description)``); silent when not enabled."""
    if not enabled:
        yield lambda done, description=None: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=False) as bar:
        task = bar.add_task(what, total=total)

        def update(done: int, description: str | None = None) -> None:
            bar.update(task, completed=done, description=description or what)

        yield update


def start_committee(net: LocalNet, timeout: float, *, show: bool, verbose: bool) -> None:
    """Wait for the committee's verifiers (launched already) with a progress display (how many serve
    signed lists)."""
    if verbose:
        for v in net.verifiers:
            print(f"devnet: {v}: {' '.join(net.command(v))}  (log: {net.root / (v + '.log')}, "
                  f"{net.root / v / 'cometbft.log'})", file=sys.stderr)
    what = f"starting the committee: {len(net.verifiers)} verifiers (CometBFT validators)"
    with progress(len(net.verifiers), what, show) as update:
        net.wait_committee(timeout, on_progress=lambda done: update(
            done, what if done < len(net.verifiers) else "committee up: signed lists served"))


def spawn_nodes(net: LocalNet, *, verbose: bool) -> None:
    for n in net.relays + net.models:
        net.spawn(n)
        if verbose:
            print(f"devnet: {n}: {' '.join(net.command(n))}  (log: {net.root / (n + '.log')})", file=sys.stderr)


def start_nodes(net: LocalNet, timeout: float, *, show: bool, verbose: bool, spawn: bool = True) -> None:
    """Spawn every node (unless ``spawn`` is false: already spawned) and wait for each READY line,
    with a progress display; a node that exits or is not ready within ``timeout`` seconds (on
    ``net.clock``) raises :class:`LocalNetError`."""
    names = net.relays + net.models
    if spawn:
        spawn_nodes(net, verbose=verbose)
    pending = set(names)
    deadline = net.clock.monotonic() + timeout
    starting = "starting nodes (each registers with the committee)" if net.verifiers else "starting nodes"
    with progress(len(names), starting, show) as update:
        while pending:
            pending = net.still_starting(pending)
            waiting_models = sorted(pending & set(net.models))
            update(len(names) - len(pending),
                   f"loading the model on {', '.join(waiting_models)}" if waiting_models and len(pending) ==
                   len(waiting_models) else starting)
            if pending and net.clock.monotonic() > deadline:
                raise LocalNetError(f"not ready after {timeout}s: {sorted(pending)}; see their logs in {net.root}")
            if pending:
                time.sleep(0.1)
    if net.verifiers:
        net.wait_listed(names, timeout)


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt (like Ctrl-C), so the nodes are stopped either way."""
    def raise_interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def model_audited(net: LocalNet) -> bool:
    """Whether the committee's signed model list (from the first verifier that serves one that
    verifies against the genesis keys) marks a node of ``net.model`` audited."""
    import trio

    from overlay.directory.lists import KIND_MODELS, load_genesis, verify_document
    from overlay.directory.rpc import RpcError

    chain_id, validators = load_genesis(str(net.genesis_file))
    for v in net.verifiers:
        try:
            answer = net.query(v, "/lists/models")
            got = verify_document(answer.value, chain_id, validators, kind=KIND_MODELS)
        except (OSError, ValueError, RpcError, trio.TooSlowError):
            continue
        return any(e.audited for e in got.entries if net.model in e.models)
    return False


AUDITED_WAIT_EPOCHS = 3  # the verifiers may miss the first epochs' commit windows while they start


def wait_audited(net: LocalNet, *, show: bool, timeout: float | None = None) -> None:
    """Wait until the committee's model list marks the model audited (:func:`model_audited`): with
    ``--audits`` a chat may use it only then. ``timeout`` (default: :data:`AUDITED_WAIT_EPOCHS`
    epochs at a second a block) on ``net.clock``; :class:`LocalNetError` after it."""
    timeout = AUDITED_WAIT_EPOCHS * net.epoch_blocks * 1.0 if timeout is None else timeout
    what = "waiting for the verifiers to audit the model (their first plan commits, at an epoch's start)"
    deadline = net.clock.monotonic() + timeout
    with progress(1, what, show) as update:
        while not model_audited(net):
            if net.clock.monotonic() > deadline:
                raise LocalNetError(f"the committee's model list does not mark {net.model} audited after {timeout:g} s: "
                                    f"no verifiers with more than 2/3 of the voting power declared it; see the "
                                    f"verifiers' logs in {net.root}")
            time.sleep(1.0)
        update(1, f"the committee audits {net.model}")


def interactive_chat(config: Path) -> int:
    """``gentorrent user chat`` on this terminal; Ctrl-C ends the chat (and then the devnet)."""
    return subprocess.run(cli("user", "chat", "--config", str(config), "--log-level", "warning")).returncode


def demo_chat(net: LocalNet, config: Path, engine: str) -> int:
    turns = [a for t in DEMO_TURNS[engine] for a in ("--prompt", t)]
    cmd = cli("user", "chat", "--config", str(config), *turns, "--verbose", "--max-tokens", "48", "--temperature", "0",
              "--log-level", "warning",
              "--timeout", "30")
    return subprocess.run(cmd, timeout=180).returncode


def load_state(path: Path) -> dict[str, Any] | None:
    """The devnet state recorded in ``path`` (``None`` if there is none): ``version``,
    ``chain_id``, ``verifiers`` (the committee's size) and ``ports`` (name -> loopback port, as
    :class:`LocalNet` takes them). :class:`CliError` naming ``--fresh`` if it is unreadable."""
    try:
        raw = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CliError(f"cannot read the devnet state {path}: {exc.strerror or exc}; pass --fresh to start a new "
                       "chain") from None
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    ok = (isinstance(doc, dict) and doc.get("version") == STATE_VERSION and isinstance(doc.get("chain_id"), str)
          and type(doc.get("verifiers")) is int and isinstance(doc.get("ports"), dict)
          and all(type(v) is int and 0 < v < 65536 for v in doc["ports"].values()))
    if not ok:
        raise CliError(f"{path} is not a devnet state this version of gentorrent understands; pass --fresh to "
                       "start a new chain")
    assert isinstance(doc, dict)
    return doc


def save_state(path: Path, net: LocalNet, recorded: dict[str, Any] | None) -> None:
    """Record ``net``'s chain id, committee size and ports in ``path`` (keeping recorded ports of
    nodes this run does not start, for a later run that does)."""
    ports = {**(recorded or {}).get("ports", {}), **net.ports}
    tmp = path.with_name(path.name + ".tmp")
    audits = {"audits": net.audits, **({"epoch_blocks": net.epoch_blocks,
                                         "challenges_per_node": net.challenges_per_node} if net.audits else {})}
    tmp.write_text(json.dumps({"version": STATE_VERSION, "chain_id": net.chain_id, "verifiers": len(net.verifiers),
                               **audits, "ports": ports}, indent=1) + "\n")
    os.replace(tmp, path)


def open_net(root: Path, args: argparse.Namespace, model: str) -> tuple[LocalNet, dict[str, Any] | None]:
    """The :class:`LocalNet` to start, and the state it resumes (``None``: a new chain on new
    ports, as with ``--fresh``). :class:`CliError` naming ``--fresh`` when the recorded state is
    for another committee size, its chain cannot be resumed, or one of its ports is taken."""
    path = root / STATE_FILE
    recorded = None
    if args.fresh:
        path.unlink(missing_ok=True)
    else:
        recorded = load_state(path)
    if recorded is not None and bool(recorded.get("audits", False)) != args.audits:
        was = "with" if recorded.get("audits") else "without"
        raise CliError(f"the devnet in {root} was created {was} --audits (its committee's genesis fixes it): "
                       f"{'add' if was == 'with' else 'drop'} --audits to resume it, or pass --fresh to start a new "
                       "chain")
    from verifier.audit.chain import MAX_EPOCH_BLOCKS, MIN_EPOCH_BLOCKS

    epoch_blocks = _genesis_kept(root, recorded if args.audits else None, "epoch_blocks", args.epoch_blocks,
                                 EPOCH_BLOCKS, MIN_EPOCH_BLOCKS, MAX_EPOCH_BLOCKS)
    per_node = _genesis_kept(root, recorded if args.audits else None, "challenges_per_node",
                             args.challenges_per_node, CHALLENGES_PER_NODE, 1, MAX_CHALLENGES_PER_NODE)
    if recorded is not None and recorded["verifiers"] != args.verifiers:
        raise CliError(f"the devnet in {root} has a committee of {recorded['verifiers']} verifiers, not "
                       f"{args.verifiers}: pass --verifiers {recorded['verifiers']} to resume it, or --fresh to start "
                       "a new chain")
    chain_id = recorded["chain_id"] if recorded is not None else f"{DEVNET_CHAIN_ID}-{os.urandom(4).hex()}"
    net = LocalNet(root, args.relays, users=("you",), models=args.models, model=model, engine=args.engine,
                   registry_keys=REGISTRY_KEYS, ping_interval=PING_INTERVAL, echo_delay=0.02,
                   committee=args.verifiers, ports=recorded["ports"] if recorded is not None else None,
                   chain_id=chain_id, audits=args.audits, epoch_blocks=epoch_blocks, challenges_per_node=per_node)
    if recorded is None:
        return net, None
    if net.verifiers:
        why = net.committee_state()
        if why is not None:
            raise CliError(f"cannot resume the devnet's chain {chain_id} in {root}: {why}; pass --fresh to start a "
                           "new chain (node keys are kept)")
    taken = ports_taken({n: p for n, p in net.ports.items() if n in recorded["ports"]})
    if taken:
        shown = ", ".join(f"{n} (127.0.0.1:{net.ports[n]})" for n in taken[:6]) + (" ..." if len(taken) > 6 else "")
        raise CliError(f"ports recorded in {path} are in use: {shown}. Is a devnet still running on this data dir "
                       "(stop it first), or another program on those ports? Pass --fresh to start a new chain on "
                       "new ports")
    return net, recorded


def _genesis_kept(root: Path, recorded: dict[str, Any] | None, name: str, given: int | None, default: int,
                  lo: int, hi: int) -> int:
    """An audit parameter the committee's genesis fixes (``name``, its flag ``--name``): ``given``
    or ``default`` for a new chain; the ``recorded`` one to resume (a state from before the
    parameter was recorded: ``default``), :class:`CliError` naming ``--fresh`` when ``given``
    differs from it or it is not an int within ``lo..hi``."""
    value = default if given is None else given
    if recorded is None:
        return value
    flag = "--" + name.replace("_", "-")
    kept = recorded.get(name, default)
    if type(kept) is not int or not lo <= kept <= hi:
        raise CliError(f"{root / STATE_FILE} records no valid {name} ({kept!r}); pass --fresh to start a new chain")
    if given is not None and given != kept:
        raise CliError(f"the devnet in {root} was created with {flag} {kept} (its committee's genesis fixes it): "
                       f"drop {flag} to resume it, or pass --fresh to start a new chain")
    return int(kept)


def check_args(args: argparse.Namespace) -> None:
    """:class:`CliError` for a network devnet cannot start as asked."""
    if not 4 <= args.relays <= 200:
        raise CliError("--relays must be between 4 and 200 (paths need 3 distinct relays each)")
    if (not args.no_demo or args.chat) and args.relays < 12:
        raise CliError("chats keep 4 proxy paths of 3 distinct relays: they need --relays 12 or more "
                       "(or pass --no-demo without --chat)")
    if not 1 <= args.models <= 8:
        raise CliError("--models must be between 1 and 8")
    if not (args.verifiers == 0 or 1 <= args.verifiers <= 7):
        raise CliError("--verifiers must be between 1 and 7, or 0 for a signed registry file")
    from verifier.audit.chain import MAX_EPOCH_BLOCKS, MIN_EPOCH_BLOCKS

    if args.epoch_blocks is not None and not args.audits:
        raise CliError("--epoch-blocks sets the audit epochs: it needs --audits")
    if args.epoch_blocks is not None and not MIN_EPOCH_BLOCKS <= args.epoch_blocks <= MAX_EPOCH_BLOCKS:
        raise CliError(f"--epoch-blocks must be between {MIN_EPOCH_BLOCKS} and {MAX_EPOCH_BLOCKS}")
    if args.challenges_per_node is not None and not args.audits:
        raise CliError("--challenges-per-node sets the audits' challenges: it needs --audits")
    if args.challenges_per_node is not None and not 1 <= args.challenges_per_node <= MAX_CHALLENGES_PER_NODE:
        raise CliError(f"--challenges-per-node must be between 1 and {MAX_CHALLENGES_PER_NODE}")
    if args.audits and (args.engine != "llama.cpp" or args.verifiers == 0):
        raise CliError("--audits needs the real model (--engine llama.cpp, the default) and a committee "
                       "(--verifiers 1 or more): the verifiers score replies under their own copy of the model")


@dataclass
class Run:
    """One run of devnet: its arguments, the network, the model, where its state and chat config
    live, and the state it resumes (``recorded``; ``resume``: a committee's chain)."""

    args: argparse.Namespace
    net: LocalNet
    root: Path
    model: str
    chat_config: Path
    recorded: dict[str, Any] | None
    resume: bool
    t0: float = 0.0

    def say(self, text: str) -> None:
        """Progress for the user (nothing with ``--quiet``)."""
        if not self.args.quiet:
            print(text, flush=True)


def starting_line(run: Run) -> str:
    """What devnet says as it starts: the committee, the nodes, and the chain it starts or resumes."""
    args, net = run.args, run.net
    committee = f"a committee of {args.verifiers} verifiers, then " if args.verifiers else ""
    chain = ""
    if net.verifiers:
        chain = (f"; resuming chain {net.chain_id} recorded in {run.root / STATE_FILE} (--fresh starts a new one)"
                 if run.resume else f"; new chain {net.chain_id}")
    return (f"devnet: starting {committee}{args.relays} relays and {args.models} model node(s) ({args.engine}, "
            f"{run.model}) on 127.0.0.1 (state in {run.root}{chain})")


def start_all(run: Run) -> None:
    """Launch the committee (if any), record the state, then start the nodes and wait for each to
    be ready (they start with the committee: they wait for it to answer)."""
    args, net = run.args, run.net
    show = not args.quiet
    if net.verifiers:
        net.launch_committee(resume=run.resume)
        save_state(run.root / STATE_FILE, net, run.recorded)
        spawn_nodes(net, verbose=args.verbose)
        try:
            start_committee(net, args.ready_timeout, show=show, verbose=args.verbose)
        except LocalNetError as exc:
            if run.resume:
                raise LocalNetError(f"{exc}. The chain {net.chain_id} was resumed from {run.root}: if that state "
                                    "is from another version of gentorrent, pass --fresh to start a new "
                                    "chain") from None
            raise
        height = net.height()
        run.say(f"devnet: committee up: chain {net.chain_id} at height {height}" + (" (resumed)" if run.resume else ""))
    else:
        save_state(run.root / STATE_FILE, net, run.recorded)
    start_nodes(net, args.ready_timeout, show=show, verbose=args.verbose, spawn=not net.verifiers)


def report_health(run: Run) -> bool:
    """Check that every node answers (:func:`check_up`), show the health table and say so; whether they all did."""
    net = run.net
    ok, results = check_up(net, run.args.ready_timeout)
    for row in health_table(net, results):
        run.say(row)
    if not ok:
        print(f"devnet: not every node answered within {run.args.ready_timeout}s (rows marked !!); see the "
              f"logs in {run.root}", file=sys.stderr)
        return False
    count = len(started_entries(net))
    if net.verifiers:
        run.say(f"devnet: all {count} nodes healthy, registered with the committee "
                f"(RPC {net.committee_addresses}; genesis {net.genesis_file})")
    else:
        run.say(f"devnet: all {count} nodes healthy. Registry: {net.registry_file} "
                f"(signed by {REGISTRY_KEYS} registry keys)")
    return True


def settle_audits(run: Run) -> None:
    """Say whether chats may use the model: unaudited (no --audits: the chat config allows it), or,
    with --audits and a chat to hold, once the committee audits it (:func:`wait_audited`)."""
    args, net = run.args, run.net
    if net.unaudited:
        run.say(f"devnet: this committee runs no audits (--audits turns them on), so no model is audited: the "
                f"chat config {run.chat_config} sets allow_unaudited = true (a user's own config would need "
                f"--allow-unaudited)")
    elif net.audits and (args.chat or not (args.no_demo or args.quiet)):
        wait_audited(net, show=not args.quiet)
        run.say(f"devnet: the committee audits {run.model}: chats use it without --allow-unaudited")


def how_to_chat(net: LocalNet, chat_config: Path) -> str:
    """The commands to see the committee's state and to chat with the network from another terminal."""
    exe = Path(sys.executable).parent / "gentorrent"
    cmd = exe if exe.exists() else "gentorrent"
    lines = []
    if net.verifiers:
        lines.append(f"devnet: the committee's state: {cmd} status --committee "
                     f"{net.committee_addresses} --committee-genesis {net.genesis_file}")
    lines.append(f"devnet: chat yourself, from another terminal:\n"
                 f"    {cmd} user chat --config {chat_config}\n"
                 f"or serve an OpenAI-compatible API on http://127.0.0.1:8741/v1:\n"
                 f"    {cmd} user serve --config {chat_config}"
                 + ("\n(that config sets allow_unaudited = true: this committee runs no audits, so no model is "
                    "audited)" if net.unaudited else ""))
    return "\n".join(lines)


def run_up(run: Run) -> int:
    """Once the nodes are ready: the health check, the demo chat, ``--chat``, or how to chat and
    running until Ctrl-C or ``--duration``. The exit status."""
    args, net = run.args, run.net
    if not report_health(run):
        return 1
    how = ("resumed chain " if run.resume else "new chain ") + net.chain_id if net.verifiers else "no committee"
    print(f"devnet: up in {net.clock.monotonic() - run.t0:.1f} s ({how})", flush=True)
    settle_audits(run)
    if not args.no_demo and not args.quiet:
        run.say("devnet: demo chat through the anonymous overlay (3-hop proxy paths, (4,3) S-IDA cloves):")
        if demo_chat(net, run.chat_config, args.engine) != 0:
            print(f"devnet: the demo chat FAILED; see the messages above and the logs in {run.root}",
                  file=sys.stderr)
            return 1
        run.say(f"devnet: the chat answered {net.clock.monotonic() - run.t0:.1f} s after devnet started")
    if args.chat:
        run.say("devnet: your chat; /help for commands, /quit or Ctrl-D to leave (the network stops then)")
        interactive_chat(run.chat_config)
        return 0
    print(how_to_chat(net, run.chat_config), flush=True)
    if args.duration is None:
        print("devnet: running; press Ctrl-C to stop.", flush=True)
        while True:
            time.sleep(3600)
    time.sleep(args.duration)
    return 0


def _run(args: argparse.Namespace) -> int:
    cfg = resolve_config(args)
    check_args(args)
    root = cfg.data_path / "devnet"
    model = DEFAULT_MODEL if args.engine == "llama.cpp" else "echo"
    root.mkdir(parents=True, exist_ok=True)
    net, recorded = open_net(root, args, model)
    run = Run(args, net, root, model, net.config_toml("you", root / "chat.toml"), recorded,
              resume=recorded is not None and bool(net.verifiers))
    run.say(starting_line(run))
    run.t0 = net.clock.monotonic()
    try:
        with sigterm_as_interrupt():
            start_all(run)
            return run_up(run)
    except KeyboardInterrupt:
        return 0
    except LocalNetError as exc:
        raise CliError(str(exc)) from None
    finally:
        n = len([p for p in net.procs if p not in net.verifiers])
        v = len([p for p in net.procs if p in net.verifiers])
        net.stop()
        print(f"devnet: stopped {n} nodes" + (f" and {v} verifiers." if v else "."), flush=True)
