"""``gentorrent bench committee``: a real 4-validator committee on loopback, measured from outside.

Four ``gentorrent verifier`` processes (CometBFT v0.38 plus our ABCI application) in a temp dir.
Figures (docs/benchmarks.md "## committee"):

- ``registrations_per_s``: ``users`` pre-signed registrations broadcast with ``broadcast_tx_sync``
  over ``clients`` keep-alive connections spread across the four RPCs, from the first send until
  the last is committed (every verifier's ``/info`` counts them all).
- ``register_to_signed_list_{mean,p50,p99}_ms``: one registration at a time, from its broadcast to
  the first signed ``/lists/users`` (fetched and verified as a client does) that lists it.
- ``list_fetch_verify_{mean,p50,p99}_ms``: ``abci_query /lists/users`` over HTTP plus
  :func:`overlay.directory.lists.verify_document` of the list of ``users`` users (10,000 in a full run);
  ``list_verify_*`` the verification alone, ``list_bytes`` the document's size.
- ``block_time_mean_ms``: CometBFT's mean block interval (header times) during the registrations,
  ``txs_per_block_max`` the largest block then.
"""

from __future__ import annotations

import base64
import http.client
import itertools
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgpack
import trio

from gentorrent.bench.stats import cpu_model, summarize_ms
from gentorrent.tools.localnet import free_ports
from overlay.directory import registration as tx
from overlay.directory.lists import KIND_USERS, CommitteeClient, ValidatorKey, verify_document
from overlay.directory.rpc import abci_value, block_time_unix
from overlay.wire import crypto
from overlay.wire.constants import ROLE_USER
from overlay.wire.identity import node_id_of
from verifier import cometbft

CHAIN = "gt-bench"
START_TIMEOUT = 90.0


def _free_port() -> int:
    return free_ports(1)[0]  # below the ephemeral range: outgoing connections cannot take it first


