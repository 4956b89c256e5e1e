"""The donated-prompt pool (verifier/audit/pool.py; decision 0013 §4) and its query hook
(verifier/abci_app.py ``/audit/donate_key``, ``/audit/donate``).

A donation is taken only sealed to this verifier, signed by a registered user node, for a model
this verifier audits, within a challenge's limits, not a duplicate, and under its donor's cap;
every refusal says why and leaves the pool as it was. Draws pick a donor first, so a flooding
donor gets no more challenges than any other."""

from __future__ import annotations

import json
import os
import random
import stat
from collections import Counter
from pathlib import Path

import msgpack
import pytest

from overlay.directory.donation import seal_donation
from overlay.directory.registration import Code
from overlay.directory.transcripts import MAX_MESSAGES
from overlay.wire import crypto
from overlay.wire.identity import Identity
from overlay.wire.messages import ChatMessage, SamplingParams
from verifier.audit import pool as pl

MODEL = "smollm2-135m-instruct"
VERIFIER = crypto.SigningKey.from_bytes(b"\x07" * 32)
PARAMS = SamplingParams(temperature=0.7, top_p=1.0, top_k=0, max_tokens=256, seed=None)


class Users:
    """Registered user nodes (node id -> Ed25519 key), as the committee's state has them."""

    def __init__(self, n: int = 3) -> None:
        self.ids = [Identity.generate() for _ in range(n)]
        self.keys = {i.node_id: i.signing.public_bytes for i in self.ids}

    def __call__(self, node_id: bytes) -> bytes | None:
        return self.keys.get(node_id)


def donation(user: Identity, text: str = "How do tides work?", *, model: str = MODEL,
             messages: tuple[ChatMessage, ...] | None = None, params: SamplingParams = PARAMS,
             to: bytes = VERIFIER.public_bytes, seen_by: tuple[bytes, ...] = ()) -> bytes:
    msgs = messages if messages is not None else (ChatMessage("user", text),)
    return seal_donation(to, user.signing, user.node_id, model, msgs, params, seen_by)


def new_pool(**kw: int) -> pl.DonationPool:
    p = pl.DonationPool(**kw)
    p.models = frozenset({MODEL})
    return p


def offer(p: pl.DonationPool, sealed: bytes, users: Users) -> pl.Donation:
    return p.offer(sealed, VERIFIER.private_bytes(), users)


def test_a_donation_is_taken_as_given_multi_turn_and_parameters_kept() -> None:
    users, p = Users(), new_pool()
    turns = (ChatMessage("system", "Be brief."), ChatMessage("user", "Hi"), ChatMessage("assistant", "Hello!"),
             ChatMessage("user", "What is a tide?"))
    own = SamplingParams(temperature=0.2, top_p=0.9, top_k=0, max_tokens=100, seed=42)
    d = offer(p, donation(users.ids[0], messages=turns, params=own), users)
    assert (d.donor, d.model, d.messages, d.params) == (users.ids[0].node_id, MODEL, turns, own)
    assert len(p) == 1 and p.dirty
    got = p.draw(MODEL, random.Random(1))
    assert got == d and len(p) == 0 and p.draw(MODEL, random.Random(1)) is None  # used once


def _refused(p: pl.DonationPool, users: Users, sealed: bytes, code: Code, words: str) -> None:
    before = p.to_bytes()
    with pytest.raises(pl.DonationError) as err:
        offer(p, sealed, users)
    assert err.value.code == code and words in err.value.reason, err.value
    assert p.to_bytes() == before  # unchanged


