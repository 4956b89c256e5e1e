"""A node's registration with the committee (overlay/directory/registration.py, overlay/directory/membership.py) and the
relay/model-node rule that only registered nodes use the network, against an in-process committee
(verifier/app.py run block by block as CometBFT would, with signed lists)."""

from __future__ import annotations

import functools
from typing import Any

import msgpack
import pytest
import trio
import trio.testing

from overlay.anon import onion
from overlay.anon.relay import RelayCore
from overlay.directory.membership import (
    MIN_GAP_S,
    WARMUP_S,
    Membership,
    committee_settings,
    node_entry,
    serve_member,
)
from overlay.directory.registration import (
    OP_LEAVE,
    OP_REGISTER,
    OP_UPDATE,
    REFRESH_INTERVAL_S,
    Code,
    CommitteeRegistration,
    Registrar,
    RegistrationError,
    decode_tx,
)
from overlay.directory.registry import Registry, RegistryError
from overlay.testing import wait_until
from overlay.wire import crypto
from overlay.wire.identity import Identity
from overlay.wire.messages import Create, Destroy
from tests.committee_helpers import CHAIN, InProcessCommittee


def _ops(c: InProcessCommittee) -> list[tuple[int, int]]:
    out = []
    for raw in c.sent:
        tx = decode_tx(raw, CHAIN)
        out.append((tx.op, tx.seq))
    return out


def _listed(c: InProcessCommittee, node_id: bytes) -> bool:
    return c.app.query("/node", node_id)[0].ok


def test_registrar_core_register_refresh_leave_and_restart() -> None:
    ident = Identity.generate()
    r = Registrar(ident.signing, CHAIN, node_entry(ident, "127.0.0.1:9000", "eu-west"))
    r.begin(0, False)
    tx = decode_tx(r.next_tx(), CHAIN)
    assert (tx.op, tx.seq, tx.node_id) == (OP_REGISTER, 1, ident.node_id)
    assert (r.listed, r.due_at) == (False, None)  # a tuple: mypy holds no narrowing past committed()
    r.committed(100.0)
    assert r.listed and r.due_at == 100.0 + REFRESH_INTERVAL_S
    assert (decode_tx(r.next_tx(), CHAIN).op, decode_tx(r.next_tx(), CHAIN).seq) == (OP_UPDATE, 2)
    r.failed(200.0)
    assert r.due_at == 200.0 + r.retry
    leave = decode_tx(r.leave_tx(), CHAIN)
    assert (leave.op, leave.seq, leave.entry) == (OP_LEAVE, 2, None)
    # A restart reads the committee's seq: still listed -> update with the next seq.
    again = Registrar(ident.signing, CHAIN, node_entry(ident, "127.0.0.1:9000", "eu-west"))
    again.begin(7, True)
    tx = decode_tx(again.next_tx(), CHAIN)
    assert (tx.op, tx.seq) == (OP_UPDATE, 8)
    with pytest.raises(RegistrationError):
        node_entry(ident, "0.0.0.0:9000", "eu-west")  # not dialable by others
    m = node_entry(ident, "127.0.0.1:9001", "eu-west", model="smollm2", capacity=3)
    assert (m.role, m.model_id, m.capacity) == (2, "smollm2", 3)


def test_register_leave_and_restart_continue_the_seq_against_the_committee() -> None:
    c = InProcessCommittee()
    ident = Identity.generate()

    async def main() -> None:
        reg = CommitteeRegistration(["v0:1"], Registrar(ident.signing, CHAIN, node_entry(ident, "127.0.0.1:9000", "r")),
                                    rpc=c.rpc, unix_ms=lambda: 0)  # a clock at 0: seqs count 1, 2, 3
        await reg.register()
        assert _listed(c, ident.node_id)
        await reg.leave()
        assert not _listed(c, ident.node_id)
        # A new process with the same key: the committee's seq (2) is read first.
        again = CommitteeRegistration(["v0:1"], Registrar(ident.signing, CHAIN,
                                                          node_entry(ident, "127.0.0.1:9000", "r")), rpc=c.rpc,
                                       unix_ms=lambda: 0)
        await again.register()
        # ...and a crash (no leave) then a restart updates the live entry instead of registering twice.
        third = CommitteeRegistration(["v0:1"], Registrar(ident.signing, CHAIN,
                                                          node_entry(ident, "127.0.0.1:9002", "r")), rpc=c.rpc,
                                       unix_ms=lambda: 0)
        await third.register()

    trio.run(main)
    assert _ops(c) == [(OP_REGISTER, 1), (OP_LEAVE, 2), (OP_REGISTER, 3), (OP_UPDATE, 4)]
    rec = msgpack.unpackb(c.app.query("/node", ident.node_id)[1])
    assert rec[4] == "127.0.0.1:9002"


