"""Real ``gentorrent user relay`` processes on loopback: authentication both ways, bad
peers of every kind, identity across restarts, and configuration layers."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
import trio

from gentorrent.tools.localnet import free_ports
from overlay.net import handshake
from overlay.net.peers import PeerEntry, save
from overlay.net.transport import PeerAuthError, TLSTransport, TransportError, parse_address
from overlay.wire.identity import Identity, load_or_create, short_id
from overlay.wire.messages import (
    AuthChallenge,
    AuthProof,
    Echo,
    EchoReply,
    Error,
    PeerStatus,
    PeerStatusRequest,
    Ping,
    Pong,
)

pytestmark = pytest.mark.slow


async def echo_round_trip(relay: Any, nonce: int = 1) -> None:
    with trio.fail_after(30):
        conn = await TLSTransport(Identity.generate()).dial(relay.address, relay.node_id)
        try:
            await conn.send(Echo(nonce=nonce, data=b"x" * 100))
            assert await conn.receive() == EchoReply(nonce=nonce, data=b"x" * 100)
            await conn.send(Ping(nonce=nonce))
            assert await conn.receive() == Pong(nonce=nonce)
        finally:
            await conn.aclose()


async def test_two_processes_authenticate_each_other(relay: Any) -> None:
    """This test process dials the relay process: each end proves its id to the other."""
    me = Identity.generate()
    with trio.fail_after(30):
        conn = await TLSTransport(me).dial(relay.address, relay.node_id)
        try:
            assert conn.peer_id == relay.node_id
            await conn.send(Echo(nonce=7, data=b"hello"))
            assert await conn.receive() == EchoReply(nonce=7, data=b"hello")
        finally:
            await conn.aclose()
    assert relay.alive()


async def test_two_relay_processes_ping_each_other(relay_factory: Any, tmp_path: Path, helpers: Any) -> None:
    """Two relays given each other in a peer list reach each other (their own pings)."""
    idents = [load_or_create(tmp_path / f"n{i}") for i in range(2)]
    ports = free_ports(2)
    entries = [PeerEntry.of(ident, f"127.0.0.1:{p}") for ident, p in zip(idents, ports, strict=True)]
    save(tmp_path / "peers.json", entries)
    relays = [relay_factory(f"n{i}", "--peers", str(tmp_path / "peers.json"), "--ping-interval", "0.2",
                            listen=entries[i].address) for i in range(2)]
    assert [r.node_id for r in relays] == [e.node_id for e in entries]
    async def reached(r: Any) -> bool:
        conn = await TLSTransport(Identity.generate()).dial(r.address, r.node_id)
        try:
            await conn.send(PeerStatusRequest())
            while not isinstance(msg := await conn.receive(idle_timeout=10), PeerStatus):
                pass
            return any(p.rtt_us >= 0 for p in msg.peers)
        finally:
            await conn.aclose()

    async def wait_reached(r: Any) -> None:
        # Asked again and again: the relay is another process, its peers' state a status query away.
        while True:
            if await reached(r):
                return
            await trio.sleep(0.2)

    with trio.fail_after(60):
        for r in relays:
            await wait_reached(r)


async def test_wrong_expected_id_is_refused(relay: Any) -> None:
    wrong = Identity.generate().node_id
    with trio.fail_after(30), pytest.raises(PeerAuthError) as ei:
        await TLSTransport(Identity.generate()).dial(relay.address, wrong)
    msg = str(ei.value)
    assert short_id(wrong) in msg and short_id(relay.node_id) in msg
    await echo_round_trip(relay)


async def _raw_handshake(relay: Any, helpers: Any, forge: Any) -> tuple[Identity, Any, Any]:
    """Complete TLS, answer the challenge with ``forge(identity, binding, nonce)``:
    (identity, the server's reply, what follows it: ``None`` if the server closed)."""
    ident = Identity.generate()
    with trio.fail_after(30):
        stream, _server_pk, binding = await TLSTransport(ident)._open(relay.address)
        raw = helpers.RawPeer(stream)
        try:
            challenge = await raw.receive()
            assert isinstance(challenge, AuthChallenge)
            await raw.send(forge(ident, binding, challenge.nonce))
            reply = await raw.receive()
            if isinstance(reply, Error):
                return ident, reply, await raw.receive()
            await raw.send(Ping(nonce=5))
            return ident, reply, await raw.receive()
        finally:
            await raw.aclose()


def _bad_signature(ident: Identity, binding: bytes, nonce: bytes) -> AuthProof:
    p = handshake.make_proof(ident, binding, nonce)
    return AuthProof(p.ed25519_public, p.x25519_public, p.signature[:-1] + bytes([p.signature[-1] ^ 1]))


def _wrong_binding(ident: Identity, binding: bytes, nonce: bytes) -> AuthProof:
    return handshake.make_proof(ident, bytes(32), nonce)  # what a relaying MITM would produce


@pytest.mark.parametrize("forge", [_bad_signature, _wrong_binding], ids=["bad-signature", "wrong-binding"])
async def test_dialer_that_cannot_prove_its_id_is_refused(relay: Any, helpers: Any, forge: Any) -> None:
    ident, reply, after = await _raw_handshake(relay, helpers, forge)
    assert isinstance(reply, Error) and reply.code == "auth-failed", reply
    assert after is None  # and the server closed the connection
    await echo_round_trip(relay)  # keeps serving
    assert relay.alive()
    log = relay.log()
    assert "auth-failed" in log and short_id(ident.node_id) in log


async def test_honest_raw_handshake_is_accepted(relay: Any, helpers: Any) -> None:
    """Control for the test above: the same raw client with an honest proof gets in."""
    _, reply, after = await _raw_handshake(relay, helpers, handshake.make_proof)
    assert type(reply).__name__ == "AuthOk"
    assert after == Pong(nonce=5)


async def test_relay_keeps_serving_while_peers_misbehave(relay: Any, helpers: Any) -> None:
    """Garbage before TLS, garbage after TLS, a 4 GiB frame after authenticating, and a
    peer that connects and never speaks: each is refused while others are answered."""
    host, port = parse_address(relay.address)
    silent = await trio.open_tcp_stream(host, port)  # connects, never speaks
    try:
        # 1. Not TLS at all.
        junk = await trio.open_tcp_stream(host, port)
        try:
            await junk.send_all(b"\x16\x03\x01\x00\x05hello" + os.urandom(512))
            with trio.fail_after(30):
                try:
                    while await junk.receive_some(4096):
                        pass
                except trio.BrokenResourceError:
                    pass
        finally:
            await junk.aclose()
        await echo_round_trip(relay, 1)

        # 2. TLS, then garbage instead of a proof.
        with trio.fail_after(30):
            stream, _, _ = await TLSTransport(Identity.generate())._open(relay.address)
            raw = helpers.RawPeer(stream)
            try:
                assert isinstance(await raw.receive(), AuthChallenge)
                await raw.send_raw(b"\x00\x00\x00\x04\xc1\xc1\xc1\xc1")
                replies = await raw.drain()
            finally:
                await raw.aclose()
        assert [(type(m), m.code) for m in replies] == [(Error, "bad-frame")]
        await echo_round_trip(relay, 2)

        # 3. Authenticated, then a 4 GiB length prefix.
        with trio.fail_after(30):
            conn = await TLSTransport(Identity.generate()).dial(relay.address, relay.node_id)
            try:
                await conn.send_raw(b"\xff\xff\xff\xff")
                err = await conn.receive()
                assert isinstance(err, Error) and err.code == "bad-frame"
                assert "4294967295" in err.detail
                with pytest.raises(TransportError):
                    await conn.receive()
            finally:
                await conn.aclose()
        await echo_round_trip(relay, 3)

        # 4. Authenticated, then a frame of the wrong type for its field.
        with trio.fail_after(30):
            conn = await TLSTransport(Identity.generate()).dial(relay.address, relay.node_id)
            try:
                # Ping(nonce=True), in two writes: bool is not an int.
                await conn.send_raw(b"\x00\x00\x00\x04\x93\x01\x0a")
                await conn.send_raw(b"\xc3")
                err = await conn.receive()
                assert isinstance(err, Error) and err.code == "bad-frame" and "Ping.nonce" in err.detail
            finally:
                await conn.aclose()

        # The silent peer is still connected; others were served all along.
        await echo_round_trip(relay, 4)
        assert relay.alive()
    finally:
        await silent.aclose()
    log = relay.log()
    assert "handshake-io" in log  # not TLS
    assert "bad-frame" in log and "frame length 4294967295" in log
    assert "Ping.nonce: expected int, got bool" in log
    assert "Traceback" not in log


def test_identity_survives_a_restart(relay_factory: Any, tmp_path: Path) -> None:
    first = relay_factory("node")
    first_id = first.node_id
    assert first.stop() == 0
    key = tmp_path / "node" / "identity.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    second = relay_factory("node")
    assert second.node_id == first_id
    assert second.address != "" and second.alive()


def test_group_readable_key_is_refused(tmp_path: Path, helpers: Any) -> None:
    load_or_create(tmp_path / "node")
    key = tmp_path / "node" / "identity.key"
    key.chmod(0o640)
    (tmp_path / "peers.json").write_text('{"peers": []}')
    out = helpers.run_cli("user", "relay", "--data-dir", str(tmp_path / "node"), "--listen", "127.0.0.1:0",
                          "--peers", str(tmp_path / "peers.json"), timeout=60)
    assert out.returncode == 2
    assert out.stdout == ""
    line = out.stderr.strip()
    assert line.startswith("gentorrent: error: ") and len(line.splitlines()) == 1
    assert str(key) in line and "640" in line and "chmod 600" in line


def test_configuration_layers_through_the_cli(relay_factory: Any, tmp_path: Path, helpers: Any) -> None:
    """listen comes from DATA_DIR/config.toml, then GENTORRENT_LISTEN, then --listen."""
    ports = free_ports(3)
    data = tmp_path / "layered"
    data.mkdir(mode=0o700)
    (data / "config.toml").write_text(f'listen = "127.0.0.1:{ports[0]}"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("GENTORRENT_")}

    r = relay_factory("layered", listen=None, env=env)
    assert r.address == f"127.0.0.1:{ports[0]}"
    r.stop()

    env["GENTORRENT_LISTEN"] = f"127.0.0.1:{ports[1]}"
    r = relay_factory("layered", listen=None, env=env)
    assert r.address == f"127.0.0.1:{ports[1]}"
    r.stop()

    r = relay_factory("layered", listen=f"127.0.0.1:{ports[2]}", env=env)
    assert r.address == f"127.0.0.1:{ports[2]}"
    r.stop()


def test_status_reports_a_live_relay(relay_factory: Any, tmp_path: Path, helpers: Any) -> None:
    ident = load_or_create(tmp_path / "st")
    relay = relay_factory("st")
    assert relay.node_id == ident.node_id
    save(tmp_path / "list.json", [PeerEntry.of(ident, relay.address)])
    out = helpers.run_cli("status", "--peers", str(tmp_path / "list.json"), "--data-dir", str(tmp_path / "obs"),
                          "--timeout", "20", timeout=60)
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if short_id(ident.node_id) in line)
    assert " up " in row

    # The same address listed under another id: DOWN, naming the certificate mismatch.
    impostor = Identity.generate()
    save(tmp_path / "bad.json", [PeerEntry.of(impostor, relay.address)])
    out = helpers.run_cli("status", "--peers", str(tmp_path / "bad.json"), "--data-dir", str(tmp_path / "obs"),
                          "--timeout", "20", timeout=60)
    assert out.returncode == 1
    row = next(line for line in out.stdout.splitlines() if short_id(impostor.node_id) in line)
    assert "DOWN" in row and short_id(relay.node_id) in row
    assert relay.alive()


def test_relay_with_bad_listen_address_says_so(tmp_path: Path, helpers: Any) -> None:
    (tmp_path / "peers.json").write_text(json.dumps({"peers": []}))
    out = helpers.run_cli("user", "relay", "--data-dir", str(tmp_path / "n"), "--listen", "nowhere",
                          "--peers", str(tmp_path / "peers.json"), timeout=60)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and "not host:port" in out.stderr
