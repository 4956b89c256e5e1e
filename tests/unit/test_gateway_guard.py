"""The gateway against a web page the user visits and against slow clients (issue 28, item 5),
over real HTTP: the gateway (Starlette on Hypercorn's trio worker, configured by
``server_config``) on loopback, a fake backend (no model, no network), and httpx, the official
openai client or a raw socket (what an attacker holding connections open would use) as the
client. Every refused request must leave the backend untouched."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
import trio
from hypercorn.trio import serve

from gentorrent.cli import CliError, build_parser
from overlay.wire.messages import ReplyChunk
from user_client import openai_api as api
from user_client.gateway import Gateway, guard_from_args, server_config

NODE = b"N" * 32
CHAT = {"model": "echo", "messages": [{"role": "user", "content": "hello there"}]}
KEY = "sk-local-7f3a9c"


class Backend:
    """Echoes the last message word by word; records every call (what reached the network)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def models(self) -> list[str]:
        return ["echo"]

    def unaudited(self) -> list[str]:
        return []

    async def request(self, model, messages, params, node, *, sent_to=None):
        self.calls.append(messages[-1].content)
        words = messages[-1].content.split(" ")
        for i, w in enumerate(words):
            yield ReplyChunk(b"r" * 16, i, (" " if i else "") + w, (1,), i == len(words) - 1, "", NODE, b"", b"",
                             0, 3)


class Watch:
    """Wraps the app to see which requests the app has begun reading the body of, or answered
    (test instrumentation: the gateway does not know it is watched)."""

    def __init__(self, app) -> None:
        self.app = app
        self.seen: set[int] = set()
        self._grew = trio.Event()  # set when ``seen`` grows, then replaced

    async def wait_seen(self, n: int) -> None:
        """Until the app has seen ``n`` requests."""
        while len(self.seen) < n:
            await self._grew.wait()

    def _see(self, scope) -> None:
        if id(scope) not in self.seen:
            self.seen.add(id(scope))
            self._grew.set()
            self._grew = trio.Event()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def rx():
            self._see(scope)
            return await receive()

        async def tx(message):
            if message["type"] == "http.response.start":
                self._see(scope)
            await send(message)

        await self.app(scope, rx, tx)


async def read_all(stream: trio.SocketStream) -> bytes:
    """Everything the server sends until it closes the connection."""
    got = b""
    while chunk := await stream.receive_some(65536):
        got += chunk
    return got


async def start(nursery, guard: api.Guard | None = None, **kw) -> tuple[Gateway, Backend, Watch, str]:
    backend = Backend()
    gw = Gateway(backend, guard=guard, **kw)
    watch = Watch(gw.app)
    binds = await nursery.start(serve, watch, server_config("127.0.0.1:0"))
    return gw, backend, watch, binds[0]


def port_of(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


async def test_a_rebound_host_is_refused_before_anything_is_sent(nursery):
    """DNS rebinding: a page at http://evil.example:PORT whose name now points at 127.0.0.1
    sends ``Host: evil.example:PORT``. It is refused (and cannot read /v1/models either); the
    loopback names, with the gateway's port or none, are served."""
    gw, backend, _, base = await start(nursery)
    port = port_of(base)
    async with httpx.AsyncClient(base_url=base) as c:
        for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.nip.io:{port}", f"localhost:{port + 1}",
                     f"127.0.0.1:{port}@evil.example", f"localhost.:{port}"):
            r = await c.post("/v1/chat/completions", json=CHAT, headers={"host": host})
            assert r.status_code == 421 and r.json()["error"]["code"] == "bad_host", host
            r = await c.get("/v1/models", headers={"host": host})
            assert r.status_code == 421 and "data" not in r.json(), host
        assert backend.calls == [] and gw.active == 0
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "LOCALHOST", "127.0.0.1"):
            r = await c.post("/v1/chat/completions", json=CHAT, headers={"host": host})
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "hello there", host
    assert len(backend.calls) == 5


async def test_a_second_origin_header_is_refused(nursery):
    """The first Origin is the gateway's own, the second another site's: refused, whichever one
    a check would have read (Hypercorn's h11 refuses a second Host header itself)."""
    _, backend, _, base = await start(nursery)
    port = port_of(base)
    body = json.dumps(CHAT).encode()
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:%d\r\n"
                              b"origin: http://127.0.0.1:%d\r\norigin: https://evil.example\r\n"
                              b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                              % (port, port, len(body), body))
        answer = await read_all(stream)
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["code"] == "duplicate_header"
    assert backend.calls == []


