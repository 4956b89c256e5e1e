"""No lock-out by idle connections (issue 15, item 5), with real processes on loopback.

An attacker on one address (127.0.0.2: Linux routes all of 127/8 to loopback) holds 2,000
silent connections against a relay process and 2,000 against the model node process — half
plain TCP that never start TLS, half that finish TLS and never send the proof of identity —
and reopens each one 5 s after the listener closes it. The listeners refuse most of them at
once (over the per-address rate of new connections) and evict the rest while unauthenticated. Meanwhile honest peers (on 127.0.0.1)
connect and authenticate, and anonymous requests through 4 paths to the model node complete.
"""

from __future__ import annotations

import os
import resource
import ssl

import pytest
import trio
import trio.lowlevel

from gentorrent.tools.localnet import LocalNet
from overlay.net.transport import TLSTransport, parse_address
from overlay.usernode import UserNode
from overlay.wire.messages import ChatMessage, SamplingParams

pytestmark = pytest.mark.slow

HOLD = int(os.environ.get("GT_HOLD", "2000"))  # silent connections per target (half TCP, half TLS)
ATTACKER = "127.0.0.2"
REOPEN_AFTER = 5.0  # seconds between the listener closing a connection and the attacker reopening it


def raise_fd_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            pytest.skip(f"the test needs {needed} file descriptors; the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


class Holder:
    """Keeps ``count`` silent connections open to ``address`` (``tls``: finish TLS first),
    reopening each one ``REOPEN_AFTER`` seconds after the listener closes it."""

    def __init__(self, address: str, count: int, tls: bool) -> None:
        self.host, self.port = parse_address(address)
        self.count, self.tls = count, tls
        self.open = 0
        self.opened = 0
        self.closed_by_listener = 0
        self.all_opened = trio.Event()  # every connection opened once
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        self.ctx.check_hostname = False
        self.ctx.verify_mode = ssl.CERT_NONE

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(self.count):
                nursery.start_soon(self._one)
                await trio.lowlevel.checkpoint()
            await self.all_opened.wait()  # every connection opened once before we report
            task_status.started()

    async def _one(self) -> None:
        while True:
            stream: trio.abc.Stream | None = None
            try:
                stream = await trio.open_tcp_stream(self.host, self.port, local_address=ATTACKER)
            except OSError:
                stream = None
            if stream is not None:
                self.opened += 1
                self.open += 1
                if self.opened >= self.count:
                    self.all_opened.set()
                try:
                    if self.tls:
                        stream = trio.SSLStream(stream, self.ctx, server_hostname=None)
                        with trio.fail_after(30):
                            await stream.do_handshake()
                    while await stream.receive_some(4096):  # the AuthChallenge, then silence
                        pass
                    self.closed_by_listener += 1
                except (OSError, trio.BrokenResourceError, ssl.SSLError):
                    self.closed_by_listener += 1  # closed during TLS (refused over the rate, evicted)
                except trio.TooSlowError:
                    pass
                finally:
                    self.open -= 1
                    with trio.CancelScope(shield=True), trio.move_on_after(1):
                        await stream.aclose()
            await trio.sleep(REOPEN_AFTER)


async def test_two_thousand_silent_connections_do_not_lock_out_honest_peers(tmp_path):
    raise_fd_limit(4 * HOLD + 1024)
    with LocalNet(tmp_path, 15, users=("client",)) as net:
        net.start()
        relay, model = net.entries["relay-0"], net.entries["model-0"]
        ident = net.identities["client"]
        async with trio.open_nursery() as nursery:
            holders = [Holder(e.address, HOLD // 2, tls) for e in (relay, model) for tls in (False, True)]
            for h in holders:
                await nursery.start(h.run)
            assert all(h.opened >= HOLD // 2 for h in holders)
            # Honest peers connect and authenticate while the attacker holds its connections.
            transport = TLSTransport(ident)
            for e in (relay, model):
                for _ in range(5):
                    conn = await transport.dial(e.address, e.node_id)
                    assert conn.peer_id == e.node_id
                    await conn.aclose()
            # Anonymous requests: 4 fresh paths, proxies connecting to the held model node.
            host, port = parse_address(net.entries["client"].address)
            user = UserNode(ident, TLSTransport(ident), net.registry, build_timeout=10.0)
            await nursery.start(user.serve, host, port)
            assert user.paths is not None and user.client is not None
            with trio.fail_after(60):
                await user.paths.wait_ready(4)
            for i in range(5):
                parts = []
                async for chunk in user.client.request("echo", [ChatMessage("user", f"held {i}")],
                                                       SamplingParams(max_tokens=64), chunk_timeout=30):
                    parts.append(chunk.text)
                assert "".join(parts) == f"held {i}"
            # The listeners closed the silent connections (evicted, or past the accept deadline).
            assert all(h.closed_by_listener > 0 for h in holders)
            nursery.cancel_scope.cancel()
