"""The model node records what it serves as the addressed node (model_node/server.py into
model_node/served.py, decision 0037): a user's request through the in-memory overlay lands in the
node's store whole, as the user got it; a plain request the node forwarded to a member lands in the
entry node's store, signed by the member, and not in the member's."""

from __future__ import annotations

import trio

from model_node.served import ServedStore
from model_node.testing import echo_node, start_group
from overlay.anon.signing import ReplyChecker, request_digest
from overlay.directory import escrow
from overlay.directory import transcripts as wire
from overlay.testing import start_overlay
from overlay.wire.messages import ChatMessage, ReplyChunk, SamplingParams
from tests.integration.test_forwarding_memory import cache_on, direct_request, nid, read_reply

PARAMS = SamplingParams(max_tokens=64)


async def test_a_users_reply_is_kept_as_the_user_got_it(autojump_clock):
    store = ServedStore()
    async with trio.open_nursery() as nursery:
        net = await start_overlay(nursery, 15, models=[echo_node(delay=0.01, served_store=store)])
        model = net.model
        msgs = [ChatMessage("user", "keep this reply, it may be withheld")]
        client = net.users[0].client
        assert client is not None
        chunks: list[ReplyChunk] = [c async for c in client.request("echo", msgs, PARAMS)]
        seeded = [c async for c in client.request("echo", msgs, SamplingParams(max_tokens=64, seed=3))]
        assert seeded[-1].done and not seeded[-1].error
        nursery.cancel_scope.cancel()
    assert len(chunks) >= 2 and chunks[-1].done and not chunks[-1].error
    (kept,) = store.entries()  # the seeded one is not kept: it can never be a transcript
    assert store.skipped == {"seeded": 1}
    me = model.identity.node_id
    assert kept.node_id == kept.served_by == me and kept.model == "echo" and tuple(kept.messages) == tuple(msgs)
    assert kept.chunks == tuple((c.text, tuple(c.token_ids)) for c in chunks)
    assert kept.signature == chunks[-1].signature and kept.signed_at_ms == chunks[-1].signed_at_ms
    assert kept.digest == wire.committed_digest("echo", msgs, kept.params, kept.request_id, me)
    checker = ReplyChecker(kept.digest, "echo", me, model.identity.ed25519_public)
    for c in chunks:
        checker.check(c.text, c.token_ids, c.done, c.chain, c.signature, c.signed_at_ms)
    secret = wire.escrowed_secret(kept.digest)
    value = wire.commitment(escrow.nonce_of(secret), me, kept.digest)
    assert store.find(secret, value) == kept


async def test_a_reply_forwarded_to_a_member_is_kept_by_the_node_addressed(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_group(nursery, accept_direct_requests=True)
        a, b, _ = net.models
        await cache_on(net, b)
        a.served_store, b.served_store = ServedStore(), ServedStore()
        conn = await net.dial(a, net.identities["user-5"])
        req = direct_request("is box 3 open?")
        await conn.send(req)
        chunks = await read_reply(conn)
        await conn.aclose()
        nursery.cancel_scope.cancel()
    assert chunks[-1].node == nid(b) and not chunks[-1].error
    (kept,) = a.served_store.entries()
    assert kept.node_id == nid(a) and kept.served_by == nid(b) and kept.request_id == req.request_id
    assert kept.digest == request_digest(req, nid(a)) and kept.chunks == tuple((c.text, c.token_ids) for c in chunks)
    # b, which signed it, keeps it too, under a (the node addressed): a user's forwarded request is
    # answered straight to the user, so the member is the one that can hand it in
    (by_b,) = b.served_store.entries()
    assert by_b.node_id == nid(a) and by_b.digest == kept.digest and by_b.served_by == nid(b)
