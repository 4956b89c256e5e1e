"""Donated prompts, the user's side (user_client/donate.py; decision 0013 item 4): the sealed,
signed format of /tmp spec "Donations", one verifier per donation chosen uniformly, the rate, the
delay, and fire and forget (nothing raised, nothing blocks). The RPC is a fake in the test."""

from __future__ import annotations

import base64
import logging
import random
from collections import Counter

import msgpack
import pytest
import trio

from overlay.directory.donation import MAX_DONATION_BYTES, MAX_SEEN_BY, DonationError, decode, verify
from overlay.directory.transcripts import MAX_TURNS
from overlay.wire import crypto
from overlay.wire.identity import Identity
from overlay.wire.messages import ChatMessage, SamplingParams
from user_client import donate
from user_client.donate import Donor
from verifier.audit import tx as at
from verifier.audit.tx import Opening, script_of

MESSAGES = (ChatMessage("system", "be brief"), ChatMessage("user", "What is a quine?"),
            ChatMessage("assistant", "A program that prints itself."), ChatMessage("user", "Show one in Python."))
DONATED = (MESSAGES[0], MESSAGES[1], MESSAGES[3])  # what is donated of MESSAGES: no reply (decision 0027)
NODE_A, NODE_B = b"\x0a" * 20, b"\x0b" * 20  # model nodes that read the conversation


class Verifier:
    """A verifier's RPC as far as donations go: /audit/donate_key and /audit/donate."""

    def __init__(self, address: str, key: crypto.SigningKey | None = None, code: int = 0) -> None:
        self.address = address
        self.key = key or crypto.SigningKey.generate()
        self.code = code
        self.calls: list[dict[str, str]] = []
        self.sealed: list[bytes] = []

    def answer(self, params: dict[str, str]) -> dict[str, object]:
        self.calls.append(params)
        if params["path"] == '"/audit/donate_key"':
            return {"response": {"code": 0, "value": base64.b64encode(self.key.public_bytes).decode()}}
        assert params["path"] == '"/audit/donate"' and params["data"].startswith("0x")
        self.sealed.append(bytes.fromhex(params["data"][2:]))
        return {"response": {"code": self.code, "log": "no pool here" if self.code else ""}}


class Committee:
    def __init__(self, n: int = 4, **kw: object) -> None:
        self.verifiers = {f"127.0.0.1:{26650 + i}": Verifier(f"127.0.0.1:{26650 + i}", **kw) for i in range(n)}  # type: ignore[arg-type]
        self.fail: type[Exception] | None = None

    @property
    def addresses(self) -> list[str]:
        return list(self.verifiers)

    def keys(self) -> list[bytes]:
        return [v.key.public_bytes for v in self.verifiers.values()]

    async def rpc(self, address: str, method: str, params: dict[str, str]) -> object:
        assert method == "abci_query"
        if self.fail is not None:
            raise self.fail("connection refused")
        return self.verifiers[address].answer(params)


