"""The verifier's quota issuer (verifier/quota.py, issue 31, decision 0018): tokens issued blind to
registered users within their allowance (a token bucket per user and model) redeem exactly once, whichever model node asks; everything else is refused with
a code and a reason; the state survives a restart; old epochs are forgotten; and the issuer cannot
tell which issuance a redemption comes from."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
from voprf import ristretto

from overlay.directory import quota as q
from overlay.directory.quota import QuotaParams
from overlay.directory.registration import Code
from overlay.wire import crypto
from overlay.wire.identity import Identity
from verifier import cli, quota
from verifier.quota import Issuer, QuotaStateError, quota_seed

CHAIN = "gt-quota"
A = crypto.SigningKey.from_bytes(b"\x0a" * 32)
B = crypto.SigningKey.from_bytes(b"\x0b" * 32)
PARAMS = QuotaParams(epoch_s=600, tokens=5, issuers=2, grace_s=60, burst=5)  # a token every 120 s, 5 at most
NOW = 1_700_000_000.0  # 200 s into its epoch
EPOCH = PARAMS.epoch_at(NOW)
START = EPOCH * 600.0
MODELS = ("m1", "m2")
U1, U2, STRANGER = Identity.generate(), Identity.generate(), Identity.generate()
KEYS = {u.node_id: u.ed25519_public for u in (U1, U2)}


def user_key(node_id: bytes) -> bytes | None:
    return KEYS.get(node_id)


def listed(model: str) -> bool:
    return model in MODELS


def issuer(key: crypto.SigningKey = A, params: QuotaParams = PARAMS, caps: quota.Caps | None = None) -> Issuer:
    return Issuer(quota_seed(key.private_bytes()), key, CHAIN, params, caps or quota.Caps())


def request(blinding: q.Blinding, *, user: Identity = U1, to: crypto.SigningKey = A, model: str = "m1",
            epoch: int = EPOCH, signer: Identity | None = None) -> bytes:
    return q.encode_issue((signer or user).signing, CHAIN,
                          q.IssueRequest(user.node_id, to.public_bytes, model, epoch, blinding.blinded))


def tokens(iss: Issuer, n: int = 1, *, user: Identity = U1, model: str = "m1", now: float = NOW,
           seen: list[bytes] | None = None) -> list[tuple[bytes, bytes]]:
    """``n`` (nonce, output) pairs of ``user`` from ``iss``, checked against its key record;
    ``seen``, when given, gets every byte string the issuer took and gave."""
    epoch = PARAMS.epoch_at(now)
    record = iss.key_record(model, epoch)
    rec = q.decode_key_record(record)
    q.verify_key_record(rec, CHAIN)
    assert rec.issuer == iss.public and (rec.model, rec.epoch, rec.params) == (model, epoch, iss.params)
    b = q.Blinding(q.new_nonces(n))
    raw = request(b, user=user, to=A if iss.public == A.public_bytes else B, model=model, epoch=epoch)
    code, why, answer = iss.issue(raw, now, user_key, listed)
    assert code == Code.OK, why
    if seen is not None:
        seen += [record, raw, answer]
    return list(zip(b.nonces, b.finalize(q.decode_issued(answer), rec.key), strict=True))


def redeem(iss: Issuer, token: tuple[bytes, bytes], *, model: str = "m1", epoch: int = EPOCH,
           now: float = NOW) -> tuple[Code, str]:
    return iss.redeem(q.encode_redeem(q.Redeem(model, epoch, *token)), now)


# --------------------------------------------------------------------------- issue and redeem

def test_tokens_issued_blind_redeem_once() -> None:
    iss = issuer()
    got = tokens(iss, 3)
    assert iss.left(U1.node_id, "m1", NOW) == 2
    for t in got:
        assert redeem(iss, t) == (Code.OK, "spent")
    for t in got:
        assert redeem(iss, t)[0] == Code.SPENT
    assert iss.spent("m1", EPOCH) == 3


def test_a_token_spends_once_across_nodes_and_at_each_of_its_issuers() -> None:
    a, b = issuer(A), issuer(B)
    nonce = q.new_nonces(1)
    outputs = []
    for iss in (a, b):  # the same nonce, blinded afresh for each issuer
        bl = q.Blinding(nonce)
        code, why, answer = iss.issue(request(bl, to=A if iss is a else B), NOW, user_key, listed)
        assert code == Code.OK, why
        outputs.append(bl.finalize(q.decode_issued(answer), q.decode_key_record(iss.key_record("m1", EPOCH)).key)[0])
    token = q.Token("m1", EPOCH, nonce[0], ((A.public_bytes, outputs[0]), (B.public_bytes, outputs[1])))
    raw = q.encode_token(token)
    first_node, second_node = q.decode_token(raw), q.decode_token(raw)  # two model nodes hold the same token
    assert a.redeem(first_node.redeem(A.public_bytes), NOW) == (Code.OK, "spent")
    assert a.redeem(second_node.redeem(A.public_bytes), NOW)[0] == Code.SPENT
    assert b.redeem(second_node.redeem(B.public_bytes), NOW) == (Code.OK, "spent")  # B keeps its own spent set
    assert b.redeem(first_node.redeem(B.public_bytes), NOW)[0] == Code.SPENT
    assert a.redeem(token.redeem(B.public_bytes), NOW)[0] == Code.BAD_TOKEN  # B's output is not A's


def test_the_allowance_is_a_bucket_per_user_and_model_and_says_when_more_comes() -> None:
    iss = issuer()
    tokens(iss, 3)
    code, why, value = iss.issue(request(q.Blinding(q.new_nonces(3))), NOW, user_key, listed)
    assert (code, value) == (Code.QUOTA_LATER, b"")
    assert "2 tokens of 'm1' can be had from this issuer now and you asked for 3" in why
    assert f"at Unix time {NOW + 120:.1f} (in 120.0 s)" in why
    tokens(iss, 2)
    assert iss.left(U1.node_id, "m1", NOW) == 0
    code, why, _ = iss.issue(request(q.Blinding(q.new_nonces(1))), NOW, user_key, listed)
    assert code == Code.QUOTA_LATER and "0 tokens" in why and "(in 120.0 s)" in why
    code, why, _ = iss.issue(request(q.Blinding(q.new_nonces(6))), NOW, user_key, listed)
    assert code == Code.QUOTA_USED and "5 at most" in why  # more than the bucket ever holds
    tokens(iss, 5, model="m2")  # another model: its own allowance
    tokens(iss, 5, user=U2)  # another user: its own allowance
    assert iss.left(U1.node_id, "m1", NOW + 119) == 0
    tokens(iss, 1, now=NOW + 120)  # one token comes back every 120 s
    assert iss.left(U1.node_id, "m1", NOW + 120 + 4 * 120) == 4
    assert iss.left(U1.node_id, "m1", NOW + 10_000) == 5  # never more than the burst


def test_a_new_epoch_does_not_refill_the_allowance_so_tokens_cannot_be_saved_up() -> None:
    """The hoarder's plan under per-epoch budgets: take the whole budget at the end of an epoch,
    the next one's at the start of the next, and spend both at once in the grace. Under the bucket
    the second take gets only what accrued in between."""
    iss = issuer()
    end = START + 600 - 1
    tokens(iss, 5, now=end)
    nxt = end + 2  # the next epoch
    assert PARAMS.epoch_at(nxt) == EPOCH + 1 and iss.left(U1.node_id, "m1", nxt) == 0
    code, _, _ = iss.issue(request(q.Blinding(q.new_nonces(5)), epoch=EPOCH + 1), nxt, user_key, listed)
    assert code == Code.QUOTA_LATER


def test_a_replayed_request_gets_the_same_answer_and_counts_once() -> None:
    iss = issuer()
    b = q.Blinding(q.new_nonces(2))
    raw = request(b)
    first = iss.issue(raw, NOW, user_key, listed)
    again = iss.issue(raw, NOW + 5, user_key, listed)
    assert first[0] == again[0] == Code.OK and first[2] == again[2]
    assert "counted once" in again[1]
    assert iss.left(U1.node_id, "m1", NOW) == 3
    tokens(iss, 3)  # the whole rest of the allowance is still there
    assert iss.issue(raw, NOW + 9, user_key, listed)[2] == first[2]  # still answered, even with nothing left
    key = q.decode_key_record(iss.key_record("m1", EPOCH)).key
    assert b.finalize(q.decode_issued(again[2]), key)  # the replayed answer is a good one


def test_only_registered_users_get_tokens_for_listed_models_from_this_issuer() -> None:
    iss = issuer()
    iss.forget(NOW)
    revision = iss.revision()
    b = q.Blinding(q.new_nonces(1))
    cases: list[tuple[bytes, Code, str]] = [
        (request(b, user=STRANGER), Code.UNKNOWN_NODE, "only registered users get tokens"),
        (request(b, signer=U2), Code.BAD_SIGNATURE, "signature does not verify"),  # U2 signs one naming U1
        (request(b, to=B), Code.INVALID_FIELD, "another issuer's key"),  # a request for B, sent to A
        (request(b, model="m3"), Code.INVALID_FIELD, "no listed model node serves 'm3'"),
        (request(b, epoch=EPOCH + 1), Code.WRONG_EPOCH, f"the current epoch is {EPOCH}"),
        (request(b, epoch=EPOCH - 1), Code.WRONG_EPOCH, f"the current epoch is {EPOCH}"),
        (b"\x97\x01", Code.MALFORMED, "quota issue request"),
        (b"garbage", Code.MALFORMED, ""),
    ]
    other_chain = q.encode_issue(U1.signing, "another-chain",
                                 q.IssueRequest(U1.node_id, A.public_bytes, "m1", EPOCH, b.blinded))
    cases.append((other_chain, Code.BAD_SIGNATURE, "signature"))
    for raw, code, words in cases:
        got, why, value = iss.issue(raw, NOW, user_key, listed)
        assert (got, value) == (code, b"") and words in why, (code, why)
    assert iss.left(U1.node_id, "m1", EPOCH) == PARAMS.tokens and iss.revision() == revision  # nothing counted
    assert issuer(B).issue(request(b, to=B), NOW, user_key, listed)[0] == Code.OK  # the same request, to B


def test_a_blinded_input_that_is_no_element_is_malformed_and_counts_nothing() -> None:
    iss = issuer()
    good = q.Blinding(q.new_nonces(1)).blinded[0]
    for bad in (b"\xff" * 32, b"\x00" * 32):  # not an encoding; the identity
        raw = q.encode_issue(U1.signing, CHAIN, q.IssueRequest(U1.node_id, A.public_bytes, "m1", EPOCH, (good, bad)))
        assert iss.issue(raw, NOW, user_key, listed) == (Code.MALFORMED, "a blinded input is not a valid element", b"")
    assert iss.left(U1.node_id, "m1", EPOCH) == PARAMS.tokens


def test_tokens_of_another_model_epoch_or_issuer_are_bad() -> None:
    iss = issuer()
    t = tokens(iss, 1)[0]
    code, why = redeem(iss, t, model="m2")
    assert code == Code.BAD_TOKEN and "does not verify" in why
    other = tokens(issuer(B), 1)[0]
    assert redeem(iss, other)[0] == Code.BAD_TOKEN
    forged = (t[0], bytes(64))
    assert redeem(iss, forged)[0] == Code.BAD_TOKEN
    assert redeem(iss, (q.new_nonces(1)[0], t[1]))[0] == Code.BAD_TOKEN  # the output of another nonce
    code, why = redeem(iss, t, epoch=EPOCH - 1)  # 200 s into the epoch: the last one's grace is over
    assert code == Code.BAD_TOKEN and "another epoch's" in why
    code, why = redeem(iss, t, epoch=EPOCH + 1)
    assert code == Code.BAD_TOKEN and "another epoch's" in why
    early = tokens(iss, 1, now=START + 1)[0]  # within the last epoch's grace, claimed as the last epoch's
    code, why = redeem(iss, early, epoch=EPOCH - 1, now=START + 30)
    assert code == Code.BAD_TOKEN and "does not verify" in why
    assert redeem(iss, t) == (Code.OK, "spent")  # none of that spent it


def test_a_token_redeems_within_its_epoch_and_the_grace_after() -> None:
    iss = issuer()
    t1, t2 = tokens(iss, 2)
    assert redeem(iss, t1, now=START + 600 + 59) == (Code.OK, "spent")
    assert redeem(iss, t2, now=START + 600 + 60)[0] == Code.BAD_TOKEN


def test_garbage_is_malformed_everywhere() -> None:
    iss = issuer()
    iss.forget(NOW)
    revision = iss.revision()
    for raw in (b"", b"\x00", b"\x95\x01", b"\xc1" * 40, q.encode_key_query("m1", EPOCH)):
        assert iss.redeem(raw, NOW)[0] == Code.MALFORMED
        assert iss.issue(raw, NOW, user_key, listed)[0] == Code.MALFORMED
    assert iss.key_query(b"\x92", NOW)[0] == Code.MALFORMED
    assert iss.revision() == revision


def test_key_records_are_signed_for_the_epochs_around_now() -> None:
    iss = issuer()
    for d in (-1, 0, 1):
        code, _, value = iss.key_query(q.encode_key_query("m1", EPOCH + d), NOW)
        rec = q.decode_key_record(value)
        q.verify_key_record(rec, CHAIN)
        assert code == Code.OK and rec.key == q.evaluator(quota_seed(A.private_bytes()), CHAIN, "m1",
                                                         EPOCH + d).public_key.serialize()
    for d in (-2, 2, 100):
        code, why, value = iss.key_query(q.encode_key_query("m1", EPOCH + d), NOW)
        assert code == Code.WRONG_EPOCH and str(EPOCH) in why
        assert value == iss.key_record("m1", EPOCH)  # the current epoch's record: its params say the length
    assert iss.key_record("m1", EPOCH) != iss.key_record("m2", EPOCH) != iss.key_record("m1", EPOCH + 1)


def test_keys_come_from_the_validator_key_and_stay_across_restarts() -> None:
    seed = quota_seed(A.private_bytes())
    assert len(seed) == 32 and seed == quota_seed(A.private_bytes()) and seed != A.private_bytes()
    assert seed != quota_seed(B.private_bytes())
    assert issuer().key_record("m1", EPOCH) == issuer().key_record("m1", EPOCH)
    with pytest.raises(ValueError):
        quota_seed(b"\x01" * 31)
    with pytest.raises(ValueError):
        Issuer(b"\x01" * 31, A, CHAIN, PARAMS)


def test_the_evaluator_cache_is_bounded() -> None:
    iss = issuer()
    for i in range(quota.EVALUATORS + 10):
        iss.key_record(f"model-{i}", EPOCH)
    assert len(iss._keys) == quota.EVALUATORS


# --------------------------------------------------------------------------- bounds

def test_past_its_caps_the_issuer_refuses_rather_than_forgets() -> None:
    iss = issuer(caps=quota.Caps(accounts=2, spent=3))
    got = tokens(iss, 2) + tokens(iss, 2, model="m2")
    code, why, _ = iss.issue(request(q.Blinding(q.new_nonces(1)), user=U2), NOW, user_key, listed)
    assert code == Code.UNAVAILABLE and "users' allowances" in why
    tokens(iss, 1)  # an account it holds still gets its tokens
    for t, model in zip(got[:3], ("m1", "m1", "m2"), strict=True):
        assert redeem(iss, t, model=model)[0] == Code.OK
    code, why = redeem(iss, got[3], model="m2")
    assert code == Code.UNAVAILABLE and "spent tokens" in why
    assert redeem(iss, got[0])[0] == Code.SPENT  # spent stays spent
    later = NOW + 300  # the same epoch; both allowances full again (a token back every 120 s): they take no room
    assert PARAMS.epoch_at(later) == EPOCH and iss.left(U1.node_id, "m2", later) == PARAMS.burst
    tokens(iss, 1, user=U2, now=later)


def test_answers_kept_for_replays_are_bounded() -> None:
    iss = issuer(params=QuotaParams(epoch_s=600, tokens=10, burst=10), caps=quota.Caps(answers=2))
    raws = [request(q.Blinding(q.new_nonces(1))) for _ in range(3)]
    answers = [iss.issue(raw, NOW, user_key, listed)[2] for raw in raws]
    assert [iss.issue(raw, NOW, user_key, listed)[2] for raw in raws[1:]] == answers[1:]
    assert iss.left(U1.node_id, "m1", NOW) == 7
    assert len(iss._epochs[EPOCH].answers) == 2


# --------------------------------------------------------------------------- epochs and restarts

def test_old_epochs_are_forgotten_and_stay_refused() -> None:
    iss = issuer()
    t = tokens(iss, 2)
    assert redeem(iss, t[0])[0] == Code.OK
    later = START + 600 + 100  # the next epoch: this one's is held still (a token of it may come in its grace)
    assert iss.redeem(b"", later)[0] == Code.MALFORMED
    assert iss.spent("m1", EPOCH) == 1
    two_later = START + 1200
    assert iss.redeem(b"", two_later)[0] == Code.MALFORMED
    assert iss.spent("m1", EPOCH) == 0 and iss.left(U1.node_id, "m1", two_later) == PARAMS.burst
    assert not iss._allowances  # full again: forgotten
    assert iss.floor == EPOCH + 1 and not iss._epochs
    assert redeem(iss, t[0], now=NOW)[0] == Code.BAD_TOKEN  # the clock set back: the forgotten epoch stays closed
    assert iss.issue(request(q.Blinding(q.new_nonces(1))), NOW, user_key, listed)[0] == Code.WRONG_EPOCH
    snap = iss.snapshot()
    assert len(snap) < 80 and Issuer.restore(snap, quota_seed(A.private_bytes()), A, CHAIN, PARAMS).floor == EPOCH + 1


def test_a_restart_keeps_allowances_and_spent_tokens() -> None:
    iss = issuer()
    mine = tokens(iss, 3)
    theirs = tokens(iss, 5, user=U2, model="m2")
    assert redeem(iss, mine[0])[0] == Code.OK and redeem(iss, theirs[4], model="m2")[0] == Code.OK
    raw = iss.snapshot()
    again = Issuer.restore(raw, quota_seed(A.private_bytes()), A, CHAIN, PARAMS)
    assert again.snapshot() == raw
    assert again.left(U1.node_id, "m1", NOW) == 2 and again.left(U2.node_id, "m2", NOW) == 0
    assert again.issue(request(q.Blinding(q.new_nonces(3))), NOW, user_key, listed)[0] == Code.QUOTA_LATER
    assert redeem(again, mine[0])[0] == Code.SPENT and redeem(again, theirs[4], model="m2")[0] == Code.SPENT
    assert redeem(again, mine[1])[0] == Code.OK  # issued before the restart, good after it
    assert again.key_record("m1", EPOCH) == iss.key_record("m1", EPOCH)
    tokens(again, 2)


def test_a_snapshot_restores_only_as_itself() -> None:
    iss = issuer()
    tokens(iss, 2)
    tokens(iss, 1, user=U2)
    assert redeem(iss, tokens(iss, 1, model="m2")[0], model="m2")[0] == Code.OK
    raw = iss.snapshot()
    seed = quota_seed(A.private_bytes())
    refusals: list[tuple[Callable[[], Issuer], str]] = [
        (lambda: Issuer.restore(raw, seed, A, "another-chain", PARAMS), "another chain"),
        (lambda: Issuer.restore(raw, quota_seed(B.private_bytes()), B, CHAIN, PARAMS), "another issuer"),
        (lambda: Issuer.restore(raw, seed, A, CHAIN, QuotaParams()), "other quota params"),
        (lambda: Issuer.restore(raw + b"\x00", seed, A, CHAIN, PARAMS), "trailing"),
        (lambda: Issuer.restore(raw[:-3], seed, A, CHAIN, PARAMS), ""),
        (lambda: Issuer.restore(b"\x97\x01" + raw[2:], seed, A, CHAIN, PARAMS), "version 1"),
        (lambda: Issuer.restore(b"\xc1", seed, A, CHAIN, PARAMS), ""),
        (lambda: Issuer.restore(b"\x90" * (quota.MAX_STATE_BYTES + 1), seed, A, CHAIN, PARAMS), "at most"),
    ]
    for restore, words in refusals:
        with pytest.raises(QuotaStateError) as info:
            restore()
        assert words in info.value.reason
    # the allowances out of order: the same content, another encoding
    wire = iss._wire()
    wire[5].reverse()
    with pytest.raises(QuotaStateError, match="canonical"):
        Issuer.restore(quota._pack(wire), seed, A, CHAIN, PARAMS)
    wire[5].reverse()
    for bad in (1, -1.0, float("inf"), float("nan"), quota.MAX_FULL_AT):  # an allowance's time out of bounds
        wire[5][0][2] = bad
        with pytest.raises(QuotaStateError, match="allowance"):
            Issuer.restore(quota._pack(wire), seed, A, CHAIN, PARAMS)
    for cut in range(len(raw)):  # every prefix is refused, never half restored
        with pytest.raises(QuotaStateError):
            Issuer.restore(raw[:cut], seed, A, CHAIN, PARAMS)


# --------------------------------------------------------------------------- unlinkability

def _windows(data: bytes, n: int = 16) -> set[bytes]:
    return {data[i:i + n] for i in range(len(data) - n + 1)}


def test_a_redemption_carries_nothing_of_its_issuance_and_fits_every_user_alike() -> None:
    """Everything the issuer takes and gives while issuing to two users, then everything it takes
    at a redemption: no 16 bytes of the redeemed nonce or output were ever in the issuance, and
    the redemption is equally good whichever of the two issuances it is put down to."""
    iss = issuer()
    seen: list[bytes] = []
    t1 = tokens(iss, 1, user=U1, seen=seen)[0]
    t2 = tokens(iss, 1, user=U2, seen=seen)[0]
    transcript = b"\xff".join(seen)
    for nonce, output in (t1, t2):
        raw = q.encode_redeem(q.Redeem("m1", EPOCH, nonce, output))
        assert not (_windows(nonce) | _windows(output)) & _windows(transcript)
        assert U1.node_id not in raw and U2.node_id not in raw
    # Validity is the only link: an issuer that saw only U1's issuance, only U2's, or none at all
    # answers each redemption alike, so the answer cannot depend on whose issuance it was.
    only_u1, only_u2, neither = issuer(), issuer(), issuer()
    only_u1.issue(seen[1], NOW, user_key, listed)
    only_u2.issue(seen[4], NOW, user_key, listed)
    for t, view in itertools.product((t1, t2), (only_u1, only_u2, neither)):
        assert redeem(view, t) == (Code.OK, "spent")
    # The blinded element the issuer saw is unrelated to the token: blinding the nonce again
    # gives another element, and its own evaluation of it is not the token's output.
    for (nonce, output), request_raw in ((t1, seen[1]), (t2, seen[4])):
        blinded = q.decode_issue(request_raw).blinded[0]
        assert q.Blinding([nonce]).blinded[0] != blinded
        ev = q.evaluator(quota_seed(A.private_bytes()), CHAIN, "m1", EPOCH)
        evaluated = ev.evaluate_batch([ristretto.BlindedInput.deserialize(blinded)]).serialize()
        assert not _windows(output) & _windows(evaluated)
    # What the issuer keeps holds no blinded or evaluated element: allowances by user, nonces by model.
    elements = [*q.decode_issue(seen[1]).blinded, *q.decode_issue(seen[4]).blinded,
                q.decode_issued(seen[2]).evaluated, q.decode_issued(seen[5]).evaluated]
    kept = _windows(iss.snapshot())
    assert not any(_windows(e) & kept for e in elements)


# --------------------------------------------------------------------------- the CLI's defaults

def test_the_genesis_commands_defaults_are_the_params_defaults() -> None:
    d = QuotaParams()
    assert (cli._DEFAULT_QUOTA_EPOCH_S, cli._DEFAULT_QUOTA_TOKENS, cli._DEFAULT_QUOTA_ISSUERS,
            cli._DEFAULT_QUOTA_GRACE_S, cli._DEFAULT_QUOTA_BURST, cli._DEFAULT_QUOTA_PRIORITY) == (
        d.epoch_s, d.tokens, d.issuers, d.grace_s, d.burst, d.priority)


# --------------------------------------------------------------------------- classes (decision 0022)

CLASSED = QuotaParams(epoch_s=600, tokens=10, issuers=2, grace_s=60, burst=5, priority=2)  # the top 2 of 5


def classed(iss: Issuer, n: int, priority: bool, now: float = NOW) -> tuple[Code, str, list[tuple[bytes, bytes]]]:
    """Ask ``iss`` for ``n`` tokens of a class; the (nonce, output) pairs checked against that class's key."""
    b = q.Blinding(q.new_nonces(n))
    raw = q.encode_issue(U1.signing, CHAIN, q.IssueRequest(U1.node_id, A.public_bytes, "m1", EPOCH, b.blinded,
                                                           priority=priority))
    code, why, answer = iss.issue(raw, now, user_key, listed)
    if code != Code.OK:
        return code, why, []
    rec = q.decode_key_record(iss.key_record("m1", EPOCH))
    return code, why, list(zip(b.nonces, b.finalize(q.decode_issued(answer), rec.key_of(priority)), strict=True))


