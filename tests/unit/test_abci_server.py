"""The ABCI socket server (verifier/abci/server.py) against a fake CometBFT client."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from verifier.abci import server, wire
from verifier.abci.proto.tendermint.abci import types_pb2 as abci


class RecordingApp:
    """Answers every method with its default response and records what it was asked."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)

        def method(req: Any) -> Any:
            self.calls.append(name)
            if name == "info":
                return abci.ResponseInfo(last_block_height=5, last_block_app_hash=b"h" * 32)
            if name == "check_tx":
                return abci.ResponseCheckTx(code=len(req.tx))
            if name == "query" and req.path == "/boom":
                raise RuntimeError("boom")
            return getattr(abci, "Response" + "".join(p.title() for p in name.split("_")))()

        return method


def _reqs() -> list[abci.Request]:
    return [
        abci.Request(echo=abci.RequestEcho(message="ping")),
        abci.Request(info=abci.RequestInfo()),
        abci.Request(check_tx=abci.RequestCheckTx(tx=b"abc")),
        abci.Request(flush=abci.RequestFlush()),
        abci.Request(finalize_block=abci.RequestFinalizeBlock(height=1)),
    ]


async def _read_responses(stream: trio.abc.Stream, n: int) -> list[abci.Response]:
    buf = bytearray()
    out: list[abci.Response] = []
    while len(out) < n:
        got = wire.decode_uvarint(buf)
        if got is not None and len(buf) >= got[1] + got[0]:
            length, start = got
            out.append(abci.Response.FromString(bytes(buf[start : start + length])))
            del buf[: start + length]
            continue
        data = await stream.receive_some(65536)
        assert data, "server closed the connection early"
        buf += data
    return out


def _check_answers(resps: list[abci.Response], app: RecordingApp) -> None:
    assert [r.WhichOneof("value") for r in resps] == ["echo", "info", "check_tx", "flush", "finalize_block"]
    assert resps[0].echo.message == "ping"
    assert resps[1].info.last_block_height == 5
    assert resps[2].check_tx.code == 3
    assert app.calls == ["info", "check_tx", "finalize_block"]


async def test_answers_in_order_over_a_memory_stream() -> None:
    app = RecordingApp()
    client, srv = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.serve_connection, app, srv)
        await client.send_all(b"".join(wire.encode_request(r) for r in _reqs()))
        _check_answers(await _read_responses(client, 5), app)
        await client.aclose()


async def test_malformed_frame_closes_the_connection_after_earlier_answers() -> None:
    app = RecordingApp()
    client, srv = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.serve_connection, app, srv)
        await client.send_all(wire.encode_request(_reqs()[0]) + b"\xff" * 11)
        (echo,) = await _read_responses(client, 1)
        assert echo.echo.message == "ping"
        assert await client.receive_some(10) == b""  # closed


async def test_application_error_answers_exception_and_closes() -> None:
    app = RecordingApp()
    client, srv = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.serve_connection, app, srv)
        await client.send_all(wire.encode_request(abci.Request(query=abci.RequestQuery(path="/boom"))))
        (resp,) = await _read_responses(client, 1)
        assert resp.WhichOneof("value") == "exception"
        assert "boom" in resp.exception.error
        assert await client.receive_some(10) == b""


async def test_serves_four_connections_on_a_unix_socket(tmp_path: Path) -> None:
    app = RecordingApp()
    path = str(tmp_path / "abci.sock")
    async with trio.open_nursery() as nursery:
        where = await nursery.start(server.serve, app, f"unix://{path}")
        assert where.url() == f"unix://{path}"
        assert ((await trio.Path(path).stat()).st_mode & 0o077) == 0

        async def one_client() -> None:
            stream = await trio.open_unix_socket(path)
            async with stream:
                await stream.send_all(wire.encode_request(_reqs()[0]) + wire.encode_request(_reqs()[3]))
                resps = await _read_responses(stream, 2)
                assert [r.WhichOneof("value") for r in resps] == ["echo", "flush"]

        async with trio.open_nursery() as clients:
            for _ in range(4):
                clients.start_soon(one_client)
        nursery.cancel_scope.cancel()
    assert not await trio.Path(path).exists()


async def test_serves_loopback_tcp() -> None:
    app = RecordingApp()
    async with trio.open_nursery() as nursery:
        where = await nursery.start(server.serve, app, "tcp://127.0.0.1:0")
        assert where.host == "127.0.0.1" and where.port > 0
        stream = await trio.open_tcp_stream("127.0.0.1", where.port)
        async with stream:
            await stream.send_all(b"".join(wire.encode_request(r) for r in _reqs()))
            _check_answers(await _read_responses(stream, 5), app)
        nursery.cancel_scope.cancel()


async def test_refuses_a_path_that_is_not_a_socket(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(server.AbciAddressError, match="not a socket"):
        await server.serve(RecordingApp(), f"unix://{f}")


@pytest.mark.parametrize("address, why", [
    ("tcp://0.0.0.0:26658", "loopback"),
    ("tcp://10.1.2.3:26658", "loopback"),
    ("tcp://localhost:26658", "IP literal"),
    ("tcp://127.0.0.1", "expected"),
    ("unix://", "without a path"),
    ("http://127.0.0.1:1", "expected"),
])
def test_parse_address_refuses_non_local(address: str, why: str) -> None:
    with pytest.raises(server.AbciAddressError, match=why):
        server.parse_address(address)


def test_parse_address_accepts_loopback_and_unix() -> None:
    assert server.parse_address("tcp://127.0.0.1:26658").url() == "tcp://127.0.0.1:26658"
    assert server.parse_address("tcp://[::1]:5").url() == "tcp://[::1]:5"
    assert server.parse_address("unix:///tmp/x.sock").path == "/tmp/x.sock"
