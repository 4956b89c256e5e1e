"""The forwarding benchmarks' seeded workload (model_node/bench_forwarding.py)."""

from __future__ import annotations

import itertools

import pytest

from model_node.bench.forwarding import workload, zipf_weights


def test_zipf_weights_are_a_decreasing_distribution() -> None:
    w = zipf_weights(8, 1.1)
    assert sum(w) == pytest.approx(1.0)
    assert all(a > b for a, b in itertools.pairwise(w))
    assert w[0] / w[1] == pytest.approx(2 ** 1.1)


def test_workload_is_seeded_and_sorted() -> None:
    a, b = workload(100, 8, 0.36, 3, 7), workload(100, 8, 0.36, 3, 7)
    assert a == b and a != workload(100, 8, 0.36, 3, 8)
    assert all(x.at < y.at for x, y in itertools.pairwise(a))
    assert {j.entry for j in a} == {0, 1, 2} and {j.system for j in a} <= set(range(8))


def test_a_faster_rate_plays_the_same_requests_sooner() -> None:
    """The threshold sweep relies on this: only arrival times change with the rate."""
    slow, fast = workload(150, 8, 0.36, 3, 7), workload(150, 8, 1.44, 3, 7)
    assert [(j.entry, j.system, j.question) for j in slow] == [(j.entry, j.system, j.question) for j in fast]
    assert all(f.at == pytest.approx(s.at / 4) for s, f in zip(slow, fast, strict=True))


def test_popular_system_prompts_come_first() -> None:
    jobs = workload(2000, 8, 1.0, 3, 7)
    counts = [sum(j.system == i for j in jobs) for i in range(8)]
    assert counts[0] > counts[1] > counts[3] > counts[7] > 0
