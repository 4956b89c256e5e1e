"""List refresh cost and replayed-list staleness (issue 28: part of ``gentorrent bench admission``).

Both run the real code in process: a :class:`verifier.app.CommitteeApp` with four validator keys,
blocks run as CometBFT runs them (PrepareProposal with the last height's vote extensions, so a
certificate rides first; ProcessProposal, ExtendVote, FinalizeBlock, Commit), and a real
:class:`overlay.directory.lists.CommitteeClient` whose fetch answers from the app's ``query`` (no network,
so the figures are bytes and CPU, not latency). Time is a :class:`overlay.wire.clock.FakeClock` the
block time follows.

:func:`measure_list_refresh`: 10,000 registered users (2,000 with ``quick``), then churn of 1 % of
the list between two refreshes (half of it leaves, half new registrations), then one refresh by
delta and, side by side, the full fetch today's clients made:

- ``delta_bytes``: the bytes the delta refresh fetched (user and model deltas);
- ``full_bytes``: the bytes of the full user and model lists at the same height;
- ``delta_to_full_bytes_ratio``;
- ``delta_apply_ms``: :func:`overlay.directory.lists.apply_delta` of the user delta on the held list
  (decode the added records, rebuild the list bytes, SHA-256, signatures), median of 5;
- ``full_verify_ms``: :func:`overlay.directory.lists.verify_document` of the full user list (every
  record decoded and checked, signatures), median of 5;
- ``users_count``, ``churn_records_count``.

:func:`measure_replay_stale`: a committee making a block a second, a user joining right after a
dishonest verifier froze its lists (from then on it serves those genuine, signed lists and no
delta), and a client refreshing every :data:`overlay.directory.lists.REFRESH_S` seconds, over every phase
of its refresh against the freeze:

- ``replay_stale_with_honest_s``: with two honest verifiers besides the replaying one (three
  addresses, asked two at a time in random order; 20 orders per phase), the most seconds the
  client went on holding lists without the new user while a list with it was being served;
- ``replay_stale_alone_s``: with only the replaying verifier reachable, the most seconds the client
  kept taking the replayed lists as current after the newer list existed; from the first refresh
  past that, it refuses them (the lists were signed more than
  :data:`~overlay.directory.lists.MAX_LIST_AGE_S` + :data:`~overlay.directory.lists.CLOCK_AHEAD_S` ago), its
  :meth:`~overlay.directory.lists.CommitteeClient.fresh` is false and the node warns; it still holds
  those lists, less the records that expire;
- ``replay_refused_at_list_age_s``: how old (signed time to the client's clock) the replayed list
  was at the refresh that first refused it.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable

import trio

from overlay.directory import registration as tx
from overlay.directory.lists import (
    KIND_USERS,
    REFRESH_S,
    CommitteeClient,
    ListError,
    ValidatorKey,
    apply_delta,
    verify_document,
)
from overlay.wire import crypto
from overlay.wire.clock import FakeClock
from overlay.wire.constants import ROLE_USER
from overlay.wire.identity import node_id_of
from verifier.app import CommitteeApp, Validator

CHAIN = "gt-bench-lists"
T0 = 1_750_000_000
BLOCK_BYTES = 1 << 24


class _Committee:
    """An in-process committee: one app, four validator keys, blocks at the fake clock's time."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.keys = [crypto.SigningKey.generate() for _ in range(4)]
        self.pinned = [ValidatorKey(k.public_bytes, 10) for k in self.keys]
        self.app = CommitteeApp()
        self.app.init_chain(CHAIN, [Validator("ed25519", k.public_bytes, 10) for k in self.keys])
        self._votes: list[tuple[bytes, bytes]] = []
        self.block()

    def block(self, txs: list[bytes] | None = None) -> None:
        a, h, now = self.app, self.app.height + 1, int(self.clock.unix())
        block = a.prepare_proposal(txs or [], BLOCK_BYTES, now, h, self._votes)
        block_hash = crypto.sha256(b"".join(block) + h.to_bytes(8, "big"))
        if not a.process_proposal(block, now, h, block_hash):
            raise RuntimeError(f"the bench's own block {h} was rejected")
        self._votes = [(crypto.sha256(k.public_bytes)[:20], a.extend_vote(h, k, block_hash, block, now))
                       for k in self.keys]
        results, _ = a.finalize_block(h, now, block, block_hash)
        if not all(r.ok for r in results):
            raise RuntimeError(f"a bench transaction was refused: {[r for r in results if not r.ok][:1]}")
        a.commit()

    def settle(self) -> None:
        """Two more heights, so the served (certified) lists hold every committed transaction."""
        self.block()
        self.block()

    async def fetch(self, address: str, path: str) -> bytes:
        res, value = self.app.query(path, b"")
        if not res.ok:
            raise ListError(f"{address} answered code {int(res.code)}: {res.log}")
        return value


class _User:
    def __init__(self, i: int) -> None:
        self.key = crypto.SigningKey.generate()
        self.address = f"100.{64 + (i >> 16) % 64}.{(i >> 8) & 255}.{i & 255}:9000"
        self.seq = 0

    @property
    def node_id(self) -> bytes:
        return node_id_of(self.key.public_bytes)

    def tx(self, op: int) -> bytes:
        self.seq += 1
        entry = None if op == tx.OP_LEAVE else tx.Entry(ROLE_USER, bytes(32), self.address, "eu-west", "", 0)
        return tx.make_tx(self.key, CHAIN, op, self.seq, entry)


