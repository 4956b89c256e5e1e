"""Admission (issue 28 items 1 and 2, decision 0014): each test plays the cheap attacker of the
issue against the committee's core and fails on the rules as they were (free, any-string,
first-come registrations kept forever)."""

from __future__ import annotations

import json

import pytest

from overlay.directory import registration as tx
from overlay.directory import work
from overlay.directory.registration import Code
from overlay.wire import crypto
from overlay.wire.constants import ROLE_USER
from tests.committee_helpers import CHAIN, Node
from verifier import admission
from verifier.admission import AdmissionParams, make_probe_tx
from verifier.app import CommitteeApp, Validator

T0 = 1_700_000_000
# A public network whose work is cheap enough for tests: scrypt n = 2**2, 4 bits at the normal rate.
CHEAP = AdmissionParams(work_bits=4, work_n_log2=2, free=3, step=2, window_s=3600, per_ip=2, per_prefix=3)


def committee(params: AdmissionParams, n: int = 4) -> tuple[CommitteeApp, list[crypto.SigningKey]]:
    keys = [crypto.SigningKey.generate() for _ in range(n)]
    app = CommitteeApp()
    app.init_chain(CHAIN, [Validator("ed25519", k.public_bytes, 10) for k in keys],
                   json.dumps({"admission": params.to_json()}).encode())
    return app, keys


def block(app: CommitteeApp, txs: list[bytes], time_s: int) -> list[Code]:
    results, _ = app.finalize_block(app.height + 1, time_s, txs)
    app.commit()
    return [r.code for r in results]


def paid_register(app: CommitteeApp, node: Node, address: str, role: int = ROLE_USER) -> bytes:
    """A register carrying the work the committee requires now (as CommitteeRegistration pays it)."""
    st = app.committed
    bits = admission.required_bits(st.admission, len(st.paid))
    got = work.solve(CHAIN, node.key.public_bytes, bits, st.admission.work_n_log2)
    assert got is not None
    node.seq += 1
    return tx.make_tx(node.key, CHAIN, tx.OP_REGISTER, node.seq, node.entry(role, address=address), work=got[0])


def probe(app: CommitteeApp, keys: list[crypto.SigningKey], time_s: int) -> list[Code]:
    reached = sorted((p.node_id, p.seq) for p in app.committed.pending.values())
    return block(app, [make_probe_tx(k, CHAIN, reached) for k in keys], time_s)


def listed(app: CommitteeApp, node: Node) -> bool:
    return node.node_id in app.committed.nodes


@pytest.mark.parametrize("address", ["127.0.0.1:9000", "10.1.2.3:9000", "192.168.1.2:9000", "169.254.169.254:80",
                                     "100.64.0.1:9000", "198.51.100.7:9000", "[::1]:9000", "[fe80::1]:9000",
                                     "[fd00::1]:9000", "224.0.0.1:9000", "0.0.0.0:9000"])
def test_a_public_network_refuses_addresses_others_cannot_reach(address: str) -> None:
    app, _ = committee(CHEAP)
    res = app.check_tx(paid_register(app, Node(), address))
    assert res.code == Code.ADDRESS_NOT_ALLOWED, res


def test_a_local_network_lists_loopback_and_one_host_counts_once() -> None:
    app, keys = committee(AdmissionParams.local())
    n = Node()
    assert block(app, [n.register(address="127.0.0.1:9000")], T0) == [Code.OK]
    assert not listed(app, n)  # probed first, as everywhere
    probe(app, keys, T0 + 1)
    assert listed(app, n)
    # The aliases of one address are not new addresses: the codec refuses them outright.
    for alias in ("[::ffff:127.0.0.1]:9000", "localhost:9000", "127.0.0.1.nip.io:9000", "127.000.0.1:9000"):
        with pytest.raises(tx.TxError):
            Node().register(address=alias)


