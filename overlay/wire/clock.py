"""The one place GenTorrent reads a clock.

Cores never read a clock: they take ``now`` as an argument. Drivers take a
:class:`Clock` (``clock=``) and read it only through its two methods, so a test
hands them a :class:`FakeClock` or runs them under trio's ``MockClock`` and
every timeout, TTL and expiry follows the test's time.

- ``monotonic()``: seconds on a clock that never goes back; for timeouts, TTLs,
  rate limits and anything compared only with itself on this machine.
- ``unix()``: seconds since the Unix epoch; only for values that leave this
  machine (expiry stamps in onions, signing times, status reports).
"""

from __future__ import annotations

import time
from typing import Protocol

import trio


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def unix(self) -> float: ...


class SystemClock:
    """The machine's clocks; for code that runs outside trio (CLI tools, processes)."""

    def monotonic(self) -> float:
        return time.monotonic()

    def unix(self) -> float:
        return time.time()


# Wall clock minus trio's clock, fixed the first time any TrioClock of a run reads it.
_UNIX_OFFSET: trio.lowlevel.RunVar[float] = trio.lowlevel.RunVar("gentorrent_unix_offset")


class TrioClock:
    """trio's clock, so ``MockClock`` drives drivers under test.

    ``unix()`` is anchored to the wall clock the first time any ``TrioClock``
    reads it in a ``trio.run`` and then advances with trio's clock, so a test
    that jumps trio's clock by an hour sees expiry stamps an hour later too,
    and every node of the run agrees on the time (one anchor per run, not per
    instance: under an autojumping ``MockClock`` two instances anchored at
    different trio times would disagree by the jump). Both methods must be
    called inside ``trio.run``.
    """

    def monotonic(self) -> float:
        return trio.current_time()

    def unix(self) -> float:
        now = trio.current_time()
        try:
            offset = _UNIX_OFFSET.get()
        except LookupError:
            offset = time.time() - now
            _UNIX_OFFSET.set(offset)
        return offset + now


class FakeClock:
    """A clock a test sets by hand: ``clock.advance(30)``."""

    def __init__(self, monotonic: float = 0.0, unix: float = 1_700_000_000.0) -> None:
        self._monotonic = monotonic
        self._unix = unix

    def monotonic(self) -> float:
        return self._monotonic

    def unix(self) -> float:
        return self._unix

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock does not go back")
        self._monotonic += seconds
        self._unix += seconds
