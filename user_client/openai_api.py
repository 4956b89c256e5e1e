"""The OpenAI-compatible request and response shapes of ``gentorrent user serve``, as plain functions.

I/O-free: the HTTP layer (:mod:`user_client.gateway`) hands each parsed JSON body to
:func:`parse_chat` or :func:`parse_completion`, which either return a :class:`Call` or
raise :class:`ApiError` (the OpenAI error body and its HTTP status); replies are shaped by
the ``*_response`` / ``*_chunk`` functions and framed for streaming by :func:`sse`. Before
any of that, :class:`Guard` decides from a request's headers alone whether it may be served
(``Host``, ``Origin``, ``Sec-Fetch-Site``, the API key) and :func:`check_json_body` that a POST
body is declared JSON.

What maps to what (the overlay's :class:`~overlay.wire.messages.Request` carries chat messages
and :class:`~overlay.wire.messages.SamplingParams`, nothing else):

- ``/v1/completions``: the prompt is sent as one user message; the model node applies its
  chat template (the protocol has no raw-prompt mode).
- ``stop``: applied here, on the decoded text, since the protocol carries no stop strings;
  the reply is cut before the first stop string and the rest of the stream is abandoned (every
  chunk returned passed its signature check, but the final one is never seen: ``verified`` is
  false for such a reply, as it is not known to be complete).
- ``usage.completion_tokens``: the number of token ids the model node sent (they are signed);
  ``usage.prompt_tokens``: the prompt's token count as the serving model node reports it on
  each reply chunk (after its chat template; not signed: an accounting figure; after a
  failover, the first node's count, since the next one's prompt also holds the continuation).
- ``finish_reason``: ``"stop"`` for a stop string or a reply shorter than ``max_tokens``,
  ``"length"`` when the reply used all ``max_tokens``.
- Unknown fields are ignored (clients send many); fields whose value we cannot honour
  (``n`` other than 1, tools, logprobs) are refused with 400.

Session affinity (:func:`conversation_key`): a conversation is named by a hash of the model
and of its messages up to and including the last assistant message. After a reply, the
gateway remembers ``conversation_key(model, messages + [assistant reply])`` -> the node that
served it; a follow-up that resends that history (what chat clients do) finds the node and
goes back to it, so its prefix cache is reused. A first turn (no assistant message yet) has
no key and goes to any node serving the model.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import math
import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from overlay.wire.messages import MAX_PROMPT_CHARS, ChatMessage, SamplingParams

MAX_MESSAGES = 256  # what one overlay Request carries
MAX_TOKENS_LIMIT = 4096  # model nodes' default ceiling (model_node.server.check_params)
DEFAULT_MAX_TOKENS = 256
MAX_STOP = 4
MAX_STOP_CHARS = 256
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
_REFUSED = ("tools", "functions", "tool_choice", "function_call", "logprobs", "top_logprobs", "best_of",
            "suffix", "logit_bias", "response_format")


class ApiError(Exception):
    """An OpenAI-shaped error: HTTP ``status`` and the ``{"error": {...}}`` body."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after  # seconds, sent as Retry-After (a 429 for a used-up quota)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code="invalid_value" if param else None)


@dataclass(frozen=True, slots=True)
class Call:
    """One validated request: what to send over the overlay and how to shape the answer."""

    kind: str  # "chat" | "completion"
    model: str
    messages: tuple[ChatMessage, ...]
    params: SamplingParams
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False


def _number(body: dict[str, Any], name: str, default: float, lo: float, hi: float, *, lo_open: bool = False) -> float:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise bad(f"{name} must be a number, got {json.dumps(v)[:40]}", name)
    if v < lo or v > hi or (lo_open and v == lo):
        raise bad(f"{name} must be within {'(' if lo_open else '['}{lo:g}, {hi:g}], got {v}", name)
    return float(v)


def _int(body: dict[str, Any], name: str, lo: int, hi: int) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad(f"{name} must be an integer, got {json.dumps(v)[:40]}", name)
    if not lo <= v <= hi:
        raise bad(f"{name} must be within {lo}..{hi}, got {v}", name)
    return v


