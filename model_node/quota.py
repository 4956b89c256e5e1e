"""A model node's side of anonymous usage quotas (issue 31, decisions 0017 and 0022): is a request's
token good, and spend it.

A request may carry a token (``Request.quota``, inside its sealed clove: :mod:`overlay.directory.quota`
has the format): a nonce and the VOPRF outputs of ``issuers`` distinct verifiers for it. The node
that serves the request redeems it by asking each of those issuers over its CometBFT RPC
(``abci_query`` :data:`~overlay.directory.quota.REDEEM_PATH`); an issuer recomputes the output,
compares, and records the nonce as spent. The spent sets live at the issuers: every node of a
group redeems at the same issuers, so a token spends once across all of them. The outcome is a
:class:`Verdict`:

- ``TOKENED``: every issuer said yes (and spent it now): the request is served by its token's
  class (:func:`token_rank`, :mod:`model_node.priority`): a priority token's ahead of a standard
  one's, and both ahead of requests without one. The class is proved, not claimed: each issuer
  recomputes the output under the key of the class the token names (decision 0022), so a standard
  token relabelled priority is not valid there (``REFUSED``).
- ``REFUSED``: the token is bad (garbage, another model's, an epoch not redeemable now, too few
  distinct issuers, an issuer that is not a verifier of the committee) or an issuer says it is
  spent or not valid: the node answers an error (``quota token refused: <why>``) before any engine
  work. The user's client does not send a bad token by mistake, so this is final.
- ``UNCHECKED``: the node could not tell (issuers unreachable or too slow, quotas off at the
  committee, an issuer's key record not to be had): the request is served best-effort, as one
  without a token. A user loses priority, never service, when the committee is unreachable.

Local checks come first and cost no RPC (:func:`parse`, :func:`screen_token`): a garbage token
costs the node a msgpack decode. Which issuer is which verifier, and the committee's
:class:`~overlay.directory.quota.QuotaParams`, come from each RPC address's key record
(:data:`~overlay.directory.quota.KEY_PATH`, signed by the verifier's validator key), fetched once
per address and again, at most every ``refetch`` seconds, when a token names an issuer not known
here or a fetch failed; an address that answers ``QUOTA_OFF`` has quotas off (asked again after
:data:`OFF_RECHECK_S`). :class:`Redeemer` is the driver: the RPCs (to the token's issuers at once,
under one timeout), the cache, the counters; :func:`judge` turns the issuers' answers into the verdict.
"""

from __future__ import annotations

import enum
import logging
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

import trio

from model_node.priority import PRIORITY, STANDARD
from overlay.anon.responder import TOKEN_REFUSAL, TOKEN_SPENT
from overlay.directory import quota
from overlay.directory.quota import QuotaError, QuotaParams, Token
from overlay.directory.registration import Code
from overlay.directory.rpc import Answer, Rpc, RpcError, abci_query
from overlay.wire.clock import Clock, TrioClock
from overlay.wire.failures import Failure

log = logging.getLogger("gentorrent.model.quota")

TIMEOUT_S = 2.0  # seconds for the issuers' answers (``--quota-timeout``)
REFETCH_S = 5.0  # an address's key record is asked again at most this often
OFF_RECHECK_S = 60.0  # an address that said quotas are off is asked again after this


class Kind(enum.Enum):
    TOKENED = "tokened"
    REFUSED = "refused"
    UNCHECKED = "unchecked"


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the node makes of a token: its :class:`Kind` and, unless tokened, why."""

    kind: Kind
    reason: str = ""
    spent: bool = False  # refused because an issuer says it was redeemed before

    @property
    def tokened(self) -> bool:
        return self.kind is Kind.TOKENED

    @property
    def refused(self) -> bool:
        return self.kind is Kind.REFUSED

    def error(self) -> str:
        """The words of a refused token's error chunk."""
        return TOKEN_REFUSAL + self.reason

    @property
    def failure(self) -> Failure:
        """A refused token's error chunk's code: ``SPENT`` (the client may ask again with a fresh
        token) or ``INVALID``."""
        return Failure.SPENT if self.spent else Failure.INVALID


