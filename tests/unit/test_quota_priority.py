"""model_node.priority (issue 31, decision 0022): requests go by rank, their usage-quota token's
class (priority 2, standard 1, none 0): admitted against work of their rank or above only, never
behind lower-rank work waiting, a freed slot to the oldest waiter of the highest rank, a full queue
makes room by sending the newest waiter of the lowest rank below away, and a waiter with a token
stops a generation without one (never one with a token). With ranks 0 and 1 only, the rules are
decision 0018's (untokened and tokened)."""

from __future__ import annotations

import pytest
import trio

from model_node.admission import Queued, admit
from model_node.priority import (
    BAND,
    PRIORITY,
    STANDARD,
    UNTOKENED,
    Held,
    SlotGate,
    admit_held,
    next_up,
    preempt,
    victim,
)

LIMIT = 10.0
NOW = 100.0


def test_a_tokened_request_is_admitted_ahead_of_untokened_work() -> None:
    # 12 s of untokened prompts wait (promised, with no slack): an untokened request is refused
    waiting = [Held(3.0, 3.0, 104.0), Held(4.0, 4.0, 108.0), Held(5.0, 5.0, 113.0)]
    assert admit_held(waiting, 2.0, NOW, LIMIT, rank=UNTOKENED) is None
    got = admit_held(waiting, 2.0, NOW, LIMIT, rank=STANDARD)
    assert got is not None and got.wait == 2.0 and got.promise == NOW + LIMIT
    assert got.key < 0 < min(h.key for h in waiting)  # the engine evaluates it before all of them
    # on an engine that evaluates prompts first come first served, as well: the untokened ones wait for a slot
    fcfs = admit_held(waiting, 2.0, NOW, LIMIT, rank=STANDARD, reorders=False)
    assert fcfs is not None and fcfs.wait == 2.0 and fcfs.key < 0


def test_a_tokened_request_waits_for_the_prompts_the_engine_already_holds_first_come_first_served() -> None:
    running = Held(6.0, 6.0, 110.0, running=True)  # untokened, its prompt with the engine
    queued = Held(7.0, 3.0, 113.0)  # untokened, waiting for a slot
    fcfs = admit_held([running, queued], 2.0, NOW, LIMIT, rank=STANDARD, reorders=False)
    assert fcfs is not None and fcfs.wait == pytest.approx(8.0) and fcfs.key < 0
    assert admit_held([running, queued], 5.0, NOW, LIMIT, rank=STANDARD, reorders=False) is None  # 11 s
    # an engine that orders prompts by key evaluates it before both: its key sorts first
    ordered = admit_held([running, queued], 5.0, NOW, LIMIT, rank=STANDARD)
    assert ordered is not None and ordered.wait == 5.0 and ordered.key < 0


def test_tokened_requests_keep_their_promises_among_themselves() -> None:
    first = admit_held([], 6.0, NOW, LIMIT, rank=STANDARD)
    assert first is not None
    tokened = Held(first.key, 6.0, first.promise, rank=STANDARD)  # done at 106, promised 110: 4 s of slack
    short = admit_held([tokened], 0.5, NOW, LIMIT, rank=STANDARD)
    assert short is not None and short.key < tokened.key and short.wait == 0.5  # ahead of it, within its slack
    assert admit_held([tokened], 4.5, NOW, LIMIT, rank=STANDARD) is None  # 10.5 s behind it; 4.5 s ahead makes it late


def test_an_untokened_request_is_never_placed_ahead_of_tokened_work() -> None:
    long_tokened = Held(6.0 - BAND, 6.0, 110.0, rank=STANDARD)  # 4 s of slack: a short prompt could pass it
    got = admit_held([long_tokened], 0.5, NOW, LIMIT, rank=UNTOKENED)
    assert got is not None and got.key > long_tokened.key and got.key >= 0
    assert got.wait == pytest.approx(6.5)  # behind it
    # nor between two tokened requests, whatever their keys
    pair = [long_tokened, Held(8.0 - BAND, 1.0, 110.0, rank=STANDARD)]
    got = admit_held(pair, 0.1, NOW, LIMIT, rank=UNTOKENED)
    assert got is not None and got.key > max(h.key for h in pair) and got.wait == pytest.approx(7.1)


