"""Signed membership lists from the verifier committee: the format, its verification, and a refreshing client.

At each height the committee's validators sign, with their CometBFT validator keys (Ed25519), the
digests of the user list and of the model list (docs/committee.md "Signed lists"). Any verifier
serves a list with the signatures through ABCI Query (``/lists/users``, ``/lists/models``), which a
client reads through CometBFT's RPC ``abci_query``. This module is the client side and the one
definition of the format (the verifier imports it; overlay never imports the verifier).

A served document is the msgpack array::

    [LISTS_VERSION, chain_id, height, kind, list, users_digest, models_digest, validators, signatures]

- ``kind``: :data:`KIND_USERS` or :data:`KIND_MODELS`; ``list`` (bin) is the msgpack array of the
  records of that kind, each ``[node_id, ed25519, role, x25519, address, region, model_id,
  capacity, expires_at]``, sorted by node id; its SHA-256 is that kind's digest. Model records
  carry two more fields: ``reputation`` (10th), the committee's reputation of the node in fixed
  point (10^6 = 1.0, verifier/audit/reputation.py), and ``audited`` (11th, a bool), whether the
  node's model is audited (validators with more than 2/3 of the power hold it; decision 0013).
  The model list holds every registered model node, untrusted ones too (reputation under
  :data:`overlay.peers.TRUST_LINE`), so audits can reach them; both fields reach users as
  :attr:`overlay.peers.PeerEntry.reputation` and :attr:`~overlay.peers.PeerEntry.audited`, and
  clients send prompts only to trusted nodes of audited models (:func:`overlay.peers.usable`).
- ``validators``: the committee as of ``height``, ``[[ed25519_public, power], ...]`` sorted by key;
  its digest is SHA-256 of that array's msgpack encoding.
- ``signatures``: ``[[ed25519_public, signature], ...]``, each over :func:`signing_message` of
  (chain id, height, users digest, models digest, validators digest).

A client holds a validator set (first the pinned genesis keys and powers) and accepts a document
only if distinct validators of the set it holds, with more than 2/3 of its voting power, signed it,
its height is not below the one it holds, and every record decodes strictly. When the document's
validator set differs from the held one, the client adopts it after accepting the document: more
than 2/3 of the set it trusted vouched for it (how committee changes reach clients).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import trio

from overlay import crypto
from overlay.clock import Clock, TrioClock
from overlay.peers import PeerEntry
from overlay.registry import Registry
from overlay.transport import parse_address

log = logging.getLogger("gentorrent.committee")

LISTS_VERSION = 3  # 2: model records carry the node's reputation; 3: and whether its model is audited
LISTS_CONTEXT = b"gentorrent/committee-lists/v1\x00"
KIND_USERS, KIND_MODELS = 1, 2
KIND_PATHS = {KIND_USERS: "/lists/users", KIND_MODELS: "/lists/models"}
ROLE_USER, ROLE_MODEL = 1, 2  # as in verifier/tx.py
MAX_LIST_BYTES = 32 * 1024 * 1024
MAX_RECORDS = 200_000
MAX_VALIDATORS = 1000
MAX_CHAIN_ID = 50
DIGEST_LEN = 32
REFRESH_S = 10.0
FETCH_TIMEOUT_S = 10.0


class ListError(Exception):
    """A signed list was refused (bad format, too few valid signatures, older than held); says why."""


@dataclass(frozen=True, slots=True)
class ValidatorKey:
    """A committee member as clients pin it: its CometBFT validator key (Ed25519) and voting power."""

    public_key: bytes
    power: int


def validators_wire(validators: Sequence[ValidatorKey]) -> list[list[object]]:
    return [[v.public_key, v.power] for v in sorted(validators, key=lambda v: v.public_key)]


def validators_digest(validators: Sequence[ValidatorKey]) -> bytes:
    return crypto.sha256(_pack(validators_wire(validators)))


def signing_message(chain_id: str, height: int, users_digest: bytes, models_digest: bytes,
                    vals_digest: bytes) -> bytes:
    """What each validator signs for ``height``: context, chain id, height, the three digests."""
    chain = chain_id.encode()
    if not 0 < len(chain) <= MAX_CHAIN_ID or not 0 <= height < 2**63:
        raise ValueError("chain id must be 1-50 bytes and height 0..2^63-1")
    if not len(users_digest) == len(models_digest) == len(vals_digest) == DIGEST_LEN:
        raise ValueError("digests are 32 bytes")
    return (LISTS_CONTEXT + bytes([len(chain)]) + chain + height.to_bytes(8, "big")
            + users_digest + models_digest + vals_digest)


def _pack(obj: object) -> bytes:
    out: bytes = msgpack.packb(obj, use_bin_type=True)
    return out


def encode_document(chain_id: str, height: int, kind: int, list_bytes: bytes, users_digest: bytes,
                    models_digest: bytes, validators: Sequence[ValidatorKey],
                    signatures: Sequence[tuple[bytes, bytes]]) -> bytes:
    """The served document (the verifier's side)."""
    return _pack([LISTS_VERSION, chain_id, height, kind, list_bytes, users_digest, models_digest,
                  validators_wire(validators), [[k, s] for k, s in sorted(signatures)]])


@dataclass(frozen=True, slots=True)
class SignedList:
    """A verified list: its height, its entries, and the validator set that signed it."""

    chain_id: str
    height: int
    kind: int
    entries: tuple[PeerEntry, ...]
    validators: tuple[ValidatorKey, ...]
    signers: frozenset[bytes]
    digest: bytes = b""  # SHA-256 of the list's bytes (the signed digest of its kind)


def _typed(value: Any, tp: type, what: str) -> Any:
    if type(value) is not tp:
        raise ListError(f"{what}: expected {tp.__name__}, got {type(value).__name__}")
    return value


def _unpack(raw: bytes, what: str, *, use_list: bool = True) -> Any:
    try:
        return msgpack.unpackb(raw, raw=False, use_list=use_list, strict_map_key=True, max_bin_len=MAX_LIST_BYTES,
                               max_str_len=4096, max_array_len=MAX_RECORDS, max_map_len=0, max_ext_len=0)
    except (ValueError, TypeError, RecursionError, msgpack.UnpackException) as exc:
        raise ListError(f"{what} is not strict msgpack ({type(exc).__name__})") from None


_RECORD_TYPES = (bytes, bytes, int, bytes, str, str, str, int, int)
_MODEL_RECORD_TYPES = (*_RECORD_TYPES, int, bool)  # + reputation, audited
REPUTATION_SCALE = 1_000_000
_ID_PERSON = b"gentorrent-id"  # node id = BLAKE2b-160(ed25519 key), personalised as overlay/identity.py does
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


def _entries(records: Any, kind: int) -> tuple[PeerEntry, ...]:
    """Every record as a :class:`PeerEntry`, each field typed and bounded, the list of one role and
    strictly sorted by node id. The hot loop of a refresh (10,000 records a list): one pass, locals
    only, the node id hashed with :mod:`hashlib` directly; the checks are those of
    :func:`overlay.identity.node_id_of` and :func:`overlay.transport.parse_address`."""
    want_role = ROLE_USER if kind == KIND_USERS else ROLE_MODEL
    role_name = "user" if kind == KIND_USERS else "model"
    model = want_role == ROLE_MODEL
    blake, types, entry = hashlib.blake2b, _MODEL_RECORD_TYPES if model else _RECORD_TYPES, _make_entry
    out = []
    prev = b""
    reputation: int | None = None
    audited: bool | None = None
    for i, rec in enumerate(records):
        if type(rec) is not tuple or tuple(map(type, rec)) != types:
            raise ListError(f"record {i}: not [node_id, ed25519, role, x25519, address, region, model_id, "
                            f"capacity, expires{', reputation, audited' if model else ''}] with those types")
        if model:
            node_id, ed, role, x, address, region, model_id, _capacity, _expires, reputation, audited = rec
            if not 0 <= reputation <= REPUTATION_SCALE:
                raise ListError(f"record {i}: reputation {reputation} outside 0..{REPUTATION_SCALE}")
        else:
            node_id, ed, role, x, address, region, model_id, _capacity, _expires = rec
        if len(ed) != 32 or len(x) != 32 or node_id != blake(ed, digest_size=20, person=_ID_PERSON).digest():
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
    return tuple(out)


# msgpack first bytes of arrays and maps (fixarray, fixmap, array 16/32, map 16/32)
_CONTAINER = frozenset((*range(0x80, 0xA0), 0xDC, 0xDD, 0xDE, 0xDF))


def _read_document(raw: bytes) -> list[Any]:
    """The 9 fields of a served document, read by shape: scalars where scalars belong, and the
    validators and signatures as arrays (at most :data:`MAX_VALIDATORS`) of 2-scalar arrays, so
    that a hostile verifier's nested arrays cost no more than the bytes they take (unpacking the
    whole document first let 3 MB of nested empty arrays take 195 MB, docs/fuzzing.md)."""
    u = msgpack.Unpacker(raw=False, strict_map_key=True, max_buffer_size=max(len(raw), 1),
                         max_bin_len=MAX_LIST_BYTES, max_str_len=4096, max_array_len=MAX_VALIDATORS,
                         max_map_len=0, max_ext_len=0)
    u.feed(raw)

    def scalar() -> Any:
        at = u.tell()
        if at >= len(raw) or raw[at] in _CONTAINER:
            raise ListError("the signed list has an array or map where a value belongs")
        return u.unpack()

    def pairs() -> list[list[Any]]:
        return [[scalar(), scalar()] if u.read_array_header() == 2 else _bad_pair() for _ in range(u.read_array_header())]

    try:
        if u.read_array_header() != 9:
            raise ListError("the signed list is not a 9-field array; is this verifier another version?")
        doc = [scalar() for _ in range(7)] + [pairs(), pairs()]
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


def verify_document(raw: bytes, chain_id: str, held: Sequence[ValidatorKey], *, kind: int,
                    min_height: int = 0, known: SignedList | None = None) -> SignedList:
    """Decode ``raw`` strictly and accept it only as described in the module docstring.

    ``held`` is the validator set the client trusts; ``min_height`` the height of the list it holds
    (an older one is refused, the same height is accepted). ``known``: a list verified before; when
    the new document's list has the same SHA-256 (the same bytes, most refreshes), its entries are
    reused instead of decoding the records again; everything else (signatures, digests, height) is
    checked as always. Raises :class:`ListError` saying why.
    """
    version, chain, height, got_kind, list_bytes, users_d, models_d, vals, sigs = _read_document(raw)
    if _typed(version, int, "version") != LISTS_VERSION:
        raise ListError(f"signed list format {version}; this client reads {LISTS_VERSION}")
    if _typed(chain, str, "chain id") != chain_id:
        raise ListError(f"the list is from chain {chain[:50]!r}, not the pinned committee {chain_id!r}")
    _typed(height, int, "height")
    if _typed(got_kind, int, "kind") != kind:
        raise ListError(f"asked for list kind {kind}, got {got_kind}")
    for value, what in ((list_bytes, "list"), (users_d, "users digest"), (models_d, "models digest")):
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
    if not 0 <= height < 2**63:
        raise ListError(f"height {height} out of range")
    if height < min_height:
        raise ListError(f"the list is at height {height}, older than the height {min_height} already held; "
                        "ask another verifier")
    list_digest = crypto.sha256(list_bytes)
    if list_digest != (users_d if kind == KIND_USERS else models_d):
        raise ListError("the list does not match the digest the committee signed (tampered or truncated)")
    message = signing_message(chain_id, height, users_d, models_d, validators_digest(validators))
    power = {v.public_key: v.power for v in held}
    total = sum(power.values())
    signers = crypto.valid_signers(_signature_pairs(sigs), power, message)
    signed = sum(power[k] for k in signers)
    if 3 * signed <= 2 * total:
        raise ListError(f"valid signatures from validators with {signed} of {total} voting power; more than 2/3 "
                        "are required (a verifier serving this may be faulty: ask another)")
    if known is not None and known.kind == kind and known.digest == list_digest:
        entries = known.entries  # the same bytes, decoded and checked when ``known`` was verified
    else:
        records = _unpack(list_bytes, "the list", use_list=False)
        if type(records) is not tuple:
            raise ListError("the list is not an array of records")
        entries = _entries(records, kind)
    return SignedList(chain_id, height, kind, entries, tuple(validators), frozenset(signers), list_digest)


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
    """Holds the latest verified user and model lists, fetched from any of ``addresses``.

    I/O goes through ``fetch`` (default: :func:`fetch_abci_query`, CometBFT's RPC over HTTP), so the
    core can be tested without a network. ``refresh`` tries the verifiers in turn (starting after the
    last one that answered) and keeps the first list that verifies; :meth:`run` refreshes every
    ``interval`` seconds (trio time), and :meth:`age` reads ``clock`` (default: trio's, so MockClock drives it).
    """

    def __init__(self, addresses: Sequence[str], chain_id: str, validators: Sequence[ValidatorKey], *,
                 fetch: Fetch | None = None, clock: Clock | None = None, interval: float = REFRESH_S,
                 fetch_timeout: float = FETCH_TIMEOUT_S) -> None:
        if not addresses:
            raise ValueError("name at least one verifier RPC address (--committee HOST:PORT,...)")
        if not validators:
            raise ValueError("pin the committee's validator keys")
        self.addresses = list(addresses)
        self.chain_id = chain_id
        self.validators: tuple[ValidatorKey, ...] = tuple(validators)
        self.fetch = fetch or fetch_abci_query
        self.clock = clock or TrioClock()
        self.interval = interval
        self.fetch_timeout = fetch_timeout
        self.lists: dict[int, SignedList] = {}
        self.errors: list[str] = []
        self.refreshed_at: float | None = None  # clock.monotonic() of the last refresh that verified
        self._next = 0

    @property
    def height(self) -> int:
        return min((lst.height for lst in self.lists.values()), default=0)

    def registry(self) -> Registry:
        """The held lists as the :class:`Registry` nodes use (version = the lists' height)."""
        entries = [e for k in (KIND_USERS, KIND_MODELS) if k in self.lists for e in self.lists[k].entries]
        return Registry(self.height, entries)

    def accept(self, raw: bytes, kind: int) -> SignedList:
        """Verify ``raw`` against the held set and height; keep it (and its validator set) if it passes."""
        held = self.lists.get(kind)
        got = verify_document(raw, self.chain_id, self.validators, kind=kind,
                              min_height=held.height if held else 0, known=held)
        self.lists[kind] = got
        if {(v.public_key, v.power) for v in got.validators} != {(v.public_key, v.power) for v in self.validators}:
            log.info("committee changed at height %d: now %d validators", got.height, len(got.validators))
            self.validators = got.validators
        return got

    async def refresh(self) -> Registry:
        """Fetch and verify both lists; raises :class:`ListError` listing each verifier's failure."""
        for kind in (KIND_USERS, KIND_MODELS):
            errors = []
            for i in range(len(self.addresses)):
                addr = self.addresses[(self._next + i) % len(self.addresses)]
                try:
                    with trio.fail_after(self.fetch_timeout):
                        raw = await self.fetch(addr, KIND_PATHS[kind])
                    self.accept(raw, kind)
                except trio.TooSlowError:
                    errors.append(f"{addr}: no answer within {self.fetch_timeout:g} s")
                    continue
                except (ListError, OSError, ValueError) as exc:
                    errors.append(f"{addr}: {exc}")
                    continue
                self._next = (self._next + i) % len(self.addresses)
                break
            else:
                self.errors = errors
                raise ListError(f"no verifier served a {KIND_PATHS[kind]} list that verifies: " + "; ".join(errors))
        self.errors = []
        self.refreshed_at = self.clock.monotonic()
        return self.registry()

    def age(self) -> float | None:
        """Seconds since the last verified refresh (None before the first)."""
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


MAX_RESPONSE = 64 * 1024 * 1024


async def http_get(address: str, target: str, *, max_bytes: int = MAX_RESPONSE) -> bytes:
    """``GET target`` on ``host:port`` (plain HTTP/1.1 over trio); the response body, at most
    ``max_bytes``. Raises :class:`ListError` for a response that is not HTTP or too large, and
    ``OSError`` for I/O."""
    host, port = parse_address(address)
    stream = await trio.open_tcp_stream(host, port)
    async with stream:
        await stream.send_all(f"GET {target} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n".encode())
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = await stream.receive_some(1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                raise ListError(f"{address} answered over {max_bytes} bytes")
    head, sep, body = b"".join(chunks).partition(b"\r\n\r\n")
    if not sep:
        raise ListError(f"{address} did not answer HTTP")
    if b"chunked" in head.lower():
        body = _dechunk(body)
    return body


async def rpc_call(address: str, method: str, params: dict[str, str]) -> Any:
    """One CometBFT JSON-RPC call over HTTP GET (``/method?k=v``; values as CometBFT's URI form
    expects them: strings quoted, bytes ``0x``-hex); the ``result`` object. A JSON-RPC error
    raises :class:`ListError` with its message and data."""
    import json
    import urllib.parse

    query = "&".join(f"{k}={urllib.parse.quote(v, safe='')}" for k, v in params.items())
    body = await http_get(address, f"/{method}?{query}" if query else f"/{method}")
    try:
        doc = json.loads(body)
    except ValueError:
        raise ListError(f"{address} answered {method} with something other than JSON") from None
    if not isinstance(doc, dict):
        raise ListError(f"{address} answered {method} with a non-object")
    if doc.get("error"):
        err = doc["error"]
        what = f"{err.get('message', '')}: {err.get('data', '')}" if isinstance(err, dict) else str(err)
        raise ListError(f"{address} did not answer {method}: JSON-RPC error {what[:300]}")
    if "result" not in doc:
        raise ListError(f"{address} answered {method} without a result")
    return doc["result"]


async def fetch_abci_query(address: str, path: str, data: bytes = b"", *,
                           rpc: Callable[[str, str, dict[str, str]], Awaitable[Any]] | None = None) -> bytes:
    """``abci_query`` on a verifier's CometBFT RPC (``host:port``), with ``data`` if any; the
    response's value bytes. ``rpc`` (default :func:`rpc_call`) is injectable for tests.

    The response is bounded by :data:`MAX_RESPONSE`. Raises :class:`ListError` for a non-zero query
    code (with the verifier's log) and ``OSError`` for I/O.
    """
    import base64

    params = {"path": f'"{path}"'}
    if data:
        params["data"] = "0x" + data.hex()
    result = await (rpc or rpc_call)(address, "abci_query", params)
    try:
        response = result["response"]
        code = int(response.get("code", 0))
        value = base64.b64decode(response.get("value") or "", validate=True)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ListError(f"{address} did not answer an abci_query ({type(exc).__name__})") from None
    if code:
        raise ListError(f"{address} answered code {code}: {str(response.get('log', ''))[:200]}")
    return value


def _dechunk(body: bytes) -> bytes:
    out = bytearray()
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        try:
            size = int(size_line.split(b";")[0], 16)
        except ValueError:
            raise ListError("bad HTTP chunk") from None
        if size == 0:
            break
        out += rest[:size]
        body = rest[size + 2:]
    return bytes(out)