def _common(body: object) -> tuple[dict[str, Any], str, SamplingParams, tuple[str, ...], bool, bool]:
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not 0 < len(model) <= 128:
        raise bad("model must be a model id (a non-empty string of at most 128 characters); "
                  "GET /v1/models lists them", "model")
    for name in _REFUSED:
        if body.get(name) not in (None, False, [], {}) and not (name == "response_format"
                                                              and body[name] == {"type": "text"}):
            raise bad(f"{name} is not supported by this gateway", name)
    if _int(body, "n", 1, 1) not in (None, 1):
        raise bad("n must be 1", "n")
    max_tokens = _int(body, "max_completion_tokens", 1, MAX_TOKENS_LIMIT)
    if max_tokens is None:
        max_tokens = _int(body, "max_tokens", 1, MAX_TOKENS_LIMIT)
    seed = _int(body, "seed", 0, 2**32 - 1)
    params = SamplingParams(
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True),
        max_tokens=max_tokens if max_tokens is not None else DEFAULT_MAX_TOKENS,
        seed=seed,
    )
    stop_v = body.get("stop")
    stops: list[str] = [stop_v] if isinstance(stop_v, str) else stop_v if isinstance(stop_v, list) else []
    if stop_v is not None and not isinstance(stop_v, str | list):
        raise bad("stop must be a string or a list of strings", "stop")
    if len(stops) > MAX_STOP or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in stops):
        raise bad(f"stop takes at most {MAX_STOP} non-empty strings of at most {MAX_STOP_CHARS} characters", "stop")
    stream = body.get("stream")
    if stream not in (None, True, False):
        raise bad("stream must be true or false", "stream")
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise bad("stream_options must be an object", "stream_options")
    include_usage = bool(stream) and bool((opts or {}).get("include_usage"))
    return body, model, params, tuple(stops), bool(stream), include_usage


def _content(m: dict[str, Any], i: int) -> str:
    c = m.get("content")
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        texts = []
        for part in c:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad(f"messages[{i}].content: only text parts are supported", "messages")
            texts.append(part["text"])
        return "".join(texts)
    raise bad(f"messages[{i}].content must be a string or a list of text parts", "messages")


def parse_json(data: bytes | bytearray) -> object:
    """A request body's JSON value; :class:`ApiError` (400) if it is not JSON (bad UTF-8, bad
    syntax, or nesting too deep for the parser)."""
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise bad("the request body is not valid JSON") from None


def parse_chat(body: object) -> Call:
    """A ``POST /v1/chat/completions`` body as a :class:`Call`; :class:`ApiError` (400) if invalid."""
    d, model, params, stops, stream, include_usage = _common(body)
    raw = d.get("messages")
    if not isinstance(raw, list) or not raw:
        raise bad("messages must be a non-empty list", "messages")
    if len(raw) > MAX_MESSAGES:
        raise bad(f"at most {MAX_MESSAGES} messages per request; drop the oldest turns", "messages")
    messages = []
    total = 0
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or m["role"] not in ROLES:
            raise bad(f"messages[{i}].role must be one of {', '.join(ROLES)}", "messages")
        content = _content(m, i)
        total += len(content)
        messages.append(ChatMessage(ROLES[m["role"]], content))
    if total > MAX_PROMPT_CHARS:
        raise bad(f"the messages hold {total} characters; at most {MAX_PROMPT_CHARS}", "messages")
    return Call("chat", model, tuple(messages), params, stops, stream, include_usage)


def parse_completion(body: object) -> Call:
    """A ``POST /v1/completions`` body as a :class:`Call` (the prompt becomes one user message)."""
    d, model, params, stops, stream, include_usage = _common(body)
    prompt = d.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise bad("prompt must be a non-empty string (one prompt per request)", "prompt")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise bad(f"the prompt holds {len(prompt)} characters; at most {MAX_PROMPT_CHARS}", "prompt")
    if d.get("echo"):
        raise bad("echo is not supported by this gateway", "echo")
    return Call("completion", model, (ChatMessage("user", prompt),), params, stops, stream, include_usage)


