"""``gentorrent bench hrtree``: HR-tree search latency, memory, sync bytes, and τ_c choice.

A synthetic group workload (seeded): ``nodes`` model nodes each keep their last ``cache``
prompts (LRU); prompts come from 8 system prompts of 64–2048 tokens (Zipf 1.1 popularity,
60 % of requests), bare prompts (a 5-token chat header + user text), multi-turn follow-ups
(30 %: an earlier prompt + a reply + a new turn) and long documents (LooGLE-like, up to 32k
tokens). ``L`` is learned by the Sentry from the first requests. Figures:

- ``search_{1k,8k,32k}_tokens_{mean,p50,p99}_us``: :meth:`HRTree.search` of a prompt of that
  many tokens (a list of ints, as a tokenizer returns) that shares a cached prefix: u32
  packing, chunk hashing and the tree walk, in the whole group's tree.
- ``memory_per_prefix_bytes``: tracemalloc bytes of the group tree ÷ cached prefixes;
  ``radix_memory_per_prefix_bytes`` the same for a path-compressed radix tree over the token
  ids (u32 edges, bitmask node sets: a lean baseline); ``memory_ratio_hrtree_vs_radix``.
- ``sync_full_bytes_per_node``: one node's full :class:`SubtreeUpdate`, encoded;
  ``radix_sync_full_bytes_per_node``: its prefixes as a radix tree of token ids in msgpack;
  ``sync_full_ratio_hrtree_vs_radix``. ``sync_delta_bytes_per_round``: a delta for a round in
  which 10 prefixes were cached and 10 evicted (baseline: the new prefixes' token ids plus an
  8-byte id per eviction); ``sync_bytes_per_node_per_round``: load report + subtree update
  averaged over the schedule (a full one every ``FULL_EVERY`` rounds, deltas between) and
  its baseline; ``sync_round_ratio_hrtree_vs_radix``.
- ``false_match_rate_tau{1..4}``: fraction of queries that the tree reports as a match
  (``d ≥ τ``) while none of the returned nodes truly shares a single chunk with the query;
  ``missed_reuse_rate_tau{τ}``: fraction of queries with a truly shared chunk somewhere in
  the group that are not matched; ``missed_reuse_tokens_frac_tau{τ}``: the reusable tokens
  in those missed queries ÷ all reusable tokens; ``reuse_available_rate``. The same with
  ``_b16`` (16-bit hashes) and ``_no_sentry`` (L empty: 256-token chunks only) for contrast.
"""

from __future__ import annotations

import array
import bisect
import gc
import random
import time
import tracemalloc
from typing import Any

import msgpack

from gentorrent.bench.stats import summarize
from model_node.group import FULL_EVERY
from model_node.hrtree import ChunkLengths, HRTree, common_prefix_units, default_tau_c, token_bytes
from model_node.messages import LoadReport, SubtreeUpdate
from model_node.sentry import Sentry
from overlay.wire import codec

VOCAB = 128_000
HEADER = array.array("I", [128000, 128006, 9125, 128007, 271])  # a llama-3-like chat header


def _tokens(rng: random.Random, n: int) -> array.array[int]:
    return array.array("I", [rng.randrange(1000, VOCAB) for _ in range(n)])


def _log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    return int(lo * (hi / lo) ** rng.random())


