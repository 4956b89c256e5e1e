"""Audit challenges through the overlay's anonymous request API (verifier/audit/auditor.py
``send_challenge``; overlay/anon/client.py ``failover=False``, ``fresh_paths=True``), in memory on trio's
mock clock.

A challenge goes to ONE model node with no failover, over proxy paths built for it alone
(overlay/anon/paths.py ``PathManager.build_fresh``) and closed after it, and comes back as the record a
report needs (every chunk's text and token ids, the final signature and signing time, the signer),
or as the reason there is none; and the model node receives nothing that tells it from a user's
chat turn, nor a proxy path that links two challenges.
"""

from __future__ import annotations

import io
import random
from dataclasses import fields

import pytest
import trio

from model_node.testing import echo_node
from overlay.anon import signing
from overlay.anon.client import AnonClient, AnonError
from overlay.anon.paths import PathManager
from overlay.testing import Net, record_requests, settle, start_overlay
from overlay.usernode import UserNode
from overlay.wire.identity import short_id
from overlay.wire.messages import ChatMessage, Create, Destroy, ReplyChunk, Request, SamplingParams
from user_client.chat import ChatSession
from verifier.audit.auditor import Failure, Reply
from verifier.audit.challenges import ChallengeGenerator
from verifier.audit.loop import send_challenge


def anon(user: UserNode) -> AnonClient:
    """``user``'s anonymous client (a user node started by the test kit has one)."""
    assert user.client is not None
    return user.client


def _chain_ok(reply: Reply, opening, key: bytes, node_id: bytes) -> bool:
    digest = opening.reply_digest(node_id, 1)  # the first try's request id (Opening.request_id)
    chain = signing.chain_start(digest)
    for text, ids in reply.chunks:
        chain = signing.chain_next(chain, text, ids)
    signing.verify_reply(key, reply.signature, digest, chain, True, opening.model, node_id, reply.signed_at_ms)
    return True


