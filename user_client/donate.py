"""Donating prompts to the committee's audits (decision 0013, item 4): the user's side.

A user who turns on ``--donate-prompts`` hands, after a complete reply and with probability
``--donate-rate`` (default :data:`DEFAULT_RATE`), the request's messages (the conversation as
sent, the last message the user's) and sampling parameters to ONE verifier of the committee,
chosen uniformly at random among the ``--committee`` RPC addresses, after a random delay of
0 to :data:`MAX_DELAY_S` seconds (so the donation is not timed to the request). The verifier
keeps donations in a private pool and audits model nodes with them, so challenges read like
users' own prompts (verifier/audit/pool.py).

Privacy cost, stated where the flag is: the chosen verifier learns the donor's node id, its IP
address and the prompt; not the reply, nor which model node served it.

The exchange, over the verifier's CometBFT RPC (``abci_query``, :func:`overlay.committee.rpc_call`):

1. ``/audit/donate_key`` answers the verifier's Ed25519 validator key (32 bytes); the donor
   goes on only if that key is one of the committee's validator keys it holds (the genesis set,
   or the set the signed lists moved it to).
2. ``/audit/donate`` with ``data`` = the sealed donation (:func:`overlay.crypto.seal_to_ed25519`
   to that key, at most :data:`MAX_DONATION_BYTES`); code 0 means accepted.

The plaintext (:func:`encode`) is the msgpack array ``[1, donor_node_id(20), model,
[[role, content], ...], [temperature, top_p, top_k, max_tokens, seed], signature(64)]``; the
signature is the donor's identity key's Ed25519 over :data:`DONATION_CONTEXT` followed by the
msgpack of ``[donor_node_id, model, messages, params]``.

Fire and forget: nothing here is ever shown as a chat error, blocks or slows a reply; failures
are logged (info). Donations still waiting for their delay when the process exits are dropped
(sending them at exit would time them to the last request).
"""

from __future__ import annotations

import base64
import logging
import math
import random
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import trio

from overlay import crypto
from overlay.identity import Identity, node_id_of, short_id
from overlay.messages import ChatMessage, SamplingParams

log = logging.getLogger("gentorrent.donate")

DONATION_VERSION = 1
DONATION_CONTEXT = b"gentorrent/donation/v1\x00"
MAX_DONATION_BYTES = 16 * 1024  # sealed
MAX_MESSAGES = 8  # an audit challenge's limit (verifier/audit/tx.py MAX_MESSAGES)
MAX_DELAY_S = 60.0
DEFAULT_RATE = 0.25
MAX_PENDING = 64  # donations waiting for their delay at once; more are skipped
KEY_PATH = "/audit/donate_key"
DONATE_PATH = "/audit/donate"
PRIVACY = ("the chosen verifier learns your node id, your IP address and the prompt (not the reply, nor which "
           "model node served you)")

Rpc = Callable[[str, str, dict[str, str]], Awaitable[Any]]  # overlay.committee.rpc_call's shape


class DonationError(Exception):
    """A donation could not be made or was refused; says why."""


def _pack(obj: object) -> bytes:
    out: bytes = msgpack.packb(obj, use_bin_type=True)
    return out


def messages_wire(messages: Sequence[ChatMessage]) -> list[list[str]]:
    return [[m.role, m.content] for m in messages]


def params_wire(p: SamplingParams) -> list[Any]:
    """``[temperature, top_p, top_k, max_tokens, seed]``, floats as floats (a gateway may hold ints)."""
    return [float(p.temperature), float(p.top_p), int(p.top_k), int(p.max_tokens),
            None if p.seed is None else int(p.seed)]


def signed_bytes(donor: bytes, model: str, messages: list[list[str]], params: list[Any]) -> bytes:
    """What the donor signs: :data:`DONATION_CONTEXT` || msgpack([donor, model, messages, params])."""
    return DONATION_CONTEXT + _pack([donor, model, messages, params])


def encode(identity: Identity, model: str, messages: Sequence[ChatMessage], params: SamplingParams) -> bytes:
    """The donation's plaintext, signed by ``identity`` (see the module docstring)."""
    donor = identity.node_id
    msgs, prm = messages_wire(messages), params_wire(params)
    signature = identity.sign(signed_bytes(donor, model, msgs, prm))
    return _pack([DONATION_VERSION, donor, model, msgs, prm, signature])


