"""``gentorrent user serve``: an OpenAI-compatible HTTP API whose every call goes over the overlay.

A thin Starlette app served by Hypercorn's trio worker, in the same trio run as the user
node that carries the calls: ``GET /v1/models``, ``POST /v1/chat/completions`` and
``POST /v1/completions`` (streamed as server-sent events or not). Validation and response
shapes are the plain functions of :mod:`user_client.openai_api`; this module only moves
bytes between HTTP and a :class:`Backend` (the real one, :class:`AnonBackend`, is the
:class:`~overlay.anon.client.AnonClient` users run, with session affinity per conversation).

Who may call (:class:`~user_client.openai_api.Guard`, on the headers alone, before the body is
read and before anything is sent to the network; a refusal leaves no state): a ``Host`` that
does not name the gateway is refused 421 ``bad_host`` (DNS rebinding), a browser request from
another web origin 403 ``cross_origin`` (CSRF) unless ``--allow-origin`` lists it (only a listed
origin gets CORS headers), a missing or wrong ``Authorization: Bearer`` key 401
``invalid_api_key`` when ``--api-key`` is set; a POST body not declared ``application/json`` is
refused 415 ``unsupported_media_type``.

Bounds: a body over ``max_body`` bytes is refused (413) without being read further; a body not
received whole within ``body_timeout`` seconds is refused (408 ``body_timeout``, and the
connection closed); a call takes one of ``max_concurrent`` slots only once its body is read and
valid, and more calls in flight are refused (429), so clients that send their bodies slowly
never hold a slot. Hypercorn closes a connection whose request headers do not arrive within
``keep_alive_timeout`` (:func:`server_config`). Errors are OpenAI-shaped: 400 bad parameters,
401 no or a wrong API key, 403 another web origin, 404 unknown model, 408 body too slow, 413 body
too large, 415 body not JSON, 421 a Host not this gateway's, 429 too many calls, 502 the model
node answered with an error (``model_node_error``) or a reply failed its check against the
model node's signature (``reply_unverified``: never returned as a success), 503 no model node
reachable, fewer proxy paths ready than a request needs, or a model the committee's verifiers do
not audit (``model_unaudited``; ``--allow-unaudited`` lifts it). ``GET /v1/models`` lists the
models with a node a call may use: trusted, and audited unless ``--allow-unaudited``.
With ``--donate-prompts``, a complete reply's request may be donated to the committee's audits
(:mod:`user_client.donate`); with ``--donate-transcripts``, some calls are sent committed to and
their transcripts revealed to every verifier (:mod:`user_client.transcripts`: the backend's client
is then a :class:`~user_client.transcripts.DonatingClient`). An error after streaming began is
sent as a last ``data: {"error": ...}`` event and the stream ends without ``[DONE]``. Only
verified text is ever sent: the anonymous client yields nothing that failed its check.

Beyond OpenAI's fields, a reply's headers say which model nodes served it
(``x-gentorrent-node``: hex ids, comma-separated and in order when a failover handed the
reply on) and, when not streamed, whether its signatures were checked to its end
(``x-gentorrent-verified``).
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import math
import os
import signal
import sys
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import trio
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from overlay.anon.client import AnonError, ModelUnaudited, QuotaExhausted, unaudited_message
from overlay.net.peers import PeerEntry, usable
from overlay.wire.clock import Clock, TrioClock
from overlay.wire.failures import Failure
from overlay.wire.messages import ChatMessage, ReplyChunk, SamplingParams
from user_client import openai_api as api
from user_client.cli import API_KEY_ENV, DEFAULT_BODY_TIMEOUT, DEFAULT_MAX_BODY, DEFAULT_MAX_CONCURRENT
from user_client.donate import Donor

log = logging.getLogger("gentorrent.gateway")


class Backend(Protocol):
    """Where calls go: :class:`AnonBackend` over the overlay, or a fake in tests."""

    def models(self) -> list[str]:
        """Model ids a call may use: served by a usable model node (trusted; of an audited model
        unless the user allowed unaudited ones)."""
        ...

    def unaudited(self) -> list[str]:
        """Model ids left out of :meth:`models` only because the committee does not audit them."""
        ...

    def request(self, model: str, messages: Sequence[ChatMessage], params: SamplingParams,
                node: bytes | None, *, sent_to: set[bytes] | None = None) -> AsyncGenerator[ReplyChunk, None]:
        """The reply chunks in order; :class:`~overlay.anon.client.AnonError` or :class:`api.ApiError`
        on failure. ``node`` prefers a model node (session affinity); ``sent_to`` collects the model
        nodes the call was sent to (:meth:`~overlay.anon.client.AnonClient.request`)."""
        ...


class AnonBackend:
    """Calls through an :class:`~overlay.anon.client.AnonClient` (the user's own anonymous client).

    Before each call it waits up to ``paths_timeout`` seconds for the n proxy paths a request
    needs (503 ``not_enough_paths`` otherwise); ``timeout`` bounds the wait for each chunk (the
    client's ``chunk_timeout``)."""

    def __init__(self, client: Any, models: Callable[[], list[str]], *, timeout: float = 60.0,
                 paths_timeout: float = 10.0, unaudited: Callable[[], list[str]] = list) -> None:
        self.client = client
        self._models = models
        self._unaudited = unaudited
        self.timeout = timeout
        self.paths_timeout = paths_timeout

    def models(self) -> list[str]:
        return self._models()

    def unaudited(self) -> list[str]:
        return self._unaudited()

    async def request(self, model: str, messages: Sequence[ChatMessage], params: SamplingParams,
                      node: bytes | None, *, sent_to: set[bytes] | None = None) -> AsyncGenerator[ReplyChunk, None]:
        paths, n = self.client.paths, self.client.n
        if len(paths.ready_paths()) < n:  # the usual case skips the wait's set-up
            with trio.move_on_after(self.paths_timeout) as waited:
                await paths.wait_ready(n)
            if waited.cancelled_caught:
                raise api.ApiError(503, f"not enough proxy paths to send a request anonymously: "
                                   f"{paths.too_few(n, self.paths_timeout)}",
                                   type="service_unavailable", code="not_enough_paths")
        async with aclosing(self.client.request(model, list(messages), params, node=node,
                                                chunk_timeout=self.timeout, paths_timeout=self.paths_timeout,
                                                sent_to=sent_to)) as chunks:
            async for c in chunks:
                yield c


def unaudited_error(model: str) -> api.ApiError:
    """The 503 for a model the committee's verifiers do not audit (``--allow-unaudited`` lifts it)."""
    return api.ApiError(503, unaudited_message(model), type="service_unavailable", param="model",
                        code="model_unaudited")


def error_for(exc: AnonError) -> api.ApiError:
    """503 when no model node answered, every one was busy or the model is not audited, 502 when
    one answered with an error or its reply failed verification: by the failure's kind, never by
    its message."""
    msg = str(exc)
    if isinstance(exc, ModelUnaudited):
        return unaudited_error(exc.model)
    if isinstance(exc, QuotaExhausted):
        return api.ApiError(429, msg, type="rate_limit_exceeded", code="quota_exceeded",
                            retry_after=max(1, math.ceil(exc.wait_s)))
    if exc.kind is Failure.UNVERIFIED:
        return api.ApiError(502, f"the reply failed verification and was refused: {msg}", type="model_node_error",
                            code="reply_unverified")
    if exc.kind in (Failure.ALL_BUSY, Failure.BUSY):
        return api.ApiError(503, f"every model node is busy: {msg}; retry later", type="service_unavailable",
                            code="model_nodes_busy")
    if exc.kind in (Failure.SILENT, Failure.LOST, Failure.NO_MODEL_NODE):
        return api.ApiError(503, f"no model node reachable: {msg}", type="service_unavailable",
                            code="no_model_node_reachable")
    return api.ApiError(502, msg, type="model_node_error", code="model_node_error")


def model_ids(entries: Sequence[PeerEntry], allow_unaudited: bool) -> tuple[list[str], list[str]]:
    """``(usable, unaudited)`` model ids of the model nodes ``entries``: those served by a node a
    call may use (:func:`overlay.net.peers.usable`), and those served by trusted nodes only of a model
    the committee does not audit (so left out unless ``allow_unaudited``). Models served by
    untrusted nodes only are in neither."""
    ok: set[str] = set()
    held: set[str] = set()
    for e in entries:
        if usable(e, allow_unaudited):
            ok.update(e.models)
        elif e.trusted:
            held.update(e.models)
    return sorted(ok), sorted(held - ok)


@dataclass
class Outcome:
    """What a finished call produced (for the final chunk, the affinity map and the headers).

    ``nodes``: every model node that served a part of the reply, in order (more than one
    after a failover); ``sent_to``: every model node the call was sent to (those that refused
    it or failed too); ``earlier``: the node the affinity map sent the conversation's earlier
    turns to, if it knows one; ``prompt_tokens``: the prompt's token count as the first of
    ``nodes`` reported it."""

    text: list[str] = field(default_factory=list)
    tokens: int = 0
    prompt_tokens: int = 0
    nodes: list[bytes] = field(default_factory=list)
    sent_to: set[bytes] = field(default_factory=set)
    earlier: bytes | None = None
    verified: bool = False
    stopped: bool = False
    first_piece_s: float | None = None

    @property
    def node(self) -> bytes | None:
        """The node that served the end of the reply (the one follow-ups go back to)."""
        return self.nodes[-1] if self.nodes else None

    def seen_by(self) -> set[bytes]:
        """The model nodes that have read the conversation, as far as a gateway knows (a donation
        names them, decision 0029): this call's, and the node its earlier turns went to. The
        affinity map keeps only the last node of a conversation: nodes that served earlier turns
        before a failover, or that refused them, are not known here."""
        return {*self.sent_to, *self.nodes, *([self.earlier] if self.earlier is not None else [])}


async def pieces(
    backend: Backend, affinity: api.Affinity, call: api.Call, out: Outcome
) -> AsyncGenerator[str, None]:
    """The reply's visible text, piece by piece, with stop strings applied; fills ``out``.

    A reply that ends normally (its last chunk verified by the client) is recorded in
    ``affinity`` for the conversation's follow-ups."""
    scanner = api.StopScanner(call.stop)
    t0 = time.perf_counter()
    out.earlier = affinity.node_for(call.model, call.messages)
    async with aclosing(backend.request(call.model, call.messages, call.params, out.earlier,
                                        sent_to=out.sent_to)) as chunks:
        async for c in chunks:
            out.tokens += len(c.token_ids)
            if not out.prompt_tokens:
                out.prompt_tokens = c.prompt_tokens
            if not out.nodes or out.nodes[-1] != c.node:
                out.nodes.append(c.node)
            text, stopped = scanner.feed(c.text)
            if text:
                if out.first_piece_s is None:
                    out.first_piece_s = time.perf_counter() - t0
                out.text.append(text)
                yield text
            if stopped:
                out.stopped = True
                break
            if c.done:
                out.verified = True  # every chunk passed its check and this one ends the reply
    if not out.stopped:
        rest = scanner.flush()
        if rest:
            out.text.append(rest)
            yield rest
    if out.node is not None and call.kind == "chat":
        affinity.served(call.model, call.messages, "".join(out.text), out.node)


class Gateway:
    """The ASGI app (``self.app``: the :class:`~user_client.openai_api.Guard`'s checks, then the
    routes) and its limits. ``guard`` defaults to a loopback gateway's: loopback names only, no
    other origin, no API key."""

    def __init__(self, backend: Backend, *, max_body: int = DEFAULT_MAX_BODY,
                 max_concurrent: int = DEFAULT_MAX_CONCURRENT, body_timeout: float = DEFAULT_BODY_TIMEOUT,
                 guard: api.Guard | None = None, clock: Clock | None = None, donor: Donor | None = None) -> None:
        self.backend = backend
        self.donor = donor  # --donate-prompts: offered each complete reply's request
        self.clock: Clock = clock or TrioClock()  # stamps replies' ``created``
        self.guard = guard or api.Guard.make("127.0.0.1")
        self.max_body = max_body
        self.max_concurrent = max_concurrent
        self.body_timeout = body_timeout
        self.active = 0
        self.served = 0
        self.affinity = api.Affinity()
        self.routes = Starlette(routes=[
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/models", self.list_models, methods=["GET"]),
        ])

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI app: an HTTP request passes the guard (on its headers, nothing read, nothing
        kept) or is answered with the refusal; a CORS preflight from a listed origin is answered
        here; a listed origin's answers carry its CORS headers."""
        if scope["type"] != "http":
            return await self.routes(scope, receive, send)
        server = scope.get("server")
        try:
            headers = api.Headers(scope["headers"])
            listed = self.guard.check(scope["method"], headers, server[1] if server else None)
        except api.ApiError as exc:
            return await _error(exc)(scope, receive, send)
        if listed is None:
            return await self.routes(scope, receive, send)
        if scope["method"] == "OPTIONS" and headers.get("access-control-request-method") is not None:
            return await Response(status_code=204, headers=dict(
                (k.decode(), v.decode()) for k, v in api.Guard.cors(listed, headers)))(scope, receive, send)
        cors = api.Guard.cors(listed)

        async def send_cors(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *cors]}
            await send(message)

        await self.routes(scope, receive, send_cors)

    async def list_models(self, request: Request) -> Response:
        return JSONResponse(api.models_list(self.backend.models()))

    async def chat(self, request: Request) -> Response:
        return await self._handle(request, api.parse_chat)

    async def completions(self, request: Request) -> Response:
        return await self._handle(request, api.parse_completion)

    async def _body(self, request: Request) -> object:
        """The request's JSON body, read whole within ``body_timeout`` seconds (408 otherwise)."""
        api.check_json_body(request.headers.get("content-type"))
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_body):
            raise api.ApiError(413, f"the request body is larger than {self.max_body} bytes", code="body_too_large")
        data = bytearray()
        with trio.move_on_after(self.body_timeout):
            try:
                async for part in request.stream():
                    data += part
                    if len(data) > self.max_body:
                        raise api.ApiError(413, f"the request body is larger than {self.max_body} bytes",
                                           code="body_too_large")
            except ClientDisconnect:
                raise api.ApiError(400, "the client hung up before sending the whole body",
                                   code="body_incomplete") from None
            return api.parse_json(data)
        raise api.ApiError(408, f"the request body did not arrive whole within {self.body_timeout:g} s",
                           code="body_timeout")

    def _check_model(self, call: api.Call) -> None:
        if call.model not in self.backend.models():
            if call.model in self.backend.unaudited():
                raise unaudited_error(call.model)
            raise api.ApiError(404, f"the model {call.model!r} is not served by any model node of the "
                                    "registry; GET /v1/models lists those that are", param="model",
                               code="model_not_found")

    async def _handle(self, request: Request, parse: Callable[[object], api.Call]) -> Response:
        try:  # the body is read and checked before the call takes a slot: a slow body holds none
            call = parse(await self._body(request))
            self._check_model(call)
        except api.ApiError as exc:
            return _error(exc)
        if self.active >= self.max_concurrent:
            return _error(api.ApiError(429, f"the gateway is handling {self.max_concurrent} calls already; retry "
                                            "shortly", type="rate_limit_exceeded", code="too_many_requests"))
        self.active += 1
        release = True
        try:
            out = Outcome()
            gen = pieces(self.backend, self.affinity, call, out)
            try:
                first = await _first(gen)
            except AnonError as exc:
                raise error_for(exc) from None
            rid = ("chatcmpl-" if call.kind == "chat" else "cmpl-") + os.urandom(16).hex()
            created = int(self.clock.unix())
            if call.stream:
                release = False  # the stream releases the slot when it ends
                return EventStream(self._stream(call, rid, created, first, gen, out),
                                   {"cache-control": "no-cache", "x-gentorrent-node": _nodes(out)})
            texts = [] if first is None else [first]
            try:
                async with aclosing(gen):
                    async for t in gen:
                        texts.append(t)
            except AnonError as exc:
                raise error_for(exc) from None
            self.served += 1
            self._donate(call, out)
            finish = api.finish_reason(out.stopped, out.tokens, call.params.max_tokens)
            return JSONResponse(api.response(call, rid, created, "".join(texts), finish, out.prompt_tokens,
                                             out.tokens),
                                headers=_served_headers(out))
        except api.ApiError as exc:
            return _error(exc)
        finally:
            if release:
                self.active -= 1

    def _donate(self, call: api.Call, out: Outcome) -> None:
        """Offer a complete reply's request to the donor (fire and forget: it never raises)."""
        if self.donor is not None and (out.verified or out.stopped):
            self.donor.offer(call.model, call.messages, call.params, seen_by=out.seen_by())

    async def _stream(self, call: api.Call, rid: str, created: int, first: str | None,
                      gen: AsyncGenerator[str, None], out: Outcome) -> AsyncGenerator[tuple[bytes, bool], None]:
        """The reply's events as ``(bytes, last)``: the last one ends the body. The call's slot
        is released before the last event leaves (or when the stream is abandoned), so a client
        that has read the whole reply never finds its slot still taken."""
        last: bytes | None = None
        try:
            piece = api.ChunkEncoder(call, rid, created)
            if first is not None:
                yield piece.first(first), False
            try:
                async with aclosing(gen):
                    async for t in gen:
                        yield (piece.text(t) if first is not None else piece.first(t)), False
                        first = t
            except AnonError as exc:
                last = api.sse(error_for(exc).body())
            except api.ApiError as exc:
                last = api.sse(exc.body())
            else:
                finish = api.finish_reason(out.stopped, out.tokens, call.params.max_tokens)
                last = api.sse(api.chunk(call, rid, created, None, finish, first=first is None))
                if call.include_usage:
                    last += api.sse(api.usage_chunk(call, rid, created, out.prompt_tokens, out.tokens))
                last += b"data: [DONE]\n\n"  # the last events and the end of the body: one message
                self.served += 1
                self._donate(call, out)
        finally:
            self.active -= 1
        yield last, True


