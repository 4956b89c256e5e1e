"""The quota wire contract (overlay/directory/quota.py, issue 31): every message round-trips; each
decoder takes exactly one encoding of each message and refuses everything else with a
QuotaError naming why (never another exception); signatures bind the chain and the issuer; the
user's Blinding refuses an answer made under another key; QuotaParams.from_json keeps to its
bounds and known keys."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
from voprf import ristretto

from overlay.directory import quota as q
from overlay.directory.quota import QuotaError, QuotaParams
from overlay.directory.registration import MAX_MODEL_ID
from overlay.wire import crypto
from overlay.wire.identity import Identity

CHAIN = "gt-quota"
ISSUER = crypto.SigningKey.from_bytes(b"\x11" * 32)
OTHER_ISSUER = crypto.SigningKey.from_bytes(b"\x12" * 32)
USER = Identity.generate()
SEED = b"\x33" * 32
MODEL = "smollm2-135m-instruct"
EPOCH = 2_833_333


def pack(obj: object) -> bytes:
    out: bytes = msgpack.packb(obj, use_bin_type=True)
    return out


def key_record(signer: crypto.SigningKey = ISSUER, chain: str = CHAIN, epoch: int = EPOCH) -> bytes:
    ev, top = q.evaluator(SEED, chain, MODEL, epoch), q.evaluator(SEED, chain, MODEL, epoch, priority=True)
    rec = q.KeyRecord(signer.public_bytes, MODEL, epoch, ev.public_key.serialize(), top.public_key.serialize(),
                      QuotaParams())
    return q.encode_key_record(signer, chain, rec)


def issue_request(blinded: tuple[bytes, ...] | None = None, *, issuer: bytes = ISSUER.public_bytes,
                  chain: str = CHAIN, priority: bool = False) -> bytes:
    blinded = blinded if blinded is not None else q.Blinding(q.new_nonces(2)).blinded
    return q.encode_issue(USER.signing, chain, q.IssueRequest(USER.node_id, issuer, MODEL, EPOCH, blinded,
                                                              priority=priority))


def token(priority: bool = False) -> q.Token:
    return q.Token(MODEL, EPOCH, b"\x05" * 32, ((ISSUER.public_bytes, b"\x06" * 64),
                                                (OTHER_ISSUER.public_bytes, b"\x07" * 64)), priority)


def valid_messages() -> list[tuple[Callable[[bytes], Any], bytes]]:
    """One valid encoding of every message, with its decoder."""
    return [(q.decode_key_record, key_record()), (q.decode_issue, issue_request()),
            (q.decode_issued, q.encode_issued(q.Issued(b"\x09" * 96, 7))),
            (q.decode_token, q.encode_token(token())), (q.decode_token, q.encode_token(token(priority=True))),
            (q.decode_redeem, q.encode_redeem(q.Redeem(MODEL, EPOCH, b"\x05" * 32, b"\x06" * 64))),
            (q.decode_key_query, q.encode_key_query(MODEL, EPOCH))]


# --------------------------------------------------------------------------- round trips

def test_every_message_round_trips() -> None:
    rec = q.decode_key_record(key_record())
    assert (rec.issuer, rec.model, rec.epoch, rec.params) == (ISSUER.public_bytes, MODEL, EPOCH, QuotaParams())
    assert rec.key == q.evaluator(SEED, CHAIN, MODEL, EPOCH).public_key.serialize() == rec.key_of(False)
    assert rec.priority_key == q.evaluator(SEED, CHAIN, MODEL, EPOCH, priority=True).public_key.serialize()
    assert rec.priority_key == rec.key_of(True) != rec.key  # a class has its own key
    q.verify_key_record(rec, CHAIN)
    blinded = q.Blinding(q.new_nonces(3)).blinded
    for priority in (False, True):
        req = q.decode_issue(issue_request(blinded, priority=priority))
        assert (req.user, req.issuer, req.model, req.epoch, req.blinded, req.priority) == (
            USER.node_id, ISSUER.public_bytes, MODEL, EPOCH, blinded, priority)
        q.verify_issue(req, CHAIN, USER.ed25519_public)
        assert q.decode_token(q.encode_token(token(priority))) == token(priority)
        r = q.Redeem(MODEL, EPOCH, b"\x05" * 32, b"\x06" * 64, priority)
        assert q.decode_redeem(q.encode_redeem(r)) == r
        assert q.decode_redeem(token(priority).redeem(OTHER_ISSUER.public_bytes)) == q.Redeem(
            MODEL, EPOCH, b"\x05" * 32, b"\x07" * 64, priority)  # a token's class goes with its redeems
    assert q.decode_issued(q.encode_issued(q.Issued(b"\x09" * 96, 7))) == q.Issued(b"\x09" * 96, 7)
    assert q.decode_key_query(q.encode_key_query(MODEL, EPOCH)) == (MODEL, EPOCH)


def test_a_full_batch_fits_the_limits() -> None:
    ev = q.evaluator(SEED, CHAIN, MODEL, EPOCH)
    b = q.Blinding(q.new_nonces(q.MAX_BATCH))
    raw = issue_request(b.blinded)
    assert len(raw) <= q.MAX_ISSUE_BYTES
    batch = ev.evaluate_batch([ristretto.BlindedInput.deserialize(x) for x in b.blinded])
    answer = q.encode_issued(q.Issued(batch.serialize(), 10**9))
    assert len(answer) <= q.MAX_ISSUED_BYTES
    outputs = b.finalize(q.decode_issued(answer), ev.public_key.serialize())
    assert len(set(outputs)) == q.MAX_BATCH
    long_model = "m" * MAX_MODEL_ID
    full = q.Token(long_model, q.MAX_EPOCH, b"\x01" * 32,
                   tuple((bytes([i]) * 32, b"\x02" * 64) for i in range(q.MAX_ISSUERS)))
    assert len(q.encode_token(full)) <= q.MAX_TOKEN_BYTES and q.decode_token(q.encode_token(full)) == full
    assert len(full.redeem(b"\x00" * 32)) <= q.MAX_REDEEM_BYTES


# --------------------------------------------------------------------------- strict decoding

def _items(raw: bytes) -> list[Any]:
    out: list[Any] = msgpack.unpackb(raw, raw=False)
    return out


def _refused(decode: Callable[[bytes], Any], raw: Any, *words: str) -> str:
    with pytest.raises(QuotaError) as info:
        decode(raw)
    assert info.value.reason and all(w in info.value.reason for w in words), info.value.reason
    return info.value.reason


def test_trailing_bytes_and_non_bytes_are_refused() -> None:
    for decode, raw in valid_messages():
        decode(raw)
        _refused(decode, raw + b"\x00", "trailing")
        _refused(decode, raw[:-1])
        _refused(decode, bytearray(raw), "bytes")
        _refused(decode, b"")


def test_non_canonical_encodings_are_refused() -> None:
    redeem = [2, MODEL, EPOCH, False, b"\x05" * 32, b"\x06" * 64]
    canonical = pack(redeem)
    q.decode_redeem(canonical)
    wide_version = b"\x96\xcc\x02" + canonical[2:]  # the version 2 as a uint8
    assert msgpack.unpackb(wide_version) == msgpack.unpackb(canonical)
    _refused(q.decode_redeem, wide_version, "canonical")
    wide_epoch = b"".join([b"\x96", pack(2), pack(MODEL), b"\xcf" + EPOCH.to_bytes(8, "big"), pack(False),
                           pack(b"\x05" * 32), pack(b"\x06" * 64)])  # the epoch as a uint64
    _refused(q.decode_redeem, wide_epoch, "canonical")
    wide_bin = canonical.replace(b"\xc4\x20" + b"\x05" * 32, b"\xc5\x00\x20" + b"\x05" * 32)  # bin16 header
    _refused(q.decode_redeem, wide_bin, "canonical")
    _refused(q.decode_redeem, pack([2, MODEL.encode(), EPOCH, False, b"\x05" * 32, b"\x06" * 64]), "model id")  # bin
    _refused(q.decode_redeem, msgpack.packb(redeem, use_bin_type=False))  # the nonce as a str
    _refused(q.decode_redeem, pack({"v": 1}))  # a map
    _refused(q.decode_redeem, b"\xdc\x00\x06" + canonical[1:], "canonical")  # an array16 header


@pytest.mark.parametrize("index, value, words", [
    (4, b"\x05" * 31, ("nonce", "32")), (4, b"\x05" * 33, ("nonce",)), (5, b"\x06" * 63, ("output", "64")),
    (2, -1, ("epoch",)), (2, q.MAX_EPOCH + 1, ("epoch",)), (2, 1.0, ("epoch",)), (2, True, ("epoch",)),
    (1, "", ("model",)), (1, "m" * (MAX_MODEL_ID + 1), ("model",)), (0, 1, ("version 1",)),
    (0, 0, ("version",)), (0, "2", ("version",)), (3, 1, ("class",)), (3, None, ("class",)), (3, b"", ("class",)),
])
def test_redeem_fields_out_of_shape_are_refused(index: int, value: Any, words: tuple[str, ...]) -> None:
    items: list[Any] = [2, MODEL, EPOCH, False, b"\x05" * 32, b"\x06" * 64]
    items[index] = value
    _refused(q.decode_redeem, pack(items), *words)


def test_issue_requests_out_of_shape_are_refused() -> None:
    good = _items(issue_request())
    for index, value, words in [(1, b"\x01" * 19, ("user",)), (2, b"\x02" * 31, ("issuer",)),
                                (5, 0, ("class",)), (5, "priority", ("class",)),
                                (6, [], ("blinded", "0 items")), (6, [b"\x03" * 32] * (q.MAX_BATCH + 1), ("blinded",)),
                                (6, [b"\x03" * 31], ("blinded input",)), (7, b"\x04" * 63, ("signature",)),
                                (0, 1, ("version 1",))]:
        items = list(good)
        items[index] = value
        _refused(q.decode_issue, pack(items), *words)
    _refused(q.decode_issue, pack(good[:-1]), "an array of 8")
    _refused(q.decode_issue, pack([*good, b""]), "an array of 8")


def test_tokens_need_one_to_max_distinct_issuers() -> None:
    t = token()
    dup = q.Token(t.model, t.epoch, t.nonce, (t.evaluations[0], (t.evaluations[0][0], b"\x08" * 64)))
    _refused(q.decode_token, q.encode_token(dup), "an issuer appears twice")
    none = q.Token(t.model, t.epoch, t.nonce, ())
    _refused(q.decode_token, q.encode_token(none), "evaluations")
    many = q.Token(t.model, t.epoch, t.nonce, tuple((bytes([i]) * 32, b"\x02" * 64)
                                                    for i in range(q.MAX_ISSUERS + 1)))
    _refused(q.decode_token, q.encode_token(many))
    _refused(q.decode_token, pack([2, t.model, t.epoch, False, t.nonce, [[b"\x01" * 32]]]), "an evaluation")
    _refused(q.decode_token, pack([2, t.model, t.epoch, False, t.nonce, [[b"\x01" * 32, b"\x02" * 63]]]), "output")
    _refused(q.decode_token, pack([2, t.model, t.epoch, 1, t.nonce, [[b"\x01" * 32, b"\x02" * 64]]]), "class")


def test_key_records_and_answers_out_of_shape_are_refused() -> None:
    good = _items(key_record())
    for index, value in [(4, b"\x01" * 31), (5, b"\x01" * 33), (6, [600, 60, 2, 60, 16]), (6, [600, 0, 2, 60, 16, 4]),
                         (6, [600, 60, 2, 600, 16, 4]), (6, [600, 60, q.MAX_ISSUERS + 1, 60, 16, 4]),
                         (6, [600.0, 60, 2, 60, 16, 4]), (6, [600, 60, 2, 60, 16, 0]), (7, b"\x02" * 65)]:
        items = list(good)
        items[index] = value
        _refused(q.decode_key_record, pack(items))
    _refused(q.decode_issued, pack([2, b"", 3]), "evaluated")
    _refused(q.decode_issued, pack([2, b"\x01" * 96, -1]), "left")
    _refused(q.decode_key_query, pack([MODEL]), "[model, epoch]")
    _refused(q.decode_key_query, pack([MODEL, -3]), "epoch")


def test_oversize_inputs_are_refused_before_decoding() -> None:
    for decode, limit in [(q.decode_issue, q.MAX_ISSUE_BYTES), (q.decode_redeem, q.MAX_REDEEM_BYTES),
                          (q.decode_token, q.MAX_TOKEN_BYTES), (q.decode_key_record, q.MAX_KEY_BYTES)]:
        _refused(decode, b"\x90" * (limit + 1), f"at most {limit}")


def test_random_and_mutated_bytes_raise_only_quota_errors() -> None:
    rnd = random.Random(31)
    decoders = [d for d, _ in valid_messages()]
    corpus = [raw for _, raw in valid_messages()]
    for _ in range(3000):
        raw = bytearray(rnd.choice(corpus))
        for _ in range(rnd.randint(1, 4)):
            op = rnd.randrange(3)
            at = rnd.randrange(len(raw) + 1)
            if op == 0 and at < len(raw):
                raw[at] = rnd.randrange(256)
            elif op == 1:
                raw[at:at] = bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 8)))
            else:
                del raw[at:at + rnd.randint(1, 8)]
        for decode in decoders:
            try:
                m = decode(bytes(raw))
            except QuotaError as exc:
                assert exc.reason
                continue
            if decode is not q.decode_key_query:
                assert pack(m.wire()) == bytes(raw)  # one encoding per message


# --------------------------------------------------------------------------- signatures

def test_signatures_bind_the_chain_the_issuer_and_every_field() -> None:
    rec = q.decode_key_record(key_record())
    q.verify_key_record(rec, CHAIN)
    with pytest.raises(QuotaError, match="signature"):
        q.verify_key_record(rec, "another-chain")
    forged = q.decode_key_record(q.encode_key_record(OTHER_ISSUER, CHAIN, q.KeyRecord(
        ISSUER.public_bytes, MODEL, EPOCH, rec.key, rec.priority_key, rec.params)))  # signed by B, naming A
    with pytest.raises(QuotaError, match="signature"):
        q.verify_key_record(forged, CHAIN)
    swapped = q.KeyRecord(rec.issuer, MODEL, EPOCH, rec.priority_key, rec.key, rec.params, rec.signature)
    with pytest.raises(QuotaError, match="signature"):  # the classes' keys are signed in their places
        q.verify_key_record(q.decode_key_record(pack(swapped.wire())), CHAIN)
    with pytest.raises(QuotaError, match="signature"):
        q.verify_key_record(forged, CHAIN)

    req = q.decode_issue(issue_request())
    q.verify_issue(req, CHAIN, USER.ed25519_public)
    with pytest.raises(QuotaError, match="signature"):
        q.verify_issue(req, "another-chain", USER.ed25519_public)
    other = Identity.generate()
    with pytest.raises(QuotaError, match="not the user's"):
        q.verify_issue(req, CHAIN, other.ed25519_public)
    for changed in (q.IssueRequest(req.user, OTHER_ISSUER.public_bytes, req.model, req.epoch, req.blinded,
                                   req.signature),  # the same signature, another issuer named
                    q.IssueRequest(req.user, req.issuer, "another-model", req.epoch, req.blinded, req.signature),
                    q.IssueRequest(req.user, req.issuer, req.model, req.epoch + 1, req.blinded, req.signature),
                    q.IssueRequest(req.user, req.issuer, req.model, req.epoch, req.blinded[:1], req.signature),
                    q.IssueRequest(req.user, req.issuer, req.model, req.epoch, req.blinded, req.signature,
                                   not req.priority)):  # the class is signed
        with pytest.raises(QuotaError, match="signature"):
            q.verify_issue(q.decode_issue(pack(changed.wire())), CHAIN, USER.ed25519_public)
    with pytest.raises(QuotaError):
        q.verify_issue(req, CHAIN, b"\x01" * 31)


# --------------------------------------------------------------------------- the user's blind half

def test_finalize_refuses_an_answer_made_under_another_key() -> None:
    b = q.Blinding(q.new_nonces(2))
    mine, theirs = q.evaluator(SEED, CHAIN, MODEL, EPOCH), q.evaluator(b"\x44" * 32, CHAIN, MODEL, EPOCH)
    inputs = [ristretto.BlindedInput.deserialize(x) for x in b.blinded]
    answer = q.Issued(theirs.evaluate_batch(inputs).serialize(), 3)
    with pytest.raises(QuotaError, match="does not verify"):
        b.finalize(answer, mine.public_key.serialize())  # the key the issuer published is not the one it used
    other_epoch = q.evaluator(SEED, CHAIN, MODEL, EPOCH + 1)
    with pytest.raises(QuotaError, match="does not verify"):
        b.finalize(q.Issued(other_epoch.evaluate_batch(inputs).serialize(), 3), mine.public_key.serialize())
    ok = q.Issued(mine.evaluate_batch(inputs).serialize(), 3)
    outputs = b.finalize(ok, mine.public_key.serialize())
    assert outputs == [mine.evaluate_known_input(q.token_input(n)) for n in b.nonces]


def test_finalize_refuses_garbage_and_answers_for_other_inputs() -> None:
    b = q.Blinding(q.new_nonces(2))
    ev = q.evaluator(SEED, CHAIN, MODEL, EPOCH)
    key = ev.public_key.serialize()
    for evaluated in (b"\x01" * 96, b"\xff" * 160, b"\x00"):
        with pytest.raises(QuotaError):
            b.finalize(q.Issued(evaluated, 1), key)
    with pytest.raises(QuotaError):
        b.finalize(q.Issued(ev.evaluate_batch([ristretto.BlindedInput.deserialize(b.blinded[0])]).serialize(), 1),
                   key)  # one output for two inputs
    others = q.Blinding(q.new_nonces(2))
    answer = ev.evaluate_batch([ristretto.BlindedInput.deserialize(x) for x in others.blinded]).serialize()
    with pytest.raises(QuotaError):
        b.finalize(q.Issued(answer, 1), key)  # evaluated someone else's inputs
    with pytest.raises(QuotaError):
        b.finalize(q.Issued(answer, 1), b"\xff" * 32)  # not a key
    with pytest.raises(QuotaError):
        q.Blinding([b"\x01" * 31])
    with pytest.raises(QuotaError):
        q.Blinding([])


def test_blinding_the_same_nonce_twice_gives_unrelated_elements() -> None:
    nonce = q.new_nonces(1)
    assert q.Blinding(nonce).blinded != q.Blinding(nonce).blinded


# --------------------------------------------------------------------------- params and epochs

def test_params_from_json_keep_to_bounds_and_known_keys() -> None:
    assert QuotaParams.from_json({}) == QuotaParams()
    assert QuotaParams.from_json(QuotaParams().to_json()) == QuotaParams()
    assert QuotaParams().to_json() == {"epoch_s": 60, "tokens": 6, "issuers": 2, "grace_s": 15, "burst": 16,
                                       "priority": 4}
    assert QuotaParams.from_json({"tokens": 5}) == QuotaParams(tokens=5)
    for name, (lo, hi) in QuotaParams.BOUNDS.items():
        for bad in (lo - 1, hi + 1, str(lo), float(lo), None):
            with pytest.raises(QuotaError, match=name):
                QuotaParams.from_json({name: bad, **({"epoch_s": 86_400} if name == "grace_s" else {})})
    with pytest.raises(QuotaError, match="tokens"):
        QuotaParams.from_json({"tokens": True})  # a bool is not an int here
    with pytest.raises(QuotaError, match="unknown keys"):
        QuotaParams.from_json({"tokens": 5, "token": 6})
    with pytest.raises(QuotaError, match="grace_s"):
        QuotaParams.from_json({"epoch_s": 60, "grace_s": 60})
    bad_objects: list[Any] = [[], "quota", None, {1: 2}]
    for bad_obj in bad_objects:
        with pytest.raises(QuotaError, match="object"):
            QuotaParams.from_json(bad_obj)


def test_epochs_issue_now_and_redeem_within_grace() -> None:
    p = QuotaParams(epoch_s=600, grace_s=60)
    start = EPOCH * 600
    assert p.epoch_at(start) == EPOCH and p.epoch_at(start - 0.001) == EPOCH - 1
    assert p.issuable(EPOCH, start) and not p.issuable(EPOCH + 1, start) and not p.issuable(EPOCH - 1, start)
    assert p.redeemable(EPOCH, start) and p.redeemable(EPOCH, start + 659.9) and not p.redeemable(EPOCH, start + 660)
    assert not p.redeemable(EPOCH, start - 1)  # not before its epoch
    assert p.refills_at(EPOCH) == start + 600


# --------------------------------------------------------------------------- the allowance (decision 0018)

def test_an_allowance_is_a_token_bucket_that_fills_at_the_rate_and_holds_at_most_the_burst() -> None:
    p = QuotaParams(epoch_s=60, tokens=6, burst=4)  # a token every 10 s, 4 at most
    a = q.Allowance(p)
    assert a.level(1000.0) == 4 and a.full(1000.0)
    assert a.take(3, 1000.0) and a.level(1000.0) == 1
    assert not a.take(2, 1000.0) and a.level(1000.0) == 1  # refused: nothing changes
    assert a.ready_at(2, 1000.0) == 1010.0 and a.ready_at(1, 1000.0) == 1000.0
    assert a.level(1009.9) == 1 and a.level(1010.0) == 2 and a.level(1030.0) == 4 and a.full(1030.0)
    assert a.level(5000.0) == 4  # never more than the burst, however long idle
    assert a.take(4, 5000.0) and a.level(5000.0) == 0 and a.ready_at(4, 5000.0) == 5040.0
    assert a.ready_at(9, 5000.0) == 5040.0  # more than the burst: when the bucket is full


def test_an_allowance_gives_at_most_the_rate_over_time_whoever_asks_how() -> None:
    """Whatever a user's asks (sizes, times), what it gets over T seconds is at most burst + rate x T."""
    rng = random.Random(7)
    p = QuotaParams(epoch_s=60, tokens=6, burst=16)
    for _ in range(50):
        a, t, got = q.Allowance(p), 0.0, 0
        while t < 600:
            n = rng.randint(1, 16)
            if a.take(n, t):
                got += n
            t += rng.expovariate(1.0)
        assert got <= p.burst + p.tokens * 600 / p.epoch_s


