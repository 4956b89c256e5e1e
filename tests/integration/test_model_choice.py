"""Model choice over the whole in-memory overlay (decision 0013 item 6), on trio's mock clock: a
user's prompts reach only trusted nodes of audited models, an unaudited model needs the opt-in,
and a verifier's ``failover=False`` challenge still reaches an untrusted, unaudited node (audits
must reach every listed node, so an honest node knocked under the line can come back)."""

from __future__ import annotations

import dataclasses

import pytest
import trio

from model_node.testing import echo_node
from overlay.anon.client import ModelUnaudited
from overlay.directory.registry import Registry
from overlay.testing import Net, record_requests, start_overlay
from overlay.wire.constants import TRUST_LINE
from overlay.wire.messages import ChatMessage


def _mark(net: Net, marks: dict[bytes, tuple[int, bool]]) -> None:
    """The committee's list as if it had marked these nodes ``(reputation, audited)``."""
    reg = net.registry
    reg.replace(Registry(reg.version + 1, [dataclasses.replace(e, reputation=marks[e.node_id][0],
                                                               audited=marks[e.node_id][1])
                                           if e.node_id in marks else e for e in reg.entries]))


async def _ask(client, text: str, **kw) -> bytes:
    node = b""
    async for c in client.request("echo", [ChatMessage("user", text)], node=kw.pop("node", None), chunk_timeout=30, **kw):
        node = c.node
    return node


async def test_users_reach_only_trusted_audited_nodes_and_audits_reach_every_node(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_overlay(nursery, 15, models=[echo_node(), echo_node()])
        good, low = net.models
        seen_good, seen_low = record_requests(good), record_requests(low)
        _mark(net, {good.identity.node_id: (900_000, True), low.identity.node_id: (TRUST_LINE - 1, True)})
        client = net.client.client
        assert client is not None
        served = {await _ask(client, f"question {i}") for i in range(6)}
        assert served == {good.identity.node_id} and seen_low == [] and len(seen_good) == 6
        # A user's affinity to the untrusted node is not followed either.
        assert await _ask(client, "again", node=low.identity.node_id) == good.identity.node_id
        # A verifier's challenge to the untrusted node (failover=False, an explicit target) reaches it.
        assert await _ask(client, "challenge", node=low.identity.node_id, failover=False) == low.identity.node_id
        assert [r.messages[-1].content for r in seen_low] == ["challenge"]
        nursery.cancel_scope.cancel()


async def test_an_unaudited_model_needs_the_opt_in_and_audits_reach_it_without(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_overlay(nursery, 15, models=[echo_node()])
        (m,) = net.models
        seen = record_requests(m)
        _mark(net, {m.identity.node_id: (600_000, False)})
        client = net.client.client
        assert client is not None
        with pytest.raises(ModelUnaudited, match="pass --allow-unaudited to use it anyway"):
            await _ask(client, "hello")
        assert seen == []  # nothing was sent
        assert await _ask(client, "challenge", node=m.identity.node_id, failover=False) == m.identity.node_id
        client.allow_unaudited = True
        assert await _ask(client, "hello") == m.identity.node_id
        assert [r.messages[-1].content for r in seen] == ["challenge", "hello"]
        nursery.cancel_scope.cancel()
