"""The committee's application core: a deterministic, I/O-free state machine (DESIGN.md "Verifier committee").

CometBFT orders transactions; this core states the rules. It holds the registered user and model
nodes and every node's last sequence number, takes ABCI's calls as plain method calls with plain
values, and returns plain values: :mod:`verifier.abci_app` translates protobuf and persists.

Determinism: every verifier that applies the same blocks holds byte-identical state. The only time
the core knows is the block time from the header CometBFT hands to ``prepare_proposal``,
``process_proposal`` and ``finalize_block`` (BFT time: the same on every validator), in whole
seconds; it never reads a clock.

Rules (codes in :class:`overlay.directory.registration.Code`):

- register: the node is not registered (else CONFLICT, use update); seq > its last seq (REPLAYED);
  the address is not held by another node (CONFLICT).
- update: the node is registered (UNKNOWN_NODE); seq > last (REPLAYED); the role does not change
  (CONFLICT); the address is not held by another node (CONFLICT). An update with an unchanged
  entry is the refresh that keeps an entry alive.
- leave: the node is registered (UNKNOWN_NODE); seq > last (REPLAYED).
- expiry: an entry expires :data:`ENTRY_TTL_S` seconds of block time after its last register or
  update; expired entries are dropped at the start of the first block whose time reaches it.
- A node's last seq outlives its entry (leave, expiry), so an old transaction can never be replayed.

Audits (:mod:`verifier.audit.chain`, docs/committee.md "Audits"): with an ``audit`` section in the
genesis ``app_state``, audit transactions (``GTAUDIT2`` tag, :mod:`verifier.audit.tx`) are checked
and applied at the height and block time of the block they are in (CheckTx: the next height, the
last block's time), and every block ends with :func:`verifier.audit.chain.end_block` at its height
and hash (the epoch's settlement and the next seed at its last block). The model list the
committee signs holds every registered model node with its reputation and whether its model is
audited (decision 0013); clients use only the trusted ones.

The app hash is SHA-256 of :meth:`CommitteeState.canonical_bytes`; it covers the chain id, the
validators, the entries, the sequence numbers and the audit state, not the height (so empty blocks
keep it, except where the audit state moves at a block's end).
A transaction that breaks a rule never changes state: CheckTx rejects it, PrepareProposal drops
it, ProcessProposal rejects a block that holds one, and FinalizeBlock, should one get that far,
answers its code and skips it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

import msgpack

from overlay.directory import lists
from overlay.directory.registration import (  # noqa: F401 - REFRESH_INTERVAL_S re-exported
    DECODE_ERRORS,
    ENTRY_TTL_S,
    OP_LEAVE,
    OP_REGISTER,
    REFRESH_INTERVAL_S,
    Code,
    Entry,
    Tx,
    TxError,
    decode_tx,
    pack,
)
from overlay.wire import crypto
from overlay.wire.constants import MAX_VALIDATORS, ROLE_MODEL, ROLE_NAMES, ROLE_USER
from verifier import admission, quorum
from verifier.admission import AdmissionParams
from verifier.audit import chain as audits
from verifier.audit import tx as audit_tx
from verifier.audit.reputation import R0
from verifier.quorum import Change, ListCert

STATE_VERSION = 6  # 3: the audit state (verifier/audit/chain.py); 4: its decision 0013 form; 5: admission;
# 6: transcript scores (decision 0015)
SNAPSHOT_VERSION = 2  # 2: the block time and the last list certificate
# An entry lives ENTRY_TTL_S (block time) after its last register/update; nodes refresh every
# REFRESH_INTERVAL_S (both defined with the codec, in overlay/directory/registration.py).
DECODE_MEMO = 50_000  # decoded transactions remembered (about 20 MB at most)
LIST_HISTORY = 8  # heights whose lists a verifier keeps to serve under a certificate
DELTA_HISTORY = 1200  # heights whose changed node ids a verifier keeps to serve deltas (20 min at 1 block/s)


class StateError(Exception):
    """Persisted state is corrupt or from another format; the verifier must not start on it."""


@dataclass(frozen=True, slots=True)
class Validator:
    """A CometBFT validator from genesis: key type (``ed25519``), public key, voting power."""

    key_type: str
    public_key: bytes
    power: int

    @property
    def address(self) -> bytes:
        """CometBFT's validator address: the first 20 bytes of SHA-256 of the public key."""
        return crypto.sha256(self.public_key)[:20]


@dataclass(frozen=True, slots=True)
class Record:
    """A live registration: the node's keys, its entry, and the block time it expires at.

    ``packed`` caches the record's canonical msgpack encoding, so hashing a state of 10,000 nodes
    joins cached bytes instead of re-encoding every record each block.
    """

    node_id: bytes
    ed25519_public: bytes
    entry: Entry
    expires_at: int
    packed: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "packed", pack(self.to_wire()))

    def to_wire(self) -> list[object]:
        return [self.node_id, self.ed25519_public, *self.entry.to_wire(), self.expires_at]


@dataclass(frozen=True, slots=True)
class Pending:
    """A registration awaiting its address probe (decision 0014): listed once validators with more
    than 2/3 of the power (``attesters``) reached the key at the address; dropped at ``expires_at``."""

    node_id: bytes
    ed25519_public: bytes
    entry: Entry
    seq: int
    expires_at: int
    attesters: frozenset[bytes] = frozenset()

    def to_wire(self) -> list[object]:
        return [self.node_id, self.ed25519_public, *self.entry.to_wire(), self.seq, self.expires_at,
                sorted(self.attesters)]


@dataclass(frozen=True, slots=True)
class Tombstone:
    """A node that left or expired: its address stays reserved to it (and its seq kept) until ``until``."""

    node_id: bytes
    address: str
    until: int


def _array_header(n: int) -> bytes:
    """msgpack's array header for ``n`` items, as msgpack itself writes it."""
    if n < 16:
        return bytes([0x90 | n])
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


@dataclass(frozen=True, slots=True)
class Result:
    """What CheckTx/FinalizeBlock answer for one transaction."""

    code: Code
    log: str

    @property
    def ok(self) -> bool:
        return self.code == Code.OK


OK = Result(Code.OK, "")


