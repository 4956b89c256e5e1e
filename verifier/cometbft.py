"""CometBFT homes: find the binary, ``init`` a verifier's home, edit its config, make a committee's genesis.

A verifier's data dir holds::

    DATA_DIR/cometbft/        CometBFT's home (config/, data/): its keys, blocks and consensus state
    DATA_DIR/app_state.bin    our application's committed state (verifier/abci_app.py)
    DATA_DIR/cometbft.log     CometBFT's log while `gentorrent verifier` runs it
    DATA_DIR/abci.sock        the ABCI socket (default; unix sockets only reach this machine)

Config edits are plain text substitutions of ``key = value`` lines inside a ``[section]`` of
``config.toml`` (:func:`set_toml`), so comments and every other setting stay as CometBFT wrote them.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from overlay.wire import crypto
from overlay.wire.clock import Clock, SystemClock

HOME_DIR = "cometbft"
LOG_FILE = "cometbft.log"
SOCKET_FILE = "abci.sock"
DEFAULT_CHAIN_ID = "gentorrent-committee"
_CHAIN_ID = re.compile(r"[A-Za-z0-9._-]{1,50}")
TomlValue = str | bool | int


class CometError(Exception):
    """CometBFT is missing, a home is incomplete, or a command failed; the message says what to do."""


def find_cometbft(*, python: str | None = None, path: str | None = None) -> str:
    """The ``cometbft`` binary: next to ``python`` (default: this interpreter; ``make setup`` puts it in
    .venv/bin), else on ``path`` (default: $PATH)."""
    python = python or sys.executable
    beside = Path(python).parent / "cometbft"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("cometbft", path=path)
    if found:
        return found
    raise CometError(f"the cometbft binary was not found next to {python} or on PATH; "
                     "run `make setup` (it runs `go install github.com/cometbft/cometbft/cmd/cometbft@v0.38.26`)")


def home_of(data_dir: str | os.PathLike[str]) -> Path:
    return Path(data_dir) / HOME_DIR


def _toml_literal(value: TomlValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return json.dumps(value)  # a TOML basic string is a JSON string for the ASCII we write


def set_toml(text: str, section: str, key: str, value: TomlValue) -> str:
    """``text`` with ``key = ...`` inside ``[section]`` (``""``: before any section) set to ``value``.

    Only an existing key is replaced (CometBFT writes every key); a missing one raises
    :class:`CometError`, so a config from another CometBFT version cannot be half-edited silently.
    """
    lines = text.split("\n")
    current = ""
    pattern = re.compile(rf"^{re.escape(key)}\s*=")
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("[") and stripped.endswith("]"):
            current = stripped[1:-1].strip()
            continue
        if current == section and pattern.match(line):
            lines[i] = f"{key} = {_toml_literal(value)}"
            return "\n".join(lines)
    raise CometError(f"config.toml has no key {key!r} in section [{section}]; is this CometBFT v0.38?")


def get_toml(text: str, section: str, key: str) -> str:
    """The raw value text of ``key`` in ``[section]`` (strings keep their quotes stripped)."""
    current = ""
    for line in text.split("\n"):
        stripped = line.strip()
        if stripped.startswith("[") and stripped.endswith("]"):
            current = stripped[1:-1].strip()
            continue
        m = re.match(rf"^{re.escape(key)}\s*=\s*(.*)$", line)
        if current == section and m:
            raw = m.group(1).strip()
            return str(json.loads(raw)) if raw.startswith('"') else raw
    raise CometError(f"config.toml has no key {key!r} in section [{section}]")


@dataclass(frozen=True, slots=True)
class HomeInfo:
    """What other members need to know about a verifier's home."""

    node_id: str  # hex, for persistent_peers (ID@host:port)
    p2p_address: str  # host:port from p2p.laddr
    validator_address: str  # upper hex, as in genesis
    validator_pub_key_b64: str
    moniker: str

    @property
    def peer(self) -> str:
        return f"{self.node_id}@{self.p2p_address}"


