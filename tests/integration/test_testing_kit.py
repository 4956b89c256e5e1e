"""The test kit itself (overlay.testing, model_node.testing): what the other integration
tests rely on — captures that see every byte, nodes that die when killed, a registry
fixed once nodes exist."""

from __future__ import annotations

from collections import Counter

import pytest
import trio

from model_node.testing import start_echo_overlay
from overlay.net.transport import TransportError
from overlay.testing import Net, frames_of
from overlay.wire.messages import ChatMessage, Echo, EchoReply, SamplingParams


async def test_captures_record_both_directions_of_every_connection(autojump_clock, nursery, net: Net):
    a_id, b_id = net.add_users(2)
    a = await net.start_node(nursery, a_id, capture=True)
    b = await net.start_node(nursery, b_id, capture=True)
    conn = await net.dial(b, a_id)  # a's identity dials b (a second connection, from a's transport)
    await conn.send(Echo(nonce=1, data=b"captured?"))
    assert await conn.receive() == EchoReply(nonce=1, data=b"captured?")
    await conn.aclose()
    assert await a.ping(net.entry(b_id.node_id)) >= 0
    ca, cb = net.capture(a_id.node_id), net.capture(b_id.node_id)
    # What one end sent is what the other received (the handshakes included; two connections,
    # so compare the messages, not their interleaving), and all of it decodes.
    def same(x: list[object], y: list[object]) -> bool:
        return Counter(map(repr, x)) == Counter(map(repr, y))

    assert len(cb.received_bytes()) == len(ca.sent_bytes()) and len(ca.received_bytes()) == len(cb.sent_bytes())
    assert same(cb.received_messages(), ca.sent_messages()) and same(ca.received_messages(), cb.sent_messages())
    assert {peer for peer, _ in ca.sent} == {b_id.node_id} and {peer for peer, _ in cb.sent} == {a_id.node_id}
    assert Echo(nonce=1, data=b"captured?") in cb.received_messages()
    assert EchoReply(nonce=1, data=b"captured?") in ca.received_messages()
    with pytest.raises(AssertionError, match="inside a frame"):
        frames_of([ca.sent[0][1][:-1]])


async def test_a_killed_node_stops_answering(autojump_clock, nursery, net: Net):
    node = await net.start_node(nursery)
    await (await net.dial(node)).aclose()
    net.kill(node)
    await trio.sleep(1)
    with pytest.raises(TransportError, match="refused"):
        await net.dial(node)


def test_the_registry_is_fixed_once_built():
    net = Net()
    net.add_users(2)
    assert len(net.registry.users()) == 2
    with pytest.raises(RuntimeError, match="add every identity before"):
        net.add("late")


async def test_an_echo_overlay_answers_through_its_model_nodes(autojump_clock, nursery):
    net = await start_echo_overlay(nursery, 15, models=2, clients=2)
    assert [u.client is not None for u in net.users] == [True, True] + [False] * 13
    assert len(net.registry.models("echo")) == 2 and net.client is net.users[0]
    for u in net.users[:2]:
        assert u.client is not None
        chunks = [c async for c in u.client.request("echo", [ChatMessage("user", "hi there")],
                                                    SamplingParams(max_tokens=16))]
        assert "".join(c.text for c in chunks) == "hi there"
    assert sum(m.served for m in net.models) == 2