def test_priority_tokens_come_from_the_top_of_the_bucket_only() -> None:
    """Decision 0022: the top ``priority`` tokens of a full bucket are priority ones; below that, only
    standard ones; a user that keeps to its rate keeps getting priority ones."""
    p = QuotaParams(epoch_s=60, tokens=6, burst=8, priority=3)  # a token every 10 s; the top 3 of 8
    a = q.Allowance(p)
    assert a.top(1000.0) == 3 and a.level(1000.0) == 8
    assert not a.take_class(4, True, 1000.0) and a.level(1000.0) == 8  # refused: nothing changes
    assert a.take_class(3, True, 1000.0) and a.top(1000.0) == 0 and a.level(1000.0) == 5
    assert not a.take_class(1, True, 1000.0)  # the top is spent: no priority token now ...
    assert a.top_at(1, 1000.0) == 1010.0  # ... until the bucket is one token above the rest again
    assert a.take_class(2, False, 1000.0) and a.level(1000.0) == 3  # standard ones from what is below
    assert a.top(1029.9) == 0 and a.top_at(1, 1000.0) == 1030.0  # 3 tokens' time to be above 5 again
    assert a.take_class(1, True, 1030.0) and a.top(1030.0) == 0
    b = q.Allowance(QuotaParams(burst=3))  # priority 4 >= burst 3: every token is a priority one
    assert b.top(0.0) == 3 and b.take_class(3, True, 0.0)


def test_a_user_at_its_rate_gets_only_priority_tokens_and_a_burst_only_the_top() -> None:
    """Whatever a user does, over T seconds it gets at most ``priority + rate x T`` priority tokens: its
    burst beyond the top is standard."""
    rng = random.Random(22)
    p = QuotaParams(epoch_s=60, tokens=6, burst=16, priority=4)
    for _ in range(50):
        a, t, got = q.Allowance(p), 0.0, 0
        while t < 600:
            n = rng.randint(1, 4)
            if a.take_class(n, True, t):
                got += n
            t += rng.expovariate(1.0)
        assert got <= p.priority + p.tokens * 600 / p.epoch_s
    steady = q.Allowance(p)
    assert all(steady.take_class(1, True, 10.0 * i) for i in range(100))  # one a token's time: all priority