@dataclass(frozen=True, slots=True)
class Donation:
    """A decoded donation (:func:`decode`)."""

    donor: bytes
    model: str
    messages: tuple[ChatMessage, ...]
    params: SamplingParams
    signature: bytes

    def verify(self, ed25519_public: bytes) -> None:
        """:class:`DonationError` unless ``ed25519_public`` is the donor's key and signed this."""
        if len(ed25519_public) != 32 or node_id_of(ed25519_public) != self.donor:
            raise DonationError("the key is not the donor's")
        message = signed_bytes(self.donor, self.model, messages_wire(self.messages), params_wire(self.params))
        try:
            crypto.ed25519_verify(ed25519_public, self.signature, message)
        except crypto.CryptoError:
            raise DonationError("the donation's signature does not verify") from None


def decode(plaintext: bytes) -> Donation:
    """A donation's plaintext, decoded strictly (types exact, no trailing bytes); the signature is
    not checked here (:meth:`Donation.verify`). :class:`DonationError` if anything is off."""
    try:
        f = msgpack.unpackb(plaintext, raw=False, strict_map_key=True, max_map_len=0, max_ext_len=0,
                            max_array_len=MAX_MESSAGES + 8, max_str_len=MAX_DONATION_BYTES,
                            max_bin_len=MAX_DONATION_BYTES)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise DonationError(f"not strict msgpack ({type(exc).__name__})") from None
    if type(f) is not list or len(f) != 6 or f[0] != DONATION_VERSION or type(f[0]) is not int:
        raise DonationError(f"not a version {DONATION_VERSION} donation [1, donor, model, messages, params, signature]")
    _, donor, model, msgs, prm, signature = f
    if type(donor) is not bytes or len(donor) != 20 or type(model) is not str or type(signature) is not bytes \
            or len(signature) != 64:
        raise DonationError("bad donor id, model or signature")
    if type(msgs) is not list or not 1 <= len(msgs) <= MAX_MESSAGES or not all(
            type(m) is list and len(m) == 2 and type(m[0]) is str and type(m[1]) is str for m in msgs):
        raise DonationError(f"messages are 1 to {MAX_MESSAGES} [role, content] pairs")
    if type(prm) is not list or len(prm) != 5 or type(prm[0]) is not float or type(prm[1]) is not float \
            or type(prm[2]) is not int or type(prm[3]) is not int or not (prm[4] is None or type(prm[4]) is int):
        raise DonationError("params are [temperature, top_p, top_k, max_tokens, seed]")
    return Donation(donor, model, tuple(ChatMessage(r, c) for r, c in msgs),
                    SamplingParams(prm[0], prm[1], prm[2], prm[3], prm[4]), signature)


def fit(messages: Sequence[ChatMessage]) -> list[ChatMessage] | None:
    """The messages to donate: all of them when they fit a challenge (at most :data:`MAX_MESSAGES`),
    else a leading system prompt and the latest turns, starting at a user turn. ``None`` when the
    last message is not a non-empty user message (nothing an audit could send)."""
    if not messages or messages[-1].role != "user" or not messages[-1].content.strip():
        return None
    msgs = list(messages)
    if len(msgs) <= MAX_MESSAGES:
        return msgs
    head = msgs[:1] if msgs[0].role == "system" else []
    tail = msgs[len(msgs) - (MAX_MESSAGES - len(head)):]
    while len(tail) > 1 and tail[0].role != "user":
        tail = tail[1:]
    return head + tail


