"""The verifier committee on real CometBFT (v0.38, loopback): one validator, then four.

Each verifier is a real ``gentorrent verifier`` process (our ABCI server plus the cometbft binary
it supervises); transactions go in through CometBFT's RPC. Every wait is bounded by a timeout;
nothing asserts on time.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import msgpack
import pytest
import trio

from gentorrent.tools.localnet import free_ports
from overlay.directory import registration as tx
from overlay.directory.lists import (
    KIND_MODELS,
    KIND_USERS,
    CommitteeClient,
    ListError,
    ValidatorKey,
    verify_document,
)
from overlay.directory.registration import Code
from overlay.directory.rpc import abci_value
from overlay.wire.clock import SystemClock
from overlay.wire.constants import ROLE_MODEL, ROLE_USER
from tests.committee_helpers import Node
from tests.conftest import REPO, gentorrent_cmd, run_cli
from verifier import cometbft
from verifier.cometbft import LOG_FILE
from verifier.run import log_tail

pytestmark = pytest.mark.slow

CHAIN = "gt-e2e"
START_TIMEOUT = 60.0
COMMIT_TIMEOUT = 60.0
T = TypeVar("T")


def _free_port() -> int:
    """A port below the ephemeral range, never given twice in this process: an OS-picked ephemeral
    port can be taken by another verifier's outgoing connection before this one listens (CI saw a
    verifier's RPC refuse connections for a whole minute)."""
    return free_ports(1)[0]


