"""Model nodes for the in-memory test network of :mod:`overlay.testing`.

:func:`echo_node` is the factory :func:`overlay.testing.start_overlay` (and
:meth:`overlay.testing.Net.model_node`) take for a :class:`~model_node.server.ModelNode`
running the echo engine; :class:`CachingEcho` is an echo engine that remembers the
prompts it served, so it reports cached prefixes as llama.cpp does (the forwarding
tests need it); :func:`start_echo_overlay` and :func:`start_group` build whole networks::

    net = await start_echo_overlay(nursery, 15, models=2)   # 15 users, 2 echo model nodes
    async for chunk in net.client.client.request("echo", messages, params): ...

Every node runs on trio's clock: run tests under ``autojump_clock``.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import trio

from model_node.echo import EchoEngine, EchoGeneration
from model_node.engine import Engine, Piece
from model_node.group import GroupConfig
from model_node.hrtree import common_prefix
from model_node.server import ModelNode
from overlay.directory.registry import Registry
from overlay.net.transport import Transport
from overlay.testing import Net, NodeFactory, start_overlay
from overlay.wire.identity import Identity
from overlay.wire.messages import SamplingParams

GROUP_SYNC = 1.0  # seconds between a test group's sync rounds (expiry after 3 silent rounds)
GROUP_THRESHOLD = 2.0  # a test group's load threshold: seconds of work (at the rates a node measured)


def echo_node(*, delay: float = 0.0, engine: Engine | None = None, **model_kw: Any) -> NodeFactory:
    """A factory for a :class:`ModelNode` serving ``engine`` (default: a fresh
    :class:`EchoEngine` with ``delay`` seconds between pieces); ``model_kw`` go to
    :class:`ModelNode` (``group``, ``slots``, ``accept_direct_requests``, ...)."""

    def build(identity: Identity, transport: Transport, registry: Registry) -> ModelNode:
        return ModelNode(identity, transport, registry, engine or EchoEngine(delay=delay), **model_kw)

    return build


class _Evaluated(EchoGeneration):
    """An echo generation whose stats count only the prompt tokens not already cached."""

    def __init__(self, inner: EchoGeneration, evaluated: int) -> None:
        super().__init__(inner.engine, inner.prompt, inner.n_prompt, inner.params)
        self.evaluated = evaluated

    async def __aiter__(self) -> AsyncGenerator[Piece, None]:
        async for piece in super().__aiter__():
            yield piece
        assert self.stats is not None
        self.stats = dataclasses.replace(self.stats, evaluated_prompt_tokens=self.evaluated)


class CachingEcho(EchoEngine):
    """The echo engine with a prefix memory: the last ``keep`` prompts count as cached
    (reported by ``cached_prefixes`` and subtracted from ``evaluated_prompt_tokens``)."""

    def __init__(self, delay: float = 0.0, keep: int = 4) -> None:
        super().__init__("echo", delay)
        self.keep = keep
        self.memory: OrderedDict[tuple[int, ...], None] = OrderedDict()

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> _Evaluated:
        gen = super().generate(prompt_ids, params)
        reused = min(max((common_prefix(p, prompt_ids) for p in self.memory), default=0), len(prompt_ids) - 1)
        key = tuple(prompt_ids)
        self.memory[key] = None
        self.memory.move_to_end(key)
        while len(self.memory) > self.keep:
            self.memory.popitem(last=False)
        return _Evaluated(gen, len(prompt_ids) - reused)

    def cached_prefixes(self) -> list[tuple[int, ...]]:
        return list(self.memory)


async def start_echo_overlay(nursery: trio.Nursery, n_users: int = 15, *, models: int = 1,
                             echo_delay: float = 0.0, **overlay_kw: Any) -> Net:
    """:func:`~overlay.testing.start_overlay` with ``models`` echo model nodes (``echo_delay``
    seconds between pieces); ``overlay_kw``: ``clients``, ``regions``, ``capture``, ... and
    :class:`~overlay.usernode.UserNode` keywords."""
    return await start_overlay(nursery, n_users, models=[echo_node(delay=echo_delay)] * models, **overlay_kw)


async def start_group(nursery: trio.Nursery, *, n_users: int = 16, delays: Sequence[float] = (0.0, 0.0, 0.0),
                      sync: float = GROUP_SYNC, threshold: float = GROUP_THRESHOLD, forwarding: bool = True,
                      clients: int = 2, net: Net | None = None, **model_kw: Any) -> Net:
    """Model nodes ``model-0`` ... of "echo" forwarding as one group (paper §3.3), one per
    entry of ``delays`` (each a :class:`CachingEcho` with that delay), with ``n_users``
    users (``clients`` of them send requests). Two registered identities run no node:
    ``rogue-member`` (a model node of "echo": a group member to impersonate) and
    ``other-model`` (a model node of another model). ``forwarding=False`` runs the
    nodes without a group; ``net``: a fresh :class:`Net` to use (set up beforehand, e.g. its
    network's delays); ``model_kw`` go to every :class:`ModelNode`."""
    net = net or Net()
    net.add("rogue-member", role="model", models=("echo",))
    net.add("other-model", role="model", models=("other",))
    group = GroupConfig(sync_interval=sync, load_threshold=threshold) if forwarding else None
    factories = [echo_node(engine=CachingEcho(delay), group=group, **model_kw) for delay in delays]
    return await start_overlay(nursery, n_users, clients=clients, models=factories, net=net)
