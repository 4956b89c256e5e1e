"""``gentorrent bench sida``: clove preparation and recovery (paper §3.2, §5 "overhead").

The paper reports, over 10,000 trials, 0.273 ms mean clove preparation
(P50 0.280, P99 < 0.31 ms, A100 host) and 0.302 ms mean decryption (P50 0.309,
P99 0.334 ms, i7-7700). This bench measures the same two operations with
(n, k) = (4, 3) for messages of 256 B, 4 KiB, 32 KiB and 256 KiB, one thread:

- ``prepare_{S}B_{mean,p50,p99}_ms``: message → n encoded clove payloads
  (:func:`overlay.anon.sida.split` + :func:`~overlay.anon.sida.encode_clove` for all n).
- ``recover_{S}B_{mean,p50,p99}_ms``: k encoded payloads (a uniformly random
  k-subset each trial) → message (:func:`~overlay.anon.sida.decode_clove` ×k +
  :func:`~overlay.anon.sida.recover`).
- ``baseline_prepare_…``, ``baseline_recover_…``: a plain S-IDA with the same
  AEAD and zfec code but pycryptodome's Shamir (GF(2^128)) on the two 16-byte
  halves of K, no fingerprints, the ciphertext zero-padded for zfec, and
  cloves as plain msgpack lists — what one would write without tuning.
- ``aesgcm_seal_…``, ``aesgcm_open_…``: AES-256-GCM alone on the same
  message (``Aead(fresh key)`` built inside the timing, key drawn outside).
- ``{prepare,recover}_{S}B_mean_ratio_vs_baseline`` and ``…_ratio_vs_aesgcm``:
  ours divided by the baseline / by AES-GCM alone, same run.
- ``shamir_{split,combine}_32B_…`` and ``baseline_shamir_…``: the key sharing
  step alone (ours: byte-wise GF(2^8); baseline: pycryptodome on two halves).

Every trial of every variant is interleaved in one loop, so drift in the
machine's speed affects all of them alike.
"""

from __future__ import annotations

import itertools
import os
import random
import sys
import time
from importlib.metadata import version
from typing import Any

import msgpack
import zfec

from gentorrent.bench.stats import cpu_model, summarize_ms
from overlay.anon import gf256
from overlay.anon.sida import decode_clove, encode_clove, recover, split
from overlay.wire.crypto import Aead, random_bytes

SIZES = (256, 4096, 32768, 262144)
N, K = 4, 3
_NONCE = bytes(12)


# --------------------------------------------------------------------------- baseline


