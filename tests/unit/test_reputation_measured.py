"""The reputation rule over simulated time with the score distributions measured on the real
engine (simulations/data/scores.json, ``python -m simulations.measure_scores``): issue 14's
acceptance figures for the rule."""

from __future__ import annotations

import json
import random
from pathlib import Path

from verifier.audit import reputation as rep

SCORES = Path(__file__).resolve().parents[2] / "simulations" / "data" / "scores.json"
CHALLENGES = 3  # per node and epoch, each with a setting drawn like a user's


def _pool(role: str) -> list[list[float]]:
    samples = json.loads(SCORES.read_text())["samples"]
    return [[row["calibrated"] for row in samples[s][role]] for s in sorted(samples)]


def _epoch(pool: list[list[float]], rng: random.Random) -> list[int]:
    return [rep.to_fixed(rng.choice(rng.choice(pool))) for _ in range(CHALLENGES)]


def test_honest_nodes_stay_trusted_for_100_epochs() -> None:
    pool, rng = _pool("honest"), random.Random(14)
    table = rep.ReputationTable()
    nodes = [b"honest %d" % i for i in range(50)]
    untrusted: set[bytes] = set()
    for _ in range(100):
        table = table.apply_epoch({n: _epoch(pool, rng) for n in nodes})
        untrusted.update(n for n in nodes if not table.get(n).trusted())
    assert not untrusted


def test_degraded_nodes_fall_below_the_trust_line_within_5_epochs() -> None:
    pool, rng = _pool("degraded"), random.Random(14)
    for start in (rep.R0, rep.SCALE):  # a new node, and one that had earned full trust
        table = rep.ReputationTable(rep.Params(r0=start))
        nodes = [b"degraded %d" % i for i in range(50)]
        for _ in range(5):
            table = table.apply_epoch({n: _epoch(pool, rng) for n in nodes})
        assert table.trusted(nodes) == []
        for _ in range(30):  # and they stay out
            table = table.apply_epoch({n: _epoch(pool, rng) for n in nodes})
            assert table.trusted(nodes) == []