def test_bad_donations_are_refused_with_their_reason_and_leave_the_pool_unchanged() -> None:
    users, p = Users(), new_pool(per_donor=2)
    a, b = users.ids[0], users.ids[1]
    offer(p, donation(a, "first"), users)
    stranger = Identity.generate()
    sealed = donation(a, "ok")

    _refused(p, users, b"garbage" * 10, Code.MALFORMED, "does not open")
    _refused(p, users, os.urandom(200), Code.MALFORMED, "does not open")
    _refused(p, users, b"x" * (pl.MAX_DONATION_BYTES + 1), Code.OVERSIZE, "at most")
    _refused(p, users, donation(a, to=crypto.SigningKey.generate().public_bytes), Code.MALFORMED, "does not open")
    _refused(p, users, crypto.seal_to_ed25519(VERIFIER.public_bytes, b"\x93\x01\x02"), Code.MALFORMED, "not")
    _refused(p, users, crypto.seal_to_ed25519(VERIFIER.public_bytes, msgpack.packb({"a": 1})), Code.MALFORMED, "not")
    # a donation signed by another key than the donor's registered one
    forged = seal_donation(VERIFIER.public_bytes, stranger.signing, a.node_id, MODEL, (ChatMessage("user", "q"),),
                           PARAMS)
    _refused(p, users, forged, Code.BAD_SIGNATURE, "does not verify")
    # a tampered plaintext: the signature no longer covers it
    plain = msgpack.unpackb(crypto.open_sealed_ed25519(VERIFIER.private_bytes(), sealed), raw=False)
    plain[3][0][1] = "something else"
    _refused(p, users, crypto.seal_to_ed25519(VERIFIER.public_bytes, msgpack.packb(plain, use_bin_type=True)),
             Code.BAD_SIGNATURE, "does not verify")
    plain[0] = 3
    _refused(p, users, crypto.seal_to_ed25519(VERIFIER.public_bytes, msgpack.packb(plain, use_bin_type=True)),
             Code.UNSUPPORTED_VERSION, "version")
    _refused(p, users, donation(stranger), Code.UNKNOWN_NODE, "not a registered user node")
    _refused(p, users, donation(a, model="another-model"), Code.INVALID_FIELD, "does not audit")
    _refused(p, users, donation(a, messages=(ChatMessage("user", "q"), ChatMessage("assistant", "a"))),
             Code.INVALID_FIELD, "last message")
    _refused(p, users, donation(a, params=SamplingParams(max_tokens=5000)), Code.INVALID_FIELD, "max_tokens")
    _refused(p, users, donation(a, params=SamplingParams(temperature=1)),  # an int where a float belongs
             Code.MALFORMED, "types")
    _refused(p, users, donation(a, messages=tuple(ChatMessage("user", f"t{i}") for i in range(MAX_MESSAGES + 1))),
             Code.INVALID_FIELD, "messages")
    _refused(p, users, donation(b, "  FIRST "), Code.DUPLICATE, "already donated")  # normalised, any donor
    offer(p, donation(a, "second"), users)
    _refused(p, users, donation(a, "third"), Code.UNAVAILABLE, "already has 2 prompts")  # the donor's cap
    offer(p, donation(b, "third"), users)  # another donor is not capped by it
    assert len(p) == 3
    # a used prompt cannot come back
    drawn = [p.draw(MODEL, random.Random(i)) for i in range(3)]
    assert all(drawn)
    _refused(p, users, donation(b, "first"), Code.DUPLICATE, "already donated")


def test_every_refusal_is_a_donation_error_whatever_the_bytes() -> None:
    users, p = Users(), new_pool()
    rng = random.Random(5)
    good = donation(users.ids[0])
    plain = crypto.open_sealed_ed25519(VERIFIER.private_bytes(), good)
    for i in range(400):
        if i % 2:
            bad = bytearray(plain)
            for _ in range(rng.randint(1, 4)):
                bad[rng.randrange(len(bad))] = rng.randrange(256)
            blob = crypto.seal_to_ed25519(VERIFIER.public_bytes, bytes(bad[: rng.randint(0, len(bad))]))
        else:
            blob = bytes(rng.randrange(256) for _ in range(rng.randint(0, 300)))
        try:
            offer(p, blob, users)
        except pl.DonationError:
            pass
    assert len(p) <= 1


def test_no_donation_before_the_audit_model_is_known() -> None:
    users, p = Users(), pl.DonationPool()
    with pytest.raises(pl.DonationError) as err:
        offer(p, donation(users.ids[0]), users)
    assert err.value.code == Code.UNAVAILABLE and len(p) == 0


def test_the_pool_drops_its_oldest_prompts_past_its_cap() -> None:
    users, p = Users(), new_pool(cap=3)
    for i in range(5):
        offer(p, donation(users.ids[i % 3], f"question {i}"), users)
    assert len(p) == 3
    left = sorted(d.messages[-1].content for d in (p.draw(MODEL, random.Random(i)) for i in range(3)) if d)
    assert left == ["question 2", "question 3", "question 4"]


