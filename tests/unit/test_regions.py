"""The testbed's regions and links (gentorrent/tools/regions.py)."""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from collections.abc import Callable

import pytest

from gentorrent.tools import regions as R
from overlay.anon.paths import wider_region


def test_regions_are_valid_region_names_each_with_an_azure_source() -> None:
    assert len(R.REGIONS) == 6 and len(set(R.REGIONS)) == 6
    azure = [R.REGION_INFO[r][1] for r in R.REGIONS]
    assert len(set(azure)) == len(azure)
    for r in R.REGIONS:
        assert r.islower() and "-" in r
        assert wider_region(r) in {"eu", "us", "ap"}  # the overlay's region scopes widen as intended


def test_published_table_has_both_directions_of_every_pair() -> None:
    azure = [R.REGION_INFO[r][1] for r in R.REGIONS]
    assert set(R.P50_RTT_MS) == {(a, b) for a, b in itertools.permutations(azure, 2)}
    assert all(isinstance(v, int) and v > 0 for v in R.P50_RTT_MS.values())


def test_rtt_is_symmetric_complete_and_positive() -> None:
    for a, b in itertools.product(R.REGIONS, repeat=2):
        assert R.rtt_ms(a, b) == R.rtt_ms(b, a) > 0
        assert R.one_way_ms(a, b) == R.rtt_ms(a, b) / 2
    for a in R.REGIONS:
        assert R.rtt_ms(a, a) == R.INTRA_REGION_RTT_MS
        assert all(R.rtt_ms(a, a) < R.rtt_ms(a, b) for b in R.REGIONS if b != a)


def test_rtt_is_the_mean_of_the_two_published_directions() -> None:
    # East US -> West Europe 83 ms, West Europe -> East US 85 ms (the source's CSV, 2026-07-30).
    assert R.rtt_ms("us-east", "eu-west") == 84.0
    assert R.rtt_ms("eu-west", "eu-central") == 11.0
    assert R.rtt_ms("ap-southeast", "ap-northeast") == 72.0


def test_link_carries_the_one_way_delay_jitter_rate_and_loss() -> None:
    link = R.link("eu-west", "us-east")
    assert link == R.link("us-east", "eu-west")
    assert link.latency_ms == 42.0
    assert link.jitter_ms == pytest.approx(42.0 * R.JITTER_FRACTION)
    assert link.rate_kbps == R.DEFAULT_RATE_KBPS == 6605
    assert link.loss == R.LOSS
    assert R.link("eu-west", "eu-west", rate_kbps=None).rate_kbps is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(link, "latency_ms", 1.0)  # noqa: B010 (a frozen dataclass refuses it)


def test_path_floor_sums_the_hops() -> None:
    path = ["eu-west", "us-east", "us-east", "ap-northeast"]
    assert R.path_floor_ms(path) == R.one_way_ms("eu-west", "us-east") + R.INTRA_REGION_RTT_MS / 2 \
        + R.one_way_ms("us-east", "ap-northeast")
    assert R.path_floor_ms(path) == 42.0 + 4.0 + 81.0
    assert R.path_floor_ms([]) == R.path_floor_ms(["eu-west"]) == 0.0


def test_assign_is_deterministic_balanced_and_covers_every_region() -> None:
    a = R.assign(100, seed=7)
    assert a == R.assign(100, seed=7)
    assert a != R.assign(100, seed=8)
    counts = Counter(a)
    assert set(counts) == set(R.REGIONS)
    assert sum(counts.values()) == 100 and max(counts.values()) - min(counts.values()) <= 1
    assert set(R.assign(6, seed=0)) == set(R.REGIONS)
    assert R.assign(0, seed=0) == []


def test_assign_follows_weights() -> None:
    a = R.assign(10, seed=1, weights={"eu-west": 3, "us-east": 1, "ap-southeast": 1})
    assert Counter(a) == {"eu-west": 6, "us-east": 2, "ap-southeast": 2}
    assert Counter(R.assign(7, seed=1, weights={"us-west": 1})) == {"us-west": 7}


@pytest.mark.parametrize("call", [
    lambda: R.rtt_ms("eu-west", "mars"),
    lambda: R.one_way_ms("moon", "eu-west"),
    lambda: R.link("eu-west", "EU-WEST"),
    lambda: R.path_floor_ms(["eu-west", "eu"]),
    lambda: R.assign(3, seed=0, weights={"atlantis": 1}),
])
def test_unknown_region_is_a_clear_error(call: Callable[[], object]) -> None:
    with pytest.raises(ValueError, match=r"unknown region .* the testbed's regions are eu-west"):
        call()


def test_assign_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="weights must be >= 0"):
        R.assign(3, seed=0, weights={"eu-west": -1})
    with pytest.raises(ValueError, match="sum to 0"):
        R.assign(3, seed=0, weights={"eu-west": 0})
    with pytest.raises(ValueError, match="-1 nodes"):
        R.assign(-1, seed=0)
