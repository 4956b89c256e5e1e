"""A model node's view of its group: the node table, the HR-tree, and their sync (paper §3.3).

All model nodes serving one model form a group (split by region above
:data:`MAX_GROUP_SIZE` = 50 nodes, :func:`split_groups`). :class:`GroupState` is the I/O-free
core a driver pumps::

    sends = state.tick(now)                    # every SYNC_INTERVAL: this round's reports
    sends = state.report_load(now)             # between rounds: our load changed (issue 29)
    sends = state.on_message(peer, msg, now)   # a sync message from an authenticated peer
    sends = state.observe(token_ids, now)      # a user's request arrived (the Sentry learns)
    decision = state.decide(token_ids, forwarded=False, now=now)   # serve or forward

Each returns what to send (:class:`Send`) or what to do (:class:`Decision`); the driver
feeds ``set_local_load`` and ``set_local_prefixes`` (the engine's cached prefixes) before
each ``tick``.

**State synchronisation.** Every round each node sends each member a :class:`LoadReport` and
a :class:`SubtreeUpdate`: a delta on the previous round, or the full subtree on the first
round, every ``full_every`` rounds, after adopting a new ``L``, and to peers that asked
(:class:`SubtreeRequest`, sent when a delta does not apply — a lost or reordered update).
Late updates (sequence numbers not newer than what we hold) are dropped; peers silent for
``expiry_rounds`` rounds leave the node table and the tree. Between rounds a node also pushes
its load to every member whenever it changes (:meth:`GroupState.report_load`, rate-limited by
the driver): a round's report may be 5 s old, and the simulation found stale peer loads the
main reason HR-tree forwarding fell behind a central oracle (docs/simulations.md). Load reports
have their own sequence numbers, never behind the round's: subtree deltas chain on the
round's ``seq - 1``, so a pushed report must not advance it.

**Bad input.** Everything a peer sends is validated before it touches the state: members
only, value ranges, sizes, the ``L`` version and digest, path shapes, delta consistency. A
bad message is dropped with a reason counted in ``state.dropped[reason]`` and logged; it never
raises and never changes the tree.

**Churn (issue 15, item 7).** A new ``L`` makes every member rebuild its tree, so adoption
is guarded: a newer ``L`` is adopted only from the *designated proposer* (the lowest id among
ourselves and the peers we hear), or from another member passing on exactly the version the
designated proposer reports; the designated proposer may advance the version at most once per
``MIN_PROPOSAL_ROUNDS`` rounds and by at most ``MAX_VERSION_STEP``, and replace an ``L`` of the
same version at most once; a load report may not claim a version more than
``MAX_VERSION_STEP`` ahead of ours. A member that breaks one of these rules is *quarantined*:
dropped from the node table and the tree, and everything it sends ignored, for
``QUARANTINE_SECONDS`` (reasons ``version-jump``, ``churn``; a non-designated proposal is only
refused, ``not-proposer``, since honest members pass ``L`` on). A node still at version 0
(just started) takes the group's version from the designated proposer's report.

**Forwarding.** :meth:`GroupState.decide` runs the configured rule (``GroupConfig.rule``:
least predicted TTFT, :func:`model_node.forwarding.least_ttft`, by default; ``"alg2"``: the
paper's Algorithm 2, :func:`model_node.forwarding.algorithm2`) on this state's node table and
HR-tree and keeps its bookkeeping: decisions counted by reason, a forward counted against its
target until the target's next load report.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from model_node.forwarding import (
    DEFAULT_LOAD_THRESHOLD,
    Decision,
    Load,
    algorithm2,
    least_ttft,
    with_group_rates,
)
from model_node.hrtree import (
    DEFAULT_BITS,
    MAX_L_VERSION,
    MAX_PATHS_PER_NODE,
    ChunkLengths,
    HRTree,
    Match,
    default_tau_c,
    lengths_problem,
)
from model_node.messages import LengthProposal, LoadReport, SubtreeRequest, SubtreeUpdate
from model_node.sentry import LengthAgreement, Sentry, proposer
from overlay.anon.actions import Send
from overlay.wire.constants import MAX_CAPACITY, MIN_CAPACITY

log = logging.getLogger("gentorrent.model.group")

MAX_GROUP_SIZE = 50  # paper §3.3: a larger group splits (by region)
SYNC_INTERVAL = 5.0  # seconds between rounds (paper §5)
EXPIRY_ROUNDS = 3  # a peer silent this many rounds leaves the table and the tree
FULL_EVERY = 12  # rounds between full subtrees sent to everyone (1 min at 5 s)
MAX_REQUESTS = 1_000_000  # active or queued requests a report may claim
MAX_LATENCY_MS = 10_000_000
MAX_IDLE_MS = 10**12  # how long a report may say its node has been idle (about 31 years): also "never held work"
RULES = ("ttft", "alg2")  # GroupConfig.rule
MAX_WORK_TOKENS = 10**9  # prefill or decode tokens a report may claim
MAX_RATE_MTPS = 10**10  # a measured rate, in thousandths of a token per second (10 million tokens/s)
MAX_STREAMS = 4096  # sequences a node may generate at once
MAX_REQUESTS_PER_REPORT = 100_000  # increments of a peer's request counter credited per report
MAX_VERSION_STEP = 4  # an L (or a load report) may be at most this many versions ahead of ours
MIN_PROPOSAL_ROUNDS = 6  # rounds between two version advances of the designated proposer (30 s)
QUARANTINE_SECONDS = 300.0  # a member that breaks the L rules is ignored and out of the table this long
RTT_SAMPLES = 5  # round trips kept per peer; the least is its hop cost (queueing only adds to a sample)
MAX_RTT = 60.0  # seconds: a round trip longer than this is kept as this
_U63 = 2**63

# Drop reasons that mean "the peer misbehaves" (logged as warnings); others are routine.
_SUSPECT = frozenset({"non-member", "bad-load", "oversized", "malformed-path", "inconsistent",
                      "bad-proposal", "unexpected-message", "version-jump", "churn"})


@dataclass(slots=True)
class PeerState:
    last_heard: float
    load: Load | None = None
    load_seq: int = -1
    load_at: float = -math.inf  # when its load report (hence its idle_ms) arrived
    requests: int | None = None
    subtree_seq: int | None = None  # round of the subtree we hold; None: need a full one
    l_version: int = 0
    full_requested_at: float = -math.inf
    proposal_sent_at: float = -math.inf


@dataclass(frozen=True)
class GroupConfig:
    """Tunables (defaults: docs/decisions/0005-hrtree.md)."""

    bits: int = DEFAULT_BITS  # b of the version-0 L (a proposal's b wins once adopted)
    tau_c: int | None = None  # None: default_tau_c(b) = ⌈16 / b⌉, 2 for 8-bit hashes
    load_threshold: float = DEFAULT_LOAD_THRESHOLD
    sync_interval: float = SYNC_INTERVAL
    expiry_rounds: int = EXPIRY_ROUNDS
    full_every: int = FULL_EVERY
    max_paths_per_node: int = MAX_PATHS_PER_NODE
    # "ttft": least predicted time to first token (issue 29); "alg2": the paper's Algorithm 2
    # (load_threshold applies to it only)
    rule: str = "ttft"


def load_problem(msg: LoadReport) -> str | None:
    """Why a peer's load report is unacceptable, or ``None``."""
    if not 0 <= msg.seq < _U63 or not 0 <= msg.requests < _U63:
        return "seq and requests must be within 0..2^63-1"
    if not 0 <= msg.l_version <= MAX_L_VERSION:
        return "l_version must be within 0..2^62"
    if not 0 <= msg.active <= MAX_REQUESTS or not 0 <= msg.queued <= MAX_REQUESTS:
        return f"active and queued must be within 0..{MAX_REQUESTS}"
    if not MIN_CAPACITY <= msg.capacity <= MAX_CAPACITY:
        return f"capacity {msg.capacity} outside {MIN_CAPACITY}..{MAX_CAPACITY}"
    if not 0 <= msg.kv_usage_permille <= 1000:
        return "kv_usage_permille outside 0..1000"
    if not 0 <= msg.latency_ms <= MAX_LATENCY_MS:
        return f"latency_ms outside 0..{MAX_LATENCY_MS}"
    if not 0 <= msg.prefill_tokens <= MAX_WORK_TOKENS or not 0 <= msg.decode_tokens <= MAX_WORK_TOKENS:
        return f"prefill_tokens and decode_tokens must be within 0..{MAX_WORK_TOKENS}"
    if not 0 <= msg.prefill_mtps <= MAX_RATE_MTPS or not 0 <= msg.decode_mtps <= MAX_RATE_MTPS:
        return f"prefill_mtps and decode_mtps must be within 0..{MAX_RATE_MTPS}"
    if not 1 <= msg.streams <= MAX_STREAMS:
        return f"streams {msg.streams} outside 1..{MAX_STREAMS}"
    if not -1 <= msg.match_wait_ms <= MAX_LATENCY_MS:
        return f"match_wait_ms outside -1..{MAX_LATENCY_MS}"
    if not -1 <= msg.idle_ms <= MAX_IDLE_MS:
        return f"idle_ms outside -1..{MAX_IDLE_MS}"
    return None


