"""The user's proxy paths (paper §3.2 step 2): build, keep N ready, refresh, rebuild.

A :class:`PathManager` keeps ``target`` ready paths. Each path is 3 relays
drawn at random from the registry's users of our region — never ourselves, and
no relay shared between two of our paths. Building sends one
:class:`~overlay.wire.messages.Create` onion to the first relay and waits for the
proxy's :class:`~overlay.wire.messages.PathReady`; a build that times out or is
destroyed is retried on other relays. Paths older than ``refresh`` seconds are
replaced (paper §5.2: "discover new proxies every 15 minutes"); a path that
fails (Destroy, lost first hop) is dropped and rebuilt at once, and so is a path that
misbehaves silently (issue 15, item 4): a backward cell or reply clove that fails
authentication, a proxy's notice that a forward cell failed there, or a request for which the
path brought no reply clove at all while the request's other paths did (if the clove has not
come ``LATE_CLOVE`` seconds after the request ended, the path is doubted — not used, replaced at
once — and given up unless the clove comes within ``MISSING_GRACE`` seconds after the request
ended). Counted in ``replaced[reason]``.

A build that fails fast, before its ``PathReady`` (a relay's ``Destroy``, a first relay
unreachable or lost; not a timeout, which has waited ``build_timeout`` already), pushes the next
build back (:class:`Backoff`, issue 28 item 9): exponential from ``BACKOFF_BASE_S``, doubling per
consecutive failed round, capped at ``BACKOFF_CAP_S``, with equal jitter; while builds keep
failing only one build is in flight (a probe), and the first ``PathReady`` ends the back-off, so
the pool fills at once. A ``Destroy("not-registered")`` means a relay's
list does not hold us yet (we registered moments ago): it is counted (``refused[reason]``) and
backed off, but does not make the path's relays suspects, since they will serve us after their
next list refresh. Without this, a new user's pool rebuilt on every refusal at once: hundreds
of refused builds a second until the relays' rate limits stopped answering.

Relays are drawn from the user's region if it has at least ``region_min_users`` users
(:data:`REGION_MIN_USERS`, the paper's "more than 1,000 users per region"), else from the
nearest wider region ('eu-west' -> 'eu' -> everyone; :func:`region_scope`): regions are
self-declared, and a small region would be a small anonymity set.

Besides its pool, the manager builds *one-off* paths for a single request
(:meth:`PathManager.build_fresh`, retired with :meth:`PathManager.retire`): a verifier sends
each audit challenge over paths no other request used, so the proxies that deliver one
challenge's cloves link it to no other (decision 0013). They are never handed to other
requests, and :meth:`~PathManager.run` neither counts nor refreshes them.

The manager owns the user's end of its paths: the node routes ``CellBack`` and
``Destroy`` on links it owns here (:meth:`owns`).
"""

from __future__ import annotations

import functools
import logging
import math
import random
from collections import Counter
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import trio

from overlay.anon import onion
from overlay.net.peers import PeerEntry
from overlay.wire import codec, crypto
from overlay.wire.clock import Clock, TrioClock
from overlay.wire.identity import short_id
from overlay.wire.messages import LINK_ID_LEN, CellBack, Create, Destroy, FromModel, PathNotice, PathReady

log = logging.getLogger("gentorrent.paths")

SUSPECT_SECONDS = 60.0  # relays of a failed path are avoided this long (if enough others exist)
MISSING_GRACE = 5.0  # after a request ends, how long a path's first reply clove may still be late
# A request ends as soon as k of its n paths brought the last chunk, so the other paths' cloves
# are usually a moment behind: a path is doubted only if its clove is this late (seconds).
LATE_CLOVE = 0.5
FRESH_RETRY_S = 1.0  # build_fresh: the pause before building again when every build failed at once
EXPIRY_JITTER = 1200  # each hop's expiry is path_ttl plus an independent uniform draw from [0, this) s
BACKOFF_BASE_S = 0.5  # the pause after the first failed round of builds (then doubled per failed round)
BACKOFF_CAP_S = 30.0  # the longest pause between two rounds of builds
NOT_REGISTERED = "not-registered"  # a relay's Destroy reason: its list does not hold us (yet)
# Destroy reasons counted by name in ``PathManager.refused``; any other reason (it comes from the
# network) is counted as "other", so the counter stays small.
REFUSAL_REASONS = frozenset({NOT_REGISTERED, "table-full", "bad-next-hop", "expired", "closed", "neighbour-lost",
                             "bad-size", "bad-key", "bad-mac", "bad-flags", "bad-cell"})
