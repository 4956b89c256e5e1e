"""A user's usage-quota tokens (issue 31, decision 0017): fetched blind from the committee's
issuers and handed to each request (:attr:`overlay.anon.client.AnonClient.quota`).

The wallet keeps, per model, the tokens of the current quota epoch (and spends those left of the
epoch before first, while they still redeem in its grace). When it holds none it asks
``issuers`` verifiers (the committee's :class:`~overlay.directory.quota.QuotaParams`) for a batch
of at most what their allowances hold now (:class:`~overlay.directory.quota.Allowance`, which the
wallet follows from what each issuer said, decision 0018), and at most what they would grow back
by before the batch's tokens stop redeeming (a token lost unspent is a token the bucket lacks):
the same fresh nonces, blinded anew for each issuer (:class:`~overlay.directory.quota.Blinding`),
in a request signed by this node's key, so each issuer counts the batch against this user's
budget and none sees a nonce. Each issuer's answer is checked against the key it signed and
published for the model and epoch (its key record, fetched from every verifier once an epoch);
a token carries the outputs of all of them. A failed or refusing issuer is replaced by another
for the same nonces. When fewer than ``issuers`` issuers have a token to give now, the wallet
waits for them up to ``max_wait`` seconds (the allowances fill by the second); past that the
model's quota is used up for now: :meth:`Wallet.token` raises
:class:`~overlay.anon.client.QuotaExhausted` with the time the next token can be had. When no
issuer can be reached, or the committee issues no tokens (its
genesis has no quota section: every verifier answers ``QUOTA_OFF``), a request goes without a
token: model nodes then serve it after requests that carry one.

**Classes** (decision 0022): while the allowances of the issuers asked hold priority tokens (the
top ``priority`` of their buckets), the wallet asks for priority tokens, at most that many; when
none holds one, for one standard token at a time (so the top refills as soon as the user slows
down). Model nodes serve priority tokens first, then standard ones, then requests without.

What the issuers learn: that this registered user took a batch of this size and class for this
model at this time; not the nonces, so not which requests later spend them.

With a ``store`` (``DATA_DIR/quota_tokens.bin``, mode 0600: tokens are bearer values) the unspent
tokens of the current epoch (and those of the epoch before, spent first while they redeem) and each
issuer's allowance as the wallet follows it outlive the
process, so that ``user chat --prompt`` runs close together spend one batch instead of fetching a
new one each time. A token handed to a request is removed from the store before the request is
sent.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import trio

from overlay.anon.client import QuotaExhausted
from overlay.directory import quota
from overlay.directory.registration import Code
from overlay.directory.rpc import Answer, Rpc, RpcError, abci_query
from overlay.wire.clock import Clock, TrioClock
from overlay.wire.identity import Identity, write_private

log = logging.getLogger("gentorrent.quota")

BATCH = 16  # tokens fetched at once
RPC_TIMEOUT = 5.0  # seconds for one verifier's answer
OFF_RECHECK_S = 300.0  # a committee that issues no tokens is asked again after this long
MAX_WAIT_S = 15.0  # the longest a request waits for the issuers' allowances to fill before QuotaExhausted
CARRY_MARGIN_S = 5.0  # the epoch before's tokens are spent until this long before its grace ends
STORE_VERSION = 3
MAX_STORE_BYTES = 4 * 1024 * 1024


@dataclass
class _Stock:
    """One model's tokens of one epoch, and what the issuers said."""

    epoch: int
    params: quota.QuotaParams
    records: dict[str, quota.KeyRecord]  # address -> the issuer's verified key record
    tokens: list[bytes] = field(default_factory=list)
    failed: set[str] = field(default_factory=set)  # addresses that failed or refused this epoch: not asked again
    carried: list[bytes] = field(default_factory=list)  # the epoch before's tokens, spent first within its grace
    later: dict[str, float] = field(default_factory=dict)  # address -> not asked before (it answered QUOTA_LATER)


