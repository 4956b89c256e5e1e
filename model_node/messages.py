"""Wire messages among a model node group (paper §3.3), codes 300–319: state sync and forwarding.

Every ``SYNC_INTERVAL`` (5 s) each model node sends every member of its group a
:class:`LoadReport` and a :class:`SubtreeUpdate` (its HR-tree subtree, as a delta on the
previous round where possible). :class:`LengthProposal` carries the group's chunk length
array ``L`` (appendix A3); :class:`SubtreeRequest` asks a peer for its full subtree after a
lost delta. The codec bounds here are the hard limits; :mod:`model_node.group` checks the
values (ranges, ``L`` version, consistency) and drops what is off with a counted reason.

:class:`ForwardedRequest` hands a user's request to another member (Algorithm 2, driven by
:mod:`model_node.forwarding`); :class:`StatsRequest` / :class:`NodeStats` expose a node's
serving and forwarding counters (diagnostics, tests, benchmarks).
"""

from __future__ import annotations

from dataclasses import dataclass

from model_node.hrtree import DIGEST_LEN, MAX_DEPTH, MAX_LENGTHS, MAX_PATHS_PER_NODE
from overlay.wire.codec import field, message
from overlay.wire.identity import NODE_ID_LEN
from overlay.wire.messages import Request

MAX_PATH_BYTES = 2 * MAX_DEPTH  # a path of MAX_DEPTH hashes of up to 16 bits


@message(300)
@dataclass(frozen=True, slots=True)
class LoadReport:
    """A node's load, for load balancing (paper §3.3 "Load balancing", Algorithm 2).

    ``seq`` grows every round (it starts at the sender's wall clock in ms, so a restarted
    node's reports are newer than its old ones); ``l_version`` is the sender's ``L`` version
    (a receiver with a newer ``L`` answers with a :class:`LengthProposal`). ``active`` and
    ``queued`` are requests being generated and waiting; ``capacity`` the hardware score
    1–10; ``kv_usage_permille`` KV-cache use (0–1000); ``latency_ms`` its recent median
    time to first token (0: unknown); ``requests`` user requests it has received in total
    (the group counts them to refresh ``L`` every 10,000 requests).

    The work it holds (issue 19, :class:`~model_node.forwarding.Load`): ``prefill_tokens``
    prompt tokens still to evaluate, ``decode_tokens`` output tokens still expected,
    ``prefill_mtps`` / ``decode_mtps`` its measured per-stream rates in thousandths of a
    token per second (0: not measured yet), ``streams`` the sequences it generates at once,
    ``match_wait_ms`` the wait for the first token of a request whose prefix it caches
    (-1: not reported); ``idle_ms`` how long it has held no work (-1: it holds some, or does
    not say), which breaks forwarding's ties (issue 29). Bounds:
    :func:`model_node.group.load_problem`.

    Besides each round's report, a node sends one whenever its load changes (at most about
    every 0.1 s: :meth:`model_node.group.GroupState.report_load`); ``seq`` then grows too.
    """

    seq: int
    l_version: int
    active: int
    queued: int
    capacity: int
    kv_usage_permille: int
    latency_ms: int
    requests: int
    prefill_tokens: int = field(default=0)
    decode_tokens: int = field(default=0)
    prefill_mtps: int = field(default=0)
    decode_mtps: int = field(default=0)
    streams: int = field(default=1)
    match_wait_ms: int = field(default=-1)
    idle_ms: int = field(default=-1)


@message(301)
@dataclass(frozen=True, slots=True)
class SubtreeUpdate:
    """A node's HR-tree subtree: the chunk-hash paths of its cached prefixes.

    ``full``: ``added`` is the whole subtree (``removed`` empty, ``base_seq`` 0). Otherwise a
    delta that turns the subtree of round ``base_seq`` into that of round ``seq``. Paths are
    made under the ``L`` named by ``l_version`` and ``l_digest``; receivers drop updates
    under any other ``L`` (trees built with different ``L`` never mix).
    """

    seq: int
    base_seq: int
    full: bool
    l_version: int
    l_digest: bytes = field(exact=DIGEST_LEN)
    added: tuple[bytes, ...] = field(max=MAX_PATHS_PER_NODE, metadata={"item_max": MAX_PATH_BYTES})
    removed: tuple[bytes, ...] = field(max=MAX_PATHS_PER_NODE, metadata={"item_max": MAX_PATH_BYTES})


