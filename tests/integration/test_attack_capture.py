"""Capture (paper §3.2): what each relay receives and stores contains nothing about the user's
traffic and names only its two neighbours; cells reveal only a size class. Every node is
captured (overlay.testing.Capture) and every relay's state harvested."""

from __future__ import annotations

import dataclasses
import os
import types
from collections import Counter, defaultdict, deque
from collections.abc import Mapping
from typing import Any

import trio

from overlay.anon import sida
from overlay.anon.relay import RelayCore
from overlay.testing import Net, settle
from overlay.usernode import UserNode
from overlay.wire import codec
from overlay.wire.messages import (
    LINK_ID_LEN,
    CellBack,
    CellFwd,
    ReplyChunk,
    Request,
)

from .attacks import (
    EvilCore,
    ask,
    link_ids,
    ready_paths,
    relay_core,
    start_secnet,
)


def harvest(obj: Any, out: list[bytes], seen: set[int] | None = None) -> None:
    """Every bytes and str value reachable from ``obj`` (dataclasses, slots, __dict__,
    containers); opaque objects (cipher contexts) contribute their repr; callables
    (e.g. the registry lookup ``knows``) are not followed."""
    seen = set() if seen is None else seen
    if isinstance(obj, (bytes, bytearray, memoryview)):
        out.append(bytes(obj))
        return
    if isinstance(obj, str):
        out.append(obj.encode())
        return
    if obj is None or isinstance(obj, (bool, int, float)):
        return
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            harvest(k, out, seen)
            harvest(v, out, seen)
        return
    if isinstance(obj, (list, tuple, set, frozenset, deque)):
        for x in obj:
            harvest(x, out, seen)
        return
    if callable(obj) or isinstance(obj, types.ModuleType):
        return
    attrs: dict[str, Any] = {}
    for cls in type(obj).__mro__:
        slots = getattr(cls, "__slots__", ())
        for name in [slots] if isinstance(slots, str) else slots:
            if hasattr(obj, name):
                attrs[name] = getattr(obj, name)
    attrs.update(getattr(obj, "__dict__", {}))
    if not attrs:
        out.append(repr(obj).encode())
        return
    for v in attrs.values():
        harvest(v, out, seen)


def relay_state(u: UserNode) -> bytes:
    """Everything a relay node stores about traffic: its whole RelayCore (by_pred, by_succ,
    by_proxy_path keys and every _Path field with its hop keys, per-peer counts, token buckets,
    the replay cache, counters), its node's connections (peer id, keys, address), outbox,
    dial-lock and ping tables, ``seen``, and the rejection counters. Not the registry
    (``node.peers``): it is public and identical on every node."""
    out: list[bytes] = []
    core = u.relay.core
    test_only = {f.name for f in dataclasses.fields(EvilCore)} - {f.name for f in dataclasses.fields(RelayCore)}
    harvest({k: v for k, v in vars(core).items() if k not in test_only}, out)
    node = u.node
    for peer, conn in node._conns.items():
        harvest([peer, conn.peer_id, conn.peer_ed25519, conn.peer_x25519, conn.address], out)
    harvest([list(node._outboxes), list(node._dial_locks), node._pings, node.seen, node.rejected,
             node.transport.rejected], out)
    return b"\x00".join(out)


