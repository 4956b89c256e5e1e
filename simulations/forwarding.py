"""Item 5 — forwarding at scale (paper §5.3, Figs. 15–18).

``MODEL_NODES`` = 50 model nodes, each with its own real :class:`~model_node.group.GroupState`
(node table, HR-tree, Sentry); every ``SYNC_S`` = 5 s (the paper's interval) each node reports
its load and cached prefixes (``set_local_load``, ``set_local_prefixes``, ``tick``) and the
messages are delivered to the other states' ``on_message`` — the real sync, minus the
network. Requests arrive as a Poisson process at an entry node chosen uniformly; the entry's
state ``observe``s the prompt and a policy decides where it is served:

- ``hrtree``: the product's Algorithm 2 (``GroupState.decide``);
- ``load``: load only, :func:`model_node.bench.policies.least_loaded`;
- ``no_hrtree``: neither cache nor load: :class:`model_node.bench.policies.RandomChoice`;
- ``oracle``: a central router that knows every engine's exact KV cache and queue at the
  instant of each arrival (no sync, no delay) and sends the request where its predicted TTFT,
  wait until it would start plus prefill of its uncached tokens under the cost model below, is
  least (:func:`oracle_choice`): what a centralised radix-tree router (SGLang's, llm-d's) could
  at best know. :func:`oracle_ratios` gives HR-tree's mean and p99 TTFT as ratios to it.

HR-tree *variants* (:class:`Variant`, :data:`VARIANTS`; not in :data:`POLICIES`, so not in the
full run) change one thing at a time about what the entry knows when it decides (its own load,
its peers' loads, the prefixes peers announce) or the rule (Algorithm 2, or the least predicted
TTFT, :func:`least_ttft`); :func:`variant_ratios` compares them with the oracle (issue 29).

Engines are a cost model: one request at a time per node, first come first served; a request
costs ``prefill × uncached prompt tokens + decode × output tokens``, the constants measured on
the real llama.cpp engine with SmolLM2-135M (``simulations/data/costs.json``, written by
``python -m simulations.measure_costs``; printed with the results). A node's KV cache holds
the prefixes it served last, up to ``CACHE_TOKENS`` tokens (LRU); a request reuses its prefix if
the serving node holds it.

Workloads are synthesized with the paper's statistics (§5.3): ``tooluse`` (tool prompts by
Zipf 1.1, ~7,206 prompt tokens, 100 output), ``coding`` (10,000 problems by Zipf 0.8, ~1,802
prompt tokens, up to 1,000 output), ``longdoc`` (776 documents by Zipf 0.6, ~10,985 prompt
tokens, 100 output) and ``mixed`` (3 : 6 : 1). Arrival rates rise as a fraction ``RHO`` of the
group's capacity without any cache reuse; each run lasts ``SERVICES`` mean service times.
Nodes report their load as work (prompt and output tokens held, at the cost model's rates),
as model nodes do; Algorithm 2's threshold is ``REQUESTS_THRESHOLD`` mean uncached requests
of the workload, in seconds. Figures per workload, rate and policy: mean and p99
latency and TTFT (s) and cache hit rate (requests with at least half the prompt cached).
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import math
import random
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from model_node.bench.policies import RandomChoice, least_loaded
from model_node.forwarding import Decision, Load, algorithm2, predicted_ttft
from model_node.group import SYNC_INTERVAL, GroupConfig, GroupState
from model_node.hrtree import Match
from simulations.common import Progress, Result, new_figure
from simulations.metrics import percentile

COSTS_FILE = Path(__file__).parent / "data" / "costs.json"
MODEL_NODES = 50
SYNC_S = SYNC_INTERVAL
SERVICES = 6.0  # each run lasts this many mean service times
CACHE_TOKENS = 65_536
RHO = (0.6, 0.9)
POLICIES = ("hrtree", "load", "no_hrtree", "oracle")
VOCAB = 49_152  # SmolLM2's vocabulary size
REQUESTS_THRESHOLD = 8  # Algorithm 2's threshold: this many uncached requests of the workload's mean cost


@dataclass(frozen=True)
class Workload:
    """Requests share a prefix ``key`` (chosen by Zipf(``zipf``) among ``prefixes``) of about
    ``prefix_tokens`` tokens, then ``suffix_tokens`` of their own; ``output`` (lo, hi) tokens."""

    name: str
    prefixes: int
    zipf: float
    prefix_tokens: int
    suffix_tokens: int
    output: tuple[int, int]


WORKLOADS = {
    "tooluse": Workload("tooluse", 200, 1.1, 6_800, 406, (100, 100)),
    "coding": Workload("coding", 10_000, 0.8, 1_700, 102, (300, 1000)),
    "longdoc": Workload("longdoc", 776, 0.6, 10_900, 85, (100, 100)),
}
MIX = (("tooluse", 3), ("coding", 6), ("longdoc", 1))


@dataclass(frozen=True)
class Job:
    at: float
    entry: int
    key: tuple[str, int]
    prefix_len: int
    suffix_seed: int
    suffix_len: int
    output: int


def _prefix_tokens(key: tuple[str, int], n: int) -> list[int]:
    """The token ids of prefix ``key`` (deterministic, distinct per key)."""
    a = (sum(map(ord, key[0])) * 7919 + key[1] * 104_729) % VOCAB
    return [(a + 31 * i + (i * i) % 97) % VOCAB for i in range(n)]


def _suffix_tokens(seed: int, n: int) -> list[int]:
    r = random.Random(seed)
    return [r.randrange(VOCAB) for _ in range(n)]


def load_costs(path: Path = COSTS_FILE) -> dict[str, Any]:
    """The measured cost constants (see :mod:`simulations.measure_costs`)."""
    costs: dict[str, Any] = json.loads(path.read_text())
    return costs


def zipf_weights(n: int, s: float) -> list[float]:
    w = [1 / (r**s) for r in range(1, n + 1)]
    total = sum(w)
    return [x / total for x in w]


def workload(name: str, rate: float, duration: float, nodes: int, seed: int) -> list[Job]:
    """Poisson arrivals at ``rate`` per second for ``duration`` seconds of workload ``name``."""
    rng = random.Random(seed)
    parts = MIX if name == "mixed" else ((name, 1),)
    kinds = [WORKLOADS[p] for p, _ in parts]
    kind_w = [w for _, w in parts]
    cum = {w.name: _cumulative(zipf_weights(w.prefixes, w.zipf)) for w in kinds}
    sizes = {w.name: random.Random(seed + 1) for w in kinds}
    prefix_len: dict[tuple[str, int], int] = {}
    jobs: list[Job] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= duration:
            return jobs
        w = rng.choices(kinds, kind_w)[0]
        key = (w.name, rng.choices(range(w.prefixes), cum_weights=cum[w.name])[0])
        if key not in prefix_len:
            prefix_len[key] = int(w.prefix_tokens * sizes[w.name].uniform(0.8, 1.2))
        jobs.append(Job(t, rng.randrange(nodes), key, prefix_len[key], rng.getrandbits(32), w.suffix_tokens,
                        rng.randint(*w.output)))


def _cumulative(w: Sequence[float]) -> list[float]:
    out, acc = [], 0.0
    for x in w:
        acc += x
        out.append(acc)
    return out


def mean_service_s(name: str, costs: dict[str, Any]) -> float:
    """Mean service time of a request of workload ``name`` without cache reuse."""
    parts = MIX if name == "mixed" else ((name, 1),)
    total = sum(w for _, w in parts)
    s = 0.0
    for p, wt in parts:
        w = WORKLOADS[p]
        s += wt / total * ((w.prefix_tokens + w.suffix_tokens) * costs["prefill_s_per_token"]
                           + sum(w.output) / 2 * costs["decode_s_per_token"])
    return s


@dataclass
class _Engine:
    """One model node's engine under the cost model."""

    free_at: float = 0.0
    # (start, end of prefill, end, uncached prompt tokens, output tokens) of jobs not yet done
    jobs: list[tuple[float, float, float, int, int]] = field(default_factory=list)
    cache: OrderedDict[tuple[str, int], int] = field(default_factory=OrderedDict)  # prefix key -> tokens
    cached_at: dict[tuple[str, int], float] = field(default_factory=dict)
    tokens: int = 0
    changes: list[float] = field(default_factory=list)  # when its load changed: arrivals, first tokens, ends

    def last_change(self, now: float) -> float:
        """When this engine's load last changed at or before ``now`` (-inf: never)."""
        i = bisect.bisect_right(self.changes, now)
        return self.changes[i - 1] if i else -math.inf

    def load(self, now: float, costs: dict[str, Any]) -> Load:
        """The work this engine holds at ``now`` (as a model node reports it: prompt tokens
        still to evaluate, output tokens still to generate, at the cost model's rates)."""
        self.jobs = [j for j in self.jobs if j[2] > now]
        active = sum(1 for j in self.jobs if j[0] <= now)
        prefill = decode = 0.0
        for start, prefilled, end, n_prompt, n_out in self.jobs:
            if now < prefilled:
                left = (prefilled - max(now, start)) / (prefilled - start) if prefilled > start else 1.0
                prefill += n_prompt * left
                decode += n_out
            else:
                decode += n_out * (end - now) / (end - prefilled) if end > prefilled else 0.0
        return Load(active=active, queued=len(self.jobs) - active, capacity=1, prefill_tokens=round(prefill),
                    decode_tokens=round(decode), prefill_rate=1 / costs["prefill_s_per_token"],
                    decode_rate=1 / costs["decode_s_per_token"])

    def predict_ttft(self, job: Job, now: float, costs: dict[str, Any]) -> float:
        """The TTFT ``job`` would get if queued here at ``now``: the wait until this engine is
        free plus the prefill of the prompt tokens its cache does not hold (what :meth:`serve`
        would return; the cache holds a prefix from the moment its request is queued, since the
        engine serves first come first served)."""
        cached = job.prefix_len if job.key in self.cache else 0
        prefill: float = (job.prefix_len + job.suffix_len - cached) * costs["prefill_s_per_token"]
        return max(now, self.free_at) - now + prefill

    def serve(self, job: Job, now: float, costs: dict[str, Any]) -> tuple[float, float, int]:
        """Queue ``job``; returns (ttft, latency, cached prompt tokens)."""
        start = max(now, self.free_at)
        cached = job.prefix_len if job.key in self.cache else 0
        prompt = job.prefix_len + job.suffix_len
        prefill = (prompt - cached) * costs["prefill_s_per_token"]
        end = start + prefill + job.output * costs["decode_s_per_token"]
        self.free_at = end
        self.jobs.append((start, start + prefill, end, prompt - cached, job.output))
        for t in (now, start + prefill, end):
            bisect.insort(self.changes, t)
        if job.key in self.cache:
            self.cache.move_to_end(job.key)
        else:
            self.cache[job.key] = job.prefix_len
            self.tokens += job.prefix_len
            self.cached_at[job.key] = start + prefill
            while self.tokens > CACHE_TOKENS and len(self.cache) > 1:
                old, n = self.cache.popitem(last=False)
                self.tokens -= n
                self.cached_at.pop(old, None)
        return start + prefill - now, end - now, cached

    def visible_prefixes(self, now: float) -> list[tuple[str, int]]:
        """Prefixes whose prefill has finished by ``now`` (what the engine would report)."""
        return [k for k in self.cache if self.cached_at.get(k, 0.0) <= now]