class EventStream(Response):
    """A ``text/event-stream`` response that writes each event the moment it is produced.

    ``events`` yields ``(bytes, last)``; the item with ``last`` ends the body, in the same ASGI
    message. Unlike Starlette's ``StreamingResponse``, the headers and the first event leave from
    the handler's own task (no task switch before the first token), and one plain trio task
    (no anyio task group) watches for the client hanging up (``http.disconnect``): the stream is
    then cancelled, which closes ``events`` and abandons the overlay request."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncGenerator[tuple[bytes, bool], None], headers: dict[str, str]) -> None:
        self.status_code = 200
        self.background = None
        self.events = events
        self.init_headers(headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with trio.open_nursery() as nursery, aclosing(self.events) as events:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            watching = False
            async for data, last in events:
                await send({"type": "http.response.body", "body": data, "more_body": not last})
                if last:
                    break
                if not watching:  # after the first event, which leaves before the watcher starts
                    nursery.start_soon(_cancel_on_disconnect, receive, nursery.cancel_scope)
                    watching = True
            nursery.cancel_scope.cancel()


async def _cancel_on_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


async def _first(gen: AsyncGenerator[str, None]) -> str | None:
    """The first piece, or ``None`` for an empty reply (errors before any text surface here)."""
    try:
        return await gen.__anext__()
    except StopAsyncIteration:
        return None


def _nodes(out: Outcome) -> str:
    return ",".join(n.hex() for n in out.nodes)


def _served_headers(out: Outcome) -> dict[str, str]:
    """Which model nodes served (comma-separated hex ids, in order: more than one after a
    failover) and whether the reply's signatures were checked to its end (not OpenAI fields;
    a stream's headers leave with its first text, so they name only the node that sent it)."""
    return {"x-gentorrent-node": _nodes(out),
            "x-gentorrent-verified": "true" if out.verified else "false"}