def test_a_refused_registration_names_the_code_and_log_and_unreachable_verifiers_are_listed() -> None:
    c = InProcessCommittee()
    a, b = Identity.generate(), Identity.generate()

    async def main() -> None:
        await CommitteeRegistration(["v0:1"], Registrar(a.signing, CHAIN, node_entry(a, "127.0.0.1:9000", "r")),
                                    rpc=c.rpc).register()
        taken = CommitteeRegistration(["v0:1"], Registrar(b.signing, CHAIN, node_entry(b, "127.0.0.1:9000", "r")),
                                      rpc=c.rpc)
        with pytest.raises(RegistrationError, match=r"code 6 CONFLICT: .*address") as info:
            await taken.register()
        assert info.value.code == Code.CONFLICT
        c.down = True
        with pytest.raises(RegistrationError, match=r"v0:1: .*refused; v1:2: .*refused.*is the committee running"):
            await CommitteeRegistration(["v0:1", "v1:2"], Registrar(b.signing, CHAIN, node_entry(
                b, "127.0.0.1:9001", "r")), rpc=c.rpc).register()

    trio.run(main)
    assert not _listed(c, b.node_id)


def test_membership_registers_refreshes_before_expiry_sees_updates_live_and_leaves() -> None:
    c = InProcessCommittee()
    me, other = Identity.generate(), Identity.generate()
    registry = Registry(0, [])
    updates: list[int] = []

    async def main() -> None:
        member = Membership(c.settings(), me, registry, on_update=lambda r: updates.append(len(r.entries)),
                            rpc=c.rpc, fetch=c.fetch)
        async with trio.open_nursery() as nursery:
            await nursery.start(member.run, node_entry(me, "127.0.0.1:9000", "r"))
            assert me.node_id in registry.by_id and updates == [1]  # lists holding this node, before started()
            # Another node registers: the held registry object sees it at the next list refresh.
            await CommitteeRegistration(["v0:1"], Registrar(other.signing, CHAIN, node_entry(
                other, "127.0.0.1:9001", "r", model="m", capacity=2)), rpc=c.rpc).register()
            await trio.sleep(member.client.interval * 2.5)
            assert other.node_id in registry.by_id and registry.models("m")
            # Time passes: the entry is refreshed before it could expire.
            c.now += REFRESH_INTERVAL_S
            await trio.sleep(REFRESH_INTERVAL_S + 1)
            assert [op for op, _ in _ops(c) if op != OP_REGISTER] == [OP_UPDATE]
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    mine = [(op, seq) for raw, (op, seq) in zip(c.sent, _ops(c), strict=True)
            if decode_tx(raw, CHAIN).node_id == me.node_id]
    assert [op for op, _ in mine] == [OP_REGISTER, OP_UPDATE, OP_LEAVE]  # clean shutdown: leave
    assert [seq for _, seq in mine] == sorted({seq for _, seq in mine})  # seqs only grow
    assert not _listed(c, me.node_id)


