"""``gentorrent devnet``'s recorded state (DATA_DIR/devnet/devnet.json): what a second start
resumes, and the errors (naming ``--fresh``) when it cannot."""

from __future__ import annotations

import argparse
import json
import re
import socket
from pathlib import Path

import pytest

from gentorrent.cli import CliError
from gentorrent.tools.devnet import (
    CHALLENGES_PER_NODE,
    EPOCH_BLOCKS,
    STATE_FILE,
    WINDOWS_SHOWN,
    check_args,
    load_state,
    open_net,
    save_state,
)
from gentorrent.tools.localnet import LocalNet, fitting_reply_window, ports_taken


def args(**kw) -> argparse.Namespace:
    base = {"relays": 4, "models": 1, "verifiers": 2, "engine": "echo", "fresh": False, "audits": False,
            "epoch_blocks": None, "challenges_per_node": None}
    return argparse.Namespace(**{**base, **kw})


def fake_committee(net: LocalNet) -> None:
    """What `verifier init` and `verifier genesis --install` leave behind, as far as devnet checks."""
    genesis = {"chain_id": net.chain_id, "validators": []}
    net.genesis_file.write_text(json.dumps(genesis))
    for v in net.verifiers:
        cfg = net.root / v / "cometbft" / "config"
        cfg.mkdir(parents=True)
        (cfg / "genesis.json").write_text(json.dumps(genesis))
        (cfg / "config.toml").write_text("")


def started(root: Path, **kw) -> LocalNet:
    """A devnet's first start, as far as its state goes: a new chain, recorded."""
    net, recorded = open_net(root, args(**kw), "echo")
    assert recorded is None
    fake_committee(net)
    save_state(root / STATE_FILE, net, recorded)
    return net


def test_a_second_start_resumes_the_recorded_chain_on_the_recorded_ports(tmp_path):
    first = started(tmp_path)
    assert first.chain_id.startswith("gentorrent-devnet-") and len(first.ports) == 4 + 1 + 1 + 2 * 2
    net, recorded = open_net(tmp_path, args(), "echo")
    assert recorded is not None and recorded["chain_id"] == first.chain_id
    assert net.chain_id == first.chain_id and net.ports == first.ports
    assert net.committee_addresses == first.committee_addresses
    assert {n: e.address for n, e in net.entries.items()} == {n: e.address for n, e in first.entries.items()}
    other = started(tmp_path / "other")
    assert other.chain_id != first.chain_id  # each new devnet chain is its own


def test_more_relays_keep_the_recorded_ports_and_the_state_keeps_ports_of_nodes_not_started(tmp_path):
    first = started(tmp_path)
    more, recorded = open_net(tmp_path, args(relays=6), "echo")
    assert all(more.ports[n] == p for n, p in first.ports.items())
    assert len(set(more.ports.values())) == len(more.ports)  # the two new relays got ports of their own
    save_state(tmp_path / STATE_FILE, more, recorded)
    fewer, recorded = open_net(tmp_path, args(relays=4), "echo")
    save_state(tmp_path / STATE_FILE, fewer, recorded)
    state = load_state(tmp_path / STATE_FILE)
    assert state is not None and state["ports"] == more.ports


def test_fresh_starts_a_new_chain_on_new_ports(tmp_path):
    first = started(tmp_path)
    net, recorded = open_net(tmp_path, args(fresh=True), "echo")
    assert recorded is None and net.chain_id != first.chain_id
    assert not (tmp_path / STATE_FILE).exists()  # recorded again once the new committee is set up


