"""The two-sided audit score (verifier.audit.scoring, decision 0013 §5) against the replies measured
on the real engine (simulations/data/audit_scores.json, ``python -m simulations.measure_audit_scores``):
the file is well-formed and matches the current rule, honest nodes stay above τ, and nodes that
decode greedily whatever temperature is asked fall below it where the measurement shows they can
be seen (a Q2_K node's greedy reply at T = 0.7 cannot: see the assertions and Z_HIGH's comment)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

import pytest

from simulations.measure_audit_scores import KINDS, SETTINGS, epoch2_below, summarize
from verifier.audit import reputation as rep
from verifier.audit import scoring

DATA = Path(__file__).resolve().parents[2] / "simulations" / "data" / "audit_scores.json"
TAU = rep.TAU / rep.SCALE
SAMPLED = [s for s in SETTINGS if SETTINGS[s][0] > 0.0]
USERS = ["t0.7", "t1.0"]  # the clients' defaults (user chat, gateway)
FIELDS = {"prompt": int, "tokens": int, "calibrated": float, "score": float, "z": float, "mean_logprob": float,
          "mean_expected_logprob": float, "var_sum": float, "argmax_agreement": float}


@pytest.fixture(scope="module")
def data() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DATA.read_text())
    return loaded


def _mixed_below(samples: dict[str, Any], kind: str, settings: list[str], field: str = "score") -> float:
    """The share of 2-reply epochs below τ, each reply's setting uniform among ``settings``."""
    pools = [[r[field] for r in samples[s][kind]] for s in settings]
    return statistics.fmean(
        sum((x + y) / 2 < TAU for x in a for y in b) / (len(a) * len(b)) for a in pools for b in pools)


def test_the_file_is_well_formed_and_matches_the_current_rule(data: dict[str, Any]) -> None:
    samples = data["samples"]
    assert set(samples) == set(SETTINGS) and set(data["settings"]) == set(SETTINGS)
    assert all(set(cells) == set(KINDS) for cells in samples.values())
    assert data["z_high"] == scoring.Z_HIGH, "rerun python -m simulations.measure_audit_scores --rescore"
    assert data["tau"] == TAU and data["cpu"] and data["measured"] and data["how"]
    n_prompts = len(data["prompts"])
    sizes = {len(rows) for cells in samples.values() for rows in cells.values()}
    assert sizes == {n_prompts} and n_prompts >= 20
    for setting, cells in samples.items():
        for kind, rows in cells.items():
            assert [r["prompt"] for r in rows] == list(range(n_prompts)), (setting, kind)
            for r in rows:
                assert set(r) == set(FIELDS)
                assert all(isinstance(r[f], t) or (t is float and isinstance(r[f], int)) for f, t in FIELDS.items())
                assert all(math.isfinite(r[f]) for f in FIELDS)
                assert 0.0 < r["score"] <= r["calibrated"] <= 1.0 and r["tokens"] >= 1 and r["var_sum"] >= 0.0
                assert r["calibrated"] == pytest.approx(scoring.calibrated(r["mean_logprob"], r["mean_expected_logprob"]))
                assert r["score"] == scoring.two_sided(r["mean_logprob"], r["mean_expected_logprob"], r["z"])
                if setting == "greedy":
                    assert r["z"] == 0.0 and r["var_sum"] == 0.0 and r["score"] == r["calibrated"]
    assert data["summary"] == summarize(samples)


def test_honest_replies_keep_their_one_sided_score_and_stay_above_tau(data: dict[str, Any]) -> None:
    samples = data["samples"]
    for setting in SETTINGS:
        rows = samples[setting]["honest"]
        assert all(r["z"] <= scoring.Z_HIGH for r in rows), setting  # never "too likely"
        assert all(r["score"] == r["calibrated"] for r in rows)
        assert statistics.median(r["score"] for r in rows) > TAU
    honest_z = [r["z"] for s in SAMPLED for r in samples[s]["honest"]]
    assert abs(statistics.fmean(honest_z)) < 0.3 and statistics.stdev(honest_z) < 1.3  # z is ~N(0, 1)
    assert _mixed_below(samples, "honest", USERS) < 0.05


