"""The transcript wire format (overlay/directory/transcripts.py, decision 0015): a donor's signed commit and
its sealed, signed reveal round-trip; every malformed input is refused with a TranscriptError
naming why, and nothing else is ever raised; the limits are a transcript's (decision 0032): every request
a model node serves by default, wider than an audit challenge's."""

from __future__ import annotations

import random

import msgpack
import pytest

from overlay.anon import signing
from overlay.directory import transcripts as wire
from overlay.directory.registration import TxError
from overlay.wire import crypto
from overlay.wire.identity import Identity
from overlay.wire.messages import ChatMessage, SamplingParams
from verifier.audit import tx as at

VERIFIER = crypto.SigningKey.generate()
DONOR = Identity.generate()
NODE = Identity.generate()
MSGS = (ChatMessage("system", "be brief"), ChatMessage("user", "why is the sky blue?"))
PARAMS = SamplingParams(0.7, 1.0, 0, 64, None)


def revealed(**kw: object) -> wire.Revealed:
    base: dict[str, object] = dict(node_id=NODE.node_id, nonce=b"\x01" * 16, model="echo", messages=MSGS,
                                   params=PARAMS, request_id=b"\x02" * 16, served_by=NODE.node_id,
                                   chunks=(("Rayleigh", (5, 6)), (" scattering", (7,))), signature=b"\x03" * 64,
                                   signed_at_ms=1_800_000_000_000)
    base.update(kw)
    return wire.Revealed(**base)  # type: ignore[arg-type]


def commit_raw(value: bytes = b"\x09" * 32, sent_ms: int = 1_800_000_000_000) -> bytes:
    return wire.encode_commit(DONOR, DONOR.node_id, VERIFIER.public_bytes, sent_ms, value)


def test_a_commit_round_trips_and_verifies_with_the_donors_key_only() -> None:
    raw = commit_raw()
    doc = msgpack.unpackb(raw, raw=False)
    assert doc[:5] == [1, DONOR.node_id, VERIFIER.public_bytes, 1_800_000_000_000, b"\x09" * 32]
    # the signature, from the docstring: Ed25519 over the context and msgpack([donor, verifier, sent_ms, value])
    crypto.ed25519_verify(DONOR.ed25519_public, doc[5], b"gentorrent/transcript-commit/v1\x00"
                          + msgpack.packb(doc[1:5], use_bin_type=True))
    c = wire.decode_commit(raw)
    assert (c.donor, c.verifier, c.sent_ms, c.value) == (DONOR.node_id, VERIFIER.public_bytes, 1_800_000_000_000,
                                                         b"\x09" * 32)
    wire.verify_commit(c, DONOR.ed25519_public)
    with pytest.raises(wire.TranscriptError, match="not the donor's"):
        wire.verify_commit(c, Identity.generate().ed25519_public)
    other = wire.decode_commit(msgpack.packb([*doc[:4], b"\x08" * 32, doc[5]], use_bin_type=True))
    with pytest.raises(wire.TranscriptError, match="does not verify"):
        wire.verify_commit(other, DONOR.ed25519_public)


# the longest transcript (decision 0032): 256 messages of 128 KiB in all, max_tokens 4,096, a reply of 8,192
# token ids (each taking 5 bytes) with 4 bytes of text each: it fits in a reveal
LONGEST = revealed(messages=(*[ChatMessage("user", "é" * 256)] * 255,
                             ChatMessage("user", "q" * (wire.TRANSCRIPT_PROMPT_BYTES - 255 * 512))),
                   params=SamplingParams(0.7, 1.0, 0, wire.TRANSCRIPT_MAX_TOKENS, None),
                   chunks=tuple(("abcd" * 512, tuple(range(2**31, 2**31 + 512))) for _ in range(16)))


@pytest.mark.parametrize("body", [revealed(), wire.NoReply(b"\x07" * 32), revealed(chunks=()),
                                  revealed(params=SamplingParams(1.0, 0.5, 40, 1024, 7), messages=MSGS[1:]),
                                  LONGEST])
