"""Signed lists: the client's verification (overlay/directory/lists.py) and the verifier core's side
(vote extensions, certificates in blocks, queries; verifier/app.py), with keys made in the test."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from overlay.directory import registration as tx
from overlay.directory.lists import (
    KIND_MODELS,
    KIND_USERS,
    CommitteeClient,
    ListError,
    ValidatorKey,
    encode_document,
    signing_message,
    validators_digest,
    verify_document,
)
from overlay.directory.registration import Code
from overlay.wire import crypto
from overlay.wire.clock import FakeClock
from overlay.wire.constants import ROLE_MODEL, ROLE_USER
from overlay.wire.identity import node_id_of
from tests.committee_helpers import CHAIN, Node
from verifier import quorum
from verifier.app import CommitteeApp, Validator

T0 = 1_700_000_000


def _record(i: int, role: int = 1, reputation: int = 900_000, audited: bool = True) -> list[Any]:
    """A list record; a model record carries the committee's reputation of the node as its 10th field
    and whether its model is audited as its 11th (lists format 3)."""
    key = crypto.SigningKey.generate()
    return [node_id_of(key.public_bytes), key.public_bytes, role, bytes(32), f"10.0.0.{i}:9000", "eu-west",
            "smollm2" if role == 2 else "", 5 if role == 2 else 0, T0 + 1800,
            *([reputation, audited] if role == 2 else [])]


class Committee:
    """Four validator keys that sign lists as the verifiers do."""

    def __init__(self, n: int = 4, power: int = 10) -> None:
        self.keys = [crypto.SigningKey.generate() for _ in range(n)]
        self.pinned = [ValidatorKey(k.public_bytes, power) for k in self.keys]

    def document(self, height: int, users: list[list[object]], models: list[list[object]] | None = None, *,
                 signers: int | None = None, kind: int = KIND_USERS, t: int = T0) -> bytes:
        ub = msgpack.packb(sorted(users, key=lambda r: r[0]), use_bin_type=True)  # type: ignore[arg-type,return-value]
        mb = msgpack.packb(sorted(models or [], key=lambda r: r[0]), use_bin_type=True)  # type: ignore[arg-type,return-value]
        ud, md = crypto.sha256(ub), crypto.sha256(mb)
        msg = signing_message(CHAIN, height, t, ud, md, validators_digest(self.pinned))
        sigs = [(k.public_bytes, k.sign(msg)) for k in self.keys[:signers]]
        return encode_document(CHAIN, height, t, kind, ub if kind == KIND_USERS else mb, ud, md, self.pinned, sigs)


def test_a_good_list_is_accepted_and_becomes_peer_entries() -> None:
    c = Committee()
    users = [_record(i) for i in range(20)]
    got = verify_document(c.document(7, users, signers=3), CHAIN, c.pinned, kind=KIND_USERS)
    assert got.height == 7 and len(got.signers) == 3
    assert {e.node_id for e in got.entries} == {r[0] for r in users}
    assert all(e.role == "user" and e.region == "eu-west" for e in got.entries)
    models = [_record(i, 2) for i in range(3)]
    got = verify_document(c.document(7, users, models, kind=KIND_MODELS), CHAIN, c.pinned, kind=KIND_MODELS)
    assert all(e.models == ("smollm2",) for e in got.entries)
    assert all(e.reputation == 900_000 and e.audited is True for e in got.entries)
    users_got = verify_document(c.document(7, users, models, kind=KIND_USERS), CHAIN, c.pinned, kind=KIND_USERS)
    assert all(e.reputation is None and e.audited is None for e in users_got.entries)


def test_model_records_carry_the_audited_flag_and_untrusted_nodes_are_listed() -> None:
    """Lists format 3: a model record's 11th field says whether its model is audited (a bool,
    strictly), and nodes under the trust line stay on the list, marked by their reputation."""
    from overlay.directory.lists import LISTS_VERSION
    from overlay.net.peers import usable
    from overlay.wire.constants import TRUST_LINE

    assert LISTS_VERSION == 4
    c = Committee()
    models = [_record(0, 2, reputation=900_000, audited=True), _record(1, 2, reputation=10_000, audited=True),
              _record(2, 2, reputation=500_000, audited=False)]
    got = verify_document(c.document(7, [], models, kind=KIND_MODELS), CHAIN, c.pinned, kind=KIND_MODELS)
    by_id = {e.node_id: e for e in got.entries}
    ok, low, unaudited = (by_id[r[0]] for r in models)
    assert (ok.audited, low.audited, unaudited.audited) == (True, True, False)
    assert low.reputation == 10_000 < TRUST_LINE and not low.trusted and ok.trusted and unaudited.trusted
    assert [usable(e) for e in (ok, low, unaudited)] == [True, False, False]
    assert [usable(e, allow_unaudited=True) for e in (ok, low, unaudited)] == [True, False, True]
    for flag in (1, 0, None, "true", b"\x01"):  # only msgpack's true and false are a flag
        bad = [list(r) for r in models]
        bad[0][10] = flag
        with pytest.raises(ListError, match="types"):
            verify_document(c.document(7, [], bad, kind=KIND_MODELS), CHAIN, c.pinned, kind=KIND_MODELS)
    ten = [list(r)[:10] for r in models]  # a model record of format 2 (no audited flag)
    with pytest.raises(ListError, match="types"):
        verify_document(c.document(7, [], ten, kind=KIND_MODELS), CHAIN, c.pinned, kind=KIND_MODELS)
    twelve = [[*r, True] for r in models]
    with pytest.raises(ListError, match="types"):
        verify_document(c.document(7, [], twelve, kind=KIND_MODELS), CHAIN, c.pinned, kind=KIND_MODELS)


def test_two_of_four_signatures_are_refused() -> None:
    c = Committee()
    with pytest.raises(ListError, match=r"20 of 40 voting power; more than 2/3"):
        verify_document(c.document(7, [_record(1)], signers=2), CHAIN, c.pinned, kind=KIND_USERS)
    # Exactly 2/3 is not more than 2/3: with unequal power, 20 of 30 is refused too.
    uneven = [ValidatorKey(p.public_key, w) for p, w in zip(c.pinned, (10, 10, 5, 5), strict=True)]
    doc = msgpack.unpackb(c.document(7, [_record(1)], signers=4))
    doc[8] = [[v.public_key, v.power] for v in sorted(uneven, key=lambda v: v.public_key)]
    with pytest.raises(ListError):
        verify_document(msgpack.packb(doc, use_bin_type=True), CHAIN, uneven, kind=KIND_USERS)


def test_signatures_by_unpinned_keys_or_twice_by_one_key_do_not_count() -> None:
    c, strangers = Committee(), Committee()
    doc = msgpack.unpackb(c.document(7, [_record(1)], signers=2))
    other = msgpack.unpackb(strangers.document(7, [_record(1)], signers=4))
    doc[9] = doc[9] + other[9][:1] + doc[9][:1]  # 2 good, 1 stranger, 1 repeat: 4 of 4 slots
    with pytest.raises(ListError, match="more than 2/3"):
        verify_document(msgpack.packb(doc, use_bin_type=True), CHAIN, c.pinned, kind=KIND_USERS)


def test_tampered_entry_wrong_chain_and_junk_are_refused() -> None:
    c = Committee()
    users = [_record(i) for i in range(3)]
    doc = msgpack.unpackb(c.document(7, users, signers=4))
    records = msgpack.unpackb(doc[5])
    records[1][4] = "6.6.6.6:9000"  # an attacker's address for a listed node
    doc[5] = msgpack.packb(records, use_bin_type=True)
    with pytest.raises(ListError, match="digest"):
        verify_document(msgpack.packb(doc, use_bin_type=True), CHAIN, c.pinned, kind=KIND_USERS)
    with pytest.raises(ListError, match="not the pinned committee"):
        verify_document(c.document(7, users, signers=4), "other-chain", c.pinned, kind=KIND_USERS)
    with pytest.raises(ListError, match="kind"):
        verify_document(c.document(7, users, signers=4), CHAIN, c.pinned, kind=KIND_MODELS)
    good = c.document(7, users, signers=4)
    for bad in (b"", b"\xc1", good[:-1], good[:len(good) // 2], b"\x98" + good[1:], good + b"\x00"):
        with pytest.raises(ListError):
            verify_document(bad, CHAIN, c.pinned, kind=KIND_USERS)


def test_a_record_that_lies_about_its_id_is_refused_even_when_signed() -> None:
    c = Committee()
    rec = _record(1)
    rec[0] = bytes(20)
    with pytest.raises(ListError, match="record 0"):
        verify_document(c.document(7, [rec], signers=4), CHAIN, c.pinned, kind=KIND_USERS)


async def _serve(docs: dict[str, bytes], addr: str, path: str) -> bytes:
    if addr not in docs:
        raise OSError(f"{addr} is down")
    return docs[addr]


def test_client_refuses_older_lists_follows_committee_changes_and_refreshes_on_its_clock() -> None:
    c = Committee()
    users, models = [_record(i) for i in range(4)], [_record(9, 2)]
    docs: dict[str, bytes] = {}

    async def fetch(addr: str, path: str) -> bytes:
        kind = KIND_USERS if path.endswith("users") else KIND_MODELS
        return docs[addr] if kind == KIND_USERS else models_doc[addr]

    models_doc: dict[str, bytes] = {}
    client = CommitteeClient(["a:1", "b:1"], CHAIN, c.pinned, fetch=fetch, interval=5.0, clock=FakeClock(unix=T0),
                             deltas=False)

    async def main() -> None:
        docs["a:1"] = c.document(10, users, models, signers=3)
        models_doc["a:1"] = c.document(10, users, models, signers=3, kind=KIND_MODELS)
        docs["b:1"], models_doc["b:1"] = docs["a:1"], models_doc["a:1"]
        reg = await client.refresh()
        assert reg.version == 10 and len(reg.users()) == 4 and len(reg.models()) == 1
        assert client.age() == 0
        # A verifier serving an older list is refused; the other one's list is kept.
        docs["a:1"] = c.document(9, users, models, signers=4)
        with pytest.raises(ListError, match="older than the height 10"):
            client.accept(docs["a:1"], KIND_USERS)
        docs["b:1"] = c.document(12, users[:2], models, signers=4)
        updates: list[int] = []
        async with trio.open_nursery() as n:
            n.start_soon(client.run, lambda r: updates.append(len(r.users())))
            await trio.sleep(12)
            n.cancel_scope.cancel()
        assert updates and updates[-1] == 2 and client.lists[KIND_USERS].height == 12

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_client_adopts_a_new_validator_set_vouched_for_by_the_old_one() -> None:
    c = Committee()
    joiner = crypto.SigningKey.generate()
    bigger = Committee()
    bigger.keys = [*c.keys, joiner]
    bigger.pinned = [*c.pinned, ValidatorKey(joiner.public_bytes, 10)]
    client = CommitteeClient(["a:1"], CHAIN, c.pinned, fetch=_never, clock=FakeClock(unix=T0))
    client.accept(bigger.document(5, [_record(1)]), KIND_USERS)
    assert {v.public_key for v in client.validators} == {k.public_bytes for k in bigger.keys}
    # Now the joiner's signature counts: 4 of 5 (joiner included, one founder missing) is enough.
    doc = msgpack.unpackb(bigger.document(6, [_record(1)]))
    doc[9] = [s for s in doc[9] if s[0] != c.keys[0].public_bytes]
    got = client.accept(msgpack.packb(doc, use_bin_type=True), KIND_USERS)
    assert joiner.public_bytes in got.signers
    # A set the held committee did not sign is never adopted.
    strangers = Committee()
    with pytest.raises(ListError):
        client.accept(strangers.document(7, [_record(1)]), KIND_USERS)


async def _never(addr: str, path: str) -> bytes:
    raise OSError("no network in this test")


# --------------------------------------------------------------------------- the verifier core's side


def _committee_app(c: Committee) -> CommitteeApp:
    a = CommitteeApp()
    a.init_chain(CHAIN, [Validator("ed25519", k.public_bytes, 10) for k in c.keys])
    return a


def _height(a: CommitteeApp, c: Committee, txs: list[bytes], *, signers: int = 4, t: int = T0) -> list[bytes]:
    """One height H as CometBFT runs it with vote extensions: the proposer's block (a certificate
    from height H-1's extensions first), process, the validators' precommits extended (signing the
    lists as they stand after block H), finalize, commit."""
    h = a.height + 1
    votes = getattr(a, "_test_votes", [])
    block = a.prepare_proposal(txs, 1 << 20, t, h, votes)
    block_hash = crypto.sha256(b"".join(block) + bytes([h]))
    assert a.process_proposal(block, t, h, block_hash)
    exts = [(crypto.sha256(k.public_bytes)[:20], a.extend_vote(h, k, block_hash, block, t)) for k in c.keys[:signers]]
    for addr, ext in exts:
        assert a.verify_vote_extension(h, block_hash, addr, ext)
    a._test_votes = exts  # type: ignore[attr-defined]
    results, _ = a.finalize_block(h, t, block, block_hash)
    assert all(r.ok for r in results), results
    a.commit()
    return block


def test_the_core_records_certificates_and_serves_lists_that_verify() -> None:
    c = Committee()
    a = _committee_app(c)
    assert a.query("/lists/users", b"")[0].code == Code.UNAVAILABLE
    nodes = [Node(port=7000 + i) for i in range(5)]
    _height(a, c, [n.register() for n in nodes])
    for _ in range(3):
        _height(a, c, [])
    res, raw = a.query("/lists/users", b"")
    assert res.ok
    got = verify_document(raw, CHAIN, c.pinned, kind=KIND_USERS)
    assert {e.node_id for e in got.entries} == {n.node_id for n in nodes} and len(got.signers) == 4
    # A certificate rides first in a block and changes no app state.
    before = a.app_hash
    block = _height(a, c, [])
    assert block and block[0].startswith(quorum.CERT_TAG) and a.app_hash == before
    # With only two validators extending their votes, no certificate is made.
    _height(a, c, [], signers=2)
    assert not [b for b in _height(a, c, []) if b.startswith(quorum.CERT_TAG)]


def test_the_model_list_holds_every_model_node_with_its_reputation_and_audited_flag() -> None:
    """verifier/app.py ListsAt.of (lists format 3): untrusted model nodes stay on the list (audits
    must reach them), each record with its reputation and whether its model is audited
    (verifier.audit.chain.audited_models: empty when audits are off)."""
    from dataclasses import replace

    from overlay.wire.constants import TRUST_LINE
    from verifier import app as core
    from verifier.audit import chain as audits
    from verifier.audit.reputation import R0, NodeReputation, ReputationTable

    c = Committee()
    a = _committee_app(c)
    good, low, other = Node(port=7100), Node(port=7101), Node(port=7102)
    user = Node(port=7103)
    _height(a, c, [good.register(ROLE_MODEL), low.register(ROLE_MODEL),
                   other.register(ROLE_MODEL, model_id="other-model", capacity=2), user.register()])

    def entries(st: object) -> dict[bytes, object]:
        lists = core.ListsAt.of(st, T0)  # type: ignore[arg-type]
        doc = encode_document(CHAIN, 9, T0, KIND_MODELS, lists.models, lists.users_digest, lists.models_digest, c.pinned,
                              [(k.public_bytes, k.sign(lists.message(CHAIN, 9))) for k in c.keys])
        return {e.node_id: e for e in verify_document(doc, CHAIN, c.pinned, kind=KIND_MODELS).entries}

    # Audits off: every model node listed at R(0), no model audited.
    off = entries(a.committed)
    assert set(off) == {good.node_id, low.node_id, other.node_id}
    assert all(e.reputation == R0 and e.audited is False for e in off.values())  # type: ignore[attr-defined]
    # Audits on: one node under the trust line; "smollm2-135m" declared by 3 of 4 validators of equal
    # power (audited), "other-model" by 2 (not).
    st = a.committed.copy()
    pks = [pk for pk, _ in st.validator_powers()]
    st.audit = replace(audits.initial(audits.AuditParams(), CHAIN),
                       declared=tuple(sorted((pk, ("other-model", "smollm2-135m") if i < 2 else ("smollm2-135m",))
                                             for i, pk in enumerate(pks[:3]))),
                       reputation=ReputationTable(nodes={good.node_id: NodeReputation(900_000),
                                                         low.node_id: NodeReputation(TRUST_LINE - 1)}))
    assert audits.audited_models(st.audit, st.validator_powers()) == {"smollm2-135m"}
    on = entries(st)
    assert set(on) == {good.node_id, low.node_id, other.node_id}  # the untrusted node is still listed
    got = {n: (e.reputation, e.audited) for n, e in on.items()}  # type: ignore[attr-defined]
    assert got == {good.node_id: (900_000, True), low.node_id: (TRUST_LINE - 1, True), other.node_id: (R0, False)}


def test_a_wrong_extension_is_rejected_and_forged_certificates_never_pass() -> None:
    c = Committee()
    a = _committee_app(c)
    for _ in range(3):
        _height(a, c, [])
    h = a.height + 1
    addr = crypto.sha256(c.keys[0].public_bytes)[:20]
    assert a.process_proposal([Node().register()], T0, h, b"block h")
    # The extension signs the lists after the processed block (the cached result, whatever txs say).
    assert a.verify_vote_extension(h, b"block h", addr, a.extend_vote(h, c.keys[0], b"block h", [], T0))
    assert not a.verify_vote_extension(h, b"block h", addr, crypto.SigningKey.generate().sign(b"x"))
    assert not a.verify_vote_extension(h, b"block h", addr, c.keys[1].sign(b"other lists"))
    assert a.verify_vote_extension(h, b"block h", addr, b"")  # a validator that signed nothing just does not count
    # Unverifiable here (a block this verifier never processed): accepted, and it can never count.
    assert a.verify_vote_extension(h, b"a block never processed here", addr, b"\x01" * 64)
    held = a.lists_at(a.height)
    assert held is not None
    msg = held.message(CHAIN, a.height)
    good = [(k.public_bytes, k.sign(msg)) for k in c.keys]
    last = a.cert.height if a.cert else -1
    for sigs in (
        sorted(good[:2]),  # 2 of 4
        sorted([(good[0][0], good[1][1]), *good[1:]]),  # a signature under another key
        sorted([(crypto.SigningKey.generate().public_bytes, good[0][1]), *good[1:]]),  # not a validator
    ):
        cert = quorum.ListCert(a.height, held.time_s, held.users_digest, held.models_digest, held.validators_digest,
                               tuple(sigs))
        assert not a.process_proposal([cert.encode()], T0)
        assert a._run([cert.encode()], T0).results[0].code == Code.BAD_SIGNATURE
        assert a.check_tx(cert.encode()).code == Code.MALFORMED  # never from the mempool
    ok = quorum.ListCert(a.height, held.time_s, held.users_digest, held.models_digest, held.validators_digest,
                         tuple(sorted(good)))
    assert (a.height > last) and a.process_proposal([ok.encode()], T0)
    stale = quorum.ListCert(last, held.time_s, held.users_digest, held.models_digest, held.validators_digest, tuple(sorted(good)))
    assert a._run([stale.encode()], T0).results[0].code == Code.REPLAYED
    assert not a.process_proposal([Node().register(), ok.encode()], T0)  # only as the first transaction
    for junk in (quorum.CERT_TAG, quorum.CERT_TAG + b"\x95", ok.encode() + b"\x00"):
        assert not a.process_proposal([junk], T0)
    assert a.check_tx(tx.MAX_TX_BYTES * b"\xc1").code != Code.OK


# --------------------------------------------------------------------------- committee changes


def _change(a: CommitteeApp, c: Committee, seq: int, key: bytes, power: int, approvers: int) -> bytes:
    return quorum.make_change(seq, key, power, [quorum.approve(k, CHAIN, seq, key, power) for k in c.keys[:approvers]])


def test_a_join_needs_more_than_two_thirds_and_emits_a_validator_update() -> None:
    c = Committee()
    a = _committee_app(c)
    joiner = crypto.SigningKey.generate()
    weak = _change(a, c, 1, joiner.public_bytes, 10, 2)
    assert a.check_tx(weak).code == Code.BAD_SIGNATURE
    assert "20 of 40" in a.check_tx(weak).log
    assert a.check_tx(_change(a, c, 2, joiner.public_bytes, 10, 3)).code == Code.REPLAYED  # seq must be 1
    stranger = Committee()
    forged = quorum.make_change(1, joiner.public_bytes, 10,
                                [quorum.approve(k, CHAIN, 1, joiner.public_bytes, 10) for k in stranger.keys])
    assert a.check_tx(forged).code == Code.BAD_SIGNATURE
    other_chain = quorum.make_change(1, joiner.public_bytes, 10,
                                     [quorum.approve(k, "x", 1, joiner.public_bytes, 10) for k in c.keys])
    assert a.check_tx(other_chain).code == Code.BAD_SIGNATURE
    good = _change(a, c, 1, joiner.public_bytes, 10, 3)
    assert a.check_tx(good).ok
    before = a.app_hash
    _height(a, c, [good])
    assert a.updates == [Validator("ed25519", joiner.public_bytes, 10)]
    assert a.app_hash != before and a.committed.change_seq == 1
    assert len(a.committed.validators) == 5
    assert a.check_tx(good).code == Code.REPLAYED  # the same approvals never apply twice
    _height(a, c, [])
    assert a.updates == []
    # Now the joiner is a validator: 3 of the old 4 (30 of 50) no longer suffice; with it, 4 of 5 do.
    c5 = Committee()
    c5.keys, c5.pinned = [*c.keys, joiner], [*c.pinned, ValidatorKey(joiner.public_bytes, 10)]
    leaving = c.keys[0].public_bytes
    assert a.check_tx(_change(a, c5, 2, leaving, 0, 3)).code == Code.BAD_SIGNATURE
    others = [quorum.approve(k, CHAIN, 2, leaving, 0) for k in c5.keys[1:]]  # 40 of 50, the joiner among them
    _height(a, c5, [quorum.make_change(2, leaving, 0, others)])
    assert a.updates == [Validator("ed25519", leaving, 0)]
    assert leaving not in {v.public_key for v in a.committed.validators}
    res, raw = a.query("/validators", b"")
    assert res.ok and msgpack.unpackb(raw)[0] == 2 and len(msgpack.unpackb(raw)[1]) == 4


def test_bad_changes_are_refused_with_codes() -> None:
    c = Committee(n=1)
    a = _committee_app(c)
    me = c.keys[0].public_bytes
    assert a.check_tx(_change(a, c, 1, me, 0, 1)).code == Code.CONFLICT  # the last validator cannot leave
    assert a.check_tx(_change(a, c, 1, bytes(32), 0, 1)).code == Code.UNKNOWN_NODE
    good = _change(a, c, 1, bytes(32), 5, 1)
    for junk in (quorum.CHANGE_TAG, good[:-1], good + b"\x00", quorum.CHANGE_TAG + b"\x92\xc4\x00\x90"):
        assert a.check_tx(junk).code == Code.MALFORMED, junk
    with pytest.raises(ValueError):
        quorum.make_change(1, bytes(31), 5, [])
    with pytest.raises(ValueError):
        quorum.parse_approval("zz:00")
    pub, sig = quorum.approve(c.keys[0], CHAIN, 1, bytes(32), 5)
    assert quorum.parse_approval(f"{pub.hex()}:{sig.hex()}") == (pub, sig)


def test_a_verifier_that_never_answers_is_skipped_after_the_fetch_timeout() -> None:
    c = Committee()
    good = {KIND_USERS: c.document(3, [_record(1)]), KIND_MODELS: c.document(3, [_record(1)], kind=KIND_MODELS)}

    async def fetch(addr: str, path: str) -> bytes:
        if addr.startswith("stuck"):
            await trio.sleep_forever()
        return good[KIND_USERS if path.endswith("users") else KIND_MODELS]

    async def main() -> None:
        client = CommitteeClient(["stuck:1", "ok:1"], CHAIN, c.pinned, fetch=fetch, fetch_timeout=2.0,
                                 clock=FakeClock(unix=T0), deltas=False)
        reg = await client.refresh()
        assert reg.version == 3 and len(reg.users()) == 1
        # Both down: the error names each verifier and why; the held lists stay.
        client.addresses = ["stuck:1", "stuck:2"]
        with pytest.raises(ListError, match=r"no answer within 2 s") as err:
            await client.refresh()
        assert "stuck:1: no answer" in str(err.value) and "stuck:2: no answer" in str(err.value)
        assert client.registry().version == 3

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


async def _http_server(answers: list[bytes], task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """Answers each connection with the next canned HTTP response, recording nothing."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])

    async def handle(stream: trio.SocketStream) -> None:
        async with stream:
            await stream.receive_some(65536)
            await stream.send_all(answers.pop(0))

    await trio.serve_listeners(handle, listeners)


