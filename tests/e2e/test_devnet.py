"""``gentorrent devnet``: its health table in plain words, and a clean stop on Ctrl-C or SIGTERM
that leaves no node process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from overlay.messages import PeerSeen, PeerStatus
from overlay.tools.devnet import health


def status(*rtts: int) -> PeerStatus:
    return PeerStatus(b"n" * 32, 3.0, tuple(PeerSeen(bytes([i]) * 32, "127.0.0.1:1", r, 0.0) for i, r in
                                             enumerate(rtts)))


def test_health_says_plainly_what_is_healthy():
    ok, text = health("user", (0.004, status(-1, -1, -1)))
    assert ok and text.startswith("healthy") and "0 of 3 peers answered so far" in text and "normal" in text
    ok, text = health("user", (0.004, status(1500, 2500, -1)))
    assert ok and "2 of 3 peers answered" in text and "2.5 ms" in text
    ok, text = health("model", (0.002, status()))
    assert ok and "serves the model" in text
    ok, text = health("user", "connection refused")
    assert not ok and text.startswith("DOWN") and "log" in text


def children_of(pid: int) -> set[int]:
    out = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.add(int(entry.name))
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_stopping_devnet_leaves_no_process_behind(tmp_path, sig):
    proc = subprocess.Popen([sys.executable, "-m", "overlay.cli", "devnet", "--engine", "echo", "--relays", "5",
                             "--models", "1", "--no-demo", "--data-dir", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        lines = []
        deadline = time.monotonic() + 90
        for line in proc.stdout:
            lines.append(line)
            if "press Ctrl-C" in line or time.monotonic() > deadline:
                break
        text = "".join(lines)
        assert "press Ctrl-C" in text, text + proc.stderr.read()
        assert "all 6 nodes healthy, registered with the committee" in text and text.count("healthy: relays for users") == 5
        nodes = children_of(proc.pid)
        assert len(nodes) == 6 + 4  # the nodes and the committee's 4 verifiers
        proc.send_signal(sig)
        rest, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0
        assert "stopped 6 nodes and 4 verifiers" in rest
        assert [p for p in nodes if alive(p)] == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for p in [p for p in locals().get("nodes", ()) if alive(p)]:
            os.kill(p, signal.SIGKILL)  # leave nothing behind even when the test fails
