"""Peer list files: who is in the network, where, with which keys.

For now a JSON file that ``gentorrent devnet`` generates; the signed registry
(overlay issue) and later the verifier committee replace its source, not its
shape. Loading is strict: every id must match its Ed25519 key.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from overlay.net.transport import parse_address
from overlay.wire.constants import ROLE_NAMES, TRUST_LINE
from overlay.wire.identity import Identity, node_id_of

MAX_PEERS = 100_000
MAX_FILE = 64 * 1024 * 1024


class PeerListError(Exception):
    """The peer list file is missing, malformed or inconsistent."""


@dataclass(frozen=True, slots=True)
class PeerEntry:
    node_id: bytes
    address: str
    ed25519_public: bytes
    x25519_public: bytes
    region: str = "default"
    role: str = "user"  # "user" | "model"
    models: tuple[str, ...] = ()  # model nodes: the model ids they serve
    # model nodes on a committee's list: the committee's reputation of the node (fixed point,
    # REPUTATION_SCALE = 1.0; verifier/audit/reputation.py); None where no committee vouches (peer files)
    reputation: int | None = None
    # model nodes on a committee's list: whether the committee's verifiers audit the node's model
    # (decision 0013); None where no committee vouches (peer files, registry files): unknown
    audited: bool | None = None

    @property
    def trusted(self) -> bool:
        """Not under the committee's trust line (:data:`TRUST_LINE`); True where no committee
        vouches (``reputation`` None)."""
        return self.reputation is None or self.reputation >= TRUST_LINE

    @classmethod
    def of(cls, identity: Identity, address: str, region: str = "default", role: str = "user",
           models: tuple[str, ...] = ()) -> PeerEntry:
        return cls(identity.node_id, address, identity.ed25519_public, identity.x25519_public, region, role,
                   models)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "id": self.node_id.hex(),
            "address": self.address,
            "ed25519": self.ed25519_public.hex(),
            "x25519": self.x25519_public.hex(),
            "region": self.region,
            "role": self.role,
        }
        if self.models:
            out["models"] = list(self.models)
        return out


def usable(entry: PeerEntry, allow_unaudited: bool = False) -> bool:
    """Whether a user may send prompts to model node ``entry``: it is trusted
    (:attr:`PeerEntry.trusted`; never waived) and its model is audited, unless ``allow_unaudited``
    (``--allow-unaudited``). An entry no committee vouches for (``audited`` None: a peer or
    registry file, local testing) counts as audited."""
    return entry.trusted and (allow_unaudited or entry.audited is not False)


def _hex(v: object, n: int, what: str) -> bytes:
    if not isinstance(v, str):
        raise PeerListError(f"{what} must be a hex string")
    try:
        b = bytes.fromhex(v)
    except ValueError:
        raise PeerListError(f"{what} is not hex") from None
    if len(b) != n:
        raise PeerListError(f"{what} must be {n} bytes, got {len(b)}")
    return b


def parse_entry(obj: object, where: str) -> PeerEntry:
    if not isinstance(obj, dict):
        raise PeerListError(f"{where}: expected an object")
    unknown = set(obj) - {"id", "address", "ed25519", "x25519", "region", "role", "models"}
    if unknown:
        raise PeerListError(f"{where}: unknown keys {sorted(unknown)}")
    ed = _hex(obj.get("ed25519"), 32, f"{where}.ed25519")
    nid = _hex(obj.get("id"), 20, f"{where}.id")
    if node_id_of(ed) != nid:
        raise PeerListError(f"{where}: id {nid.hex()[:8]} does not match its ed25519 key")
    addr = obj.get("address")
    if not isinstance(addr, str):
        raise PeerListError(f"{where}.address must be a string")
    try:
        parse_address(addr)
    except ValueError as exc:
        raise PeerListError(f"{where}.address: {exc}") from None
    region = obj.get("region", "default")
    role = obj.get("role", "user")
    if not isinstance(region, str) or not 0 < len(region) <= 64:
        raise PeerListError(f"{where}.region must be a short string")
    if role not in ROLE_NAMES.values():
        raise PeerListError(f"{where}.role must be 'user' or 'model'")
    models = obj.get("models", [])
    if (not isinstance(models, list) or len(models) > 16
            or not all(isinstance(m, str) and 0 < len(m) <= 128 for m in models)):
        raise PeerListError(f"{where}.models must be a list of at most 16 short strings")
    if models and role != "model":
        raise PeerListError(f"{where}: only model nodes list models")
    return PeerEntry(nid, addr, ed, _hex(obj.get("x25519"), 32, f"{where}.x25519"), region, role,
                     tuple(models))


def read_json(path: str | os.PathLike[str], what: str, error: type[PeerListError] = PeerListError) -> object:
    """Parse a JSON file of at most :data:`MAX_FILE` bytes; ``error`` says what went wrong."""
    p = Path(path)
    try:
        if p.stat().st_size > MAX_FILE:
            raise error(f"{what} {p} is larger than {MAX_FILE} bytes")
        return json.loads(p.read_text())
    except FileNotFoundError:
        raise error(f"{what} {p} does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise error(f"{what} {p} is not valid JSON: {exc}") from None


def load(path: str | os.PathLike[str]) -> list[PeerEntry]:
    p = Path(path)
    doc = read_json(p, "peer list")
    if not isinstance(doc, dict) or not isinstance(doc.get("peers"), list):
        raise PeerListError(f"peer list {p} must be an object with a 'peers' array")
    if len(doc["peers"]) > MAX_PEERS:
        raise PeerListError(f"peer list {p} has more than {MAX_PEERS} peers")
    entries = [parse_entry(e, f"peers[{i}]") for i, e in enumerate(doc["peers"])]
    if len({e.node_id for e in entries}) != len(entries):
        raise PeerListError(f"peer list {p} lists a node twice")
    return entries


def save(path: str | os.PathLike[str], entries: list[PeerEntry]) -> None:
    p = Path(path)
    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text(json.dumps({"peers": [e.to_json() for e in entries]}, indent=1))
    os.replace(tmp, p)