class ListedStub:
    """A node as serve_member sees it: serves on a port, counts list changes."""

    def __init__(self, identity: Identity) -> None:
        self.identity = identity
        self.on_unlisted: Any = None
        self.changes = 0

    async def serve(self, host: str = "127.0.0.1", port: int = 0, *,
                    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started(f"{host}:{port or 7100}")
        await trio.sleep_forever()

    def directory_changed(self) -> None:
        self.changes += 1


@pytest.mark.parametrize("with_committee", [True, False])
def test_serve_member_starts_a_node_ready_registered_at_the_address_it_serves(with_committee: bool) -> None:
    """The one way every role starts (chat, gateway, relay, auditor, model node): started once the
    node serves and a verified list holds it at the address it listens on; list changes reach the
    node, and a peer it does not know refreshes the lists early. Without a committee: served only."""
    c = InProcessCommittee()
    me, other = Identity.generate(), Identity.generate()
    node, registry = ListedStub(me), Registry(0, [])

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            address, member = await nursery.start(functools.partial(
                serve_member, node, "127.0.0.1", 0, c.settings() if with_committee else None, registry,
                lambda address: node_entry(me, address, "r"), rpc=c.rpc, fetch=c.fetch))
            assert address == "127.0.0.1:7100"
            if not with_committee:
                assert member is None and node.on_unlisted is None and not c.sent
                nursery.cancel_scope.cancel()
                return
            assert registry.by_id[me.node_id].address == "127.0.0.1:7100"
            assert node.on_unlisted == member.poke and node.changes == 1
            await trio.sleep(WARMUP_S)  # past the start-up's frequent refreshes
            await CommitteeRegistration(["v0:1"], Registrar(other.signing, CHAIN, node_entry(
                other, "127.0.0.1:9001", "r")), rpc=c.rpc).register()
            node.on_unlisted()  # the node met ``other`` before its lists did
            await trio.sleep(MIN_GAP_S + 0.5)  # well before the next regular refresh
            assert other.node_id in registry.by_id and node.changes == 2
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert _listed(c, me.node_id) is False  # cancelled: it left (or never registered)


def test_membership_fails_clearly_when_no_signed_list_holds_the_node() -> None:
    c = InProcessCommittee()
    me = Identity.generate()

    async def no_lists(address: str, path: str) -> bytes:
        raise OSError("connection refused")

    async def main() -> None:
        member = Membership(c.settings(), me, Registry(0, []), rpc=c.rpc, fetch=no_lists, list_wait=5)
        with pytest.raises(RegistrationError, match="no signed list holding this node came within 5 s"):
            await member.run(node_entry(me, "127.0.0.1:9000", "r"))

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_committee_settings_need_both_flags_and_read_the_genesis(tmp_path: Any) -> None:
    import base64
    import json

    class Cfg:
        committee: str | None = "127.0.0.1:26657, 127.0.0.1:26667"
        committee_genesis: str | None = None

    cfg = Cfg()
    with pytest.raises(RegistryError, match="--committee needs --committee-genesis"):
        committee_settings(cfg)
    keys = [crypto.SigningKey.generate().public_bytes for _ in range(4)]
    gen = tmp_path / "genesis.json"
    gen.write_text(json.dumps({"chain_id": "c1", "validators": [
        {"pub_key": {"type": "tendermint/PubKeyEd25519", "value": base64.b64encode(k).decode()}, "power": "10"}
        for k in keys]}))
    cfg.committee_genesis = str(gen)
    got = committee_settings(cfg)
    assert got is not None and got.chain_id == "c1" and got.addresses == ("127.0.0.1:26657", "127.0.0.1:26667")
    assert [v.public_key for v in got.validators] == keys
    gen.write_text("{}")
    with pytest.raises(RegistryError, match="no chain_id or validators"):
        committee_settings(cfg)
    cfg.committee = None
    with pytest.raises(RegistryError, match="--committee-genesis needs --committee"):
        committee_settings(cfg)


def _create(hops: list[Identity]) -> Create:
    pkt, _ = onion.build_onion([h.x25519.public_bytes for h in hops], [h.node_id for h in hops], 2000)
    return Create(crypto.random_bytes(16), pkt)


def test_a_relay_refuses_paths_from_unregistered_nodes_and_closes_those_of_nodes_that_left() -> None:
    relay, member, stranger, h1, h2 = (Identity.generate() for _ in range(5))
    listed = {member.node_id, h1.node_id, h2.node_id}
    core = RelayCore(relay.node_id, relay.x25519, knows=lambda i: i in listed, admits=lambda i: i in listed)
    out = core.on_message(stranger.node_id, _create([relay, h1, h2]), now=1.0, unix=1000.0)
    assert out == [] and core.held == 1  # held up to hold_s for a list that holds the stranger
    out = core.release_held(now=1.0 + core.limits.hold_s, unix=1003.0)  # none came: refused
    assert [type(s.msg) for s in out] == [Destroy] and out[0].msg.reason == "not-registered"
    assert core.dropped["not-registered"] == 1 and len(core) == 0 and core.held == 0
    out = core.on_message(member.node_id, _create([relay, h1, h2]), now=1.0, unix=1000.0)
    assert len(core) == 1 and [(s.peer, type(s.msg)) for s in out] == [(h1.node_id, Create)]
    assert core.forget_unlisted() == []  # still listed: nothing closes
    listed.discard(member.node_id)  # the member left the committee's lists
    out = core.forget_unlisted()
    assert len(core) == 0 and core.dropped["path-unlisted"] == 1
    assert sorted((s.peer, s.msg.reason) for s in out) == sorted(
        [(member.node_id, "not-registered"), (h1.node_id, "not-registered")])


def test_a_node_started_before_its_committee_waits_for_it_then_registers() -> None:
    c = InProcessCommittee()
    me = Identity.generate()
    c.down = True

    async def main() -> None:
        reg = CommitteeRegistration(["v0:1"], Registrar(me.signing, CHAIN, node_entry(me, "127.0.0.1:9000", "r")),
                                    rpc=c.rpc, start_wait=10)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reg.wait_reachable)
            await trio.sleep(5)
            c.down = False  # the committee comes up within the wait
        await reg.register()
        c.down = True
        with pytest.raises(RegistrationError, match="no verifier answered status"):
            await reg.wait_reachable()  # and never within it: a clear error after start_wait

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert _listed(c, me.node_id)


