"""Nodes over MemoryTransport with trio's MockClock: authentication, and every kind of
misbehaving peer, each answered by a specific Error frame, a counted reason and a
closed connection while the node keeps serving everyone else. Timeouts of 10 s or
300 s run instantly (autojump clock)."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from trio.testing import MockClock

from overlay.net import handshake
from overlay.net.node import Node
from overlay.net.peers import PeerEntry
from overlay.net.transport import (
    MemoryTransport,
    PeerAuthError,
    Timeouts,
    TransportError,
)
from overlay.testing import Net, wait_until, warnings_logged
from overlay.wire import codec, crypto
from overlay.wire.identity import Identity, short_id
from overlay.wire.messages import (
    AuthChallenge,
    AuthOk,
    AuthProof,
    Echo,
    EchoReply,
    Error,
    PeerStatus,
    PeerStatusRequest,
    Ping,
    Pong,
)

# Every test takes ``autojump_clock``: pytest-trio runs a test under the clock among its arguments.
# ``net`` and ``nursery`` come from conftest.py: an empty in-memory network (overlay.testing.Net).


def addr(node: Node) -> str:
    """The address ``node`` listens on (it has one once started)."""
    assert node.address is not None
    return node.address


def entry(node: Node) -> PeerEntry:
    return PeerEntry.of(node.identity, addr(node))


def assert_logged(caplog: pytest.LogCaptureFixture, *parts: str) -> None:
    """A WARNING was logged containing every one of ``parts``."""
    warnings = warnings_logged(caplog.records)
    assert any(all(p in m for p in parts) for m in warnings), (parts, warnings)


async def assert_serving(net: Net, node: Node) -> None:
    """A fresh, well-behaved peer still gets answers."""
    conn = await net.dial(node)
    await conn.send(Echo(nonce=5, data=b"still there?"))
    assert await conn.receive() == EchoReply(nonce=5, data=b"still there?")
    await conn.aclose()


# --------------------------------------------------------------------------- happy paths


async def test_two_nodes_authenticate_and_ping(
    autojump_clock: MockClock, nursery: trio.Nursery, net: Net
) -> None:
    a = await net.start_node(nursery)
    b = await net.start_node(nursery)
    rtt = await b.ping(entry(a))
    assert rtt >= 0
    conn = await b.connection_to(entry(a))
    assert conn.peer_id == a.node_id
    assert conn.peer_ed25519 == a.identity.ed25519_public
    assert conn.peer_x25519 == a.identity.x25519_public
    # The server side learned the dialer's proven id and keys.
    assert b.node_id in a._conns
    assert a._conns[b.node_id].peer_x25519 == b.identity.x25519_public
    # A reply travels back over the same connection: a pings b without dialing.
    assert await a.ping(entry(b)) >= 0
    assert a.rejected == {} and b.rejected == {}


async def test_echo_and_status(
    autojump_clock: MockClock, nursery: trio.Nursery, net: Net
) -> None:
    a = await net.start_node(nursery)
    conn = await net.dial(a)
    await conn.send(Echo(nonce=1, data=b"x" * 1000))
    assert await conn.receive() == EchoReply(nonce=1, data=b"x" * 1000)
    await conn.send(Ping(nonce=99))
    assert await conn.receive() == Pong(nonce=99)
    await conn.send(PeerStatusRequest())
    status = await conn.receive()
    assert isinstance(status, PeerStatus) and status.node_id == a.node_id


async def test_ping_loop_records_reachable_and_unreachable_peers(
    autojump_clock: MockClock, nursery: trio.Nursery, net: Net
) -> None:
    b = await net.start_node(nursery)
    ghost = PeerEntry.of(Identity.generate(), "mem-ghost:1")
    a = await net.start_node(nursery, peers=[entry(b), ghost], ping_interval=30)
    with trio.fail_after(120):  # the first ping round: b answers, the ghost's ping fails
        await wait_until(lambda: len(a.seen) >= 2)
    assert a.seen[b.node_id].rtt_us >= 0 and a.seen[b.node_id].last_ok_unix > 0
    assert a.seen[ghost.node_id].rtt_us == -1
    conn = await net.dial(a)
    await conn.send(PeerStatusRequest())
    status = await conn.receive()
    assert {p.node_id: p.rtt_us >= 0 for p in status.peers} == {b.node_id: True, ghost.node_id: False}


# --------------------------------------------------------------------------- who is who


async def test_wrong_expected_id_is_refused(
    autojump_clock: MockClock, nursery: trio.Nursery, net: Net
) -> None:
    a = await net.start_node(nursery)
    other = Identity.generate()
    with pytest.raises(PeerAuthError) as ei:
        await net.transport(Identity.generate()).dial(addr(a), other.node_id)
    msg = str(ei.value)
    assert short_id(other.node_id) in msg and short_id(a.node_id) in msg


async def test_unknown_address_is_a_transport_error(
    autojump_clock: MockClock, net: Net
) -> None:
    with pytest.raises(TransportError, match="refused"):
        await net.transport(Identity.generate()).dial("mem-nobody:1", None)


class ManInTheMiddle(MemoryTransport):
    """Signs over a channel binding other than the server's (what a relaying MITM sees)."""

    async def _open(self, address: str) -> Any:
        stream, server_pk, _binding = await super()._open(address)
        return stream, server_pk, crypto.sha256(b"the MITM's own certificate")


