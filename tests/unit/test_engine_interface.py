"""Every backend satisfies the Engine protocol (model_node/engine.py)."""

from __future__ import annotations

import importlib.util

import pytest

from model_node.echo import EchoEngine
from model_node.engine import Engine, EngineError

from . import fake_vllm


def test_echo_is_an_engine() -> None:
    engine = EchoEngine()
    assert isinstance(engine, Engine)
    assert engine.name == "echo"


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python is not installed")
def test_llama_cpp_is_an_engine() -> None:
    from model_node.llama import LlamaCppEngine, resolve_model

    try:
        model_id, path = resolve_model(None)
    except EngineError as exc:
        pytest.skip(str(exc))
    engine = LlamaCppEngine(path, model_id=model_id, n_ctx=256)
    try:
        assert isinstance(engine, Engine)
        assert (engine.name, engine.model, engine.context_window) == ("llama.cpp", "smollm2-135m-instruct", 256)
    finally:
        engine.close()


def test_vllm_adapter_is_an_engine() -> None:
    from model_node.vllm import VllmEngine

    engine = VllmEngine("fake/model", vllm_module=fake_vllm)
    try:
        assert isinstance(engine, Engine)
        assert engine.name == "vllm"
    finally:
        engine.close()


def test_llama_model_resolution_errors(tmp_path) -> None:
    from model_node.llama import DEFAULT_MODEL_ID, resolve_model

    with pytest.raises(EngineError, match="model file not found"):
        resolve_model(str(tmp_path / "missing.gguf"))
    with pytest.raises(EngineError, match=DEFAULT_MODEL_ID):
        resolve_model("some-other-model-id")
    gguf = tmp_path / "Tiny-Model.Q8_0.gguf"
    gguf.write_bytes(b"GGUF")
    assert resolve_model(str(gguf)) == ("Tiny-Model.Q8_0", gguf)


def test_expected_logprob_matches_a_hand_computation() -> None:
    """``expected_logprob`` (shared by llama.cpp and vLLM) under temperature, top-k, top-p."""
    pytest.importorskip("numpy")
    import math

    from model_node.engine import expected_logprob
    from overlay.wire.messages import SamplingParams

    lse = math.log(sum(math.exp(x) for x in (2.0, 1.0, 0.0, -1.0)))
    logp = [x - lse for x in (2.0, 1.0, 0.0, -1.0)]
    shuffled = [logp[2], logp[0], logp[3], logp[1]]  # the order must not matter
    probs = [math.exp(x) for x in logp]
    assert expected_logprob(shuffled, SamplingParams(temperature=0.0)) == pytest.approx(logp[0])
    assert expected_logprob(shuffled, SamplingParams(temperature=1.0)) == pytest.approx(
        sum(q * x for q, x in zip(probs, logp, strict=True)))
    w = [math.exp(logp[0] / 0.5), math.exp(logp[1] / 0.5)]
    assert expected_logprob(shuffled, SamplingParams(temperature=0.5, top_k=2)) == pytest.approx(
        (w[0] * logp[0] + w[1] * logp[1]) / sum(w))
    # top_p 0.85 needs the top 2 of .644, .237, .087, .032; 0.5 only the top 1
    assert expected_logprob(shuffled, SamplingParams(temperature=1.0, top_p=0.85)) == pytest.approx(
        (probs[0] * logp[0] + probs[1] * logp[1]) / (probs[0] + probs[1]))
    assert expected_logprob(shuffled, SamplingParams(temperature=1.0, top_p=0.5)) == pytest.approx(logp[0])
    assert math.isnan(expected_logprob([], SamplingParams()))


def test_llama_scoring_math() -> None:
    """``score_rows``: the given token's log-probability, the argmax, and the expectation under
    temperature, top-k and top-p (computed here by hand on a 4-token vocabulary)."""
    np = pytest.importorskip("numpy")
    import math

    from model_node.llama import score_rows
    from overlay.wire.messages import SamplingParams

    logits = np.array([[2.0, 1.0, 0.0, -1.0]])
    lse = math.log(sum(math.exp(x) for x in logits[0]))
    logp = [x - lse for x in logits[0]]
    (greedy,) = score_rows(logits, [1], SamplingParams(temperature=0.0))
    assert greedy.token_id == 1 and greedy.argmax == 0
    assert greedy.logprob == pytest.approx(logp[1]) and greedy.expected_logprob == pytest.approx(logp[0])
    (t1,) = score_rows(logits, [0], SamplingParams(temperature=1.0))
    assert t1.expected_logprob == pytest.approx(sum(math.exp(x) * x for x in logp))
    (k2,) = score_rows(logits, [0], SamplingParams(temperature=0.5, top_k=2))
    w = [math.exp(2.0 / 0.5), math.exp(1.0 / 0.5)]
    assert k2.expected_logprob == pytest.approx((w[0] * logp[0] + w[1] * logp[1]) / sum(w))
    # top_p: at T=1 the probabilities are .644, .237, .087, .032: 0.85 needs the top 2, 0.9 the top 3
    (p85,) = score_rows(logits, [0], SamplingParams(temperature=1.0, top_p=0.85))
    (p90,) = score_rows(logits, [0], SamplingParams(temperature=1.0, top_p=0.9))
    probs = [math.exp(x) for x in logp]
    assert p85.expected_logprob == pytest.approx(sum(probs[i] * logp[i] for i in range(2)) / sum(probs[:2]))
    assert p90.expected_logprob == pytest.approx(sum(probs[i] * logp[i] for i in range(3)) / sum(probs[:3]))
    (both,) = score_rows(logits, [0], SamplingParams(temperature=1.0, top_k=3, top_p=0.7))
    renorm = [q / sum(probs[:3]) for q in probs[:3]]  # top_k first: .70, .26, .09 → 0.7 needs the top 2
    assert renorm[0] < 0.7 <= renorm[0] + renorm[1]
    assert both.expected_logprob == pytest.approx(sum(probs[i] * logp[i] for i in range(2)) / sum(probs[:2]))
    big = np.random.default_rng(1).normal(size=(3, 5000)) * 3  # the widening search of the nucleus
    for row in score_rows(big, [0, 1, 2], SamplingParams(temperature=1.3, top_p=0.999)):
        assert -20 < row.expected_logprob < 0