class Wallet:
    """Quota tokens for this user node (module docstring). ``addresses``: the verifiers' RPC
    addresses (a callable: membership may change them); ``validators``: the committee's validator
    keys now (a key record from anyone else is ignored); ``rpc``/``clock``/``rng`` injectable."""

    def __init__(self, identity: Identity, addresses: Callable[[], Sequence[str]], chain_id: str,
                 validators: Callable[[], Sequence[bytes]], *, rpc: Rpc | None = None, clock: Clock | None = None,
                 batch: int = BATCH, rpc_timeout: float = RPC_TIMEOUT, rng: random.Random | None = None,
                 send_when_used_up: bool = False, store: Path | None = None, max_wait: float = MAX_WAIT_S) -> None:
        if not 1 <= batch <= quota.MAX_BATCH:
            raise ValueError(f"batch must be within 1..{quota.MAX_BATCH}")
        self.identity, self.addresses, self.chain_id, self.validators = identity, addresses, chain_id, validators
        self.rpc, self.clock, self.batch, self.rpc_timeout = rpc, clock or TrioClock(), batch, rpc_timeout
        self.rng = rng or random.Random()
        # a verifier's audit user: a used-up quota sends challenges without a token rather than not at
        # all (an unsent challenge would count against the node, not against the verifier)
        self.send_when_used_up = send_when_used_up
        self.max_wait = max_wait
        self._full_at: dict[tuple[str, bytes], float] = {}  # (model, issuer) -> its Allowance's full_at, as followed
        self._stock: dict[str, _Stock] = {}
        self._locks: dict[str, trio.Lock] = {}
        self._writing = trio.Lock()  # one write of the store at a time
        self._params = quota.QuotaParams()  # the last the committee published (epoch length for the first ask)
        self._off_until = -1.0
        self.fetched = 0  # tokens obtained
        self.spent = 0  # tokens handed out
        self.store = store
        self._saved = self._load()  # model -> (epoch, tokens, carried, full_at by issuer key) from an earlier run

    async def token(self, model: str) -> bytes:
        """A token for one request to ``model`` (empty: none to be had, send without), waiting up
        to ``max_wait`` s for the issuers' allowances to fill; :class:`QuotaExhausted` when no token
        can be had within that (it says when one can)."""
        lock = self._locks.setdefault(model, trio.Lock())
        async with lock:
            for _ in range(3):  # a wait may cross into the next epoch: its stock is fetched then
                stock = await self._current(model)
                if stock is None:
                    return b""
                if stock.carried and not stock.params.redeemable(stock.epoch - 1, self.clock.unix() + CARRY_MARGIN_S):
                    stock.carried.clear()  # too close to the grace's end to reach a model node in time
                if not stock.tokens and not stock.carried:
                    await self._fill(model, stock)
                if stock.tokens or stock.carried:
                    self.spent += 1
                    token = (stock.carried or stock.tokens).pop()
                    await self._save()
                    return token
                now = self.clock.unix()
                ready = self._ready_at(model, stock, now)
                if ready is None or self.send_when_used_up:
                    return b""  # issuers failed (best effort without a token), or an audit user: send without
                if ready - now > self.max_wait:
                    raise QuotaExhausted(
                        f"your quota of {model!r} is spent for now: the next token can be had in {ready - now:.0f} s "
                        f"(each of {len(stock.records)} issuers gives you {stock.params.tokens} every "
                        f"{stock.params.epoch_s} s, {stock.params.burst} at most at once, and a request takes "
                        f"{stock.params.issuers})", ready, ready - now)
                await trio.sleep(ready - now)
            return b""

    async def _current(self, model: str) -> _Stock | None:
        """The stock of ``model`` for the epoch now (its key records fetched when new); None when
        quotas are off or no issuer answered."""
        now = self.clock.unix()
        if now < self._off_until:
            return None
        stock = self._stock.get(model)
        if stock is None or stock.epoch != stock.params.epoch_at(now):
            old = stock
            stock = await self._new_stock(model, now)
            if stock is None:
                return None
            if old is not None and old.epoch == stock.epoch - 1:  # unspent tokens still redeem in the grace
                stock.carried = old.tokens
            self._stock[model] = stock
        return stock

    def _allowance(self, model: str, issuer: bytes, params: quota.QuotaParams) -> quota.Allowance:
        """This user's allowance of ``model`` at ``issuer`` as the wallet follows it."""
        return quota.Allowance(params, self._full_at.get((model, issuer), 0.0))

    def _usable(self, allowance: quota.Allowance, now: float) -> int:
        """How many tokens of some class this wallet would take from ``allowance`` now: all it holds
        (priority ones first, then standard ones)."""
        return allowance.level(now)

    def _candidates(self, model: str, stock: _Stock, now: float) -> list[str]:
        """The addresses that may be asked now for at least one token, those that hold priority
        tokens first."""
        out = [a for a, r in stock.records.items() if a not in stock.failed and stock.later.get(a, 0.0) <= now
               and self._usable(self._allowance(model, r.issuer, stock.params), now) > 0]
        self.rng.shuffle(out)
        return sorted(out, key=lambda a: self._allowance(model, stock.records[a].issuer, stock.params).top(now) == 0)

    def _ready_at(self, model: str, stock: _Stock, now: float) -> float | None:
        """When ``params.issuers`` issuers can give a token (None: fewer than that still answer)."""
        times = sorted(max(stock.later.get(a, now), self._ready(self._allowance(model, r.issuer, stock.params), now))
                       for a, r in stock.records.items() if a not in stock.failed)
        need = stock.params.issuers
        return times[need - 1] if len(times) >= need else None

    def _ready(self, allowance: quota.Allowance, now: float) -> float:
        """When :meth:`_usable` of ``allowance`` is 1 or more."""
        return allowance.ready_at(1, now)

    # ------------------------------------------------------------------ key records

    async def _new_stock(self, model: str, now: float) -> _Stock | None:
        """The verified key records of ``model`` for the epoch at ``now`` (asked again once if the
        committee's epoch length is not the one assumed: an issuer asked for another epoch than
        its current one answers WRONG_EPOCH with its current record, whose params say the length);
        None when quotas are off or no issuer answered."""
        for _ in range(2):
            epoch = self._params.epoch_at(now)
            records, off = await self._records(model, epoch)
            if not records:
                if off:
                    log.info("the committee issues no quota tokens; requests go without")
                    self._off_until = now + OFF_RECHECK_S
                else:
                    log.warning("no verifier answered for quota keys of %r; the request goes without a token", model)
                return None
            params = _agreed(records)
            if params.epoch_at(now) == epoch:
                self._params = params
                stock = _Stock(epoch, params, {a: r for a, r in records.items()
                                               if r.params == params and r.epoch == epoch})
                saved = self._saved.pop(model, None)
                if saved is not None:  # an earlier run's allowances, and its tokens that still redeem
                    for issuer, full_at in saved[3].items():
                        self._full_at.setdefault((model, issuer), full_at)
                    if saved[0] == epoch:
                        stock.tokens, stock.carried = list(saved[1]), list(saved[2])
                    elif saved[0] == epoch - 1:  # the epoch before's tokens, spent first within its grace
                        stock.carried = list(saved[1])
                return stock
            self._params = params
        return None

    async def _records(self, model: str, epoch: int) -> tuple[dict[str, quota.KeyRecord], bool]:
        """``(address -> key record, every verifier answered QUOTA_OFF)``."""
        addresses = list(self.addresses())
        found: dict[str, quota.KeyRecord] = {}
        off: list[str] = []
        keys = set(self.validators())
        data = quota.encode_key_query(model, epoch)

        async def ask(address: str) -> None:
            with trio.move_on_after(self.rpc_timeout):
                answer = await self._query(address, quota.KEY_PATH, data, "quota key")
                if answer is None:
                    return
                if answer.code == Code.QUOTA_OFF:
                    off.append(address)
                    return
                if answer.code == Code.WRONG_EPOCH and answer.value:
                    pass  # the issuer's current epoch's record: its params say the epoch length
                elif answer.code:
                    log.info("quota key from %s refused: code %d %s", address, answer.code, answer.log[:200])
                    return
                try:
                    rec = quota.checked_key_record(answer.value, self.chain_id, model, keys)
                except quota.QuotaError as exc:
                    log.warning("quota key from %s refused: %s", address, exc.reason)
                    return
                if any(r.issuer == rec.issuer for r in found.values()):
                    return  # the same verifier under two addresses counts once
                found[address] = rec

        async with trio.open_nursery() as nursery:
            for a in addresses:
                nursery.start_soon(ask, a)
        return found, bool(addresses) and len(off) == len(addresses)

    async def _query(self, address: str, path: str, data: bytes, what: str) -> Answer | None:
        """``abci_query``'s answer, whatever its code; None (logged) when the verifier cannot be asked."""
        try:
            return await abci_query(address, path, data, rpc=self.rpc)
        except (RpcError, OSError) as exc:
            log.info("%s from %s: %s", what, address, exc)
            return None

    # ------------------------------------------------------------------ issuance

    async def _fill(self, model: str, stock: _Stock) -> None:
        """One batch from ``params.issuers`` issuers whose allowances hold a token now: priority
        tokens, as many as the least of them holds at its top (at most ``batch``), when each holds
        one there, else one standard token; replacing any issuer that fails."""
        need, now = stock.params.issuers, self.clock.unix()
        candidates = self._candidates(model, stock, now)
        if len(candidates) < need:
            return
        # no more than the allowances hold, nor than they would grow back by before these tokens stop
        # redeeming: a token not spent by then is lost, and taking it emptied the bucket for nothing
        p = stock.params
        usable_s = p.refills_at(stock.epoch) + p.grace_s - CARRY_MARGIN_S - now
        top = min(self._allowance(model, stock.records[a].issuer, p).top(now) for a in candidates[:need])
        priority = top > 0
        n = min(self.batch, max(1, math.ceil(usable_s / p.per_token_s)), top) if priority else 1
        nonces = quota.new_nonces(n)
        outputs: dict[bytes, list[bytes]] = {}
        while len(outputs) < need and candidates:
            take = candidates[:need - len(outputs)]
            del candidates[:len(take)]
            results: dict[str, list[bytes] | None] = {}
            async with trio.open_nursery() as nursery:
                for a in take:
                    nursery.start_soon(self._issue, a, stock, model, nonces, priority, results)
            for a in take:
                got = results.get(a)
                if got is not None:
                    outputs[stock.records[a].issuer] = got
        if len(outputs) < need:
            return  # what the issuers that answered took from their allowances is lost with this batch
        issuers = sorted(outputs)
        stock.tokens.extend(quota.encode_token(quota.Token(model, stock.epoch, nonce, tuple(
            (i, outputs[i][j]) for i in issuers), priority)) for j, nonce in enumerate(nonces))
        self.fetched += len(nonces)
        await self._save()

    # ------------------------------------------------------------------ the store

    def _load(self) -> dict[str, tuple[int, list[bytes], list[bytes], dict[bytes, float]]]:
        """The store's content; nothing (and a warning) when it is missing, unreadable or not in
        this format (the tokens in it are then lost, nothing else)."""
        if self.store is None:
            return {}
        try:
            raw = self.store.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            log.warning("cannot read the quota tokens in %s: %s", self.store, exc)
            return {}
        try:
            if len(raw) > MAX_STORE_BYTES:
                raise ValueError("too large")
            version, models = msgpack.unpackb(raw, raw=False, strict_map_key=False)
            if version != STORE_VERSION:
                raise ValueError(f"version {version!r}")
            out = {}
            for model, (epoch, tokens, carried, full_at) in models.items():
                if not (isinstance(model, str) and type(epoch) is int
                        and all(type(t) is bytes for t in [*tokens, *carried])
                        and all(type(k) is bytes and type(v) is float for k, v in full_at.items())):
                    raise ValueError("odd values")
                out[model] = (epoch, list(tokens), list(carried), dict(full_at))
            return out
        except (ValueError, TypeError, AttributeError, msgpack.UnpackException) as exc:
            log.warning("the quota tokens in %s are not readable (%s); starting without them", self.store, exc)
            return {}

    async def _save(self) -> None:
        """Write the store (its bytes made here; the fsynced write in a worker thread, one at a time:
        ``write_private`` writes through one temporary file)."""
        if self.store is None:
            return
        models: dict[str, list[Any]] = {m: list(saved) for m, saved in self._saved.items()}  # not asked yet
        models.update({m: [s.epoch, s.tokens, s.carried, {i: t for (mm, i), t in self._full_at.items() if mm == m}]
                       for m, s in self._stock.items()})
        raw = msgpack.packb([STORE_VERSION, models], use_bin_type=True)
        async with self._writing:
            try:
                await trio.to_thread.run_sync(write_private, self.store, raw)
            except OSError as exc:
                log.warning("cannot save the quota tokens in %s: %s", self.store, exc)

    async def _issue(self, address: str, stock: _Stock, model: str, nonces: list[bytes], priority: bool,
                     results: dict[str, list[bytes] | None]) -> None:
        rec = stock.records[address]
        blinding = quota.Blinding(nonces)
        raw = quota.encode_issue(self.identity, self.chain_id, quota.IssueRequest(
            self.identity.node_id, rec.issuer, model, stock.epoch, blinding.blinded, priority=priority))
        results[address] = None
        with trio.move_on_after(self.rpc_timeout):
            answer = await self._query(address, quota.ISSUE_PATH, raw, "quota tokens")
            if answer is None:
                return
            if answer.code == Code.QUOTA_LATER:  # its clock or its count is ahead of this wallet's: ask it later
                stock.later[address] = self.clock.unix() + stock.params.per_token_s
                return
            if answer.code:
                log.warning("quota tokens from %s refused: code %d %s", address, answer.code, answer.log[:200])
                stock.failed.add(address)  # not asked again this epoch
                return
            try:
                issued = quota.decode_issued(answer.value)
                results[address] = blinding.finalize(issued, rec.key_of(priority))
            except quota.QuotaError as exc:
                log.warning("quota tokens from %s refused: %s", address, exc.reason)
                stock.failed.add(address)
                return
            # follow the issuer's count: after this batch its allowance holds issued.left
            now = self.clock.unix()
            self._full_at[(model, rec.issuer)] = now + (stock.params.burst - issued.left) * stock.params.per_token_s


STORE_FILE = "quota_tokens.bin"


def member_wallet(identity: Identity, member: Any, *, send_when_used_up: bool = False,
                  data_dir: Path | None = None) -> Wallet:
    """The wallet of a node that is a committee member (:class:`overlay.directory.membership.Membership`):
    its verifiers, chain and validator keys, as the membership holds them now; its tokens kept in
    ``data_dir`` (:data:`STORE_FILE`) when given."""
    return Wallet(identity, lambda: member.settings.addresses, member.settings.chain_id,
                  lambda: [v.public_key for v in member.client.validators], rpc=member.rpc,
                  send_when_used_up=send_when_used_up, store=None if data_dir is None else data_dir / STORE_FILE)


def _agreed(records: dict[str, quota.KeyRecord]) -> quota.QuotaParams:
    """The params most key records carry (every honest verifier's are the genesis's)."""
    counts: dict[quota.QuotaParams, int] = {}
    for r in records.values():
        counts[r.params] = counts.get(r.params, 0) + 1
    return max(counts, key=lambda p: counts[p])
