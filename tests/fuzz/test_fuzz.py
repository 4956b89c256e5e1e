"""The fuzz targets under hypothesis: a short, derandomized run for CI.

Stateless targets run as ``@given`` tests, stateful ones as a ``RuleBasedStateMachine`` whose
rules are the target's steps and whose invariant is its ``check``. ``derandomize=True`` makes
every CI run try the same inputs (no flakes); ``GENTORRENT_FUZZ_EXAMPLES`` scales the number of
examples for a longer local run (``python -m tests.fuzz`` is the long run that the docs record).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from tests.fuzz import targets
from tests.fuzz.mutate import DrawSource

SCALE = int(os.environ.get("GENTORRENT_FUZZ_EXAMPLES", "0")) or None
COMMON: dict[str, Any] = dict(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
                           HealthCheck.large_base_example],
)
STATELESS_SETTINGS = settings(max_examples=SCALE or 150, **COMMON)
STATEFUL_SETTINGS = settings(max_examples=SCALE or 15, stateful_step_count=25, **COMMON)


@pytest.mark.parametrize("cls", targets.STATELESS, ids=lambda c: c.NAME)
def test_stateless_target(cls: type[targets.Target]) -> None:
    target = cls()
    steps = [getattr(target, name) for name in cls.STEPS]

    @STATELESS_SETTINGS
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        src = DrawSource(data)
        step = steps[src.int(0, len(steps) - 1)]
        step(src)
        target.check()

    run()


def machine_for(cls: type[targets.Target]) -> type[RuleBasedStateMachine]:
    """A state machine whose rules are ``cls``'s steps and whose invariant is its ``check``."""

    def __init__(self: Any) -> None:
        RuleBasedStateMachine.__init__(self)
        self.target = cls()

    def make_rule(name: str) -> Any:
        def step(self: Any, data: st.DataObject) -> None:
            getattr(self.target, name)(DrawSource(data))

        step.__name__ = name
        return rule(data=st.data())(step)

    attrs: dict[str, Any] = {"__init__": __init__}
    attrs.update({name: make_rule(name) for name in cls.STEPS})
    attrs["invariants"] = invariant()(lambda self: self.target.check())
    return type(f"{cls.__name__}Machine", (RuleBasedStateMachine,), attrs)


@pytest.mark.parametrize("cls", targets.STATEFUL, ids=lambda c: c.NAME)
def test_stateful_target(cls: type[targets.Target]) -> None:
    run_state_machine_as_test(machine_for(cls), settings=STATEFUL_SETTINGS)


def test_the_long_run_prints_the_documented_figures(helpers: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m tests.fuzz --json`` (here 0.2 s per target): one object with the keys that
    docs/benchmarks.md "fuzz" lists, and no crash."""
    import json

    from tests.fuzz.__main__ import main

    assert main(["--seconds-per-target", "0.2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bench"] == "fuzz" and isinstance(out["params"], dict)
    figures = out["figures"]
    assert set(figures) == helpers.documented_figures("fuzz")
    assert figures["crashes_total"] == 0 and figures["inputs_total"] > 0
    assert all(isinstance(v, int | float) for v in figures.values())
