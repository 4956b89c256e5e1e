"""Where a node finds its peers, and keeping that view live (docs/committee.md "Nodes and the committee").

A node's directory (the users it may relay with, the model nodes it may reach) comes from one of:

- **the verifier committee** (``--committee HOST:PORT,...`` with ``--committee-genesis FILE``): the
  node registers itself (:mod:`overlay.directory.registration`), takes its lists from the committee's signed
  lists (:class:`overlay.directory.lists.CommitteeClient`), and sees their updates live;
- a **signed registry file** (``--registry`` + ``--registry-keys``), a local option, static;
- an **unsigned peers file** (``--peers``), for local testing only, static.

:class:`Membership` is the thin driver of the first: register, wait for the signed lists that hold
this node, then refresh them every few seconds (each time from more than one verifier, by delta;
lists older than :data:`overlay.directory.lists.MAX_LIST_AGE_S` are refused, and a warning says when no
fresh list can be had) and hand each update to ``on_update``. The node's
:class:`~overlay.directory.registry.Registry` object is updated in place (:meth:`Registry.replace`), so every
part holding it (relay checks, path selection, the model list) sees new nodes and loses removed ones
without a restart.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import msgpack
import trio

from overlay.directory.lists import REFRESH_S, CommitteeClient, Fetch, ListError, ValidatorKey, load_genesis
from overlay.directory.registration import CommitteeRegistration, Entry, Registrar, RegistrationError
from overlay.directory.registry import Registry, RegistryError, from_config
from overlay.directory.rpc import Rpc
from overlay.net.transport import parse_address
from overlay.wire.clock import Clock, TrioClock
from overlay.wire.constants import REPUTATION_SCALE, ROLE_MODEL, TRUST_LINE
from overlay.wire.identity import Identity

log = logging.getLogger("gentorrent.membership")

LIST_WAIT_S = 60.0  # how long a starting node waits for the signed lists that hold its registration
WARMUP_S = 60.0  # for this long after start, lists are refreshed every WARMUP_INTERVAL_S (nodes start together)
WARMUP_INTERVAL_S = 1.0
MIN_GAP_S = 1.0  # a poke (an unlisted node seen) refreshes at most this often


@dataclass(frozen=True)
class CommitteeSettings:
    """How to reach and trust a committee: its verifiers' RPC addresses, chain id and validator keys."""

    addresses: tuple[str, ...]
    chain_id: str
    validators: tuple[ValidatorKey, ...]


def committee_settings(cfg: Any) -> CommitteeSettings | None:
    """``--committee`` and ``--committee-genesis`` as settings (``None`` when no committee is named);
    :class:`RegistryError` saying what to fix."""
    if not cfg.committee:
        if cfg.committee_genesis:
            raise RegistryError("--committee-genesis needs --committee HOST:PORT,... (the verifiers' RPC addresses)")
        return None
    if not cfg.committee_genesis:
        raise RegistryError("--committee needs --committee-genesis FILE: the committee's genesis.json (every "
                            "verifier holds it in DATA_DIR/cometbft/config/genesis.json)")
    addresses = tuple(a.strip() for a in cfg.committee.split(",") if a.strip())
    for a in addresses:
        try:
            parse_address(a)
        except ValueError as exc:
            raise RegistryError(f"--committee: {a!r}: {exc}") from None
    if not addresses:
        raise RegistryError("--committee names no address; pass HOST:PORT,... (the verifiers' CometBFT RPC)")
    try:
        chain_id, validators = load_genesis(cfg.committee_genesis)
    except ListError as exc:
        raise RegistryError(str(exc)) from None
    return CommitteeSettings(addresses, chain_id, validators)


def directory(cfg: Any) -> tuple[Registry, CommitteeSettings | None, str]:
    """``(registry, committee, source)``: with a committee, an empty registry that
    :class:`Membership` fills; otherwise the file's (static) registry. ``source`` says in words
    where the directory comes from."""
    committee = committee_settings(cfg)
    if committee is not None:
        return Registry(0, []), committee, f"the committee {committee.chain_id!r} ({len(committee.addresses)} verifiers)"
    if cfg.registry:
        return from_config(cfg), None, f"the signed registry file {cfg.registry} (local option)"
    reg = from_config(cfg)
    log.warning("using the UNSIGNED peers file %s: for local testing only (use --committee)", cfg.peers)
    return reg, None, f"the UNSIGNED peers file {cfg.peers} (local testing only)"


