"""The anonymous request API (paper §3.2 steps 3–4), shared by users and verifiers.

:class:`AnonClient` turns ``request(model, messages, params)`` into n S-IDA
cloves, each sealed to the chosen model node and sent over one of our proxy
paths, and yields the reply chunks as soon as k cloves of each authenticate and the chunk
passes its check against the serving node's signature (:mod:`overlay.anon.signing`); it fails
over to another model node when the serving one fails, is reported gone or goes silent.
Verifiers use the same class, so challenges look exactly like user traffic. The model node's
end is :mod:`overlay.anon.responder`.
"""

from __future__ import annotations

import logging
import random
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextlib import aclosing, suppress
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from overlay.anon import sida
from overlay.anon.paths import PATH_CLOSED, Path, PathError, PathManager
from overlay.anon.seal import ReturnKey, SealError, seal_to
from overlay.anon.signing import ReplyChecker, ReplyVerifyError, request_digest
from overlay.net.peers import PeerEntry, usable
from overlay.wire import codec, crypto
from overlay.wire.clock import Clock, TrioClock
from overlay.wire.failures import Failure, from_wire
from overlay.wire.identity import short_id
from overlay.wire.messages import (
    REQUEST_ID_LEN,
    CellFwd,
    ChatMessage,
    PathNotice,
    ReplyChunk,
    Request,
    ReturnPath,
    SamplingParams,
    ToModel,
)

log = logging.getLogger("gentorrent.anon")

MAX_CHUNKS_QUEUED = 1024
# What an error chunk's code (ReplyChunk.failure, overlay.wire.failures) makes the client do: BUSY
# (a node past its capacity, before any output): another model node serving the model at once;
# INVALID (bad sampling parameters, a prompt the tokenizer refuses or too long for the context:
# any node would answer the same) and SPENT (a usage-quota token redeemed before: asked again with
# a fresh token, once, where a busy node before may have spent it; else reported): no failover;
# anything else (the engine failed, the node does not serve the model after all, a forwarding
# fault): failover to another node.
# Failover on silence: before the first chunk the caller's ``chunk_timeout`` applies (it covers
# queueing and prefill); after it, a silence longer than SILENCE_GAPS times the reply's mean
# gap between chunks (the node's own decode rate as seen here; FIRST_GAP until two chunks have
# come), but never shorter than SILENCE_FLOOR nor longer than ``chunk_timeout``; and
# ``chunk_timeout`` when no node is left to fail over to (a slow reply beats none: a loaded CPU
# node stalls for seconds mid-reply, docs/benchmarks.md "Decision 0040").
SILENCE_FLOOR = 2.0
SILENCE_GAPS = 8.0
FIRST_GAP = 1.0
# Proxy notices that say a model node cannot be reached through that proxy any more.
MODEL_GONE = frozenset({"model-unreachable", "model-lost"})


class AnonError(Exception):
    """An anonymous request failed; the message says why and what to do, ``kind`` (a
    :class:`~overlay.wire.failures.Failure`) what failed, for whoever shows it (chat's exit status,
    the gateway's HTTP error, the auditor's verdict): never the message."""

    kind: Failure = Failure.OTHER

    def __init__(self, message: str = "", kind: Failure | None = None) -> None:
        super().__init__(message)
        if kind is not None:
            self.kind = kind


class ModelUnaudited(AnonError):
    """Every trusted model node serving the model is of a model no verifier with enough voting
    power audits (the committee's model list marks it unaudited, decision 0013), and the user did
    not opt in (``--allow-unaudited``). Nothing was sent."""

    kind = Failure.UNAUDITED

    def __init__(self, model: str) -> None:
        super().__init__(unaudited_message(model))
        self.model = model


def unaudited_message(model: str) -> str:
    """What a user reads when ``model`` is not audited and they did not pass ``--allow-unaudited``."""
    return (f"model {model} is not audited by the committee's verifiers (no verifier with enough voting power holds "
            "it); pass --allow-unaudited to use it anyway")


