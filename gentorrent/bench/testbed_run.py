"""Measuring a :class:`~gentorrent.tools.testbed.Testbed` from inside: registered in-process clients
in chosen regions, timed requests against their paths' propagation floor, path builds, the
committee's pace, churn, per-process cost, and the run's report (JSON plus latency CDF plots).

``gentorrent testbed`` and ``gentorrent bench wide-area`` both drive these.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import random
import signal
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import trio

from gentorrent.bench.stats import percentile, process_usage, summarize_ms
from gentorrent.tools.regions import LOSS
from gentorrent.tools.testbed import ChurnEvent, Testbed, churn_schedule, via_rule
from overlay.anon.client import AnonError
from overlay.directory.lists import load_genesis
from overlay.directory.membership import CommitteeSettings, node_entry, serve_member
from overlay.directory.registry import Registry
from overlay.directory.rpc import block_time_unix
from overlay.net.transport import TLSTransport, Via, parse_address
from overlay.usernode import UserNode
from overlay.wire.messages import ChatMessage, SamplingParams

PROMPT = "Hello from the wide-area testbed: how far did this prompt travel?"


@dataclass
class Client:
    """A registered in-process user node of the testbed (:func:`open_client`)."""

    name: str
    user: UserNode
    registered_s: float  # registration sent -> in a verified signed list


@asynccontextmanager
async def open_client(net: Testbed, name: str, *, n: int, k: int, paths: int,
                      build_timeout: float = 20.0) -> AsyncIterator[Client]:
    """Start ``name`` (one of ``net``'s clients) in this process, in its region, behind its
    links, registered with the committee, keeping ``paths`` paths; stop it (it leaves) on exit."""
    ident = net.identities[name]
    region = net.region_of[name]
    chain_id, validators = load_genesis(str(net.genesis_file))
    settings = CommitteeSettings(tuple(net.committee_for(name).split(",")), chain_id, validators)
    registry = Registry(0, [])
    user = UserNode(ident, TLSTransport(ident, via=Via.parse(via_rule(net.region_number(name)))), registry,
                    region=region, n=n, k=k, paths=paths, ping_interval=0, registered_only=True,
                    build_timeout=build_timeout)
    assert user.client is not None
    user.client.allow_unaudited = True  # the testbed's committee runs no audits
    host, port = parse_address(net.entries[name].address)
    async with trio.open_nursery() as nursery:
        t0 = trio.current_time()  # the listener's start (~1 ms) counts too
        await nursery.start(serve_member, user, host, port, settings, registry,
                            lambda address: node_entry(ident, address, region))
        yield Client(name, user, trio.current_time() - t0)
        nursery.cancel_scope.cancel()


@dataclass
class Sample:
    """One timed request."""

    config: str  # "n,k"
    client: str
    ok: bool
    ttft_ms: float = math.nan  # request sent -> first verified reply chunk
    floor_ms: float = math.nan  # the propagation floor of the same paths (see :func:`request_floor_ms`)
    served_by: str = ""
    entry: str = ""  # the model node the request was addressed to (it may forward to ``served_by``)
    error: str = ""
    at_s: float = 0.0  # when it was sent, seconds into the run


def request_floor_ms(net: Testbed, client: str, paths: Sequence[Sequence[str]], target: str, k: int,
                     served_by: str | None = None) -> float:
    """The least time a request and its first reply chunk must spend on the wire: the k-th
    fastest of the paths' one-way floors from the client through its 3 relays to ``target``
    (the model node the request was addressed to: it rebuilds the request from any k cloves),
    then, when ``target`` forwarded it to ``served_by``, the hop between the two, and the k-th
    fastest of the paths' floors from the server back to the client (the server sends its reply
    cloves straight to the paths' last relays; any k rebuild the chunk). Served where it was
    addressed, that is the k-th fastest path there and back."""
    if len(paths) < k:
        return math.nan
    server = served_by or target
    there = sorted(net.floor_ms([client, *hops, target]) for hops in paths)[k - 1]
    back = sorted(net.floor_ms([client, *hops, server]) for hops in paths)[k - 1]  # delays are symmetric
    hop = net.one_way_ms(target, server) if server != target else 0.0
    return there + hop + back


async def timed_request(net: Testbed, c: Client, model: str, *, wait_timeout: float, started: float,
                        target: str | None = None) -> Sample:
    """Send one prompt from client ``c`` and time its first verified chunk against the floor of
    the paths it goes over (the client keeps exactly n paths, so those are the ones).
    ``wait_timeout`` bounds each of its waits, for ready paths and the client's for each reply
    chunk; the whole request gets three times that (room for the client's failover). A request
    that fails or runs out of time is a failed sample, not an error."""
    client = c.user.client
    assert client is not None and c.user.paths is not None
    config = f"{client.n},{client.k}"
    sample = Sample(config, c.name, False, at_s=trio.current_time() - started)
    try:
        # the entry is chosen here as the client would (at random among the usable nodes), to know it
        node = net.entries[target].node_id if target else client.choose_model_node(model).node_id
        sample.entry = next((n for n in net.models if net.entries[n].node_id == node), "?")
        with trio.move_on_after(wait_timeout) as waited:
            ready = await c.user.paths.wait_ready(client.n)
        if waited.cancelled_caught:
            raise c.user.paths.too_few(client.n, wait_timeout)
    except Exception as exc:  # noqa: BLE001 - no usable model node, PathError and the like: a failed request, counted
        sample.error = f"before sending: {type(exc).__name__}: {exc}"
        return sample
    hops = [[net.name_at(r.address) or "?" for r in p.relays] for p in ready[:client.n]]
    t0 = trio.current_time()
    try:
        with trio.fail_after(3 * wait_timeout):  # room for the client's own failover after a silent node
            async for chunk in client.request(model, [ChatMessage("user", PROMPT)], SamplingParams(max_tokens=16),
                                              node=node, chunk_timeout=wait_timeout):
                if math.isnan(sample.ttft_ms):
                    sample.ttft_ms = 1e3 * (trio.current_time() - t0)
                    served = next((n for n in net.models if net.entries[n].node_id == chunk.node), "?")
                    sample.served_by = served
                if chunk.done:
                    break
    except (AnonError, trio.TooSlowError) as exc:
        sample.error = f"{type(exc).__name__}: {exc}"
        return sample
    sample.ok = not math.isnan(sample.ttft_ms)
    if sample.ok and "?" not in {sample.entry, sample.served_by, *(h for p in hops for h in p)}:
        sample.floor_ms = request_floor_ms(net, c.name, hops, sample.entry, client.k, sample.served_by)
    return sample


async def time_path_builds(net: Testbed, c: Client, count: int, rng: Any, build_timeout: float = 30.0,
                           ) -> list[float]:
    """Build ``count`` 3-hop paths from ``c`` one after another, each through 3 running relays
    drawn at random, from Create sent to PathReady back; seconds each. A build not ready within
    ``build_timeout`` seconds fails; failed builds are left out (the caller counts them)."""
    pm = c.user.paths
    assert pm is not None
    times: list[float] = []
    for _ in range(count):
        running = [r for r in net.relays if (p := net.procs.get(r)) is not None and p.poll() is None]
        relays = [net.entries[r] for r in rng.sample(running, 3)]
        t0 = trio.current_time()
        path = pm.start_build(relays, one_off=True)
        with trio.move_on_after(build_timeout):
            await path.ready.wait()
            times.append(trio.current_time() - t0)
        pm.retire([path])
    return times


# ---------------------------------------------------------------------------------------- churn


@dataclass
class ChurnLog:
    done: list[tuple[float, str, str]] = field(default_factory=list)  # (at_s, name, kind)

    def count(self, kind: str) -> int:
        return sum(1 for _, _, k in self.done if k == kind)


async def play_churn(net: Testbed, events: Sequence[ChurnEvent], log: ChurnLog,
                     say: Callable[[str], None] = lambda _: None, *, run_started: float | None = None) -> None:
    """Carry out ``events`` (times from now): crash = SIGKILL, leave = SIGTERM (the node leaves
    the committee's lists), join = the same node started again (same key and address). The log
    records times since ``run_started`` (default: now), as the samples do."""
    start = trio.current_time()
    offset = start - run_started if run_started is not None else 0.0
    for ev in events:
        await trio.sleep_until(start + ev.at_s)
        proc = net.procs.get(ev.name)
        if ev.kind == "join":
            if proc is not None and proc.poll() is None:
                continue
            net.spawn(ev.name)
        elif proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL if ev.kind == "crash" else signal.SIGTERM)
        else:
            continue
        log.done.append((offset + ev.at_s, ev.name, ev.kind))
        say(f"testbed: churn: {ev.name} {ev.kind} at {offset + ev.at_s:.0f} s")


# ------------------------------------------------------------------------------------ the cost


def process_costs(net: Testbed, wall_s: float) -> dict[str, float]:
    """Resident memory and CPU share of each role's processes now (CPU over ``wall_s``, their life)."""
    figures: dict[str, float] = {}
    roles = {"relay": net.relays, "model": net.models, "verifier": net.verifiers}
    for role, names in roles.items():
        rss, cpu = [], []
        for n in names:
            p = net.procs.get(n)
            if p is None or p.poll() is not None:
                continue
            try:
                got = process_usage(p.pid)
            except OSError:  # it exited just now
                continue
            rss.append(got[0])
            cpu.append(got[1])
        if rss:
            figures[f"{role}_rss_mean_MiB"] = sum(rss) / len(rss)
            figures[f"{role}_rss_max_MiB"] = max(rss)
            figures[f"{role}_cpu_mean_percent"] = 100.0 * sum(cpu) / len(cpu) / max(wall_s, 1e-9)
    return figures


def committee_pace(net: Testbed, blocks: int = 20) -> dict[str, float]:
    """The mean interval between the last ``blocks`` blocks (their header times, from one verifier)."""
    top = net.height()
    if top < 3:
        return {}
    low = max(1, top - blocks)
    got: Any = net.rpc(net.verifiers[0], "blockchain", {"minHeight": str(low), "maxHeight": str(top)}, timeout=10)
    times = sorted(block_time_unix(m["header"]["time"]) for m in got["block_metas"])
    if len(times) < 2:
        return {}
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return {"committee_block_interval_mean_ms": 1e3 * sum(gaps) / len(gaps),
            "committee_block_interval_p50_ms": 1e3 * percentile(sorted(gaps), 50)}


# ---------------------------------------------------------------------------------------- report


def summarize_samples(samples: Sequence[Sample], config: str) -> dict[str, float]:
    """TTFT and floor figures of ``config``'s samples (``n,k``), keys ``ttft_N_K_*``."""
    mine = [s for s in samples if s.config == config]
    key = "ttft_" + config.replace(",", "_")
    ok = [s for s in mine if s.ok]
    out: dict[str, float] = {f"{key}_requests": float(len(mine)), f"{key}_answered": float(len(ok)),
                             f"{key}_forwarded": float(sum(s.served_by != s.entry for s in ok))}
    ttft = sorted(s.ttft_ms for s in ok)
    floors = sorted(s.floor_ms for s in ok if not math.isnan(s.floor_ms))
    if ttft:
        out[f"{key}_p50_ms"] = percentile(ttft, 50)
        out[f"{key}_p99_ms"] = percentile(ttft, 99)
        out[f"{key}_mean_ms"] = sum(ttft) / len(ttft)
    if floors:
        out[f"{key}_floor_p50_ms"] = percentile(floors, 50)
        excess = sorted(s.ttft_ms - s.floor_ms for s in ok if not math.isnan(s.floor_ms))
        out[f"{key}_excess_p50_ms"] = percentile(excess, 50)
        ratio = sorted(s.ttft_ms / s.floor_ms for s in ok if not math.isnan(s.floor_ms) and s.floor_ms > 0)
        if ratio:
            out[f"{key}_ratio_to_floor_p50"] = percentile(ratio, 50)
    return out


def write_report(run_dir: Path, params: dict[str, Any], figures: dict[str, float], samples: Sequence[Sample],
                 extra: dict[str, Any] | None = None) -> list[Path]:
    """``run_dir/report.json`` (params, figures, every sample) and ``run_dir/ttft_cdf.png`` (one
    TTFT CDF per configuration, with its floor's); the files written."""
    run_dir.mkdir(parents=True, exist_ok=True)
    report = run_dir / "report.json"
    report.write_text(json.dumps({"params": params, "figures": figures, "samples": [asdict(s) for s in samples],
                                  **(extra or {})}, indent=1, default=str) + "\n")
    written = [report]
    if any(s.ok for s in samples):
        written.append(plot_cdf(samples, run_dir / "ttft_cdf.png"))
    return written


def plot_cdf(samples: Sequence[Sample], png: Path) -> Path:
    """One CDF of time to first token per configuration of ``samples`` (solid), each beside the
    CDF of its requests' propagation floors (dotted, same colour); written to ``png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, config in enumerate(sorted({s.config for s in samples})):
        label = f"(n,k)=({config})" if config[:1].isdigit() else config
        colour = f"C{i}"
        ttft = sorted(s.ttft_ms for s in samples if s.config == config and s.ok)
        floors = sorted(s.floor_ms for s in samples if s.config == config and s.ok and not math.isnan(s.floor_ms))
        if ttft:
            ax.plot(ttft, [(j + 1) / len(ttft) for j in range(len(ttft))], color=colour, label=f"{label} TTFT")
        if floors:
            ax.plot(floors, [(j + 1) / len(floors) for j in range(len(floors))], color=colour, linestyle=":",
                    label=f"{label} floor")
    ax.set_xlabel("time to first token (ms)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("Wide-area testbed: TTFT through the overlay (dotted: propagation floor)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


# ------------------------------------------------------------------------------------- a whole run


@dataclass
class Plan:
    """What one testbed run starts and measures (``gentorrent testbed`` flags; the bench's sizes)."""

    relays: int = 100
    models: int = 6
    verifiers: int = 4
    engine: str = "echo"
    model: str = "echo"
    configs: tuple[tuple[int, int], ...] = ((1, 1), (4, 3), (4, 4))
    client_regions: tuple[str, ...] = ("eu-west", "us-east", "ap-southeast")
    requests: int = 10  # timed requests per client, churn aside
    warmup: int = 2  # untimed requests per client first (they open the links)
    path_builds: int = 20
    failover_requests: int = 3  # per (4,3) client, to a model node that just crashed
    churn_s: float = 120.0
    relay_leave_per_min: float = 0.01  # 10 % of the relays per 10 minutes
    model_leaves: int = 1  # model nodes crashed during the churn phase
    crash_share: float = 0.5
    mean_downtime_s: float = 60.0
    churn_request_every_s: float = 2.0  # per (4,3) client during the churn phase
    timeout: float = 30.0
    seed: int = 0
    timeout_commit: str = "1s"
    start_timeout: float = 600.0
    loss: float = LOSS  # of TCP segments on every link (docs/testbed.md "Loss")

    def clients(self) -> dict[str, tuple[int, int, str]]:
        """Client name -> (n, k, region)."""
        return {f"client-{n}{k}-{r}": (n, k, r) for n, k in self.configs for r in self.client_regions}


def run_plan(root: Path, plan: Plan, *, say: Callable[[str], None], show: bool) -> tuple[
        dict[str, Any], dict[str, float], list[Sample], list[Path]]:
    """Start the testbed of ``plan`` under ``root``, measure, stop everything; ``(params,
    figures, samples, files written)``. Raises :class:`~gentorrent.tools.localnet.LocalNetError` or
    :class:`~gentorrent.tools.toxiproxy.ToxiproxyError` when the network cannot start."""
    from gentorrent.cli import run_async
    from gentorrent.tools.devnet import start_committee, start_nodes
    from gentorrent.tools.toxiproxy import Toxiproxy

    clients = plan.clients()
    net = Testbed(root, relays=plan.relays, models=plan.models, verifiers=plan.verifiers, clients=list(clients),
                  client_regions={c: r for c, (_, _, r) in clients.items()}, engine=plan.engine, model=plan.model,
                  seed=plan.seed, timeout_commit=plan.timeout_commit, loss=plan.loss)
    figures: dict[str, float] = {}
    samples: list[Sample] = []
    extra: dict[str, Any] = {"regions": net.region_of}
    params: dict[str, Any] = {**{k: v for k, v in asdict(plan).items() if k != "configs"},
                              "configs": [f"{n},{k}" for n, k in plan.configs],
                              "processes": plan.relays + plan.models + plan.verifiers * 2 + 1}
    began = time.perf_counter()
    root.mkdir(parents=True, exist_ok=True)
    proxy = Toxiproxy()
    proxy.start(log_path=root / "toxiproxy.log")
    with proxy, net:
        links = net.start_links(proxy)
        say(f"testbed: {links} access links (Toxiproxy) for {len(net.names) + len(net.verifiers)} nodes "
            f"in {len(net.regions)} regions")
        params["access_links"] = links
        first = net.proxy_specs()[0][0].name
        params["toxics_per_link"] = len(proxy.toxics(first))  # latency, bandwidth and (with loss) loss, each way
        params["toxiproxy_version"] = proxy.version()
        net.launch_committee()
        start_committee(net, plan.start_timeout, show=show, verbose=False)
        t_nodes = time.perf_counter()
        start_nodes(net, plan.start_timeout, show=show, verbose=False)
        figures["network_start_s"] = time.perf_counter() - t_nodes
        say(f"testbed: {len(net.relays)} relays and {len(net.models)} model nodes up and listed "
            f"({figures['network_start_s']:.0f} s)")
        churn = ChurnLog()
        run_async(_measure, net, plan, clients, figures, samples, churn, say)
        figures.update(process_costs(net, time.perf_counter() - t_nodes))
        if proxy.pid is not None:
            with contextlib.suppress(OSError):
                figures["toxiproxy_rss_MiB"], figures["toxiproxy_cpu_s"] = process_usage(proxy.pid)
        try:
            figures.update(committee_pace(net))
        except Exception as exc:  # noqa: BLE001 - a figure missing, said in the report
            say(f"testbed: no block interval ({exc})")
        extra["churn"] = churn.done
    figures["run_s"] = time.perf_counter() - began
    files = write_report(root, params, figures, samples, extra)
    return params, figures, samples, files


@dataclass
class Measuring:
    """One run's measurement with every client open: what it measures with, and where it puts it."""

    net: Testbed
    plan: Plan
    clients: dict[str, tuple[int, int, str]]
    opened: dict[str, Client]
    figures: dict[str, float]
    samples: list[Sample]
    churn: ChurnLog
    say: Callable[[str], None]
    rng: random.Random
    started: float

    async def request(self, c: Client, target: str | None = None) -> Sample:
        """One :func:`timed_request` from ``c`` under the plan's bound."""
        return await timed_request(self.net, c, self.plan.model, wait_timeout=self.plan.timeout,
                                   started=self.started, target=target)

    def of_config(self, n: int, k: int) -> list[Client]:
        """The open clients that send as (n, k)."""
        return [c for name, c in self.opened.items() if self.clients[name][:2] == (n, k)]


async def _measure(net: Testbed, plan: Plan, clients: dict[str, tuple[int, int, str]], figures: dict[str, float],
                   samples: list[Sample], churn: ChurnLog, say: Callable[[str], None]) -> None:
    rng = random.Random(plan.seed)
    started = trio.current_time()
    opened: dict[str, Client] = {}
    stop = trio.Event()
    all_open = trio.Event()

    async def keep(name: str) -> None:  # each client lives in its own task until the end of the run
        n, k, _ = clients[name]
        async with open_client(net, name, n=n, k=k, paths=n) as c:
            opened[name] = c
            if len(opened) == len(clients):
                all_open.set()
            await stop.wait()

    async with trio.open_nursery() as keeper:
        for name in clients:
            keeper.start_soon(keep, name)
        with trio.fail_after(plan.start_timeout):
            await all_open.wait()
        await _measure_open(Measuring(net, plan, clients, opened, figures, samples, churn, say, rng, started))
        stop.set()


async def _measure_open(m: Measuring) -> None:
    _registrations(m)
    await _path_builds(m)
    order = await _requests(m)
    churners = m.of_config(4, 3) or order  # failover and churn: from the (4,3) clients
    await _failover(m, churners)
    await _churn(m, churners)
    stats = [c.user.stats() for c in m.opened.values()]
    figures = m.figures
    figures["client_refused_builds"] = float(sum(s.get("paths_refused_builds", 0) for s in stats))


def _registrations(m: Measuring) -> None:
    """How long the clients took from registration to a verified signed list."""
    reg = sorted(c.registered_s for c in m.opened.values())
    m.figures["registration_to_listed_p50_ms"] = 1e3 * percentile(reg, 50)
    m.figures["registration_to_listed_max_ms"] = 1e3 * reg[-1]
    m.say(f"testbed: {len(m.opened)} clients registered (p50 {m.figures['registration_to_listed_p50_ms']:.0f} ms "
          "from registration to a verified signed list)")


async def _path_builds(m: Measuring) -> None:
    """Time the plan's path builds, from the first (4,3) client (or the first client)."""
    if not m.plan.path_builds:
        return
    builder = (m.of_config(4, 3) or list(m.opened.values()))[0]
    builds = await time_path_builds(m.net, builder, m.plan.path_builds, m.rng)
    if builds:
        m.figures.update(summarize_ms("path_build", builds))
    m.figures["path_builds_failed"] = float(m.plan.path_builds - len(builds))
    m.say(f"testbed: {len(builds)} path builds timed")


async def _requests(m: Measuring) -> list[Client]:
    """The timed requests, interleaved over the clients so that each configuration sees the same
    load (after the warm-up's, not counted); the clients in the last round's order."""
    order = list(m.opened.values())
    for c in order:
        for _ in range(m.plan.warmup):
            await m.request(c)
    for i in range(m.plan.requests):
        m.rng.shuffle(order)
        for c in order:
            m.samples.append(await m.request(c))
        m.say(f"testbed: timed requests, round {i + 1} of {m.plan.requests}")
    for n, k in m.plan.configs:
        m.figures.update(summarize_samples(m.samples, f"{n},{k}"))
    return order


async def _failover(m: Measuring, churners: list[Client]) -> None:
    """A model node crashes; requests sent to it right away are answered elsewhere."""
    net, plan = m.net, m.plan
    if not plan.failover_requests or len(net.models) <= 1:
        return
    victim = net.models[-1]
    net.procs[victim].send_signal(signal.SIGKILL)
    m.churn.done.append((trio.current_time() - m.started, victim, "crash"))
    fo: list[Sample] = []
    for c in churners:
        for _ in range(plan.failover_requests):
            s = await m.request(c, target=victim)
            s.config = "failover"
            fo.append(s)
    m.samples.extend(fo)
    ok = sorted(s.ttft_ms for s in fo if s.ok)
    m.figures["failover_requests"], m.figures["failover_answered"] = float(len(fo)), float(len(ok))
    if ok:
        m.figures["failover_ttft_p50_ms"] = percentile(ok, 50)
        m.figures["failover_ttft_max_ms"] = ok[-1]
    net.spawn(victim)
    m.say(f"testbed: failover: {len(ok)} of {len(fo)} requests to a crashed model node answered elsewhere")


def _churn_events(net: Testbed, plan: Plan) -> list[ChurnEvent]:
    """The plan's churn: relays leaving and coming back, and model nodes crashing or leaving in turn."""
    events = churn_schedule(net.relays, duration_s=plan.churn_s, leave_per_min=plan.relay_leave_per_min,
                            crash_share=plan.crash_share, mean_downtime_s=plan.mean_downtime_s, seed=plan.seed)
    for j in range(min(plan.model_leaves, len(net.models) - 1)):
        at = plan.churn_s * (j + 1) / (plan.model_leaves + 1)
        mn = net.models[j]
        events = sorted([*events, ChurnEvent(at, mn, "crash" if j % 2 == 0 else "leave"),
                         ChurnEvent(at + plan.mean_downtime_s, mn, "join")], key=lambda e: e.at_s)
    return [e for e in events if e.at_s < plan.churn_s]


async def _churn(m: Measuring, churners: list[Client]) -> None:
    """Relays (and model nodes) leave and come back while the clients keep asking."""
    net, plan = m.net, m.plan
    if plan.churn_s <= 0:
        return
    events = _churn_events(net, plan)
    m.say(f"testbed: churn for {plan.churn_s:.0f} s: {sum(e.kind != 'join' for e in events)} departures")
    during: list[Sample] = []

    async def ask(c: Client) -> None:
        end = trio.current_time() + plan.churn_s
        while trio.current_time() < end:
            t0 = trio.current_time()
            s = await m.request(c)
            s.config = "churn"
            during.append(s)
            await trio.sleep_until(t0 + plan.churn_request_every_s)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(play_churn, run_started=m.started), net, events, m.churn, m.say)
        for c in churners:
            nursery.start_soon(ask, c)
    m.samples.extend(during)
    answered = sum(s.ok for s in during)
    m.figures["churn_requests"], m.figures["churn_answered"] = float(len(during)), float(answered)
    m.figures["churn_answered_fraction"] = answered / len(during) if during else math.nan
    m.figures["churn_departures"] = float(m.churn.count("crash") + m.churn.count("leave"))
    m.say(f"testbed: churn: {answered} of {len(during)} requests answered")
