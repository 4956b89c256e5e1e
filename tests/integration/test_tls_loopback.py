"""TLSTransport on 127.0.0.1, in one process: real TLS 1.3, real certificates.

Covers what MemoryTransport cannot: the certificate pin, the channel binding
taken from the certificate, and peers that never get as far as TLS.
"""

from __future__ import annotations

import datetime
import ssl
from typing import Any

import pytest
import trio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from overlay.net import handshake
from overlay.net.node import Node
from overlay.net.transport import PeerAuthError, Timeouts, TLSTransport, TransportError, parse_address
from overlay.wire import crypto
from overlay.wire.identity import Identity, short_id
from overlay.wire.messages import AuthChallenge, AuthProof, Echo, EchoReply, Error, Ping, Pong


async def start_node(nursery: trio.Nursery, **transport_kw: Any) -> Node:
    ident = Identity.generate()
    node = Node(ident, TLSTransport(ident, **transport_kw), ping_interval=0)
    await nursery.start(node.serve, "127.0.0.1", 0)
    return node


def addr(node: Node) -> str:
    """The address ``node`` listens on (it has one once started)."""
    assert node.address is not None
    return node.address


async def echo_ok(node: Node) -> None:
    conn = await TLSTransport(Identity.generate()).dial(addr(node), node.node_id)
    try:
        await conn.send(Echo(nonce=9, data=b"ok?"))
        assert await conn.receive(idle_timeout=10) == EchoReply(nonce=9, data=b"ok?")
    finally:
        await conn.aclose()


async def open_tcp(address: str) -> trio.SocketStream:
    host, port = parse_address(address)
    return await trio.open_tcp_stream(host, port)


async def test_mutual_authentication(nursery: trio.Nursery) -> None:
    server = await start_node(nursery)
    seen: list[tuple[bytes, bytes]] = []

    async def record(conn: Any, msg: Echo) -> EchoReply:
        seen.append((conn.peer_id, conn.peer_x25519))
        return EchoReply(nonce=msg.nonce, data=msg.data)

    server.on(Echo, record)
    dialer = Identity.generate()
    conn = await TLSTransport(dialer).dial(addr(server), server.node_id)
    try:
        assert conn.peer_id == server.node_id
        assert conn.peer_x25519 == server.identity.x25519_public
        await conn.send(Echo(nonce=1, data=b"hi"))
        assert await conn.receive(idle_timeout=10) == EchoReply(nonce=1, data=b"hi")
        await conn.send(Ping(nonce=2))
        assert await conn.receive(idle_timeout=10) == Pong(nonce=2)
    finally:
        await conn.aclose()
    assert seen == [(dialer.node_id, dialer.x25519_public)]


async def test_tls_is_1_3_and_the_certificate_carries_the_identity_key(nursery: trio.Nursery) -> None:
    server = await start_node(nursery)
    tcp = await open_tcp(addr(server))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    tls = trio.SSLStream(tcp, ctx)
    try:
        with trio.fail_after(10):
            await tls.do_handshake()
        assert tls.version() == "TLSv1.3"
        der = tls.getpeercert(binary_form=True)
        assert crypto.cert_ed25519_public_key(der) == server.identity.ed25519_public
    finally:
        await tls.aclose()


async def test_two_nodes_ping_each_other(nursery: trio.Nursery) -> None:
    from overlay.net.peers import PeerEntry

    a = await start_node(nursery)
    b = await start_node(nursery)
    with trio.fail_after(15):
        assert await a.ping(PeerEntry.of(b.identity, addr(b))) >= 0
        assert await b.ping(PeerEntry.of(a.identity, addr(a))) >= 0


async def test_certificate_for_another_id_is_refused(nursery: trio.Nursery) -> None:
    server = await start_node(nursery)
    expected = Identity.generate().node_id
    with pytest.raises(PeerAuthError) as ei:
        await TLSTransport(Identity.generate()).dial(addr(server), expected)
    msg = str(ei.value)
    assert short_id(expected) in msg and short_id(server.node_id) in msg
    assert "certificate" in msg
    await echo_ok(server)


