"""The wire codec: length-prefixed msgpack frames of typed, frozen messages.

Frame::

    +----------------+-------------------------------------------------+
    | length (u32 BE)| msgpack array [version, type, field1, field2...] |
    +----------------+-------------------------------------------------+

Every message is a frozen dataclass registered with :func:`message` under a
unique type number; its fields' annotations are its schema. Decoding is by shape:
the payload is read one msgpack item at a time against that schema (a value where
a field is a value, an array header, counted against the field's bound before any
item is read, where it is a tuple or a nested message), so no frame builds more
objects than its schema allows, whatever its bytes. Decoding is strict: an
unknown version or type, a wrong field count or type, an oversize field,
trailing bytes, a non-canonical encoding, or a frame over :data:`MAX_FRAME`
raise :class:`RemoteProtocolError` naming the peer. Nothing here does I/O.

Supported field types: ``int`` (signed/unsigned 64-bit; ``bool`` is not an
``int`` here), ``bool``, ``float``, ``str``, ``bytes``, ``tuple[T, ...]``,
another registered-or-plain message dataclass (nested as an array), and
``T | None``. Bounds come from :func:`field` (``max`` length or item count,
``exact`` length); unbounded defaults are :data:`DEFAULT_MAX_STR`,
:data:`MAX_FRAME` for bytes and :data:`DEFAULT_MAX_ITEMS` for tuples.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

import msgpack

WIRE_VERSION = 1
HEADER_LEN = 4
MAX_FRAME = 2 * 1024 * 1024
DEFAULT_MAX_STR = 64 * 1024
DEFAULT_MAX_ITEMS = 1024
_EVIDENCE = 64  # bytes of a bad frame kept in the error

_I64_MIN = -(2**63)
_U64_MAX = 2**64 - 1


class RemoteProtocolError(Exception):
    """The peer sent something that breaks the protocol.

    ``peer`` names who (a node id, short id or address), ``evidence`` holds the
    first bytes of what they sent. The connection it came from must be closed.
    """

    def __init__(self, reason: str, *, peer: str | None = None, evidence: bytes = b"") -> None:
        self.reason = reason
        self.peer = peer
        self.evidence = bytes(evidence[:_EVIDENCE])
        who = f"peer {peer}: " if peer else ""
        super().__init__(f"{who}{reason}")

    def with_peer(self, peer: str) -> RemoteProtocolError:
        if self.peer is None:
            return RemoteProtocolError(self.reason, peer=peer, evidence=self.evidence)
        return self


class LocalProtocolError(Exception):
    """We tried to send something the protocol forbids (a bug on our side)."""


# --------------------------------------------------------------------------- schema


def field(*, max: int | None = None, exact: int | None = None, **kw: Any) -> Any:
    """A dataclass field with wire bounds: ``max`` length/items, or ``exact`` length.

    ``field()`` with no bounds marks a plain field that follows bounded ones: the
    field stays required at run time, and mypy (which takes any ``x = call()`` for a
    default) does not report a field without a default after one with.
    """
    meta = dict(kw.pop("metadata", {}) or {})
    if max is not None:
        meta["max"] = max
    if exact is not None:
        meta["exact"] = exact
    return dataclasses.field(metadata=meta, **kw)


Check = Callable[[Any], Any]  # validates one decoded item, returns the Python value
Read = Callable[["ShapeReader"], Any]  # reads a field's items by shape, returns the Python value
Encode = Callable[[Any], Any]  # turns a Python value into what msgpack packs


class ShapeError(Exception):
    """A payload that :class:`ShapeReader` refused: its shape is not the schema's."""


_Bad = ShapeError


# msgpack's first bytes of an array (fixarray, array 16, array 32), and of nil
_ARRAY_HEADS = frozenset((*range(0x90, 0xA0), 0xDC, 0xDD))
_NIL = 0xC0


