"""A user's usage-quota tokens (issue 31, decision 0017): fetched blind from the committee's
issuers and handed to each request (:attr:`overlay.anon.client.AnonClient.quota`).

The wallet keeps, per model, the tokens of the current quota epoch. When it holds none it asks
``issuers`` verifiers (the committee's :class:`~overlay.directory.quota.QuotaParams`) for a batch:
the same fresh nonces, blinded anew for each issuer (:class:`~overlay.directory.quota.Blinding`),
in a request signed by this node's key, so each issuer counts the batch against this user's
budget and none sees a nonce. Each issuer's answer is checked against the key it signed and
published for the model and epoch (its key record, fetched from every verifier once an epoch);
a token carries the outputs of all of them. A failed or refusing issuer is replaced by another
for the same nonces. When fewer than ``issuers`` issuers have budget left the model's quota is
used up: :meth:`Wallet.token` raises :class:`~overlay.anon.client.QuotaExhausted` with the time
the next epoch begins. When no issuer can be reached, or the committee issues no tokens (its
genesis has no quota section: every verifier answers ``QUOTA_OFF``), a request goes without a
token: model nodes then serve it after requests that carry one.

What the issuers learn: that this registered user took a batch of this size for this model at
this time; not the nonces, so not which requests later spend them.

With a ``store`` (``DATA_DIR/quota_tokens.bin``, mode 0600: tokens are bearer values) the unspent
tokens of the current epoch and what each issuer said was left outlive the process, so that a
``user chat --prompt`` run once a minute spends its batch over many runs instead of fetching a
new one each time (and using the budget up in a few runs). A token handed to a request is
removed from the store before the request is sent.
"""

from __future__ import annotations

import logging
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
STORE_VERSION = 1
MAX_STORE_BYTES = 4 * 1024 * 1024


@dataclass
class _Stock:
    """One model's tokens of one epoch, and what the issuers said."""

    epoch: int
    params: quota.QuotaParams
    records: dict[str, quota.KeyRecord]  # address -> the issuer's verified key record
    tokens: list[bytes] = field(default_factory=list)
    left: dict[str, int] = field(default_factory=dict)  # address -> tokens left there (as it said)
    used_up: set[str] = field(default_factory=set)  # addresses that refused: budget spent

    def candidates(self) -> list[str]:
        return [a for a in self.records if a not in self.used_up and self.left.get(a, self.params.tokens) > 0]


