"""Admission: what a registration must prove and pay before the committee lists it (decision 0014).

Pure rules and the probe transaction's codec; :mod:`verifier.app` applies them at a block's time.

- **Addresses** are canonical IP literals (:func:`overlay.directory.registration.check_address`). On a
  *public* network an address must be globally routable: loopback, private, link-local, shared,
  reserved, documentation and multicast ranges are refused (ADDRESS_NOT_ALLOWED). A *local* network
  (the genesis says so: devnet, tests) takes any unicast address.
- **Caps**: at most ``per_ip`` listed nodes on one IP and ``per_prefix`` on one network prefix
  (/24 for IPv4, /48 for IPv6) (ADDRESS_CAP, at the register and again when a probed registration
  is listed); 0 is no cap. Registrations awaiting their probe do not count: an unproven claim must
  not use up an owner's cap.
- **Work**: a new key's register carries a proof of work (:mod:`overlay.directory.work`) of at least
  :func:`required_bits`: ``work_bits`` while at most ``free`` registrations paid work in the last
  ``window_s`` seconds of block time, then one more bit for every ``step`` more. A flood thus pays
  exponentially more per key while honest joins at a normal rate pay ``work_bits`` (LOW_WORK).
- **Probes**: with ``probe`` on, a registered address is listed only after validators holding
  more than 2/3 of the voting power dialled it and found the registering key answering there
  (:class:`ProbeTx`, sent by :mod:`verifier.prober`); until then the registration is *pending*,
  for at most :data:`PENDING_TTL_S`.
- **Reservation**: a node that leaves or expires keeps its address (and its seq, so nothing of
  its can be replayed) for :data:`RESERVE_S`; it may register again within that time without new
  work or probe at the same address. After it the seq is pruned: the state holds nothing for keys
  that left long ago.

The genesis ``app_state`` section ``"admission"`` sets the parameters (:meth:`AdmissionParams.from_json`);
``gentorrent verifier genesis`` writes the public defaults, ``--local-network`` the local ones. A
genesis without the section (chains made before decision 0014, unit tests) gets :data:`OPEN`:
local, no work, no caps, no probes; the verifier warns about it at start.
"""

from __future__ import annotations

import functools
import ipaddress
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from overlay.directory import work
from overlay.directory.registration import DECODE_ERRORS, Code, TxError, canonical_ip, pack
from overlay.wire import crypto
from overlay.wire.constants import MAX_CHAIN_ID

PENDING_TTL_S = 300  # a registration not probed within this much block time is dropped
RESERVE_S = 30 * 60  # a node that left keeps its address and seq this long
PREFIX_V4, PREFIX_V6 = 24, 48
MAX_PENDING = 1024  # registrations awaiting their probe, at most (PENDING_FULL beyond)

PROBE_TAG = b"GTPROBE1"
PROBE_CONTEXT = b"gentorrent/committee-probe/v1\x00"
PROBE_VERSION = 1
MAX_PROBE_ENTRIES = 256
MAX_PROBE_TX_BYTES = 16 * 1024


class AdmissionParamsError(ValueError):
    """The genesis ``admission`` section is malformed; says which field."""


@dataclass(frozen=True, slots=True)
class AdmissionParams:
    """The committee's admission rules (module docstring), fixed by its genesis."""

    network: str = "public"  # "public" or "local"
    work_bits: int = 6  # base proof of work (bits); 2**6 trials of 34 ms: about 2 s on one core
    work_n_log2: int = 14  # scrypt n = 2**14: 16 MiB a trial
    free: int = 20  # registrations a window that pay only work_bits
    step: int = 8  # beyond them, one more bit every `step` registrations
    window_s: int = 3600
    per_ip: int = 2
    per_prefix: int = 16
    probe: bool = True

    def __post_init__(self) -> None:
        if self.network not in ("public", "local"):
            raise AdmissionParamsError(f"admission.network {self.network!r} is not 'public' or 'local'")
        if not 0 <= self.work_bits <= 40 or not work.MIN_N_LOG2 <= self.work_n_log2 <= work.MAX_N_LOG2:
            raise AdmissionParamsError(f"admission.work_bits must be 0..40 and work_n_log2 {work.MIN_N_LOG2}.."
                                       f"{work.MAX_N_LOG2}")
        if self.free < 0 or not 1 <= self.step <= 10_000 or not 60 <= self.window_s <= 7 * 86400:
            raise AdmissionParamsError("admission.free must be >= 0, step 1..10000, window_s 60..604800")
        if not 0 <= self.per_ip <= 10_000 or not 0 <= self.per_prefix <= 1_000_000:
            raise AdmissionParamsError("admission.per_ip and per_prefix must be >= 0 (0: no cap)")

    @classmethod
    def local(cls) -> AdmissionParams:
        """A local network (devnet, tests on 127.0.0.0/8): any unicast address, no caps, no work;
        addresses are still probed."""
        return cls(network="local", work_bits=0, per_ip=0, per_prefix=0)

    def to_json(self) -> dict[str, Any]:
        return {"network": self.network, "work_bits": self.work_bits, "work_n_log2": self.work_n_log2,
                "free": self.free, "step": self.step, "window_s": self.window_s, "per_ip": self.per_ip,
                "per_prefix": self.per_prefix, "probe": self.probe}

    @classmethod
    def from_json(cls, doc: Any) -> AdmissionParams:
        if not isinstance(doc, dict) or set(doc) - set(cls().to_json()):
            raise AdmissionParamsError(f"admission must be an object with fields from {sorted(cls().to_json())}")
        for k, v in doc.items():
            want = str if k == "network" else bool if k == "probe" else int
            if type(v) is not want:
                raise AdmissionParamsError(f"admission.{k} must be {want.__name__}")
        return cls(**doc)

    def to_wire(self) -> list[Any]:
        return [self.network, self.work_bits, self.work_n_log2, self.free, self.step, self.window_s, self.per_ip,
                self.per_prefix, self.probe]

    @classmethod
    def from_wire(cls, w: Sequence[Any]) -> AdmissionParams:
        return cls(*w)


