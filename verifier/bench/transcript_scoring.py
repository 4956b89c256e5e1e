"""``gentorrent bench transcript-scoring``: how much of users' transcripts one verifier thread can
score a round, and what rule 9 of :mod:`verifier.audit.transcripts` (``within_capacity``, decision
0033) does under a flood of sybil donors' transcripts.

Two parts, every one seeded (the same seeds give the same transcripts and rounds):

**1. Throughput of the audit engine** (what sizes :data:`~verifier.audit.transcripts.ROUND_BUDGET`).
A model node's engine (:class:`~model_node.llama.LlamaCppEngine` over the default GGUF,
``resolve_model(None)``, :data:`NODE_SLOTS` slots, one thread) answers ``replies`` user
prompts drawn (seed :data:`PROMPT_SEED`) from ``../shared/data/user-prompts.jsonl``, one user
message each, at the users' default sampling (temperature 0.7, top_p 1, no top-k, up to
:data:`MAX_TOKENS` tokens, seed :data:`REPLY_SEED` + i), and one *long* transcript: prompts of the
file concatenated into one user message of at least :data:`LONG_PROMPT_TOKENS` prompt tokens (the
first of a few seeds whose reply reaches :data:`MAX_TOKENS` tokens, else the longest). The engine is
closed; the verifier's audit engine is built exactly as ``gentorrent verifier --audit`` builds it
(:func:`verifier.audit.loop._engine` with one thread: 4 slots, a 4,096-token window, every reply
evaluated from scratch) and scores each transcript (the opening without the seed, as a transcript
carries none) with :func:`verifier.audit.loop.score_tokens` ``transcript=True``, one at a time
after an untimed first one, timed by ``time.perf_counter`` and this process's CPU time
(``time.process_time``). Figures: ``typical_cost_mean`` (cost units,
:func:`~verifier.audit.transcripts.cost`: reply tokens plus a quarter of the messages' bytes),
``typical_score_s_mean`` / ``typical_score_cpu_s_mean`` (seconds a transcript),
``typical_cost_per_s`` (all their cost ÷ all their wall seconds), ``long_cost``, ``long_score_s``,
``long_score_cpu_s``, ``long_cost_per_s``, and ``round_budget_{typical,long}_s``: ROUND_BUDGET ÷
the cost per second, the seconds one thread takes to score a full round budget of typical or of
long transcripts (an epoch is :data:`EPOCH_S` seconds).

**2. A scoring flood** (no engine; :class:`~verifier.audit.transcripts.Counted` built directly). A
network of :data:`NODES` model nodes; node 0 is a cheater (its transcripts are not flooded). Each
round, every node has :data:`HONEST_PER_NODE` transcripts (the audit-evasion bench's users at
donation rate 0.1), each from a distinct honest donor, each one of part 1's typical transcripts
(drawn uniformly, so their costs are the measured ones). An attacker's ``A`` sybil donors each hand
in :data:`MAX_COMMITS` transcripts of the longest kind (cost :data:`FLOOD_COST`: a 256-token reply to
a prompt that fills the window) over the other nodes, at random, at most :data:`MAX_PER_NODE` a
node. Over ``rounds`` rounds, the round's transcripts go through rule 8
(:func:`~verifier.audit.transcripts.within_budget`), then either nothing more (*old*) or rule 9 as
the audit loop draws it (*new*, :func:`score_round`: the first draw,
:func:`~verifier.audit.transcripts.first_draw` at ROUND_BUDGET, three quarters of it for the first
draw, and the second, :func:`~verifier.audit.transcripts.second_draw`: the suspects' spare
transcripts within the last quarter, a suspect staying one for
:data:`~verifier.audit.transcripts.SUSPECT_EPOCHS` rounds, what they leave to every node's), with the verifier's secret randomness a generator of
its own. The cheater cheats on its users: each of its users' transcripts in the first draw makes it
a suspect with the measured probability ``trigger_share`` (:func:`trigger_share`: the share of the
cheap model's replies, ``simulations/data/audit_scores.json`` at the users' default sampling,
whose transcript alone passes rule 7's threshold for one set); no other transcript does. Figures
per ``A`` (suffix ``_sybils{A}``): ``old_round_cost`` (mean cost scored a round, old rule),
``old_round_s`` (that ÷ ``typical_cost_per_s``: one thread's seconds a round; over EPOCH_S the
backlog grows every epoch), ``new_round_cost_mean``, ``new_round_cost_max`` (over rounds),
``new_round_s_max`` (seconds are at the typical transcripts' rate; the flood's long ones score
slower, so they understate), ``new_cheater_scored_{mean,min}`` (the cheater's transcripts scored a
round, both draws) and ``new_honest_node_scored_mean`` (users' transcripts scored per other node
and round).
**Boosters**: the cheater's own ``B`` donors each hand in :data:`MAX_PER_NODE` typical transcripts of
it beside its users' ones, with the sybil flood of :data:`BOOST_FLOOD` on the other nodes (so that
the budget binds). Suffix ``_boosters{B}``: ``new_cheater_honest_share`` (the users' share of the
cheater's transcripts in the first draw, over all rounds), beside ``cheater_honest_share_counted``
(their share of its counted transcripts) and ``cheater_honest_donor_share`` (their share of its
donors: what the first draw, one transcript a donor before a second of any, keeps);
``cheater_user_sets_scored_mean`` (its users' transcripts scored a round, both draws), and the
share of rounds with at least two of them scored (where rule 7 can cap the cheater), by the first
draw alone (``cheater_two_user_sets_first_share``) and with the second
(``cheater_two_user_sets_share``).
"""