def test_abci_value_reads_cometbft_answers_and_refuses_errors() -> None:
    import base64
    import json

    def http(body: dict[str, object], chunked: bool = False) -> bytes:
        raw = json.dumps(body).encode()
        if chunked:
            return (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + f"{len(raw):x}".encode() + b"\r\n"
                    + raw + b"\r\n0\r\n\r\n")
        return b"HTTP/1.1 200 OK\r\nContent-Length: " + str(len(raw)).encode() + b"\r\n\r\n" + raw

    ok: dict[str, object] = {"result": {"response": {"code": 0, "value": base64.b64encode(b"doc").decode()}}}
    answers = [http(ok), http(ok, chunked=True),
               http({"result": {"response": {"code": 10, "log": "no signed list held yet"}}}),
               http({"error": {"code": -32603}}), b"garbage"]

    async def main() -> None:
        from overlay.directory.rpc import RpcError, abci_value

        async with trio.open_nursery() as n:
            port = await n.start(_http_server, answers)
            addr = f"127.0.0.1:{port}"
            assert await abci_value(addr, "/lists/users") == b"doc"
            assert await abci_value(addr, "/lists/users") == b"doc"
            with pytest.raises(RpcError, match="code 10: no signed list"):
                await abci_value(addr, "/lists/users")
            for _ in range(2):
                with pytest.raises(RpcError, match="did not answer"):
                    await abci_value(addr, "/lists/users")
            n.cancel_scope.cancel()

    trio.run(main)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([quorum.CERT_TAG, quorum.CHANGE_TAG, quorum.PREFIX, b""]), st.binary(max_size=400))
