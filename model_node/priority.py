"""Quota priority (issue 31, decisions 0018 and 0022): a model node serves requests by *rank*,
the class of the usage-quota token they carry: :data:`PRIORITY` (2, a redeemed priority token: a
user keeping to its rate), :data:`STANDARD` (1, a redeemed standard token: what a full bucket
gives beyond that at once), :data:`UNTOKENED` (0, no token, or one that could not be checked).
Higher ranks go first, and lower ones are answered "busy" first.

No I/O, no clock. Used by :class:`~model_node.server.ModelNode`; which rank a request has is
:mod:`model_node.quota`'s business. Four rules, so that a user with tokens left is never starved
by users without, nor a user keeping to its rate by users spending a full bucket at once:

- **Admission** (:func:`admit_held`): a request of rank r is admitted
  (:func:`~model_node.admission.admit`) against the work held of rank r or above only, plus, on an
  engine that evaluates prompts first come first served, the lower-rank prompts the engine already
  holds (it cannot pass those). Lower-rank work waiting for a slot is pushed back and may then miss
  its promised first token: it is best-effort beside r. Keys tell the engine the prompt order: a
  rank r request's key is its admission key less r × :data:`BAND`, so it sorts before every key of
  a lower rank (untokened keys are never negative, and are as without quotas).
- **Slots** (:class:`SlotGate`, :func:`next_up`): a slot that frees goes to the oldest waiter of
  the highest rank (each rank first come first served).
- **A full queue** (:func:`victim`): a request of rank r that finds the queue full takes the place
  of the newest waiter of the lowest rank below r, which is answered "busy" (its user's client
  tries another node); none below r, and it is "busy" itself.
- **Every slot taken** (:func:`preempt`): a request with a token that would wait for a slot while
  generations without one hold slots stops the one that has produced least; it answers "busy"
  after what it sent (its user's client goes on at another node with the text so far), and the
  slot goes to the highest waiter (decision 0018). A generation with a token, standard ones
  included, is never stopped: its user paid for it, and a single-node group would lose it
  (measured, decision 0022: stopping standard ones cost a user at its fair share 20 % of its
  requests).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import trio

from model_node.admission import Admission, Queued, admit

UNTOKENED, STANDARD, PRIORITY = 0, 1, 2  # ranks: no (checked) token, a standard token, a priority token
BAND = 1e6  # seconds: a rank r key is its admission key less r * BAND (every untokened key is >= 0)


@dataclass(frozen=True, slots=True)
class Held:
    """A request held that has not had its first token: its admission view (``key``, the
    ``seconds`` of prompt it still needs, its ``promise``), its ``rank``, and whether it is
    ``running`` (it holds a slot: the engine has its prompt)."""

    key: float
    seconds: float
    promise: float
    rank: int = UNTOKENED
    running: bool = False


def admit_held(held: Sequence[Held], seconds: float, now: float, limit: float, *, rank: int,
               reorders: bool = True) -> Admission | None:
    """Admit a request of ``seconds`` of prompt and ``rank`` behind the work ``held`` (see the
    module docstring); ``None``: refused. Admission runs in rank ``rank``'s own key space
    (keys plus ``rank`` × :data:`BAND`: that rank's keys from 0, higher ranks' below)."""
    shift = rank * BAND
    ahead = [Queued(h.key + shift, h.seconds, h.promise) for h in held if h.rank >= rank]
    if not reorders:  # the engine evaluates the prompts it holds first, whatever their rank; their promises are theirs
        ahead += [Queued(-1.0, h.seconds, math.inf) for h in held if h.running and h.rank < rank]
    got = admit(ahead, seconds, now, limit, reorders=reorders)
    return None if got is None else Admission(got.key - shift, got.promise, got.wait)


def next_up(waiting: Sequence[int]) -> int | None:
    """Which of the ``waiting`` requests (their ranks, oldest first) a freed slot goes to: the
    oldest of the highest rank; ``None`` when none waits."""
    return waiting.index(max(waiting)) if waiting else None


def victim(waiting: Sequence[int], rank: int) -> int | None:
    """Which of the ``waiting`` requests (their ranks, oldest first) a request of ``rank`` that
    finds the queue full replaces: the newest of the lowest rank below ``rank``; ``None`` when
    none is below it."""
    below = [r for r in waiting if r < rank]
    if not below:
        return None
    lowest = min(below)
    return max(i for i, r in enumerate(waiting) if r == lowest)


def preempt(running: Sequence[tuple[int, int]], waiting: Sequence[int], stopping: int = 0) -> int | None:
    """Which generation to stop for the ``waiting`` requests (their ranks, the newcomer's too),
    given ``stopping`` generations already being stopped: of the ``running`` ones (``(rank,
    produced)`` each), the untokened one that has produced least, when a waiter with a token
    wants a slot; ``None`` when none is wanted or none runs without a token.

    Who wants one: freed slots go to the highest ranks first (:func:`next_up`), so the slots of
    the generations already stopping go to the ``stopping`` highest waiters; the highest of the
    others wants one if it has a token. Called once for each tokened request that comes to wait,
    this stops at most one generation for each; with two ranks it is decision 0018's rule."""
    unserved = sorted(waiting, reverse=True)[stopping:]
    if not unserved or unserved[0] == UNTOKENED:
        return None
    untokened = [(produced, i) for i, (r, produced) in enumerate(running) if r == UNTOKENED]
    return min(untokened)[1] if untokened else None


class _Waiter:
    __slots__ = ("event", "granted", "rank")

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.granted = False
        self.event = trio.Event()


class SlotGate:
    """``slots`` generation slots, handed out by :func:`next_up` instead of first come first
    served (a ``trio.Semaphore`` otherwise): :meth:`acquire` waits for one, :meth:`release`
    gives one back, :meth:`evict` sends the :func:`victim` away without one."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"slots must be at least 1, got {slots}")
        self.free = slots
        self._waiting: list[_Waiter] = []

    def waiting(self) -> list[int]:
        """The ranks of the requests waiting for a slot, oldest first."""
        return [w.rank for w in self._waiting]

    def evictable(self, rank: int) -> bool:
        """Whether a request below ``rank`` waits (one of ``rank`` could take its place)."""
        return victim(self.waiting(), rank) is not None

    async def acquire(self, rank: int) -> bool:
        """Wait for a slot as a request of ``rank``: ``True`` once held (:meth:`release` it),
        ``False`` if evicted."""
        if self.free > 0:  # nobody waits while a slot is free: release hands slots to waiters
            self.free -= 1
            return True
        w = _Waiter(rank)
        self._waiting.append(w)
        try:
            await w.event.wait()
        except BaseException:  # cancelled (the caller's wait ran out): a slot handed over meanwhile is passed on
            if w.granted:
                self.release()
            elif w in self._waiting:
                self._waiting.remove(w)
            raise
        return w.granted

    def release(self) -> None:
        i = next_up(self.waiting())
        if i is None:
            self.free += 1
            return
        w = self._waiting.pop(i)
        w.granted = True
        w.event.set()

    def evict(self, rank: int) -> bool:
        """Send the :func:`victim` of a request of ``rank`` away (its :meth:`acquire` returns
        ``False``); ``False`` if none waits below ``rank``."""
        i = victim(self.waiting(), rank)
        if i is None:
            return False
        self._waiting.pop(i).event.set()
        return True