class ShapeReader:
    """A payload read by shape, one item at a time: a value where the schema has a value, an
    array header where it has an array, whose count the field's bound checks before any item
    is read. An array where a value belongs is refused before it is built, and the unpacker
    itself builds no array or map with items (``max_array_len=0``, ``max_map_len=0``: arrays
    are only read by header), so no payload builds more objects than its schema allows
    (unpacking the whole payload first let 2 MB of nested empty arrays take 116 MB,
    docs/fuzzing.md). msgpack's own errors propagate: :func:`decode` maps them to "malformed
    msgpack"."""

    __slots__ = ("end", "raw", "u")

    def __init__(self, raw: bytes | memoryview, max_bin: int = MAX_FRAME) -> None:
        self.raw = raw
        self.end = len(raw)
        self.u = msgpack.Unpacker(
            raw=False,
            strict_map_key=True,
            max_buffer_size=self.end or 1,
            read_size=self.end or 1,  # one buffer of the payload's size, never regrown
            max_bin_len=max_bin,
            max_str_len=max_bin,  # the field checks apply the real bounds
            max_array_len=0,
            max_map_len=0,
            max_ext_len=0,
        )
        self.u.feed(raw)

    def head(self) -> int:
        """The first byte of the next item (-1 at the end)."""
        at: int = self.u.tell()
        return self.raw[at] if at < self.end else -1

    def value(self) -> Any:
        """The next item, a value; :class:`_Bad` if it is an array, refused unbuilt."""
        at = self.u.tell()
        if at < self.end and self.raw[at] in _ARRAY_HEADS:
            raise _Bad("expected a value, got an array")
        return self.u.unpack()

    def ints(self, n: int) -> list[int]:
        """The next ``n`` items, ints, in one loop without a peek per item (token ids come by
        the thousand). Each is checked as it comes, so an array among them is refused unbuilt
        by the unpacker if it has items, as the one object it is if not."""
        out: list[int] = []
        unpack, append = self.u.unpack, out.append
        for _ in range(n):
            x = unpack()
            if type(x) is not int:
                raise _Bad(f"expected int, got {type(x).__name__}")
            append(x)
        return out

    def array(self) -> int:
        """The item count of the next item, an array, whose items follow (the caller bounds
        the count before it reads any); :class:`_Bad` naming the value found instead."""
        if self.head() in _ARRAY_HEADS:
            n: int = self.u.read_array_header()
            return n
        raise _Bad(f"expected array, got {type(self.u.unpack()).__name__}")

    def done(self) -> bool:
        """Whether every byte was read."""
        at: int = self.u.tell()
        return at == self.end


def _check_int(v: Any) -> int:
    if type(v) is not int or not (_I64_MIN <= v <= _U64_MAX):
        raise _Bad(f"expected int, got {type(v).__name__}")
    return v


def _check_bool(v: Any) -> bool:
    if type(v) is not bool:
        raise _Bad(f"expected bool, got {type(v).__name__}")
    return v


def _check_float(v: Any) -> float:
    if type(v) is not float:
        raise _Bad(f"expected float, got {type(v).__name__}")
    return v


# Scalars msgpack packs as they are: one check each, no encode step.
_SCALARS: dict[Any, Check] = {int: _check_int, bool: _check_bool, float: _check_float}


class _Field(typing.NamedTuple):
    """A field type compiled for the wire."""

    read: Read  # reads the field's items by shape, returns the Python value
    enc: Encode | None  # turns the value into what msgpack packs; None: packed as it is
    # For a value (one item, never an array: a scalar, str, bytes, or one of those or nil),
    # the check of that item: a message reads its value fields with it, without a call to
    # ``read`` (most fields are values).
    check: Check | None = None


def _value(check: Check) -> _Field:
    """A value field: one item, never an array, that ``check`` accepts."""

    def read_value(r: ShapeReader) -> Any:
        return check(r.value())

    return _Field(read_value, None, check)