def test_without_tokened_work_admission_is_as_without_quotas() -> None:
    queue = [Queued(6.0, 6.0, 110.0), Queued(0.3, 0.3, 109.0)]
    held = [Held(q.key, q.seconds, q.promise) for q in queue]
    for seconds in (0.1, 0.5, 2.0, 5.0):
        for reorders in (True, False):
            assert admit_held(held, seconds, NOW, LIMIT, rank=UNTOKENED, reorders=reorders) == admit(
                queue, seconds, NOW, LIMIT, reorders=reorders)


def test_a_tokened_request_that_would_wait_stops_the_untokened_generation_that_produced_least() -> None:
    running = [(0, 40), (1, 3), (0, 7), (0, 90)]  # (rank, tokens produced)
    assert preempt(running, [STANDARD]) == 2
    assert preempt(running, [STANDARD], stopping=1) is None  # as many being stopped as tokened waiters: no more
    assert preempt(running, [UNTOKENED, STANDARD, UNTOKENED, STANDARD], stopping=1) == 2  # one more waits
    assert preempt([(1, 1), (1, 2)], [STANDARD]) is None  # tokened generations are never stopped for it
    assert preempt(running, [UNTOKENED, UNTOKENED]) is None  # nor anything for untokened waiters
    assert preempt([], [STANDARD, STANDARD]) is None


def test_a_waiter_with_a_token_stops_only_a_generation_without_one() -> None:
    assert preempt([(1, 2), (0, 50), (2, 1)], [PRIORITY]) == 1  # the untokened one, though it produced more
    assert preempt([(1, 20), (2, 1), (1, 5)], [PRIORITY]) is None  # a standard generation is never stopped
    assert preempt([(2, 1), (2, 3)], [PRIORITY]) is None  # nor a priority one


def test_a_standard_waiter_never_stops_a_standard_or_priority_generation() -> None:
    assert preempt([(1, 1), (2, 0), (1, 9)], [STANDARD]) is None
    assert preempt([(1, 1), (2, 0)], [UNTOKENED, STANDARD, STANDARD]) is None


def test_generations_already_stopping_serve_the_highest_waiters_first() -> None:
    running = [(1, 4), (0, 10), (0, 2)]
    # one being stopped, two waiting: its slot goes to the priority waiter, so the standard one
    # still wants one, and may stop only an untokened generation
    assert preempt(running, [STANDARD, PRIORITY], stopping=1) == 2
    assert preempt([(1, 4)], [STANDARD, PRIORITY], stopping=1) is None
    # none being stopped: the priority waiter's want comes first, and it stops no standard one
    assert preempt([(1, 4), (2, 1)], [STANDARD, PRIORITY]) is None
    assert preempt([(1, 4), (0, 1)], [UNTOKENED]) is None  # an untokened waiter stops nothing


def test_which_waiter_gets_a_slot_and_which_is_sent_away() -> None:
    # oldest first: untokened, tokened, untokened, tokened, untokened
    waiting = [0, 1, 0, 1, 0]
    assert next_up(waiting) == 1  # the oldest tokened one
    assert victim(waiting, STANDARD) == 4  # the newest untokened one
    assert victim(waiting, UNTOKENED) is None  # an untokened request never sends one away
    assert next_up([0, 0]) == 0 and victim([0, 0], STANDARD) == 1
    assert next_up([1, 1]) == 0 and victim([1, 1], STANDARD) is None  # tokened ones are never sent away by their rank
    assert next_up([]) is None and victim([], PRIORITY) is None


def test_a_freed_slot_goes_to_a_priority_waiter_before_an_older_standard_one() -> None:
    assert next_up([STANDARD, UNTOKENED, PRIORITY, STANDARD, PRIORITY]) == 2
    assert next_up([UNTOKENED, STANDARD, STANDARD]) == 1


def test_a_full_queue_sends_away_the_newest_of_the_lowest_rank_below_the_newcomer() -> None:
    waiting = [UNTOKENED, STANDARD, PRIORITY, UNTOKENED, STANDARD]
    assert victim(waiting, PRIORITY) == 3  # untokened ones go first
    assert victim(waiting, STANDARD) == 3
    assert victim([STANDARD, PRIORITY, STANDARD, PRIORITY], PRIORITY) == 2  # no untokened: the newest standard one
    assert victim([PRIORITY, STANDARD, PRIORITY], STANDARD) is None  # a standard newcomer never sends a priority one
    assert victim([PRIORITY, PRIORITY], PRIORITY) is None