def conversation_key(model: str, messages: Sequence[ChatMessage]) -> bytes | None:
    """The conversation a request continues: a hash of ``model`` and of ``messages`` up to and
    including the last assistant message; ``None`` if there is none (a first turn)."""
    last = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=-1)
    if last < 0:
        return None
    h = hashlib.sha256(json.dumps(model).encode())
    for m in messages[: last + 1]:
        h.update(b"\0" + json.dumps([m.role, m.content]).encode())
    return h.digest()


class Affinity:
    """Which model node served each conversation (bounded: the oldest are forgotten)."""

    def __init__(self, capacity: int = 10_000) -> None:
        self.capacity = capacity
        self._nodes: OrderedDict[bytes, bytes] = OrderedDict()

    def node_for(self, model: str, messages: Sequence[ChatMessage]) -> bytes | None:
        key = conversation_key(model, messages)
        if key is None or key not in self._nodes:
            return None
        self._nodes.move_to_end(key)
        return self._nodes[key]

    def served(self, model: str, messages: Sequence[ChatMessage], reply: str, node: bytes) -> None:
        key = conversation_key(model, [*messages, ChatMessage("assistant", reply)])
        assert key is not None
        self._nodes[key] = node
        self._nodes.move_to_end(key)
        while len(self._nodes) > self.capacity:
            self._nodes.popitem(last=False)

    def __len__(self) -> int:
        return len(self._nodes)


