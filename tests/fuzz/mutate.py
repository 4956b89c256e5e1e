"""Random choices and mutations of wire input, shared by the CI tests and the long run.

Every generator here takes a :class:`Source` of choices, so one definition serves both runs:
:class:`DrawSource` draws through hypothesis (CI: shrinkable, derandomized) and
:class:`RandomSource` through :class:`random.Random` (the long run in :mod:`tests.fuzz.__main__`:
fast, one seed per example, no stop at the first failure).

Mutations, at two levels:

- **bytes**: bit flips, interesting bytes (msgpack headers, 0x00, 0xff), truncation,
  extension, insertion and deletion, a duplicated slice, a splice with another valid frame, and
  *lying headers* (msgpack str/bin/array/map/ext headers announcing up to 4 GiB) dropped in
  anywhere;
- **structure** (on the decoded msgpack tree): a value replaced by one of another type or an
  extreme one (ints at the 64-bit edges, NaN, long strings, wrong-length bytes, maps, deep
  nesting), elements dropped, duplicated or swapped, the fields of one message type under the
  header of another, another type code or version, arrays grown past their bounds.

Plus purely random bytes and deeply nested arrays.
"""

from __future__ import annotations

import builtins
import dataclasses
import random
import types
import typing
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

import msgpack
from hypothesis import strategies as st

from overlay.wire import codec

T = TypeVar("T")


class Source(Protocol):
    """Where a generator's choices come from."""

    def int(self, lo: int, hi: int) -> int:
        """An integer in ``lo..hi`` (inclusive)."""

    def bytes(self, n: builtins.int) -> builtins.bytes:
        """``n`` arbitrary bytes."""


class RandomSource:
    """Choices from :class:`random.Random` (the long run)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def int(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def bytes(self, n: builtins.int) -> builtins.bytes:
        return self.rng.randbytes(n)


class DrawSource:
    """Choices drawn through hypothesis (CI), so failures shrink."""

    def __init__(self, data: st.DataObject) -> None:
        self.data = data

    def int(self, lo: int, hi: int) -> int:
        return self.data.draw(st.integers(lo, hi))

    def bytes(self, n: builtins.int) -> builtins.bytes:
        return self.data.draw(st.binary(min_size=n, max_size=n))


def choice(src: Source, items: Sequence[T]) -> T:
    return items[src.int(0, len(items) - 1)]


def chance(src: Source, percent: int) -> bool:
    return src.int(0, 99) < percent


# --------------------------------------------------------------------------- valid values

_SMALL = (0, 1, 2, 3, 7, 16, 32)


def value_for(src: Source, tp: Any, meta: dict[str, Any]) -> Any:
    """A valid Python value for a wire field annotated ``tp`` with bounds ``meta`` (short
    strings, bytes and tuples: the mutations make the long ones)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        if chance(src, 30):
            return None
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    exact = meta.get("exact")
    if tp is bool:
        return bool(src.int(0, 1))
    if tp is int:
        return choice(src, (0, 1, src.int(0, 1000), src.int(-(2**63), 2**64 - 1)))
    if tp is float:
        return choice(src, (0.0, 1.0, 0.5, float(src.int(-1000, 1000))))
    if tp is str:
        n = exact if exact is not None else min(meta.get("max", 64), choice(src, _SMALL))
        return "".join(chr(src.int(32, 126)) for _ in range(n))
    if tp is bytes:
        n = exact if exact is not None else min(meta.get("max", 64), choice(src, _SMALL))
        return src.bytes(n)
    if typing.get_origin(tp) is tuple:
        item_meta = {k[5:]: v for k, v in meta.items() if k.startswith("item_")}
        n = exact if exact is not None else min(meta.get("max", 8), src.int(0, 3))
        return tuple(value_for(src, typing.get_args(tp)[0], item_meta) for _ in range(n))
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return message_of(src, tp)
    raise TypeError(f"no generator for wire field type {tp!r}")


def message_of(src: Source, cls: type[T]) -> T:
    """An instance of wire dataclass ``cls`` with valid field values (its ``__post_init__``
    may refuse some: then its fields' minimal values are tried)."""
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    values = [value_for(src, hints[f.name], dict(f.metadata)) for f in fields]
    try:
        return cls(*values)
    except (ValueError, TypeError):
        return cls(*[_minimal(hints[f.name], dict(f.metadata)) for f in fields])


def _minimal(tp: Any, meta: dict[str, Any]) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return None
    exact = meta.get("exact") or 0
    if tp is bool:
        return False
    if tp is int:
        return 1
    if tp is float:
        return 0.0
    if tp is str:
        return "x" * exact
    if tp is bytes:
        return bytes(exact)
    if typing.get_origin(tp) is tuple:
        return ()
    hints = typing.get_type_hints(tp)
    return tp(*[_minimal(hints[f.name], dict(f.metadata)) for f in dataclasses.fields(tp)])


# --------------------------------------------------------------------------- byte mutations

