"""What a model node keeps of the replies it served (decision 0037, step 5): the store its reveal
driver (:mod:`model_node.reveals`) looks a released commitment up in.

For every request whose reply completed as it passed through this node, :class:`ServedStore`
keeps what a verifier needs to check it as a transcript (:class:`Kept`): the node the client
addressed, the request (model, messages, sampling parameters, id), the signer, every chunk's text
and token ids, the final signature and its time, and the request digest
(:func:`overlay.anon.signing.request_digest` of the request addressed to that node: what the
donor's commitment binds). That is a request addressed to this node (its own engine's reply, or a
group member's relayed back through it), and a request a member forwarded here, kept under the
member that forwarded it: a user's forwarded request is answered straight to the user's proxies,
so the member that addressed node forwarded to is the only one that sees the reply, and it hands it in
itself (a node reveal from the reply's signer, decision 0037). A donor who withheld its reveal cannot then hide a
good reply: once the verifiers release the commitment's shares, the node rebuilds the secret,
finds the request here (:meth:`ServedStore.find`, by the locator the secret carries: one lookup
and a hash per entry of that locator, decision 0038) and hands the transcript in itself.

Only a request that can be a transcript is kept: no seed, no continuation (a transcript's digest
has none), within :func:`overlay.directory.transcripts.transcript_problem`'s limits; and only a
reply that completed (a final, signed chunk) without an error chunk, one signer throughout and
within a transcript's chunk and token limits. Everything else is counted in
:attr:`ServedStore.skipped` by reason.

No clock (times are passed in). With a ``log`` (:class:`model_node.served_log.ServedLog`, what
the node runs with: ``DATA/served``) every entry kept is appended to disk and only its index stays
in memory (its node, digest and time, and where it lies: :data:`_SLOT_BYTES` an entry); it is read
back only when a released commitment names it. :meth:`ServedStore.open` loads the index of what
is still within the retention at start, so a restart loses nothing. Without one (tests), or where
a write failed, the entry stays in memory.

Bounded: at most ``max_bytes`` of memory (the index, and entries held in memory by an estimate of
their size from their strings and token counts), ``max_disk_bytes`` of files (default 4 GiB) and
``retention_ms`` old (default :data:`RETENTION_MS`: two 15-minute epochs and the release delay);
the oldest go first, counted in :attr:`ServedStore.dropped`. A flood that pushes entries out
before the retention is logged (decision 0038: a framer's withheld reply dropped before its
release cannot be handed in); the defaults hold about 1 million entries, or 250,000 whose prompts
fill a 4,096-token window.

Recording (:meth:`ServedStore.begin`, then :meth:`Recording.add` per chunk) is O(1) per chunk
besides keeping the chunk's text and ids, and never raises on what a chunk holds.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter, deque
from pathlib import Path
from typing import TYPE_CHECKING

from overlay.anon.signing import request_digest
from overlay.directory import escrow
from overlay.directory import transcripts as wire
from overlay.wire.messages import ChatMessage, ReplyChunk, Request, SamplingParams

if TYPE_CHECKING:
    from model_node.served_log import ServedLog

MAX_BYTES = 512 * 1024 * 1024  # of memory
MAX_DISK_BYTES = 4 * 1024 * 1024 * 1024  # of the log's files (decision 0038)
_SLOT_BYTES = 512  # the memory an entry on disk takes, its index: 385 to 460 measured (test_served_log.py, bench escrow)
RETENTION_MS = 45 * 60 * 1000  # two 15-minute epochs, and the release 11 minutes into the next
_ENTRY_BYTES = 512  # an entry's fixed fields and bookkeeping
_PART_BYTES = 64  # a message's or chunk's own overhead
_TOKEN_BYTES = 8
_MAX_IDS = 4096  # node ids shared among slots (this node's, its members'); past it each slot keeps its own
_PRUNE_EVERY_MS = 60_000  # how often keeping an entry also deletes the log's expired segments

logger = logging.getLogger("gentorrent.model_node")

Where = tuple[Path, int, int]  # an entry on disk: its segment, the frame's offset and length

__all__ = ["MAX_BYTES", "MAX_DISK_BYTES", "RETENTION_MS", "Kept", "Recording", "ServedStore", "Where"]


@dataclasses.dataclass(frozen=True, slots=True)
class Kept:
    """One served request and its reply, as it passed through this node: ``node_id`` the node
    addressed (this one, or the member that forwarded it here), ``digest`` the request digest the
    reply signs, ``served_by`` the signer (this node, or the member it forwarded to), every chunk's
    text and ids, the final signature and its time: a :class:`~overlay.directory.transcripts.Revealed`
    but for the secret, which only the release gives. ``size``: the estimate the store counts;
    ``kept_ms``: when the store took it."""

    node_id: bytes
    digest: bytes
    model: str
    messages: tuple[ChatMessage, ...]
    params: SamplingParams
    request_id: bytes
    served_by: bytes
    chunks: tuple[tuple[str, tuple[int, ...]], ...]
    signature: bytes
    signed_at_ms: int
    size: int
    kept_ms: int = 0

    def revealed(self, secret: int) -> wire.Revealed:
        """The transcript a donor would have revealed with the escrowed ``secret`` (kind 2)."""
        return wire.Revealed(self.node_id, escrow.nonce_of(secret), self.model, self.messages, self.params,
                             self.request_id, self.served_by, self.chunks, self.signature, self.signed_at_ms,
                             escrow.scalar_bytes(secret))


class Recording:
    """One reply being recorded (:meth:`ServedStore.begin`): :meth:`add` each chunk as it goes out."""

    __slots__ = ("_chunks", "_digest", "_node_id", "_req", "_served_by", "_size", "_skipped", "_tokens", "open")

    def __init__(self, req: Request, node_id: bytes, digest: bytes, size: int, skipped: Counter[str]) -> None:
        self._req, self._node_id, self._digest, self._size = req, node_id, digest, size
        self._chunks: list[tuple[str, tuple[int, ...]]] = []
        self._tokens = 0
        self._served_by = b""
        self._skipped = skipped
        self.open = True

    def _drop(self, why: str) -> None:
        self.open = False
        self._chunks = []
        self._skipped[why] += 1

    def add(self, chunk: ReplyChunk) -> Kept | None:
        """Take the next chunk of the reply; the entry to keep once the final signed chunk came
        (``None`` before, and for a reply that cannot be a transcript: then nothing more is taken)."""
        if not self.open:
            return None
        try:
            if chunk.error or not chunk.signature:
                self._drop("error")
                return None
            if self._served_by and chunk.node != self._served_by:
                self._drop("signers")
                return None
            self._served_by = chunk.node
            ids = tuple(chunk.token_ids)
            self._tokens += len(ids)
            if len(chunk.text) > wire.MAX_CHUNK_TEXT or self._tokens > wire.TRANSCRIPT_MAX_REPLY_TOKENS \
                    or len(self._chunks) >= wire.TRANSCRIPT_MAX_CHUNKS:
                self._drop("limits")
                return None
            self._chunks.append((chunk.text, ids))
            self._size += len(chunk.text) + _TOKEN_BYTES * len(ids) + _PART_BYTES
            if not chunk.done:
                return None
            self.open = False
            r = self._req
            return Kept(self._node_id, self._digest, r.model, tuple(r.messages), r.params, r.request_id,
                        self._served_by, tuple(self._chunks), chunk.signature, chunk.signed_at_ms, self._size)
        except (AttributeError, TypeError, ValueError):  # not a chunk as the wire decodes them
            self._drop("malformed")
            return None


@dataclasses.dataclass(slots=True)
class _Slot:
    """One entry as the store holds it: what finds it, and either the entry itself (``kept``) or
    where it lies on disk (``where``)."""

    node_id: bytes
    digest: bytes
    kept_ms: int
    kept: Kept | None
    where: Where | None

    def memory(self) -> int:
        """The bytes of memory the store counts for it: :data:`_SLOT_BYTES` for an entry on disk."""
        return _SLOT_BYTES if self.kept is None else self.kept.size

    def disk(self) -> int:
        """The bytes of disk it takes: its frame's."""
        return 0 if self.where is None else self.where[2]


