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
    models: list[ModelNode] = field(default_factory=list)

    def kill(self, node_id: bytes) -> None:
        """Stop a node abruptly (its listener disappears, its connections close)."""
        self.scopes[node_id].cancel()


def make_registry(network: MemoryNetwork, n_users: int, model: str = "echo",
                  n_models: int = 1) -> tuple[Registry, list[Identity], list[Identity]]:
    users = [Identity.generate() for _ in range(n_users)]
    model_idents = [Identity.generate() for _ in range(n_models)]
    entries = [PeerEntry.of(u, network.address(u.node_id.hex()[:12])) for u in users]
    for m in model_idents:
        entries.append(PeerEntry.of(m, network.address(m.node_id.hex()[:12]), role="model", models=(model,)))
    return Registry(1, entries), users, model_idents


async def start_net(nursery: trio.Nursery, n_users: int = 15, *, clients: int = 1, models: int = 1,
                    echo_delay: float = 0.0, **user_kw: Any) -> Net:
    network = MemoryNetwork()
    registry, user_ids, model_ids = make_registry(network, n_users, n_models=models)
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
    for model_id in model_ids:
        m = ModelNode(model_id, MemoryTransport(model_id, network), registry, EchoEngine(delay=echo_delay))
        await nursery.start(run_scoped, model_id.node_id, m.serve)
        net.models.append(m)
    net.model = net.models[0]
    return net
