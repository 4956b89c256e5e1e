"""RelayCore holds a Create from a peer its list does not hold yet (issue 28 item 9): up to
``hold_s``, bounded in all and per peer, re-fed when the list changes (accepted if it now holds
the peer) or when due (refused ``not-registered`` as without holding); re-feeding takes no second
rate-limit token and goes through the onion replay cache like any Create."""

from __future__ import annotations

import os

from overlay.anon import onion
from overlay.anon.actions import Send
from overlay.anon.relay import HOLD_S, RelayCore, RelayLimits
from overlay.wire import crypto
from overlay.wire.messages import Create, Destroy

UNIX = 1_800_000_000.0
USER = b"U" * 20


class Hops:
    """A relay core ``me`` (admits only ``listed``) and two next hops it knows."""

    def __init__(self, limits: RelayLimits | None = None) -> None:
        self.keys = [crypto.X25519Key.generate() for _ in range(3)]
        self.ids = [os.urandom(20) for _ in range(3)]
        self.listed: set[bytes] = set(self.ids)
        self.core = RelayCore(self.ids[0], self.keys[0], knows=set(self.ids).__contains__,
                              admits=self.listed.__contains__, limits=limits or RelayLimits())

    def onion(self) -> bytes:
        pkt, _ = onion.build_onion([k.public_bytes for k in self.keys], self.ids, int(UNIX) + 600)
        return pkt

    def create(self, pkt: bytes | None = None) -> Create:
        return Create(os.urandom(16), pkt if pkt is not None else self.onion())

    def send(self, peer: bytes, msg: object, now: float = 0.0) -> list[Send]:
        return self.core.on_message(peer, msg, now=now, unix=UNIX + now)


def _refusals(out: list[Send]) -> list[bytes]:
    return [s.msg.link_id for s in out if isinstance(s.msg, Destroy) and s.msg.reason == "not-registered"]


def test_a_create_from_an_unlisted_peer_is_held_then_accepted_once_the_list_holds_it():
    h = Hops()
    c = h.create()
    assert h.send(USER, c) == [] and h.core.held == 1 and h.core.holds["held"] == 1
    assert h.core.next_hold_deadline() == HOLD_S
    assert h.core.release_held(1.0, UNIX + 1) == [] and h.core.held == 1  # still unlisted, not due
    h.listed.add(USER)  # the relay's next list holds the user
    out = h.core.release_held(1.5, UNIX + 1.5)
    assert [(s.peer, type(s.msg)) for s in out] == [(h.ids[1], Create)] and len(h.core) == 1
    assert h.core.held == 0 and h.core.holds["admitted"] == 1 and h.core.next_hold_deadline() is None
    assert not h.core.dropped  # accepted: not dropped as a replay, nor refused


def test_a_held_create_is_refused_when_due_if_the_peer_is_still_unlisted():
    h = Hops()
    c = h.create()
    h.send(USER, c, now=10.0)
    assert h.core.release_held(10.0 + HOLD_S - 0.01, UNIX) == []
    out = h.core.release_held(10.0 + HOLD_S, UNIX + HOLD_S)
    assert [(s.peer, s.msg) for s in out] == [(USER, Destroy(c.link_id, "not-registered"))]
    assert h.core.dropped["not-registered"] == 1 and h.core.holds["refused"] == 1 and h.core.held == 0
    assert h.core.release_held(100.0, UNIX + 100) == []  # released once only


def test_holding_is_bounded_per_peer_and_in_all_and_over_the_bound_refuses_at_once():
    h = Hops(RelayLimits(max_held=5, max_held_per_peer=2))
    a, b, c = h.create(), h.create(), h.create()
    assert h.send(USER, a) == [] and h.send(USER, b) == []
    assert _refusals(h.send(USER, c)) == [c.link_id]  # a third from the same peer: refused now
    assert h.core.holds["full"] == 1 and h.core.dropped["not-registered"] == 1 and h.core.held == 2
    strangers = [os.urandom(20) for _ in range(10)]
    refused = [link for p in strangers for link in _refusals(h.send(p, h.create()))]
    assert h.core.held == 5 and len(refused) == 7 and h.core.holds["full"] == 8
    # every Create gets one answer in the end, as without holding: no more, no less
    out = h.core.release_held(HOLD_S, UNIX + HOLD_S)
    assert len(_refusals(out)) == 5 and h.core.dropped["not-registered"] == 1 + 7 + 5


