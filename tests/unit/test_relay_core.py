"""RelayCore, the I/O-free relay state machine: table-driven cases with a tiny in-process router."""

from __future__ import annotations

import os

import pytest

from overlay.anon import onion
from overlay.anon.actions import Send
from overlay.anon.relay import RelayCore, RelayLimits
from overlay.wire import codec, crypto
from overlay.wire.messages import (
    CellBack,
    CellFwd,
    Create,
    Deliver,
    Destroy,
    FromModel,
    PathNotice,
    PathReady,
    ReturnClove,
    ToModel,
)

USER = b"U" * 20
MODEL = b"M" * 20
UNIX = 1_800_000_000


def make_relays(n=3, limits=None):
    cores = []
    for _ in range(n):
        cores.append(RelayCore(os.urandom(20), crypto.X25519Key.generate(), limits=limits or RelayLimits()))
    known = {c.node_id for c in cores} | {USER, MODEL}
    for c in cores:
        c.knows = known.__contains__
    return cores


def route(cores, sender, actions, now=0.0):
    """Deliver actions between cores until they leave the relay set; return what left."""
    by_id = {c.node_id: c for c in cores}
    out = []
    queue = [(sender, a) for a in actions]
    while queue:
        src, a = queue.pop(0)
        dst = by_id.get(a.peer)
        if dst is None:
            out.append((src, a))
            continue
        for nxt in dst.on_message(src, a.msg, now=now, unix=UNIX):
            queue.append((dst.node_id, nxt))
    return out


def build(cores, expires=UNIX + 600):
    pkt, keys = onion.build_onion([c.static_key.public_bytes for c in cores], [c.node_id for c in cores], expires)
    link = os.urandom(16)
    out = route(cores, USER, [Send(cores[0].node_id, Create(link, pkt))])
    return link, pkt, keys, out


def test_build_then_cells_both_ways():
    cores = make_relays()
    link, _pkt, keys, out = build(cores)
    (src, a), = out
    assert a.peer == USER and isinstance(a.msg, CellBack) and a.msg.link_id == link
    user = onion.PathCrypt(keys)
    ready = codec.decode(user.unwrap_backward(a.msg.iv, a.msg.body))
    assert isinstance(ready, PathReady)
    # forward: ToModel reaches the model node as Deliver with the proxy path id
    iv, body = user.wrap_forward(codec.encode(ToModel(dest=MODEL, sealed=b"sealed-clove")))
    (src, a), = route(cores, USER, [Send(cores[0].node_id, CellFwd(link, iv, body))])
    assert src == cores[2].node_id and a.peer == MODEL
    assert a.msg == Deliver(proxy_path_id=ready.proxy_path_id, sealed=b"sealed-clove")
    # backward: the model node's ReturnClove comes out at the user
    actions = cores[2].on_message(MODEL, ReturnClove(ready.proxy_path_id, b"reply-clove"), now=0, unix=UNIX)
    (src, a), = route(cores, cores[2].node_id, actions)
    assert a.peer == USER
    assert codec.decode(user.unwrap_backward(a.msg.iv, a.msg.body)) == FromModel(data=b"reply-clove")
    assert all(len(c) == 1 for c in cores)


def test_replayed_onion_is_dropped():
    cores = make_relays()
    _link, pkt, _keys, _ = build(cores)
    assert cores[0].on_message(USER, Create(os.urandom(16), pkt), now=0, unix=UNIX) == []
    assert cores[0].dropped["onion-replayed"] == 1


@pytest.mark.parametrize("expires,reason", [(UNIX - 1, "onion-expired"), (UNIX + 3 * 3600, "onion-expired")])
def test_expiry_bounds(expires, reason):
    cores = make_relays()
    _, _, _, out = build(cores, expires)
    assert [type(a.msg) for _, a in out] == [Destroy]
    assert cores[0].dropped[reason] == 1


def test_garbage_onion_gets_destroy_and_counted():
    c = make_relays(1)[0]
    out = c.on_message(USER, Create(os.urandom(16), os.urandom(onion.ONION_LEN)), now=0, unix=UNIX)
    assert [type(a.msg) for a in out] == [Destroy]
    assert c.dropped["onion-bad-mac"] == 1
    out = c.on_message(USER, Create(os.urandom(16), b"short"), now=0, unix=UNIX)
    assert c.dropped["onion-bad-size"] == 1
    assert len(c) == 0


def test_unknown_links_and_proxy_paths_are_dropped():
    c = make_relays(1)[0]
    assert c.on_message(USER, CellFwd(os.urandom(16), os.urandom(16), b"x"), now=0, unix=UNIX) == []
    assert c.on_message(USER, CellBack(os.urandom(16), os.urandom(16), b"x"), now=0, unix=UNIX) == []
    assert c.on_message(MODEL, ReturnClove(os.urandom(16), b"x"), now=0, unix=UNIX) == []
    assert c.dropped["unknown-link"] == 2 and c.dropped["unknown-proxy-path"] == 1


