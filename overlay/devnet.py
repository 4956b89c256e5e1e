"""``gentorrent devnet``: a whole local network on loopback, in one command.

Today: N user nodes (``gentorrent user relay`` processes) that find each other
from a generated peer list and ping each other over authenticated TLS. The
devnet waits until every node has reached every other, prints the network,
and keeps it running until Ctrl-C (or ``--duration``), then stops every node.
Later issues add model nodes, a chat through the overlay, and the committee.

Devnet spawns processes rather than importing roles, so ``overlay`` still
imports no role package.
"""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import trio

from overlay.cli import CliError, common_flags, resolve_config, run_async
from overlay.identity import load_or_create, short_id
from overlay.peers import PeerEntry, save
from overlay.status import format_rows, query_all
from overlay.transport import TLSTransport, format_address


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "devnet", help="run a local network of every part that exists, on loopback",
        description=(
            "Start a local GenTorrent network on 127.0.0.1: --nodes user nodes that discover each "
            "other from a generated peer list and ping each other over authenticated TLS. Prints "
            "the network once every node has reached every other, then runs until Ctrl-C "
            "(or --duration seconds) and stops all nodes. State lives in DATA_DIR/devnet."
        ),
    )
    common_flags(p)
    p.add_argument("--nodes", type=int, default=5, help="number of user nodes (default: 5)")
    p.add_argument("--duration", type=float, default=None,
                   help="stop after this many seconds instead of waiting for Ctrl-C")
    p.add_argument("--ready-timeout", type=float, default=60.0,
                   help="seconds to wait for the nodes to find each other (default: 60)")
    p.set_defaults(run=_run)


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports free right now (the OS picks; a tiny race is acceptable on loopback)."""
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


class Devnet:
    def __init__(self, root: Path, n_nodes: int, *, ping_interval: float = 2.0) -> None:
        if not 2 <= n_nodes <= 64:
            raise CliError("--nodes must be between 2 and 64")
        self.root = root
        self.n = n_nodes
        self.ping_interval = ping_interval
        self.entries: list[PeerEntry] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.peers_file = root / "peers.json"

    def prepare(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        ports = free_ports(self.n)
        self.entries = []
        for i, port in enumerate(ports):
            ident = load_or_create(self.root / f"node-{i}")
            self.entries.append(PeerEntry.of(ident, format_address("127.0.0.1", port)))
        save(self.peers_file, self.entries)

    def start(self) -> None:
        for i, e in enumerate(self.entries):
            log = open(self.root / f"node-{i}.log", "ab")
            cmd = [
                sys.executable, "-m", "overlay.cli", "user", "relay",
                "--data-dir", str(self.root / f"node-{i}"), "--listen", e.address,
                "--peers", str(self.peers_file), "--ping-interval", str(self.ping_interval),
            ]
            # Own process group: a terminal Ctrl-C reaches the devnet, which stops the nodes.
            self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=log, start_new_session=True))
            log.close()

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 5
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    async def wait_connected(self, timeout: float) -> dict:
        """Poll every node's status until each has reached all others (or timeout)."""
        transport = TLSTransport(load_or_create(self.root / "observer"))
        deadline = trio.current_time() + timeout
        while True:
            for i, p in enumerate(self.procs):
                if p.poll() is not None:
                    raise CliError(f"node {i} exited with status {p.returncode}; see {self.root}/node-{i}.log")
            results = await query_all(transport, self.entries, 5.0)
            done = all(
                not isinstance(r, str) and sum(1 for s in r[1].peers if s.rtt_us >= 0) == self.n - 1
                for r in results.values()
            )
            if done or trio.current_time() > deadline:
                return {"ok": done, "results": results}
            await trio.sleep(0.5)


def _run(args: argparse.Namespace) -> int:
    cfg = resolve_config(args)
    net = Devnet(cfg.data_path / "devnet", args.nodes)
    net.prepare()
    print(f"devnet: starting {net.n} user nodes on 127.0.0.1 (state in {net.root})", flush=True)
    net.start()
    try:
        state = run_async(net.wait_connected, args.ready_timeout)
        for row in format_rows(net.entries, state["results"]):
            print(row)
        if not state["ok"]:
            print(f"devnet: not every node reached every other within {args.ready_timeout}s; "
                  f"see the logs in {net.root}", file=sys.stderr)
            return 1
        print(f"devnet: all {net.n} nodes authenticated and pinged each other. "
              f"Peer list: {net.peers_file}", flush=True)
        if args.duration is None:
            print("devnet: running; press Ctrl-C to stop.", flush=True)
            while True:
                time.sleep(3600)
        else:
            time.sleep(args.duration)
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        net.stop()
        print(f"devnet: stopped {net.n} nodes.", flush=True)
