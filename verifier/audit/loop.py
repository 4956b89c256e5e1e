"""A verifier's audit loop (decision 0013; docs/committee.md "Audits: running a verifier with
audits"): the **thin trio driver** of :class:`verifier.audit.auditor.Auditor`, the I/O-free planner.

:class:`AuditDriver` polls the verifier's own CometBFT RPC (``/abci_query`` ``/audit``, about once
a block), sends challenges through the overlay's anonymous request API, the very code users run,
to ONE node with no failover, over the paths its persona holds for the epoch as a user's client
holds its own (:func:`send_challenge`; decision 0026: built at the persona's first send, rebuilt
when too few are up, closed before the report goes out, so that no path a report labels is used
again), scores replies and users' transcripts with this verifier's own engine
(:func:`score_tokens`), and broadcasts the transactions (``/broadcast_tx_sync``), transcript
scores only once the book of users' transcripts is written. :func:`run_audits` sets it up inside
``gentorrent verifier --audit``: a user node of the overlay registered with the committee as a
user (its identity in ``DATA_DIR/audit-user``) and the audit model loaded with llama.cpp. Every
failure is logged with the node; nothing here can stop the verifier.

What counts as an answer: a complete reply (its last chunk ``done``) whose every chunk verified
against the signature of the node that served it. A node answers for what it returns (decision
0013 §2): a reply signed by another node (the challenged node forwarded it, Algorithm 2) counts for
the challenged node, with the signer as ``served_by``.
"""

from __future__ import annotations

import logging
import random
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from model_node.engine import EngineError
from overlay.anon.client import AnonClient, AnonError
from overlay.directory.rpc import Rpc, RpcError, abci_query, broadcast_tx_sync, rpc_call
from overlay.wire.clock import Clock, TrioClock
from overlay.wire.constants import REPUTATION_SCALE
from overlay.wire.identity import short_id
from overlay.wire.messages import ChatMessage
from verifier.audit.auditor import (
    PLAN_FILE,
    VERDICT,
    Action,
    Auditor,
    AuditViewError,
    Failure,
    Reply,
    ScoreTranscripts,
    Send,
    Submit,
    parse_revealed,
    parse_view,
)
from verifier.audit.challenges import ChallengeError, ChallengeGenerator

if TYPE_CHECKING:
    from model_node.engine import Engine
    from overlay.anon.paths import Path as OverlayPath
    from verifier.audit.corpus import ChallengeCorpus
    from verifier.audit.pool import DonationPool
    from verifier.audit.transcripts import Counted, TranscriptBook
    from verifier.audit.tx import Opening

log = logging.getLogger("gentorrent.audit")

POLL_S = 1.0  # about once a block
CHALLENGE_TIMEOUT_S = 60.0  # for the first chunk (queueing and prefill), and for any silence after it (no failover)
PATHS_TIMEOUT_S = 30.0  # to build a challenge's own paths
RESTART_S = 10.0  # run_audits waits this long after a failure before starting again
SUBMITTED_KEPT = 64  # the latest submissions a driver keeps for tests and stats (it runs for months)
POOL_SAVE_S = 30.0  # the donation pool is written at most this often (a used prompt lost in a crash is void anyway)
PACE_SAMPLES = 256  # polls the block pace is measured over (BlockPace): a few minutes
PACE_MIN_BLOCKS = 20  # blocks they must span before the pace counts


# --------------------------------------------------------------------------- challenges and scoring (I/O)