def test_the_plaintext_is_the_spec_array_signed_by_the_donor() -> None:
    me = Identity.generate()
    params = SamplingParams(temperature=1, top_p=0.9, top_k=0, max_tokens=64, seed=7)  # an int temperature
    raw = donate.encode(me, "smollm2", MESSAGES, params, [NODE_B, NODE_A, NODE_B])
    f = msgpack.unpackb(raw, raw=False)
    assert len(f) == 7 and f[0] == 2 and f[1] == me.node_id and f[2] == "smollm2"
    assert f[3] == [[m.role, m.content] for m in MESSAGES]
    assert f[4] == [1.0, 0.9, 0, 64, 7] and type(f[4][0]) is float and type(f[4][1]) is float
    assert f[5] == [NODE_A, NODE_B]  # seen_by: distinct, ascending
    # The signature, recomputed here from the spec: Ed25519 over the context || msgpack([id, model, msgs, params,
    # seen_by]).
    signed = b"gentorrent/donation/v2\x00" + msgpack.packb(f[1:6], use_bin_type=True)
    crypto.ed25519_verify(me.ed25519_public, f[6], signed)
    got, sig = decode(raw)
    assert (got.donor, got.model, got.messages, got.params, got.seen_by) == (
        me.node_id, "smollm2", MESSAGES, SamplingParams(1.0, 0.9, 0, 64, 7), (NODE_A, NODE_B))
    verify(got, sig, me.ed25519_public)
    with pytest.raises(DonationError, match="not the donor's"):
        verify(got, sig, Identity.generate().ed25519_public)
    for forged in ([*f[:2], "other-model", *f[3:]], [*f[:5], [NODE_A], f[6]]):  # the nodes are signed too
        with pytest.raises(DonationError, match="does not verify"):
            verify(*decode(msgpack.packb(forged, use_bin_type=True)), me.ed25519_public)
    # A seed of nil stays nil; strict decoding refuses other shapes.
    assert msgpack.unpackb(donate.encode(me, "m", MESSAGES[1:2], SamplingParams()), raw=False)[4][4] is None
    for bad in ([1, *f[1:]], [True, *f[1:]], f[:6], [*f[:4], [1, 0.9, 0, 64, 7], *f[5:]], [*f[:3], [], *f[4:]]):
        with pytest.raises(DonationError):
            decode(msgpack.packb(bad, use_bin_type=True))


def test_the_donation_is_sealed_to_the_verifiers_key_and_fits_the_limit() -> None:
    me, verifier = Identity.generate(), crypto.SigningKey.generate()
    sealed = donate.seal(verifier.public_bytes, me, "m", MESSAGES, SamplingParams())
    plain = crypto.open_sealed_ed25519(verifier.private_bytes(), sealed)
    # The system prompt and the user turns are donated; the reply the user got is not (decision 0027).
    assert decode(plain)[0].messages == DONATED
    with pytest.raises(crypto.CryptoError):
        crypto.open_sealed_ed25519(crypto.SigningKey.generate().private_bytes(), sealed)
    # A long conversation keeps its system prompt and its latest MAX_TURNS user turns, as a script.
    long = [ChatMessage("system", "sys")] + [ChatMessage("user" if i % 2 == 0 else "assistant", f"turn {i}")
                                             for i in range(21)]
    kept = decode(crypto.open_sealed_ed25519(
        verifier.private_bytes(), donate.seal(verifier.public_bytes, me, "m", long, SamplingParams())))[0].messages
    assert kept == (long[0], *[m for m in long if m.role == "user"][-MAX_TURNS:])
    assert MAX_TURNS == at.MAX_TURNS == 8 and len(kept) <= at.MAX_MESSAGES
    Opening(bytes(16), "m", script_of(kept), SamplingParams()).check_script()  # what the pool makes of it
    # Too large for one donation: older turns go first; a last message alone too large is not donated.
    big = [ChatMessage("user", "a" * 9000), ChatMessage("assistant", "b" * 3000), ChatMessage("user", "c" * 9000)]
    sealed = donate.seal(verifier.public_bytes, me, "m", big, SamplingParams())
    assert len(sealed) <= MAX_DONATION_BYTES
    assert [m.content[0] for m in decode(crypto.open_sealed_ed25519(verifier.private_bytes(),
                                                                    sealed))[0].messages] == ["c"]
    with pytest.raises(DonationError, match="longer than a donation holds"):
        donate.seal(verifier.public_bytes, me, "m", [ChatMessage("user", "x" * 20_000)], SamplingParams())
    with pytest.raises(DonationError, match="not a user's"):
        donate.seal(verifier.public_bytes, me, "m", MESSAGES[:3], SamplingParams())


