"""Item 1 — survival under churn (paper §5.2, Fig. 14).

``N_USERS`` = 3,119 user nodes; churn of ``CHURN_PER_MIN`` = 200 nodes/min: every second a
Poisson number of online nodes (mean 200/60) leaves, chosen uniformly, and as many new nodes
join, so the population stays at 3,119. ``TRACKED`` users (who stay online) each hold their
paths from t = 0; a communication at time t *survives* when the user can still send a request
and decode the reply: at least k of its paths have every relay online (a path whose relay left
but whose user has not yet noticed loses the clove).

Four designs, all built from the same relay choice at t = 0:

- ``onion``: one 3-hop onion path (the first of the user's paths); survives while its 3 relays do;
- ``garlic_cast``: Garlic-Cast-style slicing, (n, k) = (4, 3) over random-walk paths of
  ``GC_HOPS`` = 4 relays (walks may revisit nodes; drawn uniformly — an assumption, the paper
  does not give Garlic Cast's walk length);
- ``ours``: (n, k) = (4, 3) and 3-hop paths, no repair (the paper's "without new proxies");
- ``ours_repair``: the real :class:`~overlay.anon.paths.PathManager` of each tracked user, driven by
  the events it gets in the product: a relay that leaves is noticed ``DETECT_S`` later (the
  first hop: ``on_peer_lost``; a later hop: the ``Destroy`` its predecessor sends), and the
  manager rebuilds at once (``start_build``, the relays from its own choice, suspects avoided).
  A build takes ``BUILD_S``; it fails if a chosen relay is offline — relays come from a
  directory snapshot refreshed every ``DIRECTORY_REFRESH_S`` (the registry lags the churn),
  so stale entries cost failed builds as they do in the product.

Relay choice for ``onion`` and ``ours`` is :func:`overlay.anon.paths.choose_relays` (what
``PathManager`` calls). Figures: survival of each design at 5, 10 and 15 minutes, and the
repairing users' path builds and failed builds per user.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from overlay.anon import onion
from overlay.anon.paths import Path, PathManager, choose_relays
from overlay.net.peers import PeerEntry
from overlay.wire import crypto
from overlay.wire.clock import FakeClock
from overlay.wire.identity import NODE_ID_LEN
from overlay.wire.messages import Destroy
from simulations.common import Progress, Result, new_figure

N_USERS = 3119
CHURN_PER_MIN = 200.0
DURATION_S = 15 * 60
SAMPLE_EVERY_S = 10
TRACKED = 200
N, K = 4, 3
GC_HOPS = 4
DETECT_S = 1.0
BUILD_S = 1.0
DIRECTORY_REFRESH_S = 60.0

DESIGNS = ("onion", "garlic_cast", "ours", "ours_repair")


class _Node:
    """What a PathManager needs of its node: an id and a best-effort send."""

    def __init__(self, node_id: bytes, online: set[bytes]) -> None:
        self.node_id = node_id
        self._online = online

    def send_nowait(self, peer: bytes, msg: object) -> bool:
        return peer in self._online  # a Create or Destroy reaches the first relay iff it is online


@dataclass
class _World:
    rng: random.Random
    entries: dict[bytes, PeerEntry]
    online: set[bytes]
    next_id: int = 0
    listed: list[PeerEntry] = field(default_factory=list)  # the directory's snapshot (:meth:`refresh`)

    def join(self) -> bytes:
        self.next_id += 1
        nid = self.next_id.to_bytes(NODE_ID_LEN, "big")
        key = crypto.X25519Key.generate()
        self.entries[nid] = PeerEntry(nid, "sim", bytes(32), key.public_bytes)
        self.online.add(nid)
        return nid

    def refresh(self) -> None:
        """A new directory snapshot: the nodes online now."""
        self.listed = [self.entries[x] for x in sorted(self.online)]

    def churn(self, rate: float, keep: int, staying: set[bytes]) -> list[bytes]:
        """One second's departures: a Poisson number (mean ``rate``) of online nodes, none of
        ``staying`` and never fewer than ``keep`` left online, each replaced by a new node; the
        nodes that left."""
        leaving = min(_poisson(self.rng, rate), len(self.online) - keep)
        gone = self.rng.sample(sorted(self.online - staying), leaving) if leaving else []
        for nid in gone:
            self.online.discard(nid)
            self.join()
        return gone


@dataclass
class _Repairs:
    """The tracked users' real path managers (``ours_repair``), fed the events they get in the
    product: builds that finish (or fail) ``BUILD_S`` after they start, and relays' departures."""

    clock: FakeClock
    managers: list[PathManager] = field(default_factory=list)
    watch: dict[bytes, set[tuple[int, Path]]] = field(
        default_factory=lambda: defaultdict(set))  # relay -> (manager index, path)
    building: list[tuple[float, int, Path]] = field(default_factory=list)  # (due, manager index, path)
    started: int = 0
    failed: int = 0

    def start(self, i: int) -> None:
        """Manager ``i`` starts builds up to its target."""
        pm = self.managers[i]
        while len(pm.paths) < pm.target:
            path = pm.start_build()
            self.started += 1
            if path.dead:  # first relay unreachable: the manager dropped it and marked suspects
                self.failed += 1
                continue
            for r in path.relays:
                self.watch[r.node_id].add((i, path))
            self.building.append((self.clock.monotonic() + BUILD_S, i, path))

    def finish_builds(self, now: float, online: set[bytes]) -> None:
        """Builds that finish now: ready if every relay is still online, else destroyed (and their
        manager builds again; those new builds are due later)."""
        still = []
        for due, i, path in self.building:  # start() appends to it as it goes
            if path.dead:
                continue
            if due > now:
                still.append((due, i, path))
            elif all(r.node_id in online for r in path.relays):
                path.ready.set()
            else:
                self.failed += 1
                self.managers[i].on_destroy(path, Destroy(path.link_id, "relay left"))
                self.start(i)
        self.building[:] = still

    def notice(self, nid: bytes) -> None:
        """Relay ``nid`` left, and the users whose ready paths go through it notice (the first
        hop's user: a lost peer; a later hop's: the Destroy its predecessor sends); they rebuild."""
        for i, path in sorted(self.watch.pop(nid, set()), key=lambda x: (x[0], x[1].link_id)):
            if path.dead or not path.ready.is_set():
                continue
            pm = self.managers[i]
            if path.first == nid:
                pm.on_peer_lost(nid)
            else:
                pm.on_destroy(path, Destroy(path.link_id, "next hop lost"))
            self.start(i)

    def surviving(self, online: set[bytes], k: int) -> int:
        """Users with at least ``k`` ready paths whose relays are all online."""
        return sum(sum(all(r.node_id in online for r in p.relays) for p in pm.ready_paths()) >= k
                   for pm in self.managers)