class RelayingMitm(TLSTransport):
    """Proves its id over a certificate hash other than the server's, as a man in
    the middle that terminated TLS with its own certificate would."""

    async def _open(self, address: str) -> Any:
        stream, server_pk, _ = await super()._open(address)
        return stream, server_pk, crypto.sha256(b"some other certificate")


async def test_proof_over_another_certificate_is_refused(nursery: trio.Nursery) -> None:
    server = await start_node(nursery)
    with pytest.raises(PeerAuthError, match="auth-failed"):
        await RelayingMitm(Identity.generate()).dial(addr(server), server.node_id)
    assert server.transport.rejected == {"auth-failed": 1}
    await echo_ok(server)


async def test_bad_signature_gets_an_error_frame(nursery: trio.Nursery, helpers: Any) -> None:
    server = await start_node(nursery)
    t = TLSTransport(Identity.generate())
    stream, _server_pk, binding = await t._open(addr(server))
    raw = helpers.RawPeer(stream)
    try:
        challenge = await raw.receive()
        assert isinstance(challenge, AuthChallenge)
        p = handshake.make_proof(t.identity, binding, challenge.nonce)
        await raw.send(AuthProof(p.ed25519_public, p.x25519_public, bytes(64)))
        rest = await raw.drain()
    finally:
        await raw.aclose()
    assert [m.code for m in rest] == ["auth-failed"] and isinstance(rest[0], Error)
    assert short_id(t.identity.node_id) in rest[0].detail
    assert server.transport.rejected == {"auth-failed": 1}
    await echo_ok(server)


async def test_plain_tcp_garbage_is_refused(nursery: trio.Nursery) -> None:
    server = await start_node(nursery)
    tcp = await open_tcp(addr(server))
    try:
        await tcp.send_all(b"GET / HTTP/1.0\r\n\r\n" + bytes(range(256)))
        with trio.fail_after(15):
            while await tcp.receive_some(4096):
                pass  # the server closes: EOF
    except trio.BrokenResourceError:
        pass  # or resets the connection
    finally:
        await tcp.aclose()
    assert server.transport.rejected == {"handshake-io": 1}
    await echo_ok(server)


async def test_silent_tcp_peer_times_out(nursery: trio.Nursery, helpers: Any) -> None:
    """Short handshake timeout, real clock: only the outcome is checked, never the time."""
    server = await start_node(nursery, timeouts=Timeouts(handshake=0.5))
    tcp = await open_tcp(addr(server))
    try:
        await echo_ok(server)  # served while the silent peer holds its connection
        with trio.fail_after(15):  # the silent peer times out
            await helpers.wait_until(lambda: server.transport.rejected.get("timeout") == 1)
    finally:
        await tcp.aclose()
    assert server.transport.rejected == {"timeout": 1}


async def test_dial_refused_port_is_a_transport_error() -> None:
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()  # nothing listens there now
    with pytest.raises(TransportError, match="cannot connect"):
        await TLSTransport(Identity.generate()).dial(f"127.0.0.1:{port}", None)


def _ec_cert() -> tuple[bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "not-a-node")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


async def test_server_without_an_ed25519_certificate_is_refused(nursery: trio.Nursery, tmp_path: Any) -> None:
    cert_pem, key_pem = _ec_cert()
    (tmp_path / "c.pem").write_bytes(cert_pem)
    (tmp_path / "k.pem").write_bytes(key_pem)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem")

    async def handler(stream: trio.SSLStream[trio.SocketStream]) -> None:
        with trio.move_on_after(10):
            try:
                await stream.do_handshake()
                await stream.receive_some(1)
            except trio.BrokenResourceError:
                pass
        await stream.aclose()

    listeners = await nursery.start(trio.serve_ssl_over_tcp, handler, 0, ctx)
    port = listeners[0].transport_listener.socket.getsockname()[1]
    with pytest.raises(PeerAuthError, match="not Ed25519"):
        await TLSTransport(Identity.generate()).dial(f"127.0.0.1:{port}", None)
