"""The donation codec (overlay/directory/donation.py; decision 0013 §4): the one format the user's client
writes and the verifier's pool reads. The bytes are pinned here; decoding is strict, and every
refusal is a DonationError with a reason."""

from __future__ import annotations

import msgpack
import pytest

from overlay.directory import donation as dn
from overlay.wire import crypto
from overlay.wire.identity import Identity
from overlay.wire.messages import ChatMessage, SamplingParams

KEY = crypto.SigningKey.from_bytes(b"\x07" * 32)
DONOR = b"\x01" * 20
MESSAGES = (ChatMessage("user", "hi"),)
PARAMS = SamplingParams(temperature=0.5, top_p=1.0, top_k=0, max_tokens=16, seed=None)

SEEN = (b"\x02" * 20, b"\x03" * 20)
# msgpack([donor, "m", [["user", "hi"]], [0.5, 1.0, 0, 16, nil], [seen_by...]]), byte by byte
BODY = (b"\xc4\x14" + DONOR + b"\xa1m" + b"\x91\x92\xa4user\xa2hi"
        + b"\x95\xcb\x3f\xe0\x00\x00\x00\x00\x00\x00\xcb\x3f\xf0\x00\x00\x00\x00\x00\x00\x00\x10\xc0"
        + b"\x92\xc4\x14" + SEEN[0] + b"\xc4\x14" + SEEN[1])


def _plain(*fields: object) -> bytes:
    out: bytes = msgpack.packb(list(fields), use_bin_type=True)
    return out


def _fields() -> list[object]:
    fields: list[object] = msgpack.unpackb(dn.encode(KEY, DONOR, "m", MESSAGES, PARAMS, SEEN), raw=False)
    return fields


def test_the_signing_bytes_and_the_plaintext_are_pinned() -> None:
    d = dn.Donation(DONOR, "m", MESSAGES, PARAMS, SEEN)
    assert dn.DONATION_VERSION == 2 and dn.MAX_DONATION_BYTES == 16 * 1024 and dn.MAX_SEEN_BY == 16
    assert dn.signing_bytes(d) == b"gentorrent/donation/v2\x00" + b"\x95" + BODY
    sig = KEY.sign(dn.signing_bytes(d))
    # seen_by is written distinct and in ascending order whatever order it is given in
    assert dn.encode(KEY, DONOR, "m", MESSAGES, PARAMS, SEEN[::-1] + SEEN) == b"\x97\x02" + BODY + b"\xc4\x40" + sig


def test_a_donation_round_trips_and_verifies_with_the_donors_key_only() -> None:
    me = Identity.generate()
    turns = (ChatMessage("system", "Be brief."), ChatMessage("user", "Hi"), ChatMessage("assistant", "Hello!"),
             ChatMessage("user", "Why is the sky blue?"))
    params = SamplingParams(temperature=0.2, top_p=0.9, top_k=40, max_tokens=100, seed=-3)
    d, sig = dn.decode(dn.encode(me, me.node_id, "smollm2", turns, params, SEEN))
    assert d == dn.Donation(me.node_id, "smollm2", turns, params, SEEN)
    dn.verify(d, sig, me.ed25519_public)
    with pytest.raises(dn.DonationError, match="not the donor's"):
        dn.verify(d, sig, Identity.generate().ed25519_public)
    for other in (dn.Donation(me.node_id, "other-model", turns, params, SEEN),
                  dn.Donation(me.node_id, "smollm2", turns, params, SEEN[:1])):  # seen_by is signed too
        with pytest.raises(dn.DonationError, match="does not verify"):
            dn.verify(other, sig, me.ed25519_public)
    # sealed to one verifier's key: only that key opens it
    verifier = crypto.SigningKey.generate()
    sealed = dn.seal_donation(verifier.public_bytes, me, me.node_id, "smollm2", turns, params, SEEN)
    assert dn.decode(dn.unseal(verifier.private_bytes(), sealed)) == (d, sig)
    with pytest.raises(dn.DonationError, match="does not open"):
        dn.unseal(crypto.SigningKey.generate().private_bytes(), sealed)
    with pytest.raises(dn.DonationError, match="does not open"):
        dn.unseal(verifier.private_bytes(), sealed[:-1] + bytes([sealed[-1] ^ 1]))