def wait_for(what: str, fn: Callable[[], T | None], timeout: float) -> T:
    """Poll ``fn`` until it returns something other than None/False, at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        try:
            got = fn()
            if got is not None and got is not False:
                return got
        except (OSError, urllib.error.URLError, ValueError, KeyError, ListError) as exc:
            last_exc = exc
        time.sleep(0.2)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what} (last error: {last_exc})")


class Verifier:
    """One ``gentorrent verifier`` process and a small client for its CometBFT RPC."""

    def __init__(self, data_dir: Path, p2p: int, rpc: int) -> None:
        self.data_dir = data_dir
        self.p2p, self.rpc = p2p, rpc
        self.proc: subprocess.Popen[bytes] | None = None

    def spawn(self) -> None:
        with (self.data_dir / "verifier.out").open("ab") as out:
            self.proc = subprocess.Popen(gentorrent_cmd("verifier", "--data-dir", str(self.data_dir)),
                                         stdout=out, stderr=subprocess.STDOUT, cwd=REPO)

    def start(self) -> None:
        self.spawn()
        self.wait_height(1)

    def wait_height(self, height: int) -> None:
        """Wait for block ``height``; a process that exits or a timeout fails with this verifier's
        own output and the tail of its CometBFT log, so a start-up failure says why."""
        def reached() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"{self.data_dir.name} exited with {self.proc.returncode}:\n"
                                     f"{self.output()}\n{self.comet_log()}")
            return self.height() >= height
        try:
            wait_for(f"{self.data_dir.name} at height {height}", reached, START_TIMEOUT)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{self.output()}\n{self.comet_log()}") from None

    def comet_log(self) -> str:
        return "\n".join(log_tail(self.data_dir / LOG_FILE).splitlines()[-40:])

    def stop(self, sig: int = signal.SIGINT) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=30)
        finally:
            self.proc = None

    def output(self) -> str:
        return (self.data_dir / "verifier.out").read_text(errors="replace")[-3000:]

    def rpc_call(self, method: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.rpc}/{method}?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as exc:  # CometBFT answers RPC errors with HTTP 500 and a JSON body
            body = json.loads(exc.read())
        if "error" in body:
            raise RuntimeError(f"{method}: {body['error']}")
        return body["result"]

    def height(self) -> int:
        return int(self.rpc_call("status")["sync_info"]["latest_block_height"])

    def app_info(self) -> tuple[int, bytes]:
        r = self.rpc_call("abci_info")["response"]
        return int(r.get("last_block_height", 0)), base64.b64decode(r.get("last_block_app_hash", ""))

    def broadcast_sync(self, raw: bytes) -> dict[str, Any]:
        return dict(self.rpc_call("broadcast_tx_sync", tx="0x" + raw.hex()))

    def broadcast_commit(self, raw: bytes) -> dict[str, Any]:
        return dict(self.rpc_call("broadcast_tx_commit", tx="0x" + raw.hex()))

    def query(self, path: str, data: bytes = b"") -> tuple[int, Any]:
        r = self.rpc_call("abci_query", path=json.dumps(path), data="0x" + data.hex())["response"]
        value = base64.b64decode(r.get("value") or "")
        return int(r.get("code", 0)), (msgpack.unpackb(value) if value else None)

    def seq_of(self, node_id: bytes) -> int:
        code, seq = self.query("/seq", node_id)
        assert code == 0
        return int(seq)


def make_committee(tmp_path: Path, n: int) -> list[Verifier]:
    vs = [Verifier(tmp_path / f"v{i}", _free_port(), _free_port()) for i in range(n)]
    for v in vs:
        r = run_cli("verifier", "init", "--data-dir", str(v.data_dir), "--p2p", f"127.0.0.1:{v.p2p}",
                    "--rpc", f"127.0.0.1:{v.rpc}", "--timeout-commit", "300ms")
        assert r.returncode == 0, r.stderr
    r = run_cli("verifier", "genesis", "--chain-id", CHAIN, "--out", str(tmp_path / "genesis.json"), "--install",
                "--local-network", "--no-address-probes", *(str(v.data_dir) for v in vs))  # nothing listens
    assert r.returncode == 0, r.stderr
    return vs


@pytest.fixture
def committee_factory(tmp_path: Path) -> Iterator[Callable[[int], list[Verifier]]]:
    try:
        cometbft.find_cometbft()
    except cometbft.CometError as exc:
        pytest.skip(str(exc))
    made: list[Verifier] = []

    def make(n: int) -> list[Verifier]:
        vs = make_committee(tmp_path, n)
        made.extend(vs)
        return vs

    yield make
    for v in made:
        if v.proc is not None:
            v.proc.kill()
            v.proc.wait(timeout=30)
    # A verifier killed with SIGKILL leaves its cometbft to notice the lost ABCI connection and exit.
    for v in made:
        try:
            wait_for(f"{v.data_dir.name}'s cometbft to exit", functools.partial(_port_closed, v.rpc), 30)
        except TimeoutError:
            pass


def _port_closed(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) != 0


def _chain_tx(node: Node, op: int, entry: tx.Entry | None = None, *, seq: int | None = None) -> bytes:
    return node.sign_tx(op, entry, seq=seq, chain=CHAIN)


def test_one_validator_commits_registrations_and_rejects_bad_transactions(
        committee_factory: Callable[[int], list[Verifier]]) -> None:
    (v,) = committee_factory(1)
    v.start()
    user, model = Node(port=7001), Node(port=7002)
    for raw in (_chain_tx(user, tx.OP_REGISTER, user.entry()),
                _chain_tx(model, tx.OP_REGISTER, model.entry(ROLE_MODEL, model_id="smollm2", capacity=3))):
        r = v.broadcast_commit(raw)
        assert r["check_tx"]["code"] == 0 and r["tx_result"].get("code", 0) == 0, r
    code, rec = v.query("/node", model.node_id)
    assert code == 0
    assert rec[0] == model.node_id and rec[1] == model.key.public_bytes and rec[2] == ROLE_MODEL
    assert rec[4:8] == ["127.0.0.1:7002", "eu-west", "smollm2", 3]
    assert v.query("/nodes", b"user")[1][0][0] == user.node_id
    _, before = v.app_info()

    body = msgpack.unpackb(_chain_tx(Node(), tx.OP_LEAVE))[0]
    bad = {
        Code.REPLAYED: _chain_tx(user, tx.OP_UPDATE, user.entry(region="us-east"), seq=1),
        Code.UNSIGNED: msgpack.packb([body, b""], use_bin_type=True),
        Code.MALFORMED: b"\x92\xc4\x01x",
        Code.OVERSIZE: b"\x00" * (tx.MAX_TX_BYTES + 100),
        Code.BAD_SIGNATURE: user.sign_tx(tx.OP_LEAVE, chain="another-chain"),
        Code.CONFLICT: _chain_tx(Node(port=7001), tx.OP_REGISTER, Node(port=7001).entry()),
    }
    for code, raw in bad.items():
        r = v.broadcast_sync(raw)
        assert int(r["code"]) == code, (code, r)
        assert r["log"]
    with pytest.raises(RuntimeError, match="cache"):  # the same bytes again never reach the app
        v.broadcast_sync(_chain_tx(user, tx.OP_REGISTER, user.entry(), seq=1))
    h = v.height()
    wait_for("two more blocks", lambda: v.height() >= h + 2, COMMIT_TIMEOUT)
    assert v.app_info()[1] == before  # no bad transaction changed state
    assert v.query("/node", user.node_id)[1][5] == "eu-west"
    assert v.stop() == 0
    # Restart: Info reports the persisted height and hash, and CometBFT carries on from there.
    v.start()
    assert v.query("/node", model.node_id)[0] == 0
    assert v.app_info()[1] == before
    assert v.stop() == 0


def _wait_committed(vs: list[Verifier], nodes: list[Node]) -> None:
    for v in vs:
        for n in nodes:
            wait_for(f"{n.node_id.hex()[:8]}'s seq {n.seq} on {v.data_dir.name}",
                     functools.partial(lambda v, n: v.seq_of(n.node_id) == n.seq, v, n), COMMIT_TIMEOUT)


def _same_app_hash(vs: list[Verifier]) -> bytes:
    """Once every verifier is two blocks past the highest one now, their app hashes must agree."""
    target = max(v.height() for v in vs) + 2
    for v in vs:
        wait_for(f"{v.data_dir.name} at height {target}", functools.partial(lambda v: v.app_info()[0] >= target, v),
                 COMMIT_TIMEOUT)
    hashes = {v.data_dir.name: v.app_info()[1] for v in vs}
    assert len(set(hashes.values())) == 1, hashes
    return next(iter(hashes.values()))


def _mixed_round(vs: list[Verifier], nodes: list[Node], round_no: int) -> None:
    """Registers, updates or leaves for every node, spread over the verifiers, plus junk."""
    for i, n in enumerate(nodes):
        v = vs[(i + round_no) % len(vs)]
        registered = v.query("/node", n.node_id)[0] == 0
        if not registered:
            raw = _chain_tx(n, tx.OP_REGISTER, n.entry(ROLE_MODEL if i % 2 else ROLE_USER))
        elif (i + round_no) % 3 == 0:
            raw = _chain_tx(n, tx.OP_LEAVE)
        else:
            raw = _chain_tx(n, tx.OP_UPDATE, n.entry(ROLE_MODEL if i % 2 else ROLE_USER,
                                                     region=f"r{round_no}"))
        r = v.broadcast_sync(raw)
        assert int(r["code"]) == 0, r
        assert int(vs[i % len(vs)].broadcast_sync(b"junk")["code"]) == Code.MALFORMED


def test_four_validators_agree_survive_a_crash_and_catch_up(
        committee_factory: Callable[[int], list[Verifier]]) -> None:
    vs = committee_factory(4)
    for v in vs:
        v.spawn()
    for v in vs:
        v.wait_height(2)
    nodes = [Node(port=8000 + i) for i in range(12)]
    for round_no in range(3):
        _mixed_round(vs, nodes, round_no)
        _wait_committed(vs, nodes)
    first = _same_app_hash(vs)

    # One verifier dies hard; its cometbft notices the lost application and exits.
    victim, rest = vs[3], vs[:3]
    assert victim.proc is not None
    victim.proc.kill()
    victim.proc.wait(timeout=30)
    victim.proc = None
    wait_for("the killed verifier's cometbft to exit", lambda: _port_closed(victim.rpc), 60)
    # The other three (30 of 40 voting power, over 2/3) keep finalizing.
    for round_no in range(3, 5):
        _mixed_round(rest, nodes, round_no)
        _wait_committed(rest, nodes)
    second = _same_app_hash(rest)
    assert second != first

    # Restarted, it replays what it missed (Info/replay handshake) and holds the same state.
    victim.start()
    _wait_committed([victim], nodes)
    assert _same_app_hash(vs) == second
    for v in vs:
        assert v.stop() == 0, v.output()
    assert os.path.exists(vs[0].data_dir / "app_state.bin")


def pinned_validators(tmp_path: Path) -> list[ValidatorKey]:
    """The committee's validator keys and powers as a client pins them: from the genesis file."""
    g = json.loads((tmp_path / "genesis.json").read_text())
    return [ValidatorKey(base64.b64decode(v["pub_key"]["value"]), int(v["power"])) for v in g["validators"]]


