"""model_node.priority (issue 31): requests with a usage-quota token go first: admitted against
tokened work only, never behind untokened work waiting, a freed slot to the oldest tokened waiter,
and a full queue makes room by sending the newest untokened waiter away."""

from __future__ import annotations

import pytest
import trio

from model_node.admission import Queued, admit
from model_node.priority import BAND, Held, SlotGate, admit_held, next_up, preempt, victim

LIMIT = 10.0
NOW = 100.0


def test_a_tokened_request_is_admitted_ahead_of_untokened_work() -> None:
    # 12 s of untokened prompts wait (promised, with no slack): an untokened request is refused
    waiting = [Held(3.0, 3.0, 104.0), Held(4.0, 4.0, 108.0), Held(5.0, 5.0, 113.0)]
    assert admit_held(waiting, 2.0, NOW, LIMIT, tokened=False) is None
    got = admit_held(waiting, 2.0, NOW, LIMIT, tokened=True)
    assert got is not None and got.wait == 2.0 and got.promise == NOW + LIMIT
    assert got.key < 0 < min(h.key for h in waiting)  # the engine evaluates it before all of them
    # on an engine that evaluates prompts first come first served, as well: the untokened ones wait for a slot
    fcfs = admit_held(waiting, 2.0, NOW, LIMIT, tokened=True, reorders=False)
    assert fcfs is not None and fcfs.wait == 2.0 and fcfs.key < 0


def test_a_tokened_request_waits_for_the_prompts_the_engine_already_holds_first_come_first_served() -> None:
    running = Held(6.0, 6.0, 110.0, running=True)  # untokened, its prompt with the engine
    queued = Held(7.0, 3.0, 113.0)  # untokened, waiting for a slot
    fcfs = admit_held([running, queued], 2.0, NOW, LIMIT, tokened=True, reorders=False)
    assert fcfs is not None and fcfs.wait == pytest.approx(8.0) and fcfs.key < 0
    assert admit_held([running, queued], 5.0, NOW, LIMIT, tokened=True, reorders=False) is None  # 11 s
    # an engine that orders prompts by key evaluates it before both: its key sorts first
    ordered = admit_held([running, queued], 5.0, NOW, LIMIT, tokened=True)
    assert ordered is not None and ordered.wait == 5.0 and ordered.key < 0


def test_tokened_requests_keep_their_promises_among_themselves() -> None:
    first = admit_held([], 6.0, NOW, LIMIT, tokened=True)
    assert first is not None
    tokened = Held(first.key, 6.0, first.promise, tokened=True)  # done at 106, promised 110: 4 s of slack
    short = admit_held([tokened], 0.5, NOW, LIMIT, tokened=True)
    assert short is not None and short.key < tokened.key and short.wait == 0.5  # ahead of it, within its slack
    assert admit_held([tokened], 4.5, NOW, LIMIT, tokened=True) is None  # 10.5 s behind it; 4.5 s ahead makes it late


def test_an_untokened_request_is_never_placed_ahead_of_tokened_work() -> None:
    long_tokened = Held(6.0 - BAND, 6.0, 110.0, tokened=True)  # 4 s of slack: a short prompt could pass it
    got = admit_held([long_tokened], 0.5, NOW, LIMIT, tokened=False)
    assert got is not None and got.key > long_tokened.key and got.key >= 0
    assert got.wait == pytest.approx(6.5)  # behind it
    # nor between two tokened requests, whatever their keys
    pair = [long_tokened, Held(8.0 - BAND, 1.0, 110.0, tokened=True)]
    got = admit_held(pair, 0.1, NOW, LIMIT, tokened=False)
    assert got is not None and got.key > max(h.key for h in pair) and got.wait == pytest.approx(7.1)


def test_without_tokened_work_admission_is_as_without_quotas() -> None:
    queue = [Queued(6.0, 6.0, 110.0), Queued(0.3, 0.3, 109.0)]
    held = [Held(q.key, q.seconds, q.promise) for q in queue]
    for seconds in (0.1, 0.5, 2.0, 5.0):
        for reorders in (True, False):
            assert admit_held(held, seconds, NOW, LIMIT, tokened=False, reorders=reorders) == admit(
                queue, seconds, NOW, LIMIT, reorders=reorders)


def test_a_tokened_request_that_would_wait_stops_the_untokened_generation_that_produced_least() -> None:
    running = [(False, 40), (True, 3), (False, 7), (False, 90)]  # (tokened, tokens produced)
    assert preempt(running, wanted=1) == 2
    assert preempt(running, wanted=0) is None  # as many being stopped as tokened waiters: no more
    assert preempt([(True, 1), (True, 2)], wanted=1) is None  # tokened generations are never stopped
    assert preempt([], wanted=3) is None


def test_which_waiter_gets_a_slot_and_which_is_sent_away() -> None:
    # oldest first: untokened, tokened, untokened, tokened, untokened
    waiting = [False, True, False, True, False]
    assert next_up(waiting) == 1  # the oldest tokened one
    assert victim(waiting) == 4  # the newest untokened one
    assert next_up([False, False]) == 0 and victim([False, False]) == 1
    assert next_up([True, True]) == 0 and victim([True, True]) is None  # tokened ones are never sent away
    assert next_up([]) is None and victim([]) is None


async def test_the_slot_gate_serves_tokened_waiters_first_and_evicts_the_newest_untokened(autojump_clock) -> None:
    gate = SlotGate(1)
    assert await gate.acquire(False)  # a free slot: at once
    order: list[str] = []

    async def wait(name: str, tokened: bool) -> None:
        got = await gate.acquire(tokened)
        order.append(name if got else f"{name} evicted")

    async with trio.open_nursery() as nursery:
        for name, tokened in (("u1", False), ("u2", False), ("t1", True), ("u3", False), ("t2", True)):
            nursery.start_soon(wait, name, tokened)
            await trio.sleep(1)  # arrival order
        assert gate.evictable() and gate.evict()
        await trio.sleep(1)
        assert order == ["u3 evicted"]
        for _ in range(4):
            gate.release()
            await trio.sleep(1)
        assert order == ["u3 evicted", "t1", "t2", "u1", "u2"]
        assert not gate.evictable() and not gate.evict()
    gate.release()
    assert gate.free == 1


async def test_a_waiter_that_gives_up_leaves_the_line(autojump_clock) -> None:
    gate = SlotGate(1)
    assert await gate.acquire(False)
    with trio.move_on_after(1):
        await gate.acquire(False)
    assert not gate.evictable()  # gone from the line: nobody to evict, nobody to hand the slot to
    gate.release()
    assert gate.free == 1
