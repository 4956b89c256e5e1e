"""The model node's served store on disk (decision 0037, step 5): what :mod:`model_node.served`
keeps survives a restart, so a framer's withheld reply served before the node restarted is still
handed in after the release.

Files ``served-<start ms>.log`` in one directory (``DATA/served``, mode 0700, files 0600), one
segment per :data:`SEGMENT_MS` of keeping: entries are only appended, and a whole segment is
deleted once every entry in it is past the retention, or, oldest first, while the files hold more
than ``max_bytes``; no file is ever rewritten, so a write costs one append however full the
store is. A segment is a run of frames::

    length (4 bytes, big-endian) | BLAKE2b-128 of the entry | entry

and an entry is the msgpack array ``[1, kept_ms, size, digest, body]``, ``body`` the reply as a
donor's reveal would carry it (:func:`overlay.directory.transcripts.encode_body`, kind 1, its
nonce zero: the node learns the real one only from the release).

Loading (:meth:`ServedLog.load`) reads the segments in order and every frame in them strictly; at
the first frame that does not check (a write cut short by a crash, a damaged disk) it stops
reading that segment, truncates it there and counts the entries lost (``torn``); a file it cannot
read is counted (``unreadable``) and left alone. A write that fails (a full disk) is counted and
logged once; the entry stays kept in memory. Entries are written without fsync: a process restart
loses none, a machine crash may lose the last seconds'.

On disk, the prompts and replies this node served are kept for the retention (45 minutes, up to a
segment more): ``--no-reveal-withheld`` keeps none.
"""

from __future__ import annotations

import logging
import os
import re
from collections import Counter
from pathlib import Path

import msgpack

from model_node.served import MAX_BYTES, Kept
from overlay.directory import transcripts as wire
from overlay.wire import crypto

log = logging.getLogger("gentorrent.model_node")

SEGMENT_MS = 15 * 60 * 1000
ENTRY_VERSION = 1
MAX_ENTRY_BYTES = wire.MAX_REVEAL_BYTES + 64  # a body, and its time, size and digest
_HEAD = 4 + 16
_NAME = re.compile(r"served-(\d{16})\.log")
_ZERO_NONCE = bytes(wire.NONCE_LEN)

__all__ = ["ENTRY_VERSION", "SEGMENT_MS", "LogError", "ServedLog", "decode_entry", "encode_entry", "frame"]


class LogError(ValueError):
    """An entry or frame that does not decode (the reason)."""


def encode_entry(k: Kept) -> bytes:
    body = wire.Revealed(k.node_id, _ZERO_NONCE, k.model, k.messages, k.params, k.request_id, k.served_by, k.chunks,
                         k.signature, k.signed_at_ms)
    out: bytes = msgpack.packb([ENTRY_VERSION, k.kept_ms, k.size, k.digest, wire.encode_body(body)],
                               use_bin_type=True)
    return out


def decode_entry(raw: bytes) -> Kept:
    """An entry of :func:`encode_entry`, decoded strictly; :class:`LogError` otherwise."""
    if len(raw) > MAX_ENTRY_BYTES:
        raise LogError(f"an entry of {len(raw)} bytes; at most {MAX_ENTRY_BYTES}")
    try:
        v = msgpack.unpackb(raw, raw=False, strict_map_key=True, max_bin_len=MAX_ENTRY_BYTES,
                            max_str_len=0, max_array_len=5, max_map_len=0, max_ext_len=0)
    except (ValueError, TypeError, RecursionError, OverflowError, msgpack.UnpackException) as exc:
        raise LogError(f"not msgpack ({type(exc).__name__})") from None
    if type(v) is not list or len(v) != 5 or v[0] != ENTRY_VERSION or type(v[0]) is not int:
        raise LogError(f"not an entry of version {ENTRY_VERSION}: [1, kept_ms, size, digest, body]")
    _, kept_ms, size, digest, body_raw = v
    if type(kept_ms) is not int or type(size) is not int or not 0 <= kept_ms < 2**63 or not 0 < size < 2**63:
        raise LogError("kept_ms and size are non-negative ints")
    if type(digest) is not bytes or len(digest) != 32 or type(body_raw) is not bytes:
        raise LogError("the digest is 32 bytes and the body bytes")
    try:
        body = wire.decode_body(body_raw)
    except wire.TranscriptError as exc:
        raise LogError(f"the body: {exc}") from None
    if not isinstance(body, wire.Revealed) or body.secret or body.nonce != _ZERO_NONCE:
        raise LogError("the body is a transcript of kind 1 with a zero nonce")
    return Kept(body.node_id, digest, body.model, body.messages, body.params, body.request_id, body.served_by,
                body.chunks, body.signature, body.signed_at_ms, size, kept_ms)


