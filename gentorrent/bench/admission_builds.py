"""Refused path builds of a joining user (issue 28 item 9; part of ``gentorrent bench admission``).

An in-memory network (:mod:`overlay.testing`) on trio's ``MockClock``: ``relays`` user nodes
that open paths only for users in their lists (``registered_only``), whose lists do not hold a
newly registered user for its first ``LIST_LAG_S`` seconds (a list refresh behind its
registration), then do. The user starts at once and builds its ``target`` paths through the
real :class:`~overlay.anon.paths.PathManager`, relays and transport. Run twice, the same way: with
the path manager's back-off (:class:`~overlay.anon.paths.Backoff`, as shipped) and with it off
(``base=0``: every refused build rebuilt at once, as main behaved before issue 28). These two
runs measure the back-off alone: their relays refuse an unlisted user's Create at once
(``RelayLimits.hold_s = 0``), as before relays held them. Two more runs (back-off on) measure the
relays' hold (:meth:`overlay.anon.relay.RelayCore.release_held`: a Create from an unlisted peer waits
up to ``HOLD_S`` for a list that holds it): with the list ``HOLD_LAG_S`` late (within the hold)
and ``LATE_LAG_S`` late (past it).

Figures (``_s``: seconds of the mock clock from the user's start; ``_count``: counts):
``refused_builds_count`` and ``refused_builds_no_backoff_count`` (builds the relays refused with
``not-registered``, as the user's ``PathManager.refused_builds`` counts them);
``paths_ready_after_s`` and ``paths_ready_after_no_backoff_s`` (until ``target`` paths are
ready); ``create_rate_limited_count`` and ``create_rate_limited_no_backoff_count`` (the user's
Creates the relays dropped unanswered, over their per-peer Create rate limit); ``relays_count``,
``list_lag_s``; ``held_refused_builds_count`` and ``held_paths_ready_after_s`` (relays holding,
list ``HOLD_LAG_S`` late), ``held_creates_count`` (Creates the relays held in that run),
``held_late_refused_builds_count`` and ``held_late_paths_ready_after_s`` (relays holding, list
``LATE_LAG_S`` late), ``hold_s``, ``hold_lag_s``, ``late_lag_s``.
"""

from __future__ import annotations

import random

import trio
import trio.testing

from overlay.anon.paths import Backoff
from overlay.anon.relay import HOLD_S, RelayLimits
from overlay.directory.registry import Registry
from overlay.testing import Net
from overlay.usernode import UserNode

LIST_LAG_S = 3.0
HOLD_LAG_S = 2.0  # within HOLD_S: the relays hold the user's first Creates until the list holds it
LATE_LAG_S = 4.0  # past HOLD_S: held Creates are refused once, then the rebuilds are held
SEED = 28


async def _join(relays: int, lag_s: float, backoff: bool, seed: int, hold: bool) -> dict[str, float]:
    net = Net()
    relay_ids = net.add_users(relays, prefix="relay")
    newcomer = net.add("newcomer")
    full = net.registry
    lagging = Registry(full.version, [e for e in full.entries if e.node_id != newcomer.node_id])
    async with trio.open_nursery() as nursery:
        nodes = [UserNode(i, net.transport(i), lagging, client=False, registered_only=True) for i in relay_ids]
        for r in nodes:
            if not hold:
                r.relay.core.limits = RelayLimits(hold_s=0.0)
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
        with trio.fail_after(600):
            await pm.wait_ready(pm.target)
        ready_after = trio.current_time() - t0
        limited = sum(r.relay.core.dropped["create-rate-limited"] for r in nodes)
        held = sum(r.relay.core.holds["held"] for r in nodes)
        nursery.cancel_scope.cancel()
    return {"refused": float(pm.refused_builds), "ready": ready_after, "limited": float(limited),
            "held": float(held)}


def measure_refused_builds(quick: bool) -> dict[str, float]:
    """The figures above, for 12 relays (``quick``) or 30."""
    relays = 12 if quick else 30

    def run(backoff: bool, lag_s: float = LIST_LAG_S, hold: bool = False) -> dict[str, float]:
        out: dict[str, float] = trio.run(_join, relays, lag_s, backoff, SEED, hold,
                                         clock=trio.testing.MockClock(autojump_threshold=0))
        return out

    on, off = run(True), run(False)
    held, late = run(True, HOLD_LAG_S, hold=True), run(True, LATE_LAG_S, hold=True)
    return {
        "refused_builds_count": on["refused"],
        "refused_builds_no_backoff_count": off["refused"],
        "paths_ready_after_s": on["ready"],
        "paths_ready_after_no_backoff_s": off["ready"],
        "create_rate_limited_count": on["limited"],
        "create_rate_limited_no_backoff_count": off["limited"],
        "relays_count": float(relays),
        "list_lag_s": LIST_LAG_S,
        "held_refused_builds_count": held["refused"],
        "held_paths_ready_after_s": held["ready"],
        "held_creates_count": held["held"],
        "held_late_refused_builds_count": late["refused"],
        "held_late_paths_ready_after_s": late["ready"],
        "hold_s": HOLD_S,
        "hold_lag_s": HOLD_LAG_S,
        "late_lag_s": LATE_LAG_S,
    }


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(measure_refused_builds("--quick" in sys.argv), indent=2))
