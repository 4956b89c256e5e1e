"""Frozen lists (issue 28, item 3): a client refuses a list whose signed time is too old, asks more
than one verifier so one replaying an old list cannot hold it back, leaves expired records out of
its view, and says how old its lists are. Fake clocks throughout; the committee is the in-process
one (tests/committee_helpers.py), whose block time follows the test's clock."""

from __future__ import annotations

import logging

import pytest
import trio
import trio.testing

from overlay.directory.lists import CLOCK_AHEAD_S, MAX_LIST_AGE_S, CommitteeClient, ListError
from overlay.directory.membership import Membership, node_entry
from overlay.directory.registration import ENTRY_TTL_S, CommitteeRegistration, Registrar
from overlay.directory.registry import Registry
from overlay.wire.clock import FakeClock
from overlay.wire.identity import Identity
from tests.committee_helpers import CHAIN, InProcessCommittee, Node

BOUND = MAX_LIST_AGE_S + CLOCK_AHEAD_S


def _committee(users: int = 3) -> tuple[InProcessCommittee, FakeClock, list[Node]]:
    clock = FakeClock(unix=1_750_000_000.0)
    c = InProcessCommittee(clock=clock)
    nodes = [Node(port=7000 + i) for i in range(users)]
    c.height([n.register() for n in nodes])
    c.settle()
    return c, clock, nodes


class Replayer:
    """A verifier that keeps serving the documents it held when :meth:`freeze` was called (genuine,
    signed, old), and has no delta to offer; the other addresses reach the honest committee."""

    def __init__(self, c: InProcessCommittee, bad: str = "bad:1") -> None:
        self.c = c
        self.bad = bad
        self.frozen: dict[str, bytes] = {}
        self.honest_down = False

    async def freeze(self) -> None:
        self.frozen = {p: await self.c.fetch(self.bad, p) for p in ("/lists/users", "/lists/models")}

    async def fetch(self, address: str, path: str) -> bytes:
        if address == self.bad and self.frozen:
            if path not in self.frozen:
                raise ListError(f"{address} answered code 10: no delta")
            return self.frozen[path]
        if self.honest_down:
            raise OSError(f"{address}: connection refused")
        return await self.c.fetch(address, path)


def _new_node(c: InProcessCommittee) -> Node:
    n = Node(port=8000 + c.app.height)
    assert c.height([n.register()])[1][-1].ok
    c.settle()
    return n


def test_a_replayed_old_list_is_refused_once_older_than_the_bound() -> None:
    c, clock, _ = _committee()
    r = Replayer(c)
    client = CommitteeClient(["bad:1", "good:1"], CHAIN, c.pinned, fetch=r.fetch, clock=clock)

    async def main() -> None:
        await client.refresh()
        await r.freeze()
        held = client.height
        r.honest_down = True  # only the replaying verifier is reachable
        clock.advance(BOUND - 5)
        c.tick()  # the committee goes on making blocks
        newer = _new_node(c)
        reg = await client.refresh()  # still young enough: taken
        assert client.height == held and newer.node_id not in reg.by_id
        clock.advance(10)
        c.tick()
        with pytest.raises(ListError, match=r"signed \d+ s ago, more than the 40 s a client accepts"):
            await client.refresh()
        assert client.list_age() == pytest.approx(BOUND + 5, abs=2)
        assert not client.fresh()

    trio.run(main)


def test_a_same_height_replay_does_not_keep_a_client_stale_while_an_honest_verifier_serves_newer() -> None:
    c, clock, _ = _committee()
    r = Replayer(c)
    seen: list[str] = []

    async def fetch(address: str, path: str) -> bytes:
        seen.append(address)
        return await r.fetch(address, path)

    # The replaying verifier is named first: a client that asks one verifier, starting with the
    # one that answered last, would take its same-height list forever.
    client = CommitteeClient(["bad:1", "good:1"], CHAIN, c.pinned, fetch=fetch, clock=clock)

    async def main() -> None:
        await r.freeze()
        await client.refresh()
        for _ in range(3):
            clock.advance(10)
            c.tick()
            newer = _new_node(c)
            reg = await client.refresh()
            assert newer.node_id in reg.by_id  # the honest verifier's newer list is the one kept
            assert client.height == c.app.cert.height  # type: ignore[union-attr]
        assert "bad:1" in seen and "good:1" in seen

    trio.run(main)


def test_expired_records_leave_the_clients_view() -> None:
    c, clock, nodes = _committee()
    client = CommitteeClient(["v:1"], CHAIN, c.pinned, fetch=c.fetch, clock=clock)

    async def main() -> None:
        reg = await client.refresh()
        assert {n.node_id for n in nodes} <= set(reg.by_id)
        clock.advance(100)
        c.tick()
        c.height([nodes[0].update()])  # nodes[0] refreshes its entry; the others do not
        c.settle()
        clock.advance(ENTRY_TTL_S - 120)
        await client.refresh()
        # The held list (say a replayed one, or a committee that stalled) still holds the others;
        # once their expires_at passes on this client's clock they are gone from its view.
        clock.advance(21)
        reg = client.registry()
        assert nodes[0].node_id in reg.by_id
        assert not {n.node_id for n in nodes[1:]} & set(reg.by_id)
        assert len(client.lists[1].entries) == len(nodes)  # the list itself is unchanged

    trio.run(main)


def test_the_client_says_how_old_its_lists_are_from_their_signed_time() -> None:
    c, clock, _ = _committee()
    client = CommitteeClient(["v:1"], CHAIN, c.pinned, fetch=c.fetch, clock=clock)
    assert client.list_age() is None and not client.fresh()

    async def main() -> None:
        await client.refresh()
        signed = c.app.lists_at(c.app.cert.height).time_s  # type: ignore[union-attr]
        assert client.list_age() == clock.unix() - signed and client.fresh()
        clock.advance(25)
        assert client.list_age() == clock.unix() - signed
        client.clock = FakeClock(unix=signed - 3600)  # a clock behind the committee's: the lists are not "old"
        assert client.list_age() == 0.0

    trio.run(main)


def test_membership_warns_when_no_fresh_list_can_be_had_and_drops_expired_records(
        caplog: pytest.LogCaptureFixture) -> None:
    """Membership keeps the held lists when no verifier serves a fresh one, says so clearly, and
    its registry still loses the records that expire (here: a node that stopped refreshing)."""
    c = InProcessCommittee()  # block time follows trio's clock (MockClock) through tick()
    me, other = Identity.generate(), Identity.generate()
    registry = Registry(0, [])
    r = Replayer(c, bad="v0:26657")

    async def main() -> None:
        member = Membership(c.settings(("v0:26657",)), me, registry, rpc=c.rpc, fetch=r.fetch)
        async with trio.open_nursery() as nursery:
            await CommitteeRegistration(["v0:1"], Registrar(other.signing, CHAIN, node_entry(
                other, "127.0.0.1:9001", "r")), rpc=c.rpc).register()
            await nursery.start(member.run, node_entry(me, "127.0.0.1:9000", "r"))
            assert other.node_id in registry.by_id
            await r.freeze()  # from now on the only verifier replays these lists
            await trio.sleep(ENTRY_TTL_S + 60)
            assert other.node_id not in registry.by_id  # expired on the node's clock, though still listed
            nursery.cancel_scope.cancel()

    with caplog.at_level(logging.WARNING, logger="gentorrent.membership"):
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert any("NO FRESH COMMITTEE LIST" in rec.getMessage() and "signed" in rec.getMessage()
               for rec in caplog.records)
