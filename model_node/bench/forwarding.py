"""``gentorrent bench forwarding``: HR-tree forwarding against load-only and random forwarding
(paper §3.3 and §5 "latency"; decision 0005), with the real llama.cpp engine.

Three ``gentorrent model-node --engine llama.cpp`` processes (SmolLM2-135M-Instruct), started
by :mod:`model_node.bench.node` so that the baseline policies can be injected
(:mod:`model_node.bench.policies`), form one group on this machine. The same seeded workload is
played three times, once per forwarding policy, each time on fresh processes (empty caches):

- ``hrtree``: the default rule of ``gentorrent model-node`` (:meth:`model_node.group.GroupState.decide`).
  It was Algorithm 2 (a cached prefix's holder if under the load threshold, else the least
  relatively loaded node) when docs/benchmarks.md's "forwarding" figures were measured; since
  issue 29 it is the least predicted time to first token (``alg2`` in
  :mod:`model_node.bench.policies` keeps Algorithm 2; ``bench forwarding-wide-area`` compares them);
- ``load``: the least relatively loaded node, caches ignored (the paper's "without HR-tree
  based KV cache reusing");
- ``random``: a uniformly random node of the group.

Workload: ``SYSTEM_PROMPTS`` system prompts of 800–1,500 tokens (lengths drawn uniformly, each
with its own topic and wording, so prompts share only the chat template's 3-token header), one
chosen per request by Zipf(1.1) popularity, followed by a short question; greedy, 16 output
tokens. Poisson arrivals at ``RATE`` requests/s; each request goes to an entry node chosen
uniformly at random, which serves or forwards it. Requests are sent as direct authenticated TLS
``Request``\\ s (the nodes run with ``--accept-direct-requests``; a forwarded one's chunks come
back through the entry node), not through the
anonymous overlay, to keep the 2 cores for the engines; the overlay's added latency is measured
by ``bench engine`` (≈ 14 ms to the first token) and ``bench overlay``.

Each engine keeps at most 4 cached prefixes (the one in its context and 3 KV snapshots:
``--prefix-snapshots 3``) and runs one thread (``--threads 1``: three engines share 2 cores;
llama.cpp's multi-threaded batches slow down many-fold when processes oversubscribe cores).
The group syncs every 5 s (the paper's interval). The first request is sent once every node
has heard from both peers.

Then the same workload (same seed, same prompts) at ``RATE_FACTORS`` 2× and 4× the rate
(issue 19): at 2×, Algorithm 2 with the product's work-aware load (``hrtree``) and with the
request-count load (``requests``, a baseline in :mod:`model_node.bench.policies`); at 4×,
``hrtree`` alone. A model node past its capacity answers "busy" (after at most
``--max-queue-wait``, 10 s); the bench client then sends the request at once to an entry node
that has not refused it (nor has the node that refused it), as the user's ``AnonClient`` does,
and counts the request refused only when every node refused. TTFT and latency run from the
first send.

``--quick``: 8 requests, 3 system prompts of 400–500 tokens, 0.6 requests/s, syncs every second
(checks the bench runs; its figures mean little). Full run ≈ 30 minutes; a line per run goes to stderr as it
finishes.

Figures, per policy ``P`` in ``hrtree``, ``load``, ``random``: ``ttft_P_{mean,p50,p99}_ms``
(request sent → first reply chunk, which carries the first token), ``latency_P_{...}_ms``
(→ last chunk), ``cache_hit_rate_P`` (requests of which at least half the prompt came from
the serving engine's cache), ``prompt_reuse_P`` (cached ÷ all prompt tokens),
``forwarded_frac_P`` (requests the entry node forwarded), ``busiest_node_share_P`` (the
largest share of the answered requests one node served), ``cpu_utilisation_P`` (CPU time of the three
model-node processes ÷ (wall time × cores), from the first request sent to the last reply),
``foreign_cpu_P`` (the same for every other process on the machine but this bench: above a few
per cent, another job disturbed the run), ``failed_frac_P`` (requests answered with an error,
e.g. a forwarded request whose target sent nothing for 120 s; TTFT and latency cover the
others);
and ``ttft_mean_ratio_hrtree_vs_load``, ``ttft_p99_ratio_hrtree_vs_load``,
``latency_mean_ratio_hrtree_vs_load``, ``latency_p99_ratio_hrtree_vs_load``,
``ttft_mean_ratio_hrtree_vs_random``, ``ttft_mean_reduction_hrtree_vs_load`` (1 − ratio).
At 2× and 4×: ``ttft_mean_work_vs_requests_2x`` (mean TTFT of accepted requests, work-aware ÷
request-count load), ``ttft_p99_accepted_4x_s`` (p99 TTFT of the requests answered at 4×, in
seconds), ``lost_4x`` (requests at 4× neither answered nor refused as busy), and
``refused_frac_{hrtree,requests}_2x`` / ``refused_frac_4x`` (requests every node refused as busy).
"""

