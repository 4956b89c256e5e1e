""":class:`LlamaCppEngine`: loads the model and creates the llama.cpp context (one KV stream per
sequence, batch invariant by default), wires the parts (:mod:`.template`, :mod:`.kv_cache`,
:mod:`.scoring`, :mod:`.worker`) and serves the :class:`~model_node.engine.Engine` protocol:
``chat_prompt``/``tokenize``/``detokenize``, ``generate``, ``score``/``score_batch``,
``cached_prefixes`` and ``kv_usage``, with the checks on prompts and token ids.

**Batch invariance** (default): logits do not depend on how a position's tokens were batched,
cached or which other sequences shared the batch (see :data:`INVARIANT_UBATCH`; each sequence
has its own KV stream, so its cells stay in position order), so a cache hit or a busy node never
changes a reply (same seed ⇒ same text as when served alone) and one-pass scoring agrees with
generation token by token."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

from model_node.engine import EngineError, TokenScore
from model_node.llama.kv_cache import DEFAULT_CACHE_BYTES, N_BATCH, KvCache
from model_node.llama.loading import import_llama_cpp, model_params
from model_node.llama.scoring import ScorePass, Scorer
from model_node.llama.template import ChatTokens
from model_node.llama.worker import (
    PREFILL_CHUNK,
    LlamaGeneration,
    ScoreBatchRequest,
    ScoreRequest,
    Worker,
)
from overlay.wire.messages import ChatMessage, SamplingParams

log = logging.getLogger("gentorrent.llama")

# Batch invariance (docs/decisions/0004-llama-prefix-cache.md). llama.cpp's CPU attention takes
# other code paths for 64+ tokens per physical batch (tiled) and for one token over 512+ KV
# cells with several threads (KV split across threads); each sums in another order, and logits
# then move by up to ~2 (measured with SmolLM2): a greedy reply changes after a cache hit, and
# one-pass scoring disagrees with the tokens generated one at a time. With physical batches of
# 32 tokens and one thread for one-token batches, every position's logits are bit-identical
# however its tokens were evaluated (one at a time, in batches, restored from a snapshot,
# beside other sequences' tokens).
INVARIANT_UBATCH = 32
# A request's context window by default: model nodes serve in it, and verifiers score in it, so
# that every reply a node may give can be scored (decision 0032)
DEFAULT_N_CTX = 4096


class LlamaCppEngine:
    """llama.cpp on CPU: see :mod:`model_node.llama`. ``model_path``: a GGUF file; ``model_id``:
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
    prefill than without); ``score_fresh``: scoring passes evaluate from scratch
    (:meth:`Scorer.place <model_node.llama.scoring.Scorer.place>`). Call :meth:`close` when
    done: it stops the engine thread."""

    name = "llama.cpp"

    # Waiting prompts are evaluated lowest ``priority`` first (ties first come first served): the
    # model node's admission orders them (model_node.admission; engine.OrdersPrompts).
    orders_prompts = True

    def __init__(self, model_path: str | os.PathLike[str], *, model_id: str | None = None, n_ctx: int = DEFAULT_N_CTX,
                 n_threads: int | None = None, cache_bytes: int = DEFAULT_CACHE_BYTES,
                 max_snapshots: int | None = None, batch_invariant: bool = True, slots: int = 1,
                 prefill_chunk: int = PREFILL_CHUNK, score_fresh: bool = False) -> None:
        if not 1 <= slots <= 256:
            raise EngineError(f"slots must be between 1 and 256 (got {slots})")
        if not 1 <= prefill_chunk <= N_BATCH:
            raise EngineError(f"prefill_chunk must be between 1 and {N_BATCH} (got {prefill_chunk})")
        L = self._L = import_llama_cpp()
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
        self._kv_cache = KvCache(L, self._ctx, slots, self.context_window, self.cache_bytes, max_snapshots)
        self._tokens = ChatTokens(L, self._model, path.name)
        self.n_vocab = self._tokens.n_vocab
        scorer = Scorer(L, self._ctx, self._kv_cache, self.n_vocab, score_fresh)
        self._worker = Worker(L, self._ctx, self._kv_cache, self._tokens, scorer, name=f"llama.cpp {self.model}",
                              context_window=self.context_window, prefill_chunk=prefill_chunk)
        log.info("llama.cpp engine: %s (%s), %d slots of %d tokens, %d threads, snapshot cache %d MiB%s",
                 self.model, path.name, slots, self.context_window, threads, self.cache_bytes >> 20,
                 "" if max_snapshots is None else f", at most {max_snapshots} snapshots")

    def close(self) -> None:
        """Stop the engine thread (requests still running end with an :class:`EngineError`),
        then free the llama.cpp context and model (also done at garbage collection)."""
        L = getattr(self, "_L", None)
        if L is None:
            return
        worker = getattr(self, "_worker", None)
        if worker is not None:
            worker.close()
        kv_cache = getattr(self, "_kv_cache", None)
        if kv_cache is not None:
            kv_cache.close()
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

    def tokenize(self, text: str, *, special: bool = False) -> list[int]:
        """Token ids of ``text``; ``special``: parse control-token text (template parts only)."""
        return self._tokens.tokenize(text, special=special)

    def chat_prompt(self, messages: Sequence[ChatMessage], continuation: str = "") -> list[int]:
        """Token ids of the model's chat template applied to ``messages``, opened for the reply,
        then ``continuation`` (:meth:`ChatTokens.chat_prompt <model_node.llama.template.ChatTokens.chat_prompt>`)."""
        return self._tokens.chat_prompt(messages, continuation)

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return self._tokens.detokenize(token_ids)

    def end_token(self) -> int | None:
        """The model's end-of-turn token (:class:`~model_node.engine.EndsReplies`)."""
        return self._tokens.end_token()

    def is_end(self, token_id: int) -> bool:
        """Whether ``token_id`` ends generation (an end-of-generation token of the vocabulary)."""
        return 0 <= token_id < self.n_vocab and self._tokens.is_eog(token_id)

    # ----------------------------------------------------------------- cache state (read by callers)

    def cached_prefixes(self) -> list[tuple[int, ...]]:
        """What the sequences hold (running ones first, then free ones, most recently used
        first) and the KV snapshots (newest first), as of the engine thread's last step."""
        return list(self._kv_cache.held)

    def kv_usage(self) -> float:
        """Fraction of the KV cells (all sequences) in use, for the group's load reports."""
        return self._kv_cache.usage

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
        self._tokens.check_ids(prompt_ids)

    def generate(self, prompt_ids: list[int], params: SamplingParams, priority: float = 0.0) -> LlamaGeneration:
        """Start a reply. Waiting prompts take free sequences and prompt chunks lowest
        ``priority`` first, ties in arrival order."""
        self._check_prompt(prompt_ids)
        return LlamaGeneration(self._worker, list(prompt_ids), params, priority)

    async def score(self, prompt_ids: list[int], continuation_ids: list[int],
                    params: SamplingParams) -> list[TokenScore]:
        """Teacher-forced scoring of ``continuation_ids`` in one pass over prompt + continuation
        (cached prefixes of the prompt are reused; only the positions that predict a
        continuation token return logits). See :func:`~model_node.llama.scoring.score_rows`."""
        self._check_prompt(prompt_ids, len(continuation_ids))
        self._tokens.check_ids(continuation_ids)
        if not continuation_ids:
            return []
        scores: list[TokenScore] = await self._worker.run(
            ScoreRequest(ScorePass(list(prompt_ids) + list(continuation_ids), len(prompt_ids) - 1, params)))
        return scores

    async def score_batch(self, items: Sequence[tuple[list[int], list[int], SamplingParams]]
                          ) -> list[list[TokenScore]]:
        """:meth:`score` of several ``(prompt_ids, continuation_ids, params)`` at once: as many
        as the engine has sequences (``slots``) are evaluated side by side in shared
        ``llama_decode`` batches. Same scores as one :meth:`score` call each (batch invariance)."""
        jobs = []
        for prompt_ids, continuation_ids, params in items:
            self._check_prompt(prompt_ids, len(continuation_ids))
            self._tokens.check_ids(continuation_ids)
            jobs.append(ScorePass(list(prompt_ids) + list(continuation_ids), len(prompt_ids) - 1, params))
        if not jobs:
            return []
        results: list[list[TokenScore]] = await self._worker.run(ScoreBatchRequest(jobs))
        return results
