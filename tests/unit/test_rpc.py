"""The one CometBFT RPC client (overlay/directory/rpc.py): its helpers' parsing, through an injected rpc."""

from __future__ import annotations

import base64
from typing import Any

import pytest
import trio

from overlay.directory.rpc import QueryRefused, RpcError, abci_query, abci_value, broadcast_tx_commit, broadcast_tx_sync


def fake(result: Any) -> Any:
    calls: list[tuple[str, str, dict[str, str]]] = []

    async def rpc(address: str, method: str, params: dict[str, str]) -> Any:
        calls.append((address, method, params))
        return result

    rpc.calls = calls  # type: ignore[attr-defined]
    return rpc


def test_abci_query_sends_the_quoted_path_and_hex_data_and_reads_every_field() -> None:
    rpc = fake({"response": {"code": 7, "log": "why", "value": base64.b64encode(b"v").decode(), "height": "12"}})
    answer = trio.run(lambda: abci_query("a:1", "/node", b"\x01\x02", rpc=rpc))
    assert (answer.code, answer.log, answer.value, answer.height) == (7, "why", b"v", 12)
    assert rpc.calls == [("a:1", "abci_query", {"path": '"/node"', "data": "0x0102"})]
    with pytest.raises(QueryRefused, match="a:1 answered code 7: why") as refused:
        trio.run(lambda: abci_value("a:1", "/node", rpc=rpc))
    assert refused.value.code == 7
    with pytest.raises(RpcError, match="did not answer an abci_query"):
        trio.run(lambda: abci_query("a:1", "/node", rpc=fake({"no": "response"})))


def test_broadcasts_read_their_codes_and_the_first_refusing_stage() -> None:
    sync = trio.run(lambda: broadcast_tx_sync("a:1", b"\xff", rpc=fake({"code": 19, "log": "low work"})))
    assert (sync.code, sync.log) == (19, "low work")
    ok = trio.run(lambda: broadcast_tx_commit("a:1", b"\xff", rpc=fake(
        {"check_tx": {"code": 0}, "tx_result": {"code": 0}, "height": "5"})))
    assert ok.refused() is None and ok.height == 5
    bad = trio.run(lambda: broadcast_tx_commit("a:1", b"\xff", rpc=fake({"check_tx": {"code": 4, "log": "sig"}})))
    assert bad.refused() == ("check_tx", bad.check_tx) and bad.check_tx.log == "sig"
    late = trio.run(lambda: broadcast_tx_commit("a:1", b"\xff", rpc=fake(
        {"check_tx": {"code": 0}, "tx_result": {"code": 6, "log": "conflict"}, "height": "9"})))
    assert late.refused() == ("tx_result", late.tx_result)
    with pytest.raises(RpcError, match="broadcast_tx_commit oddly"):
        trio.run(lambda: broadcast_tx_commit("a:1", b"\xff", rpc=fake({"check_tx": {"code": 0}})))
    with pytest.raises(RpcError, match="broadcast_tx_sync oddly"):
        trio.run(lambda: broadcast_tx_sync("a:1", b"\xff", rpc=fake([1])))


def test_a_connection_reset_mid_answer_is_an_oserror_that_callers_already_handle() -> None:
    """A verifier (or a proxy before it) that resets the connection after part of an answer: the
    client's callers catch OSError; trio's BrokenResourceError escaped them and crashed a node."""
    import socket
    import struct

    from overlay.directory.rpc import http_get

    async def main() -> None:
        listener = trio.socket.socket()
        await listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]

        async def serve() -> None:
            conn, _ = await listener.accept()
            await conn.recv(4096)
            await conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
            await trio.sleep(0.05)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
            conn.close()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve)
            with pytest.raises(OSError, match="connection broke"):
                await http_get(f"127.0.0.1:{port}", "/status")
        listener.close()

    trio.run(main)


def test_block_times_read_as_unix_seconds_to_the_microsecond() -> None:
    from overlay.directory.rpc import block_time_unix

    assert block_time_unix("1970-01-01T00:00:01.5Z") == 1.5
    assert block_time_unix("2026-11-25T23:00:50.123456789Z") == pytest.approx(1795647650.123456, abs=1e-6)
    assert block_time_unix("2026-11-25T23:00:50Z") == 1795647650.0
