"""Signed membership lists from the verifier committee: the format, its verification, and a refreshing client.

At each height the committee's validators sign, with their CometBFT validator keys (Ed25519), the
digests of the user list and of the model list (docs/committee.md "Signed lists"). Any verifier
serves a list with the signatures through ABCI Query (``/lists/users``, ``/lists/models``), which a
client reads through CometBFT's RPC ``abci_query``. This module is the client side and the one
definition of the format (the verifier imports it; overlay never imports the verifier).

A served document (a full list) is the msgpack array::

    [LISTS_VERSION, chain_id, height, time, kind, list, users_digest, models_digest, validators, signatures]

- ``time``: the BFT time (whole Unix seconds) of the block at ``height``, the time of the lists; the
  validators sign it, so a client can tell how old a list is whoever serves it.
- ``kind``: :data:`KIND_USERS` or :data:`KIND_MODELS`; ``list`` (bin) is the msgpack array of the
  records of that kind, each ``[node_id, ed25519, role, x25519, address, region, model_id,
  capacity, expires_at]``, sorted by node id; its SHA-256 is that kind's digest. Model records
  carry two more fields: ``reputation`` (10th), the committee's reputation of the node in fixed
  point (10^6 = 1.0, verifier/audit/reputation.py), and ``audited`` (11th, a bool), whether the
  node's model is audited (validators with more than 2/3 of the power hold it; decision 0013).
  The model list holds every registered model node, untrusted ones too (reputation under
  :data:`overlay.net.peers.TRUST_LINE`), so audits can reach them; both fields reach users as
  :attr:`overlay.net.peers.PeerEntry.reputation` and :attr:`~overlay.net.peers.PeerEntry.audited`, and
  clients send prompts only to trusted nodes of audited models (:func:`overlay.net.peers.usable`).
- ``validators``: the committee as of ``height``, ``[[ed25519_public, power], ...]`` sorted by key;
  its digest is SHA-256 of that array's msgpack encoding.
- ``signatures``: ``[[ed25519_public, signature], ...]``, each over :func:`signing_message` of
  (chain id, height, time, users digest, models digest, validators digest).

A **delta** (query ``/lists/users/since/H``, ``/lists/models/since/H``: what changed since the
client's held height ``H``, as Tor's consensus diffs) is the msgpack array::

    [LISTS_VERSION, chain_id, height, time, kind, since, removed, added, users_digest, models_digest,
     validators, signatures]

with the same certificate as the full list at ``height`` (the same digests and signatures),
``since`` = ``H``, ``removed`` (bin) the node ids (20 bytes each, sorted) no longer on the list and
``added`` (bin) the msgpack array of the records added or changed since ``H``, sorted by node id.
The client applies it to the list it holds at ``H`` (its per-record bytes) and accepts the result
only if the SHA-256 of the resulting list bytes is the signed digest: a delta is exactly as
trustworthy as the full list. Any failure falls back to the full list.

A client holds a validator set (first the pinned genesis keys and powers) and accepts a document
only if distinct validators of the set it holds, with more than 2/3 of its voting power, signed it,
its height is not below the one it holds, its time is at most :data:`MAX_LIST_AGE_S` (plus
:data:`CLOCK_AHEAD_S` for a client clock ahead of the committee's) before the client's clock, and
every record decodes strictly. When the document's validator set differs from the held one, the
client adopts it after accepting the document: more than 2/3 of the set it trusted vouched for it
(how committee changes reach clients). A client's view leaves out the records whose ``expires_at``
is at or before its clock (docs/committee.md "Signed lists").
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import logging
import random
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import trio

from overlay.directory.registry import Registry
from overlay.directory.rpc import RpcError, abci_value
from overlay.net.peers import PeerEntry
from overlay.wire import crypto
from overlay.wire.clock import Clock, TrioClock
from overlay.wire.constants import (
    MAX_CHAIN_ID,
    MAX_VALIDATORS,
    REPUTATION_SCALE,
    ROLE_MODEL,
    ROLE_NAMES,
    ROLE_USER,
)
from overlay.wire.identity import ID_PERSON, NODE_ID_LEN

log = logging.getLogger("gentorrent.committee")

LISTS_VERSION = 4  # 2: model records carry reputation; 3: and the audited flag; 4: the signed time, deltas
LISTS_CONTEXT = b"gentorrent/committee-lists/v2\x00"  # v2: the message holds the lists' block time
KIND_USERS, KIND_MODELS = 1, 2
KIND_PATHS = {KIND_USERS: "/lists/users", KIND_MODELS: "/lists/models"}
SINCE = "/since/"  # KIND_PATHS[kind] + SINCE + str(held height): the delta query
MAX_LIST_BYTES = 32 * 1024 * 1024
MAX_RECORDS = 200_000
DIGEST_LEN = 32
REFRESH_S = 10.0
FETCH_TIMEOUT_S = 10.0
# A list is refused once its signed time is more than MAX_LIST_AGE_S + CLOCK_AHEAD_S before the
# client's clock. The committee makes a block (and so a newer list time) every second or so
# (CometBFT's timeout_commit, 1 s, with empty blocks); a verifier serves the lists of the last
# certified height, a second or two old. MAX_LIST_AGE_S covers that, a few rounds of a slow chain
# and the refresh interval; CLOCK_AHEAD_S a client clock that runs ahead of the validators'. Their
# sum bounds how long a replayed old list can pass as fresh (issue 28's goal: 60 s).
MAX_LIST_AGE_S = 30.0
CLOCK_AHEAD_S = 10.0
FANOUT = 2  # verifiers asked at once per refresh (random order); the newest list that verifies is kept


class ListError(RpcError):
    """A signed list was refused (bad format, too few valid signatures, older than held); says why.
    An :class:`~overlay.directory.rpc.RpcError`: a verifier served something a client cannot use."""


@dataclass(frozen=True, slots=True)
class ValidatorKey:
    """A committee member as clients pin it: its CometBFT validator key (Ed25519) and voting power."""

    public_key: bytes
    power: int


def validators_wire(validators: Sequence[ValidatorKey]) -> list[list[object]]:
    return [[v.public_key, v.power] for v in sorted(validators, key=lambda v: v.public_key)]


def validators_digest(validators: Sequence[ValidatorKey]) -> bytes:
    return crypto.sha256(_pack(validators_wire(validators)))


def signing_message(chain_id: str, height: int, time_s: int, users_digest: bytes, models_digest: bytes,
                    vals_digest: bytes) -> bytes:
    """What each validator signs for ``height``: context, chain id, height, the lists' block time
    (Unix seconds), the three digests."""
    chain = chain_id.encode()
    if not 0 < len(chain) <= MAX_CHAIN_ID or not 0 <= height < 2**63 or not 0 <= time_s < 2**63:
        raise ValueError("chain id must be 1-50 bytes, height and time 0..2^63-1")
    if not len(users_digest) == len(models_digest) == len(vals_digest) == DIGEST_LEN:
        raise ValueError("digests are 32 bytes")
    return (LISTS_CONTEXT + bytes([len(chain)]) + chain + height.to_bytes(8, "big") + time_s.to_bytes(8, "big")
            + users_digest + models_digest + vals_digest)


def _pack(obj: object) -> bytes:
    out: bytes = msgpack.packb(obj, use_bin_type=True)
    return out


def array_header(n: int) -> bytes:
    """msgpack's array header for ``n`` items, as msgpack itself writes it (a list's bytes are this
    header and its records' bytes, so a client rebuilds them from the records it holds)."""
    if n < 16:
        return bytes([0x90 | n])
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def encode_document(chain_id: str, height: int, time_s: int, kind: int, list_bytes: bytes, users_digest: bytes,
                    models_digest: bytes, validators: Sequence[ValidatorKey],
                    signatures: Sequence[tuple[bytes, bytes]]) -> bytes:
    """The served full list (the verifier's side)."""
    return _pack([LISTS_VERSION, chain_id, height, time_s, kind, list_bytes, users_digest, models_digest,
                  validators_wire(validators), [[k, s] for k, s in sorted(signatures)]])