def test_a_flooding_donor_gets_no_more_challenges_than_a_donor_of_one_prompt() -> None:
    users = Users(2)
    flood, one = users.ids
    counts: Counter[bytes] = Counter()
    rng = random.Random(9)
    offer(template := new_pool(), donation(flood, "flood 0"), users)  # the real path once; then add() directly
    for trial in range(400):
        p = new_pool()
        for i in range(64):
            p.add(pl.Donation(flood.node_id, MODEL, (ChatMessage("user", f"flood {trial} {i}"),), PARAMS))
        p.add(pl.Donation(one.node_id, MODEL, (ChatMessage("user", f"single {trial}"),), PARAMS))
        with pytest.raises(pl.DonationError, match="already has 64"):
            p.add(pl.Donation(flood.node_id, MODEL, (ChatMessage("user", "one more"),), PARAMS))
        d = p.draw(MODEL, rng)
        assert d is not None
        counts[d.donor] += 1
    assert 160 < counts[one.node_id] < 240 and 160 < counts[flood.node_id] < 240  # about half each
    assert len(template) == 1


def test_sybil_donors_on_one_network_get_no_more_challenges_than_one_honest_donor_on_another() -> None:
    """Decision 0028, the attacker: a cheating model node registers 160 users of its own on one
    network (the committee lists 16 nodes on one /24; ten /24s) and donates prompts it will know
    again; one honest donor donates one prompt. Drawn by donor, nearly every challenge would be
    the attacker's (160 of 161); drawn by network, about half."""
    counts: Counter[str] = Counter()
    rng = random.Random(28)
    for trial in range(400):
        p = new_pool()
        for i in range(160):
            p.add(pl.Donation(i.to_bytes(20, "big"), MODEL, (ChatMessage("user", f"sybil {trial} {i}"),), PARAMS),
                  f"net 198.51.{i // 16}.0/24")
        p.add(pl.Donation(b"\xee" * 20, MODEL, (ChatMessage("user", f"honest {trial}"),), PARAMS), "net 192.0.2.0/24")
        assert p.donors(MODEL) == 161 and p.networks(MODEL) == 11
        d = p.draw(MODEL, rng)
        assert d is not None
        counts["honest" if d.donor == b"\xee" * 20 else "sybil"] += 1
    assert 20 < counts["honest"] < 60  # one network of 11: 400 / 11 = 36 expected