class Wallet:
    """Quota tokens for this user node (module docstring). ``addresses``: the verifiers' RPC
    addresses (a callable: membership may change them); ``validators``: the committee's validator
    keys now (a key record from anyone else is ignored); ``rpc``/``clock``/``rng`` injectable."""

    def __init__(self, identity: Identity, addresses: Callable[[], Sequence[str]], chain_id: str,
                 validators: Callable[[], Sequence[bytes]], *, rpc: Rpc | None = None, clock: Clock | None = None,
                 batch: int = BATCH, rpc_timeout: float = RPC_TIMEOUT, rng: random.Random | None = None,
                 send_when_used_up: bool = False, store: Path | None = None) -> None:
        if not 1 <= batch <= quota.MAX_BATCH:
            raise ValueError(f"batch must be within 1..{quota.MAX_BATCH}")
        self.identity, self.addresses, self.chain_id, self.validators = identity, addresses, chain_id, validators
        self.rpc, self.clock, self.batch, self.rpc_timeout = rpc, clock or TrioClock(), batch, rpc_timeout
        self.rng = rng or random.Random()
        # a verifier's audit user: a used-up quota sends challenges without a token rather than not at
        # all (an unsent challenge would count against the node, not against the verifier)
        self.send_when_used_up = send_when_used_up
        self._stock: dict[str, _Stock] = {}
        self._locks: dict[str, trio.Lock] = {}
        self._writing = trio.Lock()  # one write of the store at a time
        self._params = quota.QuotaParams()  # the last the committee published (epoch length for the first ask)
        self._off_until = -1.0
        self.fetched = 0  # tokens obtained
        self.spent = 0  # tokens handed out
        self.store = store
        self._saved = self._load()  # model -> (epoch, tokens, left by issuer key) from an earlier run

    async def token(self, model: str) -> bytes:
        """A token for one request to ``model`` (empty: none to be had, send without);
        :class:`QuotaExhausted` when this epoch's quota of ``model`` is used up."""
        lock = self._locks.setdefault(model, trio.Lock())
        async with lock:
            now = self.clock.unix()
            if now < self._off_until:
                return b""
            stock = self._stock.get(model)
            if stock is None or stock.epoch != stock.params.epoch_at(now):
                stock = await self._new_stock(model, now)
                if stock is None:
                    return b""
                self._stock[model] = stock
            if not stock.tokens:
                await self._fill(model, stock)
            if stock.tokens:
                self.spent += 1
                token = stock.tokens.pop()
                await self._save()
                return token
            if len(stock.candidates()) < stock.params.issuers and not self.send_when_used_up:
                refills = stock.params.refills_at(stock.epoch)
                raise QuotaExhausted(
                    f"your quota of {model!r} for this period is used up ({stock.params.tokens} tokens from each of "
                    f"{len(stock.records)} issuers, {stock.params.issuers} a request); it refills in "
                    f"{max(0.0, refills - now):.0f} s", refills, max(0.0, refills - now))
            return b""  # issuers failed: best effort without a token

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
                if saved is not None and saved[0] == epoch:  # an earlier run's tokens of this epoch
                    stock.tokens = list(saved[1])
                    stock.left = {a: saved[2][r.issuer] for a, r in stock.records.items() if r.issuer in saved[2]}
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
        """One batch from ``params.issuers`` issuers with budget left, replacing any that fails."""
        need = stock.params.issuers
        candidates = stock.candidates()
        self.rng.shuffle(candidates)
        if len(candidates) < need:
            return
        n = min(self.batch, *(stock.left.get(a, stock.params.tokens) for a in candidates[:need]))
        nonces = quota.new_nonces(n)
        outputs: dict[bytes, list[bytes]] = {}
        while len(outputs) < need and candidates:
            take = candidates[:need - len(outputs)]
            del candidates[:len(take)]
            results: dict[str, list[bytes] | None] = {}
            async with trio.open_nursery() as nursery:
                for a in take:
                    nursery.start_soon(self._issue, a, stock, model, nonces, results)
            for a in take:
                got = results.get(a)
                if got is not None:
                    outputs[stock.records[a].issuer] = got
        if len(outputs) < need:
            return  # the budget spent at the issuers that answered is lost with this batch
        issuers = sorted(outputs)
        stock.tokens.extend(quota.encode_token(quota.Token(model, stock.epoch, nonce, tuple(
            (i, outputs[i][j]) for i in issuers))) for j, nonce in enumerate(nonces))
        self.fetched += len(nonces)
        await self._save()

    # ------------------------------------------------------------------ the store

    def _load(self) -> dict[str, tuple[int, list[bytes], dict[bytes, int]]]:
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
            for model, (epoch, tokens, left) in models.items():
                if not (isinstance(model, str) and type(epoch) is int and all(type(t) is bytes for t in tokens)
                        and all(type(k) is bytes and type(v) is int for k, v in left.items())):
                    raise ValueError("odd values")
                out[model] = (epoch, list(tokens), dict(left))
            return out
        except (ValueError, TypeError, AttributeError, msgpack.UnpackException) as exc:
            log.warning("the quota tokens in %s are not readable (%s); starting without them", self.store, exc)
            return {}

    async def _save(self) -> None:
        """Write the store (its bytes made here; the fsynced write in a worker thread, one at a time:
        ``write_private`` writes through one temporary file)."""
        if self.store is None:
            return
        models: dict[str, list[Any]] = {m: [e, t, left] for m, (e, t, left) in self._saved.items()}  # not asked yet
        models.update({m: [s.epoch, s.tokens, {r.issuer: s.left[a] for a, r in s.records.items() if a in s.left}]
                       for m, s in self._stock.items()})
        raw = msgpack.packb([STORE_VERSION, models], use_bin_type=True)
        async with self._writing:
            try:
                await trio.to_thread.run_sync(write_private, self.store, raw)
            except OSError as exc:
                log.warning("cannot save the quota tokens in %s: %s", self.store, exc)

    async def _issue(self, address: str, stock: _Stock, model: str, nonces: list[bytes],
                     results: dict[str, list[bytes] | None]) -> None:
        rec = stock.records[address]
        blinding = quota.Blinding(nonces)
        raw = quota.encode_issue(self.identity, self.chain_id, quota.IssueRequest(
            self.identity.node_id, rec.issuer, model, stock.epoch, blinding.blinded))
        results[address] = None
        with trio.move_on_after(self.rpc_timeout):
            answer = await self._query(address, quota.ISSUE_PATH, raw, "quota tokens")
            if answer is None:
                return
            if answer.code == Code.QUOTA_USED:
                stock.used_up.add(address)
                return
            if answer.code:
                log.warning("quota tokens from %s refused: code %d %s", address, answer.code, answer.log[:200])
                stock.used_up.add(address)  # not asked again this epoch
                return
            try:
                issued = quota.decode_issued(answer.value)
                results[address] = blinding.finalize(issued, rec.key)
            except quota.QuotaError as exc:
                log.warning("quota tokens from %s refused: %s", address, exc.reason)
                stock.used_up.add(address)
                return
            stock.left[address] = issued.left


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