@dataclass(slots=True)
class CommitteeState:
    """Everything hashed into the app hash. ``addresses`` is a derived index, not hashed."""

    chain_id: str = ""
    validators: tuple[Validator, ...] = ()
    nodes: dict[bytes, Record] = field(default_factory=dict)
    seqs: dict[bytes, int] = field(default_factory=dict)
    change_seq: int = 0  # the last committee change applied (verifier/quorum.py)
    addresses: dict[str, bytes] = field(default_factory=dict)
    audit: audits.AuditState | None = None  # None: the genesis has no audit section (audits off)
    admission: AdmissionParams = admission.OPEN
    paid: tuple[int, ...] = ()  # block times of the registrations that paid work, within the window
    pending: dict[bytes, Pending] = field(default_factory=dict)
    tombstones: dict[bytes, Tombstone] = field(default_factory=dict)
    reserved: dict[str, bytes] = field(default_factory=dict)  # derived: tombstoned address -> node id
    held: dict[str, int] = field(default_factory=dict)  # derived: listed nodes per IP and prefix

    def copy(self) -> CommitteeState:
        return CommitteeState(self.chain_id, self.validators, dict(self.nodes), dict(self.seqs), self.change_seq,
                              dict(self.addresses), self.audit, self.admission, self.paid, dict(self.pending),
                              dict(self.tombstones), dict(self.reserved), dict(self.held))

    def admission_wire(self) -> list[object]:
        return [self.admission.to_wire(), list(self.paid), [self.pending[n].to_wire() for n in sorted(self.pending)],
                [[t.node_id, t.address, t.until] for _, t in sorted(self.tombstones.items())]]

    def validator_powers(self) -> list[tuple[bytes, int]]:
        """``(Ed25519 key, power)`` of each validator, in the committee's order (the audit's order)."""
        return [(v.public_key, v.power) for v in self.validators]

    def reputation(self, node_id: bytes) -> int:
        """A model node's reputation (fixed point); R(0) when never audited or audits are off."""
        if self.audit is None:
            return R0
        return self.audit.reputation.get(node_id).value

    def validator_keys(self) -> tuple[lists.ValidatorKey, ...]:
        return tuple(lists.ValidatorKey(v.public_key, v.power) for v in self.validators)

    def canonical_bytes(self) -> bytes:
        """One encoding per state: the msgpack array ``[STATE_VERSION, chain_id, validators,
        records sorted by node id, [node_id, seq] pairs sorted by node id, change_seq, audit,
        admission]`` with bin types; ``audit`` is nil (audits off) or
        :meth:`verifier.audit.AuditState.to_wire`; ``admission`` is :meth:`admission_wire`."""
        return b"".join((
            _array_header(8),
            pack(STATE_VERSION),
            pack(self.chain_id),
            pack([[v.key_type, v.public_key, v.power] for v in self.validators]),
            _array_header(len(self.nodes)),
            *(self.nodes[n].packed for n in sorted(self.nodes)),
            pack([[n, self.seqs[n]] for n in sorted(self.seqs)]),
            pack(self.change_seq),
            _audit_bytes(self.audit),
            pack(self.admission_wire()),
        ))

    def app_hash(self) -> bytes:
        return crypto.sha256(self.canonical_bytes())

    @classmethod
    def from_canonical_bytes(cls, raw: bytes) -> CommitteeState:
        """Inverse of :meth:`canonical_bytes`; :class:`StateError` if ``raw`` is not one."""
        try:
            fields = msgpack.unpackb(raw, raw=False, strict_map_key=True)
            version = fields[0] if type(fields) is list and fields else None
            if version != STATE_VERSION:
                raise StateError(f"persisted state format {version}; this verifier reads {STATE_VERSION} (format 3 "
                                 "added the audit state). Resync: delete the data dir's app_state.bin and CometBFT's "
                                 "data, and let the verifier replay the chain")
            _, chain_id, vals, nodes, seqs, change_seq, audit, (params, paid, pending, tombs) = fields
            st = cls(chain_id=chain_id, validators=tuple(Validator(t, bytes(k), p) for t, k, p in vals),
                     change_seq=change_seq, audit=None if audit is None else audits.AuditState.from_wire(audit))
            for node_id, ed, role, x, addr, region, model_id, cap, expires in nodes:
                st.nodes[node_id] = Record(node_id, ed, Entry(role, x, addr, region, model_id, cap), expires)
                st.addresses[addr] = node_id
            st.seqs = {n: s for n, s in seqs}
            st.admission = AdmissionParams.from_wire(params)
            st.paid = tuple(paid)
            for node_id, ed, role, x, addr, region, model_id, cap, seq, expires, attesters in pending:
                st.pending[node_id] = Pending(node_id, ed, Entry(role, x, addr, region, model_id, cap), seq, expires,
                                              frozenset(attesters))
            for node_id, addr, until in tombs:
                st.tombstones[node_id] = Tombstone(node_id, addr, until)
                st.reserved[addr] = node_id
            for rec in st.nodes.values():
                _hold(st, rec.entry.address, 1)
        except StateError:
            raise
        except (*DECODE_ERRORS, KeyError, audits.AuditParamsError, admission.AdmissionParamsError) as exc:
            raise StateError(f"persisted state does not decode ({type(exc).__name__}: {exc})") from None
        if st.canonical_bytes() != raw:
            raise StateError("persisted state is not in canonical form")
        return st


_AUDIT_CANON: list[tuple[audits.AuditState, bytes]] = []  # the last audit state encoded (states are immutable)


def _audit_bytes(audit: audits.AuditState | None) -> bytes:
    """``audit``'s canonical bytes (msgpack nil when off), encoded once per audit state: most blocks
    change registrations, not the audit, and a report with its challenges runs to hundreds of KB."""
    if audit is None:
        return b"\xc0"
    if _AUDIT_CANON and _AUDIT_CANON[0][0] is audit:
        return _AUDIT_CANON[0][1]
    raw = audit.canonical_bytes()
    _AUDIT_CANON[:] = [(audit, raw)]
    return raw


def _check(st: CommitteeState, tx: Tx) -> None:
    """Stateful rules; :class:`TxError` if ``tx`` may not apply to ``st``."""
    node_id = tx.node_id
    last = st.seqs.get(node_id, 0)
    if tx.seq <= last:
        raise TxError(Code.REPLAYED, f"seq {tx.seq} is not above node {node_id.hex()[:8]}'s last seq {last}")
    current = st.nodes.get(node_id)
    pending = st.pending.get(node_id)
    if tx.op == OP_REGISTER and current is not None:
        raise TxError(Code.CONFLICT, f"node {node_id.hex()[:8]} is already registered; send an update")
    if tx.op != OP_REGISTER and current is None and (tx.op != OP_LEAVE or pending is None):
        raise TxError(Code.UNKNOWN_NODE, f"node {node_id.hex()[:8]} is not registered (or expired"
                                         f"{', or awaits its address probe' if pending else ''}); register it")
    if tx.entry is not None:
        _check_entry(st, tx, current)


