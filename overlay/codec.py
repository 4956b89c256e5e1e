"""The wire codec: length-prefixed msgpack frames of typed, frozen messages.

Frame::

    +----------------+-------------------------------------------------+
    | length (u32 BE)| msgpack array [version, type, field1, field2...] |
    +----------------+-------------------------------------------------+

Every message is a frozen dataclass registered with :func:`message` under a
unique type number; its fields' annotations are its schema. Decoding is strict:
an unknown version or type, a wrong field count or type, an oversize field,
trailing bytes, or a frame over :data:`MAX_FRAME` raise
:class:`RemoteProtocolError` naming the peer. Nothing here does I/O.

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
# Items the unpacker admits per array: the largest declared tuple bound (raised as
# messages register), and never more than the payload's length (each item takes at
# least a byte), so a tiny frame cannot make msgpack preallocate a huge list.
_max_array_len = DEFAULT_MAX_ITEMS * 16

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


Check = Callable[[Any], Any]  # validates a decoded value, returns the Python value


class _Bad(Exception):
    pass


Encode = Callable[[Any], Any]  # turns a Python value into what msgpack packs


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


def _compile(tp: Any, meta: dict[str, Any], owner: str) -> tuple[Check, Encode | None]:
    """Return (decode-check, encode-transform-or-None) for annotation ``tp`` of a field of
    ``owner`` with wire bounds ``meta``; ``TypeError`` for a type the wire cannot carry."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return _compile_optional(tp, meta, owner)
    if tp in _SCALARS:
        return _SCALARS[tp], None
    if tp is str or tp is bytes:
        return _compile_sized(tp, meta), None
    if origin is tuple:
        return _compile_tuple(tp, meta, owner)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        spec = _spec_of(tp)
        return spec.decode_fields, spec.encode_fields
    raise TypeError(f"{owner}: unsupported wire field type {tp!r}")


