"""A model node: answers anonymous requests arriving as cloves through users' proxies.

Requests wait in a queue for one of the node's ``slots``; each runs on the engine, streams
back as reply chunks, and the last chunk carries the node's Ed25519 signature over the
request digest and every output token id (:mod:`overlay.anon.signing`), so the user can verify
who answered and send follow-ups there (session affinity).

**Load and overload.** The load the node advertises (:meth:`ModelNode.current_load`) is the
work it holds: prompt tokens still to evaluate (less the prefix the engine caches) and output
tokens still expected, with the engine's rates measured on recent requests through the
injected clock (:class:`~model_node.forwarding.Throughput`). A request is taken only with a
promise: its first token within ``max_queue_wait`` seconds, without making an earlier
request's promised first token late (:mod:`model_node.admission`; an idle node takes any
prompt). An engine that orders prompts (:class:`~model_node.engine.OrdersPrompts`, llama.cpp)
gets each request's place in the order (a mostly cached prompt ahead of cold ones, as far as
their promises allow); other engines serve prompts first come first served. A request that
cannot be taken so, that finds every slot taken and more work than that wait queued, that waits
that long for a slot, or that finds ``max_queue`` requests already queued, is refused with a
"busy" error chunk (:func:`overlay.anon.responder.busy_error`), signed over the request's digest
(:func:`overlay.anon.signing.busy_signing_bytes`: a donor shows its verifiers that the node refused
the request it committed to, decision 0044); the user's client then tries another
model node. Every request is answered or refused: none waits without bound. The load also
reports ``match_wait``, the wait admission would give a mostly cached prompt now, which
forwarding compares for a prefix's holders, and ``idle_ms``, how long the node has held no
work (forwarding's tie-break). With a group, the node reports its load to the members each
time it changes (a request admitted, its first token, its end: :meth:`GroupService.load_changed`,
rate-limited), and announces the prompts of the requests it took but has not prefilled yet
with its cached prefixes (:meth:`ModelNode.announced_prefixes`), so that peers send requests
sharing a prefix here from the moment it is queued (issue 29, docs/simulations.md).

**Usage quotas** (issue 31: :mod:`model_node.quota`, :mod:`model_node.priority`). With a
committee (``redeemer``), a request may carry a usage-quota token. Checks that need no issuer
come first: a bad token (garbage, another model's, an epoch not redeemable now, too few or
unknown issuers) is refused with an invalid error chunk, ``quota token refused: <why>``, before
any other work. A request whose token passes is taken or refused as above, with its token's
*rank* (decision 0022): 2 for a priority token, 1 for a standard one, 0 without a token. It is
admitted against work of its rank or above only, and when the queue is full it takes the place of
the newest waiter of the lowest rank below its own (that one is answered "busy"). Only once taken
is its token redeemed at its issuers: spent or invalid there (a standard token relabelled priority
included), it is refused as above; issuers unreachable or quotas off, it waits as a request
without a token (rank 0, best-effort). So a request refused "busy" at once keeps its token for the
next node; one refused after it was taken has spent it, and the user's client takes a fresh one
when the next node says so. A freed slot goes to the oldest waiter of the highest rank, and a request that would
wait while a lower-rank generation holds a slot stops one (decision 0018). A request forwarded in the
group carries its token unchanged and the member that serves it redeems it, once it has taken it;
the entry node that forwards it never does (a token spends once). Without a redeemer, a token is
ignored and every request is served alike.

With a group (``group=GroupConfig(...)``, the default of ``gentorrent model-node``)
the node forwards among the model nodes serving its model (paper §3.3,
:mod:`model_node.forwarding`, run by :mod:`model_node.group_service`): after tokenizing
a user's request it asks Algorithm 2 where to serve it; a forwarded request goes, unchanged, to the chosen member, which
replies straight to the user's proxies and names itself, so follow-ups go to it. A
request that arrives forwarded is always served where it arrives (one hop at most).
``group=None`` serves everything locally.

A plain :class:`~overlay.wire.messages.Request` over an authenticated connection (not a clove)
is not anonymous: the node learns who asked. It is answered only from members of the
node's own group (a forwarded request's chunks come back through the member that took it)
or, for diagnostics and benchmarks, when the node runs with ``accept_direct_requests``
(``--accept-direct-requests``); anyone else gets an error reply naming the flag.

**One way in.** Every request, whatever its origin, enters through :meth:`ModelNode.answer`
with an :class:`Origin` saying how it came (:class:`Via`: ``ANONYMOUS``, rebuilt from a user's
cloves; ``FORWARDED`` by a member; ``DIRECT``, plain over a connection) and where its reply
chunks go (the request's return paths, or the connection it came over). The node calls its
:class:`~overlay.anon.responder.Responder` one way: the responder hands back the requests it
rebuilds from cloves (:meth:`~overlay.anon.responder.Responder.on_deliver`) and answers a request
to its return paths with the reply stream it is given
(:meth:`~overlay.anon.responder.Responder.accept`); it never calls into the node otherwise.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import math
import statistics
from collections import Counter, deque
from collections.abc import AsyncGenerator, Collection, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import trio

from model_node.admission import Admission
from model_node.engine import Engine, EngineError, GenStats, OrdersPrompts
from model_node.forwarding import MATCH_PROBE_TOKENS, ForwardingPolicy, Load, Throughput
from model_node.group import MAX_IDLE_MS, GroupConfig
from model_node.group_service import GroupService
from model_node.hrtree import common_prefix
from model_node.messages import Count, NodeStats, Served, StatsRequest
from model_node.priority import UNTOKENED, Held, SlotGate, admit_held, preempt
from model_node.quota import Redeemer, token_rank
from model_node.served import Recording, ServedStore
from overlay.anon.replay import AnsweredIds
from overlay.anon.responder import Responder, busy_error, invalid_error, only
from overlay.anon.signing import ReplySigner, busy_signing_bytes, request_digest
from overlay.directory.quota import Token
from overlay.directory.registry import Registry
from overlay.net.node import Node, listed_in
from overlay.net.transport import Connection, Transport, TransportError
from overlay.wire.clock import Clock, TrioClock
from overlay.wire.failures import Failure
from overlay.wire.identity import Identity, short_id
from overlay.wire.messages import Deliver, ReplyChunk, Request

log = logging.getLogger("gentorrent.model")

# Reply chunking: the first piece goes out alone (time to first token); later pieces are
# coalesced until CHUNK_INTERVAL has passed since the last chunk, so a fast engine sends few
# large chunks (each chunk costs n cloves through the overlay) and a slow one streams each piece.
CHUNK_INTERVAL = 0.010  # seconds
CHUNK_MAX_CHARS = 16 * 1024
RELAY_TIMEOUT = 120.0  # seconds a forwarded direct request may go without a reply chunk
RECENT = 64  # served requests kept for NodeStats, the latency figure and the measured rates
MAX_QUEUE_WAIT = 10.0  # seconds a request may wait for a slot before the node answers "busy"
MAX_CACHED_PREFIXES_COMPARED = 64  # cached prefixes a queued prompt is compared with (work estimate)
DIRECT_REFUSED = (
    "this model node answers plain (non-anonymous) requests only from members of its group; send the "
    "request through the overlay, or start the node with --accept-direct-requests (a diagnostic: the "
    "requester is then not anonymous to the model node)"
)


def check_params(req: Request, max_tokens_limit: int) -> str | None:
    """Why ``req``'s sampling parameters are unacceptable, or ``None``."""
    p = req.params
    if not (math.isfinite(p.temperature) and 0.0 <= p.temperature <= 5.0):
        return f"temperature must be within 0..5, got {p.temperature}"
    if not (math.isfinite(p.top_p) and 0.0 < p.top_p <= 1.0):
        return f"top_p must be within (0, 1], got {p.top_p}"
    if not 0 <= p.top_k <= 1000:
        return f"top_k must be within 0..1000, got {p.top_k}"
    if not 1 <= p.max_tokens <= max_tokens_limit:
        return f"max_tokens must be within 1..{max_tokens_limit}, got {p.max_tokens}"
    if p.seed is not None and not 0 <= p.seed < 2**32:
        return "seed must be within 0..2^32-1"
    return None


