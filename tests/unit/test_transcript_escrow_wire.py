"""Version 2 of the transcript wire format (overlay/directory/transcripts.py, decision 0037): the
escrowed body (kind 2, the secret in the nonce's place), the escrow commit with its sealed shares,
the verifiers' acceptances, the certificate and the power it certifies, the node's reveal and the
released shares. Each round-trips and verifies only with the right key; every malformed input is
refused with a TranscriptError naming why, and nothing else is ever raised; the limits, computed
from the escrow's, hold a message at the limits."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nacl import bindings as sodium

from overlay.directory import escrow
from overlay.directory import transcripts as wire
from overlay.wire import crypto
from overlay.wire.identity import Identity
from overlay.wire.messages import ChatMessage, SamplingParams

RNG = random.Random(37)
VERIFIERS = [crypto.SigningKey.generate() for _ in range(4)]
VERIFIER = VERIFIERS[0]
STRANGER = crypto.SigningKey.generate()  # a key no validator holds
DONOR = Identity.generate()
NODE = Identity.generate()
OTHER_NODE = Identity.generate()
MSGS = (ChatMessage("system", "be brief"), ChatMessage("user", "why is the sky blue?"))
PARAMS = SamplingParams(0.7, 1.0, 0, 64, None)
SENT = 1_800_000_000_000
SECRET = escrow.new_secret(RNG)
PLAN = escrow.plan([10, 20, 30, 40])
DEAL = escrow.deal(SECRET, PLAN, RNG)
POINTS_RAW = escrow.encode_commitments(DEAL.commitments)
DIGEST = wire.points_digest(POINTS_RAW)
POWERS = {k.public_bytes: p for k, p in zip(VERIFIERS, (10, 20, 30, 40), strict=True)}


def pack(obj: object) -> bytes:
    out: bytes = msgpack.packb(obj, use_bin_type=True)
    return out


def unpack(raw: bytes) -> Any:
    return msgpack.unpackb(raw, raw=False)


def escrowed(s: int = SECRET, **kw: object) -> wire.Revealed:
    base: dict[str, object] = dict(node_id=NODE.node_id, nonce=escrow.nonce_of(s), model="echo", messages=MSGS,
                                   params=PARAMS, request_id=b"\x02" * 16, served_by=NODE.node_id,
                                   chunks=(("Rayleigh", (5, 6)), (" scattering", (7,))), signature=b"\x03" * 64,
                                   signed_at_ms=SENT + 900, secret=escrow.scalar_bytes(s))
    base.update(kw)
    return wire.Revealed(**base)  # type: ignore[arg-type]


def value_of(b: wire.Revealed) -> bytes:
    """The commitment a donor's client makes of ``b``'s request (with ``b``'s nonce)."""
    return wire.commitment(b.nonce, b.node_id, wire.committed_digest(b.model, b.messages, b.params, b.request_id,
                                                                     b.node_id))


VALUE = value_of(escrowed())


def commit_raw(holder: int = 0, **kw: Any) -> bytes:
    args: dict[str, Any] = dict(signer=DONOR, donor=DONOR.node_id, verifier=VERIFIERS[holder].public_bytes,
                                sent_ms=SENT, value=VALUE, points_raw=POINTS_RAW, shares=DEAL.shares[holder])
    args.update(kw)
    return wire.encode_escrow_commit(**args)


def acceptance_raw(key: crypto.SigningKey = VERIFIER, **kw: Any) -> bytes:
    args: dict[str, Any] = dict(signer=key, verifier=key.public_bytes, donor=DONOR.node_id, value=VALUE,
                                digest=DIGEST, sent_ms=SENT)
    args.update(kw)
    return wire.encode_acceptance(**args)


def certificate_raw(acceptances: list[bytes] | None = None) -> bytes:
    if acceptances is None:
        acceptances = [acceptance_raw(k) for k in VERIFIERS]
    return wire.encode_certificate(DONOR.node_id, VALUE, SENT, POINTS_RAW, acceptances)


def node_reveal_raw(body: wire.Revealed | None = None, signer: Identity = NODE, node_id: bytes | None = None) -> bytes:
    return wire.encode_node_reveal(signer, NODE.node_id if node_id is None else node_id, VERIFIER.public_bytes,
                                   escrowed() if body is None else body)


def released_items(n: int = 3) -> list[wire.ReleasedItem]:
    out = []
    for i in range(n):
        d = escrow.deal(escrow.new_secret(RNG), PLAN, RNG)
        out.append((bytes([0xF0 - i]) * 32, d.commitments, d.shares[i % 4]))
    return out


# --------------------------------------------------------------------------- the escrowed body


def test_an_escrowed_body_carries_the_secret_and_its_nonce_opens_the_commitment() -> None:
    b = escrowed()
    w = b.wire()
    assert w[0] == wire.BODY_ESCROWED == 2 and w[2] == escrow.scalar_bytes(SECRET) and len(w) == 11
    assert dataclasses.replace(b, secret=b"").wire()[:3] == [1, NODE.node_id, b.nonce]  # kind 1 as it was
    sealed = wire.seal_reveal(VERIFIER.public_bytes, DONOR, DONOR.node_id, b)
    r = wire.decode_reveal(wire.unseal(VERIFIER.private_bytes(), sealed))
    assert unpack(wire.unseal(VERIFIER.private_bytes(), sealed))[0] == 1  # the envelope stays version 1
    assert r.body == b
    wire.verify_reveal(r, DONOR.ed25519_public)
    got = r.body
    assert isinstance(got, wire.Revealed)
    assert got.nonce == escrow.nonce_of(escrow.scalar_of(got.secret)) == escrow.nonce_of(SECRET)
    assert value_of(got) == VALUE  # the commitment the donor made with this nonce opens
    assert escrow.opens(DEAL.commitments, escrow.scalar_of(got.secret))
    # the decoder derives the nonce: a body built with another one decodes to the secret's
    lying = dataclasses.replace(b, nonce=b"\x01" * 16)
    plain = wire.encode_reveal(DONOR, DONOR.node_id, VERIFIER.public_bytes, lying)
    assert wire.decode_reveal(plain).body == b


@pytest.mark.parametrize("secret, why", [
    (bytes(32), "not a canonical scalar"),  # 0
    (escrow.L.to_bytes(32, "little"), "not a canonical scalar"),  # L
    ((escrow.L + 5).to_bytes(32, "little"), "not a canonical scalar"),
    (b"\xff" * 32, "not a canonical scalar"),
    (b"\x01" * 31, "secret is not 32 bytes"),
    (b"\x01" * 33, "secret is not 32 bytes"),
    ("x" * 32, "secret is not 32 bytes"),
])
def test_a_secret_that_is_not_a_canonical_scalar_within_1_to_L_is_refused(secret: object, why: str) -> None:
    body = escrowed().wire()
    body[2] = secret
    plain = pack([1, DONOR.node_id, VERIFIER.public_bytes, body, b"\x00" * 64])
    with pytest.raises(wire.TranscriptError, match=why):
        wire.decode_reveal(plain)
    plain = pack([2, NODE.node_id, VERIFIER.public_bytes, body, b"\x00" * 64])
    with pytest.raises(wire.TranscriptError, match=why):
        wire.decode_node_reveal(plain)


def test_the_largest_secret_and_1_are_taken() -> None:
    for s in (1, escrow.L - 1):
        b = escrowed(s)
        got = wire.decode_reveal(wire.encode_reveal(DONOR, DONOR.node_id, VERIFIER.public_bytes, b)).body
        assert got == b and isinstance(got, wire.Revealed) and got.nonce == escrow.nonce_of(s)


# --------------------------------------------------------------------------- the escrow commit


@given(st.binary(min_size=32, max_size=32), st.integers(0, 2**32))
def test_an_escrowed_secret_carries_its_requests_locator_and_is_otherwise_uniform(digest: bytes, seed: int) -> None:
    """Decision 0038: the low 64 bits are the digest's first 8 bytes; the secret is a scalar within
    1..L-1 (it deals and round-trips as any); the 188 bits above differ draw to draw."""
    rng = random.Random(seed)
    a, b = wire.escrowed_secret(digest, rng), wire.escrowed_secret(digest, rng)
    assert wire.secret_locator(a) == wire.secret_locator(b) == wire.locator(digest) == digest[:wire.LOCATOR_LEN]
    assert 0 < a < 2**252 < escrow.L and 0 < b < escrow.L and a != b
    assert escrow.scalar_of(escrow.scalar_bytes(a)) == a and escrow.opens(escrow.deal(a, PLAN, rng).commitments, a)
    assert wire.escrowed_secret(digest, random.Random(seed)) == a  # a test's rng replays; without one, ``secrets``


def test_an_escrowed_secret_is_only_made_for_a_digest() -> None:
    for bad in (b"", b"\x01" * 31, b"\x01" * 33, "x" * 32):
        with pytest.raises(ValueError):
            wire.escrowed_secret(bad)  # type: ignore[arg-type]
    assert wire.escrowed_secret(bytes(32)) != wire.escrowed_secret(bytes(32))  # never 0; drawn from ``secrets``


def test_an_escrow_commit_round_trips_verifies_and_opens_to_the_holders_shares() -> None:
    for holder, key in enumerate(VERIFIERS):
        raw = commit_raw(holder)
        doc = unpack(raw)
        assert doc[:6] == [2, DONOR.node_id, key.public_bytes, SENT, VALUE, POINTS_RAW] and len(doc) == 8
        # the signature, from the docstring
        crypto.ed25519_verify(DONOR.ed25519_public, doc[7], b"gentorrent/transcript-commit/v2\x00" + pack(doc[1:7]))
        c = wire.decode_escrow_commit(raw)
        assert (c.donor, c.verifier, c.sent_ms, c.value, c.points, c.points_raw, c.sealed_shares, c.signature) == (
            DONOR.node_id, key.public_bytes, SENT, VALUE, DEAL.commitments, POINTS_RAW, doc[6], doc[7])
        wire.verify_escrow_commit(c, DONOR.ed25519_public)
        shares = wire.open_shares(key.private_bytes(), c)
        assert shares == DEAL.shares[holder]
        assert escrow.verify_holder(PLAN, holder, c.points, shares)
    c = wire.decode_escrow_commit(commit_raw(1))
    with pytest.raises(wire.TranscriptError, match="do not open"):
        wire.open_shares(VERIFIER.private_bytes(), c)  # sealed to verifier 1
    with pytest.raises(wire.TranscriptError, match="do not open"):
        wire.open_shares(VERIFIERS[1].private_bytes(), dataclasses.replace(
            c, sealed_shares=c.sealed_shares[:-1] + bytes([c.sealed_shares[-1] ^ 1])))
    with pytest.raises(wire.TranscriptError, match="not shares"):
        wire.open_shares(VERIFIER.private_bytes(), dataclasses.replace(
            c, sealed_shares=crypto.seal_to_ed25519(VERIFIER.public_bytes, pack([[2, b"\x00" * 32], [1, b"\x00" * 32]]))))
    with pytest.raises(wire.TranscriptError):
        wire.open_shares(b"\x00" * 31, c)


def test_an_escrow_commit_verifies_with_the_donors_key_only_and_binds_every_field() -> None:
    raw = commit_raw()
    c = wire.decode_escrow_commit(raw)
    with pytest.raises(wire.TranscriptError, match="not the donor's"):
        wire.verify_escrow_commit(c, NODE.ed25519_public)
    with pytest.raises(wire.TranscriptError, match="not the donor's"):
        wire.verify_escrow_commit(c, b"\x00" * 31)
    doc = unpack(raw)
    other_points = escrow.encode_commitments(escrow.deal(SECRET, PLAN, RNG).commitments)
    other_sealed = crypto.seal_to_ed25519(VERIFIER.public_bytes, escrow.encode_shares(DEAL.shares[0]))
    for i, v in ((2, VERIFIERS[1].public_bytes), (3, SENT + 1), (4, b"\x08" * 32), (5, other_points),
                 (6, other_sealed)):
        altered = wire.decode_escrow_commit(pack([*doc[:i], v, *doc[i + 1:]]))
        with pytest.raises(wire.TranscriptError, match="does not verify"):
            wire.verify_escrow_commit(altered, DONOR.ed25519_public)
    # signed by another node's key, naming the donor
    forged = wire.decode_escrow_commit(commit_raw(signer=NODE))
    with pytest.raises(wire.TranscriptError, match="does not verify"):
        wire.verify_escrow_commit(forged, DONOR.ed25519_public)


def _points(n: int) -> tuple[bytes, ...]:
    return tuple(sodium.crypto_scalarmult_ed25519_base_noclamp(escrow.scalar_bytes(i + 1)) for i in range(n))


def test_an_escrow_commit_at_the_limits_fits_and_the_limit_is_the_computed_one() -> None:
    points = escrow.encode_commitments(_points(escrow.MAX_UNITS))
    shares = tuple(escrow.Share(x, escrow.L - 1) for x in range(1, escrow.MAX_UNITS + 1))
    assert len(points) == wire.MAX_POINTS_BYTES
    # x below 128 takes 1 byte, below 256 2, the rest 3 (the limit takes 3 for every x)
    assert len(escrow.encode_shares(shares)) == wire.MAX_SHARES_BYTES - 127 * 2 - 128
    raw = commit_raw(sent_ms=2**63 - 1, points_raw=points, shares=shares)
    assert len(raw) == wire.MAX_ESCROW_COMMIT_BYTES - 127 * 2 - 128
    c = wire.decode_escrow_commit(raw)
    assert len(c.points) == escrow.MAX_UNITS and wire.open_shares(VERIFIER.private_bytes(), c) == shares
    # shares that take 3 bytes each for x fill the limit exactly
    packed = pack([[1024, b"\x00" * 32]] * escrow.MAX_UNITS)
    assert len(packed) == wire.MAX_SHARES_BYTES
    assert len(pack([*unpack(raw)[:6], crypto.seal_to_ed25519(VERIFIER.public_bytes, packed), b"\x00" * 64])) \
        == wire.MAX_ESCROW_COMMIT_BYTES
    # one point more is refused
    with pytest.raises(wire.TranscriptError, match="points"):
        wire.decode_escrow_commit(commit_raw(points_raw=pack(list(_points(escrow.MAX_UNITS + 1)))))
    with pytest.raises(wire.TranscriptError, match="at most"):
        wire.decode_escrow_commit(raw + b"\x00" * (wire.MAX_ESCROW_COMMIT_BYTES - len(raw) + 1))


def test_the_points_digest_is_personalised_blake2b() -> None:
    import hashlib

    assert wire.points_digest(POINTS_RAW) == hashlib.blake2b(POINTS_RAW, digest_size=32,
                                                             person=b"gt-escrow-pts").digest()


# --------------------------------------------------------------------------- acceptances and the certificate


def test_an_acceptance_round_trips_and_verifies_with_the_key_it_names_only() -> None:
    raw = acceptance_raw()
    doc = unpack(raw)
    assert doc[:6] == [2, VERIFIER.public_bytes, DONOR.node_id, VALUE, DIGEST, SENT] and len(doc) == 7
    crypto.ed25519_verify(VERIFIER.public_bytes, doc[6], b"gentorrent/transcript-accept/v2\x00" + pack(doc[1:6]))
    a = wire.decode_acceptance(raw)
    assert (a.verifier, a.donor, a.value, a.digest, a.sent_ms, a.signature) == (*doc[1:],)
    assert len(raw) <= wire.MAX_ACCEPTANCE_BYTES
    assert len(acceptance_raw(sent_ms=2**63 - 1)) == wire.MAX_ACCEPTANCE_BYTES
    wire.verify_acceptance(a, VERIFIER.public_bytes)
    with pytest.raises(wire.TranscriptError, match="not the one the acceptance names"):
        wire.verify_acceptance(a, VERIFIERS[1].public_bytes)
    forged = wire.decode_acceptance(acceptance_raw(signer=STRANGER, verifier=VERIFIER.public_bytes))
    with pytest.raises(wire.TranscriptError, match="does not verify"):
        wire.verify_acceptance(forged, VERIFIER.public_bytes)
    for i, v in ((2, OTHER_NODE.node_id), (3, b"\x08" * 32), (4, b"\x07" * 32), (5, SENT + 1)):
        altered = wire.decode_acceptance(pack([*doc[:i], v, *doc[i + 1:]]))
        with pytest.raises(wire.TranscriptError, match="does not verify"):
            wire.verify_acceptance(altered, VERIFIER.public_bytes)


def test_a_certificate_round_trips() -> None:
    accs = [acceptance_raw(k) for k in VERIFIERS]
    raw = certificate_raw(accs)
    assert unpack(raw) == [2, DONOR.node_id, VALUE, SENT, POINTS_RAW, accs]
    c = wire.decode_certificate(raw)
    assert (c.donor, c.value, c.sent_ms, c.points, c.points_raw) == (DONOR.node_id, VALUE, SENT, DEAL.commitments,
                                                                     POINTS_RAW)
    assert c.acceptances == tuple(wire.decode_acceptance(a) for a in accs)
    assert wire.certified_power(c, POWERS) == 100


def test_a_certificate_at_the_limits_fits() -> None:
    points = escrow.encode_commitments(_points(escrow.MAX_UNITS))
    acc = acceptance_raw(sent_ms=2**63 - 1)
    raw = wire.encode_certificate(DONOR.node_id, VALUE, 2**63 - 1, points, [acc] * escrow.MAX_HOLDERS)
    assert len(raw) == wire.MAX_CERTIFICATE_BYTES
    assert len(wire.decode_certificate(raw).acceptances) == escrow.MAX_HOLDERS
    with pytest.raises(wire.TranscriptError, match=f"has {escrow.MAX_HOLDERS + 1} items"):
        wire.decode_certificate(wire.encode_certificate(DONOR.node_id, VALUE, SENT, POINTS_RAW,
                                                        [acc] * (escrow.MAX_HOLDERS + 1)))
    with pytest.raises(wire.TranscriptError, match="has 0 items"):
        wire.decode_certificate(wire.encode_certificate(DONOR.node_id, VALUE, SENT, POINTS_RAW, []))


def test_certified_power_counts_each_good_acceptance_once_and_nothing_else() -> None:
    a, b, c, d = VERIFIERS
    other_digest = wire.points_digest(escrow.encode_commitments(escrow.deal(SECRET, PLAN, RNG).commitments))
    good_a = acceptance_raw(a)
    accs = [
        acceptance_raw(b, signer=STRANGER),  # forged: names b, signed by another key
        good_a,
        good_a,  # a duplicate
        acceptance_raw(a, sent_ms=SENT + 1),  # a's key again, another acceptance: a counts once
        acceptance_raw(STRANGER),  # a good signature by a key no validator holds
        acceptance_raw(c, digest=other_digest),  # the digest of other points
        acceptance_raw(c, sent_ms=SENT - 1),  # another sent_ms
        acceptance_raw(c, donor=OTHER_NODE.node_id),  # another donor
        acceptance_raw(c, value=b"\x08" * 32),  # another commitment
        acceptance_raw(d),
    ]
    cert = wire.decode_certificate(certificate_raw(accs))
    assert wire.certified_power(cert, POWERS) == 10 + 40
    # the forged b first does not stop b's own acceptance later from counting
    cert = wire.decode_certificate(certificate_raw([*accs, acceptance_raw(b)]))
    assert wire.certified_power(cert, POWERS) == 10 + 20 + 40
    assert wire.certified_power(cert, {}) == 0
    assert wire.certified_power(cert, {STRANGER.public_bytes: 5}) == 5
    # the certificate's points are what the digest must match
    other = dataclasses.replace(cert, points_raw=escrow.encode_commitments(escrow.deal(SECRET, PLAN, RNG).commitments))
    assert wire.certified_power(other, POWERS) == 0
    assert wire.certified_power(dataclasses.replace(cert, sent_ms=SENT + 2), POWERS) == 0
    # never raises: odd powers, odd values in the dataclasses
    assert wire.certified_power(cert, {a.public_bytes: "10", d.public_bytes: -4, b.public_bytes: True}) == 0  # type: ignore[dict-item]
    bad = dataclasses.replace(cert, acceptances=(*cert.acceptances, dataclasses.replace(cert.acceptances[1],
                                                                                         signature=b"x")))
    assert wire.certified_power(bad, POWERS) == 10 + 20 + 40
    assert wire.certified_power(dataclasses.replace(cert, points_raw=None), POWERS) == 0  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the node's reveal


def test_a_node_reveal_is_sealed_to_one_verifier_round_trips_and_verifies_with_the_nodes_key_only() -> None:
    body = escrowed()
    sealed = wire.seal_node_reveal(VERIFIER.public_bytes, NODE, NODE.node_id, body)
    assert len(sealed) <= wire.MAX_REVEAL_BYTES
    plain = wire.unseal(VERIFIER.private_bytes(), sealed)
    doc = unpack(plain)
    assert doc[:4] == [2, NODE.node_id, VERIFIER.public_bytes, body.wire()] and len(doc) == 5
    crypto.ed25519_verify(NODE.ed25519_public, doc[4], b"gentorrent/transcript-node-reveal/v2\x00" + pack(doc[1:4]))
    nr = wire.decode_node_reveal(plain)
    assert (nr.node_id, nr.verifier, nr.body) == (NODE.node_id, VERIFIER.public_bytes, body)
    assert nr.body.nonce == escrow.nonce_of(SECRET) and value_of(nr.body) == VALUE
    wire.verify_node_reveal(nr, NODE.ed25519_public)
    with pytest.raises(wire.TranscriptError, match="not the node's"):
        wire.verify_node_reveal(nr, DONOR.ed25519_public)
    with pytest.raises(wire.TranscriptError, match="not the node's"):
        wire.verify_node_reveal(nr, OTHER_NODE.ed25519_public)
    with pytest.raises(wire.TranscriptError, match="does not open"):
        wire.unseal(STRANGER.private_bytes(), sealed)
    # every field is signed
    for i, v in ((2, VERIFIERS[1].public_bytes), (3, escrowed(chunks=(("Mie", (5,)),)).wire())):
        altered = wire.decode_node_reveal(pack([*doc[:i], v, *doc[i + 1:]]))
        with pytest.raises(wire.TranscriptError, match="does not verify"):
            wire.verify_node_reveal(altered, NODE.ed25519_public)
    # another node's key signing as this node
    forged = wire.decode_node_reveal(node_reveal_raw(signer=OTHER_NODE))
    with pytest.raises(wire.TranscriptError, match="does not verify"):
        wire.verify_node_reveal(forged, NODE.ed25519_public)


def test_a_node_reveals_only_requests_addressed_to_it_or_replies_it_signed() -> None:
    third = Identity.generate()
    elsewhere = escrowed(node_id=OTHER_NODE.node_id, served_by=third.node_id)  # neither addressed to nor signed by NODE
    nr = wire.decode_node_reveal(node_reveal_raw(elsewhere))
    with pytest.raises(wire.TranscriptError, match="addressed to it or replies it signed"):
        wire.verify_node_reveal(nr, NODE.ed25519_public)
    # the node it was addressed to may reveal it, and so may the member it was forwarded to, which
    # signed the reply (a user's forwarded request is answered straight to the user)
    nr = wire.decode_node_reveal(node_reveal_raw(elsewhere, signer=OTHER_NODE, node_id=OTHER_NODE.node_id))
    wire.verify_node_reveal(nr, OTHER_NODE.ed25519_public)
    nr = wire.decode_node_reveal(node_reveal_raw(elsewhere, signer=third, node_id=third.node_id))
    wire.verify_node_reveal(nr, third.ed25519_public)


def test_a_node_reveal_carries_an_escrowed_body_only() -> None:
    with pytest.raises(ValueError, match="escrowed"):
        node_reveal_raw(escrowed(secret=b""))
    with pytest.raises(ValueError, match="escrowed"):
        wire.encode_node_reveal(NODE, NODE.node_id, VERIFIER.public_bytes, wire.NoReply(VALUE))  # type: ignore[arg-type]
    kind1 = dataclasses.replace(escrowed(), secret=b"").wire()
    for body in (kind1, [0, VALUE], [2, VALUE], escrowed().wire()[:10]):
        with pytest.raises(wire.TranscriptError, match=r"its body is \[2, node id, secret"):
            wire.decode_node_reveal(pack([2, NODE.node_id, VERIFIER.public_bytes, body, b"\x00" * 64]))


# --------------------------------------------------------------------------- released shares


def test_released_shares_round_trip_in_order_of_commitment() -> None:
    items = released_items(3)
    raw = wire.encode_released(7, items)
    doc = unpack(raw)
    assert doc[0:2] == [2, 7] and [i[0] for i in doc[2]] == sorted(i[0] for i in items)
    assert doc[2][0][1:] == [escrow.encode_commitments(items[2][1]), escrow.encode_shares(items[2][2])]
    epoch, got = wire.decode_released(raw)
    assert epoch == 7 and got == tuple(sorted(items))
    for value, points, shares in got:
        assert escrow.verify_shares(points, shares) and value
    assert wire.decode_released(wire.encode_released(0, [])) == (0, ())
    with pytest.raises(ValueError, match="once"):
        wire.encode_released(7, [items[0], items[0]])
    # by hand: out of order, or twice
    for order in ([1, 0, 2], [0, 0]):
        bad = pack([2, 7, [doc[2][i] for i in order]])
        with pytest.raises(wire.TranscriptError, match="strictly increasing"):
            wire.decode_released(bad)


def test_released_shares_at_the_limits() -> None:
    pts = _points(wire.MAX_RELEASED_UNITS)
    shares = tuple(escrow.Share(x, escrow.L - 1) for x in range(escrow.MAX_UNITS - wire.MAX_RELEASED_UNITS + 1,
                                                                escrow.MAX_UNITS + 1))
    raw = wire.encode_released(2**63 - 1, [(b"\x01" * 32, pts, shares)])
    item = pack([b"\x01" * 32, escrow.encode_commitments(pts), escrow.encode_shares(shares)])
    assert len(item) == wire.MAX_RELEASED_ITEM_BYTES  # the largest item takes the computed limit exactly
    assert wire.decode_released(raw) == (2**63 - 1, ((b"\x01" * 32, pts, shares),))
    # the whole: MAX_RELEASED of them (the count's header takes 3 bytes)
    assert wire.MAX_RELEASED_BYTES == len(raw) - len(item) - 1 + 3 + wire.MAX_RELEASED * len(item)
    for bad in ([(b"\x01" * 32, _points(wire.MAX_RELEASED_UNITS + 1), ())],
                [(b"\x01" * 32, pts, (*shares, escrow.Share(escrow.MAX_UNITS + 1, 1)))]):
        raw = pack([2, 1, [[v, pack(list(p)), pack([[s.x, escrow.scalar_bytes(s.y)] for s in ss])]
                           for v, p, ss in bad]])
        with pytest.raises(wire.TranscriptError, match="an item is refused"):
            wire.decode_released(raw)
    too_many = b"\x93\x02\x01\xdc" + (wire.MAX_RELEASED + 1).to_bytes(2, "big")
    with pytest.raises(wire.TranscriptError, match=f"has {wire.MAX_RELEASED + 1} items"):
        wire.decode_released(too_many)


# --------------------------------------------------------------------------- refusals, for every decoder


def _decoders() -> list[tuple[str, Callable[[bytes], object], bytes]]:
    return [
        ("escrow commit", wire.decode_escrow_commit, commit_raw()),
        ("acceptance", wire.decode_acceptance, acceptance_raw(sent_ms=5)),  # below the limit, to add a byte
        ("certificate", wire.decode_certificate, certificate_raw()),
        ("node reveal", wire.decode_node_reveal, node_reveal_raw()),
        ("released", wire.decode_released, wire.encode_released(3, released_items(2))),
    ]


DECODERS = _decoders()


@pytest.mark.parametrize("name, decode, raw", DECODERS, ids=[d[0] for d in DECODERS])
def test_every_decoder_refuses_trailing_bytes_another_version_shape_or_encoding(
        name: str, decode: Callable[[bytes], object], raw: bytes) -> None:
    decode(raw)
    doc = unpack(raw)
    with pytest.raises(wire.TranscriptError, match="trailing"):
        decode(raw + b"\xc0")
    for version in (1, 3, True, 2.0):
        with pytest.raises(wire.TranscriptError, match="version") as e:
            decode(pack([version, *doc[1:]]))
        assert e.value.unsupported_version
    with pytest.raises(wire.TranscriptError, match="not") as e:
        decode(pack(doc[:-1]))
    assert not e.value.unsupported_version
    with pytest.raises(wire.TranscriptError, match="canonical"):
        decode(raw[:1] + b"\xcc\x02" + raw[2:])  # the version as a uint8
    with pytest.raises(wire.TranscriptError, match="not bytes"):
        decode(raw.decode("latin-1"))  # type: ignore[arg-type]
    with pytest.raises(wire.TranscriptError):
        decode(b"")
    # every field of a fixed length (and the points) one byte short or long; the sealed shares' length varies
    for i, v in enumerate(doc):
        if type(v) is bytes and not (name == "escrow commit" and i == 6):
            for other in (v[:-1], v + b"\x00"):
                with pytest.raises(wire.TranscriptError, match="not"):
                    decode(pack([*doc[:i], other, *doc[i + 1:]]))


@pytest.mark.parametrize("field, value, why", [
    (1, b"\x00" * 19, "donor node id is not 20"),
    (2, b"\x00" * 31, "verifier key is not 32"),
    (3, -1, "sent_ms is not an int"),
    (3, 2**64 - 1, "sent_ms is not an int"),
    (3, 1.0, "sent_ms is not an int"),
    (4, b"\x00" * 33, "commitment is not 32"),
    (5, b"", "points are refused"),
    (5, "points", "points are not a bin"),
    (5, pack([b"\x00" * 32]), "points are refused"),  # not a valid point
    (6, b"\x00" * 48, "sealed shares are not a bin of 49"),
    (6, b"\x00" * (wire.MAX_SEALED_SHARES_BYTES + 1), "sealed shares are not a bin of 49"),
    (7, b"\x00" * 63, "signature is not 64"),
])
def test_a_malformed_escrow_commit_is_refused_with_a_reason(field: int, value: object, why: str) -> None:
    doc = unpack(commit_raw())
    with pytest.raises(wire.TranscriptError, match=why):
        wire.decode_escrow_commit(pack([*doc[:field], value, *doc[field + 1:]]))


def test_non_canonical_nested_encodings_are_refused() -> None:
    doc = unpack(commit_raw())
    points = doc[5]
    assert points[0] & 0xF0 == 0x90  # a fixarray: fewer than 16 points
    loose = b"\xdc\x00" + bytes([points[0] & 0x0F]) + points[1:]  # the points' array header as an array16
    assert unpack(loose) == unpack(points)
    with pytest.raises(wire.TranscriptError, match="points are refused"):
        wire.decode_escrow_commit(pack([*doc[:5], loose, *doc[6:]]))
    with pytest.raises(wire.TranscriptError, match="points are refused"):
        wire.decode_certificate(pack([2, DONOR.node_id, VALUE, SENT, loose, [acceptance_raw()]]))
    acc = acceptance_raw()
    small = acceptance_raw(sent_ms=5)  # below the size limit, so that one byte more is in it
    loose_acc = small[:1] + b"\xcc\x02" + small[2:]
    with pytest.raises(wire.TranscriptError, match=r"acceptance 1: .*canonical"):
        wire.decode_certificate(certificate_raw([acc, loose_acc]))
    with pytest.raises(wire.TranscriptError, match="an acceptance is not a bin"):
        wire.decode_certificate(pack([2, DONOR.node_id, VALUE, SENT, POINTS_RAW, [acc.hex()]]))
    # sent_ms as a uint64 where a smaller int does
    raw = pack([*doc[:3], 5, *doc[4:]])
    i = raw.index(b"\x05" + msgpack.packb(VALUE, use_bin_type=True))
    with pytest.raises(wire.TranscriptError, match="canonical"):
        wire.decode_escrow_commit(raw[:i] + b"\xcf" + (5).to_bytes(8, "big") + raw[i + 1:])


# --------------------------------------------------------------------------- anything at all


def _mutated(raw: bytes, data: st.DataObject) -> bytes:
    out = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.integers(0, 4))
        i = data.draw(st.integers(0, max(0, len(out) - 1)))
        if op == 0 and out:
            out[i] ^= 1 << data.draw(st.integers(0, 7))
        elif op == 1:
            out[i:i] = data.draw(st.binary(min_size=1, max_size=8))
        elif op == 2:
            del out[i:i + data.draw(st.integers(1, 40))]
        elif op == 3 and out:
            out[i] = data.draw(st.sampled_from([0x00, 0xC0, 0xC4, 0xC5, 0xC6, 0xCC, 0xCF, 0xD9, 0xDC, 0xDD, 0x90,
                                                0x9F, 0xFF]))
        else:
            out = out[:i]
    return bytes(out)