REGION_MIN_USERS = 1000  # fewer users than this in a region: its users draw relays from a wider one


class PathError(Exception):
    """Not enough paths could be built or are ready."""


class _HasNodeId(Protocol):
    @property
    def node_id(self) -> bytes: ...


_E = TypeVar("_E", bound=_HasNodeId)


def choose_relays(directory: Sequence[_E], me: bytes, in_use: Container[bytes], suspect: Callable[[bytes], bool],
                  rng: random.Random, hops: int = onion.HOPS) -> list[_E]:
    """The relays of a new path: ``hops`` distinct entries drawn uniformly from ``directory``,
    never ``me`` nor a relay of our live paths (``in_use``), avoiding ``suspect`` relays unless
    fewer than ``hops`` others remain. Pure (the :class:`PathManager` and the simulations call
    it). Raises :class:`PathError` when fewer than ``hops`` relays are usable."""
    pool = [e for e in directory if e.node_id != me and e.node_id not in in_use and not suspect(e.node_id)]
    if len(pool) < hops:
        # Fall back to suspects rather than build nothing; never reuse a live path's relay.
        pool = [e for e in directory if e.node_id != me and e.node_id not in in_use]
    if len(pool) < hops:
        raise PathError(f"need {hops} relays not used by our other paths, only {len(pool)} available")
    return rng.sample(pool, hops)


class _HasRegion(Protocol):
    @property
    def node_id(self) -> bytes: ...

    @property
    def region(self) -> str: ...


_R = TypeVar("_R", bound=_HasRegion)


def in_region(region: str, scope: str) -> bool:
    """Whether a node of ``region`` belongs to the region ``scope``: the same region or one inside
    it ('eu-west' and 'eu-west-2' are in 'eu-west' and in 'eu'); every region is in ``""``."""
    return scope == "" or region == scope or region.startswith(scope + "-")


def wider_region(scope: str) -> str:
    """The region around ``scope``: its name before the last '-' ('eu-west' -> 'eu'), and ``""``
    (everyone) around a name without one."""
    return scope.rsplit("-", 1)[0] if "-" in scope else ""


def region_scope(users: Sequence[_R], region: str, min_users: int = REGION_MIN_USERS) -> tuple[str, list[_R]]:
    """The region whose ``users`` a user of ``region`` draws its relays from, and those users:
    ``region`` itself if at least ``min_users`` of ``users`` are in it (:func:`in_region`), else
    the first of its wider regions (:func:`wider_region`) that has as many, else everyone
    (scope ``""``). Every user whose choice lands on one scope draws from the same set, so a
    region smaller than ``min_users`` never narrows an anonymity set below it (unless the whole
    network is smaller). Pure."""
    scope = region
    while True:
        members = [u for u in users if in_region(u.region, scope)]
        if len(members) >= min_users or scope == "":
            return scope, members
        scope = wider_region(scope)


