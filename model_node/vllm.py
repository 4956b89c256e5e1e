"""The vLLM engine for GPU hosts (``--engine vllm``), written against vLLM 0.33.

vLLM is asyncio-based; model nodes run on trio. The adapter owns one dedicated
thread running an asyncio event loop: the vLLM engine is created on that loop
(so its output-handler task lives there) and every vLLM coroutine runs there
(``asyncio.run_coroutine_threadsafe``). Results come back to trio without
blocking either loop: the asyncio side schedules a non-blocking callback into
trio (``TrioToken.run_sync_soon``) that puts each ``RequestOutput`` into a trio
memory channel. Closing a generation early cancels its asyncio task, and vLLM
aborts the request (its ``generate`` does so on ``CancelledError``).

The adapter uses only these vLLM names and calls (``tests/unit/fake_vllm.py``
mirrors exactly them; docs/engines.md lists them):

- ``vllm.AsyncEngineArgs(model=..., enable_prefix_caching=True, max_logprobs=20, [max_model_len=...], **extra)``
- ``vllm.AsyncLLMEngine.from_engine_args(args)`` (on the asyncio loop), ``engine.shutdown()``
- ``engine.model_config.max_model_len``; ``engine.get_tokenizer()`` →
  ``tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)``,
  ``tokenizer.encode(text, add_special_tokens=False)``, ``tokenizer.decode(ids, skip_special_tokens=True)``
- ``vllm.TokensPrompt(prompt_token_ids=ids)``; ``vllm.SamplingParams(...)`` with
  ``n, temperature, top_p, top_k, seed, max_tokens, prompt_logprobs, detokenize, output_kind``;
  ``vllm.sampling_params.RequestOutputKind.DELTA`` / ``.FINAL_ONLY``
- ``async for out in engine.generate(prompt, sampling_params, request_id)``: ``out.outputs[0]``
  (``.text``, ``.token_ids``, ``.finish_reason``), ``out.finished``, ``out.num_cached_tokens``,
  ``out.prompt_logprobs`` (``None`` first, then ``{token_id: Logprob(logprob, rank, ...)}``)

Scoring uses ``prompt_logprobs``: one prefill over prompt + continuation returns, per
position, the log-probability of the given token and the top ``SCORE_TOP_LOGPROBS`` (20,
vLLM's default ``max_logprobs``) alternatives. The expected log-probability under the
sampling parameters is computed over those 20 only (temperature-scaled softmax restricted
to them, then top-k and top-p); the mass beyond the top 20 is ignored, an approximation
that is tight for the peaked distributions of chat models and exact for greedy.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import math
import os
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, Coroutine, Sequence
from typing import Any

import trio

from model_node.engine import EngineError, GenStats, Piece, TokenScore, expected_logprob
from overlay.messages import ChatMessage, SamplingParams

log = logging.getLogger("gentorrent.vllm")

INSTALL_HINT = "pip install 'gentorrent[vllm]' (vLLM 0.33, on a Linux host with a CUDA GPU)"
SCORE_TOP_LOGPROBS = 20  # vLLM's default max_logprobs: alternatives returned per prompt position
RECENT_PROMPTS = 64  # prompts remembered for cached_prefixes()
_END = object()


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
            n=1, temperature=p.temperature, top_p=p.top_p, top_k=p.top_k, seed=p.seed, max_tokens=p.max_tokens,
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
        eng._remember(self.prompt_ids)
        self.stats = GenStats(len(self.prompt_ids), len(self.prompt_ids) - cached, n_out, ttft, finish)


class VllmEngine:
    """vLLM on a GPU host (see the module docstring). ``model``: a Hugging Face id or local
    path (also the id the registry lists); ``n_ctx``: cap on the context window (default: the
    model's); ``engine_kwargs``: more ``AsyncEngineArgs`` fields (``gpu_memory_utilization``,
    ``dtype``...); ``vllm_module``: the ``vllm`` module (tests pass a fake)."""

    name = "vllm"

    def __init__(self, model: str, *, n_ctx: int | None = None, engine_kwargs: dict[str, Any] | None = None,
                 vllm_module: Any = None) -> None:
        if vllm_module is None:
            try:
                import vllm
            except ImportError as exc:
                raise EngineError(f"vLLM is not installed ({exc}): {INSTALL_HINT}") from None
            vllm_module = vllm
        self._vllm = v = vllm_module
        self._SamplingParams = v.SamplingParams  # first: vllm imports vllm.sampling_params lazily
        self._kind = v.sampling_params.RequestOutputKind
        self.model = model
        kwargs: dict[str, Any] = dict(model=model, enable_prefix_caching=True, max_logprobs=SCORE_TOP_LOGPROBS)
        if n_ctx is not None:
            kwargs["max_model_len"] = n_ctx
        kwargs.update(engine_kwargs or {})
        try:
            args = v.AsyncEngineArgs(**kwargs)
        except (TypeError, ValueError) as exc:
            raise EngineError(f"vLLM rejected the engine arguments {sorted(kwargs)}: {exc}") from None
        self._bridge = _AsyncioThread()
        self._ids = itertools.count()
        self._prefix = os.urandom(4).hex()
        self._recent: OrderedDict[tuple[int, ...], None] = OrderedDict()

        async def create() -> Any:
            return v.AsyncLLMEngine.from_engine_args(args)

        try:
            self._engine = self._bridge.submit(create()).result()
        except BaseException as exc:
            self._bridge.close()
            raise EngineError(f"vLLM could not start {model!r}: {exc}") from exc
        self.context_window = int(self._engine.model_config.max_model_len)
        self._tokenizer = self._engine.get_tokenizer()
        log.info("vLLM engine: %s, context %d tokens", model, self.context_window)

    def close(self) -> None:
        """Shut vLLM down and stop the asyncio thread."""
        engine = getattr(self, "_engine", None)
        if engine is not None:
            self._engine = None

            async def shutdown() -> None:
                engine.shutdown()

            self._bridge.submit(shutdown()).result()
        bridge = getattr(self, "_bridge", None)
        if bridge is not None:
            bridge.close()

    def _request_id(self) -> str:
        return f"gt-{self._prefix}-{next(self._ids)}"

    def _remember(self, prompt_ids: Sequence[int]) -> None:
        key = tuple(prompt_ids)
        self._recent[key] = None
        self._recent.move_to_end(key)
        while len(self._recent) > RECENT_PROMPTS:
            self._recent.popitem(last=False)

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
        except Exception as exc:  # noqa: BLE001 - reported to the caller as an engine error
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
                f"of {self.context_window} tokens of {self.model}")

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> VllmGeneration:
        self._check(prompt_ids, 1)
        return VllmGeneration(self, list(prompt_ids), params)

    async def score(self, prompt_ids: list[int], continuation_ids: list[int],
                    params: SamplingParams) -> list[TokenScore]:
        """One prefill over prompt + continuation with ``prompt_logprobs=20``; see the module
        docstring for the expectation over the top 20."""
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
            argmax = min(entry.items(), key=lambda kv: kv[1].rank if kv[1].rank is not None else math.inf)[0]
            scores.append(TokenScore(int(tok), float(entry[tok].logprob), expected_logprob(top, params), int(argmax)))
        return scores

    def cached_prefixes(self) -> list[tuple[int, ...]]:
        """Prompts served recently (vLLM's automatic prefix cache holds their KV blocks
        until it needs the memory; it does not say which it evicted)."""
        return list(reversed(self._recent))

    def detokenize(self, token_ids: Sequence[int]) -> str:
        text: str = self._tokenizer.decode(list(token_ids), skip_special_tokens=True)
        return text
