"""Configuration precedence: defaults < TOML file < GENTORRENT_* environment < flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from gentorrent import config
from gentorrent.cli import build_parser, resolve_config
from gentorrent.config import ConfigError, resolve


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No developer's real config.toml or GENTORRENT_* variable leaks in."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    for key in list(__import__("os").environ):
        if key.startswith(config.ENV_PREFIX):
            monkeypatch.delenv(key)


def write_toml(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_defaults(tmp_path: Path) -> None:
    cfg = resolve({}, env={})
    assert cfg.listen == "127.0.0.1:0"
    assert cfg.ping_interval == 0.0
    assert cfg.peers is None
    assert cfg.data_dir == str(tmp_path / "xdg" / "gentorrent")
    assert all(cfg.source(name) == "default" for name in config.SETTINGS)


def test_each_layer_overrides_the_one_below(tmp_path: Path) -> None:
    f = write_toml(tmp_path / "c.toml", 'listen = "127.0.0.1:1001"\nregion = "eu"\nping_interval = 5\n'
                                        'log_level = "warning"\n')
    env = {"GENTORRENT_LISTEN": "127.0.0.1:1002", "GENTORRENT_REGION": "us"}
    flags = {"listen": "127.0.0.1:1003", "region": None}
    cfg = resolve(flags, env=env, config_path=str(f))
    assert (cfg.listen, cfg.source("listen")) == ("127.0.0.1:1003", "flag")
    assert (cfg.region, cfg.source("region")) == ("us", "environment")
    assert cfg.ping_interval == 5.0 and isinstance(cfg.ping_interval, float)
    assert cfg.source("ping_interval") == f"file {f}"
    assert (cfg.log_level, cfg.source("log_level")) == ("warning", f"file {f}")
    assert cfg.source("peers") == "default"

    assert resolve({}, env=env, config_path=str(f)).listen == "127.0.0.1:1002"
    assert resolve({}, env={}, config_path=str(f)).listen == "127.0.0.1:1001"
    assert resolve({}, env={}).listen == "127.0.0.1:0"


def test_config_file_from_the_environment(tmp_path: Path) -> None:
    f = write_toml(tmp_path / "c.toml", 'region = "asia"\n')
    assert resolve({}, env={"GENTORRENT_CONFIG": str(f)}).region == "asia"


def test_config_toml_in_the_data_dir_is_found(tmp_path: Path) -> None:
    d = tmp_path / "data"
    write_toml(d / "config.toml", 'ping-interval = 2.5\n')  # dashes work as in flags
    assert resolve({"data_dir": str(d)}, env={}).ping_interval == 2.5
    assert resolve({}, env={"GENTORRENT_DATA_DIR": str(d)}).ping_interval == 2.5
    # ...and in the default data dir.
    write_toml(tmp_path / "xdg" / "gentorrent" / "config.toml", 'region = "home"\n')
    assert resolve({}, env={}).region == "home"


def test_explicit_config_path_wins_over_the_data_dir_one(tmp_path: Path) -> None:
    d = tmp_path / "data"
    write_toml(d / "config.toml", 'region = "in-data-dir"\n')
    f = write_toml(tmp_path / "explicit.toml", 'region = "explicit"\n')
    assert resolve({"data_dir": str(d)}, env={}, config_path=str(f)).region == "explicit"


def test_environment_values_are_typed() -> None:
    cfg = resolve({}, env={"GENTORRENT_PING_INTERVAL": "0.25"})
    assert cfg.ping_interval == 0.25
    with pytest.raises(ConfigError, match="GENTORRENT_PING_INTERVAL: ping_interval must be a float"):
        resolve({}, env={"GENTORRENT_PING_INTERVAL": "often"})


@pytest.mark.parametrize(("text", "match"), [
    ('colour = "blue"\n', "unknown setting 'colour'"),
    ('listen = 7400\n', "listen must be a str"),
    ('ping_interval = "soon"\n', "ping_interval must be a float"),
    ('ping_interval = true\n', "ping_interval must be a float"),
    ('listen = \n', "not valid TOML"),
])
def test_bad_config_file_names_the_file(tmp_path: Path, text: str, match: str) -> None:
    f = write_toml(tmp_path / "bad.toml", text)
    with pytest.raises(ConfigError, match=match) as ei:
        resolve({}, env={}, config_path=str(f))
    assert str(f) in str(ei.value)


def test_missing_config_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        resolve({}, env={}, config_path=str(tmp_path / "nope.toml"))


def test_data_path_expands_the_home_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve({"data_dir": "~/node"}, env={}).data_path == tmp_path / "node"


# --------------------------------------------------------------------------- through the CLI


def test_precedence_through_the_cli_parser(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "data"
    write_toml(d / "config.toml", 'listen = "127.0.0.1:2001"\nregion = "file"\nping_interval = 9\n')
    parser = build_parser()

    def resolved(*argv: str) -> config.Config:
        return resolve_config(parser.parse_args(["user", "relay", "--data-dir", str(d), *argv]))

    cfg = resolved()
    assert (cfg.listen, cfg.region, cfg.ping_interval) == ("127.0.0.1:2001", "file", 9.0)

    monkeypatch.setenv("GENTORRENT_LISTEN", "127.0.0.1:2002")
    monkeypatch.setenv("GENTORRENT_PING_INTERVAL", "3")
    cfg = resolved()
    assert (cfg.listen, cfg.region, cfg.ping_interval) == ("127.0.0.1:2002", "file", 3.0)

    cfg = resolved("--listen", "127.0.0.1:2003", "--region", "flag", "--ping-interval", "0.5")
    assert (cfg.listen, cfg.region, cfg.ping_interval) == ("127.0.0.1:2003", "flag", 0.5)
    assert cfg.source("listen") == "flag"


def test_data_dir_from_the_environment_through_the_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "envdata"
    write_toml(d / "config.toml", 'region = "from-env-data-dir"\n')
    monkeypatch.setenv("GENTORRENT_DATA_DIR", str(d))
    cfg = resolve_config(build_parser().parse_args(["status"]))
    assert cfg.data_path == d and cfg.region == "from-env-data-dir"


def test_config_flag_through_the_cli(tmp_path: Path) -> None:
    f = write_toml(tmp_path / "x.toml", 'peers = "/nonexistent/peers.json"\n')
    cfg = resolve_config(build_parser().parse_args(["status", "--config", str(f)]))
    assert cfg.peers == "/nonexistent/peers.json" and cfg.source("peers") == f"file {f}"


def test_switches_come_from_every_layer_and_take_only_true_or_false(tmp_path: Path) -> None:
    """``allow_unaudited`` and ``donate_prompts`` (user chat/serve): booleans in the file, words in the
    environment (``GENTORRENT_ALLOW_UNAUDITED=1``), ``--x``/``--no-x`` flags; ``donate_rate`` a float."""
    cfg = resolve({}, env={})
    assert (cfg.allow_unaudited, cfg.donate_prompts, cfg.donate_rate) == (False, False, 0.25)
    f = write_toml(tmp_path / "c.toml", "allow_unaudited = true\ndonate-prompts = true\ndonate_rate = 1\n")
    cfg = resolve({}, env={}, config_path=str(f))
    assert (cfg.allow_unaudited, cfg.donate_prompts, cfg.donate_rate) == (True, True, 1.0)
    for word, value in (("1", True), ("TRUE", True), ("yes", True), ("on", True), ("0", False), ("false", False),
                        ("no", False), ("off", False)):
        assert resolve({}, env={"GENTORRENT_ALLOW_UNAUDITED": word}).allow_unaudited is value
    assert resolve({}, env={"GENTORRENT_ALLOW_UNAUDITED": "0"}, config_path=str(f)).allow_unaudited is False
    with pytest.raises(ConfigError, match="GENTORRENT_DONATE_PROMPTS: donate_prompts must be true or false"):
        resolve({}, env={"GENTORRENT_DONATE_PROMPTS": "maybe"})
    with pytest.raises(ConfigError, match="allow_unaudited must be a bool"):
        resolve({}, env={}, config_path=str(write_toml(tmp_path / "d.toml", "allow_unaudited = 1\n")))
    parser = build_parser()
    for argv, want in ((["--allow-unaudited"], True), (["--no-allow-unaudited"], False), ([], None)):
        for cmd in ("chat", "serve"):
            args = parser.parse_args(["user", cmd, *argv, "--donate-prompts", "--donate-rate", "0.5"])
            assert (args.allow_unaudited, args.donate_prompts, args.donate_rate) == (want, True, 0.5)
    args = parser.parse_args(["user", "chat", "--no-allow-unaudited", "--config", str(f)])
    cfg = resolve_config(args)
    assert cfg.allow_unaudited is False and cfg.source("allow_unaudited") == "flag" and cfg.donate_prompts is True