def _error(exc: api.ApiError) -> JSONResponse:
    """The OpenAI-shaped answer to ``exc``; a 408 closes the connection (the rest of the body may
    still be on its way), a 401 names the scheme the key goes in, a used-up quota says in
    Retry-After when it refills."""
    headers = {"connection": "close"} if exc.status == 408 else {"www-authenticate": "Bearer"} \
        if exc.status == 401 else None
    if exc.retry_after is not None:
        headers = {**(headers or {}), "retry-after": str(exc.retry_after)}
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


HEADER_TIMEOUT = 5.0  # seconds for a request's headers to arrive, and for an idle kept-alive connection
MAX_HEADER_BYTES = 16 * 1024


def server_config(bind: str) -> Any:
    """Hypercorn's config for the gateway on ``bind`` (``HOST:PORT``; ``[V6]:PORT``): no access
    log, errors to the ``gentorrent.gateway.http`` logger, no ``server`` header, kept-alive
    connections reused for up to 100,000 calls (an OpenAI client pools a few), 1 s to finish
    calls on shutdown.

    Slow clients: Hypercorn's ``keep_alive_timeout`` runs from the moment a connection opens (or
    its last answer ends) until a request's headers are whole, so a connection whose headers
    trickle in, or that sits idle, is closed after :data:`HEADER_TIMEOUT` s; the headers are at
    most :data:`MAX_HEADER_BYTES`. The body is the app's to bound (``--body-timeout``).
    ``read_timeout`` stays off: it bounds every socket read, and the client sends nothing while a
    long reply streams to it."""
    from hypercorn.config import Config as HyperConfig

    hc = HyperConfig()
    hc.bind = [bind]
    hc.accesslog = None
    hc.errorlog = logging.getLogger("gentorrent.gateway.http")
    hc.include_server_header = False
    hc.keep_alive_max_requests = 100_000
    hc.keep_alive_timeout = HEADER_TIMEOUT
    hc.h11_max_incomplete_size = MAX_HEADER_BYTES
    hc.read_timeout = None
    hc.graceful_timeout = 1.0
    return hc


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def flag_values(values: Sequence[str] | None) -> list[str]:
    """A repeatable flag's values, each of which may be a comma-separated list."""
    return [v.strip() for value in values or () for v in value.split(",") if v.strip()]


