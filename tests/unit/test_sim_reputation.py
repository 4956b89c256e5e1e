"""The reputation simulation (simulations/reputation.py): deterministic under a seed, driven by
the real reputation core, and its command writes its files."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from simulations import __main__ as cli
from simulations import reputation as sim
from simulations.common import Result
from verifier.audit import reputation as rep


def _run(seed: int, **kw: Any) -> Result:
    return sim.simulate(seed, n_honest=5, n_dishonest=5, **kw)


def test_deterministic_under_a_seed() -> None:
    a = _run(3)
    assert a.figures == _run(3).figures and a.series == _run(3).series
    assert a.figures != _run(4).figures


def test_stricter_gamma_punishes_dishonest_nodes_harder() -> None:
    f = _run(1).figures
    assert (f["gamma_1_5_dishonest_mean_R_epoch5"] <= f["gamma_1_3_dishonest_mean_R_epoch5"]
            <= f["gamma_1_1_dishonest_mean_R_epoch5"])
    assert f["gamma_1_5_honest_ever_untrusted"] == 0


def test_follows_the_reputation_core() -> None:
    """A table whose epochs change nothing gives flat curves at R(0): the simulation reads its
    reputations from the core, it does not compute its own."""

    class Frozen(rep.ReputationTable):
        def apply_epoch(self, scores: Mapping[bytes, Sequence[int]]) -> rep.ReputationTable:
            return self

    frozen = _run(1, new_table=Frozen)
    assert frozen.figures != _run(1).figures
    assert frozen.series["gamma"]["1/5"]["dishonest_mean"] == [rep.to_float(rep.R0)] * (sim.EPOCHS + 1)


def test_run_rule_matches_the_core_by_hand() -> None:
    draws = {b"n": [[rep.SCALE], [0]]}
    curves = sim.run_rule(draws, rep.Params(gamma=Fraction(1, 5)), 2)
    r1 = rep.update(rep.NodeReputation(rep.R0), [rep.SCALE])
    r2 = rep.update(r1, [0])
    assert curves[b"n"] == [rep.to_float(rep.R0), rep.to_float(r1.value), rep.to_float(r2.value)]


def test_bad_scores_file_says_what_to_do(tmp_path: Path) -> None:
    bad = tmp_path / "scores.json"
    bad.write_text(json.dumps({"samples": {"greedy": {"honest": [{"calibrated": 1.0, "raw_inv_ppl": 0.5}]}}}))
    with pytest.raises(ValueError, match="measure_scores"):
        sim.load_scores(bad)


def test_command_writes_json_and_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["reputation", "--seed", "2", "--quick", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "reputation.json").read_text())
    assert data["name"] == "reputation" and data["figures"]
    assert (tmp_path / "reputation.png").read_bytes()[:4] == b"\x89PNG"
    assert "reputation:" in capsys.readouterr().err


def test_first_epoch_below_hand_cases() -> None:
    assert sim._first_epoch([[0.5, 0.3, 0.2], [0.5, 0.45, 0.35]], 0.4) == 2
    assert sim._first_epoch([[0.5, 0.3], [0.5, 0.45]], 0.4) is None
    assert sim._first_epoch([[0.05]], 0.1) == 0
