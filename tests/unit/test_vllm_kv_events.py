"""The vLLM adapter's pure parts: the KV block index fed by vLLM's KV-cache events, and the
checks on ``--model`` that run before the engine starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model_node.convert import MARKER
from model_node.engine import EngineError
from model_node.vllm import KvBlockIndex, resolve_vllm_model

B = 4  # block size of these tests


def toks(start: int, n: int = B) -> list[int]:
    return list(range(start, start + n))


def test_stored_chains_become_prefixes_longest_only_newest_first() -> None:
    idx = KvBlockIndex()
    idx.stored(["a", "b"], None, toks(0, 2 * B), B)     # one prompt: two blocks
    idx.stored(["c"], "b", toks(100), B)                # the same prompt grew by one block
    idx.stored(["x"], None, toks(50), B)                # another prompt
    assert idx.prefixes() == [tuple(toks(50)), tuple(toks(0, 2 * B) + toks(100))]
    idx.stored(["d"], "a", toks(200), B)                # a branch after the first block
    assert idx.prefixes()[0] == tuple(toks(0) + toks(200))
    assert len(idx.prefixes()) == 3


def test_removed_blocks_disappear_and_orphans_are_not_reported() -> None:
    idx = KvBlockIndex()
    idx.stored(["a", "b", "c"], None, toks(0, 3 * B), B)
    idx.removed(["c"])                                   # the leaf evicted: the shorter prefix remains
    assert idx.prefixes() == [tuple(toks(0, 2 * B))]
    idx.removed(["a"])                                   # an ancestor evicted: nothing reusable remains
    assert idx.prefixes() == []
    idx.removed(["never-stored"])                        # unknown hashes are ignored
    assert len(idx) == 1


def test_cleared_forgets_everything() -> None:
    idx = KvBlockIndex()
    idx.stored([1, 2], None, toks(0, 2 * B), B)
    idx.cleared()
    assert idx.prefixes() == [] and len(idx) == 0


def test_malformed_and_cyclic_events_claim_nothing() -> None:
    idx = KvBlockIndex()
    idx.stored(["a"], None, toks(0, B + 1), B)           # token count does not match the blocks
    idx.stored(["a"], None, toks(0), 0)
    assert len(idx) == 0
    idx.stored(["p"], "q", toks(0), B)                   # p -> q -> p: no root
    idx.stored(["q"], "p", toks(10), B)
    assert idx.prefixes() == []


def test_the_index_is_bounded() -> None:
    idx = KvBlockIndex(max_blocks=3)
    for i in range(5):
        idx.stored([i], None, toks(10 * i), B)
    assert len(idx) == 3 and idx.prefixes()[0] == tuple(toks(40))


# --------------------------------------------------------------------------- --model checks


def checkpoint(d: Path, *, marker: str | None = None) -> Path:
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"")
    (d / "tokenizer.json").write_text("{}")
    if marker:
        (d / MARKER).write_text(json.dumps({"model_id": marker}))
    return d


def test_a_gguf_is_refused_with_the_conversion_command(tmp_path: Path) -> None:
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    with pytest.raises(EngineError, match=r"python -m model_node\.convert .*m\.gguf"):
        resolve_vllm_model(str(f))
    with pytest.raises(EngineError, match="convert it"):
        resolve_vllm_model(str(tmp_path / "missing.gguf"))


def test_incomplete_and_missing_directories_name_what_is_missing(tmp_path: Path) -> None:
    d = tmp_path / "broken"
    d.mkdir()
    (d / "config.json").write_text("{}")
    with pytest.raises(EngineError, match=r"missing \*\.safetensors weights, tokenizer files"):
        resolve_vllm_model(str(d))
    with pytest.raises(EngineError, match="model directory not found"):
        resolve_vllm_model(str(tmp_path / "nowhere"))


def test_directories_and_ids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENTORRENT_CACHE", str(tmp_path / "cache"))
    plain = checkpoint(tmp_path / "My-Model")
    assert resolve_vllm_model(str(plain)) == ("My-Model", str(plain.resolve()))
    with pytest.raises(EngineError, match=r"has not been converted for vLLM: run `python -m model_node\.convert`"):
        resolve_vllm_model(None)
    conv = checkpoint(tmp_path / "cache" / "vllm-models" / "smollm2-135m-instruct", marker="smollm2-135m-instruct")
    assert resolve_vllm_model(None) == ("smollm2-135m-instruct", str(conv))
    assert resolve_vllm_model(str(conv)) == ("smollm2-135m-instruct", str(conv.resolve()))
    assert resolve_vllm_model("Qwen/Qwen2.5-7B-Instruct") == ("Qwen/Qwen2.5-7B-Instruct",) * 2
