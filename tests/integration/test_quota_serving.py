"""Usage quotas at the model node (issue 31), in memory on trio's mock clock: users' requests
carry tokens minted by fake issuers (model_node.testing.FakeIssuers: real VOPRF keys, one spent
set per issuer shared by every node, as the verifiers keep it). A tokened request is served while
another user floods the node; a priority token goes ahead of a standard one (decision 0022) but
stops no standard generation, and a token relabelled to the priority class is refused; a token
spends once across the nodes of a group; a request refused "busy" keeps its token for the next
node, and one refused "busy" after its token was spent gets a fresh one there; a forwarded request is redeemed once, by the member that serves it."""

from __future__ import annotations

import pytest
import trio

from model_node.group import GroupConfig
from model_node.messages import Count
from model_node.quota import Redeemer
from model_node.server import ModelNode
from model_node.testing import GROUP_SYNC, CachingEcho, FakeIssuers, echo_node
from overlay.anon.client import AnonClient, AnonError
from overlay.anon.responder import TOKEN_REFUSAL, TOKEN_SPENT
from overlay.directory import quota
from overlay.testing import start_overlay, wait_until
from overlay.wire.failures import Failure
from overlay.wire.messages import ChatMessage, SamplingParams


class Tokens:
    """A client's usage-quota tokens (``AnonClient.quota``): handed out in turn, none once used up."""

    def __init__(self, *tokens: bytes) -> None:
        self.left = list(tokens)

    async def token(self, model: str) -> bytes:
        return self.left.pop(0) if self.left else b""


def redeemer(issuers: FakeIssuers) -> Redeemer:
    return Redeemer("echo", lambda: issuers.addresses, issuers.chain_id, rpc=issuers.rpc)


async def holding(node: ModelNode, n: int) -> None:
    """Wait until ``node`` holds ``n`` requests (generating or queued)."""
    with trio.fail_after(30):
        await wait_until(lambda: node.active + node.queued == n)


def redeemed(issuers: FakeIssuers) -> int:
    """Redemptions asked of the issuers, spent or not."""
    return sum(n for (_, path), n in issuers.calls.items() if path == quota.REDEEM_PATH)


async def ask(client: AnonClient | None, text: str, node: ModelNode | None = None, *, system: str = "",
              failover: bool = False, max_tokens: int = 8) -> str:
    assert client is not None
    messages = [ChatMessage("system", system)] if system else []
    chunks = [c async for c in client.request("echo", [*messages, ChatMessage("user", text)],
                                              SamplingParams(max_tokens=max_tokens),
                                              node=node.identity.node_id if node else None, failover=failover,
                                              chunk_timeout=120)]
    return "".join(c.text for c in chunks)


async def test_a_tokened_request_is_served_while_another_user_floods_the_node(autojump_clock):
    issuers = FakeIssuers(3)
    async with trio.open_nursery() as nursery:
        factory = echo_node(delay=1.0, slots=1, max_queue=2, max_queue_wait=20.0, redeemer=redeemer(issuers))
        net = await start_overlay(nursery, 15, clients=2, models=[factory])
        (a,) = net.models
        flooder, user = net.users[0].client, net.users[1].client
        assert flooder is not None and user is not None
        outcome: dict[str, str] = {}
        done: list[str] = []

        async def one(client: AnonClient, name: str) -> None:
            try:
                outcome[name] = await ask(client, f"{name} b c d", a)  # four pieces: 4 s
            except AnonError as exc:  # busy at once, or stopped mid-reply for a tokened request
                outcome[name] = f"busy: {exc}"
            done.append(name)

        for n, name in enumerate(("u1", "u2", "u3"), start=1):  # one generating, two queued: the queue is full
            nursery.start_soon(one, flooder, name)
            await holding(a, n)
        assert (a.active, a.queued) == (1, 2)
        token = issuers.token()
        user.quota = Tokens(token)
        nursery.start_soon(one, user, "t1")
        with trio.fail_after(30):
            await wait_until(lambda: "u3" in outcome)  # sent away: its place went to t1
        nursery.start_soon(one, flooder, "u4")  # the queue is full again, and u4 has no token
        with trio.fail_after(60):
            await wait_until(lambda: len(done) == 5)
        assert outcome["t1"] == "t1 b c d"
        assert "took this request's place" in outcome["u3"] and "at capacity" in outcome["u4"], outcome
        # u1 was generating without a token when t1 came: stopped, its slot went to t1 (decision 0018)
        assert "took this request's slot" in outcome["u1"] and outcome["u2"] == "u2 b c d", outcome
        assert done.index("u1") < done.index("t1") < done.index("u2")  # ahead of the untokened request queued before it
        assert a.preempted == 1
        assert issuers.spent_by_all(token) and redeemed(issuers) == 2
        assert a.redeemer is not None and (a.redeemer.tokened, a.redeemer.refused, a.redeemer.unchecked) == (1, 0, 0)
        assert Count("tokened", 1) in a.stats().quota and a.busy == 2
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("first", [True, False])
async def test_a_priority_token_passes_a_waiting_standard_one_and_stops_no_generation_with_a_token(
        autojump_clock, first):
    """The slot held by a priority or a standard generation (``first``); a standard request waits,
    then a priority one comes: it is served next, before the earlier standard one, and nothing
    with a token is stopped."""
    issuers = FakeIssuers(3)
    async with trio.open_nursery() as nursery:
        factory = echo_node(delay=1.0, slots=1, max_queue=3, max_queue_wait=30.0, redeemer=redeemer(issuers))
        net = await start_overlay(nursery, 15, clients=3, models=[factory])
        (a,) = net.models
        clients = [u.client for u in net.users[:3]]
        outcome: dict[str, str] = {}
        done: list[str] = []

        async def one(client: AnonClient | None, name: str) -> None:
            try:
                outcome[name] = await ask(client, f"{name} b c d", a)  # four pieces: 4 s
            except AnonError as exc:
                outcome[name] = f"busy: {exc}"
            done.append(name)

        for n, (client, name, priority) in enumerate(zip(clients, ("first", "standard", "priority"),
                                                         (first, False, True), strict=True), start=1):
            assert client is not None
            client.quota = Tokens(issuers.token(priority=priority))
            nursery.start_soon(one, client, name)
            await holding(a, n)
        assert (a.active, a.queued) == (1, 2) and not done
        with trio.fail_after(60):
            await wait_until(lambda: len(done) == 3)
        assert outcome == {n: f"{n} b c d" for n in ("first", "standard", "priority")}, outcome  # nobody stopped
        assert done == ["first", "priority", "standard"]  # the priority one passed the earlier standard one
        assert a.preempted == 0 and a.busy == 0
        assert a.redeemer is not None and (a.redeemer.tokened, a.redeemer.refused) == (3, 0)
        nursery.cancel_scope.cancel()


