"""Decision 0023 in ``gentorrent bench audit-evasion``: a verifier caps its replies from one node by
their pooled z (``verifier.audit.scoring.pooled_cap``), as the auditor does at its report. Played
on the real chain core with the engine's measured replies (simulations/data/audit_scores.json)."""

from __future__ import annotations

import numpy as np
import pytest

from overlay.wire.constants import TRUST_LINE
from overlay.wire.messages import ChatMessage, SamplingParams
from verifier.audit import chain
from verifier.bench import audit_evasion as ae

CHAT = SamplingParams(temperature=0.7, top_p=1.0, top_k=0, max_tokens=256, seed=None)  # `user chat`'s defaults
GATEWAY = SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_tokens=256, seed=None)  # the gateway's
SEEDS = range(1, 11)


def req(i: int, source: str = "user") -> ae.Req:
    return ae.Req(float(i), (ChatMessage("user", f"question number {i}?"),), CHAT if i % 2 else GATEWAY, (i,), (i,),
                  i, 0, False, source, -1)


@pytest.fixture(scope="module")
def scores() -> ae.ScoreTable:
    if not ae.SCORES_FILE.is_file():
        pytest.skip(f"{ae.SCORES_FILE} is missing")
    return ae.ScoreTable()


def epochs_to_untrusted(scores: ae.ScoreTable, pooled: bool) -> tuple[list[int | None], int]:
    """For each seed, the epochs of cheating until an always-greedy Q2_K node is untrusted (None: not
    within 10); and the lowest R of the honest node beside it over all seeds."""
    users = [req(i) for i in range(40)]
    view = ae.View("defaults", "combined", 0.5, [(req(100 + i, "donated"), 0.0) for i in range(40)],
                   np.full(len(users), -1.0), users)
    out, honest = [], []
    for seed in SEEDS:
        res = ae.ChainRun(seed, [ae.NodeSpec("honest", "honest"), ae.NodeSpec("greedy", "greedy", cheat_from=2)],
                          scores, view, chain.DEFAULT_EPOCH_BLOCKS, chain.DEFAULT_CHALLENGES_PER_NODE,
                          pooled=pooled).run(12)
        out.append(ae._epochs_to_untrusted(res.reputation["greedy"], 2, TRUST_LINE))
        honest.append(min(res.reputation["honest"]))
    return out, min(honest)


def test_a_greedy_q2k_node_at_the_clients_defaults_is_caught_sooner_once_its_replies_are_pooled(
        scores: ae.ScoreTable) -> None:
    """Challenges at the clients' defaults (half T = 0.7, half T = 1.0), 2 a verifier an epoch: each
    verifier's pair of replies pooled, the greedy node is untrusted within 5 epochs in at least 9 of
    10 runs, and in no run later than without pooling; scored reply by reply (decision 0019 alone),
    in at most 7 (measured: 7, median 5 epochs, against 3 pooled). The honest node beside it scores
    the same either way (its replies' spread is sampling's)."""
    within = ae.UNTRUSTED_WITHIN
    before, honest_before = epochs_to_untrusted(scores, pooled=False)
    after, honest_after = epochs_to_untrusted(scores, pooled=True)
    assert sum(x is not None and x <= within for x in before) <= 7
    assert sum(x is not None and x <= within for x in after) >= 9
    assert all(a is not None and (b is None or a <= b) for a, b in zip(after, before, strict=True))
    assert honest_before == honest_after >= TRUST_LINE
