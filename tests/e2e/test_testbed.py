"""``gentorrent testbed`` end to end, small: 12 relays, 2 echo model nodes and 4 verifiers, each
on its own loopback address behind Toxiproxy access links (delays on), one client in one region;
a model node crashes (failover), then the churn phase takes another model node out and back. The
report must show chats answered, the churn carried out and delays in force."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.slow


def test_a_small_testbed_with_delays_and_churn_answers_chats_and_writes_its_report() -> None:
    from gentorrent.tools.toxiproxy import ToxiproxyError, find_toxiproxy
    from verifier import cometbft

    try:
        find_toxiproxy()
        cometbft.find_cometbft()
    except (ToxiproxyError, cometbft.CometError) as exc:
        pytest.skip(str(exc))
    tmp_path = Path(tempfile.mkdtemp(prefix="gt-tb-"))  # short: a verifier's ABCI unix socket lives under it
    try:
        _run_and_check(tmp_path)
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def _run_and_check(tmp_path: Path) -> None:
    r = run_cli("testbed", "--data-dir", str(tmp_path), "--relays", "12", "--models", "2", "--verifiers", "4",
                "--configs", "4,3", "--client-regions", "us-east", "--requests", "2", "--path-builds", "2",
                "--churn", "16", "--relay-churn", "0", "--downtime", "6", "--quiet", timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (run,) = tmp_path.glob("run-*")
    report = json.loads((run / "report.json").read_text())
    figures, samples = report["figures"], report["samples"]
    assert figures["ttft_4_3_answered"] >= 1
    assert figures["failover_answered"] >= 1
    # the churn happened: the crash for failover, then a model node's leave or crash and its return
    kinds = [kind for _, _, kind in report["churn"]]
    assert kinds.count("join") >= 1 and len(kinds) >= 3
    # delays were in force: every timed request crossed links between distinct regions
    timed = [s for s in samples if s["config"] == "4,3" and s["ok"]]
    assert timed and all(s["floor_ms"] > 0 for s in timed)
    assert report["params"]["access_links"] == (12 + 2 + 1 + 4 * 2) * 6
    assert report["params"]["toxics_per_link"] == 6  # latency, bandwidth and loss on both streams
    assert report["params"]["loss"] == 0.001 and report["params"]["toxiproxy_version"].endswith("+gentorrent-loss")
    assert (run / "ttft_cdf.png").stat().st_size > 1000
    assert figures["registration_to_listed_p50_ms"] > 0
    assert "report:" in r.stdout