class Workload:
    """A seeded stream of prompts (u32 token arrays) as described in the module docstring."""

    def __init__(self, seed: int, n_docs: int = 20) -> None:
        self.rng = rng = random.Random(seed)
        self.systems = [HEADER + _tokens(rng, _log_uniform(rng, 64, 2048)) for _ in range(8)]
        weights = [1 / (i + 1) ** 1.1 for i in range(8)]
        total = sum(weights)
        self.cum = [sum(weights[: i + 1]) / total for i in range(8)]
        self.docs = [HEADER + _tokens(rng, 32_768) for _ in range(n_docs)]
        self.recent: list[array.array[int]] = []

    def next(self) -> array.array[int]:
        rng = self.rng
        r = rng.random()
        if r < 0.3 and self.recent:
            prev = rng.choice(self.recent[-500:])
            p = prev + _tokens(rng, rng.randrange(50, 300)) + _tokens(rng, _log_uniform(rng, 10, 400))
            p = p[:40_000]
        elif r < 0.33:
            doc = rng.choice(self.docs)
            p = doc[: rng.randrange(2000, len(doc))] + _tokens(rng, 50)
        elif r < 0.33 + 0.67 * 0.6:
            system = self.systems[bisect.bisect_left(self.cum, rng.random())]
            p = system + _tokens(rng, _log_uniform(rng, 20, 1500))
        else:
            p = HEADER + _tokens(rng, _log_uniform(rng, 20, 1500))
        self.recent.append(p)
        if len(self.recent) > 2000:
            del self.recent[:1000]
        return p


class TokenRadix:
    """Baseline: a path-compressed radix tree over token ids (u32 edges), node sets as
    bitmasks — the structure a central router (SGLang) keeps, without its KV pointers."""

    __slots__ = ("root",)

    def __init__(self) -> None:
        self.root: list[Any] = [b"", None, 0]  # edge, children {first 4 bytes: node}, mask

    def insert(self, slot: int, data: bytes) -> None:
        bit = 1 << slot
        node, i, n = self.root, 0, len(data)
        node[2] |= bit
        while i < n:
            key = data[i:i + 4]
            if node[1] is None:
                node[1] = {}
            child = node[1].get(key)
            if child is None:
                node[1][key] = [data[i:], None, bit]
                return
            e = child[0]
            m = _common(e, data[i:i + len(e)])
            if m < len(e):
                upper = [e[:m], {e[m:m + 4]: child}, child[2]]
                child[0] = e[m:]
                node[1][key] = upper
                child = upper
            child[2] |= bit
            i += m
            node = child

    def shared(self, data: bytes) -> dict[int, int]:
        """Tokens each slot truly shares with ``data`` (slot → longest common prefix)."""
        out: dict[int, int] = {}
        node, i, n = self.root, 0, len(data)
        while i < n and node[1]:
            child = node[1].get(data[i:i + 4])
            if child is None:
                break
            e = child[0]
            m = _common(e, data[i:i + len(e)])
            i += m
            mask = child[2]
            while mask:
                low = mask & -mask
                out[low.bit_length() - 1] = i // 4
                mask ^= low
            if m < len(e):
                break
            node = child
        return out

    def encode(self) -> bytes:
        """msgpack of nested ``[edge token ids, [children...]]`` (what a radix sync sends)."""

        def walk(node: list[Any]) -> list[Any]:
            ids = array.array("I")
            ids.frombytes(node[0])
            kids = [walk(c) for c in node[1].values()] if node[1] else []
            return [ids.tolist(), kids]

        packed: bytes = msgpack.packb(walk(self.root), use_bin_type=True)
        return packed


def _common(a: bytes, b: bytes) -> int:
    return common_prefix_units(a, b, 4)



def _node_id(i: int) -> bytes:
    return i.to_bytes(20, "big")


def _build(lengths: ChunkLengths, caches: list[list[array.array[int]]]) -> HRTree:
    tree = HRTree(lengths)
    for i, cache in enumerate(caches):
        for p in cache:
            tree.insert(_node_id(i), p)
    return tree


def _traced(build: Any) -> tuple[Any, int]:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    obj = build()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return obj, after - before