def _baseline_prepare(message: bytes, shamir: Any, enc: Any) -> list[bytes]:
    key = random_bytes(32)
    msg_id = random_bytes(16)
    ct = Aead(key).seal(_NONCE, message, msg_id)
    b = -(-len(ct) // K)
    padded = ct + bytes(b * K - len(ct))
    frags = enc.encode([padded[i * b:(i + 1) * b] for i in range(K)])
    lo = shamir.split(K, N, key[:16])
    hi = shamir.split(K, N, key[16:])
    return [
        msgpack.packb([msg_id, i, N, K, len(ct), frags[i], lo[i][1], hi[i][1]], use_bin_type=True)
        for i in range(N)
    ]


def _baseline_recover(payloads: list[bytes], shamir: Any, dec: Any) -> bytes:
    cloves = sorted((msgpack.unpackb(p) for p in payloads), key=lambda c: c[1])
    msg_id, _, _, _, ct_len = cloves[0][:5]
    blocks = dec.decode([c[5] for c in cloves], [c[1] for c in cloves])
    ct = b"".join(blocks)[:ct_len]
    key = shamir.combine([(c[1] + 1, c[6]) for c in cloves]) + shamir.combine(
        [(c[1] + 1, c[7]) for c in cloves]
    )
    return Aead(key).open(_NONCE, ct, msg_id)


# --------------------------------------------------------------------------- timing



def _measure_size(size: int, trials: int, shamir: Any, rnd: random.Random) -> dict[str, float]:
    message = os.urandom(size)
    subsets = list(itertools.combinations(range(N), K))
    enc, dec = zfec.Encoder(K, N), zfec.Decoder(K, N)
    perf = time.perf_counter
    t: dict[str, list[float]] = {
        name: [] for name in ("prepare", "recover", "bprep", "brec", "seal", "open")
    }
    warmup = min(50, trials)
    for trial in range(warmup + trials):
        sub = subsets[rnd.randrange(len(subsets))]

        t0 = perf()
        payloads = [encode_clove(c) for c in split(message, N, K)]
        t1 = perf()
        chosen = [payloads[i] for i in sub]
        t2 = perf()
        out = recover([decode_clove(p) for p in chosen])
        t3 = perf()
        if out != message:
            raise AssertionError("sida recover returned the wrong message")

        t4 = perf()
        bpay = _baseline_prepare(message, shamir, enc)
        t5 = perf()
        bchosen = [bpay[i] for i in sub]
        t6 = perf()
        bout = _baseline_recover(bchosen, shamir, dec)
        t7 = perf()
        if bout != message:
            raise AssertionError("baseline recover returned the wrong message")

        key = random_bytes(32)
        t8 = perf()
        ct = Aead(key).seal(_NONCE, message)
        t9 = perf()
        Aead(key).open(_NONCE, ct)
        t10 = perf()

        if trial >= warmup:
            t["prepare"].append(t1 - t0)
            t["recover"].append(t3 - t2)
            t["bprep"].append(t5 - t4)
            t["brec"].append(t7 - t6)
            t["seal"].append(t9 - t8)
            t["open"].append(t10 - t9)
    s = f"{size}B"
    figures: dict[str, float] = {}
    figures.update(summarize_ms(f"prepare_{s}", t["prepare"]))
    figures.update(summarize_ms(f"recover_{s}", t["recover"]))
    figures.update(summarize_ms(f"baseline_prepare_{s}", t["bprep"]))
    figures.update(summarize_ms(f"baseline_recover_{s}", t["brec"]))
    figures.update(summarize_ms(f"aesgcm_seal_{s}", t["seal"]))
    figures.update(summarize_ms(f"aesgcm_open_{s}", t["open"]))
    for op, base, aes in (("prepare", "baseline_prepare", "aesgcm_seal"), ("recover", "baseline_recover", "aesgcm_open")):
        ours = figures[f"{op}_{s}_mean_ms"]
        figures[f"{op}_{s}_mean_ratio_vs_baseline"] = ours / figures[f"{base}_{s}_mean_ms"]
        figures[f"{op}_{s}_mean_ratio_vs_aesgcm"] = ours / figures[f"{aes}_{s}_mean_ms"]
    return figures


def _measure_shamir(trials: int, shamir: Any) -> dict[str, float]:
    perf = time.perf_counter
    ours_split, ours_comb, base_split, base_comb = [], [], [], []
    for _ in range(trials):
        key = random_bytes(32)
        t0 = perf()
        shares = gf256.split(key, N, K)
        t1 = perf()
        got = gf256.combine([(i + 1, shares[i]) for i in (0, 2, 3)])
        t2 = perf()
        lo = shamir.split(K, N, key[:16])
        hi = shamir.split(K, N, key[16:])
        t3 = perf()
        bgot = shamir.combine([lo[i] for i in (0, 2, 3)]) + shamir.combine([hi[i] for i in (0, 2, 3)])
        t4 = perf()
        if got != key or bgot != key:
            raise AssertionError("Shamir round trip failed")
        ours_split.append(t1 - t0)
        ours_comb.append(t2 - t1)
        base_split.append(t3 - t2)
        base_comb.append(t4 - t3)
    figures: dict[str, float] = {}
    figures.update(summarize_ms("shamir_split_32B", ours_split))
    figures.update(summarize_ms("shamir_combine_32B", ours_comb))
    figures.update(summarize_ms("baseline_shamir_split_32B", base_split))
    figures.update(summarize_ms("baseline_shamir_combine_32B", base_comb))
    return figures


def run(quick: bool) -> tuple[dict[str, Any], dict[str, float]]:
    try:
        from Crypto.Protocol.SecretSharing import Shamir  # test/bench extra, not a runtime dependency
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError("bench sida needs pycryptodome (pip install 'gentorrent[test]')") from exc
    trials = 200 if quick else 10_000
    shamir_trials = 200 if quick else 2_000
    rnd = random.Random(2024)
    figures: dict[str, float] = {}
    for size in SIZES:
        figures.update(_measure_size(size, trials, Shamir, rnd))
    figures.update(_measure_shamir(shamir_trials, Shamir))
    params = {
        "n": N,
        "k": K,
        "sizes_B": list(SIZES),
        "trials_per_size": trials,
        "shamir_trials": shamir_trials,
        "recover_subset": "uniformly random k of n per trial",
        "threads": 1,
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "cryptography": version("cryptography"),
        "zfec": version("zfec"),
        "pycryptodome": version("pycryptodome"),
        "baseline": "pycryptodome Shamir on two 16-byte halves + the same zfec + AES-GCM, "
        "no fingerprints, msgpack lists",
    }
    return params, figures
