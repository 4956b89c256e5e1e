"""Model-node serving through the overlay: signed replies, session affinity, failover (in memory)."""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from contextlib import aclosing

import pytest
import trio

from model_node.testing import start_echo_overlay
from overlay.anon.client import SILENCE_FLOOR, AnonError, ReplyUnverified
from overlay.wire.messages import ChatMessage, PathNotice, ReplyChunk, SamplingParams

PARAMS = SamplingParams(max_tokens=4096)


async def collect(client, text, **kw) -> list[ReplyChunk]:
    return [c async for c in client.request("echo", [ChatMessage("user", text)], PARAMS, **kw)]


async def test_reply_is_signed_by_the_serving_node(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_echo_overlay(nursery, 15)
        chunks = await collect(net.users[0].client, "sign this reply please")
        last = chunks[-1]
        assert last.done and len(last.signature) == 64 and last.signed_at_ms > 0
        assert {c.node for c in chunks} == {net.model.identity.node_id}
        assert len(chunks) >= 2 and all(len(c.signature) == 64 and len(c.chain) == 32 for c in chunks)
        assert len({c.chain for c in chunks}) == len(chunks)  # each chunk moves the chain on
        nursery.cancel_scope.cancel()


async def test_tampered_reply_is_rejected_by_the_client(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_echo_overlay(nursery, 15)
        model = net.model
        real = model.handle

        async def forge(req, *origin):  # the node's last chunk altered after signing
            async with aclosing(real(req, *origin)) as chunks:
                async for c in chunks:
                    if c.done and c.signature:
                        c = dataclasses.replace(c, token_ids=(*c.token_ids, 1))
                    yield c

        model.handle = forge
        with pytest.raises(ReplyUnverified, match="hash chain"):
            await collect(net.users[0].client, "a reply that will be altered")
        nursery.cancel_scope.cancel()


def altered(real, change):
    """A reply stream (``ModelNode.handle``) that yields ``real``'s signed chunks with ``change(chunk)``
    applied after signing."""
    async def handler(req, *origin):
        async with aclosing(real(req, *origin)) as chunks:
            async for c in chunks:
                yield change(c)
    return handler


async def test_tampered_text_with_untouched_ids_is_refused_and_never_shown(autojump_clock):
    # The signature used to cover token ids only: a node (or anyone relaying its chunks) could
    # show other text than it signed. Now the chain covers the text; nothing after it is yielded.
    async with trio.open_nursery() as nursery:
        net = await start_echo_overlay(nursery, 15, echo_delay=0.05)
        model = net.model
        model.handle = altered(
            model.handle, lambda c: dataclasses.replace(c, text=c.text.replace("safe", "harm"))
        )
        shown: list[str] = []
        client = net.users[0].client
        assert client is not None
        with pytest.raises(ReplyUnverified, match="hash chain") as info:
            async for c in client.request("echo", [ChatMessage("user", "one two safe three")], PARAMS):
                shown.append(c.text)
        assert "harm" not in "".join(shown) and "safe" not in "".join(shown)
        assert isinstance(info.value, AnonError)  # callers that catch AnonError still see it
        nursery.cancel_scope.cancel()


async def test_a_truncated_reply_passed_off_as_complete_is_refused(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_echo_overlay(nursery, 15, echo_delay=0.05)
        model = net.model
        model.handle = altered(model.handle,
                               lambda c: dataclasses.replace(c, done=True) if c.seq == 1 else c)
        with pytest.raises(ReplyUnverified, match="signature"):
            await collect(net.users[0].client, "a b c d e f g h")
        nursery.cancel_scope.cancel()


async def test_chunks_spliced_from_another_reply_are_refused(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_echo_overlay(nursery, 15)
        model = net.model
        real = model.handle
        donor: list[ReplyChunk] = []

        async def splice(req, *origin):  # the first reply is recorded; the second gets its signed chunk 1
            async with aclosing(real(req, *origin)) as chunks:
                async for c in chunks:
                    if len(donor) < 2:
                        donor.append(c)
                    elif c.seq == 0:
                        c = dataclasses.replace(donor[0], request_id=c.request_id)
                    yield c

        model.handle = splice
        await collect(net.users[0].client, "first reply words here")
        with pytest.raises(ReplyUnverified, match="hash chain"):  # signed, but chained to another request
            await collect(net.users[0].client, "first reply words here, asked again")
        nursery.cancel_scope.cancel()


async def test_follow_ups_reach_the_same_node_through_new_cloves(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_echo_overlay(nursery, 15, models=3)
        client = net.users[0].client
        assert client is not None
        first = await collect(client, "turn one")
        node = first[-1].node
        served_before = {m.identity.node_id: m.served for m in net.models}
        for i in range(5):
            chunks = await collect(client, f"turn {i + 2}", node=node)
            assert chunks[-1].node == node
        served = {m.identity.node_id: m.served - served_before[m.identity.node_id] for m in net.models}
        assert served[node] == 5 and sum(served.values()) == 5
        nursery.cancel_scope.cancel()


async def test_failover_when_the_serving_node_dies_mid_reply(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_echo_overlay(nursery, 15, models=2, echo_delay=0.05)
        client = net.users[0].client
        assert client is not None
        text = " ".join(f"w{j}" for j in range(80))
        first_node = net.models[0].identity.node_id
        got: list[ReplyChunk] = []

        async def kill_soon():
            await trio.sleep(1.0)  # about 20 words in
            net.kill(first_node)

        nursery.start_soon(kill_soon)
        arrived: list[float] = []
        async for c in client.request("echo", [ChatMessage("user", text)], PARAMS, node=first_node, chunk_timeout=60):
            got.append(c)
            arrived.append(trio.current_time())
        assert "".join(c.text for c in got) == text  # complete, no repeated words
        second = net.models[1].identity.node_id
        assert got[0].node == first_node and got[-1].node == second
        # the proxies' model-lost signals, not a silence timeout, moved the reply: the next
        # chunk came well within the 3 s target (virtual time), far below ``chunk_timeout``
        assert client.failovers == {"lost": 1}
        switch = next(i for i, c in enumerate(got) if c.node == second)
        assert arrived[switch] - arrived[switch - 1] < 3.0
        # each part is signed by the node that wrote it; every chunk was checked on arrival
        assert all(len(c.signature) == 64 for c in got)
        nursery.cancel_scope.cancel()


def failing_after(real, n_chunks, error):
    """A reply stream (``ModelNode.handle``) that passes ``n_chunks`` chunks of ``real`` on, then
    answers ``error``."""
    async def handler(req, *origin):
        async with aclosing(real(req, *origin)) as chunks:
            async for c in chunks:
                if c.seq == n_chunks:
                    yield dataclasses.replace(c, text="", token_ids=(), done=True, error=error, chain=b"",
                                              signature=b"", signed_at_ms=0)
                    return
                yield c
    return handler


async def test_an_error_reply_mid_reply_fails_over_at_once(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_echo_overlay(nursery, 15, models=2, echo_delay=0.05)
        bad, good = net.models
        bad.handle = failing_after(bad.handle, 3, "model node error: RuntimeError")
        client = net.users[0].client
        assert client is not None
        text = " ".join(f"w{j}" for j in range(40))
        t0 = trio.current_time()
        sent_to: set[bytes] = set()
        got = await collect(client, text, node=bad.identity.node_id, chunk_timeout=60, sent_to=sent_to)
        assert "".join(c.text for c in got) == text
        assert sent_to == {bad.identity.node_id, good.identity.node_id}  # the failover's target too (decision 0029)
        assert [c.node for c in got][:3] == [bad.identity.node_id] * 3 and got[-1].node == good.identity.node_id
        assert client.failovers == {"error": 1}
        assert trio.current_time() - t0 < 5.0  # the reply itself takes 2 s; no timeout was waited out
        nursery.cancel_scope.cancel()


async def test_a_silent_node_is_left_after_a_few_of_its_chunk_gaps(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_echo_overlay(nursery, 15, models=2, echo_delay=0.05)
        stuck, good = net.models
        real = stuck.handle

        async def hang(req, *origin):  # a node that stops sending but keeps its connections (no proxy signal)
            async with aclosing(real(req, *origin)) as chunks:
                async for c in chunks:
                    if c.seq == 5:
                        await trio.sleep_forever()
                    yield c

        stuck.handle = hang
        client = net.users[0].client
        assert client is not None
        text = " ".join(f"w{j}" for j in range(40))
        arrived: list[float] = []
        got = []
        async for c in client.request("echo", [ChatMessage("user", text)], PARAMS, node=stuck.identity.node_id,
                                      chunk_timeout=60):
            got.append(c)
            arrived.append(trio.current_time())
        assert "".join(c.text for c in got) == text and client.failovers == {"silent": 1}
        switch = next(i for i, c in enumerate(got) if c.node == good.identity.node_id)
        gap = arrived[switch] - arrived[switch - 1]
        assert SILENCE_FLOOR <= gap < 5.0  # the floor (its chunks came every ~50 ms), not the 60 s timeout
        nursery.cancel_scope.cancel()


def stalling(real, at_seq, stall):
    """A reply stream (``ModelNode.handle``) that stops for ``stall`` seconds before chunk
    ``at_seq`` (``math.inf``: for good), keeping its connections: a loaded CPU node, or a hung one."""
    async def handler(req, *origin):
        async with aclosing(real(req, *origin)) as chunks:
            async for c in chunks:
                if c.seq == at_seq:
                    await trio.sleep(stall)
                yield c
    return handler


async def test_with_no_node_left_to_fail_over_to_a_stalled_reply_is_waited_for(autojump_clock, caplog):
    """The only node serving the model stalls 10 s mid-reply (decision 0040's loaded devnet saw
    such stalls end a chat): with nowhere to fail over to, the client waits out the silence up to
    ``chunk_timeout`` instead of its 2-s floor, and the reply completes, its longest silence
    logged (debug). A node that never resumes still fails the request, once ``chunk_timeout``
    has passed."""
    async with trio.open_nursery() as nursery:
        net = await start_echo_overlay(nursery, 15, models=1, echo_delay=0.05)
        node = net.model
        real = node.handle
        node.handle = stalling(real, 5, 10.0)
        client = net.users[0].client
        assert client is not None
        text = " ".join(f"w{j}" for j in range(40))
        with caplog.at_level(logging.DEBUG, logger="gentorrent.anon"):
            got = await collect(client, text, chunk_timeout=30)
        assert "".join(c.text for c in got) == text and {c.node for c in got} == {node.identity.node_id}
        assert client.failovers == {}
        logged = re.findall(r"(\d+) reply chunk\(s\), the longest silence between two ([\d.]+)s", caplog.text)
        assert [(int(n), float(s) // 1) for n, s in logged] == [(len(got), 10.0)]  # mock time: 10 s and the pace
        node.handle = stalling(real, 5, math.inf)
        t0 = trio.current_time()
        with pytest.raises(AnonError, match="no reply from model node"):
            await collect(client, text, chunk_timeout=30)
        assert trio.current_time() - t0 >= 30.0  # the silence it waited out before giving up
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("how", [{"failover": False}, {"wait_first": True}], ids=["challenge", "committed-try"])
async def test_a_challenge_or_a_donors_committed_try_waits_out_its_nodes_stall(autojump_clock, how):
    """A verifier's challenge (``failover=False``: it is to one node) and a donor's committed try
    (``wait_first``: its reply counts only from the node it names) to a loaded honest node that
    stalls 10 s mid-reply get the whole reply from that node, though another node serves the
    model. Without either, the client leaves after the silence floor."""
    async with trio.open_nursery() as nursery:
        net = await start_echo_overlay(nursery, 15, models=2, echo_delay=0.05)
        slow, other = net.models
        slow.handle = stalling(slow.handle, 5, 10.0)
        client = net.users[0].client
        assert client is not None
        text = " ".join(f"w{j}" for j in range(40))
        got = await collect(client, text, node=slow.identity.node_id, chunk_timeout=30, **how)
        assert "".join(c.text for c in got) == text and {c.node for c in got} == {slow.identity.node_id}
        assert client.failovers == {}
        got = await collect(client, text, node=slow.identity.node_id, chunk_timeout=30)
        assert "".join(c.text for c in got) == text and got[-1].node == other.identity.node_id
        assert client.failovers == {"silent": 1}
        nursery.cancel_scope.cancel()


async def test_a_single_proxy_claiming_the_node_gone_does_not_move_the_reply(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_echo_overlay(nursery, 15, models=2, echo_delay=0.05)
        first = net.models[0].identity.node_id
        user = net.users[0]
        client = user.client
        assert client is not None and user.paths is not None
        text = " ".join(f"w{j}" for j in range(40))
        got = []
        async for c in client.request("echo", [ChatMessage("user", text)], PARAMS, node=first, chunk_timeout=60):
            got.append(c)
            if len(got) == 3:  # one (lying) proxy: its own path counts as lost, k=3 of n=4 remain
                lying = next(p for p in user.paths.paths if p.watchers)
                for w in list(lying.watchers.values()):
                    w(PathNotice(code="model-lost", detail="a lie", model_node=first))
        assert "".join(c.text for c in got) == text
        assert {c.node for c in got} == {first} and client.failovers == {}
        nursery.cancel_scope.cancel()


async def test_a_final_error_is_reported_without_trying_another_node(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_echo_overlay(nursery, 15, models=2)
        client = net.users[0].client
        assert client is not None
        with pytest.raises(AnonError, match="invalid request: temperature must be within"):
            [c async for c in client.request("echo", [ChatMessage("user", "x")], SamplingParams(temperature=9.0))]
        assert client.failovers == {}
        nursery.cancel_scope.cancel()


async def test_no_failover_candidate_gives_a_clear_error(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_echo_overlay(nursery, 15, echo_delay=0.05)
        client = net.users[0].client
        assert client is not None

        async def kill_soon():
            await trio.sleep(0.5)
            net.kill(net.model)

        nursery.start_soon(kill_soon)
        with pytest.raises(AnonError, match="no reply from model node"):
            await collect(client, " ".join(["word"] * 50), chunk_timeout=5)
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("params,match", [
    (SamplingParams(temperature=-1.0), "temperature must be within"),
    (SamplingParams(top_k=10**9), "top_k must be within"),
    (SamplingParams(max_tokens=10**9), "max_tokens must be within"),
    (SamplingParams(top_p=float("nan")), "top_p must be within"),
])
async def test_bad_requests_get_a_clear_error_through_the_paths(autojump_clock, params, match):
    async with trio.open_nursery() as nursery:
        net = await start_echo_overlay(nursery, 15)
        client = net.users[0].client
        assert client is not None
        with pytest.raises(AnonError, match=match):
            [c async for c in client.request("echo", [ChatMessage("user", "x")], params)]
        # the node keeps serving
        chunks = await collect(client, "still here")
        assert "".join(c.text for c in chunks) == "still here"
        nursery.cancel_scope.cancel()


async def test_a_model_the_node_does_not_serve_is_refused(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_echo_overlay(nursery, 15)
        client = net.users[0].client
        assert client is not None
        client.models = lambda model: net.registry.models("echo")  # a stale or lying directory
        with pytest.raises(AnonError, match="serves 'echo', not 'gpt-x'"):
            [c async for c in client.request("gpt-x", [ChatMessage("user", "x")], PARAMS)]
        nursery.cancel_scope.cancel()
