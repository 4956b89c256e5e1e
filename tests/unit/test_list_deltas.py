"""List deltas (issue 28, "Build"): a refresh costs what changed. The verifier serves, for a held
height, the node ids removed and the records added or changed since, under the full list's
certificate; the client applies it to its held list and accepts it only if the result hashes to
the signed digest. Any mismatch, or a height the verifier no longer covers, falls back to the full
list."""

from __future__ import annotations

import msgpack
import pytest
import trio

from overlay.directory.lists import KIND_MODELS, KIND_USERS, CommitteeClient, ListError, apply_delta, verify_document
from overlay.directory.registration import Code
from overlay.wire.clock import FakeClock
from overlay.wire.constants import ROLE_MODEL
from tests.committee_helpers import CHAIN, InProcessCommittee, Node
from verifier import app as core


def _committee(users: int = 40) -> tuple[InProcessCommittee, FakeClock, list[Node]]:
    clock = FakeClock(unix=1_750_000_000.0)
    c = InProcessCommittee(clock=clock)
    nodes = [Node(port=7000 + i) for i in range(users)]
    c.height([n.register() for n in nodes] + [Node(port=6000).register(ROLE_MODEL)])
    c.settle()
    return c, clock, nodes


def _churn(c: InProcessCommittee, nodes: list[Node], clock: FakeClock) -> list[Node]:
    """Some leave, some join, one moves region (an update), over a few blocks."""
    clock.advance(5)
    c.tick()
    joined = [Node(port=7500 + c.app.height + i) for i in range(3)]
    c.height([nodes[0].leave(), nodes[1].leave(), joined[0].register()])
    c.height([nodes[2].update(region="us-east"), joined[1].register()])
    c.height([joined[2].register(), nodes[3].leave()])
    c.settle()
    return joined


class Recording:
    """The committee's fetch, recording each path asked and the bytes answered."""

    def __init__(self, c: InProcessCommittee) -> None:
        self.c = c
        self.asked: list[tuple[str, int]] = []
        self.tamper: object = None  # a function of (path, raw) -> raw, for deltas

    async def fetch(self, address: str, path: str) -> bytes:
        raw = await self.c.fetch(address, path)
        if self.tamper is not None and "/since/" in path:
            raw = self.tamper(path, raw)  # type: ignore[operator]
        self.asked.append((path, len(raw)))
        return raw


def test_a_delta_applied_equals_the_full_list_and_costs_what_changed() -> None:
    c, clock, nodes = _committee()
    rec = Recording(c)
    client = CommitteeClient(["v:1"], CHAIN, c.pinned, fetch=rec.fetch, clock=clock)

    async def main() -> None:
        await client.refresh()
        first = client.height
        joined = _churn(c, nodes, clock)
        rec.asked.clear()
        reg = await client.refresh()
        paths = [p for p, _ in rec.asked]
        assert paths == [f"/lists/users/since/{first}", f"/lists/models/since/{first}"]  # no full list fetched
        full = {k: verify_document(await c.fetch("v:1", p), CHAIN, c.pinned, kind=k)
                for k, p in ((KIND_USERS, "/lists/users"), (KIND_MODELS, "/lists/models"))}
        for kind, lst in full.items():
            held = client.lists[kind]
            assert (held.height, held.digest, held.time_s) == (lst.height, lst.digest, lst.time_s)
            assert held.entries == lst.entries and held.raws == lst.raws and held.expires == lst.expires
        assert {n.node_id for n in joined} <= set(reg.by_id)
        assert not {n.node_id for n in (nodes[0], nodes[1], nodes[3])} & set(reg.by_id)
        assert reg.by_id[nodes[2].node_id].region == "us-east"
        users_delta = rec.asked[0][1]
        assert users_delta < len(await c.fetch("v:1", "/lists/users")) / 4  # 4 records changed of 40
        # Nothing changed since: a delta is just the certificate (the list's new time and signatures).
        clock.advance(3)
        rec.asked.clear()
        await client.refresh()
        assert len(rec.asked) == 2 and all("/since/" in p and n < 2000 for p, n in rec.asked)
        assert client.lists[KIND_USERS].entries == full[KIND_USERS].entries

    trio.run(main)