def _fetch_list(v: Verifier, path: str) -> bytes:
    return trio.run(abci_value, f"127.0.0.1:{v.rpc}", path)


def test_registrations_appear_in_signed_lists_that_verify_on_the_client(
        tmp_path: Path, committee_factory: Callable[[int], list[Verifier]]) -> None:
    vs = committee_factory(4)
    for v in vs:
        v.spawn()
    for v in vs:
        v.wait_height(2)
    users = [Node(port=8100 + i) for i in range(5)]
    model = Node(port=8200)
    for i, n in enumerate(users):
        assert int(vs[i % 4].broadcast_sync(_chain_tx(n, tx.OP_REGISTER, n.entry()))["code"]) == 0
    assert int(vs[0].broadcast_sync(_chain_tx(model, tx.OP_REGISTER, model.entry(ROLE_MODEL)))["code"]) == 0
    _wait_committed(vs, [*users, model])

    pinned = pinned_validators(tmp_path)
    client = CommitteeClient([f"127.0.0.1:{v.rpc}" for v in vs], CHAIN, pinned, clock=SystemClock())

    def listed() -> bool:
        reg = trio.run(client.refresh)
        return {e.node_id for e in reg.users()} == {n.node_id for n in users} and len(reg.models()) == 1

    wait_for("every registration in a signed list", listed, COMMIT_TIMEOUT)
    trio.run(client.refresh)  # again: by signed delta from the height held, through CometBFT's RPC
    assert client.delta_fetches > 0
    reg = client.registry()
    (m,) = reg.models()
    assert m.node_id == model.node_id and m.models == ("smollm2-135m",) and m.address == "127.0.0.1:8200"
    assert client.lists[KIND_USERS].signers <= {p.public_key for p in pinned}
    assert len(client.lists[KIND_USERS].signers) >= 3
    # Every verifier serves a list that verifies, with signatures from more than 2/3 of the power
    # (one a block behind the others serves the list it holds, so wait for each).
    for v in vs:
        wait_for(f"{v.data_dir.name}'s signed model list", functools.partial(
            lambda v: [e.node_id for e in verify_document(_fetch_list(v, "/lists/models"), CHAIN, pinned,
                                                          kind=KIND_MODELS).entries] == [model.node_id], v),
            COMMIT_TIMEOUT)

    # A document cut down to two of four signatures is refused.
    raw = _fetch_list(vs[1], "/lists/users")
    doc = msgpack.unpackb(raw)
    doc[9] = doc[9][:2]
    with pytest.raises(ListError, match="more than 2/3"):
        verify_document(msgpack.packb(doc, use_bin_type=True), CHAIN, pinned, kind=KIND_USERS)
    # A served list with one entry altered (another address for a registered user) is refused.
    doc = msgpack.unpackb(raw)
    records = msgpack.unpackb(doc[5])
    records[0][4] = "6.6.6.6:9000"
    doc[5] = msgpack.packb(records, use_bin_type=True)
    with pytest.raises(ListError, match="digest"):
        verify_document(msgpack.packb(doc, use_bin_type=True), CHAIN, pinned, kind=KIND_USERS)
    assert verify_document(raw, CHAIN, pinned, kind=KIND_USERS).height == msgpack.unpackb(raw)[2]
    # A list older than the one held is refused.
    held = client.lists[KIND_USERS].height
    h = doc[2]
    # (The client may already hold a list newer than the one vs[1] served: wait for one newer than both.)

    def newer() -> bool:
        trio.run(client.refresh)
        return bool(client.lists[KIND_USERS].height > max(held, h))

    wait_for("a newer signed list on the client", newer, COMMIT_TIMEOUT)
    with pytest.raises(ListError, match="older than"):
        client.accept(raw, KIND_USERS)
    for v in vs:
        assert v.stop() == 0, v.output()


