"""The wide-area testbed's pure parts: the dial rewrite (overlay.net.transport.Via), the address plan,
the churn schedule, the links each listener gets, and the propagation floor of a request."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from gentorrent.bench.testbed_run import Sample, request_floor_ms, summarize_samples
from gentorrent.tools import regions as geo
from gentorrent.tools import testbed as tb
from gentorrent.tools.testbed import (
    ChurnEvent,
    _set_line,
    churn_schedule,
    node_host,
    proxy_host,
    via_rule,
)
from overlay.net.transport import Via


def test_via_rewrites_only_addresses_its_rules_name_and_keeps_the_port() -> None:
    via = Via.parse("127.1.0.0/16=127.13.0.0/16, 10.0.0.0/8=127.0.0.0/8")
    assert via("127.1.2.3:9000") == "127.13.2.3:9000"
    assert via("10.1.2.3:1") == "127.1.2.3:1"  # rules apply once: no chaining
    for untouched in ("127.0.0.1:5", "[::1]:4", "192.0.2.1:80"):
        assert via(untouched) == untouched
    assert Via.parse("")("127.1.0.1:7") == "127.1.0.1:7"


@pytest.mark.parametrize("bad", ["127.1.0.0/16", "127.1.0.0/16=127.2.0.0/8", "x=y", "127.1.0.5/16=127.2.0.0/16"])
def test_via_refuses_rules_it_cannot_apply_and_says_which(bad: str) -> None:
    with pytest.raises(ValueError, match="GENTORRENT_VIA"):
        Via.parse(bad)


def test_via_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENTORRENT_VIA", via_rule(3))
    assert Via.from_env()(f"{node_host(7)}:1") == f"{proxy_host(7, 3)}:1"
    monkeypatch.delenv("GENTORRENT_VIA")
    assert Via.from_env().rules == ()


def test_address_plan_every_node_and_region_has_its_own_address() -> None:
    hosts = {node_host(i) for i in range(600)}
    assert len(hosts) == 600 and all(h.startswith("127.1.") and not h.endswith((".0", ".255")) for h in hosts)
    proxies = {proxy_host(i, r) for i in range(600) for r in range(6)}
    assert len(proxies) == 3600 and not proxies & hosts
    for r in range(6):  # a dialer in region r reaches node i through exactly its proxy for r
        via = Via.parse(via_rule(r))
        assert all(via(f"{node_host(i)}:77") == f"{proxy_host(i, r)}:77" for i in range(600))
    with pytest.raises(ValueError):
        node_host(250 * 256)


def test_churn_schedule_is_the_papers_poisson_model_seeded_and_consistent() -> None:
    names = [f"relay-{i}" for i in range(100)]
    events = churn_schedule(names, duration_s=3600, leave_per_min=0.01, crash_share=0.5, mean_downtime_s=60, seed=1)
    assert events == churn_schedule(names, duration_s=3600, leave_per_min=0.01, crash_share=0.5,
                                    mean_downtime_s=60, seed=1)
    assert [e.at_s for e in events] == sorted(e.at_s for e in events)
    departures = [e for e in events if e.kind != "join"]
    assert 40 <= len(departures) <= 85  # 1 % of 100 nodes a minute for an hour: 60 expected
    assert {e.kind for e in departures} == {"crash", "leave"}
    online = set(names)
    for e in events:  # a node leaves only while online and comes back only after leaving
        if e.kind == "join":
            assert e.name not in online
            online.add(e.name)
        else:
            assert e.name in online
            online.remove(e.name)
    assert churn_schedule(names, duration_s=60, leave_per_min=0.0, crash_share=0.5, mean_downtime_s=1, seed=0) == []
    with pytest.raises(ValueError):
        churn_schedule(names, duration_s=60, leave_per_min=0.1, crash_share=2.0, mean_downtime_s=1, seed=0)
    assert ChurnEvent(1.0, "a", "join").kind == "join"


@pytest.fixture
def bed(tmp_path: Path) -> tb.Testbed:
    return tb.Testbed(tmp_path, relays=12, models=2, verifiers=4, clients=["c"], client_regions={"c": "ap-southeast"})


def test_every_listener_gets_one_link_per_source_region_with_that_pairs_delay(bed: tb.Testbed) -> None:
    specs = bed.proxy_specs()
    listeners = sum(len(p) for p in bed.listeners().values())
    assert listeners == 12 + 2 + 1 + 4 * 2
    assert len(specs) == listeners * len(geo.REGIONS)
    assert len({s.listen for s, _ in specs}) == len(specs)
    for spec, link in specs:
        name = spec.name.split(":")[0]
        src = spec.name.rsplit("@", 1)[1]
        assert spec.upstream.startswith(bed.host(name) + ":")
        assert link.latency_ms == geo.one_way_ms(src, bed.region_of[name])
        assert link.loss == geo.LOSS
        via = Via.parse(via_rule(bed.regions.index(src)))
        assert via(spec.upstream) == spec.listen  # the dialer's rewrite lands on this proxy
    assert bed.region_of["c"] == "ap-southeast"
    assert bed.entries["relay-0"].address.startswith("127.1.0.1:")
    assert bed.env_for("c")["GENTORRENT_VIA"] == via_rule(bed.regions.index("ap-southeast"))
    assert bed.command("relay-3")[-2:] == ["--region", bed.region_of["relay-3"]]
    # nodes reach the committee through their region's RPC proxies; the harness directly
    r = bed.region_number("relay-3")
    assert bed.committee_for("relay-3").split(",") == [
        f"{proxy_host(bed.index[v], r)}:{bed.verifier_ports[v][1]}" for v in bed.verifiers]
    assert bed.committee_for(None) == bed.committee_addresses


def test_the_loss_of_every_link_is_the_testbeds_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    off = tb.Testbed(tmp_path, relays=6, models=1, verifiers=1, loss=0.0)
    assert {link.loss for _, link in off.proxy_specs()} == {0.0}
    for bad in (-0.01, 1.01, float("nan")):
        with pytest.raises(ValueError, match="loss"):
            tb.Testbed(tmp_path, relays=6, models=1, verifiers=1, loss=bad)


def test_the_floor_of_a_request_is_the_kth_fastest_path_there_and_back(bed: tb.Testbed) -> None:
    paths = [["relay-0", "relay-1", "relay-2"], ["relay-3", "relay-4", "relay-5"],
             ["relay-6", "relay-7", "relay-8"], ["relay-9", "relay-10", "relay-11"]]
    one_way = sorted(geo.path_floor_ms([bed.region_of[h] for h in ["c", *p, "model-0"]]) for p in paths)
    assert request_floor_ms(bed, "c", paths, "model-0", 3) == 2 * one_way[2]
    assert request_floor_ms(bed, "c", paths, "model-0", 1) == 2 * one_way[0]
    assert math.isnan(request_floor_ms(bed, "c", paths[:2], "model-0", 3))
    # served where it was addressed: no hop; forwarded: there to the entry, its hop to the server,
    # and back from the server (it replies straight to the paths' last relays)
    assert request_floor_ms(bed, "c", paths, "model-0", 3, "model-0") == 2 * one_way[2]
    assert bed.region_of["model-0"] != bed.region_of["model-1"]
    hop = bed.one_way_ms("model-0", "model-1")
    back = sorted(geo.path_floor_ms([bed.region_of[h] for h in ["c", *p, "model-1"]]) for p in paths)
    assert hop > 0 and back != one_way
    assert request_floor_ms(bed, "c", paths, "model-0", 3, "model-1") == pytest.approx(one_way[2] + hop + back[2])


def test_summaries_count_failures_and_compare_with_the_floor() -> None:
    s = [Sample("4,3", "c", True, 120.0, 100.0, served_by="m0", entry="m0"),
         Sample("4,3", "c", True, 240.0, 200.0, served_by="m1", entry="m0"),
         Sample("4,3", "c", False, error="AnonError: gone"), Sample("1,1", "c", True, 50.0, 40.0)]
    f = summarize_samples(s, "4,3")
    assert (f["ttft_4_3_requests"], f["ttft_4_3_answered"], f["ttft_4_3_forwarded"]) == (3, 2, 1)
    assert f["ttft_4_3_p50_ms"] == 120.0 and f["ttft_4_3_excess_p50_ms"] == 20.0
    assert f["ttft_4_3_ratio_to_floor_p50"] == pytest.approx(1.2)


def test_config_toml_edits_touch_only_the_p2p_section() -> None:
    text = '[rpc]\npex = true\n\n[p2p]\npex = true\npersistent_peers = ""\n'
    out = _set_line(_set_line(text, "pex", "false"), "persistent_peers", '"a@b:1"')
    assert out == '[rpc]\npex = true\n\n[p2p]\npex = false\npersistent_peers = "a@b:1"\n'
    with pytest.raises(ValueError):
        _set_line(text, "nope", "1")
