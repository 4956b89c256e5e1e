"""The Hash-Radix tree (HR-tree, paper §3.3 "Hash-Radix tree", Fig. 6–7, appendix Algorithm 1).

A prompt (a sequence of token ids) is cut into chunks by the group's length array ``L``
(:class:`ChunkLengths`; learned by the Sentry, appendix A3): chunk *i* is ``l_i`` tokens, and
once ``L`` is used up every further chunk is ``tail`` tokens. Only complete chunks count: the
tokens after the last complete chunk are not hashed (a query that continues past them would
cut them differently, so their hash could never be matched reliably). Each chunk is hashed to
``b`` bits (8 by default, paper §3.3/§5) with BLAKE2b keyed by a digest of the group's ``L``
and its version, so the hash is identical on every node of the group, differs between
versions, and never depends on Python's salted ``hash()``. A prompt's sequence of chunk hashes
is its *path*; paths are ``bytes`` (one byte per hash for ``b ≤ 8``, two for ``b ≤ 16``).

The tree stores paths from every model node of the group. Each tree node stands for a prefix
and holds the set of model nodes whose KV cache covers that prefix (paper: "a set of
pointers, each referencing an entry of a separate table"); the set is a bitmask over small
per-node slots, and single-child chains are path-compressed (a true radix tree over hash
units), so a cached prefix of 32k tokens costs one short edge, not 128 objects.

:meth:`HRTree.search` is Algorithm 1: walk the query's path from the root while a child
matches; it returns the depth ``d`` reached and the model nodes at the deepest matched tree
node. The threshold ``τ_c`` (``d ≥ τ_c`` is a match) is applied by :meth:`HRTree.match` and by
the forwarding logic (:mod:`model_node.group`), not by ``search`` (default ``τ_c`` =
⌈16 / b⌉, i.e. 2 for 8-bit hashes, chosen by measurement, :func:`default_tau_c`): the paper's pseudocode
returns early without the ``τ_c`` check when a child is missing (line 15), while its text says
any ``d`` below the threshold is a miss; we follow the text.

False positives: a query that shares no prefix with a cached one still matches depth ``d``
with probability ≈ ∏ (children at level i) / 2^b, i.e. 2^(−b·d) against one stored path
(paper: "as small as 1/256^d"). See docs/decisions/0005-hrtree.md for the measured rates.

Nothing here does I/O.
"""

from __future__ import annotations

import array
import bisect
import sys
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

from overlay.wire import crypto

DEFAULT_BITS = 8  # b: bits per chunk hash (paper §5: "8-bit hash values")
DEFAULT_TAIL = 256  # tokens per chunk once L is used up (and the unit the Sentry splits long gaps by)
TAU_C_BITS = 16  # a match needs this many bits of chunk-hash evidence (measured: docs/decisions/0005-hrtree.md)
MAX_BITS = 16
MAX_DEPTH = 512  # chunks hashed per prompt at most (512 × 256 tokens = 131,072 tokens by default)
MAX_LENGTHS = 256  # entries of L
MAX_CHUNK_TOKENS = 1 << 16  # one chunk, tokens
MAX_PATHS_PER_NODE = 1024  # cached prefixes one model node may announce
MAX_TOKEN_ID = 2**32 - 1  # token ids are hashed as little-endian u32

_KEY_CONTEXT = b"gentorrent/hrtree/L/v1\x00"
_PERSON_KEY = b"gt-hrtree-key"
_PERSON_DIGEST = b"gt-hrtree-L"
_PERSON_CHUNK = b"gt-hrtree-chunk"
DIGEST_LEN = 8
# Highest L version: a member may push the group's version up (the highest wins), so versions
# stop well short of 2^63 and the proposer's next version (+1) always fits the wire's integers.
MAX_L_VERSION = 2**62

# A typecode with 4-byte items, for token ids as u32.
_U32 = next(t for t in ("I", "L") if array.array(t).itemsize == 4)
_BIG_ENDIAN = sys.byteorder == "big"


