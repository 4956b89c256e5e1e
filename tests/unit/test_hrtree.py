"""The HR-tree (paper §3.3, Algorithm 1): chunking, keyed b-bit chunk hashes, search,
subtree export/import and deltas, false-positive rates, hashes equal across processes."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from model_node.hrtree import (
    MAX_DEPTH,
    ChunkLengths,
    HRTree,
    Match,
    common_prefix,
    default_tau_c,
    token_bytes,
)

REPO = Path(__file__).resolve().parents[2]
A, B, C = b"A" * 20, b"B" * 20, b"C" * 20


def prompt(rng: random.Random, n: int, lo: int = 0, hi: int = 100_000) -> list[int]:
    return [rng.randrange(lo, hi) for _ in range(n)]


# --------------------------------------------------------------------------- chunking and hashing


def test_chunks_follow_L_then_the_tail() -> None:
    L = ChunkLengths(lengths=(100, 16), tail=64)
    assert L.chunk_ends(50) == []  # no complete chunk: nothing to hash
    assert L.chunk_ends(100) == [100]
    assert L.chunk_ends(115) == [100]
    assert L.chunk_ends(116) == [100, 116]
    assert L.chunk_ends(300) == [100, 116, 180, 244]  # the partial chunk 244..300 is not hashed
    assert len(ChunkLengths(tail=1).chunk_ends(10 * MAX_DEPTH)) == MAX_DEPTH


def test_path_has_one_hash_per_complete_chunk() -> None:
    L = ChunkLengths(lengths=(4, 2), tail=3)
    assert len(L.path(list(range(15)))) == 5
    assert len(L.path(list(range(17)))) == 5
    assert L.path(list(range(3))) == b""
    wide = ChunkLengths(lengths=(4, 2), tail=3, bits=12)
    path = wide.path(list(range(15)))
    assert len(path) == 10
    assert all(int.from_bytes(path[i:i + 2], "big") < 4096 for i in range(0, 10, 2))
    narrow = ChunkLengths(tail=1, bits=3)
    assert max(narrow.path(list(range(500)))) < 8


def test_chunk_hash_known_answer() -> None:
    """Pins the hash (BLAKE2b keyed by the L digest, u32 little-endian tokens): every node
    and every future version of this code must compute exactly these bytes."""
    L = ChunkLengths(version=3, lengths=(4, 2), tail=3, bits=8)
    assert L.digest.hex() == "3372652dc456f893"
    assert L.path(list(range(1000, 1015))).hex() == "50c0ad0a68"
    L12 = ChunkLengths(version=3, lengths=(4, 2), tail=3, bits=12)
    assert L12.path(list(range(1000, 1015))).hex() == "0e2705920ee102b60a91"


def test_hash_is_keyed_by_the_L_version_and_contents() -> None:
    rng = random.Random(7)
    tokens = prompt(rng, 64 * 200)
    base = ChunkLengths(version=1, tail=64)
    other_version = ChunkLengths(version=2, tail=64)
    other_lengths = ChunkLengths(version=1, lengths=(64,), tail=64)  # same chunks, another L
    assert base.path(tokens) == ChunkLengths(version=1, tail=64).path(tokens)
    for other in (other_version, other_lengths):
        assert other.key != base.key and other.digest != base.digest
        p, q = base.path(tokens), other.path(tokens)
        assert len(p) == len(q) == 200
        assert sum(x == y for x, y in zip(p, q, strict=True)) < 10  # independent 8-bit hashes: ≈ 200/256 agree


def test_bad_lengths_and_token_ids_are_refused() -> None:
    for kwargs in ({"bits": 0}, {"bits": 17}, {"tail": 0}, {"lengths": (0,)}, {"lengths": (5, -1)},
                   {"version": -1}, {"lengths": (1,) * 257}):
        with pytest.raises(ValueError):
            ChunkLengths(**kwargs)  # mixed-type kwargs on purpose
    with pytest.raises(ValueError):
        token_bytes([1, -1])
    with pytest.raises(ValueError):
        token_bytes([2**32])
    with pytest.raises(ValueError):
        ChunkLengths(tail=1).path([1, "x"])  # type: ignore[list-item]  # a non-int token on purpose


def test_path_problem_names_malformed_paths() -> None:
    L8, L4, L12 = ChunkLengths(), ChunkLengths(bits=4), ChunkLengths(bits=12)
    assert L8.path_problem(b"\x01\x02") is None
    assert L8.path_problem(b"") == "empty path"
    assert "exceeds" in (L8.path_problem(b"\x00" * (MAX_DEPTH + 1)) or "")
    assert "bits" in (L4.path_problem(b"\x0f\x10") or "")
    assert "whole number" in (L12.path_problem(b"\x00\x01\x02") or "")
    assert "bits" in (L12.path_problem(b"\x10\x00") or "")
    assert L12.path_problem(b"\x0f\xff") is None


# --------------------------------------------------------------------------- the tree


def test_search_returns_depth_and_nodes_holding_the_prefix() -> None:
    rng = random.Random(1)
    L = ChunkLengths(lengths=(100, 16), tail=64, bits=16)  # 16 bits: no accidental collision here
    tree = HRTree(L)
    a = prompt(rng, 1000)
    b = a[:300] + prompt(rng, 500)
    assert tree.insert(A, a) and tree.insert(B, b)
    assert not tree.insert(A, a)  # already there
    assert tree.search(a) == Match(len(L.chunk_ends(1000)), frozenset({A}))
    assert tree.search(a[:200]) == Match(3, frozenset({A, B}))  # chunks end at 100, 116, 180
    assert tree.search(b).candidates == {B}
    assert tree.search(b).depth == len(L.chunk_ends(800))
    assert tree.search(a[:300] + prompt(rng, 300)).depth == 4  # shares 4 chunks (…244), then differs
    assert tree.search(prompt(rng, 1000, 200_000, 300_000)).candidates == frozenset()
    assert tree.search(a[:99]) == Match(0, frozenset())


def test_match_applies_tau_c() -> None:
    rng = random.Random(2)
    tree = HRTree(ChunkLengths(tail=10))
    a = prompt(rng, 100)
    tree.insert(A, a)
    q = a[:25] + prompt(rng, 75)  # two shared chunks
    assert tree.match(q, tau_c=2) == Match(2, frozenset({A}))
    assert tree.match(q, tau_c=3) == Match(2, frozenset())
    assert tree.match(prompt(rng, 100, 500_000, 600_000), tau_c=0).candidates == frozenset()
    assert tree.match(q) == Match(2, frozenset({A}))  # default τ_c for 8 bits: 2
    assert tree.match(a[:15] + prompt(rng, 85)) == Match(1, frozenset())
    assert [default_tau_c(b) for b in (1, 4, 8, 12, 16)] == [16, 4, 2, 2, 1]


def test_remove_path_keeps_what_other_paths_of_the_node_hold() -> None:
    tree = HRTree(ChunkLengths(tail=1))
    tree.insert_path(A, b"\x01\x02\x03\x04")
    tree.insert_path(A, b"\x01\x02\x09")
    tree.insert_path(B, b"\x01\x02\x03\x04\x05")
    assert tree.remove_path(A, b"\x01\x02\x03\x04")
    assert not tree.remove_path(A, b"\x01\x02\x03\x04")
    assert tree.search_path(b"\x01\x02\x03\x04") == Match(4, frozenset({B}))
    assert tree.search_path(b"\x01\x02") == Match(2, frozenset({A, B}))
    assert tree.search_path(b"\x01\x02\x09") == Match(3, frozenset({A}))
    assert tree.remove_node(B)
    assert tree.search_path(b"\x01\x02\x03") == Match(2, frozenset({A}))
    assert tree.node_ids() == [A]
    assert tree.remove_path(A, b"\x01\x02\x09")
    assert tree.search_path(b"\x01\x02") == Match(0, frozenset())
    assert len(tree) == 0 and tree.tree_node_count() == 1


def test_per_node_limit() -> None:
    tree = HRTree(ChunkLengths(tail=1), max_paths_per_node=3)
    assert [tree.insert_path(A, bytes([i])) for i in range(5)] == [True, True, True, False, False]
    assert tree.path_count(A) == 3
    assert tree.insert_path(B, b"\x09")


def test_export_import_round_trip() -> None:
    rng = random.Random(3)
    L = ChunkLengths(tail=32)
    src = HRTree(L)
    system = prompt(rng, 500)
    for _ in range(40):
        src.insert(A, system + prompt(rng, rng.randrange(0, 2000)))
    exported = src.paths(A)
    assert list(exported) == sorted(exported)
    dst = HRTree(L)
    dst.replace_paths(A, exported)
    assert dst.paths(A) == exported
    q = system + prompt(rng, 100)
    assert dst.search(q) == src.search(q)
    assert dst.tree_node_count() == src.tree_node_count()


def test_delta_since_a_sequence_number() -> None:
    tree = HRTree(ChunkLengths(tail=1), journal_size=8)
    tree.track(A)
    tree.insert_path(A, b"\x01")
    tree.insert_path(A, b"\x02")
    s = tree.seq(A)
    assert s == 2
    tree.insert_path(A, b"\x03")
    tree.remove_path(A, b"\x01")
    tree.insert_path(A, b"\x04")
    tree.remove_path(A, b"\x04")  # added and removed again: no net change
    tree.remove_path(A, b"\x02")
    tree.insert_path(A, b"\x02")  # removed and added back: no net change
    d = tree.delta_since(A, s)
    assert d is not None
    assert (d.base, d.seq, d.added, d.removed) == (2, tree.seq(A), (b"\x03",), (b"\x01",))
    now = tree.delta_since(A, tree.seq(A))
    assert now is not None and now.added == ()
    assert tree.delta_since(A, tree.seq(A) + 1) is None  # from the future
    assert tree.delta_since(B, 0) is None  # not tracked
    for i in range(10, 30):  # overflow the 8-entry journal
        tree.insert_path(A, bytes([i]))
    assert tree.delta_since(A, s) is None
    assert tree.delta_since(A, tree.seq(A) - 4) is not None


def test_memory_accounting_grows_with_prefixes() -> None:
    rng = random.Random(4)
    tree = HRTree(ChunkLengths(tail=256))
    empty = tree.memory_bytes()
    for i in range(100):
        tree.insert(bytes([i % 5]) * 20, prompt(rng, 8192))
    per_prefix = (tree.memory_bytes() - empty) / 100
    assert 100 < per_prefix < 2000  # one compressed edge (+ a sorted path entry) per prefix
    for i in range(5):
        tree.remove_node(bytes([i]) * 20)
    assert tree.tree_node_count() == 1
    assert tree.memory_bytes() < empty + 1000  # only the (resized) bookkeeping containers remain


# --------------------------------------------------------------------------- properties

ALPHABET = st.binary(min_size=1, max_size=6).map(lambda b: bytes(x % 3 for x in b))  # lots of sharing
NODES = st.sampled_from([A, B, C])


def reference_search(stored: set[tuple[bytes, bytes]], query: bytes) -> Match:
    """Algorithm 1 by brute force: the longest shared chunk prefix and who holds it."""
    depth = max((common_prefix(p, query) for _, p in stored), default=0)
    if depth == 0:
        return Match(0, frozenset())
    return Match(depth, frozenset(n for n, p in stored if common_prefix(p, query) >= depth))


def canonical_node_count(stored: set[tuple[bytes, bytes]]) -> int:
    fresh = HRTree(ChunkLengths(tail=1))
    for n, p in sorted(stored):
        fresh.insert_path(n, p)
    return fresh.tree_node_count()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(st.tuples(st.booleans(), NODES, ALPHABET), max_size=40),
       queries=st.lists(ALPHABET, min_size=1, max_size=8),
       gone=st.sets(NODES, max_size=1))
def test_search_is_the_longest_matching_prefix(ops: list[tuple[bool, bytes, bytes]], queries: list[bytes],
                                                gone: set[bytes]) -> None:
    tree = HRTree(ChunkLengths(tail=1))
    stored: set[tuple[bytes, bytes]] = set()
    for add, node, path in ops:
        if add:
            assert tree.insert_path(node, path) == ((node, path) not in stored)
            stored.add((node, path))
        else:
            assert tree.remove_path(node, path) == ((node, path) in stored)
            stored.discard((node, path))
    for node in gone:
        tree.remove_node(node)
        stored = {(n, p) for n, p in stored if n != node}
    for q in queries + [p for _, p in stored]:
        assert tree.search_path(q) == reference_search(stored, q)
    assert sorted(tree.iter_paths()) == sorted(stored)
    # Removal leaves the same compressed tree as building from scratch (no debris).
    assert tree.tree_node_count() == canonical_node_count(stored)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_prompts=st.integers(1, 6), lengths=st.lists(st.integers(1, 6), max_size=3),
       tail=st.integers(1, 5))
def test_search_on_token_prompts_matches_the_reference(seed: int, n_prompts: int, lengths: list[int],
                                                       tail: int) -> None:
    rng = random.Random(seed)
    L = ChunkLengths(lengths=tuple(lengths), tail=tail)
    tree = HRTree(L)
    base = prompt(rng, 40, 0, 4)  # a tiny vocabulary: prompts share prefixes
    stored = set()
    for i in range(n_prompts):
        p = base[: rng.randrange(0, 40)] + prompt(rng, rng.randrange(0, 20), 0, 4)
        node = [A, B, C][i % 3]
        tree.insert(node, p)
        if L.path(p):
            stored.add((node, L.path(p)))
    q = base[: rng.randrange(0, 40)] + prompt(rng, 10, 0, 4)
    assert tree.search(q) == reference_search(stored, L.path(q))


# --------------------------------------------------------------------------- false positives


@pytest.mark.parametrize(("bits", "depth", "queries"), [(8, 1, 40_000), (4, 1, 20_000), (4, 2, 40_000),
                                                        (2, 1, 10_000), (2, 3, 40_000), (2, 4, 40_000)])
def test_false_positive_rate_is_2_to_the_minus_b_d(bits: int, depth: int, queries: int) -> None:
    """A prompt sharing nothing with the one stored prompt still reaches depth ≥ d with
    probability 2^(−b·d) (paper §3.3: "as small as 1/256^d"). Fixed seed: deterministic."""
    rng = random.Random(1000 * bits + depth)
    L = ChunkLengths(tail=1, bits=bits)
    tree = HRTree(L)
    tree.insert(A, prompt(rng, depth + 1, 0, 1_000_000))
    hits = 0
    for _ in range(queries):
        q = prompt(rng, depth, 1_000_000, 2_000_000)  # disjoint vocabulary: never a true match
        hits += tree.search(q).depth >= depth
    p = 2.0 ** (-bits * depth)
    sigma = math.sqrt(queries * p * (1 - p))
    assert abs(hits - queries * p) <= max(5 * sigma, 3), (hits, queries * p)


# --------------------------------------------------------------------------- across processes

_PROBE = """
import json, sys
from model_node.hrtree import ChunkLengths
out = []
for version, lengths, tail, bits in [(0, (), 256, 8), (5, (7, 3), 4, 8), (9, (100, 16), 32, 12), (2, (), 3, 5)]:
    L = ChunkLengths(version, lengths, tail, bits)
    out.append(L.path(list(range(31, 31 + 600))).hex())