def _compile(tp: Any, meta: dict[str, Any], owner: str) -> _Field:
    """Compile annotation ``tp`` of a field of ``owner`` with wire bounds ``meta``;
    ``TypeError`` for a type the wire cannot carry."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return _compile_optional(tp, meta, owner)
    if tp in _SCALARS:
        return _value(_SCALARS[tp])
    if tp is str or tp is bytes:
        return _value(_compile_sized(tp, meta))
    if origin is tuple:
        return _compile_tuple(tp, meta, owner)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        spec = _spec_of(tp)
        return _Field(spec.read, spec.encode_fields)
    raise TypeError(f"{owner}: unsupported wire field type {tp!r}")


def _compile_optional(tp: Any, meta: dict[str, Any], owner: str) -> _Field:
    """``T | None``: nil reads as ``None``, anything else as ``T``."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if len(args) != 1:
        raise TypeError(f"{owner}: only 'T | None' unions are supported")
    inner = _compile(args[0], meta, owner)
    if inner.check is not None:  # nil or a value: still one value
        check = inner.check

        def check_optional(v: Any) -> Any:
            return None if v is None else check(v)

        return _value(check_optional)
    read = inner.read

    def read_optional(r: ShapeReader) -> Any:
        return r.u.unpack() if r.head() == _NIL else read(r)

    if inner.enc is None:
        return _Field(read_optional, None)
    enc = inner.enc

    def encode_optional(v: Any) -> Any:
        return None if v is None else enc(v)

    return _Field(read_optional, encode_optional)


def _compile_sized(tp: type[str] | type[bytes], meta: dict[str, Any]) -> Check:
    """``str`` or ``bytes`` of ``exact`` length, or at most ``max`` (default
    :data:`DEFAULT_MAX_STR` for str, :data:`MAX_FRAME` for bytes)."""
    exact: int | None = meta.get("exact")
    limit: int = meta.get("max", DEFAULT_MAX_STR if tp is str else MAX_FRAME)
    name = tp.__name__

    def check_sized(v: Any) -> Any:
        if type(v) is not tp:
            raise _Bad(f"expected {name}, got {type(v).__name__}")
        if exact is not None and len(v) != exact:
            raise _Bad(f"{name} of length {len(v)}, expected exactly {exact}")
        if len(v) > limit:
            raise _Bad(f"{name} of length {len(v)} over the limit {limit}")
        return v

    return check_sized


def _compile_tuple(tp: Any, meta: dict[str, Any], owner: str) -> _Field:
    """``tuple[T, ...]`` as an array of ``exact`` or at most ``max`` items (default
    :data:`DEFAULT_MAX_ITEMS`), counted before any item is read; ``item_max``/``item_exact``
    bound each item."""
    args = typing.get_args(tp)
    if len(args) != 2 or args[1] is not Ellipsis:
        raise TypeError(f"{owner}: tuples must be tuple[T, ...]")
    exact: int | None = meta.get("exact")
    limit: int = meta.get("max", DEFAULT_MAX_ITEMS)
    item_meta = {key: meta["item_" + key] for key in ("max", "exact") if "item_" + key in meta}
    item = _compile(args[0], item_meta, owner)
    read_item = item.read
    ints = args[0] is int

    def read_tuple(r: ShapeReader) -> tuple[Any, ...]:
        n = r.array()
        if exact is not None and n != exact:
            raise _Bad(f"array of {n} items, expected exactly {exact}")
        if n > limit:
            raise _Bad(f"array of {n} items over the limit {limit}")
        if ints:  # fast path for token ids: one loop, then one pass per bound
            v = r.ints(n)
            if v and (min(v) < _I64_MIN or max(v) > _U64_MAX):
                return tuple(_check_int(x) for x in v)  # raises with the precise reason
            return tuple(v)
        return tuple([read_item(r) for _ in range(n)])

    if item.enc is None:
        return _Field(read_tuple, None)
    enc = item.enc

    def encode_tuple(v: Any) -> Any:
        return [enc(x) for x in v]

    return _Field(read_tuple, encode_tuple)


