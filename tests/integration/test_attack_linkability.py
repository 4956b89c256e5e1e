"""Linkability (issue 15, item 1): across all relays of a user's paths, no value a relay sees
is shared with another relay — of another path, or another hop of the same path — unless the
protocol needs it. Relays collude freely here: each one's view is everything it received
(decoded, every field, the onion it peeled with its own key) and everything it stores about
the path, and every pair of views is intersected.

What the protocol needs, and so may be shared (docs/overlay.md, "What each party learns"):
the identity (node id, keys, address) of a node that is a direct neighbour of both relays —
the user for the first relays of all paths, the model node for all proxies, a relay for its
two neighbours — and the id of a link both relays are on. Sizes (padding classes), counts and
timing of cells are not values a relay receives, and are covered by
``test_cells_reveal_only_a_size_class`` and documented; strings (protocol constants such as a
``Destroy`` reason) are left out.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from itertools import combinations
from typing import Any

import trio

from overlay.anon import onion
from overlay.anon.paths import Path
from overlay.testing import Net
from overlay.wire.messages import Create

from .attacks import ask, link_ids, ready_paths, relay_core, start_secnet


def values_of(obj: Any, out: set[Any]) -> None:
    """Every bytes and int value in a decoded message (nested dataclasses and tuples)."""
    if isinstance(obj, (bytes, bytearray)):
        out.add(bytes(obj))
    elif isinstance(obj, int) and not isinstance(obj, bool):
        out.add(obj)
    elif isinstance(obj, (tuple, list)):
        for x in obj:
            values_of(x, out)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            values_of(getattr(obj, f.name), out)


def relay_view(net: Net, node_id: bytes) -> set[Any]:
    """What relay ``node_id`` sees: every value of every message it received, what it learnt
    peeling each onion (expiry, next hop, ephemeral key, hop keys), its connections' peer
    identities, and its stored paths (neighbours, link ids, proxy path id)."""
    view: set[Any] = set()
    core = relay_core(net, node_id)
    for m in net.capture(node_id).received_messages():
        values_of(m, view)
        if isinstance(m, Create):
            r = onion.peel_onion(core.static_key, m.onion)
            values_of([r.expires, r.ephemeral, list(dataclasses.astuple(r.keys))], view)
            if not r.is_proxy:  # at the proxy the next-hop field is all zeros, meaning none
                view.add(r.next_node)
    for conn in net.user(node_id).node._conns.values():
        values_of([conn.peer_id, conn.peer_ed25519, conn.peer_x25519, conn.address.encode()], view)
    for p in core.by_pred.values():
        values_of([p.pred, p.pred_link, p.succ, p.succ_link, p.proxy_path_id], view)
    return view


async def test_no_value_links_two_paths_or_two_hops_of_a_path(autojump_clock):
    """The user builds its 4 paths in the same instant and sends requests; every pair of its
    12 relays shares only neighbours' identities and common link ids. On the code before
    issue 15 every hop of every path saw the same 32-bit onion expiry."""
    async with trio.open_nursery() as nursery:
        net = await start_secnet(nursery, 15)
        user = net.client
        paths = await ready_paths(user)
        for i in range(3):
            assert await ask(user.client, f"request {i}") == f"request {i}"
        model = net.model.identity.node_id
        identity_of: dict[Any, bytes] = {}
        for e in net.registry.entries:
            for v in (e.node_id, e.ed25519_public, e.x25519_public, e.address.encode()):
                identity_of[v] = e.node_id

        hops: list[tuple[Path, int]] = [(p, i) for p in paths for i in range(len(p.relays))]
        links = {id(p): link_ids(net, user.identity.node_id, p) for p in paths}

        def near(p: Path, i: int) -> set[bytes]:
            pred = user.identity.node_id if i == 0 else p.relays[i - 1].node_id
            succ = model if i == len(p.relays) - 1 else p.relays[i + 1].node_id
            return {pred, p.relays[i].node_id, succ}

        def on_links(p: Path, i: int) -> set[bytes]:
            return set(links[id(p)][i:i + 2])  # link i (from pred) and i+1 (to succ; none at the proxy)

        views = {(id(p), i): relay_view(net, p.relays[i].node_id) for p, i in hops}
        expiry: dict[tuple[int, int], int] = {}
        for p, i in hops:
            (create,) = [m for m in net.capture(p.relays[i].node_id).received_messages() if isinstance(m, Create)]
            expiry[(id(p), i)] = onion.peel_onion(relay_core(net, p.relays[i].node_id).static_key,
                                                  create.onion).expires
            assert expiry[(id(p), i)] in views[(id(p), i)]  # positive control: the view holds the expiry

        linked: list[str] = []
        for (pa, ia), (pb, ib) in combinations(hops, 2):
            shared = views[(id(pa), ia)] & views[(id(pb), ib)]
            common_nodes = near(pa, ia) & near(pb, ib)
            common_links = on_links(pa, ia) & on_links(pb, ib)
            for v in shared:
                if identity_of.get(v) in common_nodes or v in common_links:
                    continue
                if v == expiry[(id(pa), ia)] == expiry[(id(pb), ib)]:
                    continue  # two independent draws may coincide (1 in EXPIRY_JITTER): checked below
                where = "hops of one path" if pa is pb else "two paths"
                linked.append(f"{where} ({ia}, {ib}) share {v!r:.60}")
        assert not linked, f"{len(linked)} linking values, e.g. {linked[:5]}"

        # The expiries are independent draws from EXPIRY_JITTER values: a pair may coincide by
        # chance (p ≈ 66/1200 here), four coincidences essentially never (p < 1e-6).
        drawn = list(expiry.values())
        assert max(Counter(drawn).values()) <= 3 and len(set(drawn)) >= len(drawn) - 3
        # Positive control: neighbours do share their link and each other's identity.
        p = paths[0]
        assert links[id(p)][1] in views[(id(p), 0)] & views[(id(p), 1)]
        assert p.relays[1].node_id in views[(id(p), 0)] & views[(id(p), 2)]
        nursery.cancel_scope.cancel()