def test_a_flood_of_unlisted_peers_holds_at_most_max_held_and_costs_one_refusal_per_create():
    h = Hops()
    answers = 0
    for i in range(2_000):
        answers += len(h.send(os.urandom(20), Create(os.urandom(16), os.urandom(200)), now=i * 0.001))
        assert h.core.held <= h.core.limits.max_held
    answers += len(h.core.release_held(1e6, UNIX + 1e6))
    assert answers == 2_000 == h.core.dropped["not-registered"] and h.core.held == 0
    assert len(h.core) == 0 and not h.core.replay  # nothing held was peeled


def test_re_feeding_takes_no_second_token_and_holding_does_not_bypass_the_rate_limit():
    h = Hops(RelayLimits(creates_per_s=0.001, create_burst=1))
    c = h.create()
    assert h.send(USER, c) == []  # took the one token, then held
    assert h.send(USER, h.create()) == [] and h.core.dropped["create-rate-limited"] == 1  # not held
    assert h.core.held == 1 and h.core.holds["held"] == 1
    h.listed.add(USER)
    out = h.core.release_held(0.5, UNIX)
    assert [type(s.msg) for s in out] == [Create] and h.core.dropped["create-rate-limited"] == 1


def test_a_held_create_goes_through_the_replay_cache():
    h = Hops()
    pkt = h.onion()
    first, again = h.create(pkt), h.create(pkt)  # one onion, two links: a replay
    h.send(USER, first)
    h.send(USER, again)
    h.listed.add(USER)
    out = h.core.release_held(1.0, UNIX)
    assert [type(s.msg) for s in out] == [Create] and len(h.core) == 1
    assert h.core.dropped["onion-replayed"] == 1
    # an onion already used, replayed by an unlisted peer: held, then dropped as a replay
    other = os.urandom(20)
    assert h.send(other, h.create(pkt)) == [] and h.core.held == 1
    h.listed.add(other)
    assert h.core.release_held(2.0, UNIX) == [] and h.core.dropped["onion-replayed"] == 2


def test_a_peer_that_disconnects_or_gives_up_loses_its_held_creates():
    h = Hops()
    a, b = h.create(), h.create()
    h.send(USER, a)
    h.send(USER, b)
    other = os.urandom(20)
    h.send(other, h.create())
    assert h.core.held == 3
    assert h.core.on_peer_lost(USER) == [] and h.core.held == 1 and h.core.dropped["held-peer-lost"] == 2
    c = h.create()
    h.send(USER, c)
    assert h.send(USER, Destroy(c.link_id, "closed")) == [] and h.core.dropped["held-destroyed"] == 1
    h.listed.add(USER)
    h.listed.add(other)
    out = h.core.release_held(1.0, UNIX)
    assert [(s.peer, type(s.msg)) for s in out] == [(h.ids[1], Create)] and len(h.core) == 1  # other's only
    assert h.core.holds["held"] == 4 and h.core.holds["admitted"] == 1


def test_a_link_id_held_twice_is_dropped_and_no_hold_means_refused_at_once():
    h = Hops()
    c = h.create()
    h.send(USER, c)
    assert h.send(USER, c) == [] and h.core.dropped["link-in-use"] == 1 and h.core.held == 1
    off = Hops(RelayLimits(hold_s=0.0))
    c = off.create()
    assert _refusals(off.send(USER, c)) == [c.link_id] and off.core.held == 0 and not off.core.holds
