"""Regions of the wide-area testbed and the links between them (pure data and arithmetic, no I/O).

The testbed (docs/testbed.md) puts each node in one of :data:`REGIONS` and delays every
connection by the one-way delay between the dialler's region and the listener's region, on both
streams, with jitter and a bandwidth cap (:func:`link`).

Round-trip times: **Microsoft, "Azure network round-trip latency statistics"**,
https://learn.microsoft.com/en-us/azure/networking/azure-network-latency — the dataset taken on
July 30, 2026 (monthly P50 round trip times over the 30 days ending July 30, 2026, measured by
probes between Azure regions every minute), read from the page's single CSV table (rows: source
region, columns: destination region; the per-area tabs show the same numbers). The table is
directional (e.g. East US -> West Europe 83 ms, West Europe -> East US 85 ms): :data:`P50_RTT_MS`
keeps both published directions and :func:`rtt_ms` is their mean, so the model is symmetric.
Each of our regions stands for one Azure region (:data:`REGION_INFO`).

Within a region the source gives nothing (the diagonal is empty). We take
:data:`INTRA_REGION_RTT_MS` = 8 ms: the same source's P50 between two datacenters of one
geography are 7-9 ms (East US <-> East US 2: 8 / 9, Korea Central <-> Korea South: 8 / 9,
UK South <-> UK West: 7 / 8, Switzerland North <-> Switzerland West: 7 / 7).

Jitter (our assumption, :data:`JITTER_FRACTION`): Toxiproxy draws each chunk's delay uniformly
in latency +/- jitter; we set jitter to 5% of the one-way delay. A uniform +/-J has standard
deviation J/sqrt(3), so two independent legs give a round trip whose standard deviation is about
2% of its mean — the middle of the five sample rows WonderProxy published of its hourly
``ping -c 30`` between its servers (https://wonderproxy.com/blog/a-day-in-the-life-of-the-internet/,
2020-07-20 rows: mdev / avg from 0.04% to 4.0%, median 1.9%). Five rows are a thin sample.

Bandwidth (:data:`DEFAULT_RATE_KBPS`): the global median *upload* speed of fixed broadband,
52.84 Mbit/s, in Ookla's Speedtest Global Index for January 2025 (as reported by Neowin,
https://www.neowin.net/news/ookla-speed-test-report-these-countries-have-the-fastest-internet-in-2025-so-far/;
download 97.61 Mbit/s). Upload is the narrower side of a home link and relays send as much as
they receive. 52.84 Mbit/s = 6,605 KB/s (Toxiproxy's KB is 1,000 bytes).

Loss (:data:`LOSS`, a fraction of TCP segments): SLAC's PingER reports losses below 0.1% between
North America and Europe, East Asia and Oceania, and above 0.1% (up to a few per cent) to
South-East Asia, South Asia, Latin America and Africa
(https://confluence.slac.stanford.edu/pages/diffpagesbyversion.action?pageId=32784&selectedPageVersions=10&selectedPageVersions=11,
data 2002-2006); we use 0.1% for every pair. Toxiproxy sits on TCP streams and cannot drop a
packet inside one; our build's ``loss`` toxic (tools/toxiproxy/loss.go) charges each lost
segment the time TCP takes to repair it on the link's round trip (docs/testbed.md "Loss").
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise

# Our region name -> (where it is, the Azure region whose measurements it takes).
REGION_INFO: dict[str, tuple[str, str]] = {
    "eu-west": ("Amsterdam, Netherlands", "West Europe"),
    "eu-central": ("Frankfurt, Germany", "Germany West Central"),
    "us-east": ("Virginia, USA", "East US"),
    "us-west": ("California, USA", "West US"),
    "ap-southeast": ("Singapore", "Southeast Asia"),
    "ap-northeast": ("Tokyo, Japan", "Japan East"),
}

REGIONS: tuple[str, ...] = tuple(REGION_INFO)

SOURCE_URL = "https://learn.microsoft.com/en-us/azure/networking/azure-network-latency"
SOURCE_DATASET = "Azure network round-trip latency statistics, P50, dataset taken 2026-07-30"

# (source Azure region, destination Azure region) -> published P50 round trip, ms, exactly as in
# the source's CSV table (row = source, column = destination).
P50_RTT_MS: dict[tuple[str, str], int] = {
    ("West Europe", "Germany West Central"): 11,
    ("West Europe", "East US"): 85,
    ("West Europe", "West US"): 146,
    ("West Europe", "Southeast Asia"): 169,
    ("West Europe", "Japan East"): 233,
    ("Germany West Central", "West Europe"): 11,
    ("Germany West Central", "East US"): 94,
    ("Germany West Central", "West US"): 151,
    ("Germany West Central", "Southeast Asia"): 166,
    ("Germany West Central", "Japan East"): 235,
    ("East US", "West Europe"): 83,
    ("East US", "Germany West Central"): 94,
    ("East US", "West US"): 69,
    ("East US", "Southeast Asia"): 224,
    ("East US", "Japan East"): 162,
    ("West US", "West Europe"): 145,
    ("West US", "Germany West Central"): 152,
    ("West US", "East US"): 67,
    ("West US", "Southeast Asia"): 170,
    ("West US", "Japan East"): 108,
    ("Southeast Asia", "West Europe"): 169,
    ("Southeast Asia", "Germany West Central"): 166,
    ("Southeast Asia", "East US"): 224,
    ("Southeast Asia", "West US"): 170,
    ("Southeast Asia", "Japan East"): 72,
    ("Japan East", "West Europe"): 234,
    ("Japan East", "Germany West Central"): 236,
    ("Japan East", "East US"): 162,
    ("Japan East", "West US"): 107,
    ("Japan East", "Southeast Asia"): 72,
}

INTRA_REGION_RTT_MS = 8.0  # our choice; see the module docstring
JITTER_FRACTION = 0.05  # jitter = 5% of the one-way delay (our assumption)
DEFAULT_RATE_KBPS = 6605  # 52.84 Mbit/s in Toxiproxy's KB/s (1 KB = 1,000 bytes)
LOSS = 0.001  # of TCP segments, from PingER (docs/testbed.md "Loss")


@dataclass(frozen=True)
class Link:
    """What a connection from one region to another goes through, per direction: ``latency_ms``
    one-way delay, ``jitter_ms`` (+/-, uniform), ``rate_kbps`` bandwidth cap in KB/s (``None``
    or 0: none) and ``loss`` (the fraction of TCP segments lost; 0: none)."""

    latency_ms: float
    jitter_ms: float
    rate_kbps: int | None
    loss: float


def check_region(region: str) -> str:
    """``region`` if it is one of :data:`REGIONS`, else ValueError naming them."""
    if region not in REGION_INFO:
        raise ValueError(f"unknown region {region!r}: the testbed's regions are {', '.join(REGIONS)}")
    return region


def rtt_ms(a: str, b: str) -> float:
    """The round-trip time between regions ``a`` and ``b`` in ms: the mean of the two published
    directions (symmetric), or :data:`INTRA_REGION_RTT_MS` within one region."""
    check_region(a)
    check_region(b)
    if a == b:
        return INTRA_REGION_RTT_MS
    sa, sb = REGION_INFO[a][1], REGION_INFO[b][1]
    return (P50_RTT_MS[sa, sb] + P50_RTT_MS[sb, sa]) / 2


def one_way_ms(a: str, b: str) -> float:
    """The one-way delay between ``a`` and ``b`` in ms: half the round trip."""
    return rtt_ms(a, b) / 2


def link(a: str, b: str, *, rate_kbps: int | None = DEFAULT_RATE_KBPS, loss: float = LOSS) -> Link:
    """The link from region ``a`` to region ``b`` (the same both ways)."""
    latency = one_way_ms(a, b)
    return Link(latency_ms=latency, jitter_ms=latency * JITTER_FRACTION, rate_kbps=rate_kbps, loss=loss)


def path_floor_ms(regions: Sequence[str]) -> float:
    """The least time data takes along a path through ``regions`` (a node per entry, in order):
    the sum of the one-way delays of consecutive hops, without jitter, queueing or processing.
    One region (or none): 0."""
    for r in regions:
        check_region(r)
    return sum(one_way_ms(a, b) for a, b in pairwise(regions))


def assign(n: int, seed: int, weights: Mapping[str, float] | None = None) -> list[str]:
    """Regions for ``n`` nodes, deterministic in ``(n, seed, weights)``: each region gets its
    share of ``n`` by ``weights`` (default: equal), rounded by largest remainder (ties go to the
    region listed first in :data:`REGIONS`), then the list is shuffled with ``random.Random(seed)``.
    So with equal weights every region has ``n // 6`` or one more node, and ``n >= 6`` covers all."""
    if n < 0:
        raise ValueError(f"cannot assign regions to {n} nodes")
    if weights is None:
        weights = dict.fromkeys(REGIONS, 1.0)
    for r, w in weights.items():
        check_region(r)
        if not w >= 0:  # also rejects NaN
            raise ValueError(f"region {r!r} has weight {w}; weights must be >= 0")
    total = sum(weights.values())
    if total <= 0:
        raise ValueError("region weights sum to 0: give at least one region a positive weight")
    shares = {r: n * weights.get(r, 0.0) / total for r in REGIONS}
    counts = {r: int(s) for r, s in shares.items()}
    left = n - sum(counts.values())
    by_remainder = sorted((r for r in REGIONS if weights.get(r, 0.0) > 0), key=lambda r: (-(shares[r] - counts[r]), REGIONS.index(r)))
    for r in by_remainder[:left]:
        counts[r] += 1
    out = [r for r in REGIONS for _ in range(counts[r])]
    random.Random(seed).shuffle(out)
    return out
