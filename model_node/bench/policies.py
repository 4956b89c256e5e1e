"""Forwarding baselines for the forwarding benchmarks, injected into a model node as its
:class:`~model_node.forwarding.ForwardingPolicy` (the product ships Algorithm 2 only).

- :func:`least_loaded` ("load"): the least relatively loaded node, ignoring caches, i.e.
  Algorithm 2's miss branch for every request (the paper's "load-based" baseline);
- :class:`RandomChoice` ("random"): a uniformly random node with a known load, ourselves
  included.

See docs/decisions/0005-hrtree.md.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from model_node.forwarding import Decision, ForwardingPolicy
from model_node.group import GroupState


def least_loaded(state: GroupState, token_ids: Sequence[int]) -> Decision:
    """Algorithm 2 on an empty prompt: no match, so the least relatively loaded node."""
    return state.decide((), forwarded=False)


class RandomChoice:
    """A uniformly random node of the node table (counted as the decision ``random``)."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def __call__(self, state: GroupState, token_ids: Sequence[int]) -> Decision:
        choice = self._rng.choice(sorted(state.table()))
        state.decisions["random"] += 1
        return Decision(None if choice == state.self_id else choice, "random", 0)


def baseline(name: str) -> ForwardingPolicy | None:
    """The policy a benchmark names: ``hrtree`` (``None``: the product's Algorithm 2),
    ``load`` or ``random``."""
    if name == "hrtree":
        return None
    if name == "load":
        return least_loaded
    if name == "random":
        return RandomChoice()
    raise ValueError(f"unknown forwarding baseline {name!r}; choose hrtree, load or random")


BASELINES = ("hrtree", "load", "random")
