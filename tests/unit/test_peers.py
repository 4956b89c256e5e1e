"""Peer list files: strict loading, ids checked against keys."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from overlay.net import peers
from overlay.net.peers import PeerEntry, PeerListError
from overlay.wire.identity import Identity


def entry(i: int = 0, **kw: Any) -> PeerEntry:
    return PeerEntry.of(Identity.generate(), f"127.0.0.1:{7000 + i}", **kw)


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    entries = [entry(0), entry(1, region="eu", role="model"), entry(2)]
    peers.save(tmp_path / "peers.json", entries)
    assert peers.load(tmp_path / "peers.json") == entries
    assert not (tmp_path / "peers.json.tmp").exists()


def write(tmp_path: Path, doc: Any) -> Path:
    p = tmp_path / "peers.json"
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return p


def good() -> dict[str, object]:
    return entry().to_json()


def test_id_must_match_key(tmp_path: Path) -> None:
    row = good()
    row["id"] = Identity.generate().node_id.hex()
    with pytest.raises(PeerListError, match=r"peers\[0\]: id .* does not match its ed25519 key"):
        peers.load(write(tmp_path, {"peers": [row]}))


@pytest.mark.parametrize(("mutate", "match"), [
    (lambda r: r.update(address="nowhere"), "address"),
    (lambda r: r.update(address="127.0.0.1:99999"), "out of range"),
    (lambda r: r.update(address=7000), "address must be a string"),
    (lambda r: r.update(ed25519="zz"), "not hex"),
    (lambda r: r.update(x25519="00"), "x25519 must be 32 bytes"),
    (lambda r: r.update(ed25519=5), "hex string"),
    (lambda r: r.update(role="admin"), "role"),
    (lambda r: r.update(region=""), "region"),
    (lambda r: r.update(extra=1), "unknown keys"),
    (lambda r: r.pop("id"), "id must be a hex string"),
])
def test_bad_rows_are_refused(tmp_path: Path, mutate: Any, match: str) -> None:
    row = good()
    mutate(row)
    with pytest.raises(PeerListError, match=match):
        peers.load(write(tmp_path, {"peers": [row]}))


@pytest.mark.parametrize(("doc", "match"), [
    ("{not json", "not valid JSON"),
    ([], "'peers' array"),
    ({"peers": {}}, "'peers' array"),
    ({"peers": [1]}, "expected an object"),
])
def test_bad_documents_are_refused(tmp_path: Path, doc: Any, match: str) -> None:
    with pytest.raises(PeerListError, match=match):
        peers.load(write(tmp_path, doc))


def test_duplicates_are_refused(tmp_path: Path) -> None:
    row = good()
    with pytest.raises(PeerListError, match="twice"):
        peers.load(write(tmp_path, {"peers": [row, row]}))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(PeerListError, match="does not exist"):
        peers.load(tmp_path / "absent.json")


def test_ipv6_address_is_accepted(tmp_path: Path) -> None:
    e = PeerEntry.of(Identity.generate(), "[::1]:7000")
    peers.save(tmp_path / "p.json", [e])
    assert peers.load(tmp_path / "p.json") == [e]
