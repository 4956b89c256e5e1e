"""Forwarding among model nodes through the driver (paper §3.3), in memory with a mock clock.

Three model nodes (A, B, C) run ``ModelNode(group=GroupConfig(...))`` with an echo engine that
remembers the prompts it served (so it reports cached prefixes, as llama.cpp does); users reach
them through the in-memory overlay (:func:`model_node.testing.start_group`). The group's sync rounds, expiry and forwarding run on
trio's clock (``autojump_clock``), the messages on the in-memory transport.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import pytest
import trio

from model_node.bench.policies import baseline
from model_node.hrtree import ChunkLengths
from model_node.messages import ForwardedRequest, LoadReport, NodeStats, StatsRequest, SubtreeUpdate
from model_node.server import DIRECT_REFUSED, ModelNode
from model_node.testing import GROUP_SYNC, start_group
from overlay.anon.signing import ReplyChecker, request_digest
from overlay.testing import Net, wait_until
from overlay.wire.identity import Identity
from overlay.wire.messages import ChatMessage, ReplyChunk, Request, SamplingParams

SYNC = GROUP_SYNC  # seconds between sync rounds (expiry after 3 silent rounds)
PARAMS = SamplingParams(max_tokens=64)
# ~750 bytes (the echo engine's tokens are bytes): 2 whole 256-token chunks = τ_c at b = 8.
SYSTEM = "You answer questions about the city archive. " + " ".join(
    f"Box {i} holds the letters of year {1900 + i}." for i in range(22))
OTHER_SYSTEM = "You are a terse poet who writes only about the sea and its weather. " * 12


def nid(m: ModelNode) -> bytes:
    return m.identity.node_id


def chat(question: str, system: str = SYSTEM) -> list[ChatMessage]:
    return [ChatMessage("system", system), ChatMessage("user", question)]


async def ask(client: Any, question: str, node: ModelNode | None = None, system: str = SYSTEM,
              **kw: Any) -> list[ReplyChunk]:
    """A request through the overlay; the client verifies the last chunk's signature."""
    return [c async for c in client.request("echo", chat(question, system), PARAMS,
                                            node=nid(node) if node else None, **kw)]


async def cache_on(net: Net, node: ModelNode, system: str = SYSTEM) -> None:
    """Have ``node`` serve (and so cache) ``system``, then let a sync round carry it."""
    chunks = await ask(net.users[0].client, "first question", node, system)
    assert chunks[-1].node == nid(node) and not chunks[-1].error
    await trio.sleep(2.5 * SYNC)  # off the round boundaries: the next round reports it
    for m in net.models:
        if m is not node:
            assert m.group is not None and m.group.state.tree.path_count(nid(node)) >= 1