def test_priority_tokens_come_from_the_top_of_the_allowance_and_redeem_as_such_only() -> None:
    iss = issuer(params=CLASSED)
    code, why, _ = classed(iss, 3, True)
    assert code == Code.QUOTA_USED and "top 2" in why  # more priority tokens than the top ever holds
    code, why, top = classed(iss, 2, True)
    assert code == Code.OK and "2 priority tokens issued" in why
    code, why, _ = classed(iss, 1, True)
    assert code == Code.QUOTA_LATER and "0 priority tokens" in why and "standard ones now" in why
    assert iss.left(U1.node_id, "m1", NOW) == 3  # the refusal took nothing
    code, why, below = classed(iss, 3, False)
    assert code == Code.OK and "3 standard tokens issued" in why
    for nonce, output in top:
        relabelled = q.encode_redeem(q.Redeem("m1", EPOCH, nonce, output, priority=False))
        code, why = iss.redeem(relabelled, NOW)
        assert code == Code.BAD_TOKEN and "standard" in why  # a priority output is not a standard one
        assert iss.redeem(q.encode_redeem(q.Redeem("m1", EPOCH, nonce, output, priority=True)), NOW) == (Code.OK, "spent")
    for nonce, output in below:  # the cheaper class cannot be passed off as the other
        code, why = iss.redeem(q.encode_redeem(q.Redeem("m1", EPOCH, nonce, output, priority=True)), NOW)
        assert code == Code.BAD_TOKEN and "priority" in why
        assert iss.redeem(q.encode_redeem(q.Redeem("m1", EPOCH, nonce, output)), NOW) == (Code.OK, "spent")
    later = NOW + 4 * CLASSED.per_token_s  # 4 back: the level 4 of 5, the top 1 again
    assert classed(iss, 1, True, later)[0] == Code.OK and classed(iss, 1, True, later)[0] == Code.QUOTA_LATER