def test_hostile_committee_transactions_never_raise_and_never_change_state(prefix: bytes, body: bytes) -> None:
    c = _HOSTILE
    raw = prefix + body
    before = (c.app_hash, c.committed.canonical_bytes())
    assert c.check_tx(raw).code != Code.OK
    assert not c.process_proposal([raw], T0)
    assert not c.process_proposal([c.cert.encode() if c.cert else b"", raw], T0)
    assert (c.app_hash, c.committed.canonical_bytes()) == before


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=2000))
def test_hostile_list_documents_are_refused_with_list_error(raw: bytes) -> None:
    with pytest.raises(ListError):
        verify_document(raw, CHAIN, _HOSTILE_KEYS.pinned, kind=KIND_USERS)


def _hostile_app() -> CommitteeApp:
    a = _committee_app(_HOSTILE_KEYS)
    for _ in range(3):
        _height(a, _HOSTILE_KEYS, [])
    return a


_HOSTILE_KEYS = Committee()
_HOSTILE = _hostile_app()


def test_running_a_block_once_per_hash_gives_what_running_it_each_time_gives() -> None:
    """ProcessProposal, ExtendVote and FinalizeBlock share one run per block hash; an app that never
    sees hashes (runs each step afresh) must hold the same state, hash and lists at every height."""
    c = Committee()
    shared, plain = _committee_app(c), _committee_app(c)
    nodes = [Node(port=7100 + i) for i in range(6)]
    rounds = [[n.register(ROLE_MODEL if i % 2 else ROLE_USER) for i, n in enumerate(nodes)],
              [nodes[0].update(region="us-east"), nodes[1].leave()], [], [nodes[2].leave()]]
    for i, txs in enumerate(rounds):
        block = _height(shared, c, txs, t=T0 + i)
        assert plain.process_proposal(block, T0 + i)
        results, app_hash = plain.finalize_block(plain.height + 1, T0 + i, block)
        assert all(r.ok for r in results)
        plain.commit()
        assert (app_hash, plain.snapshot()) == (shared.app_hash, shared.snapshot())
        assert plain.lists_at(plain.height) == shared.lists_at(shared.height)


