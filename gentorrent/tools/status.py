"""``gentorrent status``: reach the nodes of a peer list and report what they see."""

from __future__ import annotations

import argparse
import time
from typing import Any

import trio

from gentorrent.cli import CliError, common_flags, resolve_config, run_async
from overlay.directory.rpc import Rpc
from overlay.net.peers import PeerEntry
from overlay.net.transport import Transport, TransportError
from overlay.wire.constants import REPUTATION_SCALE
from overlay.wire.identity import Identity, short_id
from overlay.wire.messages import PeerStatus, PeerStatusRequest


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "status", help="check the committee and which registered nodes are up and what they see",
        description=(
            "With --committee (and --committee-genesis): show the committee's height, each verifier's "
            "RPC state, the validators and whether each signed the last block, then the registered nodes "
            "from the committee's signed lists (verified). Otherwise the directory is a --registry file "
            "with --registry-keys, or an unsigned --peers list. Every node is dialed over authenticated "
            "TLS, pinning its id, and asked for its view of its own peers: one row per node. Exit status "
            "1 if any node or verifier is unreachable."
        ),
    )
    common_flags(p, "committee", "committee_genesis", "registry", "registry_keys", "peers")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds per node (default: 5)")
    p.set_defaults(run=_run)


async def query(transport: Transport, peer: PeerEntry) -> tuple[float, PeerStatus]:
    """Dial ``peer`` (pinned to its id) and fetch its :class:`PeerStatus` (the caller bounds it)."""
    t0 = time.perf_counter()
    conn = await transport.dial(peer.address, peer.node_id)
    try:
        await conn.send(PeerStatusRequest())
        while True:
            msg = await conn.receive()
            if isinstance(msg, PeerStatus):
                return time.perf_counter() - t0, msg
    finally:
        await conn.aclose()


def _trust(e: PeerEntry) -> str:
    """A model node's reputation on the committee's signed list (10^6 = 1.0), or ``-``."""
    return "-" if e.reputation is None else f"{e.reputation / REPUTATION_SCALE:.2f}"


def format_rows(entries: list[PeerEntry], results: dict[bytes, tuple[float, PeerStatus] | str]) -> list[str]:
    rows = [f"{'node':<10} {'address':<22} {'role':<6} {'trust':>5} {'state':<6} {'pinged ok':>13} {'median rtt':>11}"]
    for e in entries:
        r = results.get(e.node_id, "not queried")
        head = f"{short_id(e.node_id):<10} {e.address:<22} {e.role:<6} {_trust(e):>5}"
        if isinstance(r, str):
            rows.append(f"{head} {'DOWN':<6} {'':>13} {'':>11}  {r}")
            continue
        _, st = r
        ok = sorted(p.rtt_us for p in st.peers if p.rtt_us >= 0)
        med = f"{ok[len(ok) // 2] / 1000:.2f} ms" if ok else "-"
        rows.append(f"{head} {'up':<6} {f'{len(ok)}/{len(st.peers)}' if st.peers else '-':>13} {med:>11}")
    return rows


def audit_rows(audit: Any, reputation: Any, listed: set[bytes]) -> list[str]:
    """The committee's audit state (``/audit``'s map, ``/reputation``'s rows; verifier/audit/chain.py)
    as status lines: the epoch and its windows, which verifiers committed and reported, the models
    that are audited, the last outcomes, and the audited nodes' reputations (those under the trust
    line are listed but no client uses them). Raises KeyError, TypeError or ValueError on an
    answer of another shape."""
    def key(k: Any) -> str:
        return k.hex()[:16] if isinstance(k, bytes) else "none"

    epoch, start, end = int(audit["epoch"]), int(audit["start_height"]), int(audit["end_height"])
    audited = ", ".join(str(m) for m in audit["audited_models"]) or "none (no model is held by verifiers with more " \
                                                                     "than 2/3 of the power)"
    rows = [f"  audits: epoch {epoch} (heights {start}-{end}: commits until {audit['commit_until']}, reports from "
            f"{audit['report_from']}), {audit['challenges_per_node']} challenge(s) per node and verifier",
            f"    audited models: {audited}",
            f"    this epoch: {len(audit['committed'])} of {len(audit['validators'])} verifiers committed a plan, "
            f"{len(audit['reported'])} reported"]
    for node_id, missed in audit["misses"]:
        rows.append(f"    missed epochs in a row: {key(node_id)[:8]} {missed}")
    outcomes = list(audit["outcomes"])[-5:]
    if outcomes:
        rows.append("    last outcomes:")
        for e, status, reason, height in reversed(outcomes):
            rows.append(f"      epoch {e}: {status} at height {height}: {reason}")
    if reputation:
        rows.append(f"    reputation of {len(reputation)} audited model node(s):")
        for node_id, value, window, epochs in reputation:
            flags = "".join("x" if a else "." for a in window)
            rows.append(f"      {key(node_id)[:8]}  {int(value) / REPUTATION_SCALE:.2f}  epochs {epochs}  window [{flags}]"
                        + ("" if node_id in listed else "  UNTRUSTED: clients do not use it"))
    return rows


