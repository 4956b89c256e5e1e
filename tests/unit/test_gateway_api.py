"""The gateway's OpenAI request validation and response shapes (user_client.openai_api), directly."""

from __future__ import annotations

import json

import pytest

from overlay.wire.messages import MAX_PROMPT_CHARS, ChatMessage
from user_client import openai_api as api

MSG = [{"role": "user", "content": "hi"}]


def chat(**kw):
    return api.parse_chat({"model": "m", "messages": MSG, **kw})


def test_chat_defaults_and_mapping():
    c = api.parse_chat({"model": "m", "messages": [{"role": "developer", "content": "be brief"},
                                                    {"role": "user", "content": [{"type": "text", "text": "a"},
                                                                                 {"type": "text", "text": "b"}]}],
                        "max_tokens": 7, "temperature": 0, "top_p": 0.5, "seed": 3, "stop": "x",
                        "stream": True, "stream_options": {"include_usage": True}, "user": "ignored"})
    assert c.messages == (ChatMessage("system", "be brief"), ChatMessage("user", "ab"))
    assert (c.params.max_tokens, c.params.temperature, c.params.top_p, c.params.seed) == (7, 0.0, 0.5, 3)
    assert c.stop == ("x",) and c.stream and c.include_usage and c.kind == "chat"
    d = chat()
    assert d.params.max_tokens == api.DEFAULT_MAX_TOKENS and d.params.seed is None and not d.stream
    assert chat(max_completion_tokens=9, max_tokens=5).params.max_tokens == 9
    assert not chat(stream_options={"include_usage": True}).include_usage  # only with stream


