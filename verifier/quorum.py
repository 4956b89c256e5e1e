"""Transactions signed by the committee itself: list certificates and committee changes.

Both start with the byte ``0xc1``, which msgpack never uses, so neither can be mistaken for a
registration transaction (a msgpack array, :mod:`overlay.directory.registration`):

- **List certificate** ``0xc1 0x01 || msgpack [height, time, users_digest, models_digest,
  validators_digest, [[ed25519_public, signature], ...]]``: the validators' vote-extension
  signatures over :func:`overlay.directory.lists.signing_message` for the lists as of ``height``, whose
  time is the BFT time of block ``height`` (Unix seconds). Only a
  block proposer puts one in a block (first transaction, from PrepareProposal's
  ``local_last_commit``); CheckTx refuses it from the mempool.
- **Committee change** ``0xc1 0x02 || msgpack [body, [[ed25519_public, signature], ...]]`` with
  ``body = msgpack [CHANGE_VERSION, change_seq, validator_ed25519_public, power]``: power 0 removes
  the validator, a positive power adds it or sets its power. Each approval is a current validator's
  signature over ``CHANGE_CONTEXT || len(chain_id) || chain_id || body``; the change applies when
  approvals from more than 2/3 of the current voting power are present and ``change_seq`` is one
  above the last applied change (so no approval can be replayed).

Decoding is strict (types, sizes, canonical re-encoding); errors are :class:`overlay.directory.registration.TxError`
with code MALFORMED. Stateful checks (whose keys, how much power) live in :mod:`verifier.app`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from overlay.directory.registration import DECODE_ERRORS, Code, TxError, pack
from overlay.wire import crypto
from overlay.wire.constants import MAX_CHAIN_ID

PREFIX = b"\xc1"
CERT_TAG = b"\xc1\x01"
CHANGE_TAG = b"\xc1\x02"
CHANGE_VERSION = 1
CHANGE_CONTEXT = b"gentorrent/committee-change/v1\x00"
MAX_SIGNERS = 1000
MAX_POWER = 1 << 40  # CometBFT caps total power at MaxInt64/8; far below it
MAX_CERT_BYTES = 25 + 3 * 34 + MAX_SIGNERS * 104
MAX_CHANGE_BYTES = 64 + MAX_SIGNERS * 104


@dataclass(frozen=True, slots=True)
class ListCert:
    """Signatures by validators over the lists as of ``height`` and their time (block ``height``'s)."""

    height: int
    time_s: int
    users_digest: bytes
    models_digest: bytes
    validators_digest: bytes
    signatures: tuple[tuple[bytes, bytes], ...]  # (ed25519 public, signature), sorted by key

    def encode(self) -> bytes:
        return CERT_TAG + pack([self.height, self.time_s, self.users_digest, self.models_digest, self.validators_digest,
                                [[k, s] for k, s in self.signatures]])


@dataclass(frozen=True, slots=True)
class Change:
    """A committee change with its approvals."""

    seq: int
    public_key: bytes
    power: int
    approvals: tuple[tuple[bytes, bytes], ...]  # (approver ed25519 public, signature), sorted by key

    @property
    def body(self) -> bytes:
        return change_body(self.seq, self.public_key, self.power)

    def encode(self) -> bytes:
        return CHANGE_TAG + pack([self.body, [[k, s] for k, s in self.approvals]])


def change_body(seq: int, public_key: bytes, power: int) -> bytes:
    return pack([CHANGE_VERSION, seq, public_key, power])


def change_signing_bytes(chain_id: str, body: bytes) -> bytes:
    chain = chain_id.encode()
    if not 0 < len(chain) <= MAX_CHAIN_ID:
        raise ValueError(f"chain id must be 1-{MAX_CHAIN_ID} bytes")
    return CHANGE_CONTEXT + bytes([len(chain)]) + chain + body


def _unpack(raw: bytes, max_array: int) -> Any:
    try:
        return msgpack.unpackb(raw, raw=False, use_list=True, strict_map_key=True, max_bin_len=1024,
                               max_str_len=0, max_array_len=max_array, max_map_len=0, max_ext_len=0)
    except DECODE_ERRORS as exc:
        raise TxError(Code.MALFORMED, f"not strict msgpack ({type(exc).__name__})") from None


def _bad(why: str) -> TxError:
    return TxError(Code.MALFORMED, why)


def _pairs(value: Any, what: str) -> tuple[tuple[bytes, bytes], ...]:
    if type(value) is not list or len(value) > MAX_SIGNERS:
        raise _bad(f"{what}: not a list of at most {MAX_SIGNERS} pairs")
    out = []
    for p in value:
        if type(p) is not list or len(p) != 2 or type(p[0]) is not bytes or len(p[0]) != 32 \
                or type(p[1]) is not bytes or len(p[1]) != 64:
            raise _bad(f"{what}: each is [32-byte key, 64-byte signature]")
        out.append((p[0], p[1]))
    if [k for k, _ in out] != sorted({k for k, _ in out}):
        raise _bad(f"{what}: keys must be distinct and sorted")
    return tuple(out)


def decode_cert(raw: bytes) -> ListCert:
    if not raw.startswith(CERT_TAG) or len(raw) > MAX_CERT_BYTES:
        raise _bad("not a list certificate (or over its size limit)")
    f = _unpack(raw[2:], MAX_SIGNERS)
    if type(f) is not list or len(f) != 6:
        raise _bad("a list certificate is [height, time, users, models, validators digests, signatures]")
    height, time_s, ud, md, vd, sigs = f
    if type(height) is not int or not 0 <= height < 2**63 or type(time_s) is not int or not 0 <= time_s < 2**63:
        raise _bad("certificate height or time out of range")
    for d in (ud, md, vd):
        if type(d) is not bytes or len(d) != 32:
            raise _bad("certificate digests are 32 bytes")
    cert = ListCert(height, time_s, ud, md, vd, _pairs(sigs, "certificate signatures"))
    if cert.encode() != raw:
        raise _bad("list certificate is not in canonical form")
    return cert


def decode_change(raw: bytes) -> Change:
    if not raw.startswith(CHANGE_TAG) or len(raw) > MAX_CHANGE_BYTES:
        raise _bad("not a committee change (or over its size limit)")
    f = _unpack(raw[2:], MAX_SIGNERS)
    if type(f) is not list or len(f) != 2 or type(f[0]) is not bytes:
        raise _bad("a committee change is [body, approvals]")
    body = _unpack(f[0], 4)
    if type(body) is not list or len(body) != 4:
        raise _bad("a change body is [version, seq, validator key, power]")
    version, seq, key, power = body
    if version != CHANGE_VERSION or type(version) is not int:
        raise TxError(Code.UNSUPPORTED_VERSION, f"committee change version {version}; this verifier speaks "
                                                f"{CHANGE_VERSION}")
    if type(seq) is not int or not 1 <= seq < 2**63:
        raise TxError(Code.INVALID_FIELD, "change seq must be 1..2^63-1")
    if type(key) is not bytes or len(key) != 32:
        raise _bad("the validator key is 32 bytes (Ed25519)")
    if type(power) is not int or not 0 <= power <= MAX_POWER:
        raise TxError(Code.INVALID_FIELD, f"power must be 0 (remove) to {MAX_POWER}")
    change = Change(seq, key, power, _pairs(f[1], "approvals"))
    if change.encode() != raw:
        raise _bad("committee change is not in canonical form")
    return change


def approve(key: crypto.SigningKey, chain_id: str, seq: int, public_key: bytes, power: int) -> tuple[bytes, bytes]:
    """A validator's approval of change ``seq`` (set ``public_key``'s power; 0 removes it)."""
    return key.public_bytes, key.sign(change_signing_bytes(chain_id, change_body(seq, public_key, power)))


def make_change(seq: int, public_key: bytes, power: int, approvals: list[tuple[bytes, bytes]]) -> bytes:
    """The committee-change transaction carrying ``approvals`` (the verifier checks them)."""
    if len(public_key) != 32 or not 0 <= power <= MAX_POWER or not 1 <= seq < 2**63:
        raise ValueError("a change names a 32-byte Ed25519 key, a power 0..2^40 and a seq >= 1")
    return Change(seq, public_key, power, tuple(sorted(dict(approvals).items()))).encode()


def parse_approval(text: str) -> tuple[bytes, bytes]:
    """``PUBKEY_HEX:SIGNATURE_HEX`` as ``gentorrent verifier approve`` prints it."""
    key, _, sig = text.strip().partition(":")
    try:
        out = bytes.fromhex(key), bytes.fromhex(sig)
    except ValueError:
        raise ValueError(f"approval {text[:20]!r}... is not PUBKEY_HEX:SIGNATURE_HEX") from None
    if len(out[0]) != 32 or len(out[1]) != 64:
        raise ValueError("an approval is a 32-byte key and a 64-byte signature, in hex")
    return out
