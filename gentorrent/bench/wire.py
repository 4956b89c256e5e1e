"""``gentorrent bench wire``: codec throughput and authenticated TLS round trips.

Figures:
- ``codec_1KiB_frames_per_s``, ``codec_64KiB_frames_per_s``: encode + frame +
  split + strict decode of one :class:`~overlay.wire.messages.Echo` message, in-process.
- ``tls_rtt_1KiB_p50_ms`` / ``_p99_ms`` / ``_mean_ms``: one 1 KiB Echo and its
  reply, sequentially, to a ``gentorrent user relay`` process on loopback.
- ``tls_1KiB_MB_per_s``, ``tls_1KiB_frames_per_s``: pipelined 1 KiB Echo frames
  to the same process (payload megabytes per second, one direction, 10^6 B).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import trio

from gentorrent.bench.stats import summarize_ms
from gentorrent.cli import run_async
from overlay.net.peers import save as save_peers
from overlay.net.transport import TLSTransport
from overlay.wire import codec
from overlay.wire.identity import Identity
from overlay.wire.messages import Echo, EchoReply


def _codec_rate(size: int, seconds: float) -> float:
    msg = Echo(nonce=1, data=bytes(size))
    dec = codec.FrameDecoder()
    n = 0
    t0 = time.perf_counter()
    end = t0 + seconds
    while True:
        for _ in range(100):
            dec.feed(codec.frame(msg))
            out = dec.next_message()
        n += 100
        if time.perf_counter() >= end:
            break
    assert out == msg
    return n / (time.perf_counter() - t0)


def start_relay(data_dir: str) -> tuple[subprocess.Popen[str], bytes, str]:
    """Start ``gentorrent user relay`` and wait for its READY line: (process, id, address)."""
    peers = os.path.join(data_dir, "peers.json")
    save_peers(peers, [])  # the relay needs a directory; it has no peers to ping
    proc = subprocess.Popen(
        [sys.executable, "-m", "gentorrent.cli", "user", "relay", "--data-dir", data_dir,
         "--listen", "127.0.0.1:0", "--peers", peers, "--log-level", "warning"],
        stdout=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    if len(line) != 3 or line[0] != "READY":
        proc.kill()
        proc.wait()
        proc.stdout.close()
        raise RuntimeError(f"relay did not start: {line!r}")
    return proc, bytes.fromhex(line[1]), line[2]


async def _tls(address: str, node_id: bytes, rtt_trials: int, stream_frames: int) -> dict[str, float]:
    t = TLSTransport(Identity.generate())
    conn = await t.dial(address, node_id)
    data = bytes(1024)
    rtts = []
    for i in range(rtt_trials):
        t0 = time.perf_counter()
        await conn.send(Echo(nonce=i, data=data))
        reply = await conn.receive()
        rtts.append(time.perf_counter() - t0)
        assert isinstance(reply, EchoReply) and reply.nonce == i
    figures = summarize_ms("tls_rtt_1KiB", rtts)

    frame = codec.frame(Echo(nonce=0, data=data))
    batch = frame * 32
    t0 = time.perf_counter()
    async with trio.open_nursery() as n:

        async def sender() -> None:
            for _ in range(stream_frames // 32):
                await conn.send_raw(batch)

        n.start_soon(sender)
        for _ in range((stream_frames // 32) * 32):
            await conn.receive()
    dt = time.perf_counter() - t0
    sent = (stream_frames // 32) * 32
    figures["tls_1KiB_frames_per_s"] = sent / dt
    figures["tls_1KiB_MB_per_s"] = sent * 1024 / dt / 1e6
    await conn.aclose()
    return figures


def run(quick: bool) -> tuple[dict[str, Any], dict[str, float]]:
    seconds = 0.2 if quick else 2.0
    rtt_trials = 200 if quick else 5000
    stream_frames = 2000 if quick else 50_000
    figures = {
        "codec_1KiB_frames_per_s": _codec_rate(1024, seconds),
        "codec_64KiB_frames_per_s": _codec_rate(64 * 1024, seconds),
    }
    with tempfile.TemporaryDirectory(prefix="gentorrent-bench-") as d:
        proc, node_id, address = start_relay(d)
        try:
            figures.update(run_async(_tls, address, node_id, rtt_trials, stream_frames))
        finally:
            proc.terminate()
            proc.wait(timeout=10)
            if proc.stdout is not None:
                proc.stdout.close()
    params = {
        "codec_seconds_per_size": seconds,
        "tls_rtt_trials": rtt_trials,
        "tls_stream_frames": stream_frames,
        "transport": "TLS 1.3 over loopback TCP, separate relay process",
    }
    return params, figures
