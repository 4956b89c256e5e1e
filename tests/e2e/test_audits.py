"""Audits end to end (issue 14): 4 real ``gentorrent verifier --audit`` processes (real CometBFT,
short epochs), relays, and two real llama.cpp model nodes serving ``smollm2-135m-instruct``: one
honest (the default Q4_1 GGUF), one dishonest (the same GGUF re-quantized to Q2_K by llama.cpp's
quantizer, registered under the default model's id: :func:`simulations.degraded.dishonest_model`).

Checks: epochs complete and every verifier reports the same app hash and reputation table; the
dishonest node falls below the 0.4 trust line within 5 audited epochs and leaves the signed model
list users receive; the honest node stays trusted. Then a Byzantine leader: ``verifier-3`` runs in
this process (``InProcessVerifier``) so that a test-only hook (``AuditSettings.tamper``, never a
flag) can alter its reports before it signs them; it holds 40 of the 70 votes so that it leads
most epochs (more than 2/3 still needs it and one other verifier). Once it skips a node in its
report, the epoch it leads aborts. Every wait is bounded; nothing asserts on time.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgpack
import pytest
import trio

from overlay.committee import CommitteeClient, load_genesis
from overlay.tools.localnet import LocalNet, LocalNetError, free_ports

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
EPOCH_BLOCKS = 60  # at ~0.6-1 s a block: a leader's 6 challenges, its scoring and 3 rescorings fit
PER_NODE = 3
TRUST_LINE = 400_000
EPOCHS = 5
BYZANTINE = "verifier-3"
BYZANTINE_POWER = 40
TOLERANCE = 20_000  # verifier.audit.TOLERANCE: an attested score agrees within this of the leader's


class InProcessVerifier:
    """``gentorrent verifier --audit`` run in this process (a thread with its own trio loop), with the
    handle of a :class:`subprocess.Popen` that :class:`LocalNet` uses (poll, terminate, kill, wait)."""

    def __init__(self, data_dir: Path, settings: Any, log_path: Path) -> None:
        self.returncode: int | None = None
        self.data_dir, self.settings, self.log_path = data_dir, settings, log_path
        self._token: Any = None
        self._scope: trio.CancelScope | None = None
        self._ready = threading.Event()
        self.thread = threading.Thread(target=self._main, name="in-process verifier", daemon=True)
        self.thread.start()
        self._ready.wait(60)

    def _main(self) -> None:
        from verifier.node import run_verifier

        handler = logging.FileHandler(self.log_path)
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        logger = logging.getLogger("gentorrent")
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)

        async def main() -> None:
            self._token = trio.lowlevel.current_trio_token()
            with trio.CancelScope() as scope:
                self._scope = scope
                self._ready.set()
                await run_verifier(self.data_dir, audit=self.settings, handle_signals=False)

        try:
            trio.run(main)
            self.returncode = 0
        except BaseException:  # noqa: BLE001 - reported as an exit status, like a process
            logger.exception("the in-process verifier failed")
            self.returncode = 1
        finally:
            self._ready.set()
            logger.removeHandler(handler)
            handler.close()

    def poll(self) -> int | None:
        return self.returncode

    def terminate(self) -> None:
        if self.returncode is None and self._scope is not None:
            trio.from_thread.run_sync(self._scope.cancel, trio_token=self._token)

    kill = terminate

    def wait(self, timeout: float | None = None) -> int | None:
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise subprocess.TimeoutExpired(BYZANTINE, timeout or 0)
        return self.returncode


class AuditNet(LocalNet):
    """A :class:`LocalNet` whose verifiers audit (``--audit``; genesis with an ``audit`` section),
    whose ``model-1`` serves the dishonest model under the honest model's id, and whose
    ``verifier-3`` runs in this process with a tamper hook switched by :attr:`tampering`."""

    def __init__(self, root: Path, dishonest: Path) -> None:
        super().__init__(root, 10, models=2, model=MODEL, engine="llama.cpp", committee=4,
                         model_args=("--no-forwarding", "--threads", "1", "--slots", "2"))
        self.dishonest = dishonest
        self.audit_ports = dict(zip(self.verifiers, free_ports(len(self.verifiers)), strict=True))
        self.tampering = False

    def tamper(self, report: Any) -> Any:
        """While :attr:`tampering`: leave the report's first entry out (a skipped node)."""
        return replace(report, entries=report.entries[1:]) if self.tampering else report

    def spawn(self, name: str) -> None:
        if name != BYZANTINE:
            return super().spawn(name)
        from verifier.auditor import AuditSettings

        settings = AuditSettings(model=MODEL, listen=f"127.0.0.1:{self.audit_ports[name]}", tamper=self.tamper)
        self.procs[name] = InProcessVerifier(self.root / name, settings, self.root / f"{name}.log")  # type: ignore[assignment]
        return None

    def init_committee(self) -> None:
        """Homes and genesis as usual, then the genesis gains ``app_state.audit`` (audits of
        :data:`MODEL` in epochs of :data:`EPOCH_BLOCKS`) and verifier-3 more power, in every copy."""
        from verifier.audit import AuditParams
        from verifier.cometbft import home_of, read_validator_key

        super().init_committee()
        key = base64.b64encode(read_validator_key(self.root / BYZANTINE).public_bytes).decode()
        genesis = json.loads(self.genesis_file.read_text())
        genesis["app_state"] = {"audit": AuditParams(MODEL, EPOCH_BLOCKS, PER_NODE).to_json()}
        for v in genesis["validators"]:
            if v["pub_key"]["value"] == key:
                v["power"] = str(BYZANTINE_POWER)
        text = json.dumps(genesis, indent=2) + "\n"
        self.genesis_file.write_text(text)
        for v in self.verifiers:
            (home_of(self.root / v) / "config" / "genesis.json").write_text(text)

    def command(self, name: str) -> list[str]:
        cmd = super().command(name)
        if name in self.verifiers:
            return [*cmd, "--audit", "--audit-model", MODEL, "--audit-listen", f"127.0.0.1:{self.audit_ports[name]}",
                    "--log-level", "info"]
        if name == "model-1":
            i = cmd.index("--model")
            cmd[i + 1] = str(self.dishonest)
        return cmd

    def query(self, verifier: str, path: str) -> tuple[Any, int]:
        res: Any = self.rpc(verifier, f'abci_query?path="{path}"', timeout=10)
        resp = res["response"]
        if int(resp.get("code", 0)):
            raise LocalNetError(f"{verifier} {path}: code {resp.get('code')}: {resp.get('log')}")
        return msgpack.unpackb(base64.b64decode(resp.get("value") or "")), int(resp.get("height", 0))


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuditNet]:
    from simulations.degraded import dishonest_model

    root = tmp_path_factory.mktemp("audit-net")
    with AuditNet(root, dishonest_model()) as n:
        n.start_committee(timeout=180)
        n.start(timeout=300)
        yield n