def test_a_poke_refreshes_the_lists_early_after_the_warmup() -> None:
    from overlay.directory.membership import MIN_GAP_S, WARMUP_S

    c = InProcessCommittee()
    me, other = Identity.generate(), Identity.generate()
    registry = Registry(0, [])

    async def main() -> None:
        member = Membership(c.settings(), me, registry, rpc=c.rpc, fetch=c.fetch)
        async with trio.open_nursery() as nursery:
            await nursery.start(member.run, node_entry(me, "127.0.0.1:9000", "r"))
            await trio.sleep(WARMUP_S + 1)
            seen = member.refreshes
            with trio.fail_after(30):  # just after a steady-state refresh: the next is 10 s away
                await wait_until(lambda: member.refreshes != seen)
            await CommitteeRegistration(["v0:1"], Registrar(other.signing, CHAIN, node_entry(
                other, "127.0.0.1:9001", "r")), rpc=c.rpc).register()
            await trio.sleep(MIN_GAP_S + 0.5)
            assert other.node_id not in registry.by_id  # not without a poke
            member.poke()  # e.g. a relay met `other`, unlisted
            await trio.sleep(MIN_GAP_S + 0.5)
            assert other.node_id in registry.by_id
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_an_untrusted_model_node_stays_listed_starts_and_is_told_why_no_client_uses_it(
        caplog: pytest.LogCaptureFixture) -> None:
    """A model node whose audits put its reputation under 0.4 stays on the signed model list (so
    the audits still reach it and an honest node can come back, decision 0013); it starts, and
    its operator is told it is untrusted and what to check."""
    from dataclasses import replace

    from verifier.app import CommitteeApp, Validator
    from verifier.audit import reputation

    c = InProcessCommittee()
    c.app = CommitteeApp()  # the same validators, with audits on
    c.app.init_chain(CHAIN, [Validator("ed25519", k.public_bytes, 10) for k in c.keys],
                     b'{"audit": {"epoch_blocks": 12, "challenges_per_node": 2}}')
    c.settle()
    me = Identity.generate()

    async def rpc(address: str, method: str, params: dict[str, str]) -> object:
        out = await c.rpc(address, method, params)
        st = c.app.committed
        if me.node_id in st.nodes and st.audit is not None and not st.audit.reputation.nodes:
            c.app.committed = replace(st, audit=replace(st.audit, reputation=replace(st.audit.reputation, nodes={
                me.node_id: reputation.NodeReputation(200_000, (True,), 1)})))
            c.settle()  # the next lists are signed over the new state
        return out

    async def main() -> None:
        member = Membership(c.settings(), me, Registry(0, []), rpc=rpc, fetch=c.fetch, list_wait=5)
        async with trio.open_nursery() as nursery:
            await nursery.start(member.run, node_entry(me, "127.0.0.1:9000", "r", model="m", capacity=2))
            while me.node_id not in member.registry.by_id or member.registry.by_id[me.node_id].reputation != 200_000:
                member.poke()
                await trio.sleep(1)
            nursery.cancel_scope.cancel()

    with caplog.at_level("WARNING", logger="gentorrent.membership"):
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    warned = [r.getMessage() for r in caplog.records if "untrusted" in r.getMessage()]
    assert len(warned) == 1 and "reputation at 0.200" in warned[0] and "no client sends it requests" in warned[0]


def test_membership_gives_the_validators_powers_it_holds_now_genesis_then_the_lists() -> None:
    """What a donor deals an escrow by and a model node reads a release by (decision 0037): the
    committee client's validator set, which a signed list naming another set replaces."""
    from overlay.directory.lists import ValidatorKey

    c = InProcessCommittee()
    member = Membership(c.settings(), Identity.generate(), Registry(0, []), rpc=c.rpc, fetch=c.fetch)
    assert member.powers() == {v.public_key: v.power for v in c.settings().validators} != {}
    newer = (ValidatorKey(crypto.SigningKey.generate().public_bytes, 7),)
    member.client.validators = newer  # as CommitteeClient.keep adopts a list's set
    assert member.powers() == {newer[0].public_key: 7}
