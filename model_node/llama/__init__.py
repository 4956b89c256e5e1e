"""The llama.cpp engine: the CPU default (DESIGN.md "Model nodes"; paper §3.3–3.4).

:class:`LlamaCppEngine` serves a GGUF model through llama-cpp-python's low-level binding of the
llama.cpp C API (``llama_cpp.llama_decode``, samplers, memory and state functions), not its
high-level ``Llama`` class, so that it controls exactly which tokens are evaluated:

- **Token ids flow end to end.** :meth:`~LlamaCppEngine.chat_prompt` renders the chat template
  from the model's GGUF metadata and tokenizes it here; the engine generates from those ids;
  output ids include the end-of-generation token when the model stopped, so a verifier
  re-scores exactly what was signed.
- **Several requests at once** (docs/decisions/0011-llama-batching.md). The context has
  ``slots`` sequences, each with its own KV stream of ``context_window`` cells. One engine
  thread owns the context; each step evaluates, in one ``llama_decode`` batch, the next token of
  every running reply and a chunk of prompt tokens (chunked prefill, lowest ``priority`` first).
- **Prefix cache** (docs/decisions/0004-llama-prefix-cache.md, 0011). A new prompt reuses the
  longest cached prefix: in a free sequence, copied from another sequence, or restored from an
  LRU of KV snapshots (``cache_bytes``). ``cached_prefixes()`` lists what is held;
  ``GenStats.evaluated_prompt_tokens`` counts the prompt tokens handed to ``llama_decode``.
- **Batch invariance** (default): logits do not depend on batching, caching or neighbours in a
  batch, so a cache hit or a busy node never changes a reply and one-pass scoring agrees with
  generation token by token.
- **Scoring**: prompt + continuation evaluated once in a free sequence, then, with numpy, each
  position's log-probability, expected log-probability and its variance under the sampling
  parameters (:func:`score_rows`).

One job per module:

- :mod:`.loading`: the model file (``--model``) and loading llama.cpp (log, backend, model
  parameters for this host).
- :mod:`.template`: the chat template and tokens (:class:`~.template.ChatTokens`).
- :mod:`.kv_cache`: the context's sequences, stream copies, KV snapshots, placing a prompt on its
  longest cached prefix, and decoding tokens into sequences (:class:`~.kv_cache.KvCache`).
- :mod:`.scoring`: the scoring math (:func:`score_rows`) and scoring passes
  (:class:`~.scoring.Scorer`).
- :mod:`.worker`: the engine thread (scheduler, sampling, delivery to trio callers;
  :class:`~.worker.Worker`) and :class:`LlamaGeneration`.
- :mod:`.engine`: :class:`LlamaCppEngine`, which creates the context, wires the parts and
  serves the :class:`~model_node.engine.Engine` protocol.
"""

from model_node.llama.engine import INVARIANT_UBATCH, LlamaCppEngine
from model_node.llama.kv_cache import DEFAULT_CACHE_BYTES, MIN_SNAPSHOT_TOKENS, N_BATCH
from model_node.llama.loading import (
    DEFAULT_MODEL_ID,
    EXTRA_BUFFERS_ENV,
    INSTALL_HINT,
    SMOLLM2_FILE,
    extra_buffers,
    model_params,
    model_params_for_this_host,
    resolve_model,
    smollm2_path,
)
from model_node.llama.scoring import score_rows
from model_node.llama.worker import PREFILL_CHUNK, LlamaGeneration

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "DEFAULT_MODEL_ID",
    "EXTRA_BUFFERS_ENV",
    "INSTALL_HINT",
    "INVARIANT_UBATCH",
    "MIN_SNAPSHOT_TOKENS",
    "N_BATCH",
    "PREFILL_CHUNK",
    "SMOLLM2_FILE",
    "LlamaCppEngine",
    "LlamaGeneration",
    "extra_buffers",
    "model_params",
    "model_params_for_this_host",
    "resolve_model",
    "score_rows",
    "smollm2_path",
]