FUZZ = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.parametrize("name, decode, raw", DECODERS, ids=[d[0] for d in DECODERS])
def test_mutated_or_random_input_raises_only_transcript_error(
        name: str, decode: Callable[[bytes], object], raw: bytes) -> None:
    @FUZZ
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        if data.draw(st.booleans()):
            got = _mutated(raw, data)
        else:
            got = data.draw(st.binary(max_size=300))
        try:
            decode(got)
        except wire.TranscriptError as exc:
            assert exc.reason
        else:  # what decodes is in canonical form
            assert pack(unpack(got)) == got

    run()


@FUZZ
@given(data=st.data())
def test_open_shares_and_certified_power_never_raise_on_anything(data: st.DataObject) -> None:
    c = wire.decode_escrow_commit(commit_raw())
    sealed = data.draw(st.one_of(st.binary(max_size=120), st.just(_mutated(c.sealed_shares, data))))
    try:
        wire.open_shares(data.draw(st.sampled_from([VERIFIER.private_bytes(), b"\x00" * 32])),
                         dataclasses.replace(c, sealed_shares=sealed))
    except wire.TranscriptError as exc:
        assert exc.reason
    cert = wire.decode_certificate(certificate_raw())
    accs = []
    for a in cert.acceptances:
        accs.append(dataclasses.replace(a, signature=_mutated(a.signature, data)) if data.draw(st.booleans()) else a)
    power = wire.certified_power(dataclasses.replace(cert, acceptances=tuple(accs)), POWERS)
    assert power == sum(POWERS[a.verifier] for a in accs if a in cert.acceptances)
