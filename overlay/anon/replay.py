"""Each request id answered once: the memory a model node keeps of the ids it took.

I/O-free. A model node's :class:`~overlay.anon.responder.Responder` asks :meth:`AnsweredIds.take` for every
request it reassembles or is handed by a member of its group, and drops an id it took within
:data:`WINDOW_S` (counted as ``request-duplicate``); :class:`~model_node.server.ModelNode` asks its
own for plain (direct) requests and refuses those with a final error.

Why (decision 0015): a reply's signature binds its request id (:func:`overlay.anon.signing.request_digest`),
and a user who donates a transcript commits to the request, id included, before sending it. If
a node answered the same request twice, the user could send a committed request ten times, keep
the unluckiest of ten honest samples and hand that one in: framing by resampling. Answering each
id once leaves one sample per commitment. Honest clients never repeat an id (a fresh one per
request and per try), so nothing a user does is refused.

Bounded: two generations of ids, each at most ``capacity // 2``; the older is dropped when the
newer is full or older than half the window. An id is refused while either generation holds it,
so it is remembered for at least ``window_s / 2`` seconds unless more than ``capacity // 2``
other ids arrive first (:attr:`AnsweredIds.evicted_early` counts those drops: a flood that
makes the node forget takes that many requests, each one served or refused as any other).
"""

from __future__ import annotations

WINDOW_S = 1800.0  # a transcript's reply must be signed within TRANSCRIPT_WINDOW_S of its commitment (600 s)
CAPACITY = 200_000  # ids (16 bytes each): a few MiB


class AnsweredIds:
    """The request ids taken recently (see the module docstring)."""

    def __init__(self, capacity: int = CAPACITY, window_s: float = WINDOW_S) -> None:
        if capacity < 2 or not window_s > 0:
            raise ValueError("capacity must be at least 2 and the window positive")
        self.capacity = capacity
        self.window_s = window_s
        self._new: set[bytes] = set()
        self._old: set[bytes] = set()
        self._since: float | None = None  # when the newer generation started
        self.refused = 0
        self.evicted_early = 0

    def __len__(self) -> int:
        return len(self._new) + len(self._old)

    def take(self, request_id: bytes, now: float) -> bool:
        """Record ``request_id`` at ``now`` (monotonic seconds); False if it was taken already."""
        if request_id in self._new or request_id in self._old:
            self.refused += 1
            return False
        if self._since is None:
            self._since = now
        if now - self._since >= self.window_s / 2 or len(self._new) >= self.capacity // 2:
            if len(self._new) >= self.capacity // 2 and now - self._since < self.window_s / 2:
                self.evicted_early += len(self._old)
            self._old, self._new, self._since = self._new, set(), now
        self._new.add(request_id)
        return True
