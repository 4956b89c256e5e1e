"""The installed ``gentorrent`` command, run as a user would: help, bench, devnet."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

#: Documented in docs/benchmarks.md ("## wire").
WIRE_FIGURES = {
    "codec_1KiB_frames_per_s", "codec_64KiB_frames_per_s",
    "tls_rtt_1KiB_mean_ms", "tls_rtt_1KiB_p50_ms", "tls_rtt_1KiB_p99_ms",
    "tls_1KiB_frames_per_s", "tls_1KiB_MB_per_s",
}


def console_script() -> str:
    exe = Path(sys.executable).parent / "gentorrent"
    if not exe.exists():
        pytest.skip("the gentorrent console script is not installed next to this interpreter")
    return str(exe)


def test_console_script_help(helpers: Any) -> None:
    out = subprocess.run([console_script(), "--help"], capture_output=True, text=True, timeout=60,
                         cwd=helpers.REPO)
    assert out.returncode == 0, out.stderr
    for command in ("user", "model-node", "verifier", "devnet", "status", "bench"):
        assert command in out.stdout


def test_bench_wire_quick_json(helpers: Any) -> None:
    out = helpers.run_cli("bench", "wire", "--json", "--quick", timeout=180)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)  # exactly one JSON object on stdout
    assert set(doc) == {"bench", "params", "figures"}
    assert doc["bench"] == "wire"
    assert isinstance(doc["params"], dict) and doc["params"]
    figures = doc["figures"]
    assert WIRE_FIGURES <= set(figures), WIRE_FIGURES - set(figures)
    for key, value in figures.items():
        assert isinstance(value, (int, float)) and not isinstance(value, bool), key
        assert math.isfinite(value) and value > 0, (key, value)


def test_devnet_comes_up_and_stops(helpers: Any, tmp_path: Path) -> None:
    out = helpers.run_cli("devnet", "--relays", "4", "--duration", "0.5", "--no-demo",
                          "--data-dir", str(tmp_path), timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [line for line in out.stdout.splitlines() if line[:3] in ("ok ", "!! ")]
    assert len(rows) == 4 + 2 and all(r.startswith("ok ") and "healthy:" in r for r in rows), out.stdout
    assert "DOWN" not in out.stdout
    assert f"all {len(rows)} nodes healthy" in out.stdout
    assert f"stopped {len(rows)} nodes" in out.stdout
    assert "Traceback" not in out.stderr