def test_registration_costs_work_that_grows_with_the_rate() -> None:
    app, _keys = committee(CHEAP)
    free_rider = Node()
    res = app.check_tx(free_rider.register(address="8.8.4.4:9000"))
    assert res.code == Code.LOW_WORK and "requires 4" in res.log
    needed = []
    for i in range(9):
        needed.append(admission.required_bits(app.committed.admission, len(app.committed.paid)))
        assert block(app, [paid_register(app, Node(), f"8.{8 + i}.1.1:9000")], T0 + i) == [Code.OK]
    assert needed == [4, 4, 4, 4, 4, 5, 5, 6, 6]  # free 3, then a bit more every step (2)
    # A proof for the old difficulty no longer passes; a key's proof does not transfer to another key.
    now_needed = admission.required_bits(app.committed.admission, len(app.committed.paid))
    assert now_needed == 7
    late = Node()
    cheap = work.solve(CHAIN, late.key.public_bytes, 4, CHEAP.work_n_log2)
    assert cheap is not None
    while work.bits_of(CHAIN, late.key.public_bytes, cheap[0], CHEAP.work_n_log2) >= now_needed:
        cheap = work.solve(CHAIN, late.key.public_bytes, 4, CHEAP.work_n_log2)
        assert cheap is not None
    raw = tx.make_tx(late.key, CHAIN, tx.OP_REGISTER, 1, late.entry(address="9.9.9.9:9000"), work=cheap[0])
    assert app.check_tx(raw).code == Code.LOW_WORK
    # Another key reuses the nonce: its hash is a fresh draw, so one key in 2**bits passes by
    # chance; a thief whose draw falls short must be refused, not waved through on late's proof.
    thief = Node()
    while work.bits_of(CHAIN, thief.key.public_bytes, cheap[0], CHEAP.work_n_log2) >= now_needed:
        thief = Node()
    stolen = tx.make_tx(thief.key, CHAIN, tx.OP_REGISTER, 1, thief.entry(address="9.9.9.9:9000"), work=cheap[0])
    assert app.check_tx(stolen).code == Code.LOW_WORK
    # An hour later the window has slid: the normal price again.
    block(app, [], T0 + 3601 + 9)
    assert admission.required_bits(app.committed.admission, len(app.committed.paid)) == 4
    assert app.committed.paid == ()


def test_caps_per_ip_and_per_prefix() -> None:
    app, keys = committee(CHEAP)

    def join(address: str) -> list[Code]:
        got = block(app, [paid_register(app, Node(), address)], T0)
        probe(app, keys, T0)
        return got

    assert join("8.8.8.8:9000") == [Code.OK] and join("8.8.8.8:9001") == [Code.OK]
    res = app.check_tx(paid_register(app, Node(), "8.8.8.8:9002"))
    assert res.code == Code.ADDRESS_CAP and "8.8.8.8" in res.log
    assert join("8.8.8.9:9000") == [Code.OK]
    res = app.check_tx(paid_register(app, Node(), "8.8.8.10:9000"))  # the /24 lists 3
    assert res.code == Code.ADDRESS_CAP and "8.8.8.0/24" in res.log
    for i in range(3):
        assert join(f"[2001:4860:4860::{i + 1}]:9000") == [Code.OK]
    assert app.check_tx(paid_register(app, Node(), "[2001:4860:4860::99]:9000")).code == Code.ADDRESS_CAP  # one /48
    assert len(app.committed.nodes) == 6


def test_unproven_claims_do_not_use_up_an_owners_cap() -> None:
    """A squatter registering the owner's IP (ports nobody answers on) before the owner comes
    cannot lock it out: pending registrations count against no cap; the caps hold at listing."""
    app, keys = committee(CHEAP)
    squats = [Node(), Node()]
    for i, n in enumerate(squats):
        assert block(app, [paid_register(app, n, f"9.9.9.9:{7000 + i}")], T0) == [Code.OK]
    owner = Node()
    assert block(app, [paid_register(app, owner, "9.9.9.9:9000")], T0) == [Code.OK]
    # The validators reach only the owner; the squatters' claims stay pending and then go.
    reached = [(owner.node_id, owner.seq)]
    assert block(app, [make_probe_tx(k, CHAIN, reached) for k in keys[:3]], T0 + 1) == [Code.OK] * 3
    assert listed(app, owner)
    # Were all three reached (one host answering on three ports), the cap holds when they are listed.
    probe(app, keys, T0 + 2)
    assert sum(n.node_id in app.committed.nodes for n in squats) == 1 and app.probes_dropped == 1