print(json.dumps(out))
"""


def _paths_here() -> list[str]:
    out = []
    for version, lengths, tail, bits in [(0, (), 256, 8), (5, (7, 3), 4, 8), (9, (100, 16), 32, 12), (2, (), 3, 5)]:
        L = ChunkLengths(version, lengths, tail, bits)
        out.append(L.path(list(range(31, 31 + 600))).hex())
    return out


def test_hashes_agree_across_processes() -> None:
    """Two interpreters with different hash seeds compute the same chunk hashes as this one."""
    results = []
    for seed in ("1", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, cwd=REPO,
                              env=env, timeout=60, check=True)
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert results[0] == results[1] == _paths_here()
    assert all(results[0])


# --------------------------------------------------------------------------- the benchmark


def test_bench_quick_reports_every_documented_key(helpers: Any) -> None:
    """``gentorrent bench hrtree --quick`` runs, and its figures are exactly those documented
    (no timing is asserted: benchmarks are not tests)."""
    from model_node.bench.hrtree import run

    params, figures = run(quick=True)
    assert set(figures) == helpers.documented_figures("hrtree")
    assert all(isinstance(v, float) and math.isfinite(v) and v >= 0 for v in figures.values())
    assert params["bits"] == 8 and params["tau_c_default"] == 2
