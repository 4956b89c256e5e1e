"""The committee's application core: a deterministic, I/O-free state machine (DESIGN.md "Verifier committee").

CometBFT orders transactions; this core states the rules. It holds the registered user and model
nodes and every node's last sequence number, takes ABCI's calls as plain method calls with plain
values, and returns plain values: :mod:`verifier.abci_app` translates protobuf and persists.

Determinism: every verifier that applies the same blocks holds byte-identical state. The only time
the core knows is the block time from the header CometBFT hands to ``prepare_proposal``,
``process_proposal`` and ``finalize_block`` (BFT time: the same on every validator), in whole
seconds; it never reads a clock.

Rules (codes in :class:`verifier.tx.Code`):

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
from dataclasses import dataclass, field

import msgpack

from overlay import committee as lists
from overlay import crypto
from overlay.registration import ENTRY_TTL_S, REFRESH_INTERVAL_S  # noqa: F401 - REFRESH_INTERVAL_S re-exported
from verifier import quorum
from verifier.audit import chain as audits
from verifier.audit import tx as audit_tx
from verifier.audit.reputation import R0
from verifier.quorum import Change, ListCert
from verifier.tx import (
    DECODE_ERRORS,
    OP_LEAVE,
    OP_REGISTER,
    ROLE_MODEL,
    ROLE_NAMES,
    ROLE_USER,
    Code,
    Entry,
    Tx,
    TxError,
    decode_tx,
    pack,
)

STATE_VERSION = 4  # 3: the audit state (verifier/audit/chain.py); 4: its decision 0013 form
SNAPSHOT_VERSION = 1
# An entry lives ENTRY_TTL_S (block time) after its last register/update; nodes refresh every
# REFRESH_INTERVAL_S (both defined with the codec, in overlay/registration.py).
MAX_VALIDATORS = 1000
DECODE_MEMO = 50_000  # decoded transactions remembered (about 20 MB at most)
LIST_HISTORY = 8  # heights whose lists a verifier keeps to serve under a certificate


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

    def copy(self) -> CommitteeState:
        return CommitteeState(self.chain_id, self.validators, dict(self.nodes), dict(self.seqs), self.change_seq,
                              dict(self.addresses), self.audit)

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
        records sorted by node id, [node_id, seq] pairs sorted by node id, change_seq, audit]`` with
        bin types; ``audit`` is nil (audits off) or :meth:`verifier.audit.AuditState.to_wire`."""
        return b"".join((
            _array_header(7),
            pack(STATE_VERSION),
            pack(self.chain_id),
            pack([[v.key_type, v.public_key, v.power] for v in self.validators]),
            _array_header(len(self.nodes)),
            *(self.nodes[n].packed for n in sorted(self.nodes)),
            pack([[n, self.seqs[n]] for n in sorted(self.seqs)]),
            pack(self.change_seq),
            _audit_bytes(self.audit),
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
            _, chain_id, vals, nodes, seqs, change_seq, audit = fields
            st = cls(chain_id=chain_id, validators=tuple(Validator(t, bytes(k), p) for t, k, p in vals),
                     change_seq=change_seq, audit=None if audit is None else audits.AuditState.from_wire(audit))
            for node_id, ed, role, x, addr, region, model_id, cap, expires in nodes:
                st.nodes[node_id] = Record(node_id, ed, Entry(role, x, addr, region, model_id, cap), expires)
                st.addresses[addr] = node_id
            st.seqs = {n: s for n, s in seqs}
        except StateError:
            raise
        except (*DECODE_ERRORS, KeyError, audits.AuditParamsError) as exc:
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
    if tx.op == OP_REGISTER and current is not None:
        raise TxError(Code.CONFLICT, f"node {node_id.hex()[:8]} is already registered; send an update")
    if tx.op != OP_REGISTER and current is None:
        raise TxError(Code.UNKNOWN_NODE, f"node {node_id.hex()[:8]} is not registered (or expired); register it")
    if tx.entry is not None:
        if current is not None and current.entry.role != tx.entry.role:
            raise TxError(Code.CONFLICT, f"an update cannot change the role from {ROLE_NAMES[current.entry.role]} "
                                         f"to {ROLE_NAMES[tx.entry.role]}; leave and register with a new key")
        holder = st.addresses.get(tx.entry.address)
        if holder is not None and holder != node_id:
            raise TxError(Code.CONFLICT, f"address {tx.entry.address} is held by node {holder.hex()[:8]}")


def _apply(st: CommitteeState, tx: Tx, time_s: int) -> None:
    """Apply a checked ``tx`` to ``st`` in place."""
    node_id = tx.node_id
    st.seqs[node_id] = tx.seq
    old = st.nodes.pop(node_id, None)
    if old is not None:
        del st.addresses[old.entry.address]
    if tx.op != OP_LEAVE:
        assert tx.entry is not None
        st.nodes[node_id] = Record(node_id, tx.ed25519_public, tx.entry, time_s + ENTRY_TTL_S)
        st.addresses[tx.entry.address] = node_id


def _proto_size(raw: bytes) -> int:
    """Bytes ``raw`` takes as a ``repeated bytes`` field in a block (tag, varint length, data)."""
    n = len(raw)
    length = 1
    while n >= 0x80:
        n >>= 7
        length += 1
    return 1 + length + len(raw)


def _expire(st: CommitteeState, time_s: int) -> CommitteeState:
    """``st`` without the entries expired at ``time_s`` (a copy if any expire, else ``st`` itself)."""
    gone = [n for n, r in st.nodes.items() if r.expires_at <= time_s]
    if not gone:
        return st
    out = st.copy()
    for n in gone:
        rec = out.nodes.pop(n)
        del out.addresses[rec.entry.address]
    return out


@dataclass(frozen=True, slots=True)
class ListsAt:
    """The lists of one committed state as the committee signs and serves them (overlay/committee.py)."""

    users: bytes
    models: bytes
    users_digest: bytes
    models_digest: bytes
    validators: tuple[lists.ValidatorKey, ...]
    validators_digest: bytes

    @classmethod
    def of(cls, st: CommitteeState) -> ListsAt:
        users: list[bytes] = []
        models: list[bytes] = []
        nodes = st.nodes
        table = st.audit.reputation.nodes if st.audit is not None else {}
        audited = audits.audited_models(st.audit, st.validator_powers())  # empty when audits are off
        flags = {True: pack(True), False: pack(False)}
        for n in sorted(nodes):
            rec = nodes[n]
            if rec.entry.role == ROLE_USER:
                users.append(rec.packed)
                continue
            got = table.get(n)
            value = R0 if got is None else got.value
            # Every model node is listed, untrusted ones too (value < TRUST_LINE): audits must reach
            # them and clients leave them out (decision 0013). The record's 9-field array with a 10th
            # and an 11th field, the reputation and whether its model is audited: fixarray 9 -> 11.
            models.append(b"\x9b" + rec.packed[1:] + pack(value) + flags[rec.entry.model_id in audited])
        ub = _array_header(len(users)) + b"".join(users)
        mb = _array_header(len(models)) + b"".join(models)
        vals = st.validator_keys()
        return cls(ub, mb, crypto.sha256(ub), crypto.sha256(mb), vals, lists.validators_digest(vals))

    def message(self, chain_id: str, height: int) -> bytes:
        return lists.signing_message(chain_id, height, self.users_digest, self.models_digest, self.validators_digest)


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
    message = lists.signing_message(st.chain_id, cert.height, cert.users_digest, cert.models_digest,
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
        # Signed lists: the latest certificate (from blocks; not in the app hash: it authenticates
        # itself) and the lists of the last LIST_HISTORY committed heights, to serve under it.
        self.cert: ListCert | None = None
        self._pending_cert: ListCert | None = None
        self._pending_lists: ListsAt | None = None
        self.updates: list[Validator] = []  # validator updates of the last finalize_block
        self._history: dict[int, ListsAt] = {}
        self._history_state: CommitteeState | None = None
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
                                        audit=None if params is None else audits.initial(params, chain_id))
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

    def _remember(self, computed: ListsAt | None = None) -> None:
        prev = self._history.get(self.height - 1)
        st = self.committed
        same = prev is not None and self._history_state is st
        self._history[self.height] = prev if same and prev is not None else computed or ListsAt.of(st)
        self._history_state = st
        for h in [h for h in self._history if h <= self.height - LIST_HISTORY]:
            del self._history[h]

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
            self._proposed[block_hash] = (height, self.committed, block, ListsAt.of(block.state))
        return block

    def _lists_after(self, height: int, block_hash: bytes, txs: Sequence[bytes], time_s: int) -> ListsAt:
        """The lists as of the end of proposed block ``height`` (``block_hash``), computed once per block."""
        block = self._run_block(height, block_hash, txs, time_s)
        got = self._proposed.get(block_hash)
        return got[3] if got is not None and got[2] is block else ListsAt.of(block.state)

    def extend_vote(self, height: int, key: crypto.SigningKey, block_hash: bytes, txs: Sequence[bytes],
                    time_s: int) -> bytes:
        """This validator's vote extension for block ``height``: its signature over the lists as they
        stand after that block (the state its commit will hold)."""
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
        cert = ListCert(signed, held.users_digest, held.models_digest, held.validators_digest,
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
        self._remember(self._pending_lists)
        self._pending_lists = None
        for h in [h for h, got in self._proposed.items() if got[0] <= self.height]:
            del self._proposed[h]
        return self.snapshot()

    # ----------------------------------------------------------------- persistence

    def snapshot(self) -> bytes:
        """The committed state and height, for :meth:`restore`."""
        return pack([SNAPSHOT_VERSION, self.height, self.app_hash, self._canonical(self.committed)])

    @classmethod
    def restore(cls, raw: bytes) -> CommitteeApp:
        """An app from :meth:`snapshot`'s bytes; :class:`StateError` if they are corrupt."""
        try:
            version, height, app_hash, state = msgpack.unpackb(raw, raw=False)
        except DECODE_ERRORS as exc:
            raise StateError(f"state snapshot does not decode ({type(exc).__name__})") from None
        if version != SNAPSHOT_VERSION:
            raise StateError(f"state snapshot format {version}, this verifier reads {SNAPSHOT_VERSION}")
        if type(height) is not int or height < 0 or type(state) is not bytes:
            raise StateError("state snapshot has a bad height or state field")
        app = cls(CommitteeState.from_canonical_bytes(state), height)
        if app.app_hash != app_hash:
            raise StateError(f"state snapshot at height {height} does not match its recorded app hash")
        return app

    # ----------------------------------------------------------------- query

    def query(self, path: str, data: bytes) -> tuple[Result, bytes]:
        """Read the committed state. Paths:

        - ``/node`` (data: 20-byte node id): the record ``[node_id, ed25519, role, x25519, address,
          region, model_id, capacity, expires_at]``, or UNKNOWN_NODE.
        - ``/seq`` (data: node id): the node's last committed seq (0 if none); sign the next with seq + 1.
        - ``/nodes`` (data: ``b"user"``, ``b"model"`` or empty for both): a list of records by node id.
        - ``/info``: ``[height, app_hash, chain_id, users, models]``.
        - ``/lists/users``, ``/lists/models``: the list as of the latest certificate with its
          signatures (the format of :mod:`overlay.committee`), or UNAVAILABLE before one.
        - ``/validators``: ``[change_seq, [[ed25519_public, power], ...]]``.
        - ``/audit``: the audit's state as a msgpack map (:func:`verifier.audit.chain.query_audit`;
          docs/committee.md "Audits"): who committed and reported, never what a plan holds;
          ``/reputation``: ``[[node_id, value, [window flags], epochs], ...]`` by node id. Both
          answer AUDITS_OFF on a chain without audits.
        """
        st = self.committed
        if path in ("/audit", "/reputation"):
            return self._query_audit(path)
        if path in ("/lists/users", "/lists/models"):
            return self._query_list(lists.KIND_USERS if path == "/lists/users" else lists.KIND_MODELS)
        if path == "/validators":
            return OK, pack([st.change_seq, lists.validators_wire(st.validator_keys())])
        if path == "/node":
            rec = st.nodes.get(data)
            if rec is None:
                return Result(Code.UNKNOWN_NODE, f"no node {data.hex()[:40]} is registered"), b""
            return OK, rec.packed
        if path == "/seq":
            return OK, pack(st.seqs.get(data, 0))
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
                             "/lists/users, /lists/models, /validators, /audit or /reputation"), b""

    def _query_audit(self, path: str) -> tuple[Result, bytes]:
        st = self.committed
        if st.audit is None:
            return Result(Code.AUDITS_OFF, "this committee's genesis has no audit section"), b""
        if path == "/reputation":
            return OK, audits.query_reputation(st.audit)
        return OK, audits.query_audit(st.audit, st.validator_powers(), st.nodes)

    def _query_list(self, kind: int) -> tuple[Result, bytes]:
        cert = self.cert
        held = self._history.get(cert.height) if cert is not None else None
        if cert is None or held is None or (held.users_digest, held.models_digest, held.validators_digest) != \
                (cert.users_digest, cert.models_digest, cert.validators_digest):
            return Result(Code.UNAVAILABLE, "no signed list held yet (the committee signs one per block; "
                                            "retry in a few seconds or ask another verifier)"), b""
        return OK, lists.encode_document(self.committed.chain_id, cert.height, kind,
                                         held.users if kind == lists.KIND_USERS else held.models,
                                         held.users_digest, held.models_digest, held.validators, cert.signatures)
