"""The trio driver of a model node's group (paper §3.3): sync rounds and forwarded requests.

:class:`GroupService` runs the I/O-free :class:`~model_node.group.GroupState` on the model
node's :class:`~overlay.net.node.Node`:

- **Membership** comes from the signed registry: the model nodes serving the same model,
  split by region above 50 nodes (:func:`~model_node.group.split_groups`). Only members may
  send sync messages or :class:`~model_node.messages.ForwardedRequest`\\ s; anything from
  anyone else is dropped, counted (``state.dropped`` for sync messages, :attr:`dropped` for
  forwarded requests) and logged. The peer id is the one the transport authenticated.
- **Rounds**: every ``sync_interval`` (5 s by default) the driver hands the state the local
  load (requests generated and queued, the capacity score 1–10, KV use if the engine reports
  it, median time to first token) and the engine's cached prefixes, runs ``tick`` and queues
  the resulting messages with ``Node.send_nowait``.
- **Load pushes** (issue 29): the model node calls :meth:`load_changed` when its load changes
  (a request admitted, its first token, its end); the service reports the load to every member
  at once (:meth:`~model_node.group.GroupState.report_load`), at most once every
  :data:`PUSH_INTERVAL`: a change within that time is counted (:attr:`pushes_skipped`) and
  covered by one report when the interval is over, so the last change always goes out.
- **Round trips**: every ``sync_interval`` the driver pings each member; the least of a
  member's last few round trips is what a forward to it adds to its predicted time to first
  token (:meth:`~model_node.group.GroupState.hops`).
- **Forwarding**: :meth:`decide` refreshes the local load and runs the forwarding policy
  (the group's rule, least predicted TTFT by default, :mod:`model_node.forwarding`, unless a
  benchmark injects a baseline);
  :meth:`forward` sends the user's request, unchanged, to the chosen member over an
  authenticated connection. When that fails (the member is unreachable) the member is
  dropped from the table at once and the caller serves the request itself.

The service reads time only through its ``clock`` (:mod:`overlay.wire.clock`).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import trio

from model_node.forwarding import Decision, ForwardingPolicy, Load
from model_node.group import (
    MAX_IDLE_MS,
    MAX_LATENCY_MS,
    MAX_RATE_MTPS,
    MAX_REQUESTS,
    MAX_STREAMS,
    MAX_WORK_TOKENS,
    GroupConfig,
    GroupState,
    group_of,
)
from model_node.hrtree import ChunkLengths
from model_node.messages import (
    ForwardedRequest,
    LengthProposal,
    LoadReport,
    PeerRow,
    SubtreeRequest,
    SubtreeUpdate,
)
from overlay.anon.actions import Send
from overlay.directory.registry import Registry
from overlay.net.node import Node
from overlay.net.peers import PeerEntry
from overlay.net.transport import Connection, TransportError
from overlay.wire.clock import Clock, TrioClock
from overlay.wire.codec import LocalProtocolError
from overlay.wire.identity import short_id
from overlay.wire.messages import Request

log = logging.getLogger("gentorrent.model.group")

SYNC_MESSAGES = (LoadReport, SubtreeUpdate, LengthProposal, SubtreeRequest)
FORWARD_TIMEOUT = 5.0  # seconds to connect to the target and queue the request
PUSH_INTERVAL = 0.1  # seconds between two load reports pushed between rounds (docs/simulations.md)


class GroupService:
    """Runs :class:`GroupState` for one model node (see the module docstring).

    ``load()`` and ``prefixes()`` read the model node and its engine (``load().capacity`` is
    the node's score 1–10, ``--capacity``); ``on_forwarded(conn, request)`` is called
    (synchronously: start a task) for each request a member forwarded here. ``policy``
    decides for users' requests (``None``: Algorithm 2; benchmarks inject baselines).
    ``clock``: rounds, expiry and the first round number read it (default: trio's; read
    only once running).
    """

    def __init__(self, node: Node, registry: Registry, model: str, *,
                 load: Callable[[], Load],
                 prefixes: Callable[[], Iterable[Sequence[int]]],
                 on_forwarded: Callable[[Connection, Request], None],
                 config: GroupConfig | None = None, policy: ForwardingPolicy | None = None,
                 lengths: ChunkLengths | None = None, clock: Clock | None = None) -> None:
        self.node = node
        self.model = model
        self.config = config or GroupConfig()
        self.policy = policy
        self.clock: Clock = clock or TrioClock()
        self._load = load
        self._prefixes = prefixes
        self._on_forwarded = on_forwarded
        self.state = GroupState(node.node_id, self.members_of(registry), capacity=load().capacity,
                                config=self.config, lengths=lengths)
        self.dropped: Counter[str] = Counter()  # forwarded requests (and relayed replies) refused
        self.forwarded_out = 0
        self.forwarded_in = 0
        self.forward_failed = 0
        self.send_failed = 0  # sync messages Node.send_nowait could not queue
        self.rounds = 0
        self.pushes = 0  # load reports pushed between rounds (each to every member)
        self.pings = 0  # round trips to members measured (the forwarding rule's hop costs)
        self._pinging: set[bytes] = set()  # members whose ping is in flight
        self.pushes_skipped = 0  # load changes not pushed at once (rate limit; a later push covers them)
        self._pushed_at = -math.inf  # when the last load report went out (push or round)
        self._push_due = False  # a change is waiting for the rate limit
        self._push_wakeup = trio.Event()

    # ------------------------------------------------------------------ membership

    def members_of(self, registry: Registry) -> tuple[bytes, ...]:
        """This node's group under the registry: trusted model nodes serving ``model`` (the signed
        list keeps untrusted ones so that audits reach them, but users do not read their replies,
        so nobody forwards to them; an untrusted node is a group of its own), split by region above
        50 (every member computes the same partition)."""
        regions = {e.node_id: e.region for e in registry.models(self.model) if e.trusted}
        return group_of(self.node.node_id, regions) or (self.node.node_id,)

    def is_member(self, peer: bytes) -> bool:
        return peer != self.node.node_id and peer in self.state.members

    # ------------------------------------------------------------------ running

    def install(self) -> None:
        """Register the sync and forwarded-request handlers on the node."""
        for t in SYNC_MESSAGES:
            self.node.on(t, self._on_sync)
        self.node.on(ForwardedRequest, self._on_forwarded_request)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """A sync round now and every ``sync_interval`` seconds, until cancelled. Round numbers
        start at the wall clock in ms, so a restarted node's reports are newer than its last."""
        self.state.seq = max(self.state.seq, int(self.clock.unix() * 1000))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._push_later)
            nursery.start_soon(self._measure_round_trips)
            task_status.started()
            while True:
                self.round()
                await trio.sleep(self.config.sync_interval)

    def round(self) -> None:
        """One synchronisation round: local load and prefixes in, ``tick``'s messages out."""
        self.refresh_load()
        try:
            prefixes = list(self._prefixes())
        except RuntimeError as exc:  # the engine's cache changed under us (a worker thread): next round
            log.debug("cached prefixes unavailable this round: %s", exc)
        else:
            self.state.set_local_prefixes(prefixes)
        now = self.clock.monotonic()
        self._send(self.state.tick(now))
        self._pushed_at = now
        self._push_due = False  # the round's report carries the change
        self.rounds += 1

    async def _measure_round_trips(self) -> None:
        """Ping every member each ``sync_interval``: the round trips are the forwarding rule's
        hop costs (:meth:`~model_node.group.GroupState.set_rtt`). Each ping runs on its own, so
        a member slow to answer delays no other's measure; one still waiting is not pinged
        again, and one that does not answer gives no sample (its forwards fail on their own)."""
        async with trio.open_nursery() as nursery:
            while True:
                for peer in sorted(self.state.members - {self.node.node_id} - self._pinging):
                    entry = self.node.peers.get(peer)
                    if entry is not None:
                        self._pinging.add(peer)
                        nursery.start_soon(self._ping, entry)
                await trio.sleep(self.config.sync_interval)

    async def _ping(self, entry: PeerEntry) -> None:
        try:
            rtt = await self.node.ping(entry, pong_timeout=FORWARD_TIMEOUT)
        except TransportError as exc:
            log.debug("no round trip to model node %s: %s", short_id(entry.node_id), exc)
            return
        finally:
            self._pinging.discard(entry.node_id)
        self.state.set_rtt(entry.node_id, rtt)
        self.pings += 1

    def load_changed(self) -> None:
        """The model node's load changed (a request admitted, a first token, a request done):
        report it to every member now, or, within :data:`PUSH_INTERVAL` of the last report,
        once the interval is over (counted in :attr:`pushes_skipped`)."""
        now = self.clock.monotonic()
        if now - self._pushed_at < PUSH_INTERVAL:
            self.pushes_skipped += 1
            if not self._push_due:
                self._push_due = True
                self._push_wakeup.set()
            return
        self._push(now)

    def _push(self, now: float) -> None:
        self.refresh_load()
        self._send(self.state.report_load(now))
        self._pushed_at = now
        self._push_due = False
        self.pushes += 1

    async def _push_later(self) -> None:
        """Push the change :meth:`load_changed` held back, when the rate limit allows."""
        while True:
            await self._push_wakeup.wait()
            self._push_wakeup = trio.Event()
            await trio.sleep(max(0.0, self._pushed_at + PUSH_INTERVAL - self.clock.monotonic()))
            if self._push_due:
                self._push(self.clock.monotonic())

    def refresh_load(self) -> None:
        """The model node's load now, clamped to what a load report may carry."""
        load = self._load()
        self.state.set_local_load(Load(
            active=min(max(load.active, 0), MAX_REQUESTS), queued=min(max(load.queued, 0), MAX_REQUESTS),
            capacity=load.capacity, kv_usage_permille=min(max(load.kv_usage_permille, 0), 1000),
            latency_ms=min(max(load.latency_ms, 0), MAX_LATENCY_MS),
            prefill_tokens=min(max(load.prefill_tokens, 0), MAX_WORK_TOKENS),
            decode_tokens=min(max(load.decode_tokens, 0), MAX_WORK_TOKENS),
            prefill_rate=min(max(load.prefill_rate, 0.0), MAX_RATE_MTPS / 1000),
            decode_rate=min(max(load.decode_rate, 0.0), MAX_RATE_MTPS / 1000),
            streams=min(max(load.streams, 1), MAX_STREAMS),
            match_wait=min(load.match_wait, MAX_LATENCY_MS / 1000) if load.match_wait >= 0 else -1.0,
            idle_ms=min(load.idle_ms, MAX_IDLE_MS) if load.idle_ms >= 0 else -1,
        ))

    # ------------------------------------------------------------------ requests

    def observe(self, token_ids: Sequence[int]) -> None:
        """A user's request arrived here (not a forwarded one): the Sentry learns from it."""
        self._send(self.state.observe(token_ids, self.clock.monotonic()))

    def decide(self, token_ids: Sequence[int], *, forwarded: bool) -> Decision:
        """Serve here or forward: the group's rule (least predicted TTFT unless configured
        otherwise), or the injected policy for a user's request (a forwarded one is always
        served here). The local load is refreshed first, so this node's own figures are never
        a round old."""
        self.refresh_load()
        if forwarded or self.policy is None:
            return self.state.decide(token_ids, forwarded=forwarded, now=self.clock.monotonic())
        return self.policy(self.state, token_ids)

    async def forward(self, target: bytes, request: Request) -> bool:
        """Send ``request`` to member ``target``; ``False`` if it could not be sent (the
        caller then serves it, and ``target`` leaves the table until it reports again)."""
        entry = self.node.peers.get(target)
        if entry is None or not self.is_member(target):
            self.forward_failed += 1
            return False
        try:
            with trio.fail_after(FORWARD_TIMEOUT):
                conn = await self.node.connection_to(entry)
                await conn.send(ForwardedRequest(request))
        except (TransportError, trio.TooSlowError, LocalProtocolError) as exc:
            self.forward_failed += 1
            log.info("could not forward a request to model node %s (%s); serving it here", short_id(target),
                     exc or type(exc).__name__)
            self.state.forget(target)
            return False
        self.forwarded_out += 1
        return True

    # ------------------------------------------------------------------ peers' messages

    async def _on_sync(self, conn: Connection, msg: Any) -> None:
        self._send(self.state.on_message(conn.peer_id, msg, self.clock.monotonic()))

    async def _on_forwarded_request(self, conn: Connection, msg: ForwardedRequest) -> None:
        if not self.is_member(conn.peer_id):
            self.refuse(conn.peer_id, "non-member", "a forwarded request")
            return
        self.forwarded_in += 1
        self._on_forwarded(conn, msg.request)

    def refuse(self, peer: bytes, reason: str, what: str) -> None:
        """Count and log something refused from ``peer`` (not a sync message)."""
        self.dropped[reason] += 1
        log.warning("dropped %s from node %s: %s", what, short_id(peer), reason)

    # ------------------------------------------------------------------ internals

    def _send(self, sends: list[Send]) -> None:
        for s in sends:
            if not self.node.send_nowait(s.peer, s.msg):
                self.send_failed += 1

    def peer_rows(self) -> list[PeerRow]:
        """The group table as it stands (live peers only), for :class:`NodeStats`."""
        table = self.state.table()
        tree = self.state.tree
        return [PeerRow(p, table[p].relative if p in table else -1.0, tree.path_count(p))
                for p in sorted(self.state.peers)]