def _median_ms(fn: Callable[[], object], runs: int = 5) -> float:
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return statistics.median(out)


def measure_list_refresh(quick: bool) -> dict[str, float]:
    n = 2_000 if quick else 10_000
    clock = FakeClock(unix=T0)
    c = _Committee(clock)
    users = [_User(i) for i in range(n)]
    for start in range(0, n, 2_000):
        c.block([u.tx(tx.OP_REGISTER) for u in users[start:start + 2_000]])
    c.settle()
    client = CommitteeClient(["v:1"], CHAIN, c.pinned, fetch=c.fetch, clock=clock)
    trio.run(client.refresh)
    base = client.lists[KIND_USERS]
    # Churn: 1 % of the list changes between two refreshes, half leaving, half joining, over ten
    # seconds of one-second blocks.
    half = max(1, n // 200)
    leaving = random.Random(1).sample(users, half)
    joining = [_User(n + i) for i in range(half)]
    per = max(1, half // 10)
    for i in range(10):
        clock.advance(1)
        c.block([u.tx(tx.OP_LEAVE) for u in leaving[i * per:(i + 1) * per]]
                + [u.tx(tx.OP_REGISTER) for u in joining[i * per:(i + 1) * per]])
    clock.advance(1)
    c.settle()
    fetched = client.bytes_fetched
    deltas = client.delta_fetches
    trio.run(client.refresh)
    if client.delta_fetches != deltas + 2:
        raise RuntimeError("the refresh did not go by delta")
    delta_bytes = client.bytes_fetched - fetched
    if {u.node_id for u in joining} - set(client.registry().by_id):
        raise RuntimeError("the delta refresh misses a joined user")
    full_users = trio.run(c.fetch, "v:1", "/lists/users")
    full_models = trio.run(c.fetch, "v:1", "/lists/models")
    user_delta = trio.run(c.fetch, "v:1", f"/lists/users/since/{base.height}")
    now = clock.unix()
    applied = apply_delta(user_delta, CHAIN, c.pinned, base, now=now)
    full = verify_document(full_users, CHAIN, c.pinned, kind=KIND_USERS, now=now)
    if (applied.digest, applied.entries) != (full.digest, full.entries):
        raise RuntimeError("the delta applied differs from the full list")
    full_bytes = len(full_users) + len(full_models)
    return {
        "users_count": float(n),
        "churn_records_count": float(2 * half),
        "delta_bytes": float(delta_bytes),
        "full_bytes": float(full_bytes),
        "delta_to_full_bytes_ratio": delta_bytes / full_bytes,
        "delta_apply_ms": _median_ms(lambda: apply_delta(user_delta, CHAIN, c.pinned, base, now=now)),
        "full_verify_ms": _median_ms(lambda: verify_document(full_users, CHAIN, c.pinned, kind=KIND_USERS, now=now,
                                                             min_height=base.height)),
    }


def _replay_run(phase: int, alone: bool, seed: int) -> tuple[float, float | None]:
    """One run: (seconds, counted each second of fake time, during which the client took lists
    without the new user as fresh while a list with it was served; the list age at the first
    refresh that refused the replay, None if none did)."""
    clock = FakeClock(unix=T0)
    c = _Committee(clock)
    c.block([_User(i).tx(tx.OP_REGISTER) for i in range(20)])
    c.settle()
    frozen: dict[str, bytes] = {}

    async def fetch(address: str, path: str) -> bytes:
        if address == "bad:1":
            if path not in frozen:
                raise ListError(f"{address} answered code 10: no delta")
            return frozen[path]
        if alone and frozen:  # from the freeze on, only the replaying verifier is reachable
            raise OSError(f"{address}: connection refused")
        return await c.fetch(address, path)

    client = CommitteeClient(["bad:1", "good:1", "good:2"], CHAIN, c.pinned, fetch=fetch, clock=clock,
                             rng=random.Random(seed))
    trio.run(client.refresh)
    for path in ("/lists/users", "/lists/models"):
        frozen[path] = trio.run(c.fetch, "bad:1", path)
    newcomer = _User(10_000)
    next_refresh = clock.unix() + phase
    clock.advance(1)
    c.block([newcomer.tx(tx.OP_REGISTER)])
    c.settle()  # on a real chain these two heights take two seconds; here the newer list is served at once
    stale = 0.0
    refused_age = None
    for _ in range(180):
        if clock.unix() >= next_refresh:
            next_refresh += REFRESH_S
            try:
                trio.run(client.refresh)
            except ListError:
                if refused_age is None:
                    refused_age = client.list_age()
        if newcomer.node_id in client.registry().by_id:
            break
        stale += client.fresh()  # the client takes its lists as current, and they lack the newcomer
        clock.advance(1)
        c.block()
    return stale, refused_age


def measure_replay_stale(quick: bool) -> dict[str, float]:
    phases = range(0, int(REFRESH_S), 3 if quick else 1)
    seeds = range(4 if quick else 20)
    with_honest = max(_replay_run(p, False, s)[0] for p in phases for s in seeds)
    alone = [_replay_run(p, True, 0) for p in phases]
    ages = [a for _, a in alone if a is not None]
    return {
        "replay_stale_with_honest_s": float(with_honest),
        "replay_stale_alone_s": float(max(s for s, _ in alone)),
        "replay_refused_at_list_age_s": float(max(ages)) if ages else float("nan"),
    }
