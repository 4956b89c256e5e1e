"""Forwarding among a group's model nodes: Algorithm 2 (paper §3.3 and appendix).

A model node that receives a user's request either serves it or forwards it, at most one
hop, to another member of its group. The decision reads two things the group keeps in sync
(:mod:`model_node.group`): the node table (each member's :class:`Load`) and the HR-tree
search result for the prompt (a :class:`~model_node.hrtree.Match`).

:func:`algorithm2` is the rule, a pure function:

- a request that was already forwarded is served where it is (``forwarded``);
- with no other member of known load, serve here (``alone``);
- on a match (depth ``d ≥ τ_c``), the candidate holding the prefix with the lowest relative
  load, if that load is under ``load_threshold`` (``match``);
- otherwise (``miss``, or ``match-overloaded`` when every candidate is at or over the
  threshold) the least relatively loaded node of the whole table, ourselves included.

Ties go to ourselves (no hop), then the higher capacity, then the lower node id.

A :class:`ForwardingPolicy` is what the group driver calls for a user's request; the product
ships Algorithm 2 only (:meth:`~model_node.group.GroupState.decide`). Benchmarks inject their
baselines (:mod:`model_node.bench.policies`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from model_node.hrtree import Match

if TYPE_CHECKING:
    from model_node.group import GroupState

DEFAULT_LOAD_THRESHOLD = 8.0  # relative load (requests per capacity point) a match may carry: measured, decision 0005


@dataclass(slots=True)
class Load:
    """A model node's load: one row of the node table (paper §3.3: "the node's current load,
    latency..."), and what a model node reports about itself.

    ``active``: requests being generated; ``queued``: waiting for a slot; ``capacity``: the
    node's capacity score 1–10 (§3.3); ``kv_usage_permille``: KV-cache use if the engine
    reports it; ``latency_ms``: recent median time to first token (0: unknown);
    ``pending``: requests this node forwarded there since its last report."""

    active: int = 0
    queued: int = 0
    capacity: int = 1
    kv_usage_permille: int = 0
    latency_ms: int = 0
    pending: int = 0

    @property
    def relative(self) -> float:
        """Relative load: requests per capacity point (paper §3.3), counting the queue and
        what we forwarded since the last report."""
        return (self.active + self.queued + self.pending) / self.capacity


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do with a request: serve it here (``target is None``) or forward it to
    ``target``. ``reason``: ``match``, ``match-overloaded``, ``miss``, ``forwarded`` or ``alone``
    (see :func:`algorithm2`; a benchmark baseline may name its own);
    ``depth`` is the HR-tree depth the prompt matched."""

    target: bytes | None
    reason: str
    depth: int

    @property
    def serve_locally(self) -> bool:
        return self.target is None


class ForwardingPolicy(Protocol):
    """Decides where a user's request (not a forwarded one) is served. It may update the
    state's bookkeeping (``decisions``, a target's ``pending``) as Algorithm 2 does."""

    def __call__(self, state: GroupState, token_ids: Sequence[int]) -> Decision: ...


def algorithm2(self_id: bytes, table: Mapping[bytes, Load], found: Match, *, tau_c: int,
               load_threshold: float, forwarded: bool = False) -> Decision:
    """Algorithm 2: where to serve a request whose prompt matched ``found`` in the HR-tree.

    ``table``: every node with a known load, ``self_id`` included; ``tau_c``: the minimum
    matched depth; ``load_threshold``: the relative load a matching candidate must be under.
    Pure: the caller counts the decision and the forward (see the module docstring)."""
    depth = found.depth
    if forwarded:
        return Decision(None, "forwarded", depth)
    if len(table) <= 1:
        return Decision(None, "alone", depth)

    def rank(node: bytes) -> tuple[float, bool, int, bytes]:
        info = table[node]
        return (info.relative, node != self_id, -info.capacity, node)

    reason = "miss"
    if depth >= tau_c:
        under = [c for c in found.candidates if c in table and table[c].relative < load_threshold]
        if under:
            return _to(min(under, key=rank), "match", depth, self_id)
        reason = "match-overloaded"
    return _to(min(table, key=rank), reason, depth, self_id)


def _to(node: bytes, reason: str, depth: int, self_id: bytes) -> Decision:
    return Decision(None if node == self_id else node, reason, depth)