def test_a_reveal_is_sealed_to_one_verifier_and_round_trips(body: wire.Body) -> None:
    sealed = wire.seal_reveal(VERIFIER.public_bytes, DONOR, DONOR.node_id, body)
    assert len(sealed) <= wire.MAX_REVEAL_BYTES
    r = wire.decode_reveal(wire.unseal(VERIFIER.private_bytes(), sealed))
    assert (r.donor, r.verifier, r.body) == (DONOR.node_id, VERIFIER.public_bytes, body)
    wire.verify_reveal(r, DONOR.ed25519_public)
    with pytest.raises(wire.TranscriptError, match="does not open"):
        wire.unseal(crypto.SigningKey.generate().private_bytes(), sealed)
    with pytest.raises(wire.TranscriptError, match="does not open"):
        wire.unseal(VERIFIER.private_bytes(), sealed[:-1] + bytes([sealed[-1] ^ 1]))


def test_the_revealed_commitment_is_the_one_the_verifiers_book_computes() -> None:
    from verifier.audit.transcripts import transcript_of

    b = revealed()
    made = wire.commitment(b.nonce, b.node_id, wire.committed_digest(b.model, b.messages, b.params, b.request_id,
                                                                     b.node_id))  # the donor's client's
    assert transcript_of(b).commitment() == made
    assert wire.committed_digest(b.model, b.messages, b.params, b.request_id, b.node_id) == signing.request_digest(
        at.Opening(bytes(16), b.model, b.messages, b.params).request(b.request_id), b.node_id)


def _body_wire(**kw: object) -> list[object]:
    return revealed(**kw).wire()


def _reveal_plain(body: object, version: object = 1, tail: bytes = b"") -> bytes:
    raw: bytes = msgpack.packb([version, DONOR.node_id, VERIFIER.public_bytes, body, b"\x00" * 64], use_bin_type=True)
    return raw + tail


GOOD = _body_wire()
BUSY = _body_wire(chunks=())  # decision 0044: [3, ..., served by, signature, signed_at_ms]


def test_a_busy_refusal_is_kind_3_without_chunks_and_never_carries_a_secret() -> None:
    assert BUSY == [wire.BODY_BUSY, *GOOD[1:8], *GOOD[9:]] and revealed(chunks=()).busy and not revealed().busy
    with pytest.raises(ValueError, match="never with a secret"):
        revealed(chunks=(), secret=b"\x05" * 32).wire()