def encode_delta(chain_id: str, height: int, time_s: int, kind: int, since: int, removed: Sequence[bytes],
                 added: bytes, users_digest: bytes, models_digest: bytes, validators: Sequence[ValidatorKey],
                 signatures: Sequence[tuple[bytes, bytes]]) -> bytes:
    """The served delta (the verifier's side): ``removed`` node ids (sorted), ``added`` the msgpack
    array of the added or changed records (sorted by node id), with the full list's certificate."""
    return _pack([LISTS_VERSION, chain_id, height, time_s, kind, since, b"".join(removed), added, users_digest,
                  models_digest, validators_wire(validators), [[k, s] for k, s in sorted(signatures)]])


@dataclass(frozen=True, slots=True)
class SignedList:
    """A verified list: its height and signed time, its entries (sorted by node id) with each
    record's bytes and ``expires_at`` (so a delta can be applied and the digest recomputed without
    re-encoding), and the validator set that signed it."""

    chain_id: str
    height: int
    kind: int
    entries: tuple[PeerEntry, ...]
    validators: tuple[ValidatorKey, ...]
    signers: frozenset[bytes]
    digest: bytes  # SHA-256 of the list's bytes (the signed digest of its kind)
    time_s: int  # the block time of ``height``, as the validators signed it
    raws: tuple[bytes, ...]  # each entry's record bytes, as in the list
    expires: tuple[int, ...]  # each entry's expires_at (block time)


