"""Nodes that join through the committee, as real processes: 4 ``gentorrent verifier`` processes
(real CometBFT), relays and a model node started with ``--committee`` and no registry file, a chat
through them, ``gentorrent status``, and the rule that only registered nodes use the network.

Every wait is bounded; nothing asserts on time.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from gentorrent.tools.localnet import LocalNet, cli
from model_node.messages import NodeStats
from model_node.testing import node_stats
from overlay.anon import onion
from overlay.directory.lists import CommitteeClient, ListError, load_genesis
from overlay.net.transport import TLSTransport, TransportError
from overlay.wire import crypto
from overlay.wire.identity import Identity
from overlay.wire.messages import Create, Destroy

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalNet]:
    root = tmp_path_factory.mktemp("committee-net")
    with LocalNet(root, 12, users=("you",), models=1, committee=4) as n:
        n.start_committee(timeout=90)
        n.start(timeout=90)
        yield n


def _registered(net: LocalNet) -> set[bytes]:
    chain, vals = load_genesis(str(net.genesis_file))
    client = CommitteeClient(net.committee_addresses.split(","), chain, vals)
    return {e.node_id for e in trio.run(client.refresh).entries}


def _create_for(hops: list[Identity]) -> Create:
    pkt, _ = onion.build_onion([h.x25519.public_bytes for h in hops], [h.node_id for h in hops],
                               int(time.time()) + 600)
    return Create(crypto.random_bytes(16), pkt)


async def _ask_relay(me: Identity, net: LocalNet, relay: str) -> object:
    """Dial ``relay`` as ``me`` and open a path through it and two other relays; its first answer
    (``None`` if it said nothing within 5 s, as when it forwards the path on)."""
    e = net.entries[relay]
    hops = [net.identities[relay], net.identities["relay-1"], net.identities["relay-2"]]
    conn = await TLSTransport(me).dial(e.address, e.node_id)
    try:
        await conn.send(_create_for(hops))
        with trio.move_on_after(5):
            return await conn.receive()
        return None
    finally:
        await conn.aclose()


def test_nodes_register_themselves_and_no_registry_file_exists(net: LocalNet) -> None:
    assert not net.registry_file.exists()
    listed = _registered(net)
    started = {net.entries[n].node_id for n in net.relays + net.models}
    assert started <= listed  # every relay and the model node registered itself


def test_chat_through_nodes_that_joined_through_the_committee(net: LocalNet) -> None:
    config = net.config_toml("you", net.root / "chat.toml")
    prompt = "a prompt that crossed relays found through the committee"
    out = subprocess.run(cli("user", "chat", "--config", str(config), "--timeout", "60", "--log-level", "warning"),
                         input=prompt, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    assert prompt in out.stdout  # the echo engine streams the prompt back
    # The chat client registered for its run and left at its end (the signed lists show it a block later).
    assert net.identities["you"].node_id not in net.listed()
    deadline = time.monotonic() + 30
    while net.identities["you"].node_id in _registered(net):
        assert time.monotonic() < deadline, "the chat client's leave never reached the signed lists"
        time.sleep(0.5)


async def _model_stats(net: LocalNet, asker: str) -> NodeStats:
    """The model node's ``NodeStats``, asked over TLS by the registered node ``asker``."""
    e = net.entries[net.models[0]]
    conn = await TLSTransport(net.identities[asker]).dial(e.address, e.node_id)
    try:
        with trio.fail_after(10):
            return await node_stats(conn)
    finally:
        await conn.aclose()


def test_chats_spend_quota_tokens_redeemed_at_the_verifiers(net: LocalNet) -> None:
    """The committee's genesis has a quota section (the default): the chat fetched its tokens blind
    from the real verifiers, its request carried one, and the model node redeemed it at them
    (decision 0017); the unspent tokens stay in the chat's data dir for its next run."""
    config = net.config_toml("you", net.root / "chat-quota.toml")
    for i in range(2):
        out = subprocess.run(cli("user", "chat", "--config", str(config), "--timeout", "60", "--log-level", "warning"),
                             input=f"quota prompt {i}", capture_output=True, text=True, timeout=240)
        assert out.returncode == 0, out.stdout + out.stderr
    stats = trio.run(_model_stats, net, "relay-3")
    counts = {c.name: c.n for c in stats.quota}
    assert counts.get("tokened", 0) >= 2 and not counts.get("refused"), counts
    stored = net.root / "you" / "quota_tokens.bin"
    assert stored.exists() and stored.stat().st_mode & 0o777 == 0o600
    deadline = time.monotonic() + 30  # gone from the lists again before the next test counts the nodes
    while net.identities["you"].node_id in _registered(net):
        assert time.monotonic() < deadline, "the chat client's leave never reached the signed lists"
        time.sleep(0.5)


def test_status_shows_the_committee_and_the_registered_nodes(net: LocalNet) -> None:
    out = subprocess.run(cli("status", "--committee", net.committee_addresses, "--committee-genesis",
                             str(net.genesis_file), "--timeout", "10"), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("  up") >= 4 and out.stdout.count("  live (") == 4, out.stdout
    assert "signed lists at height" in out.stdout and "registered nodes (13)" in out.stdout, out.stdout
    assert "  quotas: a user's allowance at each issuer grows by" in out.stdout, out.stdout  # the genesis's settings


def test_an_unregistered_node_is_refused_and_a_node_that_leaves_loses_access(net: LocalNet) -> None:
    stranger = Identity.generate()
    got = trio.run(_ask_relay, stranger, net, "relay-0")
    assert isinstance(got, Destroy) and got.reason == "not-registered", got
    # A registered node's path is accepted (forwarded on: no Destroy comes back).
    leaver = net.identities["relay-11"]
    assert not isinstance(trio.run(_ask_relay, leaver, net, "relay-0"), Destroy)
    # relay-11 stops cleanly (SIGTERM): it leaves the lists, and relay-0 refuses it after its next refresh.
    proc = net.procs.pop("relay-11")
    proc.terminate()
    proc.wait(timeout=30)
    deadline = time.monotonic() + 60
    while leaver.node_id in _registered(net):
        assert time.monotonic() < deadline, "relay-11 did not leave the committee's lists"
        time.sleep(0.5)
    while True:
        try:
            got = trio.run(_ask_relay, leaver, net, "relay-0")
        except (TransportError, OSError, ListError):
            got = None
        if isinstance(got, Destroy) and got.reason == "not-registered":
            break
        assert time.monotonic() < deadline, f"relay-0 still accepts relay-11 after it left: {got}"
        time.sleep(1)


def test_a_model_node_without_a_reachable_committee_fails_clearly(net: LocalNet, tmp_path: Path) -> None:
    out = subprocess.run(cli("model-node", "--engine", "echo", "--data-dir", str(tmp_path), "--listen",
                             "127.0.0.1:0", "--committee", "127.0.0.1:9", "--committee-genesis", str(net.genesis_file)),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "registration with the committee failed" in out.stderr, out.stderr
    assert "127.0.0.1:9" in out.stderr and "is the committee running" in out.stderr