def test_signed_records_that_break_a_field_rule_are_refused() -> None:
    """The one-pass record decoder keeps every check: types, sizes, role, region/model id, order,
    address; and its entries equal those the plain PeerEntry constructor makes."""
    from overlay.net.peers import PeerEntry

    c = Committee()

    def signed(records: list[list[object]], kind: int = KIND_USERS, sort: bool = True) -> bytes:
        if sort:
            return c.document(7, records, signers=4) if kind == KIND_USERS else \
                c.document(7, [], records, signers=4, kind=KIND_MODELS)
        ub = msgpack.packb(records, use_bin_type=True)
        mb = msgpack.packb([], use_bin_type=True)
        msg = signing_message(CHAIN, 7, T0, crypto.sha256(ub), crypto.sha256(mb), validators_digest(c.pinned))
        return encode_document(CHAIN, 7, T0, KIND_USERS, ub, crypto.sha256(ub), crypto.sha256(mb), c.pinned,
                               [(k.public_bytes, k.sign(msg)) for k in c.keys])

    good = [_record(i) for i in range(3)]
    got = verify_document(signed(good), CHAIN, c.pinned, kind=KIND_USERS)
    assert [type(e) for e in got.entries] == [PeerEntry] * 3
    first = sorted(good, key=lambda r: r[0])[0]  # node id, key, role, x25519 key, address, region, ...
    assert got.entries[0] == PeerEntry(first[0], first[4], first[1], first[3], first[5], "user", ())
    cases: list[tuple[str, object, str]] = [
        ("role", 2, "another role"), ("region", "", "region"), ("region", "r" * 65, "region"),
        ("model", "m", "model id"), ("address", "no-port", "host:port"), ("address", "h:99999", "host:port"),
        ("address", ":80", "host:port"), ("x25519", bytes(31), "wrong size"), ("capacity", "5", "types"),
        ("expires", 1.5, "types"),
    ]
    index = {"role": 2, "x25519": 3, "address": 4, "region": 5, "model": 6, "capacity": 7, "expires": 8}
    for field, value, message in cases:
        bad = [list(r) for r in good]
        bad[1][index[field]] = value
        with pytest.raises(ListError, match=message):
            verify_document(signed(bad), CHAIN, c.pinned, kind=KIND_USERS)
    unsorted = sorted(good, key=lambda r: r[0], reverse=True)
    with pytest.raises(ListError, match="not sorted"):
        verify_document(signed(unsorted, sort=False), CHAIN, c.pinned, kind=KIND_USERS)
    with pytest.raises(ListError, match="not sorted"):
        verify_document(signed([good[0], good[0]], sort=False), CHAIN, c.pinned, kind=KIND_USERS)
    models = [_record(i, 2) for i in range(2)]
    bad = [list(r) for r in models]
    bad[0][6] = ""
    with pytest.raises(ListError, match="model id"):
        verify_document(signed(bad, KIND_MODELS), CHAIN, c.pinned, kind=KIND_MODELS)
    for reputation, message in ((1_000_001, "reputation"), (-1, "reputation"), ("0.9", "types"), (True, "types")):
        bad = [list(r) for r in models]
        bad[1][9] = reputation
        with pytest.raises(ListError, match=message):
            verify_document(signed(bad, KIND_MODELS), CHAIN, c.pinned, kind=KIND_MODELS)
    nine = [list(r)[:9] for r in models]  # a model record of format 1 (no reputation nor audited flag)
    with pytest.raises(ListError, match="types"):
        verify_document(signed(nine, KIND_MODELS), CHAIN, c.pinned, kind=KIND_MODELS)


