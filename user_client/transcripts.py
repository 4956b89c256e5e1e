"""Donating transcripts to the committee's audits (decision 0015): the user's side.

A user who turns on ``--donate-transcripts`` hands the committee's verifiers, for a share
``--donate-transcripts-rate`` (default :data:`DEFAULT_RATE`) of its requests, the request and the
signed reply it got, so that the verifiers score model nodes on users' real traffic (a node cannot
tell these requests from others: they *are* users' requests). A verifier counts them only under
the rules of :mod:`verifier.audit.transcripts` (commit before the reply, all or nothing, no
seeds), which this client keeps:

1. Whether a request is donated is drawn *before* it is sent (with probability
   :attr:`TranscriptDonor.rate`); a request with a seed, or outside a transcript's limits
   (:func:`overlay.directory.transcripts.fits`: every request a model node serves by default,
   decision 0032), is never chosen.
2. For a chosen request the client picks the model node itself
   (:meth:`~overlay.anon.client.AnonClient.choose_model_node`, the node a normal request would go to),
   a random request id and nonce, and computes the commitment
   (:func:`overlay.directory.transcripts.commitment` of :func:`overlay.anon.signing.request_digest` of the
   request with that id, addressed to that node).
3. It sends the signed commit (:func:`overlay.directory.transcripts.encode_commit`, naming each verifier's
   key) to EVERY verifier of ``--committee`` at once, over the verifier's RPC
   (``abci_query /audit/transcript_commit``), and waits for their answers, at most
   :data:`COMMIT_TIMEOUT_S`. Only then, and :data:`SETTLE_S` later, is the request sent: a
   verifier counts a reply only if the model node signed it strictly after the commit reached the
   verifier, the two times read on two machines' clocks, so the pause absorbs a model node's clock
   running up to about a second behind the verifier's (a reply signed "before" the commitment
   voids the donor's set). If every verifier refused (or none
   could be asked), the request is sent as a normal one and nothing is donated. If some took it
   and others refused, the request is still donated, to those that took it and those whose
   answer did not come: a commitment a verifier holds cannot be taken back (left unrevealed it
   voids the donor's set there, which counts against the donor's void budget; a reveal of one it
   never got is only refused as unknown), and a verifier that refused it holds nothing to reveal.
4. The request goes to that node with that request id (``node=``, ``request_id=``); the overlay's
   usual failover stays on, with fresh request ids after the first try, so the user gets an
   answer as for any request. The transcript is revealed only if the whole reply came from the
   committed try (every chunk under the committed request id, from one node, the last ``done``);
   otherwise the client reveals "no reply" for the commitment, as the rules require (that voids
   the donor's set of that epoch at each verifier, one of the few void sets a donor may leave
   before it is burnt there: :data:`verifier.audit.transcripts.VOID_ALLOWANCE` plus
   :data:`~verifier.audit.transcripts.VOID_SHARE` of its sets). A caller that
   stops reading early (a stop string) does not get the rest, but the client reads the committed
   reply to its end (at most :data:`DRAIN_S`) so it can be revealed.
5. After the reply, the transcript (or "no reply") is sealed to each verifier's key
   (:func:`overlay.directory.transcripts.seal_reveal`, the key from ``/audit/donate_key``, checked against
   the committee's validator keys) and sent (``abci_query /audit/transcript_reveal``), in the
   background, tried :data:`REVEAL_TRIES` times on network errors. ``gentorrent user chat``
   waits up to :data:`EXIT_WAIT_S` for reveals still out when it exits; ``user serve`` drops them
   at Ctrl-C (an unrevealed commitment voids the donor's set at that verifier).

Privacy cost (:data:`PRIVACY`, stated where the flag is): every verifier learns the donor's node
id, its IP address, the prompt, the reply and which model node served it; the commit alone tells
each verifier when the donor is about to send a request.

Nothing here is ever shown as a chat error: failures are logged (info), and a request whose
donation fails is answered like any other. The commit round trip delays a chosen request's first
token by up to :data:`COMMIT_TIMEOUT_S` and :data:`SETTLE_S`.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import AsyncGenerator, Callable, Iterable, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from overlay.anon.client import AnonError
from overlay.directory import transcripts as wire
from overlay.directory.donation import DonationError
from overlay.wire import crypto
from overlay.wire.clock import Clock, TrioClock
from overlay.wire.identity import Identity, short_id
from overlay.wire.messages import REQUEST_ID_LEN, ChatMessage, ReplyChunk, SamplingParams
from user_client.donate import Background, _as_floats, verifier_key

if TYPE_CHECKING:
    from overlay.directory.rpc import Rpc

log = logging.getLogger("gentorrent.donate")

DEFAULT_RATE = 0.1
COMMIT_TIMEOUT_S = 5.0  # for every verifier's answer to a commit
SETTLE_S = 1.0  # then this long before the request leaves (module docstring, 3)
DRAIN_S = 60.0  # to read the rest of a committed reply its caller stopped reading
REVEAL_TRIES = 3
REVEAL_RETRY_S = 20.0  # between tries of a reveal that met a network error
EXIT_WAIT_S = 10.0  # `user chat` waits this long for reveals still out when it exits
MAX_PENDING = 64  # reveals out at once; a chosen request past it is sent as a normal one
PRIVACY = ("every verifier of the committee learns your node id, your IP address, the prompt, the reply and which "
           "model node served it (and, from the commit, when you are about to send a request)")

ACCEPTED, REFUSED, UNKNOWN = "accepted", "refused", "unknown"


@dataclass(frozen=True, slots=True)
class Committed:
    """A request committed to before it is sent: what to send, where, under which id, and the
    verifiers to reveal it to (``(address, validator key)``)."""

    model: str
    messages: tuple[ChatMessage, ...]
    params: SamplingParams
    target: bytes
    request_id: bytes
    nonce: bytes
    value: bytes
    verifiers: tuple[tuple[str, bytes], ...]


def body_of(c: Committed, chunks: Sequence[ReplyChunk]) -> wire.Body:
    """The reveal for ``c`` after ``chunks`` came: the transcript when the whole reply came from
    the committed try (every chunk under its request id, from one node, the last ``done``),
    else "no reply"."""
    if not chunks or not chunks[-1].done or any(x.request_id != c.request_id or x.node != chunks[0].node
                                                  for x in chunks):
        return wire.NoReply(c.value)
    last = chunks[-1]
    return wire.Revealed(c.target, c.nonce, c.model, c.messages, c.params, c.request_id, last.node,
                         tuple((x.text, tuple(x.token_ids)) for x in chunks), last.signature, last.signed_at_ms)


class TranscriptDonor(Background):
    """Commits to and reveals donated transcripts (see the module docstring).

    ``addresses``: the committee's RPC addresses (``--committee``); ``validators()``: the validator
    keys the node holds now. ``rpc`` (default :func:`overlay.directory.rpc.rpc_call`), ``rng``
    (default :class:`random.SystemRandom`), ``urandom`` (request ids and nonces) and ``clock``
    (default :class:`~overlay.wire.clock.TrioClock`: the commit's ``sent_ms``) are injectable for tests.
    :meth:`run` must be running (in a nursery) for anything to be donated."""

    DROPPED = "donate: %d transcript reveal(s) still out dropped at exit (their commitments stand unrevealed)"
    DROPPED_LEVEL = logging.INFO

    def __init__(self, identity: Identity, addresses: Sequence[str], validators: Callable[[], Iterable[bytes]], *,
                 rate: float = DEFAULT_RATE, rpc: Rpc | None = None, rng: random.Random | None = None,
                 urandom: Callable[[int], bytes] = crypto.random_bytes, clock: Clock | None = None,
                 commit_timeout: float = COMMIT_TIMEOUT_S, settle: float = SETTLE_S, drain: float = DRAIN_S,
                 reveal_retry: float = REVEAL_RETRY_S) -> None:
        if not addresses:
            raise ValueError("donating transcripts needs the committee's RPC addresses (--committee)")
        if not (math.isfinite(rate) and 0.0 <= rate <= 1.0):
            raise ValueError(f"the transcript donation rate must be within 0..1, got {rate}")
        if rpc is None:
            from overlay.directory.rpc import rpc_call

            rpc = rpc_call
        self.identity = identity
        self.addresses = list(dict.fromkeys(addresses))
        self.validators = validators
        self.rate = rate
        self.rpc = rpc
        self.rng = rng or random.SystemRandom()
        self.urandom = urandom
        self.clock: Clock = clock or TrioClock()
        self.commit_timeout = commit_timeout
        self.settle = settle
        self.drain_s = drain
        self.reveal_retry = reveal_retry
        self.offered = self.chosen = self.committed = self.revealed = self.no_reply = self.failed = 0
        self.pending = 0
        self._keys: dict[str, bytes] = {}
        self._nursery: trio.Nursery | None = None
        self._idle: trio.Event | None = None

    # ------------------------------------------------------------------ lifetime

    async def wait_idle(self) -> bool:
        """Wait for every reveal out to end; whether they all did (False at once when the donor is
        not running: nothing will end them). The caller bounds the wait (``user chat``:
        :data:`EXIT_WAIT_S`)."""
        while self.pending and self._idle is not None:
            await self._idle.wait()
        return not self.pending

    # ------------------------------------------------------------------ before the request

    async def commit(self, client: Any, model: str, messages: Sequence[ChatMessage], params: SamplingParams | None,
                     node: bytes | None) -> Committed | None:
        """Draw whether this request is donated; if it is, commit to it with every verifier and
        return what to send (``None``: send it as a normal request). Never raises (but
        cancellation): failures are logged."""
        self.offered += 1
        if self._nursery is None or not self.rng.random() < self.rate:
            return None
        self.chosen += 1
        try:
            return await self._commit(client, model, messages, params, node)
        except (AnonError, ValueError, OSError, crypto.CryptoError) as exc:
            log.info("donate: the request is sent without donating its transcript: %s", exc)
            return None

    async def _commit(self, client: Any, model: str, messages: Sequence[ChatMessage], params: SamplingParams | None,
                      node: bytes | None) -> Committed | None:
        p = _as_floats(params or SamplingParams())
        msgs = tuple(messages)
        why = wire.fits(model, msgs, p)
        if why is not None:
            log.debug("donate: this request cannot be a transcript (%s); not donated", why)
            return None
        if self.pending >= MAX_PENDING:
            log.info("donate: %d transcript reveals are out already; this request is not donated", self.pending)
            return None
        target: bytes = client.choose_model_node(model, node).node_id
        rid, nonce = self.urandom(REQUEST_ID_LEN), self.urandom(wire.NONCE_LEN)
        value = wire.commitment(nonce, target, wire.committed_digest(model, msgs, p, rid, target))
        answers: dict[str, tuple[str, bytes, str]] = {}
        with trio.move_on_after(self.commit_timeout):
            async with trio.open_nursery() as nursery:
                for address in self.addresses:
                    nursery.start_soon(self._commit_to, address, value, answers)
        for address in self.addresses:  # still out at the deadline: it may have taken the commit
            if address not in answers and address in self._keys:
                answers[address] = (UNKNOWN, self._keys[address], f"no answer within {self.commit_timeout:g} s")
        # a verifier that accepted, or whose answer did not come, may hold the commitment: it is
        # revealed to (a commitment left unrevealed voids the donor's set there, one of its void
        # budget; one it never got is refused as unknown, which costs nothing)
        reveal_to = tuple((a, answers[a][1]) for a in self.addresses if a in answers and answers[a][0] != REFUSED)
        others = {a: answers[a][2] for a in self.addresses if a in answers and answers[a][0] != ACCEPTED}
        if not reveal_to:
            log.info("donate: no verifier took the commitment (%s); the request is sent without donating it",
                     "; ".join(f"{a}: {w}" for a, w in others.items()) or "none reachable")
            return None
        if others:
            log.info("donate: %d of %d verifiers took the commitment (%s); donating to those that may hold it",
                     len(reveal_to) - sum(1 for a in others if answers[a][0] == UNKNOWN), len(self.addresses),
                     "; ".join(f"{a}: {w}" for a, w in others.items()))
        self.committed += 1
        c = Committed(model, msgs, p, target, rid, nonce, value, reveal_to)
        try:
            await trio.sleep(self.settle)
        except BaseException:  # cancelled after committing: the commitment must still be answered
            self.finish(c, ())
            raise
        return c

    async def _key(self, address: str) -> bytes:
        """The verifier's validator key (:func:`user_client.donate.verifier_key`), kept while it is
        one this node holds."""
        held = set(self.validators())
        key = self._keys.get(address)
        if key is None or key not in held:
            key = self._keys[address] = await verifier_key(self.rpc, address, held)
        return key

    async def _commit_to(self, address: str, value: bytes, answers: dict[str, tuple[str, bytes, str]]) -> None:
        from overlay.directory.rpc import RpcError, abci_query

        try:
            key = await self._key(address)
        except (OSError, RpcError, DonationError) as exc:
            answers[address] = (REFUSED, b"", f"no key: {exc}")  # nothing was sent: nothing to reveal
            return
        raw = wire.encode_commit(self.identity, self.identity.node_id, key, int(self.clock.unix() * 1000), value)
        try:
            answer = await abci_query(address, wire.COMMIT_PATH, raw, rpc=self.rpc)
        except (OSError, RpcError) as exc:
            answers[address] = (UNKNOWN, key, str(exc))
            return
        answers[address] = (ACCEPTED, key, "") if answer.code == 0 else (REFUSED, key, answer.log[:200])

    # ------------------------------------------------------------------ after the request

    def finish(self, c: Committed, chunks: Sequence[ReplyChunk]) -> None:
        """The committed request is over with ``chunks``: reveal it (:func:`body_of`) to its
        verifiers, in the background. Never raises."""
        body = body_of(c, chunks)
        if isinstance(body, wire.NoReply):
            self.no_reply += 1
            log.info("donate: the committed request to model node %s got no complete reply of its own; revealing "
                     "\"no reply\" (this epoch's transcripts of yours count for nothing)", short_id(c.target))
        self._schedule(c, body)

    def _schedule(self, c: Committed, body: wire.Body) -> None:
        if self._nursery is None:
            log.info("donate: the transcript cannot be revealed (the donor stopped)")
            return
        for address, key in c.verifiers:
            self.pending += 1
            if self._idle is None or self._idle.is_set():
                self._idle = trio.Event()
            self._nursery.start_soon(self._reveal, address, key, body, c.value)

    async def _reveal(self, address: str, key: bytes, body: wire.Body, value: bytes) -> None:
        from overlay.directory.rpc import RpcError, abci_query

        what = "\"no reply\"" if isinstance(body, wire.NoReply) else "the transcript"
        try:
            sealed = wire.seal_reveal(key, self.identity, self.identity.node_id, body)
            if len(sealed) > wire.MAX_REVEAL_BYTES:
                sealed = wire.seal_reveal(key, self.identity, self.identity.node_id, wire.NoReply(value))
                what = "\"no reply\" (the transcript is over the size a reveal holds)"
            for attempt in range(1, REVEAL_TRIES + 1):
                try:
                    answer = await abci_query(address, wire.REVEAL_PATH, sealed, rpc=self.rpc)
                except (OSError, RpcError) as exc:
                    if attempt == REVEAL_TRIES:
                        raise
                    log.info("donate: revealing to %s failed (%s); trying again in %g s", address, exc,
                             self.reveal_retry)
                    await trio.sleep(self.reveal_retry)
                    continue
                if answer.code:
                    self.failed += 1
                    log.info("donate: %s refused %s: code %d: %s", address, what, answer.code, answer.log[:200])
                else:
                    self.revealed += 1
                    log.info("donate: revealed %s to %s", what, address)
                return
        except Exception as exc:  # noqa: BLE001 - fire and forget: logged, never raised
            self.failed += 1
            log.info("donate: %s was not revealed to %s: %s", what, address, exc)
        finally:
            self.pending -= 1
            if not self.pending and self._idle is not None:
                self._idle.set()


class DonatingClient:
    """An :class:`~overlay.anon.client.AnonClient` whose requests are sometimes donated as transcripts
    (``donor``; None: every request is a normal one). It is what ``user chat`` and ``user serve``
    send through with ``--donate-transcripts``; the rest is the wrapped client's."""

    def __init__(self, client: Any, donor: TranscriptDonor | None = None) -> None:
        self.client = client
        self.donor = donor

    @property
    def paths(self) -> Any:
        return self.client.paths

    @property
    def n(self) -> int:
        n: int = self.client.n
        return n

    async def request(self, model: str, messages: list[ChatMessage] | tuple[ChatMessage, ...],
                      params: SamplingParams | None = None, *, node: bytes | None = None,
                      chunk_timeout: float = 60.0, paths_timeout: float = 30.0,
                      sent_to: set[bytes] | None = None) -> AsyncGenerator[ReplyChunk, None]:
        """:meth:`~overlay.anon.client.AnonClient.request`'s chunks (``sent_to`` filled as there); for a
        request chosen for donation, sent only once the verifiers answered its commit (module
        docstring), then revealed."""
        donor = self.donor
        c = None if donor is None else await donor.commit(self.client, model, messages, params, node)
        if c is None or donor is None:
            async with aclosing(self.client.request(model, messages, params, node=node, chunk_timeout=chunk_timeout,
                                                    paths_timeout=paths_timeout, sent_to=sent_to)) as chunks:
                async for x in chunks:
                    yield x
            return
        got: list[ReplyChunk] = []
        try:
            async with aclosing(self.client.request(c.model, c.messages, c.params, node=c.target,
                                                    chunk_timeout=chunk_timeout, paths_timeout=paths_timeout,
                                                    request_id=c.request_id, sent_to=sent_to)) as chunks:
                try:
                    async for x in chunks:
                        got.append(x)
                        yield x
                except GeneratorExit:  # the caller stopped reading: read the committed reply to its end
                    if not (got and got[-1].done):
                        with trio.move_on_after(donor.drain_s):
                            try:
                                async for x in chunks:
                                    got.append(x)
                            except AnonError:
                                pass
                    raise
        finally:
            donor.finish(c, got)