def load_of(msg: LoadReport) -> Load:
    """The node-table row a (valid) load report stands for."""
    return Load(msg.active, msg.queued, msg.capacity, msg.kv_usage_permille, msg.latency_ms,
                prefill_tokens=msg.prefill_tokens, decode_tokens=msg.decode_tokens,
                prefill_rate=msg.prefill_mtps / 1000, decode_rate=msg.decode_mtps / 1000, streams=msg.streams,
                match_wait=msg.match_wait_ms / 1000 if msg.match_wait_ms >= 0 else -1.0, idle_ms=msg.idle_ms)


def report_of(load: Load, seq: int, l_version: int, requests: int) -> LoadReport:
    """This node's load report number ``seq``."""
    return LoadReport(seq, l_version, load.active, load.queued, load.capacity, load.kv_usage_permille,
                      load.latency_ms, requests, load.prefill_tokens, load.decode_tokens,
                      round(load.prefill_rate * 1000), round(load.decode_rate * 1000), load.streams,
                      min(MAX_LATENCY_MS, round(load.match_wait * 1000)) if load.match_wait >= 0 else -1,
                      min(MAX_IDLE_MS, load.idle_ms) if load.idle_ms >= 0 else -1)


def proposal_of(lengths: ChunkLengths) -> LengthProposal:
    return LengthProposal(lengths.version, lengths.lengths, lengths.tail, lengths.bits)