Policy = Callable[[GroupState, Sequence[int]], Decision]


@dataclass(frozen=True)
class Variant:
    """What an HR-tree policy knows when it decides, and the rule it decides by (issue 29).
    The defaults are ``hrtree``, today's product as this simulation models it; each field
    changes one thing, so that experiments vary one at a time:

    - ``local_load``: the entry's own load is read from its engine at each decision (the real
      :meth:`model_node.group_service.GroupService.decide` calls ``refresh_load`` first; the
      ``hrtree`` policy here reads its own load only at each sync round);
    - ``load_s``: every peer's load in the entry's table is taken straight from the engines
      every ``load_s`` seconds (``0``: at every decision, exact: the ideal); ``None``: only the sync round's
      :class:`~model_node.messages.LoadReport` every :data:`SYNC_S` seconds;
    - ``push``: every node reports its load whenever it changes (a request taken, a first token,
      a request done), so a peer's load in the entry's table is as of its last change (network
      delay aside): exact except that the work drained since is not subtracted;
    - ``prefixes``: what the entry knows of the caches: ``"tree"`` the HR-tree synced every
      round, from prefixes whose prefill finished (the product); ``"tree_queued"`` the same
      with a prefix announced from the moment its request is queued; ``"exact"`` the engines'
      caches at the decision, queued prefixes included (the oracle's knowledge);
    - ``rule``: ``"alg2"`` Algorithm 2 (a holder under the threshold with the least wait, else
      the least loaded node); ``"ttft"`` the node with the least predicted first-token time,
      its wait plus the prefill of the prompt tokens it does not hold (:func:`least_ttft`);
    - ``ties``: with the ``"ttft"`` rule, who wins a tie: ``"self"`` the entry (no hop), else
      the lowest id; ``"idle"`` the node free the longest (read from the engines: a load report
      would have to carry how long its node has been idle).
    """

    local_load: bool = False
    load_s: float | None = None
    push: bool = False
    prefixes: str = "tree"
    rule: str = "alg2"
    ties: str = "self"