async def test_a_challenge_reaches_only_the_given_node_and_returns_the_signed_record(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_overlay(nursery, 15, models=[echo_node(), echo_node()])
        a, b = net.models
        seen_a, seen_b = record_requests(a), record_requests(b)
        gen = ChallengeGenerator(rng=random.Random(5))
        for target, seen in ((a, seen_a), (b, seen_b)):
            opening = gen.opening("echo")
            reply = await send_challenge(anon(net.client), target.identity.node_id, opening, chunk_timeout=30)
            assert isinstance(reply, Reply), reply
            assert "".join(t for t, _ in reply.chunks) == opening.messages[-1].content  # the echo engine
            assert reply.token_ids and reply.signature and reply.signed_at_ms > 0
            assert reply.served_by == target.identity.node_id
            assert _chain_ok(reply, opening, net.entry(target.identity.node_id).ed25519_public,
                             target.identity.node_id)
            assert seen[-1].messages == opening.messages and seen[-1].params == opening.params
        assert (len(seen_a), len(seen_b)) == (1, 1)  # each challenge went to its node only
        nursery.cancel_scope.cancel()


async def test_no_failover_a_dead_node_is_reported_silent_and_never_replaced(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_overlay(nursery, 15, models=[echo_node(delay=1.0), echo_node()])
        a, b = net.models
        seen_b = record_requests(b)
        net.kill(a)
        await trio.sleep(0.5)
        opening = ChallengeGenerator(rng=random.Random(6)).opening("echo")
        got = await send_challenge(anon(net.client), a.identity.node_id, opening, chunk_timeout=10)
        assert isinstance(got, Failure) and got.kind in ("silent", "lost"), got
        assert seen_b == []  # nothing went to the other node serving the model
        assert anon(net.client).failovers == {}
        nursery.cancel_scope.cancel()


async def test_no_failover_to_a_node_not_listed_fails_at_once(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_overlay(nursery, 15, models=[echo_node()])
        with pytest.raises(AnonError, match="not listed as serving"):
            async for _ in anon(net.client).request("echo", [], node=b"\x01" * 20, failover=False):
                pass
        opening = ChallengeGenerator(rng=random.Random(7)).opening("echo")
        got = await send_challenge(anon(net.client), b"\x02" * 20, opening, chunk_timeout=10)
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
        seen = record_requests(m)
        received = net.capture(m.identity.node_id)
        user, verifier = anon(net.users[0]), anon(net.users[1])
        session = ChatSession(user, "echo", SamplingParams(temperature=0.7, max_tokens=64), "You are a helpful assistant.")
        before = len(received.received_messages())
        await session.turn("What is a common misconception about honey bees?", io.StringIO(), 30)
        user_frames = received.received_messages()[before:]
        opening = ChallengeGenerator(rng=random.Random(8)).opening("echo")
        before = len(received.received_messages())
        got = await send_challenge(verifier, m.identity.node_id, opening, chunk_timeout=30)
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
        assert len(kinds) == anon(net.users[0]).n
        nursery.cancel_scope.cancel()


async def test_every_challenge_goes_over_paths_no_other_request_used_and_they_are_closed_after(autojump_clock):
    """The model node sees the proxies that deliver a request's cloves and the return paths it
    answers on: reused paths would let it link two challenges (and, once a report reveals one,
    label those proxies as a verifier's). Each challenge gets n paths of its own."""
    async with trio.open_nursery() as nursery:
        net = await start_overlay(nursery, 15, models=[echo_node()])
        (m,) = net.models
        seen = record_requests(m)
        client = anon(net.client)
        paths = net.client.paths
        assert paths is not None
        with trio.fail_after(30):
            kept = set(map(id, await paths.wait_ready(client.n)))
        gen = ChallengeGenerator(rng=random.Random(9))
        for _ in range(3):
            got = await send_challenge(client, m.identity.node_id, gen.opening("echo"), chunk_timeout=30)
            assert isinstance(got, Reply), got
            assert paths.one_off == []  # closed once the challenge is over
        async for _ in client.request("echo", [ChatMessage("user", "a user's request")]):  # the kept paths
            pass
        returns = [{(rp.proxy, rp.proxy_path_id) for rp in req.return_paths} for req in seen]
        assert len(returns) == 4 and all(len(r) == client.n for r in returns)
        for i in range(4):
            for j in range(i + 1, 4):
                assert not returns[i] & returns[j], (i, j)  # no path shared by two requests
        assert set(map(id, paths.ready_paths())) == kept  # the kept paths were neither used up nor replaced
        assert paths.built >= client.n + 3 * client.n
        await settle()
        for r in returns[:3]:  # the proxies closed the challenges' paths
            for proxy, proxy_path_id in r:
                assert proxy_path_id not in net.user(proxy).relay.core.by_proxy_path, short_id(proxy)
        nursery.cancel_scope.cancel()


async def test_a_challenge_whose_paths_cannot_be_built_fails_as_other(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_overlay(nursery, 10, models=[echo_node()])  # 9 relays: 4 paths of 3 need 12
        (m,) = net.models
        opening = ChallengeGenerator(rng=random.Random(10)).opening("echo")
        got = await send_challenge(anon(net.client), m.identity.node_id, opening, chunk_timeout=10, paths_timeout=20)
        assert isinstance(got, Failure) and got.kind == "other" and "relays" in got.detail, got
        assert net.client.paths is not None and net.client.paths.one_off == []  # what was built is closed
        nursery.cancel_scope.cancel()


async def test_fresh_paths_that_never_come_up_are_rebuilt_elsewhere_then_given_up(autojump_clock):
    """``PathManager.build_fresh`` on its own: a build with no PathReady within ``build_timeout`` is
    replaced on other relays until the caller's deadline; then every path it began is closed."""
    net = Net()
    net.add_users(15)
    me = net.identities["user-0"].node_id
    sent: list[object] = []

    class Mute:  # a node whose relays never answer
        node_id = me

        def send_nowait(self, peer: bytes, msg: object) -> bool:
            sent.append(msg)
            return True

    pm = PathManager(Mute(), lambda: net.registry.users("default"), build_timeout=5.0)
    with trio.move_on_after(22.0) as deadline:
        await pm.build_fresh(4)
    assert deadline.cancelled_caught  # never built
    creates = [m for m in sent if isinstance(m, Create)]
    destroys = [m for m in sent if isinstance(m, Destroy)]
    assert len(creates) == 4 * 5  # at 0, 5, 10, 15 and 20 s
    assert {d.link_id for d in destroys} == {c.link_id for c in creates}  # each one closed
    assert pm.one_off == [] and pm.paths == [] and pm.by_link == {}


async def test_a_model_node_answers_a_request_id_once(autojump_clock):
    """Decision 0015: a framer resending a committed request (same id, so the same signed digest)
    to draw many honest samples gets one answer and then a final refusal."""
    async with trio.open_nursery() as nursery:
        net = await start_overlay(nursery, 15, models=[echo_node()])
        (m,) = net.models
        rid = b"\x07" * 16
        msgs = [ChatMessage("user", "the same committed request")]

        async def send() -> list[ReplyChunk]:
            return [c async for c in anon(net.client).request("echo", msgs, node=m.identity.node_id,
                                                               failover=False, request_id=rid)]

        first = await send()
        assert first[-1].done and not first[-1].error
        with pytest.raises(AnonError):  # dropped unanswered: the client waits in vain
            await send()
        fresh = [c async for c in anon(net.client).request("echo", msgs, node=m.identity.node_id, failover=False)]
        assert fresh[-1].done and not fresh[-1].error  # another id: answered
        assert m.responder.answered.refused == 1 and m.responder.dropped["request-duplicate"] == 1
        nursery.cancel_scope.cancel()


async def test_a_scripts_turns_go_over_one_held_path_set_and_verify_as_the_chain_checks_them(autojump_clock):
    """Decision 0025: turn after turn of one challenge script goes over the same n paths (as a
    user's conversation goes over its paths), with the node's own earlier replies in place; every
    reply verifies as the chain checks a report entry (real signatures), and the paths are closed
    once released."""
    from verifier.audit import tx as at
    from verifier.audit.tx import reply_outcome, reply_text

    async with trio.open_nursery() as nursery:
        net = await start_overlay(nursery, 15, models=[echo_node()])
        (m,) = net.models
        seen = record_requests(m)
        client = anon(net.client)
        base = ChallengeGenerator(rng=random.Random(12)).opening("echo")
        script = at.Opening(base.salt, "echo", (*base.messages, ChatMessage("user", "And why is that so?")),
                            base.params)
        script.check_script()
        held = await client.hold_paths(30)
        replies: list[at.ReplyOutcome] = []
        for turn in range(script.turns()):
            got = await send_challenge(client, m.identity.node_id, script, chunk_timeout=30, turn=turn,
                                       history=[reply_text(r) for r in replies], held_paths=held)
            assert isinstance(got, Reply), got
            replies.append(reply_outcome(got.served_by, got.chunks, got.signature, got.signed_at_ms, 1.0))
        first, second = seen
        assert {(rp.proxy, rp.proxy_path_id) for rp in first.return_paths} == \
            {(rp.proxy, rp.proxy_path_id) for rp in second.return_paths}  # one path set
        assert second.messages[-2] == ChatMessage("assistant", reply_text(replies[0]))  # its own reply in place
        entry = at.ReportEntry(m.identity.node_id, script, replies[1], (replies[0],))
        for turn in (0, 1):
            entry.verify(m.identity.ed25519_public, turn)
        assert net.client.paths is not None and net.client.paths.one_off
        with pytest.raises(ValueError, match="exclude"):
            async for _ in client.request("echo", [ChatMessage("user", "q")], fresh_paths=True, held_paths=held):
                pass
        client.release_paths(held)
        assert net.client.paths.one_off == []
        with pytest.raises(AnonError, match="held paths"):
            async for _ in client.request("echo", [ChatMessage("user", "q")], node=m.identity.node_id,
                                          failover=False, held_paths=held):
                pass
        nursery.cancel_scope.cancel()
