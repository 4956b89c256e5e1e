"""Onion cryptography for proxy paths (paper §3.2 step 2), I/O-free.

Two pieces:

**Path establishment onion** — one fixed-size packet that sets up a 3-hop path
(Sphinx-style header, Danezis & Goldberg 2009, without group-element blinding:
each hop's routing block carries the next hop's fresh X25519 ephemeral key).
Hop ``i`` derives its keys from ``X25519(e_i, its static key)`` with HKDF,
checks the MAC over its header, strips one routing block and re-pads the header
with keystream, so every hop sees a packet of exactly :data:`ONION_LEN` bytes
whatever its position. The MAC covers the expiry, so a modified onion is
rejected; each hop remembers the ephemeral keys it has seen until expiry, so a
replayed onion is rejected.

**Cell layers** — afterwards, cloves travel as cells ``(link id, iv, body)``.
Each hop XORs the body with AES-CTR under its own per-direction key and maps
the iv through a keyed AES permutation, so both the body and the iv differ on
every link, and no hop does public-key work per cell (DESIGN.md, "Beyond the
paper"). The innermost layer is an AEAD between the user and its proxy, so a
cell tampered with on the way is detected at the end of the path.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from overlay.wire import crypto
from overlay.wire.identity import NODE_ID_LEN
from overlay.wire.messages import IV_LEN

HOPS = 3  # path length l (paper §3.2: "GenTorrent uses l = 3")
MAC_LEN = 16
EPH_LEN = 32
# routing block: flags(1) | expiry u32 (4) | next node id (20) | next ephemeral (32) | next MAC (16)
BLOCK_LEN = 1 + 4 + NODE_ID_LEN + EPH_LEN + MAC_LEN
BETA_LEN = HOPS * BLOCK_LEN
ONION_LEN = EPH_LEN + MAC_LEN + BETA_LEN  # 32 + 16 + 3*73 = 267 bytes
MAX_ONION_TTL = 2 * 3600  # a path may not be set up to live longer than this

FLAG_RELAY = 0
FLAG_PROXY = 1

_INFO = b"gentorrent/onion/v1/"


class OnionError(Exception):
    """The onion or cell failed a check; ``reason`` is a stable word for counters."""

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        super().__init__(f"{reason}: {detail}" if detail else reason)


@dataclass(frozen=True, slots=True)
class HopKeys:
    """Symmetric keys a hop shares with the path's owner, derived from one X25519 secret."""

    mac: bytes
    stream: bytes
    fwd: bytes      # AES-CTR for cells towards the proxy
    fwd_iv: bytes   # iv permutation, forward
    back: bytes     # AES-CTR for cells towards the user
    back_iv: bytes  # iv permutation, backward
    end: bytes      # AEAD key user <-> proxy (used only at the last hop)

    @classmethod
    def derive(cls, shared: bytes, ephemeral_public: bytes) -> HopKeys:
        okm = crypto.hkdf(shared, salt=ephemeral_public, info=_INFO + b"keys", length=7 * 32)
        parts = [okm[i * 32 : (i + 1) * 32] for i in range(7)]
        return cls(*parts)


@dataclass(frozen=True, slots=True)
class Routing:
    """What one hop learns when it opens its layer."""

    is_proxy: bool  # this hop is the path's proxy (the last hop)
    expires: int
    next_node: bytes  # zero bytes at the proxy
    keys: HopKeys
    ephemeral: bytes  # this hop's ephemeral public key (for the replay cache)
    next_onion: bytes  # the packet to pass on (meaningless at the proxy)


def _xor(a: bytes, b: bytes) -> bytes:
    n = len(a)
    return (int.from_bytes(a, "big") ^ int.from_bytes(b[:n], "big")).to_bytes(n, "big")


def _rho(keys: HopKeys) -> bytes:
    return crypto.stream_xor(keys.stream, bytes(IV_LEN), bytes(BETA_LEN + BLOCK_LEN))


def _pack_block(flags: int, expires: int, next_node: bytes, next_eph: bytes, next_mac: bytes) -> bytes:
    return struct.pack(">BI", flags, expires) + next_node + next_eph + next_mac