TOKENED = Verdict(Kind.TOKENED)


def token_rank(token: Token) -> int:
    """The rank (:mod:`model_node.priority`) a request has once ``token`` is redeemed: its class's."""
    return PRIORITY if token.priority else STANDARD


def _refused(reason: str, spent: bool = False) -> Verdict:
    return Verdict(Kind.REFUSED, reason, spent)


def _unchecked(reason: str) -> Verdict:
    return Verdict(Kind.UNCHECKED, reason)


def _short(key: bytes) -> str:
    return key.hex()[:8]


# --------------------------------------------------------------------------- the pure checks

def parse(raw: bytes, model: str) -> Token | Verdict:
    """``raw`` as a token for ``model``, or why it is refused (not a token; another model's)."""
    try:
        token = quota.decode_token(raw)
    except QuotaError as exc:
        return _refused(f"not a quota token ({exc.reason})")
    if token.model != model:
        return _refused(f"it is for model {token.model!r}; this node serves {model!r}")
    return token


def screen_token(token: Token, params: QuotaParams, issuers: Collection[bytes], complete: bool,
                 now: float) -> Verdict | None:
    """Why ``token`` cannot be redeemed at Unix time ``now`` under ``params``, given the issuer
    keys known here (``complete``: every verifier's is), or ``None``: ask its issuers."""
    if not params.redeemable(token.epoch, now):
        return _refused(f"its quota epoch {token.epoch} is not redeemable now (the current epoch is "
                        f"{params.epoch_at(now)}, and a token redeems within its epoch and {params.grace_s} s after)")
    if len(token.evaluations) < params.issuers:
        return _refused(f"it carries {len(token.evaluations)} issuer(s)' evaluations; the committee asks for "
                        f"{params.issuers} distinct issuers")
    unknown = [i for i, _ in token.evaluations if i not in issuers]
    if unknown and complete:
        return _refused(f"issuer {_short(unknown[0])} is not a verifier of this committee")
    if unknown:
        return _unchecked(f"issuer {_short(unknown[0])} is not known here (a verifier's key record could not be had)")
    return None


def judge(issuers: Sequence[bytes], answers: Mapping[bytes, Answer | str]) -> Verdict:
    """The verdict on a token from its ``issuers``' answers to its redemption (an
    :class:`~overlay.directory.rpc.Answer`, or why there is none; a missing one: no answer in
    time). Any issuer saying spent or not valid refuses it; all saying yes make it tokened;
    anything else leaves it unchecked."""
    unclear: list[str] = []
    for issuer in issuers:
        got = answers.get(issuer, "no answer in time")
        if isinstance(got, str):
            unclear.append(f"issuer {_short(issuer)}: {got}")
        elif got.code == Code.SPENT:
            return _refused(f"{TOKEN_SPENT} (issuer {_short(issuer)})", spent=True)
        elif got.code == Code.BAD_TOKEN:
            return _refused(f"issuer {_short(issuer)} says it is not valid ({got.log[:200]})")
        elif got.code == Code.QUOTA_OFF:
            unclear.append(f"issuer {_short(issuer)} has quotas off")
        elif got.code != Code.OK:
            unclear.append(f"issuer {_short(issuer)} answered code {got.code} ({got.log[:200]})")
    return _unchecked("; ".join(unclear)) if unclear else TOKENED


# --------------------------------------------------------------------------- the driver

@dataclass(slots=True)
class _Address:
    """What one verifier RPC address said of itself: its issuer key and the committee's params
    (``None`` until a key record verified), or ``off``; and when it was last asked (monotonic)."""

    issuer: bytes | None = None
    params: QuotaParams | None = None
    off: bool = False
    asked: float = float("-inf")