def test_a_return_clove_from_a_stranger_is_dropped_and_counted():
    """Issue 28 item 6: the proxy passes reply cloves back only from a model node the path
    delivered to (or one ``may_answer`` allows for it); anyone else who names the path id is
    dropped, counted, and leaves the path as it was."""
    cores = make_relays()
    proxy = cores[2]
    link, _pkt, keys, _out = build(cores)
    (ppid,) = proxy.by_proxy_path
    p = proxy.by_proxy_path[ppid]
    # before any delivery even the model node is a stranger to the path
    assert proxy.on_message(MODEL, ReturnClove(ppid, b"early"), now=1.0, unix=UNIX) == []
    user = onion.PathCrypt(keys)
    iv, body = user.wrap_forward(codec.encode(ToModel(dest=MODEL, sealed=b"s")))
    route(cores, USER, [Send(cores[0].node_id, CellFwd(link, iv, body))], now=2.0)
    state = (p.last_used, p.cells, dict(p.models), dict(p.delivered), proxy.forwarded)
    for stranger in (b"X" * 20, USER, cores[1].node_id, b"B" * 20):
        assert proxy.on_message(stranger, ReturnClove(ppid, b"watermark" * 1000), now=5.0, unix=UNIX) == []
    assert proxy.dropped["return-clove-stranger"] == 5
    assert (p.last_used, p.cells, dict(p.models), dict(p.delivered), proxy.forwarded) == state
    # the model node delivered to is answered
    (_src, a), = route(cores, proxy.node_id, proxy.on_message(MODEL, ReturnClove(ppid, b"reply"), now=6.0, unix=UNIX))
    assert a.peer == USER and user.unwrap_backward(a.msg.iv, a.msg.body) == codec.encode(FromModel(data=b"reply"))
    # a member of its group, as may_answer says (B, not X)
    proxy.may_answer = lambda delivered_to, node: delivered_to == MODEL and node == b"B" * 20
    assert len(proxy.on_message(b"B" * 20, ReturnClove(ppid, b"member"), now=7.0, unix=UNIX)) == 1
    assert proxy.on_message(b"X" * 20, ReturnClove(ppid, b"stranger"), now=7.0, unix=UNIX) == []
    assert proxy.dropped["return-clove-stranger"] == 6 and list(p.models) == [MODEL, b"B" * 20]


def test_link_ids_are_per_peer_and_differ_per_link():
    cores = make_relays()
    link, _pkt, _keys, _out = build(cores)
    links = {link}
    for c in cores[:-1]:
        (p,) = c.by_pred.values()
        links.add(p.succ_link)
    assert len(links) == 3
    # the same link id from another peer is a different (unknown) path
    assert cores[0].on_message(b"X" * 20, CellFwd(link, os.urandom(16), b"x"), now=0, unix=UNIX) == []
    assert cores[0].dropped["unknown-link"] == 1


def test_tampered_forward_cell_is_dropped_at_the_proxy():
    cores = make_relays()
    link, _pkt, keys, _out = build(cores)
    iv, body = onion.PathCrypt(keys).wrap_forward(codec.encode(ToModel(dest=MODEL, sealed=b"s")))
    bad = bytes([body[0] ^ 0x80]) + body[1:]
    # dropped at the proxy, which tells the user once (issue 15: the user replaces the path)
    ((_, a),) = route(cores, USER, [Send(cores[0].node_id, CellFwd(link, iv, bad))])
    notice = codec.decode(onion.PathCrypt(keys).unwrap_backward(a.msg.iv, a.msg.body))
    assert isinstance(notice, PathNotice) and notice.code == "cell-unauthentic"
    assert route(cores, USER, [Send(cores[0].node_id, CellFwd(link, iv, bad))]) == []  # only once
    assert cores[2].dropped["cell-unauthentic"] == 2


def test_unknown_destination_gets_a_notice_back():
    cores = make_relays()
    link, _pkt, keys, _out = build(cores)
    user = onion.PathCrypt(keys)
    iv, body = user.wrap_forward(codec.encode(ToModel(dest=b"Z" * 20, sealed=b"s")))
    (_src, a), = route(cores, USER, [Send(cores[0].node_id, CellFwd(link, iv, body))])
    notice = codec.decode(user.unwrap_backward(a.msg.iv, a.msg.body))
    assert isinstance(notice, PathNotice) and notice.code == "unknown-model-node"


def notices_at_user(cores, keys, actions):
    user = onion.PathCrypt(keys)
    return [codec.decode(user.unwrap_backward(a.msg.iv, a.msg.body)) for _, a in route(cores, cores[2].node_id, actions)]