async def test_a_donation_goes_to_one_verifier_after_checking_its_key() -> None:
    me, c = Identity.generate(), Committee()
    donor = Donor(me, c.addresses, c.keys, rpc=c.rpc, rng=random.Random(1))
    params = SamplingParams(temperature=0.7, top_p=0.95, max_tokens=128)
    address = await donor.donate("smollm2", MESSAGES, params)
    v = c.verifiers[address]
    assert [p["path"] for p in v.calls] == ['"/audit/donate_key"', '"/audit/donate"']
    assert all(not other.calls for a, other in c.verifiers.items() if a != address)  # ONE verifier
    got, sig = decode(crypto.open_sealed_ed25519(v.key.private_bytes(), v.sealed[0]))
    verify(got, sig, me.ed25519_public)
    assert (got.model, got.messages, got.params) == ("smollm2", DONATED, params)


async def test_a_key_that_is_not_a_validators_or_a_refusal_is_an_error_and_nothing_is_sent() -> None:
    me, c = Identity.generate(), Committee(n=1)
    donor = Donor(me, c.addresses, lambda: [crypto.SigningKey.generate().public_bytes], rpc=c.rpc)
    with pytest.raises(DonationError, match="not one of the committee's validator keys"):
        await donor.donate("m", MESSAGES, SamplingParams())
    assert [p["path"] for p in c.verifiers[c.addresses[0]].calls] == ['"/audit/donate_key"']
    refusing = Committee(n=1, code=36)
    with pytest.raises(DonationError, match="code 36: no pool here"):
        await Donor(me, refusing.addresses, refusing.keys, rpc=refusing.rpc).donate("m", MESSAGES, SamplingParams())


async def test_offers_are_donated_at_the_rate_to_uniformly_chosen_verifiers_within_a_minute(autojump_clock) -> None:
    me, c = Identity.generate(), Committee()
    donor = Donor(me, c.addresses, c.keys, rate=0.25, rpc=c.rpc, rng=random.Random(11))
    assert donor.offer("m", MESSAGES, SamplingParams()) is False  # not running: nothing scheduled
    arrived: list[float] = []
    real = c.rpc

    async def timed(address: str, method: str, params: dict[str, str]) -> object:
        if params["path"] == '"/audit/donate"':
            arrived.append(trio.current_time() - t0)
        return await real(address, method, params)

    donor.rpc = timed
    async with trio.open_nursery() as nursery:
        await nursery.start(donor.run)
        t0 = trio.current_time()
        chosen = [donor.offer("m", MESSAGES, SamplingParams()) for _ in range(400)]
        assert not arrived  # offering returns at once; nothing is sent at the request's time
        await trio.sleep(donate.MAX_DELAY_S + 1)
        nursery.cancel_scope.cancel()
    n = sum(chosen)
    assert 60 <= n <= 140  # 400 offers at 0.25: 100 expected
    assert donor.donated == n == len(arrived) and donor.failed == 0
    assert all(0 <= t <= donate.MAX_DELAY_S for t in arrived) and max(arrived) - min(arrived) > 30  # spread out
    per = Counter(a for a, v in c.verifiers.items() for p in v.calls if p["path"] == '"/audit/donate"')
    assert set(per) == set(c.addresses) and min(per.values()) >= n // 8  # each verifier drawn, none favoured


async def test_rates_zero_and_one_and_failures_never_reach_the_caller(autojump_clock) -> None:
    me, c = Identity.generate(), Committee()
    never = Donor(me, c.addresses, c.keys, rate=0.0, rpc=c.rpc)
    always = Donor(me, c.addresses, c.keys, rate=1.0, rpc=c.rpc)
    async with trio.open_nursery() as nursery:
        await nursery.start(never.run)
        await nursery.start(always.run)
        assert not any(never.offer("m", MESSAGES, SamplingParams()) for _ in range(50))
        assert all(always.offer("m", MESSAGES, SamplingParams()) for _ in range(5))
        c.fail = OSError  # every verifier unreachable: logged, never raised
        await trio.sleep(donate.MAX_DELAY_S + 1)
        assert always.offer("m", (ChatMessage("assistant", "no user turn"),), SamplingParams())
        await trio.sleep(donate.MAX_DELAY_S + 1)
        nursery.cancel_scope.cancel()
    assert (always.scheduled, always.donated, always.failed, always.pending) == (6, 0, 6, 0)
    assert never.scheduled == 0
    with pytest.raises(ValueError, match=r"within 0\.\.1"):
        Donor(me, c.addresses, c.keys, rate=1.5)
    with pytest.raises(ValueError, match="--committee"):
        Donor(me, [], c.keys)


