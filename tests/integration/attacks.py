"""The network the security tests attack (paper §3.2; DESIGN.md "Anonymous overlay").

Built with the test kit (:func:`overlay.testing.start_overlay`): user nodes that relay
(the first ``clients`` also send requests) and one echo model node, every node captured
(:class:`overlay.testing.Capture`: every byte it receives and sends), and every relay
running an :class:`EvilCore` that behaves until a test turns it malicious. Each
``test_attack_*.py`` file covers one attack or one family of attacks; what they share
is here, so no helper is copied between them.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import trio

from model_node.testing import echo_node
from overlay.anon import sida
from overlay.anon.actions import Send
from overlay.anon.paths import Path
from overlay.anon.relay import RelayCore, RelayLimits
from overlay.anon.seal import seal_to
from overlay.testing import Net, flip, start_overlay
from overlay.usernode import UserNode
from overlay.wire import crypto
from overlay.wire.clock import TrioClock
from overlay.wire.messages import CellBack, CellFwd, ChatMessage, Deliver, ReplyChunk, ReturnClove, SamplingParams

PARAMS = SamplingParams(max_tokens=4096)


class SkewClock(TrioClock):
    """A relays' clock: trio's (autojump) clock, with a skew the test can add to ``monotonic``
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
    - ``"dup-deliver"``: sends every Deliver twice (a replaying proxy);
    - ``"drop"``: silently drops every cell, Deliver and reply clove it would pass on.

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
            if self.attack == "drop" and isinstance(m, (CellFwd, CellBack, Deliver)):
                self.tampered["dropped"] += 1
                continue
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


def fingerprint(data: bytes, person: bytes) -> bytes:
    """An S-IDA fingerprint as the reassembler computes it (so forged cloves look self-consistent)."""
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
    fps = b"".join([fingerprint(f, b"gt-sida-frag") for f in frags]
                   + [fingerprint(s, b"gt-sida-share") for s in shares])
    mid = os.urandom(16)
    out += [sida.encode_clove(sida.Clove(mid, i, n, k, frags[i], shares[i], fps)) for i in range(k)]
    # 3. an authentic S-IDA message that is not a Request (Responder "request-malformed")
    out += [sida.encode_clove(c) for c in sida.split(b"not a request " * 10, n, k)[:k]]
    # 4. an ill-formed clove (index >= n): fails decode_clove
    out.append(sida.encode_clove(sida.Clove(os.urandom(16), 9, n, k, os.urandom(flen), os.urandom(32),
                                            os.urandom(2 * n * sida.FP_LEN))))
    return out


async def start_secnet(
    nursery: trio.Nursery,
    n_users: int = 15,
    *,
    clients: int = 1,
    regions: tuple[str, ...] = ("default",),
    limits: RelayLimits | None = None,
    relay_clock: SkewClock | None = None,
    **user_kw: Any,
) -> Net:
    """``n_users`` user nodes (the first ``clients`` send requests, all relay, each with an
    :class:`EvilCore`, the relay-only ones on ``relay_clock`` (default trio's), the clients on
    trio's) and one echo model node, every node captured."""
    net = Net()

    def evil(u: UserNode) -> None:
        honest = u.relay.core
        kw = {f.name: getattr(honest, f.name) for f in dataclasses.fields(RelayCore) if f.init}
        if limits is not None:
            kw["limits"] = limits
        u.relay.core = EvilCore(**kw, models={e.node_id: e.x25519_public for e in net.registry.models()})

    return await start_overlay(nursery, n_users, clients=clients, regions=regions, models=[echo_node()],
                               capture=True, relay_clock=relay_clock, prepare=evil, net=net, **user_kw)


def relay_core(net: Net, node_id: bytes) -> EvilCore:
    """The relay core of user node ``node_id``."""
    c = net.user(node_id).relay.core
    assert isinstance(c, EvilCore)
    return c


async def ask(client: Any, text: str, *, system: str | None = None, chunk_timeout: float = 60.0,
              into: list[ReplyChunk] | None = None) -> str:
    """Send ``text`` (after an optional system prompt) to the echo model; the reply's text
    (``chunk_timeout``: the longest wait for each piece of it)."""
    messages = ([ChatMessage("system", system)] if system else []) + [ChatMessage("user", text)]
    chunks = [] if into is None else into
    async for chunk in client.request("echo", messages, PARAMS, chunk_timeout=chunk_timeout):
        chunks.append(chunk)
    return "".join(c.text for c in chunks)


async def ready_paths(user: UserNode, n: int = 4) -> list[Path]:
    assert user.paths is not None
    with trio.fail_after(60):
        return await user.paths.wait_ready(n)


def link_ids(net: Net, user_id: bytes, path: Path) -> list[bytes]:
    """The link id on each of the path's 3 links (user→r0, r0→r1, r1→r2), read from the relays."""
    links = [path.link_id]
    pred = user_id
    for r in path.relays[:-1]:
        hop = relay_core(net, r.node_id).by_pred[(pred, links[-1])]
        assert hop.succ_link is not None
        links.append(hop.succ_link)
        pred = r.node_id
    return links


def spare_relays(net: Net, user: UserNode, paths: list[Path]) -> list[bytes]:
    """Registered user nodes on none of ``paths`` and other than ``user``."""
    return net.spare_users({r.node_id for p in paths for r in p.relays} | {user.identity.node_id})


def make_evil(net: Net, paths: list[Path], attacks: list[tuple[str, int]]) -> list[EvilCore]:
    """Turn relay ``pos`` of path ``i`` malicious for each ``(attack, pos)`` in ``attacks``."""
    cores = []
    for p, (attack, pos) in zip(paths, attacks, strict=False):
        c = relay_core(net, p.relays[pos].node_id)
        c.attack = attack
        cores.append(c)
    return cores
