"""The context's sequences and the prefix cache (docs/decisions/0004-llama-prefix-cache.md,
0011-llama-batching.md), engine thread only.

The context has one sequence per slot, each with its own KV stream (llama.cpp's non-unified
KV cache: its cells stay in position order). A :class:`Slot` records exactly the tokens whose
KV its sequence holds. A sequence keeps its tokens' KV after its request ends. A new prompt
takes a free sequence and the longest cached prefix of: what that sequence holds (reused in
place), what any other sequence holds (``llama_memory_seq_cp`` copies that stream, trimmed to
the match), or an LRU of KV snapshots of earlier sequences (``llama_state_seq_get_data``, in
RAM, bounded by ``cache_bytes``; restored with ``llama_state_seq_set_data``). A sequence's
state is snapshotted before at least :data:`MIN_SNAPSHOT_TOKENS` of its tokens would be lost.
:meth:`KvCache.decode` evaluates tokens into sequences (one ``llama_decode``) and keeps that
record; :meth:`KvCache.publish` lists what the sequences and snapshots hold for callers."""

from __future__ import annotations

import ctypes
import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from model_node.engine import EngineError
from model_node.hrtree import common_prefix

log = logging.getLogger("gentorrent.llama")

DEFAULT_CACHE_BYTES = 512 * 1024 * 1024  # RAM for KV snapshots of earlier prefixes
MIN_SNAPSHOT_TOKENS = 64  # snapshot a sequence before losing at least this many of its tokens
N_BATCH = 512  # tokens per llama_decode call (decode tokens + prompt chunks)


class Slot:
    """One llama.cpp sequence (its own KV stream): ``tokens`` are exactly those whose KV it
    holds, positions 0..n-1; ``user`` the request or scoring job running in it (None: free, its
    tokens are a cached prefix); ``used`` when it was last released (LRU among free sequences)."""

    __slots__ = ("seq", "tokens", "used", "user")

    def __init__(self, seq: int) -> None:
        self.seq = seq
        self.tokens: list[int] = []
        self.user: object | None = None
        self.used = 0


