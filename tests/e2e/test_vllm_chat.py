"""A chat through the anonymous overlay answered by ``gentorrent model-node --engine vllm`` (real
processes: 12 relays and a vLLM model node serving SmolLM2-135M converted from its GGUF), and the
model node's errors for a model vLLM cannot serve.

Needs ``make setup-vllm``; skipped without vLLM unless ``GENTORRENT_REQUIRE_VLLM=1`` (CI)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import trio

from gentorrent.tools.localnet import LocalNet
from overlay.net.transport import TLSTransport
from overlay.usernode import UserNode
from overlay.wire.messages import ChatMessage, SamplingParams

if importlib.util.find_spec("vllm") is None and not os.environ.get("GENTORRENT_REQUIRE_VLLM"):
    pytest.skip("vLLM is not installed (make setup-vllm)", allow_module_level=True)

from model_node import convert
from model_node.engine import EngineError
from model_node.llama import DEFAULT_MODEL_ID, resolve_model
from model_node.vllm import VllmEngine

# vLLM, torch and transformers warn about their own internals at import (not ours to fix)
THIRD_PARTY = r"(torch|vllm|transformers)(\.|$)"
pytestmark = [pytest.mark.vllm, pytest.mark.slow,
              *(pytest.mark.filterwarnings(f"ignore::{w}:{THIRD_PARTY}")
                for w in ("DeprecationWarning", "FutureWarning", "UserWarning")),
              # vLLM 0.32's client leaves a ZMQ context for the garbage collector (VllmEngine.close)
              pytest.mark.filterwarnings("ignore:Unclosed context:ResourceWarning")]


async def test_a_vllm_model_node_answers_through_the_overlay(tmp_path: Path) -> None:
    convert.convert()  # cached
    with LocalNet(tmp_path, 12, users=("client",), registry_keys=1, engine="vllm", model=DEFAULT_MODEL_ID) as net:
        net.start(timeout=240)  # vLLM's engine start: ~35 s on a quiet 2-core machine
        ident = net.identities["client"]
        host, port = net.entries["client"].address.rsplit(":", 1)
        async with trio.open_nursery() as nursery:
            user = UserNode(ident, TLSTransport(ident), net.registry, build_timeout=5.0)
            await nursery.start(user.serve, host, int(port))
            assert user.paths is not None and user.client is not None
            with trio.fail_after(30):
                await user.paths.wait_ready(4)
            msgs = [ChatMessage("system", "You are a helpful assistant."),
                    ChatMessage("user", "What is the capital of France?")]
            params = SamplingParams(temperature=0.0, max_tokens=32)
            chunks = [c async for c in user.client.request(DEFAULT_MODEL_ID, msgs, params, chunk_timeout=120)]
            nursery.cancel_scope.cancel()
        assert "Paris" in "".join(c.text for c in chunks)
        assert chunks[-1].done and len(chunks[-1].signature) == 64 and not chunks[-1].error
        assert chunks[-1].node == net.entries["model-0"].node_id


def test_models_vllm_cannot_serve_fail_before_the_node_starts(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from gentorrent.cli import main

    base = ["model-node", "--data-dir", str(tmp_path / "node"), "--engine", "vllm"]
    gguf = resolve_model(None)[1]
    assert main([*base, "--model", str(gguf)]) == 2
    assert f"python -m model_node.convert {gguf}" in capsys.readouterr().err
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    assert main([*base, "--model", str(broken)]) == 2
    assert "not a complete model directory (missing *.safetensors weights, tokenizer files)" in capsys.readouterr().err
    monkeypatch.setenv("GENTORRENT_CACHE", str(tmp_path / "empty-cache"))
    assert main(base) == 2
    assert "has not been converted for vLLM: run `python -m model_node.convert`" in capsys.readouterr().err


def test_an_engine_that_cannot_start_says_so(tmp_path: Path) -> None:
    """A directory with the right files but no loadable model: vLLM refuses it and the adapter says
    which model and why (the model node loads its engine before it listens or registers)."""
    d = tmp_path / "hollow"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"")
    (d / "tokenizer.json").write_text("{}")
    with pytest.raises(EngineError, match=f"vLLM could not start '{d}'"):
        VllmEngine(str(d))
