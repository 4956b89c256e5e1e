"""Audit transactions (verifier/audit/tx.py, decision 0013) and the sealed-box primitives (overlay/wire/crypto.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgpack
import pytest

from overlay.anon import signing
from overlay.directory.registration import Code, TxError
from overlay.wire import crypto
from overlay.wire.identity import node_id_of
from overlay.wire.messages import ChatMessage, SamplingParams
from verifier.audit import tx as at

CHAIN = "audit-test"
SEED = bytes(range(32))
PK = crypto.SigningKey.from_bytes(SEED).public_bytes


def opening(question: str = "What is the capital of France?", salt: bytes = b"s" * 16, **params: Any) -> at.Opening:
    p: dict[str, Any] = dict(temperature=0.7, top_p=1.0, top_k=0, max_tokens=32, seed=7)
    p.update(params)
    return at.Opening(salt, "smollm2-135m-instruct", (ChatMessage("user", question),), SamplingParams(**p))


def signed_reply(node_key: crypto.SigningKey, op: at.Opening, chunks: list[tuple[str, list[int]]]) -> at.ReportEntry:
    node_id = node_id_of(node_key.public_bytes)
    signer = signing.ReplySigner(op.reply_digest(node_id, 2), op.model, node_id)
    sig = b""
    for i, (text, ids) in enumerate(chunks):
        _, sig = signer.add(text, ids, i == len(chunks) - 1, 1234, node_key.sign)
    return at.ReportEntry(node_id, op, at.reply_outcome(node_id, chunks, sig, 1234, 0.93, tries=2))


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
    assert op.digest() == signing.request_digest(op.request(), bytes(20))  # the content the commitment binds
    # each try has its own request id, which the reply signs (a node answers an id once)
    assert len({op.request_id(t) for t in (1, 2, 3)}) == 3 and len(op.request_id(1)) == 16
    node = b"n" * 20
    assert op.reply_digest(node, 2) == signing.request_digest(op.request(request_id=op.request_id(2)), node)
    assert op.reply_digest(node, 1) != op.reply_digest(node, 2) != op.digest()
    assert op.reply_digest(node) != op.reply_digest(b"m" * 20)  # a reply answers the node addressed
    same = opening("  what IS the   capital of\tfrance? ", salt=b"x" * 16)
    assert same.prompt_key() == op.prompt_key()
    assert opening("What is the capital of Spain?").prompt_key() != op.prompt_key()
    assert op.request().continuation == "" and op.request().return_paths == ()


@pytest.mark.parametrize("bad", [
    dict(max_tokens=0), dict(max_tokens=1025), dict(temperature=float("nan")), dict(temperature=6.0),
    dict(top_p=0.0), dict(top_k=1001), dict(seed=2**32), dict(seed=-1),
])
def test_opening_limits(bad: dict[str, Any]) -> None:
    with pytest.raises(TxError) as e:
        opening(**bad).encode()
    assert e.value.code == Code.INVALID_FIELD


def test_opening_message_limits() -> None:
    op = opening()
    for msgs in [(), tuple(ChatMessage("user", f"q{i}") for i in range(at.MAX_MESSAGES + 1)), (ChatMessage("user", "x" * 8193),),
                 (ChatMessage("user", "q"), ChatMessage("assistant", "a")), (ChatMessage("robot", "q"),),
                 (ChatMessage("user", "   "),)]:
        with pytest.raises(TxError):
            dataclasses.replace(op, messages=msgs).encode()
    ok = dataclasses.replace(op, messages=(ChatMessage("system", "be brief"), ChatMessage("user", "hi"),
                                           ChatMessage("assistant", "Hello!"), ChatMessage("user", "x" * 8192)))
    assert at.Opening.decode(ok.encode()) == ok  # a user's transcript carries its conversation's replies
    with pytest.raises(TxError, match="script"):
        ok.check_script()  # a challenge does not (decision 0025)


@pytest.mark.parametrize("msgs", [
    (ChatMessage("system", "s"), ChatMessage("user", "hi"), ChatMessage("assistant", "Hello!"),
     ChatMessage("user", "more")),  # a donor's history: the node's own replies take its place
    (ChatMessage("user", "hi"), ChatMessage("system", "s"), ChatMessage("user", "more")),  # system after a turn
    tuple(ChatMessage("user", f"turn {i}") for i in range(at.MAX_TURNS + 1)),
    (ChatMessage("user", "hi"), ChatMessage("user", " ")),
    (ChatMessage("user", "go on"), ChatMessage("user", "Go  on ")),  # a repeated turn (normalised)
])
def test_a_challenge_is_a_script_of_system_messages_then_user_turns(msgs: tuple[ChatMessage, ...]) -> None:
    """Decision 0025: a challenge's opening holds no assistant message; its turns are replayed."""
    with pytest.raises(TxError, match="challenge"):
        dataclasses.replace(opening(), messages=msgs).check_script()