class KvCache:
    """The ``n_slots`` sequences of the llama.cpp context ``ctx`` (``context_window`` cells
    each), the LRU of KV snapshots (at most ``cache_bytes`` of RAM and, unless None,
    ``max_snapshots`` of them) and the ``llama_decode`` batch. Used by the engine thread only,
    except :attr:`held` and :attr:`usage`, published after each step. Call :meth:`close` to free
    the batch (before the context)."""

    def __init__(self, L: Any, ctx: Any, n_slots: int, context_window: int, cache_bytes: int,
                 max_snapshots: int | None) -> None:
        self._L, self._ctx = L, ctx
        self.context_window, self.cache_bytes, self.max_snapshots = context_window, cache_bytes, max_snapshots
        self._mem = L.llama_get_memory(ctx)
        self._batch = L.llama_batch_init(N_BATCH, 0, 1)
        self.slots = [Slot(i) for i in range(n_slots)]
        self.snapshots: OrderedDict[tuple[int, ...], Any] = OrderedDict()  # LRU: tokens -> state bytes
        self._snapshot_bytes = 0
        self._pending_copy: set[int] = set()  # sequences whose stream copy llama.cpp applies at the next decode
        # ... and the sequences those copies read: their data must not change before that decode
        self._pending_src: set[int] = set()
        self._tick = 0
        # Published by the engine thread after each step (read by trio callers):
        self.held: list[tuple[int, ...]] = []
        self.usage = 0.0

    def close(self) -> None:
        """Free the ``llama_decode`` batch (idempotent)."""
        if self._batch is not None:
            self._L.llama_batch_free(self._batch)
            self._batch = None

    # ----------------------------------------------------------------- sequences

    def free(self) -> list[Slot]:
        """The sequences no request or scoring job runs in."""
        return [s for s in self.slots if s.user is None]

    def release(self, slot: Slot) -> None:
        """``slot``'s user is done: it is free, its tokens a cached prefix, most recently used."""
        self._tick += 1
        slot.user, slot.used = None, self._tick

    def clear(self, slot: Slot) -> None:
        """Empty ``slot``'s sequence."""
        self._L.llama_memory_seq_rm(self._mem, slot.seq, -1, -1)
        slot.tokens = []

    def compact(self) -> list[Slot]:
        """Keep the running sequences' ids consecutive (llama.cpp splits a batch at a gap: one
        physical batch per run of ids): move the highest into the lowest gap (a stream copy;
        the source keeps its tokens as a cached prefix). Returns the sequences a user moved into
        (its ``user`` is the one that moved)."""
        moved = []
        busy = sorted(s.seq for s in self.slots if s.user is not None)
        while len(busy) >= 2 and busy[-1] - busy[0] + 1 > len(busy):
            gap = next(i for i in range(busy[0], busy[-1]) if self.slots[i].user is None)
            src, dst = self.slots[busy[-1]], self.slots[gap]
            if len(dst.tokens) >= MIN_SNAPSHOT_TOKENS and self.cache_bytes > 0:
                self.snapshot(dst)
            self._copy(src, dst)
            dst.user, src.user = src.user, None
            moved.append(dst)
            self._tick += 1
            src.used = self._tick
            busy = sorted(s.seq for s in self.slots if s.user is not None)
        return moved

    def _copy(self, src: Slot, dst: Slot) -> None:
        L = self._L
        L.llama_memory_seq_rm(self._mem, dst.seq, -1, -1)
        L.llama_memory_seq_cp(self._mem, src.seq, dst.seq, -1, -1)  # the data moves at the next decode
        dst.tokens = list(src.tokens)
        self._pending_copy.add(dst.seq)
        self._pending_src.add(src.seq)

    def publish(self) -> None:
        """Set :attr:`held` (what the sequences hold, running ones first, then free ones most
        recently used first, then the snapshots newest first) and :attr:`usage` (the fraction of
        KV cells in use)."""
        slots = sorted(self.slots, key=lambda s: (s.user is None, -s.used))
        held: list[tuple[int, ...]] = []
        for s in slots:
            t = tuple(s.tokens)
            if t and t not in held:
                held.append(t)
        held += [k for k in reversed(self.snapshots) if k not in held]
        self.held = held
        self.usage = sum(len(s.tokens) for s in self.slots) / (self.context_window * len(self.slots))

    # ----------------------------------------------------------------- snapshots

    def snapshot(self, slot: Slot, keep: tuple[int, ...] | None = None) -> None:
        """Keep a copy of ``slot``'s KV state (its tokens are the key) in the LRU, unless another
        sequence or a longer snapshot holds it; never evict ``keep`` (the snapshot about to be
        restored): if only it stands in the way, this state is not kept."""
        import numpy as np

        L, key = self._L, tuple(slot.tokens)
        if not key or slot.seq in self._pending_copy:
            return
        if key in self.snapshots:
            self.snapshots.move_to_end(key)
            return
        if any(k[:len(key)] == key for k in self.snapshots):
            return  # a longer snapshot already holds this prefix
        if any(s is not slot and tuple(s.tokens[:len(key)]) == key for s in self.slots):
            return  # another sequence holds it (it is snapshotted in turn before losing it)
        size = L.llama_state_seq_get_size(self._ctx, slot.seq)
        if size > self.cache_bytes:
            return
        blob = np.empty(size, dtype=np.uint8)
        got = L.llama_state_seq_get_data(self._ctx, blob.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), size,
                                         slot.seq)
        if got == 0:
            log.warning("llama_state_seq_get_data failed; prefix not cached")
            return
        for k in [k for k in self.snapshots if key[:len(k)] == k and k != keep]:  # subsumed by this one
            self._snapshot_bytes -= self.snapshots.pop(k).nbytes
        while self.snapshots and (self._snapshot_bytes + size > self.cache_bytes or (
                self.max_snapshots is not None and len(self.snapshots) >= self.max_snapshots)):
            victim = next((k for k in self.snapshots if k != keep), None)
            if victim is None:
                return
            self._snapshot_bytes -= self.snapshots.pop(victim).nbytes
        self.snapshots[key] = blob[:got]
        self._snapshot_bytes += blob[:got].nbytes

    # ----------------------------------------------------------------- placing a prompt

    def place(self, tokens: list[int], limit: int) -> tuple[Slot, int]:
        """Pick a free sequence for ``tokens`` and make it hold their longest cached prefix (at
        most ``limit`` tokens: the caller needs logits from there on): in place, copied from
        another sequence, or restored from a snapshot. Returns the sequence and that length."""
        here = {s.seq: min(common_prefix(s.tokens, tokens), limit) for s in self.slots}
        target = self._pick_free(here)
        n_here = here[target.seq]
        src, n_src = None, n_here
        snap, n_snap = None, n_here
        if target.seq not in self._pending_src:  # else only what it holds in place (its data stays)
            src, n_src = self._longest_held(target, here)
            snap, n_snap = self._longest_snapshot(tokens, limit, n_src)
        losing = len(target.tokens) - (n_here if src is None and snap is None else 0)
        save = losing >= MIN_SNAPSHOT_TOKENS and self.cache_bytes > 0
        if snap is not None:
            n = self._restore(target, snap, n_snap, save)
        else:
            if save:
                self.snapshot(target)
            if src is not None:
                self._copy(src, target)
                n = n_src
            else:
                n = n_here
        return target, self._trim(target, n)

    def _pick_free(self, here: dict[int, int]) -> Slot:
        """The free sequence that loses the least: one whose tokens this prompt continues (or
        empty), else the least recently used; on a tie, next to the running ones, then the
        longest prefix in place (no stream copy). ``here``: each sequence's usable prefix."""
        busy = sorted(s.seq for s in self.slots if s.user is not None)

        def adjacent(s: Slot) -> bool:
            return not busy or s.seq in (busy[0] - 1, busy[-1] + 1)

        def cheap(s: Slot) -> bool:  # taking it loses nothing worth a snapshot
            return len(s.tokens) - here[s.seq] < MIN_SNAPSHOT_TOKENS

        # Not the source of a stream copy llama.cpp has not applied yet (it copies at the next
        # decode, from what the source holds then): restoring a snapshot into it, or copying into
        # it, would hand the earlier placement this one's data. Measured before this rule: a
        # score_batch of 4-6 replies gave one reply's first tokens log-probabilities off by 0.7-0.9,
        # and the wrong KV was then snapshotted and reused.
        safe = [s for s in self.free() if s.seq not in self._pending_src]
        return max(safe or self.free(), key=lambda s: (cheap(s), adjacent(s), here[s.seq], -s.used))

    def _longest_held(self, target: Slot, here: dict[int, int]) -> tuple[Slot | None, int]:
        """The other sequence holding a longer usable prefix than ``target`` (the first of the
        longest), and that length; else ``(None, what target holds)``."""
        src, n_src = None, here[target.seq]
        for s in self.slots:
            if s is not target and here[s.seq] > n_src:
                src, n_src = s, here[s.seq]
        return src, n_src

    def _longest_snapshot(self, tokens: list[int], limit: int,
                          longer_than: int) -> tuple[tuple[int, ...] | None, int]:
        """The snapshot holding the longest prefix of ``tokens`` (at most ``limit``) if longer than
        ``longer_than`` (the first of the longest, least recently used first), and that length."""
        snap, n_snap = None, longer_than
        for key in self.snapshots:
            n = min(common_prefix(key, tokens), limit)
            if n > n_snap:
                snap, n_snap = key, n
        return snap, n_snap

    def _restore(self, target: Slot, snap: tuple[int, ...], n_snap: int, save: bool) -> int:
        """Restore snapshot ``snap`` into ``target`` (first snapshotting what it holds if
        ``save``); returns the prefix length it now holds for the prompt (``n_snap``; 0 if the
        restore failed)."""
        L = self._L
        # A snapshot reused up to its last few tokens (a previous request's question and
        # reply) moves into the sequence: keeping it too would hold the same prefix twice,
        # and the sequence is snapshotted again before it loses MIN_SNAPSHOT_TOKENS or more.
        moving = n_snap >= len(snap) - MIN_SNAPSHOT_TOKENS
        if moving:
            blob = self.snapshots.pop(snap)
            self._snapshot_bytes -= blob.nbytes
        else:
            self.snapshots.move_to_end(snap)
            blob = self.snapshots[snap]
        if save:
            self.snapshot(target, keep=None if moving else snap)
        L.llama_memory_seq_rm(self._mem, target.seq, -1, -1)
        target.tokens = []
        ok = L.llama_state_seq_set_data(self._ctx, blob.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)),
                                        blob.nbytes, target.seq)
        if ok:
            target.tokens = list(snap)
            return n_snap
        # should not happen with an empty sequence; evaluate from scratch
        log.warning("llama_state_seq_set_data failed; evaluating the prompt in full")
        L.llama_memory_seq_rm(self._mem, target.seq, -1, -1)
        if not moving:
            self._snapshot_bytes -= self.snapshots.pop(snap).nbytes
        return 0

    def _trim(self, slot: Slot, n: int) -> int:
        """Cut ``slot`` to its first ``n`` tokens; returns what it holds then (0 if llama.cpp
        could not cut it: it is emptied)."""
        L = self._L
        if len(slot.tokens) > n:
            if not L.llama_memory_seq_rm(self._mem, slot.seq, n, -1):
                L.llama_memory_seq_rm(self._mem, slot.seq, -1, -1)
                slot.tokens, n = [], 0
            slot.tokens = slot.tokens[:n]
        return n

    # ----------------------------------------------------------------- evaluating

    def decode(self, entries: Sequence[tuple[Slot, Sequence[int], int | None]]) -> list[int]:
        """Evaluate, in one ``llama_decode`` call (≤ :data:`N_BATCH` tokens in all), each entry's
        tokens after what its sequence holds; logits for the entry's tokens from index
        ``first_out`` on (None: none). Returns each entry's last batch index."""
        L, b = self._L, self._batch
        j = 0
        for slot, toks, first_out in entries:
            pos0 = len(slot.tokens)
            for k, t in enumerate(toks):
                b.token[j] = t
                b.pos[j] = pos0 + k
                b.n_seq_id[j] = 1
                b.seq_id[j][0] = slot.seq
                b.logits[j] = first_out is not None and k >= first_out
                j += 1
        b.n_tokens = j
        rc = L.llama_decode(self._ctx, b)
        if rc != 0:
            for slot, _, _ in entries:  # a failed batch may leave part of it behind
                if not L.llama_memory_seq_rm(self._mem, slot.seq, len(slot.tokens), -1):
                    L.llama_memory_seq_rm(self._mem, slot.seq, -1, -1)
                    slot.tokens = []
            raise EngineError(f"llama.cpp failed to evaluate a batch of {j} tokens (code {rc})")
        self._pending_copy.clear()
        self._pending_src.clear()
        ends, j = [], 0
        for slot, toks, _ in entries:
            slot.tokens.extend(toks)
            j += len(toks)
            ends.append(j - 1)
        return ends