class Backoff:
    """When the next path build may start, after consecutive failed rounds of builds.

    Builds started together form a *round* (:attr:`round`, stamped on each build); the first
    failure of the current round opens the next one and pushes the next build back by
    ``min(cap, base * 2**(f-1))`` seconds with equal jitter (half fixed, half uniform from
    ``rng``), ``f`` the number of consecutive failed rounds; later failures of an older round
    add nothing, so a pool whose four builds are all refused backs off once, not four times.
    A success ends the back-off and opens a new round. ``base = 0`` turns it off (every failed
    build may be retried at once). Pure: the caller passes the time."""

    def __init__(self, rng: random.Random, base: float = BACKOFF_BASE_S, cap: float = BACKOFF_CAP_S) -> None:
        if not (0 <= base <= cap and math.isfinite(cap)):
            raise ValueError(f"need 0 <= base <= cap < inf; got base {base}, cap {cap}")
        self.rng, self.base, self.cap = rng, base, cap
        self.failures = 0  # consecutive failed rounds
        self.round = 0
        self.not_before = -math.inf  # monotonic time before which no build starts

    @property
    def enabled(self) -> bool:
        return self.base > 0

    def delay(self, failures: int) -> float:
        """The pause after ``failures`` (>= 1) consecutive failed rounds, jitter drawn."""
        d = min(self.cap, self.base * 2.0 ** min(failures - 1, 64))
        return d / 2 + self.rng.uniform(0, d / 2)

    def failed(self, build_round: int, now: float) -> float | None:
        """A build of round ``build_round`` failed at ``now``: the pause before the next build if
        this failure opened a new round, ``None`` if its round had already failed (or back-off
        is off)."""
        if not self.enabled or build_round != self.round:
            return None
        self.failures += 1
        self.round += 1
        d = self.delay(self.failures)
        self.not_before = now + d
        return d

    def succeeded(self) -> None:
        """A build succeeded: builds may start at once again."""
        self.failures = 0
        self.round += 1
        self.not_before = -math.inf

    def wait(self, now: float) -> float:
        """Seconds from ``now`` until a build may start (0: now)."""
        return max(0.0, self.not_before - now)

    @property
    def probing(self) -> bool:
        """Builds keep failing: start one at a time until one succeeds."""
        return self.enabled and self.failures > 0


def hop_expiries(unix: float, ttl: int, jitter: int, rng: random.Random, hops: int = onion.HOPS) -> list[int]:
    """One onion expiry per hop (unix seconds): ``unix + ttl`` plus an independent uniform
    draw from ``[0, jitter)`` for each hop. A relay learns only its own value, which is
    independent of every other hop's and path's, so expiries link nothing (decision 0003);
    every hop lives at least ``ttl``, and the caller keeps ``ttl + jitter`` within
    :data:`~overlay.anon.onion.MAX_ONION_TTL`. Pure."""
    if jitter < 1 or ttl < 1 or ttl + jitter > onion.MAX_ONION_TTL:
        raise ValueError(f"need 1 <= ttl, 1 <= jitter, ttl + jitter <= {onion.MAX_ONION_TTL}; got {ttl}, {jitter}")
    base = int(unix) + ttl
    return [base + rng.randrange(jitter) for _ in range(hops)]


class ReturnRoutes(dict[bytes, Callable[[bytes], bool | None]]):
    """A path's reply routing (return tag -> callback), as :class:`~overlay.anon.client.AnonClient`
    uses it (``routes[tag] = cb`` when a request starts, ``routes.pop(tag, None)`` when it
    ends); it tells its :class:`PathManager` both, so the manager can see a path that brings
    no reply cloves."""

    def __init__(self, started: Callable[[bytes], None], ended: Callable[[bytes], None]) -> None:
        super().__init__()
        self._started, self._ended = started, ended

    def __setitem__(self, tag: bytes, cb: Callable[[bytes], bool | None]) -> None:
        super().__setitem__(tag, cb)
        self._started(tag)

    def pop(self, tag: bytes, *default: Any) -> Any:
        had = tag in self
        out = super().pop(tag, *default)
        if had:
            self._ended(tag)
        return out


# The code of the notice a path's watchers get when the path dies here (a proxy saying the
# same is believed just as much: it speaks for its own path only).
PATH_CLOSED = "path-closed"


@dataclass(eq=False)
class Path:
    relays: list[PeerEntry]
    link_id: bytes
    crypt: onion.PathCrypt
    created: float
    ready: trio.Event = field(default_factory=trio.Event)
    proxy_path_id: bytes | None = None
    closed: trio.Event = field(default_factory=trio.Event)  # set when the path dies (:attr:`dead`)
    # reply routing: return tag -> callback(data); the manager watches what is delivered per tag
    returns: dict[bytes, Callable[[bytes], bool | None]] = field(default_factory=dict)
    notices: int = 0
    # requests in flight on this path: return tag -> callback(notice) for the proxy's notices
    watchers: dict[bytes, Callable[[PathNotice], None]] = field(default_factory=dict)
    doubted: bool = False  # brought no reply clove for its last request: not used, being replaced
    build_round: int = 0  # the Backoff round the build started in

    @property
    def dead(self) -> bool:
        """Closed, here or by a relay: no longer used (``await path.closed.wait()`` waits for it)."""
        return self.closed.is_set()

    @property
    def first(self) -> bytes:
        return self.relays[0].node_id

    @property
    def proxy(self) -> PeerEntry:
        return self.relays[-1]

    def __repr__(self) -> str:
        hops = "→".join(short_id(r.node_id) for r in self.relays)
        return f"<Path {hops} {'ready' if self.ready.is_set() else 'building'}{' dead' if self.dead else ''}>"


