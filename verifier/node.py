"""``gentorrent verifier``: serve the ABCI application, start CometBFT on it, and supervise it.

Order: load the persisted state, listen on the ABCI address, then start ``cometbft start`` with
``--proxy_app`` pointing at it (CometBFT connects, calls Info, replays what we lack). CometBFT's
output goes to ``DATA_DIR/cometbft.log``. On SIGINT/SIGTERM CometBFT gets SIGTERM (SIGKILL after
:data:`STOP_GRACE_S`) before the ABCI server closes, so it never sees its application vanish
mid-block. If CometBFT exits on its own, :class:`CometExited` carries its status and log tail.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import trio

from verifier.abci import server
from verifier.abci_app import CommitteeAbciApp, StateStore
from verifier.audit.auditor import AuditSettings, run_audits
from verifier.audit.pool import load_pool
from verifier.audit.transcripts import TranscriptBook
from verifier.cometbft import LOG_FILE, SOCKET_FILE, CometError, find_cometbft, get_toml, home_of, read_validator_key
from verifier.prober import run_prober

log = logging.getLogger("gentorrent.verifier")

STOP_GRACE_S = 15.0
LOG_TAIL_LINES = 25
MAX_UNIX_PATH = 100  # sun_path holds 108 bytes on Linux, 104 on macOS


class CometExited(Exception):
    """CometBFT stopped without being asked to; the message holds its exit status and log tail."""


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def default_abci_address(data_dir: Path) -> str:
    path = data_dir.resolve() / SOCKET_FILE
    if len(str(path).encode()) > MAX_UNIX_PATH:
        raise CometError(f"the ABCI socket path {path} is too long for a unix socket; "
                         "use a shorter --data-dir or --abci tcp://127.0.0.1:PORT")
    return f"unix://{path}"


async def run_verifier(data_dir: str | os.PathLike[str], *, abci: str | None = None, binary: str | None = None,
                       extra_args: Sequence[str] = (), handle_signals: bool = True,
                       audit: AuditSettings | None = None,
                       task_status: trio.TaskStatus[server.ListenAddress] = trio.TASK_STATUS_IGNORED) -> None:
    """Run one verifier until a signal (returns) or CometBFT's own exit (raises :class:`CometExited`).
    With ``audit``, the audit loop (:func:`verifier.audit.auditor.run_audits`) runs beside it once CometBFT
    has started; its failures are logged, never fatal. It shares the donation pool
    (``DATA_DIR/audit-pool.msgpack``, :mod:`verifier.audit.pool`) with the ABCI application, which
    takes users' donated prompts through ``abci_query /audit/donate``, and the book of users'
    transcripts (:mod:`verifier.audit.transcripts`, in memory), which it fills through
    ``/audit/transcript_commit`` and ``/audit/transcript_reveal`` and the audit loop closes."""
    d = Path(data_dir)
    home = home_of(d)
    if not (home / "config" / "genesis.json").exists():
        raise CometError(f"{home} has no CometBFT home; run `gentorrent verifier init --data-dir {d}` and "
                         "`gentorrent verifier genesis ...` first")
    exe = binary or find_cometbft()
    store = StateStore(d)
    core = store.load()
    log.info("application state at height %d (app hash %s)", core.height, core.app_hash.hex()[:16] or "none")
    key = read_validator_key(d)
    pool = load_pool(d) if audit is not None else None  # prompts users donate (verifier/audit/pool.py)
    book = TranscriptBook() if audit is not None else None  # users' transcripts (verifier/audit/transcripts.py)
    app = CommitteeAbciApp(core, store, key, pool=pool, transcripts=book)
    stopping = False
    # The signal receiver opens before CometBFT starts: a SIGTERM in between would kill this
    # process by default and leave CometBFT (in its own session) running.
    async with contextlib.AsyncExitStack() as stack:
        signals = (stack.enter_context(trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM))
                   if handle_signals else None)
        nursery = await stack.enter_async_context(trio.open_nursery())
        where: server.ListenAddress = await nursery.start(server.serve, app, abci or default_abci_address(d))
        cmd = [exe, "start", "--home", str(home), "--proxy_app", where.url(), *extra_args]
        logf = (d / LOG_FILE).open("ab")
        try:
            proc = await trio.lowlevel.open_process(cmd, stdout=logf, stderr=subprocess.STDOUT,
                                                    start_new_session=True)
        except OSError as exc:
            logf.close()
            raise CometError(f"could not start {exe}: {exc}") from None
        log.info("CometBFT started (pid %d), log in %s", proc.pid, d / LOG_FILE)

        async def stop_on_signal(signals: AsyncIterator[int]) -> None:
            nonlocal stopping
            async for sig in signals:
                log.info("signal %d: stopping CometBFT", sig)
                stopping = True
                proc.terminate()
                return

        if signals is not None:
            nursery.start_soon(stop_on_signal, signals)
        # address probes (decision 0014): idle on a chain whose genesis turns them off
        try:
            rpc = get_toml((home / "config" / "config.toml").read_text(), "rpc", "laddr").removeprefix("tcp://")
        except (OSError, CometError) as exc:
            log.warning("no address probes: this verifier's RPC address is unknown (%s)", exc)
        else:
            nursery.start_soon(run_prober, core, key, rpc)
        if audit is not None:
            nursery.start_soon(run_audits, d, audit, key.private_bytes(), pool, book)
        task_status.started(where)
        try:
            code = await proc.wait()
        finally:
            with trio.CancelScope(shield=True):
                if proc.returncode is None:
                    stopping = True
                    proc.terminate()
                    with trio.move_on_after(STOP_GRACE_S):
                        await proc.wait()
                    if proc.returncode is None:
                        log.warning("CometBFT ignored SIGTERM for %.0f s; killing it", STOP_GRACE_S)
                        proc.kill()
                        await proc.wait()
                logf.close()
            nursery.cancel_scope.cancel()
    if not stopping:
        raise CometExited(f"CometBFT exited with status {code}; the last lines of {d / LOG_FILE}:\n"
                          f"{log_tail(d / LOG_FILE)}")
    log.info("CometBFT stopped (status %s)", code)