async def test_a_standard_token_relabelled_priority_is_refused(autojump_clock):
    issuers = FakeIssuers(3)
    async with trio.open_nursery() as nursery:
        net = await start_overlay(nursery, 15, models=[echo_node(redeemer=redeemer(issuers))])
        (a,) = net.models
        client = net.client.client
        assert client is not None
        token = issuers.token()  # standard
        t = quota.decode_token(token)
        relabelled = quota.encode_token(quota.Token(t.model, t.epoch, t.nonce, t.evaluations, priority=True))
        client.quota = Tokens(relabelled, token)
        try:
            await ask(client, "claims priority", a)
        except AnonError as exc:
            assert exc.kind is Failure.INVALID and TOKEN_REFUSAL in str(exc) and "not valid" in str(exc), exc
        else:
            raise AssertionError("a relabelled token was served")
        assert a.served == 0 and a.redeemer is not None and a.redeemer.refused == 1
        assert not issuers.spent_by_all(token)  # the issuers refused it unspent: as a standard token it is still good
        assert await ask(client, "as it was issued", a) == "as it was issued"
        assert a.redeemer.tokened == 1 and issuers.spent_by_all(token)
        nursery.cancel_scope.cancel()


async def test_a_token_spends_once_across_the_nodes(autojump_clock):
    issuers = FakeIssuers(3)
    async with trio.open_nursery() as nursery:
        factories = [echo_node(redeemer=redeemer(issuers)), echo_node(redeemer=redeemer(issuers))]
        net = await start_overlay(nursery, 15, models=factories)
        a, b = net.models
        client = net.client.client
        assert client is not None
        token = issuers.token()
        client.quota = Tokens(token, token, token)
        assert await ask(client, "first spend", a) == "first spend"
        for node in (b, a):  # the same token again, at another node of the model and at the same one
            try:
                await ask(client, "second spend", node)
            except AnonError as exc:
                assert exc.kind is Failure.SPENT  # the code says so: the client never reads the words
                assert f"{TOKEN_REFUSAL}{TOKEN_SPENT}" in str(exc)
            else:
                raise AssertionError("a spent token was served")
        assert a.redeemer is not None and b.redeemer is not None
        assert (a.redeemer.tokened, a.redeemer.refused, b.redeemer.tokened, b.redeemer.refused) == (1, 1, 0, 1)
        assert a.served == 1 and b.served == 0  # refused before any engine work
        # a bad token costs the node no RPC and gets the same clear error
        before = sum(issuers.calls.values())
        client.quota = Tokens(issuers.token("another-model"))
        try:
            await ask(client, "wrong model", b)
        except AnonError as exc:
            assert exc.kind is Failure.INVALID and "it is for model 'another-model'" in str(exc)
        else:
            raise AssertionError("another model's token was served")
        assert sum(issuers.calls.values()) == before
        nursery.cancel_scope.cancel()