def test_a_scripts_turns_are_sent_with_the_nodes_own_replies_in_place() -> None:
    script = dataclasses.replace(opening(), messages=(ChatMessage("system", "be brief"), ChatMessage("user", "a?"),
                                                      ChatMessage("user", "b?"), ChatMessage("user", "c?")))
    script.check_script()
    assert script.turns() == 3
    assert script.turn_messages(0) == (ChatMessage("system", "be brief"), ChatMessage("user", "a?"))
    assert script.turn_messages(2, ["A", "B"]) == (
        ChatMessage("system", "be brief"), ChatMessage("user", "a?"), ChatMessage("assistant", "A"),
        ChatMessage("user", "b?"), ChatMessage("assistant", "B"), ChatMessage("user", "c?"))
    for turn, replies in [(1, []), (3, ["A", "B", "C"]), (-1, [])]:
        with pytest.raises(ValueError):
            script.turn_messages(turn, replies)
    # every turn and try has its own request id; a one-turn script's are the challenge's as before
    ids = {script.request_id(t, turn) for t in (1, 2, 3) for turn in (0, 1, 2)}
    assert len(ids) == 9
    one = opening()
    assert one.reply_digest(b"\x01" * 20, 2) == signing.request_digest(one.request(one.request_id(2)), b"\x01" * 20)
    # the replies in place are bound: another reply text, another digest
    assert script.reply_digest(b"\x01" * 20, 1, 2, ["A", "B"]) != script.reply_digest(b"\x01" * 20, 1, 2, ["A", "b"])
    assert len(set(script.prompt_keys())) == 3 and script.prompt_key() == script.prompt_keys()[0]


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


# --------------------------------------------------------------------------- transactions


def all_kinds() -> list[at.AuditTx]:
    node = crypto.SigningKey.generate()
    op = opening()
    entry = signed_reply(node, op, [("Paris", [42, 43]), (".", [44])])
    failed = at.ReportEntry(b"m" * 20, opening("Another question?"), at.FailOutcome("busy", 3))
    report = at.AuditReport(3, PK, b"s" * 16, (entry, failed))
    return [
        at.PlanCommit(3, PK, ("a-model", "smollm2-135m-instruct"), report.plan_hash()),
        report,
        at.AuditReport(3, PK, b"t" * 16, ()),
    ]


@pytest.mark.parametrize("i", range(3))
def test_round_trip_every_kind(i: int) -> None:
    tx = all_kinds()[i]
    raw = at.sign_tx(tx, CHAIN, SEED)
    assert raw.startswith(at.AUDIT_TAG)
    got = at.decode_audit_tx(raw, CHAIN)
    assert dataclasses.replace(got, signature=b"") == tx
    assert len(got.signature) == 64
    assert at.encode_tx(got) == raw


def test_the_plan_hash_binds_salt_nodes_and_openings() -> None:
    report = all_kinds()[1]
    assert isinstance(report, at.AuditReport)
    h = report.plan_hash()
    assert h == at.plan_hash(report.salt, [(e.node_id, e.opening.commitment()) for e in report.entries])
    assert dataclasses.replace(report, salt=b"x" * 16).plan_hash() != h
    assert dataclasses.replace(report, entries=report.entries[::-1]).plan_hash() != h
    other = dataclasses.replace(report.entries[0], opening=opening(salt=b"q" * 16))
    assert dataclasses.replace(report, entries=(other, report.entries[1])).plan_hash() != h
    # the outcome is not part of the plan: it is what came back
    assert dataclasses.replace(report, entries=(dataclasses.replace(report.entries[0], outcome=at.FailOutcome(
        "silent")), report.entries[1])).plan_hash() == h