def test_greedy_cheaters_fall_below_tau_where_they_can_be_seen(data: dict[str, Any]) -> None:
    samples = data["samples"]
    for kind in ("greedy", "greedy_honest_weights"):
        # T = 1 (the gateway's default): too likely, and scored as far below.
        assert statistics.median(r["score"] for r in samples["t1.0"][kind]) < TAU, kind
        assert statistics.median(r["calibrated"] for r in samples["t1.0"][kind]) == 1.0  # the old score saw nothing
    # With the honest weights, greedy replies are too likely at every temperature.
    assert statistics.median(r["score"] for r in samples["t0.7"]["greedy_honest_weights"]) < TAU
    assert sum(r["z"] > scoring.Z_HIGH for s in SAMPLED for r in samples[s]["greedy_honest_weights"]) >= 0.8 * 72
    # With Q2_K weights at T = 0.7, quantization noise makes its greedy reply as far from the
    # verifier's argmax as sampling would be: nothing is too likely (a limit of any such test).
    assert statistics.median(r["z"] for r in samples["t0.7"]["greedy"]) < scoring.Z_HIGH
    # Over epochs of two challenges with the clients' default settings, every cheater is abnormal
    # far more often than an honest node; the one-sided score let the greedy ones through.
    assert _mixed_below(samples, "degraded", USERS) > 0.9
    assert _mixed_below(samples, "greedy", USERS) > 0.55  # 0.51 before the significance cap (decision 0019)
    assert _mixed_below(samples, "greedy_honest_weights", USERS) > 0.8
    assert _mixed_below(samples, "greedy", USERS, "calibrated") < 0.05
    assert _mixed_below(samples, "greedy_honest_weights", USERS, "calibrated") < 0.05


def test_epoch_share_is_exact_over_pairs() -> None:
    assert epoch2_below([1.0, 0.5], 0.75) == pytest.approx(0.25)  # only (0.5, 0.5) averages below
    assert epoch2_below([0.8, 0.7], 0.75) == pytest.approx(0.25)


HONEST_Z = DATA.parent / "honest_z.json"


def test_honest_replies_at_the_clients_defaults_lie_within_the_cap() -> None:
    """Decision 0019's check (``python -m simulations.measure_honest_z``): honest replies at the
    clients' default settings and length, from the real engine, scored under the rule in force.
    z is ~N(0, 1) and the significance cap moves (almost) no honest reply under τ."""
    from simulations.measure_honest_z import resummarize

    data = json.loads(HONEST_Z.read_text())
    assert data["z_high"] == scoring.Z_HIGH, "rerun python -m simulations.measure_honest_z --rescore"
    assert data["tau"] == TAU and data["cpu"] and data["measured"] and data["how"]
    for rows in data["samples"].values():
        for r in rows:
            assert r["score"] == scoring.two_sided(r["mean_logprob"], r["mean_expected_logprob"], r["z"])
    assert data["summary"] == resummarize(json.loads(HONEST_Z.read_text()))["summary"]
    everything = data["summary"]["all"]
    assert everything["n"] >= 250 and everything["tokens_mean"] > 128
    assert abs(everything["z_mean"]) < 0.3 and everything["z_sd"] < 1.3
    assert everything["beyond_z_high"] <= 0.01 * everything["n"]
    assert everything["below_tau_score"] - everything["below_tau_calibrated"] <= 0.01 * everything["n"]


HONEST_Z_F32 = DATA.parent / "honest_z_f32.json"


def _pooled_groups(path: Path, k: int) -> list[list[float]]:
    """Every group of ``k`` consecutive measured honest replies' z, within one setting and
    alternating the two (the clients' mix), as a verifier pools them (decision 0023)."""
    data = json.loads(path.read_text())
    assert data["z_high"] == scoring.Z_HIGH and data["cpu"] and data["measured"] and data["how"]
    rows = {s: [r["z"] for r in data["samples"][s]] for s in ("t0.7", "t1.0")}
    assert all(len(z) >= 60 for z in rows.values())
    mixed = [z for pair in zip(rows["t0.7"], rows["t1.0"], strict=False) for z in pair]
    return [zs[i:i + k] for zs in (*rows.values(), mixed) for i in range(0, len(zs) - k + 1, k)]


@pytest.mark.parametrize("k", [2, 4, 8])
def test_honest_replies_on_the_verifiers_weights_pooled_are_never_capped(k: int) -> None:
    """Decision 0023: no group of 2, 4 or 8 honest replies (the verifier's weights file on both
    sides) reaches Z_HIGH when pooled."""
    assert max(scoring.pooled_z(g) for g in _pooled_groups(HONEST_Z, k)) <= scoring.Z_HIGH


