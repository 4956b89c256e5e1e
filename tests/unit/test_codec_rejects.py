"""Malformed, oversize, truncated and unknown frames: always RemoteProtocolError, naming the peer.

Property tests throw random bytes and cut valid frames; the corpus below holds
one hand-made frame per way a peer can get it wrong.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from overlay.wire import codec
from overlay.wire.codec import RemoteProtocolError
from overlay.wire.messages import AuthChallenge, AuthProof, Echo, Error, PeerSeen, PeerStatus, Ping, Pong

PEER = "badc0ffe"
V = codec.WIRE_VERSION


def pack(obj: Any) -> bytes:
    data: bytes = msgpack.packb(obj, use_bin_type=True)
    return data


def _status_fields(peers: Any) -> list[Any]:
    return [V, 13, b"\0" * 20, 1.0, peers]


def _unused_code() -> int:
    code = 0xFFFF
    while code in codec.registered_types():
        code -= 1
    return code


# --------------------------------------------------------------------------- corpus

#: (label, payload) — each must be refused by ``codec.decode``.
BAD_PAYLOADS: list[tuple[str, bytes]] = [
    ("empty payload", b""),
    ("wrong version 2", pack([V + 1, 10, 1])),
    ("version 0", pack([0, 10, 1])),
    ("version as str", pack(["1", 10, 1])),
    ("version as bool", pack([True, 10, 1])),
    ("negative version", pack([-1, 10, 1])),
    ("unknown type", pack([V, _unused_code(), 1])),
    ("type as str", pack([V, "10", 1])),
    ("type as bool", pack([V, True])),
    ("type as nil", pack([V, None, 1])),
    ("type beyond 16 bits", pack([V, 0x1_0000 + 10, 1])),
    ("array of one", pack([V])),
    ("empty array", pack([])),
    ("top level int", pack(1)),
    ("top level nil", pack(None)),
    ("top level bytes", pack(b"\x01\x0a")),
    ("map instead of array", pack({"version": V, "type": 10, "nonce": 1})),
    ("map as a field", pack([V, 14, 1, {"a": 1}])),
    ("too few fields", pack([V, 10])),
    ("too many fields", pack([V, 10, 1, 2])),
    ("bool for int", pack([V, 10, True])),
    ("float for int", pack([V, 10, 1.0])),
    ("str for int", pack([V, 10, "1"])),
    ("nil for int", pack([V, 10, None])),
    ("str for bytes", pack([V, 14, 1, "data"])),
    ("bytes for str", pack([V, 4, b"bad-frame", "detail"])),
    ("int for float", pack([*_status_fields([])[:3], 1, []])),
    ("bytes for tuple", pack(_status_fields(b""))),
    ("wrong nested row type", pack(_status_fields([[b"\0" * 20, "a:1", True, 0.0]]))),
    ("nested row too short", pack(_status_fields([[b"\0" * 20, "a:1", 0]]))),
    ("oversize bytes (Echo.data)", pack([V, 14, 1, b"\0" * (64 * 1024 + 1)])),
    ("oversize str (Error.code)", pack([V, 4, "c" * 65, ""])),
    ("oversize str (Error.detail)", pack([V, 4, "bad", "d" * 1025])),
    ("oversize tuple (PeerStatus.peers)",
     pack(_status_fields([[b"\0" * 20, "", 0, 0.0]] * 4097))),
    ("oversize nested str (PeerSeen.address)", pack(_status_fields([[b"\0" * 20, "a" * 257, 0, 0.0]]))),
    ("exact length short (AuthChallenge.nonce)", pack([V, 1, b"\0" * 31])),
    ("exact length long (AuthChallenge.nonce)", pack([V, 1, b"\0" * 33])),
    ("exact length (AuthProof.signature)", pack([V, 2, b"\0" * 32, b"\0" * 32, b"\0" * 63])),
    ("exact length (PeerStatus.node_id)", pack([V, 13, b"\0" * 19, 1.0, []])),
    ("trailing bytes", pack([V, 10, 1]) + b"\x00"),
    ("two messages in one payload", pack([V, 10, 1]) + pack([V, 11, 1])),
    ("truncated", pack([V, 14, 7, b"abcdef"])[:-2]),
    ("ext type field", pack([V, 10, msgpack.ExtType(1, b"\0" * 8)])),
    ("timestamp ext field", pack([V, 10, msgpack.Timestamp(1, 0)])),
    ("empty ext8 field", bytes([0x93, V, 10, 0xC7, 0x00, 0x05])),
    ("ext type top level", pack(msgpack.ExtType(7, b"x"))),
    ("non-utf8 str", bytes([0x94, V, 4, 0xA2, 0xFF, 0xFE, 0xA0])),
    ("lone surrogate str", bytes([0x94, V, 4, 0xA3, 0xED, 0xA0, 0x80, 0xA0])),
    ("reserved byte 0xc1", bytes([0x93, V, 10, 0xC1])),
    ("depth bomb", b"\x91" * 100_000 + b"\x01"),
    ("depth bomb in a field", bytes([0x93, V, 13]) + b"\x91" * 100_000 + b"\xc0"),
    ("array header claims 2^32-1 items", bytes([0xDD, 0xFF, 0xFF, 0xFF, 0xFF, V, 10])),
    ("bin header claims 4 GiB", bytes([0x94, V, 14, 1, 0xC6, 0xFF, 0xFF, 0xFF, 0xFF])),
    ("str header claims 4 GiB", bytes([0x94, V, 4, 0xDB, 0xFF, 0xFF, 0xFF, 0xFF, 0xA0])),
    ("integer above u64", bytes([0x93, V, 10, 0xCF]) + b"\xff" * 7),
    ("payload over the frame limit", pack([V, 14, 1, b"\0" * codec.MAX_FRAME])),
]


@pytest.mark.parametrize(("label", "payload"), BAD_PAYLOADS, ids=[b[0] for b in BAD_PAYLOADS])
def test_bad_payload_is_rejected_naming_the_peer(label: str, payload: bytes) -> None:
    with pytest.raises(RemoteProtocolError) as ei:
        codec.decode(payload, peer=PEER)
    err = ei.value
    assert err.peer == PEER
    assert str(err).startswith(f"peer {PEER}: ")
    assert err.reason
    assert err.evidence == payload[: len(err.evidence)]
    assert len(err.evidence) <= 64


@pytest.mark.parametrize(("label", "payload"), BAD_PAYLOADS, ids=[b[0] for b in BAD_PAYLOADS])
def test_bad_payload_in_a_frame_is_rejected(label: str, payload: bytes) -> None:
    """The same corpus, framed, through the stream splitter."""
    dec = codec.FrameDecoder(peer=PEER)
    dec.feed(len(payload).to_bytes(4, "big") + payload)
    with pytest.raises(RemoteProtocolError) as ei:
        while dec.next_message() is not None:
            pass
        raise AssertionError("decoder wanted more bytes for a complete frame")
    assert ei.value.peer == PEER


def test_specific_reasons() -> None:
    """A few reasons read well enough for an operator scanning logs."""
    cases = {
        "unsupported wire version 2": pack([2, 10, 1]),
        "unknown message type": pack([V, _unused_code(), 1]),
        "Ping: 2 fields, expected 1": pack([V, 10, 1, 2]),
        "Ping.nonce: expected int, got bool": pack([V, 10, True]),
        "Echo.data: bytes of length 65537 over the limit 65536": pack([V, 14, 1, b"\0" * 65537]),
        "AuthChallenge.nonce: bytes of length 31, expected exactly 32": pack([V, 1, b"\0" * 31]),
        "trailing bytes": pack([V, 10, 1]) + b"\0",
        "malformed msgpack": pack({"a": 1}),
    }
    for reason, payload in cases.items():
        with pytest.raises(RemoteProtocolError, match=reason):
            codec.decode(payload, peer=PEER)


# --------------------------------------------------------------------------- frame lengths


@pytest.mark.parametrize("prefix", [b"\0\0\0\0", b"\xff\xff\xff\xff",
                                    (codec.MAX_FRAME + 1).to_bytes(4, "big")],
                         ids=["zero-length", "4GiB", "max+1"])
def test_bad_length_prefix_is_refused_before_buffering(prefix: bytes) -> None:
    dec = codec.FrameDecoder(peer=PEER)
    dec.feed(prefix)
    with pytest.raises(RemoteProtocolError, match="frame length") as ei:
        dec.next_payload()
    assert ei.value.peer == PEER
    assert ei.value.evidence == prefix
    assert dec.buffered == 4  # nothing of the announced frame was waited for


def test_length_prefix_at_the_limit_waits_for_the_body() -> None:
    dec = codec.FrameDecoder(peer=PEER)
    dec.feed(codec.MAX_FRAME.to_bytes(4, "big") + b"\x94")
    assert dec.next_payload() is None


def test_smaller_limit_for_the_handshake() -> None:
    dec = codec.FrameDecoder(max_frame=4096, peer=PEER)
    dec.feed((4097).to_bytes(4, "big"))
    with pytest.raises(RemoteProtocolError, match=r"outside 1\.\.4096"):
        dec.next_payload()


# --------------------------------------------------------------------------- properties

VALID = [
    Ping(nonce=7), Pong(nonce=2**64 - 1), Echo(nonce=-1, data=b"hello"),
    Error(code="bad-frame", detail="ünïcödé"), AuthChallenge(nonce=bytes(range(32))),
    AuthProof(ed25519_public=b"\1" * 32, x25519_public=b"\2" * 32, signature=b"\3" * 64),
    PeerStatus(node_id=b"\4" * 20, uptime_s=1.5,
               peers=(PeerSeen(node_id=b"\5" * 20, address="127.0.0.1:1", rtt_us=-1, last_ok_unix=0.0),)),
]


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=512))
def test_random_payload_raises_only_protocol_errors(data: bytes) -> None:
    try:
        msg = codec.decode(data, peer=PEER)
    except RemoteProtocolError as exc:
        assert exc.peer == PEER
    else:
        # Random bytes can spell a valid message; then it must re-encode to exactly them.
        assert codec.encode(msg) == data


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=8))
def test_random_stream_raises_only_protocol_errors(chunks: list[bytes]) -> None:
    dec = codec.FrameDecoder(peer=PEER)
    try:
        for chunk in chunks:
            dec.feed(chunk)
            while dec.next_message() is not None:
                pass
    except RemoteProtocolError as exc:
        assert exc.peer == PEER
    assert dec.buffered <= sum(map(len, chunks))


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(VALID), st.data())
def test_truncated_payload_is_never_a_message(msg: Any, data: st.DataObject) -> None:
    payload = codec.encode(msg)
    cut = data.draw(st.integers(0, len(payload) - 1))
    with pytest.raises(RemoteProtocolError):
        codec.decode(payload[:cut], peer=PEER)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(VALID), min_size=1, max_size=5), st.data())
def test_frames_split_anywhere_yield_exactly_the_messages(msgs: list[Any], data: st.DataObject) -> None:
    stream = b"".join(codec.frame(m) for m in msgs)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    dec = codec.FrameDecoder(peer=PEER)
    got: list[Any] = []
    prev = 0
    for cut in [*cuts, len(stream)]:
        dec.feed(stream[prev:cut])
        prev = cut
        while (m := dec.next_message()) is not None:
            got.append(m)
    assert got == msgs
    assert dec.buffered == 0


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(VALID), st.data())
def test_truncated_frame_means_need_more(msg: Any, data: st.DataObject) -> None:
    framed = codec.frame(msg)
    cut = data.draw(st.integers(0, len(framed) - 1))
    dec = codec.FrameDecoder(peer=PEER)
    dec.feed(framed[:cut])
    assert dec.next_message() is None
    assert dec.buffered == cut


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(VALID), st.data())
def test_flipped_byte_is_rejected_or_a_well_formed_message(msg: Any, data: st.DataObject) -> None:
    payload = bytearray(codec.encode(msg))
    i = data.draw(st.integers(0, len(payload) - 1))
    payload[i] ^= data.draw(st.integers(1, 255))
    try:
        other = codec.decode(bytes(payload), peer=PEER)
    except RemoteProtocolError:
        return
    assert codec.encode(other) == bytes(payload)


def test_error_with_peer_keeps_evidence() -> None:
    err = RemoteProtocolError("bad", evidence=b"x" * 100)
    named = err.with_peer("abcd")
    assert named.peer == "abcd" and named.evidence == b"x" * 64 and "abcd" in str(named)
    assert named.with_peer("other") is named


@pytest.mark.parametrize("nonce_bytes", [
    b"\xcc\x05",                          # uint8 for a value that fits a fixint
    b"\xcf" + (5).to_bytes(8, "big"),     # uint64
    b"\xd3" + (-1).to_bytes(8, "big", signed=True),  # int64 for -1 (a negative fixint)
])
def test_non_canonical_integer_is_rejected(nonce_bytes: bytes) -> None:
    canonical = codec.encode(Ping(nonce=5))
    header = canonical[: canonical.index(b"\x05", 2)]  # [version, type, ...] up to the nonce
    with pytest.raises(RemoteProtocolError, match="non-canonical"):
        codec.decode(header + nonce_bytes, peer=PEER)


def test_non_canonical_string_header_is_rejected() -> None:
    canonical = codec.encode(Error(code="x", detail="y"))
    i = canonical.index(b"\xa1x")  # fixstr "x"
    widened = canonical[:i] + b"\xd9\x01x" + canonical[i + 2:]  # the same string as str8
    with pytest.raises(RemoteProtocolError, match="non-canonical"):
        codec.decode(widened, peer=PEER)