async def test_relays_learn_only_their_neighbours_and_nothing_of_the_traffic(autojump_clock, monkeypatch):
    """Capture every byte each relay receives and everything it stores over several requests;
    search it for the prompt and reply, the user's identity, the S-IDA message ids, shares,
    fingerprints and fragments of request and reply cloves, the request ids, return keys,
    return tags and proxy path ids, other hops' keys, and link ids of links the relay is not on."""
    splits: list[tuple[bytes, list[sida.Clove]]] = []
    real_split = sida.split

    def spy(message: bytes, n: int = 4, k: int = 3, *, msg_id: bytes | None = None) -> list[sida.Clove]:
        cloves = real_split(message, n, k, msg_id=msg_id)
        splits.append((message, cloves))
        return cloves

    monkeypatch.setattr(sida, "split", spy)
    async with trio.open_nursery() as nursery:
        net = await start_secnet(nursery, 15)
        user = net.client
        assert user.paths is not None
        me = user.identity
        prompts = [" ".join(f"secret{i}word{j:02d}{os.urandom(3).hex()}" for j in range(30)) for i in range(5)]
        system = "system-prompt-" + os.urandom(6).hex()
        for p in prompts:
            assert await ask(user.client, p, system=system) == p
        paths = await ready_paths(user)
        assert user.paths.built == 4 and user.paths.failed == 0  # these are the only paths ever built
        links = {id(p): link_ids(net, me.node_id, p) for p in paths}
        state = {u.identity.node_id: relay_state(u) for u in net.users[1:]}
        model_state: list[bytes] = []
        responder, mnode = net.model.responder, net.model.node
        harvest([responder.reassembler, responder.answered._new, responder.answered._old, responder.dropped, list(mnode._outboxes)], model_state)
        for peer, conn in mnode._conns.items():
            harvest([peer, conn.peer_id, conn.peer_ed25519, conn.peer_x25519, conn.address], model_state)
        state[net.model.identity.node_id] = b"\x00".join(model_state)
        check_capture(net, paths, links, state, splits, prompts, system)
        # The model node reads the prompt (it must) but hears only from proxies: no trace of
        # the user or of the other hops, no link ids, no hop keys.
        assert set(mnode._conns) <= {p.proxy.node_id for p in paths}
        captured = net.capture(net.model.identity.node_id).received_bytes() + state[net.model.identity.node_id]
        hidden = [me.node_id, me.ed25519_public, me.x25519_public]
        hidden += [r.node_id for p in paths for r in p.relays[:-1]] + [v for ls in links.values() for v in ls]
        hidden += [k for p in paths for h in p.crypt.hops for k in dataclasses.astuple(h.keys)]
        assert not [v for v in hidden if v in captured]
        assert all(p.proxy.ed25519_public in captured for p in paths)  # positive control
        nursery.cancel_scope.cancel()


def check_capture(net: Net, paths: list[Any], links: dict[int, list[bytes]], state: dict[bytes, bytes],
                  splits: list[tuple[bytes, list[sida.Clove]]], prompts: list[str], system: str) -> None:
    me = net.client.identity

    requests = [codec.decode(m) for m, _ in splits if isinstance(codec.decode(m), Request)]
    replies = [codec.decode(m) for m, _ in splits if isinstance(codec.decode(m), ReplyChunk)]
    assert len(requests) == 5 and len(replies) >= 10  # streamed: several chunks per reply

    secret = _secrets(splits, prompts, system, requests, replies)
    user_ids = [me.node_id, me.ed25519_public, me.x25519_public, net.registry.by_id[me.node_id].address.encode()]
    allowed, limited = _who_may_know(paths, links, requests, user_ids)
    _check_relays_learn_nothing_else(net, paths, state, secret, allowed, limited)
    _check_hops_know_only_their_neighbours(net, paths, state)


def _secrets(splits: list[tuple[bytes, list[sida.Clove]]], prompts: list[str], system: str,
             requests: list[Request], replies: list[ReplyChunk]) -> list[bytes]:
    """What no relay may see: the prompts and replies, their words, ids, keys and cloves."""
    secret: list[bytes] = [system.encode()]
    for p in prompts:
        secret += [p.encode()] + [w.encode() for w in p.split()]
    secret += [c.text.encode() for c in replies if len(c.text) >= 8]
    secret += [c.signature for c in replies if getattr(c, "signature", b"")]  # the model node's signed reply
    secret += [r.request_id for r in requests] + [rp.key for r in requests for rp in r.return_paths]
    for _, cloves in splits:
        for c in cloves:
            secret += [c.msg_id, c.share, c.fragment[:16], c.fragment[-16:]]
            secret += [c.fingerprints[i:i + 16] for i in range(0, len(c.fingerprints), 16)]
    return secret


def _who_may_know(paths: list[Any], links: dict[int, list[bytes]], requests: list[Request],
                  user_ids: list[bytes]) -> tuple[dict[bytes, set[bytes]], set[bytes]]:
    """``(allowed, limited)``: the values of paths and links (``limited``), and which of them
    each relay may know (``allowed``). Position i of path p knows links i and i+1, its own hop
    keys, and (the proxy) the path's proxy path id and return tags; the first hop knows the user."""
    allowed: dict[bytes, set[bytes]] = defaultdict(set)
    limited: set[bytes] = set()
    for p in paths:
        hop_keys = [list(dataclasses.astuple(h.keys)) for h in p.crypt.hops]
        tags = [rp.tag for r in requests for rp in r.return_paths if rp.proxy_path_id == p.proxy_path_id]
        for j, link in enumerate(links[id(p)]):
            limited.add(link)
            for i in (j - 1, j):
                if 0 <= i < len(p.relays):
                    allowed[p.relays[i].node_id].add(link)
        for i, r in enumerate(p.relays):
            limited.update(hop_keys[i])
            allowed[r.node_id].update(hop_keys[i])
        assert p.proxy_path_id is not None and tags
        limited.update([p.proxy_path_id, *tags])
        allowed[p.proxy.node_id].update([p.proxy_path_id, *tags])
        allowed[p.first].update(user_ids)
    limited.update(user_ids)
    return allowed, limited


