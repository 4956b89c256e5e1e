"""Connection slots under a flood of fresh keys (issue 28 item 4; part of ``gentorrent bench
admission``): the real TLS transport on loopback, in one process.

A listener (a :class:`~overlay.net.node.Node` on :class:`~overlay.net.transport.TLSTransport` with
``max_connections`` slots and, as its ``registered`` predicate, the set of honest peers' ids)
is attacked in two ways, one after the other, each attacker holding every connection it gets:

1. one source address (sockets bound to 127.0.0.2: Linux routes all of 127.0.0.0/8 to the
   loopback) dials ``max_connections + 64`` times, sequentially, each time with a fresh key that
   completes TLS and the proof of identity;
2. every address of one /24 (127.0.1.1 to 127.0.1.254, one dial each; at most
   ``max_connections`` of them) does the same.

Then ``max_connections`` fresh honest registered peers, each from its own address (127.0.2.1
and on), handshake and hold their connections, so that together they need every slot.

Figures (counts; ``_ms``: wall-clock time of one honest dial, TCP + TLS + proof):
``max_connections_count``; ``attacker_connections_held_count`` and
``attacker_connections_refused_count`` (one address); ``prefix_attacker_connections_held_count``
and ``prefix_attacker_connections_refused_count`` (one /24); ``honest_handshakes_ok_count`` of
``honest_handshakes_total_count``; ``honest_handshake_p50_ms``, ``honest_handshake_max_ms``;
the listener's counters: ``refused_rate_limited_count`` (over 20 new connections a second from
one address, refused before TLS), ``refused_unregistered_count`` (unregistered peers over their
caps, refused after their proof), ``evicted_unregistered_count`` (unregistered connections
closed to make room for registered peers) and ``unregistered_left_count`` (still held at the
end).
"""

from __future__ import annotations

import resource
import statistics
import time
from collections.abc import Awaitable, Callable

import trio

from overlay.net.node import Node
from overlay.net.transport import Connection, PeerAuthError, TLSTransport, TransportError
from overlay.wire.identity import Identity

ATTACKER = "127.0.0.2"
ATTACKER_PREFIX = "127.0.1."  # a /24 of loopback addresses, all the prefix attacker's
EXTRA_DIALS = 64  # the one-address attacker dials max_connections + this many times


def _honest_address(i: int) -> str:
    return f"127.0.{2 + i // 250}.{1 + i % 250}"


def _fd_room(wanted: int) -> int:
    """Raise the soft limit on open files towards ``wanted``; the limit there is."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


async def _holding(dials: list[Callable[[], Awaitable[Connection]]]) -> tuple[list[Connection], int]:
    held, refused = [], 0
    for dial in dials:
        try:
            held.append(await dial())
        except (PeerAuthError, TransportError):
            refused += 1
    return held, refused


async def _flood(max_connections: int) -> dict[str, float]:
    me = Identity.generate()
    honest = [Identity.generate() for _ in range(max_connections)]
    listed = {i.node_id for i in honest}
    node = Node(me, TLSTransport(me, max_connections=max_connections), ping_interval=0,
                registered=listed.__contains__)
    held: list[Connection] = []
    async with trio.open_nursery() as nursery:
        address = await nursery.start(node.serve, "127.0.0.1", 0)

        def dial(ident: Identity, source: str) -> Callable[[], Awaitable[Connection]]:
            return lambda: TLSTransport(ident, local_address=source).dial(address, me.node_id)

        attacker, attacker_refused = await _holding(
            [dial(Identity.generate(), ATTACKER) for _ in range(max_connections + EXTRA_DIALS)])
        prefix, prefix_refused = await _holding(
            [dial(Identity.generate(), f"{ATTACKER_PREFIX}{i}") for i in range(1, min(255, max_connections + 1))])
        held += attacker + prefix
        ok, times = 0, []
        for i, ident in enumerate(honest):
            t0 = time.perf_counter()
            try:
                held.append(await dial(ident, _honest_address(i))())
                ok += 1
            except (PeerAuthError, TransportError):
                pass
            times.append((time.perf_counter() - t0) * 1000)
        adm = node.transport.admission
        assert adm is not None
        figures = {
            "max_connections_count": float(max_connections),
            "attacker_connections_held_count": float(len(attacker)),
            "attacker_connections_refused_count": float(attacker_refused),
            "prefix_attacker_connections_held_count": float(len(prefix)),
            "prefix_attacker_connections_refused_count": float(prefix_refused),
            "honest_handshakes_ok_count": float(ok),
            "honest_handshakes_total_count": float(len(honest)),
            "honest_handshake_p50_ms": statistics.median(times),
            "honest_handshake_max_ms": max(times),
            "refused_rate_limited_count": float(adm.rate_limited),
            "refused_unregistered_count": float(adm.refused_unregistered),
            "evicted_unregistered_count": float(adm.evicted_unregistered),
            "unregistered_left_count": float(adm.unregistered),
        }
        for conn in held:
            await conn.aclose()
        nursery.cancel_scope.cancel()
    return figures


def measure_slot_flood(quick: bool) -> dict[str, float]:
    """Run the flood (module docstring): 64 slots when ``quick`` (a few seconds), else 1,024 (the
    default ``max_connections``; fewer if the limit on open files is too low for ~4 per slot)."""
    wanted = 64 if quick else 1024
    room = _fd_room(4 * wanted + 512)
    max_connections = max(16, min(wanted, (room - 512) // 4))
    return trio.run(_flood, max_connections)


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(measure_slot_flood("--quick" in sys.argv), indent=1))