def test_a_fifth_verifier_joins_by_approved_change_and_its_signatures_then_count(
        tmp_path: Path, committee_factory: Callable[[int], list[Verifier]]) -> None:
    vs = committee_factory(4)
    for v in vs:
        v.spawn()
    for v in vs:
        v.wait_height(2)
    # The fifth: its own home and key, the committee's genesis, the others as peers; a full node at first.
    new = Verifier(tmp_path / "v4", _free_port(), _free_port())
    r = run_cli("verifier", "init", "--data-dir", str(new.data_dir), "--p2p", f"127.0.0.1:{new.p2p}",
                "--rpc", f"127.0.0.1:{new.rpc}", "--timeout-commit", "300ms")
    assert r.returncode == 0, r.stderr
    genesis = json.loads((tmp_path / "genesis.json").read_text())
    cometbft.install_genesis([str(v.data_dir) for v in [*vs, new]], genesis)
    try:
        _join_and_count(tmp_path, vs, new)
    finally:
        if new.proc is not None:
            new.proc.kill()
            new.proc.wait(timeout=30)


def _join_and_count(tmp_path: Path, vs: list[Verifier], new: Verifier) -> None:
    new.start()
    joiner = cometbft.read_validator_key(new.data_dir)
    key_b64 = base64.b64encode(joiner.public_bytes).decode()
    flags = ["--chain-id", CHAIN, "--key", key_b64, "--power", "10", "--seq", "1"]

    # Two approvals (20 of 40) are refused; three (30 of 40) apply.
    approvals = []
    for v in vs[:3]:
        r = run_cli("verifier", "approve", "--data-dir", str(v.data_dir), *flags)
        assert r.returncode == 0, r.stderr
        approvals.append(r.stdout.strip())
    r = run_cli("verifier", "change", "--rpc", f"127.0.0.1:{vs[0].rpc}", *flags, *approvals[:2])
    assert r.returncode != 0 and "more than 2/3" in r.stderr, r.stderr
    r = run_cli("verifier", "change", "--rpc", f"127.0.0.1:{vs[1].rpc}", *flags, *approvals)
    assert r.returncode == 0, r.stderr
    for v in [*vs, new]:
        wait_for(f"the change on {v.data_dir.name}", functools.partial(lambda v: v.query("/validators")[1][0] == 1, v),
                 COMMIT_TIMEOUT)
    assert len(vs[0].query("/validators")[1][1]) == 5
    wait_for("CometBFT to make the fifth a validator",
             lambda: len(vs[2].rpc_call("validators")["validators"]) == 5, COMMIT_TIMEOUT)

    # A client that pinned the founding four follows the change and counts the fifth's signature.
    client = CommitteeClient([f"127.0.0.1:{v.rpc}" for v in [new, *vs]], CHAIN, pinned_validators(tmp_path))

    def fifth_signed() -> bool:
        trio.run(client.refresh)
        return joiner.public_bytes in client.lists[KIND_USERS].signers

    wait_for("a signed list carrying the fifth verifier's signature", fifth_signed, COMMIT_TIMEOUT)
    assert len(client.validators) == 5
    # With the fifth counted, the lists keep verifying with one founder gone (40 of 50).
    victim = vs[0]
    assert victim.proc is not None
    victim.proc.kill()
    victim.proc.wait(timeout=30)
    victim.proc = None
    h = client.height
    wait_for("a newer list with a founder down", lambda: trio.run(client.refresh).version > h + 2, COMMIT_TIMEOUT)
    assert joiner.public_bytes in client.lists[KIND_USERS].signers
    for v in [*vs[1:], new]:
        assert v.stop() == 0, v.output()