def _typed(value: Any, tp: type, what: str) -> Any:
    if type(value) is not tp:
        raise ListError(f"{what}: expected {tp.__name__}, got {type(value).__name__}")
    return value


_RECORD_TYPES = (bytes, bytes, int, bytes, str, str, str, int, int)
_MODEL_RECORD_TYPES = (*_RECORD_TYPES, int, bool)  # + reputation, audited
_ENTRY_FIELDS = ("node_id", "address", "ed25519_public", "x25519_public", "region", "role", "models", "reputation",
                 "audited")


def _entry_maker() -> Callable[..., PeerEntry]:
    """A constructor of :class:`PeerEntry` from its fields in order, ~30 % cheaper than its frozen
    dataclass ``__init__`` (which calls ``object.__setattr__`` per field): it fills the slots through
    their descriptors. Falls back to the plain constructor if PeerEntry's fields ever change."""
    if tuple(f.name for f in dataclasses.fields(PeerEntry)) != _ENTRY_FIELDS \
            or not all(hasattr(PeerEntry.__dict__.get(n), "__set__") for n in _ENTRY_FIELDS):
        return PeerEntry
    new = object.__new__
    s0, s1, s2, s3, s4, s5, s6, s7, s8 = (PeerEntry.__dict__[n].__set__ for n in _ENTRY_FIELDS)

    def make(node_id: bytes, address: str, ed: bytes, x: bytes, region: str, role: str,
             models: tuple[str, ...], reputation: int | None, audited: bool | None) -> PeerEntry:
        e = new(PeerEntry)
        s0(e, node_id)
        s1(e, address)
        s2(e, ed)
        s3(e, x)
        s4(e, region)
        s5(e, role)
        s6(e, models)
        s7(e, reputation)
        s8(e, audited)
        return e

    return make


_make_entry = _entry_maker()


def _entries(records: Iterable[Any], kind: int) -> tuple[tuple[PeerEntry, ...], tuple[int, ...]]:
    """Every record as a :class:`PeerEntry` with its ``expires_at``, each field typed and bounded,
    the list of one role and strictly sorted by node id. The hot loop of a refresh (10,000 records
    a list): one pass, locals only, the node id hashed with :mod:`hashlib` directly; the checks are
    those of :func:`overlay.wire.identity.node_id_of` and :func:`overlay.net.transport.parse_address`."""
    want_role = ROLE_USER if kind == KIND_USERS else ROLE_MODEL
    role_name = ROLE_NAMES[want_role]
    model = want_role == ROLE_MODEL
    blake, types, entry = hashlib.blake2b, _MODEL_RECORD_TYPES if model else _RECORD_TYPES, _make_entry
    out = []
    expires = []
    prev = b""
    reputation: int | None = None
    audited: bool | None = None
    for i, rec in enumerate(records):
        if type(rec) is not tuple or tuple(map(type, rec)) != types:
            raise ListError(f"record {i}: not [node_id, ed25519, role, x25519, address, region, model_id, "
                            f"capacity, expires{', reputation, audited' if model else ''}] with those types")
        if model:
            node_id, ed, role, x, address, region, model_id, _capacity, expires_at, reputation, audited = rec
            if not 0 <= reputation <= REPUTATION_SCALE:
                raise ListError(f"record {i}: reputation {reputation} outside 0..{REPUTATION_SCALE}")
        else:
            node_id, ed, role, x, address, region, model_id, _capacity, expires_at = rec
        if len(ed) != 32 or len(x) != 32 or node_id != blake(ed, digest_size=NODE_ID_LEN, person=ID_PERSON).digest():
            raise ListError(f"record {i}: keys of the wrong size, or a node id that is not its key's")
        if role != want_role:
            raise ListError(f"record {i}: the {role_name} list holds another role")
        if not 0 < len(region) <= 64 or len(model_id) > 128 or model != bool(model_id):
            raise ListError(f"record {i}: bad region or model id (a model node has one, a user node none)")
        if node_id <= prev:
            raise ListError(f"the {role_name} list is not sorted by node id (record {i})")
        prev = node_id
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit() or int(port) > 65535:
            raise ListError(f"record {i}: address {address[:80]!r} is not host:port")
        out.append(entry(node_id, address, ed, x, region, role_name, (model_id,) if model_id else (), reputation,
                         audited))
        expires.append(expires_at)
    return tuple(out), tuple(expires)