# HR-tree variants ``play`` accepts as policies; ``hrtree`` is today's product, each other one
# changes what it knows or how it decides (docs/simulations.md, "Against an oracle"):
VARIANTS: dict[str, Variant] = {
    "hrtree": Variant(),
    # + its own load read at each decision, as GroupService.decide does
    "hrtree_local": Variant(local_load=True),
    # + the TTFT rule, on the round's loads
    "hrtree_ttft": Variant(local_load=True, rule="ttft"),
    # + every peer's load exact at each decision (the ideal)
    "hrtree_fresh": Variant(local_load=True, load_s=0.0),
    # + prefixes announced from the moment their request is queued
    "hrtree_fresh_queued": Variant(local_load=True, load_s=0.0, prefixes="tree_queued"),
    # + the TTFT rule
    "hrtree_fresh_queued_ttft": Variant(local_load=True, load_s=0.0, prefixes="tree_queued", rule="ttft"),
    # the same with loads pushed by each node on every change instead of exact: a deployable form
    "hrtree_push_queued_ttft": Variant(local_load=True, push=True, prefixes="tree_queued", rule="ttft"),
    # the same with ties going to the node idle the longest, as the oracle's do: the proposed change
    "hrtree_push_queued_ttft_idle": Variant(local_load=True, push=True, prefixes="tree_queued", rule="ttft",
                                            ties="idle"),
    # the oracle's knowledge (exact caches and loads) with the TTFT rule: what is left is the tie-break
    "hrtree_exact": Variant(local_load=True, load_s=0.0, prefixes="exact", rule="ttft"),
}


