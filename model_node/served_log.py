"""The model node's served store on disk (decision 0037, step 5): what :mod:`model_node.served`
keeps survives a restart, so a framer's withheld reply served before the node restarted is still
handed in after the release.

Files ``served-<start ms>.log`` in one directory (``DATA/served``, mode 0700, files 0600), one
segment per :data:`SEGMENT_MS` of keeping: entries are only appended, and a whole segment is
deleted once every entry in it is past the retention, or once the store no longer holds any entry
of it (:meth:`ServedLog.prune`'s ``before``: the store drops its oldest past its byte caps); no
file is ever rewritten, so a write costs one append however full the store is. The store keeps
in memory only where each entry lies (:data:`Where`) and what finds it; the entry itself is read
back (:meth:`ServedLog.read`) only when a released commitment names it. A segment is a run of
frames::

    length (4 bytes, big-endian) | BLAKE2b-128 of the entry | entry

and an entry is the msgpack array ``[2, kept_ms, size, digest, node id, body]``, ``body`` the
reply as a donor's reveal would carry it (:func:`overlay.directory.transcripts.encode_body`, kind
1, its nonce zero: the node learns the real one only from the release), compressed by zlib (level
1: decision 0038, a prompt of long tokens takes 2 to 4 bytes a token instead of up to 32) and
inflated to at most :data:`~overlay.directory.transcripts.MAX_REVEAL_BYTES` when read back.
Version 1's ``[1, kept_ms, size, digest, body]`` (the body plain) is still read.

Loading (:meth:`ServedLog.load`) reads the segments in order and every frame in them: its
checksum, the entry's head and its node id (the body is checked in full when read back); at the
first frame that does not check (a write cut short by a crash, a damaged disk) it stops reading
that segment, truncates it there and counts the entries lost (``torn``); a file it cannot read is
counted (``unreadable``) and left alone. A write that fails (a full disk) is counted and logged
once; the entry stays kept in memory. Entries are written without fsync: a process restart loses
none, a machine crash may lose the last seconds'.

On disk, the prompts and replies this node served are kept for the retention (45 minutes, up to a
segment more): ``--no-reveal-withheld`` keeps none.
"""

from __future__ import annotations

import logging
import os
import re
import zlib
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import msgpack

from model_node.served import Kept, Where
from overlay.directory import transcripts as wire
from overlay.wire import crypto
from overlay.wire.identity import NODE_ID_LEN

log = logging.getLogger("gentorrent.model_node")

SEGMENT_MS = 15 * 60 * 1000
ENTRY_VERSION = 2  # 1: the body not compressed, no node id in the head (still read)
_ZLIB_LEVEL = 1
MAX_ENTRY_BYTES = wire.MAX_REVEAL_BYTES + 1024  # a body (compressed: zlib adds under 0.1 %) and its head
_HEAD = 4 + 16
_NAME = re.compile(r"served-(\d{16})\.log")
_ZERO_NONCE = bytes(wire.NONCE_LEN)

__all__ = ["ENTRY_VERSION", "SEGMENT_MS", "LogError", "ServedLog", "Stored", "decode_entry", "encode_entry", "frame"]


class LogError(ValueError):
    """An entry or frame that does not decode (the reason)."""


class Stored(NamedTuple):
    """What loading tells the store of one entry on disk: enough to find it, and where it lies."""

    node_id: bytes
    digest: bytes
    kept_ms: int
    where: Where


def encode_entry(k: Kept) -> bytes:
    """``k`` as an entry; :class:`LogError` where its body is over
    :data:`~overlay.directory.transcripts.MAX_REVEAL_BYTES`: a reply so long could never be handed
    in (a node reveal that large goes to no verifier), so it is not kept."""
    body = wire.encode_body(wire.Revealed(k.node_id, _ZERO_NONCE, k.model, k.messages, k.params, k.request_id,
                                          k.served_by, k.chunks, k.signature, k.signed_at_ms))
    if len(body) > wire.MAX_REVEAL_BYTES:
        raise LogError(f"a body of {len(body)} bytes could never be handed in (at most {wire.MAX_REVEAL_BYTES})")
    out: bytes = msgpack.packb([ENTRY_VERSION, k.kept_ms, k.size, k.digest, k.node_id,
                                zlib.compress(body, _ZLIB_LEVEL)], use_bin_type=True)
    return out