from __future__ import annotations

import os
import random
import statistics
import time
from dataclasses import replace
from typing import Any

from gentorrent.bench.stats import cpu_model
from gentorrent.cli import run_async
from overlay.wire.messages import ChatMessage, SamplingParams
from verifier.audit.transcripts import (
    MAX_COMMITS,
    MAX_PER_NODE,
    ROUND_BUDGET,
    SCORE_BUDGET,
    Counted,
    Transcript,
    cost,
    first_draw,
    remembered,
    second_draw,
    within_budget,
)
from verifier.audit.tx import Opening, ReplyOutcome
from verifier.bench.audit_evasion import USER_PROMPTS, ScoreTable, load_user_prompts

EPOCH_S = 900.0  # a round: one epoch of 900 one-second blocks
# part 1
PROMPT_SEED = 33  # which prompts of the file
REPLY_SEED = 1000  # the model node's sampling seed of reply i (the transcript itself carries none)
MAX_TOKENS = 256
NODE_SLOTS = 8  # a model node's llama.cpp slots (model_node.run.SLOTS; a verifier bench may not import model_node.run)
PARAMS = SamplingParams(temperature=0.7, top_p=1.0, top_k=0, max_tokens=MAX_TOKENS)  # the users' default
LONG_PROMPT_TOKENS = 2200  # the long transcript's prompt (quick: QUICK_LONG_PROMPT_TOKENS)
QUICK_LONG_PROMPT_TOKENS = 600
LONG_SEEDS = 4  # seeds tried for a long reply of MAX_TOKENS tokens
# part 2
FLOOD_SEED = 1
NODES = 32
CHEATER = 0  # the node whose transcripts are not flooded
HONEST_PER_NODE = 15  # honest donors' transcripts per node and round (audit-evasion: ~15 at donation rate 0.1)
FLOOD_COST = 4000  # a sybil's transcript: the longest requests (a 256-token reply after a full window)
SYBILS = (0, 16, 64, 256, 1024)
BOOSTERS = (0, 15, 60)
BOOST_FLOOD = 1024  # sybils flooding the other nodes while the cheater's boosters hand in theirs


# --------------------------------------------------------------------------- part 1: the engine


def _transcript(node: bytes, opening: Opening, text: str, ids: list[int]) -> Transcript:
    """A transcript as a donor reveals it (signature and ids unused here)."""
    return Transcript(node, bytes(16), opening, bytes(16), ReplyOutcome(node, ((text, tuple(ids)),), bytes(64), 1, 0))


async def _generate(engine: Any, text: str, seed: int) -> Transcript:
    messages = (ChatMessage("user", text),)
    pieces = [p async for p in engine.generate(engine.chat_prompt(messages), replace(PARAMS, seed=seed))]
    ids = [t for p in pieces for t in p.token_ids]
    return _transcript(bytes(20), Opening(bytes(16), engine.model, messages, PARAMS), "".join(p.text for p in pieces),
                       ids)