class Via(enum.Enum):
    """How a request reached this model node."""

    ANONYMOUS = "anonymous"  # a user's request, rebuilt from the cloves its proxies delivered
    FORWARDED = "forwarded"  # handed over by a member of the group: served here, never forwarded again
    DIRECT = "direct"  # a plain, non-anonymous request over an authenticated connection


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a request came from and where its reply chunks go (:meth:`ModelNode.answer`).

    ``via``: how it arrived. ``conn``: the authenticated connection it came over (the
    requester, or the member that forwarded it; ``None`` for an anonymous request).
    ``reply``: the connection its reply chunks go back on; ``None``: the request's return
    paths, as cloves through the node's responder."""

    via: Via
    conn: Connection | None = None
    reply: Connection | None = None

    @classmethod
    def direct(cls, conn: Connection) -> Origin:
        """A plain request ``conn``'s peer sent: answered on ``conn``."""
        return cls(Via.DIRECT, conn, conn)

    @classmethod
    def forwarded_by(cls, conn: Connection, req: Request) -> Origin:
        """``req`` forwarded by the member at ``conn``: a user's request (it has return
        paths) is answered straight to the user's proxies, a plain one back to the member."""
        return cls(Via.FORWARDED, conn, None if req.return_paths else conn)

    @property
    def forwarded(self) -> bool:
        """A member forwarded it here: it is served here, whatever the load."""
        return self.via is Via.FORWARDED

    @property
    def target(self) -> bytes | None:
        """The node the client addressed, which the reply's signature names: the member that
        forwarded the request (``None``: this node)."""
        return self.conn.peer_id if self.forwarded and self.conn is not None else None


ANONYMOUS = Origin(Via.ANONYMOUS)


