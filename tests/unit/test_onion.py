"""Onion layer properties (overlay.anon.onion): each hop opens only its own layer; tampering fails."""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from overlay.anon import onion, paths
from overlay.wire import crypto


def make_path():
    hops = [crypto.X25519Key.generate() for _ in range(onion.HOPS)]
    ids = [os.urandom(20) for _ in range(onion.HOPS)]
    pkt, keys = onion.build_onion([h.public_bytes for h in hops], ids, 2_000_000_000)
    return hops, ids, pkt, keys


def peel_all(hops, pkt):
    out = []
    for h in hops:
        r = onion.peel_onion(h, pkt)
        out.append(r)
        pkt = r.next_onion
    return out


def test_each_hop_learns_only_its_successor_and_keys():
    hops, ids, pkt, keys = make_path()
    routes = peel_all(hops, pkt)
    for i, r in enumerate(routes):
        assert r.keys == keys[i]
        assert r.expires == 2_000_000_000
        if i < onion.HOPS - 1:
            assert not r.is_proxy and r.next_node == ids[i + 1]
        else:
            assert r.is_proxy and r.next_node == bytes(20)
        assert len(r.next_onion) == onion.ONION_LEN  # constant size at every position


def test_a_hop_cannot_open_another_hops_layer():
    hops, _ids, pkt, _keys = make_path()
    with pytest.raises(onion.OnionError) as e:
        onion.peel_onion(hops[1], pkt)  # hop 1's key on hop 0's layer
    assert e.value.reason == "bad-mac"
    r0 = onion.peel_onion(hops[0], pkt)
    for wrong in (hops[0], hops[2]):
        with pytest.raises(onion.OnionError):
            onion.peel_onion(wrong, r0.next_onion)


@settings(max_examples=60, deadline=None)
@given(pos=st.integers(min_value=0, max_value=onion.ONION_LEN - 1), bit=st.integers(min_value=0, max_value=7))
def test_any_modified_bit_is_rejected(pos, bit):
    hops, _ids, pkt, _keys = make_path()
    bad = bytearray(pkt)
    bad[pos] ^= 1 << bit
    with pytest.raises(onion.OnionError):
        peel_all(hops, bytes(bad))


@pytest.mark.parametrize("size", [0, 1, onion.ONION_LEN - 1, onion.ONION_LEN + 1, 4096])
def test_wrong_size_is_rejected(size):
    with pytest.raises(onion.OnionError) as e:
        onion.peel_onion(crypto.X25519Key.generate(), bytes(size))
    assert e.value.reason == "bad-size"


def test_positions_are_indistinguishable_by_length_and_layers_differ():
    hops, _ids, pkt, _keys = make_path()
    seen = [pkt]
    for r in peel_all(hops, pkt)[:-1]:
        seen.append(r.next_onion)
    assert {len(x) for x in seen} == {onion.ONION_LEN}
    assert len(set(seen)) == len(seen)


@settings(max_examples=30, deadline=None)
@given(payload=st.binary(max_size=3000))
def test_cells_roundtrip_and_change_on_every_link(payload):
    hops, _ids, pkt, keys = make_path()
    routes = peel_all(hops, pkt)
    user = onion.PathCrypt(keys)
    iv, body = user.wrap_forward(payload)
    seen = [(iv, body)]
    for r in routes[:-1]:
        iv, body = onion.HopCrypt(r.keys).relay_forward(iv, body)
        seen.append((iv, body))
    proxy_end = onion.ProxyCrypt(routes[-1].keys)
    assert proxy_end.open_forward(iv, body) == payload
    assert len({s[0] for s in seen}) == len(seen)  # the iv differs on every link
    if len(payload) >= 16:
        assert len({s[1] for s in seen}) == len(seen)  # so does the body
    iv, body = proxy_end.seal_backward(payload)
    for r in reversed(routes[:-1]):
        iv, body = onion.HopCrypt(r.keys).relay_backward(iv, body)
    assert user.unwrap_backward(iv, body) == payload


def test_tampered_cells_fail_at_the_end():
    hops, _ids, pkt, keys = make_path()
    routes = peel_all(hops, pkt)
    user = onion.PathCrypt(keys)
    iv, body = user.wrap_forward(b"x" * 100)
    body = bytes([body[0] ^ 1]) + body[1:]
    for r in routes[:-1]:
        iv, body = onion.HopCrypt(r.keys).relay_forward(iv, body)
    with pytest.raises(onion.OnionError):
        onion.ProxyCrypt(routes[-1].keys).open_forward(iv, body)
    iv, body = onion.ProxyCrypt(routes[-1].keys).seal_backward(b"reply")
    with pytest.raises(onion.OnionError):
        user.unwrap_backward(iv, body[:-1] + bytes([body[-1] ^ 1]))


def test_each_hop_reads_its_own_expiry() -> None:
    """Per-hop expiries (issue 15, item 1): hop i reads expires[i], not a common value."""
    hops = [crypto.X25519Key.generate() for _ in range(onion.HOPS)]
    ids = [os.urandom(20) for _ in hops]
    wanted = [2_000_000_011, 2_000_000_522, 2_000_000_003]
    pkt, _ = onion.build_onion([h.public_bytes for h in hops], ids, wanted)
    seen = []
    for h in hops:
        r = onion.peel_onion(h, pkt)
        seen.append(r.expires)
        pkt = r.next_onion
    assert seen == wanted
    with pytest.raises(ValueError):
        onion.build_onion([h.public_bytes for h in hops], ids, wanted[:2])


def test_hop_expiries_are_independent_draws_within_the_ttl_window() -> None:
    rng = random.Random(7)
    draws = [paths.hop_expiries(1_800_000_000.5, 3600, 1200, rng) for _ in range(200)]
    flat = [e for d in draws for e in d]
    assert all(1_800_003_600 <= e < 1_800_004_800 for e in flat)
    assert sum(len(set(d)) == onion.HOPS for d in draws) > 190  # hops of one path differ
    assert len(set(flat)) > 400  # 600 draws spread over the window (≈ 472 distinct expected)
    with pytest.raises(ValueError):
        paths.hop_expiries(0, 7000, 1200, rng)  # beyond MAX_ONION_TTL: relays would refuse
