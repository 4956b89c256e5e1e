"""The gateway's HTTP layer (Starlette on Hypercorn's trio worker) over a fake backend, driven
by the official openai client and raw HTTP: status codes, limits, streaming, affinity."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import openai
import pytest
import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from openai.types.chat import ChatCompletionMessageParam

from overlay.anon.client import AllBusy, AnonError, ModelUnaudited, QuotaExhausted, ReplyUnverified
from overlay.testing import wait_until
from overlay.wire.failures import Failure
from overlay.wire.messages import ChatMessage, ReplyChunk, SamplingParams
from user_client import openai_api as api
from user_client.gateway import Gateway, is_loopback

NODE_A, NODE_B, NODE_C = b"A" * 32, b"B" * 32, b"C" * 32


PROMPT_TOKENS = 11  # what the fake's first node reports as the prompt's token count


class FakeBackend:
    """Echoes the last message word by word; special first words fail in chosen ways, and the
    word ``failover`` hands the rest of the reply to another node (whose prompt is longer: it
    holds the continuation). Each node a call goes to is added to ``sent_to``: the preferred one
    (NODE_A by default), NODE_C for a first word ``forwarded`` (C forwards it: NODE_A signs the
    reply), NODE_B for ``moved`` (the preferred node no longer serves)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bytes | None]] = []
        self.release = trio.Event()

    def models(self) -> list[str]:
        return ["echo"]

    def unaudited(self) -> list[str]:
        return ["held"]  # served by trusted nodes only of a model the committee does not audit

    async def request(self, model, messages, params, node, *, sent_to=None):
        self.calls.append((messages[-1].content, node))
        sent_to = set() if sent_to is None else sent_to
        words = messages[-1].content.split(" ")
        if words[0] == "silent":
            raise AnonError("no reply from model node 0a0b0c0d within 1s", Failure.SILENT)
        if words[0] == "nopaths":
            raise api.ApiError(503, "not enough proxy paths", type="service_unavailable", code="not_enough_paths")
        if words[0] == "refused":
            raise AnonError("model node 0a0b0c0d: model node is at capacity; try again later", Failure.NODE_ERROR)
        if words[0] == "allbusy":
            raise AllBusy("every model node serving 'echo' refused the request as busy")
        if words[0] == "unaudited":  # the committee stopped auditing the model since the call was admitted
            raise ModelUnaudited(model)
        if words[0] == "quota":  # the user's usage quota is used up (nothing was sent)
            raise QuotaExhausted("your quota of 'echo' for this period is used up; it refills in 41.2 s", 1e9, 41.2)
        target = {"forwarded": NODE_C, "moved": NODE_B}.get(words[0], node or NODE_A)
        sent_to.add(target)
        served, prompt_tokens = (NODE_A if target == NODE_C else target), PROMPT_TOKENS
        for i, w in enumerate(words[: params.max_tokens]):
            if w == "hold":
                await self.release.wait()
            if w == "break":
                raise AnonError("model node 0a0b0c0d: engine failed", Failure.NODE_ERROR)
            if w == "forged":
                raise ReplyUnverified("reply chunk 2 from node 0a0b0c0d does not match its hash chain")
            if w == "failover":
                served, prompt_tokens = (NODE_B if served == NODE_A else NODE_A), PROMPT_TOKENS + i
                sent_to.add(served)
            last = i == min(len(words), params.max_tokens) - 1
            yield ReplyChunk(b"r" * 16, i, (" " if i else "") + w, (1,), last, "", served, b"", b"", 0, prompt_tokens)


@pytest.fixture
async def gateway(nursery):
    backend = FakeBackend()
    gw = Gateway(backend, max_body=4096, max_concurrent=2)
    hc = Config()
    hc.bind = ["127.0.0.1:0"]
    hc.accesslog = None
    hc.errorlog = None
    binds = await nursery.start(serve, gw.app, hc)
    yield gw, backend, binds[0]
    for c in _clients:
        c.close()
    _clients.clear()


_clients: list[openai.OpenAI] = []