# msgpack first bytes of arrays and maps (fixarray, fixmap, array 16/32, map 16/32)
_CONTAINER = frozenset((*range(0x80, 0xA0), 0xDC, 0xDD, 0xDE, 0xDF))


def _unpacker(raw: bytes, max_array: int) -> msgpack.Unpacker:
    u = msgpack.Unpacker(raw=False, use_list=False, strict_map_key=True, max_buffer_size=max(len(raw), 1),
                         max_bin_len=MAX_LIST_BYTES, max_str_len=4096, max_array_len=max_array, max_map_len=0,
                         max_ext_len=0)
    u.feed(raw)
    return u


def _split_records(raw: bytes, what: str, *, by_shape: bool) -> tuple[list[Any], list[bytes]]:
    """The records of a list's bytes (a msgpack array of records) and each record's own bytes.

    ``by_shape``: read each record as an array of at most 11 scalars, so that bytes no signature
    has vouched for yet (a delta's added records) cost no more than they take; a signed full list's
    records are read whole (the digest was checked first)."""
    u = _unpacker(raw, MAX_RECORDS)
    records: list[Any] = []
    raws: list[bytes] = []
    try:
        n = u.read_array_header()
        at = u.tell()
        for _ in range(n):
            if by_shape:
                fields = u.read_array_header()
                if fields > 11:
                    raise ListError(f"{what}: a record of {fields} fields")
                rec = []
                for _ in range(fields):
                    if u.tell() >= len(raw) or raw[u.tell()] in _CONTAINER:
                        raise ListError(f"{what}: a record has an array or map where a value belongs")
                    rec.append(u.unpack())
                records.append(tuple(rec))
            else:
                records.append(u.unpack())
            end = u.tell()
            raws.append(raw[at:end])
            at = end
    except (ValueError, TypeError, RecursionError, msgpack.UnpackException) as exc:
        raise ListError(f"{what} is not strict msgpack ({type(exc).__name__})") from None
    if u.tell() != len(raw):
        raise ListError(f"{what} has trailing bytes")
    return records, raws


def _read_fields(raw: bytes, n_scalars: int) -> list[Any]:
    """The fields of a served document, read by shape: ``n_scalars`` scalars, then the validators
    and signatures as arrays (at most :data:`MAX_VALIDATORS`) of 2-scalar arrays, so that a hostile
    verifier's nested arrays cost no more than the bytes they take (unpacking the whole document
    first let 3 MB of nested empty arrays take 195 MB, docs/fuzzing.md)."""
    u = _unpacker(raw, MAX_VALIDATORS)

    def scalar() -> Any:
        at = u.tell()
        if at >= len(raw) or raw[at] in _CONTAINER:
            raise ListError("the signed list has an array or map where a value belongs")
        return u.unpack()

    def pairs() -> list[list[Any]]:
        return [[scalar(), scalar()] if u.read_array_header() == 2 else _bad_pair() for _ in range(u.read_array_header())]

    try:
        if u.read_array_header() != n_scalars + 2:
            raise ListError(f"the signed list is not a {n_scalars + 2}-field array; is this verifier another version?")
        doc = [scalar() for _ in range(n_scalars)] + [pairs(), pairs()]
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise ListError(f"the signed list is not strict msgpack of the expected shape ({type(exc).__name__})") from None
    if u.tell() != len(raw):
        raise ListError("the signed list has trailing bytes")
    return doc


def _bad_pair() -> list[Any]:
    raise ListError("a validator or signature is not a 2-field array")


def _signature_pairs(sigs: Iterable[Any]) -> Iterator[tuple[bytes, bytes]]:
    """The document's ``[key, signature]`` arrays as pairs; :class:`ListError` at the first other."""
    for s in sigs:
        if type(s) is not list or len(s) != 2 or type(s[0]) is not bytes or type(s[1]) is not bytes:
            raise ListError("a signature is not [key, signature]")
        yield s[0], s[1]


