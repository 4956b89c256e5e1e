"""The GPU bench's scoring math (verifier/bench/verify_gpu.py, torch) computes what the CPU
engine's does (model_node.llama.score_rows, numpy float64): the same token log-probabilities,
expected log-probabilities and their variances under every kind of sampling cut, and argmaxes. Needs torch (`make
setup-vllm` installs it; CI has it)."""

from __future__ import annotations

import os

import pytest

from model_node.llama import score_rows
from overlay.wire.messages import SamplingParams

if not os.environ.get("GENTORRENT_REQUIRE_VLLM"):
    pytest.importorskip("torch", reason="torch is not installed (make setup-vllm)")
import numpy as np
import torch

from verifier.bench.verify_gpu import expected_logprob_torch, score_rows_torch

PARAMS = [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.7),
    SamplingParams(temperature=1.0, top_k=40),
    SamplingParams(temperature=0.8, top_p=0.9),
    SamplingParams(temperature=1.3, top_k=50, top_p=0.5),
    SamplingParams(temperature=0.5, top_p=0.01),  # the nucleus is the top token alone
]


@pytest.mark.parametrize("params", PARAMS, ids=lambda p: f"T{p.temperature}-k{p.top_k}-p{p.top_p}")
def test_torch_scores_equal_numpy_scores(params: SamplingParams) -> None:
    rng = np.random.default_rng(3)
    logits = rng.normal(0.0, 3.0, size=(12, 1000))
    logits[0] += 8.0 * (np.arange(1000) == 17)  # one peaked row
    targets = [int(t) for t in rng.integers(0, 1000, size=12)]
    want = score_rows(logits, targets, params)
    got = score_rows_torch(torch.from_numpy(logits), targets, params)
    assert [s.token_id for s in got] == targets
    assert [s.argmax for s in got] == [s.argmax for s in want]
    for g, w in zip(got, want, strict=True):
        assert g.logprob == pytest.approx(w.logprob, abs=1e-9)
        assert g.expected_logprob == pytest.approx(w.expected_logprob, abs=1e-9)
        assert g.var_logprob == pytest.approx(w.var_logprob, abs=1e-9)
    if params.temperature == 0.0 or params.top_p < 0.05:  # one token to draw: no spread
        assert all(s.var_logprob == 0.0 for s in got)
    else:
        assert any(s.var_logprob > 0.01 for s in got)


def test_float32_rows_are_close_and_a_cut_changes_the_expectation() -> None:
    rng = np.random.default_rng(4)
    logits = rng.normal(0.0, 2.0, size=(4, 500)).astype(np.float32)
    params = SamplingParams(temperature=0.9, top_p=0.8)
    want = score_rows(logits, [1, 2, 3, 4], params)
    got = score_rows_torch(torch.from_numpy(logits).to(torch.bfloat16).float(), [1, 2, 3, 4], params)
    for g, w in zip(got, want, strict=True):
        assert g.expected_logprob == pytest.approx(w.expected_logprob, abs=0.05)
        assert g.var_logprob == pytest.approx(w.var_logprob, rel=0.05, abs=0.05)
    lp = torch.log_softmax(torch.from_numpy(logits).double(), dim=-1)
    uncut = expected_logprob_torch(lp, SamplingParams(temperature=0.9))
    cut = expected_logprob_torch(lp, params)
    assert bool((cut > uncut).all())  # cutting the tail raises the expected log-probability