class StopScanner:
    """Cuts streamed text before the first stop string.

    ``feed(text)`` returns what may be shown now and whether a stop string was hit; text that
    could be the start of a stop string is held back until the next piece decides it.
    ``flush()`` returns what is held back once the stream ends without a stop."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self._held = ""
        self.stopped = False

    def feed(self, text: str) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        buf = self._held + text
        if not self.stops:
            return buf, False
        cut = min((i for i in (buf.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self._held = ""
            self.stopped = True
            return buf[:cut], True
        keep = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(buf)), keep, -1):
                if buf.endswith(s[:n]):
                    keep = n
                    break
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held


def finish_reason(stopped: bool, completion_tokens: int, max_tokens: int) -> str:
    return "length" if not stopped and completion_tokens >= max_tokens else "stop"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def response(call: Call, rid: str, created: int, text: str, finish: str, prompt_tokens: int,
             completion_tokens: int) -> dict[str, Any]:
    """The non-streaming answer: a ``chat.completion`` or a ``text_completion`` object."""
    if call.kind == "chat":
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                  "finish_reason": finish, "logprobs": None}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": call.model, "choices": [choice],
            "usage": usage(prompt_tokens, completion_tokens)}


def chunk(call: Call, rid: str, created: int, text: str | None, finish: str | None, *,
          first: bool = False) -> dict[str, Any]:
    """One streamed piece: ``text`` (``None`` for the final piece) and, on the last,
    ``finish``. The first chat chunk also carries the assistant role."""
    if call.kind == "chat":
        delta: dict[str, Any] = {}
        if first:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": call.model, "choices": [choice]}


class ChunkEncoder:
    """The server-sent events of one streamed reply's text pieces, byte for byte what
    ``sse(chunk(call, rid, created, text, None, first=...))`` gives; the JSON around the text of
    the pieces after the first is built once per reply (at the second of them) rather than once
    per piece."""

    _MARK = "\x00gentorrent-text\x00"

    def __init__(self, call: Call, rid: str, created: int) -> None:
        self.call, self.rid, self.created = call, rid, created
        self._texts = 0
        self._around: tuple[bytes, bytes] | None = None

    def text(self, text: str) -> bytes:
        """The event of a piece after the first."""
        self._texts += 1
        if self._texts == 2:
            parts = sse(chunk(self.call, self.rid, self.created, self._MARK, None)).split(
                json.dumps(self._MARK).encode())
            self._around = (parts[0], parts[1]) if len(parts) == 2 else None  # None: the mark is ambiguous
        if self._around is None:
            return sse(chunk(self.call, self.rid, self.created, text, None))
        return self._around[0] + json.dumps(text).encode() + self._around[1]

    def first(self, text: str) -> bytes:
        """The event of the first piece (a chat's first chunk also names the assistant role)."""
        return sse(chunk(self.call, self.rid, self.created, text, None, first=True))


def usage_chunk(call: Call, rid: str, created: int, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """The extra last chunk of ``stream_options.include_usage``: no choices, the usage."""
    obj = "chat.completion.chunk" if call.kind == "chat" else "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": call.model, "choices": [],
            "usage": usage(prompt_tokens, completion_tokens)}


def models_list(models: Sequence[str]) -> dict[str, Any]:
    """``GET /v1/models``: each model id once, sorted."""
    return {"object": "list",
            "data": [{"id": m, "object": "model", "created": 0, "owned_by": "gentorrent"} for m in sorted(set(models))]}


def sse(obj: dict[str, Any] | str) -> bytes:
    """One server-sent event: ``data: <json>`` (or a literal such as ``[DONE]``) and a blank line."""
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


# ------------------------------------------------------------------ who may call the gateway

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
MAX_API_KEY = 1024
_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*")
_SCHEME = re.compile(r"[a-z][a-z0-9+.-]{0,31}")
_TOKEN_LIST = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+(\s*,\s*[A-Za-z0-9!#$%&'*+.^_`|~-]+)*")
_DEFAULT_PORTS = {"http": 80, "https": 443}


def host_name(value: str) -> str | None:
    """``value`` as the gateway compares host names: lower case, an IPv6 literal in brackets and
    compressed (``::1``, ``[0::1]`` -> ``[::1]``); ``None`` if it is not a DNS name or an IP literal
    (a port, a scheme, a path, a trailing dot or an empty name are not)."""
    v = value.strip().lower()
    inner = v[1:-1] if v.startswith("[") and v.endswith("]") else v
    if ":" in inner:
        try:
            return f"[{ipaddress.IPv6Address(inner).compressed}]"
        except ValueError:
            return None
    if v != inner or len(v) > 253 or not _NAME.fullmatch(v):
        return None
    return v


def split_authority(value: str) -> tuple[str, int | None] | None:
    """A ``Host`` header's (or an origin's) ``(host name, port)``: ``name``, ``name:port``,
    ``[v6]`` or ``[v6]:port``; the port is ``None`` when absent. ``None`` if malformed."""
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[: end + 1], value[end + 1:]
        if rest and not rest.startswith(":"):
            return None
        port = rest[1:] if rest else None
    else:
        name, sep, port_text = value.partition(":")
        port = port_text if sep else None
    host = host_name(name)
    if host is None:
        return None
    if port is None:
        return host, None
    if not port.isascii() or not port.isdigit() or len(port) > 5 or int(port) > 65535:
        return None
    return host, int(port)


def parse_origin(value: str) -> tuple[str, str, int | None] | None:
    """A serialized origin (``scheme://host[:port]``, no path) as ``(scheme, host, port)``, the
    port filled in for http (80) and https (443) when absent; ``None`` for anything else, ``null``
    (an opaque origin: a sandboxed frame, a ``file:`` page) included."""
    scheme, sep, rest = value.strip().partition("://")
    scheme = scheme.lower()
    if not sep or not _SCHEME.fullmatch(scheme) or not rest or "/" in rest or "@" in rest:
        return None
    parts = split_authority(rest)
    if parts is None:
        return None
    host, port = parts
    return scheme, host, port if port is not None else _DEFAULT_PORTS.get(scheme)


def _origin_text(origin: tuple[str, str, int | None]) -> str:
    scheme, host, port = origin
    return f"{scheme}://{host}" + ("" if port is None or port == _DEFAULT_PORTS.get(scheme) else f":{port}")


def _shown(value: str) -> str:
    return json.dumps(value[:100])


class Headers:
    """An ASGI scope's request headers by lower-case name (latin-1 text); :class:`ApiError` 400
    ``duplicate_header`` when one that the gateway reads is sent twice."""

    SINGLE = frozenset({"host", "origin", "authorization", "sec-fetch-site", "content-type", "content-length"})

    def __init__(self, raw: Sequence[tuple[bytes, bytes]]) -> None:
        self.values: dict[str, str] = {}
        for k, v in raw:
            name = k.decode("latin-1").lower()
            if name in self.values and name in self.SINGLE:
                raise ApiError(400, f"the request carries more than one {name} header", code="duplicate_header")
            self.values.setdefault(name, v.decode("latin-1"))

    def get(self, name: str) -> str | None:
        return self.values.get(name)


@dataclass(frozen=True, slots=True)
class Guard:
    """Who may call the gateway, checked on a request's headers before its body is read.

    - ``Host`` must name the gateway (against DNS rebinding: a page whose name was re-pointed
      at 127.0.0.1 sends its own name): one of ``hosts``, with the port the request came in on
      or without a port; else 421 ``bad_host``.
    - A request with an ``Origin`` (a browser's, against CSRF) must come from the gateway's own
      origin (``http://`` one of ``hosts`` ``:`` port) or one of ``origins``; ``null`` never;
      ``Sec-Fetch-Site: cross-site`` is refused unless the origin is one of ``origins``; else
      403 ``cross_origin``.
    - With an API key, every request carries ``Authorization: Bearer <key>`` (compared in
      constant time, on SHA-256 digests so not even the length leaks); else 401
      ``invalid_api_key``. A CORS preflight (``OPTIONS`` with
      ``Access-Control-Request-Method``) from one of ``origins`` needs none: browsers send it
      without credentials.

    A listed origin (``origins``) is the only one answered with CORS headers (:meth:`cors`);
    with none listed no page elsewhere can read an answer."""

    hosts: frozenset[str]
    origins: frozenset[tuple[str, str, int | None]] = frozenset()
    key_digest: bytes | None = None

    @classmethod
    def make(cls, bind_host: str, allow_hosts: Sequence[str] = (), allow_origins: Sequence[str] = (),
             api_key: str | None = None) -> Guard:
        """The guard of a gateway bound to ``bind_host``: it answers to that host, to the loopback
        names (``localhost``, ``127.0.0.1``, ``[::1]``) when the bind is loopback or a wildcard
        (``0.0.0.0``, ``::``: reachable through loopback too), and to each of ``allow_hosts``.
        :class:`ValueError` naming the bad value for a host that is not a name or IP literal, an
        origin that is not ``scheme://host[:port]``, or a key that is not 1 to 1,024 printable
        ASCII characters without spaces."""
        bind = host_name(bind_host)
        if bind is None:
            raise ValueError(f"the bind address {bind_host!r} is not a host name or IP literal")
        hosts = {bind}
        try:
            ip = ipaddress.ip_address(bind.strip("[]"))
            local = ip.is_loopback or ip.is_unspecified
        except ValueError:
            local = bind == "localhost"
        if local:
            hosts.update(LOOPBACK_NAMES)
        for h in allow_hosts:
            name = host_name(h)
            if name is None:
                raise ValueError(f"--allow-host {h!r} is not a host name or IP literal (no port, no scheme)")
            hosts.add(name)
        origins = set()
        for o in allow_origins:
            parsed = parse_origin(o)
            if parsed is None:
                raise ValueError(f"--allow-origin {o!r} is not an origin: scheme://host[:port], no path, not null")
            origins.add(parsed)
        digest = None
        if api_key is not None:
            if not 0 < len(api_key) <= MAX_API_KEY or not all("!" <= c <= "~" for c in api_key):
                raise ValueError(f"the API key must be 1 to {MAX_API_KEY} printable ASCII characters without spaces")
            digest = hashlib.sha256(api_key.encode()).digest()
        return cls(frozenset(hosts), frozenset(origins), digest)

    def check(self, method: str, headers: Headers, port: int | None) -> tuple[str, str, int | None] | None:
        """``None`` for a request the gateway serves as its own (no ``Origin``, or its own), the
        listed origin for one from ``origins``; :class:`ApiError` for a refused request.
        ``port``: the port the request came in on (the ASGI scope's ``server``)."""
        host = headers.get("host")
        parts = split_authority(host) if host is not None else None
        if parts is None or parts[0] not in self.hosts or parts[1] not in (None, port):
            raise ApiError(421, f"the Host header {_shown(host) if host is not None else '(none)'} does not name "
                                f"this gateway (it answers to {', '.join(sorted(self.hosts))}, on port {port}); "
                                "a page reaching it under another name (DNS rebinding) is refused. --allow-host "
                                "adds a name", code="bad_host")
        listed = None
        origin = headers.get("origin")
        if origin is not None:
            parsed = parse_origin(origin)
            if parsed is not None and parsed in self.origins:
                listed = parsed
            elif parsed is None or parsed != ("http", parsed[1], port) or parsed[1] not in self.hosts:
                raise ApiError(403, f"requests from the web origin {_shown(origin)} are refused: only the gateway's "
                                    "own origin and those given with --allow-origin may call it", code="cross_origin")
        if listed is None and (headers.get("sec-fetch-site") or "").strip().lower() == "cross-site":
            raise ApiError(403, "cross-site requests are refused (Sec-Fetch-Site: cross-site): only the gateway's "
                                "own origin and those given with --allow-origin may call it", code="cross_origin")
        preflight = method == "OPTIONS" and headers.get("access-control-request-method") is not None
        if self.key_digest is not None and not (preflight and listed is not None):
            scheme, _, token = (headers.get("authorization") or "").strip().partition(" ")
            given = hashlib.sha256(token.strip().encode("latin-1")).digest()
            if not (hmac.compare_digest(given, self.key_digest) and scheme.lower() == "bearer"):
                raise ApiError(401, "this gateway needs its API key: send 'Authorization: Bearer <key>' with the "
                                    "key given by --api-key or GENTORRENT_API_KEY", code="invalid_api_key")
        return listed

    @staticmethod
    def cors(origin: tuple[str, str, int | None], headers: Headers | None = None) -> list[tuple[bytes, bytes]]:
        """The CORS headers for a listed ``origin``; with the ``headers`` of a preflight, those
        that answer it (the methods the gateway serves, the request headers it asked for when
        they are a valid token list, private-network access when asked)."""
        out = [(b"access-control-allow-origin", _origin_text(origin).encode()), (b"vary", b"Origin"),
               (b"access-control-expose-headers", b"x-gentorrent-node, x-gentorrent-verified")]
        if headers is not None:
            asked = (headers.get("access-control-request-headers") or "").strip()
            allowed = asked if len(asked) <= 1024 and _TOKEN_LIST.fullmatch(asked) else "authorization, content-type"
            out += [(b"access-control-allow-methods", b"GET, POST"),
                    (b"access-control-allow-headers", allowed.encode()),
                    (b"access-control-max-age", b"600")]
            if (headers.get("access-control-request-private-network") or "").strip().lower() == "true":
                out.append((b"access-control-allow-private-network", b"true"))
        return out


def check_json_body(content_type: str | None) -> None:
    """A POST body must be declared JSON: ``application/json``, optionally with
    ``charset=utf-8``; else 415 ``unsupported_media_type`` (a page's form or ``text/plain``
    post, sent without a CORS preflight, never is)."""
    media, *params = (content_type or "").split(";")
    ok = media.strip().lower() == "application/json"
    for p in params:
        name, _, value = p.partition("=")
        ok = ok and name.strip().lower() == "charset" and value.strip().strip('"').lower() in ("utf-8", "utf8")
    if not ok:
        raise ApiError(415, f"the request body must be JSON, sent with 'Content-Type: application/json' (got "
                            f"{_shown(content_type) if content_type is not None else 'none'})",
                       code="unsupported_media_type")