_INTERESTING_BYTES = (0x00, 0x01, 0x7F, 0x80, 0xFF, 0xC0, 0xC1, 0xC2, 0xC3, 0xC4, 0xCA, 0xCB, 0xCF,
                      0xD3, 0xD9, 0xDC, 0xDD, 0xDE, 0xDF, 0x90, 0x9F, 0xA0, 0xBF, 0x80, 0x8F)
# msgpack headers that announce far more than follows (length-field lies).
LYING_HEADERS = (
    b"\xc4\xff", b"\xc5\xff\xff", b"\xc6\xff\xff\xff\xff", b"\xc6\x7f\xff\xff\xff",  # bin 8/16/32
    b"\xd9\xff", b"\xda\xff\xff", b"\xdb\xff\xff\xff\xff",                           # str 8/16/32
    b"\xdc\xff\xff", b"\xdd\xff\xff\xff\xff", b"\xdd\x00\x10\x00\x00",               # array 16/32
    b"\xde\xff\xff", b"\xdf\xff\xff\xff\xff",                                         # map 16/32
    b"\xc7\xff\x01", b"\xc9\xff\xff\xff\xff\x01", b"\xd4\x01",                       # ext
    b"\x9f", b"\xbf", b"\x8f",                                                        # fix* at max
)


def nested(depth: int) -> bytes:
    """``depth`` nested one-element arrays around nil."""
    return b"\x91" * depth + b"\xc0"


def mutate_bytes(src: Source, data: bytes, corpus: Sequence[bytes] = ()) -> bytes:
    """1–4 byte-level mutations of ``data``."""
    out = bytearray(data)
    for _ in range(src.int(1, 4)):
        op = src.int(0, 9)
        pos = src.int(0, len(out))
        if op == 0 and out:  # flip one bit
            i = min(pos, len(out) - 1)
            out[i] ^= 1 << src.int(0, 7)
        elif op == 1 and out:  # an interesting byte
            out[min(pos, len(out) - 1)] = choice(src, _INTERESTING_BYTES)
        elif op == 2:  # truncate
            del out[pos:]
        elif op == 3:  # extend
            out += src.bytes(src.int(1, 64))
        elif op == 4:  # insert
            out[pos:pos] = src.bytes(src.int(1, 16))
        elif op == 5:  # delete a slice
            del out[pos:pos + src.int(1, 16)]
        elif op == 6:  # duplicate a slice
            end = min(len(out), pos + src.int(1, 32))
            out[pos:pos] = out[pos:end]
        elif op == 7 and corpus:  # splice with another frame
            other = choice(src, corpus)
            out = out[:pos] + other[src.int(0, len(other)):]
        elif op == 8:  # a lying length header
            out[pos:pos] = choice(src, LYING_HEADERS)
        else:  # overwrite a slice with random bytes
            n = src.int(1, 8)
            out[pos:pos + n] = src.bytes(n)
    return bytes(out)


# --------------------------------------------------------------------------- structure mutations


def weird_value(src: Source) -> Any:
    """A msgpack value of any type, often an extreme one."""
    k = src.int(0, 17)
    if 8 <= k <= 13:
        return _weird_container(src, k)
    return _weird_atom(src, k)


def _weird_atom(src: Source, k: int) -> Any:
    """:func:`weird_value`'s ``k``-th kind of atom (nil, bool, numbers, strings, bytes, ext): ``k``
    within 0..7 or 14..17."""
    if k == 0:
        return None
    if k == 1:
        return bool(src.int(0, 1))
    if k == 2:
        return choice(src, (0, -1, 1, 2**31, 2**32, 2**63 - 1, -(2**63), 2**64 - 1, 255, 65535, 65536))
    if k == 3:
        return src.int(-(2**63), 2**64 - 1)
    if k == 4:
        return choice(src, (0.0, -0.0, float("nan"), float("inf"), float("-inf"), 1e308, 5e-324))
    if k == 5:
        return "x" * choice(src, (0, 1, 16, 17, 63, 64, 65, 129, 1025, 70_000))
    if k == 6:
        return src.bytes(choice(src, (0, 1, 7, 8, 15, 16, 17, 19, 20, 21, 31, 32, 33, 63, 64, 65, 267)))
    if k == 7:
        return bytes(choice(src, (1025, 4097, 70_000, codec.DEFAULT_MAX_STR + 1)))
    if k == 14:
        return "".join(chr(src.int(0, 0x10FFFF)) for _ in range(src.int(1, 8))
                       ).encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    if k == 15:
        return msgpack.ExtType(src.int(0, 127), src.bytes(src.int(0, 8)))
    if k == 16:
        return src.int(-40, 300)
    return src.bytes(src.int(0, 40))