def seal(verifier_key: bytes, identity: Identity, model: str, messages: Sequence[ChatMessage],
         params: SamplingParams) -> bytes:
    """The sealed donation to ``verifier_key``: :func:`fit`'s messages, the oldest turns (after a
    system prompt) dropped until it is at most :data:`MAX_DONATION_BYTES`. :class:`DonationError`
    when nothing fits or the last message is not the user's."""
    msgs = fit(messages)
    if msgs is None:
        raise DonationError("the request's last message is not a user's: nothing to donate")
    first = 1 if msgs[0].role == "system" else 0
    while True:
        sealed = crypto.seal_to_ed25519(verifier_key, encode(identity, model, msgs, params))
        if len(sealed) <= MAX_DONATION_BYTES:
            return sealed
        rest = msgs[first + 1:]
        while rest and rest[0].role != "user":
            rest = rest[1:]
        if not rest:
            raise DonationError(f"the prompt is longer than a donation holds ({MAX_DONATION_BYTES} bytes sealed)")
        msgs = msgs[:first] + rest


async def abci_query(rpc: Rpc, address: str, path: str, data: bytes = b"") -> bytes:
    """``abci_query path [data]`` on ``address``: the value; :class:`DonationError` for a non-zero
    code (with the verifier's log) or an answer that is not CometBFT's."""
    params = {"path": f'"{path}"'}
    if data:
        params["data"] = "0x" + data.hex()
    res = await rpc(address, "abci_query", params)
    try:
        resp = res["response"]
        code = int(resp.get("code", 0))
        value = base64.b64decode(resp.get("value") or "", validate=True)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise DonationError(f"{address} answered abci_query {path} oddly ({type(exc).__name__})") from None
    if code:
        raise DonationError(f"{address} answered {path} with code {code}: {str(resp.get('log', ''))[:200]}")
    return value


class Donor:
    """Donates prompts after replies (see the module docstring).

    ``addresses``: the committee's RPC addresses (``--committee``); ``validators()``: the
    validator keys the node holds now (the genesis set, or the committee's signed lists' latest).
    ``rpc`` (default :func:`overlay.committee.rpc_call`) and ``rng`` (default
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
            from overlay.committee import rpc_call

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

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the donations waiting for their delay until cancelled (they are dropped then)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._nursery = None
                if self.pending:
                    log.debug("donate: %d donation(s) still waiting for their delay dropped at exit", self.pending)

    def offer(self, model: str, messages: Sequence[ChatMessage], params: SamplingParams) -> bool:
        """After a complete reply to ``messages``: with probability :attr:`rate`, donate them
        :attr:`max_delay`-random seconds from now. Whether one was scheduled; never raises."""
        self.offered += 1
        try:
            if self._nursery is None or self.rng.random() >= self.rate:
                return False
            if self.pending >= MAX_PENDING:
                log.info("donate: %d donations are waiting already; this prompt is not donated", self.pending)
                return False
            self.pending += 1
            self.scheduled += 1
            self._nursery.start_soon(self._later, model, tuple(messages), params,
                                     self.rng.uniform(0.0, self.max_delay))
            return True
        except Exception as exc:  # noqa: BLE001 - a donation never disturbs a chat
            log.info("donate: not scheduled: %s", exc)
            return False

    async def _later(self, model: str, messages: tuple[ChatMessage, ...], params: SamplingParams,
                     delay: float) -> None:
        try:
            await trio.sleep(delay)
            address = await self.donate(model, messages, params)
        except Exception as exc:  # noqa: BLE001 - fire and forget: logged, never raised
            self.failed += 1
            log.info("donate: the prompt was not donated: %s", exc)
        else:
            self.donated += 1
            log.info("donate: a prompt was donated to the verifier at %s", address)
        finally:
            self.pending -= 1

    async def donate(self, model: str, messages: Sequence[ChatMessage], params: SamplingParams) -> str:
        """Donate now to one verifier chosen uniformly at random; its address. Raises
        :class:`DonationError` (or the RPC's errors: ``OSError``, ``overlay.committee.ListError``)."""
        address = self.rng.choice(self.addresses)
        key = await abci_query(self.rpc, address, KEY_PATH)
        if len(key) != 32 or key not in set(self.validators()):
            raise DonationError(f"{address} answered a donation key ({key.hex()[:16] or 'empty'}) that is not one of "
                                "the committee's validator keys this node holds")
        sealed = seal(key, self.identity, model, messages, params)
        await abci_query(self.rpc, address, DONATE_PATH, sealed)
        log.debug("donate: %s (%s) accepted %d sealed bytes for %s", address, short_id(key), len(sealed), model)
        return address
