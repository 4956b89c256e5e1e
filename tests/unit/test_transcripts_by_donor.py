"""Users' transcripts judged per donor (decision 0028; verifier/audit/scoring.py ``donors_cap``,
verifier/audit/transcripts.py ``capped_by_donor``): boosters cannot lift the cap, one donor cannot
set it, and honest replies as measured on the real engine never do."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest

from verifier.audit.reputation import TAU, to_fixed
from verifier.audit.scoring import (
    DONORS_TO_CAP,
    FULL_TOKENS,
    Z_HIGH,
    ScoringError,
    donor_threshold,
    donors_cap,
    pooled_z,
    transcript_z,
)
from verifier.audit.transcripts import capped_by_donor

DATA = Path(__file__).resolve().parents[2] / "simulations" / "data"
NODE, OTHER = b"\x01" * 20, b"\x02" * 20


def donor(i: int) -> bytes:
    return i.to_bytes(20, "big")


def measured(name: str, kind: str = "honest") -> list[tuple[float, int]]:
    """(z, tokens) of every reply of ``kind`` in a measurement file (``samples[setting]`` rows, or
    ``samples[setting][kind]``)."""
    path = DATA / name
    if not path.is_file():
        pytest.skip(f"{path} is missing")
    out: list[tuple[float, int]] = []
    for rows in json.loads(path.read_text())["samples"].values():
        rows = rows[kind] if isinstance(rows, dict) else rows
        out.extend((float(r["z"]), int(r["tokens"])) for r in rows)
    return out


def test_the_threshold_is_z_high_for_one_donor_and_grows_with_the_log_of_donors() -> None:
    assert donor_threshold(1) == Z_HIGH
    ts = [donor_threshold(m) for m in (1, 2, 15, 100, 1_000, 100_000)]
    assert ts == sorted(ts) and len(set(ts)) == len(ts)
    assert 3.7 < donor_threshold(15) < 3.8 and donor_threshold(1_000) < 4.7 and donor_threshold(100_000) < 5.6
    with pytest.raises(ScoringError):
        donor_threshold(0)


def test_a_short_replys_z_weighs_as_its_share_of_a_full_one() -> None:
    assert transcript_z(-4.0, FULL_TOKENS) == -4.0 and transcript_z(2.0, 10 * FULL_TOKENS) == 2.0
    assert transcript_z(-3.62, 4) == pytest.approx(-3.62 * (4 / FULL_TOKENS) ** 0.5)
    for bad in ((float("nan"), 4), (1.0, 0)):
        with pytest.raises(ScoringError):
            transcript_z(*bad)


def test_one_donor_cannot_cap_a_node_however_far_off_its_replies() -> None:
    assert DONORS_TO_CAP == 2
    assert donors_cap([[-40.0, -40.0]]) == 1.0
    assert donors_cap([[-40.0, -40.0], *[[0.3]] * 50]) == 1.0
    assert donors_cap([[-40.0], [-40.0]]) < 1e-6  # two donors do


def test_boosters_honest_sets_cannot_lift_the_cap_that_a_cheaters_users_set() -> None:
    """The attacker: 12 of a cheater's users hand in one degraded reply each (the engine's measured
    Q2_K replies); 1,000 sybil users of its own hand in 4 honest replies each. Their plain mean is
    above τ (the attack on the mean); capped by donor every score of the node is under τ."""
    degraded = [transcript_z(z, n) for z, n in measured("audit_scores.json", "degraded") if z != 0.0]
    honest = [transcript_z(z, n) for z, n in measured("honest_z.json")]
    rng = random.Random(28)
    rows = [(NODE, donor(i), to_fixed(0.2), rng.choice(degraded)) for i in range(12)]
    rows += [(NODE, donor(100 + b), to_fixed(0.95), rng.choice(honest)) for b in range(1_000) for _ in range(4)]
    rows += [(OTHER, donor(i), to_fixed(0.9), rng.choice(honest)) for i in range(12)]  # another node, honest
    plain = sum(s for n, _, s, _ in rows if n == NODE) / sum(n == NODE for n, _, _, _ in rows)
    assert plain > TAU
    got = capped_by_donor(rows)
    assert [n for n, _ in got] == [n for n, _, _, _ in rows]  # same rows, same order
    assert max(s for n, s in got if n == NODE) < TAU
    assert [s for n, s in got if n == OTHER] == [s for n, _, s, _ in rows if n == OTHER]  # untouched


@pytest.mark.parametrize("name", ["honest_z.json", "honest_z_f32.json", "honest_z_tokens4.json"])
def test_honest_replies_as_measured_never_cap_a_node(name: str) -> None:
    """Every measured honest reply of the verifier's engine, of another engine's arithmetic
    (float32) and of 4-token replies (the framer's choice), dealt to 1 to 64 donors in sets of 1
    to 4: no cap, whatever the dealing."""
    zs = [transcript_z(z, n) for z, n in measured(name)]
    rng = random.Random(name)
    worst = max(pooled_z([z]) for z in zs)
    assert worst < Z_HIGH  # no single honest reply is significant on its own
    for donors, per in itertools.product((1, 2, 5, 15, 64), (1, 2, 4)):
        for _ in range(50):
            assert donors_cap([rng.sample(zs, per) for _ in range(donors)]) == 1.0
