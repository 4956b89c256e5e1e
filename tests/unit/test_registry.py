"""The signed registry: more than 2/3 of the pinned keys must sign; anything else is refused."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest

from overlay.directory import registry as reg
from overlay.net.peers import PeerEntry
from overlay.wire.crypto import SigningKey
from overlay.wire.identity import Identity


def entries(n=3):
    out = [PeerEntry.of(Identity.generate(), f"127.0.0.1:{7000 + i}") for i in range(n)]
    out.append(PeerEntry.of(Identity.generate(), "127.0.0.1:7100", role="model", models=("m",)))
    return out


@pytest.mark.parametrize("n_keys,need", [(1, 1), (2, 2), (3, 3), (4, 3), (5, 4), (6, 5), (7, 5), (10, 7)])
def test_quorum_is_more_than_two_thirds(n_keys, need):
    assert reg.quorum(n_keys) == need
    assert need > 2 * n_keys / 3 and need - 1 <= 2 * n_keys / 3


@pytest.mark.parametrize("signers,ok", [(4, True), (3, True), (2, False), (0, False)])
def test_signature_quorum(signers, ok):
    keys = [SigningKey.generate() for _ in range(4)]
    doc = reg.sign(entries(), keys[:signers], version=5, issued_unix=1)
    pinned = [k.public_bytes for k in keys]
    if ok:
        r = reg.verify(doc, pinned)
        assert r.version == 5 and len(r.users()) == 3 and len(r.models("m")) == 1
    else:
        with pytest.raises(reg.RegistryError, match="more than 2/3"):
            reg.verify(doc, pinned)


def test_unpinned_and_duplicate_signers_do_not_count():
    keys = [SigningKey.generate() for _ in range(4)]
    outsiders = [SigningKey.generate() for _ in range(5)]
    doc = reg.sign(entries(), keys[:2] + outsiders, 1, 1)
    doc["signatures"] += copy.deepcopy(doc["signatures"][:2])  # the same two again
    with pytest.raises(reg.RegistryError, match="signed by 2 of 4"):
        reg.verify(doc, [k.public_bytes for k in keys])


def test_any_change_to_the_body_breaks_every_signature():
    keys = [SigningKey.generate() for _ in range(4)]
    doc = reg.sign(entries(), keys, 1, 1)
    doc["registry"]["entries"][0]["address"] = "10.9.9.9:1"
    with pytest.raises(reg.RegistryError, match="signed by 0 of 4"):
        reg.verify(doc, [k.public_bytes for k in keys])


def test_signatures_from_wrong_keys_are_ignored():
    keys = [SigningKey.generate() for _ in range(3)]
    doc = reg.sign(entries(), keys, 1, 1)
    for s in doc["signatures"]:
        s["sig"] = "00" * 64
    with pytest.raises(reg.RegistryError):
        reg.verify(doc, [k.public_bytes for k in keys])


@pytest.mark.parametrize("mutate", [
    lambda d: d.pop("signatures"),
    lambda d: d.update(extra=1),
    lambda d: d.update(signatures="nope"),
    lambda d: d["signatures"].append({"key": "zz", "sig": "00"}),
    lambda d: d["registry"].update(version=-1),
    lambda d: d["registry"].update(entries="x"),
])
def test_malformed_documents_are_rejected(mutate):  # a clear RegistryError, never a crash
    keys = [SigningKey.generate()]
    doc = reg.sign(entries(), keys, 1, 1)
    mutate(doc)
    with pytest.raises(reg.RegistryError):
        reg.verify(doc, [k.public_bytes for k in keys])


def test_duplicate_nodes_are_rejected():
    keys = [SigningKey.generate()]
    e = entries()
    doc = reg.sign([*e, e[0]], keys, 1, 1)
    with pytest.raises(reg.RegistryError, match="twice"):
        reg.verify(doc, [keys[0].public_bytes])


def test_load_and_pinned_keys_parsing(tmp_path):
    keys = [SigningKey.generate() for _ in range(4)]
    p = tmp_path / "registry.json"
    reg.save(p, reg.sign(entries(), keys, 2, 1))
    pinned = reg.parse_keys(",".join(k.public_bytes.hex() for k in keys))
    assert reg.load(p, pinned).version == 2
    for bad in ["", "zz", "00" * 31, ",".join([keys[0].public_bytes.hex()] * 2)]:
        with pytest.raises(reg.RegistryError):
            reg.parse_keys(bad)
    p.write_text("{not json")
    with pytest.raises(reg.RegistryError, match="not valid JSON"):
        reg.load(p, pinned)
    with pytest.raises(reg.RegistryError, match="does not exist"):
        reg.load(tmp_path / "missing.json", pinned)


def test_valid_signers_counts_distinct_trusted_keys_with_good_signatures() -> None:
    """``crypto.valid_signers``, the count behind both quorum checks (this file's registry and the
    committee's signed lists): untrusted keys, repeated keys and bad signatures do not count."""
    from overlay.wire import crypto

    a, b, c, stranger = (crypto.SigningKey.generate() for _ in range(4))
    msg = b"the list"
    trusted = {a.public_bytes, b.public_bytes, c.public_bytes}
    pairs = [
        (a.public_bytes, a.sign(msg)),
        (a.public_bytes, a.sign(msg)),  # the same key twice counts once
        (b.public_bytes, b.sign(b"another list")),  # over another message
        (stranger.public_bytes, stranger.sign(msg)),  # not trusted
        (c.public_bytes, b"\x00" * 64),  # not a signature
        (c.public_bytes, c.sign(msg)[:-1]),  # wrong length
        (b"short", b"x"),
    ]
    assert crypto.valid_signers(pairs, trusted, msg) == {a.public_bytes}
    assert crypto.valid_signers([*pairs, (c.public_bytes, c.sign(msg))], trusted, msg) == {a.public_bytes,
                                                                                           c.public_bytes}
    assert crypto.valid_signers([], trusted, msg) == set()

    def malformed_third() -> Iterator[tuple[bytes, bytes]]:
        yield a.public_bytes, a.sign(msg)
        yield b.public_bytes, b.sign(msg)
        raise ValueError("the caller's parse error")

    with pytest.raises(ValueError, match="parse error"):
        crypto.valid_signers(malformed_third(), trusted, msg)