async def _answer(engine: Any, prompts: list[str], long_text: str) -> tuple[list[Transcript], Transcript, int]:
    """The honest node's transcripts: one per prompt, and the long one; with its prompt's tokens."""
    typical = [await _generate(engine, text, REPLY_SEED + i) for i, text in enumerate(prompts)]
    long: Transcript | None = None
    for k in range(LONG_SEEDS):
        t = await _generate(engine, long_text, REPLY_SEED + len(prompts) + k)
        if long is None or len(t.reply.token_ids()) > len(long.reply.token_ids()):
            long = t
        if len(long.reply.token_ids()) >= MAX_TOKENS:
            break
    assert long is not None
    return typical, long, len(engine.chat_prompt(long.opening.messages))


async def _score(engine: Any, transcripts: list[Transcript]) -> list[tuple[float, float]]:
    """``(wall s, CPU s)`` of scoring each transcript as the verifier does, after an untimed first."""
    from verifier.audit.loop import score_tokens

    await score_tokens(engine, transcripts[0].opening, transcripts[0].reply.token_ids(), transcript=True)
    out = []
    for t in transcripts:
        t0, c0 = time.perf_counter(), time.process_time()
        await score_tokens(engine, t.opening, t.reply.token_ids(), transcript=True)
        out.append((time.perf_counter() - t0, time.process_time() - c0))
    return out


def long_prompt(engine: Any, prompts: list[str], tokens: int) -> str:
    """Prompts joined into one user message of at least ``tokens`` prompt tokens."""
    parts: list[str] = []
    for p in prompts:
        parts.append(p)
        text = "\n\n".join(parts)
        if len(engine.chat_prompt([ChatMessage("user", text)])) >= tokens:
            return text
    raise ValueError(f"the prompts hold fewer than {tokens} tokens")


def measure_engine(n: int, long_tokens: int) -> tuple[dict[str, float], dict[str, Any], list[Transcript]]:
    """Part 1: ``(figures, params, the typical transcripts)``."""
    from model_node.llama import LlamaCppEngine, resolve_model
    from verifier.audit.loop import AuditSettings, _engine

    prompts = load_user_prompts()
    rng = random.Random(PROMPT_SEED)
    chosen = rng.sample(prompts, n)
    rest = [p for p in prompts if p not in chosen]
    rng.shuffle(rest)
    model_id, path = resolve_model(None)
    node = LlamaCppEngine(path, model_id=model_id, n_threads=1, slots=NODE_SLOTS)
    try:
        typical, long, long_prompt_tokens = run_async(_answer, node, chosen, long_prompt(node, rest, long_tokens))
    finally:
        node.close()
    audit = _engine(AuditSettings(threads=1))
    window = audit.context_window
    try:
        times = run_async(_score, audit, [*typical, long])
    finally:
        audit.close()
    costs = [cost(t) for t in typical]
    wall, cpu = [w for w, _ in times[:-1]], [c for _, c in times[:-1]]
    long_s, long_cpu = times[-1]
    f = {
        "typical_cost_mean": statistics.fmean(costs),
        "typical_score_s_mean": statistics.fmean(wall),
        "typical_score_cpu_s_mean": statistics.fmean(cpu),
        "typical_cost_per_s": sum(costs) / sum(wall),
        "long_cost": float(cost(long)),
        "long_score_s": long_s,
        "long_score_cpu_s": long_cpu,
        "long_cost_per_s": cost(long) / long_s,
    }
    f["round_budget_typical_s"] = ROUND_BUDGET / f["typical_cost_per_s"]
    f["round_budget_long_s"] = ROUND_BUDGET / f["long_cost_per_s"]
    replies = [len(t.reply.token_ids()) for t in typical]
    params = {
        "model": f"{model_id} ({path.name})",
        "node_engine": f"LlamaCppEngine, {NODE_SLOTS} slots, 1 thread (as `gentorrent model-node` runs it)",
        "audit_engine": "verifier.audit.loop._engine(AuditSettings(threads=1)): 4 slots, n_ctx "
                        f"{window}, score_fresh",
        "replies": n, "prompt_seed": PROMPT_SEED, "reply_seeds": f"{REPLY_SEED}+i",
        "sampling": f"temperature {PARAMS.temperature}, top_p {PARAMS.top_p}, no top-k, max_tokens {MAX_TOKENS}",
        "typical_costs": costs, "typical_reply_tokens_min_max": [min(replies), max(replies)],
        "long_prompt_tokens": long_prompt_tokens, "long_reply_tokens": len(long.reply.token_ids()),
        "cpu": cpu_model(), "load_avg_1m": os.getloadavg()[0],
    }
    return f, params, typical


