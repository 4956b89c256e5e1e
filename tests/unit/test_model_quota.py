"""model_node.quota (issue 31): a model node's check of a request's usage-quota token, against
fake issuers that answer the verifiers' RPC with real VOPRF keys (model_node.testing.FakeIssuers).
A good token is redeemed once at each of its issuers; a bad one is refused before any RPC; a
spent or forged one is refused by its issuers; with issuers unreachable the request goes unchecked."""

from __future__ import annotations

import os
from collections import Counter

import pytest
import trio

from gentorrent.cli import build_parser
from model_node.priority import PRIORITY, STANDARD
from model_node.quota import Kind, Redeemer, Verdict, judge, token_rank
from model_node.run import redeemer as node_redeemer
from model_node.testing import FakeIssuers
from overlay.anon.responder import TOKEN_REFUSAL
from overlay.directory import quota
from overlay.directory.lists import ValidatorKey
from overlay.directory.membership import CommitteeSettings
from overlay.directory.registration import Code
from overlay.directory.rpc import Answer
from overlay.wire import crypto
from overlay.wire.failures import WIRE, Failure


def redeemer(issuers: FakeIssuers, model: str = "echo", **kw) -> Redeemer:
    return Redeemer(model, lambda: issuers.addresses, issuers.chain_id, rpc=issuers.rpc,
                    validators=lambda: set(issuers.issuers), **kw)


def redeems(issuers: FakeIssuers) -> Counter[str]:
    return Counter({a: n for (a, path), n in issuers.calls.items() if path == quota.REDEEM_PATH})


def forged(raw: bytes, index: int, evaluation: tuple[bytes, bytes]) -> bytes:
    """``raw`` with its evaluation ``index`` replaced by ``evaluation`` (issuer, output)."""
    t = quota.decode_token(raw)
    ev = list(t.evaluations)
    ev[index] = evaluation
    return quota.encode_token(quota.Token(t.model, t.epoch, t.nonce, tuple(ev)))


async def test_a_good_token_is_redeemed_once_at_each_of_its_issuers_and_then_refused(autojump_clock):
    issuers = FakeIssuers(3)
    r = redeemer(issuers)
    token = issuers.token()
    assert await r.check(token) == Verdict(Kind.TOKENED)
    a, b, _ = issuers.addresses
    assert redeems(issuers) == Counter({a: 1, b: 1})  # its two issuers, once each; not the third
    assert issuers.spent_by_all(token)
    again = await r.check(token)
    assert again.refused and again.error().startswith(TOKEN_REFUSAL) and "spent already" in again.reason
    assert again.failure is Failure.SPENT and Failure.SPENT in WIRE  # the code the client acts on
    assert (r.tokened, r.refused, r.unchecked) == (1, 1, 0)


async def test_issuers_are_asked_at_once_within_one_timeout(autojump_clock):
    issuers = FakeIssuers(3)
    r = redeemer(issuers, timeout=2.0)
    await r.prefetch()
    issuers.delay = 1.0
    t0 = trio.current_time()
    assert (await r.check(issuers.token(issuers=[0, 1, 2]))).tokened
    assert trio.current_time() - t0 == pytest.approx(1.0)  # three issuers, one second: together (mock clock)
    issuers.delay = 5.0
    t0 = trio.current_time()
    slow = await r.check(issuers.token())
    assert slow.kind is Kind.UNCHECKED and "no answer in time" in slow.reason
    assert trio.current_time() - t0 == pytest.approx(2.0)


@pytest.mark.parametrize("case, why", [
    ("garbage", "not a quota token"),
    ("empty array", "not a quota token"),
    ("another model", "it is for model 'other'; this node serves 'echo'"),
    ("an old epoch", "is not redeemable now"),
    ("a future epoch", "is not redeemable now"),
    ("one issuer", "carries 1 issuer(s)' evaluations; the committee asks for 2"),
    ("a stranger issuer", "is not a verifier of this committee"),
])
async def test_a_bad_token_is_refused_without_any_rpc(autojump_clock, case, why):
    issuers = FakeIssuers(3)
    r = redeemer(issuers)
    await r.prefetch()  # the verifiers' key records, once
    issuers.calls.clear()
    epoch = issuers.epoch()
    raw = {
        "garbage": lambda: os.urandom(200),
        "empty array": lambda: b"\x90",
        "another model": lambda: issuers.token("other"),
        "an old epoch": lambda: issuers.token(epoch=epoch - 2),
        "a future epoch": lambda: issuers.token(epoch=epoch + 1),
        "one issuer": lambda: issuers.token(issuers=[0]),
        "a stranger issuer": lambda: forged(issuers.token(), 1, (crypto.SigningKey.generate().public_bytes,
                                                                 os.urandom(quota.OUTPUT_LEN))),
    }[case]()
    verdict = await r.check(raw)
    assert verdict.refused and why in verdict.reason, verdict
    assert verdict.error() == TOKEN_REFUSAL + verdict.reason and verdict.failure is Failure.INVALID
    assert not issuers.calls  # not one RPC, not even for key records
    assert (r.tokened, r.refused, r.unchecked) == (0, 1, 0)