async def test_a_request_refused_busy_keeps_its_token_for_the_next_node(autojump_clock):
    issuers = FakeIssuers(3)
    async with trio.open_nursery() as nursery:
        busy = echo_node(delay=1.0, slots=1, max_queue=1, max_queue_wait=20.0, redeemer=redeemer(issuers))
        net = await start_overlay(nursery, 15, clients=2, models=[busy, echo_node(redeemer=redeemer(issuers))])
        a, b = net.models
        user, other = net.users[0].client, net.users[1].client
        assert user is not None and other is not None
        # A full of tokened requests (one generating, one queued): nobody whose place a token could take
        other.quota = Tokens(issuers.token(), issuers.token())
        for i in range(2):
            nursery.start_soon(ask, other, f"tokened {i} " + "x " * 8, a)
            await holding(a, i + 1)
        token = issuers.token()
        user.quota = Tokens(token)
        asked = redeemed(issuers)
        assert await ask(user, "third", a, failover=True) == "third"  # A: busy; B serves it, with the same token
        assert a.busy == 1 and b.served == 1
        assert a.redeemer is not None and b.redeemer is not None
        assert (a.redeemer.tokened, b.redeemer.tokened) == (2, 1)  # A redeemed its two, not the third
        assert redeemed(issuers) == asked + 2 and issuers.spent_by_all(token)  # spent once, by B
        nursery.cancel_scope.cancel()


async def test_a_request_refused_busy_after_its_token_was_spent_gets_a_fresh_one_at_the_next_node(autojump_clock):
    """A waits a request it took (its token redeemed) until a priority one takes its place in the
    full queue: "busy", token spent. B finds the same token spent; the client asks B again, once,
    with a fresh token. On a devnet under challenges, `user chat` ended there with "quota token
    refused: it was spent already"."""
    issuers = FakeIssuers(3)
    async with trio.open_nursery() as nursery:
        busy = echo_node(delay=1.0, slots=1, max_queue=1, max_queue_wait=30.0, redeemer=redeemer(issuers))
        net = await start_overlay(nursery, 15, clients=3, models=[busy, echo_node(redeemer=redeemer(issuers))])
        a, b = net.models
        other, user, vip = (u.client for u in net.users[:3])
        assert other is not None and user is not None and vip is not None
        other.quota = Tokens(issuers.token())
        nursery.start_soon(ask, other, "generating " + "x " * 8, a)
        await holding(a, 1)
        first, fresh = issuers.token(), issuers.token()
        user.quota = Tokens(first, fresh)
        got: list[str] = []

        async def asks() -> None:
            got.append(await ask(user, "waiting", a, failover=True))

        nursery.start_soon(asks)
        await holding(a, 2)
        vip.quota = Tokens(issuers.token(priority=True))
        nursery.start_soon(ask, vip, "priority", a)  # takes the waiting standard request's place
        with trio.fail_after(60):
            await wait_until(lambda: bool(got))
        assert got == ["waiting"] and a.busy == 1 and b.served == 1
        assert issuers.spent_by_all(first) and issuers.spent_by_all(fresh)  # A spent the first, B the fresh one
        assert b.redeemer is not None and (b.redeemer.tokened, b.redeemer.refused) == (1, 1)
        nursery.cancel_scope.cancel()


async def test_a_forwarded_request_is_redeemed_once_by_the_member_that_serves_it(autojump_clock):
    issuers = FakeIssuers(3)
    async with trio.open_nursery() as nursery:
        group = GroupConfig(sync_interval=GROUP_SYNC, load_threshold=1000.0, rule="alg2")
        factories = [echo_node(engine=CachingEcho(0.0), group=group, redeemer=redeemer(issuers)) for _ in range(2)]
        net = await start_overlay(nursery, 15, models=factories)
        a, b = net.models
        client = net.client.client
        assert client is not None
        system = "You answer questions about the city archive. " + " ".join(
            f"Box {i} holds the letters of year {1900 + i}." for i in range(22))
        first, second = issuers.token(), issuers.token()
        client.quota = Tokens(first, second, second)
        assert await ask(client, "first question", b, system=system) == "first question"  # B caches the prompt
        await trio.sleep(2.5 * GROUP_SYNC)  # A learns B's prefix
        assert await ask(client, "which box holds 1910?", a, system=system) == "which box holds 1910?"
        assert a.forwarded_out == 1 and b.forwarded_in == 1 and b.served == 2
        assert a.redeemer is not None and b.redeemer is not None
        assert not a.redeemer.counts and b.redeemer.tokened == 2  # A forwarded it unredeemed; B redeemed it
        assert redeemed(issuers) == 4 and issuers.spent_by_all(second)  # two tokens, two issuers each, once
        try:  # the token again, through A: B refuses it, spent
            await ask(client, "which box holds 1911?", a, system=system)
        except AnonError as exc:
            assert exc.kind is Failure.SPENT and "it was spent already" in str(exc)
        else:
            raise AssertionError("a spent token was served")
        assert b.redeemer.refused == 1 and not a.redeemer.counts
        nursery.cancel_scope.cancel()
