"""The listener's admission policy (overlay.transport.Admission, issue 15 item 5), I/O-free:
silent or half-open connections cannot keep honest peers out."""

from __future__ import annotations

import pytest

from overlay.transport import Admission


def test_a_flood_from_one_address_evicts_only_its_own_pending_connections() -> None:
    adm = Admission(max_connections=100, max_pending=20, max_pending_per_address=8)
    for i in range(2000):  # one address holds 2,000 silent connections
        ok, evict = adm.admit(("bad", i), "10.0.0.66")
        assert ok and all(k[0] == "bad" for k in evict)
    assert adm.pending == 8 and adm.evicted == 2000 - 8
    # honest peers from other addresses get in and stay while they authenticate
    for j in range(12):
        ok, evict = adm.admit(("good", j), f"10.0.1.{j}")
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
