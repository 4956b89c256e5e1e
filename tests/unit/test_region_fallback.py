"""A region smaller than the minimum does not narrow a user's anonymity set (issue 28 item 8): its
users draw relays from the wider region ('eu-west' -> 'eu' -> everyone), and say so once."""

from __future__ import annotations

import logging
import os
import random
from typing import Any

import pytest

from overlay.anon.paths import REGION_MIN_USERS, PathManager, in_region, region_scope, wider_region
from overlay.net.peers import PeerEntry
from overlay.wire.clock import FakeClock
from overlay.wire.identity import Identity


def _users(**regions: int) -> list[PeerEntry]:
    """``count`` users per region (keyword names use '_' for '-')."""
    out = []
    for name, count in regions.items():
        for _ in range(count):
            out.append(PeerEntry.of(Identity.generate(), "mem:x", region=name.replace("_", "-")))
    return out


def test_regions_nest_by_their_dashes() -> None:
    assert wider_region("eu-west-2") == "eu-west" and wider_region("eu-west") == "eu" and wider_region("eu") == ""
    assert in_region("eu-west", "eu") and in_region("eu-west-2", "eu-west") and in_region("eu", "eu")
    assert not in_region("europe", "eu") and not in_region("eu", "eu-west") and in_region("us", "")


def test_a_region_below_the_minimum_falls_back_to_the_wider_one_then_to_everyone() -> None:
    users = _users(eu_west=5, eu_west_2=2, eu_east=6, europe=4, us=9)
    scope, pool = region_scope(users, "eu-west", min_users=7)
    assert scope == "eu-west" and {u.region for u in pool} == {"eu-west", "eu-west-2"} and len(pool) == 7
    scope, pool = region_scope(users, "eu-west", min_users=8)
    assert scope == "eu" and len(pool) == 13 and {u.region for u in pool} == {"eu-west", "eu-west-2", "eu-east"}
    scope, pool = region_scope(users, "eu-west-2", min_users=3)  # its own 2 are too few: eu-west's 7
    assert scope == "eu-west" and len(pool) == 7
    scope, pool = region_scope(users, "eu-west", min_users=14)
    assert scope == "" and pool == users
    scope, pool = region_scope(users, "eu-west", min_users=len(users) + 1)  # the network is smaller: everyone
    assert scope == "" and pool == users
    scope, pool = region_scope(users, "mars", min_users=1)  # nobody there: everyone
    assert scope == "" and pool == users


def test_the_paper_minimum_is_the_default() -> None:
    users = _users(eu=999, us=1)
    assert REGION_MIN_USERS == 1000
    assert region_scope(users, "eu")[0] == ""
    assert region_scope([*users, *_users(eu=1)], "eu")[0] == "eu"


class _Sink:
    node_id = os.urandom(20)

    def send_nowait(self, peer: bytes, msg: Any) -> bool:
        return True


def test_a_path_manager_of_a_small_region_builds_through_the_wider_one_and_logs_it_once(
        caplog: pytest.LogCaptureFixture) -> None:
    users = _users(eu_west=2, eu_east=10, us=10)
    pm = PathManager(_Sink(), lambda: users, region="eu-west", region_min_users=5, rng=random.Random(0),
                     clock=FakeClock())
    seen: set[str] = set()
    with caplog.at_level(logging.INFO, "gentorrent.paths"):
        for _ in range(30):
            p = pm.start_build()
            seen |= {r.region for r in p.relays}
            pm.close()
    assert seen == {"eu-west", "eu-east"} and pm.scope == "eu"  # never 'us': 'eu' has 12 >= 5
    fell_back = [r for r in caplog.records if "fewer than 5 users" in r.getMessage()]
    assert len(fell_back) == 1 and "'eu'" in fell_back[0].getMessage()


def test_a_path_manager_of_a_large_enough_region_stays_in_it() -> None:
    users = _users(eu_west=6, us=10)
    pm = PathManager(_Sink(), lambda: users, region="eu-west", region_min_users=6, rng=random.Random(1),
                     clock=FakeClock())
    for _ in range(20):
        assert {r.region for r in pm.start_build().relays} == {"eu-west"}
        pm.close()
    assert pm.scope == "eu-west"