def client(base: str) -> openai.OpenAI:
    """An official client that never retries (closed when the test ends)."""
    c = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    _clients.append(c)
    return c


def error_body(e: openai.APIError) -> dict[str, Any]:
    """The error object the gateway answered with (the SDK types ``body`` as ``object``)."""
    assert isinstance(e.body, dict), e.body
    return e.body


def post(url: str, data: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


async def test_chat_stream_completion_and_models(gateway):
    gw, _backend, base = gateway

    def run():
        c = client(base)
        assert [m.id for m in c.models.list().data] == ["echo"]
        r = c.chat.completions.create(model="echo", messages=[{"role": "user", "content": "one two three"}],
                                      max_tokens=2)
        assert r.choices[0].message.content == "one two" and r.choices[0].finish_reason == "length"
        assert r.usage is not None and r.usage.completion_tokens == 2
        parts = list(c.chat.completions.create(model="echo", messages=[{"role": "user", "content": "a b END c"}],
                                               stop=["END"], stream=True,
                                               stream_options={"include_usage": True}))
        assert "".join(p.choices[0].delta.content or "" for p in parts if p.choices) == "a b "
        assert [p.choices[0].finish_reason for p in parts if p.choices][-1] == "stop"
        assert parts[-1].usage is not None and parts[0].choices[0].delta.role == "assistant"
        raw = c.chat.completions.with_raw_response.create(model="echo", messages=[{"role": "user", "content": "z"}])
        assert raw.headers["x-gentorrent-node"] == NODE_A.hex() and raw.headers["x-gentorrent-verified"] == "true"
        comp = c.completions.create(model="echo", prompt="x y")
        assert comp.choices[0].text == "x y" and comp.choices[0].finish_reason == "stop"
        streamed = "".join(p.choices[0].text for p in c.completions.create(model="echo", prompt="p q", stream=True))
        assert streamed == "p q"

    await trio.to_thread.run_sync(run)
    assert gw.active == 0 and gw.served == 5


def follow_up(first: list[ChatCompletionMessageParam], reply: str | None,
              text: str) -> list[ChatCompletionMessageParam]:
    """``first`` with the reply it got and one more user turn."""
    return [*first, {"role": "assistant", "content": reply}, {"role": "user", "content": text}]


async def test_follow_ups_go_back_to_the_node_that_served(gateway):
    _gw, backend, base = gateway

    def run():
        c = client(base)
        first: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello there"}]
        r = c.chat.completions.create(model="echo", messages=first)
        follow = follow_up(first, r.choices[0].message.content, "again")
        c.chat.completions.create(model="echo", messages=follow)
        c.chat.completions.create(model="echo", messages=[*first, {"role": "assistant", "content": "edited"},
                                                          {"role": "user", "content": "other"}])

    await trio.to_thread.run_sync(run)
    assert backend.calls == [("hello there", None), ("again", NODE_A), ("other", None)]


@pytest.mark.parametrize("content,status,code", [
    ("silent x", 503, "no_model_node_reachable"),
    ("nopaths x", 503, "not_enough_paths"),
    ("refused x", 502, "model_node_error"),
    ("allbusy x", 503, "model_nodes_busy"),
    ("forged x", 502, "reply_unverified"),
    ("unaudited x", 503, "model_unaudited"),
    ("quota x", 429, "quota_exceeded"),
])
async def test_overlay_failures_are_openai_errors(gateway, content, status, code):
    _, _, base = gateway

    def run():
        for stream in (False, True):
            with pytest.raises(openai.APIStatusError) as e:
                r = client(base).chat.completions.create(model="echo", messages=[{"role": "user", "content": content}],
                                                         stream=stream)
                list(r) if stream else None
            assert e.value.status_code == status and error_body(e.value)["code"] == code

    await trio.to_thread.run_sync(run)


async def test_a_used_up_quota_is_a_429_that_says_when_it_refills(gateway):
    _, _, base = gateway
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(
        {"model": "echo", "messages": [{"role": "user", "content": "quota x"}]}).encode(),
        headers={"content-type": "application/json"})

    def run() -> tuple[int, str | None, dict[str, Any]]:
        try:
            urllib.request.urlopen(req, timeout=10)
        except urllib.error.HTTPError as e:
            return e.code, e.headers.get("retry-after"), json.loads(e.read())
        raise AssertionError("no error")

    status, retry_after, body = await trio.to_thread.run_sync(run)
    assert (status, retry_after) == (429, "42")  # whole seconds, rounded up
    assert body["error"]["type"] == "rate_limit_exceeded" and "refills in" in body["error"]["message"]


