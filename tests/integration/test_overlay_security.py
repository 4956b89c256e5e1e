"""Security properties of the anonymous overlay (paper §3.2; DESIGN.md "Anonymous overlay").

Everything runs over in-memory transports with trio's autojump clock, so every
timeout is instant; nothing here asserts on wall-clock time. The network is
built here (not with ``overlay_net``) because these tests need hooks on every
node: a transport ``tap`` that records every byte a node receives (handshake
included), a :class:`RelayCore` subclass that can turn malicious on command,
and a relay clock the test can move forward.

1. Capture: what each relay receives and stores contains nothing about the
   user's traffic, and names only its two neighbours.
2. Forging and tampering: malicious relays and proxies on fewer than n-k+1
   paths cannot stop or alter a reply; on more, requests fail with
   :class:`AnonError`, never with garbage.
3. Bad input: wrong-size, garbage and replayed onions, unknown links and
   proxy paths, cells on expired paths, unsealable cloves, floods: dropped with a
   counted reason, bounded tables, and other users keep being served.
4. Paths: disjoint, regional, never through oneself; refreshed; failed paths'
   relays avoided; a proxy cannot steer traffic at non-model nodes.
"""

from __future__ import annotations

import dataclasses
import os
import types
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import overlay.paths
from model_node.echo import EchoEngine
from model_node.server import ModelNode
from overlay import codec, crypto, onion, sida
from overlay.actions import Send
from overlay.anon import AnonError
from overlay.clock import TrioClock
from overlay.identity import Identity
from overlay.messages import (
    LINK_ID_LEN,
    CellBack,
    CellFwd,
    ChatMessage,
    Create,
    Deliver,
    Destroy,
    PathNotice,
    PathReady,
    ReplyChunk,
    Request,
    ReturnClove,
    SamplingParams,
    ToModel,
)
from overlay.node import Node
from overlay.peers import PeerEntry
from overlay.registry import Registry
from overlay.relay import RelayCore, RelayLimits
from overlay.seal import seal_to
from overlay.transport import MemoryNetwork, MemoryTransport
from overlay.usernode import UserNode

PARAMS = SamplingParams(max_tokens=4096)


# =========================================================================== the network


class SkewClock(TrioClock):
    """The relays' clock: trio's (autojump) clock, with a skew the test can add to ``monotonic``
    (``unix`` stays on trio's, so onion expiry stamps still agree with the client's)."""

    def __init__(self) -> None:
        self.skew = 0.0

    def monotonic(self) -> float:
        return super().monotonic() + self.skew


