"""Quota priority (issue 31): a model node serves requests that carry a valid usage-quota token
(*tokened*) ahead of those without, and answers "busy" to the latter first.

No I/O, no clock. Used by :class:`~model_node.server.ModelNode`; which requests are tokened is
:mod:`model_node.quota`'s business. Three rules, so that a user with tokens left is never starved
by users without:

- **Admission** (:func:`admit_held`): a tokened request is admitted (:func:`~model_node.admission.admit`)
  against the tokened work held only, plus, on an engine that evaluates prompts first come first
  served, the prompts the engine already holds (it cannot pass those). Untokened work waiting for a
  slot is pushed back and may then miss its promised first token: it is best-effort. An untokened
  request is admitted as before, against everything held. Keys tell the engine the prompt order:
  a tokened request's key is its admission key less :data:`BAND`, so it sorts before every
  untokened key (those are never negative); with no tokened work, keys are as without quotas.
- **Slots** (:class:`SlotGate`): a slot that frees goes to the oldest tokened waiter, else to the
  oldest untokened one (each class first come first served).
- **A full queue** (:func:`victim`): a tokened request that finds the queue full takes the place
  of the newest untokened waiter, which is answered "busy" (its user's client tries another node).
- **Every slot taken** (:func:`preempt`): a tokened request that would wait for a slot while
  untokened generations hold them stops the one that has produced least; it answers "busy" after
  what it sent (its user's client goes on at another node with the text so far), and the slot
  goes to the tokened request (decision 0018).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import trio

from model_node.admission import Admission, Queued, admit

BAND = 1e6  # seconds: tokened keys are their admission key less this (every untokened key is >= 0)


@dataclass(frozen=True, slots=True)
class Held:
    """A request held that has not had its first token: its admission view (``key``, the
    ``seconds`` of prompt it still needs, its ``promise``), whether it is ``tokened``, and whether
    it is ``running`` (it holds a slot: the engine has its prompt)."""

    key: float
    seconds: float
    promise: float
    tokened: bool = False
    running: bool = False


def admit_held(held: Sequence[Held], seconds: float, now: float, limit: float, *, tokened: bool,
               reorders: bool = True) -> Admission | None:
    """Admit a request of ``seconds`` of prompt, ``tokened`` or not, behind the work ``held``
    (see the module docstring); ``None``: refused."""
    if not tokened:
        return admit([Queued(h.key, h.seconds, h.promise) for h in held], seconds, now, limit, reorders=reorders)
    ahead = [Queued(h.key + BAND, h.seconds, h.promise) for h in held if h.tokened]
    if not reorders:  # the engine evaluates the prompts it holds first, untokened or not; their promises are theirs
        ahead += [Queued(-1.0, h.seconds, math.inf) for h in held if h.running and not h.tokened]
    got = admit(ahead, seconds, now, limit, reorders=reorders)
    return None if got is None else Admission(got.key - BAND, got.promise, got.wait)


def next_up(waiting: Sequence[bool]) -> int | None:
    """Which of the ``waiting`` requests (tokened or not, oldest first) a freed slot goes to:
    the oldest tokened one, else the oldest; ``None`` when none waits."""
    if not waiting:
        return None
    return next((i for i, tokened in enumerate(waiting) if tokened), 0)


def victim(waiting: Sequence[bool]) -> int | None:
    """Which of the ``waiting`` requests (oldest first) a tokened request that finds the queue
    full replaces: the newest untokened one; ``None`` when every one is tokened."""
    return next((i for i in range(len(waiting) - 1, -1, -1) if not waiting[i]), None)


def preempt(running: Sequence[tuple[bool, int]], wanted: int) -> int | None:
    """Which generation to stop for a tokened request that would wait: of the ``running``
    generations (``(tokened, produced)`` each), the untokened one that has produced least, when
    ``wanted`` (tokened waiters not yet given a stopping generation) is positive; ``None`` when
    none is wanted or every generation is tokened."""
    if wanted <= 0:
        return None
    untokened = [(produced, i) for i, (tokened, produced) in enumerate(running) if not tokened]
    return min(untokened)[1] if untokened else None


class _Waiter:
    __slots__ = ("event", "granted", "tokened")

    def __init__(self, tokened: bool) -> None:
        self.tokened = tokened
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

    def tokened_waiting(self) -> int:
        """How many tokened requests wait for a slot."""
        return sum(1 for w in self._waiting if w.tokened)

    def evictable(self) -> bool:
        """Whether an untokened request waits (a tokened one could take its place)."""
        return victim([w.tokened for w in self._waiting]) is not None

    async def acquire(self, tokened: bool) -> bool:
        """Wait for a slot: ``True`` once held (:meth:`release` it), ``False`` if evicted."""
        if self.free > 0:  # nobody waits while a slot is free: release hands slots to waiters
            self.free -= 1
            return True
        w = _Waiter(tokened)
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
        i = next_up([w.tokened for w in self._waiting])
        if i is None:
            self.free += 1
            return
        w = self._waiting.pop(i)
        w.granted = True
        w.event.set()

    def evict(self) -> bool:
        """Send the newest untokened waiter away (its :meth:`acquire` returns ``False``);
        ``False`` if none waits."""
        i = victim([w.tokened for w in self._waiting])
        if i is None:
            return False
        self._waiting.pop(i).event.set()
        return True
