"""Wire messages of a model-node group's state synchronisation (paper §3.3), codes 300–319.

Every ``SYNC_INTERVAL`` (5 s) each model node sends every member of its group a
:class:`LoadReport` and a :class:`SubtreeUpdate` (its HR-tree subtree, as a delta on the
previous round where possible). :class:`LengthProposal` carries the group's chunk length
array ``L`` (appendix A3); :class:`SubtreeRequest` asks a peer for its full subtree after a
lost delta. The codec bounds here are the hard limits; :mod:`model_node.group` checks the
values (ranges, ``L`` version, consistency) and drops what is off with a counted reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from model_node.hrtree import DIGEST_LEN, MAX_DEPTH, MAX_LENGTHS, MAX_PATHS_PER_NODE
from overlay.codec import field, message

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
    """

    seq: int
    l_version: int
    active: int
    queued: int
    capacity: int
    kv_usage_permille: int
    latency_ms: int
    requests: int


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
    tail: int
    bits: int


@message(303)
@dataclass(frozen=True, slots=True)
class SubtreeRequest:
    """Send me your full subtree next round (a delta of yours did not apply here)."""

    l_version: int
