"""The score measurement on the real engine (simulations/measure_scores.py), tiny: one prompt,
16 tokens. The verifier scores its own model's greedy reply at exactly 1 (the engine is batch
invariant), and the Q2_K requantization is made by llama.cpp's quantizer into the cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulations import measure_scores

pytestmark = pytest.mark.slow
pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'gentorrent[llama]')")


def test_tiny_measurement(tmp_path: Path) -> None:
    out = tmp_path / "scores.json"
    assert measure_scores.main(["--prompts", "1", "--max-tokens", "16", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert set(data["samples"]) == set(measure_scores.SETTINGS)
    greedy = data["samples"]["greedy"]
    assert greedy["honest"][0]["calibrated"] == 1.0
    assert greedy["honest"][0]["argmax_agreement"] == 1.0
    assert 0.0 < greedy["degraded"][0]["calibrated"] <= 1.0
    assert any(p.name.endswith(".Q2_K.gguf") for p in measure_scores.cache_dir().iterdir())