async def send_challenge(client: AnonClient, node_id: bytes, opening: Opening, *,
                         chunk_timeout: float = CHALLENGE_TIMEOUT_S, paths_timeout: float = PATHS_TIMEOUT_S,
                         tries: int = 1, turn: int = 0, history: Sequence[str] = (),
                         held_paths: Sequence[OverlayPath] | None = None) -> Reply | Failure:
    """Send ``turn`` of ``opening``'s script (the node's replies to the earlier turns, ``history``,
    in place: :meth:`~verifier.audit.tx.Opening.turn_messages`) through the anonymous request API
    to ``node_id`` only (no failover, no retry elsewhere), over ``held_paths`` (the driver's: its
    persona's, decision 0026) or, without them, over proxy paths built for it alone and closed
    after it: the complete verified reply, signed by that node or the member of its group it
    forwarded to, or why there is none. ``chunk_timeout`` and
    ``paths_timeout`` are the client's (:meth:`~overlay.anon.client.AnonClient.request`): the
    wait for each reply chunk, and for the paths."""
    chunks: list[tuple[str, tuple[int, ...]]] = []
    last = None
    try:
        stream = client.request(opening.model, opening.turn_messages(turn, history), opening.params, node=node_id,
                                chunk_timeout=chunk_timeout, paths_timeout=paths_timeout, failover=False,
                                fresh_paths=held_paths is None, request_id=opening.request_id(tries, turn),
                                held_paths=held_paths)
        async with aclosing(stream) as replies:  # type: ignore[type-var]
            async for c in replies:
                if last is not None and c.node != last.node:
                    return Failure("unverified", f"the reply's chunks are signed by nodes {short_id(last.node)} and "
                                                 f"{short_id(c.node)}")
                chunks.append((c.text, tuple(c.token_ids)))
                last = c
                if c.done:
                    break
    except AnonError as exc:
        return Failure(VERDICT.get(exc.kind, "other"), str(exc))
    if last is None or not last.done:
        return Failure("incomplete", "the reply ended before its last chunk")
    if not any(ids for _, ids in chunks):
        return Failure("empty", "the reply holds no tokens")
    return Reply(tuple(chunks), last.signature, last.signed_at_ms, last.node)


def missing_end(engine: Engine, prompt_tokens: int, token_ids: Sequence[int], max_tokens: int) -> int | None:
    """The end token to score after ``token_ids`` (decision 0026), or None: a reply that stopped
    before ``max_tokens`` and whose last token does not end generation claims that the model
    ended its turn there, so the verifier scores the model's end-of-turn token in that place. A
    node that cuts its replies short to save work then pays that token's log-probability (an
    honest engine's replies carry the end token they stopped at: llama.cpp's do). Not when the
    engine cannot say (:class:`~model_node.engine.EndsReplies`), nor where the end token would
    not fit in the verifier's context window (a reply that filled a window is scored as it came;
    model nodes and verifiers run windows of 4,096 tokens by default)."""
    from model_node.engine import EndsReplies

    if len(token_ids) >= max_tokens or not isinstance(engine, EndsReplies):
        return None
    if token_ids and engine.is_end(token_ids[-1]):
        return None
    if prompt_tokens + len(token_ids) + 1 > engine.context_window:
        return None
    return engine.end_token()


async def score_tokens(engine: Engine, opening: Opening, token_ids: Sequence[int], *,
                       transcript: bool = False, messages: Sequence[ChatMessage] | None = None,
                       ) -> tuple[int, int, float]:
    """``(score, raw 1/PPL)`` in fixed point, and the reply's ``z``, for a reply's token ids to
    ``opening``: one teacher-forced pass of this verifier's engine (``Engine.score``) after the
    prompt the model node saw (the chat template of the opening's messages, or of ``messages``: a
    script's turn as sent), then :func:`verifier.audit.scoring.score_reply`; a user's
    ``transcript`` weighted by its length (:func:`~verifier.audit.scoring.length_weighted`). A
    reply that stops early without its end token is scored with that token (:func:`missing_end`).
    Raises :class:`~verifier.audit.scoring.ScoringError` or :class:`~model_node.engine.EngineError`."""
    from verifier.audit.reputation import to_fixed
    from verifier.audit.scoring import length_weighted, score_reply

    prompt = engine.chat_prompt(opening.messages if messages is None else messages)
    ids = list(token_ids)
    end = missing_end(engine, len(prompt), ids, opening.params.max_tokens)
    if end is not None:
        ids.append(end)
    scores = await engine.score(prompt, ids, opening.params)
    r = score_reply(scores)
    score = length_weighted(r.score, r.tokens) if transcript else r.score  # the two-sided score (decision 0013 §5)
    return to_fixed(score), to_fixed(r.raw_inv_ppl), r.z


