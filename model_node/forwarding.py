"""Forwarding among a group's model nodes: Algorithm 2 (paper §3.3 and appendix).

A model node that receives a user's request either serves it or forwards it, at most one
hop, to another member of its group. The decision reads two things the group keeps in sync
(:mod:`model_node.group`): the node table (each member's :class:`Load`) and the HR-tree
search result for the prompt (a :class:`~model_node.hrtree.Match`).

:func:`algorithm2` is the rule, a pure function:

- a request that was already forwarded is served where it is (``forwarded``);
- with no other member of known load, serve here (``alone``);
- on a match (depth ``d ≥ τ_c``), the candidate holding the prefix that would give it its
  first token soonest (:attr:`Load.cached_wait`), if under ``load_threshold`` (``match``);
- otherwise (``miss``, or ``match-overloaded`` when every candidate is at or over the
  threshold) the least relatively loaded node of the whole table, ourselves included.

Ties go to ourselves (no hop), then the higher capacity, then the lower node id.

A node's relative load (:attr:`Load.relative`) is work, not a request count: the seconds its
engine needs for the prompt tokens and output tokens it holds, at the rates it measured on its
own recent requests (:class:`Throughput`). A node holding one 2,000-token prompt is busier than
one holding three short questions, and a fast node is less loaded than a slow one with the
same queue. ``load_threshold`` is therefore in seconds (:data:`DEFAULT_LOAD_THRESHOLD`).

**Least predicted TTFT (issue 29).** The product decides by :func:`least_ttft` instead: the
node whose first token for this prompt would come soonest, its wait plus the prefill of the
prompt tokens it lacks (a holder of the matched prefix lacks only the tokens past the matched
chunks), plus, for a peer, the round trip to it that the forward adds (measured by the
driver). Costs within :data:`TTFT_TIE` of the least are a tie, won by the node idle the longest
(:attr:`Load.idle_ms`), else by ourselves (no hop). The simulation study behind it:
docs/simulations.md, "Against an oracle"; the decision: docs/decisions/0005-hrtree.md,
"Revision (issue 29)". :func:`algorithm2` stays for ``GroupConfig(rule="alg2")`` and the
benchmarks' baselines.

A :class:`ForwardingPolicy` is what the group driver calls for a user's request; the product
ships the rule of its :class:`~model_node.group.GroupConfig` (:meth:`~model_node.group.GroupState.decide`).
Benchmarks inject their baselines (:mod:`model_node.bench.policies`).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from model_node.hrtree import Match

if TYPE_CHECKING:
    from model_node.group import GroupState

DEFAULT_LOAD_THRESHOLD = 10.0  # seconds of queued work a cache holder may carry (the TTFT a user should not exceed)
# A node's rates before it has measured any (per capacity point: a capacity-c node is assumed
# c times as fast): llama.cpp with SmolLM2-135M on one thread of the 2-core development machine
# (simulations/data/costs.json: 0.024 s per prompt token, 0.039 s per output token), on the
# slow side on purpose: an underestimated wait keeps a request queued that should have been
# refused at once, an overestimated one only refuses early until the first reply is measured.
REF_PREFILL_RATE = 40.0  # prompt tokens per second per capacity point
REF_DECODE_RATE = 25.0  # output tokens per second per capacity point
MIN_SAMPLE_S = 1e-3  # shorter phases are not timed precisely enough to measure a rate
MATCH_PROBE_TOKENS = 64  # what is left of a prompt whose prefix a node caches (the question), for match_wait
TTFT_TIE = 0.01  # least_ttft: costs within 1 % (and TTFT_TIE_S) of the least are a tie
TTFT_TIE_S = 1e-3
IDLE_TIE_S = 0.1  # least_ttft: idle times this close are equal (a report's age is known only to about this)


@dataclass(slots=True)
class Load:
    """A model node's load: one row of the node table (paper §3.3: "the node's current load,
    latency..."), and what a model node reports about itself.

    The load is *work*, not a request count: ``prefill_tokens`` prompt tokens still to be
    evaluated (queued requests, less the prefix the engine already caches, and running ones
    before their first token) and ``decode_tokens`` output tokens still expected (running and
    queued requests), against the engine's measured rates ``prefill_rate`` and
    ``decode_rate`` (tokens/s of one stream; 0: not measured yet, ``capacity`` × the
    reference rates are assumed) and ``streams``, the sequences it generates at once.

    ``active``: requests being generated; ``queued``: waiting for a slot; ``capacity``: the
    node's capacity score 1–10 (§3.3); ``kv_usage_permille``: KV-cache use if the engine
    reports it; ``latency_ms``: recent median time to first token (0: unknown);
    ``pending`` / ``pending_tokens``: requests (and their prompt tokens) this node forwarded
    there since its last report; ``match_wait``: the seconds until the first token the node's
    admission would give a :data:`MATCH_PROBE_TOKENS`-token prompt, i.e. a request whose
    prefix it caches (an engine that orders prompts puts such a prompt ahead of cold ones as far
    as their promises allow: :mod:`model_node.admission`; -1: not reported); ``idle_ms``: how
    long the node has held no work (no request queued or generated), as of its report (-1: it
    holds work, or does not report it), which breaks :func:`least_ttft`'s ties."""

    active: int = 0
    queued: int = 0
    capacity: int = 1
    kv_usage_permille: int = 0
    latency_ms: int = 0
    pending: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    prefill_rate: float = 0.0
    decode_rate: float = 0.0
    streams: int = 1
    pending_tokens: int = 0
    match_wait: float = -1.0
    idle_ms: int = -1

    @property
    def prefill_wait(self) -> float:
        """Seconds until this node's engine has evaluated the prompts it holds (forwards since
        its last report included): what a new request waits before its own prompt starts.
        Prompts are evaluated one after another (a batched engine feeds them first come first
        served, between decode steps), so the tokens add up at the engine's aggregate
        ``prefill_rate``; they are not shared out over the streams."""
        return self.prefill_seconds(self.prefill_tokens + self.pending_tokens)

    def prefill_seconds(self, tokens: int) -> float:
        """Seconds this node's engine takes to evaluate ``tokens`` prompt tokens."""
        return tokens / (self.prefill_rate if self.prefill_rate > 0 else self.capacity * REF_PREFILL_RATE)

    @property
    def relative(self) -> float:
        """Relative load (paper §3.3's load ÷ capacity, counted in work): the seconds a new
        request would wait here before its own prompt starts. That is :attr:`prefill_wait`
        while a stream is free: the engine feeds prompts between decode steps, and the time
        those decode steps take is already in the measured ``prefill_rate``. When every stream
        is taken (``active + queued + pending`` ≥ ``streams``) it also waits for one to free:
        plus the output tokens held ÷ the per-stream decode rate, shared over the streams.
        Unmeasured rates are ``capacity`` × :data:`REF_PREFILL_RATE` / :data:`REF_DECODE_RATE`,
        so the capacity score still divides the load. Why decode work counts only with every
        stream taken: docs/decisions/0009-work-load-and-busy.md, "Second revision"."""
        wait = self.prefill_wait
        held = self.active + self.queued + self.pending
        if held >= max(1, self.streams):
            decode = self.decode_rate if self.decode_rate > 0 else self.capacity * REF_DECODE_RATE
            wait += self.decode_tokens / decode / max(1, self.streams)
        return wait

    @property
    def cached_wait(self) -> float:
        """Seconds a request whose prompt this node caches (an HR-tree match) would wait for its
        first token: :attr:`match_wait` plus a probe's prompt time for each forward since the
        report; :attr:`relative` when the node reports no ``match_wait``."""
        if self.match_wait < 0:
            return self.relative
        return self.match_wait + self.pending * self.prefill_seconds(MATCH_PROBE_TOKENS)

    @property
    def requests_relative(self) -> float:
        """The request-count measure the paper's text suggests and this node used before
        issue 19: requests per capacity point (a benchmark baseline compares against it)."""
        return (self.active + self.queued + self.pending) / self.capacity


