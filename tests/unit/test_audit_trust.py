"""Trust on the committee chain: a node serving a degraded model, scored with the measured
scores of simulations/data/scores.json (the same GGUF re-quantized to Q2_K, decision 0010), falls
under 0.4 within 5 audited epochs and leaves the signed model list; an honest node stays."""

from __future__ import annotations

import json
from pathlib import Path

import msgpack

from tests.audit_helpers import Committee
from verifier import audit as audits
from verifier.app import ListsAt
from verifier.reputation import TRUST_LINE, to_fixed

SCORES = Path(__file__).resolve().parents[2] / "simulations" / "data" / "scores.json"
SETTINGS = ("greedy", "t0.7", "t1.0")


def measured(kind: str) -> dict[str, list[int]]:
    samples = json.loads(SCORES.read_text())["samples"]
    return {s: [to_fixed(r["calibrated"]) for r in samples[s][kind]] for s in SETTINGS}


def test_a_degraded_node_leaves_the_model_list_within_five_epochs_and_an_honest_one_stays() -> None:
    honest, degraded = measured("honest"), measured("degraded")
    c = Committee(n_nodes=2, k=3)
    bad = c.nodes[1].node_id
    good = c.nodes[0].node_id
    assert c.listed_models() == sorted([good, bad])  # never audited: R(0) = 0.5, listed
    lead = c.elect()
    c.block([c.commit_tx(lead)[0]])
    below_at = None
    for epoch in range(1, 6):
        c.to_epoch_start(epoch)
        lead = c.elect()  # the VRF picks each epoch's leader among all four
        scores = []
        for i, ch in enumerate(c.audit.challenges):
            table = degraded if ch.node_id == bad else honest
            setting = SETTINGS[i % 3]  # a setting per challenge, like users'
            scores.append(table[setting][(7 * epoch + i) % 24])
        report = c.report_tx(lead, c.honest_entries(lead, scores))
        others = c.others(lead)
        commit, _ = c.commit_tx(lead)
        c.block([report, commit])
        c.block([c.attest_tx(pk, scores) for pk in others[:2]])  # identical rescoring
        assert c.outcome(epoch).status == audits.APPLIED
        if below_at is None and c.reputation(bad) < TRUST_LINE:
            below_at = epoch
        assert c.reputation(good) >= TRUST_LINE
    assert below_at is not None and below_at <= 5
    assert c.reputation(bad) < TRUST_LINE
    # The signed model list holds only the trusted node, with its reputation.
    models = msgpack.unpackb(ListsAt.of(c.app.committed).models)
    assert [m[0] for m in models] == [good] and models[0][9] == c.reputation(good)
    # Still registered (the /nodes query lists it) but not on the list users receive.
    assert bad in [r[0] for r in msgpack.unpackb(c.app.query("/nodes", b"model")[1])]
    # An untrusted node is not audited again: relays would not deliver its challenges (it is
    # off the list), so the next commit covers only the trusted node.
    assert audits.audit_nodes(c.audit, c.app.committed.nodes) == [good]