def _compile_optional(tp: Any, meta: dict[str, Any], owner: str) -> tuple[Check, Encode | None]:
    """``T | None``: ``None`` passes as nil, anything else as ``T``."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if len(args) != 1:
        raise TypeError(f"{owner}: only 'T | None' unions are supported")
    inner_check, inner_enc = _compile(args[0], meta, owner)

    def check_optional(v: Any) -> Any:
        return None if v is None else inner_check(v)

    if inner_enc is None:
        return check_optional, None
    enc = inner_enc

    def encode_optional(v: Any) -> Any:
        return None if v is None else enc(v)

    return check_optional, encode_optional


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


def _compile_tuple(tp: Any, meta: dict[str, Any], owner: str) -> tuple[Check, Encode | None]:
    """``tuple[T, ...]`` as an array of ``exact`` or at most ``max`` items (default
    :data:`DEFAULT_MAX_ITEMS`); ``item_max``/``item_exact`` bound each item."""
    args = typing.get_args(tp)
    if len(args) != 2 or args[1] is not Ellipsis:
        raise TypeError(f"{owner}: tuples must be tuple[T, ...]")
    exact: int | None = meta.get("exact")
    limit: int = meta.get("max", DEFAULT_MAX_ITEMS)
    global _max_array_len
    _max_array_len = max(_max_array_len, limit)  # the unpacker must admit every declared bound
    item_meta = {key: meta["item_" + key] for key in ("max", "exact") if "item_" + key in meta}
    item_check, item_enc = _compile(args[0], item_meta, owner)
    ints = args[0] is int

    def check_tuple(v: Any) -> tuple[Any, ...]:
        if type(v) is not list:
            raise _Bad(f"expected array, got {type(v).__name__}")
        if exact is not None and len(v) != exact:
            raise _Bad(f"array of {len(v)} items, expected exactly {exact}")
        if len(v) > limit:
            raise _Bad(f"array of {len(v)} items over the limit {limit}")
        if ints and v:  # fast path for token ids: one pass per check, not a call per item
            if not all(type(x) is int for x in v) or min(v) < _I64_MIN or max(v) > _U64_MAX:
                return tuple(item_check(x) for x in v)  # raises with the precise reason
            return tuple(v)
        return tuple(item_check(x) for x in v)

    if item_enc is None:
        return check_tuple, None
    enc = item_enc

    def encode_tuple(v: Any) -> Any:
        return [enc(x) for x in v]

    return check_tuple, encode_tuple


class _Spec:
    __slots__ = ("cls", "names", "checks", "encs", "any_enc")

    def __init__(self, cls: type[Any]) -> None:
        if not cls.__dataclass_params__.frozen:
            raise TypeError(f"{cls.__name__}: wire messages must be frozen dataclasses")
        hints = typing.get_type_hints(cls)
        self.cls = cls
        self.names: list[str] = []
        self.checks: list[Check] = []
        self.encs: list[Encode | None] = []
        for f in dataclasses.fields(cls):
            check, enc = _compile(hints[f.name], dict(f.metadata), cls.__name__)
            self.names.append(f.name)
            self.checks.append(check)
            self.encs.append(enc)
        self.any_enc = any(e is not None for e in self.encs)

    def encode_fields(self, msg: Any) -> list[Any]:
        if self.any_enc:
            return [
                getattr(msg, n) if e is None else e(getattr(msg, n))
                for n, e in zip(self.names, self.encs, strict=True)
            ]
        return [getattr(msg, n) for n in self.names]

    def decode_fields(self, values: Any) -> Any:
        if type(values) is not list:
            raise _Bad(f"{self.cls.__name__}: expected array, got {type(values).__name__}")
        if len(values) != len(self.names):
            raise _Bad(
                f"{self.cls.__name__}: {len(values)} fields, expected {len(self.names)}"
            )
        out = []
        for name, check, v in zip(self.names, self.checks, values, strict=True):
            try:
                out.append(check(v))
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


def decode(payload: bytes, *, peer: str | None = None) -> Any:
    """Decode one payload strictly; :class:`RemoteProtocolError` on anything off."""
    if len(payload) > MAX_FRAME:
        raise RemoteProtocolError("payload over the frame limit", peer=peer, evidence=payload)
    try:
        obj = msgpack.unpackb(
            payload,
            raw=False,
            use_list=True,
            strict_map_key=True,
            max_bin_len=MAX_FRAME,
            max_str_len=MAX_FRAME,  # field checks apply the real bounds
            max_array_len=min(_max_array_len, len(payload)),
            max_map_len=0,
            max_ext_len=0,
        )
    except msgpack.ExtraData:
        raise RemoteProtocolError("trailing bytes after the message", peer=peer, evidence=payload) from None
    except (ValueError, msgpack.UnpackException, TypeError, RecursionError) as exc:
        raise RemoteProtocolError(f"malformed msgpack ({exc})", peer=peer, evidence=payload) from None
    if type(obj) is not list or len(obj) < 2:
        raise RemoteProtocolError("frame is not [version, type, ...]", peer=peer, evidence=payload)
    # One message, one encoding: a wider integer, float or length header than needed (msgpack
    # allows them) would let a peer vary the bytes of an identical message.
    if msgpack.packb(obj, use_bin_type=True) != payload:
        raise RemoteProtocolError("non-canonical msgpack encoding", peer=peer, evidence=payload)
    version, code = obj[0], obj[1]
    if type(version) is not int or version != WIRE_VERSION:
        raise RemoteProtocolError(
            f"unsupported wire version {version!r} (we speak {WIRE_VERSION})", peer=peer, evidence=payload
        )
    spec = _BY_CODE.get(code) if type(code) is int else None
    if spec is None:
        raise RemoteProtocolError(f"unknown message type {code!r}", peer=peer, evidence=payload)
    try:
        return spec.decode_fields(obj[2:])
    except _Bad as exc:
        raise RemoteProtocolError(str(exc), peer=peer, evidence=payload) from None


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
