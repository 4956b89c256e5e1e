"""``gentorrent bench audit-evasion --quick`` (verifier/bench/audit_evasion.py): it prints exactly
the figures docs/benchmarks.md "audit-evasion" documents, every figure is well-formed, and the
properties the audit design promises hold in every quick run: a node that always serves the
degraded model is untrusted within 5 epochs of cheating, honest nodes (with faults) stay
trusted, and no node's outcome changes another's; with users' transcripts (decision 0015) the same
holds and the selective cheater is caught. Measured figures are not asserted beyond
that (the bench reports where goals are missed); no timing is asserted."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

NAME = "audit-evasion"


@pytest.fixture(scope="module")
def out() -> dict[str, Any]:
    """One quick run's JSON (``tests.conftest.quick_bench``)."""
    from tests.conftest import quick_bench
    from verifier.bench import audit_evasion

    if not audit_evasion.USER_PROMPTS.is_file():
        pytest.skip(f"{audit_evasion.USER_PROMPTS} is missing (../shared/data next to the repository)")
    return quick_bench(NAME, audit_evasion.run, timeout=600)


def test_prints_the_documented_keys(out: dict[str, Any], helpers: Any) -> None:
    assert out["bench"] == NAME and out["params"]["quick"] is True
    assert set(out["figures"]) == helpers.documented_figures(NAME)


def test_figures_are_well_formed(out: dict[str, Any]) -> None:
    f = out["figures"]
    assert all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in f.values()), f
    censored = out["params"]["cheaters"]["censored_epochs_value"]
    for k, v in f.items():
        if k.startswith("auc_") or k.endswith(("_share", "_reputation", "_reputation_after_5_mean")):
            assert 0.0 <= v <= 1.0, (k, v)
        if "_epochs_to_untrusted_" in k:
            assert 1 <= v <= censored and v == int(v), (k, v)
        if k.startswith("goal_"):
            assert v in (0.0, 1.0), (k, v)
        if k.startswith(("honest_", "cost_", "main_")):
            assert v >= 0, (k, v)
    goals = out["params"]["goals"]
    assert {f"goal_{g}_met" for g in goals} == {k for k in f if k.startswith("goal_")}
    for g, v in goals.items():
        assert v["met"] is (f[f"goal_{g}_met"] == 1.0)
    # the selective cheater's worst case is one of its swept points, at every donation rate
    for pre in ("", "transcripts_rho10_", "transcripts_rho25_"):
        for view in ("generator", "donated", "donated_colluder"):
            swept = [f[f"{pre}selective_{view}_tpr{t}_untrusted_within_5_share"] for t in (50, 55, 60, 70, 80, 90, 95)]
            assert f[f"{pre}cheater_selective_{view}_untrusted_within_5_share"] in swept
    for pre, view in (*(("", v) for v in ("private", "private_scripts", "mixed10", "mixed25", "mixed50", "mixed75")),
                      ("whatif_unrecognised_", "mixed10"), ("whatif_unrecognised_", "mixed25")):  # H, I: challenges only
        swept = [f[f"{pre}selective_{view}_tpr{t}_untrusted_within_5_share"] for t in (50, 55, 60, 70, 80, 90, 95)]
        assert f[f"{pre}cheater_selective_{view}_untrusted_within_5_share"] in swept
    # framing: a grid value (or twice the grid's last: not found), and every identity counted or burnt
    grid = out["params"]["transcripts"]["framing"]["grid"]
    for rho in (0, 10, 25):
        assert f[f"framing_rho{rho}_identities_per_epoch"] in [*grid, 2 * grid[-1]]
        assert f[f"framing_rho{rho}_identities_burnt_per_epoch"] + f[
            f"framing_rho{rho}_framer_transcripts_counted_per_epoch"] <= f[f"framing_rho{rho}_identities_per_epoch"] + 1e-9
    junks = tuple(f"framing_escrow_junk{j}_rho0_" for j in (8192, 32768, 65536))
    for pre in ("framing_escrow_rho0_", "framing_escrow_restart_rho0_", *junks):
        assert f[f"{pre}identities_per_epoch"] in [*grid, 2 * grid[-1]]
        hidden = f.get(f"{pre}node_hidden_per_epoch", 0.0)
        assert f[f"{pre}node_revealed_per_epoch"] + f[f"{pre}node_lost_per_epoch"] + hidden \
            <= f[f"{pre}withheld_per_epoch"] + 1e-9
    # a junk flood leaves no one-shot framer's withheld reply out of the release, up to every donor
    # slot the book has (decision 0039: shared out by donor); before it, about 1/2 and 7/8
    for pre in junks:
        assert f[f"{pre}node_hidden_per_epoch"] == 0 and f[f"{pre}node_revealed_per_epoch"] > 0
        assert f[f"{pre}identities_per_epoch"] == 2 * grid[-1]  # no framer count on the grid sinks the node
    # main's protocol as documented: the leader sends 3, each of 4 verifiers scores 3
    assert f["main_challenges_sent_per_verifier_node_epoch"] == 0.75
    assert f["main_replies_scored_per_verifier_node_epoch"] == 3
    k = out["params"]["chain"]["challenges_per_node_per_verifier"]
    turns = out["params"]["scripts"]["max_turns"]  # a script's every answered turn is scored (decision 0025)
    assert f["cost_replies_scored_per_verifier_node_epoch"] <= f["cost_challenges_sent_per_verifier_node_epoch"]
    assert k <= f["cost_challenges_sent_per_verifier_node_epoch"] <= k * turns * 3  # at most 3 tries a turn


