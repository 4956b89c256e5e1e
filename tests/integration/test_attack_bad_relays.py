"""Bad relays replaced (issue 15, item 4): a relay that silently drops or corrupts what it
should pass on does not keep its path "ready" until the 15-minute refresh. The user gives the
path up — at once on a cell or reply clove that fails authentication, and within
``MISSING_GRACE`` of a request for which the path brought no reply clove while the others did
(the path is not used meanwhile) — avoids its relays, and builds a replacement. Target: the
path is replaced within 2 requests."""

from __future__ import annotations

import pytest
import trio

from overlay.anon import onion
from overlay.anon.paths import LATE_CLOVE, MISSING_GRACE, Path
from overlay.wire.clock import Clock
from overlay.wire.codec import encode
from overlay.wire.messages import CellBack, FromModel

from .attacks import ask, make_evil, ready_paths, start_secnet


@pytest.mark.parametrize("attack,pos", [
    ("drop", 0), ("drop", 1), ("drop", 2),     # drops cells (and Delivers / reply cloves at the proxy)
    ("flip", 0), ("flip", 1),                  # corrupts cells both ways
    ("bad-returns", 2),                        # a proxy corrupting reply cloves only
])
async def test_a_path_through_a_bad_relay_is_replaced_within_two_requests(autojump_clock, attack, pos):
    async with trio.open_nursery() as nursery:
        net = await start_secnet(nursery, 18)
        user = net.client
        assert user.paths is not None
        paths = await ready_paths(user)
        (evil,) = make_evil(net, paths, [(attack, pos)])
        bad, evil_id = paths[0], paths[0].relays[pos].node_id
        requests = 0
        while not bad.dead:
            assert requests < 2, f"the path through the {attack}ping relay survived {requests} requests"
            text = f"request {requests}: " + " ".join(f"w{j}" for j in range(20))
            assert await ask(user.client, text) == text
            requests += 1
            if attack == "drop":
                # the reply clove still missing LATE_CLOVE after the request puts the path in
                # doubt (not used any more); it is given up after the grace period
                await trio.sleep(LATE_CLOVE)
                assert bad not in user.paths.ready_paths() and bad.doubted
                await trio.sleep(MISSING_GRACE + 1.5)
        assert sum(evil.tampered.values()) > 0
        assert sum(user.paths.replaced.values()) == 1
        # A replacement avoiding the bad relay is ready, and requests keep working.
        fresh = await ready_paths(user)
        assert bad not in fresh and all(r.node_id != evil_id for p in fresh for r in p.relays)
        assert all(not p.dead for p in paths[1:])  # the honest paths were left alone
        assert await ask(user.client, "after") == "after"
        nursery.cancel_scope.cancel()


class Ticking:
    """A clock whose every reading is later than the one before, as a real clock's is (the
    mock clock stands still between awaits)."""

    def __init__(self, inner: Clock) -> None:
        self.inner, self.ticks = inner, 0

    def monotonic(self) -> float:
        self.ticks += 1
        return self.inner.monotonic() + self.ticks * 1e-6

    def unix(self) -> float:
        return self.inner.unix()


async def test_a_dropping_relay_is_caught_when_the_clock_moves_between_registrations(autojump_clock):
    # A request's return tags used to be grouped by the clock reading at registration: under
    # a real clock no two readings are equal, so no path was ever compared with the others
    # and a dropping relay's path stayed ready (found by `gentorrent bench failover`).
    async with trio.open_nursery() as nursery:
        net = await start_secnet(nursery, 18)
        user = net.client
        assert user.paths is not None
        user.paths.clock = Ticking(user.paths.clock)
        paths = await ready_paths(user)
        make_evil(net, paths, [("drop", 1)])
        bad = paths[0]
        assert await ask(user.client, "one request") == "one request"
        await trio.sleep(LATE_CLOVE)
        assert bad not in user.paths.ready_paths() and bad.doubted
        await trio.sleep(MISSING_GRACE + 1.5)
        assert bad.dead and user.paths.replaced == {"reply-cloves-missing": 1}
        nursery.cancel_scope.cancel()