class _Spec:
    __slots__ = ("any_enc", "cls", "encs", "fields", "names")

    def __init__(self, cls: type[Any]) -> None:
        if not cls.__dataclass_params__.frozen:
            raise TypeError(f"{cls.__name__}: wire messages must be frozen dataclasses")
        hints = typing.get_type_hints(cls)
        self.cls = cls
        self.names: list[str] = []
        self.fields: list[tuple[str, Read, Check | None]] = []
        self.encs: list[Encode | None] = []
        for f in dataclasses.fields(cls):
            read, enc, check = _compile(hints[f.name], dict(f.metadata), cls.__name__)
            self.names.append(f.name)
            self.fields.append((f.name, read, check))
            self.encs.append(enc)
        self.any_enc = any(e is not None for e in self.encs)

    def encode_fields(self, msg: Any) -> list[Any]:
        if self.any_enc:
            return [
                getattr(msg, n) if e is None else e(getattr(msg, n))
                for n, e in zip(self.names, self.encs, strict=True)
            ]
        return [getattr(msg, n) for n in self.names]

    def read(self, r: ShapeReader) -> Any:
        """This message nested in another: an array of exactly its fields."""
        return self.read_fields(r, r.array())

    def read_fields(self, r: ShapeReader, count: int) -> Any:
        """This message from its ``count`` fields, which come next, checked one by one."""
        if count != len(self.names):
            raise _Bad(f"{self.cls.__name__}: {count} fields, expected {len(self.names)}")
        out = []
        for name, read, check in self.fields:
            try:
                out.append(read(r) if check is None else check(r.value()))
            except _Bad as exc:
                raise _Bad(f"{self.cls.__name__}.{name}: {exc}") from None
        try:
            return self.cls(*out)
        except (ValueError, TypeError) as exc:  # __post_init__ invariants
            raise _Bad(f"{self.cls.__name__}: {exc}") from None


_SPECS: dict[type, _Spec] = {}
_BY_CODE: dict[int, _Spec] = {}
_CODE_OF: dict[type, int] = {}


def _spec_of(cls: type[Any]) -> _Spec:
    spec = _SPECS.get(cls)
    if spec is None:
        spec = _SPECS[cls] = _Spec(cls)
    return spec


M = TypeVar("M")


def message(code: int) -> Callable[[type[M]], type[M]]:
    """Register a frozen dataclass as wire message type ``code`` (0..65535, unique)."""

    def register(cls: type[M]) -> type[M]:
        if not 0 <= code <= 0xFFFF:
            raise ValueError("message code must fit in 16 bits")
        if code in _BY_CODE and _BY_CODE[code].cls is not cls:
            raise ValueError(f"message code {code} already used by {_BY_CODE[code].cls.__name__}")
        spec = _spec_of(cls)
        _BY_CODE[code] = spec
        _CODE_OF[cls] = code
        return cls

    return register


def registered_types() -> dict[int, type]:
    """Every registered message type, by code (for tests and docs)."""
    return {code: spec.cls for code, spec in sorted(_BY_CODE.items())}


# --------------------------------------------------------------------------- encode


def encode(msg: Any) -> bytes:
    """The msgpack payload of ``msg`` (no length prefix)."""
    code = _CODE_OF.get(type(msg))
    if code is None:
        raise LocalProtocolError(f"{type(msg).__name__} is not a registered wire message")
    spec = _BY_CODE[code]
    payload: bytes = msgpack.packb([WIRE_VERSION, code, *spec.encode_fields(msg)], use_bin_type=True)
    if len(payload) > MAX_FRAME:
        raise LocalProtocolError(f"{type(msg).__name__} encodes to {len(payload)} B > {MAX_FRAME}")
    return payload


def frame(msg: Any) -> bytes:
    """``msg`` as one length-prefixed frame."""
    payload = encode(msg)
    return len(payload).to_bytes(HEADER_LEN, "big") + payload


