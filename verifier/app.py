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

The app hash is SHA-256 of :meth:`CommitteeState.canonical_bytes`; it covers the chain id, the
validators, the entries and the sequence numbers, not the height (so empty blocks keep it).
A transaction that breaks a rule never changes state: CheckTx rejects it, PrepareProposal drops
it, ProcessProposal rejects a block that holds one, and FinalizeBlock, should one get that far,
answers its code and skips it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import msgpack

from overlay import crypto
from verifier.tx import (
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

STATE_VERSION = 1
SNAPSHOT_VERSION = 1
# An entry lives this long (block time) after its last register/update. Nodes refresh every
# REFRESH_INTERVAL_S, so two missed refreshes in a row still keep them listed.
ENTRY_TTL_S = 30 * 60
REFRESH_INTERVAL_S = 10 * 60
MAX_VALIDATORS = 1000


class StateError(Exception):
    """Persisted state is corrupt or from another format; the verifier must not start on it."""


@dataclass(frozen=True, slots=True)
class Validator:
    """A CometBFT validator from genesis: key type (``ed25519``), public key, voting power."""

    key_type: str
    public_key: bytes
    power: int


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
    addresses: dict[str, bytes] = field(default_factory=dict)

    def copy(self) -> CommitteeState:
        return CommitteeState(self.chain_id, self.validators, dict(self.nodes), dict(self.seqs), dict(self.addresses))

    def canonical_bytes(self) -> bytes:
        """One encoding per state: the msgpack array ``[STATE_VERSION, chain_id, validators,
        records sorted by node id, [node_id, seq] pairs sorted by node id]`` with bin types."""
        return b"".join((
            _array_header(5),
            pack(STATE_VERSION),
            pack(self.chain_id),
            pack([[v.key_type, v.public_key, v.power] for v in self.validators]),
            _array_header(len(self.nodes)),
            *(self.nodes[n].packed for n in sorted(self.nodes)),
            pack([[n, self.seqs[n]] for n in sorted(self.seqs)]),
        ))

    def app_hash(self) -> bytes:
        return crypto.sha256(self.canonical_bytes())

    @classmethod
    def from_canonical_bytes(cls, raw: bytes) -> CommitteeState:
        """Inverse of :meth:`canonical_bytes`; :class:`StateError` if ``raw`` is not one."""
        try:
            version, chain_id, vals, nodes, seqs = msgpack.unpackb(raw, raw=False, strict_map_key=True)
            if version != STATE_VERSION:
                raise StateError(f"state format {version}, this verifier reads {STATE_VERSION}")
            st = cls(chain_id=chain_id, validators=tuple(Validator(t, bytes(k), p) for t, k, p in vals))
            for node_id, ed, role, x, addr, region, model_id, cap, expires in nodes:
                st.nodes[node_id] = Record(node_id, ed, Entry(role, x, addr, region, model_id, cap), expires)
                st.addresses[addr] = node_id
            st.seqs = {n: s for n, s in seqs}
        except StateError:
            raise
        except Exception as exc:
            raise StateError(f"persisted state does not decode ({type(exc).__name__}: {exc})") from None
        if st.canonical_bytes() != raw:
            raise StateError("persisted state is not in canonical form")
        return st


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

    # ----------------------------------------------------------------- handshake

    def info(self) -> tuple[int, bytes]:
        """(last committed height, its app hash): CometBFT replays the blocks after it."""
        return self.height, self.app_hash

    def init_chain(self, chain_id: str, validators: Iterable[Validator]) -> bytes:
        """Start from genesis; returns the genesis app hash (``b""``: genesis holds no app state)."""
        vals = tuple(sorted(validators, key=lambda v: (v.key_type, v.public_key)))
        if len(vals) > MAX_VALIDATORS:
            raise ValueError(f"{len(vals)} validators in genesis, at most {MAX_VALIDATORS}")
        self.committed = CommitteeState(chain_id=chain_id, validators=vals)
        self.height = 0
        self.app_hash = b""
        self._pending = None
        return b""

    # ----------------------------------------------------------------- mempool

    def decode(self, raw: bytes) -> Tx | Result:
        try:
            return decode_tx(raw, self.committed.chain_id)
        except TxError as exc:
            return Result(exc.code, exc.reason)

    def check_tx(self, raw: bytes) -> Result:
        """May ``raw`` enter the mempool? Checked against the committed state; never changes it."""
        tx = self.decode(raw)
        if isinstance(tx, Tx):
            try:
                _check(self.committed, tx)
            except TxError as exc:
                tx = Result(exc.code, exc.reason)
            else:
                return OK
        self.rejected[tx.code] = self.rejected.get(tx.code, 0) + 1
        return tx

    # ----------------------------------------------------------------- blocks

    def _run(self, txs: Sequence[bytes], time_s: int) -> tuple[CommitteeState, list[Result]]:
        st = _expire(self.committed, time_s)
        copied = st is not self.committed
        results: list[Result] = []
        for raw in txs:
            tx = self.decode(raw)
            if isinstance(tx, Result):
                results.append(tx)
                continue
            try:
                _check(st, tx)
            except TxError as exc:
                results.append(Result(exc.code, exc.reason))
                continue
            if not copied:
                st, copied = st.copy(), True
            _apply(st, tx, time_s)
            results.append(OK)
        return st, results

    def prepare_proposal(self, txs: Sequence[bytes], max_tx_bytes: int, time_s: int) -> list[bytes]:
        """The mempool's ``txs`` this proposer includes: the valid ones, in order, within ``max_tx_bytes``.

        Sizes count as CometBFT counts them: each transaction's protobuf encoding in the block's
        data (one tag byte, its length as a varint, its bytes).
        """
        st = _expire(self.committed, time_s).copy()
        out: list[bytes] = []
        total = 0
        for raw in txs:
            size = _proto_size(raw)
            tx = self.decode(raw) if total + size <= max_tx_bytes else None
            try:
                if not isinstance(tx, Tx):
                    raise TxError(Code.OVERSIZE if tx is None else tx.code, "left out")
                _check(st, tx)
            except TxError:
                self.dropped_from_proposals += 1
                continue
            _apply(st, tx, time_s)
            out.append(raw)
            total += size
        return out

    def process_proposal(self, txs: Sequence[bytes], time_s: int) -> bool:
        """Accept a proposed block only if every transaction in it is valid in order."""
        _, results = self._run(txs, time_s)
        ok = all(r.ok for r in results)
        self.rejected_proposals += not ok
        return ok

    def finalize_block(self, height: int, time_s: int, txs: Sequence[bytes]) -> tuple[list[Result], bytes]:
        """Apply a decided block: one result per tx, and the app hash of the resulting state."""
        if self.height > 0 and height != self.height + 1:  # genesis may set any initial height
            raise ValueError(f"FinalizeBlock for height {height} after committed height {self.height}")
        st, results = self._run(txs, time_s)
        self.skipped_in_blocks += sum(not r.ok for r in results)
        app_hash = st.app_hash()
        self._pending = (height, st, app_hash)
        return results, app_hash

    def commit(self) -> bytes:
        """Make the finalized block's state current; returns the snapshot the driver must persist."""
        if self._pending is None:
            raise ValueError("Commit without a FinalizeBlock before it")
        self.height, self.committed, self.app_hash = self._pending
        self._pending = None
        return self.snapshot()

    # ----------------------------------------------------------------- persistence

    def snapshot(self) -> bytes:
        """The committed state and height, for :meth:`restore`."""
        return pack([SNAPSHOT_VERSION, self.height, self.app_hash, self.committed.canonical_bytes()])

    @classmethod
    def restore(cls, raw: bytes) -> CommitteeApp:
        """An app from :meth:`snapshot`'s bytes; :class:`StateError` if they are corrupt."""
        try:
            version, height, app_hash, state = msgpack.unpackb(raw, raw=False)
        except Exception as exc:
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
        """
        st = self.committed
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
        return Result(Code.INVALID_FIELD, f"unknown query path {path[:64]!r}; try /node, /seq, /nodes or /info"), b""