def _paths_at_start(world: _World, users: list[bytes], repairs: _Repairs, n: int, seed: int,
                    choose: Callable[..., list[PeerEntry]], rng: random.Random) -> dict[str, list[list[list[bytes]]]]:
    """Every tracked user's paths at t = 0 in the static designs (relays by node id), and its path
    manager in ``repairs``, its paths built and ready (they exist before the clock starts, as in
    the paper)."""
    directory = world.listed
    static: dict[str, list[list[list[bytes]]]] = {d: [] for d in ("onion", "garlic_cast", "ours")}
    for i, u in enumerate(users):
        in_use: set[bytes] = set()
        ours = []
        for _ in range(n):
            relays = choose(directory, u, in_use, lambda _r: False, rng)
            in_use.update(r.node_id for r in relays)
            ours.append([r.node_id for r in relays])
        static["ours"].append(ours)
        static["onion"].append(ours[:1])
        others = [e.node_id for e in directory if e.node_id != u]
        static["garlic_cast"].append([[rng.choice(others) for _ in range(GC_HOPS)] for _ in range(n)])
        pm = PathManager(_Node(u, world.online), lambda: world.listed, target=n,
                         rng=random.Random(seed * 7919 + i), clock=repairs.clock)
        repairs.managers.append(pm)
        repairs.start(i)
    for _, _, path in repairs.building:
        path.ready.set()
    repairs.building.clear()
    return static


def _survival(static: dict[str, list[list[list[bytes]]]], repairs: _Repairs, online: set[bytes], k: int,
              tracked: int) -> dict[str, float]:
    """Each design's share of the tracked users that can still communicate."""
    out: dict[str, float] = {}
    for d in ("onion", "garlic_cast", "ours"):
        need = 1 if d == "onion" else k
        alive = sum(sum(all(r in online for r in p) for p in paths) >= need for paths in static[d])
        out[d] = alive / tracked
    out["ours_repair"] = repairs.surviving(online, k) / tracked
    return out