def _check_relays_learn_nothing_else(net: Net, paths: list[Any], state: dict[bytes, bytes], secret: list[bytes],
                                     allowed: dict[bytes, set[bytes]], limited: set[bytes]) -> None:
    """No relay's capture (what it received, and its state) holds a secret, or a value of a
    path or link it is not on; those on the paths did hear their cells."""
    on_paths = {r.node_id for p in paths for r in p.relays}
    assert len(on_paths) == 12
    for u in net.users[1:]:
        rid = u.identity.node_id
        msgs = net.capture(rid).received_messages()
        captured = net.capture(rid).received_bytes() + b"\x00" + state[rid]
        leaks = [s for s in secret if s in captured or s.hex().encode() in captured]
        assert not leaks, f"relay {rid.hex()[:8]} saw {len(leaks)} secrets, e.g. {leaks[0][:40]!r}"
        bad = [s for s in limited - allowed[rid] if s in captured or s.hex().encode() in captured]
        assert not bad, f"relay {rid.hex()[:8]} saw {len(bad)} values of paths or links it is not on"
        # positive controls: the capture is real and searchable
        if rid in on_paths:
            assert msgs and any(isinstance(m, (CellFwd, CellBack)) for m in msgs)
            assert all(v in captured for v in allowed[rid] if len(v) == LINK_ID_LEN and v in limited)
        else:
            assert msgs == []  # a relay on none of the user's paths hears nothing at all


def _check_hops_know_only_their_neighbours(net: Net, paths: list[Any], state: dict[bytes, bytes]) -> None:
    """Each relay's tables and connections name only its predecessor and successor (and, at
    the proxy, the model node it delivers to); no other node's id or keys reach it."""
    me = net.client.identity
    model_id = net.model.identity.node_id
    for p in paths:
        for i, r in enumerate(p.relays):
            u = net.user(r.node_id)
            core = u.relay.core
            pred = me.node_id if i == 0 else p.relays[i - 1].node_id
            succ = p.relays[i + 1].node_id if i + 1 < len(p.relays) else model_id
            (hop,) = core.by_pred.values()
            assert (hop.pred, hop.succ) == (pred, None if succ == model_id else succ)
            named = ({k[0] for k in core.by_pred} | {k[0] for k in core.by_succ} | set(core.per_peer)
                     | set(core._cell_buckets) | set(core._create_buckets) | set(u.node._conns)
                     | set(u.node._outboxes) | set(u.node.seen))
            assert named <= {pred, succ}
            captured = net.capture(r.node_id).received_bytes() + state[r.node_id]
            for other in net.registry.entries:
                if other.node_id in (pred, succ, r.node_id):
                    continue
                for v in (other.node_id, other.ed25519_public, other.x25519_public):
                    assert v not in captured, f"hop {i} learned about a node that is not its neighbour"


async def test_cells_reveal_only_a_size_class(autojump_clock):
    """Cloves are padded to power-of-two buckets: prompts of different lengths in one bucket
    give cells of one size on every link; the n cells of a request are the same size."""
    async with trio.open_nursery() as nursery:
        net = await start_secnet(nursery, 15)
        paths = await ready_paths(net.client)
        hops = [relay_core(net, r.node_id) for p in paths for r in p.relays]
        sizes = []
        for text in ("short", "a somewhat longer prompt of a few more words", "x" * 5000):
            for c in hops:
                c.cell_sizes.clear()
            assert await ask(net.client.client, text) == text
            await settle()  # the n-th reply clove may still be on its way
            # the n request cells look alike, and on every link: layers never change the length
            fwd = {n for c in hops for kind, n in c.cell_sizes if kind == "CellFwd"}
            assert len(fwd) == 1 and sum(kind == "CellFwd" for c in hops for kind, _ in c.cell_sizes) == 12
            sizes.append(fwd.pop())
            # the n cloves of a reply chunk look alike too, on every link (CellBack reaches
            # the middle and first relays; the proxy gets a ReturnClove)
            back = Counter(n for c in hops for kind, n in c.cell_sizes if kind == "CellBack")
            assert back and all(v % (4 * 2) == 0 for v in back.values())
        assert sizes[0] == sizes[1] < sizes[2]
        nursery.cancel_scope.cancel()
