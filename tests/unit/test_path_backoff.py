"""A refused or failed path build backs off (issue 28 item 9): a user whose relays do not list it
yet makes a bounded number of build attempts, gets its paths once they do, and starts afresh
after a success; the pauses are jittered.

The relays here are real :class:`~overlay.anon.relay.RelayCore` instances joined to one
:class:`~overlay.anon.paths.PathManager` by links of ``LATENCY`` seconds, all on trio's MockClock."""

from __future__ import annotations

import os
import random
from typing import Any

import pytest
import trio

from overlay.anon.paths import BACKOFF_BASE_S, Backoff, PathManager
from overlay.anon.relay import RelayCore, RelayLimits
from overlay.net.peers import PeerEntry
from overlay.wire.clock import TrioClock
from overlay.wire.identity import Identity
from overlay.wire.messages import CellBack, Create, Destroy

LATENCY = 0.005  # seconds per hop
LAG = 3.0  # seconds before the relays' lists hold the new user


class _Wire:
    """The user's node (``send_nowait``) and ``n`` relays that refuse it (``not-registered``)
    until ``listed`` is set; each frame takes ``LATENCY`` seconds."""

    def __init__(self, nursery: trio.Nursery, n: int = 15) -> None:
        self.nursery = nursery
        self.node_id = os.urandom(20)
        self.clock = TrioClock()
        idents = [Identity.generate() for _ in range(n)]
        self.entries = [PeerEntry.of(i, f"mem:{i.node_id.hex()[:8]}") for i in idents]
        relays = {i.node_id for i in idents}
        self.listed = False

        def admits(peer: bytes) -> bool:
            return peer in relays or (peer == self.node_id and self.listed)

        # Relays that refuse an unlisted user at once (no hold: ``hold_s = 0``, as a relay whose
        # hold is full does), so every build attempt the back-off lets through is refused.
        self.cores = {i.node_id: RelayCore(i.node_id, i.x25519, knows=relays.__contains__, admits=admits,
                                           limits=RelayLimits(hold_s=0.0))
                      for i in idents}
        self.pm: PathManager | None = None
        self.creates: list[float] = []  # when each of the user's Creates reached its first relay

    def send_nowait(self, peer: bytes, msg: Any) -> bool:
        self.nursery.start_soon(self._deliver, self.node_id, peer, msg)
        return True

    async def _deliver(self, src: bytes, dst: bytes, msg: Any) -> None:
        await trio.sleep(LATENCY)
        if dst == self.node_id:
            assert self.pm is not None
            path = self.pm.owns(src, msg.link_id)
            if path is not None and isinstance(msg, CellBack):
                self.pm.on_cell_back(path, msg)
            elif path is not None and isinstance(msg, Destroy):
                self.pm.on_destroy(path, msg)
            return
        if src == self.node_id and isinstance(msg, Create):
            self.creates.append(trio.current_time())
        for s in self.cores[dst].on_message(src, msg, now=trio.current_time(), unix=self.clock.unix()):
            self.nursery.start_soon(self._deliver, dst, s.peer, s.msg)

    def refused(self) -> int:
        """``not-registered`` refusals the relays sent (their own count)."""
        return sum(c.dropped["not-registered"] for c in self.cores.values())


def _manager(wire: _Wire, seed: int = 7) -> PathManager:
    wire.pm = PathManager(wire, lambda: wire.entries, target=4, rng=random.Random(seed), clock=wire.clock)
    return wire.pm


async def test_a_user_the_relays_do_not_list_yet_makes_few_builds_and_gets_its_paths_once_listed(autojump_clock):
    async with trio.open_nursery() as nursery:
        wire = _Wire(nursery)
        pm = _manager(wire)
        t0 = trio.current_time()
        await nursery.start(pm.run)
        await trio.sleep(LAG)
        # Without back-off every refusal was rebuilt at once: one build per round trip per path
        # (about 4 * LAG / (2 * LATENCY) = 1,200 here). With it: the first round of 4, then one
        # probe per pause of at least 0.25, 0.5, 1 s (equal jitter): at most 7 before LAG = 3 s.
        assert wire.refused() == pm.refused["not-registered"] == pm.refused_builds <= 7
        assert pm.backoff.failures >= 3
        assert not pm.ready_paths()
        wire.listed = True  # the relays' lists now hold the user
        with trio.fail_after(30):
            ready = await pm.wait_ready(4)
        took = trio.current_time() - t0
        # Worst case: the last failed probe at t < LAG came after pauses summing to at least half
        # the current pause, so the next probe starts within 2 * LAG + base of it, then one round
        # trip for the probe and one for the rest of the pool.
        assert took <= 3 * LAG + BACKOFF_BASE_S + 4 * 3 * LATENCY
        assert len(ready) == 4 and pm.backoff.failures == 0
        assert len(wire.creates) <= 7 + 1 + 3  # every refused build, the probe that worked, the rest
        assert wire.refused() <= 7  # nothing was refused once the relays knew the user
        # The refused relays were not made suspects: they serve the user after their refresh.
        assert not any(pm._is_suspect(e.node_id, trio.current_time()) for e in wire.entries)
        nursery.cancel_scope.cancel()