def test_an_address_is_listed_only_once_more_than_two_thirds_of_the_power_reached_the_key_there() -> None:
    app, keys = committee(CHEAP)
    n = Node()
    assert block(app, [paid_register(app, n, "8.8.8.8:9000")], T0) == [Code.OK]
    assert not listed(app, n) and app.query("/node", n.node_id)[0].code == Code.UNKNOWN_NODE
    assert "probe" in app.query("/node", n.node_id)[0].log
    assert probe(app, keys[:2], T0 + 1) == [Code.OK, Code.OK]  # half the power: not yet
    assert not listed(app, n)
    assert probe(app, keys[:1], T0 + 1) == [Code.REPLAYED]  # a validator reports once
    stranger = crypto.SigningKey.generate()
    assert probe(app, [stranger], T0 + 1) == [Code.NOT_VALIDATOR]
    assert probe(app, keys[2:3], T0 + 2) == [Code.OK]
    assert listed(app, n)
    # A squatter's registration nobody could reach is dropped after PENDING_TTL_S, with its seq.
    squatter = Node()
    assert block(app, [paid_register(app, squatter, "8.8.4.4:9000")], T0 + 3) == [Code.OK]
    block(app, [], T0 + 3 + admission.PENDING_TTL_S)
    assert squatter.node_id not in app.committed.pending and squatter.node_id not in app.committed.seqs


def test_a_probe_transaction_is_strict() -> None:
    app, keys = committee(CHEAP)
    n = Node()
    block(app, [paid_register(app, n, "8.8.8.8:9000")], T0)
    good = make_probe_tx(keys[0], CHAIN, [(n.node_id, n.seq)])
    assert app.check_tx(good).ok
    assert app.check_tx(make_probe_tx(keys[0], "other-chain", [(n.node_id, n.seq)])).code == Code.BAD_SIGNATURE
    assert app.check_tx(make_probe_tx(keys[0], CHAIN, [(n.node_id, n.seq + 1)])).code == Code.REPLAYED
    for bad in (good[:-1], good + b"\x00", admission.PROBE_TAG + b"\xc1", admission.PROBE_TAG):
        assert app.check_tx(bad).code == Code.MALFORMED
    flipped = bytearray(good)
    flipped[-5] ^= 1
    assert app.check_tx(bytes(flipped)).code in (Code.BAD_SIGNATURE, Code.MALFORMED)


def test_squatting_an_address_while_its_owner_is_down_fails_and_the_owner_comes_back() -> None:
    app, keys = committee(CHEAP)
    owner = Node()
    block(app, [paid_register(app, owner, "8.8.8.8:9000")], T0)
    probe(app, keys, T0 + 1)
    assert block(app, [owner.leave()], T0 + 2) == [Code.OK]  # a clean stop
    squat = paid_register(app, Node(), "8.8.8.8:9000")
    res = app.check_tx(squat)
    assert res.code == Code.CONFLICT and "reserved" in res.log
    # The owner restarts: no new work, no new probe, the same address.
    back = tx.make_tx(owner.key, CHAIN, tx.OP_REGISTER, owner.seq + 1, owner.entry(address="8.8.8.8:9000"))
    owner.seq += 1
    assert block(app, [back], T0 + 60) == [Code.OK]
    assert listed(app, owner)
    # An entry that expires (a crash) keeps its address reserved the same way.
    block(app, [], T0 + 60 + tx_ttl())
    assert not listed(app, owner) and app.check_tx(squat).code == Code.CONFLICT