TTFT_TIE = 0.01  # least_ttft: costs within 1 % (and 1 ms) of the least are a tie, won by ourselves (no hop)


def least_ttft(state: GroupState, token_ids: Sequence[int], found: Match | None = None,
               matched_tokens: int | None = None, free_at: Mapping[bytes, float] | None = None) -> Decision:
    """The node of ``state``'s table with the least predicted time to first token for
    ``token_ids``: a holder of the prompt's prefix (an HR-tree match, ``d ≥ τ_c``) waits
    :attr:`Load.cached_wait` and then evaluates the tokens past the matched chunks; any other
    node waits :attr:`Load.relative` and then evaluates the whole prompt. Ties as Algorithm
    2's: ourselves, then the higher capacity, then the lower id. ``found`` (and the tokens it
    covers, ``matched_tokens``) replace the HR-tree search when given. Counted as Algorithm
    2's decisions are (``match`` when a holder wins, else ``miss``).

    Costs within :data:`TTFT_TIE` of the least are a tie: without it a node's own rates (exact)
    and its peers' (rounded to a thousandth of a token per second in the load report) differ in
    the last digits, every entry forwards every request, and all of them to the same peer.
    ``free_at``: when each node's engine is (or was last) free; given, a tie goes to the node
    free the longest (the oracle's tie-break) instead of to ourselves."""
    table = state.table()
    if found is None:
        found = state.search(token_ids)
    holders: frozenset[bytes] = frozenset()
    if found.depth >= state.tau_c and found.candidates:
        holders = found.candidates
        if matched_tokens is None:
            ends = state.lengths.chunk_ends(len(token_ids))
            matched_tokens = ends[found.depth - 1] if ends else 0
    left = len(token_ids) - (matched_tokens or 0)

    costs = {n: predicted_ttft(table[n], n in holders, left, len(token_ids)) for n in table}
    least = min(costs.values())
    near = [n for n, c in costs.items() if c <= least * (1 + TTFT_TIE) + 1e-3]
    if free_at is not None:  # the node free the longest, as the oracle breaks ties
        best = min(near, key=lambda n: (free_at[n], n != state.self_id, costs[n], n))
    else:
        best = state.self_id if state.self_id in near else min(near, key=lambda n: (costs[n], -table[n].capacity, n))
    reason = "alone" if len(table) <= 1 else "match" if best in holders else "miss"
    return state.count(Decision(None if best == state.self_id else best, reason, found.depth), len(token_ids))


def oracle_choice(engines: Sequence[_Engine], job: Job, now: float, costs: dict[str, Any]) -> int:
    """The central oracle's choice for ``job`` arriving at ``now``: the engine with the least
    predicted TTFT (:meth:`_Engine.predict_ttft`, from its exact cache and queue now). Ties go
    to the engine free the longest (earliest ``free_at``), then to the lowest index."""
    return min(range(len(engines)),
               key=lambda i: (engines[i].predict_ttft(job, now, costs), engines[i].free_at, i))


def _default_config(jobs: Sequence[Job], costs: dict[str, Any]) -> GroupConfig:
    """The paper's rule (Algorithm 2), its load threshold in seconds of work: REQUESTS_THRESHOLD
    requests of this workload."""
    mean_cost = sum((j.prefix_len + j.suffix_len) * costs["prefill_s_per_token"]
                    + j.output * costs["decode_s_per_token"] for j in jobs) / max(1, len(jobs))
    return GroupConfig(load_threshold=REQUESTS_THRESHOLD * mean_cost, rule="alg2")