def node_entry(identity: Identity, address: str, region: str, *, model: str = "", capacity: int = 0) -> Entry:
    """What this node registers: a user (no model) or a model node (model id, capacity 1-10)."""
    host, _ = parse_address(address)
    if host in ("0.0.0.0", "::", ""):
        raise RegistrationError(f"listening on {address}, which other nodes cannot dial: pass --listen with the "
                                "address others reach this node at")
    from overlay.directory.registration import TxError, check_entry
    from overlay.wire.constants import ROLE_USER

    entry = Entry(ROLE_MODEL if model else ROLE_USER, identity.x25519.public_bytes, address, region, model, capacity)
    try:
        check_entry(entry)
    except TxError as exc:
        raise RegistrationError(f"this node cannot register {address!r}: {exc.reason} (pass --advertise IP:PORT, "
                                "the address others reach this node at)", exc.code) from None
    return entry


class ListedNode(Protocol):
    """What :func:`serve_member` starts: a user node (:class:`overlay.usernode.UserNode`) or a model
    node (:class:`model_node.server.ModelNode`)."""

    identity: Identity
    on_unlisted: Any  # Callable[[], None] | None: told when a peer is not in this node's lists

    async def serve(self, host: str = ..., port: int = ..., *, task_status: Any = ...) -> None: ...

    def directory_changed(self) -> None:
        """Its registry was updated in place: dial new peers, forget removed ones."""


async def serve_member(node: ListedNode, host: str, port: int, committee: CommitteeSettings | None,
                       registry: Registry, entry: Callable[[str], Entry], *, rpc: Rpc | None = None,
                       fetch: Fetch | None = None,
                       task_status: trio.TaskStatus[tuple[str, Membership | None]] = trio.TASK_STATUS_IGNORED
                       ) -> None:
    """Serve ``node`` on ``host:port`` and, with a ``committee``, make it a member: register
    ``entry(address)`` (the address it listens on), refresh its lists into ``registry`` (the
    node's own: it is updated in place) and tell the node after each change
    (``directory_changed``), and refresh early when the node meets a peer its lists lack.
    Started (``nursery.start``) once the node serves and, with a committee, once a verified list
    holds it: ``(address, membership)``, the membership None without a committee. Runs until
    cancelled (the registration then leaves). Every node role starts this way. ``rpc``/``fetch``:
    as :class:`Membership`'s (tests)."""
    async with trio.open_nursery() as nursery:
        address: str = await nursery.start(node.serve, host, port)
        member = None
        if committee is not None:
            member = Membership(committee, node.identity, registry, on_update=lambda _: node.directory_changed(),
                                rpc=rpc, fetch=fetch)
            node.on_unlisted = member.poke
            await nursery.start(member.run, entry(address))
        task_status.started((address, member))