def build_onion(
    hop_x25519: list[bytes], hop_ids: list[bytes], expires: int | Sequence[int]
) -> tuple[bytes, list[HopKeys]]:
    """Build the establishment onion for ``HOPS`` hops.

    ``hop_x25519[i]`` and ``hop_ids[i]`` are hop ``i``'s static X25519 key and
    node id (hop 0 is the first relay, the last is the proxy). ``expires`` is each
    hop's expiry (unix seconds), one per hop; a single int gives every hop the same
    one, which only tests and benchmarks may do: a value common to the hops of a
    path (or to several paths) lets colluding relays link them, so real paths draw
    an independent expiry per hop (:func:`overlay.anon.paths.hop_expiries`). Returns the
    packet to send to hop 0 and every hop's keys, which the user keeps.
    """
    if len(hop_x25519) != HOPS or len(hop_ids) != HOPS:
        raise ValueError(f"an onion path has exactly {HOPS} hops")
    exp = [expires] * HOPS if isinstance(expires, int) else list(expires)
    if len(exp) != HOPS or not all(0 <= e < 2**32 for e in exp):
        raise ValueError(f"need {HOPS} expiries, each a u32 of unix seconds")
    ephs = [crypto.X25519Key.generate() for _ in range(HOPS)]
    keys = [
        HopKeys.derive(e.exchange(pk), e.public_bytes) for e, pk in zip(ephs, hop_x25519, strict=True)
    ]
    rhos = [_rho(k) for k in keys]
    # Fillers: the junk each hop appends, as seen by the later hops.
    phi = b""
    for i in range(1, HOPS):
        phi = _xor(phi + bytes(BLOCK_LEN), rhos[i - 1][BETA_LEN + BLOCK_LEN - i * BLOCK_LEN :])
    last = HOPS - 1
    block = _pack_block(FLAG_PROXY, exp[last], bytes(NODE_ID_LEN), bytes(EPH_LEN), bytes(MAC_LEN))
    beta = _xor(block, rhos[last][:BLOCK_LEN]) + phi
    mac = crypto.mac16(keys[last].mac, beta)
    for i in range(HOPS - 2, -1, -1):
        block = _pack_block(FLAG_RELAY, exp[i], hop_ids[i + 1], ephs[i + 1].public_bytes, mac)
        beta = _xor(block + beta[: BETA_LEN - BLOCK_LEN], rhos[i][:BETA_LEN])
        mac = crypto.mac16(keys[i].mac, beta)
    onion = ephs[0].public_bytes + mac + beta
    assert len(onion) == ONION_LEN
    return onion, keys


def peel_onion(static: crypto.X25519Key, onion: bytes) -> Routing:
    """Open this hop's layer. Raises :class:`OnionError` (``bad-size``, ``bad-key``,
    ``bad-mac``, ``bad-flags``). The MAC covers the whole header, expiry included."""
    if len(onion) != ONION_LEN:
        raise OnionError("bad-size", f"onion of {len(onion)} bytes, expected {ONION_LEN}")
    eph, mac, beta = onion[:EPH_LEN], onion[EPH_LEN : EPH_LEN + MAC_LEN], onion[EPH_LEN + MAC_LEN :]
    try:
        shared = static.exchange(eph)
    except crypto.CryptoError as exc:
        raise OnionError("bad-key", str(exc)) from None
    keys = HopKeys.derive(shared, eph)
    rho = _rho(keys)
    tmp = _xor(beta + bytes(BLOCK_LEN), rho)
    if not crypto.ct_equal(crypto.mac16(keys.mac, beta), mac):
        raise OnionError("bad-mac", "onion layer does not authenticate (tampered, or not for us)")
    flags, expires = struct.unpack(">BI", tmp[:5])
    if flags not in (FLAG_RELAY, FLAG_PROXY):
        raise OnionError("bad-flags", f"unknown flags {flags}")
    o = 5
    next_node = tmp[o : o + NODE_ID_LEN]
    o += NODE_ID_LEN
    next_eph = tmp[o : o + EPH_LEN]
    o += EPH_LEN
    next_mac = tmp[o : o + MAC_LEN]
    next_beta = tmp[BLOCK_LEN:]
    return Routing(
        is_proxy=flags == FLAG_PROXY,
        expires=expires,
        next_node=next_node,
        keys=keys,
        ephemeral=eph,
        next_onion=next_eph + next_mac + next_beta,
    )


