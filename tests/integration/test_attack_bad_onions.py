"""Bad input at relays: wrong-size, garbage and replayed onions, unknown links and proxy paths,
bad frames; and a fuzz of RelayCore with any message from any peer. Dropped with a counted
reason, bounded tables, and the user keeps being served."""

from __future__ import annotations

import os
from collections import Counter

import msgpack
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from overlay.anon import onion
from overlay.anon.actions import Send
from overlay.anon.relay import RelayCore
from overlay.wire import codec, crypto
from overlay.wire.clock import TrioClock
from overlay.wire.messages import (
    CellBack,
    CellFwd,
    Create,
    Deliver,
    Destroy,
    ReturnClove,
)

from .attacks import (
    ask,
    ready_paths,
    relay_core,
    start_secnet,
)


async def test_bad_onions_unknown_links_and_garbage_are_counted(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_secnet(nursery, 18)
        user = net.client
        paths = await ready_paths(user)
        target = paths[0].first  # a relay carrying the user's traffic
        core = relay_core(net, target)
        bad = await net.start_raw_node(nursery)

        # wrong-size and garbage onions: Destroy back, counted, no state
        await bad.send(target, Create(os.urandom(16), b"short"), Create(os.urandom(16), os.urandom(onion.ONION_LEN)),
                       Create(os.urandom(16), bytes(onion.ONION_LEN)))
        assert core.dropped["onion-bad-size"] == 1 and core.dropped["onion-bad-mac"] == 1
        assert core.dropped["onion-bad-key"] == 1  # all-zero ephemeral key: a low-order point
        assert len(bad.received(Destroy)) == 3

        # a replayed onion (same packet, new link id) is dropped silently
        others = [e.node_id for e in net.registry.users() if e.node_id not in
                  {r.node_id for p in paths for r in p.relays} | {user.identity.node_id}]
        first, link, crypt, packet = await bad.build([target, others[0], others[1]])
        assert bad.path_ready(first, link, crypt) is not None  # an outsider can use relays (a known gap)
        await bad.send(target, Create(os.urandom(16), packet))
        assert core.dropped["onion-replayed"] == 1
        # ... also by a malicious first hop replaying the inner onion to the middle relay
        own = crypto.X25519Key.generate()
        packet, _ = onion.build_onion([own.public_bytes, net.registry.by_id[target].x25519_public,
                                       net.registry.by_id[others[2]].x25519_public],
                                      [bad.identity.node_id, target, others[2]], int(TrioClock().unix()) + 600)
        inner = onion.peel_onion(own, packet).next_onion
        await bad.send(target, Create(os.urandom(16), inner), Create(os.urandom(16), inner))
        assert core.dropped["onion-replayed"] == 2

        # unknown links and proxy paths; the user's own link id means nothing from another peer
        await bad.send(target, CellFwd(os.urandom(16), os.urandom(16), b"x" * 100),
                       CellBack(os.urandom(16), os.urandom(16), b"x" * 100),
                       CellFwd(paths[0].link_id, os.urandom(16), b"x" * 100),
                       Destroy(paths[0].link_id, "forged"), Destroy(os.urandom(16), "forged"),
                       ReturnClove(os.urandom(16), b"x" * 100))
        assert core.dropped["unknown-link"] == 5 and core.dropped["unknown-proxy-path"] == 1
        assert not paths[0].dead and len(core) == 3  # the user's path and the outsider's two

        # an oversize onion breaks the frame schema: the connection is dropped and counted
        raw = msgpack.packb([codec.WIRE_VERSION, 100, os.urandom(16), b"o" * 2000], use_bin_type=True)
        await bad.send_raw(target, len(raw).to_bytes(4, "big") + raw)
        assert net.user(target).node.rejected["bad-frame"] == 1
        # so does a frame of garbage (on a fresh connection)
        await bad.send_raw(target, (5).to_bytes(4, "big") + b"\xc1\xc1\xc1\xc1\xc1")
        assert net.user(target).node.rejected["bad-frame"] == 2
        assert user.node.rejected == Counter()

        assert await ask(user.client, "still served") == "still served"
        nursery.cancel_scope.cancel()


_PEERS = [b"U" * 20, b"M" * 20, b"S" * 20]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_relay_core_never_raises_and_stays_bounded(data):
    """Whatever arrives from whom, RelayCore returns actions or counts a drop; tables grow
    only by valid Creates."""
    cores = [RelayCore(os.urandom(20), crypto.X25519Key.generate()) for _ in range(3)]
    known = {c.node_id for c in cores} | {_PEERS[0], _PEERS[1]}
    for c in cores:
        c.knows = known.__contains__
    unix = 1_800_000_000
    packet, _ = onion.build_onion([c.static_key.public_bytes for c in cores], [c.node_id for c in cores],
                                  unix + 600)
    link = os.urandom(16)
    by_id = {c.node_id: c for c in cores}
    queue = [(_PEERS[0], Send(cores[0].node_id, Create(link, packet)))]
    while queue:
        src, a = queue.pop(0)
        if a.peer in by_id:
            queue += [(a.peer, s) for s in by_id[a.peer].on_message(src, a.msg, now=0.0, unix=unix)]
    links = [link] + [p.succ_link for c in cores for p in c.by_pred.values() if p.succ_link] + [os.urandom(16)]
    proxy_path_ids = [e for c in cores for e in c.by_proxy_path] + [os.urandom(16)]
    peers = _PEERS + [c.node_id for c in cores]
    b16 = st.binary(min_size=16, max_size=16)
    msgs = st.one_of(
        st.builds(Create, st.sampled_from(links) | b16,
                  st.sampled_from([packet, b""]) | st.binary(max_size=1024)
                  | st.binary(min_size=onion.ONION_LEN, max_size=onion.ONION_LEN)),
        st.builds(CellFwd, st.sampled_from(links) | b16, b16, st.binary(max_size=600)),
        st.builds(CellBack, st.sampled_from(links) | b16, b16, st.binary(max_size=600)),
        st.builds(Destroy, st.sampled_from(links) | b16, st.text(max_size=64)),
        st.builds(ReturnClove, st.sampled_from(proxy_path_ids) | b16, st.binary(max_size=600)),
        st.builds(Deliver, b16, st.binary(max_size=64)),
    )
    steps = data.draw(st.lists(st.tuples(st.sampled_from(range(3)), st.sampled_from(peers), msgs,
                                         st.floats(min_value=0, max_value=4000)), max_size=25))
    for i, peer, msg, now in steps:
        core = cores[i]
        before = sum(core.dropped.values())
        out = core.on_message(peer, msg, now=now, unix=unix + now)
        assert all(isinstance(s, Send) and len(s.peer) == 20 for s in out)
        if not out:
            assert sum(core.dropped.values()) > before or isinstance(msg, Destroy)
        assert len(core) <= 1 + sum(isinstance(m, Create) for _, _, m, _ in steps)
