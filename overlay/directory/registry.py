"""The signed registry: the lists of user nodes and model nodes (paper §3.1, §3.4).

A registry file is JSON::

    {"registry":   {"version": 7, "issued_unix": 1764000000, "entries": [PeerEntry...]},
     "signatures": [{"key": "<ed25519 hex>", "sig": "<hex>"}, ...]}

Each signature is Ed25519 over ``REGISTRY_CONTEXT || canonical JSON of "registry"``
(sorted keys, no spaces). A client pins the registry keys (the verifier
committee's, later) in its configuration and accepts the list only when
distinct pinned keys holding **more than 2/3** of them signed it — the same
quorum rule the committee uses. Unknown signers are ignored, not trusted.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from overlay.net.peers import MAX_PEERS, PeerEntry, PeerListError, parse_entry, read_json
from overlay.wire import crypto
from overlay.wire.crypto import SigningKey

REGISTRY_CONTEXT = b"gentorrent/registry/v1\x00"


class RegistryError(PeerListError):
    """The registry file is malformed, or not signed by a quorum of pinned keys."""


def canonical(body: dict[str, Any]) -> bytes:
    return REGISTRY_CONTEXT + json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def quorum(n_keys: int) -> int:
    """Smallest number of signatures that is more than 2/3 of ``n_keys``."""
    return (2 * n_keys) // 3 + 1


@dataclass
class Registry:
    version: int
    entries: list[PeerEntry]
    by_id: dict[bytes, PeerEntry] = field(init=False)

    def __post_init__(self) -> None:
        self.by_id = {e.node_id: e for e in self.entries}

    def replace(self, other: Registry) -> None:
        """Take ``other``'s version and entries in place, so everything holding this object (relay
        checks, path selection, the model list) sees a committee list update at once."""
        self.version = other.version
        self.entries[:] = other.entries
        self.by_id = {e.node_id: e for e in self.entries}

    def users(self, region: str | None = None) -> list[PeerEntry]:
        return [e for e in self.entries if e.role == "user" and (region is None or e.region == region)]

    def models(self, model: str | None = None) -> list[PeerEntry]:
        return [e for e in self.entries if e.role == "model" and (model is None or model in e.models)]


def sign(entries: list[PeerEntry], keys: list[SigningKey], version: int, issued_unix: int) -> dict[str, Any]:
    body = {"version": version, "issued_unix": issued_unix, "entries": [e.to_json() for e in entries]}
    msg = canonical(body)
    return {
        "registry": body,
        "signatures": [{"key": k.public_bytes.hex(), "sig": k.sign(msg).hex()} for k in keys],
    }


def save(path: str | os.PathLike[str], doc: dict[str, Any]) -> None:
    p = Path(path)
    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, p)


def parse_keys(text: str) -> list[bytes]:
    """Pinned registry keys from a comma-separated hex list."""
    keys = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            k = bytes.fromhex(part)
        except ValueError:
            raise RegistryError(f"registry key {part[:16]}... is not hex") from None
        if len(k) != 32:
            raise RegistryError("registry keys are 32-byte Ed25519 public keys (64 hex digits)")
        keys.append(k)
    if not keys:
        raise RegistryError("no registry keys pinned: set registry_keys (comma-separated hex)")
    if len(set(keys)) != len(keys):
        raise RegistryError("a registry key is pinned twice")
    return keys


def _signature_pairs(sigs: list[Any], where: str) -> Iterator[tuple[bytes, bytes]]:
    """The file's ``{"key", "sig"}`` objects as byte pairs; :class:`RegistryError` at the first
    malformed one."""
    for i, s in enumerate(sigs):
        if not isinstance(s, dict) or not isinstance(s.get("key"), str) or not isinstance(s.get("sig"), str):
            raise RegistryError(f"{where}: signatures[{i}] malformed")
        try:
            yield bytes.fromhex(s["key"]), bytes.fromhex(s["sig"])
        except ValueError:
            raise RegistryError(f"{where}: signatures[{i}] is not hex") from None


def verify(doc: Any, pinned: list[bytes], where: str = "registry") -> Registry:
    """Check the quorum of signatures, then parse the entries strictly."""
    if not isinstance(doc, dict) or set(doc) != {"registry", "signatures"}:
        raise RegistryError(f"{where}: expected an object with 'registry' and 'signatures'")
    body, sigs = doc["registry"], doc["signatures"]
    if not isinstance(body, dict) or not isinstance(sigs, list) or len(sigs) > 1024:
        raise RegistryError(f"{where}: malformed registry or signatures")
    msg = canonical(body)
    good = crypto.valid_signers(_signature_pairs(sigs, where), set(pinned), msg)
    need = quorum(len(pinned))
    if len(good) < need:
        raise RegistryError(
            f"{where}: signed by {len(good)} of {len(pinned)} pinned registry keys; more than 2/3 "
            f"({need}) are required"
        )
    version, entries = body.get("version"), body.get("entries")
    if type(version) is not int or version < 0 or not isinstance(entries, list) or len(entries) > MAX_PEERS:
        raise RegistryError(f"{where}: bad version or entries")
    parsed = [parse_entry(e, f"{where}.entries[{i}]") for i, e in enumerate(entries)]
    if len({e.node_id for e in parsed}) != len(parsed):
        raise RegistryError(f"{where}: a node is listed twice")
    return Registry(version, parsed)


def load(path: str | os.PathLike[str], pinned: list[bytes]) -> Registry:
    return verify(read_json(path, "registry", RegistryError), pinned, str(path))


def from_config(cfg: Any) -> Registry:
    """The node directory a command should use: the signed registry (``registry`` +
    ``registry_keys``), or for local testing an unsigned ``peers`` list."""
    from overlay.net import peers as peerlist

    if cfg.registry:
        if not cfg.registry_keys:
            raise RegistryError(
                "a registry needs pinned keys: set --registry-keys (or GENTORRENT_REGISTRY_KEYS, or "
                "registry_keys in the config file)"
            )
        return load(cfg.registry, parse_keys(cfg.registry_keys))
    if cfg.peers:
        return Registry(0, peerlist.load(cfg.peers))
    raise RegistryError("no node directory: pass --committee HOST:PORT,... with --committee-genesis FILE (the "
                        "verifier committee), or --registry FILE with --registry-keys (a signed file), or --peers "
                        "FILE (unsigned, local testing only)")