def _check_entry(st: CommitteeState, tx: Tx, current: Record | None) -> None:
    """The rules on a register's or update's entry: role, address holders, admission (decision 0014)."""
    assert tx.entry is not None
    node_id, address = tx.node_id, tx.entry.address
    if current is not None and current.entry.role != tx.entry.role:
        raise TxError(Code.CONFLICT, f"an update cannot change the role from {ROLE_NAMES[current.entry.role]} "
                                     f"to {ROLE_NAMES[tx.entry.role]}; leave and register with a new key")
    holder = st.addresses.get(address)
    if holder is not None and holder != node_id:
        raise TxError(Code.CONFLICT, f"address {address} is held by node {holder.hex()[:8]}")
    holder = st.reserved.get(address)
    if holder is not None and holder != node_id:
        raise TxError(Code.CONFLICT, f"address {address} is reserved to node {holder.hex()[:8]}, which left; it "
                                     f"may come back until block time {st.tombstones[holder].until}")
    params = st.admission
    moving = current is None or current.entry.address != address
    if moving:
        admission.check_allowed(params, address)
        admission.check_caps(params, address, st.held, None if current is None else current.entry.address)
    if tx.op == OP_REGISTER and node_id not in st.tombstones and node_id not in st.pending:
        if params.probe and len(st.pending) >= admission.MAX_PENDING:
            raise TxError(Code.PENDING_FULL, f"{len(st.pending)} registrations await their address probe; retry in "
                                             "a minute")
        admission.check_work(params, st.chain_id, tx.ed25519_public, tx.work, len(st.paid))


def _hold(st: CommitteeState, address: str, delta: int) -> None:
    """Count a listed node's ``address`` in (``delta`` 1) or out of (-1) the caps' index, when the
    network has caps. Pending registrations do not count: a claim nobody has proven must not use up
    the cap of an IP or a prefix (a squatter could then lock its owner out); the caps are checked
    again when a pending registration is listed."""
    if not st.admission.per_ip and not st.admission.per_prefix:
        return
    for key in admission.cap_keys(address):
        n = st.held.get(key, 0) + delta
        if n:
            st.held[key] = n
        else:
            st.held.pop(key, None)


def _list(st: CommitteeState, node_id: bytes, ed25519_public: bytes, entry: Entry, time_s: int) -> None:
    st.nodes[node_id] = Record(node_id, ed25519_public, entry, time_s + ENTRY_TTL_S)
    st.addresses[entry.address] = node_id
    _hold(st, entry.address, 1)


def _unlist(st: CommitteeState, node_id: bytes, time_s: int) -> None:
    """Take a listed node off the list; its address and seq stay reserved to it (a tombstone)."""
    rec = st.nodes.pop(node_id)
    del st.addresses[rec.entry.address]
    _hold(st, rec.entry.address, -1)
    st.tombstones[node_id] = Tombstone(node_id, rec.entry.address, time_s + admission.RESERVE_S)
    st.reserved[rec.entry.address] = node_id


def _apply(st: CommitteeState, tx: Tx, time_s: int) -> None:
    """Apply a checked ``tx`` to ``st`` in place."""
    node_id = tx.node_id
    st.seqs[node_id] = tx.seq
    old = st.nodes.get(node_id)
    prior = st.pending.pop(node_id, None)
    tomb = st.tombstones.pop(node_id, None)
    if tomb is not None:
        del st.reserved[tomb.address]
    if tx.op == OP_LEAVE:
        if old is not None:
            _unlist(st, node_id, time_s)
        else:  # a pending registration withdrawn: it was never listed, it reserves nothing
            del st.seqs[node_id]
        return
    entry = tx.entry
    assert entry is not None
    params = st.admission
    if tx.op == OP_REGISTER and tomb is None and prior is None and admission.required_bits(params, len(st.paid)):
        st.paid += (time_s,)
    known = (old is not None and old.entry.address == entry.address) or (tomb is not None and tomb.address ==
                                                                          entry.address)
    if old is not None:
        del st.nodes[node_id]
        del st.addresses[old.entry.address]
        _hold(st, old.entry.address, -1)
    if params.probe and not known:  # a new address is listed once the validators reached the key there
        st.pending[node_id] = Pending(node_id, tx.ed25519_public, entry, tx.seq, time_s + admission.PENDING_TTL_S)
    else:
        _list(st, node_id, tx.ed25519_public, entry, time_s)


def _apply_probe(st: CommitteeState, probe: admission.ProbeTx, time_s: int, check_only: bool) -> int:
    """Record a validator's probe; a pending registration attested by more than 2/3 of the power is
    listed, unless its address was taken meanwhile or its IP or prefix reached its cap: then it is
    dropped. Returns how many were dropped."""
    power = {v.public_key: v.power for v in st.validators}
    if probe.validator not in power:
        raise TxError(Code.NOT_VALIDATOR, f"probe from {probe.validator.hex()[:16]}, not a current validator")
    fresh = [p for n, seq in probe.reached if (p := st.pending.get(n)) is not None and p.seq == seq
             and probe.validator not in p.attesters]
    if not fresh:
        raise TxError(Code.REPLAYED, "the probe names no registration awaiting this validator's probe (already "
                                     "reported, listed or dropped)")
    if check_only:
        return 0
    total = sum(power.values())
    dropped = 0
    for p in fresh:
        p = Pending(p.node_id, p.ed25519_public, p.entry, p.seq, p.expires_at, p.attesters | {probe.validator})
        if 3 * sum(power.get(k, 0) for k in p.attesters) <= 2 * total:
            st.pending[p.node_id] = p
            continue
        del st.pending[p.node_id]
        address = p.entry.address
        try:
            admission.check_caps(st.admission, address, st.held)
            taken = st.addresses.get(address, p.node_id) != p.node_id or st.reserved.get(address, p.node_id) != p.node_id
        except TxError:
            taken = True
        if taken:
            st.seqs.pop(p.node_id, None)
            dropped += 1
            continue
        _list(st, p.node_id, p.ed25519_public, p.entry, time_s)
    return dropped


def _proto_size(raw: bytes) -> int:
    """Bytes ``raw`` takes as a ``repeated bytes`` field in a block (tag, varint length, data)."""
    n = len(raw)
    length = 1
    while n >= 0x80:
        n >>= 7
        length += 1
    return 1 + length + len(raw)