class ModelNode:
    """Serves one engine's model to the network (see the module docstring)."""

    def __init__(
        self,
        identity: Identity,
        transport: Transport,
        registry: Registry,
        engine: Engine,
        *,
        slots: int = 1,
        max_queue: int = 64,
        max_queue_wait: float = MAX_QUEUE_WAIT,
        max_tokens_limit: int = 4096,
        capacity: int = 1,
        group: GroupConfig | None = None,
        policy: ForwardingPolicy | None = None,
        accept_direct_requests: bool = False,
        clock: Clock | None = None,
        registered_only: bool = False,
        redeemer: Redeemer | None = None,
        served_store: ServedStore | None = None,
    ) -> None:
        """``slots``: requests generated at once (the rest wait in a queue of ``max_queue``,
        each at most ``max_queue_wait`` seconds, else "busy": see the module docstring);
        ``capacity``: the node's capacity score 1–10 that load balancing divides its load by
        (paper §3.3; ``--capacity``), independent of ``slots``. ``group``: forward among the
        registry's model nodes serving this model (``None``: serve every request here);
        ``policy``: where users' requests go (``None``: Algorithm 2; benchmarks inject their
        baselines). ``accept_direct_requests``: answer plain requests from anyone, not only
        from group members (a diagnostic: the requester is not anonymous to this node).
        ``clock``: reply chunking, signing times and the group's rounds read it (default:
        trio's). ``registered_only`` (set when lists come from the committee): accept cloves only
        from proxies in the current user list. ``redeemer``: checks and redeems the usage-quota
        tokens requests carry (the committee's issuers, :mod:`model_node.quota`); ``None`` (no
        committee): a token is ignored and every request is served alike. ``served_store``: keeps
        every completed reply to a request addressed to this node that can be a transcript (its own
        or a member's relayed through it), for the node's reveals of withheld replies
        (:mod:`model_node.served`, decision 0037); ``None``: nothing is kept."""
        self.identity = identity
        self.served_store = served_store
        self.registered_only = registered_only
        self.on_unlisted: Any = None  # Callable[[], None]: told when a proxy is not in the lists
        self.capacity = capacity
        self.engine = engine
        self.model = engine.model
        self.max_tokens_limit = max_tokens_limit
        self.max_queue = max_queue
        if not max_queue_wait > 0:
            raise ValueError(f"max_queue_wait must be above 0 seconds, got {max_queue_wait}")
        self.max_queue_wait = max_queue_wait
        self.slots = slots
        self.accept_direct_requests = accept_direct_requests
        self.clock: Clock = clock or TrioClock()
        self.answered = AnsweredIds()  # plain requests' ids, each answered once (overlay/anon/replay.py)
        self.active = 0
        self.queued = 0
        self.served = 0
        self.busy = 0  # requests refused as busy
        self.preempted = 0  # generations stopped for a request of a higher rank (model_node/priority.py)
        self.throughput = Throughput(RECENT)
        # the engine, if it evaluates prompts in the order admission gives (else first come first served)
        self._ordered: OrdersPrompts | None = (
            engine if isinstance(engine, OrdersPrompts) and engine.orders_prompts else None)
        self._work: set[_Work] = set()
        self._idle_since: float | None = None  # when the node last stopped holding work (None: it never held any)
        self._gate = SlotGate(slots)  # the highest rank's waiters first (model_node/priority.py)
        self.redeemer = redeemer
        self.node = Node(identity, transport, peers=registry.entries, ping_interval=0, clock=self.clock,
                         registered=listed_in(registry))
        # with quotas, room beyond a full queue for the requests that take lower-rank ones' places
        active = max_queue + slots if redeemer is None else 2 * max_queue + slots
        self.responder = Responder(identity, self.node.send_nowait, self._proxy, admits=self._opens_cloves_from,
                                   max_active=active, clock=self.clock)
        self._registry = registry
        self._nursery: trio.Nursery | None = None
        self.recent: deque[Served] = deque(maxlen=RECENT)
        self.totals: Counter[str] = Counter()  # prompt_tokens, evaluated_prompt_tokens, cache_hits
        self._relays: dict[tuple[bytes, bytes], trio.MemorySendChannel[ReplyChunk]] = {}
        self.group: GroupService | None = None
        if group is not None:
            self.group = GroupService(
                self.node, registry, self.model, load=self.current_load, prefixes=self.announced_prefixes,
                on_forwarded=self._take_forwarded, config=group, policy=policy, clock=self.clock)
            self.group.install()
        self.node.on(Deliver, self._on_deliver)
        self.node.on(Request, self._on_direct)
        self.node.on(ReplyChunk, self._on_relayed_chunk)
        self.node.on(StatsRequest, self._on_stats)

    # ------------------------------------------------------------------ counters

    @property
    def forwarded_out(self) -> int:
        """Requests this node forwarded to another member."""
        return self.group.forwarded_out if self.group else 0

    @property
    def forwarded_in(self) -> int:
        """Requests another member forwarded here."""
        return self.group.forwarded_in if self.group else 0

    @property
    def forward_failed(self) -> int:
        """Forwards that could not be sent (served here instead)."""
        return self.group.forward_failed if self.group else 0

    @property
    def decisions(self) -> Counter[str]:
        """Algorithm 2's outcomes by reason (``match``, ``miss``, ``forwarded``...)."""
        return self.group.state.decisions if self.group else Counter()

    def current_load(self) -> Load:
        """This node's load now: the work it holds (prompt tokens still to evaluate, output
        tokens still expected) and the engine's measured rates, requests generated and
        queued, its capacity score and slots, KV use if the engine reports it, the
        median time to first token of recent replies, and how long it has held no work
        (``idle_ms``; -1 while it holds some; :data:`~model_node.group.MAX_IDLE_MS` if it never
        held any: every fresh node is idle equally long, as the simulation's engines that never
        served are all free since time 0, so their ties go to the entry)."""
        load = self._load(self._work, self.queued)
        if self._gate.free == 0:
            load.match_wait = max(load.relative, self.max_queue_wait)
        elif load.prefill_tokens == 0:  # nothing waits for a first token (no clock needed: called at start-up)
            load.match_wait = load.prefill_seconds(MATCH_PROBE_TOKENS)
        else:
            probe = self._admission(load, MATCH_PROBE_TOKENS)
            load.match_wait = probe.wait if probe is not None else max(load.relative, self.max_queue_wait)
        return load

    def _load(self, work: Collection[_Work], queued: int) -> Load:
        """:meth:`current_load` of ``work`` (``queued`` of it waiting for a slot), without ``match_wait``."""
        kv = getattr(self.engine, "kv_usage", None)
        ttfts = [s.ttft_us for s in self.recent]
        return Load(self.active, queued, self.capacity, int(1000 * kv()) if kv is not None else 0,
                    int(statistics.median(ttfts) // 1000) if ttfts else 0,
                    prefill_tokens=sum(w.left() for w in work), decode_tokens=sum(w.remaining for w in work),
                    prefill_rate=self.throughput.prefill_rate, decode_rate=self.throughput.decode_rate,
                    streams=self.slots, idle_ms=self._idle_ms())

    def _load_ahead(self, rank: int) -> Load:
        """The load a new request of ``rank`` waits behind: all the work held, or for a tokened
        request the work it cannot pass (requests generating, and those of its rank or above:
        :mod:`model_node.priority`)."""
        if rank == UNTOKENED:
            return self.current_load()
        ahead = [w for w in self._work if w.rank >= rank or w.running]
        return self._load(ahead, sum(not w.running for w in ahead))

    def _idle_ms(self) -> int:
        if self._work:
            return -1
        if self._idle_since is None:  # never held work (and the clock may not be readable yet)
            return MAX_IDLE_MS
        return max(0, int((self.clock.monotonic() - self._idle_since) * 1000))

    def announced_prefixes(self) -> list[Sequence[int]]:
        """What this node announces to its group (its HR-tree subtree): the prompts of the
        requests it took whose prefill has not finished (the engine will cache them; peers
        should send requests sharing their prefix here from now on, not once they are
        prefilled: docs/simulations.md, "Against an oracle"), then the engine's cached
        prefixes. Raises ``RuntimeError`` as ``Engine.cached_prefixes`` does."""
        queued = [w.prompt for w in self._work if w.prefill > 0 and w.prompt]
        return [*queued, *self.engine.cached_prefixes()]

    def _load_changed(self) -> None:
        """The work held changed: the group hears of it (rate-limited)."""
        if not self._work:
            self._idle_since = self.clock.monotonic()
        if self.group is not None:
            self.group.load_changed()

    def _admission(self, load: Load, tokens: int, rank: int = UNTOKENED) -> Admission | None:
        """What :func:`~model_node.priority.admit_held` (:func:`~model_node.admission.admit` by
        rank) gives a request with ``tokens`` prompt tokens to evaluate and ``rank`` now
        (``None``: refused)."""
        held = [Held(w.key, load.prefill_seconds(w.left()), w.promise, w.rank, w.running)
                for w in self._work if w.prefill > 0]
        return admit_held(held, load.prefill_seconds(tokens), self.clock.monotonic(), self.max_queue_wait,
                          rank=rank, reorders=self._ordered is not None)

    def _prefill_estimate(self, prompt_ids: list[int]) -> int:
        """Prompt tokens the engine will evaluate for ``prompt_ids``: those past the longest
        prefix it caches now (the cache may change before the request runs: an estimate)."""
        try:
            cached = self.engine.cached_prefixes()[:MAX_CACHED_PREFIXES_COMPARED]
        except RuntimeError:  # the engine's cache changed under us (a worker thread)
            cached = []
        reused = max((common_prefix(p, prompt_ids) for p in cached), default=0)
        return max(1, len(prompt_ids) - reused)

    def stats(self, nonce: int = 0) -> NodeStats:
        g = self.group
        return NodeStats(
            nonce=nonce, node_id=self.identity.node_id, model=self.model, forwarding=g is not None,
            active=self.active, queued=self.queued, served=self.served, busy=self.busy,
            prompt_tokens=self.totals["prompt_tokens"], evaluated_prompt_tokens=self.totals["evaluated_prompt_tokens"],
            cache_hits=self.totals["cache_hits"], forwarded_out=self.forwarded_out, forwarded_in=self.forwarded_in,
            forward_failed=self.forward_failed,
            decisions=tuple(Count(k, v) for k, v in sorted(self.decisions.items()))[:64],
            dropped=tuple(Count(k, v) for k, v in sorted(((g.state.dropped + g.dropped) if g else Counter()).items()))[:64],
            expired=g.state.expired if g else 0, members=len(g.state.members) if g else 1,
            l_version=g.state.lengths.version if g else 0,
            own_paths=g.state.tree.path_count(self.identity.node_id) if g else 0,
            peers=tuple(g.peer_rows()[:64]) if g else (), recent=tuple(self.recent),
            quota=tuple(Count(k, v) for k, v in sorted(self.redeemer.counts.items())) if self.redeemer else (),
        )

    async def _on_stats(self, conn: Connection, msg: StatsRequest) -> NodeStats | None:
        """Counters for nodes listed in the registry (diagnostics, tests, benchmarks)."""
        if conn.peer_id not in self._registry.by_id:
            log.info("stats request from unregistered node %s refused", short_id(conn.peer_id))
            return None
        return self.stats(msg.nonce)

    def _record(self, stats: GenStats, forwarded: bool) -> None:
        self.recent.append(Served(stats.prompt_tokens, stats.evaluated_prompt_tokens, stats.output_tokens,
                                  int(stats.ttft_s * 1e6), forwarded))
        self.totals["prompt_tokens"] += stats.prompt_tokens
        self.totals["evaluated_prompt_tokens"] += stats.evaluated_prompt_tokens
        if 2 * stats.evaluated_prompt_tokens <= stats.prompt_tokens:
            self.totals["cache_hits"] += 1

    # ------------------------------------------------------------------ forwarded requests

    def _take_forwarded(self, conn: Connection, req: Request) -> None:
        """A member forwarded ``req`` here (the group service checked it is one): answered in
        the background (:meth:`answer`), never forwarded again."""
        assert self._nursery is not None
        self._nursery.start_soon(self._answer_forwarded, req, Origin.forwarded_by(conn, req))

    async def _answer_forwarded(self, req: Request, origin: Origin) -> None:
        """:meth:`answer` as a task of its own (the member's connection reads on meanwhile)."""
        try:
            await self.answer(req, origin)
        except TransportError as exc:
            log.info("the member that forwarded a direct request is gone: %s", exc)

    async def _on_relayed_chunk(self, conn: Connection, chunk: ReplyChunk) -> None:
        """A reply chunk for a direct request we forwarded (from the member we sent it to)."""
        ch = self._relays.get((conn.peer_id, chunk.request_id))
        if ch is None:
            if self.group is not None:
                self.group.refuse(conn.peer_id, "unexpected-reply", "a reply chunk")
            return
        try:
            ch.send_nowait(chunk)
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            if self.group is not None:
                self.group.refuse(conn.peer_id, "reply-overflow", "a reply chunk")

    async def _forward(self, req: Request, target: bytes, origin: Origin) -> AsyncGenerator[ReplyChunk, None] | None:
        """Send ``req`` to ``target``. ``None``: it could not be sent (serve it here). For a
        request answered over a connection, the chunks the target sends back; otherwise nothing
        (the target answers the user's proxies itself)."""
        assert self.group is not None
        if origin.reply is None:
            return _empty() if await self.group.forward(target, req) else None
        key = (target, req.request_id)
        if key in self._relays:
            return None
        send, recv = trio.open_memory_channel[ReplyChunk](1024)
        self._relays[key] = send
        if not await self.group.forward(target, dataclasses.replace(req, return_paths=())):
            del self._relays[key]
            return None
        return self._relayed(req, key, recv)

    async def _relayed(self, req: Request, key: tuple[bytes, bytes],
                       recv: trio.MemoryReceiveChannel[ReplyChunk]) -> AsyncGenerator[ReplyChunk, None]:
        try:
            while True:
                with trio.move_on_after(RELAY_TIMEOUT) as scope:
                    chunk = await recv.receive()
                if scope.cancelled_caught:
                    yield self._chunk(req, 0, "", (), done=True,
                                      error="the model node this request was forwarded to stopped answering")
                    return
                yield chunk
                if chunk.done:
                    return
        finally:
            self._relays.pop(key, None)

    # ------------------------------------------------------------------ requests in

    async def _on_deliver(self, conn: Connection, msg: Deliver) -> None:
        """A clove from a proxy: once the responder has rebuilt a request from it, answer it."""
        req = await self.responder.on_deliver(conn, msg)
        if req is not None:
            await self.answer(req, ANONYMOUS)

    async def _on_direct(self, conn: Connection, req: Request) -> None:
        """A plain, NON-anonymous request over an authenticated connection: answered on the same
        connection (also when forwarded: through this node) before the next message is read."""
        await self.answer(req, Origin.direct(conn))

    def _opens_cloves_from(self, proxy: bytes) -> bool:
        """Whether the responder opens ``proxy``'s cloves: with ``registered_only``, only a
        proxy in the current user list (updated in place from the committee's lists: a node
        that left loses access at once); :attr:`on_unlisted` hears of any other."""
        if not self.registered_only or self._proxy(proxy) is not None:
            return True
        if self.on_unlisted is not None:
            self.on_unlisted()
        return False

    def _proxy(self, node_id: bytes) -> Any:
        """Reply cloves go only to registered user nodes (proxies), never to other model nodes."""
        e = self._registry.by_id.get(node_id)
        return e if e is not None and e.role == "user" else None

    def accepts_direct_from(self, peer: bytes) -> bool:
        """Whether a plain, non-anonymous request from ``peer`` is answered: from members of
        this node's group, or from anyone with ``accept_direct_requests``."""
        return self.accept_direct_requests or (self.group is not None and self.group.is_member(peer))

    async def answer(self, req: Request, origin: Origin) -> None:
        """The one way in: every request, whatever its ``origin``, is answered here. A plain
        request its origin may not send is refused (:meth:`_refusal`); any other is served by
        :meth:`handle` (admission, forwarding, the engine, the reply chunks), whose chunks go
        where ``origin`` says: to the request's return paths, as cloves (the responder runs the
        reply in the background and refuses duplicates, malformed return paths and requests
        beyond its capacity), or back on the connection the request came over (this returns
        once the reply is sent; raises ``TransportError`` if that connection fails)."""
        if origin.reply is None:
            self.responder.accept(req, lambda r: self.handle(r, origin), lambda r, why: self._busy(r, why, origin))
            return
        refusal = self._refusal(req, origin)
        chunks = only(refusal) if refusal is not None else self.handle(req, origin)
        async with aclosing(chunks) as stream:
            async for chunk in stream:
                await origin.reply.send(chunk)
                if chunk.done:
                    break

    def _refusal(self, req: Request, origin: Origin) -> ReplyChunk | None:
        """The error reply to a plain request from a peer this node does not answer
        (:meth:`accepts_direct_from`), or with a request id answered already; ``None``: serve it.
        A forwarded request was checked by the group service, an anonymous one by the responder."""
        if origin.via is not Via.DIRECT or origin.conn is None:
            return None
        if not self.accepts_direct_from(origin.conn.peer_id):
            log.info("plain request from %s refused (not a group member; --accept-direct-requests is off)",
                     short_id(origin.conn.peer_id))
            return self._chunk(req, 0, "", (), done=True, error=DIRECT_REFUSED)
        if not self.answered.take(req.request_id, self.clock.monotonic()):
            return self._chunk(req, 0, "", (), done=True, error=invalid_error(
                "this request id was answered already: a node answers each request id once (send a new request)"),
                failure=Failure.INVALID)
        return None

    def _chunk(self, req: Request, seq: int, text: str, ids: tuple[int, ...], *, done: bool = False,
               error: str = "", failure: Failure = Failure.NODE_ERROR, signer: ReplySigner | None = None,
               prompt_tokens: int = 0) -> ReplyChunk:
        """A reply chunk; with ``signer`` (every output chunk) it carries the reply's hash chain
        after it and this node's signature over it (:mod:`overlay.anon.signing`), and the prompt's
        token count. An error chunk (``error``: the words) carries ``failure``, the code the
        client acts on (:mod:`overlay.wire.failures`)."""
        chain, signature, signed_at_ms = b"", b"", 0
        if signer is not None:
            signed_at_ms = int(self.clock.unix() * 1000)
            chain, signature = signer.add(text, ids, done, signed_at_ms, self.identity.sign)
        return ReplyChunk(request_id=req.request_id, seq=seq, text=text, token_ids=ids, done=done, error=error,
                          node=self.identity.node_id, chain=chain, signature=signature, signed_at_ms=signed_at_ms,
                          prompt_tokens=prompt_tokens, failure=failure if error else Failure.NONE)

    async def handle(self, req: Request, origin: Origin = ANONYMOUS) -> AsyncGenerator[ReplyChunk, None]:
        """:meth:`_handle`'s chunks; with a :attr:`served_store`, the reply is recorded as it goes
        out, under the node the client addressed (this one, or the member that forwarded the request
        here), and kept once its final chunk went (:mod:`model_node.served`; a failure there never
        reaches the reply)."""
        rec = self._recording(req, origin)
        async with aclosing(self._handle(req, origin)) as chunks:
            async for chunk in chunks:
                if rec is not None and rec.open:
                    self._record_chunk(rec, chunk)
                yield chunk

    def _recording(self, req: Request, origin: Origin) -> Recording | None:
        if self.served_store is None:
            return None
        try:  # a forwarded request was addressed to the member that sent it, which the reply signs
            return self.served_store.begin(req, origin.target or self.identity.node_id)
        except Exception:
            log.exception("served store: a request could not be recorded")
            return None

    def _record_chunk(self, rec: Recording, chunk: ReplyChunk) -> None:
        assert self.served_store is not None
        try:
            kept = rec.add(chunk)
            if kept is not None:
                self.served_store.keep(kept, int(self.clock.unix() * 1000))
        except Exception:
            rec.open = False
            log.exception("served store: a reply could not be kept")

    async def _handle(self, req: Request, origin: Origin = ANONYMOUS) -> AsyncGenerator[ReplyChunk, None]:
        """Serve one request and yield its reply chunks (:meth:`answer` sends them where they
        go): admit (validate, tokenize), forward or queue, generate, stream, sign. ``origin``
        (:class:`Origin`) decides what differs: a forwarded request is served here whatever the
        load, and its reply's signature names the member the client addressed; a request this
        node forwards has the member's chunks relayed through here if its reply goes over a
        connection (a user's request is answered straight to its proxies). A request with a bad
        usage-quota token is refused before anything else is done for it (:meth:`_screen`)."""
        prompt_ids, refusal = self._admit(req)
        token: Token | None = None
        if refusal is None:
            token, refusal = await self._screen(req)
        if refusal is None and self.group is not None:
            relayed = await self._route(req, prompt_ids, origin)
            if relayed is not None:
                async with aclosing(relayed) as chunks:
                    async for chunk in chunks:
                        yield chunk
                return
        if refusal is not None:
            failure, why = refusal
            yield self._chunk(req, 0, "", (), done=True, error=why, failure=failure)
            return
        async with aclosing(self._serve_here(req, prompt_ids, origin, token)) as chunks:
            async for chunk in chunks:
                yield chunk

    async def _screen(self, req: Request) -> tuple[Token | None, tuple[Failure, str] | None]:
        """``req``'s usage-quota token after the checks that need no issuer
        (:meth:`~model_node.quota.Redeemer.screen`): ``(token, None)``, redeemed by the node that
        serves the request once it has taken it (:meth:`_queue`); ``(None, None)``: none, or one
        that cannot be checked (no redeemer here, quotas off, the committee unreachable: the
        request is served best-effort, as one without); or the refusal of a bad one
        (invalid: ``quota token refused: ...``)."""
        if not req.quota or self.redeemer is None:
            return None, None
        got = await self.redeemer.screen(req.quota)
        if isinstance(got, Token):
            return got, None
        self.redeemer.count(got)
        return None, ((got.failure, got.error()) if got.refused else None)

    def _admit(self, req: Request) -> tuple[list[int], tuple[Failure, str] | None]:
        """``(prompt token ids, None)``, or ``([], (failure, why))`` when this node cannot serve
        ``req``: another model (a node error: another node may serve it), bad sampling
        parameters, a prompt the engine refuses, or a prompt plus ``max_tokens`` beyond the
        context window (invalid: any node would refuse it)."""
        if req.model != self.model:
            return [], (Failure.NODE_ERROR, f"this node serves {self.model!r}, not {req.model!r}")
        why = check_params(req, self.max_tokens_limit)
        if why is not None:
            return [], (Failure.INVALID, invalid_error(why))
        try:
            prompt_ids = self.engine.chat_prompt(req.messages, req.continuation)
        except EngineError as exc:
            return [], (Failure.INVALID, invalid_error(str(exc)))
        ctx = self.engine.context_window
        if len(prompt_ids) + req.params.max_tokens > ctx:
            return [], (Failure.INVALID, invalid_error(
                f"the prompt ({len(prompt_ids)} tokens) plus max_tokens ({req.params.max_tokens}) exceeds the "
                f"model's context window of {ctx} tokens"))
        return prompt_ids, None

    async def _route(self, req: Request, prompt_ids: list[int],
                     origin: Origin) -> AsyncGenerator[ReplyChunk, None] | None:
        """Ask the group where ``req`` is served. ``None``: here. Otherwise it was forwarded,
        and the chunks to pass on (none unless its reply goes over a connection)."""
        assert self.group is not None
        try:
            if not origin.forwarded:
                self.group.observe(prompt_ids)
            target = self.group.decide(prompt_ids, forwarded=origin.forwarded).target
        except Exception:
            log.exception("forwarding decision failed; serving the request here")
            return None
        if target is None:
            return None
        return await self._forward(req, target, origin)

    async def _serve_here(self, req: Request, prompt_ids: list[int], origin: Origin,
                          token: Token | None = None) -> AsyncGenerator[ReplyChunk, None]:
        """Take the request or answer "busy" at once (:meth:`_take`), wait in the queue
        (:meth:`_queue`: its quota ``token`` redeemed, then a slot), then generate."""
        own = self._prefill_estimate(prompt_ids)
        rank = UNTOKENED if token is None else token_rank(token)  # as its token claims: redeemed in _queue
        taken, why = self._take(own, rank)
        if taken is None:
            self.busy += 1
            yield self._busy(req, why, origin)
            return
        limit = req.params.max_tokens
        work = _Work(own, self.throughput.expected_output(limit), limit, key=taken.key, promise=taken.promise,
                     prompt=prompt_ids, rank=rank)
        self._work.add(work)
        self.queued += 1
        self._load_changed()
        refusal: ReplyChunk | None = None
        try:
            refusal = await self._queue(req, work, token, origin)
        finally:
            self.queued -= 1
            if not work.running:
                self._work.discard(work)
                self._load_changed()
        if refusal is not None:
            yield refusal
            return
        self.active += 1
        try:
            async with aclosing(self._generate(req, prompt_ids, work, origin)) as chunks:
                async for chunk in chunks:
                    yield chunk
        finally:
            self.active -= 1
            self._work.discard(work)
            self._gate.release()
            self._load_changed()

    def _take(self, own: int, rank: int) -> tuple[Admission | None, str]:
        """Whether to take a request of ``own`` prompt tokens to evaluate and ``rank`` (the class
        its token claims once it passed the local checks; 0 without one): its admission
        (:mod:`model_node.admission`, by rank: :mod:`model_node.priority`), or ``None`` and why it is
        "busy": the queue is full (a request then takes the place of a waiter below its rank instead,
        once its token is redeemed), its first token would come too late, or every slot is taken
        and the work ahead exceeds ``max_queue_wait``. Prompts are evaluated one after another, so
        free slots alone do not make room."""
        if self.queued >= self.max_queue and not self._gate.evictable(rank):
            return None, f"model node is at capacity ({self.queued} requests queued)"
        load = self._load_ahead(rank)
        taken = self._admission(load, own, rank)
        if taken is None:
            wait = load.prefill_seconds(own + load.prefill_tokens)
            return None, (f"model node cannot take this request now: its first token would come after more than "
                          f"{self.max_queue_wait:g} s (about {wait:.0f} s of prompts to evaluate, or earlier requests' "
                          "promised first tokens would be late)")
        if self._gate.free == 0 and load.relative > self.max_queue_wait:
            return None, (f"model node cannot take this request now: every slot is taken and about "
                          f"{load.relative:.0f} s of work queued")
        return taken, ""

    async def _queue(self, req: Request, work: _Work, token: Token | None, origin: Origin) -> ReplyChunk | None:
        """The wait of a request taken (``work``): its quota ``token``, if any, is redeemed now,
        once taken, so that a request refused "busy" keeps it for the next node (refused: the
        error chunk to answer; unchecked: it waits as a request without, :meth:`_demote`; tokened:
        it takes the place of a waiter below its rank if the queue is over ``max_queue``, and may
        stop a lower-rank generation, :meth:`_preempt`); then it waits for a slot until
        ``max_queue_wait`` seconds after it was taken (the highest rank's waiters first). ``None``:
        it holds a slot (``work.running``); else the error chunk to answer."""
        start = self.clock.monotonic()
        if token is not None:
            assert self.redeemer is not None
            verdict = await self.redeemer.redeem(token)
            self.redeemer.count(verdict)
            if verdict.refused:
                return self._chunk(req, 0, "", (), done=True, error=verdict.error(), failure=verdict.failure)
            if not verdict.tokened:
                self._demote(work)
            else:
                if self.queued > self.max_queue:
                    self._gate.evict(work.rank)
                self._preempt(work.rank)
        with trio.move_on_after(max(0.0, start + self.max_queue_wait - self.clock.monotonic())):
            if await self._gate.acquire(work.rank):
                work.running = True
                return None
            self.busy += 1
            return self._busy(req, f"{_outranking(work.rank)} took this request's place in the model node's full queue",
                              origin)
        self.busy += 1
        return self._busy(req, f"no free slot on this model node within {self.max_queue_wait:g} s", origin)

    def _preempt(self, rank: int) -> None:
        """A request of ``rank`` is about to wait for a slot: when every slot is taken, stop the
        generation :func:`model_node.priority.preempt` names for the waiters (a lower-rank one,
        for the highest waiter the generations already stopping leave without a slot): it answers
        "busy" after what it sent, and its slot goes to the oldest waiter of the highest rank."""
        if self._gate.free > 0:
            return
        running = sorted((w for w in self._work if w.running and not w.preempted), key=lambda w: w.key)  # a set: ordered
        stopping = sum(1 for w in self._work if w.running and w.preempted)
        i = preempt([(w.rank, w.produced) for w in running], [*self._gate.waiting(), rank], stopping)
        if i is not None:
            running[i].preempted = True

    def _demote(self, work: _Work) -> None:
        """``work`` was taken with its token's rank but its token could not be checked: it waits
        as an untokened request, at the place admission gives one now (else behind every one), on
        a best-effort promise. Never refused here: its token may be spent at some issuer already."""
        self._work.discard(work)
        taken = self._admission(self.current_load(), work.prefill)
        self._work.add(work)
        work.rank = UNTOKENED
        if taken is not None:
            work.key, work.promise = taken.key, taken.promise
        else:
            work.key = max((w.key for w in self._work), default=0.0) + 1.0
            work.promise = self.clock.monotonic() + self.max_queue_wait

    def _busy(self, req: Request, why: str, origin: Origin) -> ReplyChunk:
        """A "busy" error chunk saying ``why`` (the user's client tries another model node), before
        any output: signed over the request's digest (:func:`overlay.anon.signing.busy_signing_bytes`,
        the target as for a reply), so a donor can show its verifiers the node refused the request
        it committed to (decision 0044)."""
        signed_at_ms = int(self.clock.unix() * 1000)
        digest = request_digest(req, origin.target or self.identity.node_id)
        chunk = self._chunk(req, 0, "", (), done=True, failure=Failure.BUSY, error=busy_error(
            f"{why}; try another model node serving the model, or again in a minute"))
        signature = self.identity.sign(busy_signing_bytes(digest, self.model, self.identity.node_id, signed_at_ms))
        return dataclasses.replace(chunk, signature=signature, signed_at_ms=signed_at_ms)

    async def _generate(self, req: Request, prompt_ids: list[int], work: _Work,
                        origin: Origin) -> AsyncGenerator[ReplyChunk, None]:
        all_ids: list[int] = []
        seq, size, last = 0, 0, self.clock.monotonic()
        first_at: float | None = None
        buf: list[str] = []
        ids: list[int] = []
        stopped = False  # pre-empted (work.preempted seen before the engine's last piece)
        signer = ReplySigner(request_digest(req, origin.target or self.identity.node_id), self.model,
                             self.identity.node_id)
        try:
            if self._ordered is not None:
                gen = self._ordered.generate(prompt_ids, req.params, priority=work.key)
            else:
                gen = self.engine.generate(prompt_ids, req.params)
        except EngineError as exc:
            yield self._chunk(req, 0, "", (), done=True, error=str(exc))
            return
        work.gen = gen
        self.throughput.prefill_started(last)
        try:
            async with aclosing(gen.__aiter__()) as pieces:
                async for piece in pieces:
                    if work.preempted:
                        stopped = True
                        break
                    buf.append(piece.text)
                    ids.extend(piece.token_ids)
                    size += len(piece.text)
                    now = self.clock.monotonic()
                    if first_at is None:
                        self.throughput.prefill_ended(now, work.prefill)
                        first_at, work.prefill = now, 0
                        self._load_changed()
                    work.produced += len(piece.token_ids)
                    if seq == 0 or now - last >= CHUNK_INTERVAL or size >= CHUNK_MAX_CHARS:
                        all_ids.extend(ids)
                        yield self._chunk(req, seq, "".join(buf), tuple(ids), signer=signer,
                                          prompt_tokens=len(prompt_ids))
                        seq, buf, ids, size, last = seq + 1, [], [], 0, now
        except EngineError as exc:  # the engine failed mid-reply: say so (unsigned; the client fails over)
            log.warning("engine failed during a reply: %s", exc)
            yield self._chunk(req, seq, "", (), done=True, error=str(exc))
            return
        finally:
            if first_at is None:  # ended before its first token: its time counts with the next sample
                self.throughput.prefill_ended(self.clock.monotonic(), None)
        if stopped:  # a higher-rank request took its slot: "busy" after what was sent (the client fails over)
            self.preempted += 1
            yield self._chunk(req, seq, "", (), done=True, failure=Failure.BUSY, error=busy_error(
                f"{_outranking(work.rank)} took this request's slot on the model node (requests are served by "
                "their usage-quota token's class: priority, standard, then none); try another model node"))
            return
        all_ids.extend(ids)
        if first_at is not None:
            self.throughput.record(len(all_ids), self.clock.monotonic() - first_at)
        self.served += 1
        if gen.stats is not None:
            self._record(gen.stats, origin.forwarded)
            log.info("served %d prompt tokens (%d evaluated), %d output tokens, ttft %.3fs",
                     gen.stats.prompt_tokens, gen.stats.evaluated_prompt_tokens, gen.stats.output_tokens,
                     gen.stats.ttft_s)
        yield self._chunk(req, seq, "".join(buf), tuple(ids), done=True, signer=signer, prompt_tokens=len(prompt_ids))

    def directory_changed(self) -> None:
        """The registry was updated in place (a committee list update): dial new nodes, forget
        removed ones, regroup."""
        self.node.peers = {e.node_id: e for e in self._registry.entries if e.node_id != self.identity.node_id}
        if self.group is not None:
            self.group.state.set_members(self.group.members_of(self._registry))

    async def serve(
        self, host: str = "127.0.0.1", port: int = 0, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
    ) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self.responder.run)
            address = await nursery.start(self.node.serve, host, port)
            if self.group is not None:
                await nursery.start(self.group.run)
            if self.redeemer is not None:
                nursery.start_soon(self.redeemer.prefetch)
            task_status.started(address)


