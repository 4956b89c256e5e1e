"""Registration with the verifier committee: the transaction codec, and the node's side of it.

This module is the ONE codec of committee registration transactions: the verifiers decode with
it and nodes sign with it. It also holds the node's
I/O-free registration core (:class:`Registrar`: which transaction to send next, and when) and the
thin driver that talks to a verifier's CometBFT RPC (:class:`CommitteeRegistration`).

Transactions (DESIGN.md "Verifier committee"):

A transaction is one msgpack array of exactly two binaries, ``[body, signature]``:

- ``body`` is the canonical msgpack encoding of
  ``[TX_VERSION, op, seq, ed25519_public, entry, work]`` where ``op`` is :data:`OP_REGISTER`,
  :data:`OP_UPDATE` or :data:`OP_LEAVE`; ``seq`` a per-node sequence number (1 ≤ seq < 2**63) that
  must grow with every transaction the node sends, so none can be replayed (nodes use their unix
  time in milliseconds when that is larger than the last seq plus one, so a key whose seq the
  committee has pruned, decision 0014, still never reuses one); ``entry`` is
  ``[role, x25519_public, address, region, model_id, capacity]`` for register/update and ``nil``
  for leave; ``work`` (bin, at most :data:`overlay.directory.work.NONCE_LEN` bytes) is a register's
  proof-of-work nonce (:mod:`overlay.directory.work`), empty in updates and leaves.
- ``address`` is canonical: an IPv4 literal as Python's :mod:`ipaddress` writes it, or an IPv6
  literal in brackets in its compressed form (never an IPv4-mapped one), and a port 1–65535 without
  leading zeros. DNS names are refused: one host cannot count as several addresses. ``role`` is :data:`ROLE_USER` or :data:`ROLE_MODEL`; user nodes have ``model_id ""``
  and ``capacity 0``, model nodes a model id and a capacity score 1–10 (paper §3.1).
- ``signature`` is the node's Ed25519 signature over
  ``TX_CONTEXT || len(chain_id) (u8) || chain_id || body``; the chain id binds a transaction to
  one committee, so it cannot be replayed on another.

The node id is derived from the Ed25519 key (:func:`overlay.wire.identity.node_id_of`), never sent.
Every field is bounded; anything off raises :class:`TxError` with a numeric code from
:class:`Code` and a reason. The codec reads no state and no clock: stateful rules (replay,
conflicts) live in :mod:`verifier.app`.
"""

from __future__ import annotations

import enum
import ipaddress
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import trio

from overlay.directory import work
from overlay.directory.rpc import Rpc, RpcError, parse_commit, parse_query, query_params, rpc_call, tx_params
from overlay.directory.work import NONCE_LEN
from overlay.wire import crypto
from overlay.wire.clock import Clock, TrioClock
from overlay.wire.constants import MAX_CAPACITY, MAX_CHAIN_ID, MIN_CAPACITY, ROLE_NAMES, ROLE_USER
from overlay.wire.identity import node_id_of

log = logging.getLogger("gentorrent.registration")

TX_VERSION = 2  # 2: canonical IP-literal addresses and a register's proof of work
TX_CONTEXT = b"gentorrent/committee-tx/v1\x00"
MAX_TX_BYTES = 1024
MAX_ADDRESS = 255
MAX_REGION = 32
MAX_MODEL_ID = 128
MAX_SEQ = 2**63 - 1
# What msgpack (and unpacking its result) raises on hostile bytes: caught by type, never blindly.
DECODE_ERRORS = (ValueError, TypeError, RecursionError, msgpack.UnpackException)

OP_REGISTER, OP_UPDATE, OP_LEAVE = 1, 2, 3
OP_NAMES = {OP_REGISTER: "register", OP_UPDATE: "update", OP_LEAVE: "leave"}

_REGION = re.compile(r"[a-z0-9][a-z0-9-]*")
_MODEL_ID = re.compile(r"[\x21-\x7e]+")  # printable ASCII, no spaces