OPEN = AdmissionParams(network="local", work_bits=0, per_ip=0, per_prefix=0, probe=False)


def params_from_app_state(app_state: bytes) -> AdmissionParams:
    """The genesis ``app_state``'s ``admission`` section; :data:`OPEN` without one."""
    if not app_state.strip():
        return OPEN
    try:
        doc = json.loads(app_state)
    except ValueError:
        raise AdmissionParamsError("the genesis app_state is not JSON") from None
    if not isinstance(doc, dict) or "admission" not in doc:
        return OPEN
    return AdmissionParams.from_json(doc["admission"])


# --------------------------------------------------------------------------- rules


def host_of(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """The IP of a canonical address (the codec checked it)."""
    host = address.rpartition(":")[0].strip("[]")
    ip = canonical_ip(host)
    if ip is None:
        raise TxError(Code.INVALID_FIELD, f"address {address!r} is not a canonical IP:port")
    return ip


def prefix_of(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    bits = PREFIX_V4 if ip.version == 4 else PREFIX_V6
    return str(ipaddress.ip_network(f"{ip}/{bits}", strict=False))


def check_allowed(params: AdmissionParams, address: str) -> None:
    """ADDRESS_NOT_ALLOWED for an address this network does not list."""
    ip = host_of(address)
    if ip.is_multicast or ip.is_unspecified:
        raise TxError(Code.ADDRESS_NOT_ALLOWED, f"address {address}: multicast or unspecified")
    if params.network == "public" and not ip.is_global:
        raise TxError(Code.ADDRESS_NOT_ALLOWED,
                      f"address {address} is not globally routable (loopback, private, link-local, shared, reserved "
                      "or documentation range); this committee lists public addresses only (its genesis says "
                      "network 'public'): register the address others reach this node at")


def cap_keys(address: str) -> tuple[str, str]:
    """The keys an address counts under for the caps: its IP and its network prefix."""
    ip = host_of(address)
    return f"ip {ip}", f"net {prefix_of(ip)}"


def check_caps(params: AdmissionParams, address: str, held: Mapping[str, int], moving_from: str | None = None) -> None:
    """ADDRESS_CAP when ``held`` (counts by :func:`cap_keys` over the listed nodes) already holds
    ``per_ip`` nodes on this IP or ``per_prefix`` on its prefix, not counting the node's own
    address ``moving_from`` (an update to a new address)."""
    if not params.per_ip and not params.per_prefix:
        return
    ip_key, net_key = cap_keys(address)
    mine = cap_keys(moving_from) if moving_from else ()
    on_ip = held.get(ip_key, 0) - (ip_key in mine)
    on_net = held.get(net_key, 0) - (net_key in mine)
    if params.per_ip and on_ip >= params.per_ip:
        raise TxError(Code.ADDRESS_CAP, f"{ip_key[3:]} already holds {on_ip} nodes, the most this committee "
                                        f"lists on one IP ({params.per_ip})")
    if params.per_prefix and on_net >= params.per_prefix:
        raise TxError(Code.ADDRESS_CAP, f"network {net_key[4:]} already holds {on_net} nodes, the most this "
                                        f"committee lists on one prefix ({params.per_prefix})")


def required_bits(params: AdmissionParams, paid_in_window: int) -> int:
    """The work a new key's register needs when ``paid_in_window`` registrations paid work in the
    last ``window_s`` seconds (0 on a network without work: ``work_bits`` 0)."""
    if params.work_bits == 0:
        return 0
    return min(work.MAX_BITS, params.work_bits + max(0, paid_in_window - params.free) // params.step)


@functools.lru_cache(maxsize=4096)
def work_bits_of(chain_id: str, ed25519_public: bytes, nonce: bytes, n_log2: int) -> int:
    """:func:`overlay.directory.work.bits_of`, remembered: CheckTx, ProcessProposal and FinalizeBlock each
    check a register, and a check costs one scrypt."""
    return work.bits_of(chain_id, ed25519_public, nonce, n_log2)


def check_work(params: AdmissionParams, chain_id: str, ed25519_public: bytes, nonce: bytes,
               paid_in_window: int) -> None:
    need = required_bits(params, paid_in_window)
    if need == 0:
        return
    got = work_bits_of(chain_id, ed25519_public, nonce, params.work_n_log2) if nonce else 0
    if got < need:
        raise TxError(Code.LOW_WORK, f"the registration's proof of work has {got} bits; this committee requires "
                                     f"{need} now ({paid_in_window} registrations paid work in the last "
                                     f"{params.window_s} s; query /admission, solve again and resend)")


# --------------------------------------------------------------------------- probe transactions


@dataclass(frozen=True, slots=True)
class ProbeTx:
    """A validator's report that it dialled these pending registrations (``(node_id, seq)``) at
    their addresses and each answered with its registering key."""

    validator: bytes
    reached: tuple[tuple[bytes, int], ...]


def _probe_signing_bytes(chain_id: str, body: bytes) -> bytes:
    chain = chain_id.encode()
    if not 0 < len(chain) <= MAX_CHAIN_ID:
        raise ValueError("bad chain id")
    return PROBE_CONTEXT + bytes([len(chain)]) + chain + body


def make_probe_tx(key: crypto.SigningKey, chain_id: str, reached: Sequence[tuple[bytes, int]]) -> bytes:
    if not 0 < len(reached) <= MAX_PROBE_ENTRIES:
        raise ValueError(f"a probe transaction reports 1..{MAX_PROBE_ENTRIES} nodes")
    body = pack([PROBE_VERSION, key.public_bytes, [[n, s] for n, s in reached]])
    return PROBE_TAG + pack([body, key.sign(_probe_signing_bytes(chain_id, body))])


def decode_probe_tx(raw: bytes, chain_id: str) -> ProbeTx:
    """Strictly decode and check the signature (not yet that the key is a validator); TxError."""
    if len(raw) > MAX_PROBE_TX_BYTES:
        raise TxError(Code.OVERSIZE, f"probe transaction of {len(raw)} bytes over {MAX_PROBE_TX_BYTES}")
    try:
        outer = msgpack.unpackb(raw[len(PROBE_TAG):], raw=False, strict_map_key=True, max_array_len=2,
                                max_map_len=0, max_ext_len=0)
        body, sig = outer if type(outer) is list and len(outer) == 2 else (None, None)
        fields = msgpack.unpackb(body, raw=False, strict_map_key=True, max_array_len=MAX_PROBE_ENTRIES,
                                 max_map_len=0, max_ext_len=0) if type(body) is bytes else None
    except DECODE_ERRORS as exc:
        raise TxError(Code.MALFORMED, f"probe transaction is not msgpack ({type(exc).__name__})") from None
    if type(sig) is not bytes or type(fields) is not list or len(fields) != 3 or fields[0] != PROBE_VERSION:
        raise TxError(Code.MALFORMED, "probe transaction is not [body, signature] of [1, key, reached]")
    _, key, reached = fields
    if type(key) is not bytes or len(key) != crypto.ED25519_PK_LEN or type(reached) is not list \
            or not 0 < len(reached) <= MAX_PROBE_ENTRIES:
        raise TxError(Code.MALFORMED, "probe transaction: bad key or reached list")
    pairs = []
    for r in reached:
        if type(r) is not list or len(r) != 2 or type(r[0]) is not bytes or len(r[0]) != 20 or type(r[1]) is not int:
            raise TxError(Code.MALFORMED, "probe transaction: an entry is not [node_id, seq]")
        pairs.append((r[0], r[1]))
    if len({n for n, _ in pairs}) != len(pairs) or PROBE_TAG + pack([body, sig]) != raw \
            or pack([PROBE_VERSION, key, [[n, s] for n, s in pairs]]) != body:
        raise TxError(Code.MALFORMED, "probe transaction is not canonical (or names a node twice)")
    try:
        crypto.ed25519_verify(key, sig, _probe_signing_bytes(chain_id, body))
    except crypto.CryptoError:
        raise TxError(Code.BAD_SIGNATURE, "the probe transaction's signature does not verify") from None
    return ProbeTx(key, tuple(pairs))