class Membership:
    """A node's membership in a committee's network: registration plus live signed lists.

    ``run(entry)`` registers ``entry`` (and keeps it fresh, and leaves when cancelled), waits until
    the signed lists hold the registration, replaces ``registry``'s content with them, reports
    started, then refreshes every ``interval`` seconds (every :data:`WARMUP_INTERVAL_S` during the
    first :data:`WARMUP_S`, when the nodes of a network start together) and calls
    ``on_update(registry)`` after each verified refresh that changed the entries. :meth:`poke`
    (a node saw a peer its lists do not hold: maybe one that just registered) refreshes early, at
    most every :data:`MIN_GAP_S`. ``rpc``/``fetch`` are injectable (tests answer from an
    in-process committee).
    """

    def __init__(self, settings: CommitteeSettings, identity: Identity, registry: Registry, *,
                 on_update: Callable[[Registry], None] | None = None, clock: Clock | None = None,
                 interval: float = REFRESH_S, list_wait: float = LIST_WAIT_S, rpc: Rpc | None = None,
                 fetch: Fetch | None = None) -> None:
        self.settings = settings
        self.identity = identity
        self.registry = registry
        self.on_update = on_update
        self.clock = clock or TrioClock()
        self.list_wait = list_wait
        self.rpc = rpc
        self.client = CommitteeClient(settings.addresses, settings.chain_id, settings.validators, fetch=fetch,
                                      clock=self.clock, interval=interval)
        self.registration: CommitteeRegistration | None = None
        self.refreshes = 0
        self._poked = trio.Event()
        self._warned_rep: int | None = None  # the reputation last warned about (once per value)

    def poke(self) -> None:
        """Refresh the lists soon (called from trio: a relay or model node met an unlisted peer)."""
        self._poked.set()

    def powers(self) -> dict[bytes, int]:
        """The voting power of each validator key the committee client holds now (the genesis set,
        or the committee's signed lists' latest): what a donor deals an escrow by, and what a
        model node reads a release by (decision 0037)."""
        return {v.public_key: v.power for v in self.client.validators}

    def _apply(self, reg: Registry) -> None:
        mine = reg.by_id.get(self.identity.node_id)
        rep = None if mine is None else mine.reputation
        if mine is not None and not mine.trusted and rep != self._warned_rep:
            log.warning("this model node is untrusted: the committee's audits put its reputation at %.3f, under "
                        "the trust line %g, so no client sends it requests. The audits go on (untrusted nodes stay "
                        "on the signed list so that they can be audited): check that it serves its model "
                        "unmodified and answers the audits in time, and its reputation climbs back above the line "
                        "after an epoch or two of honest answers (decision 0013)", (rep or 0) / REPUTATION_SCALE,
                        TRUST_LINE / REPUTATION_SCALE)
        self._warned_rep = rep
        if reg.entries == self.registry.entries:
            self.registry.version = reg.version
            return
        self.registry.replace(reg)
        if self.on_update is not None:
            self.on_update(self.registry)

    async def _refresh_forever(self) -> None:
        started = last = self.clock.monotonic()
        while True:
            warm = self.clock.monotonic() - started < WARMUP_S
            with trio.move_on_after(WARMUP_INTERVAL_S if warm else self.client.interval):
                await self._poked.wait()
            await trio.sleep(max(0.0, last + MIN_GAP_S - self.clock.monotonic()))
            self._poked = trio.Event()
            last = self.clock.monotonic()
            try:
                reg = await self.client.refresh()
            except ListError as exc:
                self._stale(exc)
                self._apply(self.client.registry())  # the held lists, less the records expired since
                continue
            self.refreshes += 1
            self._apply(reg)

    def _stale(self, exc: ListError) -> None:
        """Say that no fresh list could be had, and how old the held one is."""
        age = self.client.list_age()
        if age is not None and age > self.client.max_age:
            log.warning("NO FRESH COMMITTEE LIST: the lists this node holds were signed %.0f s ago (height %d), more "
                        "than the %g s bound, and no verifier served a newer one that verifies. This node keeps "
                        "using them (less the records that expired) but may miss nodes that joined or left: check "
                        "that the committee is running and that this machine's clock is right. %s", age,
                        self.client.height, self.client.max_age, exc)
        else:
            log.warning("committee lists not refreshed (keeping those held%s): %s",
                        "" if age is None else f", signed {age:.0f} s ago", exc)

    async def _first_lists(self, height: int, entry: Entry) -> None:
        deadline = self.clock.monotonic() + self.list_wait
        last = "none served yet"
        left_out = False  # lists at or past the registration's height were served without this node
        while True:
            try:
                reg = await self.client.refresh()
                if self.client.height >= height and self.identity.node_id in reg.by_id:
                    self._apply(reg)
                    return
                left_out = self.client.height >= height
                last = (f"the signed lists at height {self.client.height} do not hold this node" if left_out
                        else f"the lists are at height {self.client.height}, the registration at {height}")
            except ListError as exc:
                last = str(exc)
            if self.clock.monotonic() > deadline:
                if left_out and entry.role == ROLE_MODEL:
                    raise RegistrationError(await self._untrusted_reason(height, entry))
                raise RegistrationError(f"registered at height {height}, but no signed list holding this node came "
                                        f"within {self.list_wait:g} s: {last}")
            await trio.sleep(0.25)

    async def _untrusted_reason(self, height: int, entry: Entry) -> str:
        """Why a registered model node is missing from the signed model list, and what to do: the
        committee's ``/node`` query says whether it is registered, ``/reputation`` its reputation."""
        assert self.registration is not None
        node = self.identity.node_id.hex()[:16]
        try:
            _, registered = await self.registration.read_state()
        except RegistrationError as exc:
            return (f"registered at height {height}, but the signed model lists since leave this node ({node}) "
                    f"out, and the committee could not be asked why ({exc})")
        if not registered:
            return (f"registered at height {height}, but the committee no longer holds this node ({node}) "
                    "(its /node query does not know it: the registration expired or was removed); restart the "
                    "node to register again")
        value = await self._reputation()
        rep = (f"reputation {value / REPUTATION_SCALE:.3f}" if value is not None
               else "reputation unknown: the /reputation query did not answer with this node")
        return (f"this model node ({node}) is registered (height {height}; the committee's /node query holds it) "
                f"but the signed model lists since leave it out ({rep}). A committee that follows decision 0013 "
                "lists every registered model node, untrusted ones too: this committee's verifiers may run an "
                f"older version. Check that this node serves its model ({entry.model_id!r}) and ask the "
                "committee's operators")

    async def _reputation(self) -> int | None:
        """This node's reputation (fixed point) from the committee's ``/reputation`` query
        (``[[node_id, value, window, epochs], ...]``); ``None`` if it does not answer, does not
        decode or does not hold this node (the value is only shown to the operator)."""
        assert self.registration is not None
        try:
            code, value, _ = await self.registration._query("/reputation", b"")  # the same package's RPC
            rows = msgpack.unpackb(value, raw=False, strict_map_key=False) if code == 0 else None
        except (RegistrationError, ValueError, TypeError, msgpack.UnpackException):
            return None
        if type(rows) is not list:
            return None
        for row in rows:
            if (type(row) is list and len(row) >= 2 and row[0] == self.identity.node_id and type(row[1]) is int
                    and 0 <= row[1] <= REPUTATION_SCALE):
                return row[1]
        return None  # not in the table: never audited (then it would be listed: R(0) = 0.5)

    async def run(self, entry: Entry, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Register ``entry``, wait for lists that hold it, report the registration's height, then
        refresh the lists until cancelled (the registration then leaves)."""
        registrar = Registrar(self.identity.signing, self.settings.chain_id, entry)
        self.registration = CommitteeRegistration(self.settings.addresses, registrar, rpc=self.rpc, clock=self.clock)
        failure: RegistrationError | None = None
        async with trio.open_nursery() as nursery:
            try:
                height: int = await nursery.start(self.registration.run)
                await self._first_lists(height, entry)
            except RegistrationError as exc:  # raised below, outside the nursery (no exception group)
                failure = exc
                nursery.cancel_scope.cancel()  # a registration that did commit leaves again
            if failure is None:
                await self._serve_lists(height, task_status)
        if failure is not None:
            raise failure

    async def _serve_lists(self, height: int, task_status: trio.TaskStatus[int]) -> None:
        log.info("registered with the committee %r at height %d; lists of %d nodes",
                 self.settings.chain_id, height, len(self.registry.entries))
        task_status.started(height)
        await self._refresh_forever()


async def cancel_on_sigterm(scope: trio.CancelScope) -> None:
    """Cancel ``scope`` on SIGTERM, so a node stopped that way shuts down cleanly (and leaves the
    committee's lists) as on Ctrl-C."""
    with trio.open_signal_receiver(signal.SIGTERM) as signals:
        async for _ in signals:
            scope.cancel()
            return
