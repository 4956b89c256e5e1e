"""Donating prompts to the committee's audits (decision 0013, item 4): the user's side.

A user who turns on ``--donate-prompts`` hands, after a complete reply and with probability
``--donate-rate`` (default :data:`DEFAULT_RATE`), the request's system prompt and user turns (the
latest :data:`~overlay.directory.transcripts.MAX_TURNS`, the last the request's own; not the replies
between them, decision 0027) and sampling parameters to ONE verifier of the committee,
chosen uniformly at random among the ``--committee`` RPC addresses, after a random delay of
0 to :data:`MAX_DELAY_S` seconds (so the donation is not timed to the request). The verifier
keeps donations in a private pool and audits model nodes with them, so challenges read like
users' own prompts (verifier/audit/pool.py).

Each donation names the model nodes that have read the conversation (``seen_by``, decision 0029:
those it was sent to, and those that signed its replies), so that the verifier never challenges
them with it; a conversation more than :data:`~overlay.directory.donation.MAX_SEEN_BY` nodes read is
not donated.

Privacy cost, stated where the flag is: the chosen verifier learns the donor's node id, its IP
address, the prompt and which model nodes the conversation was sent to; not the reply.

The exchange, over the verifier's CometBFT RPC (``abci_query``, :func:`overlay.directory.rpc.rpc_call`):

1. ``/audit/donate_key`` answers the verifier's Ed25519 validator key (32 bytes); the donor
   goes on only if that key is one of the committee's validator keys it holds (the genesis set,
   or the set the signed lists moved it to).
2. ``/audit/donate`` with ``data`` = the sealed donation (:func:`overlay.directory.donation.seal_donation`
   to that key, at most :data:`~overlay.directory.donation.MAX_DONATION_BYTES`); code 0 means accepted.

The format (the plaintext, its signature by the donor's identity key, the sealing) is
:mod:`overlay.directory.donation`'s, the codec the verifier decodes with; :func:`encode` makes it from this
node's identity, with the parameters as floats where the format has floats. Every refusal here
is that module's :class:`~overlay.directory.donation.DonationError` too (a donation that could not be made
or was refused, with the reason).

Fire and forget: nothing here is ever shown as a chat error, blocks or slows a reply; failures
are logged (info). Donations still waiting for their delay when the process exits are dropped
(sending them at exit would time them to the last request).
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import trio

from overlay.directory import donation
from overlay.directory.donation import DONATE_PATH, KEY_PATH, MAX_DONATION_BYTES, DonationError, donated_messages
from overlay.wire.identity import Identity, short_id
from overlay.wire.messages import ChatMessage, SamplingParams

if TYPE_CHECKING:
    from overlay.directory.rpc import Rpc

log = logging.getLogger("gentorrent.donate")

MAX_DELAY_S = 60.0
DEFAULT_RATE = 0.25
MAX_PENDING = 64  # donations waiting for their delay at once; more are skipped
PRIVACY = ("the chosen verifier learns your node id, your IP address, the prompt and which model nodes the "
           "conversation was sent to, so that it never challenges them with it (not the reply)")



def _as_floats(p: SamplingParams) -> SamplingParams:
    """``p`` with floats as floats and ints as ints (a gateway may hold ints)."""
    return SamplingParams(float(p.temperature), float(p.top_p), int(p.top_k), int(p.max_tokens),
                          None if p.seed is None else int(p.seed))


def encode(identity: Identity, model: str, messages: Sequence[ChatMessage], params: SamplingParams,
           seen_by: Iterable[bytes] = ()) -> bytes:
    """The donation's plaintext (:func:`overlay.directory.donation.encode`) from and signed by
    ``identity``, naming the model nodes ``seen_by`` as having read the conversation."""
    return donation.encode(identity, identity.node_id, model, messages, _as_floats(params), seen_by)


def seal(verifier_key: bytes, identity: Identity, model: str, messages: Sequence[ChatMessage],
         params: SamplingParams, seen_by: Iterable[bytes] = ()) -> bytes:
    """The sealed donation to ``verifier_key``: :func:`~overlay.directory.donation.donated_messages`,
    the oldest user turns (after a system prompt) dropped until it is at most
    :data:`MAX_DONATION_BYTES`, naming ``seen_by`` (the model nodes that read the conversation).
    :class:`DonationError` when nothing fits, the last message is not the user's or more than
    :data:`~overlay.directory.donation.MAX_SEEN_BY` nodes read it."""
    msgs = donated_messages(messages)
    if msgs is None:
        raise DonationError("the request's last message is not a user's: nothing to donate")
    first = 1 if msgs[0].role == "system" else 0
    params = _as_floats(params)
    seen = donation.seen_by_of(seen_by)
    while True:
        sealed = donation.seal_donation(verifier_key, identity, identity.node_id, model, msgs, params, seen)
        if len(sealed) <= MAX_DONATION_BYTES:
            return sealed
        rest = msgs[first + 1:]
        while rest and rest[0].role != "user":
            rest = rest[1:]
        if not rest:
            raise DonationError(f"the prompt is longer than a donation holds ({MAX_DONATION_BYTES} bytes sealed)")
        msgs = msgs[:first] + rest


async def abci_query(rpc: Rpc, address: str, path: str, data: bytes = b"") -> bytes:
    """:func:`overlay.directory.rpc.abci_value` through ``rpc``; a refusal or an answer that is
    not CometBFT's is a :class:`DonationError` (with the verifier's log)."""
    from overlay.directory.rpc import RpcError, abci_value

    try:
        return await abci_value(address, path, data, rpc=rpc)
    except RpcError as exc:
        raise DonationError(f"{path}: {exc}") from None


async def verifier_key(rpc: Rpc, address: str, held: Iterable[bytes]) -> bytes:
    """The Ed25519 validator key the verifier at ``address`` answers on ``/audit/donate_key``,
    which must be one of the committee's validator keys ``held`` (:class:`DonationError` otherwise):
    the key a donation, or a transcript's reveal, is sealed to."""
    key = await abci_query(rpc, address, KEY_PATH)
    if len(key) != 32 or key not in set(held):
        raise DonationError(f"{address} answered a donation key ({key.hex()[:16] or 'empty'}) that is not one of "
                            "the committee's validator keys this node holds")
    return key