@pytest.mark.parametrize("body, why", [
    ([2, b"\x07" * 32], "its body is"),
    ([0, b"\x07" * 31], "commitment is not 32 bytes"),
    ([True, b"\x07" * 32], "its body is"),
    ([0.0, b"\x07" * 32], "its body is"),
    (GOOD[:10], "its body is"),
    ([*GOOD[:1], b"\x00" * 19, *GOOD[2:]], "node id is not 20"),
    ([*GOOD[:2], b"\x00" * 15, *GOOD[3:]], "nonce is not 16"),
    ([*GOOD[:3], "", *GOOD[4:]], "model is not a string"),
    ([*GOOD[:3], b"echo", *GOOD[4:]], "model is not a string"),
    ([*GOOD[:3], "m" * 129, *GOOD[4:]], "model is not a string"),
    ([*GOOD[:4], [], *GOOD[5:]], "messages has 0 items"),
    ([*GOOD[:4], [["user", "x"]] * (wire.TRANSCRIPT_MAX_MESSAGES + 1), *GOOD[5:]],
     f"messages has {wire.TRANSCRIPT_MAX_MESSAGES + 1} items"),
    ([*GOOD[:4], [["user"]], *GOOD[5:]], "a message is"),
    ([*GOOD[:4], [["user", b"x"]], *GOOD[5:]], "a message is"),
    ([*GOOD[:5], [1, 1.0, 0, 64, None], *GOOD[6:]], "params are of types"),
    ([*GOOD[:5], [0.7, 1.0, 0, 64], *GOOD[6:]], "params are"),
    ([*GOOD[:5], [0.7, 1.0, 0, 64, 1.5], *GOOD[6:]], "params are of types"),
    ([*GOOD[:6], b"\x02" * 15, *GOOD[7:]], "request id is not 16"),
    ([*GOOD[:7], b"\x02" * 21, *GOOD[8:]], "serving node id"),
    ([*GOOD[:8], [], *GOOD[9:]], "chunks has 0 items"),
    ([*GOOD[:8], [["x"]], *GOOD[9:]], "a chunk is"),
    ([*GOOD[:8], [[b"x", [1]]], *GOOD[9:]], "text is not a string"),
    ([*GOOD[:8], [["x", [1.0]]], *GOOD[9:]], "expected int"),
    ([*GOOD[:8], [["x", [-1]]], *GOOD[9:]], "token id is not within"),
    ([*GOOD[:8], [["x", [2**32]]], *GOOD[9:]], "token id is not within"),
    ([*GOOD[:8], [["x", [1] * 8193]], *GOOD[9:]], "over 8192 token ids"),
    ([*GOOD[:8], [["x", []]] * (wire.TRANSCRIPT_MAX_CHUNKS + 1), *GOOD[9:]], "chunks has"),
    ([*GOOD[:8], [["x" * (wire.MAX_CHUNK_TEXT + 1), [1]]], *GOOD[9:]], "text is not a string of at most"),
    ([*GOOD[:8], [["x", [[]]]], *GOOD[9:]], "expected int"),
    ([*GOOD[:9], b"\x03" * 63, *GOOD[10:]], "reply's signature"),
    ([*GOOD[:10], -1], "signed_at_ms"),
    ([*GOOD[:10], "1"], "signed_at_ms"),
    ([*GOOD[:10], [1]], "expected a value"),
    ([wire.BODY_BUSY, *GOOD[1:]], "its body is"),  # a refusal has no chunks
    ([wire.BODY_TRANSCRIPT, *BUSY[1:]], "its body is"),  # a transcript has them
    (BUSY[:9], "its body is"),
    ([*BUSY[:8], b"\x03" * 63, BUSY[9]], "reply's signature"),
])
def test_every_malformed_reveal_body_is_refused_with_a_reason(body: list[object], why: str) -> None:
    with pytest.raises(wire.TranscriptError, match=why):
        wire.decode_reveal(_reveal_plain(body))


def test_reveals_and_commits_of_another_shape_version_or_encoding_are_refused() -> None:
    with pytest.raises(wire.TranscriptError, match="version 2") as e:
        wire.decode_reveal(_reveal_plain(GOOD, version=2))
    assert e.value.unsupported_version
    with pytest.raises(wire.TranscriptError, match="trailing bytes"):
        wire.decode_reveal(_reveal_plain(GOOD, tail=b"\x00"))
    with pytest.raises(wire.TranscriptError, match="canonical"):  # a float32 where the format packs float64
        raw = _reveal_plain(GOOD)
        f64 = msgpack.packb(0.5, use_bin_type=True)
        plain = _reveal_plain(_body_wire(params=SamplingParams(0.5, 1.0, 0, 64, None)))
        wire.decode_reveal(plain.replace(f64, b"\xca" + bytes.fromhex("3f000000"), 1))
    assert wire.decode_reveal(raw).body == revealed()
    with pytest.raises(wire.TranscriptError, match="canonical"):  # an int in 2 bytes where 1 does
        wire.decode_commit(commit_raw().replace(msgpack.packb(1, use_bin_type=True), b"\xcd\x00\x01", 1))
    with pytest.raises(wire.TranscriptError, match="at most 256"):
        wire.decode_commit(b"\x00" * 257)
    with pytest.raises(wire.TranscriptError, match="bytes"):
        wire.decode_commit(bytearray(commit_raw()))  # type: ignore[arg-type]
    with pytest.raises(wire.TranscriptError, match="sealed reveal of"):
        wire.unseal(VERIFIER.private_bytes(), b"\x00" * (wire.MAX_REVEAL_BYTES + 1))
    doc = msgpack.unpackb(commit_raw(), raw=False)
    for bad, why in (([1, *doc[1:5]], "version, donor"), ([1, doc[2], *doc[2:]], "donor node id"),
                     ([*doc[:2], b"k" * 31, *doc[3:]], "verifier key"), ([*doc[:3], -5, *doc[4:]], "sent_ms"),
                     ([*doc[:3], True, *doc[4:]], "sent_ms"), ([*doc[:4], b"v" * 33, doc[5]], "commitment"),
                     ([*doc[:5], b""], "signature")):
        with pytest.raises(wire.TranscriptError, match=why):
            wire.decode_commit(msgpack.packb(bad, use_bin_type=True))