def _expire(st: CommitteeState, time_s: int) -> CommitteeState:
    """``st`` as of the start of a block at ``time_s`` (a copy if anything changes, else ``st``):
    expired entries leave the list (their address stays reserved to them, decision 0014), pending
    registrations not probed in time are dropped, reservations run out (and the seqs they kept
    are pruned), and paid registrations leave the work window."""
    gone = [n for n, r in st.nodes.items() if r.expires_at <= time_s]
    stale = [n for n, p in st.pending.items() if p.expires_at <= time_s]
    over = [n for n, t in st.tombstones.items() if t.until <= time_s]
    since = time_s - st.admission.window_s
    if not (gone or stale or over or (st.paid and st.paid[0] <= since)):
        return st
    out = st.copy()
    for n in over:
        tomb = out.tombstones.pop(n)
        del out.reserved[tomb.address]
        out.seqs.pop(n, None)
    for n in stale:
        del out.pending[n]
        out.seqs.pop(n, None)
    for n in gone:
        _unlist(out, n, time_s)
    out.paid = tuple(t for t in out.paid if t > since)
    return out


@dataclass(frozen=True, slots=True)
class ListsAt:
    """The lists of one committed state as the committee signs and serves them (overlay/directory/lists.py):
    their bytes and digests, their time (the BFT time of the block that made that state), and each
    record's bytes by node id (what a delta serves)."""

    users: bytes
    models: bytes
    users_digest: bytes
    models_digest: bytes
    validators: tuple[lists.ValidatorKey, ...]
    validators_digest: bytes
    time_s: int
    user_records: dict[bytes, bytes] = field(repr=False)
    model_records: dict[bytes, bytes] = field(repr=False)

    @classmethod
    def of(cls, st: CommitteeState, time_s: int = 0) -> ListsAt:
        users: dict[bytes, bytes] = {}
        models: dict[bytes, bytes] = {}
        nodes = st.nodes
        table = st.audit.reputation.nodes if st.audit is not None else {}
        audited = audits.audited_models(st.audit, st.validator_powers())  # empty when audits are off
        flags = {True: pack(True), False: pack(False)}
        for n in sorted(nodes):
            rec = nodes[n]
            if rec.entry.role == ROLE_USER:
                users[n] = rec.packed
                continue
            got = table.get(n)
            value = R0 if got is None else got.value
            # Every model node is listed, untrusted ones too (value < TRUST_LINE): audits must reach
            # them and clients leave them out (decision 0013). The record's 9-field array with a 10th
            # and an 11th field, the reputation and whether its model is audited: fixarray 9 -> 11.
            models[n] = b"\x9b" + rec.packed[1:] + pack(value) + flags[rec.entry.model_id in audited]
        ub = lists.array_header(len(users)) + b"".join(users.values())
        mb = lists.array_header(len(models)) + b"".join(models.values())
        vals = st.validator_keys()
        return cls(ub, mb, crypto.sha256(ub), crypto.sha256(mb), vals, lists.validators_digest(vals), time_s, users,
                   models)

    def at(self, time_s: int) -> ListsAt:
        """The same lists at another block time (an unchanged state in a later block)."""
        return self if time_s == self.time_s else replace(self, time_s=time_s)

    def records(self, kind: int) -> dict[bytes, bytes]:
        return self.user_records if kind == lists.KIND_USERS else self.model_records

    def message(self, chain_id: str, height: int) -> bytes:
        return lists.signing_message(chain_id, height, self.time_s, self.users_digest, self.models_digest,
                                     self.validators_digest)


def _changed(before: dict[bytes, bytes], after: dict[bytes, bytes]) -> frozenset[bytes]:
    """The node ids whose record differs between two lists' records (added, changed or removed)."""
    out = {n for n, raw in after.items() if before.get(n) != raw}
    out.update(before.keys() - after.keys())
    return frozenset(out)


def _power_check(st: CommitteeState, signed: int, what: str) -> None:
    total = sum(v.power for v in st.validators)
    if 3 * signed <= 2 * total:
        raise TxError(Code.BAD_SIGNATURE, f"{what}: valid signatures from {signed} of {total} voting power; "
                                          "more than 2/3 are required")


def _signed_power(st: CommitteeState, pairs: Sequence[tuple[bytes, bytes]], message: bytes, what: str) -> int:
    """Power of the current validators among ``pairs``; :class:`TxError` if any signer or signature is bad."""
    power = {v.public_key: v.power for v in st.validators}
    for key, sig in pairs:
        if key not in power:
            raise TxError(Code.BAD_SIGNATURE, f"{what}: {key.hex()[:16]} is not a current validator")
        try:
            crypto.ed25519_verify(key, sig, message)
        except crypto.CryptoError:
            raise TxError(Code.BAD_SIGNATURE, f"{what}: the signature by {key.hex()[:16]} does not verify") from None
    return sum(power[k] for k, _ in pairs)


def _check_cert(st: CommitteeState, cert: ListCert, last_height: int) -> None:
    """A certificate is recordable: newer than the last, over this validator set, > 2/3 of its power."""
    if cert.height <= last_height:
        raise TxError(Code.REPLAYED, f"a list certificate for height {cert.height}, not above {last_height}")
    if cert.validators_digest != lists.validators_digest(st.validator_keys()):
        raise TxError(Code.CONFLICT, "the list certificate names another validator set than the current one")
    message = lists.signing_message(st.chain_id, cert.height, cert.time_s, cert.users_digest, cert.models_digest,
                                    cert.validators_digest)
    _power_check(st, _signed_power(st, cert.signatures, message, "list certificate"), "list certificate")


def _check_change(st: CommitteeState, change: Change) -> None:
    if change.seq != st.change_seq + 1:
        raise TxError(Code.REPLAYED, f"committee change seq {change.seq}; the next is {st.change_seq + 1}")
    current = {v.public_key: v for v in st.validators}
    if change.power == 0 and change.public_key not in current:
        raise TxError(Code.UNKNOWN_NODE, f"{change.public_key.hex()[:16]} is not a validator; nothing to remove")
    if change.power == 0 and len(current) == 1:
        raise TxError(Code.CONFLICT, "the last validator cannot leave")
    if change.power and change.public_key not in current and len(current) >= MAX_VALIDATORS:
        raise TxError(Code.CONFLICT, f"the committee already has {MAX_VALIDATORS} validators")
    message = quorum.change_signing_bytes(st.chain_id, change.body)
    _power_check(st, _signed_power(st, change.approvals, message, "committee change"), "committee change")