@pytest.mark.parametrize("field,value", [
    ("temperature", 2.5), ("temperature", -0.1), ("temperature", "hot"), ("temperature", True),
    ("top_p", 0), ("top_p", 1.5), ("max_tokens", 0), ("max_tokens", api.MAX_TOKENS_LIMIT + 1),
    ("max_tokens", 1.5), ("seed", -1), ("seed", 2**32), ("n", 2), ("stop", ["a"] * 5), ("stop", [""]),
    ("stop", 3), ("stream", "yes"), ("tools", [{"type": "function"}]), ("logprobs", True),
    ("stream_options", "x"),
])
def test_bad_parameters_are_400_naming_the_field(field, value):
    with pytest.raises(api.ApiError) as e:
        chat(**{field: value})
    assert e.value.status == 400 and e.value.param == field
    assert e.value.body()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("body", [
    [], "x", {"messages": MSG}, {"model": "", "messages": MSG}, {"model": "m"}, {"model": "m", "messages": []},
    {"model": "m", "messages": [{"role": "tool", "content": "x"}]},
    {"model": "m", "messages": [{"role": "user", "content": 3}]},
    {"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]},
    {"model": "m", "messages": MSG * (api.MAX_MESSAGES + 1)},
    {"model": "m", "messages": [{"role": "user", "content": "x" * (MAX_PROMPT_CHARS + 1)}]},
])
def test_malformed_chat_bodies_are_400(body):
    with pytest.raises(api.ApiError) as e:
        api.parse_chat(body)
    assert e.value.status == 400


def test_completion_prompt_becomes_one_user_message():
    c = api.parse_completion({"model": "m", "prompt": ["Once"], "max_tokens": 4})
    assert c.kind == "completion" and c.messages == (ChatMessage("user", "Once"),)
    for bad in ({"model": "m"}, {"model": "m", "prompt": ["a", "b"]}, {"model": "m", "prompt": ""},
                {"model": "m", "prompt": "a", "echo": True}, {"model": "m", "prompt": "a", "suffix": "z"}):
        with pytest.raises(api.ApiError):
            api.parse_completion(bad)


def test_conversation_key_is_the_prefix_through_the_last_assistant_message():
    u1, a1, u2 = ChatMessage("user", "q1"), ChatMessage("assistant", "r1"), ChatMessage("user", "q2")
    assert api.conversation_key("m", [u1]) is None
    k = api.conversation_key("m", [u1, a1, u2])
    assert k == api.conversation_key("m", [u1, a1]) == api.conversation_key("m", [u1, a1, ChatMessage("user", "z")])
    assert k != api.conversation_key("other", [u1, a1])
    assert k != api.conversation_key("m", [ChatMessage("user", "q1x"), a1])
    # no ambiguity from joining: role/content boundaries are part of the hash
    assert api.conversation_key("m", [ChatMessage("user", "a"), ChatMessage("assistant", "b")]) != \
        api.conversation_key("m", [ChatMessage("user", "a\u0000b"), ChatMessage("assistant", "")])


def test_affinity_finds_the_node_of_the_previous_turn_and_is_bounded():
    aff = api.Affinity(capacity=2)
    u1 = ChatMessage("user", "q1")
    aff.served("m", [u1], "r1", b"N1")
    assert aff.node_for("m", [u1, ChatMessage("assistant", "r1"), ChatMessage("user", "q2")]) == b"N1"
    assert aff.node_for("m", [u1]) is None
    assert aff.node_for("m", [u1, ChatMessage("assistant", "different"), ChatMessage("user", "q2")]) is None
    aff.served("m", [ChatMessage("user", "b")], "r", b"N2")
    aff.served("m", [ChatMessage("user", "c")], "r", b"N3")
    assert len(aff) == 2
    assert aff.node_for("m", [u1, ChatMessage("assistant", "r1")]) is None  # the oldest was forgotten


@pytest.mark.parametrize("pieces,stops,shown,stopped", [
    (["hello wor", "ld!"], ["world"], "hello ", True),
    (["hello wo", "rk"], ["world"], "hello work", False),
    (["abc"], [], "abc", False),
    (["ab", "c", "d"], ["cd", "bx"], "ab", True),
    (["xEN", "D more"], ["END"], "x", True),
    (["a\n", "\nb"], ["\n\n"], "a", True),
])
def test_stop_scanner_cuts_before_the_first_stop_string(pieces, stops, shown, stopped):
    s = api.StopScanner(stops)
    out, hit = [], False
    for p in pieces:
        text, hit = s.feed(p)
        out.append(text)
        if hit:
            break
    if not hit:
        out.append(s.flush())
    assert "".join(out) == shown and hit == stopped


def test_response_shapes():
    c = chat()
    r = api.response(c, "id1", 5, "text", "stop", 9, 3)
    assert r["object"] == "chat.completion" and r["choices"][0]["message"] == {"role": "assistant", "content": "text"}
    assert r["usage"] == {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}
    first = api.chunk(c, "id1", 5, "t", None, first=True)
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "t"}
    assert api.chunk(c, "id1", 5, None, "length")["choices"][0] == {"index": 0, "delta": {}, "finish_reason": "length",
                                                                     "logprobs": None}
    comp = api.parse_completion({"model": "m", "prompt": "p"})
    assert api.response(comp, "c", 5, "x", "stop", 2, 1)["choices"][0]["text"] == "x"
    assert api.usage_chunk(c, "id1", 5, 6, 4) == {"id": "id1", "object": "chat.completion.chunk", "created": 5,
                                                   "model": "m", "choices": [],
                                                   "usage": {"prompt_tokens": 6, "completion_tokens": 4,
                                                             "total_tokens": 10}}
    assert api.finish_reason(False, 8, 8) == "length" and api.finish_reason(True, 8, 8) == "stop"
    assert api.sse("[DONE]") == b"data: [DONE]\n\n"
    assert json.loads(api.sse({"a": 1})[6:]) == {"a": 1}
    assert [m["id"] for m in api.models_list(["b", "a", "b"])["data"]] == ["a", "b"]


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_chunk_encoder_gives_the_same_bytes_as_building_each_chunk(kind):
    c = chat(stream=True) if kind == "chat" else api.parse_completion({"model": "m", "prompt": "p", "stream": True})
    enc = api.ChunkEncoder(c, "chatcmpl-1", 7)
    for text in ["a", " b", 'quo"te\\', "line\nbreak", "naïve 東京 🙂", "\x00gentorrent-text\x00", ""]:
        assert enc.text(text) == api.sse(api.chunk(c, "chatcmpl-1", 7, text, None))
        assert enc.first(text) == api.sse(api.chunk(c, "chatcmpl-1", 7, text, None, first=True))
    odd = api.ChunkEncoder(api.parse_chat({"model": "\x00gentorrent-text\x00", "messages": MSG}), "r", 1)
    for text in ("x", "y"):  # the model id holds the mark: every event is built whole
        assert odd.text(text) == api.sse(api.chunk(odd.call, "r", 1, text, None))


