"""``gentorrent devnet``: its health table in plain words, and a clean stop on Ctrl-C or SIGTERM
that leaves no node process behind."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from gentorrent.tools.devnet import health
from overlay.wire.messages import PeerSeen, PeerStatus


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
    proc = subprocess.Popen([sys.executable, "-m", "gentorrent.cli", "devnet", "--engine", "echo", "--relays", "5",
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
        assert proc.stderr is not None
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
            proc.communicate()  # also closes the pipes (a leaked one fails a later test as unraisable)
        for p in [p for p in locals().get("nodes", ()) if alive(p)]:
            os.kill(p, signal.SIGKILL)  # leave nothing behind even when the test fails


def devnet_until_up(tmp_path: Path, started: list[subprocess.Popen[str]], *extra: str) -> str:
    """Start devnet (echo, 12 relays, 1 model node) on ``tmp_path`` (appended to ``started``);
    its output up to 'press Ctrl-C'."""
    proc = subprocess.Popen([sys.executable, "-m", "gentorrent.cli", "devnet", "--engine", "echo", "--relays", "12",
                             "--models", "1", "--data-dir", str(tmp_path), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started.append(proc)
    assert proc.stdout is not None
    lines = []
    deadline = time.monotonic() + 180
    for line in proc.stdout:
        lines.append(line)
        if "press Ctrl-C" in line or time.monotonic() > deadline:
            break
    text = "".join(lines)
    assert "press Ctrl-C" in text, text + (proc.stderr.read() if proc.stderr else "")
    return text


def committee_height(tmp_path: Path) -> tuple[str, int]:
    """(chain id, latest height) from the running devnet's first verifier, at its recorded RPC port."""
    state = json.loads((tmp_path / "devnet" / "devnet.json").read_text())
    with urllib.request.urlopen(f"http://127.0.0.1:{state['ports']['verifier-0.rpc']}/status", timeout=5) as r:
        info = json.loads(r.read())["result"]
    return info["node_info"]["network"], int(info["sync_info"]["latest_block_height"])


def stop_with_sigint(proc: subprocess.Popen[str], seen: set[int]) -> tuple[str, list[int]]:
    """SIGINT devnet; (its remaining output, its node processes still alive afterwards)."""
    nodes = children_of(proc.pid)
    seen |= nodes
    assert len(nodes) == 13 + 4  # the nodes and the committee's 4 verifiers
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, rest
    return rest, [p for p in nodes if alive(p)]


@pytest.mark.slow
def test_a_second_start_resumes_the_same_chain_and_answers(tmp_path):
    started: list[subprocess.Popen[str]] = []
    seen: set[int] = set()
    try:
        text = devnet_until_up(tmp_path, started, "--no-demo")
        chain = re.search(r"new chain (gentorrent-devnet-[0-9a-f]{8})", text)
        assert chain is not None, text
        assert re.search(r"devnet: up in \d+\.\d s \(new chain", text), text
        network, height = committee_height(tmp_path)
        assert network == chain.group(1) and height >= 1
        rest, left = stop_with_sigint(started[0], seen)
        assert "stopped 13 nodes and 4 verifiers" in rest and left == []

        text = devnet_until_up(tmp_path, started)  # the demo chat runs this time
        assert f"resuming chain {chain.group(1)}" in text, text
        resumed = re.search(r"committee up: chain (\S+) at height (\d+) \(resumed\)", text)
        assert resumed is not None and resumed.group(1) == chain.group(1) and int(resumed.group(2)) >= height, text
        assert committee_height(tmp_path)[0] == chain.group(1)
        assert "the chat answered" in text and re.search(r"devnet: up in \d+\.\d s \(resumed chain", text), text
        rest, left = stop_with_sigint(started[1], seen)
        assert "stopped 13 nodes and 4 verifiers" in rest and left == []
    finally:
        for proc in started:
            if proc.poll() is None:
                seen |= children_of(proc.pid)
                proc.kill()
                proc.communicate()  # also closes the pipes
        for p in [p for p in seen if alive(p)]:
            os.kill(p, signal.SIGKILL)  # leave nothing behind even when the test fails