class Throughput:
    """The engine's measured rates (I/O-free: the caller times each phase with its injected
    clock).

    ``prefill_rate``: prompt tokens the engine evaluates per second *while it has prompts to
    evaluate*, all streams together. Prompts are evaluated first come first served, so the
    time between two requests' first tokens, counted only while some prompt was pending, is
    the later one's prompt time (:meth:`prefill_started` / :meth:`prefill_ended`); per-stream
    times would count the prompts queued ahead of each request again (with 8 slots a node
    looked 8 times less loaded than it was, and let newcomers wait minutes). ``decode_rate``:
    output tokens after the first ÷ seconds from the first token to the last, per stream.
    Both include whatever else the node ran (contention). Samples come from the last
    ``window`` requests; prompt phases shorter than :data:`MIN_SAMPLE_S` are pooled, tokens and
    time, until together they are that long (a fast engine's prompts each take less; their
    tokens used to be dropped while their time was kept, so its rate read several times too
    low); decode phases that short, or without tokens, are not sampled; 0: unknown."""

    def __init__(self, window: int = 64) -> None:
        self._prefill: deque[tuple[int, float]] = deque(maxlen=window)
        self._decode: deque[tuple[int, float]] = deque(maxlen=window)
        self._outputs: deque[int] = deque(maxlen=window)
        self._prefilling = 0  # requests started whose first token has not come yet
        self._mark = 0.0  # when the pending-prompt time was last counted
        self._busy = 0.0  # pending-prompt seconds not yet attributed to a sample
        self._tokens = 0  # prompt tokens of short phases not yet in a sample (with their seconds in _busy)

    def prefill_started(self, now: float) -> None:
        """A request's prompt went to the engine at ``now``."""
        self._tick(now)
        self._prefilling += 1

    def prefill_ended(self, now: float, tokens: int | None) -> None:
        """A request's first token came at ``now``, after the engine evaluated ``tokens`` of its
        prompt; ``None``: it ended before its first token (cancelled, failed), and its time is
        counted with the next sample."""
        if self._prefilling == 0:
            return
        self._tick(now)
        self._prefilling -= 1
        if tokens is not None and tokens > 0:
            self._tokens += tokens
            if self._busy >= MIN_SAMPLE_S:  # short phases are pooled until they are long enough to time
                self._prefill.append((self._tokens, self._busy))
                self._busy, self._tokens = 0.0, 0

    def _tick(self, now: float) -> None:
        if self._prefilling > 0:
            self._busy += max(0.0, now - self._mark)
        self._mark = now

    def record(self, output_tokens: int, decode_s: float) -> None:
        """One reply ended: ``output_tokens`` in all, the last ``output_tokens - 1`` of them in
        ``decode_s`` seconds."""
        if output_tokens > 1 and decode_s >= MIN_SAMPLE_S:
            self._decode.append((output_tokens - 1, decode_s))
        if output_tokens > 0:
            self._outputs.append(output_tokens)

    @property
    def prefill_rate(self) -> float:
        return _rate(self._prefill)

    @property
    def decode_rate(self) -> float:
        return _rate(self._decode)

    def expected_output(self, max_tokens: int) -> int:
        """Output tokens to expect from a request allowed ``max_tokens``: the recent mean
        (rounded up), capped by ``max_tokens``; ``max_tokens`` before any request."""
        if not self._outputs:
            return max_tokens
        return max(1, min(max_tokens, -(-sum(self._outputs) // len(self._outputs))))


def _rate(samples: deque[tuple[int, float]]) -> float:
    seconds = sum(s for _, s in samples)
    return sum(n for n, _ in samples) / seconds if seconds > 0 else 0.0


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do with a request: serve it here (``target is None``) or forward it to
    ``target``. ``reason``: ``match``, ``match-overloaded``, ``miss``, ``forwarded`` or ``alone``
    (see :func:`algorithm2`; a benchmark baseline may name its own);
    ``depth`` is the HR-tree depth the prompt matched."""

    target: bytes | None
    reason: str
    depth: int

    @property
    def serve_locally(self) -> bool:
        return self.target is None


class ForwardingPolicy(Protocol):
    """Decides where a user's request (not a forwarded one) is served. It may update the
    state's bookkeeping (``decisions``, a target's ``pending``) as Algorithm 2 does."""

    def __call__(self, state: GroupState, token_ids: Sequence[int]) -> Decision: ...


def algorithm2(self_id: bytes, table: Mapping[bytes, Load], found: Match, *, tau_c: int,
               load_threshold: float, forwarded: bool = False,
               measure: Callable[[Load], float] | None = None) -> Decision:
    """Algorithm 2: where to serve a request whose prompt matched ``found`` in the HR-tree.

    ``table``: every node with a known load, ``self_id`` included; ``tau_c``: the minimum
    matched depth; ``load_threshold``: the relative load a matching candidate must be under.
    ``measure``: a node's relative load (default :attr:`Load.relative`, seconds of work, and
    :attr:`Load.cached_wait` for a matching candidate; a benchmark baseline passes
    :attr:`Load.requests_relative`, used for both).
    Pure: the caller counts the decision and the forward (see the module docstring)."""
    rel = measure or _work
    rel_match = measure or _cached
    depth = found.depth
    if forwarded:
        return Decision(None, "forwarded", depth)
    if len(table) <= 1:
        return Decision(None, "alone", depth)

    def rank_by(measure: Callable[[Load], float]) -> Callable[[bytes], tuple[float, bool, int, bytes]]:
        return lambda node: (measure(table[node]), node != self_id, -table[node].capacity, node)

    reason = "miss"
    if depth >= tau_c:
        under = [c for c in found.candidates if c in table and rel_match(table[c]) < load_threshold]
        if under:
            return _to(min(under, key=rank_by(rel_match)), "match", depth, self_id)
        reason = "match-overloaded"
    return _to(min(table, key=rank_by(rel)), reason, depth, self_id)


def predicted_ttft(load: Load, holder: bool, left: int, prompt_tokens: int) -> float:
    """A node's predicted seconds to the first token of a ``prompt_tokens``-token prompt: a
    ``holder`` of its matched prefix waits :attr:`Load.cached_wait` and evaluates the ``left``
    tokens past the matched chunks (less the :data:`MATCH_PROBE_TOKENS` its reported
    ``match_wait`` already counts); any other node waits :attr:`Load.relative` and evaluates the
    whole prompt. (:func:`least_ttft`'s cost; the forwarding simulation's too.)"""
    if holder:
        if load.match_wait >= 0:  # match_wait already counts a probe's prompt
            return load.cached_wait + load.prefill_seconds(max(0, left - MATCH_PROBE_TOKENS))
        return load.cached_wait + load.prefill_seconds(left)
    return load.relative + load.prefill_seconds(prompt_tokens)


def least_ttft(self_id: bytes, table: Mapping[bytes, Load], found: Match, prompt_tokens: int, *, tau_c: int,
               matched_tokens: int, load_threshold: float = math.inf, forwarded: bool = False,
               idle: Mapping[bytes, float] | None = None, hops: Mapping[bytes, float] | None = None) -> Decision:
    """The node of ``table`` with the least predicted time to first token for a
    ``prompt_tokens``-token prompt that matched ``found`` in the HR-tree (issue 29).

    A holder of the prompt's prefix (a candidate of a match, ``depth ≥ tau_c``) waits
    :attr:`Load.cached_wait`, then evaluates the ``prompt_tokens - matched_tokens`` tokens past
    the matched chunks (less the :data:`MATCH_PROBE_TOKENS` its reported ``match_wait`` already
    counts); any other node waits :attr:`Load.relative`, then evaluates the whole prompt. A node
    whose wait is at or over ``load_threshold`` is a choice only if every node's is: it would
    refuse the request as busy (its admission's limit, decision 0009; a node with every slot
    taken reports a ``match_wait`` of at least that limit), whatever the prefill it saves.
    ``hops``: the seconds a forward to each peer adds (about the round trip to it: the request
    crosses to the peer, whose reply cloves leave from there), added to its cost; a peer not in
    it costs no hop. Across regions the round trip can exceed the prefill a holder saves.

    Costs within :data:`TTFT_TIE` (and :data:`TTFT_TIE_S`) of the least are a tie: a node's
    own rates (exact) and its peers' (rounded in the load report) differ in the last digits,
    and without the margin every entry forwarded every request, all to the same peer (the
    simulation: docs/simulations.md, "Against an oracle"). A tie goes to the node idle the
    longest (``idle``: seconds each node has held no work, negative: it holds work; the
    oracle's tie-break; idle times within :data:`IDLE_TIE_S` are equal), then to ourselves (no
    hop), then the lower cost, the higher capacity, the lower id.

    Reasons: ``forwarded`` (served here), ``alone``, ``match`` (a holder wins),
    ``match-overloaded`` (a match, but a node without the prefix predicts an earlier first
    token), ``miss``. Pure: the caller counts the decision and the forward."""
    depth = found.depth
    if forwarded:
        return Decision(None, "forwarded", depth)
    if len(table) <= 1:
        return Decision(None, "alone", depth)
    holders = found.candidates if depth >= tau_c else frozenset()
    left = max(0, prompt_tokens - matched_tokens)

    def wait(node: bytes) -> float:
        return table[node].cached_wait if node in holders else table[node].relative

    hop = hops or {}
    costs = {n: predicted_ttft(table[n], n in holders, left, prompt_tokens) + (0.0 if n == self_id else hop.get(n, 0.0))
             for n in [n for n in table if wait(n) < load_threshold] or table}
    least = min(costs.values())
    near = [n for n, c in costs.items() if c <= least * (1 + TTFT_TIE) + TTFT_TIE_S]
    idle_s = {n: max(-1.0, (idle or {}).get(n, -1.0)) for n in near}
    longest = max(idle_s.values())
    if longest >= 0:  # the nodes idle the longest, within IDLE_TIE_S (rounding, a report's transit)
        near = [n for n in near if idle_s[n] >= longest - IDLE_TIE_S]
    best = min(near, key=lambda n: (n != self_id, costs[n], -table[n].capacity, n))
    reason = "match" if best in holders else "match-overloaded" if holders else "miss"
    return _to(best, reason, depth, self_id)


def with_group_rates(table: Mapping[bytes, Load]) -> dict[bytes, Load]:
    """``table`` with every rate a node has not measured yet (0) estimated from the nodes that
    have: the median of their measured rates per capacity point, times the node's capacity.
    Without it an unmeasured node counts :data:`REF_PREFILL_RATE` (slow on purpose), so an
    entry that has not served yet sees any measured peer as far faster than itself and
    forwards it every request, and so never measures its own rate (issue 29: on the testbed
    one echo node served most requests, across oceans). Nobody measured: unchanged. The
    median keeps one peer's false report from setting everyone's estimate once three nodes
    have measured (a peer can overstate only its own speed, which it could do anyway)."""
    prefill = [x.prefill_rate / x.capacity for x in table.values() if x.prefill_rate > 0]
    decode = [x.decode_rate / x.capacity for x in table.values() if x.decode_rate > 0]
    if not prefill and not decode:
        return dict(table)
    out = {}
    for node, load in table.items():
        p = load.prefill_rate or (statistics.median(prefill) * load.capacity if prefill else 0.0)
        d = load.decode_rate or (statistics.median(decode) * load.capacity if decode else 0.0)
        out[node] = load if (p, d) == (load.prefill_rate, load.decode_rate) else \
            dataclasses.replace(load, prefill_rate=p, decode_rate=d)
    return out


def _work(load: Load) -> float:
    return load.relative


def _cached(load: Load) -> float:
    return load.cached_wait


def _to(node: bytes, reason: str, depth: int, self_id: bytes) -> Decision:
    return Decision(None if node == self_id else node, reason, depth)