from __future__ import annotations

import math
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from gentorrent.bench.stats import cpu_model, percentile, process_usage, summarize_ms
from gentorrent.cli import run_async
from gentorrent.tools.localnet import LocalNet
from model_node.bench.policies import REQUESTS_THRESHOLD
from model_node.forwarding import DEFAULT_LOAD_THRESHOLD
from model_node.llama import DEFAULT_MODEL_ID, LlamaCppEngine, resolve_model
from model_node.messages import NodeStats, StatsRequest
from overlay.net.peers import PeerEntry
from overlay.net.transport import Connection, TLSTransport, TransportError
from overlay.wire.clock import TrioClock
from overlay.wire.failures import Failure, from_wire
from overlay.wire.identity import Identity
from overlay.wire.messages import ChatMessage, ReplyChunk, Request, SamplingParams

POLICIES = ("hrtree", "load", "random")  # at the base rate
RATE_FACTORS = (2, 4)
SEED = 7
ZIPF_S = 1.1
SYSTEM_PROMPTS = 8
SYSTEM_TOKENS = (800, 1500)
REQUESTS = 100
RATE = 0.36  # requests per second: about 70 % CPU utilisation under load-only on the 2-core dev machine
MAX_TOKENS = 16
SNAPSHOTS = 3  # + the context's prefix = at most 4 cached prefixes per node
SYNC_INTERVAL = 5.0
# --quick (checks the benches run; its figures mean little): syncs every second and shorter system
# prompts, so that the three forwarding benches' quick runs take a minute or two instead of five (issue 30)
QUICK_SYNC_INTERVAL = 1.0
QUICK_SYSTEM_TOKENS = (400, 500)
PARAMS = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
IDLE_REUSE = 120.0  # seconds a pooled connection is reused (model nodes close idle ones after 300 s)

TOPICS = ["a city library", "a mountain railway", "a seed bank", "a harbour office", "a chess club",
          "a bicycle repair shop", "a planetarium", "a tax help desk", "a vineyard", "a dental clinic",
          "a ferry company", "a museum of clocks"]
NOUNS = ["ticket", "ledger", "window", "bench", "lantern", "schedule", "permit", "parcel", "map", "invoice",
         "badge", "locker", "receipt", "kettle", "ladder", "folder", "stamp", "token", "basket", "compass"]
VERBS = ["check", "record", "return", "inspect", "approve", "label", "archive", "count", "repair", "announce"]
QUESTIONS = ["What should I do first?", "Where do I go for help?", "Can you summarise the key rule?",
             "Who approves the request?", "How long does it take?", "What do I need to bring?",
             "Is there a fee?", "What happens if I am late?", "Which form applies to me?",
             "Can someone else do it for me?"]


@dataclass(frozen=True)
class Job:
    at: float  # seconds after the start
    entry: int  # index of the entry node
    system: int  # index of the system prompt
    question: str


def system_prompt(engine: LlamaCppEngine, i: int, target: int, rng: random.Random) -> str:
    """A system prompt of about ``target`` tokens (with the chat template) on its own topic."""
    topic = TOPICS[i % len(TOPICS)]
    text = f"[{i}] You are the assistant of {topic}. Follow these rules exactly."
    n = 0
    while True:
        rule = (f" Rule {n}: always {rng.choice(VERBS)} the {rng.choice(NOUNS)} before you "
                f"{rng.choice(VERBS)} the {rng.choice(NOUNS)} of {topic}.")
        if len(engine.chat_prompt([ChatMessage("system", text + rule)])) > target:
            return text
        text += rule
        n += 1


