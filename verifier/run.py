"""``gentorrent verifier``: serve the ABCI application, start CometBFT on it, and supervise it.

Order: load the persisted state, listen on the ABCI address, then start ``cometbft start`` with
``--proxy_app`` pointing at it (CometBFT connects, calls Info, replays what we lack). CometBFT's
output goes to ``DATA_DIR/cometbft.log``. On SIGINT/SIGTERM CometBFT gets SIGTERM (SIGKILL after
:data:`STOP_GRACE_S`) before the ABCI server closes, so it never sees its application vanish
mid-block. If CometBFT exits on its own, :class:`CometExited` carries its status and log tail.

With audits, the book of users' transcripts (:mod:`verifier.audit.transcripts`) is kept in
``DATA_DIR/audit-transcripts.msgpack`` (:data:`BOOK_FILE`): taken back at start (a file that does
not load stops the verifier, :class:`BookFileError`), written every :data:`BOOK_SAVE_S` while it
changes (:func:`book_keeper`), at once before the audit loop's transcript scores go out (so that a
restart never scores or hands out again what the chain took), and once more when the verifier stops.

With quotas (the genesis has ``app_state.quota``: :mod:`verifier.quota`), the issuer's counts and
spent tokens are kept in ``DATA_DIR/quota_state.bin`` (:data:`QUOTA_FILE`) the same way: taken
back at start (:func:`load_issuer`; a file that does not load stops the verifier,
:class:`QuotaFileError`), written every :data:`QUOTA_SAVE_S` while they change
(:func:`keep_issuer`) and once more when the verifier stops.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path

import trio

from overlay.directory.quota import QuotaError, QuotaParams
from overlay.wire.crypto import SigningKey
from overlay.wire.identity import write_private
from verifier.abci import server
from verifier.abci_app import CommitteeAbciApp, StateStore
from verifier.audit.loop import AuditSettings, run_audits
from verifier.audit.pool import load_pool
from verifier.audit.transcripts import MAX_BOOK_BYTES, BookError, TranscriptBook
from verifier.cometbft import LOG_FILE, SOCKET_FILE, CometError, find_cometbft, get_toml, home_of, read_validator_key
from verifier.prober import run_prober
from verifier.quota import MAX_STATE_BYTES, Issuer, QuotaStateError, quota_seed

log = logging.getLogger("gentorrent.verifier")

STOP_GRACE_S = 15.0
LOG_TAIL_LINES = 25
MAX_UNIX_PATH = 100  # sun_path holds 108 bytes on Linux, 104 on macOS
BOOK_FILE = "audit-transcripts.msgpack"
# The book is written whole (every open commitment and revealed transcript, up to MAX_DONORS x
# MAX_COMMITS of them) and fsynced, so not at every commitment or reveal: those come with users'
# requests, and a write each would cost the whole book each time (and stall the ABCI queries,
# which change the book in this thread). A crash loses at most this many seconds of changes, and
# what that costs is bounded: decision 0015, "Done since".
BOOK_SAVE_S = 5.0
QUOTA_FILE = "quota_state.bin"
# The issuer's state is written whole, so not at every issue or redeem. A crash loses at most the
# last QUOTA_SAVE_S seconds of changes: the users who got tokens in them may get that many again
# from this issuer in the same epoch, and the tokens spent in them may be spent once more here (each
# at most once more per crash, and only while it still redeems: its epoch and the grace after).
QUOTA_SAVE_S = 5.0


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


class BookFileError(BookError):
    """The saved book of users' transcripts cannot be used; the message names the file and how to
    recover. The verifier does not start on it."""


def load_book(data_dir: Path) -> TranscriptBook:
    """The book saved in ``data_dir`` (:data:`BOOK_FILE`), or an empty one where there is none.
    :class:`BookFileError` for a file that cannot be read or does not load: starting with an empty
    book instead would silently forget the commitments the verifier took (decision 0015)."""
    path = data_dir / BOOK_FILE
    raw = _read_saved(path, MAX_BOOK_BYTES, lambda why: BookFileError(_unusable(path, why)))
    if raw is None:
        return TranscriptBook()
    try:
        return TranscriptBook.from_bytes(raw)
    except BookError as exc:
        raise BookFileError(_unusable(path, exc.reason)) from None


def _read_saved(path: Path, most: int, unusable: Callable[[str], Exception]) -> bytes | None:
    """A saved state's bytes; None where there is no file; ``unusable(why)`` raised for a file over
    ``most`` bytes or one that cannot be read."""
    try:
        size = path.stat().st_size
        if size > most:
            raise unusable(f"{size} bytes, over the {most} a saved state may take")
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise unusable(f"it cannot be read: {exc}") from None


def _unusable(path: Path, why: str) -> str:
    return (f"{path}: the book of users' transcripts does not load ({why}). The verifier does not start on it: "
            "an empty book in its place would forget the donors' commitments it took. Restore a good copy, or "
            f"move it aside (mv {path} {path}.bad) to start with an empty book: the reveals of those "
            "commitments are then refused as unknown, counting nothing and voiding nothing")


def save_book(data_dir: Path, book: TranscriptBook) -> None:
    """Write ``book`` to ``data_dir`` (:data:`BOOK_FILE`, mode 0600) atomically: a temporary file
    fsynced, then renamed over the old one, so a failed or interrupted write leaves the old file
    whole. Raises :class:`OSError` or :class:`~verifier.audit.transcripts.BookError` (too large)."""
    write_private(data_dir / BOOK_FILE, book.to_bytes())


class Keeper:
    """The writer of one saved state (the book, the issuer's state) at ``path``: :meth:`save` writes
    it at once, :meth:`keep` every ``every`` seconds, each only if ``revision()`` changed since the
    last write. Writes take turns, and each makes its bytes (``to_bytes()``, in the thread that
    changes the state) when its turn comes, so a later write never puts older bytes on disk; they
    are written (``write``: atomically, mode 0600) in a worker thread. ``what`` names the state in
    the log."""

    def __init__(self, path: Path, revision: Callable[[], int], to_bytes: Callable[[], bytes], what: str, *,
                 write: Callable[[Path, bytes], None] = write_private) -> None:
        self.path, self.revision, self.to_bytes, self.what, self.write = path, revision, to_bytes, what, write
        self._saved = revision()
        self._turn = trio.Lock()

    async def save(self) -> bool:
        """Write the state if it changed since the last write. True once the file holds it as it
        was when this write's turn came; False when the write failed (logged; the next tries again)."""
        async with self._turn:
            now = self.revision()
            if now == self._saved:
                return True
            try:
                raw = self.to_bytes()
                await trio.to_thread.run_sync(self.write, self.path, raw)
            except (OSError, BookError) as exc:
                log.error("cannot write %s to %s: %s", self.what, self.path, exc)
                return False
            self._saved = now
            return True

    async def keep(self, every: float) -> None:
        """:meth:`save` every ``every`` seconds (never returns)."""
        while True:
            await trio.sleep(every)
            await self.save()


def _save_at_exit(path: Path, to_bytes: Callable[[], bytes], what: str) -> None:
    try:
        write_private(path, to_bytes())
    except (OSError, BookError) as exc:
        log.error("cannot write %s to %s at exit: %s", what, path, exc)


BOOK_WHAT = "the book of users' transcripts"
QUOTA_WHAT = "the quota issuer's state"


def book_keeper(data_dir: Path, book: TranscriptBook, *,
                write: Callable[[Path, bytes], None] = write_private) -> Keeper:
    """The :class:`Keeper` of ``book`` in ``data_dir`` (:data:`BOOK_FILE`)."""
    return Keeper(data_dir / BOOK_FILE, book.revision, book.to_bytes, BOOK_WHAT, write=write)


class QuotaFileError(Exception):
    """The genesis's quota section or the issuer's saved state cannot be used; the message names the
    file and how to recover. The verifier does not start on it."""


def genesis_quota(home: Path) -> tuple[str, QuotaParams | None, int]:
    """The genesis's chain id, its ``app_state.quota`` (None: no section, quotas off) and how many
    validators it names. :class:`QuotaFileError` for a genesis that does not read or a section
    that does not parse."""
    path = home / "config" / "genesis.json"
    try:
        genesis = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise QuotaFileError(f"{path}: cannot read the genesis ({exc})") from None
    genesis = genesis if isinstance(genesis, dict) else {}
    app_state, chain_id, validators = genesis.get("app_state"), genesis.get("chain_id"), genesis.get("validators")
    section = app_state.get("quota") if isinstance(app_state, dict) else None
    n = len(validators) if isinstance(validators, list) else 0
    if section is None:
        return str(chain_id or ""), None, n
    if not isinstance(chain_id, str) or not chain_id:
        raise QuotaFileError(f"{path}: a genesis with a quota section needs a chain_id")
    try:
        return chain_id, QuotaParams.from_json(section), n
    except (QuotaError, TypeError) as exc:
        raise QuotaFileError(f"{path}: app_state.quota: {exc}") from None


def load_issuer(data_dir: Path, key: SigningKey, chain_id: str, params: QuotaParams) -> Issuer:
    """The issuer of validator ``key`` with the counts and spent tokens saved in ``data_dir``
    (:data:`QUOTA_FILE`), or with none where there is no file. :class:`QuotaFileError` for a file
    that cannot be read or does not load: starting without it would give every user a second
    budget this epoch and take spent tokens again."""
    path = data_dir / QUOTA_FILE
    seed = quota_seed(key.private_bytes())
    raw = _read_saved(path, MAX_STATE_BYTES, lambda why: QuotaFileError(_quota_unusable(path, why)))
    if raw is None:
        return Issuer(seed, key, chain_id, params)
    try:
        return Issuer.restore(raw, seed, key, chain_id, params)
    except QuotaStateError as exc:
        raise QuotaFileError(_quota_unusable(path, exc.reason)) from None


def _quota_unusable(path: Path, why: str) -> str:
    return (f"{path}: the quota issuer's saved state does not load ({why}). The verifier does not start on it: "
            "starting empty would give users a second budget and take spent tokens again in the current epoch. "
            f"Restore a good copy, or move it aside (mv {path} {path}.bad) and start the verifier once the current "
            "quota epoch has ended and its grace_s passed: then nothing of the lost state counts any more")


async def keep_issuer(data_dir: Path, issuer: Issuer, every: float = QUOTA_SAVE_S, *,
                      write: Callable[[Path, bytes], None] = write_private) -> None:
    """Write ``issuer``'s snapshot every ``every`` seconds while it changes (:class:`Keeper`)."""
    await Keeper(data_dir / QUOTA_FILE, issuer.revision, issuer.snapshot, QUOTA_WHAT, write=write).keep(every)


async def _keep_local(data_dir: Path, book: Keeper | None, issuer: Issuer | None) -> None:
    """Write this verifier's own state (the book, the issuer's) while it changes; never returns."""
    async with trio.open_nursery() as nursery:
        if book is not None:
            nursery.start_soon(book.keep, BOOK_SAVE_S)
        if issuer is not None:
            nursery.start_soon(keep_issuer, data_dir, issuer)
        await trio.sleep_forever()


def _save_local_at_exit(data_dir: Path, book: TranscriptBook | None, issuer: Issuer | None) -> None:
    if issuer is not None:
        _save_at_exit(data_dir / QUOTA_FILE, issuer.snapshot, QUOTA_WHAT)
    if book is not None:
        _save_at_exit(data_dir / BOOK_FILE, book.to_bytes, BOOK_WHAT)


def make_issuer(data_dir: Path, home: Path, key: SigningKey) -> Issuer | None:
    """This verifier's quota issuer per the genesis (None: no quota section), its state loaded;
    logs the quota settings either way."""
    chain_id, params, validators = genesis_quota(home)
    if params is None:
        log.info("quotas off: the genesis has no app_state.quota section; /quota queries answer QUOTA_OFF")
        return None
    issuer = load_issuer(data_dir, key, chain_id, params)
    log.info("quotas on: epochs of %d s, %d tokens per user, model and epoch from each issuer (%d at most at once), "
             "%d issuers per token, %d s of grace; this verifier issues as %s (state in %s)", params.epoch_s,
             params.tokens, params.burst, params.issuers, params.grace_s, key.public_bytes.hex()[:16],
             data_dir / QUOTA_FILE)
    if params.issuers > validators:
        log.warning("the genesis asks for %d issuers per token but names %d validators: no token can be made",
                    params.issuers, validators)
    return issuer


def default_abci_address(data_dir: Path) -> str:
    path = data_dir.resolve() / SOCKET_FILE
    if len(str(path).encode()) > MAX_UNIX_PATH:
        raise CometError(f"the ABCI socket path {path} is too long for a unix socket; "
                         "use a shorter --data-dir or --abci tcp://127.0.0.1:PORT")
    return f"unix://{path}"


async def run_verifier(data_dir: str | os.PathLike[str], *, abci: str | None = None, binary: str | None = None,
                       extra_args: Sequence[str] = (), handle_signals: bool = True,
                       audit: AuditSettings | None = None,
                       audit_loop: Callable[..., Awaitable[None]] = run_audits,
                       task_status: trio.TaskStatus[server.ListenAddress] = trio.TASK_STATUS_IGNORED) -> None:
    """Run one verifier until a signal (returns) or CometBFT's own exit (raises :class:`CometExited`).
    With ``audit``, the audit loop (:func:`verifier.audit.loop.run_audits`) runs beside it once CometBFT
    has started; its failures are logged, never fatal. It shares the donation pool
    (``DATA_DIR/audit-pool.msgpack``, :mod:`verifier.audit.pool`) with the ABCI application, which
    takes users' donated prompts through ``abci_query /audit/donate``, and the book of users'
    transcripts (:mod:`verifier.audit.transcripts`, ``DATA_DIR/audit-transcripts.msgpack``:
    :func:`load_book`, :func:`book_keeper`), which it fills through ``/audit/transcript_commit`` and
    ``/audit/transcript_reveal`` and the audit loop closes. :class:`BookFileError` before anything
    starts if that file does not load. ``audit_loop`` runs the audits (tests give their own).
    With a quota section in the genesis, the quota issuer (:func:`make_issuer`; its state in
    ``DATA_DIR/quota_state.bin``) answers the ``/quota/*`` queries; :class:`QuotaFileError` before
    anything starts if that section or file cannot be used."""
    d = Path(data_dir)
    home = home_of(d)
    if not (home / "config" / "genesis.json").exists():
        raise CometError(f"{home} has no CometBFT home; run `gentorrent verifier init --data-dir {d}` and "
                         "`gentorrent verifier genesis ...` first")
    store = StateStore(d)
    core = store.load()
    log.info("application state at height %d (app hash %s)", core.height, core.app_hash.hex()[:16] or "none")
    key = read_validator_key(d)
    pool = load_pool(d) if audit is not None else None  # prompts users donate (verifier/audit/pool.py)
    book = load_book(d) if audit is not None else None  # users' transcripts (verifier/audit/transcripts.py)
    keeper = None if book is None else book_keeper(d, book)  # its writer: the file holds it as loaded
    issuer = make_issuer(d, home, key)  # anonymous usage quotas (verifier/quota.py)
    exe = binary or find_cometbft()
    app = CommitteeAbciApp(core, store, key, pool=pool, transcripts=book, issuer=issuer,
                           version1_commits=audit is not None and audit.version1_commits)
    stopping = False
    # The signal receiver opens before CometBFT starts: a SIGTERM in between would kill this
    # process by default and leave CometBFT (in its own session) running.
    async with contextlib.AsyncExitStack() as stack:
        # registered first, so it runs last: after the ABCI server and the audit loop, which change them, stop
        stack.callback(_save_local_at_exit, d, book, issuer)
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
        if audit is not None:  # the loop writes the book before its transcript scores go out (keeper.save)
            nursery.start_soon(audit_loop, d, audit, key.private_bytes(), pool, book,
                               None if keeper is None else keeper.save)
        nursery.start_soon(_keep_local, d, keeper, issuer)
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
