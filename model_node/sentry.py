"""The Sentry and the group's agreement on the chunk length array ``L`` (paper appendix A3).

**Learning** (:class:`Sentry`). The Sentry keeps a window of recent prompts and finds the
lengths ``S = s_1 < s_2 < … < s_n`` of the common system prompts in them: a length ``s`` is a
system prompt when at least ``min_support`` prompts of the window share their first ``s``
tokens and then *diverge* — no single continuation carries ``dominance`` or more of them
(otherwise ``s`` is only the start of a longer shared prefix, or a lone conversation whose
turns extend each other). In the sorted window these are the LCP intervals of a suffix-array
style traversal: each interval ``(ℓ, members)`` is a set of adjacent prompts whose common
prefix is exactly ``ℓ`` tokens. From ``S`` and the separator ``δ`` the Sentry builds ``L`` as
the paper's formula (1)–(3)::

    l_1 = s_1,   l_2k = δ,   l_2k+1 = s_k+1 − s_k − δ

(lengths closer than ``δ + 1`` to the previous one are merged into it). Beyond the paper, any
chunk longer than the default chunk ``tail`` is cut into ``tail``-token pieces ending exactly
on the boundary, so long system prompts do not make the tree blind to shorter shared prefixes
(the boundaries ``s_k`` and ``s_k + δ`` are unchanged). See docs/decisions/0005-hrtree.md.

**Agreement** (:class:`LengthAgreement`). ``L`` is versioned and shared by the whole group: the
live member with the lowest node id proposes (:func:`proposer`), every ``refresh_every`` =
10,000 requests of the group (paper §5; the first one after ``warmup`` requests); the highest
version wins (:func:`supersedes`; equal versions with different contents: the lower digest
wins, so concurrent proposers converge); a node adopts it and rebuilds its tree. Proposals
from nodes outside the group are refused. Any member may pass the current ``L`` on to a peer
that reports an older version, so a lost proposal is repaired by the next sync round.
:class:`~model_node.group.GroupState` adds the churn rules on top (only the designated
proposer's ``L``, bounded version steps, a minimum interval, quarantine; issue 15).

Nothing here does I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from model_node.hrtree import (
    DEFAULT_BITS,
    DEFAULT_TAIL,
    MAX_LENGTHS,
    ChunkLengths,
    common_prefix_units,
    lengths_problem,
    token_bytes,
)

DEFAULT_DELTA = 16  # δ: the separator chunk after each system prompt (tokens)
REFRESH_EVERY = 10_000  # requests between refreshes of L (paper §5)
WARMUP = 1_000  # requests before the first proposal
WINDOW = 256  # prompts the Sentry keeps
MAX_PREFIX = 8192  # tokens of each prompt it keeps
MIN_LENGTH = 16  # shorter shared prefixes are not system prompts worth a boundary
MAX_SYSTEM_PROMPTS = 16


# --------------------------------------------------------------------------- L from S


def build_lengths(system_prompt_lengths: Iterable[int], *, delta: int = DEFAULT_DELTA,
                  tail: int = DEFAULT_TAIL) -> tuple[int, ...]:
    """``L`` from the system-prompt lengths ``S`` by appendix A3's formula (1)–(3).

    Boundaries fall at ``s_1, s_1 + δ, s_2, s_2 + δ, …``; a length within ``δ`` of the
    previous one is merged into it; chunks longer than ``tail`` are cut into ``tail``-token
    pieces (the last piece ends on the boundary). Capped at MAX_LENGTHS entries.
    """
    if delta < 1 or tail < 1:
        raise ValueError("delta and tail must be positive")
    bounds: list[int] = []
    for s in sorted(set(system_prompt_lengths)):
        if s < 1:
            continue
        if bounds and s <= bounds[-1]:
            continue  # within δ of the previous system prompt: merged
        bounds += [s, s + delta]
    out: list[int] = []
    prev = 0
    for b in bounds:
        gap = b - prev
        pieces = [tail] * ((gap - 1) // tail) + [gap - tail * ((gap - 1) // tail)]
        if len(out) + len(pieces) > MAX_LENGTHS:
            break
        out += pieces
        prev = b
    return tuple(out)


# --------------------------------------------------------------------------- learning


def _lcp_tokens(a: bytes, b: bytes) -> int:
    """Common prefix of two u32 token strings, in tokens (C-speed slice compares)."""
    return common_prefix_units(a, b, 4) // 4


def shared_prefix_lengths(prompts: Sequence[bytes], *, min_support: int, min_length: int = MIN_LENGTH,
                          dominance: float = 0.9) -> list[tuple[int, int]]:
    """``(length, support)`` of every shared prefix of ``prompts`` (u32 token strings) that at
    least ``min_support`` prompts share and after which they diverge: at least two different
    continuations, none holding ``dominance`` or more of the prompts that continue. Sorted by
    support (highest first), then length.

    The prompts are sorted; a range of adjacent prompts whose exact common prefix is ``ℓ``
    tokens is an lcp interval, its children are the sub-ranges that share more. A prompt that
    ends at ``ℓ`` (an earlier turn of a conversation, a duplicate) is no divergence, so a lone
    conversation whose turns extend each other yields nothing.
    """
    ps = sorted(prompts)
    n = len(ps)
    found: list[tuple[int, int]] = []
    if n < 2:
        return found
    lcp = [0] + [_lcp_tokens(ps[i - 1], ps[i]) for i in range(1, n)]  # lcp[i]: ps[i-1] vs ps[i]
    todo = [(0, n)]
    while todo:
        lo, hi = todo.pop()
        ell = min(lcp[lo + 1:hi])
        children, start = [], lo
        for j in range(lo + 1, hi):
            if lcp[j] == ell:
                children.append((start, j))
                start = j
        children.append((start, hi))
        size = hi - lo
        if ell >= min_length and size >= min_support:
            # Children that continue past ℓ: every range of ≥ 2 does; a single prompt only if longer.
            cont = [b - a for a, b in children if b - a > 1 or len(ps[a]) > 4 * ell]
            extending = sum(cont)
            if len(cont) >= 2 and max(cont) < dominance * extending:
                found.append((ell, size))
        todo.extend((a, b) for a, b in children if b - a > 1)
    found.sort(key=lambda t: (-t[1], t[0]))
    return found


class Sentry:
    """Learns common system-prompt lengths from the prompts a node receives (appendix A3).

    ``observe(token_ids)`` for each request that arrives from a user (not for forwarded
    ones: the first node observed them); ``count(n)`` adds requests other nodes of the
    group received (their load reports say how many), so refreshes follow the group's
    traffic. ``due()`` says a refresh is due: after ``warmup`` requests, then every
    ``refresh_every``. ``propose(version)`` returns the new ``L`` and restarts the count.
    """

    def __init__(self, *, window: int = WINDOW, max_prefix: int = MAX_PREFIX, min_length: int = MIN_LENGTH,
                 min_support: int | None = None, dominance: float = 0.9, delta: int = DEFAULT_DELTA,
                 tail: int = DEFAULT_TAIL, bits: int = DEFAULT_BITS, refresh_every: int = REFRESH_EVERY,
                 warmup: int = WARMUP, max_system_prompts: int = MAX_SYSTEM_PROMPTS) -> None:
        self.window: deque[bytes] = deque(maxlen=window)
        self.max_prefix = max_prefix
        self.min_length = min_length
        self.min_support = min_support if min_support is not None else max(4, window // 50)
        self.dominance = dominance
        self.delta = delta
        self.tail = tail
        self.bits = bits
        self.refresh_every = refresh_every
        self.warmup = warmup
        self.max_system_prompts = max_system_prompts
        self.requests = 0  # since the last proposal (local and counted)
        self.proposals = 0

    def observe(self, token_ids: Sequence[int]) -> None:
        try:
            data = token_bytes(token_ids[: self.max_prefix])
        except ValueError:
            return
        self.window.append(data)
        self.requests += 1

    def count(self, n: int) -> None:
        """``n`` more requests seen elsewhere in the group."""
        if n > 0:
            self.requests += n

    def restart(self) -> None:
        """A new ``L`` was adopted (ours or a peer's): count the next refresh from now."""
        self.requests = 0
        self.proposals += 1

    def due(self) -> bool:
        return self.requests >= (self.refresh_every if self.proposals else self.warmup)

    def system_prompt_lengths(self) -> list[int]:
        """``S``: the learned system-prompt lengths, ascending."""
        found = shared_prefix_lengths(list(self.window), min_support=self.min_support,
                                      min_length=self.min_length, dominance=self.dominance)
        return sorted(length for length, _ in found[: self.max_system_prompts])

    def lengths(self, tail: int | None = None) -> tuple[int, ...]:
        return build_lengths(self.system_prompt_lengths(), delta=self.delta, tail=tail or self.tail)

    def propose(self, version: int, *, tail: int | None = None, bits: int | None = None) -> ChunkLengths:
        """The ``L`` to propose as ``version`` (``tail`` and ``bits``: keep the group's, if
        given); restarts the refresh count."""
        self.restart()
        tail = tail or self.tail
        return ChunkLengths(version=version, lengths=self.lengths(tail), tail=tail, bits=bits or self.bits)


# --------------------------------------------------------------------------- agreement


def proposer(live_ids: Iterable[bytes]) -> bytes | None:
    """The node that proposes ``L``: the lowest node id among the live members."""
    return min(live_ids, default=None)


def supersedes(new: ChunkLengths, current: ChunkLengths) -> bool:
    """Whether ``new`` replaces ``current``: the highest version wins; at equal versions
    with different contents (two proposers at once) the lower digest wins."""
    if new.version != current.version:
        return new.version > current.version
    return new != current and new.digest < current.digest


@dataclass
class LengthAgreement:
    """A node's current ``L`` and the rule for adopting a peer's proposal.

    ``offer(peer, proposal, members)`` returns ``(adopted, reason)``: ``reason`` is
    ``"adopted"``, ``"non-member"`` (refused: the sender is outside the group),
    ``"bad-proposal"`` (malformed) or ``"not-newer"`` (an old or equal version).
    """

    current: ChunkLengths

    def offer(self, peer: bytes, proposal: ChunkLengths | tuple[int, Sequence[int], int, int],
              members: Collection[bytes]) -> tuple[bool, str]:
        if peer not in members:
            return False, "non-member"
        if not isinstance(proposal, ChunkLengths):
            version, lengths, tail, bits = proposal
            if lengths_problem(version, lengths, tail, bits) is not None:
                return False, "bad-proposal"
            proposal = ChunkLengths(version, tuple(lengths), tail, bits)
        if not supersedes(proposal, self.current):
            return False, "not-newer"
        self.current = proposal
        return True, "adopted"

    def next_version(self, highest_seen: int = 0) -> int:
        return max(self.current.version, highest_seen) + 1

