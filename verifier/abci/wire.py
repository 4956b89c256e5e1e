"""ABCI socket framing, I/O-free: unsigned-varint length-prefixed protobuf messages.

CometBFT's socket client writes every ``Request`` as ``uvarint(len) || protobuf`` (Go's
``protoio`` delimited format) and reads ``Response`` frames the same way. :class:`RequestDecoder`
is fed bytes as they arrive and hands out whole ``Request`` messages; :func:`encode_response`
frames an answer. Nothing here touches a socket.

Limits: a frame's length prefix is at most :data:`MAX_VARINT_LEN` bytes and announces at most
``max_message`` bytes (default :data:`MAX_MESSAGE`); a longer prefix, a larger length, a zero
length (an empty ``Request`` names no method), or bytes that do not parse as a ``Request`` with a
method raise :class:`AbciWireError` at once, before the body is buffered. The socket is reachable
from this machine only (the server refuses other addresses), but the decoder treats its input as
hostile all the same.
"""

from __future__ import annotations

from google.protobuf.message import DecodeError

from verifier.abci.proto.tendermint.abci import types_pb2 as abci

MAX_VARINT_LEN = 10
# CometBFT's default block max_bytes is 22,020,096 B (21 MiB) and a FinalizeBlock request carries
# the whole block plus its commit info: 32 MiB leaves room without admitting a runaway frame.
MAX_MESSAGE = 32 * 1024 * 1024
_EVIDENCE = 32


class AbciWireError(Exception):
    """The ABCI client sent bytes that are not a well-formed request; close its connection.

    ``evidence`` holds the first bytes of the offending frame.
    """

    def __init__(self, reason: str, evidence: bytes = b"") -> None:
        self.reason = reason
        self.evidence = bytes(evidence[:_EVIDENCE])
        super().__init__(f"{reason} (first bytes: {self.evidence.hex() or 'none'})")


def encode_uvarint(n: int) -> bytes:
    """``n`` (0 ≤ n < 2**64) as an unsigned LEB128 varint."""
    if not 0 <= n < 2**64:
        raise ValueError(f"uvarint out of range: {n}")
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def decode_uvarint(buf: bytes | bytearray, start: int = 0) -> tuple[int, int] | None:
    """``(value, end)`` of the varint at ``buf[start:]``, or ``None`` if it is not complete yet.

    Raises :class:`AbciWireError` for a varint longer than :data:`MAX_VARINT_LEN` bytes or over
    64 bits, and for a non-minimal encoding (a trailing zero byte), which Go never writes.
    """
    value = 0
    shift = 0
    for i in range(start, min(len(buf), start + MAX_VARINT_LEN)):
        byte = buf[i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if byte == 0 and i > start:
                raise AbciWireError("non-minimal varint length prefix", bytes(buf[start : i + 1]))
            if value >= 2**64:
                raise AbciWireError("varint length prefix over 64 bits", bytes(buf[start : i + 1]))
            return value, i + 1
        shift += 7
    if len(buf) - start >= MAX_VARINT_LEN:
        raise AbciWireError(f"varint length prefix longer than {MAX_VARINT_LEN} bytes", bytes(buf[start:]))
    return None


def frame(payload: bytes) -> bytes:
    """``payload`` with its uvarint length prefix."""
    return encode_uvarint(len(payload)) + payload


def encode_response(response: abci.Response) -> bytes:
    """One framed ``Response``."""
    return frame(response.SerializeToString())


def encode_request(request: abci.Request) -> bytes:
    """One framed ``Request`` (what CometBFT writes; for tests and tools)."""
    return frame(request.SerializeToString())


class RequestDecoder:
    """Splits a byte stream from CometBFT into ``Request`` messages.

    ``feed(data)`` appends bytes; ``next_request()`` returns the next complete request or ``None``
    when more bytes are needed. After it raises :class:`AbciWireError` the stream is unusable.
    """

    __slots__ = ("_buf", "_max", "_need")

    def __init__(self, *, max_message: int = MAX_MESSAGE) -> None:
        self._buf = bytearray()
        self._max = max_message
        self._need: tuple[int, int] | None = None  # (body length, body start) once the prefix is read

    def feed(self, data: bytes | bytearray) -> None:
        self._buf += data

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def next_request(self) -> abci.Request | None:
        if self._need is None:
            got = decode_uvarint(self._buf)
            if got is None:
                return None
            n, start = got
            if n == 0 or n > self._max:
                raise AbciWireError(f"request length {n} outside 1..{self._max}", bytes(self._buf[:start]))
            self._need = (n, start)
        n, start = self._need
        end = start + n
        if len(self._buf) < end:
            return None
        body = bytes(self._buf[start:end])
        del self._buf[:end]
        self._need = None
        return decode_request(body)


def decode_request(body: bytes) -> abci.Request:
    """Parse one ``Request`` body; :class:`AbciWireError` unless it parses and names a method."""
    req = abci.Request()
    try:
        req.ParseFromString(body)
    except (DecodeError, RuntimeError, ValueError, RecursionError) as exc:
        raise AbciWireError(f"undecodable ABCI request ({exc})", body) from None
    if req.WhichOneof("value") is None:
        raise AbciWireError("ABCI request names no method", body)
    return req
