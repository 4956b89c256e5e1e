"""``gentorrent bench gateway``: what ``gentorrent user serve`` adds on top of the anonymous client.

Relays and one echo model node run as processes on loopback (LocalNet); the bench process
runs one user node, its :class:`~overlay.anon.client.AnonClient`, and the gateway (Starlette on
Hypercorn's trio worker) on 127.0.0.1 in front of that same client. Each trial sends the
same streamed chat request twice, alternating: once straight through the AnonClient
(``direct``), once as ``POST /v1/chat/completions`` with ``stream: true`` over a kept-alive
HTTP/1.1 connection (``gateway``; the bench's HTTP client is h11 over a trio socket).

Figures:
- ``{direct,gateway}_ttft_{mean,p50,p99}_ms``: request sent -> first reply text received.
- ``{direct,gateway}_total_{mean,p50,p99}_ms``: request sent -> reply complete (for the
  gateway: the ``[DONE]`` event).
- ``gateway_added_ttft_p50_ms``, ``gateway_added_total_p50_ms``: the gateway's added cost
  (differences of the p50s; target <= 2 ms).
- ``{direct,gateway}_stream16_req_per_s``: completed requests per second with 16 concurrent
  streaming clients for a fixed time: 16 tasks calling the AnonClient in the bench process
  (``direct``), or 16 HTTP connections from a separate client process, so that the clients'
  CPU is not charged to the gateway (``gateway``).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import h11
import trio

from gentorrent.bench.stats import cpu_model, summarize_ms
from gentorrent.cli import run_async
from gentorrent.tools.localnet import LocalNet
from overlay.net.transport import TLSTransport
from overlay.usernode import UserNode
from overlay.wire.messages import ChatMessage, SamplingParams
from user_client.gateway import AnonBackend, Gateway, server_config

PROMPT = " ".join(f"word{i}" for i in range(32))  # 32 echo pieces back
PARAMS = SamplingParams(temperature=0.0, max_tokens=1024)
CONCURRENCY = 16


class HttpClient:
    """One kept-alive HTTP/1.1 connection (h11) for streamed chat calls."""

    def __init__(self, stream: trio.SocketStream, host: str) -> None:
        self.stream = stream
        self.host = host
        self.conn = h11.Connection(h11.CLIENT)

    async def chat(self, model: str, text: str) -> tuple[float, float]:
        """Stream one chat call; (seconds to the first text, seconds to ``[DONE]``)."""
        body = json.dumps({"model": model, "messages": [{"role": "user", "content": text}], "stream": True,
                           "temperature": 0, "max_tokens": PARAMS.max_tokens}).encode()
        t0 = time.perf_counter()
        out = self.conn.send(h11.Request(method="POST", target="/v1/chat/completions", headers=[
            ("host", self.host), ("content-type", "application/json"), ("content-length", str(len(body)))]))
        out += self.conn.send(h11.Data(data=body)) + self.conn.send(h11.EndOfMessage())
        await self.stream.send_all(out)
        first: float | None = None
        buf = b""
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                self.conn.receive_data(await self.stream.receive_some(65536))
                continue
            if isinstance(event, h11.Response) and event.status_code != 200:
                raise RuntimeError(f"gateway answered {event.status_code}")
            if isinstance(event, h11.Data):
                buf += bytes(event.data)
                if first is None and b'"content"' in buf:
                    first = time.perf_counter() - t0
            if isinstance(event, h11.EndOfMessage):
                total = time.perf_counter() - t0
                if not buf.endswith(b"data: [DONE]\n\n"):
                    raise RuntimeError(f"the stream ended without [DONE]: {buf[-200:]!r}")
                self.conn.start_next_cycle()
                return (first if first is not None else total), total


async def _direct(user: UserNode, model: str) -> tuple[float, float]:
    assert user.client is not None
    t0 = time.perf_counter()
    first: float | None = None
    async for c in user.client.request(model, [ChatMessage("user", PROMPT)], PARAMS, chunk_timeout=30):
        if first is None and c.text:
            first = time.perf_counter() - t0
    total = time.perf_counter() - t0
    return (first if first is not None else total), total


async def _measure(net: LocalNet, trials: int, seconds: float) -> dict[str, float]:
    from hypercorn.trio import serve

    ident = net.identities["client"]
    user = UserNode(ident, TLSTransport(ident), net.registry, build_timeout=5.0)
    assert user.client is not None and user.paths is not None
    backend = AnonBackend(user.client, lambda: [net.model], timeout=30)
    gateway = Gateway(backend, max_concurrent=4 * CONCURRENCY)
    hc = server_config("127.0.0.1:0")  # as `gentorrent user serve` runs it
    figures: dict[str, float] = {}
    async with trio.open_nursery() as nursery:
        host, port = net.entries["client"].address.rsplit(":", 1)
        await nursery.start(user.serve, host, int(port))
        binds = await nursery.start(serve, gateway.app, hc)
        http_host, http_port = binds[0].removeprefix("http://").rsplit(":", 1)
        with trio.fail_after(30):
            await user.paths.wait_ready(user.client.n)

        async def client() -> HttpClient:
            return HttpClient(await trio.open_tcp_stream(http_host, int(http_port)), f"{http_host}:{http_port}")

        http = await client()
        for _ in range(3):  # warm-up: connections, caches
            await _direct(user, net.model)
            await http.chat(net.model, PROMPT)
        samples: dict[str, list[float]] = {k: [] for k in ("direct_ttft", "direct_total", "gateway_ttft",
                                                             "gateway_total")}
        for _ in range(trials):  # alternating, so that drift and other load hit both alike
            for name in ("direct", "gateway"):
                ttft, total = await (_direct(user, net.model) if name == "direct" else http.chat(net.model, PROMPT))
                samples[f"{name}_ttft"].append(ttft)
                samples[f"{name}_total"].append(total)
        for k, v in samples.items():
            figures.update(summarize_ms(k, v))
        figures["gateway_added_ttft_p50_ms"] = figures["gateway_ttft_p50_ms"] - figures["direct_ttft_p50_ms"]
        figures["gateway_added_total_p50_ms"] = figures["gateway_total_p50_ms"] - figures["direct_total_p50_ms"]

        done = 0

        async def direct_worker(deadline: float) -> None:
            nonlocal done
            while trio.current_time() < deadline:
                await _direct(user, net.model)
                done += 1

        t0 = time.perf_counter()
        async with trio.open_nursery() as workers:
            deadline = trio.current_time() + seconds
            for _ in range(CONCURRENCY):
                workers.start_soon(direct_worker, deadline)
        figures["direct_stream16_req_per_s"] = done / (time.perf_counter() - t0)
        load = await trio.run_process(
            [sys.executable, "-m", "user_client.bench.gateway", http_host, http_port, net.model, str(seconds)],
            capture_stdout=True)
        figures["gateway_stream16_req_per_s"] = float(json.loads(load.stdout)["req_per_s"])
        nursery.cancel_scope.cancel()
    return figures


def run(quick: bool) -> tuple[dict[str, Any], dict[str, float]]:
    trials, seconds = (10, 3.0) if quick else (200, 20.0)
    n_relays = 12
    with tempfile.TemporaryDirectory(prefix="gentorrent-bench-gateway-") as d:
        # The bench measures the gateway, not overload: the echo node estimates its work at
        # llama.cpp's reference rates until it has measured itself, so 16 concurrent streams
        # would read as ~12 s of work and be refused as busy under the default 10 s wait.
        with LocalNet(Path(d), n_relays, users=("client",), registry_keys=1,
                      model_args=("--max-queue-wait", "600")) as net:
            net.start()
            figures = run_async(_measure, net, trials, seconds)
    params = {
        "relays": n_relays, "trials": trials, "sustained_s": seconds, "concurrency": CONCURRENCY, "n": 4, "k": 3,
        "engine": "echo", "reply_pieces": 32, "prompt_chars": len(PROMPT), "http": "HTTP/1.1 keep-alive, h11 client",
        "server": "Starlette on Hypercorn (trio worker)", "cpu": cpu_model(),
    }
    return params, figures


async def _load(host: str, port: int, model: str, seconds: float) -> float:
    """Requests per second completed by :data:`CONCURRENCY` streaming HTTP connections."""
    done = 0

    async def worker(deadline: float) -> None:
        nonlocal done
        c = HttpClient(await trio.open_tcp_stream(host, port), f"{host}:{port}")
        while trio.current_time() < deadline:
            await c.chat(model, PROMPT)
            done += 1
        await c.stream.aclose()

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        deadline = trio.current_time() + seconds
        for _ in range(CONCURRENCY):
            nursery.start_soon(worker, deadline)
    return done / (time.perf_counter() - t0)


if __name__ == "__main__":  # the load-client process: HOST PORT MODEL SECONDS -> {"req_per_s": ...}
    rate = trio.run(_load, sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4]))
    print(json.dumps({"req_per_s": rate}))