def _match_quality(tree: HRTree, truth: TokenRadix, queries: list[array.array[int]], suffix: str,
                   figures: dict[str, float]) -> None:
    lengths = tree.lengths
    taus = (1, 2, 3, 4)
    false = dict.fromkeys(taus, 0)
    missed = dict.fromkeys(taus, 0)
    missed_tokens = dict.fromkeys(taus, 0)
    available = reusable_tokens = 0
    for q in queries:
        depth, candidates = tree.search(q)
        ends = lengths.chunk_ends(len(q))
        shared = truth.shared(token_bytes(q))  # slot -> shared tokens
        best = max(shared.values(), default=0)
        true_chunks = bisect.bisect_right(ends, best)
        reusable = ends[true_chunks - 1] if true_chunks else 0
        useful = any(bisect.bisect_right(ends, shared.get(int.from_bytes(c, "big"), 0)) >= 1 for c in candidates)
        if true_chunks:
            available += 1
            reusable_tokens += reusable
        for t in taus:
            if depth >= t and not useful:
                false[t] += 1
            if depth < t and true_chunks:
                missed[t] += 1
                missed_tokens[t] += reusable
    n = len(queries)
    for t in taus:
        figures[f"false_match_rate_tau{t}{suffix}"] = false[t] / n
        figures[f"missed_reuse_rate_tau{t}{suffix}"] = missed[t] / max(available, 1)
        figures[f"missed_reuse_tokens_frac_tau{t}{suffix}"] = missed_tokens[t] / max(reusable_tokens, 1)
    if not suffix:
        figures["reuse_available_rate"] = available / n