def zipf_weights(n: int, s: float) -> list[float]:
    w = [1 / (k ** s) for k in range(1, n + 1)]
    total = sum(w)
    return [x / total for x in w]


def workload(n_requests: int, n_system: int, rate: float, n_entries: int, seed: int) -> list[Job]:
    rng = random.Random(seed)
    weights = zipf_weights(n_system, ZIPF_S)
    jobs, t = [], 0.0
    for _ in range(n_requests):
        t += rng.expovariate(rate)
        jobs.append(Job(t, rng.randrange(n_entries), rng.choices(range(n_system), weights)[0],
                        f"{rng.choice(QUESTIONS)} (ref {rng.randrange(10_000)})"))
    return jobs


def _machine_busy_seconds() -> float:
    """CPU time the whole machine spent busy (all processes), from /proc/stat."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # less idle and iowait


def _cpu_seconds(pid: int) -> float:
    return process_usage(pid)[1]  # utime + stime


class RequestFailed(Exception):
    """The model node answered with an error chunk (``node``: the node that says so, ``failure``:
    its code, :func:`overlay.wire.failures.from_wire`)."""

    def __init__(self, error: str, node: bytes, failure: Failure = Failure.NODE_ERROR) -> None:
        super().__init__(error)
        self.node = node
        self.failure = failure


class Client:
    """Direct TLS requests; one connection per request in flight (a model node answers a
    direct request on its connection before reading the next frame)."""

    def __init__(self, ident: Identity, transport: TLSTransport | None = None) -> None:
        self.transport = transport or TLSTransport(ident)
        self.idle: dict[bytes, list[tuple[Connection, float]]] = {}

    async def connection(self, e: PeerEntry) -> Connection:
        pool = self.idle.setdefault(e.node_id, [])
        while pool:
            c, since = pool.pop()
            if not c.closed and time.perf_counter() - since < IDLE_REUSE:
                return c
            await c.aclose()
        return await self.transport.dial(e.address, e.node_id)

    def release(self, e: PeerEntry, conn: Connection) -> None:
        self.idle.setdefault(e.node_id, []).append((conn, time.perf_counter()))

    async def warm(self, e: PeerEntry, n: int) -> None:
        for _ in range(n):
            self.release(e, await self.transport.dial(e.address, e.node_id))

    async def request(self, e: PeerEntry, messages: tuple[ChatMessage, ...],
                      t0: float | None = None) -> tuple[float, float, bytes]:
        """``(ttft, latency, serving node)`` in seconds from ``t0`` (a ``perf_counter`` time;
        default: when this request is sent). :class:`RequestFailed` for an error chunk."""
        conn = await self.connection(e)
        t0 = time.perf_counter() if t0 is None else t0
        await conn.send(Request(request_id=os.urandom(16), model=DEFAULT_MODEL_ID, messages=messages,
                                params=PARAMS, k=1, return_paths=(), continuation=""))
        ttft = None
        while True:
            c = await conn.receive(idle_timeout=600)
            if not isinstance(c, ReplyChunk):
                continue
            if ttft is None:
                ttft = time.perf_counter() - t0
            if c.error:
                self.release(e, conn)
                raise RequestFailed(c.error, c.node, from_wire(c.failure))
            if c.done:
                self.release(e, conn)
                return ttft, time.perf_counter() - t0, c.node

    async def stats(self, e: PeerEntry) -> NodeStats:
        conn = await self.connection(e)
        await conn.send(StatsRequest(1))
        while True:
            msg = await conn.receive(idle_timeout=30)
            if isinstance(msg, NodeStats):
                self.release(e, conn)
                return msg

    async def aclose(self) -> None:
        for pool in self.idle.values():
            for c, _ in pool:
                await c.aclose()


async def _play(net: LocalNet, jobs: list[Job], systems: list[str], warm_conns: int,
                transport: TLSTransport | None = None, sync_interval: float = SYNC_INTERVAL) -> dict[str, Any]:
    client = Client(net.identities["client"], transport)
    entries = [net.entries[m] for m in net.models]
    for e in entries:
        await client.warm(e, warm_conns)
    with trio.fail_after(6 * sync_interval):  # every node has heard from every peer
        while True:
            peers = [len((await client.stats(e)).peers) for e in entries]
            if all(n == len(entries) - 1 for n in peers):
                break
            await trio.sleep(0.2)
    pids = [net.procs[m].pid for m in net.models]
    cpu0 = sum(_cpu_seconds(p) for p in pids)
    own0, busy0 = _cpu_seconds(os.getpid()), _machine_busy_seconds()
    ttft: list[float] = []
    latency: list[float] = []
    served_by: dict[bytes, int] = {}
    node_index = {e.node_id: i for i, e in enumerate(entries)}
    # at, entry, system, server, ttft, latency, busy refusals before the answer
    trace: list[tuple[float, int, int, int, float, float, int]] = []
    clock = TrioClock()  # arrivals are scheduled with trio.sleep_until on trio's clock
    t_start = clock.monotonic()

    failed: list[str] = []
    refused: list[str] = []  # every node answered busy
    lost: list[str] = []  # neither answered nor refused (a connection lost, nothing for 600 s)
    attempts: list[float] = []  # requests sent to an entry node (a busy refusal's retry included)

    async def one(job: Job) -> None:
        await trio.sleep_until(t_start + job.at)
        msgs = (ChatMessage("system", systems[job.system]), ChatMessage("user", job.question))
        entry, tried, t0, refusals = entries[job.entry], set[bytes](), time.perf_counter(), 0
        while True:
            attempts.append(job.at)
            try:
                t, lat, node = await client.request(entry, msgs, t0)
                break
            except RequestFailed as exc:
                if exc.failure is not Failure.BUSY:  # e.g. a forward timed out in an overloaded group: counted
                    failed.append(str(exc))
                    return
                refusals += 1
                tried |= {entry.node_id, exc.node}  # busy: at once to a node that has not refused
                others = [e for e in entries if e.node_id not in tried]
                if not others:
                    refused.append(str(exc))
                    return
                entry = others[job.entry % len(others)]
            except TransportError as exc:
                lost.append(str(exc))
                return
        trace.append((job.at, job.entry, job.system, node_index[node], t, lat, refusals))
        ttft.append(t)
        latency.append(lat)
        served_by[node] = served_by.get(node, 0) + 1

    async with trio.open_nursery() as nursery:
        for job in jobs:
            nursery.start_soon(one, job)
    wall = clock.monotonic() - t_start
    cpu = sum(_cpu_seconds(p) for p in pids) - cpu0
    foreign = _machine_busy_seconds() - busy0 - cpu - (_cpu_seconds(os.getpid()) - own0)
    cores = len(os.sched_getaffinity(0))
    stats = [await client.stats(e) for e in entries]
    await client.aclose()
    served = sum(s.served for s in stats)
    prompt = sum(s.prompt_tokens for s in stats)
    return {
        "ttft": ttft, "latency": latency, "wall": wall,
        "cpu_utilisation": cpu / (wall * cores), "foreign_cpu": max(0.0, foreign / (wall * cores)),
        "cache_hit_rate": sum(s.cache_hits for s in stats) / served,
        "prompt_reuse": 1 - sum(s.evaluated_prompt_tokens for s in stats) / prompt,
        "forwarded_frac": sum(s.forwarded_out for s in stats) / len(jobs),
        "busiest_node_share": max(served_by.values(), default=0) / max(1, sum(served_by.values())),
        "failed_frac": len(failed) / len(jobs), "failures": sorted(set(failed)),
        "attempts": len(attempts), "refused_frac": len(refused) / len(jobs),
        "lost": len(lost) + len(failed), "losses": sorted(set(lost)),
        "served": served, "trace": sorted(trace), "stats": stats, "busy_refusals": sum(x.busy for x in stats),
    }


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def _decisions(stats: list[NodeStats]) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in stats:
        for c in s.decisions:
            out[c.name] = out.get(c.name, 0) + c.n
    return dict(sorted(out.items()))


def prompts(n_system: int, lo: int, hi: int) -> tuple[list[str], list[int], int]:
    """The seeded system prompts (``lo``..``hi`` tokens each), their token counts, and the most
    tokens a question adds."""
    rng = random.Random(SEED)
    model_id, path = resolve_model(None)
    tokenizer = LlamaCppEngine(path, model_id=model_id, n_ctx=2048, cache_bytes=0, n_threads=1)
    try:
        systems = [system_prompt(tokenizer, i, rng.randint(lo, hi), rng) for i in range(n_system)]
        system_tokens = [len(tokenizer.chat_prompt([ChatMessage("system", s)])) for s in systems]
        question_tokens = max(len(tokenizer.chat_prompt([ChatMessage("system", systems[0]),
                                                         ChatMessage("user", q + " (ref 9999)")]))
                              - system_tokens[0] for q in QUESTIONS)
    finally:
        tokenizer.close()
    return systems, system_tokens, question_tokens


def play(policy: str, jobs: list[Job], systems: list[str], warm_conns: int,
         load_threshold: float | None = None, sync_interval: float = SYNC_INTERVAL) -> dict[str, Any]:
    """Play ``jobs`` on three fresh llama.cpp model-node processes forwarding by ``policy``."""
    args = ["--threads", "1", "--prefix-snapshots", str(SNAPSHOTS), "--sync-interval", str(sync_interval),
            "--accept-direct-requests"]  # the client sends plain requests (see the module docstring)
    if load_threshold is not None:
        args += ["--load-threshold", str(load_threshold)]
    with tempfile.TemporaryDirectory(prefix=f"gentorrent-bench-forwarding-{policy}-") as d:
        with LocalNet(Path(d), 0, users=("client",), models=3, registry_keys=1, engine="llama.cpp",
                      model=DEFAULT_MODEL_ID, model_args=tuple(args), bench_args=("--baseline", policy)) as net:
            net.start(timeout=120)
            result: dict[str, Any] = run_async(_play, net, jobs, systems, warm_conns, None, sync_interval)
    ttft = result["ttft"]
    print(f"bench forwarding: policy {policy}, threshold {load_threshold or 'default'}, {len(jobs)} requests "
          f"over {jobs[-1].at:.0f} s: {len(ttft)} answered, {result['refused_frac']:.0%} refused as busy, "
          f"{result['failed_frac']:.0%} failed {result['failures']}, {result['lost']} lost, mean TTFT "
          f"{1000 * sum(ttft) / max(1, len(ttft)):.0f} ms, cache hits {result['cache_hit_rate']:.0%}, "
          f"wall {result['wall']:.0f} s", file=sys.stderr, flush=True)
    return result


def run(quick: bool) -> tuple[dict[str, Any], dict[str, float]]:
    n_requests = 8 if quick else REQUESTS
    n_system = 3 if quick else SYSTEM_PROMPTS
    rate = 0.6 if quick else RATE
    lo, hi = QUICK_SYSTEM_TOKENS if quick else SYSTEM_TOKENS
    sync = QUICK_SYNC_INTERVAL if quick else SYNC_INTERVAL
    warm = 4 if quick else 16
    model_id, path = resolve_model(None)
    systems, system_tokens, question_tokens = prompts(n_system, lo, hi)
    jobs = workload(n_requests, n_system, rate, 3, SEED)
    results = {policy: play(policy, jobs, systems, warm, sync_interval=sync) for policy in POLICIES}
    faster = {f: workload(n_requests, n_system, rate * f, 3, SEED) for f in RATE_FACTORS}
    at2 = {policy: play(policy, faster[2], systems, warm, sync_interval=sync) for policy in ("hrtree", "requests")}
    at4 = play("hrtree", faster[4], systems, warm, sync_interval=sync)
    figures: dict[str, float] = {}
    for p, r in results.items():
        figures.update(summarize_ms(f"ttft_{p}", r["ttft"]))
        figures.update(summarize_ms(f"latency_{p}", r["latency"]))
        for k in ("cache_hit_rate", "prompt_reuse", "forwarded_frac", "busiest_node_share", "cpu_utilisation",
                  "foreign_cpu", "failed_frac"):
            figures[f"{k}_{p}"] = r[k]
    for kind, stat in (("ttft", "mean"), ("ttft", "p99"), ("latency", "mean"), ("latency", "p99")):
        figures[f"{kind}_{stat}_ratio_hrtree_vs_load"] = (figures[f"{kind}_hrtree_{stat}_ms"]
                                                         / figures[f"{kind}_load_{stat}_ms"])
    figures["ttft_mean_ratio_hrtree_vs_random"] = figures["ttft_hrtree_mean_ms"] / figures["ttft_random_mean_ms"]
    figures["ttft_mean_reduction_hrtree_vs_load"] = 1 - figures["ttft_mean_ratio_hrtree_vs_load"]
    figures["ttft_mean_work_vs_requests_2x"] = _mean(at2["hrtree"]["ttft"]) / _mean(at2["requests"]["ttft"])
    for p, r in at2.items():
        figures[f"refused_frac_{p}_2x"] = r["refused_frac"]
    figures["ttft_p99_accepted_4x_s"] = percentile(sorted(at4["ttft"]), 99) if at4["ttft"] else math.nan
    figures["lost_4x"] = float(at4["lost"])
    figures["refused_frac_4x"] = at4["refused_frac"]
    zipf = zipf_weights(n_system, ZIPF_S)
    params = {
        "model": f"{model_id} ({path.name})", "engine": "llama.cpp (llama-cpp-python 0.3.36), batch-invariant",
        "model_nodes": 3, "threads_per_node": 1, "cores": len(os.sched_getaffinity(0)), "cpu": cpu_model(),
        "cached_prefixes_per_node": SNAPSHOTS + 1, "sync_interval_s": sync, "capacity_score": 1,
        "load_threshold": DEFAULT_LOAD_THRESHOLD, "requests": n_requests, "arrivals": f"Poisson, {rate} requests/s",
        "system_prompts": n_system, "system_prompt_tokens": system_tokens,
        "question_tokens_max": question_tokens, "popularity": f"Zipf({ZIPF_S})",
        "popularity_weights": [round(w, 3) for w in zipf], "max_tokens": MAX_TOKENS, "sampling": "greedy",
        "seed": SEED, "policies": list(POLICIES),
        "transport": "direct authenticated TLS Requests to an entry node chosen uniformly at random "
                     "(forwarded replies come back through it); not the anonymous overlay",
        "fresh_processes_per_policy": True,
        "wall_s": {p: round(r["wall"], 1) for p, r in results.items()},
        "decisions": {p: _decisions(r["stats"]) for p, r in results.items()},
        "attempts": {p: r["attempts"] for p, r in results.items()},
        "attempts_2x": {p: r["attempts"] for p, r in at2.items()}, "attempts_4x": at4["attempts"],
        "rate_factors": {f"{f}x": f"Poisson, {round(rate * f, 3)} requests/s" for f in RATE_FACTORS},
        "policies_2x": ["hrtree", "requests"], "policies_4x": ["hrtree"],
        "max_queue_wait_s": 10.0, "request_count_threshold": REQUESTS_THRESHOLD,
        "wall_s_2x": {p: round(r["wall"], 1) for p, r in at2.items()}, "wall_s_4x": round(at4["wall"], 1),
        "decisions_2x": {p: _decisions(r["stats"]) for p, r in at2.items()},
        "decisions_4x": _decisions(at4["stats"]),
        "failed_frac_2x": {p: r["failed_frac"] for p, r in at2.items()}, "failed_frac_4x": at4["failed_frac"],
        "answered_4x": len(at4["ttft"]), "busy_refusals_4x": at4["busy_refusals"],
        "busy_refusals_2x": {p: r["busy_refusals"] for p, r in at2.items()},
    }
    if any(math.isnan(v) for v in figures.values()):
        raise RuntimeError("a figure is NaN")
    return params, figures