def _weird_container(src: Source, k: int) -> Any:
    """:func:`weird_value`'s ``k``-th kind of array or map: ``k`` within 8..13."""
    if k == 8:
        return []
    if k == 9:
        return [weird_value(src) for _ in range(src.int(1, 3))]
    if k == 10:
        return {}
    if k == 11:
        return {"k": weird_value(src)}
    if k == 12:  # deep nesting
        v: Any = None
        for _ in range(src.int(2, 200)):
            v = [v]
        return v
    # a big array of small ints (token ids, lengths...)
    return [src.int(0, 300)] * choice(src, (17, 65, 257, 1025, 4097, 65_537))


def _nodes(obj: Any, path: tuple[int, ...] = (), out: list[tuple[int, ...]] | None = None,
           limit: int = 400) -> list[tuple[int, ...]]:
    """Paths of the nodes of a decoded msgpack tree (lists only; at most ``limit``)."""
    out = [] if out is None else out
    out.append(path)
    if isinstance(obj, list):
        for i, v in enumerate(obj):
            if len(out) >= limit:
                break
            _nodes(v, (*path, i), out, limit)
    return out


def _get(obj: Any, path: tuple[int, ...]) -> Any:
    for i in path:
        obj = obj[i]
    return obj


def _set(obj: Any, path: tuple[int, ...], value: Any) -> Any:
    if not path:
        return value
    _get(obj, path[:-1])[path[-1]] = value
    return obj


def _copy(obj: Any) -> Any:
    return [_copy(v) for v in obj] if isinstance(obj, list) else obj


def mutate_tree(src: Source, obj: Any, corpus: Sequence[Any] = ()) -> Any:
    """1–3 structural mutations of a decoded msgpack tree (a copy is changed)."""
    obj = _copy(obj)
    for _ in range(src.int(1, 3)):
        nodes = _nodes(obj)
        path = choice(src, nodes)
        node = _get(obj, path)
        op = src.int(0, 8)
        if op <= 2:  # replace a value
            obj = _set(obj, path, weird_value(src))
        elif op == 3 and isinstance(node, list) and node:  # drop an element
            del node[src.int(0, len(node) - 1)]
        elif op == 4 and isinstance(node, list):  # add or duplicate an element
            extra = _copy(choice(src, node)) if node and chance(src, 50) else weird_value(src)
            node.insert(src.int(0, len(node)), extra)
        elif op == 5 and isinstance(node, list) and len(node) >= 2:  # swap two elements
            i, j = src.int(0, len(node) - 1), src.int(0, len(node) - 1)
            node[i], node[j] = node[j], node[i]
        elif op == 6 and corpus and isinstance(obj, list) and len(obj) >= 2:
            # another message's fields under this header, or this one's under another's
            other = _copy(choice(src, corpus))
            if isinstance(other, list) and len(other) >= 2:
                obj = obj[:2] + other[2:] if chance(src, 50) else other[:2] + obj[2:]
        elif op == 7 and isinstance(obj, list) and len(obj) >= 2:  # another type code or version
            slot = src.int(0, 1)
            obj[slot] = choice(src, (0, 1, 2, 255, 65535, 65536, -1, src.int(0, 500), "1", None))
        elif op == 8 and isinstance(node, list) and node:  # grow an array past its bound
            n = choice(src, (17, 65, 257, 1025, 4097, 65_537))
            item = max(len(pack(x)) for x in node)
            n = min(n, 1_000_000 // item)  # at most about 1 MB: bounds the harness's own memory
            if n > len(node):
                obj = _set(obj, path, (node * (n // len(node) + 1))[:n])
    return obj


def pack(obj: Any) -> bytes:
    """``obj`` as msgpack (the codec's form: bin for bytes, str for str)."""
    return msgpack.packb(obj, use_bin_type=True)  # type: ignore[no-any-return]


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


# --------------------------------------------------------------------------- whole inputs

MODES = ("valid", "bytes", "tree", "tree+bytes", "random", "nested", "lying")


def payload(src: Source, corpus: Sequence[bytes]) -> tuple[str, bytes]:
    """One input for a decoder: ``(mode, bytes)``, from a corpus of valid payloads.

    Modes: a valid payload as it is; byte mutations; structure mutations; both; random bytes;
    deep nesting; a lone lying header with a little data after it.
    """
    mode = choice(src, MODES)
    base = choice(src, corpus)
    if mode == "valid":
        return mode, base
    if mode == "bytes":
        return mode, mutate_bytes(src, base, corpus)
    if mode in ("tree", "tree+bytes"):
        try:
            tree = unpack(base)
        except (ValueError, msgpack.UnpackException):  # the corpus is not msgpack (protobuf...)
            return mode, mutate_bytes(src, base, corpus)
        out = pack(mutate_tree(src, tree, [unpack(c) for c in corpus[:64]]))
        return mode, mutate_bytes(src, out, corpus) if mode == "tree+bytes" else out
    if mode == "random":
        return mode, src.bytes(choice(src, (0, 1, 2, 5, 16, 64, 267, 512)))
    if mode == "nested":
        return mode, nested(choice(src, (10, 100, 1000, 10_000, 100_000)))
    return mode, choice(src, LYING_HEADERS) + src.bytes(src.int(0, 16))