def _same_state(net: AuditNet, tries: int = 40) -> tuple[bytes, list[Any]]:
    """Every verifier's ``/info`` app hash and ``/reputation`` table at one height (retried until
    the four answer at the same height)."""
    for _ in range(tries):
        answers = [(net.query(v, "/info"), net.query(v, "/reputation")) for v in net.verifiers]
        heights = {info[1] for info, rep in answers} | {rep[1] for info, rep in answers}
        if len(heights) == 1:
            hashes = {bytes(info[0][1]) for info, _ in answers}
            tables = [rep[0] for _, rep in answers]
            assert len(hashes) == 1, f"verifiers disagree on the app hash at height {heights}: {hashes}"
            assert all(t == tables[0] for t in tables), tables
            return hashes.pop(), tables[0]
        time.sleep(0.2)
    raise AssertionError("the verifiers never answered at one height")


def _model_list(net: AuditNet) -> set[bytes]:
    chain, vals = load_genesis(str(net.genesis_file))
    client = CommitteeClient(net.committee_addresses.split(","), chain, vals)
    return {e.node_id for e in trio.run(client.refresh).models(MODEL)}


def test_audits_demote_the_dishonest_node_and_keep_the_honest_one(net: AuditNet) -> None:
    honest, dishonest = (net.entries[m].node_id for m in ("model-0", "model-1"))
    assert {honest, dishonest} <= _model_list(net)  # never audited: R(0) = 0.5, listed
    applied: set[int] = set()
    history: list[dict[bytes, int]] = []
    deadline = time.monotonic() + (EPOCHS + 3) * EPOCH_BLOCKS * 3.0
    fell_at = None
    last_epoch = -1
    reported: dict[int, float] = {}  # epoch -> when its report was first seen committed
    report_to_apply: list[float] = []
    while len(applied) < EPOCHS:
        assert time.monotonic() < deadline, f"only {len(applied)} epochs applied: {history}; see the verifier logs in {net.root}"
        view, _ = net.query("verifier-0", "/audit")
        if view["report_hash"] is not None:
            reported.setdefault(view["epoch"], time.monotonic())
        for o in view["outcomes"]:
            if o[1] == "applied" and o[0] not in applied:
                applied.add(o[0])
                if o[0] in reported:
                    report_to_apply.append(time.monotonic() - reported[o[0]])
        if view["epoch"] != last_epoch:
            last_epoch = view["epoch"]
            _, table = _same_state(net)
            rep = {bytes(r[0]): r[1] for r in table}
            history.append(rep)
            assert rep.get(honest, 500_000) >= TRUST_LINE, f"the honest node fell below the line: {history}"
            if fell_at is None and rep.get(dishonest, 500_000) < TRUST_LINE:
                fell_at = len(applied)
        time.sleep(0.25)
    assert fell_at is not None and fell_at <= EPOCHS, f"the dishonest node stayed trusted: {history}"
    _same_state(net)
    listed = _model_list(net)
    assert honest in listed and dishonest not in listed
    # Verifiers scoring the same reply on one machine: the spread against the leader's score.
    spreads = [int(m) for v in net.verifiers
               for m in re.findall(r"largest difference (\d+) millionths", (net.root / f"{v}.log").read_text())]
    assert spreads and max(spreads) <= TOLERANCE, spreads
    (net.root / "audit-figures.json").write_text(json.dumps({
        "report_to_applied_s": sorted(report_to_apply), "score_spread_millionths": spreads,
        "reputation_history": [{k.hex()[:8]: v for k, v in h.items()} for h in history]}, indent=1))
    print(f"\naudit figures in {net.root / 'audit-figures.json'}: report -> applied {sorted(report_to_apply)} s; "
          f"score spread max {max(spreads)} millionths over {len(spreads)} attestations")