async def test_a_request_cached_on_b_arriving_at_a_is_served_by_b(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_group(nursery)
        a, b, c = net.models
        client = net.users[0].client
        await cache_on(net, b)
        question = "where are the letters of 1907?"
        chunks = await ask(client, question, a)  # verified against B's registry key by the client
        assert chunks[-1].node == nid(b) and all(ch.node == nid(b) for ch in chunks)
        assert "".join(ch.text for ch in chunks) == question
        assert (a.forwarded_out, b.forwarded_in, a.served, b.served, c.served) == (1, 1, 0, 2, 0)
        assert a.decisions["match"] == 1 and b.decisions["forwarded"] == 1
        last = b.recent[-1]
        assert last.forwarded and last.evaluated_prompt_tokens < len(question) + 40 < last.prompt_tokens
        # Session affinity: the follow-up goes to B itself, no forward.
        more = await ask(client, "and of 1908?", b)
        assert more[-1].node == nid(b) and a.forwarded_out == 1 and b.forwarded_in == 1
        # A prompt nobody holds is served where it lands (all idle: ties go to the entry node).
        miss = await ask(client, "a wave", a, OTHER_SYSTEM)
        assert miss[-1].node == nid(a) and a.decisions["miss"] == 1
        nursery.cancel_scope.cancel()


async def test_a_holder_farther_away_than_the_prefill_it_saves_is_not_forwarded_to(autojump_clock):
    """A forward costs the round trip to the peer (issue 29: at wide-area delays every entry sent
    the testbed's requests to the one holder, across oceans, to save an echo engine's nothing).
    B holds the prompt; at capacity 10 (400 prompt tokens a second, no rate measured yet) the
    ~500 tokens B need not evaluate take ~1.3 s here. Once every model node is behind a 1 s
    link each way (a 2 s round trip between two of them, which the driver measures by pinging
    its members) A serves the request itself; once the links are fast again, the next pings say
    so and A forwards to B."""
    net = Net()
    far = {"delay": 0.0}
    models = {f"model-{i}" for i in range(3)}
    net.network.delay = lambda address: far["delay"] if address in {
        net.address_of(ident) for name, ident in net.identities.items() if name in models} else 0.0
    async with trio.open_nursery() as nursery:
        await start_group(nursery, capacity=10, net=net)
        a, b, _ = net.models
        assert a.group is not None
        client = net.users[0].client
        await cache_on(net, b)
        assert a.group.state.hops()[nid(b)] < 0.1 and a.group.pings > 0
        far["delay"] = 1.0
        # the round trips from before the change leave the window (one ping in flight per member)
        with trio.fail_after(60):  # the slow round trip
            await wait_until(lambda: a.group.state.hops()[nid(b)] >= 2.0)
        chunks = await ask(client, "where are the letters of 1907?", a)
        assert chunks[-1].node == nid(a) and not chunks[-1].error
        assert a.forwarded_out == 0 and a.decisions["match-overloaded"] == 1
        far["delay"] = 0.0
        with trio.fail_after(60):  # a fast round trip
            await wait_until(lambda: a.group.state.hops()[nid(b)] < 0.1)
        chunks = await ask(client, "and those of 1908?", a)
        assert chunks[-1].node == nid(b) and a.forwarded_out == 1 and a.decisions["match"] == 1
        nursery.cancel_scope.cancel()


async def test_match_wait_reaches_the_node_table_and_the_peers(autojump_clock):
    """A node's ``match_wait`` (what its admission would give a mostly cached prompt) is in its
    own row of the table and in the load reports its peers receive (decision 0009, third
    revision): Algorithm 2 compares it for a prefix's holders."""
    async with trio.open_nursery() as nursery:
        net = await start_group(nursery)
        a, b, _c = net.models
        await cache_on(net, b)
        assert a.group is not None and b.group is not None
        b.group.refresh_load()
        assert b.group.state.local.match_wait == pytest.approx(b.current_load().match_wait) and \
            b.current_load().match_wait >= 0
        await trio.sleep(2 * SYNC)
        seen = a.group.state.table()[nid(b)]
        assert seen.match_wait >= 0 and seen.cached_wait == pytest.approx(seen.match_wait, abs=1e-3)
        nursery.cancel_scope.cancel()


async def test_an_overloaded_b_is_bypassed(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_group(nursery, delays=(0.0, 1.0, 0.0), threshold=0.5)
        a, b, _c = net.models
        await cache_on(net, b)
        # A slow request under the same system prompt keeps B busy for 30 s: at the rates B
        # measured on its first request (a 14-token reply, one word a second), about a
        # second of work while it runs, over the threshold of 0.5 s.
        busy = " ".join(f"w{i}" for i in range(30))
        nursery.start_soon(ask, net.users[1].client, busy, b)
        await trio.sleep(2.5 * SYNC)
        assert a.group is not None
        row = {r.node_id: r for r in a.group.peer_rows()}[nid(b)]
        assert row.relative_load >= 0.5 and row.paths >= 1
        chunks = await ask(net.users[0].client, "which box holds 1910?", a)
        assert chunks[-1].node == nid(a)  # least loaded overall; the tie with C goes to the entry node
        assert a.decisions["match-overloaded"] == 1 and b.forwarded_in == 0 and b.forwarded_out == 0
        nursery.cancel_scope.cancel()


async def test_a_killed_b_expires_and_requests_go_elsewhere(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_group(nursery)
        a, b, c = net.models
        await cache_on(net, b)
        net.kill(b)
        assert a.group is not None
        await trio.sleep((a.group.config.expiry_rounds + 1.5) * SYNC)
        for m in (a, c):
            assert m.group is not None
            assert nid(b) not in m.group.state.peers and m.group.state.tree.path_count(nid(b)) == 0
            assert m.group.state.expired >= 1
        chunks = await ask(net.users[0].client, "which box holds 1911?", a)
        assert chunks[-1].node in {nid(a), nid(c)} and not chunks[-1].error
        assert a.forward_failed == 0
        nursery.cancel_scope.cancel()


async def test_a_forward_that_cannot_be_sent_is_served_locally(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_group(nursery)
        a, b, _c = net.models
        await cache_on(net, b)
        net.kill(b)
        await trio.sleep(0.1)  # well before expiry: A still believes B holds the prefix
        assert a.group is not None and nid(b) in a.group.state.peers
        chunks = await ask(net.users[0].client, "which box holds 1912?", a)
        assert chunks[-1].node == nid(a) and not chunks[-1].error
        assert a.forward_failed == 1 and a.forwarded_out == 0
        assert nid(b) not in a.group.state.peers  # dropped at once, not after the expiry rounds
        nursery.cancel_scope.cancel()


def direct_request(question: str, system: str = SYSTEM) -> Request:
    return Request(request_id=os.urandom(16), model="echo", messages=tuple(chat(question, system)), params=PARAMS,
                   k=1, return_paths=(), continuation="")


async def test_a_forwarded_direct_request_comes_back_through_the_entry_node(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_group(nursery, accept_direct_requests=True)  # a user's plain request
        a, b, c = net.models
        await cache_on(net, b)
        conn = await net.dial(a, net.identities["user-5"])
        req = direct_request("is box 3 open?")
        await conn.send(req)
        chunks: list[ReplyChunk] = []
        while not chunks or not chunks[-1].done:
            chunks.append(await conn.receive())
        last = chunks[-1]
        assert last.node == nid(b) and not last.error and "".join(ch.text for ch in chunks) == req.messages[-1].content
        # B signed a reply to the request the user addressed to A (decision 0015): not one to B
        checker = ReplyChecker(request_digest(req, nid(a)), "echo", nid(b), b.identity.ed25519_public)
        for ch in chunks:  # every chunk is B's, chained and signed
            checker.check(ch.text, ch.token_ids, ch.done, ch.chain, ch.signature, ch.signed_at_ms)
        assert a.forwarded_out == 1 and b.forwarded_in == 1
        # The counters, over the same authenticated connection (the user is registered).
        await conn.send(StatsRequest(7))
        stats = await conn.receive()
        assert isinstance(stats, NodeStats) and stats.nonce == 7 and stats.node_id == nid(a)
        assert stats.forwarding and stats.forwarded_out == 1 and stats.members == 4
        assert {x.name: x.n for x in stats.decisions} == {"match": 1}
        assert {r.node_id for r in stats.peers} == {nid(b), nid(c)}
        await conn.aclose()
        # An unregistered node gets no stats.
        conn = await net.dial(a, Identity.generate())
        await conn.send(StatsRequest(1))
        with trio.move_on_after(2) as scope:
            await conn.receive()
        assert scope.cancelled_caught
        await conn.aclose()
        nursery.cancel_scope.cancel()


async def read_reply(conn: Any) -> list[ReplyChunk]:
    chunks: list[ReplyChunk] = []
    while not chunks or not chunks[-1].done:
        chunk = await conn.receive()
        assert isinstance(chunk, ReplyChunk)
        chunks.append(chunk)
    return chunks


async def test_a_plain_request_is_answered_only_from_group_members_by_default(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_group(nursery)
        a = net.models[0]
        assert not a.accept_direct_requests
        # A registered user: refused with an error naming the flag and what it gives up; the
        # connection and the node keep working.
        conn = await net.dial(a, net.identities["user-5"])
        req = direct_request("who am I?")
        await conn.send(req)
        [refused] = await read_reply(conn)
        assert refused.request_id == req.request_id and refused.error == DIRECT_REFUSED
        assert "--accept-direct-requests" in refused.error and "not anonymous" in refused.error
        assert not refused.signature and a.served == 0
        await conn.send(StatsRequest(3))
        stats = await conn.receive()
        assert isinstance(stats, NodeStats) and stats.nonce == 3 and stats.served == 0
        await conn.aclose()
        # A member of the group (registered as a model node of this model): answered and signed.
        conn = await net.dial(a, net.identities["rogue-member"])
        req = direct_request("a member asks")
        await conn.send(req)
        chunks = await read_reply(conn)
        assert not chunks[-1].error and chunks[-1].signature
        assert "".join(c.text for c in chunks) == req.messages[-1].content
        await conn.aclose()
        # Users' requests through the overlay are unaffected.
        assert not (await ask(net.users[0].client, "through the overlay", a))[-1].error
        nursery.cancel_scope.cancel()


async def test_forwarded_requests_and_sync_from_non_members_are_dropped(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_group(nursery)
        a = net.models[0]
        assert a.group is not None
        user_node = await net.start_node(nursery, net.identities["user-7"])
        other = await net.start_node(nursery, net.identities["other-model"])
        # Requests handed over by non-members: a user, and a model node of another model.
        req = Request(request_id=os.urandom(16), model="echo", messages=tuple(chat("hi")), params=PARAMS, k=1,
                      return_paths=(), continuation="")
        for node in (user_node, other):
            assert node.send_nowait(nid(a), ForwardedRequest(dataclasses.replace(req, request_id=os.urandom(16))))
            assert node.send_nowait(nid(a), LoadReport(10**12, 0, 0, 0, 1, 0, 0, 0))
        await trio.sleep(1)
        assert a.group.dropped["non-member"] == 2
        assert a.group.state.dropped["non-member"] == 2
        assert a.served == 0 and a.forwarded_in == 0 and a.responder.active == 0
        assert set(a.group.state.peers) <= {nid(m) for m in net.models}
        # A reply chunk that answers nothing we forwarded is dropped too.
        assert user_node.send_nowait(nid(a), ReplyChunk(request_id=os.urandom(16), seq=0, text="x", token_ids=(),
                                                         done=True, error="", node=nid(a), chain=b"", signature=b"",
                                                         signed_at_ms=0))
        await trio.sleep(1)
        assert a.group.dropped["unexpected-reply"] == 1
        nursery.cancel_scope.cancel()


async def test_bad_sync_input_through_the_driver_does_not_poison_the_tree(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_group(nursery)
        a, b, c = net.models
        await cache_on(net, b)
        assert a.group is not None
        rogue = await net.start_node(nursery, net.identities["rogue-member"])
        rid = rogue.node_id
        state = a.group.state
        lengths: ChunkLengths = state.lengths
        before = {p: state.tree.paths(p) for p in (nid(b), nid(c))}
        prompt = a.engine.chat_prompt(chat("which box holds 1913?"))
        good_path = lengths.path(prompt)
        seq = 10**13
        bad = [
            LoadReport(seq, 0, 0, 0, 0, 0, 0, 0),  # capacity 0
            LoadReport(seq, 0, -1, 0, 1, 0, 0, 0),  # negative load
            SubtreeUpdate(seq, 0, True, lengths.version, b"\0" * 8, (good_path,), ()),  # wrong L digest
            SubtreeUpdate(seq, 0, True, lengths.version + 7, lengths.digest, (good_path,), ()),  # wrong L version
            SubtreeUpdate(seq, 0, True, lengths.version, lengths.digest, (b"\1" * 600,), ()),  # > 512 chunks
            SubtreeUpdate(seq, 0, True, lengths.version, lengths.digest, (good_path, good_path), ()),  # duplicate
            SubtreeUpdate(seq, 0, True, lengths.version, lengths.digest, (good_path,), (good_path,)),  # full + removal
            SubtreeUpdate(seq + 1, seq, False, lengths.version, lengths.digest, (good_path,), ()),  # delta, no base
        ]
        for msg in bad:
            assert rogue.send_nowait(nid(a), msg)
        await trio.sleep(0.5)
        assert state.tree.path_count(rid) == 0
        assert {p: state.tree.paths(p) for p in (nid(b), nid(c))} == before
        assert state.dropped["bad-load"] == 2 and state.dropped["wrong-l-digest"] == 1
        assert state.dropped["wrong-l-version"] == 1 and state.dropped["inconsistent"] == 2
        assert state.dropped["malformed-path"] + state.dropped["delta-gap"] == 2
        # The same member with well-formed messages is accepted, so the bad ones changed nothing.
        assert rogue.send_nowait(nid(a), LoadReport(seq + 5, 0, 0, 0, 1, 0, 0, 0))
        assert rogue.send_nowait(nid(a), SubtreeUpdate(seq + 5, 0, True, lengths.version, lengths.digest,
                                                       (good_path,), ()))
        await trio.sleep(0.5)
        assert state.tree.path_count(rid) == 1
        # A still serves: the request for that prompt goes to B (holds SYSTEM, least loaded tie by id)
        # or to the rogue member; either way the bad input changed no decision's footing.
        assert state.search(prompt).depth >= state.tau_c
        nursery.cancel_scope.cancel()


async def test_without_a_group_every_request_is_served_locally(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_group(nursery, forwarding=False)
        a, b, _ = net.models
        await ask(net.users[0].client, "first", b)
        await trio.sleep(3 * SYNC)
        chunks = await ask(net.users[0].client, "second", a)
        assert chunks[-1].node == nid(a) and a.group is None and a.forwarded_out == 0 and not a.decisions
        assert a.stats().forwarding is False
        nursery.cancel_scope.cancel()


async def test_a_fault_in_the_forwarding_decision_still_serves_the_request(autojump_clock, caplog):
    async with trio.open_nursery() as nursery:
        net = await start_group(nursery)
        a, b, _ = net.models
        await cache_on(net, b)
        assert a.group is not None

        def broken(*args: Any, **kw: Any) -> Any:
            raise RuntimeError("a bug in the group state")

        a.group.decide = broken
        chunks = await ask(net.users[0].client, "still answered", a)
        assert chunks[-1].node == nid(a) and not chunks[-1].error
        assert a.forwarded_out == 0 and "forwarding decision failed" in caplog.text
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("policy", ["load", "random"])
async def test_baseline_policies_ignore_caches(autojump_clock, policy):
    async with trio.open_nursery() as nursery:
        net = await start_group(nursery)
        a, b, _ = net.models
        await cache_on(net, b)
        assert a.group is not None
        a.group.policy = baseline(policy)
        for i in range(6):
            await ask(net.users[0].client, f"q{i}", a)
        assert a.decisions["match"] == 0
        assert sum(a.decisions.values()) == 6
        nursery.cancel_scope.cancel()


async def test_an_untrusted_model_node_is_no_group_member(autojump_clock):
    """The signed list keeps untrusted model nodes (so that audits reach them, decision 0013), but
    users do not read their replies: nobody forwards to one, and it forwards to nobody."""
    async with trio.open_nursery() as nursery:
        net = await start_group(nursery)
        a, b = net.models[0], net.models[1]
        assert a.group is not None and b.group is not None
        registry = a._registry
        assert nid(b) in a.group.members_of(registry)
        untrusted = [dataclasses.replace(e, reputation=100_000) if e.node_id == nid(b) else e
                     for e in registry.entries]
        from overlay.directory.registry import Registry

        changed = Registry(registry.version + 1, untrusted)
        assert nid(b) not in a.group.members_of(changed)
        assert b.group.members_of(changed) == (nid(b),)
        nursery.cancel_scope.cancel()