# --------------------------------------------------------------------------- cells


class HopCrypt:
    """One hop's cell transform, for both directions. Reused for every cell."""

    __slots__ = ("_back_iv", "_fwd_iv", "back", "fwd", "keys")

    def __init__(self, keys: HopKeys) -> None:
        self.keys = keys
        self.fwd = crypto.StreamCipher(keys.fwd)
        self.back = crypto.StreamCipher(keys.back)
        self._fwd_iv = crypto.BlockPermutation(keys.fwd_iv)
        self._back_iv = crypto.BlockPermutation(keys.back_iv)

    # A relay, forward: strip our layer, pass on the permuted iv.
    def relay_forward(self, iv: bytes, body: bytes) -> tuple[bytes, bytes]:
        return self._fwd_iv.forward(iv), self.fwd.xor(iv, body)

    # A relay, backward: add our layer, pass on the permuted iv.
    def relay_backward(self, iv: bytes, body: bytes) -> tuple[bytes, bytes]:
        return self._back_iv.forward(iv), self.back.xor(iv, body)

    # The user, inverting one backward hop: (iv after the hop) -> (iv the hop used).
    def unwrap_backward(self, iv_after: bytes, body: bytes) -> tuple[bytes, bytes]:
        iv = self._back_iv.inverse(iv_after)
        return iv, self.back.xor(iv, body)

    def next_forward_iv(self, iv: bytes) -> bytes:
        return self._fwd_iv.forward(iv)


def _end_nonce(iv: bytes, direction: bytes) -> bytes:
    return crypto.blake2b(direction + iv, size=12)


class PathCrypt:
    """The user's view of one path: all hop keys; wraps forward cells, unwraps backward ones.

    The innermost layer is an AEAD under the proxy's ``end`` key with a nonce
    derived from the iv the proxy sees, so a modified cell fails at the end.
    """

    def __init__(self, keys: list[HopKeys]) -> None:
        self.hops = [HopCrypt(k) for k in keys]
        self._end = crypto.Aead(keys[-1].end)

    def wrap_forward(self, payload: bytes) -> tuple[bytes, bytes]:
        """``(iv, body)`` to send on the first link; the proxy recovers ``payload``."""
        iv0 = crypto.random_bytes(IV_LEN)
        ivs = [iv0]
        for h in self.hops[:-1]:
            ivs.append(h.next_forward_iv(ivs[-1]))
        body = self._end.seal(_end_nonce(ivs[-1], b"F"), payload)
        for h, iv in zip(reversed(self.hops), reversed(ivs), strict=True):
            body = h.fwd.xor(iv, body)
        return iv0, body

    def unwrap_backward(self, iv: bytes, body: bytes) -> bytes:
        """Strip every hop's layer and the proxy's AEAD; :class:`OnionError` if tampered."""
        for h in self.hops:
            iv, body = h.unwrap_backward(iv, body)
        # ``iv`` is now the one the proxy chose.
        try:
            return self._end.open(_end_nonce(iv, b"B"), body)
        except crypto.CryptoError:
            raise OnionError("bad-cell", "backward cell does not authenticate") from None


class ProxyCrypt:
    """The proxy's end of a path: opens forward payloads, seals backward ones."""

    __slots__ = ("_end", "hop")

    def __init__(self, keys: HopKeys) -> None:
        self.hop = HopCrypt(keys)
        self._end = crypto.Aead(keys.end)

    def open_forward(self, iv: bytes, body: bytes) -> bytes:
        body = self.hop.fwd.xor(iv, body)
        try:
            return self._end.open(_end_nonce(iv, b"F"), body)
        except crypto.CryptoError:
            raise OnionError("bad-cell", "forward cell does not authenticate at the proxy") from None

    def seal_backward(self, payload: bytes) -> tuple[bytes, bytes]:
        iv = crypto.random_bytes(IV_LEN)
        body = self._end.seal(_end_nonce(iv, b"B"), payload)
        return self.hop.relay_backward(iv, body)
