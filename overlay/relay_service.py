"""Thin trio driver that runs a :class:`~overlay.relay.RelayCore` on a :class:`~overlay.node.Node`."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import trio

from overlay.messages import CellBack, CellFwd, Create, Deliver, Destroy, ReturnClove
from overlay.node import Node
from overlay.relay import RelayCore, Send
from overlay.transport import Connection

log = logging.getLogger("gentorrent.relay")

RELAY_MESSAGES = (Create, CellFwd, CellBack, Destroy, ReturnClove)


class RelayService:
    def __init__(self, node: Node, core: RelayCore, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.node = node
        self.core = core
        self.clock = clock
        node.on_peer_lost(self._on_peer_lost)

    def install(self) -> None:
        """Handle every relay message on ``node`` (a user node may wrap some first)."""
        for t in RELAY_MESSAGES:
            self.node.on(t, self.handle)

    async def handle(self, conn: Connection, msg: Any) -> None:
        self.execute(self.core.on_message(conn.peer_id, msg, now=self.clock(), unix=time.time()))

    def execute(self, actions: list[Send]) -> None:
        for a in actions:
            ok = self.node.send_nowait(a.peer, a.msg)
            if not ok and isinstance(a.msg, Deliver):
                self.execute(self.core.deliver_failed(a.msg.exit_id, "the model node is unreachable"))

    def _on_peer_lost(self, peer: bytes) -> None:
        self.execute(self.core.on_peer_lost(peer))

    async def run(self, *, interval: float = 30.0, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await trio.sleep(interval)
            self.execute(self.core.expire(self.clock()))
