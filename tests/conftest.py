"""Shared test helpers: relay processes, the CLI, documented bench figures (the in-memory
network, raw frame I/O and waiting helpers are in :mod:`overlay.testing`).

Every wait here is bounded; nothing asserts on wall-clock time.
"""

from __future__ import annotations

import os
import re

# Each xdist worker starts local networks from its own slice of the listener ports
# (gentorrent.tools.localnet.PortPool), so two workers never hand out the same port at once;
# set before anything imports localnet, whose pool reads it once.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER.startswith("gw") and _WORKER[2:].isdigit():
    _I = int(_WORKER[2:])
    _N = max(_I + 1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    os.environ.setdefault("GENTORRENT_PORT_SLICE", f"{_I}/{_N}")
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from overlay import testing

REPO = Path(__file__).resolve().parent.parent
# Tests stop the processes they start with Ctrl-C (SIGINT), as a user would. A test run started in
# the background by a non-interactive shell (`make test &`, `nohup ... &`) has SIGINT ignored, and an
# ignored signal stays ignored across exec: every node started from it would then ignore Ctrl-C
# (Python installs its KeyboardInterrupt handler only where SIGINT is not ignored). Restore the
# default here, so children start with it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

PROCESS_START_TIMEOUT = 30.0  # seconds; generous for a loaded 2-core machine
PROCESS_STOP_TIMEOUT = 10.0


# --------------------------------------------------------------------------- processes


def gentorrent_cmd(*args: str) -> list[str]:
    """The ``gentorrent`` command line run by this interpreter (no PATH lookup)."""
    return [sys.executable, "-m", "gentorrent.cli", *args]


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120.0,
            cwd: str | os.PathLike[str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``gentorrent ARGS`` to completion (bounded by ``timeout``)."""
    return subprocess.run(
        gentorrent_cmd(*args), capture_output=True, text=True, timeout=timeout,
        env=env, cwd=cwd if cwd is not None else REPO,
    )


def quick_bench(name: str, run: Callable[[bool], tuple[dict[str, Any], dict[str, float]]],
                timeout: float = 600.0) -> dict[str, Any]:
    """One ``gentorrent bench NAME --quick --json`` run's JSON: through the CLI when the entry
    point is installed, else ``run(True)`` printed in-process the same way (an editable install
    registers new entry points on reinstall)."""
    import io
    import json
    from contextlib import redirect_stdout
    from importlib.metadata import entry_points

    if name in {ep.name for ep in entry_points(group="gentorrent.benches")}:
        done = run_cli("bench", name, "--quick", "--json", timeout=timeout)
        assert done.returncode == 0, done.stderr[-2000:]
        return dict(json.loads(done.stdout))
    from gentorrent.bench.command import emit

    params, figures = run(True)
    buf = io.StringIO()
    with redirect_stdout(buf):
        emit(name, params, figures, as_json=True)
    return dict(json.loads(buf.getvalue()))


def read_line(proc: subprocess.Popen[bytes], timeout: float) -> str:
    """One stdout line of ``proc``, waiting at most ``timeout`` seconds ("" on EOF)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    buf = b""
    deadline = time.monotonic() + timeout
    while b"\n" not in buf:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"no line from {proc.args!r} within {timeout}s (got {buf!r})")
        ready, _, _ = select.select([fd], [], [], remaining)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            buf += chunk
    return buf.decode(errors="replace")


@dataclass
class RelayProcess:
    """A running ``gentorrent user relay``: its id and address from its READY line."""

    proc: subprocess.Popen[bytes]
    node_id: bytes
    address: str
    data_dir: Path
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> int:
        """Ctrl-C the relay; kill it if it does not stop in time. Returns its status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=PROCESS_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return self.proc.returncode


def start_relay(data_dir: Path, *extra: str, listen: str | None = "127.0.0.1:0", log_path: Path | None = None,
                env: dict[str, str] | None = None) -> RelayProcess:
    """Start ``gentorrent user relay`` (on ``--listen listen`` unless ``None``) and wait
    for its READY line. Without ``--peers``/``--registry`` it gets an empty peer list."""
    log_path = log_path or data_dir.parent / (data_dir.name + ".log")
    args = ["user", "relay", "--data-dir", str(data_dir), *extra]
    if listen is not None:
        args += ["--listen", listen]
    if "--peers" not in extra and "--registry" not in extra:
        # A relay needs a node directory; an empty, unsigned peer list will do.
        empty = data_dir.parent / (data_dir.name + "-peers.json")
        empty.write_text('{"peers": []}')
        args += ["--peers", str(empty)]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(gentorrent_cmd(*args), stdout=subprocess.PIPE, stderr=log,
                                cwd=REPO, env=env)
    try:
        line = read_line(proc, PROCESS_START_TIMEOUT).split()
    except BaseException:
        proc.kill()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
        raise
    if len(line) != 3 or line[0] != "READY":
        proc.kill()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
        raise AssertionError(f"relay did not start: stdout {line!r}; log:\n{log_path.read_text()}")
    return RelayProcess(proc, bytes.fromhex(line[1]), line[2], data_dir, log_path)


@pytest.fixture
def relay_factory(tmp_path: Path) -> Iterator[Callable[..., RelayProcess]]:
    """``relay_factory(name="relay", *extra_flags, listen=..., env=...)`` starts relays
    (see :func:`start_relay`); all are stopped at teardown."""
    started: list[RelayProcess] = []

    def factory(name: str = "relay", *extra: str, **kw: Any) -> RelayProcess:
        r = start_relay(tmp_path / name, *extra, **kw)
        started.append(r)
        return r

    yield factory
    for r in started:
        r.stop()


@pytest.fixture
def relay(relay_factory: Callable[..., RelayProcess]) -> RelayProcess:
    """One running relay process on loopback."""
    return relay_factory()


def documented_figures(section: str) -> set[str]:
    """The figure keys docs/benchmarks.md lists in the tables under ``## section`` (a row's
    ``a{1,2}b`` expands to ``a1b`` and ``a2b``); a table's header row (the one above its ``|---``
    line) is no figure, even when its first cell is in backticks."""
    text = (REPO / "docs" / "benchmarks.md").read_text()
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    keys: set[str] = set()
    for m in re.finditer(r"^\| `([^`]+)` \|.*(?:\n(?!\|[-:])|\Z)", body, re.M):
        pending = [m.group(1)]
        while any("{" in k for k in pending):
            k = next(k for k in pending if "{" in k)
            pending.remove(k)
            head, rest = k.split("{", 1)
            options, tail = rest.split("}", 1)
            pending += [head + o + tail for o in options.split(",")]
        keys.update(pending)
    return keys


class Helpers:
    """The helpers above, handed to tests as the ``helpers`` fixture (test modules do
    not import ``conftest``: another directory may add its own)."""

    REPO = REPO
    RawPeer = testing.RawPeer
    RelayProcess = RelayProcess
    gentorrent_cmd = staticmethod(gentorrent_cmd)
    run_cli = staticmethod(run_cli)
    read_line = staticmethod(read_line)
    start_relay = staticmethod(start_relay)
    wait_until = staticmethod(testing.wait_until)
    documented_figures = staticmethod(documented_figures)


@pytest.fixture
def helpers() -> type[Helpers]:
    return Helpers