def test_an_unchanged_list_reuses_the_held_entries_and_still_checks_everything_else() -> None:
    c = Committee()
    users = [_record(i) for i in range(5)]
    first = verify_document(c.document(7, users, signers=4), CHAIN, c.pinned, kind=KIND_USERS)
    again = verify_document(c.document(8, users, signers=4), CHAIN, c.pinned, kind=KIND_USERS, known=first)
    assert again.entries is first.entries and again.height == 8 and again.digest == first.digest
    with pytest.raises(ListError, match="more than 2/3"):
        verify_document(c.document(9, users, signers=2), CHAIN, c.pinned, kind=KIND_USERS, known=first)
    with pytest.raises(ListError, match="older"):
        verify_document(c.document(6, users, signers=4), CHAIN, c.pinned, kind=KIND_USERS, min_height=7,
                        known=first)
    changed = verify_document(c.document(9, [*users, _record(9)], signers=4), CHAIN, c.pinned, kind=KIND_USERS,
                              known=first)
    assert changed.entries is not first.entries and len(changed.entries) == 6


def test_the_clients_trust_line_is_the_committees() -> None:
    """One definition (overlay/wire/constants.py): the clients' trust line and reputation scale
    are the ones verifier/audit/reputation.py computes with."""
    from dataclasses import replace

    from overlay.net.peers import PeerEntry
    from overlay.wire.constants import REPUTATION_SCALE, TRUST_LINE
    from verifier.audit import reputation

    assert (TRUST_LINE, REPUTATION_SCALE) == (400_000, 1_000_000)
    assert (reputation.Params().trust_line, reputation.SCALE) == (TRUST_LINE, REPUTATION_SCALE)
    node = PeerEntry(b"\x01" * 20, "h:1", b"e" * 32, b"x" * 32, role="model", models=("m",))
    assert [replace(node, reputation=r).trusted for r in (TRUST_LINE - 1, TRUST_LINE)] == [False, True]
