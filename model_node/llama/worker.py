"""The engine thread (docs/decisions/0011-llama-batching.md): the only code that touches the
llama.cpp context once started, and the trio side that talks to it.

Several requests run at once. Each step evaluates, in one ``llama_decode`` batch, the next
token of every running reply and up to ``prefill_chunk`` prompt tokens of requests still in
prefill, lowest ``priority`` first, ties first come first served (chunked prefill: a newcomer's
prompt is evaluated in pieces between decode steps, so a long reply never holds its first token;
the model node gives a mostly cached prompt a place ahead of cold ones,
:mod:`model_node.admission`), then samples each sequence that produced logits with that
request's own sampler (temperature → top-k → top-p → draw, llama.cpp's sampler chain seeded by
``seed``; greedy when ``temperature == 0``). Requests beyond the sequences wait, and take freed
sequences in the same order. Scoring passes waiting for a free sequence run first; running
replies pause meanwhile. Trio callers submit requests and receive pieces over a memory channel;
cancelling one frees its sequence at the next step and leaves the others alone."""

from __future__ import annotations

import codecs
import logging
import math
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator
from typing import Any

import trio

from model_node.engine import EngineError, GenStats, Piece
from model_node.llama.kv_cache import N_BATCH, KvCache, Slot
from model_node.llama.scoring import ScorePass, Scorer
from model_node.llama.template import ChatTokens
from overlay.wire.messages import SamplingParams

log = logging.getLogger("gentorrent.llama")

PREFILL_CHUNK = 128  # prompt tokens evaluated per scheduler step, between decode steps (0011)


def _put(send: Any, item: Any) -> None:
    """Runs in the caller's trio loop (``run_sync_soon``): hand ``item`` over, unless the caller
    has gone (a closed channel must not raise inside trio's callback)."""
    try:
        send.send_nowait(item)
    except (trio.ClosedResourceError, trio.BrokenResourceError):
        pass


class Client:
    """A trio caller waiting for the engine thread's answers on an unbounded memory channel
    (the engine thread never blocks on a slow reader)."""

    def __init__(self) -> None:
        self.send, self.recv = trio.open_memory_channel[Any](math.inf)
        self.token = trio.lowlevel.current_trio_token()
        self.cancelled = False  # set by the caller; the engine thread then stops working for it


class Request(Client):
    """One generation while the engine thread serves it."""

    def __init__(self, prompt: list[int], params: SamplingParams, t0: float, priority: float = 0.0) -> None:
        super().__init__()
        self.prompt, self.params, self.t0 = prompt, params, t0
        self.order = (priority, t0)  # prompts are evaluated lowest first
        self.slot: Slot | None = None
        self.sampler: Any = None
        self.fed = 0  # prompt tokens in the sequence (cached or evaluated)
        self.evaluated = 0  # prompt tokens handed to llama_decode
        self.next_tok: int | None = None  # sampled, not evaluated yet
        self.n_out = 0
        self.pending: list[int] = []  # ids whose text is not complete UTF-8 yet
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.ttft = 0.0


class ScoreRequest(Client):
    """One scoring pass; answered with its scores."""

    def __init__(self, job: ScorePass) -> None:
        super().__init__()
        self.job = job


class ScoreBatchRequest(Client):
    """Several scoring passes evaluated together, each in its own sequence, their tokens in shared
    ``llama_decode`` batches (:meth:`Scorer.score_batch`); answered with a list of scores each."""

    def __init__(self, jobs: list[ScorePass]) -> None:
        super().__init__()
        self.jobs = jobs


class LlamaGeneration:
    """One request on a :class:`~model_node.llama.LlamaCppEngine`; iterate once for its pieces.
    Leaving the iteration early (cancellation, ``aclose``) frees its sequence; ``stats`` is set
    when the reply has ended."""

    def __init__(self, worker: Worker, prompt_ids: list[int], params: SamplingParams,
                 priority: float = 0.0) -> None:
        self.worker, self.prompt_ids, self.params, self.priority = worker, prompt_ids, params, priority
        self.stats: GenStats | None = None
        self._req: Request | None = None

    @property
    def prompt_left(self) -> int | None:
        """Prompt tokens not evaluated yet (cached ones count as evaluated); ``None`` until the
        engine has placed the request in a sequence. Read from another thread: a snapshot."""
        r = self._req
        if r is None or r.slot is None:
            return None
        return 0 if r.n_out else max(0, len(r.prompt) - r.fed)

    async def __aiter__(self) -> AsyncGenerator[Piece, None]:
        req = self._req = Request(self.prompt_ids, self.params, time.perf_counter(), self.priority)
        self.worker.submit(req)
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
                self.worker.cancel(req)