def _head(version: Any, chain: Any, height: Any, time_s: Any, got_kind: Any, chain_id: str, kind: int) -> None:
    if _typed(version, int, "version") != LISTS_VERSION:
        raise ListError(f"signed list format {version}; this client reads {LISTS_VERSION}")
    if _typed(chain, str, "chain id") != chain_id:
        raise ListError(f"the list is from chain {chain[:50]!r}, not the pinned committee {chain_id!r}")
    _typed(height, int, "height")
    _typed(time_s, int, "time")
    if _typed(got_kind, int, "kind") != kind:
        raise ListError(f"asked for list kind {kind}, got {got_kind}")
    if not 0 <= height < 2**63 or not 0 <= time_s < 2**63:
        raise ListError(f"height {height} or time {time_s} out of range")


def _certificate(chain_id: str, held: Sequence[ValidatorKey], height: int, time_s: int, users_d: Any, models_d: Any,
                 vals: Any, sigs: Any, *, min_height: int, now: float | None,
                 max_age: float) -> tuple[tuple[ValidatorKey, ...], frozenset[bytes]]:
    """Check a document's certificate (digests, validators, > 2/3 of ``held``'s power, height, age);
    the document's validators and the keys that signed. :class:`ListError` says why not."""
    for value, what in ((users_d, "users digest"), (models_d, "models digest")):
        _typed(value, bytes, what)
    if len(users_d) != DIGEST_LEN or len(models_d) != DIGEST_LEN:
        raise ListError("digests must be 32 bytes")
    if type(vals) is not list or not 0 < len(vals) <= MAX_VALIDATORS or type(sigs) is not list or len(sigs) > len(vals):
        raise ListError("bad validators or signatures array")
    validators: list[ValidatorKey] = []
    for v in vals:
        if type(v) is not list or len(v) != 2 or type(v[0]) is not bytes or len(v[0]) != 32 \
                or type(v[1]) is not int or not 0 < v[1] < 2**62:
            raise ListError("a validator is not [32-byte key, power > 0]")
        validators.append(ValidatorKey(v[0], v[1]))
    if validators_wire(validators) != vals or len({v.public_key for v in validators}) != len(validators):
        raise ListError("validators are not sorted and distinct")
    if height < min_height:
        raise ListError(f"the list is at height {height}, older than the height {min_height} already held; "
                        "ask another verifier")
    if now is not None and now - time_s > max_age:
        raise ListError(f"the list at height {height} was signed {now - time_s:.0f} s ago, more than the "
                        f"{max_age:g} s a client accepts (a verifier replaying an old list, a halted committee, or "
                        "this machine's clock is wrong): ask another verifier")
    message = signing_message(chain_id, height, time_s, users_d, models_d, validators_digest(validators))
    power = {v.public_key: v.power for v in held}
    total = sum(power.values())
    signers = crypto.valid_signers(_signature_pairs(sigs), power, message)
    signed = sum(power[k] for k in signers)
    if 3 * signed <= 2 * total:
        raise ListError(f"valid signatures from validators with {signed} of {total} voting power; more than 2/3 "
                        "are required (a verifier serving this may be faulty: ask another)")
    return tuple(validators), frozenset(signers)


def verify_document(raw: bytes, chain_id: str, held: Sequence[ValidatorKey], *, kind: int,
                    min_height: int = 0, known: SignedList | None = None, now: float | None = None,
                    max_age: float = MAX_LIST_AGE_S + CLOCK_AHEAD_S) -> SignedList:
    """Decode a full list ``raw`` strictly and accept it only as described in the module docstring.

    ``held`` is the validator set the client trusts; ``min_height`` the height of the list it holds
    (an older one is refused, the same height is accepted). ``now``: the client's Unix time; a list
    signed more than ``max_age`` seconds before it is refused (None: no age check, for tools that
    only read a list). ``known``: a list verified before; when the new document's list has the same
    SHA-256 (the same bytes, most refreshes), its entries are reused instead of decoding the records
    again; everything else (signatures, digests, height, time) is checked as always. Raises
    :class:`ListError` saying why.
    """
    version, chain, height, time_s, got_kind, list_bytes, users_d, models_d, vals, sigs = _read_fields(raw, 8)
    _head(version, chain, height, time_s, got_kind, chain_id, kind)
    _typed(list_bytes, bytes, "list")
    validators, signers = _certificate(chain_id, held, height, time_s, users_d, models_d, vals, sigs,
                                       min_height=min_height, now=now, max_age=max_age)
    list_digest = crypto.sha256(list_bytes)
    if list_digest != (users_d if kind == KIND_USERS else models_d):
        raise ListError("the list does not match the digest the committee signed (tampered or truncated)")
    if known is not None and known.kind == kind and known.digest == list_digest:
        # the same bytes, decoded and checked when ``known`` was verified
        entries, raws, expires = known.entries, known.raws, known.expires
    else:
        records, raw_list = _split_records(list_bytes, "the list", by_shape=False)
        entries, expires = _entries(records, kind)
        raws = tuple(raw_list)
    return SignedList(chain_id, height, kind, entries, validators, signers, list_digest, time_s, raws, expires)


