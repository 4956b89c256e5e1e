"""``gentorrent bench verify-gpu`` (verifier/bench/verify_gpu.py). Its figures come from a GPU
host (docs/benchmarks.md "verify-gpu"); here ``--quick`` runs the same code on a tiny random
model on the CPU, in float32, where every method computes the same log-probabilities, and the
full run refuses clearly without a GPU. Needs torch and transformers (`make setup-vllm`; CI)."""

from __future__ import annotations

import json
import os
import re
from typing import Any

import pytest

from tests.conftest import run_cli

if not os.environ.get("GENTORRENT_REQUIRE_VLLM"):
    pytest.importorskip("torch", reason="torch is not installed (make setup-vllm)")
    pytest.importorskip("transformers", reason="transformers is not installed (make setup-vllm)")

pytestmark = pytest.mark.slow
QUICK_BATCHES = ("1", "4")


def test_quick_run_prints_the_documented_keys_and_the_methods_agree(helpers: Any) -> None:
    done = run_cli("bench", "verify-gpu", "--quick", "--json", timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["bench"] == "verify-gpu"
    figures = out["figures"]
    # The documented keys are the 8B model's; --quick measures the tiny one with batches 1 and 4.
    documented = {k.replace("verify_gpu_8b_", "verify_gpu_tiny_") for k in helpers.documented_figures("verify-gpu")
                  if k.startswith("verify_gpu_8b_")}
    expected = {k for k in documented if (m := re.search(r"_batch(\d+)_", k)) is None or m.group(1) in QUICK_BATCHES}
    assert set(figures) == expected
    assert helpers.documented_figures("verify-gpu") >= {k.replace("_tiny_", "_135m_") for k in expected}
    f = {k.removeprefix("verify_gpu_tiny_"): v for k, v in figures.items()}
    for method in ("token_loop", "algorithm3", "batch"):  # float32 on the CPU: the same numbers
        assert f[f"{method}_logprob_max_abs_diff"] < 1e-4
    assert all(v > 0 for k, v in f.items() if k.endswith(("_per_min", "_ms")))
    assert f["one_pass_vs_token_loop"] == pytest.approx(f["token_loop_mean_ms"] / f["one_pass_mean_ms"])
    assert 0.5 < f["calibrated_mean"] <= 1.0  # honest samples of the scoring model
    assert out["params"]["models"]["tiny"]["parameters"] > 0


def test_full_run_without_a_gpu_says_what_to_run_instead() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: the full run would measure it")
    done = run_cli("bench", "verify-gpu", "--json", timeout=120)
    assert done.returncode != 0
    assert "no CUDA device" in done.stderr and "bench verify" in done.stderr
    assert done.stdout == ""
