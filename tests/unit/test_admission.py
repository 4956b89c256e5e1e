"""model_node.admission: promises kept, short prompts ahead only as far as promises allow."""

from __future__ import annotations

import pytest

from model_node.admission import Admission, Queued, admit

LIMIT = 10.0


def test_an_idle_node_takes_any_prompt_and_promises_its_own_time() -> None:
    assert admit([], 3.0, 100.0, LIMIT) == Admission(3.0, 110.0, 3.0)
    # a prompt that alone takes longer than the limit: only an idle node takes it, and short
    # requests may pass it for half the limit
    assert admit([], 25.0, 100.0, LIMIT) == Admission(25.0, 130.0, 25.0)
    got = admit([Queued(25.0, 25.0, 130.0)], 0.5, 100.0, LIMIT)
    assert got is not None and got.key < 25.0
    assert admit([Queued(0.5, 0.5, 109.0)], 25.0, 100.0, LIMIT) is None


def test_a_short_prompt_goes_ahead_of_a_long_one_that_has_slack() -> None:
    long = Queued(6.0, 6.0, 110.0)  # done at 106, promised 110: 4 s of slack
    got = admit([long], 0.5, 100.0, LIMIT)
    assert got is not None and got.key < long.key and got.wait == 0.5 and got.promise == 110.0


def test_a_short_prompt_never_makes_an_earlier_request_late() -> None:
    long = Queued(6.0, 6.0, 106.2)  # 0.2 s of slack only
    got = admit([long], 0.5, 100.0, LIMIT)
    # not ahead of it: behind it, where it waits 6.5 s (within its own promise)
    assert got is not None and got.key > long.key and got.wait == pytest.approx(6.5)


def test_with_no_position_that_keeps_every_promise_the_request_is_refused() -> None:
    queue = [Queued(4.0, 4.0, 104.1), Queued(5.0, 5.0, 110.0)]  # done at 104 and 109
    assert admit(queue, 0.5, 100.0, LIMIT) is not None  # behind both: 9.5 s
    assert admit(queue, 1.5, 100.0, LIMIT) is None  # ahead of either makes one late; behind: 10.5 s


def test_a_request_already_late_is_not_pushed_back_further() -> None:
    late = Queued(2.0, 3.0, 101.0)  # promised in 1 s, estimated in 3 s
    got = admit([late], 0.1, 100.0, LIMIT)
    assert got is not None and got.key > late.key


def test_first_come_first_served_engines_only_append() -> None:
    long = Queued(6.0, 6.0, 110.0)
    got = admit([long], 0.5, 100.0, LIMIT, reorders=False)
    assert got is not None and got.key > long.key and got.wait == pytest.approx(6.5)
    assert admit([long], 4.5, 100.0, LIMIT, reorders=False) is None


def test_keys_order_the_queue_as_admitted() -> None:
    """Playing admissions one after another: the keys sort the requests in the order the
    admission placed them, and every estimated first token is within its promise."""
    queue: list[Queued] = []
    now = 0.0
    for seconds in (5.0, 0.3, 4.0, 0.2, 0.4, 1.0, 3.0, 0.05):
        got = admit(queue, seconds, now, LIMIT)
        if got is not None:
            queue.append(Queued(got.key, seconds, got.promise))
    ordered = sorted(queue, key=lambda q: q.key)
    t = now
    for q in ordered:
        t += q.seconds
        assert t <= q.promise + 1e-9
    # short ones went ahead of the 5 s prompt taken first, as long as its slack lasted; the
    # 1 s and 3 s prompts no longer fit in anyone's promise; 0.05 s still does, first
    assert [q.seconds for q in ordered] == [0.05, 0.2, 0.3, 0.4, 4.0, 5.0]


def test_equal_keys_cannot_be_split() -> None:
    a, b = Queued(1.0, 1.0, 110.0), Queued(1.0, 1.0, 101.5)  # b (later arrival) has 0.5 s of slack
    got = admit([a, b], 0.9, 100.0, LIMIT)
    assert got is not None and got.key > 1.0  # not between a and b: there is no key there


@pytest.mark.parametrize("limit, seconds", [(0.0, 1.0), (-1.0, 1.0), (1.0, -0.5)])
def test_bad_arguments(limit: float, seconds: float) -> None:
    with pytest.raises(ValueError):
        admit([], seconds, 0.0, limit)