def test_decoding_is_strict() -> None:
    f = _fields()
    good = _plain(*f)
    assert dn.decode(good)[0].params == PARAMS

    def refused(raw: bytes, words: str) -> dn.DonationError:
        with pytest.raises(dn.DonationError) as err:
            dn.decode(raw)
        assert words in err.value.reason, err.value.reason
        return err.value

    refused(good + b"\x00", "msgpack (ExtraData)")  # trailing bytes
    refused(good[:-1], "msgpack")
    refused(b"", "msgpack")
    assert refused(_plain(3, *f[1:]), "version 3").unsupported_version
    assert refused(_plain(1, *f[1:5], f[6]), "version 1").unsupported_version  # version 1: no seen_by
    assert refused(_plain(True, *f[1:]), "version True").unsupported_version  # a bool is no int
    assert not refused(_plain(*f[:6]), "[version, donor").unsupported_version
    assert not refused(_plain(), "[version, donor").unsupported_version
    refused(_plain(*f, b""), "[version, donor")
    refused(msgpack.packb({"v": 1}), "msgpack")  # no maps
    refused(_plain(f[0], bytes(19), *f[2:]), "donor node id")
    refused(_plain(f[0], "\x01" * 20, *f[2:]), "donor node id")  # str where bytes belong
    refused(_plain(*f[:2], "", *f[3:]), "non-empty")
    refused(_plain(*f[:2], b"m", *f[3:]), "non-empty")
    refused(_plain(*f[:3], [], *f[4:]), "messages")
    refused(_plain(*f[:3], [["user"]], *f[4:]), "messages")
    refused(_plain(*f[:3], [["user", b"hi"]], *f[4:]), "messages")
    refused(_plain(*f[:3], [("user", "hi", "x")], *f[4:]), "messages")
    refused(_plain(*f[:4], [0.5, 1.0, 0, 16], *f[5:]), "params")
    refused(_plain(*f[:4], [1, 1.0, 0, 16, None], *f[5:]), "types")  # an int temperature
    refused(_plain(*f[:4], [0.5, 1.0, 0.0, 16, None], *f[5:]), "types")
    refused(_plain(*f[:4], [0.5, 1.0, 0, 16, 1.5], *f[5:]), "types")
    refused(_plain(*f[:4], [0.5, 1.0, False, 16, None], *f[5:]), "types")
    refused(_plain(*f[:5], [SEEN[0], bytes(19)], f[6]), "seen_by a list")
    refused(_plain(*f[:5], b"".join(SEEN), f[6]), "seen_by a list")
    refused(_plain(*f[:5], [bytes([i]) * 20 for i in range(dn.MAX_SEEN_BY + 1)], f[6]), "at most 16")
    refused(_plain(*f[:5], [SEEN[1], SEEN[0]], f[6]), "ascending")
    refused(_plain(*f[:5], [SEEN[0], SEEN[0]], f[6]), "distinct")
    assert dn.decode(_plain(*f[:5], [], f[6]))[0].seen_by == ()
    refused(_plain(*f[:6], bytes(63)), "signature")
    refused(_plain(*f[:6], "x" * 64), "signature")


def test_oversize_fields_are_refused_before_they_are_built() -> None:
    f = _fields()
    many = [["user", "q"]] * (dn.MAX_ITEMS + 1)
    assert len(dn.decode(_plain(*f[:3], many[:dn.MAX_ITEMS], *f[4:]))[0].messages) == dn.MAX_ITEMS
    for raw in (_plain(*f[:3], many, *f[4:]),
                _plain(*f[:3], [["user", "x" * (dn.MAX_DONATION_BYTES + 1)]], *f[4:]),
                _plain(*f[:6], bytes(dn.MAX_DONATION_BYTES + 1))):
        with pytest.raises(dn.DonationError, match="msgpack"):
            dn.decode(raw)


def test_a_conversation_read_by_more_nodes_than_a_donation_names_is_not_donated() -> None:
    many = [bytes([i]) * 20 for i in range(dn.MAX_SEEN_BY + 1)]
    assert dn.seen_by_of(many[:dn.MAX_SEEN_BY] * 2) == tuple(many[:dn.MAX_SEEN_BY])
    with pytest.raises(dn.DonationError, match="17 model nodes"):
        dn.encode(KEY, DONOR, "m", MESSAGES, PARAMS, many)