def _read_json(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise CometError(f"{path} is missing; run `gentorrent verifier init --data-dir ...` first") from None
    except (OSError, ValueError) as exc:
        raise CometError(f"{path} is unreadable: {exc}") from None
    if not isinstance(data, dict):
        raise CometError(f"{path} is not a JSON object")
    return data


def _key_value(obj: object, path: Path, field: str) -> bytes:
    try:
        assert isinstance(obj, dict)
        key = obj[field]
        assert isinstance(key, dict) and key.get("type", "").endswith("Ed25519")
        return base64.b64decode(key["value"], validate=True)
    except (AssertionError, KeyError, ValueError, TypeError):
        raise CometError(f"{path}: {field} is not an Ed25519 key") from None


def read_home(data_dir: str | os.PathLike[str]) -> HomeInfo:
    home = home_of(data_dir)
    cfg = home / "config"
    node_key = _key_value(_read_json(cfg / "node_key.json"), cfg / "node_key.json", "priv_key")
    val_pub = _key_value(_read_json(cfg / "priv_validator_key.json"), cfg / "priv_validator_key.json", "pub_key")
    if len(node_key) != 64 or len(val_pub) != 32:
        raise CometError(f"{cfg}: unexpected Ed25519 key lengths")
    text = (cfg / "config.toml").read_text()
    laddr = get_toml(text, "p2p", "laddr")
    return HomeInfo(
        node_id=crypto.sha256(node_key[32:])[:20].hex(),
        p2p_address=laddr.removeprefix("tcp://"),
        validator_address=crypto.sha256(val_pub)[:20].hex().upper(),
        validator_pub_key_b64=base64.b64encode(val_pub).decode(),
        moniker=get_toml(text, "", "moniker"),
    )


def read_validator_key(data_dir: str | os.PathLike[str]) -> crypto.SigningKey:
    """This verifier's CometBFT validator key (``priv_validator_key.json``), which also signs the lists."""
    path = home_of(data_dir) / "config" / "priv_validator_key.json"
    doc = _read_json(path)
    raw = _key_value(doc, path, "priv_key")
    pub = _key_value(doc, path, "pub_key")
    if len(raw) != 64:
        raise CometError(f"{path}: priv_key is not a 64-byte Ed25519 key")
    key = crypto.SigningKey.from_bytes(raw[:32])
    if key.public_bytes != pub or raw[32:] != pub:
        raise CometError(f"{path}: priv_key does not match pub_key")
    return key


def _check_hostport(value: str, what: str) -> None:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise CometError(f"{what} {value!r} is not HOST:PORT")


def init_home(data_dir: str | os.PathLike[str], *, p2p: str = "127.0.0.1:26656", rpc: str = "127.0.0.1:26657",
              moniker: str | None = None, timeout_commit: str = "1s", binary: str | None = None) -> HomeInfo:
    """Run ``cometbft init`` in ``DATA_DIR/cometbft`` (keeps existing keys) and set this verifier's config.

    Edits: P2P and RPC listen addresses, the ABCI socket, ``addr_book_strict = false`` and
    ``allow_duplicate_ip = true`` (so several verifiers on one host can peer; harmless elsewhere),
    ``timeout_commit`` and ``create_empty_blocks = true`` (the lists' signed time must advance).
    ``skip_timeout_commit`` stays false.
    """
    _check_hostport(p2p, "--p2p")
    _check_hostport(rpc, "--rpc")
    if not re.fullmatch(r"\d+(ms|s)", timeout_commit):
        raise CometError(f"--timeout-commit {timeout_commit!r}: give a duration like 1s or 500ms")
    home = home_of(data_dir)
    Path(data_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
    exe = binary or find_cometbft()
    out = subprocess.run([exe, "init", "--home", str(home)], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise CometError(f"`cometbft init --home {home}` failed: {out.stderr.strip()[-500:]}")
    cfg_path = home / "config" / "config.toml"
    text = cfg_path.read_text()
    for section, key, value in (
        ("", "moniker", moniker or Path(data_dir).resolve().name),
        ("", "proxy_app", f"unix://{(Path(data_dir).resolve() / SOCKET_FILE)}"),
        ("rpc", "laddr", f"tcp://{rpc}"),
        ("p2p", "laddr", f"tcp://{p2p}"),
        ("p2p", "addr_book_strict", False),
        ("p2p", "allow_duplicate_ip", True),
        ("consensus", "timeout_commit", timeout_commit),
        # a block every timeout_commit even with no transaction: the signed lists carry the block time,
        # and clients refuse lists older than overlay.directory.lists.MAX_LIST_AGE_S (decision 0014)
        ("consensus", "create_empty_blocks", True),
    ):
        text = set_toml(text, section, key, value)
    cfg_path.write_text(text)
    return read_home(data_dir)


def make_genesis(data_dirs: list[str], *, chain_id: str = DEFAULT_CHAIN_ID, power: int = 10,
                 genesis_time: datetime | None = None, clock: Clock | None = None) -> dict[str, object]:
    """A genesis naming every home's validator key with equal ``power``.

    The consensus parameters come from the first home's ``genesis.json`` (CometBFT's defaults as
    ``init`` wrote them), with vote extensions on from height 1: the validators sign the lists in them.
    """
    if not data_dirs:
        raise CometError("name at least one verifier data dir")
    if not _CHAIN_ID.fullmatch(chain_id):
        raise CometError(f"chain id {chain_id!r}: 1-50 of letters, digits, '.', '_', '-'")
    infos = [read_home(d) for d in data_dirs]
    if len({i.validator_address for i in infos}) != len(infos):
        raise CometError("two data dirs hold the same validator key; init each verifier in its own data dir")
    template = _read_json(home_of(data_dirs[0]) / "config" / "genesis.json")
    params = template.get("consensus_params")
    if not isinstance(params, dict) or not isinstance(params.get("abci"), dict):
        raise CometError("the first home's genesis.json has no consensus_params.abci; is this CometBFT v0.38?")
    params["abci"]["vote_extensions_enable_height"] = "1"
    if genesis_time is None:  # now, on ``clock`` (the machine's by default)
        genesis_time = datetime.fromtimestamp((clock or SystemClock()).unix(), UTC)
    when = genesis_time.astimezone(UTC)
    return {
        "genesis_time": when.strftime("%Y-%m-%dT%H:%M:%S.%f000Z"),
        "chain_id": chain_id,
        "initial_height": "1",
        "consensus_params": params,
        "validators": [
            {"address": i.validator_address,
             "pub_key": {"type": "tendermint/PubKeyEd25519", "value": i.validator_pub_key_b64},
             "power": str(power), "name": i.moniker}
            for i in infos
        ],
        "app_hash": "",
    }


def install_genesis(data_dirs: list[str], genesis: dict[str, object]) -> None:
    """Write ``genesis`` into every home and point each at all the others as persistent peers."""
    infos = [read_home(d) for d in data_dirs]
    for d, me in zip(data_dirs, infos, strict=True):
        if me.p2p_address.startswith(("0.0.0.0:", "[::]:")):
            raise CometError(f"{d} listens for peers on {me.p2p_address}, which others cannot dial; "
                             "re-run `gentorrent verifier init` with --p2p HOST:PORT")
    for d, me in zip(data_dirs, infos, strict=True):
        cfg = home_of(d) / "config"
        (cfg / "genesis.json").write_text(json.dumps(genesis, indent=2) + "\n")
        peers = ",".join(i.peer for i in infos if i.node_id != me.node_id)
        text = (cfg / "config.toml").read_text()
        (cfg / "config.toml").write_text(set_toml(text, "p2p", "persistent_peers", peers))
