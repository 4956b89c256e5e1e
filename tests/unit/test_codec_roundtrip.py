"""Every registered wire message survives encode → frame → split → strict decode.

Strategies are derived from each dataclass's type hints and its field metadata
(``max``/``exact``, ``item_max``/``item_exact``), so message types that other
modules register later are covered with no change here: every module of the
``overlay`` package is imported, plus any role-package module that registers
messages (found by scanning for ``@message(``).
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import types
import typing
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import overlay
from overlay.wire import codec
from overlay.wire.codec import RemoteProtocolError

REPO = Path(__file__).resolve().parents[2]
ROLE_PACKAGES = ("user_client", "model_node", "verifier")
I64_MIN, U64_MAX = -(2**63), 2**64 - 1


def import_message_modules() -> list[str]:
    """Import every overlay module, and role modules that register wire messages."""
    names = [m.name for m in pkgutil.walk_packages(overlay.__path__, "overlay.")]
    for pkg in ROLE_PACKAGES:
        root = REPO / pkg
        for path in sorted(root.rglob("*.py")) if root.is_dir() else []:
            if "@message(" in path.read_text(errors="replace"):
                rel = path.relative_to(REPO).with_suffix("")
                parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
                names.append(".".join(parts))
    for name in names:
        importlib.import_module(name)  # a module that fails to import is a failure here
    return names


IMPORTED = import_message_modules()
REGISTERED = codec.registered_types()


# --------------------------------------------------------------------------- strategies


def _optional_inner(tp: Any) -> Any | None:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0]
    return None


def _item_meta(meta: dict[str, Any]) -> dict[str, Any]:
    out = {}
    if "item_max" in meta:
        out["max"] = meta["item_max"]
    if "item_exact" in meta:
        out["exact"] = meta["item_exact"]
    return out


def strategy_for(tp: Any, meta: dict[str, Any]) -> st.SearchStrategy[Any]:
    """A strategy of valid Python values for a field annotated ``tp`` with ``meta``."""
    inner = _optional_inner(tp)
    if inner is not None:
        return st.none() | strategy_for(inner, meta)
    exact = meta.get("exact")
    if tp is int:
        return st.integers(I64_MIN, U64_MAX)
    if tp is bool:
        return st.booleans()
    if tp is float:
        return st.floats(allow_nan=False)
    if tp is str:
        if exact is not None:
            return st.text(min_size=exact, max_size=exact)
        return st.text(max_size=min(meta.get("max", codec.DEFAULT_MAX_STR), 40))
    if tp is bytes:
        if exact is not None:
            return st.binary(min_size=exact, max_size=exact)
        return st.binary(max_size=min(meta.get("max", codec.MAX_FRAME), 64))
    if typing.get_origin(tp) is tuple:
        item = strategy_for(typing.get_args(tp)[0], _item_meta(meta))
        if exact is not None:
            return st.lists(item, min_size=exact, max_size=exact).map(tuple)
        return st.lists(item, max_size=min(meta.get("max", codec.DEFAULT_MAX_ITEMS), 4)).map(tuple)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return message_strategy(tp)
    raise TypeError(f"no strategy for wire field type {tp!r}")


def message_strategy(cls: type) -> st.SearchStrategy[Any]:
    """Instances of dataclass ``cls`` whose fields respect their wire bounds.

    Values that ``cls``'s own ``__post_init__`` refuses are skipped (``assume``).
    """
    hints = typing.get_type_hints(cls)
    fields = [(f.name, strategy_for(hints[f.name], dict(f.metadata))) for f in dataclasses.fields(cls)]

    @st.composite
    def build(draw: Any) -> Any:
        values = [draw(s) for _, s in fields]
        try:
            return cls(*values)
        except (ValueError, TypeError):
            assume(False)

    return build()


def wire_minimal(tp: Any, meta: dict[str, Any]) -> Any:
    """The smallest well-typed *wire* value (msgpack object) for a field."""
    inner = _optional_inner(tp)
    if inner is not None:
        return None
    exact = meta.get("exact")
    if tp is int:
        return 0
    if tp is bool:
        return False
    if tp is float:
        return 0.0
    if tp is str:
        return "x" * (exact or 0)
    if tp is bytes:
        return b"\0" * (exact or 0)
    if typing.get_origin(tp) is tuple:
        item = wire_minimal(typing.get_args(tp)[0], _item_meta(meta))
        return [item] * (exact or 0)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return wire_fields(tp)
    raise TypeError(tp)


def wire_fields(cls: type) -> list[Any]:
    hints = typing.get_type_hints(cls)
    return [wire_minimal(hints[f.name], dict(f.metadata)) for f in dataclasses.fields(cls)]


def field_specs() -> list[tuple[int, type, int, str, Any, dict[str, Any]]]:
    """(code, class, index, name, annotation, metadata) for every top-level field."""
    out = []
    for code, cls in REGISTERED.items():
        hints = typing.get_type_hints(cls)
        for i, f in enumerate(dataclasses.fields(cls)):
            out.append((code, cls, i, f.name, hints[f.name], dict(f.metadata)))
    return out


FIELDS = field_specs()


def _ids(v: Any) -> str:
    return v.__name__ if isinstance(v, type) else str(v)


# --------------------------------------------------------------------------- tests


def test_foundation_messages_are_registered() -> None:
    names = {cls.__name__ for cls in REGISTERED.values()}
    assert {"AuthChallenge", "AuthProof", "AuthOk", "Error", "Ping", "Pong",
            "PeerStatusRequest", "PeerStatus", "Echo", "EchoReply"} <= names
    assert "overlay.wire.messages" in IMPORTED


def test_codes_are_unique_and_16_bit() -> None:
    assert len(set(REGISTERED.values())) == len(REGISTERED)
    assert all(0 <= code <= 0xFFFF for code in REGISTERED)


@pytest.mark.parametrize(("code", "cls"), sorted(REGISTERED.items()), ids=_ids)
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(data=st.data())
def test_round_trip(code: int, cls: type, data: st.DataObject) -> None:
    msg = data.draw(message_strategy(cls), label=cls.__name__)
    payload = codec.encode(msg)
    decoded = codec.decode(payload, peer="test")
    assert type(decoded) is cls
    assert decoded == msg
    assert codec.encode(decoded) == payload  # canonical: one encoding per message
    # Framed and split at an arbitrary point, the stream yields exactly this message.
    framed = codec.frame(msg)
    cut = data.draw(st.integers(0, len(framed)), label="cut")
    dec = codec.FrameDecoder(peer="test")
    dec.feed(framed[:cut])
    if cut < len(framed):
        assert dec.next_message() is None
    dec.feed(framed[cut:])
    assert dec.next_message() == msg
    assert dec.next_message() is None
    assert dec.buffered == 0


@pytest.mark.parametrize(("code", "cls"), sorted(REGISTERED.items()), ids=_ids)
def test_wire_layout_is_version_type_fields(code: int, cls: type) -> None:
    """[version, type, field...]: the documented layout, checked on the minimal message."""
    fields = wire_fields(cls)
    payload = msgpack.packb([codec.WIRE_VERSION, code, *fields], use_bin_type=True)
    try:
        msg = codec.decode(payload)
    except RemoteProtocolError:
        pytest.skip(f"{cls.__name__} refuses its all-zero value (own invariants)")
    assert type(msg) is cls
    assert codec.encode(msg) == payload


@pytest.mark.parametrize(("code", "cls"), sorted(REGISTERED.items()), ids=_ids)
def test_wrong_field_count_is_rejected(code: int, cls: type) -> None:
    fields = wire_fields(cls)
    bad = [[*fields, 0]]
    if fields:
        bad.append(fields[:-1])
    for values in bad:
        payload = msgpack.packb([codec.WIRE_VERSION, code, *values], use_bin_type=True)
        with pytest.raises(RemoteProtocolError, match="fields, expected") as ei:
            codec.decode(payload, peer="c0ffee00")
        assert ei.value.peer == "c0ffee00"


def _wrong_values(tp: Any) -> list[Any]:
    """Well-formed msgpack values of the wrong type for annotation ``tp``."""
    inner = _optional_inner(tp)
    if inner is not None:
        return _wrong_values(inner)
    if tp is int:
        return [True, 1.0, "1", b"1", [1]]
    if tp is bool:
        return [1, 0, "true", None]
    if tp is float:
        return [1, True, "1.0", None]
    if tp is str:
        return [b"x", 1, ["x"], None]
    if tp is bytes:
        return ["x", 1, [0], None]
    if typing.get_origin(tp) is tuple:
        return [b"", "x", 0, None]
    if dataclasses.is_dataclass(tp):
        return [0, b"", "x", None]
    raise TypeError(tp)


@pytest.mark.parametrize(("code", "cls", "index", "name", "tp", "meta"), FIELDS,
                         ids=[f"{c.__name__}.{n}" for _, c, _, n, _, _ in FIELDS])
def test_wrong_field_type_is_rejected(code: int, cls: type, index: int, name: str,
                                      tp: Any, meta: dict[str, Any]) -> None:
    for wrong in _wrong_values(tp):
        if wrong is None and _optional_inner(tp) is not None:
            continue
        fields = wire_fields(cls)
        fields[index] = wrong
        payload = msgpack.packb([codec.WIRE_VERSION, code, *fields], use_bin_type=True)
        with pytest.raises(RemoteProtocolError) as ei:
            codec.decode(payload, peer="c0ffee00")
        assert f"{cls.__name__}.{name}" in str(ei.value), wrong
        assert ei.value.peer == "c0ffee00"


BOUNDED = [s for s in FIELDS if ("max" in s[5] or "exact" in s[5])
           and (s[4] in (str, bytes) or typing.get_origin(s[4]) is tuple)]


def _of_length(tp: Any, meta: dict[str, Any], n: int) -> Any:
    if tp is str:
        return "y" * n
    if tp is bytes:
        return b"\x01" * n
    return [wire_minimal(typing.get_args(tp)[0], _item_meta(meta))] * n


@pytest.mark.parametrize(("code", "cls", "index", "name", "tp", "meta"), BOUNDED,
                         ids=[f"{c.__name__}.{n}" for _, c, _, n, _, _ in BOUNDED])
def test_length_bounds_are_enforced(code: int, cls: type, index: int, name: str,
                                    tp: Any, meta: dict[str, Any]) -> None:
    """At the bound: accepted (unless the type's own invariants object). Past it: rejected."""
    if "exact" in meta:
        ok, bad = meta["exact"], [meta["exact"] - 1, meta["exact"] + 1]
    else:
        ok, bad = meta["max"], [meta["max"] + 1]
    fields = wire_fields(cls)
    fields[index] = _of_length(tp, meta, ok)
    payload = msgpack.packb([codec.WIRE_VERSION, code, *fields], use_bin_type=True)
    if len(payload) <= codec.MAX_FRAME:
        try:
            msg = codec.decode(payload)
        except RemoteProtocolError as exc:
            # Only the type's own invariants (``Cls: ...``) may refuse a value at its bound.
            assert exc.reason.startswith(f"{cls.__name__}: ") and "fields, expected" not in exc.reason, exc
        else:
            assert len(getattr(msg, name)) == ok
    for n in bad:
        if n < 0:
            continue
        fields[index] = _of_length(tp, meta, n)
        payload = msgpack.packb([codec.WIRE_VERSION, code, *fields], use_bin_type=True)
        with pytest.raises(RemoteProtocolError) as ei:
            codec.decode(payload, peer="c0ffee00")
        assert ei.value.peer == "c0ffee00"
        if len(payload) <= codec.MAX_FRAME:
            # Named by the field check, or (for the largest bound of all) by the unpacker.
            assert f"{cls.__name__}.{name}" in str(ei.value) or "exceeds max_" in str(ei.value), ei.value


def test_unregistered_message_cannot_be_sent() -> None:
    @dataclasses.dataclass(frozen=True)
    class NotAMessage:
        x: int

    with pytest.raises(codec.LocalProtocolError):
        codec.encode(NotAMessage(1))


def test_oversize_message_cannot_be_sent() -> None:
    from overlay.wire.messages import Echo

    with pytest.raises(codec.LocalProtocolError, match="encodes to"):
        codec.encode(Echo(nonce=1, data=bytes(codec.MAX_FRAME)))


def test_registering_a_taken_code_fails() -> None:
    @dataclasses.dataclass(frozen=True)
    class Impostor:
        nonce: int

    code = next(iter(REGISTERED))
    with pytest.raises(ValueError, match="already used"):
        codec.message(code)(Impostor)


def test_non_frozen_message_is_refused() -> None:
    @dataclasses.dataclass
    class Mutable:
        x: int

    with pytest.raises(TypeError, match="frozen"):
        codec.message(0xFFFE)(Mutable)
    assert 0xFFFE not in codec.registered_types()


@dataclasses.dataclass(frozen=True, slots=True)
class _Inner:
    name: str = codec.field(max=8)
    ids: tuple[int, ...] = codec.field(max=4)


@codec.message(0xFFF0)
@dataclasses.dataclass(frozen=True, slots=True)
class _Shapes:
    """Shapes no registered message uses yet: an optional nested message, a tuple of
    nested messages, and per-item exact lengths."""

    maybe: _Inner | None
    many: tuple[_Inner, ...] = codec.field(max=3)
    keys: tuple[bytes, ...] = codec.field(max=2, metadata={"item_exact": 4})


@pytest.mark.parametrize("msg", [
    _Shapes(None, (), ()),
    _Shapes(_Inner("a", (1, 2)), (_Inner("b", ()), _Inner("c", (3,))), (b"abcd", b"efgh")),
])
def test_optional_and_repeated_nested_messages_roundtrip(msg: _Shapes) -> None:
    assert codec.decode(codec.encode(msg)) == msg


@pytest.mark.parametrize(("fields", "match"), [
    ([None, [], [b"abc"]], r"_Shapes.keys: bytes of length 3, expected exactly 4"),
    ([["toolongname", []], [], []], r"_Shapes.maybe: _Inner.name: str of length 11 over the limit 8"),
    ([None, [["a", []]] * 4, []], r"_Shapes.many: array of 4 items over the limit 3"),
    ([None, [["a", [1, 2, 3, 4, 5]]], []], r"_Shapes.many: _Inner.ids: array of 5 items over the limit 4"),
])
def test_nested_bounds_are_enforced(fields: list[Any], match: str) -> None:
    payload = msgpack.packb([codec.WIRE_VERSION, 0xFFF0, *fields], use_bin_type=True)
    with pytest.raises(codec.RemoteProtocolError, match=match):
        codec.decode(payload)


@pytest.mark.parametrize(("annotation", "match"), [
    (int | str, "only 'T | None' unions"),
    (tuple[int, int], r"tuple\[T, \.\.\.\]"),
    (dict[str, int], "unsupported wire field type"),
])
def test_unsupported_field_types_are_refused_at_registration(annotation: Any, match: str) -> None:
    odd = dataclasses.make_dataclass("Odd", [("x", annotation)], frozen=True)
    with pytest.raises(TypeError, match=match):
        codec.message(0xFFF1)(odd)
    assert 0xFFF1 not in codec.registered_types()