def guard_from_args(args: argparse.Namespace, environ: Any = os.environ) -> api.Guard:
    """The :class:`~user_client.openai_api.Guard` of ``--host``, ``--allow-host``,
    ``--allow-origin`` and ``--api-key`` (else the ``GENTORRENT_API_KEY`` environment variable;
    empty means none); :class:`~gentorrent.cli.CliError` for a bad value (never showing the key)."""
    from gentorrent.cli import CliError

    key = args.api_key if args.api_key is not None else environ.get(API_KEY_ENV) or None
    try:
        return api.Guard.make(args.host, flag_values(args.allow_host), flag_values(args.allow_origin), key)
    except ValueError as exc:
        raise CliError(str(exc)) from None


async def _serve_api(serve: Callable[..., Any], app: Any, config: Any, announce: Callable[[str], None]) -> None:
    """Hypercorn's ``serve`` of ``app`` until cancelled; ``announce`` the address once it listens."""
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(serve, app, config)
        announce(binds[0])


def _announce(bound: str, *, models: Callable[[], Sequence[str]], held: Callable[[], Sequence[str]], keyed: bool,
              proxies: int) -> None:
    """``READY <base url>`` on standard output, what the API serves (``models()``, not ``held()``)
    on standard error."""
    print(f"READY {bound}/v1", flush=True)
    served, left_out = models(), held()
    print(f"[OpenAI-compatible API on {bound}/v1; models: {', '.join(served) or 'none'}"
          + (f"; not audited by the committee, left out (--allow-unaudited uses them): {', '.join(left_out)}"
             if left_out else "") + ("; API key required" if keyed else "")
          + f"; building {proxies} proxy paths]", file=sys.stderr, flush=True)


