"""The simulations' metric functions against hand-computed cases."""

import math

import pytest

from simulations.metrics import a4_entropy, binomial_tail, entropy, percentile


def test_entropy_of_known_distributions() -> None:
    assert entropy([1.0]) == 0.0
    assert entropy([0.5, 0.5]) == pytest.approx(1.0)
    assert entropy([0.25] * 4) == pytest.approx(2.0)
    assert entropy([0.5, 0.25, 0.25, 0.0]) == pytest.approx(1.5)
    with pytest.raises(ValueError):
        entropy([0.5, 0.4])
    with pytest.raises(ValueError):
        entropy([1.5, -0.5])


def test_a4_entropy_without_guesses_is_uniform_over_honest_nodes() -> None:
    assert a4_entropy(1024, 0.0, 3, 0) == pytest.approx(1.0)
    assert a4_entropy(1024, 0.5, 3, 0) == pytest.approx(math.log2(512) / 10)


def test_a4_entropy_matches_the_distribution_it_describes() -> None:
    n, f, length, guesses = 100, 0.1, 3, 2
    p_guess = 1 / (length + 1 - f * length)
    rest = (1 - f) * n - guesses
    dist = [p_guess] * guesses + [(1 - guesses * p_guess) / rest] * int(rest)
    assert a4_entropy(n, f, length, guesses) == pytest.approx(entropy(dist) / math.log2(n))


def test_binomial_tail_is_the_closed_form_leak_probability() -> None:
    # (n, k) = (4, 3), p = 0.1: 4·0.1³·0.9 + 0.1⁴ = 0.0037
    assert binomial_tail(4, 3, 0.1) == pytest.approx(0.0037)
    assert binomial_tail(4, 0, 0.3) == pytest.approx(1.0)
    assert binomial_tail(4, 5, 0.3) == 0.0


def test_percentile() -> None:
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([0.0, 10.0], 0.99) == pytest.approx(9.9)
    assert math.isnan(percentile([], 0.5))
