"""Admission: which requests a model node takes, and the order its engine evaluates their prompts.

I/O-free; :class:`~model_node.server.ModelNode` calls :func:`admit` for every request it would
serve itself (decision 0009, "Third revision").

A node that takes a request *promises* its first token within ``limit`` seconds
(``--max-queue-wait``) of admission. A prompt that alone takes longer than that is taken only by
an idle node (nothing else waiting for its first token): someone must serve it, and an idle node
is the earliest place it can run; its promise is then its own prompt time plus
:data:`LONG_SLACK` × ``limit``, so that short requests may still pass it for that long (without
that slack, a node that took a cold 1,500-token prompt refused everything else for 15–20 s).
Otherwise the user's client is told "busy" at once and tries another node, instead of waiting
past the limit.

Prompts wait in *key* order (lower first, ties in arrival order). An engine that honours keys
(``reorders``) evaluates a new prompt at its natural place, the shortest estimated prompt time
first, so a request whose prompt is mostly cached gets its first token in a step or two instead of
waiting behind a cold 1,000-token prompt; but never so far ahead that a request taken earlier would
miss its promise: it is placed at the first position from its natural one on where every request
behind it keeps its promise (they all move back by its prompt time) and its own first token still
comes within its promise. With no such position the request is refused. An engine that evaluates
prompts first come first served (``reorders=False``) has one position: the end.

Estimates: ``seconds`` are prompt tokens still to evaluate ÷ the engine's measured prompt rate
(:class:`~model_node.forwarding.Throughput`, which includes the decode steps interleaved with
prompt chunks). The caller counts a started prompt's tokens as the engine reports them left
(llama.cpp's ``prompt_left``), else its whole admission-time estimate until its first token.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

LONG_SLACK = 0.5  # of the limit: how long short requests may delay a long prompt taken by an idle node


@dataclass(frozen=True, slots=True)
class Queued:
    """A request taken earlier that has not had its first token: its order ``key``, the
    estimated ``seconds`` of prompt evaluation it still needs, and ``promise``, the absolute time
    its first token is promised by."""

    key: float
    seconds: float
    promise: float


@dataclass(frozen=True, slots=True)
class Admission:
    """A request taken: its order ``key``, ``promise``, the time its first token is promised by, and
    the estimated ``wait`` in seconds until its first token."""

    key: float
    promise: float
    wait: float


def admit(queue: Sequence[Queued], seconds: float, now: float, limit: float, *,
          reorders: bool = True) -> Admission | None:
    """Take a request whose prompt needs ``seconds`` of evaluation at time ``now``, given the
    ``queue`` of earlier requests still waiting for their first token (any order), or refuse
    it (``None``). See the module docstring."""
    if not limit > 0 or seconds < 0:
        raise ValueError(f"limit must be above 0 and seconds not negative (got {limit}, {seconds})")
    ahead = sorted(queue, key=lambda q: q.key)  # stable: equal keys keep arrival order
    if not ahead:
        return Admission(seconds, now + (seconds + LONG_SLACK * limit if seconds > limit else limit), seconds)
    promise = now + limit
    keys = [q.key for q in ahead]
    # slack[i]: how far the requests from position i on may be pushed back and keep their promises
    slack = [float("inf")] * (len(ahead) + 1)
    finish = now + sum(q.seconds for q in ahead)
    for i in range(len(ahead) - 1, -1, -1):
        slack[i] = min(slack[i + 1], ahead[i].promise - finish)
        finish -= ahead[i].seconds
    start = bisect_right(keys, seconds) if reorders else len(ahead)
    before = sum(q.seconds for q in ahead[:start])
    for i in range(start, len(ahead) + 1):
        if i > start:
            before += ahead[i - 1].seconds
        if before + seconds > limit:
            return None  # later positions only wait longer
        if 0 < i < len(ahead) and keys[i - 1] == keys[i]:
            continue  # no key sorts between equal keys
        if slack[i] >= seconds:
            return Admission(_key_at(keys, i, seconds), promise, before + seconds)
    return None  # unreachable: the last position has infinite slack


def _key_at(keys: list[float], i: int, natural: float) -> float:
    """A key that sorts at position ``i`` of ``keys``, ``i`` ≥ 1 or ``natural`` < ``keys[0]``
    (after equal keys: arrival order): ``natural`` itself where it sorts there."""
    if (i == 0 or keys[i - 1] <= natural) and (i == len(keys) or natural < keys[i]):
        return natural
    if i == len(keys):
        return keys[-1] + 1.0
    return (keys[i - 1] + keys[i]) / 2