class Background:
    """Fire-and-forget work (donations, reveals) held in a nursery of its own: :meth:`run` must be
    running for :attr:`_nursery` to take tasks; when it is cancelled, what is still out
    (:attr:`pending`) is dropped, and said (:attr:`DROPPED`, at :attr:`DROPPED_LEVEL`)."""

    DROPPED = "donate: %d donation(s) still waiting for their delay dropped at exit"
    DROPPED_LEVEL = logging.DEBUG
    pending: int
    _nursery: trio.Nursery | None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the tasks until cancelled (those still out are dropped then)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._nursery = None
                if self.pending:
                    log.log(self.DROPPED_LEVEL, self.DROPPED, self.pending)


class Donor(Background):
    """Donates prompts after replies (see the module docstring).

    ``addresses``: the committee's RPC addresses (``--committee``); ``validators()``: the
    validator keys the node holds now (the genesis set, or the committee's signed lists' latest).
    ``rpc`` (default :func:`overlay.directory.rpc.rpc_call`) and ``rng`` (default
    :class:`random.SystemRandom`) are injectable for tests. :meth:`run` must be running (in a
    nursery) for :meth:`offer` to schedule anything."""

    def __init__(self, identity: Identity, addresses: Sequence[str], validators: Callable[[], Iterable[bytes]], *,
                 rate: float = DEFAULT_RATE, rpc: Rpc | None = None, rng: random.Random | None = None,
                 max_delay: float = MAX_DELAY_S) -> None:
        if not addresses:
            raise ValueError("donating prompts needs the committee's RPC addresses (--committee)")
        if not (math.isfinite(rate) and 0.0 <= rate <= 1.0):
            raise ValueError(f"the donation rate must be within 0..1, got {rate}")
        if rpc is None:
            from overlay.directory.rpc import rpc_call

            rpc = rpc_call
        self.identity = identity
        self.addresses = list(addresses)
        self.validators = validators
        self.rate = rate
        self.rpc = rpc
        self.rng = rng or random.SystemRandom()
        self.max_delay = max_delay
        self.offered = self.scheduled = self.donated = self.failed = 0
        self.pending = 0
        self._nursery: trio.Nursery | None = None

    def offer(self, model: str, messages: Sequence[ChatMessage], params: SamplingParams,
              seen_by: Iterable[bytes] = ()) -> bool:
        """After a complete reply to ``messages``: with probability :attr:`rate`, donate them
        :attr:`max_delay`-random seconds from now, naming ``seen_by``, the model nodes that have
        read the conversation (those it was sent to, those that signed its replies). Whether one
        was scheduled; never raises (a conversation more than
        :data:`~overlay.directory.donation.MAX_SEEN_BY` nodes read is not: it is logged)."""
        self.offered += 1
        try:
            if self._nursery is None or self.rng.random() >= self.rate:
                return False
            seen = donation.seen_by_of(seen_by)
            if self.pending >= MAX_PENDING:
                log.info("donate: %d donations are waiting already; this prompt is not donated", self.pending)
                return False
            self.pending += 1
            self.scheduled += 1
            self._nursery.start_soon(self._later, model, tuple(messages), params, seen,
                                     self.rng.uniform(0.0, self.max_delay))
            return True
        except Exception as exc:  # noqa: BLE001 - a donation never disturbs a chat
            log.info("donate: not scheduled: %s", exc)
            return False

    async def _later(self, model: str, messages: tuple[ChatMessage, ...], params: SamplingParams,
                     seen_by: tuple[bytes, ...], delay: float) -> None:
        try:
            await trio.sleep(delay)
            address = await self.donate(model, messages, params, seen_by)
        except Exception as exc:  # noqa: BLE001 - fire and forget: logged, never raised
            self.failed += 1
            log.info("donate: the prompt was not donated: %s", exc)
        else:
            self.donated += 1
            log.info("donate: a prompt was donated to the verifier at %s", address)
        finally:
            self.pending -= 1

    async def donate(self, model: str, messages: Sequence[ChatMessage], params: SamplingParams,
                     seen_by: Iterable[bytes] = ()) -> str:
        """Donate now to one verifier chosen uniformly at random, naming ``seen_by``; its address.
        Raises :class:`DonationError` (or the RPC's errors: ``OSError``, ``overlay.directory.rpc.RpcError``)."""
        address = self.rng.choice(self.addresses)
        key = await verifier_key(self.rpc, address, self.validators())
        sealed = seal(key, self.identity, model, messages, params, seen_by)
        await abci_query(self.rpc, address, DONATE_PATH, sealed)
        log.debug("donate: %s (%s) accepted %d sealed bytes for %s", address, short_id(key), len(sealed), model)
        return address
