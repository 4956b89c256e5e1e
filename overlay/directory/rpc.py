"""The one client of a verifier's CometBFT RPC: plain HTTP/1.1 over trio, JSON-RPC over GET.

:func:`rpc_call` is the transport (``(address, method, params) -> result``); every caller takes an
``rpc`` of that shape so tests can answer from an in-process committee. The helpers parse the
answers callers use: :func:`abci_query` (``code``, ``value``, ``log``, ``height``),
:func:`abci_value` (the value, or :class:`RpcError` for a non-zero code), :func:`broadcast_tx_sync`
and :func:`broadcast_tx_commit`. :func:`call_sync` runs a call from synchronous code (CLIs, local
networks). An answer that is not CometBFT's raises :class:`RpcError`; I/O raises ``OSError``.
"""

from __future__ import annotations

import base64
import json
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import trio

from overlay.net.transport import parse_address

MAX_RESPONSE = 64 * 1024 * 1024

# An RPC call: (verifier RPC address, method, params) -> the JSON-RPC "result" object.
Rpc = Callable[[str, str, dict[str, str]], Awaitable[Any]]


def block_time_unix(stamp: str) -> float:
    """A CometBFT header time (RFC 3339, UTC, up to nanoseconds: ``2026-11-25T23:00:50.123456789Z``)
    as Unix seconds (microsecond precision)."""
    head, _, frac = stamp.rstrip("Z").partition(".")
    return datetime.fromisoformat(head + "+00:00").timestamp() + float("0." + (frac[:6] or "0"))


class RpcError(Exception):
    """A verifier's RPC answered something unusable (not HTTP, too large, not JSON, a JSON-RPC
    error, no result, an odd result, a refused query); says why."""


class QueryRefused(RpcError):
    """The application refused an ``abci_query``: ``code`` (a
    :class:`~overlay.directory.registration.Code`) says what, the message why."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


async def http_get(address: str, target: str, *, max_bytes: int = MAX_RESPONSE) -> bytes:
    """``GET target`` on ``host:port`` (plain HTTP/1.1 over trio); the response body, at most
    ``max_bytes``. Raises :class:`RpcError` for a response that is not HTTP or too large, and
    ``OSError`` for I/O."""
    host, port = parse_address(address)
    stream = await trio.open_tcp_stream(host, port)
    chunks: list[bytes] = []
    try:
        async with stream:
            await stream.send_all(f"GET {target} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n".encode())
            size = 0
            while True:
                chunk = await stream.receive_some(1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
                if size > max_bytes:
                    raise RpcError(f"{address} answered over {max_bytes} bytes")
    except trio.BrokenResourceError as exc:  # a reset mid-answer is I/O like any other (the testbed's proxies showed it)
        raise ConnectionError(f"{address}: the connection broke: {exc.__cause__ or exc}") from None
    head, sep, body = b"".join(chunks).partition(b"\r\n\r\n")
    if not sep:
        raise RpcError(f"{address} did not answer HTTP")
    if b"chunked" in head.lower():
        body = _dechunk(body)
    return body


def _dechunk(body: bytes) -> bytes:
    out = bytearray()
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        try:
            size = int(size_line.split(b";")[0], 16)
        except ValueError:
            raise RpcError("bad HTTP chunk") from None
        if size == 0:
            break
        out += rest[:size]
        body = rest[size + 2:]
    return bytes(out)


async def rpc_call(address: str, method: str, params: dict[str, str]) -> Any:
    """One CometBFT JSON-RPC call over HTTP GET (``/method?k=v``; values as CometBFT's URI form
    expects them: strings quoted, bytes ``0x``-hex); the ``result`` object. A JSON-RPC error
    raises :class:`RpcError` with its message and data."""
    query = "&".join(f"{k}={urllib.parse.quote(v, safe='')}" for k, v in params.items())
    body = await http_get(address, f"/{method}?{query}" if query else f"/{method}")
    try:
        doc = json.loads(body)
    except ValueError:
        raise RpcError(f"{address} answered {method} with something other than JSON") from None
    if not isinstance(doc, dict):
        raise RpcError(f"{address} answered {method} with a non-object")
    if doc.get("error"):
        err = doc["error"]
        what = f"{err.get('message', '')}: {err.get('data', '')}" if isinstance(err, dict) else str(err)
        raise RpcError(f"{address} did not answer {method}: JSON-RPC error {what[:300]}")
    if "result" not in doc:
        raise RpcError(f"{address} answered {method} without a result")
    return doc["result"]


def call_sync(address: str, method: str, params: dict[str, str] | None = None, *, timeout: float = 10.0) -> Any:
    """:func:`rpc_call` from synchronous code; ``trio.TooSlowError`` after ``timeout`` seconds."""

    async def call() -> Any:
        with trio.fail_after(timeout):
            return await rpc_call(address, method, params or {})

    return trio.run(call)


def query_sync(address: str, path: str, data: bytes = b"", *, timeout: float = 10.0) -> Answer:
    """:func:`abci_query` from synchronous code; ``trio.TooSlowError`` after ``timeout`` seconds."""

    async def query() -> Answer:
        with trio.fail_after(timeout):
            return await abci_query(address, path, data)

    return trio.run(query)


@dataclass(frozen=True, slots=True)
class Answer:
    """A query's or a transaction's answer: its ABCI ``code`` (0: OK), ``log``, and for a query its
    ``value`` bytes and ``height``."""

    code: int
    log: str
    value: bytes = b""
    height: int = 0


def query_params(path: str, data: bytes = b"") -> dict[str, str]:
    """``abci_query``'s parameters: the quoted path, and ``data`` as ``0x``-hex when there is any."""
    params = {"path": f'"{path}"'}
    if data:
        params["data"] = "0x" + data.hex()
    return params


