"""The user's wallet of usage-quota tokens (overlay/directory/wallet.py, decisions 0017 and 0018)
against issuers made of the real VOPRF (``voprf``), the real allowance (a token bucket) and the
wire of overlay/directory/quota.py, behind a fake RPC: batches from ``issuers`` issuers, a refusing
or lying issuer replaced, a short wait for the allowances to fill, the quota spent for now with
the time the next token comes, quotas off, and tokens every issuer's output verifies."""

from __future__ import annotations

import base64
import random
from typing import Any

import pytest
import trio
from voprf import ristretto

from overlay.anon.client import QuotaExhausted
from overlay.directory import quota
from overlay.directory.registration import Code
from overlay.directory.wallet import Wallet
from overlay.wire import crypto
from overlay.wire.identity import Identity

CHAIN = "quota-test"
MODEL = "smollm2-135m-instruct"
# a token every 30 s; every token of a full bucket a priority one (the classes' own tests below use fewer)
PARAMS = quota.QuotaParams(epoch_s=600, tokens=20, issuers=2, grace_s=60, burst=20, priority=20)
NOW = 1_800_000_000.0
EPOCH = PARAMS.epoch_at(NOW)


class FakeClock:
    def __init__(self, unix: float = NOW) -> None:
        self.now = unix

    def unix(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now


class TrioTime(FakeClock):
    """Unix time that moves with trio's clock (the mock clock in the tests that wait)."""

    def unix(self) -> float:
        return self.now + trio.current_time()


class Issuer:
    """An issuer as the wire has it: key records, an allowance per user (the real bucket), blind
    evaluation. ``lie`` evaluates under another key than the one it publishes; ``off`` answers
    QUOTA_OFF."""

    def __init__(self, *, lie: bool = False, off: bool = False, down: bool = False, clock: FakeClock | None = None,
                 params: quota.QuotaParams = PARAMS) -> None:
        self.clock = clock or FakeClock()
        self.key = crypto.SigningKey.generate()
        self.seed = random.randbytes(32)
        self.lie, self.off, self.down = lie, off, down
        self.allowances: dict[bytes, quota.Allowance] = {}  # user -> its allowance
        self.asked = 0
        self.params = params
        self.classes: list[tuple[bool, int]] = []  # (priority, n) of each batch given

    def evaluator(self, model: str, epoch: int, priority: bool = False) -> Any:
        return quota.evaluator(self.seed, CHAIN, model, epoch, priority)

    def handle(self, path: str, data: bytes) -> tuple[int, str, bytes]:
        if self.off:
            return int(Code.QUOTA_OFF), "off", b""
        if path == quota.KEY_PATH:
            model, epoch = quota.decode_key_query(data)
            code, current = 0, self.params.epoch_at(self.clock.unix())
            if abs(epoch - current) > 1:  # as verifier/quota.py: another epoch's ask gets the current record
                code, epoch = int(Code.WRONG_EPOCH), current
            rec = quota.KeyRecord(self.key.public_bytes, model, epoch,
                                  self.evaluator(model, epoch).public_key.serialize(),
                                  self.evaluator(model, epoch, True).public_key.serialize(), self.params)
            return code, "", quota.encode_key_record(self.key, CHAIN, rec)
        assert path == quota.ISSUE_PATH
        self.asked += 1
        req = quota.decode_issue(data)
        assert req.issuer == self.key.public_bytes
        allowance = self.allowances.setdefault(req.user, quota.Allowance(self.params))
        now = self.clock.unix()
        if not allowance.take_class(len(req.blinded), req.priority, now):
            return int(Code.QUOTA_LATER), f"{allowance.level(now)} now", b""
        self.classes.append((req.priority, len(req.blinded)))
        ev = quota.evaluator(random.randbytes(32), CHAIN, req.model, req.epoch) if self.lie else \
            self.evaluator(req.model, req.epoch, req.priority)
        batch = ev.evaluate_batch([ristretto.BlindedInput.deserialize(b) for b in req.blinded])
        return 0, "", quota.encode_issued(quota.Issued(batch.serialize(), allowance.level(now)))


def wallet_over(issuers: dict[str, Issuer], clock: FakeClock | None = None, max_wait: float = 0.0,
                **kw: Any) -> Wallet:
    async def rpc(address: str, method: str, params: dict[str, str]) -> Any:
        await trio.lowlevel.checkpoint()
        issuer = issuers[address]
        if issuer.down:
            raise OSError("connection refused")
        data = bytes.fromhex(params["data"][2:]) if "data" in params else b""
        code, why, value = issuer.handle(params["path"].strip('"'), data)
        return {"response": {"code": code, "log": why, "value": base64.b64encode(value).decode()}}

    return Wallet(Identity.generate(), lambda: list(issuers), CHAIN,
                  lambda: [i.key.public_bytes for i in issuers.values()], rpc=rpc, clock=clock or FakeClock(),
                  rng=random.Random(3), max_wait=max_wait, **kw)


def verifies(raw: bytes, issuers: dict[str, Issuer]) -> set[bytes]:
    """The issuers whose output in token ``raw`` is the VOPRF of its nonce under their key."""
    t = quota.decode_token(raw)
    by_key = {i.key.public_bytes: i for i in issuers.values()}
    return {k for k, out in t.evaluations
            if by_key[k].evaluator(t.model, t.epoch, t.priority).evaluate_known_input(quota.token_input(t.nonce)) == out}


async def test_tokens_carry_outputs_of_two_issuers_that_verify_and_come_in_batches() -> None:
    issuers = {f"v{i}:26657": Issuer() for i in range(4)}
    wallet = wallet_over(issuers, batch=8)
    tokens = [await wallet.token(MODEL) for _ in range(8)]
    assert len(set(tokens)) == 8 and wallet.fetched == 8
    assert sum(i.asked for i in issuers.values()) == 2  # one batch: two issuers asked once each
    for raw in tokens:
        t = quota.decode_token(raw)
        assert t.model == MODEL and t.epoch == EPOCH and len(t.evaluations) == 2
        assert verifies(raw, issuers) == {k for k, _ in t.evaluations}
    await wallet.token(MODEL)
    assert sum(i.asked for i in issuers.values()) == 4  # the ninth takes a second batch


async def test_the_quota_is_spent_for_now_when_too_few_issuers_have_a_token_and_it_says_when_one_comes() -> None:
    issuers = {f"v{i}:26657": Issuer() for i in range(3)}
    wallet = wallet_over(issuers, batch=16)
    got = []
    with pytest.raises(QuotaExhausted) as info:
        for _ in range(1000):
            got.append(await wallet.token(MODEL))
    # 3 issuers x 20 tokens, 2 evaluations a token: at most 30, fewer when batches do not divide
    assert 16 <= len(got) <= 30
    assert NOW < info.value.refills_at <= NOW + PARAMS.per_token_s and info.value.wait_s == info.value.refills_at - NOW
    assert "the next token can be had in 30 s" in str(info.value)


async def test_a_request_waits_for_the_allowances_to_fill_up_to_max_wait(autojump_clock: Any) -> None:
    clock = TrioTime()
    issuers = {f"v{i}:26657": Issuer(clock=clock) for i in range(2)}
    wallet = wallet_over(issuers, clock, batch=20, max_wait=40)
    for _ in range(20):  # the two buckets' 20 tokens at once, without waiting
        await wallet.token(MODEL)
    assert trio.current_time() == 0
    raw = await wallet.token(MODEL)  # the 21st waits for one token to come back at both issuers
    assert trio.current_time() == pytest.approx(PARAMS.per_token_s) and len(verifies(raw, issuers)) == 2
    impatient = wallet_over({"v0:1": Issuer(clock=clock), "v1:1": Issuer(clock=clock)}, clock, batch=20, max_wait=10)
    for _ in range(20):
        await impatient.token(MODEL)
    with pytest.raises(QuotaExhausted):
        await impatient.token(MODEL)  # 30 s to wait, more than 10


async def test_a_new_epoch_does_not_refill_the_allowance() -> None:
    clock = FakeClock(NOW + PARAMS.epoch_s - 10)  # the end of an epoch
    issuers = {f"v{i}:26657": Issuer(clock=clock) for i in range(2)}
    wallet = wallet_over(issuers, clock, batch=16)
    with pytest.raises(QuotaExhausted):
        for _ in range(100):
            await wallet.token(MODEL)
    clock.now = PARAMS.refills_at(EPOCH) + 1  # the next epoch, 11 s on: new keys, but the allowances grew by nothing
    with pytest.raises(QuotaExhausted):
        await wallet.token(MODEL)
    clock.now += 10 * PARAMS.per_token_s
    raw = await wallet.token(MODEL)
    assert quota.decode_token(raw).epoch == EPOCH + 1 and len(verifies(raw, issuers)) == 2


async def test_an_issuer_whose_proof_fails_or_that_is_down_is_replaced() -> None:
    issuers = {"liar:1": Issuer(lie=True), "down:1": Issuer(down=True), "v2:1": Issuer(), "v3:1": Issuer()}
    wallet = wallet_over(issuers, batch=4)
    raw = await wallet.token(MODEL)
    honest = {issuers["v2:1"].key.public_bytes, issuers["v3:1"].key.public_bytes}
    assert {k for k, _ in quota.decode_token(raw).evaluations} == honest == verifies(raw, issuers)


async def test_no_token_when_quotas_are_off_or_no_issuer_answers() -> None:
    off = wallet_over({f"v{i}:1": Issuer(off=True) for i in range(3)})
    assert await off.token(MODEL) == b""
    down = wallet_over({f"v{i}:1": Issuer(down=True) for i in range(3)})
    assert await down.token(MODEL) == b""
    one = wallet_over({"v0:1": Issuer(), "v1:1": Issuer(down=True)})  # 2 issuers a token, 1 reachable
    assert await one.token(MODEL) == b""  # no token can be made: best effort without one (not "used up")


async def test_a_key_record_not_signed_by_a_validator_is_ignored() -> None:
    issuers = {f"v{i}:1": Issuer() for i in range(3)}
    stranger = Issuer()
    issuers["stranger:1"] = stranger
    wallet = Wallet(Identity.generate(), lambda: list(issuers), CHAIN,
                    lambda: [i.key.public_bytes for i in issuers.values() if i is not stranger],
                    rpc=wallet_over(issuers).rpc, clock=FakeClock(), rng=random.Random(1), batch=16)
    got = []
    with pytest.raises(QuotaExhausted):
        for _ in range(100):
            got.append(await wallet.token(MODEL))
    assert got and not any(stranger.key.public_bytes in dict(quota.decode_token(raw).evaluations) for raw in got)
    assert stranger.asked == 0


async def test_an_audit_users_wallet_sends_without_a_token_past_its_quota() -> None:
    issuers = {f"v{i}:26657": Issuer() for i in range(2)}
    wallet = wallet_over(issuers, batch=16, send_when_used_up=True)
    tokens = [await wallet.token(MODEL) for _ in range(25)]
    assert all(tokens[:20]) and tokens[20:] == [b""] * 5  # 20 tokens (2 issuers x 20 / 2), then none, no error


async def test_unspent_tokens_outlive_the_process_in_the_store(tmp_path: Any) -> None:
    issuers = {f"v{i}:26657": Issuer() for i in range(2)}
    store = tmp_path / "quota_tokens.bin"
    first = wallet_over(issuers, batch=16, store=store)
    a = await first.token(MODEL)
    asked = sum(i.asked for i in issuers.values())
    second = wallet_over(issuers, batch=16, store=store)  # the next `user chat` run
    b = await second.token(MODEL)
    assert a != b and sum(i.asked for i in issuers.values()) == asked  # from the store, no new batch
    assert store.stat().st_mode & 0o777 == 0o600
    store.write_bytes(b"garbage")
    third = wallet_over(issuers, batch=16, store=store)
    assert await third.token(MODEL) not in (a, b)  # an unreadable store costs its tokens, nothing else


async def test_a_committee_with_another_epoch_length_is_learnt_from_its_answer() -> None:
    issuers = {f"v{i}:1": Issuer() for i in range(2)}
    wallet = wallet_over(issuers, batch=4)
    wallet._params = quota.QuotaParams(epoch_s=70)  # the wallet assumes another length than the committee's
    raw = await wallet.token(MODEL)
    assert quota.decode_token(raw).epoch == EPOCH and len(verifies(raw, issuers)) == 2


async def test_tokens_left_at_an_epochs_end_are_spent_first_in_its_grace() -> None:
    clock = FakeClock(NOW + PARAMS.epoch_s - 10)  # the end of an epoch
    issuers = {f"v{i}:26657": Issuer(clock=clock) for i in range(2)}
    wallet = wallet_over(issuers, clock, batch=8)
    first = await wallet.token(MODEL)  # 10 s + 60 s of grace - 5 s of margin left: 3 tokens (one per 30 s)
    assert wallet.fetched == 3
    asked = sum(i.asked for i in issuers.values())
    clock.now = PARAMS.refills_at(EPOCH) + 5  # the next epoch, within the grace (60 s) less the margin
    carried = [await wallet.token(MODEL) for _ in range(2)]
    assert {quota.decode_token(t).epoch for t in [first, *carried]} == {EPOCH}
    assert sum(i.asked for i in issuers.values()) == asked  # no new batch while the old tokens still redeem
    fresh = await wallet.token(MODEL)
    assert quota.decode_token(fresh).epoch == EPOCH + 1
    late_clock = FakeClock(NOW + PARAMS.epoch_s - 10)
    late = wallet_over(issuers, late_clock, batch=8)
    await late.token(MODEL)
    late_clock.now = PARAMS.refills_at(EPOCH) + PARAMS.grace_s - 1  # too close to the grace's end: not used
    assert quota.decode_token(await late.token(MODEL)).epoch == EPOCH + 1


# --------------------------------------------------------------------------- classes (decision 0022)

CLASSED = quota.QuotaParams(epoch_s=600, tokens=20, issuers=2, grace_s=60, burst=8, priority=3)


async def test_the_wallet_takes_priority_tokens_from_the_top_then_one_standard_token_at_a_time() -> None:
    clock = FakeClock()
    issuers = {f"v{i}:1": Issuer(clock=clock, params=CLASSED) for i in range(2)}
    wallet = wallet_over(issuers, clock, batch=16)
    tokens = [quota.decode_token(await wallet.token(MODEL)) for _ in range(5)]
    assert [t.priority for t in tokens] == [True] * 3 + [False] * 2  # the top 3 of 8, then standard
    assert all(i.classes == [(True, 3), (False, 1), (False, 1)] for i in issuers.values())
    assert all(len(verifies(quota.encode_token(t), issuers)) == 2 for t in tokens)  # each under its class's key
    clock.now += 4 * CLASSED.per_token_s  # the bucket back at 7 of 8: 2 above the standard 5
    again = [quota.decode_token(await wallet.token(MODEL)) for _ in range(2)]
    assert [t.priority for t in again] == [True, True]


async def test_a_token_relabelled_to_another_class_does_not_verify() -> None:
    issuers = {f"v{i}:1": Issuer(params=CLASSED) for i in range(2)}
    wallet = wallet_over(issuers, batch=16)
    t = quota.decode_token(await wallet.token(MODEL))
    assert t.priority
    flipped = quota.Token(t.model, t.epoch, t.nonce, t.evaluations, priority=False)
    assert verifies(quota.encode_token(flipped), issuers) == set()


async def test_tokens_of_the_epoch_before_outlive_a_restart_in_its_grace(tmp_path: Any) -> None:
    clock = FakeClock(NOW + PARAMS.epoch_s - 10)  # the end of an epoch
    issuers = {f"v{i}:26657": Issuer(clock=clock) for i in range(2)}
    store = tmp_path / "quota_tokens.bin"
    first = wallet_over(issuers, clock, batch=8, store=store)
    await first.token(MODEL)  # 3 tokens fetched (see above), 2 left of this epoch
    clock.now = PARAMS.refills_at(EPOCH) + 5  # the next epoch, within its grace
    carried = await first.token(MODEL)  # the old ones are now the carried ones: one spent, one left
    asked = sum(i.asked for i in issuers.values())
    second = wallet_over(issuers, clock, batch=8, store=store)  # restarted within the grace
    left = await second.token(MODEL)
    assert {quota.decode_token(t).epoch for t in (carried, left)} == {EPOCH} and left != carried
    assert sum(i.asked for i in issuers.values()) == asked  # the carried token came from the store
    assert quota.decode_token(await second.token(MODEL)).epoch == EPOCH + 1  # then this epoch's
