"""``gentorrent bench escrow``: what weighted Feldman VSS of a transcript nonce costs each side
(decision 0037; code in :mod:`overlay.directory.escrow`).

For each committee of :data:`CASES` (4, 16 and 64 validators of equal power, and 16 where one holds
30 % of the power), one thread, medians over the repetitions (a fresh secret and deal each):

- ``{case}_holders_count``, ``_units_count``, ``_threshold_count``: the plan
  (:func:`~overlay.directory.escrow.plan`, its default units: the first of 32, 64, ... with which
  every coalition above a third of the power holds the threshold). 64 validators take 64 units
  (one each: with 32, half would get none); the skewed 16 take 64 too (with 32, the big one and
  one small one, above a third, would hold 11 < 15).
- ``{case}_commitments_bytes``: the encoded commitments (public, ``t`` points);
  ``{case}_largest_holder_shares_count`` / ``_bytes``: the largest holder's shares, encoded.
- ``{case}_plan_p50_ms``: the plan, from the powers (once per validator set).
- ``{case}_deal_p50_ms`` (donor): a deal of a fresh secret and the encoding of the commitments and
  every holder's shares.
- ``{case}_verify_p50_ms`` (a verifier, per commit): the largest holder decodes the commitments and
  its shares and checks them (:func:`~overlay.directory.escrow.verify_holder`: one batch check);
  ``{case}_verify_each_p50_ms``: the same, the shares checked one by one
  (:func:`~overlay.directory.escrow.verify_share`), for comparison.
- ``{case}_recover_p50_ms`` (a node): decode the commitments and every holder's shares, rebuild
  the secret (:func:`~overlay.directory.escrow.recover`: the first ``t`` shares open ``C_0``);
  ``{case}_recover_one_forged_p50_ms``: the same with one forged share first, which makes
  recover verify shares one by one until ``t`` pass.

And ``node_match_p50_ms``: what finding one released commitment among the :data:`STORED`
requests a node stored costs it, through :meth:`model_node.served.ServedStore.find`: by the
locator the rebuilt secret carries (decision 0038), one lookup and the commitment of the few
entries of that locator. Beside it the baseline, ``node_match_scan_p50_ms``: decision 0037's
match without a locator, the commitment (:func:`overlay.directory.transcripts.commitment`) of the
rebuilt nonce, the node's id and each stored request digest, the match last; and
``node_match_scan_ratio``, the one over the other. The store is kept on disk, as a node runs it
(:class:`model_node.served_log.ServedLog` in a temporary directory: the lookup includes reading
the entry back), and ``node_store_index_bytes_per_entry`` is the memory each stored entry took
while storing them (tracemalloc): what the store counts of its memory cap per entry on disk.

And what keeping costs the node's serving thread (:meth:`model_node.served.ServedStore.keep`, called
as each reply's last chunk passes: encode, compress, append to the file; timed apart from the
above, without tracemalloc): ``node_keep_p50_ms`` for :data:`SHORT_KEEPS` short requests like
those above, and ``node_keep_window_p50_ms`` for a request whose prompt fills a
4,096-token window with long tokens (a store-flushing framer's cheapest bytes, decision 0038):
each drawn at random from :data:`LONG_TOKENS` strings of 16 to 32 random letters, as many as
SmolLM2's vocabulary holds of that length; :data:`WINDOW_KEEPS` of them, each
``node_keep_window_prompt_bytes`` long and ``node_keep_window_disk_bytes`` on disk;
``node_keep_window_per_s``, how many such a serving thread could keep a second at most (1 / mean).
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time
from importlib.metadata import version
from typing import Any

from gentorrent.bench.stats import cpu_model
from overlay.directory import escrow
from overlay.directory.transcripts import commitment, escrowed_secret

# name: (powers, units)
CASES: dict[str, list[int]] = {
    "eq4": [1] * 4,
    "eq16": [1] * 16,
    "eq64": [1] * 64,
    "skew16": [450] + [70] * 15,  # one holds 30 % of the power
}
STORED = 100_000  # requests a node stored (45 minutes at about 37 a second)
SHORT_KEEPS = 10_000  # short requests kept for node_keep_p50_ms
WINDOW_KEEPS = 400  # full-window requests kept for node_keep_window_*
WINDOW_TOKENS = 4_096  # llama.cpp's default context: the longest prompt a node serves by default
LONG_TOKENS = 196  # SmolLM2's tokens of 16 to 32 bytes (decision 0038)
FIGURES = ("holders_count", "units_count", "threshold_count", "commitments_bytes", "largest_holder_shares_count",
           "largest_holder_shares_bytes", "plan_p50_ms", "deal_p50_ms", "verify_p50_ms", "verify_each_p50_ms",
           "recover_p50_ms", "recover_one_forged_p50_ms")
REPS, QUICK_REPS = 200, 5


def _ms(samples: list[float]) -> float:
    return 1000 * statistics.median(samples)


def _case(powers: list[int], reps: int) -> dict[str, float]:
    perf = time.perf_counter
    t: dict[str, list[float]] = {k: [] for k in ("plan", "deal", "verify", "each", "recover", "forged")}
    for _ in range(reps):
        t0 = perf()
        p = escrow.plan(powers)
        t1 = perf()
        secret = escrow.new_secret()
        d = escrow.deal(secret, p)
        raw_c = escrow.encode_commitments(d.commitments)
        raw_s = [escrow.encode_shares(h) for h in d.shares]
        t2 = perf()
        big = max(range(len(p.counts)), key=lambda i: (p.counts[i], -i))
        cs = escrow.decode_commitments(raw_c, p.threshold)
        mine = escrow.decode_shares(raw_s[big], p.counts[big])
        ok = escrow.verify_holder(p, big, cs, mine)
        t3 = perf()
        cs = escrow.decode_commitments(raw_c, p.threshold)
        ok_each = all(escrow.verify_share(cs, s) for s in escrow.decode_shares(raw_s[big], p.counts[big]))
        t4 = perf()
        got = escrow.recover(escrow.decode_commitments(raw_c, p.threshold),
                             [s for raw, n in zip(raw_s, p.counts, strict=True) for s in escrow.decode_shares(raw, n)])
        t5 = perf()
        forged = escrow.Share(1, (d.shares[0][0].y + 1) % escrow.L)
        got_forged = escrow.recover(escrow.decode_commitments(raw_c, p.threshold),
                                    [forged, *(s for raw, n in zip(raw_s, p.counts, strict=True)
                                               for s in escrow.decode_shares(raw, n))])
        t6 = perf()
        if not (ok and ok_each and got == secret == got_forged):
            raise AssertionError("escrow: a deal did not verify or recover")
        for k, a, b in (("plan", t0, t1), ("deal", t1, t2), ("verify", t2, t3), ("each", t3, t4),
                        ("recover", t4, t5), ("forged", t5, t6)):
            t[k].append(b - a)
    return {
        "holders_count": len(powers),
        "units_count": p.units,
        "threshold_count": p.threshold,
        "commitments_bytes": len(raw_c),
        "largest_holder_shares_count": p.counts[big],
        "largest_holder_shares_bytes": len(raw_s[big]),
        "plan_p50_ms": _ms(t["plan"]),
        "deal_p50_ms": _ms(t["deal"]),
        "verify_p50_ms": _ms(t["verify"]),
        "verify_each_p50_ms": _ms(t["each"]),
        "recover_p50_ms": _ms(t["recover"]),
        "recover_one_forged_p50_ms": _ms(t["forged"]),
    }


def _keeps(quick: bool) -> dict[str, float]:
    """The ``node_keep_*`` figures: median ms of one :meth:`~model_node.served.ServedStore.keep` of
    a short request, and of a full-window request of long tokens with its prompt's bytes, the bytes
    it takes on disk and keeps a second (1 / mean)."""
    import tempfile

    from model_node.served import Kept, ServedStore
    from model_node.served_log import ServedLog
    from overlay.wire.messages import ChatMessage, SamplingParams

    rng = random.Random(11)
    node = rng.randbytes(20)
    letters = "abcdefghijklmnopqrstuvwxyz"
    params = SamplingParams(0.7, 1.0, 0, 256, None)
    vocabulary = ["".join(rng.choices(letters, k=rng.randint(16, 32))) for _ in range(LONG_TOKENS)]
    short: list[float] = []
    took: list[float] = []
    size = 0
    with tempfile.TemporaryDirectory() as tmp:
        store = ServedStore(log=ServedLog(tmp), retention_ms=2**40)
        shorts = SHORT_KEEPS // 10 if quick else SHORT_KEEPS
        for i in range(shorts):  # as node match keeps them
            kept = Kept(node, rng.randbytes(32), "m", (ChatMessage("user", "what is a quine?"),), params,
                        rng.randbytes(16), node, (("a program", (1, 2)),), bytes(64), i, 600)
            t0 = time.perf_counter()
            store.keep(kept, i)
            short.append(time.perf_counter() - t0)
        short_disk = store.disk_bytes
        for i in range(WINDOW_KEEPS // 10 if quick else WINDOW_KEEPS):
            prompt = "".join(rng.choices(vocabulary, k=WINDOW_TOKENS))
            size += len(prompt)
            reply = (("a short answer", (1, 2, 3)),)
            kept = Kept(node, rng.randbytes(32), "m", (ChatMessage("user", prompt),), params, rng.randbytes(16), node,
                        reply, bytes(64), shorts + i, len(prompt) + 200)
            t0 = time.perf_counter()
            store.keep(kept, shorts + i)
            took.append(time.perf_counter() - t0)
        if len(store) != len(short) + len(took):
            raise AssertionError("escrow: a request was not kept")
        disk = (store.disk_bytes - short_disk) / len(took)
    return {"node_keep_p50_ms": _ms(short), "node_keep_window_p50_ms": _ms(took),
            "node_keep_window_prompt_bytes": round(size / len(took)), "node_keep_window_disk_bytes": round(disk),
            "node_keep_window_per_s": round(len(took) / sum(took))}


def _match(reps: int) -> tuple[float, float, float]:
    """Median ms to find one commitment among :data:`STORED` stored requests: through the store's
    locator index and read back from its file, as a node runs it, and by a hash per stored digest
    (the match last); and the bytes of memory an entry on disk takes (tracemalloc, while storing)."""
    import tempfile
    import tracemalloc

    from model_node.served import Kept, ServedStore
    from model_node.served_log import ServedLog
    from overlay.wire.messages import ChatMessage, SamplingParams

    rng = random.Random(7)
    node = rng.randbytes(20)
    msgs, params = (ChatMessage("user", "what is a quine?"),), SamplingParams(0.7, 1.0, 0, 64, None)
    digests = [rng.randbytes(32) for _ in range(STORED)]
    with tempfile.TemporaryDirectory() as tmp:
        store = ServedStore(log=ServedLog(tmp), retention_ms=2**40)
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for i, d in enumerate(digests):
                store.keep(Kept(node, d, "m", msgs, params, rng.randbytes(16), node, (("a program", (1, 2)),),
                                bytes(64), i, 600), i)
            index_bytes = (tracemalloc.get_traced_memory()[0] - before) / STORED
        finally:
            tracemalloc.stop()
        secret = escrowed_secret(digests[-1], rng)
        nonce = escrow.nonce_of(secret)
        wanted = commitment(nonce, node, digests[-1])
        looked, scanned = [], []
        for _ in range(max(3, reps // 20)):
            t0 = time.perf_counter()
            kept = store.find(secret, wanted)
            t1 = time.perf_counter()
            found = next(d for d in digests if commitment(nonce, node, d) == wanted)
            t2 = time.perf_counter()
            looked.append(t1 - t0)
            scanned.append(t2 - t1)
            if kept is None or kept.digest != found or found != digests[-1] or len(store) != STORED:
                raise AssertionError("escrow: the stored request was not found")
    return _ms(looked), _ms(scanned), index_bytes


def run(quick: bool) -> tuple[dict[str, Any], dict[str, float]]:
    reps = QUICK_REPS if quick else REPS
    figures: dict[str, float] = {}
    for name, powers in CASES.items():
        figures.update({f"{name}_{k}": v for k, v in _case(powers, reps).items()})
    looked, scanned, index_bytes = _match(reps)
    figures["node_match_p50_ms"], figures["node_match_scan_p50_ms"] = looked, scanned
    figures["node_store_index_bytes_per_entry"] = round(index_bytes)
    figures["node_match_scan_ratio"] = round(scanned / looked, 1) if looked else 0.0
    figures.update(_keeps(quick))
    params = {
        "quick": quick,
        "reps": reps,
        "cases": {name: {"holders": len(powers),
                         "powers": {str(v): powers.count(v) for v in sorted(set(powers), reverse=True)}}
                  for name, powers in CASES.items()},
        "node_match_stored": STORED,
        "node_keep_window": {"keeps": WINDOW_KEEPS // 10 if quick else WINDOW_KEEPS, "tokens": WINDOW_TOKENS,
                             "vocabulary": LONG_TOKENS, "token_letters": [16, 32]},
        "statistic": "median over reps (fresh secret and deal each)",
        "threads": 1,
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "pynacl": version("pynacl"),
    }
    return params, figures