async def test_a_cross_origin_post_is_refused_and_gets_no_cors_headers(nursery):
    """CSRF: a page elsewhere (another site, or another port of localhost) posts to the gateway;
    the browser names its origin. Refused, with no header that would let the page read an answer."""
    gw, backend, _, base = await start(nursery)
    port = port_of(base)
    async with httpx.AsyncClient(base_url=base) as c:
        for origin in ("https://evil.example", f"http://evil.example:{port}", "http://localhost:3000",
                       "null", f"https://127.0.0.1:{port}", "file://"):
            r = await c.post("/v1/chat/completions", json=CHAT, headers={"origin": origin})
            assert r.status_code == 403 and r.json()["error"]["code"] == "cross_origin", origin
            assert not any(h.startswith("access-control-") for h in r.headers), origin
            pre = await c.options("/v1/chat/completions", headers={"origin": origin,
                                                                   "access-control-request-method": "POST"})
            assert pre.status_code == 403 and not any(h.startswith("access-control-") for h in pre.headers)
        # a no-cors request from another site (an <img>, a form) names no origin but says it is cross-site
        r = await c.get("/v1/models", headers={"sec-fetch-site": "cross-site"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "cross_origin"
        assert backend.calls == [] and gw.active == 0
        # the gateway's own origin, and no origin at all (any non-browser client), are served
        for headers in ({"origin": f"http://127.0.0.1:{port}"}, {"origin": f"http://localhost:{port}"},
                        {"origin": f"http://127.0.0.1:{port}", "sec-fetch-site": "same-origin"}, {}):
            r = await c.post("/v1/chat/completions", json=CHAT, headers=headers)
            assert r.status_code == 200, headers
            assert not any(h.startswith("access-control-") for h in r.headers)
    assert len(backend.calls) == 4


async def test_an_origin_given_with_allow_origin_may_call_and_read(nursery):
    guard = api.Guard.make("127.0.0.1", allow_origins=["http://localhost:3000"])
    _, backend, _, base = await start(nursery, guard)
    async with httpx.AsyncClient(base_url=base) as c:
        pre = await c.options("/v1/chat/completions", headers={
            "origin": "http://localhost:3000", "access-control-request-method": "POST",
            "access-control-request-headers": "content-type, authorization, x-stainless-os",
            "sec-fetch-site": "same-site"})
        assert pre.status_code == 204
        assert pre.headers["access-control-allow-origin"] == "http://localhost:3000"
        assert "POST" in pre.headers["access-control-allow-methods"]
        assert pre.headers["access-control-allow-headers"] == "content-type, authorization, x-stainless-os"
        r = await c.post("/v1/chat/completions", json=CHAT, headers={"origin": "http://localhost:3000",
                                                                     "sec-fetch-site": "cross-site"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://localhost:3000"
        r = await c.post("/v1/chat/completions", json=CHAT, headers={"origin": "http://localhost:3001"})
        assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
    assert backend.calls == ["hello there"]


async def test_a_body_not_declared_json_is_refused_415(nursery):
    """A page can post ``text/plain`` (or a form) without a CORS preflight; the gateway answers
    only a body declared ``application/json`` (with a UTF-8 charset or none), which a browser
    sends to another origin only after a preflight that the gateway refuses."""
    gw, backend, _, base = await start(nursery)
    async with httpx.AsyncClient(base_url=base) as c:
        for ct in ("text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                   "multipart/form-data; boundary=x", None, "application/json; charset=latin-1", "application/jsonx"):
            for path in ("/v1/chat/completions", "/v1/completions"):
                r = await c.post(path, content=json.dumps({**CHAT, "prompt": "x"}).encode(),
                                 headers={} if ct is None else {"content-type": ct})
                assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type", ct
        assert backend.calls == [] and gw.active == 0
        for ct in ("application/json", "application/json; charset=utf-8", "Application/JSON;charset=\"UTF-8\""):
            r = await c.post("/v1/chat/completions", content=json.dumps(CHAT).encode(), headers={"content-type": ct})
            assert r.status_code == 200, ct
    assert len(backend.calls) == 3


async def test_with_an_api_key_every_endpoint_needs_it(nursery):
    gw, backend, _, base = await start(nursery, api.Guard.make("127.0.0.1", api_key=KEY))
    async with httpx.AsyncClient(base_url=base) as c:
        for auth in (None, "Bearer wrong", f"Bearer {KEY}x", f"Bearer {KEY[:-1]}", f"Basic {KEY}", KEY, "Bearer"):
            headers = {} if auth is None else {"authorization": auth}
            for r in (await c.get("/v1/models", headers=headers),
                      await c.post("/v1/chat/completions", json=CHAT, headers=headers),
                      await c.post("/v1/completions", json={"model": "echo", "prompt": "x"}, headers=headers)):
                assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", auth
                assert r.headers["www-authenticate"] == "Bearer"
                assert KEY not in r.text
        assert backend.calls == [] and gw.active == 0

    def official(key: str) -> str | None:
        with openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0) as o:
            try:
                [m.id for m in o.models.list().data]
            except openai.AuthenticationError as e:
                assert isinstance(e.body, dict), e.body
                code: str = e.body["code"]
                return code
            return o.chat.completions.create(  # CHAT
                model="echo", messages=[{"role": "user", "content": "hello there"}]).choices[0].message.content

    assert await trio.to_thread.run_sync(official, "unused") == "invalid_api_key"
    assert await trio.to_thread.run_sync(official, KEY) == "hello there"
    assert backend.calls == ["hello there"]


async def test_slow_bodies_hold_no_slot_and_are_answered_408(nursery):
    """40 connections (more than the 32 call slots) each send their headers and half their body,
    then stall. An honest call is still answered; each stalled one is answered 408 once the body
    timeout passes, and the connection is closed."""
    gw, backend, watch, base = await start(nursery, max_concurrent=32, body_timeout=1.0)
    port = port_of(base)
    body = json.dumps({**CHAT, "messages": [{"role": "user", "content": "stalled " * 200}]}).encode()
    stalled = []
    for _ in range(40):
        s = await trio.open_tcp_stream("127.0.0.1", port)
        await s.send_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:%d\r\n"
                         b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                         % (port, len(body), body[: len(body) // 2]))
        stalled.append(s)
    with trio.fail_after(30):  # a bound on the wait, not a measurement
        await watch.wait_seen(40)  # every stalled request is in the app: reading its body, or answered
    async with httpx.AsyncClient(base_url=base) as c:
        r = await c.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "hello there"
    with trio.fail_after(60):
        answers = [await read_all(s) for s in stalled]
    for s in stalled:
        await s.aclose()
    for a in answers:
        head, _, rest = a.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 ") and b"connection: close" in head.lower()
        assert json.loads(rest)["error"]["code"] == "body_timeout"
    assert backend.calls == ["hello there"] and gw.active == 0


async def test_a_client_that_hangs_up_mid_body_leaves_nothing_behind(nursery, caplog):
    """A client that closes its connection halfway through its body is answered (to no one), not
    an error in the server's log, and takes nothing from the next call."""
    gw, backend, watch, base = await start(nursery)
    s = await trio.open_tcp_stream("127.0.0.1", port_of(base))
    await s.send_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
                     b"content-length: 100\r\n\r\n{\"model\"")
    with trio.fail_after(30):
        await watch.wait_seen(1)
    await s.aclose()
    async with httpx.AsyncClient(base_url=base) as c:
        assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200
    assert backend.calls == ["hello there"] and gw.active == 0
    assert not [r for r in caplog.records if r.name.startswith("gentorrent.gateway") and r.levelno >= 40]


def serve_args(*argv: str):
    return build_parser().parse_args(["user", "serve", *argv])


def test_the_serve_flags_build_the_guard():
    g = guard_from_args(serve_args("--allow-host", "mybox.lan,10.0.0.5", "--allow-host", "FE80::1",
                                   "--allow-origin", "http://localhost:3000,https://app.example"), environ={})
    assert g.hosts == {"localhost", "127.0.0.1", "[::1]", "mybox.lan", "10.0.0.5", "[fe80::1]"}
    assert g.origins == {("http", "localhost", 3000), ("https", "app.example", 443)}
    assert g.key_digest is None
    public = guard_from_args(serve_args("--host", "192.168.1.20", "--listen-public"), environ={})
    assert public.hosts == {"192.168.1.20"}  # a LAN address does not answer to loopback names
    assert guard_from_args(serve_args("--host", "0.0.0.0"), environ={}).hosts == {
        "0.0.0.0", "localhost", "127.0.0.1", "[::1]"}
    assert serve_args().body_timeout == 10.0


def test_the_api_key_comes_from_the_flag_or_the_environment():
    from_env = guard_from_args(serve_args(), environ={"GENTORRENT_API_KEY": KEY})
    from_flag = guard_from_args(serve_args("--api-key", KEY), environ={"GENTORRENT_API_KEY": "other"})
    assert from_env.key_digest == from_flag.key_digest is not None
    assert guard_from_args(serve_args(), environ={"GENTORRENT_API_KEY": ""}).key_digest is None


@pytest.mark.parametrize("argv", [
    ("--allow-host", "evil.example:8080"), ("--allow-host", "http://x"), ("--allow-origin", "null"),
    ("--allow-origin", "*"), ("--allow-origin", "http://x/path"), ("--api-key", ""), ("--api-key", "has space"),
    ("--api-key", "é" * 4),
])
def test_bad_serve_flags_are_refused_without_showing_the_key(argv):
    with pytest.raises(CliError) as e:
        guard_from_args(serve_args(*argv), environ={})
    if argv[0] == "--api-key":
        assert argv[1] == "" or argv[1] not in str(e.value)


def test_the_help_documents_the_flags_and_the_key_variable(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["user", "serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for flag in ("--api-key", "GENTORRENT_API_KEY", "--allow-host", "--allow-origin", "--body-timeout", "bad_host",
                 "cross_origin", "application/json"):
        assert flag in out, flag