def _figures(times: list[int], series: dict[str, list[float]], repairs: _Repairs, tracked: int) -> dict[str, float]:
    """Survival of each design at the end and at 5, 10 and 15 minutes; the repairing users' builds."""
    figures: dict[str, float] = {}
    for d in DESIGNS:
        figures[f"survival_{d}_end"] = series[d][-1]
        for minute in (5, 10, 15):
            idx = min(range(len(times)), key=lambda j: abs(times[j] - minute * 60))
            if abs(times[idx] - minute * 60) < SAMPLE_EVERY_S:
                figures[f"survival_{d}_{minute}min"] = series[d][idx]
    figures["repair_builds_per_user"] = repairs.started / tracked
    figures["repair_failed_builds_per_user"] = repairs.failed / tracked
    return figures


def simulate(seed: int, *, n_users: int = N_USERS, churn_per_min: float = CHURN_PER_MIN,
             duration_s: int = DURATION_S, tracked: int = TRACKED, n: int = N, k: int = K,
             choose: Callable[..., list[PeerEntry]] = choose_relays,
             progress: Progress | None = None) -> Result:
    """Run the churn simulation; ``choose`` is the relay choice (default: the product's)."""
    rng = random.Random(seed)
    world = _World(rng, {}, set())
    for _ in range(n_users):
        world.join()
    users = rng.sample(sorted(world.online), tracked)
    user_set = set(users)
    world.refresh()
    repairs = _Repairs(FakeClock())
    static = _paths_at_start(world, users, repairs, n, seed, choose, rng)

    pending_detect: list[tuple[float, bytes]] = []
    times: list[int] = []
    series: dict[str, list[float]] = {d: [] for d in DESIGNS}
    rate = churn_per_min / 60.0
    for t in range(duration_s + 1):
        repairs.clock.advance(1.0 if t else 0.0)
        now = repairs.clock.monotonic()
        if t:  # departures and joins this second (tracked users stay)
            gone = world.churn(rate, tracked + onion.HOPS * n, user_set)
            pending_detect.extend((now + DETECT_S, nid) for nid in gone)
            if t % int(DIRECTORY_REFRESH_S) == 0:
                world.refresh()
        repairs.finish_builds(now, world.online)
        for _, nid in [(due, nid) for due, nid in pending_detect if due <= now]:  # departures noticed now
            repairs.notice(nid)
        pending_detect[:] = [(due, nid) for due, nid in pending_detect if due > now]
        if t % SAMPLE_EVERY_S == 0:
            times.append(t)
            for d, share in _survival(static, repairs, world.online, k, tracked).items():
                series[d].append(share)
            if progress is not None:
                progress.step(f"t = {t} s, ours {series['ours'][-1]:.2f}, with repair {series['ours_repair'][-1]:.2f}")

    params: dict[str, Any] = {
        "users": n_users, "churn_per_min": churn_per_min, "duration_s": duration_s, "tracked_users": tracked,
        "n": n, "k": k, "hops": onion.HOPS, "garlic_cast_hops": GC_HOPS, "detect_s": DETECT_S, "build_s": BUILD_S,
        "directory_refresh_s": DIRECTORY_REFRESH_S, "seed": seed,
        "per_node_survival_15min": _node_survival(churn_per_min, n_users, 15),
    }
    return Result("churn", params, _figures(times, series, repairs, tracked), {"t_s": times, **series})


def _node_survival(churn_per_min: float, n_users: int, minutes: float) -> float:
    import math

    return math.exp(-churn_per_min / n_users * minutes)


def _poisson(rng: random.Random, mean: float) -> int:
    """A Poisson draw (Knuth; fine for small means)."""
    import math

    limit, x, p = math.exp(-mean), 0, rng.random()
    while p > limit:
        x += 1
        p *= rng.random()
    return x


def plot(result: Result) -> Any:
    fig, (ax,) = new_figure()
    t_min = [t / 60 for t in result.series["t_s"]]
    labels = {"onion": "single onion path", "garlic_cast": f"Garlic Cast ({N},{K}), {GC_HOPS}-hop walks",
              "ours": f"ours ({N},{K}), 3 hops, no repair", "ours_repair": "ours with path repair (PathManager)"}
    for d in DESIGNS:
        ax.plot(t_min, result.series[d], label=labels[d])
    ax.set_xlabel("minutes")
    ax.set_ylabel("survival probability")
    p = result.params
    ax.set_title(f"Churn: {p['users']} users, {p['churn_per_min']:.0f} nodes/min")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=8)
    return fig


def run(seed: int, quick: bool) -> tuple[Result, Any]:
    kw: dict[str, Any] = {"n_users": 400, "churn_per_min": 200 * 400 / N_USERS, "duration_s": 180, "tracked": 20} \
        if quick else {}
    total = (kw.get("duration_s", DURATION_S)) // SAMPLE_EVERY_S + 1
    result = simulate(seed, progress=Progress("churn", total), **kw)
    return result, plot(result)