_UNPACK_ERRORS = (ValueError, TypeError, RecursionError, OverflowError, msgpack.UnpackException)


def _head(raw: bytes) -> tuple[int, int, int, bytes, bytes, bytes]:
    """An entry's version, ``kept_ms``, ``size``, ``digest``, node id and body as written (compressed in
    version 2), decoded strictly; the body is not decoded (a version 1 body only as far as its node id)."""
    if len(raw) > MAX_ENTRY_BYTES:
        raise LogError(f"an entry of {len(raw)} bytes; at most {MAX_ENTRY_BYTES}")
    try:
        v = msgpack.unpackb(raw, raw=False, strict_map_key=True, max_bin_len=MAX_ENTRY_BYTES,
                            max_str_len=0, max_array_len=6, max_map_len=0, max_ext_len=0)
    except _UNPACK_ERRORS as exc:
        raise LogError(f"not msgpack ({type(exc).__name__})") from None
    if type(v) is not list or not v or type(v[0]) is not int or (v[0], len(v)) not in ((1, 5), (2, 6)):
        raise LogError("not an entry: [2, kept_ms, size, digest, node id, compressed body] (or version 1's "
                       "[1, kept_ms, size, digest, body])")
    kept_ms, size, digest, body_raw = v[1], v[2], v[3], v[-1]
    if type(kept_ms) is not int or type(size) is not int or not 0 <= kept_ms < 2**63 or not 0 < size < 2**63:
        raise LogError("kept_ms and size are non-negative ints")
    if type(digest) is not bytes or len(digest) != 32 or type(body_raw) is not bytes:
        raise LogError("the digest is 32 bytes and the body bytes")
    node = v[4] if v[0] == 2 else _node_of(body_raw)
    if type(node) is not bytes or len(node) != NODE_ID_LEN:
        raise LogError("the node id is not 20 bytes")
    return v[0], kept_ms, size, digest, node, body_raw


def _node_of(body_raw: bytes) -> bytes:
    """The node id a version 1 body names (its second field), read without checking the rest of it."""
    try:
        node: bytes = msgpack.unpackb(body_raw, raw=False, max_bin_len=MAX_ENTRY_BYTES, max_str_len=MAX_ENTRY_BYTES,
                                      max_array_len=wire.TRANSCRIPT_MAX_CHUNKS, max_map_len=0, max_ext_len=0)[1]
    except (*_UNPACK_ERRORS, IndexError, KeyError) as exc:
        raise LogError(f"the body is not an array with a node id ({type(exc).__name__})") from None
    return node


def _inflate(z: bytes) -> bytes:
    """A version 2 body, decompressed to at most :data:`~overlay.directory.transcripts.MAX_REVEAL_BYTES`."""
    d = zlib.decompressobj()
    try:
        out = d.decompress(z, wire.MAX_REVEAL_BYTES)
    except zlib.error as exc:
        raise LogError(f"the body does not decompress ({exc})") from None
    if d.unconsumed_tail or not d.eof or d.unused_data:
        raise LogError(f"the body is not one stream of at most {wire.MAX_REVEAL_BYTES} bytes")
    return out


def decode_entry(raw: bytes) -> Kept:
    """An entry of :func:`encode_entry` (or of version 1, before bodies were compressed), decoded
    strictly; :class:`LogError` otherwise."""
    version, kept_ms, size, digest, node, body_raw = _head(raw)
    if version == 2:
        body_raw = _inflate(body_raw)
    try:
        body = wire.decode_body(body_raw)
    except wire.TranscriptError as exc:
        raise LogError(f"the body: {exc}") from None
    if not isinstance(body, wire.Revealed) or body.secret or body.nonce != _ZERO_NONCE or body.node_id != node:
        raise LogError("the body is a transcript of kind 1 with a zero nonce, of the node its entry names")
    return Kept(body.node_id, digest, body.model, body.messages, body.params, body.request_id, body.served_by,
                body.chunks, body.signature, body.signed_at_ms, size, kept_ms)


def frame(entry: bytes) -> bytes:
    return len(entry).to_bytes(4, "big") + crypto.blake2b(entry, size=16) + entry