async def test_proof_over_the_wrong_channel_is_refused(
    autojump_clock: MockClock, nursery: trio.Nursery, net: Net, caplog:
    pytest.LogCaptureFixture
) -> None:
    a = await net.start_node(nursery)
    mitm = Identity.generate()
    with pytest.raises(PeerAuthError, match="auth-failed") as ei:
        await ManInTheMiddle(mitm, net.network).dial(addr(a), a.node_id)
    assert short_id(mitm.node_id) in str(ei.value)
    assert a.transport.rejected == {"auth-failed": 1}
    assert_logged(caplog, "auth-failed", short_id(mitm.node_id))
    await assert_serving(net, a)


def _bad_signature(ident: Identity, binding: bytes, nonce: bytes) -> AuthProof:
    p = handshake.make_proof(ident, binding, nonce)
    return AuthProof(p.ed25519_public, p.x25519_public, bytes([p.signature[0] ^ 0x80]) + p.signature[1:])


def _someone_elses_key(ident: Identity, binding: bytes, nonce: bytes) -> AuthProof:
    p = handshake.make_proof(ident, binding, nonce)
    return AuthProof(Identity.generate().ed25519_public, p.x25519_public, p.signature)


@pytest.mark.parametrize("forge", [_bad_signature, _someone_elses_key], ids=["bad-signature", "claims-other-key"])
async def test_dialer_that_cannot_prove_its_id_is_refused(
    autojump_clock: MockClock, nursery: trio.Nursery, net: Net, forge:
    Any
) -> None:
    a = await net.start_node(nursery)
    raw = net.raw_dial(addr(a))
    challenge = await raw.receive()
    assert isinstance(challenge, AuthChallenge)
    await raw.send(forge(Identity.generate(), raw.binding, challenge.nonce))
    rest = await raw.drain()
    assert len(rest) == 1 and isinstance(rest[0], Error) and rest[0].code == "auth-failed"
    assert "failed to prove" in rest[0].detail
    assert a.transport.rejected == {"auth-failed": 1}
    await assert_serving(net, a)


async def test_correct_raw_proof_is_accepted(
    autojump_clock: MockClock, nursery: trio.Nursery, net: Net
) -> None:
    """The raw client above is faithful: with an honest proof it gets AuthOk."""
    a = await net.start_node(nursery)
    raw = net.raw_dial(addr(a))
    challenge = await raw.receive()
    assert isinstance(challenge, AuthChallenge)
    await raw.send(handshake.make_proof(Identity.generate(), raw.binding, challenge.nonce))
    assert await raw.receive() == AuthOk(x25519_public=a.identity.x25519_public)
    await raw.send(Ping(nonce=3))
    assert await raw.receive() == Pong(nonce=3)
    await raw.aclose()


# --------------------------------------------------------------------------- bad peers, before auth


async def test_silent_peer_times_out_while_others_are_served(
    autojump_clock: MockClock, nursery: trio.Nursery, net: Net,
    caplog: pytest.LogCaptureFixture
) -> None:
    a = await net.start_node(nursery)
    b = await net.start_node(nursery)
    silent = net.raw_dial(addr(a))
    assert isinstance(await silent.receive(), AuthChallenge)
    # While the silent peer holds its connection, others are answered.
    assert await b.ping(entry(a)) >= 0
    await assert_serving(net, a)
    with trio.fail_after(60):  # 5 s accept deadline (Timeouts.accept), on the mock clock
        rest = await silent.drain()
    assert [(type(m), m.code) for m in rest] == [(Error, "timeout")]
    assert a.transport.rejected == {"timeout": 1}
    assert a.rejected == {}
    assert_logged(caplog, "during handshake: timeout", "no valid handshake within 5.0s")


async def test_silent_server_times_the_dialer_out(
    autojump_clock: MockClock, nursery: trio.Nursery, net: Net
) -> None:
    """A listener that accepts but never speaks: dial fails after the handshake timeout."""
    ident = Identity.generate()
    send, receive = trio.open_memory_channel[Any](4)
    net.network.listeners["mem-mute:1"] = (ident.ed25519_public, send)
    with pytest.raises(TransportError, match="timed out"):
        await net.transport(Identity.generate(), timeouts=Timeouts(handshake=10)).dial(
            "mem-mute:1", ident.node_id)
    receive.close()