async def test_garbage_costs_no_rpc_even_before_the_keys_are_known(autojump_clock):
    issuers = FakeIssuers(3)
    r = redeemer(issuers)
    for raw in (os.urandom(64), b"", issuers.token("other")):
        assert (await r.check(raw)).refused
    assert not issuers.calls


async def test_an_unknown_issuer_has_the_key_records_asked_again_at_most_every_few_seconds(autojump_clock):
    issuers = FakeIssuers(3)
    r = redeemer(issuers, refetch=5.0)
    await r.prefetch()
    keys = Counter({a: n for (a, path), n in issuers.calls.items() if path == quota.KEY_PATH})
    assert keys == Counter({a: 1 for a in issuers.addresses})
    stranger = forged(issuers.token(), 0, (crypto.SigningKey.generate().public_bytes, os.urandom(quota.OUTPUT_LEN)))
    for _ in range(3):
        assert (await r.check(stranger)).refused
    assert sum(issuers.calls.values()) == 3  # none asked again within 5 s
    await trio.sleep(5.0)
    for _ in range(3):
        assert (await r.check(stranger)).refused
    assert sum(issuers.calls.values()) == 6 and not redeems(issuers)  # each address once more, no redemption


async def test_a_token_an_issuer_holds_spent_or_not_valid_is_refused(autojump_clock):
    issuers = FakeIssuers(3)
    r = redeemer(issuers)
    token = issuers.token()
    t = quota.decode_token(token)
    issuers.spent[1].add((t.model, t.epoch, t.nonce))  # redeemed elsewhere at the second issuer
    spent = await r.check(token)
    assert spent.refused and f"spent already (issuer {issuers.issuers[1].hex()[:8]})" in spent.reason
    bad = forged(issuers.token(), 1, (issuers.issuers[1], os.urandom(quota.OUTPUT_LEN)))  # a made-up output
    verdict = await r.check(bad)
    assert verdict.refused and "says it is not valid" in verdict.reason


def relabelled(raw: bytes) -> bytes:
    """``raw`` claiming the other class (priority for standard, standard for priority)."""
    t = quota.decode_token(raw)
    return quota.encode_token(quota.Token(t.model, t.epoch, t.nonce, t.evaluations, not t.priority))


@pytest.mark.parametrize("priority", [False, True])
async def test_a_token_relabelled_to_the_other_class_is_refused_by_its_issuers_unspent(autojump_clock, priority):
    issuers = FakeIssuers(3)
    r = redeemer(issuers)
    token = issuers.token(priority=priority)
    verdict = await r.check(relabelled(token))
    assert verdict.refused and "says it is not valid" in verdict.reason, verdict
    assert not issuers.spent_by_all(token)
    assert (await r.check(token)).tokened  # as issued, it is good


async def test_a_redeemed_token_ranks_by_its_class(autojump_clock):
    issuers = FakeIssuers(3)
    assert token_rank(quota.decode_token(issuers.token(priority=True))) == PRIORITY
    assert token_rank(quota.decode_token(issuers.token())) == STANDARD


async def test_an_unreachable_issuer_leaves_the_token_unchecked(autojump_clock):
    issuers = FakeIssuers(3)
    r = redeemer(issuers)
    await r.prefetch()
    issuers.down.add(issuers.addresses[1])
    verdict = await r.check(issuers.token())
    assert verdict.kind is Kind.UNCHECKED and "unreachable" in verdict.reason
    assert (r.tokened, r.refused, r.unchecked) == (0, 0, 1)
    issuers.down.clear()
    assert (await r.check(issuers.token())).tokened


