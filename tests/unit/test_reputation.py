"""The reputation rule (verifier/audit/reputation.py): hand-computed cases pin it."""

from __future__ import annotations

from fractions import Fraction

import pytest

from verifier.audit import reputation as rep
from verifier.audit.reputation import NodeReputation, Params, ReputationTable, update

U = rep.SCALE  # 1.0


def test_defaults_are_the_papers() -> None:
    p = Params()
    assert (p.alpha, p.beta, p.window, p.gamma, p.trust_line) == (400_000, 600_000, 5, Fraction(1, 5), 400_000)
    assert p.r0 == rep.R0 and 0 < p.tau < U


def test_normal_epoch_is_the_moving_average() -> None:
    r = update(NodeReputation(500_000), [900_000])
    assert r.value == 200_000 + 540_000
    assert r.window == (False,) and r.epochs == 1


def test_one_abnormal_epoch_punishes_at_gamma_one_fifth_boundary() -> None:
    """c / W = 1/5 = γ: the paper's "above" would not punish; the fixed rule (≥) does, with the
    factor (W+1)/(W + c/γ + 2) = 6/12."""
    r = update(NodeReputation(500_000), [600_000])  # 0.6 < τ
    assert r.window == (True,)
    assert r.value == 200_000 + 300_000
    unpunished = update(NodeReputation(500_000), [600_000], Params(gamma=Fraction(1, 3)))
    assert unpunished.value == 200_000 + 360_000  # c/W = 1/5 < 1/3: β·C


def test_gamma_one_third_needs_two_abnormal_epochs() -> None:
    p = Params(gamma=Fraction(1, 3))
    r = update(NodeReputation(500_000, (True,), 1), [600_000], p)
    assert r.window == (True, True)
    assert r.value == 200_000 + 600_000 * 6 // 13  # (W+1)/(W + 2·3 + 2) = 6/13


def test_gamma_one_does_not_punish_four_of_five() -> None:
    p = Params(gamma=Fraction(1))
    three = NodeReputation(500_000, (True,) * 3, 3)
    r = update(three, [700_000], p)
    assert r.window == (True,) * 4
    assert r.value == 200_000 + 420_000  # c/W = 4/5 < 1: β·C


def test_gamma_one_full_window_factor() -> None:
    """Five abnormal of five: c/W = 1 = γ punishes (the paper's \"above 1\" never would)."""
    p = Params(gamma=Fraction(1))
    r = update(NodeReputation(500_000, (True,) * 4, 4), [700_000], p)
    assert r.window == (True,) * 5
    assert r.value == 200_000 + 700_000 * 6 // 12


def test_window_slides_and_forgets() -> None:
    r = NodeReputation(500_000, (True,) * 5, 5)
    r = update(r, [1_000_000])
    assert r.window == (True,) * 4 + (False,)
    for _ in range(4):
        r = update(r, [1_000_000])
    assert r.window == (False,) * 5
    before = r.value
    assert update(r, [1_000_000]).value == 400_000 * before // U + 600_000


def test_punishment_grows_with_c() -> None:
    values = []
    for c_before in range(5):
        r = update(NodeReputation(500_000, (True,) * c_before, c_before), [500_000])
        values.append(r.value)
    assert values == sorted(values, reverse=True) and len(set(values)) == 5
    # c = 5: 6 / (5 + 25 + 2)
    assert values[-1] == 200_000 + 500_000 * 6 // 32


def test_tau_boundary() -> None:
    p = Params()
    assert update(NodeReputation(), [p.tau]).window == (False,)
    assert update(NodeReputation(), [p.tau - 1]).window == (True,)


def test_reputation_stays_in_range() -> None:
    r = NodeReputation(U)
    for _ in range(50):
        r = update(r, [U])
        assert 0 <= r.value <= U
    assert r.value >= U - 2  # rounding down never overshoots, barely undershoots
    for _ in range(50):
        r = update(r, [0])
        assert 0 <= r.value <= U
    assert r.value == 0


def test_epoch_mean_and_fixed_point() -> None:
    assert rep.epoch_mean([1, 2]) == 2  # 1.5 rounds half up
    assert rep.epoch_mean([1_000_000, 0, 0]) == 333_333
    assert rep.epoch_mean([2, 2, 3]) == 2
    with pytest.raises(rep.ReputationError):
        rep.epoch_mean([])
    with pytest.raises(rep.ReputationError):
        rep.epoch_mean([U + 1])
    assert rep.to_fixed(0.4) == 400_000 and rep.to_fixed(1.7) == U and rep.to_fixed(-0.1) == 0
    with pytest.raises(rep.ReputationError):
        rep.to_fixed(float("nan"))
    assert rep.to_float(250_000) == 0.25


def test_params_validated() -> None:
    with pytest.raises(rep.ReputationError):
        Params(alpha=700_000, beta=600_000)
    with pytest.raises(rep.ReputationError):
        Params(window=0)
    with pytest.raises(rep.ReputationError):
        Params(gamma=Fraction(0))
    with pytest.raises(rep.ReputationError):
        Params(tau=U + 1)


def test_table_updates_only_audited_nodes_and_is_canonical() -> None:
    t = ReputationTable()
    assert t.get(b"a").value == rep.R0 and t.get(b"a").trusted()
    t1 = t.apply_epoch({b"b": [900_000], b"a": [100_000, 200_000]})
    assert t1.get(b"a").value == 200_000 + 150_000 * 6 // 12 and not t1.get(b"a").trusted()
    assert t1.get(b"b").value == 740_000
    assert t1.trusted([b"a", b"b", b"new"]) == [b"b", b"new"]
    t2 = t1.apply_epoch({b"b": [900_000]})
    assert t2.get(b"a") == t1.get(b"a") and t2.get(b"b").epochs == 2
    same = ReputationTable().apply_epoch({b"a": [100_000, 200_000], b"b": [900_000]})
    assert same.canonical_bytes() == t1.canonical_bytes()
    assert t2.canonical_bytes() != t1.canonical_bytes()
    assert t.canonical_bytes() != ReputationTable(Params(tau=1)).canonical_bytes()