# ------------------------------------------------------------------ the guard, directly

def headers(**kw: str) -> api.Headers:
    return api.Headers([(k.replace("_", "-").encode(), v.encode()) for k, v in kw.items()])


def test_host_names_and_authorities_are_compared_normalised():
    assert api.host_name("LocalHost") == "localhost" and api.host_name("::1") == "[::1]"
    assert api.host_name("[0:0:0:0:0:0:0:1]") == "[::1]" and api.host_name("10.0.0.5") == "10.0.0.5"
    for bad in ("", "localhost.", "a..b", "-a.com", "a_b.com", "x:80", "http://x", "[::1", "a/b", "é.com"):
        assert api.host_name(bad) is None, bad
    assert api.split_authority("localhost:8741") == ("localhost", 8741)
    assert api.split_authority("[::1]:8741") == ("[::1]", 8741) and api.split_authority("[::1]") == ("[::1]", None)
    for bad in ("localhost:", "localhost:x", "localhost:99999", "[::1]x", "::1:80", "a:1:2", "a:١٢"):
        assert api.split_authority(bad) is None, bad
    assert api.parse_origin("HTTP://LocalHost") == ("http", "localhost", 80)
    assert api.parse_origin("https://app.example:8443") == ("https", "app.example", 8443)
    assert api.parse_origin("chrome-extension://abcdef") == ("chrome-extension", "abcdef", None)
    for bad in ("null", "*", "localhost:3000", "http://", "http://a/", "http://u@a", "http://a:b"):
        assert api.parse_origin(bad) is None, bad


def test_the_guard_of_a_loopback_gateway():
    g = api.Guard.make("127.0.0.1")
    assert g.hosts == {"localhost", "127.0.0.1", "[::1]"} and not g.origins and g.key_digest is None
    assert api.Guard.make("::1").hosts == g.hosts and api.Guard.make("localhost").hosts == g.hosts
    for host in ("localhost:8741", "127.0.0.1", "[::1]:8741", "LOCALHOST:8741"):
        assert g.check("POST", headers(host=host), 8741) is None, host
    for h in ({}, {"host": "evil.example:8741"}, {"host": "localhost:8742"}, {"host": "127.0.0.2:8741"},
              {"host": ""}, {"host": "localhost:8741:1"}):
        with pytest.raises(api.ApiError) as e:
            g.check("GET", headers(**h), 8741)
        assert e.value.status == 421 and e.value.code == "bad_host", h


@pytest.mark.parametrize("origin,site,ok", [
    (None, None, True), ("http://localhost:8741", "same-origin", True), ("http://[::1]:8741", None, True),
    (None, "same-site", True), (None, "none", True),
    ("https://evil.example", "cross-site", False), ("https://evil.example", None, False),
    ("http://localhost:3000", "same-site", False), ("https://localhost:8741", None, False), ("null", None, False),
    ("http://evil.example:8741", "same-origin", False), (None, "cross-site", False), ("not an origin", None, False),
])
def test_the_guard_refuses_other_origins(origin, site, ok):
    g = api.Guard.make("127.0.0.1")
    h = {"host": "localhost:8741"} | ({"origin": origin} if origin else {}) | ({"sec_fetch_site": site} if site else {})
    if ok:
        assert g.check("POST", headers(**h), 8741) is None
    else:
        with pytest.raises(api.ApiError) as e:
            g.check("POST", headers(**h), 8741)
        assert e.value.status == 403 and e.value.code == "cross_origin"