# --------------------------------------------------------------------------- part 2: the flood


def _node(n: int) -> bytes:
    return n.to_bytes(20, "big")


def _donor(kind: bytes, i: int) -> bytes:
    return kind + i.to_bytes(19, "big")


HONEST, SYBIL, BOOSTER = b"h", b"s", b"b"


def _longest(node: bytes) -> Transcript:
    """A transcript of cost :data:`FLOOD_COST`: a 256-token reply to a prompt of the rest."""
    opening = Opening(bytes(16), "m", (ChatMessage("user", "x" * 4 * (FLOOD_COST - MAX_TOKENS)),), PARAMS)
    return _transcript(node, opening, "", list(range(MAX_TOKENS)))


class Network:
    """The round's counted transcripts of :data:`NODES` nodes (module docstring, part 2)."""

    def __init__(self, typical: list[Transcript]) -> None:
        self.nodes = [_node(n) for n in range(NODES)]
        self.honest = [[replace(t, node_id=n) for t in typical] for n in self.nodes]
        self.flood = {n: _longest(n) for n in self.nodes}
        self.others = [n for n in self.nodes if n != self.nodes[CHEATER]]

    def round(self, rng: random.Random, sybils: int, boosters: int = 0) -> list[Counted]:
        out = [Counted(_donor(HONEST, i * HONEST_PER_NODE + j), n, rng.choice(self.honest[i]))
               for i, n in enumerate(self.nodes) for j in range(HONEST_PER_NODE)]
        cheater = self.nodes[CHEATER]
        out += [Counted(_donor(BOOSTER, b), cheater, rng.choice(self.honest[CHEATER]))
                for b in range(boosters) for _ in range(MAX_PER_NODE)]
        for s in range(sybils):
            out += [Counted(_donor(SYBIL, s), n, self.flood[n]) for n in rng.sample(self.others * MAX_PER_NODE,
                                                                                      MAX_COMMITS)]
        return out


def _cost(counted: list[Counted]) -> int:
    return sum(cost(c.transcript) for c in counted)


def trigger_share(setting: str = "t0.7") -> float:
    """The share of the cheap model's replies (``degraded``: SmolLM2 Q2_K, measured at the users'
    default sampling; audit-evasion's :class:`~verifier.bench.audit_evasion.ScoreTable`) whose
    transcript alone is a suspect's (:func:`~verifier.audit.transcripts.suspects`: one set past rule
    7's threshold for :data:`HONEST_PER_NODE` donors)."""
    from verifier.audit.scoring import donor_threshold, pooled_z

    zs = ScoreTable().transcript_zs[setting]["degraded"]
    t = donor_threshold(HONEST_PER_NODE)
    return sum(pooled_z([z]) > t for z in zs) / len(zs)


def score_round(counted: list[Counted], cheater: bytes, secret: random.Random, trigger: float,
                held: dict[bytes, int], epoch: int) -> tuple[list[Counted], list[Counted], list[Counted]]:
    """A verifier's round ``epoch`` as its audit loop draws it: rule 8, rule 9's first draw, and
    its second draw for the suspects, this round's and those ``held`` from the last rounds
    (:func:`~verifier.audit.transcripts.remembered`), ``(rule 8's kept, the first draw, both
    draws)``. Each of a cheater's users' transcripts in the first draw makes it a suspect with
    probability ``trigger`` (the cheap model's replies that do, :func:`trigger_share`); nothing
    else does (boosters' and the flood's are honest replies)."""
    kept, _ = within_budget(counted, secret)
    first, spare, reserve = first_draw(kept, secret, ROUND_BUDGET)
    hits = sum(c.node_id == cheater and c.donor[:1] == HONEST for c in first)
    fresh = {cheater} if any(secret.random() < trigger for _ in range(hits)) else set()
    suspect = remembered(held, epoch, fresh)
    return kept, first, first + second_draw(spare, suspect, secret, reserve)