class PathManager:
    def __init__(
        self,
        node: Any,
        directory: Callable[[], list[PeerEntry]],
        *,
        target: int = 4,
        build_timeout: float = 10.0,
        refresh: float = 15 * 60.0,
        path_ttl: int = 3600,
        expiry_jitter: int = EXPIRY_JITTER,
        rng: random.Random | None = None,
        clock: Clock | None = None,
        region: str | None = None,
        region_min_users: int = REGION_MIN_USERS,
        backoff_base: float = BACKOFF_BASE_S,
        backoff_cap: float = BACKOFF_CAP_S,
    ) -> None:
        """``node`` sends frames (``send_nowait``); ``directory()`` lists the relays usable: with
        ``region`` (our region), every user, of which the manager uses those of the region
        :func:`region_scope` picks (``region_min_users``); without, exactly the relays to draw
        from. ``target`` is N ≥ n (paper §3.2). ``clock`` (default
        :class:`~overlay.wire.clock.TrioClock`) times refreshes, suspect periods and the back-off
        between failed builds (``monotonic``; :class:`Backoff` with ``backoff_base`` and
        ``backoff_cap``, jitter from ``rng``; ``backoff_base=0`` turns it off) and stamps onion
        expiries (``unix``): each hop of each path gets its own, ``path_ttl`` plus an
        independent draw from ``[0, expiry_jitter)`` seconds (:func:`hop_expiries`)."""
        self.clock: Clock = clock or TrioClock()
        self.node = node
        self.directory = directory
        self.target = target
        self.build_timeout = build_timeout
        self.refresh = refresh
        self.path_ttl = path_ttl
        self.expiry_jitter = expiry_jitter
        if path_ttl < 1 or expiry_jitter < 1 or path_ttl + expiry_jitter > onion.MAX_ONION_TTL:
            raise ValueError(f"path_ttl + expiry_jitter must be positive and at most {onion.MAX_ONION_TTL} s "
                             f"(relays refuse longer onions); got {path_ttl} + {expiry_jitter}")
        self.rng = rng or random.SystemRandom()
        self.backoff = Backoff(self.rng, backoff_base, backoff_cap)
        self.region = region
        self.region_min_users = region_min_users
        self.scope: str | None = region  # the region relays are drawn from (region_scope), once known
        self.paths: list[Path] = []
        self.one_off: list[Path] = []  # paths of one request (build_fresh), outside the pool
        self.by_link: dict[tuple[bytes, bytes], Path] = {}
        self._changed = trio.Event()
        self.built = 0
        self.failed = 0  # builds that failed, for any reason (refused, timed out, first relay lost)
        self.refused: Counter[str] = Counter()  # builds a relay refused (Destroy before PathReady), by reason
        self._suspect: dict[bytes, float] = {}  # relay id -> monotonic time until which we avoid it
        self.dropped: Counter[str] = Counter()  # backward cells dropped, by reason
        self.replaced: Counter[str] = Counter()  # paths given up for silent misbehaviour, by reason
        self.cloves_in = 0  # reply cloves routed to a live request, on any path
        # A request's return tags are registered together (one per path, no await between them):
        # such a batch is what a path is compared with. tag -> (path, batch, cloves on this path)
        self._tag_state: dict[bytes, tuple[Path, int, int]] = {}
        self._batches: dict[int, list[int]] = {}  # batch -> [tags still live, cloves on any of its paths]
        self._batch = (0, -1.0, set[int]())  # the open batch: id, time it opened, paths in it
        # Once a client calls start_request(), batches open only there (the clock reading moves
        # between two registrations under a real clock, so it cannot delimit a request).
        self._explicit = False
        self._new_batch = False
        self._missing: dict[bytes, tuple[Path, float]] = {}  # ended tags with no clove: (path, deadline)
        self._unsure: dict[bytes, float] = {}  # missing tags not yet LATE_CLOVE late -> when they will be

    # ------------------------------------------------------------------ queries

    def ready_paths(self) -> list[Path]:
        self._doubt_late(self.clock.monotonic())
        return [p for p in self.paths if p.ready.is_set() and not p.dead and not p.doubted]

    def owns(self, peer: bytes, link_id: bytes) -> Path | None:
        return self.by_link.get((peer, link_id))

    @property
    def refused_builds(self) -> int:
        """Builds a relay refused with a ``Destroy`` before their ``PathReady`` (any reason)."""
        return sum(self.refused.values())

    async def wait_ready(self, n: int) -> list[Path]:
        """At least ``n`` ready paths, once builds have made them. The caller bounds the wait (a
        cancel scope) and may report :meth:`too_few` when it runs out."""
        while len(ready := self.ready_paths()) < n:
            await self._changed.wait()
        return ready

    def too_few(self, n: int, waited: float, *, fresh: bool = False) -> PathError:
        """The error for a caller that waited ``waited`` seconds in vain for ``n`` ready paths
        (:meth:`wait_ready`) or, ``fresh``, for ``n`` paths built for one request (:meth:`build_fresh`)."""
        if fresh:
            return PathError(f"could not build {n} fresh proxy paths within {waited:.0f}s; check that enough "
                             "relays are up")
        return PathError(
            f"only {len(self.ready_paths())} of the {n} proxy paths needed are ready after {waited:.0f}s "
            f"({len(self.paths)} known, {self.failed} builds failed: {self.paths!r}); check that enough "
            "relays are up"
        )

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    # ------------------------------------------------------------------ events from the node

    def on_cell_back(self, path: Path, msg: CellBack) -> None:
        try:
            payload = codec.decode(path.crypt.unwrap_backward(msg.iv, msg.body))
        except (onion.OnionError, codec.RemoteProtocolError) as exc:
            reason = "cell-unauthentic" if isinstance(exc, onion.OnionError) else "cell-malformed"
            self.dropped[reason] += 1
            log.info("%r: dropped a backward cell: %s", path, exc)
            self._replace(path, "backward-" + reason)  # a hop changed it: the path cannot be trusted
            return
        if isinstance(payload, PathReady):
            if path.proxy_path_id is None:
                path.proxy_path_id = payload.proxy_path_id
                path.ready.set()
                self.built += 1
                if self.backoff.failures:
                    log.info("%r: relays accept our builds again after %d failed rounds", path, self.backoff.failures)
                self.backoff.succeeded()
                self._notify()
        elif isinstance(payload, FromModel):
            data = payload.data
            tag = data[:8]
            cb = path.returns.get(tag)
            if cb is not None:
                st = self._tag_state.get(tag)
                if st is not None:
                    self._tag_state[tag] = (st[0], st[1], st[2] + 1)
                    self._batches[st[1]][1] += 1
                self.cloves_in += 1
                if cb(data) is False:  # the client says the clove does not open: the proxy tampered
                    self._replace(path, "reply-clove-unauthentic")
            else:
                late = self._missing.get(tag)
                if late is not None and late[0] is path:
                    del self._missing[tag]  # the path was only slow
                    self._unsure.pop(tag, None)
                    was = path.doubted
                    path.doubted = any(q is path and t not in self._unsure for t, (q, _) in self._missing.items())
                    if was and not path.doubted:
                        self._cleared(path)
                self.dropped["reply-unknown-tag"] += 1  # late (request finished) or forged
        elif isinstance(payload, PathNotice):
            path.notices += 1
            log.warning("proxy %s reports %s: %s", short_id(path.proxy.node_id), payload.code, payload.detail)
            if payload.code == "cell-unauthentic":
                self._replace(path, "forward-cell-unauthentic")
            for watch in list(path.watchers.values()):
                watch(payload)

    # ------------------------------------------------------------------ silent misbehaviour

    def _replace(self, path: Path, why: str) -> None:
        """``path`` misbehaves silently: give it up now (Destroy), avoid its relays, rebuild."""
        if path.dead:
            return
        self.replaced[why] += 1
        self._failed(path, f"replaced: {why}")
        self.node.send_nowait(path.first, Destroy(path.link_id, "closed"))

    def start_request(self) -> None:
        """The return tags registered from now until the next call belong to one request: a path
        that brings none of its reply cloves while the request's other paths did is put in doubt.
        (Without calls, tags registered at the same clock reading are grouped.)"""
        self._explicit = True
        self._new_batch = True

    def _tag_started(self, path: Path, tag: bytes) -> None:
        batch, opened, members = self._batch
        now = self.clock.monotonic()
        opens = self._new_batch if self._explicit else opened != now
        if opens or id(path) in members or batch not in self._batches:  # another request
            self._new_batch = False
            batch, members = batch + 1, set()
            self._batch = (batch, now, members)
            self._batches[batch] = [0, 0]
        members.add(id(path))
        self._batches[batch][0] += 1
        self._tag_state[tag] = (path, batch, 0)

    def _tag_ended(self, path: Path, tag: bytes) -> None:
        st = self._tag_state.pop(tag, None)
        if st is None:
            return
        _, batch, got = st
        live_and_cloves = self._batches[batch]
        live_and_cloves[0] -= 1
        if live_and_cloves[0] <= 0:
            del self._batches[batch]
        if path.dead:
            return
        if got == 0 and live_and_cloves[1] > 0:  # the request's other paths brought cloves, this one none
            now = self.clock.monotonic()
            self._missing[tag] = (path, now + MISSING_GRACE)
            self._unsure[tag] = now + LATE_CLOVE  # then doubted (_doubt_late) unless it came

    def _doubt_late(self, now: float) -> None:
        """Doubt the paths whose reply clove is ``LATE_CLOVE`` late: not used while in doubt, and
        a replacement is built at once."""
        if not self._unsure:
            return
        changed = False
        for tag, when in list(self._unsure.items()):
            if now >= when:
                del self._unsure[tag]
                m = self._missing.get(tag)
                if m is not None and not m[0].dead and not m[0].doubted:
                    m[0].doubted = changed = True
        if changed:
            self._notify()

    def _cleared(self, path: Path) -> None:
        """A doubted path's late clove came: it was only slow. Its replacement is usually built
        by now; then it retires (Destroy, no suspicion) so we keep ``target`` paths, else it
        is back in service."""
        now = self.clock.monotonic()
        if len([p for p in self._fresh(now) if p is not path]) >= self.target:
            self._kill(path, send_destroy=True)
        self._notify()

    def check_missing(self) -> None:
        """Give up paths whose reply clove is still missing ``MISSING_GRACE`` after their
        request ended (called by :meth:`run` every second)."""
        now = self.clock.monotonic()
        self._doubt_late(now)
        for tag, (path, deadline) in list(self._missing.items()):
            if now >= deadline:
                del self._missing[tag]
                self._unsure.pop(tag, None)
                self._replace(path, "reply-cloves-missing")

    def on_destroy(self, path: Path, msg: Destroy) -> None:
        """A relay tore ``path`` down. Before its ``PathReady`` that is a refused build, counted
        by reason; ``not-registered`` (a list without us, most likely one a moment older than our
        registration) leaves the relays unsuspected: they serve us after their next refresh."""
        if not path.dead and not path.ready.is_set():
            self.refused[msg.reason if msg.reason in REFUSAL_REASONS else "other"] += 1
        self._failed(path, f"destroyed: {msg.reason}", suspect=msg.reason != NOT_REGISTERED)

    def on_peer_lost(self, peer: bytes) -> None:
        for p in [*self.paths, *self.one_off]:
            if p.first == peer:
                self._failed(p, "lost the connection to the first relay")

    def _failed(self, path: Path, why: str, *, suspect: bool = True, backoff: bool = True) -> None:
        """A path died: avoid its relays for a while (``suspect``; we cannot tell which hop
        failed). A build that failed fast (``backoff``: refused, first relay unreachable or lost;
        not one that timed out, which waited ``build_timeout`` already) backs off the next ones
        (:class:`Backoff`)."""
        if path.dead:
            return
        now = self.clock.monotonic()
        if not path.ready.is_set():
            self.failed += 1
            pause = self.backoff.failed(path.build_round, now) if backoff else None
            if pause is not None:
                log.info("%r failed: %s; %d failed rounds of builds in a row: the next in %.2fs", path, why,
                         self.backoff.failures, pause)
            else:
                log.debug("%r failed: %s", path, why)
        else:
            log.info("%r failed: %s", path, why)
        if suspect:
            until = now + SUSPECT_SECONDS
            for r in path.relays:
                self._suspect[r.node_id] = until
        self._kill(path, send_destroy=False)

    def _kill(self, path: Path, *, send_destroy: bool) -> None:
        if path.dead:
            return
        path.closed.set()
        for watch in list(path.watchers.values()):  # requests on it lose this path's cloves
            watch(PathNotice(code=PATH_CLOSED, detail="the path was closed", model_node=b""))
        if send_destroy:
            self.node.send_nowait(path.first, Destroy(path.link_id, "closed"))
        self.by_link.pop((path.first, path.link_id), None)
        if path in self.paths:
            self.paths.remove(path)
        if path in self.one_off:
            self.one_off.remove(path)
        self._notify()

    # ------------------------------------------------------------------ building

    def relay_pool(self) -> list[PeerEntry]:
        """The relays paths are drawn from: ``directory()``, narrowed to our region's scope
        (:func:`region_scope`) when the manager has a region. Logs when the scope changes, so a
        fall-back to a wider region is logged once."""
        entries = self.directory()
        if self.region is None:
            return entries
        scope, pool = region_scope(entries, self.region, self.region_min_users)
        if scope != self.scope:
            if scope != self.region:
                log.info("region %r has fewer than %d users: paths use the relays of %s (%d users)", self.region,
                         self.region_min_users, repr(scope) if scope else "every region", len(pool))
            else:
                log.info("region %r has %d users: paths use its relays", self.region, len(pool))
            self.scope = scope
        return pool

    def _choose_relays(self) -> list[PeerEntry]:
        me = self.node.node_id
        now = self.clock.monotonic()
        in_use = {r.node_id for p in self._fresh(now) for r in p.relays}
        in_use |= {r.node_id for p in self.paths if p.doubted and not p.dead for r in p.relays}
        return choose_relays(self.relay_pool(), me, in_use, lambda r: self._is_suspect(r, now), self.rng)

    def _is_suspect(self, relay: bytes, now: float) -> bool:
        until = self._suspect.get(relay)
        return until is not None and now <= until

    def start_build(self, relays: list[PeerEntry] | None = None, *, one_off: bool = False) -> Path:
        """Start building a path now (through ``relays``, by default drawn for the pool); ``one_off``
        keeps it out of the pool (:meth:`build_fresh`). The back-off is the caller's to respect
        (:meth:`run` and :meth:`build_fresh` do)."""
        relays = relays if relays is not None else self._choose_relays()
        expiries = hop_expiries(self.clock.unix(), self.path_ttl, self.expiry_jitter, self.rng)
        packet, keys = onion.build_onion([r.x25519_public for r in relays], [r.node_id for r in relays], expiries)
        path = Path(relays, crypto.random_bytes(LINK_ID_LEN), onion.PathCrypt(keys), self.clock.monotonic(),
                    build_round=self.backoff.round)
        path.returns = ReturnRoutes(lambda tag: self._tag_started(path, tag), lambda tag: self._tag_ended(path, tag))
        (self.one_off if one_off else self.paths).append(path)
        self.by_link[(path.first, path.link_id)] = path
        if not self.node.send_nowait(path.first, Create(path.link_id, packet)):
            self._build_failed(path, "first relay unreachable")
        return path

    def _build_failed(self, path: Path, why: str, *, backoff: bool = True) -> None:
        self._failed(path, why, backoff=backoff)
        self.node.send_nowait(path.first, Destroy(path.link_id, "closed"))

    async def _watch_build(self, path: Path) -> None:
        with trio.move_on_after(self.build_timeout):
            await path.ready.wait()
        if not path.ready.is_set() and not path.dead:
            self._build_failed(path, f"no PathReady within {self.build_timeout}s", backoff=False)

    async def build_fresh(self, n: int) -> list[Path]:
        """``n`` new ready paths for ONE request, built now and used by nothing else: relays drawn
        as for the pool (distinct within these ``n`` paths, avoiding suspects), a build that fails
        or takes longer than ``build_timeout`` replaced on other relays, until they are all ready.
        Builds respect the back-off the pool shares (:class:`Backoff`: no build before its pause
        is over, one at a time while builds keep failing). The caller bounds the wait (a cancel
        scope; :meth:`too_few` with ``fresh`` says why) and retires the paths (:meth:`retire`) when
        its request is over. Cancelled, or with :class:`PathError` from drawing relays, it retires
        what it built."""
        me = self.node.node_id
        mine: list[Path] = []
        ok = False
        try:
            while True:
                now = self.clock.monotonic()
                for p in [p for p in mine if not p.dead and not p.ready.is_set()
                          and now >= p.created + self.build_timeout]:  # as the wake-up time below
                    self._build_failed(p, f"no PathReady within {self.build_timeout}s", backoff=False)
                mine = [p for p in mine if not p.dead]
                if sum(p.ready.is_set() for p in mine) >= n:
                    ok = True
                    return [p for p in mine if p.ready.is_set()][:n]
                suspect = functools.partial(self._is_suspect, now=now)
                failed_at_once = False
                for _ in range(2 * n):  # a first relay we cannot reach fails at once: try others
                    if len(mine) >= n or self.backoff.wait(now) > 0:
                        break
                    if self.backoff.probing and any(not p.ready.is_set() for p in mine):
                        break  # builds keep failing: one probe at a time
                    in_use = {r.node_id for p in mine for r in p.relays}
                    relays = choose_relays(self.relay_pool(), me, in_use, suspect, self.rng)
                    path = self.start_build(relays, one_off=True)
                    if path.dead:
                        failed_at_once = True
                    else:
                        mine.append(path)
                building = [p.created + self.build_timeout for p in mine if not p.ready.is_set()]
                pause = self.backoff.wait(now)
                if pause > 0:  # backing off: wake for a build's outcome or the pause's end
                    building.append(now + pause)
                elif failed_at_once or not building:  # first relays unreachable: pause before more builds
                    await trio.sleep(FRESH_RETRY_S)
                    continue
                changed = self._changed
                with trio.move_on_after(max(0.0, min(building) - now)):
                    await changed.wait()
        finally:
            if not ok:
                self.retire(mine)

    def retire(self, paths: list[Path]) -> None:
        """Close one-off paths (:meth:`build_fresh`) once their request is over (Destroy; their
        relays are not suspected)."""
        for p in paths:
            self._kill(p, send_destroy=True)

    def _fresh(self, now: float) -> list[Path]:
        """Live paths that are building or younger than ``refresh``, and not in doubt."""
        return [p for p in self.paths
                if not p.dead and not p.doubted and not (p.ready.is_set() and now - p.created > self.refresh)]

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep ``target`` fresh paths until cancelled; retire stale ones once replaced. Missing
        paths are built at once, unless builds are backing off (:class:`Backoff`): then none
        before the pause is over, and one at a time until a build succeeds."""
        async with trio.open_nursery() as nursery:
            task_status.started()
            while True:
                self.check_missing()
                now = self.clock.monotonic()
                fresh = self._fresh(now)
                stale = [p for p in self.paths if p not in fresh and not p.doubted]  # doubted: check_missing
                if stale and sum(p.ready.is_set() for p in fresh) >= self.target:
                    for p in stale:
                        self._kill(p, send_destroy=True)
                missing = self.target - len(fresh)
                if self.backoff.probing:
                    missing = min(missing, 1 - sum(not p.ready.is_set() for p in fresh))
                for _ in range(missing):
                    if self.backoff.wait(now) > 0:  # a build failed (at once, or before this round)
                        break
                    try:
                        path = self.start_build()
                    except PathError as exc:
                        log.warning("cannot build a path: %s", exc)
                        break
                    nursery.start_soon(self._watch_build, path)
                changed = self._changed
                with trio.move_on_after(min(1.0, self.backoff.wait(now)) or 1.0):
                    await changed.wait()

    def close(self) -> None:
        for p in [*self.paths, *self.one_off]:
            self._kill(p, send_destroy=True)
