"""Address probes: each verifier proves that a registering node answers at its address (decision 0014).

A registration for a new address waits, *pending*, until validators holding more than 2/3 of the
voting power have dialled the address with the overlay's transport and found the registering key
there: the TLS handshake pins the server's certificate to the node id
(docs/decisions/0001-tls-identity-pinning.md), so a dial that completes is the proof. Each verifier
reports what it reached in a :class:`verifier.admission.ProbeTx` signed with its validator key.

:class:`ProbePlan` is the I/O-free part: which pending registrations to dial now (those this
validator has not attested, not tried within :data:`RETRY_S`). :func:`run_prober` is the thin
driver inside ``gentorrent verifier``: it reads the committed state of the verifier's own
application, dials, and broadcasts through the verifier's CometBFT RPC.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import trio

from overlay.directory.rpc import Rpc, RpcError, broadcast_tx_sync
from overlay.net.transport import TransportError
from overlay.wire import crypto
from overlay.wire.clock import Clock, TrioClock
from verifier.admission import MAX_PROBE_ENTRIES, make_probe_tx
from verifier.app import CommitteeApp, Pending

log = logging.getLogger("gentorrent.prober")

PROBE_EVERY_S = 1.0
DIAL_TIMEOUT_S = 5.0
RETRY_S = 10.0  # an address that did not answer is dialled again after this long
PARALLEL = 16  # dials at once


@dataclass
class ProbePlan:
    """Which pending registrations (``(node_id, seq)``) this validator dials next."""

    validator: bytes
    retry: float = RETRY_S
    tried: dict[tuple[bytes, int], float] = field(default_factory=dict)  # last dial that failed, by time

    def due(self, pending: Iterable[Pending], now: float) -> list[Pending]:
        live = {}
        for p in pending:
            if self.validator not in p.attesters:
                live[(p.node_id, p.seq)] = p
        for k in [k for k in self.tried if k not in live]:  # listed, dropped or registered again
            del self.tried[k]
        due = [p for k, p in live.items() if now - self.tried.get(k, -self.retry) >= self.retry]
        return due[:MAX_PROBE_ENTRIES]

    def failed(self, p: Pending, now: float) -> None:
        self.tried[(p.node_id, p.seq)] = now


Dial = Callable[[str, bytes], Awaitable[Any]]  # (address, node id) -> a connection with aclose()


async def probe_once(app: CommitteeApp, plan: ProbePlan, key: crypto.SigningKey, dial: Dial, broadcast:
                     Callable[[bytes], Awaitable[None]], now: float) -> list[tuple[bytes, int]]:
    """Dial what is due (at most :data:`PARALLEL` at once), report what answered; returns it."""
    due = plan.due(app.committed.pending.values(), now)
    reached: list[tuple[bytes, int]] = []
    limit = trio.CapacityLimiter(PARALLEL)

    async def one(p: Pending) -> None:
        async with limit:
            try:
                with trio.fail_after(DIAL_TIMEOUT_S):
                    conn = await dial(p.entry.address, p.node_id)
                    await conn.aclose()
            except (TransportError, OSError, ValueError, trio.TooSlowError) as exc:  # refused, timed out, other key
                log.info("probe of %s at %s failed: %s", p.node_id.hex()[:8], p.entry.address, exc)
                plan.failed(p, now)
                return
            reached.append((p.node_id, p.seq))

    async with trio.open_nursery() as nursery:
        for p in due:
            nursery.start_soon(one, p)
    if reached:
        await broadcast(make_probe_tx(key, app.committed.chain_id, sorted(reached)))
    return reached


async def run_prober(app: CommitteeApp, key: crypto.SigningKey, rpc_address: str, *, dial: Dial | None = None,
                     rpc: Rpc | None = None, clock: Clock | None = None) -> None:
    """Probe pending registrations every :data:`PROBE_EVERY_S` until cancelled; failures are logged."""
    clock = clock or TrioClock()
    if dial is None:
        from overlay.net.transport import TLSTransport
        from overlay.wire.identity import Identity

        transport = TLSTransport(Identity.generate())  # a throwaway key: the dial proves the other side
        dial = transport.dial
    plan = ProbePlan(key.public_bytes)

    async def broadcast(raw: bytes) -> None:
        with trio.fail_after(DIAL_TIMEOUT_S):
            answer = await broadcast_tx_sync(rpc_address, raw, rpc=rpc)
        if answer.code:
            log.info("probe transaction refused (code %d): %s", answer.code, answer.log[:200])

    while True:
        if app.committed.admission.probe and app.committed.pending:
            try:
                await probe_once(app, plan, key, dial, broadcast, clock.monotonic())
            except (OSError, RpcError, ValueError, trio.TooSlowError) as exc:
                log.warning("probe round failed (retrying): %s", exc)
        await trio.sleep(PROBE_EVERY_S)