def usable_nodes(nodes: Sequence[PeerEntry], model: str, allow_unaudited: bool = False) -> list[PeerEntry]:
    """Those of ``nodes`` (the model nodes listed for ``model``) a user may send a prompt to
    (:func:`overlay.net.peers.usable`), never none: :class:`AnonError` (starting "no model node") when
    none is listed or none is trusted, :class:`ModelUnaudited` when the trusted ones serve an
    unaudited model and ``allow_unaudited`` is off."""
    if not nodes:
        raise AnonError(f"no model node in the registry serves {model!r}", Failure.NO_MODEL_NODE)
    trusted = [e for e in nodes if e.trusted]
    if not trusted:
        raise AnonError(f"no model node serving {model!r} is trusted: the committee's audits put all "
                        f"{len(nodes)} listed under its trust line", Failure.NO_MODEL_NODE)
    ok = [e for e in trusted if usable(e, allow_unaudited)]
    if not ok:
        raise ModelUnaudited(model)
    return ok


class QuotaExhausted(AnonError):
    """This user's usage quota of the model is used up until ``refills_at`` (Unix seconds), which
    is ``wait_s`` seconds from when it was found: the committee's issuers give no more tokens this
    quota epoch (decision 0017). Nothing was sent (a gateway answers 429 with Retry-After)."""

    kind = Failure.QUOTA

    def __init__(self, message: str, refills_at: float, wait_s: float) -> None:
        super().__init__(message)
        self.refills_at = refills_at
        self.wait_s = wait_s


class TokenSource(Protocol):
    """Where a request's usage-quota token comes from (:class:`overlay.directory.wallet.Wallet`)."""

    async def token(self, model: str) -> bytes:
        """A token for one request to ``model``; empty for none (the request goes without);
        :class:`QuotaExhausted` when the quota is used up."""
        ...


class AllBusy(AnonError):
    """Every model node tried for the request refused it as busy (past capacity): nothing was
    generated; the same request may succeed in a minute (a gateway answers 503)."""

    kind = Failure.ALL_BUSY


class ReplyUnverified(AnonError):
    """A reply chunk failed its check (:mod:`overlay.anon.signing`): its text or token ids do not
    match the hash chain, its signature does not verify, or its node is not registered for
    the model. Nothing of that chunk was yielded; the text yielded before it was verified."""

    kind = Failure.UNVERIFIED


class _NodeFailed(AnonError):
    """The serving model node failed (a failover candidate): ``nodes`` are the ones to avoid."""

    kind = Failure.NODE_ERROR

    def __init__(self, message: str, *nodes: bytes) -> None:
        super().__init__(message)
        self.nodes = nodes


class _NodeSilent(_NodeFailed):
    """The serving model node went silent."""

    kind = Failure.SILENT


class _NodeLost(_NodeFailed):
    """The proxies report the serving model node gone (or the paths to it died)."""

    kind = Failure.LOST


class _NodeBusy(AnonError):
    """A model node refused the request as busy before any output (try another at once).
    ``chunk``: the refusal; its ``node``, the node that refused (the one we sent to, or the member
    it forwarded to)."""

    kind = Failure.BUSY

    def __init__(self, message: str, chunk: ReplyChunk) -> None:
        super().__init__(message)
        self.chunk = chunk
        self.node = chunk.node


@dataclass(frozen=True, slots=True)
class _Gone:
    """Internal: enough of an attempt's paths can no longer carry its reply (``why``)."""

    why: str


