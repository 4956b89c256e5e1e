"""``gentorrent bench failover``: how fast a reply moves on when its model node dies, and how
fast a path through a bad relay is given up (issue 15, items 3 and 4).

Relays and three echo model nodes (slowed to one piece every ``ECHO_DELAY`` s, so a reply is
in flight) run as processes on loopback (LocalNet, TLS); the bench process runs the user node
and its :class:`~overlay.anon.client.AnonClient`, plus one more registered relay whose relay core it
can turn bad (the "bad relay").

Crash trials: a long reply is requested from one model node; after ``CHUNKS_BEFORE_KILL``
chunks have arrived the node's process is killed (SIGKILL), and the time from the kill to the
first chunk from another node is measured. The killed node is restarted before the next trial.
Every reply must come back complete (no text lost or repeated) with each part checked against
its own node's signature (the client yields nothing else).

Bad-relay trials: a fresh user node builds 4 paths over exactly 12 relays, so one path crosses
the bad relay; the relay then starts dropping (``drop``) or corrupting (``flip``) every cell it
passes on, and requests are sent one at a time — after each, up to ``MISSING_GRACE`` + 2 s
for the path to be given up — until the path through it is replaced. The figure is how many
requests that took.

Figures:
- ``crash_next_chunk_{mean,p50,p99}_ms``, ``crash_next_chunk_max_ms``: kill -> first chunk
  from another node (target p50 <= 3000 ms).
- ``crash_replies_complete_ratio``: replies that came back complete and in order (1.0).
- ``crash_failover_on_signal_ratio``: failovers set off by the proxies' ``model-lost``
  signals rather than a silence timeout.
- ``bad_relay_{drop,flip}_requests_{mean,max}``: requests until the path through the bad
  relay was replaced (target <= 2).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from gentorrent.bench.stats import cpu_model, summarize_ms
from gentorrent.cli import run_async
from gentorrent.tools.localnet import LocalNet
from overlay.anon.actions import Send
from overlay.anon.paths import MISSING_GRACE
from overlay.anon.relay import RelayCore
from overlay.net.transport import TLSTransport
from overlay.usernode import UserNode
from overlay.wire import codec
from overlay.wire.messages import CellBack, CellFwd, ChatMessage, Deliver, SamplingParams

ECHO_DELAY = 0.02  # seconds per echoed word: ~50 words a second, a small model on a CPU
REPLY_WORDS = 400  # ~8 s of streaming, long enough to be killed mid-reply
CHUNKS_BEFORE_KILL = 5
MODELS = 3
RELAY_PROCESSES = 11  # + the bench's bad relay = 12 = 4 disjoint paths of 3
PARAMS = SamplingParams(temperature=0.0, max_tokens=4096)


class BadRelay(RelayCore):
    """A relay core that behaves until ``attack`` is set, then drops (``"drop"``) or flips a
    bit in (``"flip"``) every cell, Deliver and reply clove it would pass on."""

    attack: str | None = None
    spoiled = 0

    def on_message(self, peer: bytes, msg: Any, *, now: float, unix: float) -> list[Send]:
        out = super().on_message(peer, msg, now=now, unix=unix)
        if self.attack is None:
            return out
        kept: list[Send] = []
        for s in out:
            m = s.msg
            if isinstance(m, (CellFwd, CellBack, Deliver)):
                self.spoiled += 1
                if self.attack == "drop":
                    continue
                if isinstance(m, (CellFwd, CellBack)):
                    body = bytearray(m.body)
                    body[len(body) // 2] ^= 0x01
                    m = type(m)(m.link_id, m.iv, bytes(body))
            kept.append(Send(s.peer, m))
        return kept


def _address(net: LocalNet, name: str) -> tuple[str, int]:
    host, port = net.entries[name].address.rsplit(":", 1)
    return host, int(port)


async def _user(nursery: trio.Nursery, net: LocalNet) -> UserNode:
    ident = net.identities["client"]
    user = UserNode(ident, TLSTransport(ident), net.registry, build_timeout=5.0)
    await nursery.start(user.serve, *_address(net, "client"))
    assert user.paths is not None
    with trio.fail_after(60):
        await user.paths.wait_ready(4)
    return user


async def _crash_trial(net: LocalNet, user: UserNode, victim: str) -> tuple[float, bool, str]:
    """One crash: (seconds from the kill to the next chunk from another node, reply complete?,
    what set the failover off)."""
    assert user.client is not None
    client = user.client
    before = dict(client.failovers)
    victim_id = net.entries[victim].node_id
    text = " ".join(f"w{j}" for j in range(REPLY_WORDS))
    parts: list[str] = []
    killed_at: float | None = None
    next_at: float | None = None
    async for c in client.request("echo", [ChatMessage("user", text)], PARAMS, node=victim_id, chunk_timeout=30):
        parts.append(c.text)
        if killed_at is None and len(parts) == CHUNKS_BEFORE_KILL:
            killed_at = time.perf_counter()
            net.kill(victim)
        elif killed_at is not None and next_at is None and c.node != victim_id:
            next_at = time.perf_counter()
    if killed_at is None or next_at is None:
        raise RuntimeError("the reply ended before the model node could be killed; lengthen REPLY_WORDS")
    after = {k: v - before.get(k, 0) for k, v in client.failovers.items() if v != before.get(k, 0)}
    why = ",".join(sorted(after)) or "none"
    return next_at - killed_at, "".join(parts) == text, why


async def _crashes(net: LocalNet, trials: int) -> dict[str, float]:
    delays: list[float] = []
    complete = signal = 0
    async with trio.open_nursery() as nursery:
        user = await _user(nursery, net)
        for i in range(trials):
            victim = net.models[i % MODELS]
            delay, ok, why = await _crash_trial(net, user, victim)
            delays.append(delay)
            complete += ok
            signal += why == "lost"
            net.spawn(victim)
            await trio.to_thread.run_sync(net.wait_ready, [victim], 60.0)
        nursery.cancel_scope.cancel()
    figures = summarize_ms("crash_next_chunk", delays)
    figures["crash_next_chunk_max_ms"] = 1000 * max(delays)
    figures["crash_replies_complete_ratio"] = complete / trials
    figures["crash_failover_on_signal_ratio"] = signal / trials
    return figures


async def _bad_relay_trial(net: LocalNet, bad: BadRelay, bad_id: bytes, attack: str) -> int:
    """Requests until the path through the bad relay is replaced (a fresh user node each time)."""
    async with trio.open_nursery() as nursery:
        user = await _user(nursery, net)
        assert user.paths is not None and user.client is not None
        through = [p for p in user.paths.ready_paths() if any(r.node_id == bad_id for r in p.relays)]
        if len(through) != 1:
            raise RuntimeError(f"expected one path through the bad relay, found {len(through)}")
        path = through[0]
        bad.attack = attack
        requests = 0
        try:
            while not path.dead:
                if requests >= 10:
                    raise RuntimeError(f"the path through the {attack} relay survived 10 requests")
                text = f"request {requests}: " + " ".join(f"w{j}" for j in range(10))
                got = "".join([c.text async for c in user.client.request("echo", [ChatMessage("user", text)],
                                                                         PARAMS, chunk_timeout=30)])
                if got != text:
                    raise RuntimeError("a reply came back altered")
                requests += 1
                with trio.move_on_after(MISSING_GRACE + 2.0):
                    await path.closed.wait()
        finally:
            bad.attack = None
        nursery.cancel_scope.cancel()
    return requests


async def _bad_relays(net: LocalNet, trials: int) -> dict[str, float]:
    ident = net.identities["bad-relay"]
    node = UserNode(ident, TLSTransport(ident), net.registry, client=False)
    core = node.relay.core
    bad = BadRelay(core.node_id, core.static_key, knows=core.knows, is_model=core.is_model)
    node.relay.core = bad
    figures: dict[str, float] = {}
    async with trio.open_nursery() as nursery:
        await nursery.start(node.serve, *_address(net, "bad-relay"))
        for attack in ("drop", "flip"):
            counts = [await _bad_relay_trial(net, bad, ident.node_id, attack) for _ in range(trials)]
            figures[f"bad_relay_{attack}_requests_mean"] = sum(counts) / len(counts)
            figures[f"bad_relay_{attack}_requests_max"] = max(counts)
        nursery.cancel_scope.cancel()
    return figures


async def _measure(net: LocalNet, crash_trials: int, relay_trials: int) -> dict[str, float]:
    async with trio.open_nursery() as nursery:  # the bad relay, well-behaved, during the crash trials
        ident = net.identities["bad-relay"]
        honest = UserNode(ident, TLSTransport(ident), net.registry, client=False)
        await nursery.start(honest.serve, *_address(net, "bad-relay"))
        figures = await _crashes(net, crash_trials)
        nursery.cancel_scope.cancel()
    figures.update(await _bad_relays(net, relay_trials))
    return figures


def run(quick: bool) -> tuple[dict[str, Any], dict[str, float]]:
    crash_trials, relay_trials = (3, 1) if quick else (24, 6)
    with tempfile.TemporaryDirectory(prefix="gentorrent-bench-failover-") as d:
        with LocalNet(Path(d), RELAY_PROCESSES, users=("client", "bad-relay"), models=MODELS, registry_keys=1,
                      echo_delay=ECHO_DELAY) as net:
            net.start()
            figures = run_async(_measure, net, crash_trials, relay_trials)
    params = {
        "relay_processes": RELAY_PROCESSES, "bad_relays": 1, "model_nodes": MODELS, "engine": "echo",
        "echo_delay_s": ECHO_DELAY, "reply_words": REPLY_WORDS, "chunks_before_kill": CHUNKS_BEFORE_KILL,
        "crash_trials": crash_trials, "bad_relay_trials_per_attack": relay_trials, "n": 4, "k": 3,
        "wire_version": codec.WIRE_VERSION, "cpu": cpu_model(),
    }
    return params, figures