class BlockPace:
    """The chain's seconds a block as the driver sees them: heights it polled against its own
    clock, over the last :data:`PACE_SAMPLES` polls; None until they span
    :data:`PACE_MIN_BLOCKS` blocks. The chain's block times are its proposers' to set; this is
    what passed here, which is what the epoch's timing is about."""

    def __init__(self) -> None:
        self.samples: deque[tuple[int, float]] = deque(maxlen=PACE_SAMPLES)

    def saw(self, height: int, now: float) -> None:
        if self.samples and height < self.samples[-1][0]:  # a node behind another: start again
            self.samples.clear()
        self.samples.append((height, now))

    @property
    def block_s(self) -> float | None:
        if not self.samples:
            return None
        (h0, t0), (h1, t1) = self.samples[0], self.samples[-1]
        return (t1 - t0) / (h1 - h0) if h1 - h0 >= PACE_MIN_BLOCKS and t1 > t0 else None


# --------------------------------------------------------------------------- the driver


class AuditDriver:
    """Runs an :class:`Auditor` against one verifier's CometBFT RPC (``rpc_address``), with
    ``client`` (the verifier's user node's anonymous client) and ``engine`` (its audit model).

    ``data_dir``: where the plan (:data:`PLAN_FILE`), the donation pool and the used private
    prompts are kept (None: not kept, for tests). ``rpc`` (default :func:`overlay.directory.rpc.rpc_call`) is injectable for tests;
    ``clock`` (default :class:`~overlay.wire.clock.TrioClock`) times the pool's writes.
    ``save_transcripts`` writes the book of users' transcripts at once (None: not kept, for tests);
    :meth:`broadcast` awaits it before transcript scores go out, so that the book on disk has their
    rounds scored and their scores out of the carry by the time the chain may hold them: a restart
    then never scores them again nor hands them out with a later epoch's (counted twice). A crash
    between that write and the broadcast loses those scores instead, as a round missed."""

    def __init__(self, auditor: Auditor, rpc_address: str, client: AnonClient, engine: Engine, *,
                 rpc: Rpc | None = None, poll: float = POLL_S, challenge_timeout: float = CHALLENGE_TIMEOUT_S,
                 paths_timeout: float = PATHS_TIMEOUT_S, data_dir: Path | None = None,
                 clock: Clock | None = None, save_transcripts: Callable[[], Awaitable[bool]] | None = None) -> None:
        self.auditor = auditor
        self.address = rpc_address
        self.client = client
        self.engine = engine
        self.rpc: Rpc = rpc or rpc_call
        self.poll = poll
        self.challenge_timeout = challenge_timeout
        self.paths_timeout = paths_timeout
        self.data_dir = data_dir
        self.clock: Clock = clock or TrioClock()
        self.save_transcripts = save_transcripts
        self.height = 0
        self.pace = BlockPace()
        self._pool_saved = -POOL_SAVE_S
        self._held: dict[tuple[int, int], list[OverlayPath]] = {}  # (epoch, persona) -> the persona's paths
        self.submitted: deque[tuple[str, int, str]] = deque(maxlen=SUBMITTED_KEPT)  # (what, code, log), the latest

    async def query(self, path: str) -> tuple[bytes, int]:
        """``abci_query path`` on the verifier: ``(value, height)``; :class:`RpcError` for a non-zero code."""
        answer = await abci_query(self.address, path, rpc=self.rpc)
        if answer.code:
            raise RpcError(f"{self.address} answered {path} with code {answer.code}: {answer.log[:200]}")
        return answer.value, answer.height

    def persist(self) -> bool:
        """Write the used private prompts (if they changed: first, so that no challenge of a plan
        on disk holds a prompt the file does not name as used), the plan (if it changed) and the
        donation pool (if it changed, at most every :data:`POOL_SAVE_S`: it may be large) to
        :attr:`data_dir`. A write that fails is logged; the plan stays in memory. False when the
        used private prompts are not on disk: then no plan commit may go out (:meth:`step`)."""
        from overlay.wire.identity import write_private
        from verifier.audit.corpus import save_used
        from verifier.audit.pool import save_pool

        if self.data_dir is None:
            return True
        try:
            if self.auditor.corpus is not None:
                save_used(self.auditor.corpus, self.data_dir)
        except OSError as exc:
            log.error("audit: cannot write the used private prompts to %s (%s): the plan is not committed until "
                      "it can be, as a restart would send its private prompts again", self.data_dir, exc)
            return False
        try:
            if self.auditor.changed:
                write_private(self.data_dir / PLAN_FILE, self.auditor.snapshot())
            now = self.clock.monotonic()
            if self.auditor.pool is not None and now - self._pool_saved >= POOL_SAVE_S:
                self._pool_saved = now
                save_pool(self.auditor.pool, self.data_dir)
        except OSError as exc:
            log.error("audit: cannot write the audit plan or donation pool in %s: %s", self.data_dir, exc)
        return True

    async def broadcast(self, sub: Submit) -> None:
        """``broadcast_tx_sync``; a network error is retried at the next plan, a refusal goes to
        :meth:`Auditor.refused`. Transcript scores go out only after the book is written (or its write
        failed: logged, they go out anyway; a restart before the next write may count them twice)."""
        if sub.key[0] == "transcripts" and self.save_transcripts is not None and not await self.save_transcripts():
            log.warning("audit: the book of users' transcripts was not written before the %s went out: a restart "
                        "before its next write would score them again", sub.what)
        try:
            answer = await broadcast_tx_sync(self.address, sub.raw, rpc=self.rpc)
            code, why = answer.code, answer.log[:300]
        except (OSError, RpcError, ValueError) as exc:
            log.warning("audit: %s not submitted to %s (will retry): %s", sub.what, self.address, exc)
            self.auditor.submitted(sub.key, retry=True)
            return
        self.submitted.append((sub.what, code, why))
        self.auditor.submitted(sub.key, retry=False)
        if code:
            log.warning("audit: the committee refused the %s: code %d: %s", sub.what, code, why)
            self.auditor.refused(sub.key, why, code)
            self.persist()
        else:
            log.info("audit: submitted the %s", sub.what)

    async def step(self, nursery: trio.Nursery) -> None:
        """One poll: read the view and the prompts past epochs' reports revealed that the planner
        lacks, write the plan if it changed (before its commit goes out; no commit goes out while
        the used private prompts cannot be written), start what the planner asks (in ``nursery``)."""
        from verifier.audit.chain import REVEALED_PATH

        raw, height = await self.query("/audit")
        view = parse_view(raw)
        self.height = max(self.height, height)
        self.pace.saw(height, self.clock.monotonic())
        for epoch in self.auditor.revealed_wanted(view.epoch):  # each past epoch once (64 after a start)
            self.auditor.take_revealed(epoch, parse_revealed((await self.query(f"{REVEALED_PATH}{epoch}"))[0], epoch))
        actions = self.auditor.plan(view, height, self.pace.block_s)
        if not self.persist():  # the plan's private prompts could be sent again after a restart
            for a in [a for a in actions if isinstance(a, Submit) and a.key[0] == "commit"]:
                actions.remove(a)
                self.auditor.submitted(a.key, retry=True)  # offered again at the next poll
        reported = [a.key[1] for a in actions if isinstance(a, Submit) and a.key[0] == "report"]
        self.retire(max([view.epoch - 1, *reported]))
        for action in actions:
            nursery.start_soon(self._run_action, action)

    async def run(self) -> None:
        """Poll forever; a failed poll is logged and retried."""
        last_error = ""
        async with trio.open_nursery() as nursery:
            while True:
                try:
                    await self.step(nursery)
                    last_error = ""
                except (OSError, RpcError, AuditViewError) as exc:
                    if str(exc) != last_error:  # once per distinct error, not once a second
                        log.warning("audit: could not read /audit from %s: %s", self.address, exc)
                    last_error = str(exc)
                except ChallengeError as exc:
                    log.error("audit: cannot make challenges: %s", exc)
                await trio.sleep(self.poll)

    async def _run_action(self, action: Action) -> None:
        try:
            if isinstance(action, Submit):
                await self.broadcast(action)
            elif isinstance(action, ScoreTranscripts):
                await self._score_transcripts(action)
            else:
                await self._send(action)
        except Exception:
            log.exception("audit: %s failed", action.what if isinstance(action, Submit) else
                          f"scoring users' transcripts in epoch {action.epoch}"
                          if isinstance(action, ScoreTranscripts) else
                          f"challenge {action.index} of epoch {action.epoch} to model node {short_id(action.node_id)}")
            if isinstance(action, Send):
                self.auditor.result(action, Failure("other", "the verifier failed"), None, self.height)

    async def _score_transcripts(self, action: ScoreTranscripts) -> None:
        """Score each counted transcript with this verifier's engine (one that cannot be scored is
        logged and left out), cap each node's scores by its donors' sets
        (:func:`~verifier.audit.transcripts.capped_by_donor`, decision 0028), then submit the
        auditor's :meth:`Auditor.transcript_scores`."""
        from verifier.audit.scoring import ScoringError, transcript_z
        from verifier.audit.transcripts import capped_by_donor

        scored: list[tuple[bytes, bytes, int, float]] = []

        async def score_all(counted: Iterable[Counted]) -> None:
            for c in counted:
                t = c.transcript
                ids = t.reply.token_ids()
                try:
                    score, _, z = await score_tokens(self.engine, t.opening, ids, transcript=True)
                    scored.append((c.node_id, c.donor, score, transcript_z(z, max(1, len(ids)))))
                except (ScoringError, EngineError) as exc:
                    log.warning("audit: cannot score a transcript of model node %s: %s", short_id(c.node_id), exc)

        await score_all(action.counted)
        await score_all(self.auditor.second_draw(action, [(n, d, z) for n, d, _, z in scored]))  # rule 9
        sub = self.auditor.transcript_scores(action.epoch, capped_by_donor(scored))
        if sub is not None:
            await self.broadcast(sub)

    def retire(self, epoch: int) -> None:
        """Close the personas' paths of ``epoch`` and earlier: before the report of ``epoch`` goes
        out (it labels every path its challenges came over), or once a later epoch has begun."""
        for key in [k for k in self._held if k[0] <= epoch]:
            self.client.release_paths(self._held.pop(key))

    async def _held_paths(self, send: Send) -> list[OverlayPath] | Failure:
        """The paths ``send`` goes over (decision 0026): those its persona holds for the epoch,
        every turn of every script it sends; built at the persona's first send, built again when
        fewer than n of them are still up."""
        self.retire(send.epoch - 1)
        key = (send.epoch, send.persona)
        paths = self._held.get(key)
        if paths is not None and sum(p.ready.is_set() and not p.dead for p in paths) >= self.client.n:
            return paths
        if paths is not None:
            self.client.release_paths(self._held.pop(key))
        try:
            built = await self.client.hold_paths(self.paths_timeout)
        except AnonError as exc:
            return Failure(VERDICT.get(exc.kind, "other"), str(exc))
        self._held[key] = built
        return built

    async def _send(self, send: Send) -> None:
        from verifier.audit.scoring import ScoringError

        outcome = await self._answer(send)
        score, z = None, 0.0
        if isinstance(outcome, Reply):
            try:
                score, _, z = await score_tokens(self.engine, send.opening, outcome.token_ids,
                                                 messages=send.messages())
            except ScoringError as exc:
                outcome = Failure("other", f"cannot score the reply: {exc}")
            except EngineError as exc:
                log.error("audit: this verifier's engine failed scoring a reply of model node %s: %s",
                          short_id(send.node_id), exc)
                outcome = Failure("other", f"the verifier's engine failed: {exc}")
        if isinstance(outcome, Failure):
            log.warning("audit: epoch %d challenge %d (try %d) to model node %s: %s", send.epoch, send.index,
                        send.attempt, short_id(send.node_id), outcome.reason)
        else:
            via = "" if outcome.served_by == send.node_id else f" (forwarded to {short_id(outcome.served_by)})"
            log.info("audit: model node %s answered challenge %d of epoch %d%s: %d tokens, score %.3f",
                     short_id(send.node_id), send.index, send.epoch, via, len(outcome.token_ids),
                     (score or 0) / REPUTATION_SCALE)
        self.auditor.result(send, outcome, score, self.height, z)
        self.persist()

    async def _answer(self, send: Send) -> Reply | Failure:
        """``send`` sent over the paths its persona holds (:meth:`_held_paths`)."""
        held = await self._held_paths(send)
        if isinstance(held, Failure):
            return held
        return await send_challenge(self.client, send.node_id, send.opening, chunk_timeout=self.challenge_timeout,
                                    paths_timeout=self.paths_timeout, tries=send.attempt, turn=send.turn,
                                    history=send.history, held_paths=held)