def test_what_the_design_promises(out: dict[str, Any]) -> None:
    f = out["figures"]
    # a node serving the cheap model on every challenge is untrusted within 5 epochs, every run
    assert f["cheater_degraded_untrusted_within_5_share"] == 1.0
    # honest nodes stay trusted, faults included, and no node's outcome moves another's
    for kind in ("plain", "restart", "busy", "flood"):
        assert f[f"honest_{kind}_untrusted_nodes"] == 0
        assert f[f"honest_{kind}_min_reputation"] >= 0.4
    assert f["cheater_run_honest_min_reputation"] >= 0.4
    assert f["honest_epochs_changed_by_another_node"] == 0
    # with users' transcripts (decision 0015): the same, and the cheap model on users is caught too
    for pre in ("transcripts_rho10_", "transcripts_rho25_"):
        assert f[f"{pre}cheater_degraded_untrusted_within_5_share"] == 1.0
        assert f[f"{pre}cheater_run_honest_min_reputation"] >= 0.4
    for kind in ("plain", "restart", "busy", "flood"):
        assert f[f"transcripts_rho25_honest_{kind}_untrusted_nodes"] == 0
    # (not "no epoch changed by another node" with transcripts: a verifier's budget is shared among
    # the nodes by their donors too (rule 9, decisions 0033, 0035), so one node's transcripts move the
    # others' shares and draws; no node's share falls under half of budget / nodes, none of them is
    # untrusted, above, and no node's faults ever decide whether another is trusted)
    assert f["transcripts_rho25_honest_epochs_trust_changed_by_another_node"] == 0
    assert 0 <= f["transcripts_rho25_honest_max_reputation_change_by_another_node"] < 0.1
    # since decision 0026 (personas, 15-minute epochs) the donated view's detector is weak: a
    # selective cheater or a forwarder acting on it is caught by challenges alone
    for cheat in ("selective_donated", "forwarder_donated"):
        assert f[f"cheater_{cheat}_reputation_after_5_mean"] < 0.4
    # users' transcripts reach what challenges cannot: the generator's and a colluder's views flag
    # challenges and no user request; such cheaters, far above the line on challenges alone, sink on
    # transcripts (within 5 epochs in every full run since decision 0026)
    for cheat in ("selective_generator", "forwarder_generator", "selective_donated_colluder",
                  "forwarder_donated_colluder"):
        alone = f[f"cheater_{cheat}_reputation_after_5_mean"]
        assert alone > 0.6 and f[f"transcripts_rho25_cheater_{cheat}_reputation_after_5_mean"] < alone - 0.25
    # decision 0028: a cheater's own sybil users (boosters) lift the plain mean of its transcripts
    # past the line with few identities; capped by donor, none of the quick grid's counts (up to 64)
    # saves it (the full grid's 128 does at the default budget: decision 0034)
    for rho in (10, 25):
        assert f[f"boosting_rho{rho}_mean_identities"] <= 64 and f[f"boosting_rho{rho}_mean_caught_share_min"] < 0.95
        assert f[f"boosting_rho{rho}_by_donor_identities"] > 64 and f[f"boosting_rho{rho}_by_donor_caught_share_min"] == 1
    assert f["boosting_honest_min_reputation"] >= 0.4
    # part G's low rates: fewer of its users' sets a cheater an epoch, the fewer the users donate
    sets = [f[f"boosting_rho{rho}_by_donor_user_sets_per_cheater_epoch"] for rho in (1, 2, 3, 5, 10, 25)]
    assert sets == sorted(sets) and sets[0] < 2 < sets[-1]
    # part H (decision 0030): an operator's private prompts are told apart by their shape when they
    # are single turns (no history where users' requests mostly carry one), not when they are
    # conversations; sent as conversations, they catch every detecting cheater on challenges alone
    assert f["auc_turns_private"] > 0.7 > f["auc_turns_private_scripts"]
    assert f["auc_template_private"] < 0.6 and f["auc_template_private_scripts"] < 0.6
    for cheat in ("selective", "forwarder", "aborter"):
        assert f[f"cheater_{cheat}_private_scripts_reputation_after_5_mean"] < 0.4
    assert f["private_run_honest_min_reputation"] >= 0.4
    # part I (decision 0031): the template's challenges are flagged whatever the share, so the fewer
    # a node's challenges are donated the better its detector, and a cheater with 90 % of them
    # generated keeps its reputation where one with 25 % generated loses it
    aucs = [f[f"auc_best_mixed{s}"] for s in (10, 25, 50, 75)]
    assert aucs == sorted(aucs, reverse=True) and aucs[-1] > f["auc_best_donated"]
    assert f["cheater_selective_mixed10_reputation_after_5_mean"] > 0.6 > f[
        "cheater_selective_mixed75_reputation_after_5_mean"]
    # decision 0037: with escrow the node hands in what framers withhold; the framing that sinks a
    # node without it sinks none with it, in the quick grid
    assert f["framing_rho0_identities_per_epoch"] <= 128 < f["framing_escrow_rho0_identities_per_epoch"]
    assert f["framing_escrow_rho0_node_revealed_per_epoch"] > 0 and f["framing_escrow_rho0_node_lost_per_epoch"] == 0
    # its store is on disk: a restart loses a withheld reply only when the node is down from its
    # release to the close
    assert f["framing_escrow_restart_rho0_node_lost_per_epoch"] < 0.05 * f["framing_escrow_restart_rho0_withheld_per_epoch"]
    # the detectors work: the public generator is recognisable, a colluder's memory recognises donations
    assert f["auc_template_generator"] > 0.9
    assert f["auc_seen_before_all_donated"] > 0.9


def test_missing_prompts_file_says_where(tmp_path: Path) -> None:
    from verifier.bench.audit_evasion import BenchError, load_user_prompts

    with pytest.raises(BenchError, match=r"user-prompts\.jsonl"):
        load_user_prompts(tmp_path / "user-prompts.jsonl")