@message(302)
@dataclass(frozen=True, slots=True)
class LengthProposal:
    """The group's chunk length array ``L`` (a :class:`~model_node.hrtree.ChunkLengths`):
    proposed by the member with the lowest id, passed on by any member to peers that
    report an older version; the highest version wins."""

    version: int
    lengths: tuple[int, ...] = field(max=MAX_LENGTHS)
    tail: int = field()
    bits: int = field()


@message(303)
@dataclass(frozen=True, slots=True)
class SubtreeRequest:
    """Send me your full subtree next round (a delta of yours did not apply here)."""

    l_version: int


# --------------------------------------------------------------------------- forwarding (304-309)


@message(304)
@dataclass(frozen=True, slots=True)
class ForwardedRequest:
    """A user's request handed to another member of the group (paper §3.3, Algorithm 2).

    ``request`` is the user's :class:`~overlay.wire.messages.Request` unchanged: the target
    replies straight to its return proxies and names itself in every chunk, so the user
    verifies the reply against the target's registry key and sends follow-ups there. A
    forwarded request is always served where it arrives (at most one hop). Accepted only
    from members of the receiver's group. A request without return paths is a direct
    (non-anonymous, diagnostic) one that the sender received over TLS: the target sends
    the :class:`~overlay.wire.messages.ReplyChunk`\\ s back to the sender on the same connection.
    """

    request: Request


@message(305)
@dataclass(frozen=True, slots=True)
class StatsRequest:
    """Ask a model node for its :class:`NodeStats` (diagnostics, tests, benchmarks). Answered
    only to nodes listed in the registry, over their authenticated connection."""

    nonce: int


@dataclass(frozen=True, slots=True)
class Count:
    """One named counter (a reason and how often it happened)."""

    name: str = field(max=64)
    n: int = field()


@dataclass(frozen=True, slots=True)
class Served:
    """The engine's figures for one request served here (``GenStats``)."""

    prompt_tokens: int
    evaluated_prompt_tokens: int  # the rest came from the engine's prefix cache
    output_tokens: int
    ttft_us: int
    forwarded: bool  # it came from another member of the group


@dataclass(frozen=True, slots=True)
class PeerRow:
    """One row of a node's group table as it stands: a live peer, its relative load (seconds of
    work, our forwards since its report included; -1 without a report) and how
    many cached-prefix paths of it the HR-tree holds."""

    node_id: bytes = field(exact=NODE_ID_LEN)
    relative_load: float = field()
    paths: int = field()


@message(306)
@dataclass(frozen=True, slots=True)
class NodeStats:
    """A model node's counters (answer to :class:`StatsRequest`; ``nonce`` echoed).

    ``busy``: requests refused as "busy" (past capacity: docs/forwarding.md "Overload");
    ``forwarded_out``: requests sent to another member; ``forwarded_in``: requests taken
    from one; ``forward_failed``: forwards that could not be sent (served here instead);
    ``decisions``: Algorithm 2's outcomes by reason; ``dropped``: messages from peers
    dropped by the group (sync and forwarded requests) by reason; ``recent``: the last
    requests served, oldest first; ``quota``: the usage-quota tokens this node judged, by
    verdict (``tokened``, ``refused``, ``unchecked``; empty without a committee). ``forwarding``
    is False on a node run with ``--no-forwarding`` (the group fields are then empty)."""

    nonce: int
    node_id: bytes = field(exact=NODE_ID_LEN)
    model: str = field(max=128)
    forwarding: bool = field()
    active: int = field()
    queued: int = field()
    served: int = field()
    busy: int = field()  # requests refused as busy (past capacity)
    prompt_tokens: int = field()  # summed over every request served
    evaluated_prompt_tokens: int = field()
    cache_hits: int = field()  # requests of which at least half the prompt came from the cache
    forwarded_out: int = field()
    forwarded_in: int = field()
    forward_failed: int = field()
    decisions: tuple[Count, ...] = field(max=64)
    dropped: tuple[Count, ...] = field(max=64)
    expired: int = field()
    members: int = field()
    l_version: int = field()
    own_paths: int = field()
    peers: tuple[PeerRow, ...] = field(max=64)
    recent: tuple[Served, ...] = field(max=64)
    quota: tuple[Count, ...] = field(max=8, default=())  # usage-quota verdicts acted on (model_node/quota.py)