async def test_unknown_model_404_bad_parameter_400(gateway):
    _, _, base = gateway

    def run():
        with pytest.raises(openai.NotFoundError) as e:
            client(base).chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "x"}])
        assert error_body(e.value)["code"] == "model_not_found"
        with pytest.raises(openai.BadRequestError) as e2:
            client(base).chat.completions.create(model="echo", messages=[{"role": "user", "content": "x"}], top_p=2)
        assert error_body(e2.value)["param"] == "top_p"
        assert post(base + "/v1/chat/completions", b"{not json")[0] == 400

    await trio.to_thread.run_sync(run)


async def test_an_unaudited_model_is_left_out_of_the_list_and_answered_503_model_unaudited(gateway):
    _, _, base = gateway

    def run():
        c = client(base)
        assert [m.id for m in c.models.list().data] == ["echo"]
        for stream in (False, True):
            with pytest.raises(openai.APIStatusError) as e:
                r = c.chat.completions.create(model="held", messages=[{"role": "user", "content": "x"}], stream=stream)
                list(r) if stream else None
            assert e.value.status_code == 503 and error_body(e.value)["code"] == "model_unaudited"
            assert error_body(e.value)["type"] == "service_unavailable" and error_body(e.value)["param"] == "model"
            assert error_body(e.value)["message"] == (
                "model held is not audited by the committee's verifiers (no verifier with enough voting power "
                "holds it); pass --allow-unaudited to use it anyway")
        status, body = post(base + "/v1/completions", json.dumps({"model": "held", "prompt": "x"}).encode())
        assert status == 503 and body["error"]["code"] == "model_unaudited"

    await trio.to_thread.run_sync(run)


def test_the_listed_models_are_those_with_a_usable_node():
    """user serve's /v1/models: trusted nodes of audited models (or unknown: no committee); an
    unaudited model only with --allow-unaudited; a model of untrusted nodes never."""
    from overlay.net.peers import PeerEntry
    from overlay.wire.constants import TRUST_LINE
    from user_client.gateway import model_ids

    def node(i, model, reputation, audited):
        return PeerEntry(bytes([i]) * 20, f"h:{i + 1}", b"e" * 32, b"x" * 32, role="model", models=(model,),
                         reputation=reputation, audited=audited)

    entries = [node(1, "audited", 900_000, True), node(2, "audited", 100_000, True),
               node(3, "plain", 600_000, False), node(4, "plain", 10_000, False),
               node(5, "sunk", TRUST_LINE - 1, True), node(6, "sunk-plain", 0, False),
               node(7, "file", None, None)]
    assert model_ids(entries, False) == (["audited", "file"], ["plain"])
    assert model_ids(entries, True) == (["audited", "file", "plain"], [])


class FakeDonor:
    def __init__(self) -> None:
        self.offers: list[tuple[str, tuple[ChatMessage, ...], SamplingParams]] = []
        self.seen_by: list[list[bytes]] = []  # per offer, sorted

    def offer(self, model, messages, params, seen_by=()) -> bool:
        self.offers.append((model, tuple(messages), params))
        self.seen_by.append(sorted(seen_by))
        return True