class GroupState:
    """One model node's group state: members, node table, HR-tree, ``L``, and Algorithm 2.

    ``members``: the node ids of the group (from the signed registry: model nodes serving
    this model, after :func:`split_groups`); ``self_id`` is always a member. ``capacity``:
    this node's score 1–10. ``initial_seq``: the first round number (the driver passes its
    wall clock in ms). ``sentry``: learns ``L`` (a default one if omitted).
    """

    def __init__(self, self_id: bytes, members: Iterable[bytes], *, capacity: int = 1,
                 lengths: ChunkLengths | None = None, config: GroupConfig | None = None,
                 sentry: Sentry | None = None, initial_seq: int = 0) -> None:
        self.self_id = self_id
        self.config = config or GroupConfig()
        if self.config.rule not in RULES:
            raise ValueError(f"unknown forwarding rule {self.config.rule!r}; choose one of {RULES}")
        self.members: frozenset[bytes] = frozenset(members) | {self_id}
        self.agreement = LengthAgreement(lengths or ChunkLengths(bits=self.config.bits))
        self.sentry = sentry or Sentry()
        self.local = Load(capacity=capacity)
        self._check_local(self.local)
        self.peers: dict[bytes, PeerState] = {}
        self.dropped: Counter[str] = Counter()
        self.decisions: Counter[str] = Counter()
        self.expired = 0
        self.requests = 0  # user requests observed here, in total
        self.seq = initial_seq  # the round number of the last tick
        self.load_seq = initial_seq  # the number of our last load report (round or pushed), >= seq
        self.loads_pushed = 0  # load reports sent between rounds (report_load)
        self.highest_version_seen = self.lengths.version
        self.versions_exhausted = False
        self.quarantined: dict[bytes, float] = {}  # peer -> time until which it is ignored
        self._last_advance = -math.inf  # when our L's version last advanced (adopted or proposed)
        self._replaced_at_version: int | None = None  # version whose L the proposer already replaced once
        self._round = 0
        self._sent_mark: int | None = None  # journal seq of our subtree at the last tick; None: full next
        self._full_for: set[bytes] = set()
        self._local_prefixes: list[Sequence[int]] = []
        self._path_memo: dict[tuple[int, ...], bytes] = {}
        self._rtts: dict[bytes, deque[float]] = {}  # member -> its last RTT_SAMPLES round trips (the driver pings)
        self.tree = self._new_tree(self.lengths)

    # ------------------------------------------------------------------ accessors

    @property
    def lengths(self) -> ChunkLengths:
        """The group's current ``L`` as this node knows it."""
        return self.agreement.current

    @property
    def tau_c(self) -> int:
        """The minimum matched depth ``τ_c`` in force (configured, or ⌈16 / b⌉ of the current ``L``)."""
        tau = self.config.tau_c if self.config.tau_c is not None else default_tau_c(self.lengths.bits)
        return max(1, tau)

    def live_ids(self) -> list[bytes]:
        """Ourselves and every peer heard from within the expiry time."""
        return [self.self_id, *self.peers]

    def is_proposer(self) -> bool:
        """Whether this node proposes ``L``: the lowest id among the live members (A3)."""
        return proposer(self.live_ids()) == self.self_id

    def designated(self) -> bytes | None:
        """The designated proposer as we see it: the lowest id among ourselves and the live
        peers (quarantined peers are not in the table, so never designated)."""
        return proposer(self.live_ids())

    def table(self) -> dict[bytes, Load]:
        """The node table: every node with a known load, ourselves included."""
        out = {self.self_id: self.local}
        out.update((p, st.load) for p, st in self.peers.items() if st.load is not None)
        return out

    def search(self, token_ids: Sequence[int]) -> Match:
        return self.tree.search(token_ids)

    def hops(self) -> dict[bytes, float]:
        """The seconds a forward to each member adds: the least of its last
        :data:`RTT_SAMPLES` measured round trips (members never measured are absent)."""
        return {p: min(samples) for p, samples in self._rtts.items() if samples}

    # ------------------------------------------------------------------ local inputs

    def set_rtt(self, peer: bytes, seconds: float) -> None:
        """A round trip to member ``peer`` was measured (the driver pings the members); other
        ids and negative or non-finite values are ignored, values over :data:`MAX_RTT` capped."""
        if peer == self.self_id or peer not in self.members or not 0 <= seconds < math.inf:
            return
        self._rtts.setdefault(peer, deque(maxlen=RTT_SAMPLES)).append(min(seconds, MAX_RTT))

    def set_members(self, members: Iterable[bytes]) -> None:
        """A new member list (registry update, group split): non-members are forgotten."""
        self.members = frozenset(members) | {self.self_id}
        for peer in [p for p in self.peers if p not in self.members]:
            self._forget(peer)
        self._full_for &= self.members
        for peer in [p for p in self._rtts if p not in self.members]:
            del self._rtts[peer]

    def set_local_load(self, load: Load) -> None:
        """This node's load now (its ``capacity`` is this node's score 1–10). Raises
        ``ValueError`` on a capacity outside 1..10 or a negative figure."""
        self._check_local(load)
        self.local = dataclasses.replace(load, pending=0, pending_tokens=0)

    def set_local_prefixes(self, prefixes: Iterable[Sequence[int]]) -> None:
        """The engine's cached prefixes now (``Engine.cached_prefixes()``): our subtree.

        At most ``max_paths_per_node`` distinct paths are kept, in the order given."""
        self._local_prefixes = list(prefixes)
        self._sync_local_paths()

    def observe(self, token_ids: Sequence[int], now: float) -> list[Send]:
        """A request arrived from a user (not a forwarded one): the Sentry learns from it,
        and if this node is the proposer and a refresh is due, a new ``L`` goes out."""
        self.requests += 1
        self.sentry.observe(token_ids)
        return self._maybe_propose(now)

    # ------------------------------------------------------------------ rounds

    def tick(self, now: float) -> list[Send]:
        """One synchronisation round: expire silent peers, then this round's load report and
        subtree update for every other member."""
        self.expire(now)
        self.seq += 1
        cur = self.lengths
        load = report_of(self.local, self._next_load_seq(), cur.version, self.requests)
        mark = self.tree.seq(self.self_id)
        full = SubtreeUpdate(self.seq, 0, True, cur.version, cur.digest, self.tree.paths(self.self_id), ())
        update = full
        if self._sent_mark is not None and self._round % self.config.full_every:
            delta = self.tree.delta_since(self.self_id, self._sent_mark)
            if delta is not None and len(delta.added) + len(delta.removed) <= self.config.max_paths_per_node:
                update = SubtreeUpdate(self.seq, self.seq - 1, False, cur.version, cur.digest,
                                       delta.added, delta.removed)
        out = []
        for peer in sorted(self.members - {self.self_id}):
            out.append(Send(peer, load))
            out.append(Send(peer, full if peer in self._full_for else update))
        self._full_for.clear()
        self._sent_mark = mark
        self._round += 1
        return out

    def report_load(self, now: float) -> list[Send]:
        """Our load changed between rounds (a request taken, a first token, a request done):
        a :class:`LoadReport` of :attr:`local` for every other member now (issue 29). It takes
        the next load sequence number, not a round's: the round number (:attr:`seq`) stays,
        since subtree deltas chain on ``seq - 1``. The driver rate-limits the calls."""
        del now  # (kept for the driver's symmetry with tick: nothing here depends on time)
        load = report_of(self.local, self._next_load_seq(), self.lengths.version, self.requests)
        self.loads_pushed += 1
        return [Send(peer, load) for peer in sorted(self.members - {self.self_id})]

    def _next_load_seq(self) -> int:
        """A new load report number: above the last one and never behind the round's."""
        self.load_seq = max(self.load_seq + 1, self.seq)
        return self.load_seq

    def forget(self, peer: bytes) -> bool:
        """Drop ``peer`` from the node table and the tree now (the driver could not reach it,
        e.g. a forward failed to connect); a live peer comes back with its next load report
        and full subtree. Returns whether it was in the table."""
        known = peer in self.peers
        if known:
            log.info("model node %s unreachable: removed from the table", peer.hex()[:8])
            self._forget(peer)
        return known

    def expire(self, now: float) -> list[bytes]:
        """Forget peers silent for ``expiry_rounds`` rounds (table and tree); returns them."""
        cutoff = now - self.config.expiry_rounds * self.config.sync_interval
        gone = [p for p, st in self.peers.items() if st.last_heard < cutoff]
        for peer in gone:
            log.info("model node %s silent since %.1f s: expired", peer.hex()[:8], now - self.peers[peer].last_heard)
            self._forget(peer)
            self.expired += 1
        return gone

    # ------------------------------------------------------------------ peers' messages

    def on_message(self, peer: bytes, msg: Any, now: float) -> list[Send]:
        """A sync message from ``peer`` (authenticated by the transport). Never raises on
        anything the peer sent; drops are counted in :attr:`dropped`."""
        if peer == self.self_id:
            return self._drop(peer, "from-self")
        if peer not in self.members:
            return self._drop(peer, "non-member", type(msg).__name__)
        until = self.quarantined.get(peer)
        if until is not None:
            if now < until:
                return self._drop(peer, "quarantined", type(msg).__name__)
            del self.quarantined[peer]
        if isinstance(msg, LoadReport):
            return self._on_load(peer, msg, now)
        if isinstance(msg, SubtreeUpdate):
            return self._on_subtree(peer, msg, now)
        if isinstance(msg, LengthProposal):
            return self._on_proposal(peer, msg, now)
        if isinstance(msg, SubtreeRequest):
            return self._on_subtree_request(peer, msg)
        return self._drop(peer, "unexpected-message", type(msg).__name__)

    def _on_load(self, peer: bytes, msg: LoadReport, now: float) -> list[Send]:
        problem = load_problem(msg)
        if problem:
            return self._drop(peer, "bad-load", problem)
        st = self.peers.get(peer)
        if st is not None and msg.seq <= st.load_seq:
            return self._drop(peer, "stale-load", f"seq {msg.seq} <= {st.load_seq}")
        cur = self.lengths.version
        if cur > 0 and msg.l_version > cur + MAX_VERSION_STEP:
            return self.quarantine(peer, now, "version-jump", f"reports L version {msg.l_version}, ours {cur}")
        if st is None:
            st = self.peers[peer] = PeerState(now)
        st.last_heard = now
        st.load = load_of(msg)
        st.load_seq = msg.seq
        st.load_at = now
        st.l_version = msg.l_version
        if st.requests is not None and msg.requests > st.requests:
            self.sentry.count(min(msg.requests - st.requests, MAX_REQUESTS_PER_REPORT))
        st.requests = msg.requests
        if msg.l_version <= cur + MAX_VERSION_STEP:  # (at version 0 a far-ahead report is not credited)
            self.highest_version_seen = max(self.highest_version_seen, msg.l_version)
        return self._offer_lengths(peer, st, msg.l_version, now)

    def _on_subtree(self, peer: bytes, msg: SubtreeUpdate, now: float) -> list[Send]:
        """A peer's subtree, full or a delta: checked against ``L``, then for shape, then
        applied (or a full one requested when the delta does not apply)."""
        out = self._check_subtree_lengths(peer, msg, now)
        if out is not None:
            return out
        problem = self._subtree_problem(msg)
        if problem is not None:
            return self._drop(peer, *problem)
        if msg.full:
            return self._apply_full_subtree(peer, msg, now)
        return self._apply_subtree_delta(peer, msg, now)

    def _check_subtree_lengths(self, peer: bytes, msg: SubtreeUpdate, now: float) -> list[Send] | None:
        """``None`` if ``msg`` was built with our ``L``; else the drop, with our ``L`` offered
        to a peer behind us, or passed on when two proposers collided and ours won (the
        lower digest)."""
        cur = self.lengths
        st = self.peers.get(peer)
        if msg.l_version != cur.version:
            out = self._offer_lengths(peer, st, msg.l_version, now) if st is not None else []
            return out + self._drop(peer, "wrong-l-version", f"{msg.l_version}, ours {cur.version}")
        if msg.l_digest != cur.digest:
            out = []
            if st is not None and cur.digest < msg.l_digest and now - st.proposal_sent_at >= self.config.sync_interval:
                st.proposal_sent_at = now
                out = [Send(peer, proposal_of(cur))]
            return out + self._drop(peer, "wrong-l-digest", f"version {msg.l_version} with another L")
        return None

    def _subtree_problem(self, msg: SubtreeUpdate) -> tuple[str, str] | None:
        """``(reason, detail)`` if the update is malformed whatever we hold, else ``None``."""
        cap = self.config.max_paths_per_node
        if len(msg.added) > cap or len(msg.removed) > cap or len(msg.added) + len(msg.removed) > cap:
            return "oversized", f"{len(msg.added)} + {len(msg.removed)} paths"
        for path in (*msg.added, *msg.removed):
            problem = self.lengths.path_problem(path)
            if problem:
                return "malformed-path", problem
        added, removed = set(msg.added), set(msg.removed)
        if len(added) != len(msg.added) or len(removed) != len(msg.removed) or added & removed:
            return "inconsistent", "a path repeated, or both added and removed"
        if not 0 <= msg.seq < _U63 or not 0 <= msg.base_seq < _U63:
            return "inconsistent", "sequence numbers out of range"
        if msg.full and (msg.removed or msg.base_seq != 0):
            return "inconsistent", "a full subtree with removals or a base"
        if not msg.full and msg.seq <= msg.base_seq:
            return "inconsistent", f"delta from {msg.base_seq} to {msg.seq}"
        return None

    def _apply_full_subtree(self, peer: bytes, msg: SubtreeUpdate, now: float) -> list[Send]:
        st = self.peers.get(peer)
        held = st.subtree_seq if st is not None else None
        if held is not None and msg.seq <= held:
            return self._drop(peer, "stale-subtree", f"seq {msg.seq} <= {held}")
        if st is None:
            st = self.peers[peer] = PeerState(now)
        self.tree.replace_paths(peer, msg.added)
        st.subtree_seq = msg.seq
        st.last_heard = now
        return []

    def _apply_subtree_delta(self, peer: bytes, msg: SubtreeUpdate, now: float) -> list[Send]:
        st = self.peers.get(peer)
        held = st.subtree_seq if st is not None else None
        if held is not None and msg.seq <= held:
            return self._drop(peer, "stale-subtree", f"seq {msg.seq} <= {held}")
        if st is None or held is None or msg.base_seq != held:
            if st is None:
                st = self.peers[peer] = PeerState(now)
            st.last_heard = now  # fresh, only not applicable here: the peer is alive
            return self._request_full(peer, st, now) + self._drop(
                peer, "delta-gap", f"delta on {msg.base_seq}, we hold {held}")
        tree = self.tree
        if any(not tree.has_path(peer, p) for p in msg.removed) or any(tree.has_path(peer, p) for p in msg.added):
            return self._request_full(peer, st, now) + self._drop(
                peer, "inconsistent", "delta removes a path it lacks or adds one it has")
        if tree.path_count(peer) - len(msg.removed) + len(msg.added) > self.config.max_paths_per_node:
            return self._drop(peer, "oversized", "subtree would exceed the per-node limit")
        for p in msg.removed:
            tree.remove_path(peer, p)
        for p in msg.added:
            tree.insert_path(peer, p)
        st.subtree_seq = msg.seq
        st.last_heard = now
        return []

    def _on_proposal(self, peer: bytes, msg: LengthProposal, now: float) -> list[Send]:
        refused = self._proposal_refused(peer, msg, now)
        if refused is not None:
            return refused
        before = self.lengths.version
        adopted, reason = self.agreement.offer(peer, (msg.version, msg.lengths, msg.tail, msg.bits), self.members)
        if adopted:
            if msg.version > before:
                self._last_advance = now
            else:
                self._replaced_at_version = msg.version
        if not adopted:
            out: list[Send] = []
            if reason == "not-newer" and msg.version < self.lengths.version:
                out = self._offer_lengths(peer, self.peers.get(peer), msg.version, now)
            return out + self._drop(peer, reason, f"version {msg.version}")
        self.highest_version_seen = max(self.highest_version_seen, msg.version)
        log.info("adopted L version %d from %s: %d entries, tail %d, b=%d", msg.version, peer.hex()[:8],
                 len(msg.lengths), msg.tail, msg.bits)
        self._rebuild()
        return []

    def _proposal_refused(self, peer: bytes, msg: LengthProposal, now: float) -> list[Send] | None:
        """The churn rules (module docstring) for a proposal that would replace our ``L``:
        ``None`` to go on with adoption, else the drop (or the quarantine)."""
        cur = self.lengths
        if lengths_problem(msg.version, msg.lengths, msg.tail, msg.bits) is not None:
            return None  # malformed: the agreement refuses it ("bad-proposal")
        if msg.version < cur.version or (msg.version, tuple(msg.lengths), msg.tail, msg.bits) == (
                cur.version, cur.lengths, cur.tail, cur.bits):
            return None  # not newer: refused there too ("not-newer")
        designated = proposer([*self.live_ids(), peer])  # its proposal shows it is alive
        if designated in self.peers:
            reported: int | None = self.peers[designated].l_version
        else:  # we are the designated proposer (just started, say): the version most peers report
            versions = sorted(st.l_version for st in self.peers.values() if st.load is not None)
            reported = versions[len(versions) // 2] if versions else None
        if peer != designated:
            if msg.version > cur.version and msg.version == reported:
                return None  # passing on the version the designated proposer reports: catch-up
            return self._drop(peer, "not-proposer", f"version {msg.version}; the designated proposer is "
                              f"{designated.hex()[:8] if designated else None}")
        if msg.version == cur.version:  # the designated proposer replaces an L of our version
            if self._replaced_at_version == cur.version:
                return self.quarantine(peer, now, "churn", f"a second L of version {msg.version}")
            return None
        if cur.version > 0 and msg.version > cur.version + MAX_VERSION_STEP:
            return self.quarantine(peer, now, "version-jump", f"version {msg.version}, ours {cur.version}")
        if now - self._last_advance < MIN_PROPOSAL_ROUNDS * self.config.sync_interval:
            return self.quarantine(peer, now, "churn", f"version {msg.version} "
                                   f"{now - self._last_advance:.1f} s after the last one")
        return None

    def quarantine(self, peer: bytes, now: float, reason: str, detail: str) -> list[Send]:
        """``peer`` broke a rule: drop it from the table and the tree and ignore it for
        :data:`QUARANTINE_SECONDS` (counted under ``reason``)."""
        self.quarantined[peer] = now + QUARANTINE_SECONDS
        self._forget(peer)
        return self._drop(peer, reason, detail + f"; quarantined for {QUARANTINE_SECONDS:.0f} s")

    def _on_subtree_request(self, peer: bytes, msg: SubtreeRequest) -> list[Send]:
        if msg.l_version != self.lengths.version:
            return self._drop(peer, "wrong-l-version", f"request for version {msg.l_version}")
        self._full_for.add(peer)
        return []

    # ------------------------------------------------------------------ Algorithm 2

    def decide(self, token_ids: Sequence[int], *, forwarded: bool = False, now: float | None = None) -> Decision:
        """Serve here or forward to one other node, at most one hop: by default the node with
        the least predicted time to first token (:func:`~model_node.forwarding.least_ttft`,
        a peer's measured round trip added to its cost, ties to the node idle the longest, as
        of ``now``: a peer's ``idle_ms`` plus the time since its report; ``None``: as of the
        reports), or with ``GroupConfig(rule="alg2")`` appendix Algorithm 2
        (:func:`~model_node.forwarding.algorithm2`), on the node table (rates not measured yet
        estimated from the group's, :func:`~model_node.forwarding.with_group_rates`) and the
        HR-tree.

        A forward is counted against the target (``pending``) until its next load report,
        so requests arriving between two reports do not all go to the same node."""
        table = with_group_rates(self.table())  # a peer's reported load is kept as it came in self.peers
        found = self.tree.search(token_ids)
        if self.config.rule == "alg2":
            decision = algorithm2(self.self_id, table, found, tau_c=self.tau_c,
                                  load_threshold=self.config.load_threshold, forwarded=forwarded)
        else:
            ends = self.lengths.chunk_ends(len(token_ids)) if found.depth > 0 else []
            matched = ends[min(found.depth, len(ends)) - 1] if ends else 0
            decision = least_ttft(self.self_id, table, found, len(token_ids), tau_c=self.tau_c,
                                  matched_tokens=matched, load_threshold=self.config.load_threshold,
                                  forwarded=forwarded, idle=self.idle_seconds(now), hops=self.hops())
        return self.count(decision, len(token_ids))

    def idle_seconds(self, now: float | None = None) -> dict[bytes, float]:
        """How long each node of the table has held no work, as of ``now`` (``None``: as of
        each report): its ``idle_ms`` plus the time since its report; -1 for a node that
        holds work, does not say, or was sent a forward since its report; at most
        :data:`MAX_IDLE_MS` (a node that never held work reports that: fresh nodes tie)."""
        cap = MAX_IDLE_MS / 1000
        out = {self.self_id: min(cap, self.local.idle_ms / 1000) if self.local.idle_ms >= 0 else -1.0}
        for peer, st in self.peers.items():
            load = st.load
            if load is None or load.idle_ms < 0 or load.pending:
                out[peer] = -1.0
            else:
                age = max(0.0, now - st.load_at) if now is not None else 0.0
                out[peer] = min(cap, load.idle_ms / 1000 + age)
        return out

    def count(self, decision: Decision, prompt_tokens: int = 0) -> Decision:
        """Record ``decision``: by reason, and a forward (of a ``prompt_tokens``-token prompt)
        against its target's load until the target's next report."""
        self.decisions[decision.reason] += 1
        if decision.target is not None:
            st = self.peers.get(decision.target)
            if st is not None and st.load is not None:
                st.load.pending += 1
                st.load.pending_tokens += prompt_tokens
        return decision

    # ------------------------------------------------------------------ internals

    def _drop(self, peer: bytes, reason: str, detail: str = "") -> list[Send]:
        self.dropped[reason] += 1
        level = logging.WARNING if reason in _SUSPECT else logging.DEBUG
        log.log(level, "dropped a message from model node %s: %s%s", peer.hex()[:8], reason,
                f" ({detail})" if detail else "")
        return []

    def _forget(self, peer: bytes) -> None:
        self.peers.pop(peer, None)
        self.tree.remove_node(peer)
        self._full_for.discard(peer)

    def _request_full(self, peer: bytes, st: PeerState | None, now: float) -> list[Send]:
        if st is None or now - st.full_requested_at < self.config.sync_interval:
            return []
        st.full_requested_at = now
        return [Send(peer, SubtreeRequest(self.lengths.version))]

    def _offer_lengths(self, peer: bytes, st: PeerState | None, their_version: int, now: float) -> list[Send]:
        """Pass our ``L`` on to a peer that reports an older one (at most once a round)."""
        cur = self.lengths
        if st is None or their_version >= cur.version or cur.version == 0:
            return []
        if now - st.proposal_sent_at < self.config.sync_interval:
            return []
        st.proposal_sent_at = now
        return [Send(peer, proposal_of(cur))]

    def _maybe_propose(self, now: float) -> list[Send]:
        if not self.sentry.due() or not self.is_proposer():
            return []
        if now - self._last_advance < MIN_PROPOSAL_ROUNDS * self.config.sync_interval:
            return []  # the members would take a faster advance for churn: wait (the Sentry stays due)
        cur_version = self.lengths.version
        seen = min(self.highest_version_seen, cur_version + MAX_VERSION_STEP - 1)
        version = self.agreement.next_version(seen)
        if version > MAX_L_VERSION:  # only a member pushing versions up can get here: keep our L
            if not self.versions_exhausted:
                log.error("cannot propose a new L: the group's L version reached %d (a member pushed it up)",
                          self.highest_version_seen)
            self.versions_exhausted = True
            return []
        cur = self.lengths
        new = self.sentry.propose(version, tail=cur.tail, bits=cur.bits)  # b and the tail stay the group's
        if (new.lengths, new.tail, new.bits) == (cur.lengths, cur.tail, cur.bits):
            return []  # nothing learned since: keep the version, no rebuild anywhere
        self.agreement.current = new
        self.highest_version_seen = version
        self._last_advance = now
        log.info("proposing L version %d: %d entries (system prompts %s)", version, len(new.lengths),
                 self.sentry.system_prompt_lengths())
        self._rebuild()
        msg = proposal_of(new)
        return [Send(p, msg) for p in sorted(self.members - {self.self_id})]

    def _rebuild(self) -> None:
        """A new ``L``: a fresh tree with our own prefixes; peers' subtrees come again in full."""
        self.tree = self._new_tree(self.lengths)
        self._path_memo = {}
        self._sync_local_paths()
        for st in self.peers.values():
            st.subtree_seq = None
        self._sent_mark = None
        self.sentry.restart()

    def _new_tree(self, lengths: ChunkLengths) -> HRTree:
        tree = HRTree(lengths, max_paths_per_node=self.config.max_paths_per_node)
        tree.track(self.self_id)
        return tree

    def _sync_local_paths(self) -> None:
        memo, new_memo = self._path_memo, {}
        paths: dict[bytes, None] = {}
        cap = self.config.max_paths_per_node
        for prefix in self._local_prefixes:
            key = prefix if isinstance(prefix, tuple) else tuple(prefix)
            path = memo.get(key)
            if path is None:
                path = self.lengths.path(key)
            new_memo[key] = path
            if path and len(paths) < cap:
                paths[path] = None
        self._path_memo = new_memo
        self.tree.replace_paths(self.self_id, paths)

    @staticmethod
    def _check_local(info: Load) -> None:
        if not MIN_CAPACITY <= info.capacity <= MAX_CAPACITY:
            raise ValueError(f"capacity must be within {MIN_CAPACITY}..{MAX_CAPACITY}")
        if min(info.active, info.queued, info.kv_usage_permille, info.latency_ms, info.prefill_tokens,
               info.decode_tokens, info.prefill_rate, info.decode_rate) < 0:
            raise ValueError("load figures must not be negative")
        if not 1 <= info.streams <= MAX_STREAMS:
            raise ValueError(f"streams must be within 1..{MAX_STREAMS}")
        if info.idle_ms < -1:
            raise ValueError("idle_ms must be -1 (not idle) or more")


# --------------------------------------------------------------------------- group split


def split_groups(members: Mapping[bytes, str], max_size: int = MAX_GROUP_SIZE) -> list[tuple[bytes, ...]]:
    """Partition the model nodes serving one model (node id → region) into groups (§3.3).

    Up to ``max_size`` nodes form one group. Above it, nodes are grouped by region, and a
    region still larger than ``max_size`` is cut into the fewest near-equal groups of
    consecutive node ids. Deterministic: every node computes the same partition from the
    same registry. Groups are sorted tuples, in region order.
    """
    if max_size < 1:
        raise ValueError("max_size must be positive")
    if len(members) <= max_size:
        return [tuple(sorted(members))] if members else []
    by_region: dict[str, list[bytes]] = {}
    for node, region in members.items():
        by_region.setdefault(region, []).append(node)
    groups: list[tuple[bytes, ...]] = []
    for region in sorted(by_region):
        ids = sorted(by_region[region])
        k = -(-len(ids) // max_size)
        bounds = [round(i * len(ids) / k) for i in range(k + 1)]
        groups += [tuple(ids[bounds[i]:bounds[i + 1]]) for i in range(k)]
    return groups


def group_of(node_id: bytes, members: Mapping[bytes, str], max_size: int = MAX_GROUP_SIZE) -> tuple[bytes, ...]:
    """The group ``node_id`` belongs to under :func:`split_groups` (empty if not listed)."""
    for g in split_groups(members, max_size):
        if node_id in g:
            return g
    return ()
