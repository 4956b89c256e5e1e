"""Every benchmark prints exactly the figure keys docs/benchmarks.md documents.

hrtree, forwarding, forwarding-threshold, gateway and audit-evasion have their own tests; these
run the others in ``--quick`` mode (figures are rough there; only the keys are checked).
"""

from __future__ import annotations

import importlib.util
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
    expected = helpers.documented_figures(name)
    if name == "engine" and importlib.util.find_spec("vllm") is None:  # vLLM figures need make setup-vllm
        expected = {k for k in expected if not k.startswith("vllm")}
        assert out["params"]["vllm"].startswith("not measured: vLLM is not installed")
    assert set(figures) == expected
    assert all(isinstance(v, int | float) for v in figures.values())