def tx_params(raw: bytes) -> dict[str, str]:
    """``broadcast_tx_*``'s parameters: the transaction as ``0x``-hex."""
    return {"tx": "0x" + raw.hex()}


def parse_query(result: Any) -> Answer:
    """The ``response`` of an ``abci_query`` result; :class:`RpcError` naming what was wrong."""
    try:
        response = result["response"]
        return Answer(int(response.get("code", 0)), str(response.get("log", "")),
                      base64.b64decode(response.get("value") or "", validate=True), int(response.get("height", 0)))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise RpcError(f"not an abci_query response ({exc!r})") from None


def parse_tx(result: Any) -> Answer:
    """A CheckTx or ExecTxResult (``broadcast_tx_sync``'s result, or a part of
    ``broadcast_tx_commit``'s); :class:`RpcError` naming what was wrong."""
    try:
        return Answer(int(result.get("code", 0)), str(result.get("log", "")))
    except (TypeError, ValueError, AttributeError) as exc:
        raise RpcError(f"not a transaction result ({exc!r})") from None


@dataclass(frozen=True, slots=True)
class Committed:
    """``broadcast_tx_commit``'s answer: CheckTx's, and (when it passed) the block's ExecTxResult and height."""

    check_tx: Answer
    tx_result: Answer
    height: int

    def refused(self) -> tuple[str, Answer] | None:
        """``(stage, answer)`` of the first stage that refused the transaction, None if it committed."""
        for stage, answer in (("check_tx", self.check_tx), ("tx_result", self.tx_result)):
            if answer.code:
                return stage, answer
        return None


def parse_commit(result: Any) -> Committed:
    """``broadcast_tx_commit``'s result; :class:`RpcError` naming what was wrong."""
    try:
        check = parse_tx(result["check_tx"])
        if check.code:
            return Committed(check, Answer(0, ""), 0)
        return Committed(check, parse_tx(result["tx_result"]), int(result["height"]))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise RpcError(f"not a broadcast_tx_commit result ({exc!r})") from None


async def abci_query(address: str, path: str, data: bytes = b"", *, rpc: Rpc | None = None) -> Answer:
    """``abci_query`` on a verifier's RPC (``host:port``), with ``data`` if any; its answer, whatever
    its code. ``rpc`` (default :func:`rpc_call`) is injectable for tests."""
    result = await (rpc or rpc_call)(address, "abci_query", query_params(path, data))
    try:
        return parse_query(result)
    except RpcError as exc:
        raise RpcError(f"{address} did not answer an abci_query: {exc}") from None


async def abci_value(address: str, path: str, data: bytes = b"", *, rpc: Rpc | None = None) -> bytes:
    """:func:`abci_query`'s value bytes; :class:`QueryRefused` for a non-zero code (with the
    verifier's log). The response is bounded by :data:`MAX_RESPONSE`; ``OSError`` for I/O."""
    answer = await abci_query(address, path, data, rpc=rpc)
    if answer.code:
        raise QueryRefused(f"{address} answered code {answer.code}: {answer.log[:200]}", answer.code)
    return answer.value


async def broadcast_tx_sync(address: str, raw: bytes, *, rpc: Rpc | None = None) -> Answer:
    """``broadcast_tx_sync``: CheckTx's answer (code 0: in the mempool)."""
    result = await (rpc or rpc_call)(address, "broadcast_tx_sync", tx_params(raw))
    try:
        return parse_tx(result)
    except RpcError as exc:
        raise RpcError(f"{address} answered broadcast_tx_sync oddly: {exc}") from None


async def broadcast_tx_commit(address: str, raw: bytes, *, rpc: Rpc | None = None) -> Committed:
    """``broadcast_tx_commit``: the transaction's CheckTx and ExecTxResult, and its block."""
    result = await (rpc or rpc_call)(address, "broadcast_tx_commit", tx_params(raw))
    try:
        return parse_commit(result)
    except RpcError as exc:
        raise RpcError(f"{address} answered broadcast_tx_commit oddly: {exc}") from None