@dataclass(eq=False, slots=True)
class _Work:
    """One request's work while it is queued or generated here (hashed by identity):
    ``prefill`` prompt tokens still to evaluate (0 once its first token is out), ``expected``
    output tokens to expect (:meth:`Throughput.expected_output`), ``limit`` its
    ``max_tokens``, ``produced`` so far; its admission ``key`` (the engine's prompt order) and
    ``promise``, the time its first token is promised by (:mod:`model_node.admission`);
    ``prompt`` its prompt's token ids (announced to the group until its prefill is done);
    ``rank``: its quota token's class (:mod:`model_node.priority`; as the token claims while it is
    being redeemed, 0 without one or once demoted); ``running``: it holds a slot."""

    prefill: int
    expected: int
    limit: int
    produced: int = 0
    key: float = 0.0
    promise: float = math.inf
    gen: Any = None  # the engine's generation, once started
    prompt: list[int] = dataclasses.field(default_factory=list)
    rank: int = UNTOKENED  # it is served ahead of lower ranks (model_node/priority.py)
    running: bool = False  # it holds a slot
    preempted: bool = False  # a higher-rank request waits for its slot: its generation stops at its next piece

    def left(self) -> int:
        """``prefill``, or what the engine reports is left of the prompt (``prompt_left``)."""
        now = getattr(self.gen, "prompt_left", None)
        return self.prefill if now is None or self.prefill == 0 else min(self.prefill, now)

    @property
    def remaining(self) -> int:
        """Output tokens still to expect: the rest of ``expected``; a reply already longer
        than expected is assumed to run as long again; never beyond ``limit``."""
        left = self.expected - self.produced if self.produced < self.expected else self.expected
        return max(0, min(self.limit - self.produced, left))


def _outranking(rank: int) -> str:
    """Who takes the place or slot of a request of ``rank``: one of a higher rank."""
    return "a request with a usage-quota token" if rank == UNTOKENED else "a request with a priority usage-quota token"


async def _empty() -> AsyncGenerator[ReplyChunk, None]:
    return
    yield  # an async generator that yields nothing