def test_a_byzantine_leader_that_skips_a_node_has_its_epoch_aborted(net: AuditNet) -> None:
    from verifier.cometbft import read_validator_key

    byzantine = read_validator_key(net.root / BYZANTINE).public_bytes
    net.tampering = True
    led: set[int] = set()  # epochs the Byzantine verifier leads, from now on
    start = net.query("verifier-0", "/audit")[0]["epoch"]
    deadline = time.monotonic() + 8 * EPOCH_BLOCKS * 3.0
    while True:
        assert time.monotonic() < deadline, f"no epoch led by {BYZANTINE} settled; see {net.root / (BYZANTINE + '.log')}"
        view, _ = net.query("verifier-0", "/audit")
        if view["epoch"] > start and view["leader"] == byzantine and view["report_hash"] is not None:
            led.add(view["epoch"])
        settled = {o[0]: o for o in view["outcomes"]}
        done = [settled[e] for e in sorted(led) if e in settled]
        if done:
            epoch, status, reason, _ = done[0]
            assert status == "aborted", done[0]
            # the reason names the leader and the fault: its first entry is missing (a skipped node)
            assert reason.startswith(f"leader {byzantine.hex()[:16]}: ") and "entr" in reason, done[0]
            break
        time.sleep(0.5)
    net.tampering = False
    _same_state(net)
