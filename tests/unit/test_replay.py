"""A model node answers each request id once (overlay/anon/replay.py, decision 0015): the framer
who resends a committed request to draw the unluckiest of many honest samples gets one."""

from __future__ import annotations

import pytest

from overlay.anon.replay import AnsweredIds


def test_an_id_is_taken_once_and_others_pass() -> None:
    ids = AnsweredIds(capacity=8, window_s=100.0)
    assert ids.take(b"a" * 16, 0.0)
    assert not ids.take(b"a" * 16, 1.0)
    assert ids.take(b"b" * 16, 1.0)
    assert ids.refused == 1 and len(ids) == 2


def test_an_id_is_remembered_for_at_least_half_the_window_across_a_rotation() -> None:
    ids = AnsweredIds(capacity=1000, window_s=100.0)
    assert ids.take(b"a" * 16, 0.0)
    assert ids.take(b"b" * 16, 60.0)  # rotates: "a" moves to the older generation
    assert not ids.take(b"a" * 16, 99.0)
    assert ids.take(b"c" * 16, 120.0)  # rotates again: "a" is dropped, "b" kept
    assert ids.take(b"a" * 16, 121.0)
    assert not ids.take(b"b" * 16, 121.0)


def test_memory_is_bounded_and_a_flood_that_evicts_is_counted() -> None:
    ids = AnsweredIds(capacity=10, window_s=1e9)
    for i in range(100):
        assert ids.take(i.to_bytes(16, "big"), float(i))
        assert len(ids) <= 10
    assert ids.evicted_early > 0
    assert not ids.take((99).to_bytes(16, "big"), 100.0)  # the latest ids are still refused


@pytest.mark.parametrize("capacity, window", [(1, 10.0), (10, 0.0), (10, float("nan"))])
def test_bad_settings_are_refused(capacity: int, window: float) -> None:
    with pytest.raises(ValueError):
        AnsweredIds(capacity, window)
