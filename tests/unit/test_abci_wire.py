"""ABCI framing (verifier/abci/wire.py): round trips, limits, and hostile bytes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verifier.abci import wire
from verifier.abci.proto.tendermint.abci import types_pb2 as abci


@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_uvarint_round_trip(n: int) -> None:
    enc = wire.encode_uvarint(n)
    assert wire.decode_uvarint(enc) == (n, len(enc))
    assert wire.decode_uvarint(enc[:-1]) is None  # incomplete


def test_uvarint_known_values() -> None:
    assert wire.encode_uvarint(0) == b"\x00"
    assert wire.encode_uvarint(127) == b"\x7f"
    assert wire.encode_uvarint(300) == b"\xac\x02"
    with pytest.raises(ValueError):
        wire.encode_uvarint(-1)


def test_uvarint_rejects_overlong_oversized_and_non_minimal() -> None:
    with pytest.raises(wire.AbciWireError, match="longer than 10"):
        wire.decode_uvarint(b"\xff" * 11)
    with pytest.raises(wire.AbciWireError, match="over 64 bits"):
        wire.decode_uvarint(b"\xff" * 9 + b"\x7f")
    with pytest.raises(wire.AbciWireError, match="non-minimal"):
        wire.decode_uvarint(b"\x80\x00")


def _requests() -> list[abci.Request]:
    return [
        abci.Request(echo=abci.RequestEcho(message="hello")),
        abci.Request(flush=abci.RequestFlush()),
        abci.Request(info=abci.RequestInfo(version="0.38.26", block_version=11, p2p_version=8)),
        abci.Request(check_tx=abci.RequestCheckTx(tx=b"\x00" * 300)),
        abci.Request(finalize_block=abci.RequestFinalizeBlock(txs=[b"a", b"b" * 1000], height=3)),
    ]


@given(st.lists(st.integers(min_value=1, max_value=200), max_size=30))
def test_decoder_round_trip_under_any_chunking(cuts: list[int]) -> None:
    reqs = _requests()
    stream = b"".join(wire.encode_request(r) for r in reqs)
    dec = wire.RequestDecoder()
    got: list[abci.Request] = []
    pos = 0
    for c in [*cuts, len(stream)]:
        dec.feed(stream[pos : pos + c])
        pos += c
        while (r := dec.next_request()) is not None:
            got.append(r)
    assert got == reqs
    assert dec.buffered == 0


def test_decoder_refuses_oversize_before_buffering_it() -> None:
    dec = wire.RequestDecoder(max_message=1000)
    dec.feed(wire.encode_uvarint(1001))
    with pytest.raises(wire.AbciWireError, match=r"outside 1\.\.1000"):
        dec.next_request()


def test_decoder_refuses_empty_and_methodless_requests() -> None:
    dec = wire.RequestDecoder()
    dec.feed(b"\x00")
    with pytest.raises(wire.AbciWireError, match="outside"):
        dec.next_request()
    dec = wire.RequestDecoder()
    dec.feed(wire.frame(b"\x98\x06\x01"))  # a valid protobuf varint field (99) that is no method
    with pytest.raises(wire.AbciWireError, match="names no method"):
        dec.next_request()


def test_decoder_refuses_undecodable_protobuf() -> None:
    dec = wire.RequestDecoder()
    dec.feed(wire.frame(b"\x12\x05ab"))  # field 2 (echo) says 5 bytes, holds 2
    with pytest.raises(wire.AbciWireError, match="undecodable"):
        dec.next_request()


@settings(max_examples=300)
@given(st.binary(max_size=400))
def test_random_bytes_yield_requests_or_a_clear_error(data: bytes) -> None:
    dec = wire.RequestDecoder(max_message=4096)
    dec.feed(data)
    try:
        while (r := dec.next_request()) is not None:
            assert r.WhichOneof("value") is not None
    except wire.AbciWireError as exc:
        assert exc.reason


@given(st.integers(min_value=0, max_value=4))
def test_truncated_stream_waits_for_more(k: int) -> None:
    whole = wire.encode_request(_requests()[k])
    for cut in range(len(whole)):
        dec = wire.RequestDecoder()
        dec.feed(whole[:cut])
        assert dec.next_request() is None
