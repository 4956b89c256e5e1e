"""The relay every user node runs (paper §3.2 steps 2–4), as an I/O-free state machine.

Feed it what arrived and from whom; it returns what to send to whom::

    actions = core.on_message(peer_id, msg, now=..., unix=...)

Per path a hop stores ``(predecessor, its link id) <-> (successor, our link id)``,
its :class:`~overlay.anon.onion.HopCrypt` and an expiry; a proxy (the last hop)
stores a proxy path id instead of a successor. Tables are bounded in total and per
peer; every peer has a token bucket for cells and for creates; idle paths
expire. Every drop is counted in ``core.dropped[reason]``; nothing a peer sends
raises out of :meth:`RelayCore.on_message`.

A proxy passes a :class:`~overlay.wire.messages.ReturnClove` back to the user only from a model node
the path delivered a clove to, or from a model node ``may_answer`` allows for one of those (a
member of its group answering a request forwarded to it); from anyone else it is dropped
(``return-clove-stranger``) and the path is left as it was. Whoever learns a proxy path id
cannot push data down the path.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from overlay.anon import onion
from overlay.anon.actions import Send
from overlay.wire import codec, crypto
from overlay.wire.messages import (
    LINK_ID_LEN,
    PROXY_PATH_ID_LEN,
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


@dataclass(slots=True)
class _Path:
    pred: bytes
    pred_link: bytes
    succ: bytes | None  # None at the proxy
    succ_link: bytes | None
    hop: onion.HopCrypt
    proxy: onion.ProxyCrypt | None  # set at the proxy (the last hop) only
    proxy_path_id: bytes | None
    expires: float  # monotonic
    last_used: float
    cells: int = 0
    told_unauthentic: bool = False  # the proxy told the user once that a forward cell failed
    # at the proxy: model nodes this path delivered to or got reply cloves from, most recent
    # last (at most MODELS_PER_PATH); losing the connection to one is signalled to the user
    models: dict[bytes, None] = field(default_factory=dict)
    # at the proxy: model nodes this path delivered to, most recent last (at most
    # MODELS_PER_PATH): reply cloves are taken from these (and those may_answer allows) only
    delivered: dict[bytes, None] = field(default_factory=dict)


@dataclass
class TokenBucket:
    rate: float
    burst: float
    tokens: float = -1.0
    stamp: float = 0.0

    def take(self, now: float, n: float = 1.0) -> bool:
        if self.tokens < 0:
            self.tokens, self.stamp = self.burst, now
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= n:
            self.tokens -= n
            return True
        return False


HOLD_S = 3.0  # how long a Create from an unlisted peer waits for a list that holds it


@dataclass(slots=True)
class _Held:
    """A Create from a peer ``admits`` did not list, waiting for the next list (or ``until``)."""

    peer: bytes
    msg: Create
    until: float  # monotonic


@dataclass(frozen=True)
class RelayLimits:
    max_paths: int = 20_000
    max_paths_per_peer: int = 2_000
    idle_timeout: float = 20 * 60.0  # > the 15-minute refresh, so live paths never idle out
    cells_per_s: float = 50_000.0
    cell_burst: float = 100_000.0
    creates_per_s: float = 100.0
    create_burst: float = 400.0
    max_replay_entries: int = 200_000
    # A Create from a peer ``admits`` does not list (yet) is held up to ``hold_s`` for a list
    # that holds it (issue 28 item 9), at most ``max_held`` in all and ``max_held_per_peer`` per
    # peer; ``hold_s = 0``: refused at once.
    hold_s: float = HOLD_S
    max_held: int = 64
    max_held_per_peer: int = 2


@dataclass
class RelayCore:
    """One node's relay state. ``knows(node_id)`` says whether a node may be a next hop
    (a registered user); ``is_model(node_id)`` whether a proxy may deliver to it (a
    registered model node; ``None``: ask ``knows``). A proxy that delivered to a user node,
    or a relay that extended a path to a model node, would make that node drop the
    connection (it does not speak the message), and with it every path on that link.
    ``admits(node_id)`` (``None``: anyone) says whether a predecessor may open a path here; once
    lists come from the committee it is "a registered user", so an unregistered node is refused
    (``not-registered``) and :meth:`forget_unlisted` closes the paths of one that left.
    ``may_answer(delivered_to, node_id)`` (``None``: nobody) says whether ``node_id`` may send
    reply cloves on a path that delivered to model node ``delivered_to`` (it is a member of that
    node's group, which answers a request forwarded to it straight to the user's proxies); the
    node delivered to may always."""

    node_id: bytes
    static_key: crypto.X25519Key
    knows: Any = None  # Callable[[bytes], bool]
    limits: RelayLimits = field(default_factory=RelayLimits)
    dropped: Counter[str] = field(default_factory=Counter)
    forwarded: int = 0
    is_model: Any = None  # Callable[[bytes], bool]
    admits: Any = None  # Callable[[bytes], bool]
    may_answer: Any = None  # Callable[[bytes, bytes], bool]

    def __post_init__(self) -> None:
        self.by_pred: dict[tuple[bytes, bytes], _Path] = {}
        self.by_succ: dict[tuple[bytes, bytes], _Path] = {}
        self.by_proxy_path: dict[bytes, _Path] = {}
        self.per_peer: Counter[bytes] = Counter()
        self.replay: dict[bytes, float] = {}  # ephemeral key -> unix expiry
        self._cell_buckets: dict[bytes, TokenBucket] = {}
        self._create_buckets: dict[bytes, TokenBucket] = {}
        self._held: dict[tuple[bytes, bytes], _Held] = {}  # (peer, link id) -> held Create, oldest first
        self._held_per_peer: Counter[bytes] = Counter()
        # held Creates: "held" (taken), "full" (refused at once: over max_held/_per_peer),
        # "admitted" (re-fed once a list held the peer), "refused" (re-fed after hold_s, unlisted)
        self.holds: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self.by_pred)

    def _drop(self, reason: str) -> list[Send]:
        self.dropped[reason] += 1
        return []

    def _bucket(self, table: dict[bytes, TokenBucket], peer: bytes, rate: float, burst: float) -> TokenBucket:
        b = table.get(peer)
        if b is None:
            if len(table) > 4 * self.limits.max_paths:
                table.clear()  # bounded: forget old peers' buckets (they refill to burst anyway)
            b = table[peer] = TokenBucket(rate, burst)
        return b

    # ------------------------------------------------------------------ dispatch

    def on_message(self, peer: bytes, msg: Any, *, now: float, unix: float) -> list[Send]:
        if isinstance(msg, CellFwd):
            return self.on_cell_fwd(peer, msg, now)
        if isinstance(msg, CellBack):
            return self.on_cell_back(peer, msg, now)
        if isinstance(msg, Create):
            return self.on_create(peer, msg, now, unix)
        if isinstance(msg, Destroy):
            return self.on_destroy(peer, msg)
        if isinstance(msg, ReturnClove):
            return self.on_return_clove(peer, msg, now)
        return self._drop("unexpected-message")

    # ------------------------------------------------------------------ create

    def on_create(self, peer: bytes, msg: Create, now: float, unix: float) -> list[Send]:
        if not self._bucket(self._create_buckets, peer, self.limits.creates_per_s,
                            self.limits.create_burst).take(now):
            return self._drop("create-rate-limited")
        return self._create(peer, msg, now, unix, may_hold=True)

    def _create(self, peer: bytes, msg: Create, now: float, unix: float, *, may_hold: bool) -> list[Send]:
        """A Create that passed the rate limit (``on_create``), or a held one re-fed
        (``release_held``: its token was taken when it arrived; ``may_hold`` False)."""
        if self.admits is not None and not self.admits(peer):
            if may_hold:
                held = self._hold(peer, msg, now)
                if held is not None:
                    return held
            return [Send(peer, Destroy(msg.link_id, "not-registered")), *self._drop("not-registered")]
        if (peer, msg.link_id) in self.by_pred:
            return self._drop("link-in-use")
        if len(self.by_pred) >= self.limits.max_paths or self.per_peer[peer] >= self.limits.max_paths_per_peer:
            return [Send(peer, Destroy(msg.link_id, "table-full")), *self._drop("table-full")]
        try:
            r = onion.peel_onion(self.static_key, msg.onion)
        except onion.OnionError as exc:
            return [Send(peer, Destroy(msg.link_id, exc.reason)), *self._drop("onion-" + exc.reason)]
        if r.expires < unix or r.expires > unix + onion.MAX_ONION_TTL:
            return [Send(peer, Destroy(msg.link_id, "expired")), *self._drop("onion-expired")]
        if r.ephemeral in self.replay:
            return self._drop("onion-replayed")
        self._remember(r.ephemeral, r.expires, unix)
        expires = now + (r.expires - unix)
        if r.is_proxy:
            proxy_path_id = crypto.random_bytes(PROXY_PATH_ID_LEN)
            path = _Path(peer, msg.link_id, None, None, onion.HopCrypt(r.keys), onion.ProxyCrypt(r.keys),
                         proxy_path_id, expires, now)
            self._add(path)
            assert path.proxy is not None
            iv, body = path.proxy.seal_backward(codec.encode(PathReady(proxy_path_id=proxy_path_id)))
            return [Send(peer, CellBack(msg.link_id, iv, body))]
        nxt = r.next_node
        if nxt == self.node_id or nxt == peer or (self.knows is not None and not self.knows(nxt)):
            return [Send(peer, Destroy(msg.link_id, "bad-next-hop")), *self._drop("bad-next-hop")]
        succ_link = crypto.random_bytes(LINK_ID_LEN)
        path = _Path(peer, msg.link_id, nxt, succ_link, onion.HopCrypt(r.keys), None, None, expires, now)
        self._add(path)
        return [Send(nxt, Create(succ_link, r.next_onion))]

    # ------------------------------------------------------------------ held creates

    def _hold(self, peer: bytes, msg: Create, now: float) -> list[Send] | None:
        """Hold a Create from an unlisted ``peer`` (``[]``: held, or dropped as a duplicate link);
        ``None``: holding is off or full, refuse it at once. Nothing of it is read until it is
        re-fed (no onion peeled, no replay entry made), so a held Create costs its bytes only."""
        lim = self.limits
        if lim.hold_s <= 0:
            return None
        key = (peer, msg.link_id)
        if key in self._held:
            return self._drop("link-in-use")
        if len(self._held) >= lim.max_held or self._held_per_peer[peer] >= lim.max_held_per_peer:
            self.holds["full"] += 1
            return None
        self._held[key] = _Held(peer, msg, now + lim.hold_s)
        self._held_per_peer[peer] += 1
        self.holds["held"] += 1
        return []

    def _unhold(self, key: tuple[bytes, bytes]) -> _Held:
        h = self._held.pop(key)
        self._held_per_peer[h.peer] -= 1
        if self._held_per_peer[h.peer] <= 0:
            del self._held_per_peer[h.peer]
        return h

    @property
    def held(self) -> int:
        """How many Creates are held now."""
        return len(self._held)

    def next_hold_deadline(self) -> float | None:
        """When the oldest held Create is due (monotonic), ``None`` if none is held."""
        return min((h.until for h in self._held.values()), default=None)

    def release_held(self, now: float, unix: float) -> list[Send]:
        """Re-feed the held Creates whose peer ``admits`` now lists (call after each list update)
        and those held ``hold_s`` (due): each goes through the rest of :meth:`on_create` (no second
        rate-limit token; the onion checks, replay cache included, as for any Create), so a listed
        peer's is accepted and an unlisted one's refused ``not-registered`` as without holding."""
        out: list[Send] = []
        for key, h in list(self._held.items()):
            admitted = self.admits is None or self.admits(h.peer)
            if not admitted and h.until > now:
                continue
            self._unhold(key)
            self.holds["admitted" if admitted else "refused"] += 1
            out += self._create(h.peer, h.msg, now, unix, may_hold=False)
        return out

    def forget_unlisted(self) -> list[Send]:
        """Close every path whose predecessor or successor ``admits``/``knows`` no longer lists
        (called after each list update): a node that left loses its paths within one refresh."""
        gone = [p for p in list(self.by_pred.values())
                if (self.admits is not None and not self.admits(p.pred))
                or (p.succ is not None and self.knows is not None and not self.knows(p.succ))]
        out: list[Send] = []
        for p in gone:
            self._remove(p)
            out += self._teardown(p, "not-registered")
            self.dropped["path-unlisted"] += 1
        return out

    def _remember(self, eph: bytes, expires: float, unix: float) -> None:
        if len(self.replay) >= self.limits.max_replay_entries:
            for k in [k for k, t in self.replay.items() if t < unix]:
                del self.replay[k]
            if len(self.replay) >= self.limits.max_replay_entries:
                # Still full of live entries: forget the oldest-expiring half. Onions
                # we forget could be replayed, but only until their own expiry.
                for k, _ in sorted(self.replay.items(), key=lambda kv: kv[1])[: len(self.replay) // 2]:
                    del self.replay[k]
        self.replay[eph] = expires

    def _add(self, p: _Path) -> None:
        self.by_pred[(p.pred, p.pred_link)] = p
        if p.succ is not None and p.succ_link is not None:
            self.by_succ[(p.succ, p.succ_link)] = p
        if p.proxy_path_id is not None:
            self.by_proxy_path[p.proxy_path_id] = p
        self.per_peer[p.pred] += 1

    def _remove(self, p: _Path) -> None:
        self.by_pred.pop((p.pred, p.pred_link), None)
        if p.succ is not None and p.succ_link is not None:
            self.by_succ.pop((p.succ, p.succ_link), None)
        if p.proxy_path_id is not None:
            self.by_proxy_path.pop(p.proxy_path_id, None)
        self.per_peer[p.pred] -= 1
        if self.per_peer[p.pred] <= 0:
            del self.per_peer[p.pred]

    # ------------------------------------------------------------------ cells

    def _live_path(self, peer: bytes, p: _Path | None, unknown: str, now: float,
                   sender_ok: Any = None) -> _Path | list[Send]:
        """Rate-limit ``peer``, then the path a cell belongs to — or the actions for a drop.
        ``sender_ok(path)`` (optional): whether ``peer`` may use the live path at all (if not:
        dropped as ``return-clove-stranger``, the path untouched)."""
        if not self._bucket(self._cell_buckets, peer, self.limits.cells_per_s, self.limits.cell_burst).take(now):
            return self._drop("cell-rate-limited")
        if p is None:
            return self._drop(unknown)
        if now > p.expires:
            self._remove(p)
            return self._teardown(p, "expired") + self._drop("path-expired")
        if sender_ok is not None and not sender_ok(p):
            return self._drop("return-clove-stranger")
        p.last_used = now
        p.cells += 1
        return p

    def on_cell_fwd(self, peer: bytes, msg: CellFwd, now: float) -> list[Send]:
        p = self._live_path(peer, self.by_pred.get((peer, msg.link_id)), "unknown-link", now)
        if not isinstance(p, _Path):
            return p
        if p.proxy is None:
            assert p.succ is not None and p.succ_link is not None
            iv, body = p.hop.relay_forward(msg.iv, msg.body)
            self.forwarded += 1
            return [Send(p.succ, CellFwd(p.succ_link, iv, body))]
        try:
            payload = codec.decode(p.proxy.open_forward(msg.iv, msg.body))
        except onion.OnionError:
            if p.told_unauthentic:
                return self._drop("cell-unauthentic")
            p.told_unauthentic = True  # once per path: the user replaces the path on it
            return self._notice(p, "cell-unauthentic", "a forward cell failed authentication at the proxy")
        except codec.RemoteProtocolError:
            return self._drop("cell-malformed")
        if not isinstance(payload, ToModel):
            return self._drop("cell-unexpected-payload")
        is_model = self.is_model if self.is_model is not None else self.knows
        if is_model is not None and not is_model(payload.dest):
            return self._notice(p, "unknown-model-node", "the destination is not a model node in the registry")
        assert p.proxy_path_id is not None
        self.forwarded += 1
        _remember_model(p.models, payload.dest)
        _remember_model(p.delivered, payload.dest)
        return [Send(payload.dest, Deliver(proxy_path_id=p.proxy_path_id, sealed=payload.sealed))]

    def on_cell_back(self, peer: bytes, msg: CellBack, now: float) -> list[Send]:
        p = self._live_path(peer, self.by_succ.get((peer, msg.link_id)), "unknown-link", now)
        if not isinstance(p, _Path):
            return p
        iv, body = p.hop.relay_backward(msg.iv, msg.body)
        self.forwarded += 1
        return [Send(p.pred, CellBack(p.pred_link, iv, body))]

    def on_return_clove(self, peer: bytes, msg: ReturnClove, now: float) -> list[Send]:
        """A reply clove from ``peer`` for the user of a proxy path: passed back only if the path
        delivered to ``peer`` or ``may_answer`` allows it for a node the path delivered to (an
        expired path is torn down whoever names it, as for any cell)."""
        found = self.by_proxy_path.get(msg.proxy_path_id)
        p = self._live_path(peer, found if found is not None and found.proxy is not None else None,
                            "unknown-proxy-path", now, lambda path: self._may_return(path, peer))
        if not isinstance(p, _Path):
            return p
        assert p.proxy is not None
        _remember_model(p.models, peer)
        iv, body = p.proxy.seal_backward(codec.encode(FromModel(data=msg.data)))
        self.forwarded += 1
        return [Send(p.pred, CellBack(p.pred_link, iv, body))]

    def _may_return(self, p: _Path, peer: bytes) -> bool:
        if peer in p.delivered:
            return True
        return self.may_answer is not None and any(self.may_answer(d, peer) for d in p.delivered)

    def _notice(self, p: _Path, code: str, detail: str, model_node: bytes = b"") -> list[Send]:
        assert p.proxy is not None
        self.dropped[code] += 1
        iv, body = p.proxy.seal_backward(codec.encode(PathNotice(code=code, detail=detail, model_node=model_node)))
        return [Send(p.pred, CellBack(p.pred_link, iv, body))]

    def deliver_failed(self, proxy_path_id: bytes, detail: str, model_node: bytes = b"") -> list[Send]:
        """The driver could not deliver to ``model_node``: tell the user through the path (a
        failover signal)."""
        p = self.by_proxy_path.get(proxy_path_id)
        if p is None:
            return []
        p.models.pop(model_node, None)
        return self._notice(p, "model-unreachable", detail[:512], model_node)

    def _model_lost(self, peer: bytes) -> list[Send]:
        """The connection to ``peer`` closed: each proxy path that delivered to it or got reply
        cloves from it tells its user (``model-lost``, a failover signal)."""
        out: list[Send] = []
        for p in list(self.by_proxy_path.values()):
            if p.proxy is not None and peer in p.models:
                del p.models[peer]
                out += self._notice(p, "model-lost", "the proxy lost its connection to the model node", peer)
        return out

    # ------------------------------------------------------------------ teardown

    def _teardown(self, p: _Path, reason: str) -> list[Send]:
        out = [Send(p.pred, Destroy(p.pred_link, reason))]
        if p.succ is not None and p.succ_link is not None:
            out.append(Send(p.succ, Destroy(p.succ_link, reason)))
        return out

    def on_destroy(self, peer: bytes, msg: Destroy) -> list[Send]:
        if (peer, msg.link_id) in self._held:  # the user gave up on a build we hold
            self._unhold((peer, msg.link_id))
            return self._drop("held-destroyed")
        p = self.by_pred.get((peer, msg.link_id))
        if p is not None:
            self._remove(p)
            if p.succ is not None and p.succ_link is not None:
                return [Send(p.succ, Destroy(p.succ_link, msg.reason))]
            return []
        p = self.by_succ.get((peer, msg.link_id))
        if p is not None:
            self._remove(p)
            return [Send(p.pred, Destroy(p.pred_link, msg.reason))]
        return self._drop("unknown-link")

    def on_peer_lost(self, peer: bytes) -> list[Send]:
        """A neighbour's connection closed: tear down every path through it, and tell the users
        of proxy paths that talked to it (if it is a model node) that it is gone."""
        out: list[Send] = self._model_lost(peer)
        for key in [k for k in self._held if k[0] == peer]:
            self._unhold(key)
            self.dropped["held-peer-lost"] += 1
        for (pred, _), p in list(self.by_pred.items()):
            if pred == peer:
                self._remove(p)
                if p.succ is not None and p.succ_link is not None:
                    out.append(Send(p.succ, Destroy(p.succ_link, "neighbour-lost")))
        for (succ, _), p in list(self.by_succ.items()):
            if succ == peer:
                self._remove(p)
                out.append(Send(p.pred, Destroy(p.pred_link, "neighbour-lost")))
        return out

    def expire(self, now: float) -> list[Send]:
        """Drop paths idle for ``idle_timeout`` or past their expiry."""
        out: list[Send] = []
        for p in list(self.by_pred.values()):
            if now > p.expires or now - p.last_used > self.limits.idle_timeout:
                self._remove(p)
                out += self._teardown(p, "expired")
                self.dropped["path-expired"] += 1
        return out


MODELS_PER_PATH = 8


def _remember_model(models: dict[bytes, None], node: bytes) -> None:
    """Add ``node`` to a proxy path's ``models`` or ``delivered`` (most recent last; bounded)."""
    models.pop(node, None)
    models[node] = None
    if len(models) > MODELS_PER_PATH:
        del models[next(iter(models))]
