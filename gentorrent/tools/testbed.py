"""The wide-area testbed's network: every node on its own loopback address, behind Toxiproxy
"access links" that give each pair of regions its delay, plus a churn schedule.

Address plan (docs/testbed.md "How it is wired"):

- node ``i`` (relays, model nodes, in-process clients, verifiers, in that order) listens on
  ``127.1.A.B`` (:func:`node_host`), on its own port;
- for every source region ``r`` (its index in :attr:`Testbed.regions`) the node has one proxy
  at ``127.(10+r).A.B``, same port (:func:`proxy_host`), carrying the one-way delay, jitter and
  bandwidth of the pair (``r``, the node's region) on both streams
  (:func:`gentorrent.tools.regions.link`);
- a process in region ``r`` runs with ``GENTORRENT_VIA=127.1.0.0/16=127.(10+r).0.0/16``
  (:class:`overlay.net.transport.Via`), so its overlay dials cross its region's links, and its
  ``--committee`` names the verifiers' RPC proxies of its region; each verifier's CometBFT
  ``persistent_peers`` name the other verifiers' P2P proxies of its region (PEX off, so no
  peer is dialled around the links).

Registered, listed and pinned addresses stay the real ``127.1.A.B:P``: only where a TCP
connection goes changes. What this does not model is listed in docs/testbed.md.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gentorrent.tools import regions as geo
from gentorrent.tools.localnet import LocalNet
from gentorrent.tools.toxiproxy import ProxySpec, Toxiproxy

NODE_OCTET = 1  # nodes listen in 127.1.0.0/16
VIA_OCTET = 10  # region r's proxies live in 127.(10+r).0.0/16
PER_BLOCK = 250  # hosts 127.x.A.1 ... 127.x.A.250
MAX_NODES = PER_BLOCK * 256
MAX_REGIONS = 255 - VIA_OCTET


def _octets(index: int) -> str:
    if not 0 <= index < MAX_NODES:
        raise ValueError(f"node index {index} out of range (at most {MAX_NODES} nodes)")
    return f"{index // PER_BLOCK}.{index % PER_BLOCK + 1}"


def node_host(index: int) -> str:
    """The loopback address node ``index`` listens on."""
    return f"127.{NODE_OCTET}.{_octets(index)}"


def proxy_host(index: int, region: int) -> str:
    """The address of node ``index``'s access link for dialers in region number ``region``."""
    if not 0 <= region < MAX_REGIONS:
        raise ValueError(f"region number {region} out of range")
    return f"127.{VIA_OCTET + region}.{_octets(index)}"


def via_rule(region: int) -> str:
    """``GENTORRENT_VIA`` for a process in region number ``region``."""
    return f"127.{NODE_OCTET}.0.0/16=127.{VIA_OCTET + region}.0.0/16"


# ---------------------------------------------------------------------------------------- churn


@dataclass(frozen=True)
class ChurnEvent:
    at_s: float  # seconds after the churn starts
    name: str
    kind: str  # "crash" (SIGKILL), "leave" (SIGTERM: the node leaves the committee's lists), "join"


def churn_schedule(names: Sequence[str], *, duration_s: float, leave_per_min: float, crash_share: float,
                   mean_downtime_s: float, seed: int, start_s: float = 0.0) -> list[ChurnEvent]:
    """Leaves and joins of ``names`` during ``duration_s`` seconds, sorted by time.

    The paper's churn model (§5.2, after measured P2P session statistics): departures are a
    Poisson process, ``leave_per_min`` of the population a minute on average, each taking a
    node chosen uniformly among those online; so an online node's session is exponential with
    mean ``1 / leave_per_min`` minutes. A departure is a crash with probability ``crash_share``,
    else a clean leave. The node comes back (same key, same address: its reservation keeps both
    for it, decision 0014) after an exponential downtime of mean ``mean_downtime_s``, if that is
    within the run; until then it is offline and cannot leave again."""
    if duration_s < 0 or leave_per_min < 0 or not 0.0 <= crash_share <= 1.0 or mean_downtime_s <= 0:
        raise ValueError("need duration_s >= 0, leave_per_min >= 0, 0 <= crash_share <= 1, mean_downtime_s > 0")
    rng = random.Random(seed)
    rate_per_s = leave_per_min * len(names) / 60.0
    events: list[ChurnEvent] = []
    back_at: dict[str, float] = {}
    t = start_s
    while rate_per_s > 0:
        t += rng.expovariate(rate_per_s)
        if t >= start_s + duration_s:
            break
        online = [n for n in names if back_at.get(n, -math.inf) <= t]
        if not online:
            continue
        name = rng.choice(online)
        events.append(ChurnEvent(t, name, "crash" if rng.random() < crash_share else "leave"))
        back = t + rng.expovariate(1.0 / mean_downtime_s)
        back_at[name] = back
        if back < start_s + duration_s:
            events.append(ChurnEvent(back, name, "join"))
    return sorted(events, key=lambda e: (e.at_s, e.name))