# --------------------------------------------------------------------------- inside `gentorrent verifier --audit`


@dataclass(frozen=True, slots=True)
class AuditSettings:
    """``gentorrent verifier --audit`` flags: the audit model (id or GGUF path), the user node's
    listen address and region, llama.cpp threads, the operator's private prompts."""

    model: str | None = None
    listen: str = "127.0.0.1:0"
    region: str = "default"
    threads: int = 1
    poll: float = POLL_S
    tamper: Callable[[Any], Any] | None = None  # TESTS ONLY (in-process): see Auditor.tamper
    # The committee's verifiers' RPC addresses (``--audit-committee``): the audit user takes its
    # usage-quota tokens from them like any user (decision 0017), so that challenges carry tokens as
    # users' requests do. Empty: this verifier's own RPC only (enough when a token needs one issuer).
    committee: tuple[str, ...] = ()
    # ``--challenge-prompts``: the operator's private challenge prompts as read from the file
    # (verifier/audit/corpus.py ``read_corpus``; the audit loop adds what DATA_DIR says was used)
    corpus: ChallengeCorpus | None = None
    # ``--transcript-budget``: the cost (about tokens) of users' transcripts scored a round (rule 9 of
    # verifier/audit/transcripts.py); None: ROUND_BUDGET for each of ``threads``
    transcript_budget: int | None = None
    # ``--take-version1-commits``: the ABCI app also takes commitments without escrow (decision 0037)
    version1_commits: bool = False

    def scoring_budget(self) -> int:
        from verifier.audit.transcripts import ROUND_BUDGET

        return ROUND_BUDGET * self.threads if self.transcript_budget is None else self.transcript_budget