def test_report_entries_and_reply_verification() -> None:
    node = crypto.SigningKey.generate()
    op = opening()
    entry = signed_reply(node, op, [("Paris", [42, 43]), (" is it.", [44, 45])])
    entry.verify(node.public_bytes)
    out = entry.outcome
    assert isinstance(out, at.ReplyOutcome)
    assert out.token_ids() == (42, 43, 44, 45) and out.score == 930_000 and out.tries == 2
    for altered in [
        dataclasses.replace(entry, outcome=dataclasses.replace(out, chunks=(("Paris", (42, 43)), (" is it!", (44, 45))))),
        dataclasses.replace(entry, outcome=dataclasses.replace(out, chunks=(("Paris", (42, 43)), (" is it.", (44, 46))))),
        dataclasses.replace(entry, outcome=dataclasses.replace(out, chunks=(("Paris", (42, 43)),))),
        dataclasses.replace(entry, opening=opening("What is the capital of Spain?")),
        dataclasses.replace(entry, outcome=dataclasses.replace(out, signed_at_ms=1235)),
        dataclasses.replace(entry, outcome=dataclasses.replace(out, served_by=b"x" * 20)),
    ]:
        with pytest.raises(signing.ReplyVerifyError):
            altered.verify(node.public_bytes)
    with pytest.raises(signing.ReplyVerifyError):
        entry.verify(crypto.SigningKey.generate().public_bytes)
    with pytest.raises(ValueError):
        at.ReportEntry(b"m" * 20, op, at.FailOutcome("silent")).verify(node.public_bytes)


def test_signature_checks() -> None:
    for tx in all_kinds():
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
    # the kind is signed: a commit's signature does not pass for a report of the same fields
    commit = all_kinds()[0]
    raw = at.sign_tx(commit, CHAIN, SEED)
    body = msgpack.unpackb(raw[len(at.AUDIT_TAG):])
    assert body[0] == at.KIND_COMMIT
    assert at.signing_bytes(CHAIN, at.KIND_COMMIT, [1]) != at.signing_bytes(CHAIN, at.KIND_REPORT, [1])


def test_strict_rejects() -> None:
    raw_ok = at.sign_tx(all_kinds()[0], CHAIN, SEED)
    body = msgpack.unpackb(raw_ok[len(at.AUDIT_TAG):])

    def enc(fields: list[object]) -> bytes:
        body: bytes = msgpack.packb(fields, use_bin_type=True)
        return at.AUDIT_TAG + body

    cases = [
        b"GTAUDIT1" + raw_ok[8:],  # the old tag
        raw_ok + b"\x00",  # trailing bytes
        enc([]), enc([9, 1, 2]), enc([True, *body[1:]]),  # kind
        enc(body[:-1]),  # missing field
        enc([body[0], True, *body[2:]]),  # bool epoch
        enc([body[0], -1, *body[2:]]),  # negative epoch
        enc([body[0], body[1], body[2][:31], *body[3:]]),  # short key
        enc([body[0], body[1], body[2], [1], *body[4:]]),  # a model that is not a string
        enc([body[0], body[1], body[2], ["m"] * 9, *body[4:]]),  # too many models
        enc([body[0], body[1], body[2], body[3], body[4][:31], body[5]]),  # short plan hash
        enc([body[0], body[1], body[2], body[3], body[4], body[5][:63]]),  # short signature
        at.AUDIT_TAG + b"\xc1",  # not msgpack
        at.AUDIT_TAG + msgpack.packb({"a": 1}),  # a map
    ]
    for raw in cases:
        with pytest.raises(TxError):
            at.decode_audit_tx(raw, CHAIN)
    # non-canonical integer encoding (epoch 3 as uint16)
    noncanon = at.AUDIT_TAG + b"\x96" + b"\x01" + b"\xcd\x00\x03" + raw_ok[len(at.AUDIT_TAG) + 3:]
    with pytest.raises(TxError) as e:
        at.decode_audit_tx(noncanon, CHAIN)
    assert e.value.code == Code.MALFORMED


