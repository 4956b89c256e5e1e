"""The audit state on a real CometBFT committee (slow): four validators with audits on agree on
every epoch, each epoch's seed is CometBFT's own hash of the previous epoch's last block, and a
plan commit sent through the RPC in the commit window is taken by every verifier (decision 0013)."""

from __future__ import annotations

import base64
import functools
from pathlib import Path
from typing import Any

import msgpack
import pytest

from tests.conftest import run_cli
from tests.e2e.test_committee import CHAIN, COMMIT_TIMEOUT, Verifier, _free_port, wait_for
from verifier import cometbft
from verifier.audit import tx as at

pytestmark = pytest.mark.slow
E = 12


def _audit(v: Verifier) -> dict[str, Any]:
    r = v.rpc_call("abci_query", path='"/audit"')["response"]
    assert int(r.get("code", 0)) == 0, r
    out: dict[str, Any] = msgpack.unpackb(base64.b64decode(r["value"]), raw=False, strict_map_key=False)
    return out


def test_four_validators_with_audits_agree_on_epochs_seeds_and_commits(tmp_path: Path) -> None:
    try:
        cometbft.find_cometbft()
    except cometbft.CometError as exc:
        pytest.skip(str(exc))
    vs = [Verifier(tmp_path / f"v{i}", _free_port(), _free_port()) for i in range(4)]
    for v in vs:
        r = run_cli("verifier", "init", "--data-dir", str(v.data_dir), "--p2p", f"127.0.0.1:{v.p2p}",
                    "--rpc", f"127.0.0.1:{v.rpc}", "--timeout-commit", "300ms")
        assert r.returncode == 0, r.stderr
    r = run_cli("verifier", "genesis", "--chain-id", CHAIN, "--out", str(tmp_path / "genesis.json"), "--install",
                "--local-network", "--audits", "--epoch-blocks", str(E), "--challenges-per-node", "1", *(str(v.data_dir) for v in vs))
    assert r.returncode == 0, r.stderr
    try:
        for v in vs:
            v.spawn()
        for v in vs:
            wait_for(f"{v.data_dir.name}'s RPC", functools.partial(lambda v: v.height() >= 1, v), 60)
        key = cometbft.read_validator_key(vs[0].data_dir)
        # Send a plan commit at the start of an epoch; under load a try may miss the 3-block window (LATE).
        for _ in range(6):
            st = wait_for("an epoch's first blocks", lambda: (lambda a: a if vs[0].height() < a["commit_until"]
                                                              else None)(_audit(vs[0])), COMMIT_TIMEOUT)
            commit = at.PlanCommit(st["epoch"], key.public_bytes, ("a-model",), at.plan_hash(b"s" * 16, []))
            res = vs[0].broadcast_commit(at.sign_tx(commit, CHAIN, key.private_bytes()))
            if int(res["check_tx"].get("code", 0)) == 0 and int(res["tx_result"].get("code", 0)) == 0:
                break
        else:
            raise AssertionError(f"no plan commit landed in its window: {res}")
        epoch = st["epoch"]

        def with_the_commit(v: Verifier) -> dict[str, Any] | None:
            a = _audit(v)
            return a if a["committed"] or a["epoch"] > epoch else None

        for v in vs:  # every verifier took the same commit
            got = wait_for(f"{v.data_dir.name} with the commit", functools.partial(with_the_commit, v), COMMIT_TIMEOUT)
            if got["epoch"] == epoch:
                assert got["committed"] == [key.public_bytes]
            assert got["declared"] == [[key.public_bytes, ["a-model"]]]
            assert got["audited_models"] == []  # one validator of four holds it: not more than 2/3
        # Two more epoch boundaries: the same state everywhere, seeds = CometBFT's block hashes.
        target = (epoch + 2) * E + 1
        for v in vs:
            wait_for(f"{v.data_dir.name} at height {target}", functools.partial(lambda v: v.height() >= target, v),
                     3 * COMMIT_TIMEOUT)
        views = [_audit(v) for v in vs]
        last = min(a["epoch"] for a in views)

        def in_the_last_epoch(v: Verifier) -> dict[str, Any] | None:
            a = _audit(v)
            return a if a["epoch"] == last else None

        if len({a["epoch"] for a in views}) > 1:
            views = [wait_for("the same epoch", functools.partial(in_the_last_epoch, v), 5) for v in vs]
        assert len({(a["epoch"], a["seed"], tuple(map(tuple, a["outcomes"]))) for a in views}) == 1
        a = views[0]
        block = vs[0].rpc_call("block", height=str(a["start_height"] - 1))
        assert a["seed"] == bytes.fromhex(block["block_id"]["hash"])
        outcomes = {o[0]: o for o in a["outcomes"]}
        assert outcomes[epoch][1] == "empty" and "0 of 4 validators reported" in outcomes[epoch][2]
    finally:
        for v in vs:
            if v.proc is not None:
                v.proc.kill()
                v.proc.wait(timeout=30)