def test_a_listed_origin_is_admitted_and_given_cors_headers():
    g = api.Guard.make("127.0.0.1", allow_origins=["http://localhost:3000"])
    h = headers(host="127.0.0.1:8741", origin="http://localhost:3000", sec_fetch_site="cross-site")
    assert g.check("POST", h, 8741) == ("http", "localhost", 3000)
    cors = dict(api.Guard.cors(("http", "localhost", 3000)))
    assert cors[b"access-control-allow-origin"] == b"http://localhost:3000" and cors[b"vary"] == b"Origin"
    pre = headers(origin="http://localhost:3000", access_control_request_method="POST",
                  access_control_request_headers="x-a, x-b\r\nevil: 1", access_control_request_private_network="true")
    answer = dict(api.Guard.cors(("http", "localhost", 3000), pre))
    assert answer[b"access-control-allow-headers"] == b"authorization, content-type"  # not a token list: not echoed
    assert answer[b"access-control-allow-private-network"] == b"true"
    assert dict(api.Guard.cors(("https", "app.example", 443)))[b"access-control-allow-origin"] == b"https://app.example"


def test_the_api_key_is_needed_everywhere_but_a_listed_origins_preflight():
    g = api.Guard.make("127.0.0.1", allow_origins=["http://localhost:3000"], api_key="k-1")
    assert g.check("GET", headers(host="localhost", authorization="Bearer k-1"), 80) is None
    assert g.check("GET", headers(host="localhost", authorization="bearer  k-1 "), 80) is None
    for auth in (None, "Bearer k-2", "Bearer k-1x", "Basic k-1", "k-1", "Bearer ", "Bearer k-1 k-1"):
        with pytest.raises(api.ApiError) as e:
            g.check("GET", headers(host="localhost", **({"authorization": auth} if auth else {})), 80)
        assert e.value.status == 401 and e.value.code == "invalid_api_key" and "k-1" not in e.value.message
    preflight = {"host": "localhost", "access_control_request_method": "POST"}
    assert g.check("OPTIONS", headers(origin="http://localhost:3000", **preflight), 80) == ("http", "localhost", 3000)
    with pytest.raises(api.ApiError):  # an OPTIONS that is not a listed origin's preflight needs the key
        g.check("OPTIONS", headers(host="localhost", access_control_request_method="POST"), 80)


def test_a_header_the_guard_reads_may_come_only_once():
    with pytest.raises(api.ApiError) as e:
        api.Headers([(b"origin", b"http://localhost:1"), (b"Origin", b"https://evil.example")])
    assert e.value.status == 400 and e.value.code == "duplicate_header"
    assert api.Headers([(b"accept", b"a"), (b"accept", b"b")]).get("accept") == "a"


def test_a_non_loopback_gateway_answers_to_its_own_and_the_allowed_names():
    g = api.Guard.make("192.168.1.20", allow_hosts=["mybox.lan"])
    assert g.hosts == {"192.168.1.20", "mybox.lan"}
    assert g.check("GET", headers(host="mybox.lan:8741", origin="http://mybox.lan:8741"), 8741) is None
    with pytest.raises(api.ApiError):
        g.check("GET", headers(host="localhost:8741"), 8741)
    assert api.Guard.make("::").hosts == {"[::]", "localhost", "127.0.0.1", "[::1]"}
    for bad in ({"bind_host": "a b"}, {"bind_host": "x", "allow_hosts": ["x:1"]},
                {"bind_host": "x", "allow_origins": ["null"]}, {"bind_host": "x", "api_key": "a b"},
                {"bind_host": "x", "api_key": "k" * (api.MAX_API_KEY + 1)}):
        with pytest.raises(ValueError):
            api.Guard.make(**bad)


@pytest.mark.parametrize("value,ok", [
    ("application/json", True), ("application/json; charset=utf-8", True), ("APPLICATION/JSON;CHARSET=\"UTF-8\"", True),
    (None, False), ("", False), ("text/plain", False), ("application/x-www-form-urlencoded", False),
    ("multipart/form-data; boundary=x", False), ("application/json; charset=latin-1", False),
    ("application/json; boundary=x", False), ("application/json-seq", False),
])
def test_a_post_body_must_be_declared_json(value, ok):
    if ok:
        api.check_json_body(value)
    else:
        with pytest.raises(api.ApiError) as e:
            api.check_json_body(value)
        assert e.value.status == 415 and e.value.code == "unsupported_media_type"
