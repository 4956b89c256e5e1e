"""The user's proxy paths (paper §3.2 step 2): build, keep N ready, refresh, rebuild.

A :class:`PathManager` keeps ``target`` ready paths. Each path is 3 relays
drawn at random from the registry's users of our region — never ourselves, and
no relay shared between two of our paths. Building sends one
:class:`~overlay.messages.Create` onion to the first relay and waits for the
proxy's :class:`~overlay.messages.PathReady`; a build that times out or is
destroyed is retried on other relays. Paths older than ``refresh`` seconds are
replaced (paper §5.2: "discover new proxies every 15 minutes"); a path that
fails (Destroy, lost first hop) is dropped and rebuilt at once.

The manager owns the user's end of its paths: the node routes ``CellBack`` and
``Destroy`` on links it owns here (:meth:`owns`).
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import trio

from overlay import codec, crypto, onion
from overlay.clock import Clock, TrioClock
from overlay.identity import short_id
from overlay.messages import LINK_ID_LEN, CellBack, Create, Destroy, FromModel, PathNotice, PathReady
from overlay.peers import PeerEntry

log = logging.getLogger("gentorrent.paths")

SUSPECT_SECONDS = 60.0  # relays of a failed path are avoided this long (if enough others exist)
EXPIRY_JITTER = 1200  # each hop's expiry is path_ttl plus an independent uniform draw from [0, this) s


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


def hop_expiries(unix: float, ttl: int, jitter: int, rng: random.Random, hops: int = onion.HOPS) -> list[int]:
    """One onion expiry per hop (unix seconds): ``unix + ttl`` plus an independent uniform
    draw from ``[0, jitter)`` for each hop. A relay learns only its own value, which is
    independent of every other hop's and path's, so expiries link nothing (decision 0003);
    every hop lives at least ``ttl``, and the caller keeps ``ttl + jitter`` within
    :data:`~overlay.onion.MAX_ONION_TTL`. Pure."""
    if jitter < 1 or ttl < 1 or ttl + jitter > onion.MAX_ONION_TTL:
        raise ValueError(f"need 1 <= ttl, 1 <= jitter, ttl + jitter <= {onion.MAX_ONION_TTL}; got {ttl}, {jitter}")
    base = int(unix) + ttl
    return [base + rng.randrange(jitter) for _ in range(hops)]


@dataclass(eq=False)
class Path:
    relays: list[PeerEntry]
    link_id: bytes
    crypt: onion.PathCrypt
    created: float
    ready: trio.Event = field(default_factory=trio.Event)
    proxy_path_id: bytes | None = None
    dead: bool = False
    # reply routing: return tag -> callback(data)
    returns: dict[bytes, Callable[[bytes], None]] = field(default_factory=dict)
    notices: int = 0

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
    ) -> None:
        """``node`` sends frames (``send_nowait``); ``directory()`` lists the relays usable
        (users of our region). ``target`` is N ≥ n (paper §3.2). ``clock`` (default
        :class:`~overlay.clock.TrioClock`) times refreshes and suspect periods
        (``monotonic``) and stamps onion expiries (``unix``): each hop of each path gets its
        own, ``path_ttl`` plus an independent draw from ``[0, expiry_jitter)`` seconds
        (:func:`hop_expiries`)."""
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
        self.paths: list[Path] = []
        self.by_link: dict[tuple[bytes, bytes], Path] = {}
        self._changed = trio.Event()
        self.built = 0
        self.failed = 0
        self._suspect: dict[bytes, float] = {}  # relay id -> monotonic time until which we avoid it
        self.dropped: Counter[str] = Counter()  # backward cells dropped, by reason

    # ------------------------------------------------------------------ queries

    def ready_paths(self) -> list[Path]:
        return [p for p in self.paths if p.ready.is_set() and not p.dead]

    def owns(self, peer: bytes, link_id: bytes) -> Path | None:
        return self.by_link.get((peer, link_id))

    async def wait_ready(self, n: int, timeout: float) -> list[Path]:
        """At least ``n`` ready paths, waiting up to ``timeout`` for builds to finish."""
        with trio.move_on_after(timeout):
            while len(self.ready_paths()) < n:
                await self._changed.wait()
        ready = self.ready_paths()
        if len(ready) < n:
            raise PathError(
                f"only {len(ready)} of the {n} proxy paths needed are ready after {timeout:.0f}s "
                f"({len(self.paths)} known, {self.failed} builds failed: {self.paths!r}); check that enough "
                "relays are up"
            )
        return ready

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    # ------------------------------------------------------------------ events from the node

    def on_cell_back(self, path: Path, msg: CellBack) -> None:
        try:
            payload = codec.decode(path.crypt.unwrap_backward(msg.iv, msg.body))
        except (onion.OnionError, codec.RemoteProtocolError) as exc:
            self.dropped["cell-unauthentic" if isinstance(exc, onion.OnionError) else "cell-malformed"] += 1
            log.info("%r: dropped a backward cell: %s", path, exc)
            return
        if isinstance(payload, PathReady):
            if path.proxy_path_id is None:
                path.proxy_path_id = payload.proxy_path_id
                path.ready.set()
                self.built += 1
                self._notify()
        elif isinstance(payload, FromModel):
            data = payload.data
            cb = path.returns.get(data[:8])
            if cb is not None:
                cb(data)
            else:
                self.dropped["reply-unknown-tag"] += 1  # late (request finished) or forged
        elif isinstance(payload, PathNotice):
            path.notices += 1
            log.warning("proxy %s reports %s: %s", short_id(path.proxy.node_id), payload.code, payload.detail)

    def on_destroy(self, path: Path, msg: Destroy) -> None:
        self._failed(path, f"destroyed: {msg.reason}")

    def on_peer_lost(self, peer: bytes) -> None:
        for p in list(self.paths):
            if p.first == peer:
                self._failed(p, "lost the connection to the first relay")

    def _failed(self, path: Path, why: str) -> None:
        """A path died: avoid its relays for a while (we cannot tell which hop failed)."""
        if path.dead:
            return
        if not path.ready.is_set():
            self.failed += 1
        until = self.clock.monotonic() + SUSPECT_SECONDS
        for r in path.relays:
            self._suspect[r.node_id] = until
        log.info("%r failed: %s", path, why)
        self._kill(path, send_destroy=False)

    def _kill(self, path: Path, *, send_destroy: bool) -> None:
        if path.dead:
            return
        path.dead = True
        if send_destroy:
            self.node.send_nowait(path.first, Destroy(path.link_id, "closed"))
        self.by_link.pop((path.first, path.link_id), None)
        if path in self.paths:
            self.paths.remove(path)
        self._notify()

    # ------------------------------------------------------------------ building

    def _choose_relays(self) -> list[PeerEntry]:
        me = self.node.node_id
        now = self.clock.monotonic()
        in_use = {r.node_id for p in self._fresh(now) for r in p.relays}
        return choose_relays(self.directory(), me, in_use, lambda r: self._is_suspect(r, now), self.rng)

    def _is_suspect(self, relay: bytes, now: float) -> bool:
        until = self._suspect.get(relay)
        return until is not None and now <= until

    def start_build(self) -> Path:
        relays = self._choose_relays()
        expiries = hop_expiries(self.clock.unix(), self.path_ttl, self.expiry_jitter, self.rng)
        packet, keys = onion.build_onion([r.x25519_public for r in relays], [r.node_id for r in relays], expiries)
        path = Path(relays, crypto.random_bytes(LINK_ID_LEN), onion.PathCrypt(keys), self.clock.monotonic())
        self.paths.append(path)
        self.by_link[(path.first, path.link_id)] = path
        if not self.node.send_nowait(path.first, Create(path.link_id, packet)):
            self._build_failed(path, "first relay unreachable")
        return path

    def _build_failed(self, path: Path, why: str) -> None:
        self._failed(path, why)
        self.node.send_nowait(path.first, Destroy(path.link_id, "closed"))

    async def _watch_build(self, path: Path) -> None:
        with trio.move_on_after(self.build_timeout):
            await path.ready.wait()
        if not path.ready.is_set() and not path.dead:
            self._build_failed(path, f"no PathReady within {self.build_timeout}s")

    def _fresh(self, now: float) -> list[Path]:
        """Live paths that are building or younger than ``refresh``."""
        return [p for p in self.paths if not p.dead and not (p.ready.is_set() and now - p.created > self.refresh)]

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep ``target`` fresh paths until cancelled; retire stale ones once replaced."""
        async with trio.open_nursery() as nursery:
            task_status.started()
            while True:
                now = self.clock.monotonic()
                fresh = self._fresh(now)
                stale = [p for p in self.paths if p not in fresh]
                if stale and sum(p.ready.is_set() for p in fresh) >= self.target:
                    for p in stale:
                        self._kill(p, send_destroy=True)
                for _ in range(self.target - len(fresh)):
                    try:
                        path = self.start_build()
                    except PathError as exc:
                        log.warning("cannot build a path: %s", exc)
                        break
                    nursery.start_soon(self._watch_build, path)
                changed = self._changed
                with trio.move_on_after(1.0):
                    await changed.wait()

    def close(self) -> None:
        for p in list(self.paths):
            self._kill(p, send_destroy=True)