BENCH_KEYS = {
    "registrations_per_s", "registration_run_s", "list_bytes", "block_time_mean_ms", "txs_per_block_max",
    *(f"{p}_{s}_ms" for p in ("register_to_signed_list", "list_fetch_verify", "list_verify")
      for s in ("mean", "p50", "p99")),
}


def test_bench_committee_quick_runs_and_prints_its_figures() -> None:
    try:
        cometbft.find_cometbft()
    except cometbft.CometError as exc:
        pytest.skip(str(exc))
    r = run_cli("bench", "committee", "--json", "--quick", timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["bench"] == "committee" and out["params"]["validators"] == 4
    assert set(out["figures"]) == BENCH_KEYS
    figs = out["figures"]
    assert all(v > 0 for v in figs.values()), figs
    assert figs["register_to_signed_list_p50_ms"] <= figs["register_to_signed_list_p99_ms"]
    assert figs["list_verify_p50_ms"] <= figs["list_fetch_verify_p99_ms"]


def _processes_mentioning(text: str) -> list[int]:
    """Pids whose command line contains ``text`` (Linux /proc)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if text in (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    pids.append(int(d.name))
            except OSError:
                continue
    return pids


def test_bench_committee_stopped_by_sigterm_leaves_no_verifier_behind() -> None:
    """SIGTERM stops a bench like Ctrl-C: it used to kill the bench and leave its 4 verifiers
    and their CometBFT nodes running."""
    import shutil
    import tempfile

    try:
        cometbft.find_cometbft()
    except cometbft.CometError as exc:
        pytest.skip(str(exc))
    # The bench's verifiers live under a short TMPDIR (their unix sockets' paths must stay short).
    tmp_path = Path(tempfile.mkdtemp(prefix="gtsig"))
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen(gentorrent_cmd("bench", "committee", "--quick"), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while len(_processes_mentioning(str(tmp_path))) < 8:  # 4 verifiers + 4 cometbft nodes
            assert proc.poll() is None and time.monotonic() < deadline, (
                "the bench did not start its committee: " + (proc.stderr.read() if proc.poll() is not None and proc.stderr
                                                             else b"").decode(errors="replace")[-2000:])
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err[-2000:].decode(errors="replace")
        assert _processes_mentioning(str(tmp_path)) == []
    finally:
        if proc.poll() is None:
            proc.kill()
        shutil.rmtree(tmp_path, ignore_errors=True)


def test_a_verifier_stopped_as_its_cometbft_starts_leaves_no_cometbft_behind(
        committee_factory: Callable[[int], list[Verifier]]) -> None:
    """SIGTERM the moment the verifier's CometBFT (its own session) appears: the verifier used to
    open its signal receiver only after starting CometBFT, so a signal in between killed it by
    default and left CometBFT running (CI saw 3 such processes after a bench was stopped)."""
    (v,) = committee_factory(1)
    home = str(v.data_dir / "cometbft")
    v.spawn()
    assert v.proc is not None
    deadline = time.monotonic() + 120
    # no sleep in this poll on purpose: the signal must land in the few milliseconds after CometBFT starts
    while not [p for p in _processes_mentioning(home) if p != v.proc.pid]:
        assert v.proc.poll() is None and time.monotonic() < deadline, v.output()
    v.proc.send_signal(signal.SIGTERM)
    v.proc.wait(timeout=60)
    v.proc = None
    left = _processes_mentioning(str(v.data_dir))
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    assert left == [], "CometBFT outlived its verifier"