def apply_delta(raw: bytes, chain_id: str, held_validators: Sequence[ValidatorKey], base: SignedList, *,
                now: float | None = None, max_age: float = MAX_LIST_AGE_S + CLOCK_AHEAD_S) -> SignedList:
    """Apply the delta document ``raw`` to ``base`` (the list the client holds) and accept the result
    only if its bytes hash to the digest the validators signed; the checks on the certificate are
    :func:`verify_document`'s (``base.height`` is the least height taken). Only the added records
    are decoded; the others keep their bytes and entries. Raises :class:`ListError` saying why."""
    (version, chain, height, time_s, got_kind, since, removed, added, users_d, models_d, vals,
     sigs) = _read_fields(raw, 10)
    kind = base.kind
    _head(version, chain, height, time_s, got_kind, chain_id, kind)
    if _typed(since, int, "since") != base.height:
        raise ListError(f"a delta since height {since}, but the list held is at height {base.height}")
    _typed(removed, bytes, "removed")
    _typed(added, bytes, "added")
    if len(removed) % NODE_ID_LEN:
        raise ListError("the removed node ids are not 20 bytes each")
    validators, signers = _certificate(chain_id, held_validators, height, time_s, users_d, models_d, vals, sigs,
                                       min_height=base.height, now=now, max_age=max_age)
    gone = [removed[i:i + NODE_ID_LEN] for i in range(0, len(removed), NODE_ID_LEN)]
    if any(b <= a for a, b in itertools.pairwise(gone)):
        raise ListError("the removed node ids are not sorted and distinct")
    records, raw_list = _split_records(added, "the delta's added records", by_shape=True)
    new_entries, new_expires = _entries(records, kind)
    table = {e.node_id: (r, e, x) for e, r, x in zip(base.entries, base.raws, base.expires, strict=True)}
    for node_id in gone:
        table.pop(node_id, None)  # a node added and removed within the delta's span is not held: no-op
    for e, r, x in zip(new_entries, raw_list, new_expires, strict=True):
        table[e.node_id] = (r, e, x)
    order = sorted(table)
    rows = [table[i] for i in order]
    list_bytes = array_header(len(rows)) + b"".join([r for r, _, _ in rows])
    digest = crypto.sha256(list_bytes)
    if digest != (users_d if kind == KIND_USERS else models_d):
        raise ListError("the list after the delta does not match the digest the committee signed (a tampered or "
                        "wrong delta): fetching the full list")
    return SignedList(chain_id, height, kind, tuple(e for _, e, _ in rows), validators, signers, digest, time_s,
                      tuple(r for r, _, _ in rows), tuple(x for _, _, x in rows))


def load_genesis(path: str) -> tuple[str, tuple[ValidatorKey, ...]]:
    """The committee's chain id and validator keys, from its CometBFT ``genesis.json`` (the file
    ``gentorrent verifier genesis`` writes and every member holds). Pinning this file is how a node
    trusts a committee; :class:`ListError` says what is wrong with it."""
    import base64
    import json

    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read(1 << 22))
    except OSError as exc:
        raise ListError(f"committee genesis {path}: {exc.strerror or exc}") from None
    except ValueError:
        raise ListError(f"committee genesis {path} is not JSON (pass the committee's genesis.json)") from None
    chain = doc.get("chain_id") if isinstance(doc, dict) else None
    vals = doc.get("validators") if isinstance(doc, dict) else None
    if not isinstance(chain, str) or not 0 < len(chain.encode()) <= MAX_CHAIN_ID or not isinstance(vals, list) \
            or not 0 < len(vals) <= MAX_VALIDATORS:
        raise ListError(f"committee genesis {path}: no chain_id or validators; is this a CometBFT genesis.json?")
    keys: list[ValidatorKey] = []
    for i, v in enumerate(vals):
        try:
            pub = v["pub_key"]
            if pub["type"] != "tendermint/PubKeyEd25519":
                raise ValueError("not an Ed25519 key")
            key = base64.b64decode(pub["value"], validate=True)
            power = int(v["power"])
            if len(key) != 32 or not 0 < power < 2**62:
                raise ValueError("bad key size or power")
        except (KeyError, TypeError, ValueError) as exc:
            raise ListError(f"committee genesis {path}: validators[{i}]: {exc}") from None
        keys.append(ValidatorKey(key, power))
    if len({k.public_key for k in keys}) != len(keys):
        raise ListError(f"committee genesis {path}: a validator key appears twice")
    return chain, tuple(keys)