class _Rpc:
    """One keep-alive HTTP connection to a verifier's CometBFT RPC."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def call(self, method: str, **params: str) -> Any:
        path = f"/{method}?" + urllib.parse.urlencode(params)
        for attempt in range(2):
            try:
                self.conn.request("GET", path)
                body = json.loads(self.conn.getresponse().read())
                break
            except (OSError, http.client.HTTPException):
                self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
                if attempt:
                    raise
        if "error" in body:
            raise RuntimeError(f"{method}: {body['error']}")
        return body["result"]


def _wait(what: str, fn: Any, timeout: float, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            got = fn()
            if got:
                return got
        except (OSError, RuntimeError, ValueError, KeyError, http.client.HTTPException) as exc:
            last = exc
        time.sleep(every)
    raise TimeoutError(f"bench committee: timed out waiting for {what} (last error: {last})")


def _registration(i: int) -> tuple[bytes, bytes]:
    key = crypto.SigningKey.generate()
    entry = tx.Entry(ROLE_USER, crypto.X25519Key.generate().public_bytes,
                     f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}:7000", "eu-west")
    return node_id_of(key.public_bytes), tx.make_tx(key, CHAIN, tx.OP_REGISTER, 1, entry)


class _Committee:
    def __init__(self, root: Path, n: int, timeout_commit: str) -> None:
        self.root = root
        self.dirs = [root / f"v{i}" for i in range(n)]
        self.rpcs: list[int] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        for d in self.dirs:
            rpc = _free_port()
            cometbft.init_home(d, p2p=f"127.0.0.1:{_free_port()}", rpc=f"127.0.0.1:{rpc}",
                               timeout_commit=timeout_commit)
            self.rpcs.append(rpc)
        genesis = cometbft.make_genesis([str(d) for d in self.dirs], chain_id=CHAIN)
        cometbft.install_genesis([str(d) for d in self.dirs], genesis)
        vals: Any = genesis["validators"]
        self.pinned = [ValidatorKey(base64.b64decode(v["pub_key"]["value"]), int(v["power"])) for v in vals]

    def start(self) -> None:
        for d in self.dirs:
            out = (d / "verifier.out").open("ab")
            self.procs.append(subprocess.Popen([sys.executable, "-m", "gentorrent.cli", "verifier", "--data-dir", str(d)],
                                               stdout=out, stderr=subprocess.STDOUT))
            out.close()
        for port in self.rpcs:
            rpc = _Rpc(port)
            _wait(f"the verifier on RPC port {port}",
                  lambda rpc=rpc: int(rpc.call("status")["sync_info"]["latest_block_height"]) >= 2, START_TIMEOUT)

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _users_on(rpc: _Rpc) -> int:
    r = rpc.call("abci_query", path='"/info"')["response"]
    return int(msgpack.unpackb(base64.b64decode(r["value"]))[3])


def _block_times(rpc: _Rpc, lo: int, hi: int) -> tuple[float, int]:
    """(mean interval in seconds, most txs in one block) over heights lo..hi."""
    times, most = [], 0
    for h in range(lo, hi + 1):
        meta = rpc.call("block", height=str(h))["block"]
        stamp = meta["header"]["time"]
        times.append(block_time_unix(stamp))
        most = max(most, len(meta["data"]["txs"] or []))
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return (sum(gaps) / len(gaps) if gaps else float("nan")), most


def run(quick: bool) -> tuple[dict[str, Any], dict[str, float]]:
    users = 300 if quick else 10_000
    samples = 5 if quick else 40
    fetches = 3 if quick else 30
    clients = 16
    timeout_commit = "300ms" if quick else "1s"
    params: dict[str, Any] = {"validators": 4, "users": users, "latency_samples": samples, "fetch_trials": fetches,
                              "clients": clients, "timeout_commit": timeout_commit, "cpu": cpu_model(),
                              "note": "4 verifiers, their CometBFT nodes and the load generator share this machine"}
    try:
        cometbft.find_cometbft()
    except cometbft.CometError as exc:
        raise SystemExit(f"bench committee: {exc}") from None
    root = Path(tempfile.mkdtemp(prefix="gt-bench-committee-"))
    committee = _Committee(root, 4, timeout_commit)
    try:
        committee.start()
        return params, _measure(committee, users, samples, fetches, clients)
    finally:
        committee.stop()
        shutil.rmtree(root, ignore_errors=True)


def _measure(committee: _Committee, users: int, samples: int, fetches: int, clients: int) -> dict[str, float]:
    regs = [_registration(i) for i in range(users)]  # signed before the clock starts
    rpc0 = _Rpc(committee.rpcs[0])
    h0 = int(rpc0.call("status")["sync_info"]["latest_block_height"])
    conns = [_Rpc(committee.rpcs[i % len(committee.rpcs)]) for i in range(clients)]

    def send(k: int) -> None:
        conn = conns[k]
        for _, raw in regs[k::clients]:
            r = conn.call("broadcast_tx_sync", tx="0x" + raw.hex())
            if int(r["code"]):
                raise RuntimeError(f"registration refused: {r}")

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(send, range(clients)))
    for port in committee.rpcs:
        rpc = _Rpc(port)
        _wait(f"{users} registrations committed on port {port}", lambda rpc=rpc: _users_on(rpc) >= users, 600, 0.02)
        if port == committee.rpcs[0]:
            elapsed = time.perf_counter() - t0
    h1 = int(rpc0.call("status")["sync_info"]["latest_block_height"])
    block_s, most = _block_times(rpc0, h0 + 1, h1)

    addrs = [f"127.0.0.1:{p}" for p in committee.rpcs]
    client = CommitteeClient(addrs, CHAIN, committee.pinned)
    latencies = []
    for i in range(samples):
        node_id, raw = _registration(users + i)
        t = time.perf_counter()
        r = conns[i % len(conns)].call("broadcast_tx_sync", tx="0x" + raw.hex())
        if int(r["code"]):
            raise RuntimeError(f"registration refused: {r}")

        def listed(node_id: bytes = node_id) -> bool:
            reg = trio.run(client.refresh)
            return node_id in reg.by_id

        _wait("a registration in a signed list", listed, 120, 0.02)
        latencies.append(time.perf_counter() - t)

    fetch_s, verify_s, size = [], [], 0
    for i in range(fetches):
        t = time.perf_counter()
        raw = trio.run(abci_value, addrs[i % len(addrs)], "/lists/users")
        t1 = time.perf_counter()
        got = verify_document(raw, CHAIN, committee.pinned, kind=KIND_USERS)
        t2 = time.perf_counter()
        fetch_s.append(t2 - t)
        verify_s.append(t2 - t1)
        size = len(raw)
        assert len(got.entries) >= users
    return {
        "registrations_per_s": users / elapsed,
        "registration_run_s": elapsed,
        **summarize_ms("register_to_signed_list", latencies),
        **summarize_ms("list_fetch_verify", fetch_s),
        **summarize_ms("list_verify", verify_s),
        "list_bytes": float(size),
        "block_time_mean_ms": 1e3 * block_s,
        "txs_per_block_max": float(most),
    }