def test_a_taken_port_is_a_clear_error_naming_fresh(tmp_path):
    first = started(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", first.ports["relay-2"]))
        s.listen(1)
        assert ports_taken(first.ports) == ["relay-2"]
        with pytest.raises(CliError, match=rf"in use: relay-2 \(127.0.0.1:{first.ports['relay-2']}\).*--fresh"):
            open_net(tmp_path, args(), "echo")
        open_net(tmp_path, args(fresh=True), "echo")  # --fresh picks free ports
    assert ports_taken(first.ports) == []


def test_state_that_cannot_be_resumed_is_a_clear_error_naming_fresh(tmp_path):
    first = started(tmp_path)
    with pytest.raises(CliError, match=r"committee of 2 verifiers, not 4.*--fresh"):
        open_net(tmp_path, args(verifiers=4), "echo")
    (tmp_path / "verifier-1" / "cometbft" / "config" / "genesis.json").write_text(json.dumps({"chain_id": "other"}))
    with pytest.raises(CliError, match=r"verifier-1's CometBFT home .* belongs to another chain.*--fresh"):
        open_net(tmp_path, args(), "echo")
    first.genesis_file.unlink()
    with pytest.raises(CliError, match=r"genesis .* is unreadable.*--fresh"):
        open_net(tmp_path, args(), "echo")
    for bad in ("{not json", json.dumps({"version": 99}), json.dumps({"version": 1, "chain_id": "c", "verifiers": 2,
                                                                      "ports": {"relay-0": 70000}})):
        (tmp_path / STATE_FILE).write_text(bad)
        with pytest.raises(CliError, match=r"not a devnet state .*--fresh"):
            open_net(tmp_path, args(), "echo")


def test_without_a_committee_the_ports_are_still_reused(tmp_path):
    net, recorded = open_net(tmp_path, args(verifiers=0), "echo")
    save_state(tmp_path / STATE_FILE, net, recorded)
    again, recorded = open_net(tmp_path, args(verifiers=0), "echo")
    assert recorded is not None and again.ports == net.ports and again.registry_file.exists()


def test_audits_add_an_audit_port_per_verifier_and_a_devnet_keeps_its_choice(tmp_path):
    first = started(tmp_path, audits=True)
    assert first.audits and {f"verifier-{i}.audit" for i in range(2)} <= set(first.ports)
    cmd = first.command("verifier-0")
    assert "--audit" in cmd and cmd[cmd.index("--audit-listen") + 1] == f"127.0.0.1:{first.ports['verifier-0.audit']}"
    assert json.loads((tmp_path / STATE_FILE).read_text())["audits"] is True
    net, recorded = open_net(tmp_path, args(audits=True), "echo")
    assert recorded is not None and net.ports == first.ports
    with pytest.raises(CliError, match=r"created with --audits.*--fresh"):
        open_net(tmp_path, args(), "echo")
    plain = started(tmp_path / "plain")
    assert "--audit" not in plain.command("verifier-0")
    with pytest.raises(CliError, match="created without --audits"):
        open_net(tmp_path / "plain", args(audits=True), "echo")


def test_an_audited_devnet_keeps_the_epoch_length_it_was_created_with(tmp_path):
    first = started(tmp_path, audits=True, epoch_blocks=300)
    assert first.epoch_blocks == 300 and first.reply_window == fitting_reply_window(300, 0.5) == 66
    assert json.loads((tmp_path / STATE_FILE).read_text())["epoch_blocks"] == 300
    net, recorded = open_net(tmp_path, args(audits=True), "echo")  # resumed without the flag: its own
    assert recorded is not None and (net.epoch_blocks, net.reply_window) == (300, 66)
    with pytest.raises(CliError, match=r"created with --epoch-blocks 300.*--fresh"):
        open_net(tmp_path, args(audits=True, epoch_blocks=120), "echo")
    fresh, recorded = open_net(tmp_path, args(audits=True, epoch_blocks=120, fresh=True), "echo")
    assert recorded is None and fresh.epoch_blocks == 120
    assert started(tmp_path / "default", audits=True).epoch_blocks == EPOCH_BLOCKS


def test_an_audited_devnet_keeps_its_challenges_per_node_and_its_verifiers_are_told_them(tmp_path):
    first = started(tmp_path, audits=True, challenges_per_node=1)
    assert json.loads((tmp_path / STATE_FILE).read_text())["challenges_per_node"] == 1
    assert " --challenges-per-node 1 " in " ".join(["", *first.genesis_audit_args(), ""])  # the genesis says it
    net, recorded = open_net(tmp_path, args(audits=True), "echo")  # resumed without the flag: its own
    assert recorded is not None and net.challenges_per_node == 1
    with pytest.raises(CliError, match=r"created with --challenges-per-node 1 .*--fresh"):
        open_net(tmp_path, args(audits=True, challenges_per_node=2), "echo")
    assert started(tmp_path / "default", audits=True).challenges_per_node == CHALLENGES_PER_NODE
    old = tmp_path / "old"  # recorded before the flag: the default it then had
    started(old, audits=True)
    state = json.loads((old / STATE_FILE).read_text())
    del state["challenges_per_node"]
    (old / STATE_FILE).write_text(json.dumps(state))
    assert open_net(old, args(audits=True), "echo")[0].challenges_per_node == CHALLENGES_PER_NODE
    state["challenges_per_node"] = "two"
    (old / STATE_FILE).write_text(json.dumps(state))
    with pytest.raises(CliError, match=r"records no valid challenges_per_node.*--fresh"):
        open_net(old, args(audits=True), "echo")


@pytest.mark.parametrize(("kw", "why"), [({"epoch_blocks": 300}, "needs --audits"),
                                         ({"audits": True, "engine": "llama.cpp", "epoch_blocks": 11}, "between 12"),
                                         ({"audits": True, "engine": "llama.cpp", "epoch_blocks": 10**7}, "between 12"),
                                         ({"challenges_per_node": 1}, "needs --audits"),
                                         ({"audits": True, "engine": "llama.cpp", "challenges_per_node": 0}, "between 1"),
                                         ({"audits": True, "engine": "llama.cpp", "challenges_per_node": 5}, "between 1")])
def test_epoch_blocks_is_checked_before_anything_starts(kw, why):
    with pytest.raises(CliError, match=why):
        check_args(args(relays=12, no_demo=True, chat=False, **kw))


def test_the_reply_windows_the_help_names_are_the_fitted_ones():
    shown = [int(x) for x in re.findall(r"(\d+) s", WINDOWS_SHOWN)]
    blocks = [int(x) for x in re.findall(r"(\d+) (?:blocks )?give", WINDOWS_SHOWN)]
    assert len(shown) == len(blocks) == 3 and shown == [fitting_reply_window(n, 0.5) for n in blocks]


def test_the_chat_config_allows_unaudited_models_only_where_the_committee_audits_none(tmp_path):
    """A committee without --audits audits no model (its list marks every model unaudited), so the
    devnet's chat.toml opts in (allow_unaudited = true); with --audits, or with no committee (a
    registry file: audited unknown, allowed anyway), it does not."""
    from gentorrent.config import load_toml

    for name, kw, allowed in (("plain", {}, True), ("audited", {"audits": True}, None),
                              ("registry", {"verifiers": 0}, None)):
        net, _ = open_net(tmp_path / name, args(**kw), "echo")
        assert net.unaudited is bool(allowed)
        got = load_toml(net.config_toml("you", tmp_path / name / "chat.toml"))
        assert got.get("allow_unaudited") is allowed  # None: not in the file (the default, off)
        assert got["model"] == "echo" and ("committee" in got) is (name != "registry")