def tx_ttl() -> int:
    from overlay.directory.registration import ENTRY_TTL_S

    return ENTRY_TTL_S


def test_state_that_a_leaving_node_no_longer_needs_is_pruned() -> None:
    app, keys = committee(CHEAP)
    nodes = [Node() for _ in range(3)]
    for i, n in enumerate(nodes):
        block(app, [paid_register(app, n, f"8.8.{i}.8:9000")], T0)
    probe(app, keys, T0 + 1)
    block(app, [n.leave() for n in nodes], T0 + 2)
    st = app.committed
    assert len(st.tombstones) == 3 and len(st.seqs) == 3
    block(app, [], T0 + 2 + admission.RESERVE_S)
    st = app.committed
    assert not st.nodes and not st.tombstones and not st.seqs and not st.reserved and not st.held


def test_moving_to_a_new_address_is_probed_again() -> None:
    app, keys = committee(CHEAP)
    n = Node()
    block(app, [paid_register(app, n, "8.8.8.8:9000")], T0)
    probe(app, keys, T0 + 1)
    assert block(app, [n.update(address="8.8.8.8:9000")], T0 + 2) == [Code.OK]  # a refresh: still listed
    assert listed(app, n)
    assert block(app, [n.update(address="9.9.9.9:9000")], T0 + 3) == [Code.OK]
    assert not listed(app, n) and n.node_id in app.committed.pending
    probe(app, keys, T0 + 4)
    assert app.committed.nodes[n.node_id].entry.address == "9.9.9.9:9000"


def test_the_admission_state_survives_a_restart_byte_for_byte() -> None:
    app, keys = committee(CHEAP)
    a, b, c = Node(), Node(), Node()
    for i, n in enumerate((a, b, c)):
        block(app, [paid_register(app, n, f"8.8.{i}.8:9000")], T0)
    probe(app, keys[:3], T0 + 1)
    block(app, [paid_register(app, Node(), "9.9.9.9:9000"), a.leave()], T0 + 2)
    probe(app, keys[:1], T0 + 3)  # one attestation on record, not enough
    again = CommitteeApp.restore(app.snapshot())
    assert again.committed.canonical_bytes() == app.committed.canonical_bytes()
    assert again.committed.held == app.committed.held and again.committed.reserved == app.committed.reserved
    assert again.query("/admission", b"") == app.query("/admission", b"")


def test_admission_section_is_checked() -> None:
    bad: object
    for bad in ({"network": "lan"}, {"work_bits": 99}, {"per_ip": -1}, {"probe": 1}, {"other": 1}, []):
        with pytest.raises(admission.AdmissionParamsError):
            admission.params_from_app_state(json.dumps({"admission": bad}).encode())
    assert admission.params_from_app_state(b"") == admission.OPEN
    assert admission.params_from_app_state(b'{"audit": {}}') == admission.OPEN


def test_a_node_pays_the_work_the_committee_asks_for_and_comes_back_without_paying_again() -> None:
    import trio

    from overlay.directory.membership import node_entry
    from overlay.directory.registration import CommitteeRegistration, Registrar
    from overlay.wire.identity import Identity
    from tests.committee_helpers import InProcessCommittee

    c = InProcessCommittee(admission=CHEAP, probe_all=True)
    ident = Identity.generate()

    def reg() -> CommitteeRegistration:
        return CommitteeRegistration(["v0:1"], Registrar(ident.signing, CHAIN, node_entry(ident, "8.8.8.8:9000", "r")),
                                     rpc=c.rpc)

    async def main() -> tuple[int, int]:
        first = reg()
        await first.register()
        assert ident.node_id in c.app.committed.nodes  # paid, probed, listed
        await first.leave()
        again = reg()  # a restart: the key's reservation holds, no work is asked
        await again.register()
        return first.work_trials, again.work_trials

    paid, repaid = trio.run(main)
    assert paid >= 1 and repaid == 0
    assert ident.node_id in c.app.committed.nodes