def frame(entry: bytes) -> bytes:
    return len(entry).to_bytes(4, "big") + crypto.blake2b(entry, size=16) + entry


class ServedLog:
    """The segments in ``directory`` (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike[str], *, segment_ms: int = SEGMENT_MS,
                 max_bytes: int = 2 * MAX_BYTES) -> None:
        if segment_ms <= 0 or max_bytes <= 0:
            raise ValueError("segments last above 0 ms and the files hold above 0 bytes")
        self.directory = Path(directory)
        self.segment_ms, self.max_bytes = segment_ms, max_bytes
        self.counts: Counter[str] = Counter()  # "written", "write errors", "torn", "unreadable", "deleted"
        self._current: tuple[int, Path] | None = None

    def _segments(self) -> list[tuple[int, Path]]:
        try:
            names = os.listdir(self.directory)
        except OSError:  # none yet, or not a directory: load() said so at start
            return []
        return sorted((int(m.group(1)), self.directory / n) for n in names if (m := _NAME.fullmatch(n)))

    def load(self, now_ms: int, retention_ms: int) -> list[Kept]:
        """Every entry kept less than ``retention_ms`` before ``now_ms``, oldest first; segments past
        the retention are deleted. :class:`OSError` when the directory cannot be made."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.prune(now_ms, retention_ms)
        out: list[Kept] = []
        for _, path in self._segments():
            out.extend(k for k in self._read(path) if now_ms - k.kept_ms < retention_ms)
        out.sort(key=lambda k: k.kept_ms)
        return out

    def _read(self, path: Path) -> list[Kept]:
        try:
            data = path.read_bytes()
        except OSError as exc:
            self.counts["unreadable"] += 1
            log.warning("served store: cannot read %s (%s); its entries are not loaded", path, exc)
            return []
        out, at = [], 0
        while at < len(data):
            try:
                n = int.from_bytes(data[at:at + 4], "big")
                if len(data) - at < _HEAD or n > MAX_ENTRY_BYTES or len(data) - at - _HEAD < n:
                    raise LogError("a frame cut short")
                entry = data[at + _HEAD:at + _HEAD + n]
                if crypto.blake2b(entry, size=16) != data[at + 4:at + _HEAD]:
                    raise LogError("a frame whose checksum does not match")
                out.append(decode_entry(entry))
            except LogError as exc:
                self.counts["torn"] += 1
                log.warning("served store: a bad frame at byte %d of %s (%s); the rest of it is dropped", at, path,
                            exc)
                self._truncate(path, at)
                break
            at += _HEAD + n
        return out

    def _truncate(self, path: Path, at: int) -> None:
        try:
            with path.open("r+b") as f:
                f.truncate(at)
        except OSError as exc:
            log.warning("served store: cannot truncate %s (%s)", path, exc)

    def append(self, k: Kept) -> None:
        """Write ``k`` at the end of the current segment (a new one each ``segment_ms``). A failed
        write is counted and logged once; it never raises."""
        try:
            if self._current is None or k.kept_ms - self._current[0] >= self.segment_ms:
                self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
                start = max(k.kept_ms, self._current[0] + 1 if self._current else 0)
                self._current = (start, self.directory / f"served-{start:016d}.log")
            fd = os.open(self._current[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                os.write(fd, frame(encode_entry(k)))
            finally:
                os.close(fd)
            self.counts["written"] += 1
        except OSError as exc:
            self.counts["write errors"] += 1
            if self.counts["write errors"] == 1:
                log.warning("served store: cannot write to %s (%s); replies are kept in memory only until it can",
                            self.directory, exc)

    def prune(self, now_ms: int, retention_ms: int) -> None:
        """Delete the segments whose every entry is past ``retention_ms`` (a segment holds entries
        kept within ``segment_ms`` of its start), then the oldest but the current while the files
        hold more than ``max_bytes``."""
        segments = self._segments()
        current = self._current[1] if self._current else None
        sizes = {}
        for start, path in segments:
            if start + self.segment_ms + retention_ms <= now_ms and path != current:
                self._delete(path)
            else:
                try:
                    sizes[path] = path.stat().st_size
                except OSError:
                    sizes[path] = 0
        total = sum(sizes.values())
        for path, size in sizes.items():  # oldest first
            if total <= self.max_bytes:
                break
            if path != current:
                self._delete(path)
                total -= size

    def _delete(self, path: Path) -> None:
        try:
            path.unlink()
            self.counts["deleted"] += 1
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("served store: cannot delete %s (%s)", path, exc)
