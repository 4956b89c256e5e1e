"""An in-memory GenTorrent network for integration tests: users, relays, an echo model node."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import trio

from model_node.echo import EchoEngine
from model_node.server import ModelNode
from overlay.identity import Identity
from overlay.peers import PeerEntry
from overlay.registry import Registry
from overlay.transport import MemoryNetwork, MemoryTransport
from overlay.usernode import UserNode


@dataclass
class Net:
    network: MemoryNetwork
    registry: Registry
    users: list[UserNode]
    model: ModelNode
    identities: dict[bytes, Identity] = field(default_factory=dict)
    scopes: dict[bytes, trio.CancelScope] = field(default_factory=dict)

    def kill(self, node_id: bytes) -> None:
        """Stop a node abruptly (its listener disappears, its connections close)."""
        self.scopes[node_id].cancel()


def make_registry(network: MemoryNetwork, n_users: int, model: str = "echo") -> tuple[Registry, list[Identity], Identity]:
    users = [Identity.generate() for _ in range(n_users)]
    model_ident = Identity.generate()
    entries = [PeerEntry.of(u, network.address(u.node_id.hex()[:12])) for u in users]
    entries.append(
        PeerEntry.of(model_ident, network.address(model_ident.node_id.hex()[:12]), role="model", models=(model,))
    )
    return Registry(1, entries), users, model_ident


async def start_net(nursery: trio.Nursery, n_users: int = 15, *, clients: int = 1, **user_kw: Any) -> Net:
    network = MemoryNetwork()
    registry, user_ids, model_id = make_registry(network, n_users)
    users = []
    net = Net(network, registry, users, None)  # type: ignore[arg-type]

    async def run_scoped(node_id: bytes, serve: Any, *, task_status: Any) -> None:
        with trio.CancelScope() as scope:
            net.scopes[node_id] = scope
            await serve(task_status=task_status)

    for i, ident in enumerate(user_ids):
        u = UserNode(ident, MemoryTransport(ident, network), registry, client=i < clients, **user_kw)
        users.append(u)
        await nursery.start(run_scoped, ident.node_id, u.serve)
    m = ModelNode(model_id, MemoryTransport(model_id, network), registry, EchoEngine(), "echo")
    await nursery.start(run_scoped, model_id.node_id, m.serve)
    net.model = m
    return net