class _Group:
    """The model-node group :func:`play` drives: each node's :class:`GroupState` (what it knows)
    and :class:`_Engine` (what it does), the sync rounds between the states, and what an HR-tree
    variant ``var`` knows besides."""

    def __init__(self, nodes: int, config: GroupConfig, costs: dict[str, Any], var: Variant | None) -> None:
        self.ids = [i.to_bytes(20, "big") for i in range(1, nodes + 1)]
        self.states = [GroupState(x, self.ids, config=config) for x in self.ids]
        self.by_id = {x: i for i, x in enumerate(self.ids)}
        self.engines = [_Engine() for _ in self.ids]
        self.costs = costs
        self.var = var
        self.prefix_tokens: dict[tuple[str, int], list[int]] = {}
        self.snapshot: list[Load] = []  # the engines' loads at the last load_s instant (a variant's fresh loads)
        self.snap_at = -math.inf
        self.applied = [-math.inf] * nodes  # the snapshot each entry's table last took
        self.pushed = [[-math.inf] * nodes for _ in range(nodes)]  # per entry and peer: the last pushed report taken
        self.next_sync = 0.0

    def free_times(self) -> dict[bytes, float]:
        return {x: e.free_at for x, e in zip(self.ids, self.engines, strict=True)}

    def prefix_of(self, key: tuple[str, int], n: int) -> list[int]:
        if key not in self.prefix_tokens:
            self.prefix_tokens[key] = _prefix_tokens(key, n)
        return self.prefix_tokens[key]

    def sync(self, now: float) -> None:
        """One sync round: every node's load and prefixes into its state, then the states' messages."""
        var = self.var
        for st, eng in zip(self.states, self.engines, strict=True):
            st.set_local_load(eng.load(now, self.costs))
            keys = list(eng.cache) if var is not None and var.prefixes == "tree_queued" else eng.visible_prefixes(now)
            st.set_local_prefixes([self.prefix_of(k, eng.cache[k]) for k in keys])
        for st in self.states:
            self.deliver(st.self_id, st.tick(now), now)
        for row in self.pushed:  # the round's reports are newer than any change before it
            row[:] = [max(t, now) for t in row]

    def deliver(self, sender: bytes, sends: Sequence[Any], now: float) -> None:
        queue = [(sender, s) for s in sends]
        while queue:
            src, s = queue.pop(0)
            queue += [(s.peer, r) for r in self.states[self.by_id[s.peer]].on_message(src, s.msg, now)]

    def fresh_loads(self, entry: int, now: float) -> None:
        """A variant's knowledge at a decision: its own load now, peers' loads as of the
        last ``load_s`` instant (as if each had just reported: no forwards pending)."""
        var = self.var
        assert var is not None
        st = self.states[entry]
        if var.local_load:
            st.set_local_load(self.engines[entry].load(now, self.costs))
        if var.push:
            for peer, ps in st.peers.items():
                i = self.by_id[peer]
                changed = self.engines[i].last_change(now)
                if ps.load is not None and changed > self.pushed[entry][i]:
                    self.pushed[entry][i] = changed
                    ps.load = self.engines[i].load(changed, self.costs)
        if var.load_s is None:
            return
        due = now if var.load_s <= 0 else math.floor(now / var.load_s) * var.load_s
        if due > self.snap_at:
            self.snapshot = [e.load(due, self.costs) for e in self.engines]
            self.snap_at = due
        if self.applied[entry] < self.snap_at:
            self.applied[entry] = self.snap_at
            for peer, ps in st.peers.items():
                if ps.load is not None:
                    ps.load = dataclasses.replace(self.snapshot[self.by_id[peer]])

    def exact_decide(self, entry: int, job: Job, tokens: Sequence[int]) -> Decision:
        """A variant with ``prefixes="exact"``: the holders are the engines caching the prefix now."""
        var = self.var
        assert var is not None
        st = self.states[entry]
        table = st.table()
        holders = frozenset(self.ids[i] for i, e in enumerate(self.engines)
                            if job.key in e.cache and self.ids[i] in table)
        found = Match(10**6 if holders else 0, holders)
        if var.rule == "ttft":
            return least_ttft(st, tokens, found, job.prefix_len,
                              free_at=self.free_times() if var.ties == "idle" else None)
        return st.count(algorithm2(st.self_id, table, found, tau_c=st.tau_c,
                                   load_threshold=st.config.load_threshold), len(tokens))

    def route(self, job: Job, decide: Policy) -> tuple[int, bool]:
        """``(the engine that serves job, forwarded?)``: its entry decides (``decide``, or the
        variant's exact rule) after the sync rounds due by its arrival and what the variant knows."""
        while self.next_sync <= job.at:
            self.sync(self.next_sync)
            self.next_sync += SYNC_S
        st = self.states[job.entry]
        tokens = self.prefix_of(job.key, job.prefix_len) + _suffix_tokens(job.suffix_seed, job.suffix_len)
        self.deliver(st.self_id, st.observe(tokens, job.at), job.at)
        var = self.var
        if var is not None:
            self.fresh_loads(job.entry, job.at)
        if var is not None and var.prefixes == "exact":
            d = self.exact_decide(job.entry, job, tokens)
        else:
            d = decide(st, tokens)
        return (job.entry if d.target is None else self.by_id[d.target]), d.target is not None


