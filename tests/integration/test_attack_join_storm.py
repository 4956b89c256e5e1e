"""A new user does not storm the relays (issue 28 item 9): right after it registers, the relays'
lists do not hold it yet and they refuse its path builds (``Destroy("not-registered")``); its
path manager backs off instead of rebuilding at once, and has its paths as soon as the relays'
next list holds it. The relays here refuse at once (``RelayLimits.hold_s = 0``), so this measures
the back-off alone; tests/integration/test_join_hold.py has relays that hold the Creates."""

from __future__ import annotations

import trio

from overlay.anon.relay import RelayLimits
from overlay.directory.registry import Registry
from overlay.testing import Net
from overlay.usernode import UserNode

LAG = 3.0  # seconds between the user's start and the relays' list that holds it


async def test_a_joining_user_backs_off_while_the_relays_do_not_list_it(autojump_clock, nursery, net: Net):
    relay_ids = net.add_users(12, prefix="relay")
    newcomer = net.add("newcomer")
    full = net.registry
    # The relays' lists: every relay, not the newcomer (it registered a moment ago).
    lagging = Registry(full.version, [e for e in full.entries if e.node_id != newcomer.node_id])
    relays = [UserNode(i, net.transport(i), lagging, client=False, registered_only=True) for i in relay_ids]
    for r in relays:
        r.relay.core.limits = RelayLimits(hold_s=0.0)  # refuse at once: the back-off alone
        await net.start(nursery, r)
    user = net.user_node(newcomer)  # its own list holds everyone
    assert user.paths is not None
    t0 = trio.current_time()
    await net.start(nursery, user)

    def refused() -> int:
        return sum(r.relay.core.dropped["not-registered"] for r in relays)

    await trio.sleep(LAG)
    # main rebuilt every refused build at once: about 4,600 refusals in no time, until each relay's
    # Create rate limit (a burst of 400 per peer) cut the user off. Now: the first round of 4,
    # then one probe after each pause (at least 0.25, 0.5, 1 s): at most 7 in 3 s.
    assert 4 <= refused() <= 7
    assert user.paths.refused["not-registered"] == refused() and not user.paths.ready_paths()
    assert not any(r.relay.core.dropped["create-rate-limited"] for r in relays)

    lagging.replace(Registry(full.version + 1, list(full.entries)))  # the relays' next list
    for r in relays:
        r.directory_changed()
    listed = trio.current_time()
    with trio.fail_after(30):
        ready = await user.paths.wait_ready(4)
    # The next probe comes within the current pause (at most 2 * LAG + 0.5 s after the last one).
    assert len(ready) == 4 and trio.current_time() - listed <= 2 * LAG + 0.5
    assert refused() <= 7 and user.paths.backoff.failures == 0
    assert trio.current_time() - t0 <= 3 * LAG + 0.5