# --------------------------------------------------------------------------- the client

Fetch = Callable[[str, str], Awaitable[bytes]]  # (verifier RPC address, query path) -> document bytes


class CommitteeClient:
    """Holds the latest verified user and model lists, fetched from ``addresses``.

    I/O goes through ``fetch`` (default: :func:`overlay.directory.rpc.abci_value`, CometBFT's RPC over HTTP), so the
    core can be tested without a network. Each :meth:`refresh` asks the verifiers in a random order
    (``rng``), :data:`FANOUT` at a time, and keeps the newest list that verifies, so one verifier
    replaying an old list cannot hold a client back while another one serves the current list; it
    stops after the first group that gave a list. A held list is refreshed by delta (only what
    changed since its height), falling back to the full list when the delta is refused. A list
    whose signed time is more than ``max_age`` seconds before ``clock.unix()`` is refused.
    :meth:`registry` leaves out records expired on ``clock.unix()``; :meth:`list_age` says how old
    the held lists are; :meth:`run` refreshes every ``interval`` seconds (trio time).
    """

    def __init__(self, addresses: Sequence[str], chain_id: str, validators: Sequence[ValidatorKey], *,
                 fetch: Fetch | None = None, clock: Clock | None = None, interval: float = REFRESH_S,
                 fetch_timeout: float = FETCH_TIMEOUT_S, max_age: float = MAX_LIST_AGE_S + CLOCK_AHEAD_S,
                 fanout: int = FANOUT, rng: random.Random | None = None, deltas: bool = True) -> None:
        if not addresses:
            raise ValueError("name at least one verifier RPC address (--committee HOST:PORT,...)")
        if not validators:
            raise ValueError("pin the committee's validator keys")
        if fanout < 1:
            raise ValueError("fanout: ask at least one verifier at a time")
        self.addresses = list(addresses)
        self.chain_id = chain_id
        self.validators: tuple[ValidatorKey, ...] = tuple(validators)
        self.fetch = fetch or abci_value
        self.clock = clock or TrioClock()
        self.interval = interval
        self.fetch_timeout = fetch_timeout
        self.max_age = max_age
        self.fanout = fanout
        self.rng = rng or random.Random()
        self.deltas = deltas
        self.lists: dict[int, SignedList] = {}
        self.errors: list[str] = []
        self.refreshed_at: float | None = None  # clock.monotonic() of the last refresh that verified
        # What refreshes cost: documents taken as deltas / as full lists, and the bytes fetched.
        self.delta_fetches = 0
        self.full_fetches = 0
        self.bytes_fetched = 0

    @property
    def height(self) -> int:
        return min((lst.height for lst in self.lists.values()), default=0)

    def registry(self) -> Registry:
        """The held lists as the :class:`Registry` nodes use (version = the lists' height), without
        the records whose ``expires_at`` is at or before ``clock.unix()``: the committee drops them
        at its next block, and a list that still holds them is an old one."""
        now = self.clock.unix()
        entries = [e for k in (KIND_USERS, KIND_MODELS) if k in self.lists
                   for e, expires in zip(self.lists[k].entries, self.lists[k].expires, strict=True) if expires > now]
        return Registry(self.height, entries)

    def list_age(self) -> float | None:
        """Seconds from the signed time of the oldest held list to ``clock.unix()`` (None before the
        first list; 0 when the committee's clock is ahead of this machine's)."""
        if not self.lists:
            return None
        return max(0.0, self.clock.unix() - min(lst.time_s for lst in self.lists.values()))

    def fresh(self) -> bool:
        """Whether both lists are held and no older than ``max_age``."""
        age = self.list_age()
        return len(self.lists) == 2 and age is not None and age <= self.max_age

    def verify(self, raw: bytes, kind: int) -> SignedList:
        """Verify the full list ``raw`` against the held set, height and the clock; keeps nothing."""
        held = self.lists.get(kind)
        return verify_document(raw, self.chain_id, self.validators, kind=kind, min_height=held.height if held else 0,
                               known=held, now=self.clock.unix(), max_age=self.max_age)

    def verify_delta(self, raw: bytes, kind: int) -> SignedList:
        """Apply the delta ``raw`` to the held list of ``kind`` and verify the result; keeps nothing."""
        held = self.lists.get(kind)
        if held is None:
            raise ListError("no list of this kind is held to apply a delta to")
        return apply_delta(raw, self.chain_id, self.validators, held, now=self.clock.unix(), max_age=self.max_age)

    def keep(self, got: SignedList) -> None:
        """Hold ``got`` (verified against the held set) and adopt its validator set."""
        self.lists[got.kind] = got
        if {(v.public_key, v.power) for v in got.validators} != {(v.public_key, v.power) for v in self.validators}:
            log.info("committee changed at height %d: now %d validators", got.height, len(got.validators))
            self.validators = got.validators

    def accept(self, raw: bytes, kind: int) -> SignedList:
        """Verify the full list ``raw`` (:meth:`verify`) and keep it."""
        got = self.verify(raw, kind)
        self.keep(got)
        return got

    async def _ask(self, address: str, kind: int) -> SignedList:
        """The list of ``kind`` from ``address``: a delta on the held list if one is held, else (or
        when the delta is refused) the full list. :class:`~overlay.directory.rpc.RpcError` (a refused list: :class:`ListError`), ``OSError`` or
        ``trio.TooSlowError`` when neither verifies."""
        held = self.lists.get(kind)
        with trio.fail_after(self.fetch_timeout):
            if held is not None and self.deltas:
                try:
                    raw = await self.fetch(address, f"{KIND_PATHS[kind]}{SINCE}{held.height}")
                    self.bytes_fetched += len(raw)
                    got = self.verify_delta(raw, kind)
                    self.delta_fetches += 1
                    return got
                except (RpcError, ValueError) as exc:
                    log.debug("%s: no usable delta since height %d (%s); fetching the full list", address,
                              held.height, exc)
            raw = await self.fetch(address, KIND_PATHS[kind])
            self.bytes_fetched += len(raw)
            got = self.verify(raw, kind)
            self.full_fetches += 1
            return got

    async def _ask_group(self, group: Sequence[str], kind: int, errors: list[str]) -> SignedList | None:
        """Ask every verifier of ``group`` at once; the newest list that verified (None if none)."""
        got: list[SignedList] = []

        async def one(address: str) -> None:
            try:
                got.append(await self._ask(address, kind))
            except trio.TooSlowError:
                errors.append(f"{address}: no answer within {self.fetch_timeout:g} s")
            except (RpcError, OSError, ValueError) as exc:
                errors.append(f"{address}: {exc}")

        async with trio.open_nursery() as nursery:
            for address in group:
                nursery.start_soon(one, address)
        return max(got, key=lambda lst: lst.height, default=None)

    async def refresh(self) -> Registry:
        """Fetch and verify both lists; raises :class:`ListError` listing each verifier's failure
        (the held lists stay)."""
        order = self.rng.sample(self.addresses, len(self.addresses))
        for kind in (KIND_USERS, KIND_MODELS):
            errors: list[str] = []
            best = None
            for start in range(0, len(order), self.fanout):
                best = await self._ask_group(order[start:start + self.fanout], kind, errors)
                if best is not None:
                    break
            if best is None:
                self.errors = errors
                raise ListError(f"no verifier served a {KIND_PATHS[kind]} list that verifies: " + "; ".join(errors))
            self.keep(best)
        self.errors = []
        self.refreshed_at = self.clock.monotonic()
        return self.registry()

    def age(self) -> float | None:
        """Seconds since the last verified refresh, on this machine's clock (None before the first);
        :meth:`list_age` says how old the lists themselves are."""
        return None if self.refreshed_at is None else self.clock.monotonic() - self.refreshed_at

    async def run(self, on_update: Callable[[Registry], None] | None = None) -> None:
        """Refresh forever, every ``interval`` seconds; failures are logged and the held lists kept."""
        while True:
            try:
                reg = await self.refresh()
            except ListError as exc:
                log.warning("committee lists not refreshed: %s", exc)
            else:
                if on_update is not None:
                    on_update(reg)
            await trio.sleep(self.interval)