class Code(enum.IntEnum):
    """CheckTx/ExecTxResult codes; 0 is success. Stable: clients match on them."""

    OK = 0
    MALFORMED = 1  # not a strict encoding of the format above
    OVERSIZE = 2  # over MAX_TX_BYTES
    UNSIGNED = 3  # empty signature
    BAD_SIGNATURE = 4  # signature does not verify (wrong key, altered body, other chain)
    REPLAYED = 5  # seq not above the node's last committed seq
    CONFLICT = 6  # register of a registered node, an address held by another node, a role change
    UNKNOWN_NODE = 7  # update or leave of a node that is not registered
    INVALID_FIELD = 8  # a field out of range (capacity, address, region, model id)
    UNSUPPORTED_VERSION = 9  # a TX_VERSION this verifier does not speak
    UNAVAILABLE = 10  # queries only: no signed list held yet; retry or ask another verifier
    # audit transactions (verifier/audit/tx.py, verifier/audit/chain.py)
    WRONG_EPOCH = 11  # an audit tx for another epoch than the one it must name now
    TOO_EARLY = 12  # before its window (a report before the report window)
    LATE = 13  # after its window (a plan commit after the commit window)
    NOT_LEADER = 14  # no longer sent (decision 0010's leaders; decision 0013 has none): the number stays taken
    DUPLICATE = 15  # a second plan commit or report from the same validator in an epoch
    NOT_VALIDATOR = 16  # an audit tx from a key that is not a current validator
    AUDITS_OFF = 17  # an audit tx on a chain whose genesis has no audit section
    SETTLED = 18  # no longer sent (decision 0010's early settlement): the number stays taken
    # admission (verifier/admission.py, decision 0014)
    LOW_WORK = 19  # a register whose proof of work is below what the committee requires now
    ADDRESS_NOT_ALLOWED = 20  # a loopback, private, link-local or reserved address on a public network
    ADDRESS_CAP = 21  # the address's IP or network prefix already holds as many nodes as allowed
    PENDING_FULL = 22  # too many registrations await their address probe; retry later
    # anonymous usage quotas (overlay/directory/quota.py, verifier/quota.py, decision 0017)
    QUOTA_OFF = 23  # this verifier issues no tokens (its chain's genesis has no quota section)
    QUOTA_USED = 24  # more tokens asked at once than a user's allowance at an issuer can hold (decision 0018)
    SPENT = 25  # a token already redeemed
    BAD_TOKEN = 26  # a token whose output does not verify, or of an epoch not redeemable now
    QUOTA_LATER = 27  # the user's allowance at this issuer holds fewer tokens than asked now (decision 0018)


class TxError(Exception):
    """A transaction breaks a rule: ``code`` says which, ``reason`` says why in words."""

    def __init__(self, code: Code, reason: str) -> None:
        self.code = code
        self.reason = reason
        super().__init__(f"{code.name} ({int(code)}): {reason}")


@dataclass(frozen=True, slots=True)
class Entry:
    """What a node registers: how to reach it and what it serves."""

    role: int
    x25519_public: bytes
    address: str
    region: str
    model_id: str = ""
    capacity: int = 0

    def to_wire(self) -> list[Any]:
        return [self.role, self.x25519_public, self.address, self.region, self.model_id, self.capacity]


@dataclass(frozen=True, slots=True)
class Tx:
    """A decoded, signature-checked transaction."""

    op: int
    seq: int
    ed25519_public: bytes
    entry: Entry | None  # None for leave
    work: bytes = b""  # a register's proof-of-work nonce (overlay/directory/work.py)

    @property
    def node_id(self) -> bytes:
        return node_id_of(self.ed25519_public)


def canonical_ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``host`` as an IP address if it is one written canonically (IPv6 without brackets), else None."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    return ip if str(ip) == host else None


