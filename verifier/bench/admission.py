"""``gentorrent bench admission``: what admission, fresh lists and connection slots cost a cheap
attacker and an honest node (issue 28 "Benchmark"; decision 0014; docs/benchmarks.md "admission").

**Registration work.** The cost of one scrypt trial at the genesis default (:mod:`overlay.directory.work`,
``n = 2**14``) is measured here, on this machine, and so is the CPU time of real solves at the
default difficulty (the honest node's one-off cost: its mean is ``2**work_bits`` trials). The
attacker owns this machine's cores (:data:`ATTACKER_CORES`) and as many addresses as it likes
(the caps per IP and prefix do not bind it): the registrations it gets listed in an hour is the
largest ``k`` whose work, ``sum(2**required_bits(params, i) for i < k)`` trials at the measured
cost (:func:`verifier.admission.required_bits`, the chain's own rule), fits in
``ATTACKER_CORES * 3600`` CPU seconds, counting no honest registration in the window (which would
only raise its price). The chain's rule is run through the real committee core, with scrypt made
cheap, to check the required bits of that many registrations in one block time window.
With one /24 (or /48) the attacker is capped outright: ``per_prefix`` listed nodes, measured
through the core the same way.

**Lists, slots, builds.** The figures of :func:`verifier.bench.admission_lists.measure_list_refresh`
(a refresh by signed delta with 10,000 users and 1 % churn against a full fetch),
:func:`~verifier.bench.admission_lists.measure_replay_stale` (how long a replayed old list keeps a
client stale), :func:`gentorrent.bench.admission_slots.measure_slot_flood` (honest handshakes while
one address holds every connection it can open, real TLS on loopback) and
:func:`gentorrent.bench.admission_builds.measure_refused_builds` (refused path builds of a joining
user), each documented in its module.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

from overlay.directory import registration as tx
from overlay.directory import work
from overlay.wire import crypto
from overlay.wire.constants import ROLE_USER
from verifier import admission
from verifier.admission import AdmissionParams

ATTACKER_CORES = 2
HOUR_S = 3600
CHAIN = "gt-bench-admission"


def trial_ms(params: AdmissionParams, trials: int) -> float:
    """Mean wall time of one scrypt trial (``trials`` of them, one core)."""
    key = crypto.SigningKey.generate().public_bytes
    start = time.perf_counter()
    for i in range(trials):
        work.bits_of(CHAIN, key, i.to_bytes(16, "big"), params.work_n_log2)
    return (time.perf_counter() - start) / trials * 1000


def honest_solves(params: AdmissionParams, runs: int) -> list[float]:
    """CPU seconds of ``runs`` real solves at the normal difficulty (fresh keys)."""
    out = []
    for _ in range(runs):
        key = crypto.SigningKey.generate().public_bytes
        start = time.process_time()
        got = work.solve(CHAIN, key, params.work_bits, params.work_n_log2)
        assert got is not None
        out.append(time.process_time() - start)
    return out


def attacker_per_hour(params: AdmissionParams, trial_s: float, cores: int = ATTACKER_CORES) -> int:
    """Registrations whose work fits in ``cores`` hours of CPU at ``trial_s`` a trial."""
    budget = cores * HOUR_S / trial_s  # trials
    k = 0
    while True:
        cost = 2 ** admission.required_bits(params, k)
        if cost > budget:
            return k
        budget -= cost
        k += 1


def chain_bits(params: AdmissionParams, count: int) -> list[int]:
    """The bits the real committee core asked of ``count`` registrations in one hour (scrypt made
    cheap, the rest of the rules as ``params``; addresses in distinct /24s)."""
    from verifier.app import CommitteeApp, Validator

    cheap = AdmissionParams(**{**params.to_json(), "work_n_log2": 1, "probe": False})
    keys = [crypto.SigningKey.generate() for _ in range(4)]
    app = CommitteeApp()
    app.init_chain(CHAIN, [Validator("ed25519", k.public_bytes, 10) for k in keys],
                   json.dumps({"admission": cheap.to_json()}).encode())
    asked = []
    for i in range(count):
        st = app.committed
        bits = admission.required_bits(st.admission, len(st.paid))
        asked.append(bits)
        key = crypto.SigningKey.generate()
        got = work.solve(CHAIN, key.public_bytes, bits, cheap.work_n_log2)
        assert got is not None
        entry = tx.Entry(ROLE_USER, crypto.X25519Key.generate().public_bytes,
                         f"{8 + i // 250}.{i % 250}.1.1:9000", "r")
        raw = tx.make_tx(key, CHAIN, tx.OP_REGISTER, 1, entry, work=got[0])
        results, _ = app.finalize_block(app.height + 1, 1_700_000_000 + i, [raw])
        app.commit()
        assert results[0].ok, results[0]
    return asked


def prefix_cap(params: AdmissionParams) -> int:
    """Nodes one /24 gets listed through the real core (registrations refused after)."""
    from verifier.app import CommitteeApp, Validator

    cheap = AdmissionParams(**{**params.to_json(), "work_bits": 0, "probe": False})
    app = CommitteeApp()
    app.init_chain(CHAIN, [Validator("ed25519", crypto.SigningKey.generate().public_bytes, 10)],
                   json.dumps({"admission": cheap.to_json()}).encode())
    listed = 0
    for i in range(4 * max(1, params.per_prefix)):
        key = crypto.SigningKey.generate()
        entry = tx.Entry(ROLE_USER, crypto.X25519Key.generate().public_bytes, f"8.8.8.{i % 250}:{9000 + i}", "r")
        results, _ = app.finalize_block(app.height + 1, 1_700_000_000 + i,
                                        [tx.make_tx(key, CHAIN, tx.OP_REGISTER, 1, entry)])
        app.commit()
        listed += results[0].ok
    return listed


def run(quick: bool) -> tuple[dict[str, Any], dict[str, float]]:
    from gentorrent.bench.admission_builds import measure_refused_builds
    from gentorrent.bench.admission_slots import measure_slot_flood
    from verifier.bench.admission_lists import measure_list_refresh, measure_replay_stale

    params = AdmissionParams()
    t_ms = trial_ms(params, 5 if quick else 40)
    solves = honest_solves(params, 2 if quick else 8)
    per_hour = attacker_per_hour(params, t_ms / 1000)
    asked = chain_bits(params, min(per_hour, 30 if quick else per_hour))
    assert asked == [admission.required_bits(params, i) for i in range(len(asked))]
    figures: dict[str, float] = {
        "work_trial_ms": t_ms,
        "honest_register_cpu_s_mean": statistics.fmean(solves),
        "honest_register_cpu_s_expected": 2 ** params.work_bits * t_ms / 1000,
        "honest_register_cpu_s_max": max(solves),
        "attacker_listed_per_hour_count": per_hour,
        "attacker_last_register_cpu_s": 2 ** admission.required_bits(params, per_hour - 1) * t_ms / 1000,
        "attacker_listed_one_prefix_count": prefix_cap(params),
        "verifier_check_register_ms": t_ms,
    }
    for measure in (measure_list_refresh, measure_replay_stale, measure_slot_flood, measure_refused_builds):
        figures.update(measure(quick))
    bench_params = {"admission": params.to_json(), "attacker_cores": ATTACKER_CORES, "honest_solves": len(solves),
                    "quick": quick}
    return bench_params, figures