async def test_while_refused_only_one_probe_is_in_flight(autojump_clock):
    async with trio.open_nursery() as nursery:
        wire = _Wire(nursery)
        pm = _manager(wire)
        await nursery.start(pm.run)
        most = 0
        for _ in range(int(LAG / 0.01)):
            await trio.sleep(0.01)
            if trio.current_time() > 0.1:  # past the first round of 4
                most = max(most, sum(not p.ready.is_set() and not p.dead for p in pm.paths))
        assert most == 1
        nursery.cancel_scope.cancel()


async def test_the_back_off_starts_afresh_after_a_success(autojump_clock):
    async with trio.open_nursery() as nursery:
        wire = _Wire(nursery)
        pm = _manager(wire)
        await nursery.start(pm.run)
        await trio.sleep(20)  # refused for 20 s: five failed rounds, pauses up to 8 s
        assert pm.backoff.failures >= 5
        wire.listed = True
        with trio.fail_after(30):
            await pm.wait_ready(4)
        assert pm.backoff.failures == 0 and pm.backoff.wait(trio.current_time()) == 0
        # The relays forget the user again and one path dies: its rebuild is refused, and the
        # pause is the first one again (at most BACKOFF_BASE_S), not the sixth.
        wire.listed = False
        builds = len(wire.creates)
        victim = pm.ready_paths()[0]
        pm.on_destroy(victim, Destroy(victim.link_id, "closed"))
        await trio.sleep(4 * LATENCY)
        assert len(wire.creates) == builds + 1  # rebuilt at once
        assert pm.refused["not-registered"] >= 1 and pm.backoff.failures == 1
        assert 0 < pm.backoff.wait(trio.current_time()) <= BACKOFF_BASE_S
        nursery.cancel_scope.cancel()


def test_pauses_double_per_failed_round_are_capped_and_jittered() -> None:
    b = Backoff(random.Random(1), base=0.5, cap=30.0)
    now, ratios = 0.0, []
    for f in range(1, 12):
        pause = b.failed(b.round, now)
        assert pause is not None and b.failures == f
        d = min(30.0, 0.5 * 2 ** (f - 1))
        assert d / 2 <= pause <= d and b.wait(now) == pytest.approx(pause)
        ratios.append(pause / d)
        now += pause
    assert len({round(r, 6) for r in ratios}) == len(ratios)  # each pause has its own jitter draw
    # Another seed draws other pauses; the same seed the same ones.
    other, same = Backoff(random.Random(2)), Backoff(random.Random(1))
    assert [other.delay(f) for f in range(1, 6)] != [same.delay(f) for f in range(1, 6)]


def test_one_round_fails_once_and_a_success_resets() -> None:
    b = Backoff(random.Random(3))
    first = b.round
    assert b.failed(first, 10.0) is not None
    assert b.failed(first, 10.1) is None and b.failures == 1  # the rest of that round: no escalation
    b.failed(b.round, 11.0)
    assert b.failures == 2 and b.probing
    b.succeeded()
    assert (b.failures, b.wait(11.0), b.probing) == (0, 0, False)  # reset (a tuple: no narrowing held over)
    pause = b.failed(b.round, 12.0)
    assert pause is not None and pause <= BACKOFF_BASE_S


def test_back_off_off_retries_at_once() -> None:
    b = Backoff(random.Random(0), base=0.0)
    assert b.failed(b.round, 1.0) is None and b.wait(1.0) == 0 and not b.probing
    with pytest.raises(ValueError):
        Backoff(random.Random(0), base=2.0, cap=1.0)


def test_refusals_are_counted_by_reason_and_only_not_registered_spares_the_relays() -> None:
    class Sink:
        node_id = os.urandom(20)

        def send_nowait(self, peer: bytes, msg: Any) -> bool:
            return True

    entries = [PeerEntry.of(i, "mem:x") for i in (Identity.generate() for _ in range(12))]
    pm = PathManager(Sink(), lambda: entries, rng=random.Random(0), clock=_Fixed())
    a, b, c = pm.start_build(), pm.start_build(), pm.start_build()
    pm.on_destroy(a, Destroy(a.link_id, "not-registered"))
    assert not any(pm._is_suspect(r.node_id, 0.0) for r in a.relays)
    pm.on_destroy(b, Destroy(b.link_id, "table-full"))
    assert all(pm._is_suspect(r.node_id, 0.0) for r in b.relays)
    pm.on_destroy(c, Destroy(c.link_id, "x" * 64))  # a reason from the network: not a key of its own
    assert pm.refused == {"not-registered": 1, "table-full": 1, "other": 1} and pm.refused_builds == 3
    assert pm.failed == 3 and pm.backoff.failures == 1  # one round


class _Fixed:
    def monotonic(self) -> float:
        return 0.0

    def unix(self) -> float:
        return 1_700_000_000.0
