"""The committee's transaction codec (overlay/directory/registration.py): strict decoding, bounds, signatures."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from overlay.directory import registration as tx
from overlay.directory.registration import Code
from overlay.wire import crypto
from overlay.wire.constants import ROLE_MODEL, ROLE_USER
from tests.committee_helpers import CHAIN, Node


def _code(raw: bytes, chain: str = CHAIN) -> Code:
    with pytest.raises(tx.TxError) as info:
        tx.decode_tx(raw, chain)
    assert info.value.reason
    return info.value.code


def test_round_trip_user_model_leave() -> None:
    n = Node()
    t = tx.decode_tx(n.register(), CHAIN)
    assert (t.op, t.seq, t.node_id) == (tx.OP_REGISTER, 1, n.node_id)
    assert t.entry == n.entry()
    m = tx.decode_tx(n.update(ROLE_MODEL, model_id="llama-3-8b", capacity=10), CHAIN)
    assert m.entry is not None and (m.entry.model_id, m.entry.capacity) == ("llama-3-8b", 10)
    leave = tx.decode_tx(n.leave(), CHAIN)
    assert leave.op == tx.OP_LEAVE and leave.entry is None and leave.seq == 3


def test_signature_binds_the_chain_and_the_body() -> None:
    n = Node()
    raw = n.register()
    assert _code(raw, "another-chain") == Code.BAD_SIGNATURE
    body, sig = msgpack.unpackb(raw)
    fields = msgpack.unpackb(body)
    fields[2] = 99  # bump the seq without re-signing
    forged = msgpack.packb([msgpack.packb(fields, use_bin_type=True), sig], use_bin_type=True)
    assert _code(forged) == Code.BAD_SIGNATURE
    other = crypto.SigningKey.generate()  # a valid signature by another key over the same body
    stolen = msgpack.packb([body, other.sign(tx.signing_bytes(CHAIN, body))], use_bin_type=True)
    assert _code(stolen) == Code.BAD_SIGNATURE


def test_unsigned_and_short_signatures() -> None:
    body, _ = msgpack.unpackb(Node().register())
    assert _code(msgpack.packb([body, b""], use_bin_type=True)) == Code.UNSIGNED
    assert _code(msgpack.packb([body, b"\x01" * 10], use_bin_type=True)) == Code.BAD_SIGNATURE


def test_oversize_malformed_and_version() -> None:
    assert _code(b"\x00" * (tx.MAX_TX_BYTES + 1)) == Code.OVERSIZE
    assert _code(b"") == Code.MALFORMED
    assert _code(b"\xc1") == Code.MALFORMED
    raw = Node().register()
    assert _code(raw + b"\x00") == Code.MALFORMED  # trailing bytes
    assert _code(msgpack.packb([1, 2])) == Code.MALFORMED
    assert _code(msgpack.packb({"a": 1})) == Code.MALFORMED
    n = Node()
    body = msgpack.packb([1, tx.OP_LEAVE, 1, n.key.public_bytes, None], use_bin_type=True)  # the old format
    assert _code(msgpack.packb([body, n.key.sign(tx.signing_bytes(CHAIN, body))], use_bin_type=True)) \
        == Code.UNSUPPORTED_VERSION


def test_non_canonical_encodings_are_refused() -> None:
    n = Node()
    body, sig = msgpack.unpackb(n.register())
    # bin 32 header where bin 8 is canonical, same bytes inside
    outer = b"\x92" + b"\xc6" + len(body).to_bytes(4, "big") + body + b"\xc4\x40" + sig
    assert _code(outer) == Code.MALFORMED
    # a body whose seq is a uint64 instead of a fixint, signed correctly
    fields = msgpack.unpackb(body)
    packed_head = msgpack.packb(fields[:2])[1:]  # fixarray header stripped
    odd = b"\x96" + packed_head + b"\xcf" + (1).to_bytes(8, "big") + b"".join(
        msgpack.packb(f, use_bin_type=True) for f in fields[3:])
    assert msgpack.unpackb(odd) == fields
    signed = msgpack.packb([odd, n.key.sign(tx.signing_bytes(CHAIN, odd))], use_bin_type=True)
    assert _code(signed) == Code.MALFORMED


@pytest.mark.parametrize("kw, why", [
    ({"address": "127.0.0.1"}, "IP:port"),
    ({"address": "127.0.0.1:0"}, "port"),
    ({"address": "127.0.0.1:070"}, "port"),
    ({"address": "bad host:1"}, "host"),
    ({"address": "[zz::1]:1"}, "IP literal"),
    ({"address": "node.example:9000"}, "DNS names"),
    ({"address": "198.51.100.7.nip.io:9000"}, "DNS names"),
    ({"address": "[::ffff:198.51.100.7]:9000"}, "IPv4-mapped"),
    ({"address": "[2001:DB8::7]:9000"}, "canonically"),
    ({"address": "[2001:db8:0::7]:9000"}, "canonically"),
    ({"address": "2001:db8::7:9000"}, "brackets"),
    ({"address": "[198.51.100.7]:9000"}, "IP literal"),
    ({"address": "198.051.100.7:9000"}, "IP literal"),
    ({"address": "a" * 300 + ":1"}, "over"),
    ({"region": ""}, "region"),
    ({"region": "EU"}, "region"),
    ({"region": "x" * 33}, "region"),
])
def test_entry_field_bounds(kw: dict[str, str], why: str) -> None:
    with pytest.raises(tx.TxError, match=why) as info:
        Node().register(**kw)  # type: ignore[arg-type]
    assert info.value.code == Code.INVALID_FIELD


@pytest.mark.parametrize("model_id, capacity", [("m", 0), ("m", 11), ("", 5), ("has space", 5), ("x" * 129, 5)])
def test_model_fields(model_id: str, capacity: int) -> None:
    n = Node()
    e = tx.Entry(ROLE_MODEL, n.x25519, "127.0.0.1:1", "eu", model_id, capacity)
    with pytest.raises(tx.TxError) as info:
        tx.check_entry(e)
    assert info.value.code == Code.INVALID_FIELD


def test_user_carries_no_model() -> None:
    with pytest.raises(tx.TxError, match="user node"):
        tx.check_entry(tx.Entry(ROLE_USER, b"x" * 32, "127.0.0.1:1", "eu", "m", 3))


def test_field_bounds_are_checked_on_decode_too() -> None:
    n = Node()
    fields = [tx.TX_VERSION, tx.OP_REGISTER, 1, n.key.public_bytes,
              [ROLE_MODEL, n.x25519, "127.0.0.1:1", "eu", "m", 11], b""]
    body = msgpack.packb(fields, use_bin_type=True)
    raw = msgpack.packb([body, n.key.sign(tx.signing_bytes(CHAIN, body))], use_bin_type=True)
    assert _code(raw) == Code.INVALID_FIELD


@settings(max_examples=400)
@given(st.binary(max_size=tx.MAX_TX_BYTES + 8))
def test_random_bytes_never_decode_and_never_crash(data: bytes) -> None:
    with pytest.raises(tx.TxError):
        tx.decode_tx(data, CHAIN)


@settings(max_examples=200)
@given(st.data())
def test_mutated_transactions_never_crash(data: st.DataObject) -> None:
    raw = bytearray(Node().register(ROLE_MODEL))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    try:
        tx.decode_tx(bytes(raw), CHAIN)
    except tx.TxError:
        pass
