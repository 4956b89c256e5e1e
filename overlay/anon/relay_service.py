"""Thin trio driver that runs a :class:`~overlay.anon.relay.RelayCore` on a :class:`~overlay.net.node.Node`."""

from __future__ import annotations

import logging
from typing import Any

import trio

from overlay.anon.actions import Send
from overlay.anon.relay import RelayCore
from overlay.net.node import Node
from overlay.net.transport import Connection
from overlay.wire.clock import Clock, TrioClock
from overlay.wire.messages import CellBack, CellFwd, Create, Deliver, Destroy, ReturnClove

log = logging.getLogger("gentorrent.relay")

RELAY_MESSAGES = (Create, CellFwd, CellBack, Destroy, ReturnClove)


class RelayService:
    """Feeds ``node``'s relay messages to ``core`` and carries out the actions it returns.

    ``clock`` (default :class:`~overlay.wire.clock.TrioClock`) gives the core its ``now``
    (``monotonic``: rate limits, path expiry) and ``unix`` (onion expiry stamps).
    """

    def __init__(self, node: Node, core: RelayCore, *, clock: Clock | None = None) -> None:
        self.node = node
        self.core = core
        self.clock: Clock = clock or TrioClock()
        node.on_peer_lost(self._on_peer_lost)
        self._held_wake = trio.Event()  # set when the core may have taken a held Create

    def install(self) -> None:
        """Handle every relay message on ``node`` (a user node may wrap some first)."""
        for t in RELAY_MESSAGES:
            self.node.on(t, self.handle)

    async def handle(self, conn: Connection, msg: Any) -> None:
        self.execute(self.core.on_message(conn.peer_id, msg, now=self.clock.monotonic(), unix=self.clock.unix()))
        if self.core.held:
            self._held_wake.set()

    def release_held(self) -> None:
        """Re-feed the core's held Creates that are due or whose peer is now listed (call after
        each list update; :meth:`run` calls it when the oldest is due)."""
        self.execute(self.core.release_held(self.clock.monotonic(), self.clock.unix()))

    async def _release_due(self) -> None:
        while True:
            due = self.core.next_hold_deadline()
            if due is None:
                await self._held_wake.wait()
                self._held_wake = trio.Event()
                continue
            await trio.sleep(max(0.0, due - self.clock.monotonic()))
            self.release_held()

    def execute(self, actions: list[Send]) -> None:
        for a in actions:
            ok = self.node.send_nowait(a.peer, a.msg)
            if not ok and isinstance(a.msg, Deliver):
                self.execute(self.core.deliver_failed(a.msg.proxy_path_id, "the model node is unreachable",
                                                     a.peer))

    def _on_peer_lost(self, peer: bytes) -> None:
        self.execute(self.core.on_peer_lost(peer))

    async def run(self, *, interval: float = 30.0, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._release_due)
            task_status.started()
            while True:
                await trio.sleep(interval)
                self.execute(self.core.expire(self.clock.monotonic()))