@pytest.mark.parametrize("k", [2, 4, 8])
def test_honest_replies_on_other_arithmetic_are_rarely_capped(k: int) -> None:
    """Decision 0023's honest side across engines (``--node-weights F32``: the same weights in
    float32, as another engine computes them): z spreads wider (measured sd 1.12 against 0.97),
    and pooling caps at most one group in 30 (measured: 1 of 144, 72 and 36 groups); the
    bench's honest nodes on this arithmetic stay trusted (``honest_other_arithmetic_*``)."""
    groups = _pooled_groups(HONEST_Z_F32, k)
    capped = sum(scoring.pooled_cap(g) < 1.0 for g in groups)
    assert capped <= max(1, len(groups) // 30)
    data = json.loads(HONEST_Z_F32.read_text())
    assert "F32" in data["how"] and data["summary"]["all"]["n"] >= 140
    assert data["summary"]["all"]["beyond_z_high"] <= 0.03 * data["summary"]["all"]["n"]


def test_a_greedy_q2k_node_is_capped_when_its_replies_are_pooled(data: dict[str, Any]) -> None:
    """Decision 0023's reason, in the measured replies: at T = 0.7 (top-p 1) a greedy Q2_K node's
    replies are each inside Z_HIGH in most cases, but spread about twice as wide as honest ones;
    pooled in fours at the clients' mix (T = 0.7 and 1.0) most groups are capped, and no honest
    group is."""
    samples = data["samples"]
    greedy_t07 = [r["z"] for r in samples["t0.7"]["greedy"]]
    honest_t07 = [r["z"] for r in samples["t0.7"]["honest"]]
    assert sum(abs(z) <= scoring.Z_HIGH for z in greedy_t07) >= 0.8 * len(greedy_t07)
    assert statistics.pstdev(greedy_t07) > 1.5 * statistics.pstdev(honest_t07)

    def groups(kind: str) -> list[list[float]]:
        mixed = [z for pair in zip((r["z"] for r in samples["t0.7"][kind]), (r["z"] for r in samples["t1.0"][kind]),
                                   strict=True) for z in pair]
        return [mixed[i:i + 4] for i in range(0, len(mixed) - 3, 4)]

    assert sum(scoring.pooled_cap(g) < 1.0 for g in groups("greedy")) >= 0.75 * len(groups("greedy"))
    assert all(scoring.pooled_cap(g) == 1.0 for g in groups("honest"))


EARLY_END = DATA.parent / "early_end.json"


def test_a_node_that_stops_its_replies_early_is_seen_once_its_claimed_end_is_scored() -> None:
    """Decision 0026's measurement (``python -m simulations.measure_early_end``): a node running
    the right weights that stops each reply at a random token, without an end token, saves half
    its work. Scored as it came (the rule before), its replies pass like honest ones; with the end
    of turn they claim scored (``auditor.missing_end``), most fall under τ, and a verifier's
    epoch of 4 such replies (their pooled cap applied, decision 0023) averages under τ every
    time (measured: 8 of 8 groups; honest: 0 of 8). Honest replies carry their end token and are
    scored as before."""
    from simulations.measure_early_end import resummarize

    data = json.loads(EARLY_END.read_text())
    assert data["tau"] == TAU and data["cpu"] and data["measured"] and data["how"]
    assert data["summary"] == resummarize(json.loads(EARLY_END.read_text()))["summary"]
    s = data["summary"]["all"]
    assert s["n"] >= 18 and s["work_saved_share"] > 0.4
    assert s["honest_below_tau"] == 0 and s["cut_as_sent_below_tau"] <= 0.1 * s["n"]
    assert s["cut_with_end_below_tau"] >= 0.5 * s["n"]
    rows = [r for setting in data["samples"].values() for r in setting]
    groups = [rows[i:i + 4] for i in range(0, len(rows) - 3, 4)]
    for kind, under in (("honest", False), ("cut_as_sent", False), ("cut_with_end", True)):
        means = [statistics.fmean(min(r[kind]["score"], scoring.pooled_cap([x[kind]["z"] for x in g])) for r in g)
                 for g in groups]
        assert sum(m < TAU for m in means) >= len(means) if under else sum(m < TAU for m in means) <= 1, kind
