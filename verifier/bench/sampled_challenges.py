"""``gentorrent bench sampled-challenges``: could a verifier sample its challenge prompts from its own
model with a secret seed (decision 0030, "Alternatives weighed")? A what-if: nothing of it is built
into the verifier. The claim tested: a model node that holds the same model (and all the code, so
the instructions too) scores each incoming prompt's likelihood under that model and tells the
model's samples from users' prompts.

**The verifier's generator.** The default model (``resolve_model(None)``: SmolLM2-135M-Instruct on
the project's :class:`~model_node.llama.LlamaCppEngine`, :data:`SLOTS` slots, every core, batch
invariant as a model node runs it) answers one of :data:`INSTRUCTIONS` (sample ``i`` takes
instruction ``i mod 3``), sent as the user turn of its chat template: write one message a user
would send to an AI assistant, the message only. Each sample has its own seed: a real verifier
would draw it from :class:`random.SystemRandom`; here sample ``i``'s is :data:`SAMPLE_SEED` + ``i``,
so that runs repeat. No top-p, no top-k, at most :data:`MAX_TOKENS` tokens. Two variants
(:data:`VARIANTS`): temperature 1.0 (suffix ``_t10``), as many samples as users' prompts, and 0.7
(``_t07``), a third as many (scoring is most of the run's time). Texts are stripped of surrounding
whitespace; empty ones are dropped (``sampled_dropped_empty``). The users' prompts are all 346 of
``../shared/data/user-prompts.jsonl`` (quick: :data:`QUICK_USERS` of them, seed
:data:`QUICK_SEED`), the stand-in for users' traffic; no challenge comes from that file.

**The node's detectors**, from teacher-forced passes (:meth:`Engine.score_batch
<model_node.llama.LlamaCppEngine.score_batch>`, log-probabilities at temperature 1; a second engine
without batch invariance, which scoring does not need) over the text's tokens (the stripped text
tokenized alone, the same way for both classes), four passes a text:

- ``loglik_plain``: the mean log-probability of the text as a user turn (the template's tokens
  before a user message's content, system prompt included; no instruction): how a node can score
  any request it is sent;
- ``loglik_instructed``: the text as the model's reply to each public instruction; the highest
  mean log-probability of the three (the node does not know which one was used);
- ``zscore_instructed``: :func:`verifier.audit.scoring.score_reply`'s ``z`` of that reply (at
  temperature 1: how many standard deviations its total log-probability lies from what sampling
  gives), the verifier's own test turned round;
- ``length``: the text's tokens;
- ``combined_loglik``: :class:`~verifier.bench.audit_evasion.Logistic` over the three likelihood
  features (the claim itself: the generator's length is the verifier's choice, not the model's);
- ``combined``: the same over all four.

Each class is split in halves by a seeded shuffle (:data:`SPLIT_SEED`; the users' halves are the
same for both variants): the node fits on the first half and is measured on the second. A single
feature's direction is fixed on the training half (its sign where the training AUC is below ½), so
a test AUC below ½ stays below. ``auc_*``: ROC AUC on the test half of "sampled challenge" against
users' prompts (:func:`~verifier.bench.audit_evasion.auc`, Mann–Whitney; 1: every challenge scores
above every user's prompt, ½: chance). ``auc_best``: the test AUC of the detector with the highest
training AUC; ``tpr_at_fpr5_best``: the share of its test challenges it flags at the threshold
that flags at most 5 % of the test users' prompts. Also the samples' and users' mean lengths and
mean log-probabilities, and the share of samples cut at :data:`MAX_TOKENS`.
"""

from __future__ import annotations

import math
import os
import random
import statistics
import sys
import time
from typing import Any

import numpy as np

from gentorrent.bench.stats import cpu_model
from gentorrent.cli import run_async
from overlay.wire.messages import ChatMessage, SamplingParams
from verifier.bench.audit_evasion import USER_PROMPTS, Logistic, auc, load_user_prompts

INSTRUCTIONS = (
    "Write one message that a user might send to an AI assistant. Reply with the message only.",
    "Write a question or a request that a person could type to a chatbot. Reply with the message only, "
    "nothing else.",
    "You are a user of an AI assistant. Write the next thing you would ask it. Reply with the message only.",
)
VARIANTS = {"t10": (1.0, 1.0), "t07": (0.7, 1 / 3)}  # suffix: (temperature, samples as a share of the users')
MAX_TOKENS = 96
SAMPLE_SEED = 30_000  # sample i's seed: SAMPLE_SEED + i (a real verifier: random.SystemRandom)
SPLIT_SEED = 30
QUICK_USERS = 12
QUICK_SEED = 31
SLOTS = 8
FPR = 0.05
SCORE_PARAMS = SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_tokens=MAX_TOKENS)
FEATURES = ("loglik_plain", "loglik_instructed", "zscore_instructed", "length")
COMBINED = {"combined_loglik": [0, 1, 2], "combined": [0, 1, 2, 3]}  # columns of FEATURES
DETECTORS = (*FEATURES, *COMBINED)


