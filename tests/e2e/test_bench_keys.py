"""Every benchmark prints exactly the figure keys docs/benchmarks.md documents.

hrtree, forwarding, forwarding-threshold and gateway have their own tests; these run the
others in ``--quick`` mode (figures are rough there; only the keys are checked).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import run_cli


@pytest.mark.slow
@pytest.mark.parametrize("name", ["wire", "sida", "overlay", "engine", "verify"])
def test_bench_prints_the_documented_keys(name: str, helpers: Any) -> None:
    done = run_cli("bench", name, "--quick", "--json", timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["bench"] == name and isinstance(out["params"], dict)
    figures = out["figures"]
    assert set(figures) == helpers.documented_figures(name)
    assert all(isinstance(v, int | float) for v in figures.values())
