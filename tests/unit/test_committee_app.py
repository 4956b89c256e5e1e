"""The committee's application core (verifier/app.py), called directly: rules, codes, determinism, restart."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from overlay.directory import registration as tx
from overlay.directory.registration import ENTRY_TTL_S, Code
from overlay.wire.constants import ROLE_MODEL, ROLE_USER
from tests.committee_helpers import CHAIN, Node
from verifier.admission import OPEN, RESERVE_S
from verifier.app import CommitteeApp, StateError, Validator

T0 = 1_700_000_000
VALIDATORS = [Validator("ed25519", bytes([i]) * 32, 10) for i in range(4)]


def fresh() -> CommitteeApp:
    a = CommitteeApp()
    a.init_chain(CHAIN, VALIDATORS)
    return a


def block(a: CommitteeApp, txs: list[bytes], time_s: int = T0) -> list[Code]:
    """Run one block the way CometBFT does: prepare, process, finalize, commit."""
    included = a.prepare_proposal(txs, 1 << 20, time_s)
    assert a.process_proposal(included, time_s)
    results, app_hash = a.finalize_block(a.height + 1, time_s, included)
    assert all(r.ok for r in results)
    a.commit()
    assert a.app_hash == app_hash
    return [a.check_tx(t).code for t in txs]


def test_register_update_leave_and_query() -> None:
    a = fresh()
    u, m = Node(), Node(port=9001)
    reg_u, reg_m = u.register(), m.register(ROLE_MODEL)
    assert a.check_tx(reg_u).code == Code.OK
    block(a, [reg_u, reg_m])
    assert a.height == 1 and len(a.app_hash) == 32
    res, value = a.query("/node", m.node_id)
    assert res.ok
    rec = msgpack.unpackb(value)
    assert rec[0] == m.node_id and rec[2] == ROLE_MODEL and rec[6] == "smollm2-135m" and rec[8] == T0 + ENTRY_TTL_S
    assert msgpack.unpackb(a.query("/seq", u.node_id)[1]) == 1
    assert [r[0] for r in msgpack.unpackb(a.query("/nodes", b"user")[1])] == [u.node_id]
    assert len(msgpack.unpackb(a.query("/nodes", b"")[1])) == 2
    assert msgpack.unpackb(a.query("/info", b"")[1])[3:] == [1, 1]
    block(a, [u.update(region="us-east"), m.leave()], T0 + 10)
    assert a.query("/node", m.node_id)[0].code == Code.UNKNOWN_NODE
    assert msgpack.unpackb(a.query("/node", u.node_id)[1])[5] == "us-east"
    assert a.query("/nope", b"")[0].code == Code.INVALID_FIELD


def test_rejections_carry_their_codes_and_change_nothing() -> None:
    a = fresh()
    u, v = Node(), Node(port=9001)
    first = u.register()
    block(a, [first])
    before = (a.app_hash, a.committed.canonical_bytes())
    cases = {
        Code.REPLAYED: first,
        Code.CONFLICT: u.register(),  # already registered
        Code.UNKNOWN_NODE: v.update(),
        Code.MALFORMED: b"\x93\x01\x02\x03",
        Code.OVERSIZE: b"x" * 2000,
        Code.UNSIGNED: msgpack.packb([msgpack.unpackb(v.register())[0], b""], use_bin_type=True),
        Code.BAD_SIGNATURE: Node().sign_tx(tx.OP_LEAVE, chain="other"),
    }
    w = Node(port=9000)  # same address as u
    cases_conflict_addr = w.register()
    for code, raw in cases.items():
        r = a.check_tx(raw)
        assert r.code == code, (code, r)
        assert r.log
    assert a.check_tx(cases_conflict_addr).code == Code.CONFLICT
    role_change = u.update(ROLE_MODEL)
    assert a.check_tx(role_change).code == Code.CONFLICT
    assert "role" in a.check_tx(role_change).log
    # None of them gets into a block, and the state is unchanged after one.
    all_bad = [*cases.values(), cases_conflict_addr, role_change]
    assert a.prepare_proposal(all_bad, 1 << 20, T0 + 1) == []
    for raw in all_bad:
        assert not a.process_proposal([raw], T0 + 1)
    results, _app_hash = a.finalize_block(a.height + 1, T0 + 1, all_bad)
    assert all(not r.ok for r in results)
    a.commit()
    assert (a.app_hash, a.committed.canonical_bytes()) == before
    assert a.rejected[Code.CONFLICT] >= 3


def test_prepare_drops_invalid_and_in_block_duplicates_and_respects_max_bytes() -> None:
    a = fresh()
    u = Node()
    reg = u.register()
    dup_seq = u.sign_tx(tx.OP_UPDATE, u.entry(), seq=1)  # same seq as the register, valid alone
    upd = u.update()
    assert a.prepare_proposal([b"junk", reg, dup_seq, upd], 1 << 20, T0) == [reg, upd]
    assert not a.process_proposal([reg, dup_seq], T0)
    assert a.process_proposal([reg, upd], T0)
    size = len(reg) + 1 + (2 if len(reg) >= 128 else 1)  # CometBFT counts the protobuf field overhead
    assert a.prepare_proposal([reg, upd], size, T0) == [reg]
    assert a.prepare_proposal([reg, upd], size - 1, T0) == []
    assert a.dropped_from_proposals == 2 + 1 + 2
    assert a.rejected_proposals == 1


def test_entries_expire_by_block_time_and_seq_outlives_them() -> None:
    a = fresh()
    u, m = Node(), Node(port=9001)
    block(a, [u.register(), m.register(ROLE_MODEL)], T0)
    block(a, [m.update(ROLE_MODEL)], T0 + ENTRY_TTL_S - 1)  # m refreshes, u does not
    block(a, [], T0 + ENTRY_TTL_S)
    assert a.query("/node", u.node_id)[0].code == Code.UNKNOWN_NODE
    assert a.query("/node", m.node_id)[0].ok
    assert a.check_tx(u.update()).code == Code.UNKNOWN_NODE
    old = u.sign_tx(tx.OP_REGISTER, u.entry(), seq=1)
    assert a.check_tx(old).code == Code.REPLAYED  # the expired entry's seq still guards it
    block(a, [u.register()], T0 + ENTRY_TTL_S + 5)
    assert a.query("/node", u.node_id)[0].ok


def test_an_address_stays_reserved_to_a_node_that_left_then_frees() -> None:
    """Squatting (issue 28 item 2): a node that leaves on a clean stop keeps its address for
    RESERVE_S; another key cannot take it meanwhile, the owner comes back to it at once."""
    a = fresh()
    u, w = Node(), Node()
    block(a, [u.register()])
    assert a.check_tx(w.register()).code == Code.CONFLICT
    block(a, [u.leave()], T0 + 1)
    res = a.check_tx(w.register())
    assert res.code == Code.CONFLICT and "reserved" in res.log
    block(a, [u.register()], T0 + 2)  # the owner restarts: its address is still its own
    assert a.query("/node", u.node_id)[0].ok
    block(a, [u.leave()], T0 + 3)
    block(a, [], T0 + 3 + RESERVE_S)  # the reservation runs out, and with it the seq the state kept
    assert u.node_id not in a.committed.seqs and not a.committed.tombstones
    block(a, [w.register()], T0 + 4 + RESERVE_S)
    assert a.query("/node", w.node_id)[0].ok


def test_info_restart_and_corrupt_snapshots() -> None:
    a = fresh()
    assert a.info() == (0, b"")
    block(a, [Node().register(), Node(port=1).register(ROLE_MODEL)])
    snap = a.snapshot()
    b = CommitteeApp.restore(snap)
    assert b.info() == a.info() and b.committed.canonical_bytes() == a.committed.canonical_bytes()
    assert b.committed.addresses == a.committed.addresses
    with pytest.raises(StateError):
        CommitteeApp.restore(snap[:-3])
    version, height, app_hash, state, time_s, cert = msgpack.unpackb(snap)
    with pytest.raises(StateError, match="does not match"):
        CommitteeApp.restore(msgpack.packb([version, height, b"\x00" * 32, state, time_s, cert], use_bin_type=True))
    with pytest.raises(StateError, match="format"):
        CommitteeApp.restore(msgpack.packb([99, height, app_hash, state, time_s, cert], use_bin_type=True))
    with pytest.raises(StateError, match=r"format 1, this verifier reads 2 .*Resync"):  # before the certificate
        CommitteeApp.restore(msgpack.packb([1, height, app_hash, state], use_bin_type=True))


def test_finalize_needs_the_next_height_and_commit_needs_finalize() -> None:
    a = fresh()
    block(a, [])
    with pytest.raises(ValueError, match="height"):
        a.finalize_block(5, T0, [])
    with pytest.raises(ValueError, match="Commit without"):
        a.commit()


def test_empty_blocks_keep_the_app_hash() -> None:
    a = fresh()
    block(a, [Node().register()])
    h = a.app_hash
    block(a, [], T0 + 1)
    assert a.app_hash == h and a.height == 2


# ----------------------------------------------------------------- determinism

_POOL = [Node(port=9000 + i) for i in range(5)]


@st.composite
def _blocks(draw: st.DrawFn) -> list[tuple[int, list[bytes]]]:
    """A random run: per block, a time step and txs drawn from register/update/leave/replays/junk."""
    for n in _POOL:
        n.seq = 0
    sent: list[bytes] = []
    out = []
    t = T0
    for _ in range(draw(st.integers(1, 6))):
        t += draw(st.sampled_from([1, 5, ENTRY_TTL_S // 2, ENTRY_TTL_S]))
        txs = []
        for _ in range(draw(st.integers(0, 5))):
            n = draw(st.sampled_from(_POOL))
            kind = draw(st.sampled_from(["reg", "regm", "upd", "leave", "replay", "junk", "addr"]))
            if kind == "reg":
                raw = n.register()
            elif kind == "regm":
                raw = n.register(ROLE_MODEL)
            elif kind == "upd":
                raw = n.update()
            elif kind == "leave":
                raw = n.leave()
            elif kind == "addr":
                raw = n.register(address="127.0.0.1:9000")
            elif kind == "replay" and sent:
                raw = draw(st.sampled_from(sent))
            else:
                raw = draw(st.binary(max_size=40))
            sent.append(raw)
            txs.append(raw)
        out.append((t, txs))
    return out


@settings(max_examples=60, deadline=None)
@given(_blocks())
def test_two_instances_fed_the_same_blocks_agree_and_restart_agrees(run: list[tuple[int, list[bytes]]]) -> None:
    a, b = fresh(), fresh()
    for t, txs in run:
        proposal = a.prepare_proposal(txs, 1 << 20, t)
        assert b.process_proposal(proposal, t)
        ra, ha = a.finalize_block(a.height + 1, t, proposal)
        rb, hb = b.finalize_block(b.height + 1, t, proposal)
        assert ha == hb and ra == rb and all(r.ok for r in ra)
        a.commit()
        b = CommitteeApp.restore(b.commit())  # b restarts from its persisted state every block
        assert a.info() == b.info()
        # the state's index agrees with its records
        assert {r.entry.address: n for n, r in a.committed.nodes.items()} == a.committed.addresses
    assert a.committed.canonical_bytes() == b.committed.canonical_bytes()



@pytest.mark.parametrize("count", [0, 1, 15, 16, 17, 300])
def test_canonical_bytes_are_plain_msgpack_of_the_state(count: int) -> None:
    a = fresh()
    nodes = [Node(port=1000 + i) for i in range(count)]
    if nodes:
        block(a, [n.register(ROLE_MODEL if i % 2 else ROLE_USER) for i, n in enumerate(nodes)])
    st = a.committed
    plain = msgpack.packb([
        6, CHAIN, [[v.key_type, v.public_key, v.power] for v in st.validators],
        [st.nodes[n].to_wire() for n in sorted(st.nodes)], [[n, st.seqs[n]] for n in sorted(st.seqs)],
        st.change_seq, None,  # no audit section in this genesis
        [OPEN.to_wire(), [], [], []],  # nor an admission section: open admission, nothing paid, pending or left
    ], use_bin_type=True)
    assert st.canonical_bytes() == plain
    assert msgpack.unpackb(a.query("/nodes", b"")[1]) == msgpack.unpackb(msgpack.packb(
        [st.nodes[n].to_wire() for n in sorted(st.nodes)], use_bin_type=True))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=6))
def test_hostile_bytes_never_raise_and_never_change_state(txs: list[bytes]) -> None:
    a = fresh()
    block(a, [Node().register()])
    before = a.app_hash
    for raw in txs:
        assert not a.check_tx(raw).ok
    assert a.prepare_proposal(txs, 1 << 20, T0 + 1) == []
    assert a.process_proposal(txs, T0 + 1) == (not txs)
    results, app_hash = a.finalize_block(a.height + 1, T0 + 1, txs)
    assert app_hash == before and all(not r.ok for r in results)