def _policy(policy: str, var: Variant | None, seed: int, group: _Group) -> Policy:
    """How an entry of ``group`` decides under ``policy`` (``var``: its HR-tree variant, if it is one)."""
    if var is not None:
        if (var.rule not in ("alg2", "ttft") or var.prefixes not in ("tree", "tree_queued", "exact")
                or var.ties not in ("self", "idle")):
            raise ValueError(f"unknown variant {var}")
        if var.rule == "alg2":
            return lambda st, tok: st.decide(tok)
        if var.ties == "idle":
            return lambda st, tok: least_ttft(st, tok, free_at=group.free_times())
        return least_ttft
    if policy == "load":
        return least_loaded
    if policy == "no_hrtree":
        return RandomChoice(random.Random(seed))
    if policy == "oracle":
        return least_loaded  # unused: the oracle reads the engines, not the group states
    raise ValueError(f"unknown policy {policy!r}; choose one of {POLICIES} or {tuple(VARIANTS)}")


def play(jobs: Sequence[Job], policy: str, costs: dict[str, Any], *, nodes: int = MODEL_NODES, seed: int = 0,
         config: GroupConfig | None = None, variant: Variant | None = None) -> dict[str, float]:
    """Play ``jobs`` on ``nodes`` model nodes forwarding by ``policy`` (one of :data:`POLICIES`
    or :data:`VARIANTS`); returns the figures. ``variant`` replaces the named HR-tree
    variant's settings (for experiments: ``policy`` is then only a label)."""
    var = variant if variant is not None else VARIANTS.get(policy)
    group = _Group(nodes, config if config is not None else _default_config(jobs, costs), costs, var)
    decide = _policy(policy, var, seed, group)
    ttft: list[float] = []
    latency: list[float] = []
    hits = forwarded = 0
    for job in jobs:
        if policy == "oracle":  # no group state, sync or HR-tree: the engines' exact state now
            server = oracle_choice(group.engines, job, job.at, costs)
            moved = server != job.entry
        else:
            server, moved = group.route(job, decide)
        forwarded += moved
        t, lat, cached = group.engines[server].serve(job, job.at, costs)
        ttft.append(t)
        latency.append(lat)
        hits += 2 * cached >= job.prefix_len + job.suffix_len
    n = max(1, len(jobs))
    return {
        "latency_mean_s": sum(latency) / n, "latency_p99_s": percentile(latency, 0.99),
        "ttft_mean_s": sum(ttft) / n, "ttft_p99_s": percentile(ttft, 0.99),
        "cache_hit_rate": hits / n, "forwarded_frac": forwarded / n, "requests": float(len(jobs)),
    }


def simulate(seed: int, *, workloads: Sequence[str] = ("tooluse", "coding", "longdoc", "mixed"),
             rho: Sequence[float] = RHO, services: float = SERVICES, nodes: int = MODEL_NODES,
             costs: dict[str, Any] | None = None, progress: Progress | None = None,
             policies: Sequence[str] = POLICIES) -> Result:
    """Every workload at every load level ``rho`` under every policy, on the same jobs (same
    seed, arrivals and entries) so that the policies compare pairwise. With ``hrtree`` and
    ``oracle`` among the policies, also ``{w}_rho{r}_{p}_vs_oracle_ttft_{mean,p99}_ratio``: policy
    ``p``'s TTFT over the oracle's."""
    costs = costs or load_costs()
    figures: dict[str, float] = {}
    series: dict[str, Any] = {"rho": list(rho)}
    rates: dict[str, list[float]] = {}
    for w in workloads:
        service = mean_service_s(w, costs)
        rates[w] = [r * nodes / service for r in rho]
        for r, rate in zip(rho, rates[w], strict=True):
            jobs = workload(w, rate, services * service, nodes, seed)
            outs: dict[str, dict[str, float]] = {}
            for p in policies:
                out = outs[p] = play(jobs, p, costs, nodes=nodes, seed=seed)
                for k, v in out.items():
                    figures[f"{w}_rho{r}_{p}_{k}"] = v
                    series.setdefault(w, {}).setdefault(p, {}).setdefault(k, []).append(v)
                if progress is not None:
                    progress.step(f"{w} at {r:.0%} of capacity ({len(jobs)} requests), {p}: mean latency "
                                  f"{out['latency_mean_s']:.1f} s, mean TTFT {out['ttft_mean_s']:.1f} s, "
                                  f"cache hits {out['cache_hit_rate']:.0%}")
            if "oracle" in outs:
                for p in outs:
                    if p == "oracle":
                        continue
                    for stat in ("mean", "p99"):
                        v = _ratio(outs[p][f"ttft_{stat}_s"], outs["oracle"][f"ttft_{stat}_s"])
                        figures[f"{w}_rho{r}_{p}_vs_oracle_ttft_{stat}_ratio"] = v
                        series[w][p].setdefault(f"vs_oracle_ttft_{stat}_ratio", []).append(v)
    params: dict[str, Any] = {
        "model_nodes": nodes, "sync_s": SYNC_S, "duration_mean_services": services, "cache_tokens": CACHE_TOKENS,
        "rho": list(rho), "rates_per_s": rates, "seed": seed, "policies": list(policies),
        "costs": {k: costs[k] for k in ("prefill_s_per_token", "decode_s_per_token", "how") if k in costs},
        "workloads": {k: vars(v) for k, v in WORKLOADS.items()}, "mixed": dict(MIX),
    }
    return Result("forwarding", params, figures, series)


