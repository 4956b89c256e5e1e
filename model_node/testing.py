"""Model nodes for the in-memory test network of :mod:`overlay.testing`.

:func:`echo_node` is the factory :func:`overlay.testing.start_overlay` (and
:meth:`overlay.testing.Net.model_node`) take for a :class:`~model_node.server.ModelNode`
running the echo engine; :class:`CachingEcho` is an echo engine that remembers the
prompts it served, so it reports cached prefixes as llama.cpp does (the forwarding
tests need it); :class:`FakeIssuers` answers a node's usage-quota RPCs (issue 31) and mints
tokens; :func:`start_echo_overlay` and :func:`start_group` build whole networks::

    net = await start_echo_overlay(nursery, 15, models=2)   # 15 users, 2 echo model nodes
    async for chunk in net.client.client.request("echo", messages, params): ...

Every node runs on trio's clock: run tests under ``autojump_clock``.
"""

from __future__ import annotations

import base64
import dataclasses
import os
from collections import Counter, OrderedDict
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import trio
from voprf import ristretto

from model_node.echo import EchoEngine, EchoGeneration
from model_node.engine import Engine, Piece
from model_node.group import GroupConfig
from model_node.hrtree import common_prefix
from model_node.messages import NodeStats, StatsRequest
from model_node.server import ModelNode
from overlay.directory import quota
from overlay.directory.quota import QuotaParams
from overlay.directory.registration import Code
from overlay.directory.registry import Registry
from overlay.net.transport import Transport
from overlay.testing import Net, NodeFactory, start_overlay
from overlay.wire import crypto
from overlay.wire.clock import Clock, TrioClock
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


class FakeIssuers:
    """``n`` verifiers issuing usage-quota tokens (issue 31), as a model node's
    :class:`~model_node.quota.Redeemer` meets them: :meth:`rpc` answers its ``abci_query`` calls
    (key records and redemptions) at :attr:`addresses`, with one spent set per issuer shared by
    every node that asks, as the real issuers keep it. :meth:`token` mints a token of either class
    directly with the issuers' VOPRF keys (one per class, as the real issuers' key records carry
    them; no blinding: a test needs the token, not the issuance). As
    ``verifier/quota.py``, key records are given for the epochs around the current one only
    (``WRONG_EPOCH`` otherwise). Knobs:
    ``down`` (addresses that raise ``OSError``), ``off`` (addresses answering ``QUOTA_OFF``),
    ``delay`` (seconds each answer takes). :attr:`calls` counts the queries by (address, path)."""

    def __init__(self, n: int = 3, *, chain_id: str = "quota-test", params: QuotaParams | None = None,
                 clock: Clock | None = None) -> None:
        self.chain_id = chain_id
        self.params = params or QuotaParams()
        self.clock: Clock = clock or TrioClock()
        self.keys = [crypto.SigningKey.generate() for _ in range(n)]
        self.seeds = [os.urandom(32) for _ in range(n)]
        self.addresses = [f"10.0.0.{i + 1}:26657" for i in range(n)]
        self.spent: list[set[tuple[str, int, bytes]]] = [set() for _ in range(n)]
        self.calls: Counter[tuple[str, str]] = Counter()
        self.down: set[str] = set()
        self.off: set[str] = set()
        self.delay = 0.0

    @property
    def issuers(self) -> list[bytes]:
        """The issuers' keys (their validator keys), in the order of :attr:`addresses`."""
        return [k.public_bytes for k in self.keys]

    def epoch(self) -> int:
        return self.params.epoch_at(self.clock.unix())

    def token(self, model: str = "echo", *, epoch: int | None = None, issuers: Sequence[int] | None = None,
              nonce: bytes | None = None, priority: bool = False) -> bytes:
        """A good token of ``model`` for ``epoch`` (default: now) from the ``issuers`` (indices;
        default: the first ``params.issuers``), of the priority class or (default) standard."""
        epoch = self.epoch() if epoch is None else epoch
        nonce = nonce or os.urandom(quota.NONCE_LEN)
        which = range(self.params.issuers) if issuers is None else issuers
        evaluations = tuple((self.keys[i].public_bytes, self._evaluator(i, model, epoch, priority).evaluate_known_input(
            quota.token_input(nonce))) for i in which)
        return quota.encode_token(quota.Token(model, epoch, nonce, evaluations, priority))

    def spent_by_all(self, raw: bytes) -> bool:
        """Whether every issuer of the token ``raw`` holds it as spent."""
        t = quota.decode_token(raw)
        return all((t.model, t.epoch, t.nonce) in self.spent[self.issuers.index(i)] for i, _ in t.evaluations)

    def _evaluator(self, i: int, model: str, epoch: int, priority: bool = False) -> ristretto.Evaluator:
        return quota.evaluator(self.seeds[i], self.chain_id, model, epoch, priority)

    async def rpc(self, address: str, method: str, params: dict[str, str]) -> Any:
        """An :data:`overlay.directory.rpc.Rpc`: the ``abci_query`` answers of the verifier at ``address``."""
        path = params["path"].strip('"')
        self.calls[address, path] += 1
        if self.delay:
            await trio.sleep(self.delay)
        if address in self.down or address not in self.addresses:
            raise ConnectionRefusedError(f"{address} is down")
        data = bytes.fromhex(params["data"][2:]) if "data" in params else b""
        code, value = self._answer(self.addresses.index(address), path, data)
        return {"response": {"code": int(code), "log": code.name.lower(), "value": base64.b64encode(value).decode()}}

    def _answer(self, i: int, path: str, data: bytes) -> tuple[Code, bytes]:
        if self.addresses[i] in self.off:
            return Code.QUOTA_OFF, b""
        if path == quota.KEY_PATH:
            model, epoch = quota.decode_key_query(data)
            code = Code.OK
            if abs(epoch - self.epoch()) > 1:  # as verifier/quota.py: the epochs around the current one only,
                code, epoch = Code.WRONG_EPOCH, self.epoch()  # else the current one's record
            key, top = (self._evaluator(i, model, epoch, p).public_key.serialize() for p in (False, True))
            rec = quota.KeyRecord(self.keys[i].public_bytes, model, epoch, key, top, self.params)
            return code, quota.encode_key_record(self.keys[i], self.chain_id, rec)
        if path != quota.REDEEM_PATH:
            return Code.MALFORMED, b""
        try:
            r = quota.decode_redeem(data)
        except quota.QuotaError:
            return Code.MALFORMED, b""
        good = self._evaluator(i, r.model, r.epoch, r.priority).evaluate_known_input(quota.token_input(r.nonce)) == r.output
        if not good or not self.params.redeemable(r.epoch, self.clock.unix()):
            return Code.BAD_TOKEN, b""
        if (r.model, r.epoch, r.nonce) in self.spent[i]:
            return Code.SPENT, b""
        self.spent[i].add((r.model, r.epoch, r.nonce))
        return Code.OK, b""


async def node_stats(conn: Any) -> NodeStats:
    """A model node's :class:`~model_node.messages.NodeStats` over ``conn`` (an authenticated
    connection from a node its registry lists): asks with a fresh nonce and reads until that
    answer comes (bound the wait with a cancel scope)."""
    nonce = int.from_bytes(os.urandom(4), "big")
    await conn.send(StatsRequest(nonce))
    while True:
        msg = await conn.receive()
        if isinstance(msg, NodeStats) and msg.nonce == nonce:
            return msg