async def test_an_issuer_not_known_while_a_verifier_is_unreachable_is_not_refused(autojump_clock):
    issuers = FakeIssuers(3)
    issuers.down.add(issuers.addresses[2])
    r = redeemer(issuers)
    verdict = await r.check(issuers.token(issuers=[0, 2]))  # the third's key record could not be had
    assert verdict.kind is Kind.UNCHECKED and "not known here" in verdict.reason
    assert not redeems(issuers)


async def test_quotas_off_at_the_committee_leave_tokens_unchecked(autojump_clock):
    issuers = FakeIssuers(3)
    issuers.off.update(issuers.addresses)
    r = redeemer(issuers)
    verdict = await r.check(issuers.token())
    assert verdict.kind is Kind.UNCHECKED and verdict.reason == "quotas are off at the committee"
    assert not redeems(issuers)


async def test_only_key_records_of_the_committees_validators_are_taken(autojump_clock):
    issuers = FakeIssuers(3)
    validators = set(issuers.issuers[:2])  # the third address answers with a key that is not a validator's
    r = Redeemer("echo", lambda: issuers.addresses, issuers.chain_id, rpc=issuers.rpc, validators=lambda: validators)
    assert (await r.check(issuers.token(issuers=[0, 1]))).tokened
    third = await r.check(issuers.token(issuers=[0, 2]))
    assert third.kind is Kind.UNCHECKED and not third.refused


async def test_a_new_committee_address_is_learned(autojump_clock):
    issuers = FakeIssuers(3)
    listed = issuers.addresses[:2]
    r = Redeemer("echo", lambda: listed, issuers.chain_id, rpc=issuers.rpc)
    assert (await r.check(issuers.token(issuers=[0, 2]))).refused  # every listed verifier known: a stranger
    listed = issuers.addresses
    await trio.sleep(10)
    assert (await r.check(issuers.token(issuers=[0, 2]))).tokened


async def test_key_records_are_asked_for_an_epoch_the_verifiers_give(autojump_clock):
    # epochs of an hour: the node's first guess (the default minute) names an epoch no verifier gives
    # a key record of; each answers WRONG_EPOCH with its current epoch's record, which is as good here
    issuers = FakeIssuers(3, params=quota.QuotaParams(epoch_s=3600))
    r = redeemer(issuers, refetch=5.0)
    await r.prefetch()
    assert (await r.check(issuers.token())).tokened
    await trio.sleep(3 * 3600)
    asked = sum(issuers.calls.values())
    assert (await r.check(issuers.token())).tokened  # a later epoch: the issuers known stay known
    assert sum(issuers.calls.values()) == asked + 2  # its two redemptions, no key record


def test_the_verdict_on_the_issuers_answers() -> None:
    a, b = b"a" * 32, b"b" * 32
    ok = Answer(Code.OK, "")
    assert judge([a, b], {a: ok, b: ok}).tokened
    assert judge([a, b], {a: ok, b: Answer(Code.SPENT, "")}).refused
    assert judge([a, b], {a: "down", b: Answer(Code.BAD_TOKEN, "forged")}).refused  # a refusal wins
    for other in (Answer(Code.QUOTA_OFF, ""), Answer(Code.MALFORMED, "?"), "down"):
        assert judge([a, b], {a: ok, b: other}).kind is Kind.UNCHECKED
    assert "no answer in time" in judge([a, b], {a: ok}).reason


def test_a_model_node_with_a_committee_redeems_at_its_verifiers() -> None:
    args = build_parser().parse_args(["model-node", "--quota-timeout", "0.5"])
    assert node_redeemer(None, "echo", args) is None  # no committee: tokens are ignored
    key = crypto.SigningKey.generate().public_bytes
    committee = CommitteeSettings(("10.0.0.1:26657", "10.0.0.2:26657"), "chain", (ValidatorKey(key, 10),))
    r = node_redeemer(committee, "echo", args)
    assert r is not None and r.model == "echo" and r.chain_id == "chain" and r.timeout == 0.5
    assert list(r.addresses()) == list(committee.addresses)
    assert r.validators is not None and set(r.validators()) == {key}
    default = node_redeemer(committee, "echo", build_parser().parse_args(["model-node"]))
    assert default is not None and default.timeout == 2.0