async def test_complete_replies_are_offered_to_the_donor_and_failures_are_not(gateway):
    gw, _, base = gateway
    gw.donor = FakeDonor()

    def run():
        c = client(base)
        msgs: list[ChatCompletionMessageParam] = [{"role": "system", "content": "be brief"},
                                                  {"role": "user", "content": "one two"}]
        c.chat.completions.create(model="echo", messages=msgs, temperature=0.5, top_p=0.9)
        "".join(p.choices[0].delta.content or "" for p in c.chat.completions.create(
            model="echo", messages=[{"role": "user", "content": "streamed reply"}], stream=True) if p.choices)
        with pytest.raises(openai.APIStatusError):
            c.chat.completions.create(model="echo", messages=[{"role": "user", "content": "silent x"}])
        with pytest.raises(openai.APIError):
            list(c.chat.completions.create(model="echo", messages=[{"role": "user", "content": "a break"}],
                                           stream=True))

    await trio.to_thread.run_sync(run)
    assert [(m, [x.content for x in msgs]) for m, msgs, _ in gw.donor.offers] == [
        ("echo", ["be brief", "one two"]), ("echo", ["streamed reply"])]
    params = gw.donor.offers[0][2]
    assert (params.temperature, params.top_p) == (0.5, 0.9)


async def test_a_donation_names_every_node_that_read_the_conversation(gateway):
    """Decision 0029: the node a call was sent to (C, which forwarded it), the node that signed the
    reply (A), and on a follow-up the node the conversation's earlier turn went to (A, though the
    follow-up went to B alone), streamed or not."""
    gw, backend, base = gateway
    gw.donor = FakeDonor()

    def run():
        c = client(base)
        first: list[ChatCompletionMessageParam] = [{"role": "user", "content": "forwarded one"}]
        r = c.chat.completions.create(model="echo", messages=first)
        follow = follow_up(first, r.choices[0].message.content, "moved on")
        "".join(p.choices[0].delta.content or "" for p in c.chat.completions.create(
            model="echo", messages=follow, stream=True) if p.choices)

    await trio.to_thread.run_sync(run)
    assert backend.calls == [("forwarded one", None), ("moved on", NODE_A)]
    assert gw.donor.seen_by == [sorted([NODE_A, NODE_C]), sorted([NODE_A, NODE_B])]


async def test_an_error_mid_stream_ends_the_stream_with_an_error_event(gateway):
    _, _, base = gateway

    def run():
        got = []
        with pytest.raises(openai.APIError, match="engine failed"):
            for p in client(base).chat.completions.create(
                    model="echo", messages=[{"role": "user", "content": "a b break c"}], stream=True):
                got.append(p.choices[0].delta.content)
        assert got == ["a", " b"]

    await trio.to_thread.run_sync(run)


async def test_a_reply_failing_verification_mid_stream_ends_with_an_error_event(gateway):
    _, _, base = gateway

    def run():
        got = []
        with pytest.raises(openai.APIError, match="failed verification") as e:
            for p in client(base).chat.completions.create(
                    model="echo", messages=[{"role": "user", "content": "a b forged c"}], stream=True):
                got.append(p.choices[0].delta.content)
        assert error_body(e.value)["code"] == "reply_unverified"
        assert got == ["a", " b"]  # only what passed its check was sent
        with pytest.raises(openai.APIStatusError) as e2:  # not streamed: an error, no partial text as success
            client(base).chat.completions.create(model="echo", messages=[{"role": "user", "content": "a b forged c"}])
        assert e2.value.status_code == 502 and error_body(e2.value)["code"] == "reply_unverified"

    await trio.to_thread.run_sync(run)


async def test_body_size_bound_413(gateway):
    gw, _, base = gateway
    big = json.dumps({"model": "echo", "messages": [{"role": "user", "content": "x" * 5000}]}).encode()
    status, body = await trio.to_thread.run_sync(post, base + "/v1/chat/completions", big)
    assert status == 413 and body["error"]["code"] == "body_too_large"
    assert gw.active == 0


