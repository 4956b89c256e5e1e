"""Configuration: defaults < TOML file < ``GENTORRENT_*`` environment < flags.

Settings are declared once (:data:`SETTINGS`), with a type, a default and a
help line; the CLI adds a flag for each one a command uses. The TOML file is
``--config PATH`` (or ``GENTORRENT_CONFIG``), else ``DATA_DIR/config.toml`` if
it exists. Keys are the setting names (``data_dir`` or ``data-dir``); an
unknown key or a value of the wrong type is an error that names the file.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV_PREFIX = "GENTORRENT_"


class ConfigError(Exception):
    """A configuration value is missing, unknown or of the wrong type."""


@dataclass(frozen=True)
class Setting:
    name: str
    type: type
    default: Any
    help: str


def _default_data_dir() -> str:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "gentorrent")


SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in [
        Setting("data_dir", str, None, "directory for keys and state (default: $XDG_DATA_HOME/gentorrent)"),
        Setting("listen", str, "127.0.0.1:0", "address to listen on, host:port (port 0 picks a free one)"),
        Setting("peers", str, None, "UNSIGNED peer list file (JSON) naming the nodes to reach: local testing only"),
        Setting("region", str, "default", "region this node belongs to (paths use relays of one region)"),
        Setting("log_level", str, "info", "logging level: debug, info, warning, error"),
        Setting("ping_interval", float, 0.0,
                "seconds between liveness pings to every node of the directory (0, the default, disables: "
                "in a large network every node would connect to every other)"),
        Setting("committee", str, None,
                "the verifier committee's CometBFT RPC addresses, comma-separated host:port: this node registers "
                "with it and takes its peers from the committee's signed lists (needs --committee-genesis)"),
        Setting("committee_genesis", str, None,
                "the committee's genesis.json (its chain id and validator keys, which signed lists must carry "
                "more than 2/3 of the voting power of); every verifier holds it in DATA_DIR/cometbft/config/"),
        Setting("advertise", str, None,
                "the host:port other nodes reach this node at, as registered with the committee (default: the "
                "--listen address; set it when listening on 0.0.0.0 or behind NAT)"),
        Setting("registry", str, None, "signed registry file listing user and model nodes (local option; "
                "--committee replaces it)"),
        Setting("registry_keys", str, None,
                "pinned registry keys, comma-separated Ed25519 hex; a list needs signatures of more than 2/3"),
        Setting("cloves", int, 4, "n: cloves per message, one per proxy path (paper default 4)"),
        Setting("threshold", int, 3, "k: cloves needed to rebuild a message (paper default 3)"),
        Setting("proxies", int, 4, "N >= n: proxy paths to keep ready"),
        Setting("path_refresh", float, 900.0, "seconds before a proxy path is replaced (paper: 15 minutes)"),
        Setting("model", str, None, "model id to request (user) or serve (model node)"),
        Setting("allow_unaudited", bool, False,
                "also send prompts to model nodes of models the committee's verifiers do not audit (the signed "
                "model list marks them unaudited: no verifiers with more than 2/3 of the voting power hold the "
                "model, so nothing checks what such a node answers). Untrusted nodes (reputation under 0.4) are "
                "never used either way. Without a committee (--registry or --peers files) whether a model is "
                "audited is unknown, and its nodes are used"),
        Setting("donate_prompts", bool, False,
                "after a complete reply, with probability --donate-rate, donate the request's system prompt, "
                "its latest 8 user turns (no replies) and sampling parameters to one verifier chosen at random, "
                "sealed to its key, 0-60 s later, so the committee's audit challenges look like real prompts "
                "(decision 0013). Privacy cost: the chosen verifier learns your node id, your IP address, the "
                "prompt and which model nodes the conversation was sent to, so that it never challenges them with "
                "it (not the reply). Needs --committee; donations still waiting when the command exits are "
                "dropped"),
        Setting("donate_rate", float, 0.25, "with --donate-prompts, the share of replies whose prompt is donated (0..1)"),
        Setting("donate_transcripts", bool, False,
                "donate, for a share --donate-transcripts-rate of requests drawn before they are sent, the request "
                "and the signed reply to every verifier of the committee, which score model nodes on them "
                "(decision 0015): the client commits to the request with every verifier first (the request waits "
                "for their answers, up to 5 s, and 1 s more; with the validators' powers known, an escrowed commit "
                "and its certificate, decision 0037: two rounds of up to 5 s), then reveals the transcript sealed to "
                "each verifier's key. Privacy cost: every verifier learns your node id, your IP address, the prompt, "
                "the reply and which model node served it; if a reveal misses verifiers that together could rebuild its "
                "escrowed secret, the model node that served the request learns after the epoch that it was donated "
                "(the client waits up to 10 s for its reveals when it stops). Seeded requests are never donated. "
                "Needs --committee"),
        Setting("donate_transcripts_rate", float, 0.1,
                "with --donate-transcripts, the share of requests whose transcript is donated (0..1)"),
    ]
}

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def _coerce(setting: Setting, value: Any, where: str) -> Any:
    t = setting.type
    if t is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if t is bool and isinstance(value, str):
        word = value.strip().lower()
        if word not in _TRUE | _FALSE:
            raise ConfigError(f"{where}: {setting.name} must be true or false (1/0, yes/no, on/off), got {value!r}")
        value = word in _TRUE
    if isinstance(value, str) and t is not str:
        try:
            value = t(value)
        except ValueError:
            raise ConfigError(f"{where}: {setting.name} must be a {t.__name__}, got {value!r}") from None
    if not isinstance(value, t) or (t is not bool and isinstance(value, bool)):
        raise ConfigError(f"{where}: {setting.name} must be a {t.__name__}, got {value!r}")
    return value


class Config:
    """Resolved settings; ``source(name)`` says where each value came from."""

    def __init__(self, values: dict[str, Any], sources: dict[str, str]) -> None:
        self._values = values
        self._sources = sources

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(name) from None

    def source(self, name: str) -> str:
        return self._sources[name]

    @property
    def data_path(self) -> Path:
        return Path(self._values["data_dir"]).expanduser()


def load_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    out = {}
    for key, value in doc.items():
        name = key.replace("-", "_")
        if name not in SETTINGS:
            raise ConfigError(f"{path}: unknown setting {key!r} (known: {', '.join(sorted(SETTINGS))})")
        out[name] = _coerce(SETTINGS[name], value, str(path))
    return out


def resolve(
    flags: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    config_path: str | None = None,
) -> Config:
    """Merge the layers. ``flags`` maps setting names to values (``None`` = not given)."""
    flags = dict(flags or {})
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for s in SETTINGS.values():
        values[s.name], sources[s.name] = s.default, "default"

    env_vals: dict[str, Any] = {}
    for s in SETTINGS.values():
        key = ENV_PREFIX + s.name.upper()
        if key in env:
            env_vals[s.name] = _coerce(s, env[key], key)

    # The data dir (where config.toml may live) can itself come from any layer.
    path = config_path or env.get(ENV_PREFIX + "CONFIG")
    data_dir_guess = flags.get("data_dir") or env_vals.get("data_dir")
    file_vals: dict[str, Any] = {}
    if path:
        file_vals = load_toml(Path(path).expanduser())
    else:
        guess = Path(data_dir_guess or _default_data_dir()).expanduser() / "config.toml"
        if guess.is_file():
            file_vals = load_toml(guess)
            path = str(guess)

    for layer, name in ((file_vals, f"file {path}"), (env_vals, "environment")):
        for k, v in layer.items():
            values[k], sources[k] = v, name
    for k, v in flags.items():
        if k in SETTINGS and v is not None:
            values[k], sources[k] = _coerce(SETTINGS[k], v, f"--{k.replace('_', '-')}"), "flag"
    if values["data_dir"] is None:
        values["data_dir"] = _default_data_dir()
    return Config(values, sources)


def add_flags(parser: Any, *names: str) -> None:
    """Add ``--name`` flags for these settings to an argparse parser (default None). A boolean
    setting is a switch: ``--name`` sets it, ``--no-name`` clears it (over the file or environment)."""
    import argparse

    for name in names:
        s = SETTINGS[name]
        flag = "--" + name.replace("_", "-")
        if s.type is bool:
            parser.add_argument(flag, dest=name, default=None, action=argparse.BooleanOptionalAction,
                                help=s.help + f" (default: {'on' if s.default else 'off'}); env "
                                     f"{ENV_PREFIX}{name.upper()}=1")
            continue
        default = "" if s.default is None else f" (default: {s.default})"
        parser.add_argument(
            flag,
            dest=name,
            default=None,
            type=s.type,
            help=s.help + default + f"; env {ENV_PREFIX}{name.upper()}",
        )