async def run_audits(data_dir: Path, settings: AuditSettings, seed: bytes, pool: DonationPool | None = None,
                     transcripts: TranscriptBook | None = None,
                     save_transcripts: Callable[[], Awaitable[bool]] | None = None) -> None:
    """The audit loop of ``gentorrent verifier --audit`` (never returns; never raises: a failure is
    logged and the loop starts again after :data:`RESTART_S`; the model is loaded once). ``pool``:
    the donated prompts this verifier takes (:mod:`verifier.abci_app` adds to it); it learns the
    audited model here, once the engine is loaded. ``transcripts``: users' committed transcripts
    (:mod:`verifier.abci_app` fills the book; the auditor closes its epochs and scores them).
    ``save_transcripts``: writes the book now (:meth:`verifier.run.Keeper.save`), awaited before
    transcript scores go out (:class:`AuditDriver`).
    ``settings.corpus``: the operator's private prompts; the used set kept in ``data_dir`` is
    added to them once, before the model loads (:func:`verifier.audit.corpus.load_used`)."""
    from verifier.audit.corpus import load_used

    engine: Any = None
    corpus, used_loaded = settings.corpus, False
    try:
        while True:
            try:
                if corpus is not None and not used_loaded:
                    load_used(corpus, data_dir)
                    used_loaded = True
                if engine is None:
                    engine = await trio.to_thread.run_sync(_engine, settings)
                if pool is not None:
                    pool.models = frozenset({engine.model})
                await _run_audits_once(data_dir, settings, seed, engine, pool, transcripts, corpus, save_transcripts)
            except Exception as exc:
                log.error("audit: the audit loop failed (%s: %s); starting it again in %g s",
                          type(exc).__name__, exc, RESTART_S,
                          exc_info=not isinstance(exc, (OSError, ValueError, EngineError)))
            await trio.sleep(RESTART_S)
    finally:
        if engine is not None:
            engine.close()