async def test_concurrency_bound_429(gateway, nursery):
    gw, backend, base = gateway
    held = []

    def hold():
        stream = client(base).chat.completions.create(model="echo", messages=[{"role": "user", "content": "a hold"}],
                                                      stream=True)
        held.append("".join(p.choices[0].delta.content or "" for p in stream))

    def third():
        with pytest.raises(openai.RateLimitError) as e:
            client(base).chat.completions.create(model="echo", messages=[{"role": "user", "content": "x"}])
        assert e.value.status_code == 429

    with trio.fail_after(30):
        async with trio.open_nursery() as holders:  # waits for both holds to be answered
            holders.start_soon(trio.to_thread.run_sync, hold)
            holders.start_soon(trio.to_thread.run_sync, hold)
            await wait_until(lambda: gw.active >= 2)
            await trio.to_thread.run_sync(third)
            backend.release.set()
    assert held == ["a hold", "a hold"] and gw.active == 0


def test_loopback_detection():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost") and is_loopback("127.3.4.5")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.2") and not is_loopback("example.com")


async def test_a_client_that_hangs_up_mid_stream_frees_its_slot(gateway):
    gw, _backend, base = gateway
    host, port = base.removeprefix("http://").rsplit(":", 1)
    body = json.dumps({"model": "echo", "messages": [{"role": "user", "content": "a hold"}], "stream": True}).encode()
    stream = await trio.open_tcp_stream(host, int(port))
    await stream.send_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: %s:%s\r\ncontent-type: application/json\r\n"
                          b"content-length: %d\r\n\r\n%s" % (host.encode(), port.encode(), len(body), body))
    got = b""
    while b'"content":"a"' not in got:
        part = await stream.receive_some(4096)
        assert part, got  # the server closed the connection before the first text
        got += part
    assert gw.active == 1
    await stream.aclose()
    with trio.fail_after(10):
        await wait_until(lambda: gw.active == 0)
    assert gw.served == 0  # the reply was abandoned, not counted as served


async def test_usage_counts_the_prompt_tokens_the_model_node_reports(gateway):
    _, _, base = gateway

    def run():
        c = client(base)
        r = c.chat.completions.create(model="echo", messages=[{"role": "user", "content": "one two three"}])
        assert r.usage is not None
        assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (
            PROMPT_TOKENS, 3, PROMPT_TOKENS + 3)
        parts = list(c.chat.completions.create(model="echo", messages=[{"role": "user", "content": "a b"}],
                                               stream=True, stream_options={"include_usage": True}))
        usage = parts[-1].usage
        assert usage is not None and usage.prompt_tokens == PROMPT_TOKENS and usage.total_tokens == PROMPT_TOKENS + 2
        comp = c.completions.create(model="echo", prompt="x y STOP z", stop=["STOP"])
        assert comp.choices[0].text == "x y " and comp.usage is not None
        assert comp.usage.prompt_tokens == PROMPT_TOKENS  # known before the end

    await trio.to_thread.run_sync(run)


async def test_after_a_failover_the_headers_name_every_node_that_served(gateway):
    _gw, backend, base = gateway

    def run():
        c = client(base)
        first: list[ChatCompletionMessageParam] = [{"role": "user", "content": "a b failover c d"}]
        raw = c.chat.completions.with_raw_response.create(model="echo", messages=first)
        assert raw.headers["x-gentorrent-node"] == f"{NODE_A.hex()},{NODE_B.hex()}"
        assert raw.headers["x-gentorrent-verified"] == "true"
        r = raw.parse()
        assert r.choices[0].message.content == "a b failover c d"
        assert r.usage is not None
        assert r.usage.prompt_tokens == PROMPT_TOKENS  # the first node's: the next one's prompt holds more
        follow: list[ChatCompletionMessageParam] = [
            *first, {"role": "assistant", "content": r.choices[0].message.content},
            {"role": "user", "content": "again"}]
        again = c.chat.completions.with_raw_response.create(model="echo", messages=follow)
        assert again.headers["x-gentorrent-node"] == NODE_B.hex()  # the follow-up went to the last node
        stream = c.chat.completions.with_raw_response.create(model="echo", messages=first, stream=True)
        assert stream.headers["x-gentorrent-node"] == NODE_A.hex()  # a stream's headers leave with its first text
        assert "".join(p.choices[0].delta.content or "" for p in stream.parse()) == "a b failover c d"

    await trio.to_thread.run_sync(run)
    assert backend.calls[1] == ("again", NODE_B)