def _search_latency(tree: HRTree, caches: list[list[array.array[int]]], wl: Workload, rng: random.Random,
                    trials: int) -> dict[str, float]:
    """Search latency: prompts of exactly 1k / 8k / 32k tokens that share a cached prefix."""
    figures: dict[str, float] = {}
    for label, n in (("1k", 1024), ("8k", 8192), ("32k", 32768)):
        if n <= 2048:
            pool = [p for c in caches for p in c if len(p) >= n // 2]
        else:
            pool = [p for c in caches for p in c if len(p) >= n - 64]
            if not pool:  # make sure a long document is cached somewhere
                doc = wl.docs[0]
                tree.insert(_node_id(0), doc)
                pool = [doc]
        queries: list[list[int]] = []
        for _ in range(trials):
            base = rng.choice(pool)
            keep = min(len(base), n - 16)
            q = base[:keep] + _tokens(rng, n - keep)
            queries.append(q.tolist())  # a tokenizer's output: a list of ints
        times = []
        for query in queries:
            t0 = time.perf_counter()
            depth, _ = tree.search(query)
            times.append(time.perf_counter() - t0)
            assert depth >= 1
        figures.update(summarize(f"search_{label}_tokens", times, unit="us"))
    return figures


def _sync_bytes(learned: ChunkLengths, caches: list[list[array.array[int]]], wl: Workload) -> dict[str, float]:
    """Sync bytes, one node (node 0) to one peer: a full update, a round's delta and the load
    report, against a radix tree's."""
    own = HRTree(learned)
    own.track(b"me")
    for p in caches[0]:
        own.insert(b"me", p)
    d = learned.digest
    full = SubtreeUpdate(2, 0, True, learned.version, d, own.paths(b"me"), ())
    full_bytes = len(codec.encode(full))
    solo = TokenRadix()
    for p in caches[0]:
        solo.insert(0, token_bytes(p))
    radix_full = len(solo.encode())
    mark = own.seq(b"me")
    new = [wl.next() for _ in range(10)]
    for p in caches[0][:10]:
        own.remove_path(b"me", learned.path(p))
    for p in new:
        own.insert(b"me", p)
    delta = own.delta_since(b"me", mark)
    assert delta is not None
    delta_bytes = len(codec.encode(SubtreeUpdate(3, 2, False, learned.version, d, delta.added, delta.removed)))
    radix_delta = len(msgpack.packb([[p.tolist() for p in new], [bytes(8)] * 10], use_bin_type=True))
    load_bytes = len(codec.encode(LoadReport(1_760_000_000_000, 1, 3, 1, 4, 512, 180, 123_456)))
    per_round = load_bytes + (full_bytes + (FULL_EVERY - 1) * delta_bytes) / FULL_EVERY
    radix_per_round = load_bytes + (radix_full + (FULL_EVERY - 1) * radix_delta) / FULL_EVERY
    return {
        "sync_full_bytes_per_node": float(full_bytes),
        "radix_sync_full_bytes_per_node": float(radix_full),
        "sync_full_ratio_hrtree_vs_radix": full_bytes / radix_full,
        "sync_delta_bytes_per_round": float(delta_bytes),
        "radix_sync_delta_bytes_per_round": float(radix_delta),
        "load_report_bytes": float(load_bytes),
        "sync_bytes_per_node_per_round": per_round,
        "radix_sync_bytes_per_node_per_round": radix_per_round,
        "sync_round_ratio_hrtree_vs_radix": per_round / radix_per_round,
    }


def run(quick: bool) -> tuple[dict[str, Any], dict[str, float]]:
    nodes, cache, warm, n_queries, trials = (10, 50, 600, 300, 50) if quick else (50, 100, 6000, 2000, 1000)
    wl = Workload(seed=2025, n_docs=5 if quick else 20)
    rng = random.Random(7)

    # The Sentry learns L from the first requests (as the group's proposer would).
    sentry = Sentry()
    first = [wl.next() for _ in range(1000 if not quick else 300)]
    for p in first:
        sentry.observe(p)
    learned = sentry.propose(version=1)

    # Steady state: every node keeps its last `cache` prompts.
    caches: list[list[array.array[int]]] = [[] for _ in range(nodes)]
    for p in first + [wl.next() for _ in range(warm)]:
        c = caches[rng.randrange(nodes)]
        c.append(p)
        if len(c) > cache:
            c.pop(0)
    prefixes = sum(len(c) for c in caches)

    tree, tree_bytes = _traced(lambda: _build(learned, caches))

    def build_radix() -> TokenRadix:
        r = TokenRadix()
        for i, c in enumerate(caches):
            for p in c:
                r.insert(i, token_bytes(p))
        return r

    radix, radix_bytes = _traced(build_radix)
    figures: dict[str, float] = {
        "cached_prefixes_count": float(prefixes),
        "mean_cached_prefix_tokens": sum(len(p) for c in caches for p in c) / prefixes,
        "memory_per_prefix_bytes": tree_bytes / prefixes,
        "memory_accounted_per_prefix_bytes": tree.memory_bytes() / prefixes,
        "radix_memory_per_prefix_bytes": radix_bytes / prefixes,
        "memory_ratio_hrtree_vs_radix": tree_bytes / radix_bytes,
    }

    figures.update(_search_latency(tree, caches, wl, rng, trials))
    figures.update(_sync_bytes(learned, caches, wl))

    # τ_c: how often a match is false, how often true reuse is missed, per threshold.
    sample = [wl.next() for _ in range(n_queries)]
    _match_quality(tree, radix, sample, "", figures)
    wide = ChunkLengths(learned.version, learned.lengths, learned.tail, 16)
    _match_quality(_build(wide, caches), radix, sample, "_b16", figures)
    _match_quality(_build(ChunkLengths(version=1), caches), radix, sample, "_no_sentry", figures)

    params = {
        "nodes": nodes,
        "prompts_cached_per_node": cache,
        "warmup_requests": warm,
        "tau_queries": n_queries,
        "search_trials_per_size": trials,
        "learned_L": list(learned.lengths),
        "system_prompt_lengths": [len(s) for s in wl.systems],
        "sentry_found": sentry.system_prompt_lengths(),
        "bits": learned.bits,
        "tau_c_default": default_tau_c(learned.bits),
        "tail": learned.tail,
        "full_every_rounds": FULL_EVERY,
        "seed": 2025,
    }
    return params, figures