def _engine(settings: AuditSettings) -> Any:
    from model_node.llama import LlamaCppEngine, resolve_model
    from model_node.llama.engine import DEFAULT_N_CTX

    model_id, path = resolve_model(settings.model)
    # 4 sequences: replies to several challenges are scored side by side; each as long as the model
    # nodes' default window (4,096 tokens, ~380 MB of KV cache for SmolLM2), so that a user's
    # transcript of any request a node serves by default can be scored (decision 0032; in 2,048, a
    # node could serve every longer one cheaply: none could be scored).
    # score_fresh: every reply is evaluated from scratch, so every verifier computes the same scores
    # whatever its engine scored before (reused cached prefixes changed them: model_node/llama/kv_cache.py).
    return LlamaCppEngine(path, model_id=model_id, n_threads=settings.threads, slots=4, n_ctx=DEFAULT_N_CTX,
                          score_fresh=True)


def load_auditor(data_dir: Path, auditor: Auditor) -> None:
    """Take back the plan saved in ``data_dir`` (:data:`PLAN_FILE`), if any and if it is this verifier's."""
    path = data_dir / PLAN_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return
    except OSError as exc:
        log.warning("audit: cannot read the saved plan %s: %s", path, exc)
        return
    if auditor.restore(raw) and auditor.current is not None:
        log.info("audit: took back the saved plan of epoch %d (%d challenges)", auditor.current.epoch,
                 len(auditor.current.entries))