def test_a_request_is_admitted_against_its_rank_and_above_only() -> None:
    # 9 s of standard prompts wait, promised with no slack: a standard request is refused, a priority one not
    standard = [Held(3.0 - BAND, 3.0, 103.0, STANDARD), Held(4.0 - BAND, 6.0, 109.0, STANDARD)]
    assert admit_held(standard, 2.0, NOW, LIMIT, rank=STANDARD) is None
    got = admit_held(standard, 2.0, NOW, LIMIT, rank=PRIORITY)
    assert got is not None and got.wait == 2.0 and got.key < min(h.key for h in standard)
    # a standard request waits behind priority work, and sorts after it, before untokened work
    top = Held(1.0 - 2 * BAND, 5.0, 110.0, PRIORITY)
    untokened = Held(0.5, 4.0, 109.0)
    got = admit_held([top, untokened], 1.0, NOW, LIMIT, rank=STANDARD)
    assert got is not None and got.wait == pytest.approx(6.0) and top.key < got.key < 0 < untokened.key
    # an untokened request waits behind both
    got = admit_held([top, *standard], 0.1, NOW, LIMIT, rank=UNTOKENED)
    assert got is None  # 14.1 s of tokened work ahead
    # first come first served: a priority request waits for the standard prompt the engine holds
    running = Held(4.0 - BAND, 4.0, 110.0, STANDARD, running=True)
    fcfs = admit_held([running], 7.0, NOW, LIMIT, rank=PRIORITY, reorders=False)
    assert fcfs is None  # 11 s
    ordered = admit_held([running], 7.0, NOW, LIMIT, rank=PRIORITY)
    assert ordered is not None and ordered.key < running.key


async def test_the_slot_gate_serves_tokened_waiters_first_and_evicts_the_newest_untokened(autojump_clock) -> None:
    gate = SlotGate(1)
    assert await gate.acquire(UNTOKENED)  # a free slot: at once
    order: list[str] = []

    async def wait(name: str, rank: int) -> None:
        got = await gate.acquire(rank)
        order.append(name if got else f"{name} evicted")

    async with trio.open_nursery() as nursery:
        for name, rank in (("u1", 0), ("u2", 0), ("t1", 1), ("u3", 0), ("t2", 1)):
            nursery.start_soon(wait, name, rank)
            await trio.sleep(1)  # arrival order
        assert gate.evictable(STANDARD) and gate.evict(STANDARD)
        await trio.sleep(1)
        assert order == ["u3 evicted"]
        for _ in range(4):
            gate.release()
            await trio.sleep(1)
        assert order == ["u3 evicted", "t1", "t2", "u1", "u2"]
        assert not gate.evictable(STANDARD) and not gate.evict(STANDARD)
    gate.release()
    assert gate.free == 1


async def test_the_slot_gate_serves_by_rank_and_a_priority_newcomer_evicts_a_standard_waiter(autojump_clock) -> None:
    gate = SlotGate(1)
    assert await gate.acquire(STANDARD)
    order: list[str] = []

    async def wait(name: str, rank: int) -> None:
        got = await gate.acquire(rank)
        order.append(name if got else f"{name} evicted")

    async with trio.open_nursery() as nursery:
        for name, rank in (("s1", STANDARD), ("p1", PRIORITY), ("s2", STANDARD), ("p2", PRIORITY)):
            nursery.start_soon(wait, name, rank)
            await trio.sleep(1)
        assert gate.waiting() == [STANDARD, PRIORITY, STANDARD, PRIORITY]
        assert not gate.evictable(STANDARD) and not gate.evict(STANDARD)  # a standard one never sends one away
        assert gate.evict(PRIORITY)  # no untokened waiter: the newest standard one goes
        await trio.sleep(1)
        assert order == ["s2 evicted"]
        for _ in range(3):
            gate.release()
            await trio.sleep(1)
        assert order == ["s2 evicted", "p1", "p2", "s1"]
    gate.release()
    assert gate.free == 1


async def test_a_waiter_that_gives_up_leaves_the_line(autojump_clock) -> None:
    gate = SlotGate(1)
    assert await gate.acquire(UNTOKENED)
    with trio.move_on_after(1):
        await gate.acquire(UNTOKENED)
    assert not gate.evictable(PRIORITY)  # gone from the line: nobody to evict, nobody to hand the slot to
    gate.release()
    assert gate.free == 1

