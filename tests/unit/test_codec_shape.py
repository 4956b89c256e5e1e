"""``codec.decode`` reads a payload by shape: no frame builds more objects than its schema allows.

Unpacking the whole payload before any schema check let a 1.97 MB frame of 65,535 arrays of 27
empty arrays take 116 MiB of Python objects before it was refused (docs/fuzzing.md, "Found and
fixed"). Now an array where a value belongs is refused before it is built, and every array
header is counted against its field's bound before any of its items is read. The memory
figures below are tracemalloc peaks; the bound (4 bytes per payload byte, plus 1 MB) is
generous: refusing costs about one copy of the payload, the unpacker's buffer.
"""

from __future__ import annotations

import tracemalloc
from typing import Any

import msgpack
import pytest

from overlay.wire import codec
from overlay.wire.codec import RemoteProtocolError
from overlay.wire.messages import Echo, PeerStatus, Ping, ReplyChunk

PEER = "badc0ffe"
V = codec.WIRE_VERSION
CODE = {cls: code for code, cls in codec.registered_types().items()}
BOMB: list[Any] = [[[]] * 27] * 65_535  # docs/fuzzing.md: 1,966,053 bytes, 1,834,981 arrays
CLAIMS_4G = b"\xdd\xff\xff\xff\xff"  # an array 32 header announcing 2**32 - 1 items


def pack(obj: Any) -> bytes:
    out: bytes = msgpack.packb(obj, use_bin_type=True)
    return out


def items(*objs: Any) -> bytes:
    """``objs`` packed one after another: the items of an array whose header is written by hand."""
    return b"".join(map(pack, objs))


def reply_fields(token_ids: Any) -> list[Any]:
    """The fields of a :class:`ReplyChunk`, with ``token_ids`` as given."""
    return [b"r" * 16, 0, "", token_ids, True, "", b"n" * 20, b"", b"", 0, 0, 0]


def refuse(payload: bytes) -> tuple[RemoteProtocolError, int]:
    """``codec.decode``'s refusal of ``payload`` and the peak of Python allocations meanwhile."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        with pytest.raises(RemoteProtocolError) as ei:
            codec.decode(payload, peer=PEER)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert ei.value.peer == PEER
    return ei.value, peak


HOSTILE: dict[str, bytes] = {
    "a frame of nested arrays": pack(BOMB),
    "nested arrays as the version": pack([BOMB, CODE[Ping], 1]),
    "nested arrays as the type": pack([V, BOMB, 1]),
    "nested arrays for an int (Ping.nonce)": pack([V, CODE[Ping], BOMB]),
    "nested arrays for bytes (Echo.data)": pack([V, CODE[Echo], 1, BOMB]),
    "nested arrays for token ids (ReplyChunk.token_ids)": pack([V, CODE[ReplyChunk], *reply_fields(BOMB)]),
    "empty arrays for token ids (ReplyChunk.token_ids)":
        pack([V, CODE[ReplyChunk], *reply_fields([[]] * 65_536)]),
    "nested arrays for nested messages' fields (PeerStatus.peers)":
        pack([V, CODE[PeerStatus], b"\0" * 20, 1.0, [[[[]] * 27] * 4] * 4096]),
}


@pytest.mark.parametrize("payload", list(HOSTILE.values()), ids=list(HOSTILE))
def test_arrays_where_the_schema_has_none_cost_no_more_than_the_bytes(payload: bytes) -> None:
    _, peak = refuse(payload)
    assert peak < 4 * len(payload) + 1_000_000, f"refusing {len(payload)} bytes took {peak} bytes"


def test_an_array_where_a_value_belongs_is_refused_naming_the_field() -> None:
    err, _ = refuse(pack([V, CODE[Ping], [1]]))
    assert err.reason == "Ping.nonce: expected a value, got an array"
    # Refused at its header: an array announcing 4 G items where bytes belong costs nothing.
    err, peak = refuse(b"\x94" + items(V, CODE[Echo], 1) + CLAIMS_4G)
    assert err.reason == "Echo.data: expected a value, got an array"
    assert peak < 100_000


def test_frame_header_claiming_4g_items_is_refused_by_its_field_count() -> None:
    err, peak = refuse(CLAIMS_4G + items(V, CODE[Ping]))
    assert err.reason == f"Ping: {2**32 - 3} fields, expected 1"
    assert peak < 100_000


@pytest.mark.parametrize("count", [65_537, 2**32 - 1])
def test_tuple_header_over_its_bound_is_refused_before_its_items(count: int) -> None:
    fields = reply_fields(None)
    token_ids = b"\xdd" + count.to_bytes(4, "big")  # an array 32 header announcing ``count``
    header = bytes([0x90 + 2 + len(fields)])  # a fixarray of the version, the code and the fields
    err, peak = refuse(header + items(V, CODE[ReplyChunk], *fields[:3]) + token_ids + items(*fields[4:]))
    assert err.reason == f"ReplyChunk.token_ids: array of {count} items over the limit 65536"
    assert peak < 100_000


def test_tuple_of_messages_over_its_bound_is_refused_before_its_items() -> None:
    err, _ = refuse(b"\x95" + items(V, CODE[PeerStatus], b"\0" * 20, 1.0) + CLAIMS_4G)
    assert err.reason == f"PeerStatus.peers: array of {2**32 - 1} items over the limit 4096"


def test_nested_message_with_the_wrong_field_count_is_refused() -> None:
    err, _ = refuse(pack([V, CODE[PeerStatus], b"\0" * 20, 1.0, [[b"\0" * 20, "a:1", 0]]]))
    assert err.reason == "PeerStatus.peers: PeerSeen: 3 fields, expected 4"
    one_row = b"\x95" + items(V, CODE[PeerStatus], b"\0" * 20, 1.0) + b"\x91"
    err, peak = refuse(one_row + CLAIMS_4G)  # whose header announces 4 G fields
    assert err.reason == f"PeerStatus.peers: PeerSeen: {2**32 - 1} fields, expected 4"
    assert peak < 100_000


@pytest.mark.parametrize("msg", [
    Ping(nonce=2**64 - 1),
    Echo(nonce=-1, data=b"x" * 300),
    ReplyChunk(request_id=b"r" * 16, seq=3, text="hé", token_ids=(0, 127, 128, 2**32, -1, -(2**63)),
               done=True, error="", node=b"n" * 20, chain=b"c" * 32, signature=b"s" * 64,
               signed_at_ms=1_700_000_000_000, prompt_tokens=5),
], ids=["Ping", "Echo", "ReplyChunk"])
def test_truncated_frame_is_malformed_at_every_cut(msg: Any) -> None:
    payload = codec.encode(msg)
    assert codec.decode(payload) == msg
    for cut in range(len(payload)):
        with pytest.raises(RemoteProtocolError) as ei:
            codec.decode(payload[:cut], peer=PEER)
        assert ei.value.peer == PEER and ei.value.reason.startswith("malformed msgpack"), (cut, ei.value)


def test_non_int_among_token_ids_is_refused() -> None:
    for bad in ([1, 2, "3"], [1, True], [1, 2.0], [1, None], [1, {}], [1, []], [1, [2]]):
        err, _ = refuse(pack([V, CODE[ReplyChunk], *reply_fields(bad)]))
        assert err.reason.startswith(("ReplyChunk.token_ids: expected int", "malformed msgpack")), err