class Worker:
    """The engine thread over ``kv``'s sequences (started by the first :meth:`submit`), with
    ``tokens`` for the text of sampled tokens and ``scorer`` for scoring passes; ``name``: the
    thread's name; ``context_window``: tokens per sequence; ``prefill_chunk``: prompt tokens per
    step. Call :meth:`close` to stop it."""

    def __init__(self, L: Any, ctx: Any, kv: KvCache, tokens: ChatTokens, scorer: Scorer, *, name: str,
                 context_window: int, prefill_chunk: int) -> None:
        self._L, self._ctx, self._kv, self._tokens, self._scorer = L, ctx, kv, tokens, scorer
        self.name, self.context_window, self.prefill_chunk = name, context_window, prefill_chunk
        # Shared with trio callers, under _cv:
        self._cv = threading.Condition()
        self._inbox: list[Client] = []
        self._cancels: list[Client] = []
        self._closing = False
        self._thread: threading.Thread | None = None
        # Owned by the engine thread:
        self.waiting: deque[Request] = deque()
        self.scores: deque[ScoreRequest | ScoreBatchRequest] = deque()
        self.active: list[Request] = []  # in admission order

    def close(self) -> None:
        """Stop the engine thread (requests still running end with an :class:`EngineError`) and
        wait for it (unless called on it)."""
        with self._cv:
            self._closing = True
            self._cv.notify()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    # ----------------------------------------------------------------- trio side

    def submit(self, client: Client) -> None:
        """Hand ``client`` to the engine thread (started on first use)."""
        with self._cv:
            if self._closing:
                raise EngineError("the llama.cpp engine is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
                self._thread.start()
            self._inbox.append(client)
            self._cv.notify()

    def cancel(self, client: Client) -> None:
        """``client``'s caller gave up: the engine thread stops working for it at its next step."""
        client.cancelled = True
        with self._cv:
            self._cancels.append(client)
            self._cv.notify()

    async def run(self, job: ScoreRequest | ScoreBatchRequest) -> Any:
        """Submit a scoring job to the engine thread and wait for its one answer (cancelled with
        the caller; an engine error is raised here)."""
        self.submit(job)
        try:
            item = await job.recv.receive()
        except BaseException:
            self.cancel(job)
            raise
        if isinstance(item, Exception):
            raise item
        return item

    # ----------------------------------------------------------------- the engine thread

    def _loop(self) -> None:
        """The engine thread: the only code that touches the llama.cpp context once started."""
        while True:
            with self._cv:
                while not (self._closing or self._inbox or self._cancels or self.active or self.waiting
                           or self.scores):
                    self._cv.wait()
                if self._closing:
                    leftover: list[Client] = [*self._inbox, *self.active, *self.waiting, *self.scores]
                    break
                inbox, self._inbox = self._inbox, []
                cancels, self._cancels = self._cancels, []
            for c in inbox:
                if isinstance(c, ScoreRequest | ScoreBatchRequest):
                    self.scores.append(c)
                elif isinstance(c, Request):
                    self.waiting.append(c)
            for c in cancels:
                self._drop(c)
            out: list[tuple[Client, Any]] = []
            try:
                self._step(out)
            except Exception as exc:
                log.exception("llama.cpp engine step failed")
                err = EngineError(f"the llama.cpp engine failed ({exc}); try again or another model node")
                for r in list(self.active):
                    self._release(r)
                    out.append((r, err))
            self._kv.publish()
            for client, item in out:
                self._deliver(client, item)
        for r in list(self.active):
            self._release(r)
        for c in leftover:
            self._deliver(c, EngineError("the llama.cpp engine was closed; try again or another model node"))

    def _deliver(self, client: Client, item: Any) -> None:
        if client.cancelled:
            return
        try:
            client.token.run_sync_soon(_put, client.send, item)
        except trio.RunFinishedError:
            client.cancelled = True

    def _drop(self, client: Client) -> None:
        """A caller gave up: stop its work. A running request's sequence keeps the tokens it
        evaluated (valid KV, a cached prefix like any other)."""
        if isinstance(client, Request):
            if client in self.active:
                self._release(client)
            elif client in self.waiting:
                self.waiting.remove(client)
        elif isinstance(client, ScoreRequest | ScoreBatchRequest) and client in self.scores:
            self.scores.remove(client)

    def _release(self, r: Request) -> None:
        if r.sampler is not None:
            self._L.llama_sampler_free(r.sampler)
            r.sampler = None
        if r.slot is not None:
            self._kv.release(r.slot)
            r.slot = None
        if r in self.active:
            self.active.remove(r)

    def _step(self, out: list[tuple[Client, Any]]) -> None:
        """One scheduler step: scoring passes waiting for a free sequence, admissions, then one
        ``llama_decode`` batch (every running reply's next token, then prompt chunks lowest
        priority first, at most ``prefill_chunk`` tokens) and sampling. Answers go to ``out``."""
        self._score_waiting(out)
        self._admit_waiting()
        self._compact()
        items = self._batch_items()
        if not items:
            return
        # llama.cpp puts sequences into one physical batch only in increasing, consecutive id order
        entries = [(r.slot, toks, len(toks) - 1 if last else None) for r, toks, last in items if r.slot is not None]
        order = sorted(range(len(items)), key=lambda i: entries[i][0].seq)
        items, entries = [items[i] for i in order], [entries[i] for i in order]
        try:
            ends = self._kv.decode(entries)
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

    def _score_waiting(self, out: list[tuple[Client, Any]]) -> None:
        """Run the scoring jobs waiting, in order, while a sequence is free; answers go to ``out``."""
        while self.scores and self._kv.free():
            job = self.scores.popleft()
            if not job.cancelled:
                try:
                    out.append((job, self._scorer.score_batch(job.jobs, job) if isinstance(job, ScoreBatchRequest)
                                else self._scorer.score(job.job, job)))
                except EngineError as exc:
                    out.append((job, exc))

    def _admit_waiting(self) -> None:
        """Give free sequences to waiting requests, lowest ``order`` first."""
        while self.waiting and self._kv.free():
            r = min(self.waiting, key=lambda w: w.order)
            self.waiting.remove(r)
            if not r.cancelled:
                self._admit(r)

    def _compact(self) -> None:
        """:meth:`KvCache.compact`; a request whose sequence moved follows it."""
        for slot in self._kv.compact():
            if isinstance(slot.user, Request):
                slot.user.slot = slot

    def _batch_items(self) -> list[tuple[Request, list[int], bool]]:
        """What the next ``llama_decode`` evaluates: ``(request, tokens, whether to sample after
        them)`` for every running reply's next token, then prompt chunks (at most
        ``prefill_chunk`` tokens in all)."""
        budget = min(self.prefill_chunk, N_BATCH - sum(r.next_tok is not None for r in self.active))
        items: list[tuple[Request, list[int], bool]] = [
            (r, [r.next_tok], True) for r in self.active if r.next_tok is not None]
        # Prompts: lowest priority first (ties: arrival order). The model node gives a mostly
        # cached prompt a place ahead of cold 1,000-token ones, as far as the promises it made to
        # those allow (model_node.admission).
        prefilling = sorted((r for r in self.active if r.next_tok is None), key=lambda r: r.order)
        for r in prefilling:
            if budget <= 0:
                break
            chunk = r.prompt[r.fed:r.fed + budget]
            budget -= len(chunk)
            items.append((r, chunk, r.fed + len(chunk) == len(r.prompt)))
        return items

    def _emit(self, r: Request, tok: int, out: list[tuple[Client, Any]]) -> None:
        """``tok`` was sampled for ``r``: stream its text (whole UTF-8 characters), end the reply
        at an end-of-generation token, ``max_tokens`` or a full sequence."""
        if r.n_out == 0:
            r.ttft = time.perf_counter() - r.t0
        r.n_out += 1
        eog = self._tokens.is_eog(tok)
        r.pending.append(tok)
        text = r.decoder.decode(self._tokens.piece(tok), final=eog)
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

    def _admit(self, r: Request) -> None:
        slot, start = self._kv.place(r.prompt, len(r.prompt) - 1)
        slot.user, r.slot, r.fed = r, slot, start
        r.sampler = self._sampler(r.params)
        self.active.append(r)

    def _sampler(self, params: SamplingParams) -> Any:
        """The request's own sampler chain: temperature → top-k → top-p → draw (seeded), or greedy."""
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