class AnonClient:
    def __init__(
        self,
        paths: PathManager,
        models: Callable[[str], list[PeerEntry]],
        send: Callable[[bytes, Any], bool],
        *,
        n: int = 4,
        k: int = 3,
        rng: random.Random | None = None,
        clock: Clock | None = None,
        allow_unaudited: bool = False,
    ) -> None:
        """``models(model_id)`` lists the model nodes serving it (all the committee lists, trusted
        or not, audited or not); ``send(peer, msg)`` queues a frame (``Node.send_nowait``).
        Defaults n=4, k=3 (paper §5.1). ``clock`` (default :class:`~overlay.wire.clock.TrioClock`)
        times the reply reassembler's TTL. ``allow_unaudited`` (also an attribute, set by the
        user commands from ``--allow-unaudited``): also choose nodes of models the committee
        does not audit. Untrusted nodes are never chosen (:func:`overlay.net.peers.usable`), except
        as the explicit target of a ``failover=False`` request (verifiers' audits)."""
        if not 1 <= k <= n <= 16:
            raise ValueError("need 1 <= k <= n <= 16")
        if paths.target < n:
            raise ValueError(f"the path manager keeps {paths.target} paths; n={n} needs at least n")
        self.paths = paths
        self.models = models
        self.send = send
        self.n, self.k = n, k
        self.rng = rng or random.SystemRandom()
        self.clock: Clock = clock or TrioClock()
        self.allow_unaudited = allow_unaudited
        self.reassembler = sida.Reassembler()
        self._requests: dict[bytes, trio.MemorySendChannel[ReplyChunk | _Gone]] = {}
        self.dropped: dict[str, int] = {}
        self.failovers: dict[str, int] = {}  # why -> count ("silent", "lost", "error", "busy")
        # usage-quota tokens (decision 0017), set by whoever runs this client with a committee
        # that issues them; None: requests carry none
        self.quota: TokenSource | None = None

    def _drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    async def hold_paths(self, wait_s: float = 30.0) -> list[Path]:
        """n paths built now for the caller alone, to send several requests over
        (``request(held_paths=...)``) and close with :meth:`release_paths`: the proxies link those
        requests to each other, as a user's conversation is linked, and to nothing else.
        :class:`AnonError` of kind :attr:`Failure.NO_PATHS` when they cannot be built within ``wait_s``."""
        return await self._paths_within(wait_s, fresh=True)

    async def _paths_within(self, wait_s: float, *, fresh: bool) -> list[Path]:
        """n paths within ``wait_s``: built for the caller alone (``fresh``), or n of the kept ready
        ones; :class:`AnonError` of kind :attr:`Failure.NO_PATHS` otherwise."""
        paths: list[Path] | None = None
        try:
            with trio.move_on_after(wait_s):
                if fresh:
                    paths = await self.paths.build_fresh(self.n)
                else:
                    paths = self.rng.sample(await self.paths.wait_ready(self.n), self.n)
            if paths is None:
                raise self.paths.too_few(self.n, wait_s, fresh=fresh)
        except PathError as exc:
            raise AnonError(str(exc), Failure.NO_PATHS) from None
        return paths

    def release_paths(self, paths: Sequence[Path]) -> None:
        """Close paths of :meth:`hold_paths`."""
        self.paths.retire(list(paths))

    def usable(self, model: str) -> list[PeerEntry]:
        """The model nodes serving ``model`` that users may be sent to (:func:`overlay.net.peers.usable`
        under :attr:`allow_unaudited`)."""
        return [e for e in self.models(model) if usable(e, self.allow_unaudited)]

    def choose_model_node(self, model: str, prefer: bytes | None = None, *, exact: bool = False) -> PeerEntry:
        """A model node for ``model``: ``prefer`` if it is usable, else one at random among the
        usable ones (trusted; of an audited model unless :attr:`allow_unaudited`). ``exact``:
        ``prefer`` whatever its reputation or audit (a verifier's audit challenge must reach every
        listed node), :class:`AnonError` if it is not listed for ``model``. :class:`ModelUnaudited`
        when only unaudited nodes serve it and the user did not opt in; :class:`AnonError` (starting
        "no model node") when none is listed or none is trusted."""
        nodes = self.models(model)
        if exact and prefer is not None and nodes:
            for e in nodes:
                if e.node_id == prefer:
                    return e
            raise AnonError(f"model node {short_id(prefer)} is not listed as serving {model!r}",
                            Failure.NO_MODEL_NODE)
        ok = usable_nodes(nodes, model, self.allow_unaudited)
        if prefer is not None:
            for e in ok:
                if e.node_id == prefer:
                    return e
        return self.rng.choice(ok)

    async def request(
        self,
        model: str,
        messages: list[ChatMessage] | tuple[ChatMessage, ...],
        params: SamplingParams | None = None,
        *,
        node: bytes | None = None,
        chunk_timeout: float = 60.0,
        paths_timeout: float = 30.0,
        failover: bool = True,
        fresh_paths: bool = False,
        request_id: bytes | None = None,
        held_paths: Sequence[Path] | None = None,
        sent_to: set[bytes] | None = None,
        refusals: list[ReplyChunk] | None = None,
        wait_first: bool = False,
    ) -> AsyncIterator[ReplyChunk]:
        """Send one prompt anonymously; yield its reply chunks in order, **each one verified**.

        Verified means: the chunk's text and token ids, with everything before it from the
        same node, hash to the chunk's ``chain``, and ``chunk.node`` — a model node the
        registry lists for ``model`` — signed that chain (:mod:`overlay.anon.signing`). A chunk
        that fails is never yielded: :class:`ReplyUnverified` is raised instead, so callers
        cannot show unverified text by accident. ``chunk.done`` marks the complete reply.

        ``node`` prefers a model node (session affinity); ``chunk_timeout`` bounds the wait for
        each reply chunk: the first one's in full (queueing and prefill), and it caps the silence
        allowed after it; ``paths_timeout`` bounds the wait for the proxy paths a try goes over
        (:class:`AnonError` of kind :attr:`Failure.NO_PATHS` after it). The request fails over —
        the prompt and the verified text so far are resent to another node serving the model,
        which continues without repeating it (``continuation``, from Petals) — when the serving node (1) answers with an error that
        is not final by nature (:attr:`Failure.INVALID`), (2) is reported gone by the proxies
        (or its paths die) so that fewer than k paths can still carry its reply, or (3) stays
        silent for longer than :data:`SILENCE_GAPS` times its gap between chunks (at least
        :data:`SILENCE_FLOOR` s; but for ``chunk_timeout`` when no node is left to fail over to: a
        slow reply beats none). After a failover ``chunk.node`` changes: each part is
        signed by the node that wrote it. A node that answers "busy" (:attr:`Failure.BUSY`) is left
        at once for another. Raises :class:`AnonError` on failure (a final error, or no node
        left), :class:`AllBusy` when every candidate refused as busy, :class:`ReplyUnverified`
        as above. Only usable nodes are chosen (:meth:`choose_model_node`: trusted, of an audited
        model unless :attr:`allow_unaudited`; :class:`ModelUnaudited` otherwise). ``failover=False``
        tries ``node`` only, whatever its reputation or audit (one usable node when ``node`` is None):
        :class:`AnonError` if the registry does not list ``node`` for ``model``, and a failure
        is raised as it happened (its ``kind`` names it), never retried elsewhere.
        Verifiers send audit challenges this way (``verifier/audit/auditor.py``).

        ``fresh_paths=True`` sends each try over n proxy paths built for it alone
        (:meth:`~overlay.anon.paths.PathManager.build_fresh`, within ``paths_timeout``) and closes
        them when the try ends, instead of the kept paths that a user's requests share: the
        proxies of one such request link it to no other request of this client. Verifiers send
        every audit challenge so (decision 0013).

        ``held_paths`` (n paths of :meth:`hold_paths`) sends over those paths, which the caller keeps
        for several requests and closes (:meth:`release_paths`): a verifier replays one challenge
        script's turns over one path set, as a user's conversation goes over its paths (decision
        0025). :class:`AnonError` of kind :attr:`Failure.NO_PATHS` when fewer than n of them are
        still up.

        ``request_id`` (16 bytes) is the first try's request id, which the reply's signature binds
        (:func:`overlay.anon.signing.request_digest`); later tries get fresh random ones. Default: random.

        ``sent_to``, when given, collects the model nodes that read the prompt: each try's target
        (the first, one tried after a "busy", a failover's) before its cloves leave, and a node that
        answered a failed try in the target's place (a member it forwarded the request to; the nodes
        that signed yielded chunks are the caller's to read off ``chunk.node``). A donated prompt
        names them (``seen_by``, decision 0029) so that the verifier never challenges a node with a
        conversation it has read. It is filled as the request goes: after a failure it holds the
        nodes tried.

        ``refusals``, when given, collects each try's "busy" refusal chunk (seq 0, before any
        output; as it came, its signature unchecked): a donor's client reveals the signed "busy" of
        the request it committed to (decision 0044).

        ``wait_first=True``: the first try waits out a silence up to ``chunk_timeout``, as if no
        node were left to fail over to: a donor's committed request counts only with the reply of
        the node it names, and a loaded honest node stalls for seconds mid-reply.
        """
        if request_id is not None and len(request_id) != REQUEST_ID_LEN:
            raise ValueError(f"a request id is {REQUEST_ID_LEN} bytes, not {len(request_id)}")
        if held_paths is not None and fresh_paths:
            raise ValueError("held_paths and fresh_paths exclude each other")
        exact = not failover and node is not None  # a verifier's challenge to one node, whatever its standing
        target = self.choose_model_node(model, node, exact=exact)
        token = await self.quota.token(model) if self.quota is not None else b""
        tried: set[bytes] = set()
        read = set() if sent_to is None else sent_to  # the model nodes the prompt was sent to (or forwarded)
        produced: list[str] = []
        passed_on = False  # the token went on from a node that refused as busy, and may have spent it
        tries = 0

        def elsewhere(serving: bytes) -> bool:
            """Whether a node not tried yet could take the request over from ``serving`` (never
            without ``failover``: a verifier's challenge is to one node; nor on the first try with
            ``wait_first``)."""
            return failover and not (wait_first and tries == 1) and \
                self._any_usable_but(model, tried | {target.node_id, serving})

        while True:
            tries += 1
            read.add(target.node_id)
            try:
                attempt = self._attempt(target, model, tuple(messages), params or SamplingParams(),
                                        "".join(produced), chunk_timeout, paths_timeout, exact, fresh_paths,
                                        request_id, token, held_paths, elsewhere)
                request_id = None  # a later try is another request
                async with aclosing(attempt) as chunks:
                    async for chunk in chunks:
                        produced.append(chunk.text)
                        yield chunk
                return
            except _NodeBusy as exc:
                if refusals is not None:
                    refusals.append(exc.chunk)
                tried |= {target.node_id, exc.node}
                read.add(exc.node)
                others = [e for e in self.usable(model) if e.node_id not in tried]
                if not failover or not others:
                    raise AllBusy(f"{exc}; every model node tried for {model!r} ({len(tried)}) is busy: "
                                  "try again in a minute") from None
                self.failovers["busy"] = self.failovers.get("busy", 0) + 1
                target = self.rng.choice(others)
                passed_on = bool(token)
                log.info("%s; trying model node %s instead", exc, short_id(target.node_id))
            except _NodeFailed as exc:
                tried |= {target.node_id, *exc.nodes}
                read.update(exc.nodes)
                others = [e for e in self.usable(model) if e.node_id not in tried]
                if not failover:
                    raise
                if not others:
                    raise AnonError(str(exc), exc.kind) from None
                why = {Failure.SILENT: "silent", Failure.LOST: "lost"}.get(exc.kind, "error")
                self.failovers[why] = self.failovers.get(why, 0) + 1
                target = self.rng.choice(others)
                token, passed_on = await self._next_token(model, token), False
                log.warning("%s; failing over to model node %s with %d characters already received",
                            exc, short_id(target.node_id), sum(map(len, produced)))
            except AnonError as exc:
                # a node takes a request, redeems its token, and may still answer "busy" (its queue
                # wait ran out, or a higher-rank token took the place): the next node then finds the
                # token spent, and is asked again, once, with a fresh one
                if not (passed_on and exc.kind is Failure.SPENT):
                    raise
                token, passed_on = await self._next_token(model, token), False
                log.info("%s: the busy model node before it had spent the token; asking again with a fresh one", exc)

    def _any_usable_but(self, model: str, excluded: set[bytes]) -> bool:
        """Whether a node :meth:`usable` for ``model`` is not among ``excluded`` (False when none
        is usable any more: a list update may have taken them all away)."""
        try:
            return any(e.node_id not in excluded for e in self.usable(model))
        except AnonError:
            return False

    async def _next_token(self, model: str, token: bytes) -> bytes:
        """The token for a try after a failed one: the failed node may have spent it, so a fresh
        one; none when the quota is used up meanwhile (the failover goes on). After a "busy" the
        token goes to the next node as it is (a node refusing at once has not redeemed it), and a
        fresh one only if that node finds it spent."""
        if not token or self.quota is None:
            return token
        try:
            return await self.quota.token(model)
        except QuotaExhausted:
            return b""

    async def _attempt(
        self, target: PeerEntry, model: str, messages: tuple[ChatMessage, ...], params: SamplingParams,
        continuation: str, chunk_timeout: float, paths_timeout: float, exact: bool = False,
        fresh_paths: bool = False, request_id: bytes | None = None, token: bytes = b"",
        held: Sequence[Path] | None = None, elsewhere: Callable[[bytes], bool] | None = None,
    ) -> AsyncGenerator[ReplyChunk, None]:
        """One try at ``target``: n cloves out over n of our paths (n built for this try alone
        with ``fresh_paths``, closed after it; the caller's ``held`` ones), the paths within
        ``paths_timeout``, the reply chunks back in order, each checked before it is yielded.
        :class:`_NodeFailed` if the node fails (``elsewhere``: :meth:`_in_order`'s)."""
        paths: list[Path] | None = None
        if held is not None:
            paths = [p for p in held if p.ready.is_set() and not p.dead][:self.n]
            if len(paths) < self.n:
                raise AnonError(f"only {len(paths)} of the {len(held)} held paths are still up; {self.n} are needed",
                                Failure.NO_PATHS)
        else:
            paths = await self._paths_within(paths_timeout, fresh=fresh_paths)
        try:
            async with aclosing(self._attempt_on(paths, target, model, messages, params, continuation, chunk_timeout,
                                                 exact, request_id, token, elsewhere)) as chunks:
                async for c in chunks:
                    yield c
        finally:
            if fresh_paths:
                self.paths.retire(paths)

    async def _attempt_on(
        self, paths: list[Path], target: PeerEntry, model: str, messages: tuple[ChatMessage, ...],
        params: SamplingParams, continuation: str, chunk_timeout: float, exact: bool,
        request_id: bytes | None = None, token: bytes = b"", elsewhere: Callable[[bytes], bool] | None = None,
    ) -> AsyncGenerator[ReplyChunk, None]:
        """:meth:`_attempt` over the chosen ``paths``."""
        keys = [ReturnKey.generate() for _ in paths]
        req = self._request(paths, keys, model, messages, params, continuation, request_id, token)
        digest = request_digest(req, target.node_id)
        try:
            cloves = sida.split(codec.encode(req), self.n, self.k)
        except (sida.SidaError, codec.LocalProtocolError) as exc:
            raise AnonError(f"the request is too large to send: {exc}") from None
        send_ch, recv_ch = trio.open_memory_channel[ReplyChunk | _Gone](MAX_CHUNKS_QUEUED)
        self._requests[req.request_id] = send_ch
        serving: list[bytes] = [target.node_id]  # whose loss fails this attempt (the chunks' node once known)
        lost: set[int] = set()

        def watch(i: int) -> Callable[[PathNotice], None]:
            def on_notice(notice: PathNotice) -> None:
                if notice.code == PATH_CLOSED or (notice.code in MODEL_GONE and notice.model_node in serving):
                    lost.add(i)
                    if len(lost) == self.n - self.k + 1:  # fewer than k paths left: the reply cannot come
                        with suppress(trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                            send_ch.send_nowait(_Gone(f"{notice.code}: {notice.detail}"))
            return on_notice

        self.paths.start_request()  # these n tags are one request (missing reply cloves are compared)
        for i, (p, rk) in enumerate(zip(paths, keys, strict=True)):
            p.returns[rk.tag] = self._on_reply_clove_for(rk)
            p.watchers[rk.tag] = watch(i)
        try:
            self._send_cloves(target, paths, cloves)
            checker: ReplyChecker | None = None
            async with aclosing(self._in_order(recv_ch, target, paths, chunk_timeout, elsewhere)) as chunks:
                async for c in chunks:
                    if checker is None:
                        checker = self._checker(c.node, digest, model, any_standing=exact)
                        serving[:] = [c.node]
                    elif c.node != checker.node_id:
                        raise ReplyUnverified(f"reply chunks from two nodes ({short_id(checker.node_id)}, "
                                              f"{short_id(c.node)}) in one reply; the reply was discarded")
                    try:
                        checker.check(c.text, c.token_ids, c.done, c.chain, c.signature, c.signed_at_ms)
                    except ReplyVerifyError as exc:
                        raise ReplyUnverified(f"{exc}; the reply was discarded from there on") from None
                    yield c
                    if c.done:
                        return
        finally:
            self._requests.pop(req.request_id, None)
            for p, rk in zip(paths, keys, strict=True):
                p.returns.pop(rk.tag, None)
                p.watchers.pop(rk.tag, None)

    def _checker(self, node: bytes, digest: bytes, model: str, *, any_standing: bool = False) -> ReplyChecker:
        """The checker for a reply from ``node``, which must be a registered node for ``model``
        (:class:`ReplyUnverified` otherwise) and, unless ``any_standing`` (a verifier's challenge: a
        forwarded reply counts for the node asked, whoever signed it), a trusted one: a reply a
        trusted node had an untrusted one write is not read, and the request fails over
        (:class:`_NodeFailed`) to another node."""
        entry = next((e for e in self.models(model) if e.node_id == node), None)
        if entry is None:
            raise ReplyUnverified(f"the reply came from node {short_id(node)}, which the registry does not "
                                  f"list as serving {model!r}; discarded")
        if not any_standing and not entry.trusted:
            raise _NodeFailed(f"the reply came from model node {short_id(node)}, which the committee does not trust "
                              "(its reputation is under the trust line); not read", node)
        return ReplyChecker(digest, model, node, entry.ed25519_public)

    def _request(
        self, paths: list[Path], keys: list[ReturnKey], model: str, messages: tuple[ChatMessage, ...],
        params: SamplingParams, continuation: str, request_id: bytes | None = None, token: bytes = b"",
    ) -> Request:
        """The request, answered through ``paths`` (one fresh return key each), with the quota
        ``token`` if any; a random id by default."""
        return Request(
            request_id=request_id or crypto.random_bytes(REQUEST_ID_LEN),
            model=model,
            messages=messages,
            params=params,
            k=self.k,
            return_paths=tuple(
                ReturnPath(proxy=p.proxy.node_id, proxy_path_id=p.proxy_path_id, key=rk.key, tag=rk.tag)
                for p, rk in zip(paths, keys, strict=True)
                if p.proxy_path_id is not None
            ),
            continuation=continuation,
            quota=token,
        )

    def _send_cloves(self, target: PeerEntry, paths: list[Path], cloves: list[sida.Clove]) -> None:
        """Clove i, sealed to ``target``, into path i (paper §3.2 step 3)."""
        for p, clove in zip(paths, cloves, strict=True):
            sealed = seal_to(target.x25519_public, sida.encode_clove(clove))
            iv, body = p.crypt.wrap_forward(codec.encode(ToModel(dest=target.node_id, sealed=sealed)))
            self.send(p.first, CellFwd(p.link_id, iv, body))

    async def _in_order(
        self, chunks: trio.MemoryReceiveChannel[ReplyChunk | _Gone], target: PeerEntry, paths: list[Path],
        chunk_timeout: float, elsewhere: Callable[[bytes], bool] | None = None,
    ) -> AsyncGenerator[ReplyChunk, None]:
        """Reply chunks in ``seq`` order as each becomes next. :class:`AnonError` for a final
        error chunk or chunks too far out of order; :class:`_NodeBusy` for a "busy" refusal
        before any output; :class:`_NodeFailed` for any other error chunk, :class:`_NodeLost`
        when the paths report the node gone, :class:`_NodeSilent` on a silence (see
        :meth:`request`). ``elsewhere(node)``: whether another node could take the request over
        from ``node``, the one answering; when none could, a silence mid-reply is waited out up
        to ``chunk_timeout`` (a slow reply beats none). ``None``: always as if one could."""
        pending: dict[int, ReplyChunk] = {}
        next_seq = 0
        first_at: float | None = None
        last_at = 0.0
        longest = 0.0  # the longest silence between two chunks so far (logged with the last)
        node = target.node_id
        while True:
            limit = chunk_timeout
            if first_at is not None:
                gap = (last_at - first_at) / (next_seq - 1) if next_seq > 1 else FIRST_GAP
                limit = min(chunk_timeout, max(SILENCE_FLOOR, SILENCE_GAPS * gap))
            with trio.move_on_after(limit) as scope:
                item = await chunks.receive()
            if scope.cancelled_caught and limit < chunk_timeout and elsewhere is not None and not elsewhere(node):
                with trio.move_on_after(chunk_timeout - limit) as scope:  # no node could take over: wait it out
                    item = await chunks.receive()
                limit = chunk_timeout
            if scope.cancelled_caught:
                dead = sum(1 for p in paths if p.dead)
                raise _NodeSilent(
                    f"no reply from model node {short_id(node)} within {limit:.1f}s "
                    f"({dead} of the {self.n} paths used failed; fewer than k={self.k} cloves of a "
                    "reply arrived). The paths are being rebuilt: try again.", node
                )
            if isinstance(item, _Gone):
                raise _NodeLost(f"no reply from model node {short_id(node)}: it is gone ({item.why}; fewer than "
                                f"k={self.k} of the {self.n} paths can still carry its reply)", node)
            pending[item.seq] = item
            if len(pending) > MAX_CHUNKS_QUEUED:
                raise AnonError("reply chunks arrived too far out of order")
            while next_seq in pending:
                c = pending.pop(next_seq)
                next_seq += 1
                if c.error or c.failure:
                    failure = from_wire(c.failure)
                    if failure is Failure.BUSY and c.seq == 0:
                        raise _NodeBusy(f"model node {short_id(c.node)}: {c.error}", c)
                    if failure in (Failure.INVALID, Failure.SPENT):
                        raise AnonError(f"model node {short_id(c.node)}: {c.error}", failure)
                    raise _NodeFailed(f"model node {short_id(c.node)} failed: {c.error}", c.node, node)
                now = self.clock.monotonic()
                if first_at is None:
                    first_at = now
                else:
                    longest = max(longest, now - last_at)
                last_at = now
                node = c.node
                if c.done:
                    log.debug("model node %s: %d reply chunk(s), the longest silence between two %.2fs",
                              short_id(node), next_seq, longest)
                yield c

    def _on_reply_clove_for(self, rk: ReturnKey) -> Callable[[bytes], bool]:
        def on_data(data: bytes) -> bool:
            """False when the clove does not open (changed on the way: the path manager
            replaces the path); True otherwise, whatever became of it."""
            try:
                clove = sida.decode_clove(rk.open(data))
            except (SealError, codec.RemoteProtocolError):
                self._drop("reply-clove-unauthentic")
                return False
            try:
                message = self.reassembler.add(clove, self.clock.monotonic())
            except sida.SidaError:
                self._drop("reply-clove-rejected")
                return True
            if message is None:
                return True
            try:
                chunk = codec.decode(message)
            except codec.RemoteProtocolError:
                self._drop("reply-malformed")
                return True
            if not isinstance(chunk, ReplyChunk):
                self._drop("reply-malformed")
                return True
            ch = self._requests.get(chunk.request_id)
            if ch is None:
                self._drop("reply-for-unknown-request")
                return True
            try:
                ch.send_nowait(chunk)
            except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                self._drop("reply-queue-full")
            return True

        return on_data