class ServedStore:
    """The replies this node served as the addressed node, newest last (see the module docstring)."""

    def __init__(self, *, max_bytes: int = MAX_BYTES, max_disk_bytes: int = MAX_DISK_BYTES,
                 retention_ms: int = RETENTION_MS, log: ServedLog | None = None) -> None:
        if max_bytes <= 0 or max_disk_bytes <= 0 or retention_ms <= 0:
            raise ValueError("a store holds above 0 bytes for above 0 ms")
        self.max_bytes, self.max_disk_bytes, self.retention_ms = max_bytes, max_disk_bytes, retention_ms
        self.log = log
        self._pruned_ms = -1
        self._entries: deque[_Slot] = deque()
        self._by_locator: dict[bytes, list[_Slot]] = {}  # each oldest first (mostly one: a list is small)
        self._ids: dict[bytes, bytes] = {}  # one bytes object per node id the slots name
        self.bytes = 0  # of memory: entries kept in memory, and the index of those on disk
        self.disk_bytes = 0
        self.kept = 0  # entries taken since start
        self.dropped: Counter[str] = Counter()  # "full" (bytes), "expired" (age), "too large", "unreadable"
        self.skipped: Counter[str] = Counter()  # requests or replies that cannot be transcripts, by reason
        self._warned_full = 0

    @classmethod
    def open(cls, log: ServedLog, now_ms: int, *, max_bytes: int = MAX_BYTES, max_disk_bytes: int = MAX_DISK_BYTES,
             retention_ms: int = RETENTION_MS) -> ServedStore:
        """A store kept on ``log``, holding what it kept within ``retention_ms`` of ``now_ms``
        (the newest, where they are over the caps)."""
        store = cls(max_bytes=max_bytes, max_disk_bytes=max_disk_bytes, retention_ms=retention_ms)
        for st in log.load(now_ms, retention_ms):
            store._take(_Slot(st.node_id, st.digest, st.kept_ms, None, st.where), now_ms)
        store.log = log
        store._prune_log(now_ms)
        return store

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> tuple[Kept, ...]:
        """What is kept, oldest first (those on disk read back; one that no longer reads is left out)."""
        return tuple(k for k in map(self._body, self._entries) if k is not None)

    def begin(self, req: Request, node_id: bytes) -> Recording | None:
        """A recording of the reply to ``req``, addressed to ``node_id`` (this node, or the member
        that forwarded it here); ``None`` for a request that can never be a transcript (counted in
        :attr:`skipped`). Never raises."""
        try:
            if req.params.seed is not None:
                self.skipped["seeded"] += 1
                return None
            if req.continuation:
                self.skipped["continuation"] += 1
                return None
            if wire.transcript_problem(req.model, req.messages, req.params) is not None:
                self.skipped["limits"] += 1
                return None
            size = _ENTRY_BYTES + len(req.model) + sum(len(m.content) + _PART_BYTES for m in req.messages)
            return Recording(req, node_id, request_digest(req, node_id), size, self.skipped)
        except (AttributeError, TypeError, ValueError):
            self.skipped["malformed"] += 1
            return None

    def keep(self, kept: Kept, now_ms: int) -> None:
        """Keep ``kept`` as of ``now_ms``: entries past the retention go, then the oldest while the
        store is over a cap. An entry larger than ``max_bytes`` alone is not kept. With a log, the
        entry goes to disk and only its index stays in memory (in memory too, where the write failed)."""
        self.prune(now_ms)
        if kept.size > self.max_bytes:
            self.dropped["too large"] += 1
            return
        entry = dataclasses.replace(kept, kept_ms=now_ms)
        try:
            where = self.log.append(entry) if self.log is not None else None
        except ValueError:  # the log's LogError: a reply too long ever to be handed in
            self.dropped["too large"] += 1
            return
        if where is not None:
            self._take(_Slot(entry.node_id, entry.digest, now_ms, None, where), now_ms)
        else:
            self._take(_Slot(entry.node_id, entry.digest, now_ms, entry, None), now_ms)
        if self.log is not None and now_ms - self._pruned_ms >= _PRUNE_EVERY_MS:
            self._prune_log(now_ms)

    def _prune_log(self, now_ms: int) -> None:
        """Delete the log's segments past the retention, and those older than any entry held."""
        if self.log is not None:
            self._pruned_ms = now_ms
            oldest = next((s.where[0] for s in self._entries if s.where is not None), None)
            self.log.prune(now_ms, self.retention_ms, before=oldest)

    def _take(self, slot: _Slot, now_ms: int) -> None:
        if len(self._ids) < _MAX_IDS:
            slot.node_id = self._ids.setdefault(slot.node_id, slot.node_id)
        self._entries.append(slot)
        self._by_locator.setdefault(wire.locator(slot.digest), []).append(slot)
        self.bytes += slot.memory()
        self.disk_bytes += slot.disk()
        self.kept += 1
        while self.bytes > self.max_bytes or self.disk_bytes > self.max_disk_bytes:
            age_s = (now_ms - self._entries[0].kept_ms) // 1000
            self._pop("full")
            if self.dropped["full"] >= self._warned_full:
                self._warned_full = 2 * self.dropped["full"]
                logger.warning("served store: full (%d MiB in memory, %d MiB on disk): %d entries dropped so far, the "
                            "last of them %d s old, within the retention (%d s); a withheld reply dropped before "
                            "its release cannot be handed in (decision 0038): raise --served-store-gib",
                            self.max_bytes >> 20, self.max_disk_bytes >> 20, self.dropped["full"], age_s,
                            self.retention_ms // 1000)

    def _pop(self, why: str) -> None:
        """Drop the oldest entry (also the oldest of its locator's)."""
        slot = self._entries.popleft()
        key = wire.locator(slot.digest)
        same = self._by_locator[key]
        del same[0]
        if not same:
            del self._by_locator[key]
        self.bytes -= slot.memory()
        self.disk_bytes -= slot.disk()
        self.dropped[why] += 1

    def prune(self, now_ms: int) -> None:
        """Drop the entries kept ``retention_ms`` or more before ``now_ms``, oldest first."""
        while self._entries and now_ms - self._entries[0].kept_ms >= self.retention_ms:
            self._pop("expired")

    def _body(self, slot: _Slot) -> Kept | None:
        if slot.kept is not None or slot.where is None or self.log is None:
            return slot.kept
        try:
            return self.log.read(slot.where)
        except (OSError, ValueError) as exc:  # ValueError: the log's LogError
            self.dropped["unreadable"] += 1
            logger.warning("served store: cannot read back an entry at %s:%d (%s)", slot.where[0], slot.where[1], exc)
            return None

    def find(self, secret: int, value: bytes) -> Kept | None:
        """The entry whose commitment under the escrowed ``secret``'s nonce is ``value``
        (:func:`overlay.directory.transcripts.commitment` of the node it was addressed to and its
        digest), newest first, read back from disk where it lies there. Only the entries of the
        locator the secret carries are tried (decision 0038: a hash each, not one per entry
        kept): a secret without its request's locator finds nothing, and counts for nothing in
        the book either. ``None`` also for a ``secret`` outside ``[1, L)``."""
        try:
            nonce = escrow.nonce_of(secret)
        except escrow.EscrowError:
            return None
        for slot in reversed(self._by_locator.get(wire.secret_locator(secret), ())):
            if wire.commitment(nonce, slot.node_id, slot.digest) == value:
                kept = self._body(slot)
                if kept is not None and kept.node_id == slot.node_id and kept.digest == slot.digest:
                    return kept
        return None