async def _run_audits_once(data_dir: Path, settings: AuditSettings, seed: bytes, engine: Any,
                           pool: DonationPool | None, transcripts: TranscriptBook | None = None,
                           corpus: ChallengeCorpus | None = None,
                           save_transcripts: Callable[[], Awaitable[bool]] | None = None) -> None:
    from overlay.directory.lists import load_genesis
    from overlay.directory.membership import CommitteeSettings, node_entry, serve_member
    from overlay.directory.registry import Registry
    from overlay.net.transport import TLSTransport
    from overlay.usernode import UserNode
    from overlay.wire.identity import load_or_create
    from verifier.cometbft import get_toml, home_of

    home = home_of(data_dir)
    chain_id, validators = load_genesis(str(home / "config" / "genesis.json"))
    rpc_address = get_toml((home / "config" / "config.toml").read_text(), "rpc", "laddr").removeprefix("tcp://")
    identity = load_or_create(data_dir / "audit-user")
    registry = Registry(0, [])
    user = UserNode(identity, TLSTransport(identity), registry, region=settings.region, registered_only=True)
    assert user.client is not None
    host, _, port = settings.listen.rpartition(":")
    auditor = Auditor(seed, chain_id, (engine.model,), ChallengeGenerator(rng=random.SystemRandom()), pool=pool,
                      corpus=corpus, tamper=settings.tamper, transcripts=transcripts,
                      transcript_budget=settings.scoring_budget())
    load_auditor(data_dir, auditor)
    driver = AuditDriver(auditor, rpc_address, user.client, engine, poll=settings.poll, data_dir=data_dir,
                         save_transcripts=save_transcripts)
    async with trio.open_nursery() as nursery:
        address, member = await nursery.start(
            serve_member, user, host.strip("[]"), int(port),
            CommitteeSettings(settings.committee or (rpc_address,), chain_id, validators),
            registry, lambda address: node_entry(identity, address, settings.region))
        from overlay.directory.wallet import member_wallet

        # challenges carry tokens as users' requests do; past the quota they go without (never unsent)
        user.client.quota = member_wallet(identity, member, send_when_used_up=True, data_dir=data_dir / "audit-user")
        log.info("audit: user node %s registered at %s with the committee at %s; auditing model %s",
                 short_id(identity.node_id), address, rpc_address, engine.model)
        await driver.run()