# ----------------------------------------------------------------------------------- the network


class Testbed(LocalNet):
    """A :class:`LocalNet` whose nodes sit in regions behind Toxiproxy access links.

    ``clients`` are extra registered users this class does not start (the bench's in-process
    clients); ``client_regions`` places them (default: round robin over the regions). Relays
    are placed by :func:`gentorrent.tools.regions.assign` (seeded); model nodes and verifiers
    round robin, so each model node and each verifier is in a different region where there are
    enough regions. ``bench_args`` start the model nodes through the bench launcher
    (:class:`~gentorrent.tools.localnet.LocalNet`): ``bench forwarding-wide-area`` injects its
    forwarding baselines so."""

    def __init__(self, root: Path, *, relays: int, models: int, verifiers: int = 4, clients: Sequence[str] = (),
                 client_regions: Mapping[str, str] | None = None, regions: Sequence[str] = geo.REGIONS,
                 engine: str = "echo", model: str = "echo", seed: int = 0, timeout_commit: str = "1s",
                 model_args: tuple[str, ...] = (), bench_args: tuple[str, ...] = (),
                 loss: float = geo.LOSS) -> None:
        if not 0.0 <= loss <= 1.0:  # also NaN
            raise ValueError(f"loss {loss!r}: must be a fraction of segments in [0, 1]")
        self.loss = loss
        if not 1 <= len(regions) <= MAX_REGIONS:
            raise ValueError(f"need 1 to {MAX_REGIONS} regions")
        for r in regions:
            geo.check_region(r)
        self.regions = tuple(regions)
        relay_names = [f"relay-{i}" for i in range(relays)]
        model_names = [f"model-{i}" for i in range(models)]
        verifier_names = [f"verifier-{i}" for i in range(verifiers)]
        order = [*relay_names, *model_names, *clients, *verifier_names]
        self.index = {name: i for i, name in enumerate(order)}
        self.region_of: dict[str, str] = dict(zip(relay_names, geo.assign(relays, seed, dict.fromkeys(self.regions, 1.0)),
                                                  strict=True))
        for i, name in enumerate(model_names):
            self.region_of[name] = self.regions[i % len(self.regions)]
        for i, name in enumerate(verifier_names):
            self.region_of[name] = self.regions[(i + 1) % len(self.regions)]
        for i, name in enumerate(clients):
            self.region_of[name] = (client_regions or {}).get(name, self.regions[i % len(self.regions)])
        self.toxiproxy: Toxiproxy | None = None
        self._by_address: dict[str, str] = {}
        super().__init__(root, relays, users=tuple(clients), models=models, model=model, engine=engine,
                         committee=verifiers, timeout_commit=timeout_commit, model_args=model_args,
                         bench_args=bench_args)

    # LocalNet's hooks

    def host(self, name: str) -> str:
        return node_host(self.index[name])

    def region_number(self, name: str) -> int:
        return self.regions.index(self.region_of[name])

    def committee_for(self, name: str | None) -> str:
        if name is None:
            return self.committee_addresses
        r = self.region_number(name)
        return ",".join(f"{proxy_host(self.index[v], r)}:{self.verifier_ports[v][1]}" for v in self.verifiers)

    def env_for(self, name: str) -> dict[str, str]:
        return {**os.environ, "GENTORRENT_VIA": via_rule(self.region_number(name))}

    def command(self, name: str) -> list[str]:
        cmd = super().command(name)
        return cmd if name in self.verifiers else [*cmd, "--region", self.region_of[name]]

    def after_genesis(self) -> None:
        """Each verifier peers with the others through its region's P2P proxies, PEX off."""
        ids = {v: cometbft_node_id(self.root / v / "cometbft") for v in self.verifiers}
        for v in self.verifiers:
            r = self.region_number(v)
            peers = ",".join(f"{ids[w]}@{proxy_host(self.index[w], r)}:{self.verifier_ports[w][0]}"
                             for w in self.verifiers if w != v)
            path = self.root / v / "cometbft" / "config" / "config.toml"
            text = _set_line(path.read_text(), "persistent_peers", f'"{peers}"')
            path.write_text(_set_line(text, "pex", "false"))

    # the links

    def listeners(self) -> dict[str, list[int]]:
        """Every listener behind a link: a node's port; a verifier's CometBFT P2P and RPC ports."""
        out = {n: [self.ports[n]] for n in self.names}
        for v in self.verifiers:
            out[v] = list(self.verifier_ports[v])
        return out

    def proxy_specs(self) -> list[tuple[ProxySpec, geo.Link]]:
        """One proxy per (listener, source region), with that pair of regions' link."""
        specs = []
        for name, ports in self.listeners().items():
            for port in ports:
                for r, src in enumerate(self.regions):
                    spec = ProxySpec(f"{name}:{port}@{src}", f"{proxy_host(self.index[name], r)}:{port}",
                                     f"{self.host(name)}:{port}")
                    specs.append((spec, geo.link(src, self.region_of[name], loss=self.loss)))
        return specs

    def start_links(self, proxy: Toxiproxy) -> int:
        """Create every access link on a running ``proxy``; the number of proxies."""
        specs = self.proxy_specs()
        proxy.populate(s for s, _ in specs)
        for spec, link in specs:
            proxy.set_link(spec.name, link)
        self.toxiproxy = proxy
        return len(specs)

    # what the links imply

    def one_way_ms(self, a: str, b: str) -> float:
        """The configured one-way delay between nodes ``a`` and ``b`` (their regions')."""
        return geo.one_way_ms(self.region_of[a], self.region_of[b])

    def name_at(self, address: str) -> str | None:
        """The node listening at ``address`` (a registered ``host:port``), if it is one of ours."""
        if len(self._by_address) != len(self.entries):
            self._by_address = {e.address: name for name, e in self.entries.items()}
        return self._by_address.get(address)

    def floor_ms(self, hops: Iterable[str]) -> float:
        """The propagation floor of a route through nodes ``hops`` (one way)."""
        return geo.path_floor_ms([self.region_of[h] for h in hops])


def cometbft_node_id(home: Path) -> str:
    """A CometBFT home's P2P node id: the first 20 bytes of SHA-256 of its Ed25519 node key, hex.
    (What ``verifier.cometbft.read_home`` reads too; overlay may not import a role package, and
    this and :func:`_set_line` are all the testbed needs of it.)"""
    doc = json.loads((home / "config" / "node_key.json").read_text())
    key = base64.b64decode(doc["priv_key"]["value"])
    if len(key) != 64:
        raise ValueError(f"{home}: node_key.json holds no Ed25519 key")
    return hashlib.sha256(key[32:]).digest()[:20].hex()


def _set_line(text: str, key: str, value: str) -> str:
    """Set ``key = value`` in the [p2p] section of a CometBFT config.toml (the key must be there)."""
    section, out, done = "", [], False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("[") and stripped.endswith("]"):
            section = stripped[1:-1]
        elif section == "p2p" and stripped.split("=")[0].strip() == key and not done:
            line, done = f"{key} = {value}", True
        out.append(line)
    if not done:
        raise ValueError(f"config.toml has no p2p.{key}")
    return "\n".join(out) + "\n"