def back_cell(path: Path, data: bytes) -> CellBack:
    """A reply clove on ``path`` as the user receives it: sealed by the proxy, layered by the relays."""
    iv, body = onion.ProxyCrypt(path.crypt.hops[-1].keys).seal_backward(encode(FromModel(data=data)))
    for h in reversed(path.crypt.hops[:-1]):
        iv, body = h.relay_backward(iv, body)
    return CellBack(path.link_id, iv, body)


async def test_a_slow_path_is_doubted_but_kept_when_its_clove_comes_late(autojump_clock):
    """No false alarm: a reply clove that arrives after its request ended (within the grace
    period) clears the doubt; and a request no path answered (the model node failed, say)
    puts no path in doubt, even while another request's cloves arrive."""
    async with trio.open_nursery() as nursery:
        net = await start_secnet(nursery, 18)
        user = net.client
        assert user.paths is not None
        pm = user.paths
        paths = await ready_paths(user)
        a, b = paths[0], paths[1]
        # request 1 on paths a and b (registered together); request 2 on paths c and d
        t1a, t1b, t2c, t2d = b"1a" * 4, b"1b" * 4, b"2c" * 4, b"2d" * 4
        got: list[bytes] = []
        a.returns[t1a] = b.returns[t1b] = got.append
        await trio.sleep(0.01)
        paths[2].returns[t2c] = paths[3].returns[t2d] = got.append
        pm.on_cell_back(b, back_cell(b, t1b + b"clove"))  # only b answers request 1
        pm.on_cell_back(paths[2], back_cell(paths[2], t2c + b"clove"))
        for p, t in ((a, t1a), (b, t1b), (paths[2], t2c), (paths[3], t2d)):
            p.returns.pop(t, None)
        assert got == [t1b + b"clove", t2c + b"clove"]
        # a brought nothing while b did, and d nothing while c did (request 2 is not compared
        # with request 1); a clove a moment behind is normal (the request ended at k cloves),
        # so nobody is in doubt before LATE_CLOVE
        assert not any(p.doubted for p in paths) and a in pm.ready_paths()
        pm.on_cell_back(a, back_cell(a, t1a + b"late"))  # a was only slow
        await trio.sleep(LATE_CLOVE)
        assert not a.doubted and a in pm.ready_paths() and paths[3] not in pm.ready_paths() and paths[3].doubted
        assert not b.doubted and not paths[2].doubted
        # e: a later request; its clove comes after LATE_CLOVE but within the grace period: in
        # doubt meanwhile (a replacement is built), then cleared and retired without suspicion
        e = next(p for p in await ready_paths(user) if p not in (a, paths[3]))
        f = next(p for p in pm.ready_paths() if p not in (a, paths[3], e))
        te, tf = b"3e" * 4, b"3f" * 4
        await trio.sleep(0.01)
        e.returns[te] = f.returns[tf] = got.append
        pm.on_cell_back(f, back_cell(f, tf + b"clove"))
        e.returns.pop(te, None)
        f.returns.pop(tf, None)
        await trio.sleep(LATE_CLOVE)
        assert (e in pm.ready_paths(), e.doubted) == (False, True)  # a tuple: mypy holds no narrowing past the call
        pm.on_cell_back(e, back_cell(e, te + b"late"))
        assert not e.doubted
        await trio.sleep(MISSING_GRACE + 2)
        assert not a.dead and paths[3].dead and pm.replaced == {"reply-cloves-missing": 1}

        # A request that no path answered: nobody is in doubt.
        fresh = await ready_paths(user)
        tags = [bytes([i]) * 8 for i in range(len(fresh))]
        for p, t in zip(fresh, tags, strict=True):
            p.returns[t] = got.append
        for p, t in zip(fresh, tags, strict=True):
            p.returns.pop(t, None)
        assert not any(p.doubted for p in fresh)
        nursery.cancel_scope.cancel()