def test_garbage_never_raises_anything_but_transcript_error() -> None:
    rng = random.Random(15)
    seeds = [commit_raw(), _reveal_plain(GOOD), _reveal_plain([0, b"\x07" * 32])]
    for i in range(4000):
        base = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            op = rng.randrange(4)
            if op == 0 and base:
                base[rng.randrange(len(base))] = rng.randrange(256)
            elif op == 1:
                base[rng.randrange(len(base) + 1):rng.randrange(len(base) + 1)] = b""
            elif op == 2:
                base.insert(rng.randrange(len(base) + 1), rng.choice((0x90, 0xDC, 0xC1, 0xCA, 0xC0, 0xFF)))
            else:
                base += bytes(rng.randrange(256) for _ in range(rng.randint(0, 8)))
        data = bytes(base) if i % 50 else bytes(rng.randrange(256) for _ in range(rng.randint(0, 64)))
        for decode in (wire.decode_commit, wire.decode_reveal):
            try:
                decode(data)
            except wire.TranscriptError as exc:
                assert exc.reason
    for nested in (b"\x91" * 10_000 + b"\xc0", b"\xdc\xff\xff" + b"\x90" * 300):
        with pytest.raises(wire.TranscriptError):
            wire.decode_reveal(nested)


def test_the_limits_are_a_transcripts_and_fits_agrees_with_the_transcript_check() -> None:
    assert (wire.MAX_MESSAGES, wire.MAX_CONTENT_BYTES, wire.MIN_TOKENS, wire.MAX_TOKENS, wire.MAX_TEMPERATURE,
            wire.MAX_TOP_K, wire.ROLES, wire.MAX_CHUNKS, wire.MAX_REPLY_TOKENS, wire.MAX_CHUNK_TEXT) == \
        (at.MAX_MESSAGES, at.MAX_CONTENT_BYTES, at.MIN_TOKENS, at.MAX_TOKENS, at.MAX_TEMPERATURE, at.MAX_TOP_K,
         at.ROLES, at.MAX_CHUNKS, at.MAX_REPLY_TOKENS, at.MAX_CHUNK_TEXT)
    rng = random.Random(3)
    cases = 0
    def pick(good: tuple[object, ...], bad: tuple[object, ...]) -> object:
        return rng.choice(good) if rng.random() < 0.9 else rng.choice(bad)

    for _ in range(1000):
        n = int(pick((1, 2, 8, 40), (0, 257)))  # type: ignore[call-overload]
        msgs = tuple(ChatMessage(str(pick(("user", "assistant", "system"), ("tool",))),
                                 str(pick(("hi", "x" * 3000), (" ", "é" * 32_769)))) for _ in range(n))
        p = SamplingParams(pick((0.0, 0.7, 5.0), (5.5, float("nan"), 1)), pick((1.0, 0.5), (0.0, 1.5)),  # type: ignore[arg-type]
                           pick((0, 1000), (1001,)), pick((1, 1024, 4096), (0, 4097)), None)  # type: ignore[arg-type]
        model = str(pick(("echo",), ("", "m" * 129)))
        try:
            at.Opening(bytes(16), model, msgs, p).check(transcript=True)
            ok = True
        except TxError:
            ok = False
        assert (wire.fits(model, msgs, p) is None) == ok, (model, msgs, p)
        cases += ok
    assert cases > 20
    assert wire.fits("echo", MSGS, SamplingParams(0.7, 1.0, 0, 64, 5)) == "the request has a seed"
