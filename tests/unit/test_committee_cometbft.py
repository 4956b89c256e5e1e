"""CometBFT homes and the verifier CLI's setup commands (verifier/cometbft.py, verifier/cli.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gentorrent.cli import main
from verifier import cometbft
from verifier.cometbft import CometError

SAMPLE = """# top comment
proxy_app = "tcp://127.0.0.1:26658"
moniker = "vm"

[rpc]
laddr = "tcp://127.0.0.1:26657"

[p2p]
laddr = "tcp://0.0.0.0:26656"
addr_book_strict = true

[consensus]
timeout_commit = "1s"

# keep this a bool
skip_timeout_commit = false
"""


def test_set_toml_edits_only_the_key_in_its_section() -> None:
    out = cometbft.set_toml(SAMPLE, "p2p", "laddr", "tcp://127.0.0.1:1")
    assert cometbft.get_toml(out, "p2p", "laddr") == "tcp://127.0.0.1:1"
    assert cometbft.get_toml(out, "rpc", "laddr") == "tcp://127.0.0.1:26657"
    out = cometbft.set_toml(out, "consensus", "timeout_commit", "200ms")
    assert 'timeout_commit = "200ms"' in out and "skip_timeout_commit = false" in out
    out = cometbft.set_toml(out, "p2p", "addr_book_strict", False)
    assert "addr_book_strict = false" in out
    assert cometbft.set_toml(out, "", "moniker", "v0").count('moniker = "v0"') == 1
    assert out.count("\n") == SAMPLE.count("\n")


def test_set_toml_refuses_a_missing_key() -> None:
    with pytest.raises(CometError, match="no key 'nope'"):
        cometbft.set_toml(SAMPLE, "p2p", "nope", 1)
    with pytest.raises(CometError):
        cometbft.set_toml(SAMPLE, "rpc", "addr_book_strict", True)


def _cometbft() -> str:
    try:
        return cometbft.find_cometbft()
    except CometError as exc:
        pytest.skip(str(exc))


def test_init_and_genesis_with_real_cometbft(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _cometbft()
    dirs = [str(tmp_path / f"v{i}") for i in range(3)]
    for i, d in enumerate(dirs):
        assert main(["verifier", "init", "--data-dir", d, "--p2p", f"127.0.0.1:{30000 + i}",
                     "--rpc", f"127.0.0.1:{31000 + i}", "--timeout-commit", "300ms"]) == 0
    out = capsys.readouterr().out
    assert "peer address:" in out
    infos = [cometbft.read_home(d) for d in dirs]
    text = (Path(dirs[0]) / "cometbft" / "config" / "config.toml").read_text()
    assert cometbft.get_toml(text, "p2p", "allow_duplicate_ip") == "true"
    assert cometbft.get_toml(text, "p2p", "addr_book_strict") == "false"
    assert cometbft.get_toml(text, "consensus", "skip_timeout_commit") == "false"
    assert cometbft.get_toml(text, "", "proxy_app").endswith("/v0/abci.sock")
    # Re-running init keeps the keys.
    assert main(["verifier", "init", "--data-dir", dirs[0], "--p2p", "127.0.0.1:30000"]) == 0
    assert cometbft.read_home(dirs[0]) == infos[0]

    gen = tmp_path / "genesis.json"
    assert main(["verifier", "genesis", "--chain-id", "gt-unit", "--out", str(gen), "--install", *dirs]) == 0
    g = json.loads(gen.read_text())
    assert g["chain_id"] == "gt-unit" and g["initial_height"] == "1"
    assert [v["address"] for v in g["validators"]] == [i.validator_address for i in infos]
    assert g["consensus_params"]["abci"]["vote_extensions_enable_height"] == "1"  # the lists are signed in them
    from verifier.admission import AdmissionParams
    from verifier.admission import params_from_app_state as admission_rules
    from verifier.audit.chain import AuditParams, params_from_app_state

    assert set(g["app_state"]) == {"admission", "quota"}  # audits off unless asked for; admission, quotas written
    from overlay.directory.quota import QuotaParams

    assert QuotaParams.from_json(g["app_state"]["quota"]) == QuotaParams()  # the documented defaults
    assert admission_rules(json.dumps(g["app_state"]).encode()) == AdmissionParams()  # a public network's
    other = tmp_path / "other.json"
    assert main(["verifier", "genesis", "--out", str(other), "--audits", "--local-network", *dirs]) == 0
    assert params_from_app_state(json.dumps(json.loads(other.read_text())["app_state"]).encode()) == AuditParams()
    assert admission_rules(json.dumps(json.loads(other.read_text())["app_state"]).encode()) == AdmissionParams.local()
    assert main(["verifier", "genesis", "--out", str(other), "--audits", "--epoch-blocks", "60",
                 "--challenges-per-node", "4", *dirs]) == 0
    assert json.loads(other.read_text())["app_state"]["audit"] == {"epoch_blocks": 60, "challenges_per_node": 4,
                                                                  "reply_window_s": 600}
    assert main(["verifier", "genesis", "--out", str(other), "--audits", "--reply-window", "22", *dirs]) == 0
    assert params_from_app_state(json.dumps(json.loads(other.read_text())["app_state"]).encode()) == AuditParams(
        reply_window_s=22)
    assert main(["verifier", "genesis", "--out", str(other), "--audits", "--reply-window", "9", *dirs]) == 2
    assert "reply_window_s must be an integer 10..600" in capsys.readouterr().err
    assert main(["verifier", "genesis", "--out", str(other), "--no-quota", *dirs]) == 0
    assert "quota" not in json.loads(other.read_text())["app_state"]
    assert main(["verifier", "genesis", "--out", str(other), "--quota-tokens", "5", "--quota-epoch-s", "30",
                 "--quota-issuers", "3", *dirs]) == 0
    assert json.loads(other.read_text())["app_state"]["quota"] == {"epoch_s": 30, "tokens": 5, "issuers": 3,
                                                                  "grace_s": 15, "burst": 16, "priority": 4}
    assert main(["verifier", "genesis", "--out", str(other), "--quota-burst", "4", "--quota-priority", "2", *dirs]) == 0
    assert json.loads(other.read_text())["app_state"]["quota"]["burst"] == 4
    assert json.loads(other.read_text())["app_state"]["quota"]["priority"] == 2
    assert main(["verifier", "genesis", "--out", str(other), "--quota-issuers", "4", *dirs]) == 2  # 3 validators
    assert main(["verifier", "genesis", "--out", str(other), "--quota-tokens", "0", *dirs]) == 2
    assert main(["verifier", "genesis", "--out", str(other), dirs[0]]) == 0
    assert json.loads(other.read_text())["app_state"]["quota"]["issuers"] == 1  # a committee of one
    assert main(["verifier", "genesis", "--out", str(other), "--work-bits", "99", *dirs]) == 2
    assert main(["verifier", "genesis", "--out", str(other), "--audits", "--epoch-blocks", "3", *dirs]) == 2
    assert "epoch_blocks" in capsys.readouterr().err
    for d, me in zip(dirs, infos, strict=True):
        installed = json.loads((Path(d) / "cometbft" / "config" / "genesis.json").read_text())
        assert installed == g
        peers = cometbft.get_toml((Path(d) / "cometbft" / "config" / "config.toml").read_text(),
                                  "p2p", "persistent_peers").split(",")
        assert sorted(peers) == sorted(i.peer for i in infos if i != me)


def test_genesis_refuses_duplicates_and_missing_homes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _cometbft()
    d = str(tmp_path / "v0")
    assert main(["verifier", "init", "--data-dir", d]) == 0
    capsys.readouterr()
    assert main(["verifier", "genesis", "--out", str(tmp_path / "g.json"), d, d]) == 2
    assert "same validator key" in capsys.readouterr().err
    assert main(["verifier", "genesis", "--out", str(tmp_path / "g.json"), str(tmp_path / "nothing")]) == 2
    assert "verifier init" in capsys.readouterr().err
    assert main(["verifier", "genesis", "--chain-id", "bad id!", "--out", str(tmp_path / "g.json"), d]) == 2


def test_run_without_a_home_says_to_init(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verifier", "--data-dir", str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err
    assert "gentorrent verifier init" in err and len(err.strip().splitlines()) == 1


def test_init_refuses_bad_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verifier", "init", "--data-dir", str(tmp_path), "--p2p", "nohost"]) == 2
    assert "HOST:PORT" in capsys.readouterr().err
    assert main(["verifier", "init", "--data-dir", str(tmp_path), "--timeout-commit", "soon"]) == 2


def test_missing_binary_names_make_setup(tmp_path: Path) -> None:
    with pytest.raises(CometError, match="make setup"):
        cometbft.find_cometbft(python=str(tmp_path / "python"), path=str(tmp_path))


def test_run_refuses_a_non_loopback_abci_address(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _cometbft()
    d = str(tmp_path / "v0")
    assert main(["verifier", "init", "--data-dir", d]) == 0
    capsys.readouterr()
    assert main(["verifier", "--data-dir", d, "--abci", "tcp://0.0.0.0:26658"]) == 2
    assert "loopback" in capsys.readouterr().err
