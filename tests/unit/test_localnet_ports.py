"""``gentorrent.tools.localnet.free_ports`` and its :class:`PortPool`: listener ports for local
networks come from below the kernel's ephemeral range (no outgoing connection can take one before
its listener binds) and are never handed out twice in one process."""

from __future__ import annotations

import socket

import pytest

from gentorrent.tools import localnet
from gentorrent.tools.localnet import PortPool


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    lo = localnet.ephemeral_low()
    ports = localnet.free_ports(40)
    assert len(set(ports)) == 40
    assert all(lo - localnet.LISTEN_PORTS <= p < lo for p in ports), (lo, ports)
    for p in ports:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", p))


def test_free_ports_never_repeats_within_a_process() -> None:
    seen: set[int] = set()
    for _ in range(20):
        ports = localnet.free_ports(10)
        assert not seen & set(ports)
        seen |= set(ports)


def test_a_port_with_a_listener_is_not_handed_out() -> None:
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        pool = PortPool(port + 68, span=68)  # exactly 68 ports, the first one held
        got = pool.take(1)
        assert got != [port] and port < got[0] < port + 68
        assert pool.given == set(got)


def test_falls_back_to_os_ports_when_the_range_is_too_small() -> None:
    ports = PortPool(1030).take(3)
    assert len(set(ports)) == 3 and all(p >= 1030 for p in ports)


def test_pools_of_different_slices_never_hand_out_the_same_port() -> None:
    """Parallel test workers each take ports from their own slice (GENTORRENT_PORT_SLICE=i/n, set
    by the tests' conftest): in a CI run one worker's relay found its port bound by another's."""
    from gentorrent.tools.localnet import PortPool, port_slice

    a, b = PortPool(32768, 12_000, (0, 2)), PortPool(32768, 12_000, (1, 2))
    assert a.low <= b.first and a.first == 32768 - 12_000 and b.low == 32768
    assert not set(a.take(200)) & set(b.take(200))
    assert port_slice("1/2") == (1, 2) and port_slice(None) == port_slice("x") == port_slice("2/2") == (0, 1)
    with pytest.raises(ValueError):
        PortPool(32768, 12_000, (3, 2))