async def test_an_offer_names_the_nodes_that_read_it_and_one_too_many_read_is_not_donated(
        autojump_clock, caplog) -> None:
    """Decision 0029: the verifier gets the model nodes the conversation was sent to (``seen_by``),
    signed with it; a conversation more than MAX_SEEN_BY nodes read is not donated (logged)."""
    me, c = Identity.generate(), Committee()
    donor = Donor(me, c.addresses, c.keys, rate=1.0, rpc=c.rpc, rng=random.Random(5))
    many = [bytes([i]) * 20 for i in range(MAX_SEEN_BY + 1)]
    async with trio.open_nursery() as nursery:
        await nursery.start(donor.run)
        assert donor.offer("m", MESSAGES, SamplingParams(), seen_by=[NODE_B, NODE_A])
        with caplog.at_level(logging.INFO, "gentorrent.donate"):
            assert donor.offer("m", MESSAGES, SamplingParams(), seen_by=many) is False
        assert donor.offer("m", MESSAGES, SamplingParams(), seen_by=many[:MAX_SEEN_BY])
        await trio.sleep(donate.MAX_DELAY_S + 1)
        nursery.cancel_scope.cancel()
    assert "more than a donation may name (16)" in caplog.text
    got = [decode(crypto.open_sealed_ed25519(v.key.private_bytes(), sealed)) for v in c.verifiers.values()
           for sealed in v.sealed]
    for d, sig in got:
        verify(d, sig, me.ed25519_public)
    assert sorted(d.seen_by for d, _ in got) == sorted([(NODE_A, NODE_B), tuple(sorted(many[:MAX_SEEN_BY]))])
    assert (donor.scheduled, donor.donated) == (2, 2)


async def test_donations_still_waiting_are_dropped_when_the_donor_stops(autojump_clock) -> None:
    me, c = Identity.generate(), Committee()
    donor = Donor(me, c.addresses, c.keys, rate=1.0, rpc=c.rpc, rng=random.Random(2))
    async with trio.open_nursery() as nursery:
        await nursery.start(donor.run)
        donor.offer("m", MESSAGES, SamplingParams())
        nursery.cancel_scope.cancel()
    assert donor.donated == 0 and not any(v.calls for v in c.verifiers.values())


def test_the_flags_help_states_the_privacy_cost_exactly() -> None:
    from gentorrent.config import SETTINGS
    from user_client.cli import USE_NOTE

    said = "the chosen verifier learns your node id, your IP address, the prompt and which model nodes the " \
           "conversation was sent to, so that it never challenges them with it (not the reply)"
    assert donate.PRIVACY == said
    assert said in SETTINGS["donate_prompts"].help and said in USE_NOTE
    assert SETTINGS["donate_prompts"].default is False and SETTINGS["donate_rate"].default == donate.DEFAULT_RATE


def test_the_verifiers_pool_opens_what_the_client_seals() -> None:
    """The two sides agree only through the format: verifier/audit/pool.py takes this client's donation."""
    pool = pytest.importorskip("verifier.audit.pool")
    me, verifier = Identity.generate(), crypto.SigningKey.generate()
    params = SamplingParams(temperature=1, top_p=0.9, max_tokens=64, seed=3)
    sealed = donate.seal(verifier.public_bytes, me, "m", MESSAGES, params)
    got = pool.open_donation(sealed, verifier.private_bytes(),
                             lambda n: me.ed25519_public if n == me.node_id else None, {"m"})
    assert (got.donor, got.model, got.messages, got.params) == (me.node_id, "m", DONATED,
                                                                 SamplingParams(1.0, 0.9, 0, 64, 3))