def _log(t0: float, line: str) -> None:
    print(f"bench sampled-challenges: {time.perf_counter() - t0:5.0f} s ({time.process_time():5.0f} s CPU)  {line}",
          file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- the node's evaluation (pure)


def halves(n: int, rng: random.Random) -> tuple[list[int], list[int]]:
    """A seeded shuffle of ``range(n)`` cut in two: ``(train, test)``, the test half the larger."""
    order = list(range(n))
    rng.shuffle(order)
    return sorted(order[:n // 2]), sorted(order[n // 2:])


def tpr_at_fpr(scores: np.ndarray[Any, Any], labels: np.ndarray[Any, Any], fpr: float) -> float:
    """The share of positives (``labels == 1``) scoring above the threshold that flags at most
    ``fpr`` of the negatives (ties at the threshold are not flagged)."""
    neg = np.sort(scores[labels == 0])[::-1]
    k = math.floor(fpr * len(neg))  # negatives allowed above the threshold
    threshold = neg[k] if k < len(neg) else -math.inf
    return float(np.mean(scores[labels == 1] > threshold))


def evaluate(x_train: np.ndarray[Any, Any], y_train: np.ndarray[Any, Any], x_test: np.ndarray[Any, Any],
             y_test: np.ndarray[Any, Any]) -> tuple[dict[str, float], str, float]:
    """The node's detectors (columns :data:`FEATURES`, then :data:`COMBINED`) fitted on the training
    half: ``(test AUC of each, the one best on training, its TPR at FPR 5 % on test)``."""
    train: dict[str, np.ndarray[Any, Any]] = {}
    test: dict[str, np.ndarray[Any, Any]] = {}
    for col, name in enumerate(FEATURES):
        sign = -1.0 if auc(x_train[:, col], y_train) < 0.5 else 1.0  # oriented as training shows
        train[name], test[name] = sign * x_train[:, col], sign * x_test[:, col]
    for name, cols in COMBINED.items():
        model = Logistic(x_train[:, cols], y_train)
        train[name], test[name] = model(x_train[:, cols]), model(x_test[:, cols])
    best = max(DETECTORS, key=lambda d: auc(train[d], y_train))
    return {d: auc(test[d], y_test) for d in DETECTORS}, best, tpr_at_fpr(test[best], y_test, FPR)


# --------------------------------------------------------------------------- the engine


def user_prefix(engine: Any) -> list[int]:
    """The chat template's tokens before a user message's content (the common prefix of two
    one-message prompts; contents are tokenized on their own)."""
    a = engine.chat_prompt([ChatMessage("user", "a")])
    b = engine.chat_prompt([ChatMessage("user", "b")])
    n = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return list(a[:n])


async def _sample(engine: Any, n: int, temperature: float) -> list[tuple[str, int]]:
    """``n`` samples of the verifier's generator: ``(stripped text, tokens generated)``."""
    import trio

    out: list[tuple[str, int]] = [("", 0)] * n

    async def one(i: int) -> None:
        prompt = engine.chat_prompt([ChatMessage("user", INSTRUCTIONS[i % len(INSTRUCTIONS)])])
        params = SamplingParams(temperature=temperature, top_p=1.0, top_k=0, max_tokens=MAX_TOKENS,
                                seed=SAMPLE_SEED + i)
        pieces = [p async for p in engine.generate(prompt, params)]
        out[i] = ("".join(p.text for p in pieces).strip(), sum(len(p.token_ids) for p in pieces))

    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(one, i)
    return out


async def _features(engine: Any, texts: list[str]) -> np.ndarray[Any, Any]:
    """The :data:`FEATURES` of each text, a row each (passes :data:`SLOTS` at a time)."""
    from verifier.audit.scoring import score_reply

    prompts = [user_prefix(engine)] + [engine.chat_prompt([ChatMessage("user", s)]) for s in INSTRUCTIONS]
    items = [(p, engine.tokenize(text), SCORE_PARAMS) for text in texts for p in prompts]
    scores = []
    for i in range(0, len(items), SLOTS):
        scores += [score_reply(s) for s in await engine.score_batch(items[i:i + SLOTS])]
    rows = []
    for k in range(len(texts)):
        plain, *replies = scores[k * len(prompts):(k + 1) * len(prompts)]
        best = max(replies, key=lambda r: r.mean_logprob)
        rows.append((plain.mean_logprob, best.mean_logprob, best.z, float(best.tokens)))
    return np.array(rows, dtype=np.float64)


def _sample_all(n: int) -> dict[str, list[tuple[str, int]]]:
    """Each variant's samples, by the verifier's generator (the engine as a model node runs it:
    batch invariant, so the same seeds give the same texts whatever ran beside them)."""
    from model_node.llama import LlamaCppEngine, resolve_model

    model_id, path = resolve_model(None)
    engine = LlamaCppEngine(path, model_id=model_id, slots=SLOTS)
    try:
        return {v: run_async(_sample, engine, round(n * share), t) for v, (t, share) in VARIANTS.items()}
    finally:
        engine.close()


def run(quick: bool) -> tuple[dict[str, Any], dict[str, float]]:
    """The ``gentorrent.benches`` entry point: ``(params, figures)``."""
    from model_node.llama import LlamaCppEngine, resolve_model

    t0 = time.perf_counter()
    users = [p.strip() for p in load_user_prompts()]
    if quick:
        users = random.Random(QUICK_SEED).sample(users, QUICK_USERS)
    n = len(users)
    samples = _sample_all(n)
    texts = {v: [s for s, _ in got if s] for v, got in samples.items()}
    _log(t0, "sampled " + ", ".join(f"{len(got)} at temperature {VARIANTS[v][0]}" for v, got in samples.items()))
    model_id, path = resolve_model(None)
    # the node's scoring needs no batch invariance: larger physical batches, faster
    engine = LlamaCppEngine(path, model_id=model_id, slots=SLOTS, batch_invariant=False)
    try:
        x_users = run_async(_features, engine, users)
        _log(t0, f"{n} users' prompts scored")
        x_sampled = {}
        for v, kept in texts.items():
            x_sampled[v] = run_async(_features, engine, kept)
            _log(t0, f"{len(kept)} samples ({v}) scored")
    finally:
        engine.close()
    u_train, u_test = halves(n, random.Random(SPLIT_SEED))
    f: dict[str, float] = {
        "users": float(n),
        "user_tokens_mean": float(x_users[:, 3].mean()),
        "user_chars_mean": statistics.fmean(len(s) for s in users),
        "loglik_plain_mean_users": float(x_users[:, 0].mean()),
        "loglik_instructed_mean_users": float(x_users[:, 1].mean()),
    }
    best_of = {}
    for v, x in x_sampled.items():
        s_train, s_test = halves(len(x), random.Random(f"{SPLIT_SEED}-{v}"))
        y_train = np.array([1] * len(s_train) + [0] * len(u_train))
        y_test = np.array([1] * len(s_test) + [0] * len(u_test))
        aucs, best, tpr = evaluate(np.vstack([x[s_train], x_users[u_train]]), y_train,
                                   np.vstack([x[s_test], x_users[u_test]]), y_test)
        best_of[v] = best
        f.update({f"auc_{d}_{v}": a for d, a in aucs.items()})
        f[f"auc_best_{v}"], f[f"tpr_at_fpr5_best_{v}"] = aucs[best], tpr
        f[f"sampled_{v}"] = float(len(samples[v]))
        f[f"sampled_dropped_empty_{v}"] = float(len(samples[v]) - len(x))
        f[f"sampled_truncated_share_{v}"] = sum(k >= MAX_TOKENS for _, k in samples[v]) / len(samples[v])
        f[f"sampled_tokens_mean_{v}"] = float(x[:, 3].mean())
        f[f"sampled_chars_mean_{v}"] = statistics.fmean(len(s) for s in texts[v])
        f[f"loglik_plain_mean_{v}"] = float(x[:, 0].mean())
        f[f"loglik_instructed_mean_{v}"] = float(x[:, 1].mean())
    params = {
        "quick": quick, "model": f"{model_id} ({path.name})",
        "engines": f"LlamaCppEngine, {SLOTS} slots, {len(os.sched_getaffinity(0))} threads: batch invariant to "
                   "sample, not to score",
        "user_prompts": f"{USER_PROMPTS} ({n} prompts{f', drawn with seed {QUICK_SEED}' if quick else ''})",
        "instructions": list(INSTRUCTIONS), "instruction_of_sample": "i mod 3",
        "variants": {v: {"temperature": t, "samples": len(samples[v])} for v, (t, _) in VARIANTS.items()},
        "top_p": 1.0, "top_k": 0, "max_tokens": MAX_TOKENS,
        "sample_seeds": f"{SAMPLE_SEED}+i (a real verifier: random.SystemRandom)",
        "split": f"halves by random.Random({SPLIT_SEED}).shuffle (users) and random.Random('{SPLIT_SEED}-VARIANT') "
                 "(samples); fitted on the first, measured on the second",
        "best_detector": best_of, "fpr": FPR,
        "examples": {v: texts[v][:3] for v in texts},
        "cpu": cpu_model(), "load_avg_1m": os.getloadavg()[0], "elapsed_s": round(time.perf_counter() - t0, 1),
    }
    return params, f