def run_serve(args: argparse.Namespace) -> int:
    """Start the user node and the HTTP gateway; print ``READY <base url>`` once both listen."""
    from hypercorn.trio import serve

    from gentorrent.cli import CliError, resolve_config, run_async
    from overlay.directory.membership import directory, node_entry, serve_member
    from overlay.net.transport import TLSTransport
    from overlay.usernode import UserNode
    from overlay.wire.identity import load_or_create
    from user_client.chat import (
        check_donation_committee,
        check_donation_settings,
        make_donor,
        make_transcript_donor,
    )
    from user_client.relay_node import listen_address
    from user_client.transcripts import DonatingClient, reveal_before_stopping

    cfg = resolve_config(args)
    if not is_loopback(args.host) and not args.listen_public:
        raise CliError(f"--host {args.host} is not a loopback address: anyone reaching it would use your user "
                       "node (with --api-key, anyone who has the key). Pass --listen-public if that is intended")
    if not 0 <= args.port <= 65535:
        raise CliError("--port must be within 0..65535")
    if args.max_body < 1024 or args.max_concurrent < 1:
        raise CliError("--max-body must be at least 1024 and --max-concurrent at least 1")
    if not 0 < args.body_timeout <= 3600:
        raise CliError("--body-timeout must be more than 0 and at most 3600 seconds")
    guard = guard_from_args(args)
    if not 1 <= cfg.threshold <= cfg.cloves <= 16 or cfg.proxies < cfg.cloves:
        raise CliError("need 1 <= threshold (k) <= cloves (n) <= 16 and proxies (N) >= cloves")
    check_donation_settings(cfg)
    identity = load_or_create(cfg.data_path)
    registry, committee, _ = directory(cfg)
    check_donation_committee(cfg, committee)
    host, port = listen_address(cfg)
    user = UserNode(identity, TLSTransport(identity), registry, region=cfg.region, n=cfg.cloves,
                    k=cfg.threshold, paths=cfg.proxies, refresh=cfg.path_refresh, ping_interval=0,
                    registered_only=committee is not None)
    assert user.client is not None
    user.client.allow_unaudited = cfg.allow_unaudited

    def models() -> list[str]:
        return model_ids(registry.models(), cfg.allow_unaudited)[0]

    def unaudited() -> list[str]:
        return model_ids(registry.models(), cfg.allow_unaudited)[1]

    client = DonatingClient(user.client) if cfg.donate_transcripts else user.client  # its donor: once registered
    backend = AnonBackend(client, models, timeout=args.timeout, paths_timeout=args.paths_timeout,
                          unaudited=unaudited)
    gateway = Gateway(backend, max_body=args.max_body, max_concurrent=args.max_concurrent,
                      body_timeout=args.body_timeout, guard=guard)
    hc = server_config(f"[{args.host}]:{args.port}" if ":" in args.host else f"{args.host}:{args.port}")
    if args.listen_public and not is_loopback(args.host):
        print(f"gentorrent: WARNING: the gateway listens on {args.host}, beyond loopback, "
              + ("with no API key: anyone who reaches it sends prompts through your user node." if
                 guard.key_digest is None else "over plain HTTP: the API key crosses the network unencrypted.")
              + f" It answers to the host names {', '.join(sorted(guard.hosts))} (--allow-host adds one).",
              file=sys.stderr)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            _, member = await nursery.start(  # registered, its lists from the committee (live)
                serve_member, user, host, port, committee, registry,
                lambda address: node_entry(identity, cfg.advertise or address, cfg.region))
            if member is not None:
                from overlay.directory.wallet import member_wallet

                assert user.client is not None
                user.client.quota = member_wallet(identity, member, data_dir=cfg.data_path)  # quota tokens, if issued
                if cfg.donate_prompts:
                    donor = make_donor(cfg, identity, member.settings.addresses,
                                       lambda: [v.public_key for v in member.client.validators])
                    await nursery.start(donor.run)
                    gateway.donor = donor
                if isinstance(client, DonatingClient):
                    client.donor = make_transcript_donor(cfg, identity, member.settings.addresses,
                                                         lambda: [v.public_key for v in member.client.validators],
                                                         member.powers)
                    await nursery.start(client.donor.run)

            # the first Ctrl-C or SIGTERM stops the API, then the donated transcripts' reveals still
            # out are given a few seconds (a commitment left unrevealed burns the donor); a second
            # one stops at once
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as stops:
                announce = partial(_announce, models=models, held=unaudited, keyed=guard.key_digest is not None,
                                   proxies=cfg.proxies)
                await reveal_before_stopping(partial(_serve_api, serve, gateway.app, hc, announce), stops,
                                             getattr(client, "donor", None),
                                             lambda text: print(text, file=sys.stderr, flush=True))
            nursery.cancel_scope.cancel()

    try:
        run_async(main, long_lived=True)
    except KeyboardInterrupt:
        pass  # before the signals are taken (start-up): stopped all the same
    except OSError as exc:
        raise CliError(f"cannot listen on {args.host}:{args.port} or {cfg.listen}: {exc.strerror or exc}") from None
    print("gateway stopped", file=sys.stderr)
    return 0
