"""Audit transactions (verifier/audit_tx.py) and the sealed-box primitives (overlay/crypto.py)."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest

from overlay import crypto, signing
from overlay.identity import node_id_of
from overlay.messages import ChatMessage, SamplingParams
from verifier import audit_tx as at
from verifier import vrf
from verifier.reputation import SCALE
from verifier.tx import Code, TxError

CHAIN = "audit-test"
SEED = bytes(range(32))
PK = crypto.SigningKey.from_bytes(SEED).public_bytes


def opening(question: str = "What is the capital of France?", salt: bytes = b"s" * 16, **params: object) -> at.Opening:
    p = dict(temperature=0.7, top_p=1.0, top_k=0, max_tokens=32, seed=7)
    p.update(params)
    return at.Opening(salt, "smollm2-135m-instruct", (ChatMessage("user", question),), SamplingParams(**p))  # type: ignore[arg-type]


def signed_reply(node_key: crypto.SigningKey, op: at.Opening, chunks: list[tuple[str, list[int]]]) -> at.ReplyEntry:
    node_id = node_id_of(node_key.public_bytes)
    signer = signing.ReplySigner(op.digest(), op.model, node_id)
    sig = b""
    for i, (text, ids) in enumerate(chunks):
        _, sig = signer.add(text, ids, i == len(chunks) - 1, 1234, node_key.sign)
    return at.reply_entry(node_id, 0, op, chunks, sig, 1234, 0.93, 0.41)


# --------------------------------------------------------------------------- sealing


def test_seal_open_round_trip_and_wrong_key() -> None:
    key = crypto.SigningKey.generate()
    box = crypto.seal_to_ed25519(key.public_bytes, b"the prompt")
    assert len(box) == len(b"the prompt") + crypto.SEALED_OVERHEAD
    assert crypto.open_sealed_ed25519(key.private_bytes(), box) == b"the prompt"
    assert crypto.seal_to_ed25519(key.public_bytes, b"the prompt") != box  # an ephemeral key each time
    with pytest.raises(crypto.CryptoError):
        crypto.open_sealed_ed25519(crypto.SigningKey.generate().private_bytes(), box)
    tampered = box[:-1] + bytes([box[-1] ^ 1])
    with pytest.raises(crypto.CryptoError):
        crypto.open_sealed_ed25519(key.private_bytes(), tampered)
    with pytest.raises(crypto.CryptoError):
        crypto.open_sealed_ed25519(key.private_bytes(), box[:40])
    with pytest.raises(crypto.CryptoError):
        crypto.seal_to_ed25519(b"\x00" * 31, b"x")
    with pytest.raises(crypto.CryptoError):
        crypto.open_sealed_ed25519(b"\x00" * 31, box)


# --------------------------------------------------------------------------- openings


def test_opening_round_trip_commitment_and_prompt_key() -> None:
    op = opening()
    assert at.Opening.decode(op.encode()) == op
    assert len(op.commitment()) == 32
    assert op.commitment() != opening(salt=b"t" * 16).commitment()
    assert op.commitment() != opening(temperature=0.0).commitment()
    assert op.digest() == signing.request_digest(op.request(request_id=b"r" * 16))  # routing is not covered
    same = opening("  what IS the   capital of\tfrance? ", salt=b"x" * 16)
    assert same.prompt_key() == op.prompt_key()
    assert opening("What is the capital of Spain?").prompt_key() != op.prompt_key()
    assert op.request().continuation == "" and op.request().return_paths == ()


@pytest.mark.parametrize("bad", [
    dict(max_tokens=0), dict(max_tokens=129), dict(temperature=float("nan")), dict(temperature=6.0),
    dict(top_p=0.0), dict(top_k=1001), dict(seed=2**32), dict(seed=-1),
])
def test_opening_limits(bad: dict[str, object]) -> None:
    with pytest.raises(TxError) as e:
        opening(**bad).encode()
    assert e.value.code == Code.INVALID_FIELD


def test_opening_message_limits() -> None:
    op = opening()
    for msgs in [(), tuple(ChatMessage("user", "q") for _ in range(5)), (ChatMessage("user", "x" * 4097),),
                 (ChatMessage("user", "q"), ChatMessage("assistant", "a")), (ChatMessage("robot", "q"),),
                 (ChatMessage("user", "   "),)]:
        with pytest.raises(TxError):
            dataclasses.replace(op, messages=msgs).encode()
    ok = dataclasses.replace(op, messages=(ChatMessage("system", "be brief"), ChatMessage("user", "x" * 4096)))
    assert at.Opening.decode(ok.encode()) == ok


def test_opening_strict_decode() -> None:
    op = opening()
    wire = op.to_wire()
    for mutate in [
        lambda w: w[:3],
        lambda w: [w[0][:15], *w[1:]],
        lambda w: [w[0], w[1], w[2], [1, 1.0, 0, 32, 7]],  # temperature as int
        lambda w: [w[0], w[1], w[2], [0.7, 1.0, 0, True, 7]],  # bool is not int
        lambda w: [w[0], w[1], [["user", "q", "x"]], w[3]],
    ]:
        with pytest.raises(TxError):
            at.Opening.decode(msgpack.packb(mutate(list(wire)), use_bin_type=True))
    with pytest.raises(TxError):
        at.Opening.decode(op.encode() + b"\x00")  # trailing bytes
    f32 = msgpack.packb(wire, use_bin_type=True, use_single_float=True)
    with pytest.raises(TxError):
        at.Opening.decode(f32)  # not canonical (32-bit floats)


def test_challenge_seal_and_open() -> None:
    keys = [crypto.SigningKey.generate() for _ in range(3)]
    op = opening()
    ch = at.seal_challenge(b"n" * 20, op, [k.public_bytes for k in keys])
    assert ch.commitment == op.commitment() and len(ch.sealed) == 3
    for i, k in enumerate(keys):
        assert ch.open(i, k.private_bytes()) == op
    with pytest.raises(TxError):
        ch.open(0, keys[1].private_bytes())
    with pytest.raises(TxError):
        ch.open(3, keys[0].private_bytes())
    other = at.Challenge(ch.node_id, opening(salt=b"z" * 16).commitment(), ch.sealed)
    with pytest.raises(TxError, match="commitment"):
        other.open(0, keys[0].private_bytes())


# --------------------------------------------------------------------------- transactions


def all_kinds() -> list[at.AuditTx]:
    node = crypto.SigningKey.generate()
    op = opening()
    reply = signed_reply(node, op, [("Paris", [42, 43]), (".", [44])])
    ch = at.seal_challenge(reply.node_id, op, [PK])
    report = at.EpochReport(3, PK, (reply, at.SilentEntry(b"m" * 20, 1, "no reply within 60 s")))
    return [
        at.prove_leader(3, b"h" * 32, SEED),
        at.ChallengeCommit(4, PK, (ch,)),
        report,
        at.Attestation(3, PK, at.report_hash(dataclasses.replace(report, signature=b"\x01" * 64)), (930_000,)),
        at.SilenceConfirm(3, PK, b"m" * 20, False),
        at.SilenceConfirm(3, PK, b"m" * 20, True),
    ]


@pytest.mark.parametrize("i", range(6))
def test_round_trip_every_kind(i: int) -> None:
    tx = all_kinds()[i]
    raw = at.sign_tx(tx, CHAIN, SEED)
    assert raw.startswith(at.AUDIT_TAG)
    got = at.decode_audit_tx(raw, CHAIN)
    if isinstance(tx, at.VrfProof):
        assert got == tx
        assert vrf.verify(PK, vrf.leader_alpha(3, b"h" * 32), tx.proof)
    else:
        assert dataclasses.replace(got, signature=b"") == tx
        assert len(got.signature) == 64  # type: ignore[union-attr]
    assert at.encode_tx(got) == raw


def test_report_entries_and_reply_verification() -> None:
    node = crypto.SigningKey.generate()
    op = opening()
    reply = signed_reply(node, op, [("Paris", [42, 43]), (" is it.", [44, 45])])
    reply.verify(node.public_bytes)
    assert reply.text() == "Paris is it." and reply.token_ids() == (42, 43, 44, 45)
    assert reply.score == 930_000 and reply.raw_score == 410_000
    for altered in [
        dataclasses.replace(reply, chunks=(("Paris", (42, 43)), (" is it!", (44, 45)))),
        dataclasses.replace(reply, chunks=(("Paris", (42, 43)), (" is it.", (44, 46)))),
        dataclasses.replace(reply, chunks=(("Paris", (42, 43)),)),
        dataclasses.replace(reply, opening=opening("What is the capital of Spain?")),
        dataclasses.replace(reply, signed_at_ms=1235),
    ]:
        with pytest.raises(signing.ReplyVerifyError):
            altered.verify(node.public_bytes)
    with pytest.raises(signing.ReplyVerifyError):
        reply.verify(crypto.SigningKey.generate().public_bytes)


def test_signature_checks() -> None:
    for tx in all_kinds()[1:]:
        raw = at.sign_tx(tx, CHAIN, SEED)
        with pytest.raises(TxError) as e:
            at.decode_audit_tx(raw, "another-chain")
        assert e.value.code == Code.BAD_SIGNATURE
        # a flipped signature bit
        bad = raw[:-1] + bytes([raw[-1] ^ 1])
        with pytest.raises(TxError) as e:
            at.decode_audit_tx(bad, CHAIN)
        assert e.value.code == Code.BAD_SIGNATURE
        # signed by another key than the one it names
        other = crypto.SigningKey.generate()
        forged = dataclasses.replace(tx, signature=other.sign(at.signing_bytes(CHAIN, tx.KIND, tx.fields())))
        with pytest.raises(TxError) as e:
            at.decode_audit_tx(at.encode_tx(forged), CHAIN)
        assert e.value.code == Code.BAD_SIGNATURE
        with pytest.raises(ValueError):
            at.sign_tx(tx, CHAIN, other.private_bytes())
    # a signature of one kind does not pass for another with the same fields
    conf = at.SilenceConfirm(3, PK, b"m" * 20, False)
    raw = at.sign_tx(conf, CHAIN, SEED)
    body = msgpack.unpackb(raw[len(at.AUDIT_TAG):])
    assert body[0] == at.KIND_SILENCE


def test_strict_rejects() -> None:
    raw_ok = at.sign_tx(at.SilenceConfirm(3, PK, b"m" * 20, True), CHAIN, SEED)
    body = msgpack.unpackb(raw_ok[len(at.AUDIT_TAG):])

    def enc(fields: list[object]) -> bytes:
        return at.AUDIT_TAG + msgpack.packb(fields, use_bin_type=True)

    cases = [
        b"GTAUDIT2" + raw_ok[8:],  # wrong tag
        raw_ok + b"\x00",  # trailing bytes
        enc([]), enc([9, 1, 2]), enc([True, *body[1:]]),  # kind
        enc(body[:-1]),  # missing field
        enc([body[0], True, *body[2:]]),  # bool epoch
        enc([body[0], -1, *body[2:]]),  # negative epoch
        enc([body[0], body[1], body[2][:31], *body[3:]]),  # short key
        enc([body[0], body[1], body[2], body[3], 1, body[5]]),  # int, not bool
        enc([body[0], body[1], body[2], body[3], body[4], body[5][:63]]),  # short signature
        at.AUDIT_TAG + b"\xc1",  # not msgpack
        at.AUDIT_TAG + msgpack.packb({"a": 1}),  # a map
    ]
    for raw in cases:
        with pytest.raises(TxError):
            at.decode_audit_tx(raw, CHAIN)
    # non-canonical integer encoding (epoch 3 as uint16)
    noncanon = at.AUDIT_TAG + b"\x96" + b"\x05" + b"\xcd\x00\x03" + raw_ok[len(at.AUDIT_TAG) + 3:]
    with pytest.raises(TxError) as e:
        at.decode_audit_tx(noncanon, CHAIN)
    assert e.value.code == Code.MALFORMED


def test_decoded_by_shape() -> None:
    """The body is read by shape: the kind's byte limit before the rest, a value where the schema
    has one, each array bounded before its items (docs/fuzzing.md "Found and fixed")."""
    def enc(fields: list[object]) -> bytes:
        return at.AUDIT_TAG + msgpack.packb(fields, use_bin_type=True)

    sig = b"s" * 64
    cases = [
        (at.AUDIT_TAG + b"\x94\x01" + b"\xc1" * 5000, Code.OVERSIZE, "VRF proof of"),  # limit before the rest
        (enc([5, [3], PK, b"m" * 20, True, sig]), Code.MALFORMED, "where a value belongs"),
        (enc([5, 3, {}, b"m" * 20, True, sig]), Code.MALFORMED, "where a value belongs"),
        (enc([[5], 3]), Code.MALFORMED, "kind 1-5"),
        (enc([2, 3, PK, 5, sig]), Code.MALFORMED, "challenges: expected an array"),
        (enc([2, 3, PK, [0] * 129, sig]), Code.INVALID_FIELD, "129 items, at most 128"),
        (enc([2, 3, PK, [0] * 300, sig]), Code.MALFORMED, "not strict msgpack"),  # no array is that long
        (enc([2, 3, PK, [[b"n" * 20, b"c" * 32, [["ab"]]]], sig]), Code.MALFORMED, "where a value belongs"),
        (enc([3, 3, PK, [[]], sig]), Code.MALFORMED, "entry 0 is not an array"),
        (enc([3, 3, PK, [[0, b"n" * 20, 0, opening().to_wire(), [["x", [[1]]]], sig, 1, 1, 1, b"n" * 20]], sig]),
         Code.MALFORMED, "where a value belongs"),
        (enc([3, 3, PK, [[0, b"n" * 20, 0, opening().to_wire(), [["x", 1]], sig, 1, 1, 1, b"n" * 20]], sig]),
         Code.MALFORMED, "a chunk is [text, token ids]"),
        (enc([3, 3, PK, [[0, b"n" * 20, 0, [1, 2, 3, 4, 5], [], sig, 1, 1, 1, b"n" * 20]], sig]),
         Code.INVALID_FIELD, "opening: 5 items, at most 4"),
        (enc([4, 3, PK, b"r" * 32, [1, [2]], sig]), Code.MALFORMED, "where a value belongs"),
        (at.AUDIT_TAG + b"\x96\x05\x03", Code.MALFORMED, "OutOfData"),
    ]
    for raw, code, why in cases:
        with pytest.raises(TxError) as e:
            at.decode_audit_tx(raw, CHAIN)
        assert (e.value.code, why in e.value.reason) == (code, True), (raw[:40], e.value.reason)
    wire = opening().to_wire()
    for bad in ([wire[0], wire[1], [[["user"], "q"]], wire[3]], [*wire[:3], [0.7, [1.0], 0, 32, 7]]):
        with pytest.raises(TxError) as e:
            at.Opening.decode(msgpack.packb(bad, use_bin_type=True))
        assert e.value.code == Code.MALFORMED


def test_size_caps() -> None:
    att = at.Attestation(3, PK, b"r" * 32, tuple([1] * (at.MAX_CHALLENGES + 1)))
    with pytest.raises(TxError) as e:
        at.decode_audit_tx(at.sign_tx(att, CHAIN, SEED), CHAIN)
    assert e.value.code in (Code.INVALID_FIELD, Code.OVERSIZE)
    att = at.Attestation(3, PK, b"r" * 32, (SCALE + 1,))
    with pytest.raises(TxError) as e:
        at.decode_audit_tx(at.sign_tx(att, CHAIN, SEED), CHAIN)
    assert e.value.code == Code.INVALID_FIELD
    with pytest.raises(TxError) as e:
        at.decode_audit_tx(at.AUDIT_TAG + b"\x00" * (at.MAX_COMMIT_BYTES + 1), CHAIN)
    assert e.value.code == Code.OVERSIZE
    node = crypto.SigningKey.generate()
    big = signed_reply(node, opening(), [("x" * 100, [1] * 100)] * 3)  # 300 tokens > 256
    with pytest.raises(TxError):
        at.decode_audit_tx(at.sign_tx(at.EpochReport(1, PK, (big,)), CHAIN, SEED), CHAIN)
    silent = at.SilentEntry(b"m" * 20, 0, "x" * 201)
    with pytest.raises(TxError):
        at.decode_audit_tx(at.sign_tx(at.EpochReport(1, PK, (silent,)), CHAIN, SEED), CHAIN)
    empty = dataclasses.replace(big, chunks=())
    with pytest.raises(TxError):
        at.decode_audit_tx(at.sign_tx(at.EpochReport(1, PK, (empty,)), CHAIN, SEED), CHAIN)


def test_report_hash_is_of_the_raw_tx() -> None:
    report = all_kinds()[2]
    assert isinstance(report, at.EpochReport)
    raw = at.sign_tx(report, CHAIN, SEED)
    decoded = at.decode_audit_tx(raw, CHAIN)
    assert isinstance(decoded, at.EpochReport)
    assert at.report_hash(raw) == at.report_hash(decoded) == crypto.sha256(raw)


def test_mutated_transactions_raise_only_tx_errors() -> None:
    """Every byte is hostile: flipped, cut or extended audit transactions decode or raise TxError."""
    import random

    rng = random.Random(14)
    raws = [at.sign_tx(tx, CHAIN, SEED) for tx in all_kinds()]
    for _ in range(3000):
        raw = bytearray(rng.choice(raws))
        for _ in range(rng.randint(1, 4)):
            op = rng.random()
            i = rng.randrange(len(at.AUDIT_TAG), len(raw))
            if op < 0.6:
                raw[i] = rng.randrange(256)
            elif op < 0.8:
                del raw[i:i + rng.randint(1, 8)]
            else:
                raw[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        try:
            at.decode_audit_tx(bytes(raw), CHAIN)
        except TxError:
            pass
