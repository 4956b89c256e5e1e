"""``gentorrent model-node`` runner: picks the engine, checks the registry, serves."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from gentorrent.cli import CliError, resolve_config, run_async
from model_node.engine import Engine, EngineError
from model_node.forwarding import ForwardingPolicy
from model_node.quota import TIMEOUT_S, Redeemer
from model_node.reveals import PLANS_FILE, Reveals
from model_node.served import MAX_BYTES, MAX_DISK_BYTES, ServedStore
from overlay.directory.membership import CommitteeSettings, cancel_on_sigterm, directory, node_entry, serve_member
from overlay.directory.registry import RegistryError
from overlay.net.transport import TLSTransport, parse_address
from overlay.wire.clock import SystemClock
from overlay.wire.identity import Identity, load_or_create

log = logging.getLogger("gentorrent.model")

# Requests generated at once (default of --slots). llama.cpp decodes one sequence per slot in one
# batch (docs/decisions/0011-llama-batching.md); vLLM batches continuously, so the node lets it see
# many requests and keeps the rest queued.
SLOTS = {"llama.cpp": 8, "echo": 1, "vllm": 64}


def plan_engine(engine: str, model: str | None, echo_delay: float = 0.0, *, threads: int | None = None,
                prefix_snapshots: int | None = None, slots: int | None = None) -> tuple[str, Callable[[], Engine]]:
    """``(model id the registry must list, factory that loads the engine)``, without loading
    anything heavy yet, so that a misconfigured node fails before a long model load.
    ``threads``, ``prefix_snapshots`` and ``slots`` (default ``SLOTS``) apply to llama.cpp only."""
    if engine == "echo":
        from model_node.echo import EchoEngine

        mid = model or "echo"
        return mid, lambda: EchoEngine(mid, echo_delay)
    if engine == "llama.cpp":
        from model_node.llama import INSTALL_HINT, LlamaCppEngine, resolve_model

        try:
            mid, path = resolve_model(model)
        except EngineError as exc:
            raise CliError(str(exc)) from None
        if importlib.util.find_spec("llama_cpp") is None:
            raise CliError(f"llama-cpp-python is not installed: {INSTALL_HINT}")
        n = slots or SLOTS["llama.cpp"]
        return mid, lambda: LlamaCppEngine(path, model_id=mid, n_threads=threads, max_snapshots=prefix_snapshots,
                                           slots=n)
    if engine == "vllm":
        from model_node.vllm import INSTALL_HINT as VLLM_HINT
        from model_node.vllm import VllmEngine, installed, resolve_vllm_model

        try:
            mid, source = resolve_vllm_model(model)
        except EngineError as exc:
            raise CliError(str(exc)) from None
        if not installed():
            raise CliError(f"vLLM is not installed: {VLLM_HINT}")
        return mid, lambda: VllmEngine(source, model_id=mid)
    raise CliError(f"unknown engine {engine!r}; choose llama.cpp, vllm or echo")


def redeemer(committee: CommitteeSettings | None, model: str, args: argparse.Namespace) -> Redeemer | None:
    """The node's usage-quota redeemer (issue 31): with a committee, at the verifiers its
    membership uses (the committee's genesis decides whether quotas are on: verifiers with
    none answer ``QUOTA_OFF`` and every request is served alike); none without."""
    if committee is None:
        return None
    validators = frozenset(v.public_key for v in committee.validators)
    return Redeemer(model, lambda: committee.addresses, committee.chain_id, validators=lambda: validators,
                    timeout=getattr(args, "quota_timeout", TIMEOUT_S))


def withheld(committee: CommitteeSettings | None, identity: Identity, args: argparse.Namespace,
             data_dir: Path) -> tuple[ServedStore | None, Reveals | None]:
    """The node's store of served replies, kept in ``data_dir``/served so a restart loses none,
    and its reveals of the withheld ones (decision 0037: :mod:`model_node.served`,
    :mod:`model_node.served_log`, :mod:`model_node.reveals`): with a committee, unless
    ``--no-reveal-withheld``; neither without. The reveals read the validators' powers from
    genesis until the node's membership starts, which then gives the signed lists' latest; the
    sets they remember are kept in ``data_dir``/:data:`~model_node.reveals.PLANS_FILE`."""
    if committee is None or getattr(args, "no_reveal_withheld", False):
        return None, None
    from model_node.served_log import ServedLog

    try:
        gib = getattr(args, "served_store_gib", None)
        disk = MAX_DISK_BYTES if gib is None else int(gib * 2**30)
        store = ServedStore.open(ServedLog(data_dir / "served"), int(SystemClock().unix() * 1000),
                                 max_disk_bytes=disk, max_bytes=max(MAX_BYTES, disk // 8))
    except OSError as exc:
        raise CliError(f"cannot keep the replies this node serves in {data_dir / 'served'} ({exc}); make it a "
                       "directory this user can write, or run with --no-reveal-withheld") from None
    if len(store):
        log.info("served store: %d replies served before this start are kept, to hand in if withheld", len(store))
    validators = {v.public_key: v.power for v in committee.validators}
    return store, Reveals(committee.addresses, lambda: validators, identity, store, plans_file=data_dir / PLANS_FILE)


def run_model_node(args: argparse.Namespace, *, policy: ForwardingPolicy | None = None,
                   echo_delay: float = 0.0) -> int:
    """Run the model node ``args`` (``gentorrent model-node``'s flags) describe until
    interrupted. Benchmarks inject ``policy`` (a forwarding baseline instead of Algorithm 2)
    and ``echo_delay`` (seconds the echo engine waits per piece); the CLI passes neither."""
    cfg = resolve_config(args)
    slots = getattr(args, "slots", None) or SLOTS[args.engine]
    model, load_engine = plan_engine(args.engine, cfg.model, echo_delay, threads=args.threads,
                                     prefix_snapshots=args.prefix_snapshots, slots=slots)
    identity = load_or_create(cfg.data_path)
    try:
        registry, committee, source = directory(cfg)
    except RegistryError as exc:
        raise CliError(str(exc)) from None
    me = registry.by_id.get(identity.node_id)
    if committee is None and (me is None or me.role != "model" or model not in me.models):
        raise CliError(
            f"this node ({identity.node_id.hex()[:8]}) is not listed in the registry as a model node serving "
            f"{model!r}; users could not find it"
        )
    try:
        host, port = parse_address(cfg.listen)
    except ValueError as exc:
        raise CliError(f"listen: {exc}") from None
    if args.engine == "echo":
        log.warning("engine 'echo' is a DIAGNOSTIC: it streams prompts back and runs no model")
    try:
        engine = load_engine()
    except EngineError as exc:
        raise CliError(str(exc)) from None

    from model_node.group import GroupConfig
    from model_node.server import ModelNode

    close: Any = getattr(engine, "close", None)  # vLLM's asyncio thread must be stopped
    try:
        group = (None if args.no_forwarding
                 else GroupConfig(sync_interval=args.sync_interval, load_threshold=args.load_threshold,
                                  bits=args.hash_bits))
        store, reveals = withheld(committee, identity, args, cfg.data_path)
        node = ModelNode(identity, TLSTransport(identity), registry, engine, slots=slots,
                         capacity=args.capacity, max_queue_wait=args.max_queue_wait, group=group, policy=policy,
                         accept_direct_requests=args.accept_direct_requests,
                         registered_only=committee is not None, redeemer=redeemer(committee, model, args),
                         served_store=store)

        async def main() -> None:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(cancel_on_sigterm, nursery.cancel_scope)
                address, member = await nursery.start(
                    serve_member, node, host, port, committee, registry,
                    lambda address: node_entry(identity, cfg.advertise or address, cfg.region, model=model,
                                               capacity=args.capacity))
                log.info("model node %s on %s; directory from %s", identity.node_id.hex()[:8], address, source)
                if reveals is not None:
                    if member is not None:  # the lists' latest validators, not genesis's (as donors deal by)
                        reveals.validators = member.powers
                    await nursery.start(reveals.run)
                print(f"READY {identity.node_id.hex()} {address}", flush=True)

        try:
            run_async(main, long_lived=True)
        except KeyboardInterrupt:
            print("model node stopped", file=sys.stderr)
    finally:
        if close is not None:
            close()
    return 0
