"""Audits end to end (issue 14): 4 real ``gentorrent verifier --audit`` processes (real CometBFT,
short epochs), relays, and two real llama.cpp model nodes serving ``smollm2-135m-instruct``: one
honest (the default Q4_1 GGUF), one dishonest (the same GGUF re-quantized to Q2_K by llama.cpp's
quantizer, registered under the default model's id: :func:`simulations.degraded.dishonest_model`).

Checks: epochs complete and every verifier reports the same app hash and reputation table; the
dishonest node falls below the 0.4 trust line within 5 audited epochs and leaves the signed model
list users receive; the honest node stays trusted. Every wait is bounded; nothing asserts on time.
"""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import trio

from overlay.committee import CommitteeClient, load_genesis
from overlay.tools.localnet import LocalNet, LocalNetError, cli, free_ports

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
EPOCH_BLOCKS = 60  # at ~0.6-1 s a block: a leader's 6 challenges, its scoring and 3 rescorings fit
PER_NODE = 3
TRUST_LINE = 400_000
EPOCHS = 5
TOLERANCE = 20_000  # verifier.audit.TOLERANCE: an attested score agrees within this of the leader's


class AuditNet(LocalNet):
    """A :class:`LocalNet` whose verifiers audit (``--audit``; genesis with an ``audit`` section)
    and whose ``model-1`` serves the dishonest model under the honest model's id."""

    def __init__(self, root: Path, dishonest: Path) -> None:
        super().__init__(root, 10, models=2, model=MODEL, engine="llama.cpp", committee=4,
                         model_args=("--no-forwarding", "--threads", "1", "--slots", "2"))
        self.dishonest = dishonest
        self.audit_ports = dict(zip(self.verifiers, free_ports(len(self.verifiers)), strict=True))

    def init_committee(self) -> None:
        super().init_committee()  # homes and a first genesis; now the one with audits
        import subprocess

        done = subprocess.run(cli("verifier", "genesis", "--chain-id", "gentorrent-devnet", "--out",
                                  str(self.genesis_file), "--install", "--audit-model", MODEL,
                                  "--epoch-blocks", str(EPOCH_BLOCKS), "--challenges-per-node", str(PER_NODE),
                                  *[str(self.root / v) for v in self.verifiers]), capture_output=True)
        if done.returncode != 0:
            raise LocalNetError(f"verifier genesis failed: {done.stderr.decode(errors='replace')[-500:]}")

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
