"""The forwarding simulation's central oracle (issue 29): it reads every engine's exact cache and
queue, sends each request where its predicted TTFT is least, and HR-tree forwarding is reported
as a ratio to it."""

import math
import random

import pytest

from simulations import forwarding
from simulations.forwarding import Job, _Engine, oracle_choice

COSTS = {"prefill_s_per_token": 0.001, "decode_s_per_token": 0.01}
A, B = ("tooluse", 0), ("tooluse", 1)


def _job(at: float, key: tuple[str, int], prefix: int = 1000, suffix: int = 100, output: int = 100,
         entry: int = 0) -> Job:
    return Job(at, entry, key, prefix, 7, suffix, output)


def _engines(n: int) -> list[_Engine]:
    return [_Engine() for _ in range(n)]


def test_oracle_sends_to_the_idle_node_holding_the_prefix() -> None:
    engines = _engines(3)
    engines[1].serve(_job(0.0, A), 0.0, COSTS)  # node 1 now holds A, done at 0.1 + 1.1 = 2.1 s
    later = _job(10.0, A)  # every node idle again
    assert oracle_choice(engines, later, 10.0, COSTS) == 1
    assert engines[1].predict_ttft(later, 10.0, COSTS) == pytest.approx(0.1)  # only the suffix
    assert engines[0].predict_ttft(later, 10.0, COSTS) == pytest.approx(1.1)


def test_oracle_weighs_the_holders_queue_against_the_prefill_it_saves() -> None:
    engines = _engines(2)
    engines[0].serve(_job(0.0, A), 0.0, COSTS)  # node 0 holds A, busy until 2.1 s
    # at 1.5 s: node 0 would start at 2.1 (wait 0.6) + 0.1 prefill = 0.7 s; node 1: 1.1 s of prefill
    assert oracle_choice(engines, _job(1.5, A), 1.5, COSTS) == 0
    # queue more work on node 0 (until 2.1 + 1.1 + 1.0 = 4.2 s): now waiting for it costs 2.6 s
    engines[0].serve(_job(1.6, B), 1.6, COSTS)
    assert oracle_choice(engines, _job(1.7, A), 1.7, COSTS) == 1


def test_oracle_sends_to_the_least_loaded_node_when_no_cache_helps() -> None:
    engines = _engines(3)
    engines[0].serve(_job(0.0, A, output=300), 0.0, COSTS)  # busy until 4.1 s
    engines[1].serve(_job(0.0, B, output=100), 0.0, COSTS)  # until 2.1 s
    engines[2].serve(_job(0.0, ("coding", 5), output=200), 0.0, COSTS)  # until 3.1 s
    assert oracle_choice(engines, _job(1.0, ("coding", 9)), 1.0, COSTS) == 1
    # ties (every node idle, nothing cached): the one free the longest, then the lowest index
    assert oracle_choice(engines, _job(9.0, ("coding", 9)), 9.0, COSTS) == 1
    assert oracle_choice(_engines(3), _job(0.0, A), 0.0, COSTS) == 0


def test_oracle_prediction_is_what_the_engine_then_serves() -> None:
    rng = random.Random(3)
    engines = _engines(4)
    t = 0.0
    for i in range(200):
        t += rng.expovariate(2.0)
        job = _job(t, ("tooluse", rng.randrange(6)), prefix=rng.randrange(200, 2000), output=rng.randrange(10, 300))
        best = oracle_choice(engines, job, t, COSTS)
        predicted = [e.predict_ttft(job, t, COSTS) for e in engines]
        assert predicted[best] == min(predicted)
        ttft, _, _ = engines[best].serve(job, t, COSTS)
        assert ttft == pytest.approx(predicted[best]), i


def _mean_ttft(jobs: list[Job], nodes: int, choose: object) -> float:
    engines = _engines(nodes)
    total = 0.0
    for i, job in enumerate(jobs):
        server = oracle_choice(engines, job, job.at, COSTS) if choose == "oracle" else i % nodes
        total += engines[server].serve(job, job.at, COSTS)[0]
    return total / len(jobs)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_oracle_is_no_worse_than_random_or_round_robin(seed: int) -> None:
    jobs = forwarding.workload("tooluse", 0.5, 200.0, 6, seed)
    oracle = forwarding.play(jobs, "oracle", COSTS, nodes=6, seed=seed)
    assert oracle == forwarding.play(jobs, "oracle", COSTS, nodes=6, seed=seed)  # deterministic
    assert oracle["requests"] == len(jobs)
    assert oracle["ttft_mean_s"] <= forwarding.play(jobs, "no_hrtree", COSTS, nodes=6, seed=seed)["ttft_mean_s"]
    assert _mean_ttft(jobs, 6, "oracle") == pytest.approx(oracle["ttft_mean_s"])
    assert oracle["ttft_mean_s"] <= _mean_ttft(jobs, 6, "round robin")
    assert oracle["cache_hit_rate"] > 0


def test_simulate_reports_each_policy_over_the_oracle() -> None:
    res = forwarding.simulate(1, workloads=("coding",), rho=(0.9,), services=2.0, nodes=5, costs=COSTS,
                              policies=("hrtree", "oracle"))
    f = res.figures
    assert f["coding_rho0.9_hrtree_vs_oracle_ttft_mean_ratio"] == pytest.approx(
        f["coding_rho0.9_hrtree_ttft_mean_s"] / f["coding_rho0.9_oracle_ttft_mean_s"])
    assert f["coding_rho0.9_hrtree_vs_oracle_ttft_p99_ratio"] == pytest.approx(
        f["coding_rho0.9_hrtree_ttft_p99_s"] / f["coding_rho0.9_oracle_ttft_p99_s"])
    assert f["coding_rho0.9_hrtree_requests"] == f["coding_rho0.9_oracle_requests"]  # the same jobs
    assert res.series["coding"]["hrtree"]["vs_oracle_ttft_mean_ratio"] == [
        f["coding_rho0.9_hrtree_vs_oracle_ttft_mean_ratio"]]
    assert "oracle" in forwarding.POLICIES
    assert forwarding.plot(res) is not None


def test_oracle_ratios_are_finite_for_every_workload_and_load() -> None:
    out = forwarding.oracle_ratios(seed=2, quick=True, nodes=5, services=2.0, costs=COSTS)
    assert out == forwarding.oracle_ratios(seed=2, quick=True, nodes=5, services=2.0, costs=COSTS)
    workloads, rho = ("tooluse", "coding", "longdoc", "mixed"), forwarding.RHO
    for p in ("hrtree", "alg2", "load"):  # the ported rule, the paper's before it, load only
        for stat in ("mean", "p99"):
            cases = [out[f"forwarding_{p}_vs_oracle_{stat}_ratio_{w}_rho{r}"] for w in workloads for r in rho]
            assert all(math.isfinite(x) and x > 0 for x in cases)
            assert out[f"forwarding_{p}_vs_oracle_{stat}_ratio_max"] == max(cases)
    case = "tooluse_rho0.6"
    assert out[f"forwarding_hrtree_vs_oracle_mean_ratio_{case}"] == pytest.approx(
        out[f"forwarding_hrtree_ttft_mean_s_{case}"] / out[f"forwarding_oracle_ttft_mean_s_{case}"])
    assert out["forwarding_oracle_nodes"] == 5.0
    assert 0 < out["forwarding_oracle_requests_min"] <= out["forwarding_oracle_requests_max"]
    assert all(math.isfinite(v) for v in out.values())
