"""The listener's admission policy (overlay.transport.Admission, issue 15 item 5), I/O-free:
silent or half-open connections cannot keep honest peers out."""

from __future__ import annotations

import pytest

from overlay.transport import Admission


def test_a_flood_from_one_address_evicts_only_its_own_pending_connections() -> None:
    adm = Admission(max_connections=100, max_pending=20, max_pending_per_address=8)
    for i in range(2000):  # one address holds 2,000 silent connections (within its rate)
        ok, evict = adm.admit(("bad", i), "10.0.0.66", now=i / 10)
        assert ok and all(k[0] == "bad" for k in evict)
    assert adm.pending == 8 and adm.evicted == 2000 - 8
    # honest peers from other addresses get in and stay while they authenticate
    for j in range(12):
        ok, evict = adm.admit(("good", j), f"10.0.1.{j}", now=200.0)
        assert ok and all(k[0] == "bad" for k in evict)
    for j in range(12):
        adm.authenticated(("good", j))
    assert adm.established == 12 and adm.pending <= 8


def test_over_the_pending_cap_the_heaviest_address_loses_its_oldest() -> None:
    adm = Admission(max_connections=100, max_pending=10, max_pending_per_address=10)
    for i in range(7):
        assert adm.admit(("a", i), "A") == (True, [])
    for i in range(3):
        assert adm.admit(("b", i), "B") == (True, [])
    assert adm.admit(("c", 0), "C") == (True, [("a", 0)])  # A has the most pending: its oldest goes
    assert adm.admit(("a", 7), "A") == (True, [("a", 1)])


def test_authenticated_connections_are_never_evicted() -> None:
    adm = Admission(max_connections=4, max_pending=4, max_pending_per_address=4)
    for i in range(4):
        adm.admit(i, "H")
        adm.authenticated(i)
    assert adm.admit("new", "X") == (False, []) and adm.refused == 1
    adm.closed(0)
    assert adm.admit("new", "X") == (True, [])
    # total cap with one pending left: the newcomer evicts the pending one, not the others
    assert adm.admit("newer", "Y") == (True, ["new"])
    assert adm.established == 3 and adm.pending == 1


def test_closing_frees_slots_and_unknown_keys_are_ignored() -> None:
    adm = Admission(max_connections=2, max_pending=2, max_pending_per_address=1)
    adm.admit(1, "A")
    adm.closed(1)
    adm.closed(1)
    adm.closed("never seen")
    adm.authenticated("never seen")
    assert adm.pending == adm.established == 0
    assert adm.admit(2, "A") == (True, [])
    with pytest.raises(ValueError):
        Admission(max_connections=4, max_pending=8)


def test_new_connections_are_rate_limited_per_address() -> None:
    """A churning attacker is refused before TLS; other addresses are not affected."""
    adm = Admission(max_connections=1000, max_pending=1000, max_pending_per_address=1000,
                    new_per_s=10.0, new_burst=20.0)
    results = [adm.admit(("bad", i), "A", now=0.0)[0] for i in range(100)]
    assert sum(results) == 20 and adm.rate_limited == 80
    assert adm.admit("good", "B", now=0.0) == (True, [])
    assert adm.admit(("bad", 100), "A", now=0.05)[0] is False  # half a token
    assert adm.admit(("bad", 101), "A", now=0.2)[0] is True  # refilled at 10/s
    for i in range(10_000):  # many addresses: the bucket table stays bounded
        adm.admit(("many", i), f"10.{i}", now=1000.0 + i)
        adm.closed(("many", i))
    assert len(adm._buckets) <= 4 * adm.max_connections + 1