@pytest.mark.parametrize(("label", "data", "detail"), [
    ("4GiB-prefix", b"\xff\xff\xff\xff", "frame length 4294967295"),
    ("zero-length", b"\0\0\0\0", "frame length 0"),
    ("handshake-frame-over-4KiB", (4097).to_bytes(4, "big"), "frame length 4097"),
    ("garbage", b"\0\0\0\x03\xc1\xc1\xc1", "malformed msgpack"),
    ("wrong-message", codec.frame(Ping(nonce=1)), "expected AuthProof"),
    ("unknown-type", b"\0\0\0\x03\x92\x01\xcd", "malformed"),
])
async def test_bad_handshake_frames(
    autojump_clock: MockClock, nursery: trio.Nursery, net: Net,
    caplog: pytest.LogCaptureFixture, label: str, data: bytes, detail: str
) -> None:
    a = await net.start_node(nursery)
    raw = net.raw_dial(addr(a))
    assert isinstance(await raw.receive(), AuthChallenge)
    await raw.send_raw(data)
    rest = await raw.drain()
    assert len(rest) == 1 and rest[0].code == "bad-frame"
    assert detail in rest[0].detail
    assert a.transport.rejected == {"bad-frame": 1}
    assert_logged(caplog, "during handshake: bad-frame", detail)
    await assert_serving(net, a)


async def test_connection_cap(
    autojump_clock: MockClock, nursery: trio.Nursery, net: Net
) -> None:
    """With one slot: a newcomer evicts a connection still in its handshake (issue 15, item
    5), never an authenticated one; when the slot is authenticated, newcomers are refused."""
    a = await net.start_node(nursery, max_connections=1)
    first = net.raw_dial(addr(a))
    assert isinstance(await first.receive(), AuthChallenge)
    second = net.raw_dial(addr(a))
    assert isinstance(await second.receive(), AuthChallenge)  # admitted: the first one made room
    assert await first.drain() == []  # evicted, closed
    b = await net.start_node(nursery)
    assert await b.ping(entry(a)) >= 0  # an honest peer gets in past the silent one
    assert await second.drain() == []
    assert a.transport.rejected == {"evicted": 2}
    third = net.raw_dial(addr(a))
    assert await third.drain() == []  # the only slot is authenticated: refused at once
    assert a.transport.rejected == {"evicted": 2, "too-many-connections": 1}


# --------------------------------------------------------------------------- bad peers, after auth


def _framed(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


# An Echo whose data is one byte over its 64 KiB bound.
_OVERSIZE_ECHO = _framed(b"\x94\x01\x0e\x01\xc6" + (65537).to_bytes(4, "big") + bytes(65537))


@pytest.mark.parametrize(("label", "data", "reason", "detail"), [
    ("4GiB-prefix", b"\xff\xff\xff\xff", "bad-frame", "frame length 4294967295"),
    ("over-2MiB-prefix", (codec.MAX_FRAME + 1).to_bytes(4, "big"), "bad-frame", "frame length"),
    ("garbage", _framed(b"\xc1\xc1\xc1\xc1"), "bad-frame", "malformed msgpack"),
    ("wrong-version", _framed(b"\x93\x07\x0a\x01"), "bad-frame", "unsupported wire version 7"),
    ("unknown-type", _framed(b"\x93\x01\xcd\xff\xff\x01"), "bad-frame", "unknown message type 65535"),
    ("bool-for-int", _framed(b"\x93\x01\x0a\xc3"), "bad-frame", "Ping.nonce: expected int, got bool"),
    ("oversize-field", _OVERSIZE_ECHO, "bad-frame", "Echo.data: bytes of length 65537 over the limit 65536"),
    ("unexpected-message", codec.frame(AuthOk(x25519_public=b"\0" * 32)), "unexpected-message", "AuthOk"),
])
async def test_bad_frames_after_auth(
    autojump_clock: MockClock, nursery: trio.Nursery, net: Net, caplog:
    pytest.LogCaptureFixture, label: str, data: bytes, reason: str, detail: str
) -> None:
    a = await net.start_node(nursery)
    b = await net.start_node(nursery)
    assert await b.ping(entry(a)) >= 0
    conn = await net.dial(a)
    await conn.send_raw(data)
    err = await conn.receive()
    assert isinstance(err, Error) and err.code == reason and detail in err.detail
    with pytest.raises(TransportError):
        await conn.receive()
    assert a.rejected == {reason: 1}
    dropped = [r.getMessage() for r in caplog.records if r.name == "gentorrent.node"]
    assert any(reason in m and "dropping peer" in m and detail in m for m in dropped), dropped
    # Everyone else is still served, including the peer that was already connected.
    assert await b.ping(entry(a)) >= 0
    await assert_serving(net, a)


async def test_idle_authenticated_peer_is_dropped(
    autojump_clock: MockClock, nursery: trio.Nursery, net: Net
) -> None:
    a = await net.start_node(nursery)
    conn = await net.dial(a)
    with pytest.raises(TransportError, match="closed"):
        await conn.receive(idle_timeout=a.idle_timeout * 2)
    with trio.fail_after(15):  # the idle connection is forgotten
        await wait_until(lambda: a._conns == {})
    assert a.rejected == {} and a.transport.rejected == {}


async def test_peer_error_frame_closes_quietly(
    autojump_clock: MockClock, nursery: trio.Nursery, net: Net
) -> None:
    a = await net.start_node(nursery)
    conn = await net.dial(a)
    await conn.send(Error(code="going-away", detail="bye"))
    with pytest.raises(TransportError):
        await conn.receive(idle_timeout=5)
    assert a.rejected == {}