def _ratio(a: float, b: float) -> float:
    """``a / b``; 1 when both are 0 (no wait at all), inf when only ``b`` is."""
    if b > 0:
        return a / b
    return 1.0 if a == 0 else float("inf")


# oracle_ratios: quick is the scale of the full forwarding run (about 50 s on one slow core); the
# full one runs 4 times longer, so more requests per run and less of it with cold caches
ORACLE_QUICK = {"nodes": MODEL_NODES, "services": SERVICES}
ORACLE_FULL = {"nodes": MODEL_NODES, "services": 4 * SERVICES}


# oracle_ratios' labels: the model node's forwarding as ported in issue 29 (pushed loads, queued
# prefixes, least predicted TTFT, idle ties: model_node/forwarding.py least_ttft), the paper's
# Algorithm 2 on 5 s rounds (the model node's rule before it), and load only
_ORACLE_LABELS = {"hrtree_push_queued_ttft_idle": "hrtree", "hrtree": "alg2", "load": "load"}


def oracle_ratios(seed: int = 0, quick: bool = True, *, workloads: Sequence[str] = ("tooluse", "coding", "longdoc",
                                                                                   "mixed"),
                  rho: Sequence[float] = RHO, nodes: int | None = None, services: float | None = None,
                  costs: dict[str, Any] | None = None) -> dict[str, float]:
    """The model nodes' forwarding against the central oracle, per workload and load level, on
    the same jobs, under three labels (:data:`_ORACLE_LABELS`): ``hrtree``, the rule the model node
    runs since issue 29 (policy ``hrtree_push_queued_ttft_idle``); ``alg2``, the paper's Algorithm 2
    on 5 s load rounds that it ran before (policy ``hrtree``); ``load``, load only. Flat figures
    ``forwarding_{label}_vs_oracle_{mean,p99}_ratio_{workload}_rho{r}`` (the policy's mean or p99
    TTFT over the oracle's), the worst of each over all cases
    (``forwarding_hrtree_vs_oracle_mean_ratio_max`` ...), the absolute TTFTs
    (``forwarding_{label,oracle}_ttft_{mean,p99}_s_{workload}_rho{r}``) and the parameters:
    ``forwarding_oracle_nodes``, ``forwarding_oracle_services``, ``forwarding_oracle_seed`` and
    ``forwarding_oracle_requests_{min,max}`` (requests per run). ``quick``: :data:`ORACLE_QUICK`
    (fewer nodes, so fewer requests per run) instead of :data:`ORACLE_FULL`; ``nodes`` and
    ``services`` override either."""
    size = ORACLE_QUICK if quick else ORACLE_FULL
    n = int(nodes if nodes is not None else size["nodes"])
    svc = float(services if services is not None else size["services"])
    res = simulate(seed, workloads=workloads, rho=rho, services=svc, nodes=n, costs=costs,
                   policies=(*_ORACLE_LABELS, "oracle"))
    f = res.figures
    out: dict[str, float] = {}
    requests: list[float] = []
    for w in workloads:
        for r in rho:
            case = f"{w}_rho{r}"
            requests.append(f[f"{case}_oracle_requests"])
            for stat in ("mean", "p99"):
                out[f"forwarding_oracle_ttft_{stat}_s_{case}"] = f[f"{case}_oracle_ttft_{stat}_s"]
            for p, label in _ORACLE_LABELS.items():
                for stat in ("mean", "p99"):
                    out[f"forwarding_{label}_ttft_{stat}_s_{case}"] = f[f"{case}_{p}_ttft_{stat}_s"]
                    out[f"forwarding_{label}_vs_oracle_{stat}_ratio_{case}"] = f[f"{case}_{p}_vs_oracle_ttft_{stat}_ratio"]
    for label in _ORACLE_LABELS.values():
        for stat in ("mean", "p99"):
            ratios = [out[f"forwarding_{label}_vs_oracle_{stat}_ratio_{w}_rho{r}"] for w in workloads for r in rho]
            out[f"forwarding_{label}_vs_oracle_{stat}_ratio_max"] = max(ratios)
    out.update({"forwarding_oracle_nodes": float(n), "forwarding_oracle_services": svc,
                "forwarding_oracle_seed": float(seed), "forwarding_oracle_requests_min": min(requests),
                "forwarding_oracle_requests_max": max(requests)})
    return out


