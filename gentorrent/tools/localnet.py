"""A local network of real node processes on loopback: used by devnet, benchmarks and e2e tests.

:class:`LocalNet` creates identities under ``root``, assigns loopback ports,
signs a registry with ``registry_keys`` keys (clients need more than 2/3 of
them), spawns ``gentorrent user relay`` and ``gentorrent model-node`` processes
(each in its own session, logs in ``root/NAME.log``), waits for their
``READY`` lines, and stops or kills them on request. It imports no role
package: roles run as processes.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Self

import trio

from overlay.directory import registry as reg
from overlay.directory import transcripts as tw
from overlay.directory.rpc import Answer, RpcError, call_sync, query_sync
from overlay.net.peers import PeerEntry
from overlay.net.transport import format_address
from overlay.wire.clock import Clock, SystemClock
from overlay.wire.crypto import SigningKey
from overlay.wire.identity import Identity, load_or_create

DEVNET_CHAIN_ID = "gentorrent-devnet"


class LocalNetError(Exception):
    """A node of the local network failed to start."""


_EPHEMERAL_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LISTEN_PORTS = 12_000  # how many ports below the ephemeral range local networks listen on


def ephemeral_low() -> int:
    """The lowest port the kernel gives outgoing connections (Linux's ``ip_local_port_range``;
    32768, Linux's default, where that cannot be read)."""
    try:
        return int(_EPHEMERAL_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


class PortPool:
    """Listener ports for local networks: the ``span`` ports just below ``low`` (the kernel's
    ephemeral range), so no outgoing connection of another node can take one as its source port
    between :meth:`take` and the listener's bind (a port the OS picks with ``bind(("", 0))`` is an
    ephemeral one, and with dozens of nodes dialling each other while they start, one of them took
    a verifier's audit port in a CI run). A port the pool gave is never given again. Where that
    range is too small for a request, the OS picks (ephemeral ports: a small race).

    ``slice_`` ``(i, n)`` keeps this pool to the i-th of n equal parts of that range, so that n
    processes that start local networks at once (a parallel test run: ``GENTORRENT_PORT_SLICE=i/n``,
    set per worker by the tests' conftest) never hand out the same port: one of them bound a port
    another had just taken, in a CI run."""

    def __init__(self, low: int, span: int = LISTEN_PORTS, slice_: tuple[int, int] = (0, 1)) -> None:
        first = max(1024, low - span)
        i, n = slice_
        if not 0 <= i < n:
            raise ValueError(f"a port slice is i/n with 0 <= i < n, not {i}/{n}")
        width = (low - first) // n
        self.first, self.low = first + i * width, first + (i + 1) * width
        self.given: set[int] = set()
        self._rng = random.SystemRandom()

    def take(self, n: int, host: str = "127.0.0.1") -> list[int]:
        """``n`` distinct ports nobody listens on now (checked as :func:`ports_taken` does)."""
        if self.low - self.first < 4 * n + 64:
            return _os_ports(n, host)
        ports: list[int] = []
        for _ in range(50 * n + 200):
            if len(ports) == n:
                break
            port = self._rng.randrange(self.first, self.low)
            if port not in self.given and port not in ports and not ports_taken({"": port}, host):
                ports.append(port)
        if len(ports) < n:
            raise LocalNetError(f"found only {len(ports)} of {n} free ports in {self.first}..{self.low - 1} on {host}")
        self.given.update(ports)
        return ports


def port_slice(value: str | None) -> tuple[int, int]:
    """``GENTORRENT_PORT_SLICE`` (``i/n``) as ``(i, n)``; the whole range when unset or not that form."""
    try:
        i, n = (int(x) for x in (value or "").split("/"))
    except ValueError:
        return 0, 1
    return (i, n) if 0 <= i < n else (0, 1)


_POOL = PortPool(ephemeral_low(), slice_=port_slice(os.environ.get("GENTORRENT_PORT_SLICE")))


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports free right now, for listeners a local network will start, never the
    same port twice in one process (:class:`PortPool` below the ephemeral range)."""
    return _POOL.take(n, host)


def _os_ports(n: int, host: str) -> list[int]:
    """``n`` distinct ports the OS picks (ephemeral ones: a small race with outgoing connections)."""
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


def ports_taken(ports: Mapping[str, int], host: str = "127.0.0.1") -> list[str]:
    """The names of ``ports`` whose port cannot be listened on now (another process holds it).

    Binds as servers do (``SO_REUSEADDR``), so a port left in TIME_WAIT by a stopped node
    counts as free."""
    taken = []
    for name, port in ports.items():
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
                s.listen(1)
            except OSError:
                taken.append(name)
    return taken


def fitting_reply_window(epoch_blocks: int, block_s: float) -> int:
    """The longest reply window (decision 0040), at most the default 600 s, at which model nodes
    hand in what donors withheld before an epoch of ``epoch_blocks`` blocks of at least ``block_s``
    seconds each reaches its report window (:func:`overlay.directory.transcripts.close_after_s`);
    the least window where none fits (the verifiers then warn that framing goes unanswered)."""
    from verifier.audit.chain import AuditParams

    room = (epoch_blocks - AuditParams(epoch_blocks).report_blocks()) * block_s
    fits = [w for w in range(tw.MIN_REPLY_WINDOW_S, tw.DEFAULT_REPLY_WINDOW_S + 1) if tw.close_after_s(w) <= room]
    return max(fits, default=tw.MIN_REPLY_WINDOW_S)


def _seconds(duration: str) -> float:
    """A CometBFT duration (``500ms``, ``1s``) in seconds."""
    return float(duration[:-2]) / 1000 if duration.endswith("ms") else float(duration.rstrip("s"))


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "gentorrent.cli", *args]


class LocalNet:
    def __init__(
        self,
        root: Path,
        n_relays: int,
        *,
        users: tuple[str, ...] = (),
        models: int = 1,
        model: str = "echo",
        registry_keys: int = 4,
        ping_interval: float = 0.0,
        echo_delay: float = 0.0,
        engine: str = "echo",
        model_args: tuple[str, ...] = (),
        bench_args: tuple[str, ...] = (),
        clock: Clock | None = None,
        committee: int = 0,
        timeout_commit: str = "500ms",
        ports: Mapping[str, int] | None = None,
        chain_id: str = DEVNET_CHAIN_ID,
        audits: bool = False,
        epoch_blocks: int = 120,
        challenges_per_node: int = 2,
        reply_window: int | None = None,
    ) -> None:
        """``users`` names extra registered user identities that this class does not
        start (chat clients, benchmark clients, test sinks). ``engine``: the model nodes'
        ``--engine`` (``echo``, the diagnostic, by default; ``llama.cpp`` with
        ``model="smollm2-135m-instruct"`` runs the real default model). ``model_args``: extra
        ``gentorrent model-node`` flags (``--sync-interval 0.5``, ``--threads 1``...).
        ``echo_delay`` and ``bench_args`` (``--baseline load``) are injected by the bench
        launcher ``python -m model_node.bench.node``, which then starts the model nodes: they
        are no ``gentorrent model-node`` flags. ``clock`` (default
        :class:`~overlay.wire.clock.SystemClock`: this class runs outside trio) stamps the registry
        and times the waits for processes. ``committee``: run that many verifiers (CometBFT
        validators, ``gentorrent verifier``; :meth:`start_committee`) and let every node register
        with them instead of reading a registry file (none is written); ``timeout_commit`` is their
        CometBFT block pause, ``chain_id`` their chain's id. ``ports``: fixed loopback ports by
        name (a node's name; ``verifier-I.p2p`` and ``verifier-I.rpc`` for a verifier's CometBFT
        ports); every port not named there is one the OS finds free now (:attr:`ports` holds them
        all, to be given back on a later run that resumes the same network). ``audits``: the
        committee's genesis turns audits on for ``model`` in epochs of ``epoch_blocks`` blocks, with
        ``challenges_per_node`` challenges a verifier sends each node, and every verifier runs
        ``--audit`` (its audit user node on port ``verifier-I.audit``). Both are smaller than the
        public network's defaults (900 and 4, decision 0026): a network on one machine is watched
        for minutes, and its few cores answer every challenge. ``reply_window``: the genesis's
        ``reply_window_s`` (decision 0040); ``None``, the longest that lets model nodes hand in what
        donors withheld within these epochs at ``timeout_commit``'s pace (:func:`fitting_reply_window`)."""
        self.clock: Clock = clock or SystemClock()
        self.root = root
        self.engine = engine
        self.model_args = tuple(model_args)
        self.bench_args = tuple(bench_args)
        root.mkdir(parents=True, exist_ok=True)
        self.ping_interval = ping_interval
        self.echo_delay = echo_delay
        self.model = model
        verifiers = [f"verifier-{i}" for i in range(committee)]
        wanted = [f"relay-{i}" for i in range(n_relays)] + [f"model-{i}" for i in range(models)] + list(users) + [
            f"{v}.{what}" for v in verifiers for what in ("p2p", "rpc", *(("audit",) if audits else ()))]
        fixed = dict(ports or {})
        fresh = iter(free_ports(sum(w not in fixed for w in wanted)))
        self.ports: dict[str, int] = {w: fixed[w] if w in fixed else next(fresh) for w in wanted}
        self.chain_id = chain_id
        self.names: list[str] = []
        self.identities: dict[str, Identity] = {}
        self.entries: dict[str, PeerEntry] = {}
        for i in range(n_relays):
            self._add(f"relay-{i}", self.ports[f"relay-{i}"], "user")
        for i in range(models):
            self._add(f"model-{i}", self.ports[f"model-{i}"], "model")
        for u in users:
            self._add(u, self.ports[u], "user")
        self.relays = [f"relay-{i}" for i in range(n_relays)]
        self.models = [f"model-{i}" for i in range(models)]
        self.verifiers = verifiers
        self.verifier_ports = {v: (self.ports[f"{v}.p2p"], self.ports[f"{v}.rpc"]) for v in verifiers}  # (p2p, rpc)
        self.timeout_commit = timeout_commit
        self.audits, self.epoch_blocks, self.challenges_per_node = audits, epoch_blocks, challenges_per_node
        self.reply_window: int = reply_window if reply_window is not None else \
            fitting_reply_window(epoch_blocks, _seconds(timeout_commit)) if audits else tw.DEFAULT_REPLY_WINDOW_S
        self.genesis_file = root / "committee-genesis.json"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        if committee:  # no registry file: the nodes register with the committee
            self.keys_hex = ""
            self.registry_file = root / "registry.json"
            self.registry_file.unlink(missing_ok=True)
            self.registry = reg.Registry(0, list(self.entries.values()))
            return
        keys = [SigningKey.from_bytes(load_or_create(root / f"registry-key-{i}").signing.private_bytes())
                for i in range(registry_keys)]
        self.keys_hex = ",".join(k.public_bytes.hex() for k in keys)
        self.registry_file = root / "registry.json"
        reg.save(self.registry_file, reg.sign(list(self.entries.values()), keys, 1, int(self.clock.unix())))
        self.registry = reg.load(self.registry_file, [k.public_bytes for k in keys])

    def _add(self, name: str, port: int, role: str) -> None:
        ident = load_or_create(self.root / name)
        self.names.append(name)
        self.identities[name] = ident
        self.entries[name] = PeerEntry.of(
            ident, format_address(self.host(name), port), role=role, models=(self.model,) if role == "model" else ()
        )

    # Hooks a network on several addresses overrides (gentorrent/tools/testbed.py).

    def host(self, name: str) -> str:
        """The IP ``name`` (a node or a verifier) listens on: loopback here."""
        return "127.0.0.1"

    def committee_for(self, name: str | None) -> str:
        """The verifiers' RPC addresses as node ``name`` reaches them (``None``: from this process)."""
        return self.committee_addresses

    def env_for(self, name: str) -> dict[str, str] | None:
        """The environment ``name``'s process runs with (``None``: this process's)."""
        return None

    def after_genesis(self) -> None:
        """Called once the committee's genesis is installed in every verifier's home."""

    @property
    def committee_addresses(self) -> str:
        """The verifiers' CometBFT RPC addresses, as ``--committee`` takes them."""
        return ",".join(self.rpc_address(v) for v in self.verifiers)

    def registry_args(self, name: str | None = None) -> list[str]:
        if self.verifiers:
            return ["--committee", self.committee_for(name), "--committee-genesis", str(self.genesis_file)]
        return ["--registry", str(self.registry_file), "--registry-keys", self.keys_hex]

    @property
    def unaudited(self) -> bool:
        """Whether the committee's model list marks the model unaudited: a committee without
        audits (no verifier declares a model), whose users need ``allow_unaudited``."""
        return bool(self.verifiers) and not self.audits

    def config_toml(self, name: str, path: Path) -> Path:
        """Write a config file for the user ``name`` (e.g. a chat client; registered in the
        registry file, or registering itself with the committee). A committee without audits
        audits no model, so the file sets ``allow_unaudited = true`` (:attr:`unaudited`)."""
        directory = (f'committee = "{self.committee_for(name)}"\n'
                     f"committee_genesis = {json.dumps(str(self.genesis_file))}\n") if self.verifiers else (
                     f"registry = {json.dumps(str(self.registry_file))}\n"
                     f'registry_keys = "{self.keys_hex}"\n')
        path.write_text(
            f"data_dir = {json.dumps(str(self.root / name))}\n"
            + directory +
            f'listen = "{self.entries[name].address}"\n'
            f'model = "{self.model}"\n'
            + ("# this committee runs no audits: its model list marks every model unaudited\n"
               "allow_unaudited = true\n" if self.unaudited else "")
        )
        return path

    # ------------------------------------------------------------------ the committee

    def committee_state(self) -> str | None:
        """Why the verifiers' homes under ``root`` cannot resume this committee's chain, or
        ``None`` when they can: each home holds CometBFT's config and a genesis of chain
        :attr:`chain_id` equal to :attr:`genesis_file` (CometBFT replays to the application
        whatever blocks its state lacks)."""
        try:
            genesis = json.loads(self.genesis_file.read_text())
        except (OSError, ValueError) as exc:
            return f"the committee's genesis {self.genesis_file} is unreadable ({exc})"
        if not isinstance(genesis, dict) or genesis.get("chain_id") != self.chain_id:
            return f"{self.genesis_file} is not the genesis of chain {self.chain_id!r}"
        for v in self.verifiers:
            home = self.root / v / "cometbft" / "config"
            try:
                installed = json.loads((home / "genesis.json").read_text())
            except (OSError, ValueError):
                return f"{v} has no CometBFT home with a genesis in {home}"
            if installed != genesis or not (home / "config.toml").is_file():
                return f"{v}'s CometBFT home {home} belongs to another chain"
        return None

    def init_committee(self) -> None:
        """``gentorrent verifier init`` for each verifier (a fresh home: whatever chain was there
        is dropped), then one genesis of :attr:`chain_id` from their keys, installed in each
        (``verifier genesis --install``)."""
        procs = []
        for v in self.verifiers:  # in parallel: each is a Python start-up plus `cometbft init`
            shutil.rmtree(self.root / v, ignore_errors=True)
            p2p, rpc = self.verifier_ports[v]
            procs.append((v, subprocess.Popen(
                cli("verifier", "init", "--data-dir", str(self.root / v), "--p2p", f"{self.host(v)}:{p2p}", "--rpc",
                    f"{self.host(v)}:{rpc}", "--timeout-commit", self.timeout_commit, "--log-level", "warning"),
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)))
        for v, proc in procs:
            _, err = proc.communicate()
            if proc.returncode != 0:
                raise LocalNetError(f"{v}: verifier init failed: {err.decode(errors='replace').strip()[-500:]}")
        done = subprocess.run(cli("verifier", "genesis", "--chain-id", self.chain_id, "--out", str(self.genesis_file),
                                  "--local-network", *self.genesis_audit_args(), "--install",
                                  *[str(self.root / v) for v in self.verifiers]),
                              capture_output=True)
        if done.returncode != 0:
            raise LocalNetError(f"verifier genesis failed: {done.stderr.decode(errors='replace').strip()[-500:]}")
        self.after_genesis()

    def genesis_audit_args(self) -> list[str]:
        """``verifier genesis``'s audit flags for this network (none without audits)."""
        return ["--audits", "--epoch-blocks", str(self.epoch_blocks), "--challenges-per-node",
                str(self.challenges_per_node), "--reply-window", str(self.reply_window)] if self.audits else []

    def rpc_address(self, verifier: str) -> str:
        """``verifier``'s CometBFT RPC address (loopback)."""
        return f"{self.host(verifier)}:{self.verifier_ports[verifier][1]}"

    def rpc(self, verifier: str, method: str, params: dict[str, str] | None = None, timeout: float = 2.0) -> Any:
        """One CometBFT RPC call to ``verifier`` (:func:`overlay.directory.rpc.call_sync`); the result."""
        return call_sync(self.rpc_address(verifier), method, params, timeout=timeout)

    def query(self, verifier: str, path: str, timeout: float = 2.0) -> Answer:
        """``abci_query path`` on ``verifier`` (:func:`overlay.directory.rpc.query_sync`), whatever its code."""
        return query_sync(self.rpc_address(verifier), path, timeout=timeout)

    def serves_lists(self, verifier: str) -> bool:
        """Whether ``verifier`` answers its RPC and serves a signed user list (code 0)."""
        try:
            return self.query(verifier, "/lists/users").code == 0
        except (OSError, RpcError, ValueError, trio.TooSlowError):
            return False

    def launch_committee(self, *, resume: bool = False) -> None:
        """Init the verifiers (unless ``resume``: their homes hold the chain already, see
        :meth:`committee_state`) and spawn them (nodes may be spawned right after: they wait for
        the committee to answer, :data:`overlay.directory.registration.START_WAIT_S`)."""
        if not resume:
            self.init_committee()
        for v in self.verifiers:
            self.spawn(v)

    def wait_committee(self, timeout: float = 60.0, on_progress: Callable[[int], None] | None = None) -> None:
        """Wait until every verifier serves signed lists; ``on_progress(n)`` hears how many do so far."""
        deadline = self.clock.monotonic() + timeout
        pending = set(self.verifiers)
        while pending:
            for v in sorted(pending):
                if self.procs[v].poll() is not None:
                    raise LocalNetError(f"{v} exited with status {self.procs[v].returncode}; see "
                                        f"{self.root / (v + '.log')} and {self.root / v / 'cometbft.log'}")
            pending = {v for v in pending if not self.serves_lists(v)}
            if on_progress is not None:
                on_progress(len(self.verifiers) - len(pending))
            if pending and self.clock.monotonic() > deadline:
                raise LocalNetError(f"the committee did not serve signed lists within {timeout}s: {sorted(pending)}")
            if pending:
                time.sleep(0.1)

    def start_committee(self, timeout: float = 60.0, on_progress: Callable[[int], None] | None = None) -> None:
        """Init, start every verifier, and wait until each serves signed lists."""
        self.launch_committee()
        self.wait_committee(timeout, on_progress)

    def height(self) -> int:
        """The committee's latest block height, from the first verifier that answers (0: none)."""
        for v in self.verifiers:
            try:
                res: Any = self.rpc(v, "status")
                return int(res["sync_info"]["latest_block_height"])
            except (OSError, RpcError, ValueError, KeyError, TypeError, trio.TooSlowError):
                continue
        return 0

    def validator_keys(self) -> list[str]:
        """The committee's validator keys (base64, from its genesis)."""
        doc = json.loads(self.genesis_file.read_text())
        return [v["pub_key"]["value"] for v in doc["validators"]]

    def command(self, name: str) -> list[str]:
        if name in self.verifiers:
            audit = ["--audit", "--audit-model", self.model, "--audit-listen",
                     f"{self.host(name)}:{self.ports[name + '.audit']}",
                     "--audit-committee", self.committee_addresses] if self.audits else []
            return cli("verifier", "--data-dir", str(self.root / name), *audit)
        e = self.entries[name]
        common = ["--data-dir", str(self.root / name), "--listen", e.address, *self.registry_args(name)]
        if name in self.models:
            bench = [*self.bench_args]
            if self.engine == "echo" and self.echo_delay:
                bench += ["--echo-delay", str(self.echo_delay)]
            head = [sys.executable, "-m", "model_node.bench.node", *bench] if bench else cli("model-node")
            return [*head, "--engine", self.engine, "--model", self.model, *self.model_args, *common]
        return cli("user", "relay", "--ping-interval", str(self.ping_interval), *common)

    def spawn(self, name: str) -> None:
        log = open(self.root / f"{name}.log", "wb")
        self.procs[name] = subprocess.Popen(self.command(name), stdout=log, stderr=log, start_new_session=True,
                                            env=self.env_for(name))
        log.close()

    def start(self, names: list[str] | None = None, timeout: float = 60.0) -> None:
        names = names if names is not None else self.relays + self.models
        for n in names:
            self.spawn(n)
        self.wait_ready(names, timeout)
        if self.verifiers:
            self.wait_listed(names, timeout)

    def listed(self) -> set[bytes]:
        """Node ids the committee holds now (its committed state, via one verifier's ``/nodes``)."""
        import msgpack

        for v in self.verifiers:
            try:
                answer = self.query(v, "/nodes")
                if answer.code:
                    continue
                return {rec[0] for rec in msgpack.unpackb(answer.value)}
            except (OSError, RpcError, ValueError, KeyError, TypeError, trio.TooSlowError):
                continue
        return set()

    def wait_listed(self, names: list[str], timeout: float) -> None:
        """Wait until the committee lists every node of ``names``, then for the nodes' next list
        refresh (:data:`overlay.directory.membership.WARMUP_INTERVAL_S` while they are young), so that each
        knows the others."""
        from overlay.directory.membership import WARMUP_INTERVAL_S

        want = {self.entries[n].node_id for n in names}
        deadline = self.clock.monotonic() + timeout
        while not want <= self.listed():
            if self.clock.monotonic() > deadline:
                raise LocalNetError(f"the committee does not list every started node after {timeout}s")
            time.sleep(0.1)
        time.sleep(2 * WARMUP_INTERVAL_S + 0.5)

    def still_starting(self, names: set[str]) -> set[str]:
        """Those of ``names`` that have not printed READY yet; :class:`LocalNetError` if one exited."""
        pending = set()
        for n in sorted(names):
            p = self.procs[n]
            if p.poll() is not None:
                raise LocalNetError(f"{n} exited with status {p.returncode}; see {self.root / (n + '.log')}")
            if b"READY " not in (self.root / f"{n}.log").read_bytes():
                pending.add(n)
        return pending

    def wait_ready(self, names: list[str], timeout: float) -> None:
        deadline = self.clock.monotonic() + timeout
        pending = set(names)
        while pending:
            pending = self.still_starting(pending)
            if pending and self.clock.monotonic() > deadline:
                raise LocalNetError(f"not ready after {timeout}s: {sorted(pending)}")
            if pending:
                time.sleep(0.05)

    def kill(self, name: str) -> None:
        """Stop a node abruptly (SIGKILL): its peers see their connections drop."""
        p = self.procs.pop(name)
        p.kill()
        p.wait()

    def stop(self) -> None:
        """Stop the nodes (SIGTERM: they leave the committee's lists), then the verifiers."""
        nodes = [p for n, p in self.procs.items() if n not in self.verifiers]
        verifiers = [p for n, p in self.procs.items() if n in self.verifiers]
        for group, grace in ((nodes, 10.0 if verifiers else 5.0), (verifiers, 20.0)):
            for p in group:
                if p.poll() is None:
                    p.terminate()
            deadline = self.clock.monotonic() + grace
            for p in group:
                try:
                    p.wait(timeout=max(0.1, deadline - self.clock.monotonic()))
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.procs.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
