"""Audit challenges through the overlay's anonymous request API (verifier/auditor.py
``send_challenge``; overlay/anon.py ``failover=False``), in memory on trio's mock clock.

A challenge goes to ONE model node with no failover, comes back as the record a report needs
(every chunk's text and token ids, the final signature and signing time), or as the reason there
is none; and the model node receives nothing that tells it from a user's chat turn.
"""

from __future__ import annotations

import io
import random
from dataclasses import fields

import pytest
import trio

from model_node.testing import echo_node
from overlay import signing
from overlay.anon import AnonError
from overlay.messages import Request, SamplingParams
from overlay.testing import start_overlay
from user_client.chat import ChatSession
from verifier.auditor import Failure, Reply, send_challenge
from verifier.challenges import ChallengeGenerator


def _record(node) -> list[Request]:
    """Every request ``node``'s responder accepts, in order (what the model node sees)."""
    seen: list[Request] = []
    accept = node.responder.accept

    def spy(req: Request, handler=None) -> bool:
        seen.append(req)
        return accept(req, handler)

    node.responder.accept = spy
    return seen


def _chain_ok(reply: Reply, opening, key: bytes, node_id: bytes) -> bool:
    digest = signing.request_digest(opening.request(request_id=bytes(16)))
    chain = signing.chain_start(digest)
    for text, ids in reply.chunks:
        chain = signing.chain_next(chain, text, ids)
    signing.verify_reply(key, reply.signature, digest, chain, True, opening.model, node_id, reply.signed_at_ms)
    return True


async def test_a_challenge_reaches_only_the_given_node_and_returns_the_signed_record(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_overlay(nursery, 15, models=[echo_node(), echo_node()])
        a, b = net.models
        seen_a, seen_b = _record(a), _record(b)
        gen = ChallengeGenerator(rng=random.Random(5))
        for target, seen in ((a, seen_a), (b, seen_b)):
            opening = gen.opening("echo")
            reply = await send_challenge(net.client.client, target.identity.node_id, opening, timeout=30)
            assert isinstance(reply, Reply), reply
            assert "".join(t for t, _ in reply.chunks) == opening.messages[-1].content  # the echo engine
            assert reply.token_ids and reply.signature and reply.signed_at_ms > 0
            assert _chain_ok(reply, opening, net.entry(target.identity.node_id).ed25519_public,
                             target.identity.node_id)
            assert seen[-1].messages == opening.messages and seen[-1].params == opening.params
        assert (len(seen_a), len(seen_b)) == (1, 1)  # each challenge went to its node only
        nursery.cancel_scope.cancel()


async def test_no_failover_a_dead_node_is_reported_silent_and_never_replaced(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_overlay(nursery, 15, models=[echo_node(delay=1.0), echo_node()])
        a, b = net.models
        seen_b = _record(b)
        net.kill(a)
        await trio.sleep(0.5)
        opening = ChallengeGenerator(rng=random.Random(6)).opening("echo")
        got = await send_challenge(net.client.client, a.identity.node_id, opening, timeout=10)
        assert isinstance(got, Failure) and got.kind in ("silent", "lost"), got
        assert seen_b == []  # nothing went to the other node serving the model
        assert net.client.client.failovers == {}
        nursery.cancel_scope.cancel()


async def test_no_failover_to_a_node_not_listed_fails_at_once(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_overlay(nursery, 15, models=[echo_node()])
        with pytest.raises(AnonError, match="not listed as serving"):
            async for _ in net.client.client.request("echo", [], node=b"\x01" * 20, failover=False):
                pass
        opening = ChallengeGenerator(rng=random.Random(7)).opening("echo")
        got = await send_challenge(net.client.client, b"\x02" * 20, opening, timeout=10)
        assert isinstance(got, Failure) and got.kind == "other" and "not listed" in got.detail
        nursery.cancel_scope.cancel()


async def test_the_model_node_cannot_tell_a_challenge_from_a_users_chat_turn(autojump_clock):
    """A user's chat turn (``ChatSession``, the code ``gentorrent user chat`` runs) and a verifier's
    challenge reach the model node as the same message type, through the same number of proxies and
    cloves, with the same fields and field types, the same threshold and return-path shape; only the
    contents (prompt, parameters, ids, keys) differ, and those are drawn like users'."""
    async with trio.open_nursery() as nursery:
        net = await start_overlay(nursery, 16, clients=2, models=[echo_node()], capture=True)
        (m,) = net.models
        seen = _record(m)
        received = net.capture(m.identity.node_id)
        user, verifier = net.users[0].client, net.users[1].client
        session = ChatSession(user, "echo", SamplingParams(temperature=0.7, max_tokens=64), "You are a helpful assistant.")
        before = len(received.received_messages())
        await session.turn("What is a common misconception about honey bees?", io.StringIO(), 30)
        user_frames = received.received_messages()[before:]
        opening = ChallengeGenerator(rng=random.Random(8)).opening("echo")
        before = len(received.received_messages())
        got = await send_challenge(verifier, m.identity.node_id, opening, timeout=30)
        challenge_frames = received.received_messages()[before:]
        assert isinstance(got, Reply)
        u, c = seen
        assert type(u) is type(c) is Request
        for f in fields(Request):
            assert type(getattr(u, f.name)) is type(getattr(c, f.name)), f.name
        assert (u.model, u.k, len(u.return_paths), u.continuation) == (c.model, c.k, len(c.return_paths), "")
        assert {type(getattr(u.params, s)) for s in ("temperature", "top_p", "top_k", "max_tokens")} == \
            {type(getattr(c.params, s)) for s in ("temperature", "top_p", "top_k", "max_tokens")}
        assert [m.role for m in c.messages][-1] == "user" and len(c.messages) in (1, 2)
        # the same frames, in kind and number, reached the model node for both (n cloves via proxies)
        kinds = sorted(type(x).__name__ for x in user_frames if type(x).__name__ == "Deliver")
        assert kinds == sorted(type(x).__name__ for x in challenge_frames if type(x).__name__ == "Deliver")
        assert len(kinds) == net.users[0].client.n
        nursery.cancel_scope.cancel()
