"""A user node: relays for others and, optionally, sends its own anonymous requests.

Composition only (the logic lives in :mod:`overlay.anon.relay`, :mod:`overlay.anon.paths`
and :mod:`overlay.anon.client`). Verifiers use the same class with ``client=True`` so
their challenges are ordinary user traffic.
"""

from __future__ import annotations

from typing import Any

import trio

from overlay.anon.client import AnonClient
from overlay.anon.paths import REGION_MIN_USERS, PathManager
from overlay.anon.relay import RelayCore
from overlay.anon.relay_service import RelayService
from overlay.directory.registry import Registry
from overlay.net.node import Node, listed_in
from overlay.net.transport import Connection, Transport
from overlay.wire.clock import Clock, TrioClock
from overlay.wire.identity import Identity
from overlay.wire.messages import CellBack, Destroy


class UserNode:
    def __init__(
        self,
        identity: Identity,
        transport: Transport,
        registry: Registry,
        *,
        region: str = "default",
        client: bool = True,
        n: int = 4,
        k: int = 3,
        paths: int | None = None,
        ping_interval: float = 0.0,
        build_timeout: float = 10.0,
        refresh: float = 15 * 60.0,
        clock: Clock | None = None,
        registered_only: bool = False,
        region_min_users: int = REGION_MIN_USERS,
    ) -> None:
        """``clock`` (default :class:`~overlay.wire.clock.TrioClock`) is handed to every part:
        node, relay, path manager and client, so a test moves them all at once.
        ``registered_only`` (set when lists come from the committee): this relay opens paths only
        for users in the current user list. Paths go through the user's ``region`` while it lists
        at least ``region_min_users`` users, else through a wider one (:func:`overlay.anon.paths.region_scope`). ``registry`` may be updated in place
        (:meth:`Registry.replace`); call :meth:`directory_changed` after each update."""
        clock = clock or TrioClock()
        self.identity = identity
        self.registry = registry
        self.region = region
        self.node = Node(identity, transport, peers=registry.entries, ping_interval=ping_interval,
                         clock=clock, registered=listed_in(registry))

        self.on_unlisted: Any = None  # Callable[[], None]: told when a peer is not in the lists (refresh them)

        def has_role(role: str) -> Any:
            def check(node_id: bytes) -> bool:
                e = registry.by_id.get(node_id)
                if e is None and self.on_unlisted is not None:
                    self.on_unlisted()
                return e is not None and e.role == role
            return check

        def groupmates(delivered_to: bytes, node_id: bytes) -> bool:
            """Both trusted model nodes serving a common model: ``node_id`` may be in
            ``delivered_to``'s forwarding group (model_node.group_service), and answer for it."""
            a, b = registry.by_id.get(delivered_to), registry.by_id.get(node_id)
            return (a is not None and b is not None and a.role == b.role == "model" and a.trusted
                    and b.trusted and not set(a.models).isdisjoint(b.models))

        self.relay = RelayService(
            self.node,
            RelayCore(identity.node_id, identity.x25519, knows=has_role("user"), is_model=has_role("model"),
                      admits=has_role("user") if registered_only else None, may_answer=groupmates),
            clock=clock,
        )
        self.relay.install()
        self.paths: PathManager | None = None
        self.client: AnonClient | None = None
        self._nursery: trio.Nursery | None = None
        self._paths_deferred = False  # lists from the committee: build paths once the first ones arrive
        if client:
            self.paths = PathManager(
                self.node, registry.users, region=region, region_min_users=region_min_users,
                target=max(n, paths or n), build_timeout=build_timeout, refresh=refresh, clock=clock,
            )
            self.client = AnonClient(self.paths, registry.models, self.node.send_nowait, n=n, k=k,
                                      clock=clock)
            self.node.on(CellBack, self._on_cell_back)
            self.node.on(Destroy, self._on_destroy)
            self.node.on_peer_lost(self.paths.on_peer_lost)

    def directory_changed(self) -> None:
        """The registry was updated in place: dial the new nodes by their listed addresses, forget
        removed ones, and close relayed paths of nodes no longer listed, and re-feed the Creates the relay holds for
        senders the list did not hold (now accepted if it does)."""
        self.node.peers = {e.node_id: e for e in self.registry.entries if e.node_id != self.identity.node_id}
        self.relay.execute(self.relay.core.forget_unlisted())
        self.relay.release_held()  # Creates held for a list that holds their sender (issue 28 item 9)
        if self._paths_deferred and self._nursery is not None and self.paths is not None and self.registry.entries:
            self._paths_deferred = False
            self._nursery.start_soon(self.paths.run)

    async def _on_cell_back(self, conn: Connection, msg: CellBack) -> None:
        assert self.paths is not None
        path = self.paths.owns(conn.peer_id, msg.link_id)
        if path is not None:
            self.paths.on_cell_back(path, msg)
        else:
            await self.relay.handle(conn, msg)

    async def _on_destroy(self, conn: Connection, msg: Destroy) -> None:
        assert self.paths is not None
        path = self.paths.owns(conn.peer_id, msg.link_id)
        if path is not None:
            self.paths.on_destroy(path, msg)
        else:
            await self.relay.handle(conn, msg)

    async def serve(
        self, host: str = "127.0.0.1", port: int = 0, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
    ) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            address = await nursery.start(self.node.serve, host, port)
            await nursery.start(self.relay.run)
            if self.paths is not None:
                if self.registry.entries:
                    await nursery.start(self.paths.run)
                else:  # an empty directory (lists from the committee come later): start with them
                    self._paths_deferred = True
            task_status.started(address)

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "relay_paths": len(self.relay.core),
            "relay_forwarded": self.relay.core.forwarded,
            "relay_dropped": dict(self.relay.core.dropped),
            "relay_holds": dict(self.relay.core.holds),
            "node_rejected": dict(self.node.rejected),
        }
        if self.paths is not None:
            out["paths_ready"] = len(self.paths.ready_paths())
            out["paths_refused_builds"] = self.paths.refused_builds
            out["paths_refused"] = dict(self.paths.refused)
            out["paths_region_scope"] = self.paths.scope
        return out