def check_address(address: str) -> None:
    """A canonical ``IP:port``: an IPv4 literal or a bracketed, compressed IPv6 literal (not
    IPv4-mapped), and a port 1–65535 without leading zeros. DNS names are refused."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 1 <= int(port) <= 65535 or port != str(int(port)):
        raise TxError(Code.INVALID_FIELD, f"address {address!r} is not IP:port with a port 1-65535")
    bracketed = host.startswith("[") and host.endswith("]")
    inner = host[1:-1] if bracketed else host
    try:
        mapped = ipaddress.IPv6Address(inner).ipv4_mapped if bracketed else None
    except ValueError:
        mapped = None
    if mapped is not None:
        raise TxError(Code.INVALID_FIELD, f"address {address!r} is IPv4-mapped: register the IPv4 form {mapped}:{port}")
    ip = canonical_ip(inner)
    if ip is None or bracketed != (ip.version == 6):
        raise TxError(Code.INVALID_FIELD,
                      f"address {address!r}: the host must be an IP literal written canonically (IPv4 as "
                      f"198.51.100.7, IPv6 in brackets and compressed, as [2001:db8::7]); DNS names are not taken")


def check_entry(entry: Entry) -> None:
    """Field rules of an entry; :class:`TxError` ``INVALID_FIELD`` naming the field."""
    if entry.role not in ROLE_NAMES:
        raise TxError(Code.INVALID_FIELD, f"role {entry.role} is not 1 (user) or 2 (model)")
    if len(entry.x25519_public) != crypto.X25519_PK_LEN:
        raise TxError(Code.INVALID_FIELD, "x25519 key must be 32 bytes")
    if len(entry.address) > MAX_ADDRESS:
        raise TxError(Code.INVALID_FIELD, f"address over {MAX_ADDRESS} characters")
    check_address(entry.address)
    if len(entry.region) > MAX_REGION or not _REGION.fullmatch(entry.region):
        raise TxError(Code.INVALID_FIELD,
                      f"region {entry.region[:40]!r} must be 1-{MAX_REGION} of a-z, 0-9, '-' (e.g. 'eu-west')")
    if entry.role == ROLE_USER:
        if entry.model_id or entry.capacity:
            raise TxError(Code.INVALID_FIELD, "a user node has no model id and capacity 0")
    else:
        if len(entry.model_id) > MAX_MODEL_ID or not _MODEL_ID.fullmatch(entry.model_id):
            raise TxError(Code.INVALID_FIELD, f"model id must be 1-{MAX_MODEL_ID} printable ASCII characters")
        if not MIN_CAPACITY <= entry.capacity <= MAX_CAPACITY:
            raise TxError(Code.INVALID_FIELD,
                          f"capacity score {entry.capacity} outside {MIN_CAPACITY}-{MAX_CAPACITY} (paper §3.1)")


def _check_chain_id(chain_id: str) -> bytes:
    raw = chain_id.encode()
    if not 0 < len(raw) <= MAX_CHAIN_ID:
        raise ValueError(f"chain id must be 1-{MAX_CHAIN_ID} bytes")
    return raw


def signing_bytes(chain_id: str, body: bytes) -> bytes:
    raw = _check_chain_id(chain_id)
    return TX_CONTEXT + bytes([len(raw)]) + raw + body


def pack(obj: object) -> bytes:
    """Canonical msgpack (bin types for bytes), the one encoding transactions and state use."""
    out: bytes = msgpack.packb(obj, use_bin_type=True)
    return out


def _body(op: int, seq: int, ed25519_public: bytes, entry: Entry | None, work: bytes) -> bytes:
    return pack([TX_VERSION, op, seq, ed25519_public, None if entry is None else entry.to_wire(), work])


def make_tx(signing: crypto.SigningKey, chain_id: str, op: int, seq: int, entry: Entry | None = None, *,
            work: bytes = b"") -> bytes:
    """Encode and sign a transaction (the client side); ``work``: a register's proof-of-work nonce
    (:func:`overlay.directory.work.solve`). Raises :class:`TxError` for a bad entry."""
    if op not in OP_NAMES:
        raise ValueError(f"unknown op {op}")
    if (entry is None) != (op == OP_LEAVE):
        raise ValueError("register and update carry an entry; leave carries none")
    if len(work) > NONCE_LEN or (work and op != OP_REGISTER):
        raise ValueError(f"work is a register's nonce of at most {NONCE_LEN} bytes")
    if entry is not None:
        check_entry(entry)
    if not 1 <= seq <= MAX_SEQ:
        raise ValueError(f"seq must be 1..{MAX_SEQ}")
    body = _body(op, seq, signing.public_bytes, entry, work)
    return pack([body, signing.sign(signing_bytes(chain_id, body))])


def _unpack(raw: bytes, max_array: int) -> Any:
    return msgpack.unpackb(raw, raw=False, use_list=True, strict_map_key=True, max_bin_len=MAX_TX_BYTES,
                           max_str_len=MAX_TX_BYTES, max_array_len=max_array, max_map_len=0, max_ext_len=0)


def _typed(value: Any, tp: type, what: str) -> Any:
    if type(value) is not tp:
        raise TxError(Code.MALFORMED, f"{what}: expected {tp.__name__}, got {type(value).__name__}")
    return value


def _strict(raw: bytes, max_array: int, why: str) -> Any:
    """``raw`` unpacked strictly (arrays of at most ``max_array`` items); MALFORMED saying ``why``."""
    try:
        return _unpack(raw, max_array)
    except DECODE_ERRORS as exc:
        raise TxError(Code.MALFORMED, f"{why} ({type(exc).__name__})") from None


def _signed(raw: bytes) -> tuple[bytes, bytes]:
    """``(body, signature)`` of a transaction: its size, outer shape, canonical encoding and a
    signature of the right length checked (the first of :func:`decode_tx`'s checks)."""
    if len(raw) > MAX_TX_BYTES:
        raise TxError(Code.OVERSIZE, f"{len(raw)} bytes over the limit of {MAX_TX_BYTES}")
    outer = _strict(raw, 2, "not a msgpack [body, signature] array")
    if type(outer) is not list or len(outer) != 2:
        raise TxError(Code.MALFORMED, "not a [body, signature] array")
    body = _typed(outer[0], bytes, "body")
    sig = _typed(outer[1], bytes, "signature")
    if pack([body, sig]) != raw:
        raise TxError(Code.MALFORMED, "transaction is not in canonical msgpack form")
    if not sig:
        raise TxError(Code.UNSIGNED, "the transaction carries no signature")
    if len(sig) != crypto.ED25519_SIG_LEN:
        raise TxError(Code.BAD_SIGNATURE, f"signature of {len(sig)} bytes, expected {crypto.ED25519_SIG_LEN}")
    return body, sig


def _body_fields(body: bytes) -> list[Any]:
    """The body's six fields, its version checked (a version this verifier does not speak is
    UNSUPPORTED_VERSION even when the rest of the body is of another shape)."""
    fields = _strict(body, 6, "body is not msgpack")
    version = fields[0] if type(fields) is list and fields else None
    if type(version) is int and version != TX_VERSION:
        raise TxError(Code.UNSUPPORTED_VERSION, f"transaction version {version}; this verifier speaks {TX_VERSION}")
    if type(fields) is not list or len(fields) != 6:
        raise TxError(Code.MALFORMED, "body is not [version, op, seq, ed25519, entry, work]")
    version = _typed(fields[0], int, "version")
    if version != TX_VERSION:
        raise TxError(Code.UNSUPPORTED_VERSION, f"transaction version {version}; this verifier speaks {TX_VERSION}")
    return fields


def _entry(op: int, e: Any) -> Entry | None:
    """The body's entry: none for a leave, a checked :class:`Entry` otherwise."""
    if op == OP_LEAVE:
        if e is not None:
            raise TxError(Code.MALFORMED, "a leave carries no entry")
        return None
    if type(e) is not list or len(e) != 6:
        raise TxError(Code.MALFORMED, "entry is not [role, x25519, address, region, model_id, capacity]")
    entry = Entry(
        role=_typed(e[0], int, "role"), x25519_public=_typed(e[1], bytes, "x25519 key"),
        address=_typed(e[2], str, "address"), region=_typed(e[3], str, "region"),
        model_id=_typed(e[4], str, "model id"), capacity=_typed(e[5], int, "capacity"),
    )
    check_entry(entry)
    return entry


def decode_tx(raw: bytes, chain_id: str) -> Tx:
    """Strictly decode ``raw`` and check its signature for ``chain_id``; :class:`TxError` on anything off.

    Checks, in order: size, outer shape, signature presence, canonical body encoding, version,
    field types and bounds, entry rules, then the Ed25519 signature. Never raises anything else.
    """
    body, sig = _signed(raw)
    fields = _body_fields(body)
    op = _typed(fields[1], int, "op")
    if op not in OP_NAMES:
        raise TxError(Code.MALFORMED, f"unknown op {op}")
    seq = _typed(fields[2], int, "seq")
    if not 1 <= seq <= MAX_SEQ:
        raise TxError(Code.INVALID_FIELD, f"seq {seq} outside 1..{MAX_SEQ}")
    pub = _typed(fields[3], bytes, "ed25519 key")
    if len(pub) != crypto.ED25519_PK_LEN:
        raise TxError(Code.MALFORMED, "ed25519 key must be 32 bytes")
    entry = _entry(op, fields[4])
    work = _typed(fields[5], bytes, "work")
    if len(work) > NONCE_LEN or (work and op != OP_REGISTER):
        raise TxError(Code.MALFORMED, f"work is a register's nonce of at most {NONCE_LEN} bytes")
    if _body(op, seq, pub, entry, work) != body:
        raise TxError(Code.MALFORMED, "body is not in canonical msgpack form")
    try:
        crypto.ed25519_verify(pub, sig, signing_bytes(chain_id, body))
    except crypto.CryptoError:
        raise TxError(Code.BAD_SIGNATURE,
                      "the signature does not verify with the transaction's key for this chain") from None
    return Tx(op=op, seq=seq, ed25519_public=pub, entry=entry, work=work)


# =========================================================================== the node's side

# Entries expire ENTRY_TTL_S seconds of block time after their last register/update; nodes refresh
# every REFRESH_INTERVAL_S, so two missed refreshes in a row still keep them listed.
ENTRY_TTL_S = 30 * 60
REFRESH_INTERVAL_S = 10 * 60
RETRY_S = 15.0  # after a failed refresh, try again this soon (still far inside the TTL)
LEAVE_TIMEOUT_S = 5.0
START_WAIT_S = 30.0  # a starting node waits this long for its committee to answer at all


class RegistrationError(Exception):
    """The committee refused (or could not be asked about) this node's registration; the message
    names the verifier's code and log, or each verifier's failure."""

    def __init__(self, message: str, code: Code | None = None) -> None:
        self.code = code
        super().__init__(message)


@dataclass
class Registrar:
    """The I/O-free core of a node's registration: which transaction to send next, and when.

    ``begin(last_seq, listed)`` takes what the committee holds for this node (its last committed
    seq, whether its entry is live), so a restarted node continues its seq and updates the entry it
    still has instead of registering twice. ``next_tx()`` signs the transaction that (re)registers
    it: register when not listed, else an update (an unchanged update is the refresh that keeps the
    entry alive); ``committed(now)`` records that it committed and schedules the next refresh
    ``interval`` seconds later; ``failed(now)`` schedules a retry after ``retry`` seconds.
    ``leave_tx()`` signs the leave sent on clean shutdown. Times are any monotonic clock's seconds.
    """

    signing: crypto.SigningKey
    chain_id: str
    entry: Entry
    interval: float = REFRESH_INTERVAL_S
    retry: float = RETRY_S
    seq: int = 0  # the last seq this node knows committed
    listed: bool = False
    floor: int = 0  # the next seq is at least this (the driver sets its unix time in ms: decision 0014)
    work: bytes = b""  # the proof-of-work nonce a register carries (overlay/directory/work.py)
    due_at: float | None = None  # when the next refresh is due (None: before the first commit)
    _pending: int = 0

    def __post_init__(self) -> None:
        check_entry(self.entry)
        _check_chain_id(self.chain_id)

    @property
    def node_id(self) -> bytes:
        return node_id_of(self.signing.public_bytes)

    def begin(self, last_seq: int, listed: bool, floor: int = 0) -> None:
        """What the committee holds for this node: its last committed seq and whether it is listed;
        ``floor``: the least seq to send next (a committee prunes the seqs of keys that left long
        ago, so a key counts on from its clock, never reusing a seq an old transaction holds)."""
        if not 0 <= last_seq <= MAX_SEQ:
            raise RegistrationError(f"the committee reports seq {last_seq} for this node, outside 0..{MAX_SEQ}")
        self.seq = max(self.seq, last_seq)
        self.listed = listed
        self.floor = min(floor, MAX_SEQ)

    def next_tx(self) -> bytes:
        """The signed register (or refreshing update) to send now, with the next seq."""
        self._pending = min(MAX_SEQ, max(self.seq + 1, self.floor))
        if self.listed:
            return make_tx(self.signing, self.chain_id, OP_UPDATE, self._pending, self.entry)
        return make_tx(self.signing, self.chain_id, OP_REGISTER, self._pending, self.entry, work=self.work)

    def committed(self, now: float) -> None:
        """The transaction from :meth:`next_tx` committed: listed until ``now + ENTRY_TTL_S``."""
        self.seq = max(self.seq, self._pending)
        self.listed = True
        self.due_at = now + self.interval

    def failed(self, now: float) -> None:
        """A refresh could not be committed: try again ``retry`` seconds from now."""
        self.due_at = now + self.retry

    def leave_tx(self) -> bytes:
        """The signed leave (next seq); the node is no longer listed once it commits."""
        self._pending = min(MAX_SEQ, max(self.seq + 1, self.floor))
        return make_tx(self.signing, self.chain_id, OP_LEAVE, self._pending)

    def left(self) -> None:
        self.seq = max(self.seq, self._pending)
        self.listed = False
        self.due_at = None


class CommitteeRegistration:
    """The thin driver: runs a :class:`Registrar` against verifiers' CometBFT RPC.

    ``rpc`` (default :func:`overlay.directory.rpc.rpc_call`, plain HTTP) is injectable so tests can
    answer from an in-process committee. Each call tries the verifiers in turn; a verifier that
    cannot be reached is skipped, an answer (accepted or refused) is final.
    """

    def __init__(self, addresses: Sequence[str], registrar: Registrar, *, rpc: Rpc | None = None,
                 clock: Clock | None = None, timeout: float = 30.0, start_wait: float = START_WAIT_S,
                 unix_ms: Callable[[], int] | None = None) -> None:
        if not addresses:
            raise ValueError("name at least one verifier RPC address (--committee HOST:PORT,...)")
        self.addresses = list(addresses)
        self.registrar = registrar
        self.rpc: Rpc = rpc or rpc_call
        self.clock = clock or TrioClock()
        self.timeout = timeout
        self.start_wait = start_wait  # at start, wait this long for a verifier to answer at all
        self.height = 0  # the block the last registration/refresh committed in
        self.work_trials = 0  # scrypt trials spent on proofs of work
        # the least next seq: this node's unix time in ms (injectable for tests)
        self.floor: Callable[[], int] = unix_ms or (lambda: int(self.clock.unix() * 1000))

    async def _call(self, method: str, params: dict[str, str]) -> Any:
        errors = []
        for addr in self.addresses:
            try:
                with trio.fail_after(self.timeout):
                    return await self.rpc(addr, method, params)
            except trio.TooSlowError:
                errors.append(f"{addr}: no answer within {self.timeout:g} s")
            except (OSError, ValueError, RpcError) as exc:
                errors.append(f"{addr}: {exc}")
        raise RegistrationError(f"no verifier answered {method}: " + "; ".join(errors)
                                + " (is the committee running, and are these its RPC addresses?)")

    async def _query(self, path: str, data: bytes) -> tuple[int, bytes, str]:
        try:
            answer = parse_query(await self._call("abci_query", query_params(path, data)))
        except RpcError as exc:
            raise RegistrationError(f"a verifier answered abci_query {path} with no response ({exc})") from None
        return answer.code, answer.value, answer.log

    async def wait_reachable(self) -> None:
        """At start: wait up to ``start_wait`` seconds for any verifier to answer (a node may start
        with, or just before, its committee); :class:`RegistrationError` naming each failure after."""
        deadline = self.clock.monotonic() + self.start_wait
        while True:
            try:
                await self._call("status", {})
                return
            except RegistrationError as exc:
                if self.clock.monotonic() >= deadline:
                    raise
                log.info("waiting for the committee (%s)", exc)
            await trio.sleep(0.5)

    async def read_state(self) -> tuple[int, bool]:
        """``(last committed seq, listed?)`` for this node, from the committee's committed state."""
        node_id = self.registrar.node_id
        code, value, log_ = await self._query("/seq", node_id)
        if code:
            raise RegistrationError(f"the committee answered /seq with code {code}: {log_[:200]}")
        try:
            seq = msgpack.unpackb(value)
        except DECODE_ERRORS:
            raise RegistrationError("the committee's /seq answer does not decode") from None
        if type(seq) is not int:
            raise RegistrationError("the committee's /seq answer is not an integer")
        code, _, log_ = await self._query("/node", node_id)
        if code not in (Code.OK, Code.UNKNOWN_NODE):
            raise RegistrationError(f"the committee answered /node with code {code}: {log_[:200]}")
        return seq, code == Code.OK

    async def submit(self, raw: bytes) -> int:
        """Broadcast ``raw`` and wait for it to commit; the block height, or :class:`RegistrationError`
        naming the verifier's code and log."""
        try:
            done = parse_commit(await self._call("broadcast_tx_commit", tx_params(raw)))
        except RpcError as exc:
            raise RegistrationError(f"a verifier answered broadcast_tx_commit oddly ({exc})") from None
        refused = done.refused()
        if refused is not None:
            stage, part = refused
            try:
                code: Code | None = Code(part.code)
            except ValueError:
                code = None
            raise RegistrationError(
                f"the committee refused the transaction ({stage}): code {part.code} "
                f"{code.name if code is not None else 'UNKNOWN'}: {part.log[:300]}", code)
        return done.height

    async def admission(self) -> tuple[int, int]:
        """``(work bits a new key needs now, scrypt n_log2)`` from the committee's ``/admission``."""
        code, value, log_ = await self._query("/admission", b"")
        if code:
            raise RegistrationError(f"the committee answered /admission with code {code}: {log_[:200]}")
        try:
            doc = msgpack.unpackb(value, raw=False, strict_map_key=True, max_map_len=64, max_array_len=64)
            bits, n_log2 = doc["work_bits"], doc["params"]["work_n_log2"]
        except (*DECODE_ERRORS, KeyError) as exc:
            raise RegistrationError(f"the committee's /admission answer does not decode ({type(exc).__name__})") \
                from None
        if type(bits) is not int or type(n_log2) is not int or not 0 <= bits <= work.MAX_BITS \
                or not work.MIN_N_LOG2 <= n_log2 <= work.MAX_N_LOG2:
            raise RegistrationError(f"the committee's /admission answer is out of range ({bits}, {n_log2})")
        return bits, n_log2

    async def solve_work(self) -> None:
        """Pay the registration's proof of work (decision 0014), in a worker thread, unless the nonce
        held already proves what the committee requires now."""
        bits, n_log2 = await self.admission()
        reg = self.registrar
        pub = reg.signing.public_bytes
        if bits == 0 or (reg.work and work.bits_of(reg.chain_id, pub, reg.work, n_log2) >= bits):
            return
        log.info("paying the registration's proof of work: %d bits (about %d scrypt trials of 2^%d)", bits,
                 1 << bits, n_log2)
        stop = False
        try:
            got = await trio.to_thread.run_sync(
                lambda: work.solve(reg.chain_id, pub, bits, n_log2, cancelled=lambda: stop), abandon_on_cancel=True)
        finally:
            stop = True
        assert got is not None
        reg.work = got[0]
        self.work_trials += got[1]

    async def register(self) -> int:
        """Register (or, still listed after a restart, update) this node; the block it committed in.

        A key the committee does not know (seq 0) pays the proof of work first. A REPLAYED,
        CONFLICT, UNKNOWN_NODE or LOW_WORK answer means the committee's view moved under us
        (another process with this key, an expiry, a rise in the work required): the state is read
        again and the send retried once.
        """
        for attempt in (0, 1):
            seq, listed = await self.read_state()
            self.registrar.begin(seq, listed, self.floor())
            if not listed and seq == 0:
                await self.solve_work()
            try:
                self.height = await self.submit(self.registrar.next_tx())
            except RegistrationError as exc:
                if attempt == 0 and exc.code in (Code.REPLAYED, Code.CONFLICT, Code.UNKNOWN_NODE, Code.LOW_WORK):
                    continue
                raise
            self.registrar.committed(self.clock.monotonic())
            return self.height
        raise AssertionError("unreachable")

    async def leave(self) -> None:
        """Send the leave transaction and wait for it to commit."""
        if not self.registrar.listed:
            return
        self.registrar.floor = max(self.registrar.floor, self.floor())
        self.height = await self.submit(self.registrar.leave_tx())
        self.registrar.left()

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Register, report the height to ``task_status``, refresh before expiry until cancelled,
        then leave (shielded, at most :data:`LEAVE_TIMEOUT_S`; a node that cannot leave expires)."""
        await self.wait_reachable()
        height = await self.register()
        task_status.started(height)
        try:
            while True:
                assert self.registrar.due_at is not None
                await trio.sleep(max(0.0, self.registrar.due_at - self.clock.monotonic()))
                try:
                    await self.register()
                except RegistrationError as exc:
                    log.warning("registration refresh failed (retrying in %g s): %s", self.registrar.retry, exc)
                    self.registrar.failed(self.clock.monotonic())
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(LEAVE_TIMEOUT_S) as scope:
                try:
                    await self.leave()
                    log.info("left the committee's lists (block %d)", self.height)
                except RegistrationError as exc:
                    log.warning("could not leave the committee's lists (the entry will expire): %s", exc)
            if scope.cancelled_caught:
                log.warning("leave not committed within %g s; the entry will expire", LEAVE_TIMEOUT_S)