def variant_ratios(seed: int = 0, *, variants: dict[str, Variant] | Sequence[str] = tuple(VARIANTS),
                   workloads: Sequence[str] = ("tooluse", "coding", "longdoc", "mixed"), rho: Sequence[float] = RHO,
                   nodes: int = MODEL_NODES, services: float = SERVICES,
                   costs: dict[str, Any] | None = None) -> dict[str, float]:
    """HR-tree variants against the central oracle on the same jobs (issue 29's experiments):
    ``forwarding_{name}_vs_oracle_{mean,p99}_ratio_{workload}_rho{r}``, their worst over the
    cases (``..._max``) and the oracle's TTFTs (``forwarding_oracle_ttft_{mean,p99}_s_...``).
    ``variants``: names of :data:`VARIANTS`, or ``{name: Variant}`` (e.g. a ``load_s`` sweep)."""
    costs = costs or load_costs()
    chosen = dict(variants) if isinstance(variants, dict) else {n: VARIANTS[n] for n in variants}
    out: dict[str, float] = {}
    for w in workloads:
        service = mean_service_s(w, costs)
        for r in rho:
            case = f"{w}_rho{r}"
            jobs = workload(w, r * nodes / service, services * service, nodes, seed)
            oracle = play(jobs, "oracle", costs, nodes=nodes, seed=seed)
            for stat in ("mean", "p99"):
                out[f"forwarding_oracle_ttft_{stat}_s_{case}"] = oracle[f"ttft_{stat}_s"]
            for name, var in chosen.items():
                got = play(jobs, name, costs, nodes=nodes, seed=seed, variant=var)
                for stat in ("mean", "p99"):
                    out[f"forwarding_{name}_vs_oracle_{stat}_ratio_{case}"] = _ratio(
                        got[f"ttft_{stat}_s"], oracle[f"ttft_{stat}_s"])
    for name in chosen:
        for stat in ("mean", "p99"):
            out[f"forwarding_{name}_vs_oracle_{stat}_ratio_max"] = max(
                out[f"forwarding_{name}_vs_oracle_{stat}_ratio_{w}_rho{r}"] for w in workloads for r in rho)
    return out


def plot(result: Result) -> Any:
    names = [w for w in ("tooluse", "coding", "longdoc", "mixed") if w in result.series]
    fig, axes = new_figure(len(names), 4.0)
    rho = result.series["rho"]
    for ax, w in zip(axes, names, strict=True):
        for i, p in enumerate(result.params.get("policies", POLICIES)):
            s = result.series[w][p]
            ax.plot(rho, s["latency_mean_s"], marker=".", color=f"C{i}", label=f"{p} mean")
            ax.plot(rho, s["latency_p99_s"], marker=".", linestyle="--", color=f"C{i}", label=f"{p} p99")
        ax.set_title(w)
        ax.set_xlabel("load (fraction of uncached capacity)")
        ax.set_yscale("log")
    axes[0].set_ylabel("latency (s)")
    axes[0].legend(fontsize=6)
    return fig


def run(seed: int, quick: bool) -> tuple[Result, Any]:
    kw: dict[str, Any] = {"workloads": ("tooluse",), "rho": (0.6, 0.9), "services": 4.0,
                          "nodes": 10} if quick else {}
    total = len(kw.get("workloads", "1234")) * len(kw.get("rho", RHO)) * len(POLICIES)
    costs = load_costs()
    import sys

    print(f"forwarding: cost constants {costs['prefill_s_per_token'] * 1000:.2f} ms per uncached prompt token, "
          f"{costs['decode_s_per_token'] * 1000:.2f} ms per output token ({costs['how']})", file=sys.stderr)
    result = simulate(seed, costs=costs, progress=Progress("forwarding", total, every=0.0), **kw)
    return result, plot(result)