def test_decoded_by_shape() -> None:
    """The body is read by shape with the wire codec's ShapeReader: the kind's byte limit before
    the rest, a value where the schema has one, each array bounded before its items."""
    def enc(fields: list[object]) -> bytes:
        body: bytes = msgpack.packb(fields, use_bin_type=True)
        return at.AUDIT_TAG + body

    sig = b"s" * 64
    salt = b"s" * 16
    w = opening().to_wire()
    reply = [0, b"n" * 20, [["x", [1]]], sig, 1, 1, 1]
    cases = [
        (at.AUDIT_TAG + b"\x96\x01" + b"\xc1" * 5000, Code.OVERSIZE, "plan commit of"),  # limit before the rest
        (enc([1, [3], PK, ["m"], b"h" * 32, sig]), Code.MALFORMED, "value"),
        (enc([1, 3, {}, ["m"], b"h" * 32, sig]), Code.MALFORMED, "expected 32 bytes"),
        (enc([[1], 3]), Code.MALFORMED, "expected a value, got an array"),
        (enc([2, 3, PK, salt, 5, sig]), Code.MALFORMED, "expected array"),
        (enc([2, 3, PK, salt, [0] * 129, sig]), Code.INVALID_FIELD, "129 items, at most 128"),
        (enc([2, 3, PK, salt, [[]], sig]), Code.MALFORMED, "entry 0 is [node_id, opening, outcome, [earlier reply, ...]]"),
        (enc([2, 3, PK, salt, [[b"n" * 20, w, [0, b"n" * 20, [["x", [[1]]]], sig, 1, 1, 1], []]], sig]),
         Code.MALFORMED, "not strict msgpack"),  # an array among token ids: refused by the unpacker
        (enc([2, 3, PK, salt, [[b"n" * 20, w, [0, b"n" * 20, [["x", 1]], sig, 1, 1, 1], []]], sig]),
         Code.MALFORMED, "expected array"),
        (enc([2, 3, PK, salt, [[b"n" * 20, [1, 2, 3, 4, 5], reply, []]], sig]), Code.INVALID_FIELD,
         "opening: 5 items, at most 4"),
        (enc([2, 3, PK, salt, [[b"n" * 20, w, [1, "asleep", 1], []]], sig]), Code.INVALID_FIELD, "failure kind"),
        (enc([2, 3, PK, salt, [[b"n" * 20, w, [1, "busy", 4], []]], sig]), Code.INVALID_FIELD, "tries"),
        (enc([2, 3, PK, salt, [[b"n" * 20, w, [0, b"n" * 20, [["x", [1]]], sig, 1, 1_000_001, 1], []]], sig]),
         Code.INVALID_FIELD, "score"),
        (enc([2, 3, PK, salt, [[b"n" * 20, w, [0, b"n" * 20, [], sig, 1, 1, 1], []]], sig]),
         Code.INVALID_FIELD, "at least one chunk"),
        (enc([2, 3, PK, salt, [[b"n" * 20, w, reply, [reply] * at.MAX_TURNS]], sig]), Code.INVALID_FIELD,
         f"earlier replies: {at.MAX_TURNS} items, at most {at.MAX_TURNS - 1}"),
        (enc([2, 3, PK, salt, [[b"n" * 20, w, reply, [[1, "busy", 1]]]], sig]), Code.INVALID_FIELD,
         "an earlier turn's outcome is a reply"),
        (enc([2, 3, PK, salt, [[b"n" * 20, w, reply, [reply]]], sig]), Code.INVALID_FIELD,
         "1 earlier replies to a script of 1 turns"),
        (at.AUDIT_TAG + b"\x96\x02\x03", Code.MALFORMED, "OutOfData"),
    ]
    for raw, code, why in cases:
        with pytest.raises(TxError) as e:
            at.decode_audit_tx(raw, CHAIN)
        assert (e.value.code, why in e.value.reason) == (code, True), (raw[:40], e.value.reason)
    for bad in ([w[0], w[1], [[["user"], "q"]], w[3]], [*w[:3], [0.7, [1.0], 0, 32, 7]]):
        with pytest.raises(TxError) as e:
            at.Opening.decode(msgpack.packb(bad, use_bin_type=True))
        assert e.value.code == Code.MALFORMED


def test_size_caps() -> None:
    with pytest.raises(TxError) as e:
        at.decode_audit_tx(at.AUDIT_TAG + b"\x00" * (at.MAX_REPORT_BYTES + 1), CHAIN)
    assert e.value.code == Code.OVERSIZE
    node = crypto.SigningKey.generate()
    big = signed_reply(node, opening(), [("x" * 10, [1] * 700)] * 3)  # 2,100 tokens > 2,048
    with pytest.raises(TxError) as e:
        at.decode_audit_tx(at.sign_tx(at.AuditReport(1, PK, b"s" * 16, (big,)), CHAIN, SEED), CHAIN)
    assert "reply tokens" in e.value.reason


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