def test_losing_the_model_node_signals_the_paths_that_used_it():
    cores = make_relays()
    proxy = cores[2]
    link, _pkt, keys, _out = build(cores)
    _link2, _pkt2, _keys2, _out2 = build(cores)  # a second path through the same proxy, unused
    iv, body = onion.PathCrypt(keys).wrap_forward(codec.encode(ToModel(dest=MODEL, sealed=b"s")))
    route(cores, USER, [Send(cores[0].node_id, CellFwd(link, iv, body))])
    # another node (a group member it forwarded to) sends reply cloves on the path too
    member = b"B" * 20
    proxy.may_answer = lambda delivered_to, node: (delivered_to, node) == (MODEL, member)
    ppid = next(iter(proxy.by_proxy_path))
    p = proxy.by_proxy_path[ppid]
    proxy.on_message(member, ReturnClove(ppid, b"clove"), now=0, unix=UNIX)
    assert list(p.models) == [MODEL, member]
    for lost in (MODEL, member):
        (notice,) = notices_at_user(cores, keys, proxy.on_peer_lost(lost))
        assert notice == PathNotice(code="model-lost", detail=notice.detail, model_node=lost)
    assert notices_at_user(cores, keys, proxy.on_peer_lost(MODEL)) == []  # once per loss
    # a relay that is not the proxy, and a peer the path never used, say nothing
    assert proxy.on_peer_lost(b"Q" * 20) == [] and cores[1].on_peer_lost(MODEL) == []


def test_a_failed_delivery_names_the_model_node():
    cores = make_relays()
    _link, _pkt, keys, _out = build(cores)
    ppid = next(iter(cores[2].by_proxy_path))
    (notice,) = notices_at_user(cores, keys, cores[2].deliver_failed(ppid, "unreachable", MODEL))
    assert notice.code == "model-unreachable" and notice.model_node == MODEL


def test_the_models_remembered_per_path_are_bounded():
    cores = make_relays()
    link, _pkt, keys, _out = build(cores)
    cores[2].knows = lambda node: True
    ppid = next(iter(cores[2].by_proxy_path))
    user = onion.PathCrypt(keys)
    for i in range(50):  # delivered to 50 model nodes: the last 8 are remembered
        iv, body = user.wrap_forward(codec.encode(ToModel(dest=bytes([i]) * 20, sealed=b"s")))
        route(cores, USER, [Send(cores[0].node_id, CellFwd(link, iv, body))])
    p = cores[2].by_proxy_path[ppid]
    assert list(p.delivered) == list(p.models) == [bytes([i]) * 20 for i in range(42, 50)]
    cores[2].may_answer = lambda delivered_to, node: True
    for i in range(100, 150):  # 50 more answer for them
        cores[2].on_message(bytes([i]) * 20, ReturnClove(ppid, b"c"), now=0, unix=UNIX)
    assert list(p.models) == [bytes([i]) * 20 for i in range(142, 150)]
    assert list(p.delivered) == [bytes([i]) * 20 for i in range(42, 50)]


def test_destroy_propagates_and_clears_tables():
    cores = make_relays()
    link, *_ = build(cores)
    out = route(cores, USER, [Send(cores[0].node_id, Destroy(link, "bye"))])
    assert out == [] and all(len(c) == 0 and not c.by_succ and not c.by_proxy_path for c in cores)


def test_peer_lost_tears_down_both_directions():
    cores = make_relays()
    build(cores)
    # the middle relay loses the proxy: it tells the first relay, which tells the user
    out = route(cores, cores[1].node_id, cores[1].on_peer_lost(cores[2].node_id))
    assert [(a.peer, type(a.msg)) for _, a in out] == [(USER, Destroy)]
    assert len(cores[0]) == 0 and len(cores[1]) == 0


def test_table_limits_and_rate_limits():
    limits = RelayLimits(max_paths=2, max_paths_per_peer=2, creates_per_s=1000, create_burst=1000,
                         cells_per_s=1.0, cell_burst=2.0)
    cores = make_relays(3, limits)
    for _ in range(2):
        build(cores)
    _, _, _, out = build(cores)
    assert [type(a.msg) for _, a in out] == [Destroy]
    assert cores[0].dropped["table-full"] == 1
    c = cores[0]
    for _ in range(5):
        c.on_message(USER, CellFwd(os.urandom(16), os.urandom(16), b"x"), now=0.0, unix=UNIX)
    assert c.dropped["cell-rate-limited"] == 3


def test_idle_paths_expire():
    cores = make_relays(3, RelayLimits(idle_timeout=10))
    build(cores)
    out = cores[0].expire(now=11.0)
    assert len(cores[0]) == 0 and {a.peer for a in out} == {USER, cores[1].node_id}


def test_flood_of_garbage_keeps_memory_bounded():
    c = make_relays(1, RelayLimits(creates_per_s=0.0, create_burst=50))[0]
    for _ in range(500):
        c.on_message(USER, Create(os.urandom(16), os.urandom(onion.ONION_LEN)), now=0.0, unix=UNIX)
    assert len(c) == 0 and len(c.replay) == 0
    assert c.dropped["create-rate-limited"] == 450