def default_tau_c(bits: int) -> int:
    """The default ``τ_c`` for ``b``-bit hashes: ⌈16 / b⌉ matched chunks (2 for b = 8).

    Measured on a 50-node group (docs/decisions/0005-hrtree.md): at b = 8 and τ_c = 1 the
    root level is saturated (≈ 256 distinct first chunks are cached group-wide) and 27 % of
    queries match falsely; τ_c = 2 brings that to 0.55 % and misses only queries that share
    nothing but the shortest system prompt (0.16 % of reusable tokens)."""
    return max(1, -(-TAU_C_BITS // bits))


def unit_width(bits: int) -> int:
    """Bytes per chunk hash in a path: 1 for ``b ≤ 8``, 2 for ``b ≤ 16``."""
    return 1 if bits <= 8 else 2


def token_bytes(token_ids: Sequence[int]) -> bytes:
    """``token_ids`` as little-endian u32 (the bytes every node hashes).

    Raises :class:`ValueError` for an id outside 0..2^32−1 or a non-integer.
    """
    try:
        arr = array.array(_U32, token_ids)
    except (OverflowError, TypeError) as exc:
        raise ValueError(f"token ids must be integers in 0..{MAX_TOKEN_ID}") from exc
    if _BIG_ENDIAN:
        arr.byteswap()
    return arr.tobytes()


@dataclass(frozen=True)
class ChunkLengths:
    """The group's chunk length array ``L`` and its version (paper §3.3, appendix A3).

    ``lengths`` are ``l_1..l_n`` in tokens; every chunk after them is ``tail`` tokens.
    ``bits`` is ``b``, the bits per chunk hash. The whole tuple is versioned and shared by
    the group (:mod:`model_node.sentry` decides which version wins); trees and paths made
    under different ``ChunkLengths`` never mix, which :attr:`digest` lets peers check.
    """

    version: int = 0
    lengths: tuple[int, ...] = ()
    tail: int = DEFAULT_TAIL
    bits: int = DEFAULT_BITS

    def __post_init__(self) -> None:
        problem = lengths_problem(self.version, self.lengths, self.tail, self.bits)
        if problem:
            raise ValueError(problem)

    @cached_property
    def _canonical(self) -> bytes:
        parts = [_KEY_CONTEXT, self.version.to_bytes(8, "big"), self.bits.to_bytes(1, "big"),
                 self.tail.to_bytes(4, "big"), len(self.lengths).to_bytes(4, "big")]
        parts += [n.to_bytes(4, "big") for n in self.lengths]
        return b"".join(parts)

    @cached_property
    def key(self) -> bytes:
        """The 32-byte BLAKE2b key of the chunk hash, derived from this whole ``L`` (and its
        version), so equal on every node that holds the same ``L``."""
        return crypto.blake2b(self._canonical, size=32, person=_PERSON_KEY)

    @cached_property
    def digest(self) -> bytes:
        """8 bytes naming this ``L`` on the wire (two different ``L`` with one version differ here)."""
        return crypto.blake2b(self._canonical, size=DIGEST_LEN, person=_PERSON_DIGEST)

    @cached_property
    def width(self) -> int:
        return unit_width(self.bits)

    @cached_property
    def _ends(self) -> tuple[int, ...]:
        ends, k = [], 0
        for n in self.lengths[:MAX_DEPTH]:
            k += n
            ends.append(k)
        return tuple(ends)

    def chunk_ends(self, n_tokens: int) -> list[int]:
        """End offsets of the complete chunks of an ``n_tokens`` prompt (at most MAX_DEPTH)."""
        ends = self._ends
        i = bisect.bisect_right(ends, n_tokens)
        out = list(ends[:i])
        if i == len(ends) and len(out) < MAX_DEPTH:
            k = ends[-1] if ends else 0
            room = min((n_tokens - k) // self.tail, MAX_DEPTH - len(out))
            out.extend(range(k + self.tail, k + self.tail * room + 1, self.tail))
        return out

    def chunk_hash(self, chunk: bytes | memoryview) -> bytes:
        """The ``b``-bit keyed hash of one chunk (its tokens as little-endian u32)."""
        h = crypto.blake2b(bytes(chunk), size=self.width, key=self.key, person=_PERSON_CHUNK)
        if self.bits in (8, 16):
            return h
        mask = (1 << self.bits) - 1
        return (int.from_bytes(h, "big") & mask).to_bytes(self.width, "big")

    def path(self, token_ids: Sequence[int]) -> bytes:
        """The chunk-hash path of a prompt: one hash per complete chunk (Fig. 6)."""
        ends = self.chunk_ends(len(token_ids))
        if not ends:
            return b""
        data = memoryview(token_bytes(token_ids[: ends[-1]]))
        key, size, person = self.key, self.width, _PERSON_CHUNK
        blake = crypto.blake2b
        out, start = [], 0
        if self.bits in (8, 16):
            for end in ends:
                # A memoryview slice is hashed without a copy.
                out.append(blake(data[4 * start:4 * end], size=size, key=key, person=person))
                start = end
        else:
            for end in ends:
                out.append(self.chunk_hash(data[4 * start:4 * end]))
                start = end
        return b"".join(out)

    def path_problem(self, path: bytes) -> str | None:
        """Why ``path`` cannot be a path under this ``L`` (a peer's bad input), or ``None``."""
        if type(path) is not bytes:
            return "path is not bytes"
        w = self.width
        if not path:
            return "empty path"
        if len(path) % w:
            return f"path of {len(path)} bytes is not a whole number of {w}-byte hashes"
        if len(path) // w > MAX_DEPTH:
            return f"path of {len(path) // w} chunks exceeds {MAX_DEPTH}"
        if self.bits % 8:
            limit = 1 << self.bits
            if w == 1:
                if max(path) >= limit:
                    return f"hash value over {self.bits} bits"
            elif any(int.from_bytes(path[i:i + 2], "big") >= limit for i in range(0, len(path), 2)):
                return f"hash value over {self.bits} bits"
        return None


def lengths_problem(version: int, lengths: Sequence[int], tail: int, bits: int) -> str | None:
    """Why these are not a valid ``ChunkLengths``, or ``None`` (used on peers' proposals too)."""
    if type(version) is not int or not 0 <= version <= MAX_L_VERSION:
        return "version must be an integer in 0..2^62"
    if type(bits) is not int or not 1 <= bits <= MAX_BITS:
        return f"bits must be in 1..{MAX_BITS}"
    if type(tail) is not int or not 1 <= tail <= MAX_CHUNK_TOKENS:
        return f"tail must be in 1..{MAX_CHUNK_TOKENS}"
    if len(lengths) > MAX_LENGTHS:
        return f"L has {len(lengths)} entries, over {MAX_LENGTHS}"
    if any(type(n) is not int or not 1 <= n <= MAX_CHUNK_TOKENS for n in lengths):
        return f"every entry of L must be in 1..{MAX_CHUNK_TOKENS}"
    return None


class Match(NamedTuple):
    """A search result: the depth ``d`` reached and the model nodes at the deepest matched
    tree node (empty at depth 0). ``depth, candidates = tree.search(prompt)``."""

    depth: int
    candidates: frozenset[bytes]


class Delta(NamedTuple):
    """A node's changes between two journal sequence numbers (see :meth:`HRTree.delta_since`)."""

    base: int
    seq: int
    added: tuple[bytes, ...]
    removed: tuple[bytes, ...]


class _TNode:
    """A tree node: ``edge`` = the hash units from the parent, ``mask`` = slots holding this
    prefix (constant along the edge), ``children`` keyed by the first unit of their edge."""

    __slots__ = ("children", "edge", "mask")

    def __init__(self, edge: bytes, children: dict[int, _TNode] | None, mask: int) -> None:
        self.edge = edge
        self.children = children
        self.mask = mask


def common_prefix(a: Sequence[object], b: Sequence[object]) -> int:
    """Length of the longest common prefix of two sequences (token ids, bytes...)."""
    n = 0
    for x, y in zip(a, b, strict=False):  # lengths may differ: the prefix ends with the shorter
        if x != y:
            break
        n += 1
    return n


def common_prefix_units(a: bytes, b: bytes, w: int) -> int:
    """Length in bytes (a multiple of ``w``) of the longest common prefix of ``a`` and ``b``."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n - n % w
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo - lo % w


class HRTree:
    """The group's HR-tree under one :class:`ChunkLengths` (paper §3.3, Fig. 7).

    Model nodes are named by their node ids (bytes). Each node's *subtree* is the set of
    paths of its cached prefixes (at most ``max_paths_per_node``); the tree is their union.
    ``track(node_id)`` keeps a journal of that node's changes so :meth:`delta_since` can
    export them as a delta (the local node tracks itself for state synchronisation).
    Methods taking a ``path`` expect it well-formed (:meth:`ChunkLengths.path_problem`);
    callers validate peers' input first (:mod:`model_node.group` does).
    """

    def __init__(self, lengths: ChunkLengths | None = None, *,
                 max_paths_per_node: int = MAX_PATHS_PER_NODE, journal_size: int = 4 * MAX_PATHS_PER_NODE) -> None:
        self.lengths = lengths or ChunkLengths()
        self.max_paths_per_node = max_paths_per_node
        self.journal_size = journal_size
        self._w = self.lengths.width
        self._root = _TNode(b"", None, 0)
        self._slot: dict[bytes, int] = {}
        self._ids: list[bytes | None] = []
        self._free: list[int] = []
        self._paths: dict[bytes, list[bytes]] = {}  # node id -> its paths, sorted
        self._journal: dict[bytes, deque[tuple[int, bytes, bool]]] = {}
        self._seq: dict[bytes, int] = {}
        self._trimmed: dict[bytes, int] = {}  # node id -> newest seq dropped from its journal

    # ------------------------------------------------------------------ prompts

    def insert(self, node_id: bytes, token_ids: Sequence[int]) -> bool:
        """Record that ``node_id`` holds the KV cache of ``token_ids`` (its complete chunks).

        Returns whether the node's subtree changed (False: already there, no complete
        chunk, or the node is at ``max_paths_per_node``).
        """
        path = self.lengths.path(token_ids)
        return bool(path) and self.insert_path(node_id, path)

    def search(self, token_ids: Sequence[int]) -> Match:
        """Algorithm 1: the depth reached by the prompt's path and the nodes holding it."""
        return self.search_path(self.lengths.path(token_ids))

    def match(self, token_ids: Sequence[int], tau_c: int | None = None) -> Match:
        """Algorithm 1 with its threshold: the candidates if ``d ≥ τ_c``, else none
        (``τ_c`` defaults to :func:`default_tau_c` of this tree's ``b``)."""
        m = self.search(token_ids)
        tau = default_tau_c(self.lengths.bits) if tau_c is None else tau_c
        return m if m.depth >= max(1, tau) else Match(m.depth, frozenset())

    # ------------------------------------------------------------------ paths

    def search_path(self, path: bytes) -> Match:
        node, i, n, w = self._root, 0, len(path), self._w
        mask = 0
        while i < n:
            children = node.children
            if not children:
                break
            child = children.get(path[i] if w == 1 else (path[i] << 8) | path[i + 1])
            if child is None:
                break
            e = child.edge
            le = len(e)
            mask = child.mask
            if path[i:i + le] == e:
                i += le
                node = child
                continue
            i += common_prefix_units(e, path[i:i + le], w)
            break
        return Match(i // w, self._nodes_of(mask) if i else frozenset())

    def insert_path(self, node_id: bytes, path: bytes) -> bool:
        paths = self._paths.get(node_id)
        if paths is None:
            paths = []
        k = bisect.bisect_left(paths, path)
        if k < len(paths) and paths[k] == path:
            return False
        if len(paths) >= self.max_paths_per_node:
            return False
        if not paths:
            self._paths[node_id] = paths
        paths.insert(k, path)
        self._add_to_tree(self._slot_for(node_id), path)
        self._log(node_id, path, True)
        return True

    def remove_path(self, node_id: bytes, path: bytes) -> bool:
        paths = self._paths.get(node_id)
        if not paths:
            return False
        k = bisect.bisect_left(paths, path)
        if k == len(paths) or paths[k] != path:
            return False
        del paths[k]
        w = self._w
        keep = 0  # units still held through the node's other paths (max LCP with a neighbour)
        if k > 0:
            keep = common_prefix_units(paths[k - 1], path, w)
        if k < len(paths):
            keep = max(keep, common_prefix_units(paths[k], path, w))
        self._clear_along(self._slot[node_id], path, keep)
        self._log(node_id, path, False)
        if not paths:
            del self._paths[node_id]
            self._release(node_id)
        return True

    def replace_paths(self, node_id: bytes, paths: Iterable[bytes]) -> None:
        """Make ``node_id``'s subtree exactly ``paths`` (a full import), changing only the difference."""
        new = set(paths)
        old = set(self._paths.get(node_id, ()))
        for p in sorted(old - new):
            self.remove_path(node_id, p)
        for p in sorted(new - old):
            self.insert_path(node_id, p)

    def remove_node(self, node_id: bytes) -> bool:
        """Forget every prefix of ``node_id`` (a silent peer expired, or it left the group)."""
        if node_id not in self._paths:
            return False
        if node_id in self._journal:
            for p in list(self._paths[node_id]):
                self.remove_path(node_id, p)
            return True
        bit = 1 << self._slot[node_id]
        stack = [self._root]
        while stack:
            node = stack.pop()
            node.mask &= ~bit
            if node.children:
                for key, child in list(node.children.items()):
                    if child.mask & bit:
                        if child.mask == bit:
                            del node.children[key]
                        else:
                            stack.append(child)
                if not node.children:
                    node.children = None
        self._merge_all()
        del self._paths[node_id]
        self._release(node_id)
        return True

    def paths(self, node_id: bytes) -> tuple[bytes, ...]:
        """``node_id``'s subtree as a compact path list (sorted): the full export."""
        return tuple(self._paths.get(node_id, ()))

    def has_path(self, node_id: bytes, path: bytes) -> bool:
        paths = self._paths.get(node_id, ())
        k = bisect.bisect_left(paths, path)
        return k < len(paths) and paths[k] == path

    def path_count(self, node_id: bytes) -> int:
        return len(self._paths.get(node_id, ()))

    def node_ids(self) -> list[bytes]:
        """Every model node with at least one path."""
        return list(self._paths)

    def __len__(self) -> int:
        return sum(len(p) for p in self._paths.values())

    # ------------------------------------------------------------------ deltas

    def track(self, node_id: bytes) -> None:
        """Journal ``node_id``'s changes from now on (for :meth:`delta_since`)."""
        self._journal.setdefault(node_id, deque(maxlen=self.journal_size))
        self._seq.setdefault(node_id, 0)

    def seq(self, node_id: bytes) -> int:
        """The journal sequence number of ``node_id``'s subtree (bumped on every change)."""
        return self._seq.get(node_id, 0)

    def delta_since(self, node_id: bytes, since: int) -> Delta | None:
        """The net change of a tracked node's subtree since journal sequence ``since``, or
        ``None`` when the journal no longer reaches back that far (send a full export)."""
        journal = self._journal.get(node_id)
        now = self._seq.get(node_id, 0)
        if journal is None or since > now or since < self._trimmed.get(node_id, 0):
            return None
        first: dict[bytes, bool] = {}
        for seq, path, added in journal:
            if seq > since and path not in first:
                first[path] = added
        add, rem = [], []
        for path, first_was_add in first.items():
            present = self.has_path(node_id, path)
            if present and first_was_add:
                add.append(path)
            elif not present and not first_was_add:
                rem.append(path)
        return Delta(since, now, tuple(sorted(add)), tuple(sorted(rem)))

    def _log(self, node_id: bytes, path: bytes, added: bool) -> None:
        journal = self._journal.get(node_id)
        if journal is None:
            return
        seq = self._seq[node_id] = self._seq[node_id] + 1
        if len(journal) == journal.maxlen:
            self._trimmed[node_id] = journal[0][0]
        journal.append((seq, path, added))

    # ------------------------------------------------------------------ accounting

    def tree_node_count(self) -> int:
        n, stack = 0, [self._root]
        while stack:
            node = stack.pop()
            n += 1
            if node.children:
                stack.extend(node.children.values())
        return n

    def memory_bytes(self) -> int:
        """Bytes held by the tree and the per-node path lists (``sys.getsizeof`` of every
        object we own; node ids and small ints shared with the interpreter not counted)."""
        size = sys.getsizeof
        total, stack = 0, [self._root]
        while stack:
            node = stack.pop()
            total += size(node) + size(node.edge) + (size(node.mask) if node.mask > 255 else 0)
            if node.children:
                total += size(node.children)
                stack.extend(node.children.values())
        for paths in self._paths.values():
            total += size(paths) + sum(size(p) for p in paths)
        total += size(self._paths) + size(self._slot) + size(self._ids)
        for journal in self._journal.values():
            total += size(journal) + len(journal) * size((0, b"", True))
        return total

    # ------------------------------------------------------------------ internals

    def _slot_for(self, node_id: bytes) -> int:
        slot = self._slot.get(node_id)
        if slot is None:
            if self._free:
                slot = self._free.pop()
                self._ids[slot] = node_id
            else:
                slot = len(self._ids)
                self._ids.append(node_id)
            self._slot[node_id] = slot
        return slot

    def _release(self, node_id: bytes) -> None:
        if node_id in self._journal:
            return  # a tracked node keeps its slot (cheap) so its journal stays meaningful
        slot = self._slot.pop(node_id)
        self._ids[slot] = None
        self._free.append(slot)

    def _nodes_of(self, mask: int) -> frozenset[bytes]:
        out = []
        ids = self._ids
        while mask:
            low = mask & -mask
            node_id = ids[low.bit_length() - 1]
            if node_id is not None:
                out.append(node_id)
            mask ^= low
        return frozenset(out)

    def _key(self, data: bytes, i: int) -> int:
        return data[i] if self._w == 1 else (data[i] << 8) | data[i + 1]

    def _add_to_tree(self, slot: int, path: bytes) -> None:
        bit = 1 << slot
        node, i, n = self._root, 0, len(path)
        node.mask |= bit
        trail = []
        while i < n:
            key = self._key(path, i)
            if node.children is None:
                node.children = {}
            child = node.children.get(key)
            if child is None:
                node.children[key] = _TNode(path[i:], None, bit)
                break
            e = child.edge
            m = common_prefix_units(e, path[i:i + len(e)], self._w)
            if m < len(e):
                child = self._split(node, key, child, m)
            child.mask |= bit
            trail.append(child)
            i += m
            node = child
        for node in reversed(trail):  # keep the tree canonical: no single child with an equal mask
            self._merge(node)

    def _split(self, parent: _TNode, key: int, child: _TNode, m: int) -> _TNode:
        """Cut ``child``'s edge after ``m`` bytes; return the new upper node."""
        e = child.edge
        upper = _TNode(e[:m], {self._key(e, m): child}, child.mask)
        child.edge = e[m:]
        assert parent.children is not None
        parent.children[key] = upper
        return upper

    def _clear_along(self, slot: int, path: bytes, keep: int) -> None:
        """Clear ``slot`` from the tree nodes of ``path`` deeper than ``keep`` bytes, then
        drop empty nodes and re-merge single-child chains on the way back up."""
        bit = 1 << slot
        trail: list[tuple[_TNode, int, _TNode]] = []  # (parent, key, node)
        node, i, n = self._root, 0, len(path)
        if keep == 0:
            node.mask &= ~bit
        while i < n:
            key = self._key(path, i)
            assert node.children is not None
            child = node.children[key]
            le = len(child.edge)
            if i < keep < i + le:
                child = self._split(node, key, child, keep - i)
                le = keep - i
            if i + le > keep:
                child.mask &= ~bit
            trail.append((node, key, child))
            i += le
            node = child
        for parent, key, child in reversed(trail):
            if child.mask == 0:
                assert parent.children is not None
                del parent.children[key]
                if not parent.children:
                    parent.children = None
            else:
                self._merge(child)

    def _merge(self, node: _TNode) -> None:
        while node.children is not None and len(node.children) == 1 and node is not self._root:
            (only,) = node.children.values()
            if only.mask != node.mask:
                return
            node.edge += only.edge
            node.children = only.children

    def _merge_all(self) -> None:
        stack = [self._root]
        while stack:
            node = stack.pop()
            self._merge(node)
            if node.children:
                stack.extend(node.children.values())

    def iter_paths(self) -> Iterator[tuple[bytes, bytes]]:
        """Every (node id, path) pair, for tests and debugging."""
        for node_id, paths in self._paths.items():
            for p in paths:
                yield node_id, p
