"""Overload says so (issue 19): a model node past its capacity answers "busy" after a bounded
wait, and the user's client completes the request on another model node (in memory, mock clock).
"""

from __future__ import annotations

import pytest
import trio

from model_node.echo import EchoEngine
from model_node.group import GroupConfig
from model_node.server import ModelNode
from model_node.testing import GROUP_SYNC, CachingEcho, echo_node
from overlay.anon import signing
from overlay.anon.client import AllBusy, AnonError
from overlay.testing import Net, start_overlay
from overlay.wire.failures import Failure, from_wire
from overlay.wire.messages import ChatMessage, ReplyChunk, Request, SamplingParams

LONG = " ".join(f"w{i}" for i in range(60))  # 60 pieces: a minute at one piece a second


async def network(nursery: trio.Nursery, models: int = 2, *, wait: float = 3.0) -> Net:
    """Two users that send requests, and ``models`` echo model nodes of one slot each, one
    piece a second, refusing requests that would wait more than ``wait`` seconds."""
    factory = echo_node(delay=1.0, slots=1, max_queue_wait=wait)
    return await start_overlay(nursery, 15, clients=2, models=[factory] * models)


async def ask(client, text: str, node: ModelNode, max_tokens: int = 4096, **kw) -> list[ReplyChunk]:
    params = SamplingParams(max_tokens=max_tokens)
    return [c async for c in client.request("echo", [ChatMessage("user", text)], params,
                                            node=node.identity.node_id, chunk_timeout=120, **kw)]


def signed_busy(refusal: ReplyChunk, node: ModelNode, target: ModelNode, messages: list[ChatMessage],
                params: SamplingParams) -> bool:
    """Whether ``refusal`` is ``node``'s signed "busy" of the request (``messages``, ``params``,
    its id) addressed to ``target`` (decision 0044); a wrong key or request does not verify."""
    req = Request(request_id=refusal.request_id, model="echo", messages=tuple(messages), params=params, k=3,
                  return_paths=(), continuation="")
    try:
        signing.verify_busy(node.identity.ed25519_public, refusal.signature,
                            signing.request_digest(req, target.identity.node_id), "echo", refusal.node,
                            refusal.signed_at_ms)
    except signing.ReplyVerifyError:
        return False
    return refusal.node == node.identity.node_id and refusal.seq == 0 and not refusal.chain


