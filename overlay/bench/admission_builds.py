"""Refused path builds of a joining user (issue 28 item 9; part of ``gentorrent bench admission``).

An in-memory network (:mod:`overlay.testing`) on trio's ``MockClock``: ``relays`` user nodes
that open paths only for users in their lists (``registered_only``), whose lists do not hold a
newly registered user for its first ``LIST_LAG_S`` seconds (a list refresh behind its
registration), then do. The user starts at once and builds its ``target`` paths through the
real :class:`~overlay.paths.PathManager`, relays and transport. Run twice, the same way: with
the path manager's back-off (:class:`~overlay.paths.Backoff`, as shipped) and with it off
(``base=0``: every refused build rebuilt at once, as main behaved before issue 28).

Figures (``_s``: seconds of the mock clock from the user's start; ``_count``: counts):
``refused_builds_count`` and ``refused_builds_no_backoff_count`` (builds the relays refused with
``not-registered``, as the user's ``PathManager.refused_builds`` counts them);
``paths_ready_after_s`` and ``paths_ready_after_no_backoff_s`` (until ``target`` paths are
ready); ``create_rate_limited_count`` and ``create_rate_limited_no_backoff_count`` (the user's
Creates the relays dropped unanswered, over their per-peer Create rate limit); ``relays_count``,
``list_lag_s``.
"""

from __future__ import annotations

import random

import trio
import trio.testing

from overlay.directory.registry import Registry
from overlay.paths import Backoff
from overlay.testing import Net
from overlay.usernode import UserNode

LIST_LAG_S = 3.0
SEED = 28


async def _join(relays: int, lag_s: float, backoff: bool, seed: int) -> dict[str, float]:
    net = Net()
    relay_ids = net.add_users(relays, prefix="relay")
    newcomer = net.add("newcomer")
    full = net.registry
    lagging = Registry(full.version, [e for e in full.entries if e.node_id != newcomer.node_id])
    async with trio.open_nursery() as nursery:
        nodes = [UserNode(i, net.transport(i), lagging, client=False, registered_only=True) for i in relay_ids]
        for r in nodes:
            await net.start(nursery, r)
        user = net.user_node(newcomer)
        pm = user.paths
        assert pm is not None
        pm.rng = random.Random(seed)
        pm.backoff = Backoff(pm.rng) if backoff else Backoff(pm.rng, base=0.0)
        t0 = trio.current_time()
        await net.start(nursery, user)
        await trio.sleep(lag_s)
        lagging.replace(Registry(full.version + 1, list(full.entries)))  # the relays' next list holds the user
        for r in nodes:
            r.directory_changed()
        await pm.wait_ready(pm.target, timeout=600)
        ready_after = trio.current_time() - t0
        limited = sum(r.relay.core.dropped["create-rate-limited"] for r in nodes)
        nursery.cancel_scope.cancel()
    return {"refused": float(pm.refused_builds), "ready": ready_after, "limited": float(limited)}


def measure_refused_builds(quick: bool) -> dict[str, float]:
    """The figures above, for 12 relays (``quick``) or 30."""
    relays = 12 if quick else 30

    def run(backoff: bool) -> dict[str, float]:
        out: dict[str, float] = trio.run(_join, relays, LIST_LAG_S, backoff, SEED,
                                         clock=trio.testing.MockClock(autojump_threshold=0))
        return out

    on, off = run(True), run(False)
    return {
        "refused_builds_count": on["refused"],
        "refused_builds_no_backoff_count": off["refused"],
        "paths_ready_after_s": on["ready"],
        "paths_ready_after_no_backoff_s": off["ready"],
        "create_rate_limited_count": on["limited"],
        "create_rate_limited_no_backoff_count": off["limited"],
        "relays_count": float(relays),
        "list_lag_s": LIST_LAG_S,
    }


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(measure_refused_builds("--quick" in sys.argv), indent=2))
