"""Trust on the committee chain with measured scores: a node serving a degraded model (the same
GGUF re-quantized to Q2_K, simulations/data/scores.json, decision 0010), challenged by all four
verifiers every epoch (decision 0013), falls under 0.4 within 5 epochs and is marked untrusted
on the signed model list (clients skip it); an honest node stays trusted throughout."""

from __future__ import annotations

import json
from pathlib import Path

from overlay.wire.constants import TRUST_LINE
from tests.audit_helpers import Committee
from verifier.audit import tx as at
from verifier.audit.reputation import to_fixed

SCORES = Path(__file__).resolve().parents[2] / "simulations" / "data" / "scores.json"
SETTINGS = ("greedy", "t0.7", "t1.0")


def measured(kind: str) -> dict[str, list[int]]:
    samples = json.loads(SCORES.read_text())["samples"]
    return {s: [to_fixed(r["calibrated"]) for r in samples[s][kind]] for s in SETTINGS}


def test_a_degraded_node_is_untrusted_within_five_epochs_and_an_honest_one_stays() -> None:
    honest, degraded = measured("honest"), measured("degraded")
    c = Committee(n_nodes=2)
    good, bad = c.nodes[0].node_id, c.nodes[1].node_id
    assert {r[0]: r[9] for r in c.listed_models()} == {good: 500_000, bad: 500_000}  # never audited: R(0)
    c.to_epoch_start(1)
    draws = iter(range(10_000))

    def entries(p: object) -> list[at.ReportEntry]:
        out = []
        for n, op in p.items:  # type: ignore[attr-defined]
            i = next(draws)
            table = degraded if n == bad else honest
            score = table[SETTINGS[i % 3]][(7 * i) % 24]  # a setting per challenge, like users'
            out.append(at.ReportEntry(n, op, c.node(n).reply(op, score=score)))
        return out

    below_at = None
    for epoch in range(1, 6):
        c.epoch(entries=entries)
        if below_at is None and c.reputation(bad) < TRUST_LINE:
            below_at = epoch
        assert c.reputation(good) >= TRUST_LINE
    assert below_at is not None and below_at <= 5
    assert c.reputation(bad) < TRUST_LINE
    # Both stay on the signed list with their reputations (audits must reach the untrusted one);
    # clients use only records at or above the trust line.
    records = {r[0]: r for r in c.listed_models()}
    assert records[bad][9] == c.reputation(bad) < TRUST_LINE <= records[good][9] == c.reputation(good)