async def test_a_node_at_capacity_answers_busy_and_the_request_completes_on_another(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await network(nursery)
        a, b = net.models
        long_reply: list[ReplyChunk] = []
        long_done = trio.Event()

        async def occupy() -> None:
            long_reply.extend(await ask(net.users[1].client, LONG, a))
            long_done.set()

        nursery.start_soon(occupy)
        await trio.sleep(2.0)  # A is generating the long reply: its only slot is taken
        assert a.active == 1
        load = a.current_load()  # the work A holds: the rest of a reply of up to 4,096 tokens
        assert load.prefill_tokens == 0 and load.decode_tokens > 4000 and load.relative > 3.0
        # A minute of output ahead (before A has measured itself, a request is expected to use
        # its whole max_tokens): far over the 3 s wait, so A refuses at once.
        t0 = trio.current_time()
        sent_to: set[bytes] = set()
        refusals: list[ReplyChunk] = []
        chunks = await ask(net.users[0].client, "a short question", a, sent_to=sent_to, refusals=refusals)
        assert trio.current_time() - t0 < 4.0  # B's 3 pieces at one a second; no 3 s wait at A first
        (refusal,) = refusals  # A's "busy", signed over the request A was sent (decision 0044)
        question = [ChatMessage("user", "a short question")]
        assert signed_busy(refusal, a, a, question, SamplingParams(max_tokens=4096))
        assert not signed_busy(refusal, a, a, question, SamplingParams(max_tokens=4095))
        assert not signed_busy(refusal, b, a, question, SamplingParams(max_tokens=4096))
        assert refusal.request_id != chunks[0].request_id  # B was sent it under a fresh id
        assert sent_to == {a.identity.node_id, b.identity.node_id}  # both read it (decision 0029)
        assert "".join(c.text for c in chunks) == "a short question"
        assert chunks[-1].node == b.identity.node_id and chunks[-1].signature  # served and signed by B
        assert (a.busy, a.served, b.served) == (1, 0, 1)
        with trio.fail_after(120):
            await long_done.wait()
        assert "".join(c.text for c in long_reply) == LONG  # the request A kept is answered in full
        assert long_reply[-1].node == a.identity.node_id
        assert a.throughput.decode_rate > 0 and a.current_load().decode_tokens == 0  # measured; idle
        nursery.cancel_scope.cancel()


async def test_a_request_that_waits_too_long_for_a_slot_is_refused_after_the_bounded_wait(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await network(nursery, models=1)
        (a,) = net.models
        nursery.start_soon(ask, net.users[1].client, LONG, a, 8)  # 8 pieces: 8 s, estimated well under 3 s
        await trio.sleep(1.5)
        t0 = trio.current_time()
        sent_to: set[bytes] = set()
        refusals: list[ReplyChunk] = []
        with pytest.raises(AllBusy, match="busy: no free slot on this model node within 3 s") as ei:
            await ask(net.users[0].client, "still there?", a, sent_to=sent_to, refusals=refusals)
        assert sent_to == {a.identity.node_id}  # a failed request names the nodes it was sent to too
        (refusal,) = refusals  # refused after the wait, still before any output: signed
        assert signed_busy(refusal, a, a, [ChatMessage("user", "still there?")], SamplingParams(max_tokens=4096))
        waited = trio.current_time() - t0
        assert 3.0 <= waited < 6.0  # refused after the bounded wait, before the slot freed
        assert "every model node tried" in str(ei.value) and a.busy == 1
        nursery.cancel_scope.cancel()


async def test_no_failover_gets_the_busy_error_itself(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await network(nursery)
        a, b = net.models
        nursery.start_soon(ask, net.users[1].client, LONG, a)
        await trio.sleep(2.0)
        with pytest.raises(AllBusy, match="busy:") as ei:
            await ask(net.users[0].client, "only you", a, failover=False)
        assert "work queued" in str(ei.value)
        assert (a.busy, b.served) == (1, 0)
        nursery.cancel_scope.cancel()


async def test_every_request_is_answered_or_refused_as_busy(autojump_clock):
    """More requests than two one-slot nodes can take within the wait: each one ends with a
    reply or a busy refusal; none is lost."""
    async with trio.open_nursery() as nursery:
        net = await network(nursery)
        outcomes: list[str] = []

        async def one(i: int, client) -> None:
            node = net.models[i % 2]
            try:
                chunks = await ask(client, f"question {i} " + "x " * 4, node, max_tokens=6)
            except AllBusy:
                outcomes.append("busy")
                return
            except AnonError as exc:
                outcomes.append(f"error: {exc}")
                return
            assert "".join(c.text for c in chunks).startswith(f"question {i}")
            outcomes.append("answered")

        async with trio.open_nursery() as inner:
            for i in range(8):
                inner.start_soon(one, i, net.users[i % 2].client)
        assert len(outcomes) == 8
        assert set(outcomes) <= {"answered", "busy"}, outcomes
        assert outcomes.count("answered") >= 2 and "busy" in outcomes
        assert sum(m.served for m in net.models) == outcomes.count("answered")
        nursery.cancel_scope.cancel()


def test_an_error_chunk_s_code_is_read_and_never_its_words() -> None:
    """What a client does with an error chunk comes from its code: a node may send only node
    error, busy or invalid; anything else (none, a client-side kind, an unknown number) counts
    as a node error, so the client fails over rather than trusting it."""
    assert [from_wire(c) for c in (Failure.NODE_ERROR, Failure.BUSY, Failure.INVALID)] == [
        Failure.NODE_ERROR, Failure.BUSY, Failure.INVALID]
    for code in (0, Failure.ALL_BUSY, Failure.UNVERIFIED, Failure.OTHER, 99, -1, 2**40):
        assert from_wire(code) is Failure.NODE_ERROR


async def test_a_forwarded_request_refused_as_busy_completes_on_a_third_node(autojump_clock):
    """A forwards to B (B holds the prompt's prefix and A's threshold lets it through); B is
    busy and says so; the client skips both A (the entry) and B, and C answers. (C runs
    without forwarding: a group member would forward the retry to B again until B's next
    load report shows its work: docs/forwarding.md "Known limits".) A runs Algorithm 2, which
    sends a match to a holder under the threshold whatever its own cost: the default rule would
    see B busy and A idle (at B's measured rate) and serve the request itself."""
    async with trio.open_nursery() as nursery:
        group = GroupConfig(sync_interval=GROUP_SYNC, load_threshold=1000.0, rule="alg2")
        a_f = echo_node(engine=CachingEcho(0.0), group=group, max_queue_wait=3.0)
        b_f = echo_node(engine=CachingEcho(1.0), group=group, max_queue_wait=3.0)
        c_f = echo_node(engine=CachingEcho(0.0), max_queue_wait=3.0)
        net = await start_overlay(nursery, 15, clients=2, models=[a_f, b_f, c_f])
        a, b, c = net.models
        system = "You answer questions about the city archive. " + " ".join(
            f"Box {i} holds the letters of year {1900 + i}." for i in range(22))

        async def ask_group(client, question: str, node: ModelNode, **kw) -> list[ReplyChunk]:
            msgs = [ChatMessage("system", system), ChatMessage("user", question)]
            return [ch async for ch in client.request("echo", msgs, SamplingParams(max_tokens=64),
                                                      node=node.identity.node_id, chunk_timeout=30, **kw)]

        first = await ask_group(net.users[0].client, "first question", b)  # B caches the system prompt
        assert first[-1].node == b.identity.node_id
        await trio.sleep(2.5 * GROUP_SYNC)  # A learns B's prefix
        nursery.start_soon(ask_group, net.users[1].client, LONG, b)  # B's only slot: a minute
        await trio.sleep(1.0)
        sent_to: set[bytes] = set()
        refusals: list[ReplyChunk] = []
        chunks = await ask_group(net.users[0].client, "which box holds 1910?", a, sent_to=sent_to,
                                 refusals=refusals)
        assert "".join(ch.text for ch in chunks) == "which box holds 1910?"
        # B's "busy", relayed by A, signed over the request addressed to A (as B's reply would be)
        (refusal,) = refusals
        assert signed_busy(refusal, b, a, [ChatMessage("system", system), ChatMessage("user", "which box holds 1910?")],
                           SamplingParams(max_tokens=64))
        # A (sent to), B (A forwarded it there; it refused as busy) and C read it (decision 0029)
        assert sent_to == {a.identity.node_id, b.identity.node_id, c.identity.node_id}
        assert chunks[-1].node == c.identity.node_id
        assert (a.forwarded_out, b.forwarded_in, b.busy, a.served, c.served) == (1, 1, 1, 0, 1)
        nursery.cancel_scope.cancel()


async def test_a_node_with_free_slots_refuses_when_the_prompts_ahead_exceed_the_wait(autojump_clock):
    """Slots are not capacity: a node evaluates prompts one after another, so with four slots and
    two long prompts still in prefill, a third request would wait for both and is refused at once,
    though two slots are free (before issue 19's fix, it took a slot and waited minutes)."""
    async with trio.open_nursery() as nursery:
        factory = echo_node(delay=5.0, slots=4, max_queue_wait=3.0)  # first piece after 5 s: "prefill"
        net = await start_overlay(nursery, 15, clients=2, models=[factory])
        (a,) = net.models
        words = " ".join(f"w{i}" for i in range(8))  # 45 prompt tokens: 1.1 s at the reference 40 tokens/s
        first = a.current_load()
        assert first.prefill_wait == 0.0
        nursery.start_soon(ask, net.users[1].client, words, a, 1)
        await trio.sleep(0.5)
        assert a.current_load().prefill_wait == pytest.approx(45 / 40)
        # one prompt ahead (1.1 s) and its own (51 tokens, 1.3 s): under the 3 s wait, so it is taken
        nursery.start_soon(ask, net.users[1].client, words + " again", a, 1)
        await trio.sleep(0.5)
        assert a.active == 2 and a.current_load().prefill_wait == pytest.approx(96 / 40)
        t0 = trio.current_time()  # 2.4 s ahead + its own 38 tokens: over the wait
        with pytest.raises(AllBusy, match="first token would come after more than 3 s") as ei:
            await ask(net.users[0].client, "a third question", a, failover=False)
        assert trio.current_time() - t0 < 1.0  # refused at once, not after the wait
        assert a.busy == 1 and a.active == 2 and "busy:" in str(ei.value)
        nursery.cancel_scope.cancel()


class _OrderedEcho(EchoEngine):
    """Echo that records the priority each prompt is generated with (an engine that orders
    prompts, as llama.cpp's batched engine)."""

    orders_prompts = True

    def __init__(self, delay: float) -> None:
        super().__init__(delay=delay)
        self.priorities: dict[str, float] = {}

    def generate(self, prompt_ids: list[int], params: SamplingParams, priority: float = 0.0):
        text = bytes(prompt_ids).decode(errors="replace")
        self.priorities[text[text.index("<|user|>") + 8:text.index("\n")]] = priority
        return super().generate(prompt_ids, params)


async def test_on_an_engine_that_orders_prompts_a_short_one_goes_ahead_of_long_ones(autojump_clock):
    """Two long prompts in prefill, with slack in their promises: a short question is placed
    ahead of both (a lower priority), a later long prompt behind them; a long prompt that would
    make the first token come after the wait is refused."""
    async with trio.open_nursery() as nursery:
        engine = _OrderedEcho(delay=5.0)
        factory = echo_node(engine=engine, slots=4, max_queue_wait=6.0)
        net = await start_overlay(nursery, 15, clients=2, models=[factory])
        (a,) = net.models
        words = " ".join(f"w{i}" for i in range(8))  # 45 and 51 tokens, then 24 ("hi") and 55
        nursery.start_soon(ask, net.users[1].client, words, a, 1)
        await trio.sleep(0.5)
        nursery.start_soon(ask, net.users[1].client, words + " again", a, 1)
        await trio.sleep(0.5)
        short: list[ReplyChunk] = []
        short_done = trio.Event()

        async def hi() -> None:
            short.extend(await ask(net.users[0].client, "hi", a, 1, failover=False))
            short_done.set()

        nursery.start_soon(hi)
        await trio.sleep(0.5)
        nursery.start_soon(ask, net.users[1].client, words + " once more", a, 1)
        await trio.sleep(0.5)
        p = engine.priorities
        assert a.active == 4 and a.busy == 0
        assert p["hi"] < p[words] < p[words + " again"] < p[words + " once more"]
        # 4.4 s of prompts ahead + its own 1.8 s (71 tokens): over the 6 s wait
        with pytest.raises(AllBusy, match="first token would come after more than 6 s"):
            await ask(net.users[0].client, words + " and one more time, please", a, failover=False)
        assert a.busy == 1
        with trio.fail_after(60):
            await short_done.wait()
        assert "".join(c.text for c in short) == "hi"
        nursery.cancel_scope.cancel()
