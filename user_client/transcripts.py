"""Donating transcripts to the committee's audits (decisions 0015 and 0037): the user's side.

A user who turns on ``--donate-transcripts`` hands the committee's verifiers, for a share
``--donate-transcripts-rate`` (default :data:`DEFAULT_RATE`) of its requests, the request and the
signed reply it got, so that the verifiers score model nodes on users' real traffic (a node cannot
tell these requests from others: they *are* users' requests). A verifier counts them only under
the rules of :mod:`verifier.audit.transcripts` (commit before the reply, all or nothing, no
seeds), which this client keeps.

A chosen request is committed to one of two ways. When the donor knows the committee's validator
keys with their voting powers (``powers``: the genesis set, or the signed lists' latest) and they
admit an escrow plan (:func:`overlay.directory.escrow.plan_of`), the commitment is *escrowed*
(decision 0037: its secret is dealt among the validators, so the model node can reveal a reply the
donor withholds); otherwise it is a version-1 commitment, which the verifiers still take.

1. Whether a request is donated is drawn *before* it is sent (with probability
   :attr:`TranscriptDonor.rate`); a request with a seed, or outside a transcript's limits
   (:func:`overlay.directory.transcripts.fits`: every request a model node serves by default,
   decision 0032), is never chosen.
2. For a chosen request the client picks the model node itself
   (:meth:`~overlay.anon.client.AnonClient.choose_model_node`, the node a normal request would go to),
   a random request id, and the commitment's nonce:

   - version 1: a random nonce;
   - escrowed: a fresh secret ``s`` (:func:`overlay.directory.transcripts.escrowed_secret`: the
     request's locator in its low bits, decision 0038) dealt under the
     plan (:func:`~overlay.directory.escrow.deal`: public points and each validator's shares), the
     nonce :func:`~overlay.directory.escrow.nonce_of` ``s``;

   and computes the commitment (:func:`overlay.directory.transcripts.commitment` of
   :func:`overlay.anon.signing.request_digest` of the request with that id, addressed to that node).
3. It commits with EVERY verifier of ``--committee`` at once, over the verifier's RPC, and waits
   for their answers, at most :data:`COMMIT_TIMEOUT_S` a round. Each verifier is named by its key
   from ``/audit/donate_key``, checked against the committee's validator keys.

   - Version 1: one round, the signed commit (:func:`overlay.directory.transcripts.encode_commit`,
     ``abci_query /audit/transcript_commit``). If every verifier refused (or none could be asked),
     the request is sent as a normal one and nothing is donated. If some took it and others
     refused, the request is still donated, to those that took it and those whose answer did not
     come: a commitment a verifier holds cannot be taken back (left unrevealed it voids the
     donor's set there, which counts against the donor's void budget; a reveal of one it never got
     is only refused as unknown), and a verifier that refused it holds nothing to reveal.
   - Escrowed: two rounds. *Commit*: each verifier gets the points and its own shares, sealed to
     its key (:func:`overlay.directory.transcripts.encode_escrow_commit`, ``abci_query
     /audit/transcript_escrow_commit``, one ``sent_ms`` for all), and answers its signed
     acceptance, which the client checks (:func:`~overlay.directory.transcripts.verify_acceptance`,
     and that it binds this commitment, points and ``sent_ms``). If the good acceptances hold no
     more than two thirds of the power (each key counted once, as the verifiers' own
     :func:`~overlay.directory.transcripts.certified_power` counts them), the request is sent as a
     normal one and nothing is donated: a verifier holds an uncertified commitment as counting for
     nothing, so leaving it unrevealed costs the donor nothing (it marks the donor idle there,
     which only puts its later uncertified holds first out of a full book, decision 0041).
     *Certify*: otherwise the certificate (:func:`~overlay.directory.transcripts.encode_certificate`,
     the acceptances) goes to every verifier whose key the client has (``abci_query
     /audit/transcript_certify``), those that refused the commit or did not answer it too (a
     verifier takes a certified commitment without shares of its own). The commitment is donated
     to those that took the certificate and those whose answer did not come; one that refused it
     holds nothing that counts. If none took it (or might have), the request is sent as a normal
     one.

   Only then, and :data:`SETTLE_S` later, is the request sent: a verifier counts a reply only if
   the model node signed it strictly after the commit (escrowed: the certificate) reached the
   verifier, the two times read on two machines' clocks, so the pause absorbs a model node's clock
   running up to about a second behind the verifier's (a reply signed "before" the commitment
   voids the donor's set).
4. The request goes to that node with that request id (``node=``, ``request_id=``); the overlay's
   usual failover stays on, with fresh request ids after the first try, so the user gets an
   answer as for any request, but the committed try waits out a silence up to the chunk timeout
   (``wait_first``) instead of failing over after a few seconds: only that node's reply can be
   revealed, and a loaded honest node stalls for seconds mid-reply. The transcript is revealed
   only if the whole reply came from the committed try (every chunk under the committed request
   id, from one node, the last ``done``). When the node refused the committed try as busy before
   any output, it signed that refusal (decision 0044), and the client reveals the signed refusal:
   the verifiers take it as no sample, which voids nothing. Otherwise the client reveals "no
   reply" for the commitment, as the rules require (that voids
   the donor's set of that epoch at each verifier, one of the few void sets a donor may leave
   before it is burnt there: :data:`verifier.audit.transcripts.VOID_ALLOWANCE` plus
   :data:`~verifier.audit.transcripts.VOID_SHARE` of its sets). A caller that
   stops reading early (a stop string) does not get the rest, but the client reads the committed
   reply to its end (at most :data:`DRAIN_S`) so it can be revealed.
5. After the reply, the transcript (or "no reply") is sealed to each verifier's key
   (:func:`overlay.directory.transcripts.seal_reveal`) and sent to the verifiers step 3 donated
   it to (``abci_query /audit/transcript_reveal``), in the background, tried :data:`REVEAL_TRIES`
   times on network errors; an escrowed transcript carries the secret ``s`` in the nonce's place
   (a body of kind 2), which the verifier checks against the points. ``gentorrent user chat``
   and ``user serve`` wait up to :data:`EXIT_WAIT_S` for reveals still out when they stop, at the
   end of the chat or at the first Ctrl-C or SIGTERM (:func:`reveal_before_stopping`; a second
   one stops at once): an unrevealed commitment voids the donor's set at each verifier that holds
   it, and tells the node after the epoch that the request was donated. A request cancelled after
   its commitment (escrowed: after its certificate may have gone out), by a stop too, reveals "no
   reply".

Privacy cost (:data:`PRIVACY`, stated where the flag is): every verifier learns the donor's node
id, its IP address, the prompt, the reply and which model node served it; the commit alone tells
each verifier when the donor is about to send a request. An escrowed commitment adds only
this: a verifier that holds no reveal of a certified one after its epoch (the donor withheld it,
crashed, or its reveal did not come) releases its shares, so the model node that served the
request learns that it was donated, and can reveal it; validators below a third of the power
cannot rebuild ``s`` before that.

Nothing here is ever shown as a chat error: failures are logged (info), and a request whose
donation fails is answered like any other. The commit round trip (escrowed: both) delays a chosen
request's first token by up to :data:`COMMIT_TIMEOUT_S` a round and :data:`SETTLE_S`.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

import trio

from overlay.anon.client import AnonError
from overlay.directory import escrow
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
COMMIT_TIMEOUT_S = 5.0  # for every verifier's answer to a commit (escrowed: to each of its two rounds)
SETTLE_S = 1.0  # then this long before the request leaves (module docstring, 3)
DRAIN_S = 60.0  # to read the rest of a committed reply its caller stopped reading
REVEAL_TRIES = 3
REVEAL_RETRY_S = 20.0  # between tries of a reveal that met a network error
EXIT_WAIT_S = 10.0  # `user chat` and `user serve` wait this long for reveals still out when they stop
MAX_PENDING = 64  # reveals out at once; a chosen request past it is sent as a normal one
PRIVACY = ("every verifier of the committee learns your node id, your IP address, the prompt, the reply and which "
           "model node served it (and, from the commit, when you are about to send a request); if your reveal of "
           "a request misses verifiers that together could rebuild its escrowed secret, the model node that "
           "served it learns after the epoch that it was donated")

ACCEPTED, REFUSED, UNKNOWN = "accepted", "refused", "unknown"
Answers = dict[str, tuple[str, bytes, str]]  # address -> (ACCEPTED | REFUSED | UNKNOWN, its key or b"", why)


@dataclass(frozen=True, slots=True)
class Committed:
    """A request committed to before it is sent: what to send, where, under which id, the
    verifiers to reveal it to (``(address, validator key)``) and, for an escrowed commitment, its
    secret (:func:`overlay.directory.escrow.scalar_bytes`; empty for version 1)."""

    model: str
    messages: tuple[ChatMessage, ...]
    params: SamplingParams
    target: bytes
    request_id: bytes
    nonce: bytes
    value: bytes
    verifiers: tuple[tuple[str, bytes], ...]
    secret: bytes = b""


def body_of(c: Committed, chunks: Sequence[ReplyChunk], refusals: Sequence[ReplyChunk] = ()) -> wire.Body:
    """The reveal for ``c`` after ``chunks`` came (and ``refusals``, the tries' "busy" chunks):
    the transcript when the whole reply came from the committed try (every chunk under its request
    id, from one node, the last ``done``); else the node's signed "busy" when the committed try was
    refused so (decision 0044: a body of kind 3, which voids nothing); else "no reply". An
    escrowed commitment's transcript carries its secret (a body of kind 2)."""
    if not chunks or not chunks[-1].done or any(x.request_id != c.request_id or x.node != chunks[0].node
                                                  for x in chunks):
        busy = next((x for x in refusals if x.request_id == c.request_id and x.seq == 0
                     and len(x.signature) == wire.SIGNATURE_LEN), None)
        if busy is None:
            return wire.NoReply(c.value)
        return wire.Revealed(c.target, c.nonce, c.model, c.messages, c.params, c.request_id, busy.node, (),
                             busy.signature, busy.signed_at_ms)
    last = chunks[-1]
    return wire.Revealed(c.target, c.nonce, c.model, c.messages, c.params, c.request_id, last.node,
                         tuple((x.text, tuple(x.token_ids)) for x in chunks), last.signature, last.signed_at_ms,
                         c.secret)


class TranscriptDonor(Background):
    """Commits to and reveals donated transcripts (see the module docstring).

    ``addresses``: the committee's RPC addresses (``--committee``); ``validators()``: the validator
    keys the node holds now; ``powers()`` (optional): those keys' voting powers, the set whose
    plan an escrowed commitment is dealt under (none, or no plan: version-1 commitments).
    ``rpc`` (default :func:`overlay.directory.rpc.rpc_call`), ``rng``
    (default :class:`random.SystemRandom`), ``urandom`` (request ids and nonces) and ``clock``
    (default :class:`~overlay.wire.clock.TrioClock`: the commit's ``sent_ms``) are injectable for tests.
    :meth:`run` must be running (in a nursery) for anything to be donated."""

    DROPPED = "donate: %d transcript reveal(s) still out dropped at exit (their commitments stand unrevealed)"
    DROPPED_LEVEL = logging.INFO

    def __init__(self, identity: Identity, addresses: Sequence[str], validators: Callable[[], Iterable[bytes]], *,
                 powers: Callable[[], Mapping[bytes, int]] | None = None,
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
        self.powers = powers
        self.rate = rate
        self.rpc = rpc
        self.rng = rng or random.SystemRandom()
        self.urandom = urandom
        self.clock: Clock = clock or TrioClock()
        self.commit_timeout = commit_timeout
        self.settle = settle
        self.drain_s = drain
        self.reveal_retry = reveal_retry
        self.offered = self.chosen = self.committed = self.escrowed = self.revealed = self.no_reply = self.failed = 0
        self.busy = 0  # committed requests their node refused as busy, its signed refusal revealed
        self.pending = 0
        self._keys: dict[str, bytes] = {}
        self._no_plan: dict[bytes, int] | None = None  # the last powers that admitted no escrow plan
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
        except Exception as exc:  # noqa: BLE001 - the request goes as a normal one, whatever failed
            log.info("donate: the request is sent without donating its transcript: %s", exc)
            return None

    def _plan(self) -> tuple[dict[bytes, int], escrow.Plan] | None:
        """The validators' powers and their escrow plan, or None (no powers known, or no plan for
        them): commit without escrow."""
        if self.powers is None:
            return None
        powers = dict(self.powers())
        try:
            return powers, escrow.plan_of(powers)
        except escrow.EscrowError as exc:
            if powers != self._no_plan:  # said once for each validator set
                self._no_plan = powers
                log.info("donate: the validators' powers admit no escrow (%s); committing without it", exc.reason)
            return None

    async def _commit(self, client: Any, model: str, messages: Sequence[ChatMessage], params: SamplingParams | None,
                      node: bytes | None) -> Committed | None:
        """Steps 2 and 3 of the module docstring: the commitment, version 1 or escrowed, then the
        settling pause; ``None`` when nothing is donated."""
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
        rid = self.urandom(REQUEST_ID_LEN)
        digest = wire.committed_digest(model, msgs, p, rid, target)
        planned = self._plan()
        c: Committed | None
        if planned is None:  # version 1: a random nonce, one round
            nonce = self.urandom(wire.NONCE_LEN)
            value = wire.commitment(nonce, target, digest)
            reveal_to = await self._commit_v1(value)
            c = None if reveal_to is None else Committed(model, msgs, p, target, rid, nonce, value, reveal_to)
        else:  # escrowed: the nonce is the dealt secret's; commit, then certify
            c = await self._commit_escrowed(Committed(model, msgs, p, target, rid, b"", b"", ()), digest, *planned)
        if c is None:
            return None
        self.committed += 1
        try:
            await trio.sleep(self.settle)
        except BaseException:  # cancelled after committing: the commitment must still be answered
            self.finish(c, ())
            raise
        return c

    # version 1: one round

    async def _commit_v1(self, value: bytes) -> tuple[tuple[str, bytes], ...] | None:
        """Step 3, version 1: the commit to every verifier; the verifiers that may hold it, or
        None when none does."""
        answers: Answers = {}
        with trio.move_on_after(self.commit_timeout):
            async with trio.open_nursery() as nursery:
                for address in self.addresses:
                    nursery.start_soon(self._commit_to, address, value, answers)
        self._unanswered(answers)
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
        return reveal_to

    def _unanswered(self, answers: Answers) -> None:
        """Marks the verifiers whose answer is still out at the deadline (with a key: something was
        sent, which it may have taken) as UNKNOWN."""
        for address in self.addresses:
            if address not in answers and address in self._keys:
                answers[address] = (UNKNOWN, self._keys[address], f"no answer within {self.commit_timeout:g} s")

    async def _key(self, address: str) -> bytes:
        """The verifier's validator key (:func:`user_client.donate.verifier_key`), kept while it is
        one this node holds."""
        held = set(self.validators())
        key = self._keys.get(address)
        if key is None or key not in held:
            key = self._keys[address] = await verifier_key(self.rpc, address, held)
        return key

    async def _commit_to(self, address: str, value: bytes, answers: Answers) -> None:
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

    # escrowed (decision 0037): commit, then certify

    async def _commit_escrowed(self, req: Committed, digest: bytes, powers: dict[bytes, int],
                               plan: escrow.Plan) -> Committed | None:
        """Step 3, escrowed: ``req`` (the request, its node and id) committed to under a secret
        dealt by ``plan`` over ``powers``, then certified; what to send and reveal, with the
        secret, or None when nothing is donated."""
        secret = wire.escrowed_secret(digest)  # carries the request's locator (decision 0038)
        dealt = escrow.deal(secret, plan)
        points_raw = escrow.encode_commitments(dealt.commitments)
        nonce = escrow.nonce_of(secret)
        value = wire.commitment(nonce, req.target, digest)
        sent_ms = int(self.clock.unix() * 1000)  # one for all: every acceptance binds it
        me = self.identity.node_id
        order = [k for k, _ in escrow.holders(powers)]
        # round 1, commit: each verifier checks its shares and answers its signed acceptance
        answers: Answers = {}
        accepted: dict[str, tuple[bytes, wire.Acceptance]] = {}
        with trio.move_on_after(self.commit_timeout):
            async with trio.open_nursery() as nursery:
                for address in self.addresses:
                    nursery.start_soon(self._escrow_commit_to, address, order, dealt, points_raw, value, sent_ms,
                                       answers, accepted)
        self._unanswered(answers)
        good = [accepted[a] for a in self.addresses if a in accepted]
        # each acceptance was checked against its verifier's key, which has power here; a key counts once
        power, total = sum(powers[k] for k in {x.verifier for _, x in good}), sum(powers.values())
        if 3 * power <= 2 * total:  # uncertified: it counts for nothing anywhere, and costs nothing
            why = "; ".join(f"{a}: {answers[a][2]}" for a in self.addresses if a in answers and a not in accepted)
            log.info("donate: the escrowed commitment's acceptances hold %d of %d power, not above two thirds (%s); "
                     "the request is sent without donating it", power, total, why or "none refused")
            return None
        # round 2, certify: to every verifier with a key, acceptor or not (a verifier takes a
        # certified commitment without shares of its own); from now on it may count
        raw_cert = wire.encode_certificate(me, value, sent_ms, points_raw, [raw for raw, _ in good])
        keyed = {a: answers[a][1] for a in self.addresses if a in answers and answers[a][1]}
        c = replace(req, nonce=nonce, value=value, verifiers=tuple(keyed.items()), secret=escrow.scalar_bytes(secret))
        certified: Answers = {}
        try:
            with trio.move_on_after(self.commit_timeout):
                async with trio.open_nursery() as nursery:
                    for address, key in keyed.items():
                        nursery.start_soon(self._certify_to, address, key, raw_cert, certified)
        except BaseException:  # cancelled with certificates out: the commitment must still be answered
            self.finish(c, ())
            raise
        self._unanswered(certified)
        # a verifier that took the certificate, or whose answer did not come, may count the
        # commitment: it is revealed to; one that refused it holds nothing that counts
        reveal_to = tuple((a, k) for a, k in keyed.items() if certified[a][0] != REFUSED)
        others = {a: certified[a][2] for a in keyed if certified[a][0] != ACCEPTED}
        if not reveal_to:
            log.info("donate: no verifier took the escrowed commitment's certificate (%s); the request is sent "
                     "without donating it", "; ".join(f"{a}: {w}" for a, w in others.items()) or "none reachable")
            return None
        if others:
            log.info("donate: %d of %d verifiers took the certificate (%s); donating to those that may count it",
                     len(reveal_to) - sum(1 for a in others if certified[a][0] == UNKNOWN), len(self.addresses),
                     "; ".join(f"{a}: {w}" for a, w in others.items()))
        self.escrowed += 1
        return replace(c, verifiers=reveal_to)

    async def _escrow_commit_to(self, address: str, order: Sequence[bytes], dealt: escrow.Deal, points_raw: bytes,
                                value: bytes, sent_ms: int, answers: Answers,
                                accepted: dict[str, tuple[bytes, wire.Acceptance]]) -> None:
        from overlay.directory.rpc import RpcError, abci_query

        try:
            key = await self._key(address)
        except (OSError, RpcError, DonationError) as exc:
            answers[address] = (REFUSED, b"", f"no key: {exc}")  # nothing was sent: nothing to certify or reveal
            return
        if key not in order:
            answers[address] = (REFUSED, key, "its key has no power in the validator set the secret was dealt over")
            return
        me = self.identity.node_id
        raw = wire.encode_escrow_commit(self.identity, me, key, sent_ms, value, points_raw,
                                        dealt.shares[order.index(key)])
        try:
            answer = await abci_query(address, wire.ESCROW_COMMIT_PATH, raw, rpc=self.rpc)
        except (OSError, RpcError) as exc:
            answers[address] = (UNKNOWN, key, str(exc))
            return
        if answer.code:
            answers[address] = (REFUSED, key, answer.log[:200])
            return
        try:
            acceptance = wire.decode_acceptance(answer.value)
            wire.verify_acceptance(acceptance, key)
        except wire.TranscriptError as exc:
            answers[address] = (REFUSED, key, f"its acceptance does not check: {exc.reason}")
            return
        if (acceptance.donor, acceptance.value, acceptance.digest, acceptance.sent_ms) \
                != (me, value, wire.points_digest(points_raw), sent_ms):
            answers[address] = (REFUSED, key, "its acceptance is of another commitment")
            return
        answers[address] = (ACCEPTED, key, "")
        accepted[address] = (answer.value, acceptance)

    async def _certify_to(self, address: str, key: bytes, raw_cert: bytes, certified: Answers) -> None:
        from overlay.directory.rpc import RpcError, abci_query

        try:
            answer = await abci_query(address, wire.CERTIFY_PATH, raw_cert, rpc=self.rpc)
        except (OSError, RpcError) as exc:
            certified[address] = (UNKNOWN, key, str(exc))
            return
        certified[address] = (ACCEPTED, key, "") if answer.code == 0 else (REFUSED, key, answer.log[:200])

    # ------------------------------------------------------------------ after the request

    def finish(self, c: Committed, chunks: Sequence[ReplyChunk], refusals: Sequence[ReplyChunk] = ()) -> None:
        """The committed request is over with ``chunks`` (and the tries' "busy" ``refusals``):
        reveal it (:func:`body_of`) to its verifiers, in the background. Never raises."""
        body = body_of(c, chunks, refusals)
        if isinstance(body, wire.Revealed) and body.busy:
            self.busy += 1
            log.info("donate: model node %s refused the committed request as busy; revealing its signed refusal "
                     "(no sample, and this epoch's other transcripts of yours still count)", short_id(c.target))
        elif isinstance(body, wire.NoReply):
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

        what = ("\"no reply\"" if isinstance(body, wire.NoReply) else "the busy refusal" if body.busy
                else "the escrowed transcript" if body.secret else "the transcript")
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
        refused: list[ReplyChunk] = []
        try:
            async with aclosing(self.client.request(c.model, c.messages, c.params, node=c.target,
                                                    chunk_timeout=chunk_timeout, paths_timeout=paths_timeout,
                                                    request_id=c.request_id, sent_to=sent_to,
                                                    refusals=refused, wait_first=True)) as chunks:
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
            donor.finish(c, got, refused)


class Reveals(Protocol):
    """What :func:`reveal_before_stopping` needs of a :class:`TranscriptDonor`."""

    @property
    def pending(self) -> int: ...

    async def wait_idle(self) -> bool: ...


async def reveal_before_stopping(work: Callable[[], Awaitable[object]], stops: AsyncIterator[object],
                                 donor: Reveals | None, note: Callable[[str], None]) -> bool:
    """Run ``work`` (a chat's turns, a gateway's server) until it returns or the first of ``stops``
    (a signal: Ctrl-C, SIGTERM) cancels it; then wait up to :data:`EXIT_WAIT_S`, or until the next
    of ``stops``, for ``donor``'s reveals still out, the "no reply" of every committed request the
    cancel cut short among them. A commitment left unrevealed voids the donor's set at each
    verifier that holds it, and its shares come out after the epoch, which tells the model node
    that served the request that it was donated. Whether a stop came."""
    stopped = await _until_stopped(work, stops)
    # ``work``'s tasks have ended: every request cut short has handed its commitment to the donor
    if donor is not None and donor.pending:
        note(f"[revealing {donor.pending} donated transcript(s)..."
             + (" Ctrl-C again to stop now]" if stopped else "]"))
        with trio.move_on_after(EXIT_WAIT_S):
            stopped = await _until_stopped(donor.wait_idle, stops) or stopped
    return stopped


async def _until_stopped(work: Callable[[], Awaitable[object]], stops: AsyncIterator[object]) -> bool:
    """Run ``work`` until it returns or the next of ``stops`` cancels it; whether one did."""
    stopped = False
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            nonlocal stopped
            async for _ in stops:
                stopped = True
                nursery.cancel_scope.cancel()
                return

        nursery.start_soon(watch)
        await work()
        nursery.cancel_scope.cancel()
    return stopped