async def query_all(transport: Transport, entries: list[PeerEntry], per_node_timeout: float,
                    ) -> dict[bytes, tuple[float, PeerStatus] | str]:
    """Every node's :func:`query` at once: ``(rtt, status)``, or why none came (the transport's
    error, or no answer within ``per_node_timeout`` seconds: each node is bounded on its own, so a
    slow one is reported and the others' answers are kept)."""
    results: dict[bytes, tuple[float, PeerStatus] | str] = {}

    async def one(e: PeerEntry) -> None:
        try:
            with trio.fail_after(per_node_timeout):
                results[e.node_id] = await query(transport, e)
        except trio.TooSlowError:
            results[e.node_id] = f"no answer within {per_node_timeout}s"
        except TransportError as exc:
            results[e.node_id] = str(exc)

    async with trio.open_nursery() as n:
        for e in entries:
            n.start_soon(one, e)
    return results


LIVENESS_BLOCKS = 5  # a validator is live if it signed any of the last this many commits


async def committee_view(addresses: tuple[str, ...], chain_id: str, validators: Any, rpc_timeout: float,
                         ) -> tuple[list[str], list[PeerEntry], bool]:
    """(rows describing the committee, the registered nodes from its verified lists, all verifiers up?).

    ``rpc_timeout`` bounds each exchange with the verifiers on its own (one verifier's status; the
    validators and recent commits; the signed lists; the audit state): one that runs out is
    reported in its row, and the view goes on."""
    import base64

    from overlay.directory.lists import CommitteeClient, ListError
    from overlay.directory.rpc import RpcError, rpc_call

    rows, up, answered = [f"committee {chain_id!r}: {len(addresses)} verifier RPC address(es)"], True, None
    rows.append(f"  {'verifier RPC':<22} {'height':>8}  state")
    for addr in addresses:
        try:
            with trio.fail_after(rpc_timeout):
                st = await rpc_call(addr, "status", {})
            info = st["sync_info"]
            state = "catching up" if info.get("catching_up") else "up"
            rows.append(f"  {addr:<22} {int(info['latest_block_height']):>8}  {state}")
            answered = answered or addr
        except (OSError, RpcError, trio.TooSlowError, KeyError, TypeError, ValueError) as exc:
            up = False
            rows.append(f"  {addr:<22} {'':>8}  DOWN: {exc or type(exc).__name__}")
    entries: list[PeerEntry] = []
    if answered is None:
        rows.append("  no verifier answered: the committee's state and registered nodes are unknown")
        return rows, entries, False
    try:
        with trio.fail_after(rpc_timeout):
            vals = (await rpc_call(answered, "validators", {}))["validators"]
            latest = await rpc_call(answered, "commit", {})
            height = int(latest["signed_header"]["header"]["height"])
            commits = [latest] + [await rpc_call(answered, "commit", {"height": str(h)})
                                  for h in range(height - 1, max(0, height - LIVENESS_BLOCKS), -1)]
        signed: dict[str, int] = {}
        for c in commits:
            for s in c["signed_header"]["commit"]["signatures"]:
                if int(s.get("block_id_flag", 0)) == 2:  # BlockIDFlagCommit: it signed this block
                    signed[s["validator_address"]] = signed.get(s["validator_address"], 0) + 1
        rows.append(f"  validators at height {height} (live: signed some of the last {len(commits)} commits; a "
                    "commit needs only 2/3+, so a live validator may miss one):")
        for v in vals:
            key = base64.b64decode(v["pub_key"]["value"]).hex()[:16]
            n = signed.get(v["address"], 0)
            rows.append(f"    {key:<18} power {int(v['voting_power']):>4}  {'live' if n else 'NOT SIGNING'}"
                        f" ({n}/{len(commits)})")
    except (OSError, RpcError, trio.TooSlowError, KeyError, TypeError, ValueError) as exc:
        rows.append(f"  validators unknown: {answered} did not answer ({exc})")
    client = CommitteeClient(addresses, chain_id, validators, fetch_timeout=rpc_timeout)
    try:
        reg = await client.refresh()
        entries = list(reg.entries)
        age = client.list_age()
        rows.append(f"  signed lists at height {client.height}: {len(reg.users())} users, {len(reg.models())} model "
                    f"nodes (verified against the pinned genesis keys; signed {age or 0:.0f} s ago)")
    except ListError as exc:
        up = False
        rows.append(f"  no signed list verifies: {exc}")
    try:
        with trio.fail_after(rpc_timeout):
            rows.extend(await _audit_view(answered, entries))
    except trio.TooSlowError:
        rows.append(f"  audits unknown: {answered} did not answer /audit within {rpc_timeout:g} s")
    models = sorted({m for e in entries if e.role == "model" for m in e.models})
    try:
        with trio.fail_after(rpc_timeout):
            rows.extend(await _quota_view(answered, chain_id, {v.public_key for v in validators}, models))
    except trio.TooSlowError:
        rows.append(f"  quotas unknown: {answered} did not answer /quota/key within {rpc_timeout:g} s")
    return rows, entries, up