def test_a_flood_of_donations_drops_its_own_networks_prompts_not_the_honest_ones() -> None:
    """Past the pool's cap the oldest prompt of the network holding the most goes: sybil donors
    filling the pool from one network evict their own prompts, never the earlier honest ones."""
    p = new_pool(cap=100)
    for i in range(20):
        p.add(pl.Donation(bytes([1, i]) * 10, MODEL, (ChatMessage("user", f"honest {i}"),), PARAMS),
              f"net 192.0.{i}.0/24")
    for i in range(1_000):
        p.add(pl.Donation(bytes([2, i // 64]) * 10, MODEL, (ChatMessage("user", f"flood {i}"),), PARAMS),
              f"net 198.51.{i // 256}.0/24")
    assert len(p) == 100
    assert sum(d.messages[-1].content.startswith("honest") for d, _ in p._items.values()) == 20


def test_a_pool_file_of_version_1_loads_each_donor_as_its_own_network() -> None:
    from overlay.directory.registration import pack

    donors = [bytes([i]) * 20 for i in (1, 2)]
    v1 = pack([1, [pl.Donation(d, MODEL, (ChatMessage("user", f"old {d[0]}"),), PARAMS).wire()[:4] for d in donors],
               []])
    back = pl.DonationPool.from_bytes(v1)
    assert len(back) == 2 and back.donors(MODEL) == 2 and back.networks(MODEL) == 2
    again = pl.DonationPool.from_bytes(back.to_bytes())
    assert again.to_bytes() == back.to_bytes() and again.networks(MODEL) == 2


def test_a_pool_file_of_version_2_loads_with_no_node_named_as_a_reader() -> None:
    from overlay.directory.registration import pack

    d = pl.Donation(b"\x01" * 20, MODEL, (ChatMessage("user", "kept"),), PARAMS)
    back = pl.DonationPool.from_bytes(pack([2, [[d.wire()[:4], "net 192.0.2.0/24"]], []]))
    assert back.networks(MODEL) == 1 and back.draw(MODEL, random.Random(1), avoid=b"\x09" * 20) == d
    with pytest.raises(ValueError, match="not a donation pool"):  # version 2 holds no seen_by
        pl.DonationPool.from_bytes(pack([2, [[d.wire(), "net 192.0.2.0/24"]], []]))


def test_a_node_is_never_challenged_with_a_conversation_it_read() -> None:
    """Decision 0029, the attacker: a cheating model node that remembers every prompt it was sent
    (it served, forwarded or refused them) recognises a challenge replaying one of them; with few
    nodes serving a model that is a large share of its challenges (all of them with one node). The
    donor names the nodes its conversation was sent to; the pool never draws such a prompt for
    them, and the other nodes still get it."""
    users, p = Users(4), new_pool()
    cheater, other = b"\xc0" * 20, b"\xd0" * 20
    read: set[str] = set()
    for i in range(40):  # half the donors' conversations went to the cheater
        seen = (cheater,) if i % 2 else (other,)
        d = offer(p, donation(users.ids[i % 4], f"question {i}", seen_by=seen), users)
        assert d.seen_by == seen
        if i % 2:
            read.add(d.messages[-1].content)
    rng = random.Random(29)
    drawn = [p.draw(MODEL, rng, avoid=cheater) for _ in range(20)]
    assert all(d is not None and cheater not in d.seen_by for d in drawn)
    assert not read & {d.messages[-1].content for d in drawn if d is not None}
    assert p.draw(MODEL, rng, avoid=cheater) is None and len(p) == 20  # only prompts it read are left
    to_other = p.draw(MODEL, rng, avoid=other)
    assert to_other is not None and to_other.messages[-1].content in read
    # persisted with the pool: a restart keeps who read what
    back = pl.DonationPool.from_bytes(p.to_bytes())
    assert back.to_bytes() == p.to_bytes() and back.draw(MODEL, rng, avoid=cheater) is None


def test_a_draw_for_a_node_picks_among_the_networks_holding_a_prompt_it_did_not_read() -> None:
    """Drawn for a node, a network whose every prompt the node read does not count; the others
    are drawn uniformly, whatever share of their prompts the node read."""
    node = b"\xc0" * 20
    counts: Counter[str] = Counter()
    rng = random.Random(30)
    for trial in range(300):
        p = new_pool()
        p.add(pl.Donation(b"\x01" * 20, MODEL, (ChatMessage("user", f"read {trial}"),), PARAMS, (node,)), "net a")
        for i in range(9):  # net b: 9 of 10 read by the node, one not
            p.add(pl.Donation(b"\x02" * 20, MODEL, (ChatMessage("user", f"b {trial} {i}"),), PARAMS, (node,)),
                  "net b")
        p.add(pl.Donation(b"\x02" * 20, MODEL, (ChatMessage("user", f"b {trial} unread"),), PARAMS), "net b")
        p.add(pl.Donation(b"\x03" * 20, MODEL, (ChatMessage("user", f"c {trial}"),), PARAMS), "net c")
        d = p.draw(MODEL, rng, avoid=node)
        assert d is not None and node not in d.seen_by
        counts[d.messages[-1].content.split()[0]] += 1
    assert set(counts) == {"b", "c"} and 110 < counts["b"] < 190  # about half each


def test_the_pool_survives_a_restart_in_a_private_file(tmp_path: Path) -> None:
    users, p = Users(), new_pool()
    for i in range(4):
        offer(p, donation(users.ids[i % 2], f"kept {i}",
                          params=SamplingParams(temperature=0.3, top_p=0.95, top_k=0, max_tokens=64, seed=i)), users)
    used = p.draw(MODEL, random.Random(2))
    assert used is not None
    pl.save_pool(p, tmp_path)
    path = tmp_path / pl.POOL_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and not p.dirty
    back = pl.load_pool(tmp_path)
    back.models = frozenset({MODEL})
    assert back.to_bytes() == p.to_bytes() and len(back) == 3
    with pytest.raises(pl.DonationError, match="already donated"):  # a used prompt stays refused
        offer(back, donation(users.ids[2], used.messages[-1].content), users)
    path.write_bytes(b"\xc1 not a pool")
    assert len(pl.load_pool(tmp_path)) == 0 and (tmp_path / (pl.POOL_FILE + ".corrupt")).exists()
    assert len(pl.load_pool(tmp_path / "nowhere")) == 0


# --------------------------------------------------------------------------- the query hook


def _abci_app(pool: pl.DonationPool | None, users: Users, *, audits: bool = True) -> object:
    from overlay.directory.registration import OP_REGISTER, Entry, make_tx
    from overlay.wire.constants import ROLE_MODEL, ROLE_USER
    from verifier.abci_app import CommitteeAbciApp
    from verifier.app import CommitteeApp, Validator

    core = CommitteeApp()
    app_state = json.dumps({"audit": {"epoch_blocks": 60, "challenges_per_node": 2}} if audits else {}).encode()
    core.init_chain("donations", [Validator("ed25519", VERIFIER.public_bytes, 10)], app_state)
    txs = [make_tx(u.signing, "donations", OP_REGISTER, 1,
                   Entry(ROLE_USER, u.x25519.public_bytes, f"127.0.0.1:{7000 + i}", "default"))
           for i, u in enumerate(users.ids)]
    model = Identity.generate()
    users.keys[model.node_id] = model.signing.public_bytes  # a model node is no donor, whatever it signs
    users.ids.append(model)
    txs.append(make_tx(model.signing, "donations", OP_REGISTER, 1,
                       Entry(ROLE_MODEL, model.x25519.public_bytes, "127.0.0.1:7999", "default", MODEL, 1)))
    results, _ = core.finalize_block(1, 1_700_000_000, txs, b"\x01" * 32)
    assert all(r.ok for r in results), results
    core.commit()
    return CommitteeAbciApp(core, None, VERIFIER, pool=pool)


def _query(app: object, path: str, data: bytes = b"") -> tuple[int, str, bytes]:
    from verifier.abci.proto.tendermint.abci import types_pb2 as abci

    res = app.query(abci.RequestQuery(path=path, data=data))  # type: ignore[attr-defined]
    return res.code, res.log, bytes(res.value)


def test_the_verifier_answers_its_donation_key_and_takes_donations_from_registered_users() -> None:
    users = Users(2)
    p = new_pool()
    app = _abci_app(p, users)
    code, _, key = _query(app, "/audit/donate_key")
    assert code == 0 and key == VERIFIER.public_bytes
    code, why, _ = _query(app, "/audit/donate", donation(users.ids[0], to=key))
    assert code == 0 and "taken" in why and len(p) == 1
    assert [net for _, net in p._items.values()] == ["net 127.0.0.0/24"]  # its registered address's /24
    # the model node's key is registered, but not as a user
    code, why, _ = _query(app, "/audit/donate", donation(users.ids[-1], "from a model node", to=key))
    assert code == Code.UNKNOWN_NODE and "not a registered user node" in why and len(p) == 1
    code, why, _ = _query(app, "/audit/donate", b"\x00" * (16 * 1024 + 1))
    assert code == Code.OVERSIZE and len(p) == 1
    code, why, _ = _query(app, "/audit/donate", b"rubbish")
    assert code == Code.MALFORMED and why


def test_a_verifier_without_a_pool_or_a_chain_without_audits_refuses_donations() -> None:
    users = Users(1)
    for app in (_abci_app(None, users), _abci_app(new_pool(), Users(1), audits=False)):
        for path in ("/audit/donate_key", "/audit/donate"):
            code, why, value = _query(app, path, b"")
            assert code == Code.AUDITS_OFF and why and value == b""


async def test_a_donation_from_the_users_client_is_taken_through_the_query_hook() -> None:
    """user_client/donate.py's ``Donor`` against this verifier's ABCI query hook, over a stand-in
    for CometBFT's RPC: the two sides agree on the format and the signature."""
    import base64

    from user_client.donate import Donor

    users = Users(1)
    p = new_pool()
    app = _abci_app(p, users)

    async def rpc(address: str, method: str, params: dict[str, str]) -> object:
        assert method == "abci_query"
        data = bytes.fromhex(params["data"][2:]) if "data" in params else b""
        code, why, value = _query(app, params["path"].strip('"'), data)
        return {"response": {"code": code, "log": why, "value": base64.b64encode(value).decode()}}

    donor = Donor(users.ids[0], ["verifier:26657"], lambda: [VERIFIER.public_bytes], rate=1.0, rpc=rpc)
    turns = [ChatMessage("system", "Be brief."), ChatMessage("user", "Why is the sky blue?")]
    gateway = SamplingParams(temperature=1, top_p=1, max_tokens=300)  # ints, as a gateway may hold them
    await donor.donate(MODEL, turns, gateway)
    (d,) = [p.draw(MODEL, random.Random(0))]
    assert d is not None and d.donor == users.ids[0].node_id and list(d.messages) == turns
    assert d.params == SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_tokens=300, seed=None)