class ServedLog:
    """The segments in ``directory`` (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike[str], *, segment_ms: int = SEGMENT_MS) -> None:
        if segment_ms <= 0:
            raise ValueError("segments last above 0 ms")
        self.directory = Path(directory)
        self.segment_ms = segment_ms
        self.counts: Counter[str] = Counter()  # "written", "write errors", "torn", "unreadable", "deleted"
        self._current: tuple[int, Path] | None = None

    def _segments(self) -> list[tuple[int, Path]]:
        try:
            names = os.listdir(self.directory)
        except OSError:  # none yet, or not a directory: load() said so at start
            return []
        return sorted((int(m.group(1)), self.directory / n) for n in names if (m := _NAME.fullmatch(n)))

    def load(self, now_ms: int, retention_ms: int) -> list[Stored]:
        """Every entry kept less than ``retention_ms`` before ``now_ms``, oldest first; segments past
        the retention are deleted. :class:`OSError` when the directory cannot be made."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.prune(now_ms, retention_ms)
        out: list[Stored] = []
        for _, path in self._segments():
            out.extend(k for k in self._read(path) if now_ms - k.kept_ms < retention_ms)
        out.sort(key=lambda k: k.kept_ms)
        return out

    def _read(self, path: Path) -> list[Stored]:
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
                _, kept_ms, _, digest, node, _ = _head(entry)
                out.append(Stored(node, digest, kept_ms, (path, at, _HEAD + n)))
            except LogError as exc:
                self.counts["torn"] += 1
                log.warning("served store: a bad frame at byte %d of %s (%s); the rest of it is dropped", at, path,
                            exc)
                self._truncate(path, at)
                break
            at += _HEAD + n
        return out

    def read(self, where: Where) -> Kept:
        """The entry framed at ``where`` (its segment, offset and frame length), checked in full:
        :class:`LogError` for a frame or entry that does not check, :class:`OSError` for a file
        that cannot be read (deleted, or damaged since)."""
        path, at, n = where
        with open(path, "rb") as f:
            f.seek(at)
            data = f.read(n)
        if len(data) != n or n < _HEAD or int.from_bytes(data[:4], "big") != n - _HEAD:
            raise LogError("a frame cut short")
        entry = data[_HEAD:]
        if crypto.blake2b(entry, size=16) != data[4:_HEAD]:
            raise LogError("a frame whose checksum does not match")
        return decode_entry(entry)

    def _truncate(self, path: Path, at: int) -> None:
        try:
            with path.open("r+b") as f:
                f.truncate(at)
        except OSError as exc:
            log.warning("served store: cannot truncate %s (%s)", path, exc)

    def append(self, k: Kept) -> Where | None:
        """Write ``k`` at the end of the current segment (a new one each ``segment_ms``): where it
        lies, or ``None`` when the write failed (counted, and logged once). :class:`LogError`
        (nothing written) for an entry too large ever to be handed in (:func:`encode_entry`)."""
        data = frame(encode_entry(k))
        try:
            if self._current is None or k.kept_ms - self._current[0] >= self.segment_ms:
                self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
                start = max(k.kept_ms, self._current[0] + 1 if self._current else 0)
                self._current = (start, self.directory / f"served-{start:016d}.log")
            path = self._current[1]
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                at = os.lseek(fd, 0, os.SEEK_END)  # one writer: where this append lands
                if os.write(fd, data) != len(data):
                    raise OSError("a short write")
            finally:
                os.close(fd)
            self.counts["written"] += 1
            return path, at, len(data)
        except OSError as exc:
            self.counts["write errors"] += 1
            if self.counts["write errors"] == 1:
                log.warning("served store: cannot write to %s (%s); replies are kept in memory only until it can",
                            self.directory, exc)
            return None

    def prune(self, now_ms: int, retention_ms: int, before: Path | None = None) -> None:
        """Delete the segments whose every entry is past ``retention_ms`` (a segment holds entries
        kept within ``segment_ms`` of its start), and those older than segment ``before`` (the
        oldest the store still holds an entry of), never the current one."""
        current = self._current[1] if self._current else None
        for start, path in self._segments():
            gone = start + self.segment_ms + retention_ms <= now_ms or (before is not None and path < before)
            if gone and path != current:
                self._delete(path)

    def _delete(self, path: Path) -> None:
        try:
            path.unlink()
            self.counts["deleted"] += 1
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("served store: cannot delete %s (%s)", path, exc)