def _tampered_deltas() -> list[object]:
    def addr(path: str, raw: bytes) -> bytes:  # another address for an added record
        doc = msgpack.unpackb(raw)
        records = msgpack.unpackb(doc[7])
        if records:
            records[0][4] = "6.6.6.6:9000"
        doc[7] = msgpack.packb(records, use_bin_type=True)
        return msgpack.packb(doc, use_bin_type=True)  # type: ignore[no-any-return]

    def keep_removed(path: str, raw: bytes) -> bytes:  # hide the nodes that left
        doc = msgpack.unpackb(raw)
        doc[6] = b""
        return msgpack.packb(doc, use_bin_type=True)  # type: ignore[no-any-return]

    def drop_added(path: str, raw: bytes) -> bytes:  # hide the nodes that joined
        doc = msgpack.unpackb(raw)
        doc[7] = b"\x90"
        return msgpack.packb(doc, use_bin_type=True)  # type: ignore[no-any-return]

    def junk(path: str, raw: bytes) -> bytes:
        return raw[: len(raw) // 2]

    return [addr, keep_removed, drop_added, junk]


@pytest.mark.parametrize("tamper", _tampered_deltas(), ids=["address", "removals-hidden", "joins-hidden", "cut"])
def test_a_tampered_delta_is_refused_and_the_full_list_taken_instead(tamper: object) -> None:
    c, clock, nodes = _committee()
    rec = Recording(c)
    client = CommitteeClient(["v:1"], CHAIN, c.pinned, fetch=rec.fetch, clock=clock)

    async def main() -> None:
        await client.refresh()
        base = client.lists[KIND_USERS]
        joined = _churn(c, nodes, clock)
        good = await c.fetch("v:1", f"/lists/users/since/{base.height}")
        with pytest.raises(ListError):
            apply_delta(tamper(f"/lists/users/since/{base.height}", good),  # type: ignore[operator]
                        CHAIN, client.validators, base, now=clock.unix())
        rec.tamper = tamper
        rec.asked.clear()
        reg = await client.refresh()
        assert ("/lists/users", ) == tuple(p for p, _ in rec.asked if "users" in p)[1:]  # fell back to full
        assert {n.node_id for n in joined} <= set(reg.by_id) and nodes[0].node_id not in reg.by_id
        assert client.lists[KIND_USERS].digest == c.app.lists_at(client.height).users_digest  # type: ignore[union-attr]

    trio.run(main)


def test_a_delta_checks_its_certificate_and_base_like_a_full_list() -> None:
    c, clock, nodes = _committee()
    client = CommitteeClient(["v:1"], CHAIN, c.pinned, fetch=c.fetch, clock=clock)

    async def main() -> None:
        await client.refresh()
        base = client.lists[KIND_USERS]
        _churn(c, nodes, clock)
        good = await c.fetch("v:1", f"/lists/users/since/{base.height}")
        doc = msgpack.unpackb(good)
        doc[11] = doc[11][:2]  # two of four signatures
        with pytest.raises(ListError, match="more than 2/3"):
            apply_delta(msgpack.packb(doc, use_bin_type=True), CHAIN, client.validators, base, now=clock.unix())
        doc = msgpack.unpackb(good)
        doc[5] = base.height - 1  # a delta from another height than the one held
        with pytest.raises(ListError, match="since height"):
            apply_delta(msgpack.packb(doc, use_bin_type=True), CHAIN, client.validators, base, now=clock.unix())
        with pytest.raises(ListError, match=r"signed .* ago"):  # a replayed delta is as old as its list
            apply_delta(good, CHAIN, client.validators, base, now=clock.unix() + 3600)
        got = apply_delta(good, CHAIN, client.validators, base, now=clock.unix())
        assert got.height > base.height

    trio.run(main)


def test_the_verifier_answers_deltas_only_for_heights_it_covers() -> None:
    c, clock, nodes = _committee(users=5)
    app = c.app
    cert = app.cert
    assert cert is not None
    assert app.query(f"/lists/users/since/{cert.height}", b"")[0].ok
    for bad in ("/lists/users/since/", "/lists/users/since/-1", "/lists/users/since/1e3", "/lists/users/since/٣",
                "/lists/users/since/" + "9" * 20, "/lists/nodes", "/lists/users/", "/lists/users/since/1/2"):
        assert app.query(bad, b"")[0].code == Code.INVALID_FIELD, bad
    res = app.query(f"/lists/users/since/{cert.height + 1}", b"")[0]
    assert res.code == Code.UNAVAILABLE and "lags" in res.log
    # A verifier restored from its snapshot knows no change before its restart: full list only.
    c.app = core.CommitteeApp.restore(app.snapshot())
    c.settle()
    res = c.app.query(f"/lists/users/since/{cert.height}", b"")[0]
    assert res.code == Code.UNAVAILABLE and "fetch the full list" in res.log
    assert c.app.query("/lists/users", b"")[0].ok
    client = CommitteeClient(["v:1"], CHAIN, c.pinned, fetch=c.fetch, clock=clock)

    async def main() -> None:
        await client.refresh()
        full = client.full_fetches
        c.height([nodes[0].leave()])
        c.settle()
        await client.refresh()  # after the restart: the delta from a height it saw
        assert client.full_fetches == full and nodes[0].node_id not in client.registry().by_id

    trio.run(main)


def test_delta_history_is_bounded() -> None:
    c, _clock, _ = _committee(users=2)
    cert = c.app.cert
    assert cert is not None
    for _ in range(3):
        c.height()
    assert len(c.app._changes) <= core.DELTA_HISTORY
    old = core.DELTA_HISTORY
    try:
        core.DELTA_HISTORY = 3
        c.height()
        assert c.app.query(f"/lists/users/since/{cert.height}", b"")[0].code == Code.UNAVAILABLE
        assert len(c.app._changes) <= 3
    finally:
        core.DELTA_HISTORY = old