# What msgpack raises on bytes that are not msgpack: a bad or reserved byte, a truncated item,
# a length over a ``max_*_len``, invalid UTF-8 (StopIteration only when an Unpacker is iterated).
_MALFORMED = (ValueError, TypeError, RecursionError, StopIteration, msgpack.UnpackException)
_NOT_A_FRAME = "frame is not [version, type, ...]"


def _frame_value(r: ShapeReader) -> Any:
    """The next item of a frame's head (its version or type), a value."""
    try:
        return r.value()
    except _Bad:
        raise _Bad(_NOT_A_FRAME) from None


def _read_message(payload: bytes) -> Any:
    """The one message ``[version, type, field...]`` of ``payload``, read by shape (the reader,
    a copy of the payload, is gone when the canonical check packs the message again)."""
    r = ShapeReader(payload)
    if r.head() not in _ARRAY_HEADS:
        r.u.unpack()  # bytes that are not msgpack (a map with entries, a cut item) say so
        raise _Bad(_NOT_A_FRAME)
    n: int = r.u.read_array_header()
    if n < 2:
        raise _Bad(_NOT_A_FRAME)
    version = _frame_value(r)
    if type(version) is not int or version != WIRE_VERSION:
        raise _Bad(f"unsupported wire version {version!r} (we speak {WIRE_VERSION})")
    code = _frame_value(r)
    spec = _BY_CODE.get(code) if type(code) is int else None
    if spec is None:
        raise _Bad(f"unknown message type {code!r}")
    msg = spec.read_fields(r, n - 2)
    if not r.done():
        raise _Bad("trailing bytes after the message")
    return msg


def decode(payload: bytes, *, peer: str | None = None) -> Any:
    """Decode one payload strictly, by shape; :class:`RemoteProtocolError` on anything off."""
    if len(payload) > MAX_FRAME:
        raise RemoteProtocolError("payload over the frame limit", peer=peer, evidence=payload)
    try:
        msg = _read_message(payload)
    except _Bad as exc:
        raise RemoteProtocolError(str(exc), peer=peer, evidence=payload) from None
    except _MALFORMED as exc:
        raise RemoteProtocolError(f"malformed msgpack ({exc})", peer=peer, evidence=payload) from None
    # One message, one encoding: a wider integer, float or length header than needed (msgpack
    # allows them) would let a peer vary the bytes of an identical message.
    try:
        canonical = encode(msg)
    except LocalProtocolError:  # float32s widened past the frame limit
        canonical = b""
    if canonical != payload:
        raise RemoteProtocolError("non-canonical msgpack encoding", peer=peer, evidence=payload)
    return msg


# --------------------------------------------------------------------------- framing


class FrameDecoder:
    """I/O-free splitter of a byte stream into frame payloads.

    ``feed(data)`` appends bytes; ``next_payload()`` returns the next complete
    payload or ``None``. A length prefix of zero or over ``max_frame`` raises at
    once, before any of that frame is buffered, so a peer announcing 4 GiB costs
    us four bytes.
    """

    __slots__ = ("_buf", "_max", "peer")

    def __init__(self, *, max_frame: int = MAX_FRAME, peer: str | None = None) -> None:
        self._buf = bytearray()
        self._max = max_frame
        self.peer = peer

    def feed(self, data: bytes | bytearray) -> None:
        self._buf += data

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def next_payload(self) -> bytes | None:
        buf = self._buf
        if len(buf) < HEADER_LEN:
            return None
        n = int.from_bytes(buf[:HEADER_LEN], "big")
        if n == 0 or n > self._max:
            raise RemoteProtocolError(
                f"frame length {n} outside 1..{self._max}", peer=self.peer, evidence=bytes(buf[:HEADER_LEN])
            )
        end = HEADER_LEN + n
        if len(buf) < end:
            return None
        payload = bytes(buf[HEADER_LEN:end])
        del buf[:end]
        return payload

    def next_message(self) -> Any | None:
        payload = self.next_payload()
        return None if payload is None else decode(payload, peer=self.peer)
