"""Forwarding baselines for the forwarding benchmarks, injected into a model node as its
:class:`~model_node.forwarding.ForwardingPolicy` (the product's rule, ``hrtree`` here, is
:meth:`GroupState.decide <model_node.group.GroupState.decide>`: the least predicted time to first
token since issue 29, decision 0005 "Revision (issue 29)").

- :func:`least_loaded` ("load"): the product's rule on an empty prompt, so caches are ignored:
  the node with the least queued work (the paper's "load-based" baseline);
- :func:`paper_algorithm2` ("alg2"): the paper's Algorithm 2 on the node table and the HR-tree
  (a cached prefix's holder if under the load threshold, else the least relatively loaded
  node): the product's rule until issue 29;
- :class:`RandomChoice` ("random"): a uniformly random node with a known load, ourselves
  included;
- :func:`request_count` ("requests"): Algorithm 2 with the load measured as requests per
  capacity point (:attr:`~model_node.forwarding.Load.requests_relative`, the product's measure
  before issue 19) and its threshold of :data:`REQUESTS_THRESHOLD` requests, against which
  ``bench forwarding`` compares the work-aware load.

See docs/decisions/0005-hrtree.md.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from model_node.forwarding import Decision, ForwardingPolicy, Load, algorithm2
from model_node.group import GroupState

REQUESTS_THRESHOLD = 8.0  # requests per capacity point: the request-count threshold (decision 0005)


def least_loaded(state: GroupState, token_ids: Sequence[int]) -> Decision:
    """Algorithm 2 on an empty prompt: no match, so the least relatively loaded node."""
    return state.decide((), forwarded=False)


def paper_algorithm2(state: GroupState, token_ids: Sequence[int]) -> Decision:
    """Appendix Algorithm 2 with the product's work-aware load and threshold."""
    decision = algorithm2(state.self_id, state.table(), state.search(token_ids), tau_c=state.tau_c,
                          load_threshold=state.config.load_threshold)
    return state.count(decision, len(token_ids))


def request_count(state: GroupState, token_ids: Sequence[int]) -> Decision:
    """Algorithm 2 on the node table with loads counted in requests per capacity point
    (threshold :data:`REQUESTS_THRESHOLD`); decisions and forwards are counted as the
    product's are."""
    decision = algorithm2(state.self_id, state.table(), state.search(token_ids), tau_c=state.tau_c,
                          load_threshold=REQUESTS_THRESHOLD, measure=_requests)
    return state.count(decision, len(token_ids))


def _requests(load: Load) -> float:
    return load.requests_relative


class RandomChoice:
    """A uniformly random node of the node table (counted as the decision ``random``)."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def __call__(self, state: GroupState, token_ids: Sequence[int]) -> Decision:
        choice = self._rng.choice(sorted(state.table()))
        state.decisions["random"] += 1
        return Decision(None if choice == state.self_id else choice, "random", 0)


def baseline(name: str) -> ForwardingPolicy | None:
    """The policy a benchmark names: ``hrtree`` (``None``: the product's rule), ``alg2``,
    ``load``, ``random`` or ``requests``."""
    if name == "hrtree":
        return None
    if name == "load":
        return least_loaded
    if name == "alg2":
        return paper_algorithm2
    if name == "random":
        return RandomChoice()
    if name == "requests":
        return request_count
    raise ValueError(f"unknown forwarding baseline {name!r}; choose one of {', '.join(BASELINES)}")


BASELINES = ("hrtree", "alg2", "load", "random", "requests")
