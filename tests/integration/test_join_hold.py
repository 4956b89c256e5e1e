"""A joining user's first builds are held, not refused (issue 28 item 9): right after it
registers, its relays' lists do not hold it yet; a relay that gets its ``Create`` holds it (up to
``HOLD_S``) and re-feeds it when its next list arrives, so the user gets its paths without a
single ``Destroy("not-registered")`` when the lists catch up within the hold."""

from __future__ import annotations

import random

import trio

from overlay.anon.relay import HOLD_S
from overlay.directory.registry import Registry
from overlay.testing import Net
from overlay.usernode import UserNode


async def test_relays_that_learn_of_a_joining_user_within_the_hold_refuse_none_of_its_builds(
        autojump_clock, nursery, net: Net):
    relay_ids = net.add_users(12, prefix="relay")
    newcomer = net.add("newcomer")
    full = net.registry
    # Each relay's own list: every relay, not the newcomer (it registered a moment ago).
    lists = [Registry(full.version, [e for e in full.entries if e.node_id != newcomer.node_id]) for _ in relay_ids]
    relays = [UserNode(i, net.transport(i), reg, client=False, registered_only=True)
              for i, reg in zip(relay_ids, lists, strict=True)]
    for r in relays:
        await net.start(nursery, r)
    user = net.user_node(newcomer)  # its own list holds everyone
    assert user.paths is not None
    t0 = trio.current_time()
    await net.start(nursery, user)

    # Each relay's next list, which holds the newcomer, arrives 1 to 2 s after the user started.
    rng = random.Random(28)
    lags = sorted((rng.uniform(1.0, 2.0), k) for k in range(len(relays)))
    assert lags[-1][0] < HOLD_S
    for lag, k in lags:
        await trio.sleep_until(t0 + lag)
        lists[k].replace(Registry(full.version + 1, list(full.entries)))
        relays[k].directory_changed()

    with trio.fail_after(30):
        ready = await user.paths.wait_ready(4)
    assert len(ready) == 4 and trio.current_time() - t0 <= lags[-1][0] + 0.5
    assert user.paths.refused_builds == 0 and user.paths.failed == 0
    assert sum(r.relay.core.dropped["not-registered"] for r in relays) == 0
    held = sum(r.relay.core.holds["held"] for r in relays)
    assert held >= 1 and sum(r.relay.core.holds["admitted"] for r in relays) == held
    assert all(r.relay.core.held == 0 for r in relays)


async def test_a_held_build_is_refused_after_the_hold_if_no_list_holds_the_user(autojump_clock, nursery, net: Net):
    relay_ids = net.add_users(6, prefix="relay")
    stranger = net.add("stranger")
    full = net.registry
    lagging = Registry(full.version, [e for e in full.entries if e.node_id != stranger.node_id])
    relays = [UserNode(i, net.transport(i), lagging, client=False, registered_only=True) for i in relay_ids]
    for r in relays:
        await net.start(nursery, r)
    user = net.user_node(stranger)
    assert user.paths is not None
    t0 = trio.current_time()
    await net.start(nursery, user)
    await trio.sleep(HOLD_S - 0.1)
    assert user.paths.refused_builds == 0 and sum(r.relay.core.held for r in relays) >= 1
    await trio.sleep(0.2)  # the first builds' hold ran out: refused, as without holding
    assert user.paths.refused["not-registered"] >= 1
    assert sum(r.relay.core.holds["refused"] for r in relays) == user.paths.refused["not-registered"]
    assert not user.paths.ready_paths() and trio.current_time() - t0 < HOLD_S + 0.2
