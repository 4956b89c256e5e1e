"""``gentorrent status``: reach the nodes of a peer list and report what they see."""

from __future__ import annotations

import argparse
import time

import trio

from overlay.cli import CliError, common_flags, resolve_config, run_async
from overlay.identity import Identity, short_id
from overlay.messages import PeerStatus, PeerStatusRequest
from overlay.peers import PeerEntry
from overlay.transport import Transport, TransportError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "status", help="check which nodes of a peer list are up and what they see",
        description=(
            "Dial every node of the directory (--registry with --registry-keys, or an unsigned --peers "
            "list) over authenticated TLS, pinning each id, ask for its view of its own peers, and "
            "print one row per node. Exit status 1 if any node is unreachable."
        ),
    )
    common_flags(p, "registry", "registry_keys", "peers")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds per node (default: 5)")
    p.set_defaults(run=_run)


async def query(transport: Transport, peer: PeerEntry, timeout: float) -> tuple[float, PeerStatus]:
    """Dial ``peer`` (pinned to its id) and fetch its :class:`PeerStatus`."""
    t0 = time.perf_counter()
    with trio.fail_after(timeout):
        conn = await transport.dial(peer.address, peer.node_id)
        try:
            await conn.send(PeerStatusRequest())
            while True:
                msg = await conn.receive()
                if isinstance(msg, PeerStatus):
                    return time.perf_counter() - t0, msg
        finally:
            await conn.aclose()


def format_rows(entries: list[PeerEntry], results: dict[bytes, tuple[float, PeerStatus] | str]) -> list[str]:
    rows = [f"{'node':<10} {'address':<22} {'role':<6} {'state':<6} {'pinged ok':>13} {'median rtt':>11}"]
    for e in entries:
        r = results.get(e.node_id, "not queried")
        if isinstance(r, str):
            rows.append(f"{short_id(e.node_id):<10} {e.address:<22} {e.role:<6} {'DOWN':<6} {'':>13} {'':>11}  {r}")
            continue
        _, st = r
        ok = sorted(p.rtt_us for p in st.peers if p.rtt_us >= 0)
        med = f"{ok[len(ok) // 2] / 1000:.2f} ms" if ok else "-"
        rows.append(f"{short_id(e.node_id):<10} {e.address:<22} {e.role:<6} {'up':<6} {f'{len(ok)}/{len(st.peers)}' if st.peers else '-':>13} {med:>11}")
    return rows


async def query_all(transport: Transport, entries: list[PeerEntry], timeout: float) -> dict[bytes, tuple[float, PeerStatus] | str]:
    results: dict[bytes, tuple[float, PeerStatus] | str] = {}

    async def one(e: PeerEntry) -> None:
        try:
            results[e.node_id] = await query(transport, e, timeout)
        except trio.TooSlowError:
            results[e.node_id] = f"no answer within {timeout}s"
        except TransportError as exc:
            results[e.node_id] = str(exc)

    async with trio.open_nursery() as n:
        for e in entries:
            n.start_soon(one, e)
    return results


def _run(args: argparse.Namespace) -> int:
    from overlay.registry import RegistryError, from_config
    from overlay.transport import TLSTransport

    cfg = resolve_config(args)
    try:
        entries = from_config(cfg).entries
    except RegistryError as exc:
        raise CliError(f"status: {exc}") from None
    transport = TLSTransport(Identity.generate())  # a throwaway identity: status is anonymous
    results = run_async(query_all, transport, entries, args.timeout)
    for row in format_rows(entries, results):
        print(row)
    return 0 if all(not isinstance(r, str) for r in results.values()) else 1