class Redeemer:
    """Checks and redeems tokens for a node serving ``model`` (see the module docstring).

    ``addresses()``: the committee's verifier RPC addresses now (the node's membership's).
    ``chain_id``: the committee's (key records are signed for it). ``validators()``, if given: the
    committee's validator keys; a key record from any other key is not taken. ``rpc`` (default:
    the real one), ``clock`` (default: trio's; ``unix()`` judges epochs, ``monotonic()`` the
    refetches), ``timeout``: seconds the issuers have to answer. :attr:`counts` counts the
    verdicts the node acted on (:meth:`count`), by :class:`Kind` value."""

    def __init__(self, model: str, addresses: Callable[[], Sequence[str]], chain_id: str, *,
                 validators: Callable[[], Collection[bytes]] | None = None, rpc: Rpc | None = None,
                 clock: Clock | None = None, timeout: float = TIMEOUT_S, refetch: float = REFETCH_S) -> None:
        if not timeout > 0:
            raise ValueError(f"the quota timeout must be above 0 seconds, got {timeout}")
        self.model = model
        self.addresses = addresses
        self.chain_id = chain_id
        self.validators = validators
        self.rpc = rpc
        self.clock: Clock = clock or TrioClock()
        self.timeout = timeout
        self.refetch = refetch
        self.counts: Counter[str] = Counter()
        self._known: dict[str, _Address] = {}
        self._learning: trio.Event | None = None

    @property
    def tokened(self) -> int:
        return self.counts[Kind.TOKENED.value]

    @property
    def refused(self) -> int:
        return self.counts[Kind.REFUSED.value]

    @property
    def unchecked(self) -> int:
        return self.counts[Kind.UNCHECKED.value]

    def count(self, verdict: Verdict) -> None:
        """Count a verdict the node acted on (an unchecked one is logged at info)."""
        self.counts[verdict.kind.value] += 1
        if verdict.kind is Kind.UNCHECKED:
            log.info("quota token not checked (%s): served best-effort, without priority", verdict.reason)

    async def check(self, raw: bytes) -> Verdict:
        """:meth:`screen` then :meth:`redeem`: the verdict on ``raw`` (counted)."""
        got = await self.screen(raw)
        verdict = got if isinstance(got, Verdict) else await self.redeem(got)
        self.count(verdict)
        return verdict

    async def screen(self, raw: bytes) -> Token | Verdict:
        """The local checks: the token, ready for :meth:`redeem`, or the verdict without
        asking its issuers. RPCs only for key records (see the module docstring), never for a
        token that does not decode or is another model's."""
        token = parse(raw, self.model)
        if isinstance(token, Verdict):
            return token
        params = self._params()
        if params is not None:  # what can be refused with what is known, before any RPC
            why = screen_token(token, params, self._issuers(), complete=False, now=self.clock.unix())
            if why is not None and why.refused:
                return why
        await self._learn({i for i, _ in token.evaluations}, token.epoch)
        params = self._params()
        if params is None:
            held = self._held().values()
            off = bool(held) and all(a.off for a in held)
            return _unchecked("quotas are off at the committee" if off else "no verifier's quota key record could be had")
        why = screen_token(token, params, self._issuers(), self._complete(), self.clock.unix())
        return why if why is not None else token

    async def redeem(self, token: Token) -> Verdict:
        """Ask each of ``token``'s issuers to spend it, at once, within :attr:`timeout`."""
        where = {a.issuer: address for address, a in self._known.items() if a.issuer is not None}
        answers: dict[bytes, Answer | str] = {}

        async def ask(issuer: bytes, address: str) -> None:
            try:
                answers[issuer] = await abci_query(address, quota.REDEEM_PATH, token.redeem(issuer), rpc=self.rpc)
            except (OSError, RpcError) as exc:
                answers[issuer] = f"{address} unreachable ({type(exc).__name__}: {exc})"

        issuers = [i for i, _ in token.evaluations]
        with trio.move_on_after(self.timeout):
            async with trio.open_nursery() as nursery:
                for issuer in issuers:
                    if issuer in where:
                        nursery.start_soon(ask, issuer, where[issuer])
                    else:  # its address left the committee's list since screening
                        answers[issuer] = "its address is no longer listed"
        return judge(issuers, answers)

    async def prefetch(self) -> None:
        """Learn every address's issuer and the params now (a node starting), not at its first token."""
        await self._learn(set(), None)

    # ------------------------------------------------------------------ key records

    def _held(self) -> dict[str, _Address]:
        """The current addresses and what each said (addresses no longer listed are forgotten)."""
        now = list(self.addresses())
        for gone in set(self._known) - set(now):
            del self._known[gone]
        return {a: self._known.setdefault(a, _Address()) for a in now}

    def _issuers(self) -> set[bytes]:
        return {a.issuer for a in self._held().values() if a.issuer is not None}

    def _complete(self) -> bool:
        """Every current address's issuer is known."""
        return all(a.issuer is not None for a in self._held().values())

    def _params(self) -> QuotaParams | None:
        """The committee's params, as most addresses' key records carry them."""
        seen = Counter(a.params for a in self._held().values() if a.params is not None)
        return seen.most_common(1)[0][0] if seen else None

    def _due(self, wanted: set[bytes], now: float) -> list[str]:
        """The addresses whose key record to ask for now: never asked, or (not since
        :attr:`refetch` seconds, or :data:`OFF_RECHECK_S` for one with quotas off) with no issuer
        known or when ``wanted`` names an issuer not known."""
        missing = bool(wanted - self._issuers())
        due = []
        for address, a in self._held().items():
            wait = OFF_RECHECK_S if a.off else self.refetch
            if a.asked == float("-inf") or (now - a.asked >= wait and (a.issuer is None or missing)):
                due.append(address)
        return due

    async def _learn(self, wanted: set[bytes], hint: int | None) -> None:
        """Fetch the key records due (see :meth:`_due`), all at once within :attr:`timeout`; a
        fetch already under way is waited for instead. A verifier gives the records of the epochs
        around its current one only: the current epoch by the params once known, else the epoch
        ``hint`` (a token's: its user had it issued lately), else by the default params."""
        if self._learning is not None:
            with trio.move_on_after(self.timeout):
                await self._learning.wait()
            return
        due = self._due(wanted, self.clock.monotonic())
        if not due:
            return
        self._learning = done = trio.Event()
        try:
            epoch = self._epoch_to_ask(hint)
            with trio.move_on_after(self.timeout):
                async with trio.open_nursery() as nursery:
                    for address in due:
                        self._known[address].asked = self.clock.monotonic()
                        nursery.start_soon(self._fetch, address, epoch)
        finally:
            self._learning = None
            done.set()

    def _epoch_to_ask(self, hint: int | None) -> int:
        params = self._params()
        if params is not None:
            return params.epoch_at(self.clock.unix())
        return hint if hint is not None else QuotaParams().epoch_at(self.clock.unix())

    async def _fetch(self, address: str, epoch: int) -> None:
        try:
            answer = await abci_query(address, quota.KEY_PATH, quota.encode_key_query(self.model, epoch), rpc=self.rpc)
        except (OSError, RpcError) as exc:
            log.info("quota key record of %s not had: %s", address, exc)
            return
        state = self._known.get(address)
        if state is None:  # no longer listed
            return
        state.off = answer.code == Code.QUOTA_OFF
        if state.off:
            state.issuer = state.params = None
            return
        if answer.code and not (answer.code == Code.WRONG_EPOCH and answer.value):  # what it said before stands
            log.info("quota key record of %s refused: code %d (%s)", address, answer.code, answer.log[:200])
            return
        try:
            rec = quota.checked_key_record(answer.value, self.chain_id, self.model,
                                           None if self.validators is None else self.validators())
        except QuotaError as exc:
            log.warning("the quota key record %s answered is not usable: %s", address, exc.reason)
            return
        # a WRONG_EPOCH answer carries the issuer's current record (its params say the epoch length): as good here
        state.issuer, state.params = rec.issuer, rec.params