def flood(typical: list[Transcript], cost_per_s: float, rounds: int, sybils: tuple[int, ...],
          boosters: tuple[int, ...]) -> dict[str, float]:
    """Part 2's figures."""
    net = Network(typical)
    cheater = net.nodes[CHEATER]
    trigger = trigger_share()
    f: dict[str, float] = {"trigger_share": trigger}
    for a in sybils:
        build, secret = random.Random(f"{FLOOD_SEED}-sybils{a}"), random.Random(f"{FLOOD_SEED}-secret{a}")
        old, new, scored, honest = [], [], [], []
        held: dict[bytes, int] = {}
        for epoch in range(rounds):
            kept, _, chosen = score_round(net.round(build, a), cheater, secret, trigger, held, epoch)
            old.append(_cost(kept))
            new.append(_cost(chosen))
            scored.append(sum(c.node_id == cheater for c in chosen))
            honest.append(sum(c.node_id != cheater and c.donor[:1] == HONEST for c in chosen) / (NODES - 1))
        f[f"old_round_cost_sybils{a}"] = statistics.fmean(old)
        f[f"old_round_s_sybils{a}"] = statistics.fmean(old) / cost_per_s
        f[f"new_round_cost_mean_sybils{a}"] = statistics.fmean(new)
        f[f"new_round_cost_max_sybils{a}"] = float(max(new))
        f[f"new_round_s_max_sybils{a}"] = max(new) / cost_per_s
        f[f"new_cheater_scored_mean_sybils{a}"] = statistics.fmean(scored)
        f[f"new_cheater_scored_min_sybils{a}"] = float(min(scored))
        f[f"new_honest_node_scored_mean_sybils{a}"] = statistics.fmean(honest)
    for b in boosters:
        build, secret = random.Random(f"{FLOOD_SEED}-boosters{b}"), random.Random(f"{FLOOD_SEED}-secret-b{b}")
        counted_honest = counted_all = first_honest = first_all = 0
        users, two, two_first = [], 0, 0
        held_b: dict[bytes, int] = {}
        for epoch in range(rounds):
            counted = net.round(build, BOOST_FLOOD, b)
            _, first, chosen = score_round(counted, cheater, secret, trigger, held_b, epoch)
            mine = [c.donor[:1] == HONEST for c in counted if c.node_id == cheater]
            counted_honest, counted_all = counted_honest + sum(mine), counted_all + len(mine)
            mine = [c.donor[:1] == HONEST for c in first if c.node_id == cheater]
            first_honest, first_all = first_honest + sum(mine), first_all + len(mine)
            two_first += sum(mine) >= 2
            got = sum(c.node_id == cheater and c.donor[:1] == HONEST for c in chosen)
            users.append(got)
            two += got >= 2
        f[f"new_cheater_honest_share_boosters{b}"] = first_honest / first_all
        f[f"cheater_honest_share_counted_boosters{b}"] = counted_honest / counted_all
        f[f"cheater_honest_donor_share_boosters{b}"] = HONEST_PER_NODE / (HONEST_PER_NODE + b)
        f[f"cheater_user_sets_scored_mean_boosters{b}"] = statistics.fmean(users)
        f[f"cheater_two_user_sets_first_share_boosters{b}"] = two_first / rounds
        f[f"cheater_two_user_sets_share_boosters{b}"] = two / rounds
    return f


def run(quick: bool) -> tuple[dict[str, Any], dict[str, float]]:
    """The ``gentorrent.benches`` entry point: ``(params, figures)``."""
    n, long_tokens, rounds = (4, QUICK_LONG_PROMPT_TOKENS, 20) if quick else (24, LONG_PROMPT_TOKENS, 200)
    sybils, boosters = ((0, 64), (0, 15)) if quick else (SYBILS, BOOSTERS)
    figures, engine_params, typical = measure_engine(n, long_tokens)
    figures.update(flood(typical, figures["typical_cost_per_s"], rounds, sybils, boosters))
    params = {
        "quick": quick, **engine_params, "user_prompts": str(USER_PROMPTS),
        "round_budget": ROUND_BUDGET, "score_budget": SCORE_BUDGET, "epoch_s": EPOCH_S,
        "nodes": NODES, "cheater": CHEATER, "honest_per_node": HONEST_PER_NODE, "flood_cost": FLOOD_COST,
        "sybil_transcripts": MAX_COMMITS, "max_per_node": MAX_PER_NODE, "sybils": list(sybils),
        "boosters": list(boosters), "booster_transcripts": MAX_PER_NODE, "boost_flood_sybils": BOOST_FLOOD,
        "rounds": rounds, "flood_seed": FLOOD_SEED,
    }
    return params, figures