def _apply_change(st: CommitteeState, change: Change) -> Validator:
    rest = [v for v in st.validators if v.public_key != change.public_key]
    update = Validator("ed25519", change.public_key, change.power)
    st.validators = tuple(sorted(rest + ([update] if change.power else []), key=lambda v: (v.key_type, v.public_key)))
    st.change_seq = change.seq
    return update


@dataclass(slots=True)
class _Block:
    """What running a block's transactions gives: the next state, one result per tx, a certificate to
    record (from the block's first transaction) and validator updates for CometBFT."""

    state: CommitteeState
    results: list[Result]
    cert: ListCert | None = None
    updates: dict[bytes, Validator] = field(default_factory=dict)


class CommitteeApp:
    """The application core. One instance per verifier; the ABCI driver calls it in order.

    ``committed`` is the state as of ``height`` (what Info, CheckTx and Query see); a
    ``finalize_block`` computes the next state, which ``commit`` makes current.
    """

    def __init__(self, state: CommitteeState | None = None, height: int = 0) -> None:
        self.committed = state if state is not None else CommitteeState()
        self.height = height
        self.app_hash = self.committed.app_hash() if height > 0 else b""
        self._pending: tuple[int, CommitteeState, bytes] | None = None
        # Every drop is counted: CheckTx rejections by code, transactions PrepareProposal left out,
        # proposals ProcessProposal rejected, and transactions FinalizeBlock skipped.
        self.rejected: dict[Code, int] = {}
        self.dropped_from_proposals = 0
        self.rejected_proposals = 0
        self.skipped_in_blocks = 0
        self.probes_dropped = 0  # pending registrations whose address another node took before their probe
        # Signed lists: the latest certificate (from blocks; not in the app hash: it authenticates
        # itself) and the lists of the last LIST_HISTORY committed heights, to serve under it.
        self.cert: ListCert | None = None
        self._pending_cert: ListCert | None = None
        self._pending_lists: ListsAt | None = None
        self.updates: list[Validator] = []  # validator updates of the last finalize_block
        self._history: dict[int, ListsAt] = {}
        self._history_state: CommitteeState | None = None
        self._pending_time = 0  # the time of the block finalize_block ran (its lists' time)
        # height -> the node ids whose user / model record changed in that height's block (deltas)
        self._changes: dict[int, tuple[frozenset[bytes], frozenset[bytes]]] = {}
        self._decoded: dict[bytes, Tx] = {}
        # block hash -> (height, the state it was run on, the run, the lists after it)
        self._proposed: dict[bytes, tuple[int, CommitteeState, _Block, ListsAt]] = {}
        self._canon: tuple[CommitteeState, bytes] | None = None  # the last canonical encoding made
        if height > 0:
            self._remember()

    # ----------------------------------------------------------------- handshake

    def info(self) -> tuple[int, bytes]:
        """(last committed height, its app hash): CometBFT replays the blocks after it."""
        return self.height, self.app_hash

    def init_chain(self, chain_id: str, validators: Iterable[Validator], app_state: bytes = b"") -> bytes:
        """Start from genesis; returns the genesis app hash (``b""``, as CometBFT's genesis holds).

        ``app_state``: the genesis ``app_state`` JSON bytes; its ``audit`` section
        (:func:`verifier.audit.params_from_app_state`) turns audits on; without one they are off.
        Raises :class:`verifier.audit.AuditParamsError` for a malformed section."""
        vals = tuple(sorted(validators, key=lambda v: (v.key_type, v.public_key)))
        if len(vals) > MAX_VALIDATORS:
            raise ValueError(f"{len(vals)} validators in genesis, at most {MAX_VALIDATORS}")
        params = audits.params_from_app_state(app_state)
        self.committed = CommitteeState(chain_id=chain_id, validators=vals,
                                        audit=None if params is None else audits.initial(params, chain_id),
                                        admission=admission.params_from_app_state(app_state))
        self._decoded.clear()
        self.height = 0
        self.app_hash = b""
        self._pending = None
        self._history.clear()
        self._remember()
        return b""

    # ----------------------------------------------------------------- signed lists

    def _canonical(self, st: CommitteeState) -> bytes:
        """``st.canonical_bytes()``, made once per state (FinalizeBlock hashes it, Commit persists it)."""
        if self._canon is None or self._canon[0] is not st:
            self._canon = (st, st.canonical_bytes())
        return self._canon[1]

    def _remember(self, computed: ListsAt | None = None, time_s: int = 0) -> None:
        """Keep the lists of the committed state (block time ``time_s``) and which records changed
        since the height before (when its lists are held: not across a restart)."""
        prev = self._history.get(self.height - 1)
        st = self.committed
        if prev is not None and self._history_state is st:
            now = prev.at(time_s)
        else:
            now = computed.at(time_s) if computed is not None else ListsAt.of(st, time_s)
        self._history[self.height] = now
        self._history_state = st
        if prev is not None:
            self._changes[self.height] = (
                frozenset() if prev.users_digest == now.users_digest else _changed(prev.user_records, now.user_records),
                frozenset() if prev.models_digest == now.models_digest else _changed(prev.model_records,
                                                                                      now.model_records))
        for h in [h for h in self._history if h <= self.height - LIST_HISTORY]:
            del self._history[h]
        for h in [h for h in self._changes if h <= self.height - DELTA_HISTORY]:
            del self._changes[h]

    def _lists_of(self, st: CommitteeState, time_s: int) -> ListsAt:
        """The lists of ``st`` at block time ``time_s``; those already held when ``st`` is the committed state."""
        held = self._history.get(self.height)
        return held.at(time_s) if held is not None and st is self._history_state else ListsAt.of(st, time_s)

    def lists_at(self, height: int) -> ListsAt | None:
        """The lists as of committed ``height``, if still held."""
        return self._history.get(height)

    def _run_block(self, height: int, block_hash: bytes, txs: Sequence[bytes], time_s: int) -> _Block:
        """Run proposed block ``height`` once: ProcessProposal, ExtendVote and FinalizeBlock of the same
        block hash (which covers its transactions and time) on the same committed state share it."""
        got = self._proposed.get(block_hash) if block_hash else None
        if got is not None and got[0] == height and got[1] is self.committed:
            return got[2]
        block = self._run(txs, time_s, height, block_hash)
        if block_hash and all(r.ok for r in block.results):
            self._proposed[block_hash] = (height, self.committed, block, self._lists_of(block.state, time_s))
        return block

    def _lists_after(self, height: int, block_hash: bytes, txs: Sequence[bytes], time_s: int) -> ListsAt:
        """The lists as of the end of proposed block ``height`` (``block_hash``), computed once per block."""
        block = self._run_block(height, block_hash, txs, time_s)
        got = self._proposed.get(block_hash)
        return got[3] if got is not None and got[2] is block else self._lists_of(block.state, time_s)

    def extend_vote(self, height: int, key: crypto.SigningKey, block_hash: bytes, txs: Sequence[bytes],
                    time_s: int) -> bytes:
        """This validator's vote extension for block ``height``: its signature over the lists as they
        stand after that block (the state its commit will hold) and that block's time ``time_s``."""
        held = self._lists_after(height, block_hash, txs, time_s)
        return key.sign(held.message(self.committed.chain_id, height))

    def verify_vote_extension(self, height: int, block_hash: bytes, validator_address: bytes,
                              extension: bytes) -> bool:
        """Accept an empty extension or a valid signature; reject a wrong one.

        An extension this verifier cannot check (it has not processed that block, or does not know
        the validator) is accepted: only signatures that verify against the current set ever count
        (PrepareProposal and ProcessProposal check them again).
        """
        if not extension:
            return True
        got = self._proposed.get(block_hash)
        key = next((v.public_key for v in self.committed.validators if v.address == validator_address), None)
        if got is None or got[0] != height or got[1] is not self.committed or key is None:
            return True
        try:
            crypto.ed25519_verify(key, extension, got[3].message(self.committed.chain_id, height))
        except crypto.CryptoError:
            return False
        return True

    def make_cert(self, height: int, votes: Sequence[tuple[bytes, bytes]]) -> ListCert | None:
        """The certificate a proposer of block ``height`` puts first: the valid extensions of the votes
        for ``height - 1`` (``(validator address, extension)`` pairs, from ``local_last_commit``),
        which sign the lists as of ``height - 1`` (the committed state); None without enough of them."""
        signed = height - 1
        held = self._history.get(signed)
        st = self.committed
        last = self.cert.height if self.cert else -1
        if held is None or signed <= last or held.validators_digest != lists.validators_digest(st.validator_keys()):
            return None
        message = held.message(st.chain_id, signed)
        by_address = {v.address: v for v in st.validators}
        sigs: dict[bytes, bytes] = {}
        for address, ext in votes:
            v = by_address.get(address)
            if v is None or not ext:
                continue
            try:
                crypto.ed25519_verify(v.public_key, ext, message)
            except crypto.CryptoError:
                continue
            sigs[v.public_key] = ext
        cert = ListCert(signed, held.time_s, held.users_digest, held.models_digest, held.validators_digest,
                        tuple(sorted(sigs.items())))
        try:
            _check_cert(st, cert, last)
        except TxError:
            return None
        return cert

    # ----------------------------------------------------------------- mempool

    def check_tx(self, raw: bytes) -> Result:
        """May ``raw`` enter the mempool? Checked against the committed state; never changes it."""
        self._height = self.height + 1  # the block it would enter
        result = self._step(self.committed, raw, -1, None)
        if not result.ok:
            self.rejected[result.code] = self.rejected.get(result.code, 0) + 1
        return result

    # ----------------------------------------------------------------- blocks

    def _step(self, st: CommitteeState, raw: bytes, index: int, block: _Block | None) -> Result:
        """Check ``raw`` at position ``index`` of a block (-1: the mempool, check only: ``st`` is not
        touched) and apply it to ``st`` (which the caller owns) if it is valid. Certificates and
        validator updates go to ``block``."""
        check_only = index < 0
        try:
            if raw.startswith(audit_tx.AUDIT_TAG):
                after = self._audit(st, raw)
                if not check_only:
                    st.audit = after
                return OK
            if raw.startswith(admission.PROBE_TAG):
                probe = admission.decode_probe_tx(raw, st.chain_id)
                self.probes_dropped += _apply_probe(st, probe, self._time_s, check_only)
                return OK
            if raw.startswith(quorum.CERT_TAG):
                if index != 0 or block is None:
                    raise TxError(Code.MALFORMED, "a list certificate comes only from a block proposer, "
                                                  "as the block's first transaction")
                cert = quorum.decode_cert(raw)
                _check_cert(st, cert, self.cert.height if self.cert else -1)
                block.cert = cert
                return OK
            if raw.startswith(quorum.PREFIX):
                change = quorum.decode_change(raw)
                _check_change(st, change)
                if check_only:
                    return OK
                update = _apply_change(st, change)
                if block is not None:
                    block.updates[update.public_key] = update
                return OK
            tx = self._decode(raw)
            _check(st, tx)
        except TxError as exc:
            return Result(exc.code, exc.reason)
        if not check_only:
            _apply(st, tx, self._time_s)
        return OK

    _time_s = 0
    _height = 0  # the height of the block being checked or run

    def _audit(self, st: CommitteeState, raw: bytes) -> audits.AuditState:
        """The audit state after audit transaction ``raw`` at :attr:`_height`; :class:`TxError` if refused."""
        if st.audit is None:
            raise TxError(Code.AUDITS_OFF, "this committee's genesis has no audit section; audit transactions are "
                                           "not taken")
        tx = audit_tx.decode_audit_tx(raw, st.chain_id)
        return audits.take(st.audit, tx, raw, height=self._height, time_s=self._time_s,
                           validators=st.validator_powers(), nodes=st.nodes)

    def _decode(self, raw: bytes) -> Tx:
        """:func:`decode_tx` for this chain, remembered: the signature check is the costly part, and
        each transaction is checked by CheckTx, again in ProcessProposal and in FinalizeBlock. A pure
        function of the bytes, so remembering it cannot change any outcome."""
        got = self._decoded.get(raw)
        if got is None:
            got = decode_tx(raw, self.committed.chain_id)
            if len(self._decoded) >= DECODE_MEMO:
                del self._decoded[next(iter(self._decoded))]
            self._decoded[raw] = got
        return got

    def _run(self, txs: Sequence[bytes], time_s: int, height: int = 0, block_hash: bytes = b"") -> _Block:
        st = _expire(self.committed, time_s)
        block = _Block(st, [])
        self._time_s = time_s
        self._height = height or self.height + 1
        for i, raw in enumerate(txs):
            if block.state is self.committed and not raw.startswith(quorum.CERT_TAG):
                block.state = block.state.copy()  # a certificate changes no state; anything else may
            block.results.append(self._step(block.state, raw, i, block))
        audit = block.state.audit
        if audit is not None:
            after = audits.end_block(audit, self._height, block_hash, block.state.validator_powers())
            if after is not audit:
                if block.state is self.committed:
                    block.state = block.state.copy()
                block.state.audit = after
        return block

    def prepare_proposal(self, txs: Sequence[bytes], max_tx_bytes: int, time_s: int, height: int = 0,
                         votes: Sequence[tuple[bytes, bytes]] = ()) -> list[bytes]:
        """The transactions this proposer puts in block ``height``: first a list certificate made from
        ``votes`` (see :meth:`make_cert`) when there is one, then the mempool's valid ``txs`` in order,
        within ``max_tx_bytes``.

        Sizes count as CometBFT counts them: each transaction's protobuf encoding in the block's
        data (one tag byte, its length as a varint, its bytes).
        """
        st = _expire(self.committed, time_s).copy()
        self._time_s = time_s
        self._height = height or self.height + 1
        out: list[bytes] = []
        total = 0
        cert = self.make_cert(height, votes) if votes else None
        if cert is not None and _proto_size(cert.encode()) <= max_tx_bytes:
            out.append(cert.encode())
            total += _proto_size(out[0])
        for raw in txs:
            size = _proto_size(raw)
            if total + size > max_tx_bytes or raw.startswith(quorum.CERT_TAG) \
                    or not self._step(st, raw, len(out), None).ok:
                self.dropped_from_proposals += 1
                continue
            out.append(raw)
            total += size
        return out

    def process_proposal(self, txs: Sequence[bytes], time_s: int, height: int = 0, block_hash: bytes = b"") -> bool:
        """Accept a proposed block only if every transaction in it is valid in order. With its
        ``block_hash``, an accepted block's resulting lists are kept to check vote extensions on it."""
        ok = all(r.ok for r in self._run_block(height or self.height + 1, block_hash, txs, time_s).results)
        self.rejected_proposals += not ok
        return ok

    def finalize_block(self, height: int, time_s: int, txs: Sequence[bytes],
                       block_hash: bytes = b"") -> tuple[list[Result], bytes]:
        """Apply a decided block: one result per tx, and the app hash of the resulting state.

        The block's validator updates (committee changes) are left in :attr:`updates` for CometBFT.
        """
        if self.height > 0 and height != self.height + 1:  # genesis may set any initial height
            raise ValueError(f"FinalizeBlock for height {height} after committed height {self.height}")
        block = self._run_block(height, block_hash, txs, time_s)
        self.skipped_in_blocks += sum(not r.ok for r in block.results)
        unchanged = block.state is self.committed and self.app_hash
        app_hash = self.app_hash if unchanged else crypto.sha256(self._canonical(block.state))
        got = self._proposed.get(block_hash)
        self._pending_lists = got[3] if got is not None and got[2] is block else None
        self._pending_time = time_s
        self._pending = (height, block.state, app_hash)
        self._pending_cert = block.cert
        self.updates = list(block.updates.values())
        return block.results, app_hash

    def commit(self) -> bytes:
        """Make the finalized block's state current; returns the snapshot the driver must persist."""
        if self._pending is None:
            raise ValueError("Commit without a FinalizeBlock before it")
        self.height, self.committed, self.app_hash = self._pending
        self._pending = None
        if self._pending_cert is not None:
            self.cert, self._pending_cert = self._pending_cert, None
        self._remember(self._pending_lists, self._pending_time)
        self._pending_lists = None
        for h in [h for h, got in self._proposed.items() if got[0] <= self.height]:
            del self._proposed[h]
        return self.snapshot()

    # ----------------------------------------------------------------- persistence

    def snapshot(self) -> bytes:
        """The committed state and height, the time of its block, and the last list certificate
        recorded (which ProcessProposal and FinalizeBlock check new ones against), for :meth:`restore`."""
        held = self._history.get(self.height)
        return pack([SNAPSHOT_VERSION, self.height, self.app_hash, self._canonical(self.committed),
                     held.time_s if held is not None else 0, self.cert.encode() if self.cert is not None else None])

    @classmethod
    def restore(cls, raw: bytes) -> CommitteeApp:
        """An app from :meth:`snapshot`'s bytes; :class:`StateError` if they are corrupt or of another format."""
        try:
            fields = msgpack.unpackb(raw, raw=False)
        except DECODE_ERRORS as exc:
            raise StateError(f"state snapshot does not decode ({type(exc).__name__})") from None
        version = fields[0] if type(fields) is list and fields else None
        if version != SNAPSHOT_VERSION:
            raise StateError(f"state snapshot format {version}, this verifier reads {SNAPSHOT_VERSION} (format 2 "
                             "keeps the last list certificate, so a restarted verifier judges a replayed one as the "
                             "others do). Resync: delete the data dir's app_state.bin and CometBFT's data, and let "
                             "the verifier replay the chain")
        if len(fields) != 6:
            raise StateError("state snapshot is not [version, height, app hash, state, time, certificate]")
        _, height, app_hash, state, time_s, cert_raw = fields
        if type(height) is not int or height < 0 or type(state) is not bytes or type(time_s) is not int \
                or not 0 <= time_s < 2**63 or not (cert_raw is None or type(cert_raw) is bytes):
            raise StateError("state snapshot has a bad height, state, time or certificate field")
        try:
            cert = None if cert_raw is None else quorum.decode_cert(cert_raw)
        except TxError as exc:
            raise StateError(f"state snapshot's list certificate does not decode ({exc.reason})") from None
        app = cls(CommitteeState.from_canonical_bytes(state), height)
        if app.app_hash != app_hash:
            raise StateError(f"state snapshot at height {height} does not match its recorded app hash")
        app.cert = cert
        held = app._history.get(height)
        if held is not None:
            app._history[height] = held.at(time_s)
        return app

    # ----------------------------------------------------------------- query

    def query(self, path: str, data: bytes) -> tuple[Result, bytes]:
        """Read the committed state. Paths:

        - ``/node`` (data: 20-byte node id): the record ``[node_id, ed25519, role, x25519, address,
          region, model_id, capacity, expires_at]``, or UNKNOWN_NODE.
        - ``/seq`` (data: node id): the node's last committed seq (0 if none, or pruned); sign the next
          with a larger one (nodes use ``max(seq + 1, unix time in ms)``).
        - ``/admission``: :meth:`admission_info`.
        - ``/nodes`` (data: ``b"user"``, ``b"model"`` or empty for both): a list of records by node id.
        - ``/info``: ``[height, app_hash, chain_id, users, models]``.
        - ``/lists/users``, ``/lists/models``: the list as of the latest certificate with its
          signatures (the format of :mod:`overlay.directory.lists`), or UNAVAILABLE before one.
          ``/lists/users/since/H``, ``/lists/models/since/H`` (``H`` in decimal: the height of the
          list the client holds): the delta from ``H`` to the certified lists, with their signatures;
          UNAVAILABLE when this verifier no longer knows every change since ``H`` (more than
          :data:`DELTA_HISTORY` heights ago, or before its restart): fetch the full list.
        - ``/validators``: ``[change_seq, [[ed25519_public, power], ...]]``.
        - ``/audit``: the audit's state as a msgpack map (:func:`verifier.audit.chain.query_audit`;
          docs/committee.md "Audits"): who committed and reported, never what a plan holds;
          ``/audit/revealed/E`` (``E`` in decimal): ``[E, [prompt key, ...]]``, the user turns
          epoch E's reports revealed (:func:`verifier.audit.chain.query_revealed`);
          ``/reputation``: ``[[node_id, value, [window flags], epochs], ...]`` by node id. All
          answer AUDITS_OFF on a chain without audits.
        """
        st = self.committed
        if path in ("/audit", "/reputation") or path.startswith(audits.REVEALED_PATH):
            return self._query_audit(path)
        if path.startswith("/lists/"):
            return self._query_list(path)
        if path == "/validators":
            return OK, pack([st.change_seq, lists.validators_wire(st.validator_keys())])
        if path == "/node":
            rec = st.nodes.get(data)
            if rec is None:
                why = "registered, awaiting its address probe" if data in st.pending else "registered"
                return Result(Code.UNKNOWN_NODE, f"no node {data.hex()[:40]} is {why}"), b""
            return OK, rec.packed
        if path == "/seq":
            return OK, pack(st.seqs.get(data, 0))
        if path == "/admission":
            return OK, self.admission_info()
        if path == "/nodes":
            roles = {b"": (ROLE_USER, ROLE_MODEL), b"user": (ROLE_USER,), b"model": (ROLE_MODEL,)}.get(data)
            if roles is None:
                return Result(Code.INVALID_FIELD, "/nodes takes data 'user', 'model' or nothing"), b""
            recs = [st.nodes[n].packed for n in sorted(st.nodes) if st.nodes[n].entry.role in roles]
            return OK, _array_header(len(recs)) + b"".join(recs)
        if path == "/info":
            users = sum(1 for r in st.nodes.values() if r.entry.role == ROLE_USER)
            return OK, pack([self.height, self.app_hash, st.chain_id, users, len(st.nodes) - users])
        return Result(Code.INVALID_FIELD, f"unknown query path {path[:64]!r}; try /node, /seq, /nodes, /info, "
                             "/lists/users, /lists/models, /validators, /admission, /audit, /audit/revealed/EPOCH or /reputation"), b""

    def admission_info(self) -> bytes:
        """``/admission``: a msgpack map of the rules a registration meets now (decision 0014):
        ``params`` (the genesis section), ``work_bits`` (what a new key's register needs now),
        ``paid`` (registrations that paid work in the window), ``pending``, ``reserved``."""
        st = self.committed
        return pack({"params": st.admission.to_json(),
                     "work_bits": admission.required_bits(st.admission, len(st.paid)),
                     "paid": len(st.paid), "pending": len(st.pending), "reserved": len(st.tombstones)})

    def _query_audit(self, path: str) -> tuple[Result, bytes]:
        st = self.committed
        if st.audit is None:
            return Result(Code.AUDITS_OFF, "this committee's genesis has no audit section"), b""
        if path == "/reputation":
            return OK, audits.query_reputation(st.audit)
        if path.startswith(audits.REVEALED_PATH):
            epoch = path[len(audits.REVEALED_PATH):]
            if not (epoch.isdigit() and epoch.isascii() and len(epoch) <= 19):
                return Result(Code.INVALID_FIELD, f"{audits.REVEALED_PATH}EPOCH takes the epoch in decimal, "
                                                  f"not {epoch[:24]!r}"), b""
            return OK, audits.query_revealed(st.audit, int(epoch))
        return OK, audits.query_audit(st.audit, st.validator_powers(), st.nodes)

    def _query_list(self, path: str) -> tuple[Result, bytes]:
        """``/lists/KIND`` and ``/lists/KIND/since/H`` (see :meth:`query`)."""
        kinds = {p: k for k, p in lists.KIND_PATHS.items()}
        base, sep, since_text = path.partition(lists.SINCE)
        kind = kinds.get(base)
        if kind is None or (sep and not (since_text.isdigit() and since_text.isascii() and len(since_text) <= 19)):
            return Result(Code.INVALID_FIELD, f"unknown list path {path[:64]!r}; try /lists/users, /lists/models, "
                                              "or either with /since/HEIGHT"), b""
        cert = self.cert
        held = self._history.get(cert.height) if cert is not None else None
        if cert is None or held is None or (held.users_digest, held.models_digest, held.validators_digest) != \
                (cert.users_digest, cert.models_digest, cert.validators_digest):
            return Result(Code.UNAVAILABLE, "no signed list held yet (the committee signs one per block; "
                                            "retry in a few seconds or ask another verifier)"), b""
        chain = self.committed.chain_id
        if not sep:
            return OK, lists.encode_document(chain, cert.height, held.time_s, kind,
                                             held.users if kind == lists.KIND_USERS else held.models,
                                             held.users_digest, held.models_digest, held.validators, cert.signatures)
        since = int(since_text)
        if since > cert.height:
            return Result(Code.UNAVAILABLE, f"a delta since height {since}, above this verifier's signed lists "
                                            f"(height {cert.height}): it lags; ask another verifier"), b""
        spans = [self._changes.get(h) for h in range(since + 1, cert.height + 1)] \
            if cert.height - since < DELTA_HISTORY else [None]
        if any(c is None for c in spans):
            return Result(Code.UNAVAILABLE, f"this verifier no longer knows every change since height {since} (it "
                                            f"keeps {DELTA_HISTORY} heights, since its start): fetch the full "
                                            "list"), b""
        changed: set[bytes] = set()
        for c in spans:
            assert c is not None
            changed.update(c[kind - 1])
        records = held.records(kind)
        added = sorted(n for n in changed if n in records)
        return OK, lists.encode_delta(chain, cert.height, held.time_s, kind, since,
                                      sorted(n for n in changed if n not in records),
                                      lists.array_header(len(added)) + b"".join(records[n] for n in added),
                                      held.users_digest, held.models_digest, held.validators, cert.signatures)