@dataclass
class EvilCore(RelayCore):
    """A relay that behaves until ``attack`` is set, then misbehaves:

    - ``"flip"``: flips a bit in the body of every cell it forwards (both directions);
    - ``"random"``: replaces every forwarded cell body with random bytes of the same size;
    - ``"proxy"``: as a proxy, (a) flips a bit in the sealed clove of every Deliver,
      (b) sends forged Delivers sealed to the model node carrying forged cloves,
      (c) flips a bit in every ReturnClove's data on the way back;
    - ``"bad-returns"``: only (c);
    - ``"dup-deliver"``: sends every Deliver twice (a replaying proxy).

    It also records the sizes of the cells it receives (``cell_sizes``).
    """

    attack: str | None = None
    models: Mapping[bytes, bytes] = field(default_factory=dict)  # model node id -> X25519 key
    tampered: Counter[str] = field(default_factory=Counter)
    cell_sizes: list[tuple[str, int]] = field(default_factory=list)

    def on_message(self, peer: bytes, msg: Any, *, now: float, unix: float) -> list[Send]:
        if isinstance(msg, (CellFwd, CellBack)):
            self.cell_sizes.append((type(msg).__name__, len(msg.body)))
        if self.attack in ("proxy", "bad-returns") and isinstance(msg, ReturnClove):
            msg = ReturnClove(msg.proxy_path_id, flip(msg.data, len(msg.data) - 1))  # past the 8-byte tag
            self.tampered["return-clove"] += 1
        out = super().on_message(peer, msg, now=now, unix=unix)
        if self.attack is None:
            return out
        res: list[Send] = []
        for s in out:
            m = s.msg
            if isinstance(m, (CellFwd, CellBack)) and self.attack in ("flip", "random"):
                body = flip(m.body, len(m.body) // 2) if self.attack == "flip" else os.urandom(len(m.body))
                m = type(m)(m.link_id, m.iv, body)
                self.tampered["cell"] += 1
            elif isinstance(m, Deliver) and self.attack == "proxy":
                for forged in forged_cloves():
                    res.append(Send(s.peer, Deliver(m.proxy_path_id, seal_to(self.models[s.peer], forged))))
                    self.tampered["forged-deliver"] += 1
                m = Deliver(m.proxy_path_id, flip(m.sealed, len(m.sealed) // 2))
                self.tampered["deliver"] += 1
            elif isinstance(m, Deliver) and self.attack == "dup-deliver":
                res.append(Send(s.peer, m))
                self.tampered["deliver"] += 1
            res.append(Send(s.peer, m))
        return res


def flip(data: bytes, pos: int) -> bytes:
    b = bytearray(data)
    b[pos] ^= 0x04
    return bytes(b)


def _fp(data: bytes, person: bytes) -> bytes:
    return crypto.blake2b(data, size=sida.FP_LEN, person=person)


def forged_cloves(n: int = 4, k: int = 3) -> list[bytes]:
    """Encoded cloves a malicious proxy can make (it never sees a real clove in the clear)."""
    flen = sida.fragment_len(400, k)
    out = []
    # 1. well-formed, random fingerprints: not self-consistent (Reassembler "rejected")
    out.append(sida.encode_clove(sida.Clove(os.urandom(16), 0, n, k, os.urandom(flen), os.urandom(32),
                                            os.urandom(2 * n * sida.FP_LEN))))
    # 2. k self-consistent cloves of random data under one msg id: a complete group that
    #    fails the AEAD tag (Reassembler "failed_groups")
    frags = [os.urandom(flen) for _ in range(n)]
    shares = [os.urandom(32) for _ in range(n)]
    fps = b"".join([_fp(f, b"gt-sida-frag") for f in frags] + [_fp(s, b"gt-sida-share") for s in shares])
    mid = os.urandom(16)
    out += [sida.encode_clove(sida.Clove(mid, i, n, k, frags[i], shares[i], fps)) for i in range(k)]
    # 3. an authentic S-IDA message that is not a Request (Responder "request-malformed")
    out += [sida.encode_clove(c) for c in sida.split(b"not a request " * 10, n, k)[:k]]
    # 4. an ill-formed clove (index >= n): fails decode_clove
    out.append(sida.encode_clove(sida.Clove(os.urandom(16), 9, n, k, os.urandom(flen), os.urandom(32),
                                            os.urandom(2 * n * sida.FP_LEN))))
    return out


@dataclass
class SecNet:
    network: MemoryNetwork
    registry: Registry
    users: list[UserNode]
    model: ModelNode
    clock: SkewClock
    identities: dict[bytes, Identity] = field(default_factory=dict)
    taps: dict[bytes, list[bytes]] = field(default_factory=lambda: defaultdict(list))
    scopes: dict[bytes, trio.CancelScope] = field(default_factory=dict)

    @property
    def client(self) -> UserNode:
        return self.users[0]

    def user(self, node_id: bytes) -> UserNode:
        return next(u for u in self.users if u.identity.node_id == node_id)

    def core(self, node_id: bytes) -> EvilCore:
        core = self.user(node_id).relay.core
        assert isinstance(core, EvilCore)
        return core

    def kill(self, node_id: bytes) -> None:
        self.scopes[node_id].cancel()


async def start_secnet(
    nursery: trio.Nursery,
    n_users: int = 15,
    *,
    clients: int = 1,
    regions: tuple[str, ...] = ("default",),
    limits: RelayLimits | None = None,
    **user_kw: Any,
) -> SecNet:
    """``n_users`` user nodes (the first ``clients`` send requests, all relay, each with an
    :class:`EvilCore`; the others run on the shared :class:`SkewClock`, the clients on trio's)
    and one echo model node, all tapped."""
    network = MemoryNetwork()
    idents = [Identity.generate() for _ in range(n_users)]
    model_ident = Identity.generate()
    entries = [PeerEntry.of(u, network.address(u.node_id.hex()[:12]), region=regions[i % len(regions)])
               for i, u in enumerate(idents)]
    entries.append(PeerEntry.of(model_ident, network.address(model_ident.node_id.hex()[:12]), role="model",
                                models=("echo",)))
    registry = Registry(1, entries)
    models = {e.node_id: e.x25519_public for e in registry.models()}
    clock = SkewClock()
    net = SecNet(network, registry, [], None, clock)  # type: ignore[arg-type]

    def tap(ident: Identity) -> Callable[[bytes], None]:
        chunks = net.taps[ident.node_id]
        return lambda data: chunks.append(bytes(data))

    async def run_scoped(node_id: bytes, serve: Any, *, task_status: Any) -> None:
        with trio.CancelScope() as scope:
            net.scopes[node_id] = scope
            await serve(task_status=task_status)

    for i, ident in enumerate(idents):
        net.identities[ident.node_id] = ident
        u = UserNode(ident, MemoryTransport(ident, network, tap=tap(ident)), registry, client=i < clients,
                     region=regions[i % len(regions)], clock=TrioClock() if i < clients else clock, **user_kw)
        honest = u.relay.core
        kw = {f.name: getattr(honest, f.name) for f in dataclasses.fields(RelayCore) if f.init}
        if limits is not None:
            kw["limits"] = limits
        u.relay.core = EvilCore(**kw, models=models)
        net.users.append(u)
    net.identities[model_ident.node_id] = model_ident
    net.model = ModelNode(model_ident, MemoryTransport(model_ident, network, tap=tap(model_ident)), registry,
                          EchoEngine())
    # Relays and the model node first, then the clients: paths are built against a full network.
    for u in net.users[clients:]:
        await nursery.start(run_scoped, u.identity.node_id, u.serve)
    await nursery.start(run_scoped, model_ident.node_id, net.model.serve)
    for u in net.users[:clients]:
        await nursery.start(run_scoped, u.identity.node_id, u.serve)
    return net


async def ask(client: Any, text: str, *, system: str | None = None, timeout: float = 60.0,
              into: list[ReplyChunk] | None = None) -> str:
    messages = ([ChatMessage("system", system)] if system else []) + [ChatMessage("user", text)]
    chunks = [] if into is None else into
    async for chunk in client.request("echo", messages, PARAMS, timeout=timeout):
        chunks.append(chunk)
    return "".join(c.text for c in chunks)


async def ready_paths(user: UserNode, n: int = 4) -> list[overlay.paths.Path]:
    assert user.paths is not None
    return await user.paths.wait_ready(n, 60)


def link_ids(net: SecNet, user_id: bytes, path: overlay.paths.Path) -> list[bytes]:
    """The link id on each of the path's 3 links (user→r0, r0→r1, r1→r2), read from the relays."""
    links = [path.link_id]
    pred = user_id
    for r in path.relays[:-1]:
        hop = net.core(r.node_id).by_pred[(pred, links[-1])]
        assert hop.succ_link is not None
        links.append(hop.succ_link)
        pred = r.node_id
    return links


# --------------------------------------------------------------------------- an outsider


class Outsider:
    """A node outside the registry (or inside it) that speaks the protocol by hand."""

    def __init__(self, net: SecNet, ident: Identity | None = None) -> None:
        self.net = net
        self.ident = ident or Identity.generate()
        self.node = Node(self.ident, MemoryTransport(self.ident, net.network), peers=net.registry.entries,
                         ping_interval=0)
        self.inbox: list[tuple[bytes, Any]] = []
        for t in (CellBack, CellFwd, Create, Destroy, Deliver, ReturnClove):
            self.node.on(t, self._record)

    async def _record(self, conn: Any, msg: Any) -> None:
        self.inbox.append((conn.peer_id, msg))

    async def start(self, nursery: trio.Nursery) -> Outsider:
        await nursery.start(self.node.serve)
        return self

    def entry(self, node_id: bytes) -> PeerEntry:
        return self.net.registry.by_id[node_id]

    async def send(self, node_id: bytes, *msgs: Any) -> None:
        conn = await self.node.connection_to(self.entry(node_id))
        await conn.send_raw(b"".join(codec.frame(m) for m in msgs))
        await settle()

    async def send_raw(self, node_id: bytes, data: bytes) -> None:
        conn = await self.node.connection_to(self.entry(node_id))
        await conn.send_raw(data)
        await settle()

    def received(self, kind: type) -> list[Any]:
        return [m for _, m in self.inbox if isinstance(m, kind)]

    async def build(self, relays: list[bytes], *, first_static: crypto.X25519Key | None = None,
                    expires: int | None = None) -> tuple[bytes, bytes, onion.PathCrypt, bytes]:
        """Build a path through ``relays``; returns (first hop, link id, crypt, packet sent).
        The proxy's PathReady (if any) is in the inbox afterwards."""
        keys = [self.entry(r).x25519_public for r in relays]
        packet, hop_keys = onion.build_onion(keys, relays, expires or int(TrioClock().unix()) + 600)
        link = os.urandom(16)
        await self.send(relays[0], Create(link, packet))
        return relays[0], link, onion.PathCrypt(hop_keys), packet

    def path_ready(self, first: bytes, link: bytes, crypt: onion.PathCrypt) -> PathReady | None:
        for peer, m in self.inbox:
            if isinstance(m, CellBack) and peer == first and m.link_id == link:
                try:
                    payload = codec.decode(crypt.unwrap_backward(m.iv, m.body))
                except onion.OnionError:
                    continue
                if isinstance(payload, PathReady):
                    return payload
        return None

    def payloads(self, first: bytes, link: bytes, crypt: onion.PathCrypt) -> list[Any]:
        out = []
        for peer, m in self.inbox:
            if isinstance(m, CellBack) and peer == first and m.link_id == link:
                try:
                    out.append(codec.decode(crypt.unwrap_backward(m.iv, m.body)))
                except onion.OnionError:
                    pass
        return out


async def settle(seconds: float = 1.0) -> None:
    """Let every queued frame be delivered and handled (autojump: instant)."""
    await trio.sleep(seconds)


# =========================================================================== 1. capture


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


def frames_of(chunks: list[bytes]) -> list[Any]:
    """Decode a tap: every chunk must hold whole frames (so no value can straddle chunks)."""
    msgs = []
    for chunk in chunks:
        dec = codec.FrameDecoder()
        dec.feed(chunk)
        while (m := dec.next_message()) is not None:
            msgs.append(m)
        assert not dec._buf, "a tapped chunk ended inside a frame"
    return msgs


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
        harvest([responder.reassembler, responder._seen, responder.dropped, list(mnode._outboxes)], model_state)
        for peer, conn in mnode._conns.items():
            harvest([peer, conn.peer_id, conn.peer_ed25519, conn.peer_x25519, conn.address], model_state)
        state[net.model.identity.node_id] = b"\x00".join(model_state)
        check_capture(net, paths, links, state, splits, prompts, system)
        # The model node reads the prompt (it must) but hears only from proxies: no trace of
        # the user or of the other hops, no link ids, no hop keys.
        assert set(mnode._conns) <= {p.proxy.node_id for p in paths}
        captured = b"".join(net.taps[net.model.identity.node_id]) + state[net.model.identity.node_id]
        hidden = [me.node_id, me.ed25519_public, me.x25519_public]
        hidden += [r.node_id for p in paths for r in p.relays[:-1]] + [v for ls in links.values() for v in ls]
        hidden += [k for p in paths for h in p.crypt.hops for k in dataclasses.astuple(h.keys)]
        assert not [v for v in hidden if v in captured]
        assert all(p.proxy.ed25519_public in captured for p in paths)  # positive control
        nursery.cancel_scope.cancel()


def check_capture(net: SecNet, paths: list[Any], links: dict[int, list[bytes]], state: dict[bytes, bytes],
                  splits: list[tuple[bytes, list[sida.Clove]]], prompts: list[str], system: str) -> None:
    me = net.client.identity

    requests = [codec.decode(m) for m, _ in splits if isinstance(codec.decode(m), Request)]
    replies = [codec.decode(m) for m, _ in splits if isinstance(codec.decode(m), ReplyChunk)]
    assert len(requests) == 5 and len(replies) >= 10  # streamed: several chunks per reply

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
    user_ids = [me.node_id, me.ed25519_public, me.x25519_public, net.registry.by_id[me.node_id].address.encode()]

    # Who may know what: position i of path p knows links i and i+1, its own hop keys,
    # and (the proxy) the path's proxy path id and return tags.
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

    on_paths = {r.node_id for p in paths for r in p.relays}
    assert len(on_paths) == 12
    for u in net.users[1:]:
        rid = u.identity.node_id
        msgs = frames_of(net.taps[rid])
        captured = b"".join(net.taps[rid]) + b"\x00" + state[rid]
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

    # Each relay's tables and connections name only its predecessor and successor (and, at
    # the proxy, the model node it delivers to); no other node's id or keys reach it.
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
            captured = b"".join(net.taps[r.node_id]) + state[r.node_id]
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
        hops = [net.core(r.node_id) for p in paths for r in p.relays]
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


# =========================================================================== 2. forging and tampering


def make_evil(net: SecNet, paths: list[overlay.paths.Path], attacks: list[tuple[str, int]]) -> list[EvilCore]:
    """Turn relay ``pos`` of path ``i`` malicious for each ``(attack, pos)`` in ``attacks``."""
    cores = []
    for p, (attack, pos) in zip(paths, attacks, strict=False):
        core = net.core(p.relays[pos].node_id)
        core.attack = attack
        cores.append(core)
    return cores


@pytest.mark.parametrize("attack,pos", [("flip", 1), ("random", 0), ("flip", 0), ("proxy", 2)])
async def test_one_malicious_path_of_four_is_tolerated(autojump_clock, attack, pos):
    async with trio.open_nursery() as nursery:
        net = await start_secnet(nursery, 15)
        client = net.client.client
        paths = await ready_paths(net.client)
        (evil,) = make_evil(net, paths, [(attack, pos)])
        bad = paths[0]
        for i in range(3):
            text = f"request {i}: " + " ".join(f"w{j}" for j in range(50))
            chunks: list[ReplyChunk] = []
            assert await ask(client, text, into=chunks) == text
            assert [c.seq for c in chunks] == list(range(len(chunks))) and chunks[-1].done
        assert sum(evil.tampered.values()) > 0
        responder = net.model.responder
        assert responder.served == 3
        proxy = net.core(bad.proxy.node_id)
        if attack in ("flip", "random"):
            # forward cells fail the user<->proxy AEAD at the (honest) proxy; backward cells
            # fail it at the user
            assert proxy.dropped["cell-unauthentic"] == 3
            assert net.client.paths.dropped["cell-unauthentic"] >= 3
        else:
            # (a) tampered seals and (b) ill-formed forged cloves (one counter for both)
            assert responder.dropped["clove-unsealable"] >= 6
            assert responder.reassembler.stats["rejected"] >= 3  # (b) wrong fingerprints
            assert responder.reassembler.stats["failed_groups"] >= 3  # (b) forged groups fail the tag
            assert responder.dropped["request-malformed"] >= 3  # (b) authentic S-IDA, not a Request
            assert client.dropped["reply-clove-unauthentic"] >= 3  # (c) tampered return cloves
        # the bad path stays up (nothing tells the user which hop misbehaved), the others are clean
        assert not bad.dead and all(not p.dead for p in paths)
        for p in paths[1:]:
            assert net.core(p.proxy.node_id).dropped["cell-unauthentic"] == 0
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("attacks", [
    [("flip", 1), ("random", 0)],          # requests never reach the model node
    [("bad-returns", 2), ("bad-returns", 2)],  # requests are served, replies cannot be rebuilt
    [("proxy", 2), ("flip", 0)],
])
async def test_two_malicious_paths_fail_cleanly(autojump_clock, attacks):
    async with trio.open_nursery() as nursery:
        net = await start_secnet(nursery, 15)
        client = net.client.client
        paths = await ready_paths(net.client)
        make_evil(net, paths, attacks)
        chunks: list[ReplyChunk] = []
        with pytest.raises(AnonError, match="fewer than k=3"):
            await ask(client, "this must not come back altered " * 5, timeout=10, into=chunks)
        assert chunks == []  # never garbage, never a partial reply
        if attacks[0][0] == "bad-returns":
            assert net.model.responder.served == 1
            assert client.dropped["reply-clove-unauthentic"] >= 2
            assert client.reassembler.stats["completed"] == 0
        else:
            assert net.model.responder.served == 0
        nursery.cancel_scope.cancel()


async def test_a_replaying_proxy_does_not_run_a_request_twice(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_secnet(nursery, 15)
        paths = await ready_paths(net.client)
        make_evil(net, paths, [("dup-deliver", 2)] * 4)  # every proxy sends every clove twice
        for i in range(3):
            assert await ask(net.client.client, f"once only {i}") == f"once only {i}"
        responder = net.model.responder
        assert responder.served == 3
        stats = responder.reassembler.stats
        # 8 cloves per request, 3 complete it: the other 5 are late or duplicates, never a rerun
        assert stats["duplicates"] + stats["late"] + responder.dropped.get("request-duplicate", 0) >= 5 * 3
        nursery.cancel_scope.cancel()


# =========================================================================== 3. bad input


async def test_bad_onions_unknown_links_and_garbage_are_counted(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_secnet(nursery, 18)
        user = net.client
        paths = await ready_paths(user)
        target = paths[0].first  # a relay carrying the user's traffic
        core = net.core(target)
        bad = await Outsider(net).start(nursery)

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
                                      [bad.ident.node_id, target, others[2]], int(TrioClock().unix()) + 600)
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


async def test_cloves_on_expired_paths_are_dropped_and_paths_rebuilt(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_secnet(nursery, 20)
        user = net.client
        assert user.paths is not None
        old = await ready_paths(user)
        assert await ask(user.client, "before expiry") == "before expiry"
        # An outsider's own path, to play the model node on it later.
        bad = await Outsider(net).start(nursery)
        spare = [e.node_id for e in net.registry.users()
                 if e.node_id not in {r.node_id for p in old for r in p.relays} | {user.identity.node_id}]
        first, link, crypt, _ = await bad.build(spare[:3])
        ready = bad.path_ready(first, link, crypt)
        assert ready is not None
        proxy_core = net.core(spare[2])

        # Paths are set up to live path_ttl: move the relays' clock past every expiry.
        net.clock.skew += user.paths.path_ttl + 60
        with pytest.raises(AnonError):
            await ask(user.client, "too late", timeout=5)
        assert sum(net.core(p.first).dropped["path-expired"] for p in old) == 4
        assert all(p.dead for p in old)  # each first relay told the user (Destroy)
        # a return clove for an expired path is dropped at the proxy, not relayed to the user
        n_back = len(bad.received(CellBack))
        await bad.send(spare[2], ReturnClove(ready.proxy_path_id, os.urandom(300)))
        assert proxy_core.dropped["path-expired"] == 1 and len(bad.received(CellBack)) == n_back
        assert ready.proxy_path_id not in proxy_core.by_proxy_path

        # New paths are built at once and requests succeed again; relays hold only live paths.
        new = await ready_paths(user)
        assert not {id(p) for p in new} & {id(p) for p in old}
        assert await ask(user.client, "after the rebuild") == "after the rebuild"
        await trio.sleep(60)  # a relay sweep (every 30 s) clears whatever expired unused
        assert sum(len(u.relay.core) for u in net.users) == 12
        nursery.cancel_scope.cancel()


def test_backward_cells_on_an_expired_path_are_dropped_at_every_hop():
    """I/O-free: a middle relay drops a CellBack for an expired path (and tears it down),
    as it does for forward cells; so does the proxy for a ReturnClove."""
    cores = [RelayCore(os.urandom(20), crypto.X25519Key.generate()) for _ in range(3)]
    user, unix = b"U" * 20, 1_800_000_000
    packet, _ = onion.build_onion([c.static_key.public_bytes for c in cores], [c.node_id for c in cores],
                                  unix + 600)
    queue = [(user, Send(cores[0].node_id, Create(os.urandom(16), packet)))]
    by_id = {c.node_id: c for c in cores}
    while queue:
        src, a = queue.pop(0)
        if a.peer in by_id:
            queue += [(a.peer, s) for s in by_id[a.peer].on_message(src, a.msg, now=0.0, unix=unix)]
    (mid_path,) = cores[1].by_succ.values()
    assert mid_path.succ_link is not None
    out = cores[1].on_message(cores[2].node_id, CellBack(mid_path.succ_link, os.urandom(16), b"x" * 64),
                              now=601.0, unix=unix + 601)
    assert cores[1].dropped["path-expired"] == 1 and len(cores[1]) == 0
    assert {type(s.msg) for s in out} == {Destroy}
    (proxy_path_id,) = cores[2].by_proxy_path
    out = cores[2].on_message(b"M" * 20, ReturnClove(proxy_path_id, b"x" * 64), now=601.0, unix=unix + 601)
    assert cores[2].dropped["path-expired"] == 1 and len(cores[2]) == 0
    assert {type(s.msg) for s in out} == {Destroy}


async def test_cloves_that_do_not_open_at_the_model_node_are_dropped(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_secnet(nursery, 15)
        model = net.model
        mid = model.identity.node_id
        responder = model.responder
        bad = await Outsider(net).start(nursery)
        clove = sida.encode_clove(sida.split(b"x" * 100)[0])
        sealed = seal_to(model.identity.x25519_public, clove)
        junk = [
            os.urandom(300),                                          # random bytes
            b"short",                                                 # shorter than a sealed box
            seal_to(Identity.generate().x25519_public, clove),        # sealed to another node
            flip(sealed, 40),                                         # tampered
            sealed[:-1],                                              # truncated
            bytes(32) + sealed[32:],                                  # low-order ephemeral key
            seal_to(model.identity.x25519_public, b"not a clove"),    # opens, but is no clove
        ]
        await bad.send(mid, *[Deliver(os.urandom(16), s) for s in junk])
        assert responder.dropped["clove-unsealable"] == len(junk)
        assert model.node.rejected == Counter()  # a bad clove is no reason to drop the proxy

        # A flood of well-formed, self-consistent forged cloves (each a message of its own)
        # stays within the reassembler's bounds, oldest first out.
        responder.reassembler = sida.Reassembler(max_messages=50)
        forged = []
        for _ in range(300):
            frag, share = os.urandom(sida.fragment_len(300, 3)), os.urandom(32)
            fps = _fp(frag, b"gt-sida-frag") + os.urandom(48) + _fp(share, b"gt-sida-share") + os.urandom(48)
            c = sida.Clove(os.urandom(16), 0, 4, 3, frag, share, fps)
            forged.append(Deliver(os.urandom(16), seal_to(model.identity.x25519_public, sida.encode_clove(c))))
        await bad.send(mid, *forged)
        assert len(responder.reassembler) == 50 and responder.reassembler.stats["evicted"] == 250
        assert responder.reassembler.bytes_held <= responder.reassembler.max_bytes

        assert await ask(net.client.client, "served after the junk") == "served after the junk"
        nursery.cancel_scope.cancel()


async def test_a_proxy_flooding_the_model_node_with_cloves_is_rate_limited(autojump_clock):
    """Opening a clove costs the model node an X25519: past its per-proxy budget a flooding
    peer's cloves are dropped unopened and counted; other proxies are not affected."""
    async with trio.open_nursery() as nursery:
        net = await start_secnet(nursery, 15)
        model = net.model
        responder = model.responder
        responder.delivers_per_s, responder.deliver_burst = 0.001, 20.0  # no refill within the test
        bad = await Outsider(net).start(nursery)
        junk = [Deliver(os.urandom(16), os.urandom(300)) for _ in range(50)]
        await bad.send(model.identity.node_id, *junk)
        assert responder.dropped["clove-unsealable"] == 20
        assert responder.dropped["deliver-rate-limited"] == 30
        assert model.node.rejected == Counter()  # dropped, not a protocol error: the link stays up
        assert await ask(net.client.client, "served during the flood") == "served during the flood"
        nursery.cancel_scope.cancel()


async def test_a_model_node_at_capacity_or_failing_answers_with_an_error(autojump_clock):
    """Overload and engine failures come back to the user as an error chunk; the model node
    keeps serving."""
    async with trio.open_nursery() as nursery:
        net = await start_secnet(nursery, 15)
        responder = net.model.responder
        responder.max_active = 0
        with pytest.raises(AnonError, match="at capacity"):
            await ask(net.client.client, "too busy", timeout=5)
        responder.max_active = 64

        async def broken(req: Request) -> Any:
            raise RuntimeError("the engine fell over")
            yield  # an async generator

        real, responder.handler = responder.handler, broken
        with pytest.raises(AnonError, match="model node error: RuntimeError"):
            await ask(net.client.client, "crash", timeout=5)
        responder.handler = real
        assert await ask(net.client.client, "still serving") == "still serving"
        nursery.cancel_scope.cancel()


async def test_floods_from_one_peer_stay_bounded_and_others_are_served(autojump_clock):
    limits = RelayLimits(cells_per_s=100.0, cell_burst=200.0, creates_per_s=10.0, create_burst=20.0,
                         max_paths_per_peer=5)
    async with trio.open_nursery() as nursery:
        net = await start_secnet(nursery, 18, limits=limits)
        user = net.client
        paths = await ready_paths(user)
        target = paths[0].first
        core, node = net.core(target), net.user(target).node
        bad = await Outsider(net).start(nursery)

        async def flood() -> None:
            await bad.send(target, *[CellFwd(os.urandom(16), os.urandom(16), os.urandom(512)) for _ in range(2000)])
            await bad.send(target, *[Create(os.urandom(16), os.urandom(onion.ONION_LEN)) for _ in range(200)])

        async with trio.open_nursery() as inner:
            inner.start_soon(flood)
            assert await ask(user.client, "served during the flood") == "served during the flood"
        assert core.dropped["unknown-link"] + core.dropped["cell-rate-limited"] == 2000
        assert core.dropped["cell-rate-limited"] >= 1000
        assert core.dropped["onion-bad-mac"] + core.dropped["create-rate-limited"] == 200
        assert core.dropped["create-rate-limited"] >= 100

        # Valid onions too: one peer holds at most max_paths_per_peer paths at a relay.
        spare = [e.node_id for e in net.registry.users()
                 if e.node_id not in {r.node_id for p in paths for r in p.relays} | {user.identity.node_id}]
        for i in range(12):
            await bad.build([target, spare[i % 5], spare[(i + 1) % 5]])
        assert core.per_peer[bad.ident.node_id] == 5 and core.dropped["table-full"] == 7
        assert len(core) == 6 and len(core.replay) <= 6
        neighbours = {user.identity.node_id, paths[0].relays[1].node_id, bad.ident.node_id, *spare[:5]}
        assert set(core._cell_buckets) | set(core._create_buckets) | set(node._outboxes) <= neighbours

        assert await ask(user.client, "served after the flood") == "served after the flood"
        assert not any(p.dead for p in paths)
        nursery.cancel_scope.cancel()


# =========================================================================== 4. paths and routing


async def test_paths_are_disjoint_regional_and_never_through_oneself(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_secnet(nursery, 30, regions=("eu", "eu", "us"))
        user = net.client
        paths = await ready_paths(user)
        relays = [r.node_id for p in paths for r in p.relays]
        assert len(relays) == len(set(relays)) == 12
        assert user.identity.node_id not in relays
        assert {net.registry.by_id[r].region for r in relays} == {"eu"}
        assert all(len(u.relay.core) == 0 for u in net.users if u.region == "us")
        assert await ask(user.client, "regional") == "regional"
        nursery.cancel_scope.cancel()


async def test_paths_are_refreshed_and_relays_forget_old_ones(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_secnet(nursery, 20)
        user = net.client
        assert user.paths is not None
        old = await ready_paths(user)
        old_links = {link for p in old for link in link_ids(net, user.identity.node_id, p)}
        await trio.sleep(user.paths.refresh + 5)  # 15 minutes (paper §5.2)
        new = await ready_paths(user)
        assert not {id(p) for p in new} & {id(p) for p in old}
        assert all(p.dead for p in old)
        # the old paths were destroyed hop by hop: no relay keeps their state
        for u in net.users[1:]:
            assert not {k[1] for k in u.relay.core.by_pred} & old_links
        assert sum(len(u.relay.core) for u in net.users) == 12
        assert await ask(user.client, "on fresh paths") == "on fresh paths"
        nursery.cancel_scope.cancel()


async def test_a_failed_paths_relays_are_avoided(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_secnet(nursery, 20)
        user = net.client
        paths = await ready_paths(user)
        victim = paths[0]
        suspects = {r.node_id for r in victim.relays}
        net.kill(victim.relays[1].node_id)  # the middle relay: only its neighbours notice
        await settle()
        assert victim.dead
        new = await ready_paths(user)
        used = {r.node_id for p in new for r in p.relays}
        assert len(used) == 12 and not used & suspects  # we cannot tell which hop failed: avoid all 3
        assert await ask(user.client, "around the failure") == "around the failure"
        nursery.cancel_scope.cancel()


async def test_a_proxy_delivers_only_to_model_nodes(autojump_clock):
    """A path's payload names its destination; a proxy must not hand a Deliver to a user
    node (which would drop the connection between the two relays, and every path on it)."""
    async with trio.open_nursery() as nursery:
        net = await start_secnet(nursery, 18)
        user = net.client
        paths = await ready_paths(user)
        p0 = paths[0]
        mid, proxy = p0.relays[1].node_id, p0.relays[2].node_id
        spare = [e.node_id for e in net.registry.users()
                 if e.node_id not in {r.node_id for p in paths for r in p.relays} | {user.identity.node_id}]
        bad = await Outsider(net).start(nursery)
        first, link, crypt, _ = await bad.build([spare[0], spare[1], mid])  # ends at the victim's middle relay
        assert bad.path_ready(first, link, crypt) is not None
        iv, body = crypt.wrap_forward(codec.encode(ToModel(dest=proxy, sealed=os.urandom(200))))
        await bad.send(first, CellFwd(link, iv, body))
        assert net.core(mid).dropped["unknown-model-node"] == 1
        notices = [m for m in bad.payloads(first, link, crypt) if isinstance(m, PathNotice)]
        assert [n.code for n in notices] == ["unknown-model-node"]
        assert net.user(proxy).node.rejected == Counter() and not p0.dead
        assert await ask(user.client, "path intact") == "path intact"
        nursery.cancel_scope.cancel()


async def test_a_create_cannot_extend_to_a_model_node(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_secnet(nursery, 15)
        paths = await ready_paths(net.client)
        proxy = paths[0].proxy.node_id  # connected to the model node
        model = net.model.identity.node_id
        spare = [e.node_id for e in net.registry.users() if e.node_id not in
                 {r.node_id for p in paths for r in p.relays} | {net.client.identity.node_id}]
        bad = await Outsider(net).start(nursery)
        await bad.build([proxy, model, spare[0]])
        assert net.core(proxy).dropped["bad-next-hop"] == 1
        assert [d.reason for d in bad.received(Destroy)] == ["bad-next-hop"]
        assert net.model.node.rejected == Counter()
        assert await ask(net.client.client, "still fine") == "still fine"
        nursery.cancel_scope.cancel()


async def test_concurrent_users_get_only_their_own_replies(autojump_clock):
    async with trio.open_nursery() as nursery:
        net = await start_secnet(nursery, 20, clients=3)
        results: dict[int, str] = {}

        async def one(i: int) -> None:
            text = " ".join(f"user{i}-word{j}" for j in range(40))
            results[i] = await ask(net.users[i].client, text)
            assert results[i] == text

        async with trio.open_nursery() as inner:
            for i in range(3):
                inner.start_soon(one, i)
        assert len(results) == 3 and net.model.responder.served == 3
        nursery.cancel_scope.cancel()


# --------------------------------------------------------------------------- RelayCore fuzz

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