async def _quota_view(address: str, chain_id: str, keys: set[bytes], models: list[str], *,
                      rpc: Rpc | None = None) -> list[str]:
    """The committee's usage-quota settings (decision 0018) as one verifier's issuer states them in
    its signed key record for the first of ``models`` (verified against the pinned validator
    ``keys``); the caller bounds it. ``rpc``: as :func:`~overlay.directory.rpc.abci_query`'s (tests)."""
    from overlay.directory import quota
    from overlay.directory.registration import Code
    from overlay.directory.rpc import RpcError, abci_query

    if not models:
        return ["  quotas unknown: no model node is registered, so there is no model to ask the issuers about"]
    try:  # epoch 0 is never current: the issuer answers WRONG_EPOCH with its current record, params included
        answer = await abci_query(address, quota.KEY_PATH, quota.encode_key_query(models[0], 0), rpc=rpc)
    except (OSError, RpcError) as exc:
        return [f"  quotas unknown: {address} did not answer {quota.KEY_PATH} ({exc})"]
    if answer.code == Code.QUOTA_OFF:
        return ["  quotas: off (the committee's genesis has no quota section: requests carry no tokens)"]
    if answer.code not in (Code.OK, Code.WRONG_EPOCH) or not answer.value:
        return [f"  quotas unknown: {address} answered code {answer.code}: {answer.log[:200]}"]
    try:
        rec = quota.checked_key_record(answer.value, chain_id, models[0], keys)
    except quota.QuotaError as exc:
        return [f"  quotas unknown: the key record {address} answered does not verify: {exc.reason}"]
    p = rec.params
    return [f"  quotas: a user's allowance at each issuer grows by {p.tokens} token(s) per {p.epoch_s} s epoch "
            f"(one every {p.epoch_s / p.tokens:g} s) and holds at most {p.burst}, the top {min(p.priority, p.burst)} "
            f"priority tokens, the rest standard; a token needs {p.issuers} "
            f"issuer(s) and redeems until {p.grace_s} s after its epoch (signed key record of {address})"]


async def _audit_view(address: str, entries: list[PeerEntry], *, rpc: Rpc | None = None) -> list[str]:
    """Rows for the committee's audits, read from one verifier (unsigned: that verifier's view);
    the caller bounds it. ``rpc``: as :func:`~overlay.directory.rpc.abci_value`'s (tests)."""
    import msgpack

    from overlay.directory.registration import Code
    from overlay.directory.rpc import QueryRefused, RpcError, abci_value

    try:
        audit = msgpack.unpackb(await abci_value(address, "/audit", rpc=rpc), raw=False, strict_map_key=False)
        reputation = msgpack.unpackb(await abci_value(address, "/reputation", rpc=rpc), raw=False)
        listed = {e.node_id for e in entries if e.role == "model"}
        return audit_rows(audit, reputation, listed)
    except QueryRefused as exc:
        if exc.code == Code.AUDITS_OFF:
            return ["  audits: off (the committee's genesis has no audit section)"]
        return [f"  audits unknown: {exc}"]
    except RpcError as exc:
        return [f"  audits unknown: {exc}"]
    except (OSError, ValueError, TypeError, KeyError, msgpack.UnpackException) as exc:
        return [f"  audits unknown: {address} did not answer /audit ({type(exc).__name__}: {exc})"]


def _run(args: argparse.Namespace) -> int:
    from overlay.directory.membership import committee_settings
    from overlay.directory.registry import RegistryError, from_config
    from overlay.net.transport import TLSTransport

    cfg = resolve_config(args)
    committee_up = True
    try:
        committee = committee_settings(cfg)
        if committee is not None:
            rows, entries, committee_up = run_async(committee_view, committee.addresses, committee.chain_id,
                                                    committee.validators, args.timeout)
            for row in rows:
                print(row)
            print(f"registered nodes ({len(entries)}):")
        else:
            entries = from_config(cfg).entries
    except RegistryError as exc:
        raise CliError(f"status: {exc}") from None
    transport = TLSTransport(Identity.generate())  # a throwaway identity: status is anonymous
    results = run_async(query_all, transport, entries, args.timeout)
    for row in format_rows(entries, results):
        print(row)
    return 0 if committee_up and all(not isinstance(r, str) for r in results.values()) else 1
