"""The OpenAI-compatible request and response shapes of ``gentorrent user serve``, as plain functions.

I/O-free: the HTTP layer (:mod:`user_client.gateway`) hands each parsed JSON body to
:func:`parse_chat` or :func:`parse_completion`, which either return a :class:`Call` or
raise :class:`ApiError` (the OpenAI error body and its HTTP status); replies are shaped by
the ``*_response`` / ``*_chunk`` functions and framed for streaming by :func:`sse`.

What maps to what (the overlay's :class:`~overlay.messages.Request` carries chat messages
and :class:`~overlay.messages.SamplingParams`, nothing else):

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
import json
import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from overlay.messages import MAX_PROMPT_CHARS, ChatMessage, SamplingParams

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
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
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
