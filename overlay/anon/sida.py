"""S-IDA cloves: Krawczyk's secure information dispersal (paper §3.2, "Using S-IDA").

Every prompt and every reply chunk travels as n cloves over n anonymous paths;
any k of them rebuild it, k−1 of them reveal nothing about the key that
protects it (paper §3.2; H. Krawczyk, "Secret sharing made short", CRYPTO '93,
and its robust variant). :func:`split` does the sender's steps 1–4:

1. Encrypt M under a fresh 32-byte key K with AES-256-GCM
   (:class:`overlay.wire.crypto.Aead`). K is used for this one message only, so the
   nonce is the constant zero nonce; the associated data binds the message id
   and (n, k): ``b"gentorrent/sida/v1" || msg_id || n || k``.
2. Split the ciphertext k-of-n with Rabin's IDA, i.e. a systematic
   Reed–Solomon erasure code (zfec). zfec needs k equal blocks, so the
   ciphertext is extended as ``ct || 0^p || p`` (one byte ``p`` in 0..k−1)
   to a multiple of k; each fragment is ``ceil((|M| + 17) / k)`` bytes.
3. Split K k-of-n with Shamir's scheme over GF(2^8), byte-wise
   (:mod:`overlay.anon.gf256`); share i is the evaluation at x = i + 1.
4. Clove i = (msg_id, i, n, k, fragment_i, share_i, fingerprints), where
   ``fingerprints`` is ``F(fragment_0) … F(fragment_{n−1}) || S(share_0) …
   S(share_{n−1})``, each a 16-byte BLAKE2b with its own personalisation.

Robust decoding (Krawczyk's variant, linear time, no subset search): cloves
are grouped by (msg_id, n, k, fragment length, fingerprint vector); a clove
counts for its group only if its own fragment and share hash to its own slot
of that vector. A group with k such cloves at distinct indexes is decoded
(zfec, Lagrange at 0) and the AES-GCM tag is the final check, so a wrong key
or ciphertext never yields garbage. Forgers may invent whole fingerprint
vectors; a group that is self-consistent but fails the tag is discarded and
the next group with k members is tried. Each clove is hashed at most once
and each group decoded at most once, so the work is linear in the input.

Security notes. k−1 shares are independent of K (information-theoretic); the
share fingerprints in every clove make the secrecy of K computational (a
2^256 search against BLAKE2b), as in Krawczyk's robust scheme. Anyone who can
inject k self-consistent cloves under a message id can make a message of
their own: S-IDA gives confidentiality and integrity against fewer than k
bad paths, not sender authentication (the clove header is sealed to the
receiver by the overlay, DESIGN.md "Anonymous overlay").

Limits: ``1 ≤ k ≤ n ≤`` :data:`MAX_N` and messages up to :data:`MAX_MESSAGE`
bytes (DESIGN.md: defaults n = 4, k = 3).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import zfec

from overlay.anon import gf256
from overlay.wire import codec
from overlay.wire.codec import field, message
from overlay.wire.crypto import AEAD_KEY_LEN, AEAD_TAG_LEN, Aead, CryptoError, blake2b, random_bytes

__all__ = [
    "FP_LEN",
    "KEY_LEN",
    "MAX_MESSAGE",
    "MAX_N",
    "MSG_ID_LEN",
    "Clove",
    "Reassembler",
    "SidaError",
    "clove_problem",
    "decode_clove",
    "encode_clove",
    "fragment_len",
    "recover",
    "split",
]

MAX_N = 16
"""Most cloves per message (the math allows 255; paths are few, so we bound it)."""
MAX_MESSAGE = 1 << 20
"""Largest message :func:`split` accepts, in bytes (1 MiB)."""
MSG_ID_LEN = 16
KEY_LEN = AEAD_KEY_LEN
FP_LEN = 16
"""Bytes of one fingerprint (truncated BLAKE2b)."""

_TRAILER = AEAD_TAG_LEN + 1  # GCM tag + the pad-length byte
MAX_FRAGMENT = MAX_MESSAGE + _TRAILER  # k = 1
_NONCE = bytes(12)
_AAD_PREFIX = b"gentorrent/sida/v1"
_P_FRAG = b"gt-sida-frag"
_P_SHARE = b"gt-sida-share"
# ``_PADS[p]`` is appended to the last block: p zero bytes, then p itself.
_PADS = tuple(bytes(p) + bytes((p,)) for p in range(MAX_N))


class SidaError(Exception):
    """A message could not be split or recovered; the message says why."""


def fragment_len(size: int, k: int) -> int:
    """Length of every fragment of a ``size``-byte message split with threshold ``k``."""
    return -(-(size + _TRAILER) // k)


@message(200)
@dataclass(frozen=True, slots=True)
class Clove:
    """One S-IDA clove (paper §3.2, step 4). Wire type 200.

    A clove is *well-formed* when ``1 ≤ k ≤ n ≤ MAX_N``, ``0 ≤ index < n``,
    ``msg_id`` is 16 bytes, ``share`` 32 bytes, ``fingerprints`` ``2·n·FP_LEN``
    bytes (n fragment fingerprints, then n share fingerprints) and the
    fragment length is one that some message of 0..MAX_MESSAGE bytes would
    give for this k (:func:`fragment_len`). The dataclass itself is plain wire
    data: :func:`decode_clove` rejects ill-formed cloves, :func:`split` only
    makes well-formed ones, and :func:`recover` and :class:`Reassembler`
    ignore ill-formed ones like any other forgery. (Keeping the check out of
    ``__init__`` lets generic codec tests build instances from field bounds.)
    Whether a clove is *authentic* is only known once k of them decode.
    """

    msg_id: bytes = field(exact=MSG_ID_LEN)
    index: int = field()
    n: int = field()
    k: int = field()
    fragment: bytes = field(max=MAX_FRAGMENT)
    share: bytes = field(exact=KEY_LEN)
    fingerprints: bytes = field(max=2 * MAX_N * FP_LEN)


def clove_problem(c: Clove) -> str | None:
    """Why ``c`` is ill-formed (see :class:`Clove`), or ``None`` if it is well-formed."""
    n, k, i = c.n, c.k, c.index
    frag = c.fragment
    # One fast combined check (it runs for every clove received).
    if (
        type(n) is int
        and type(k) is int
        and type(i) is int
        and 1 <= k <= n <= MAX_N
        and 0 <= i < n
        and type(c.msg_id) is bytes
        and len(c.msg_id) == MSG_ID_LEN
        and type(c.share) is bytes
        and len(c.share) == KEY_LEN
        and type(c.fingerprints) is bytes
        and len(c.fingerprints) == 2 * FP_LEN * n
        and type(frag) is bytes
        and _FRAG_MIN[k] <= len(frag) <= _FRAG_MAX[k]
    ):
        return None
    if type(n) is not int or type(k) is not int or type(i) is not int:
        return "index, n and k must be ints"
    if not 1 <= k <= n <= MAX_N:
        return f"need 1 <= k <= n <= {MAX_N}, got n={n}, k={k}"
    if not 0 <= i < n:
        return f"index {i} outside 0..{n - 1}"
    for name in ("msg_id", "fragment", "share", "fingerprints"):
        if type(getattr(c, name)) is not bytes:
            return f"{name} must be bytes"
    if len(c.msg_id) != MSG_ID_LEN:
        return f"msg_id must be {MSG_ID_LEN} bytes"
    if len(c.share) != KEY_LEN:
        return f"share must be {KEY_LEN} bytes, got {len(c.share)}"
    if len(c.fingerprints) != 2 * n * FP_LEN:
        return f"fingerprints must be {2 * n * FP_LEN} bytes for n={n}, got {len(c.fingerprints)}"
    return f"fragment of {len(frag)} bytes impossible for k={k}"


_XS = tuple(tuple(range(1, n + 1)) for n in range(MAX_N + 1))  # Shamir x-coordinates
_FRAG_MIN = (0, *(fragment_len(0, k) for k in range(1, MAX_N + 1)))
_FRAG_MAX = (0, *(fragment_len(MAX_MESSAGE, k) for k in range(1, MAX_N + 1)))


# --------------------------------------------------------------------------- caches

_ENCODERS: dict[tuple[int, int], Any] = {}
_DECODERS: dict[tuple[int, int], Any] = {}


def _encoder(n: int, k: int) -> Any:
    enc = _ENCODERS.get((n, k))
    if enc is None:
        enc = _ENCODERS[(n, k)] = zfec.Encoder(k, n)
    return enc


def _decoder(n: int, k: int) -> Any:
    dec = _DECODERS.get((n, k))
    if dec is None:
        dec = _DECODERS[(n, k)] = zfec.Decoder(k, n)
    return dec


def _aad(msg_id: bytes, n: int, k: int) -> bytes:
    return _AAD_PREFIX + msg_id + bytes((n, k))


# --------------------------------------------------------------------------- split


def split(message: bytes | bytearray | memoryview, n: int = 4, k: int = 3, *, msg_id: bytes | None = None) -> list[Clove]:
    """The n cloves of ``message`` (paper §3.2, sender steps 1–4); any k rebuild it.

    ``msg_id`` defaults to 16 fresh random bytes (it must be unique per
    message: the receiver groups cloves by it). :class:`SidaError` if
    ``1 ≤ k ≤ n ≤ MAX_N`` does not hold, the message is over
    :data:`MAX_MESSAGE` bytes or ``msg_id`` is not 16 bytes.
    """
    if type(n) is not int or type(k) is not int or not 1 <= k <= n <= MAX_N:
        raise SidaError(f"need 1 <= k <= n <= {MAX_N}, got n={n!r}, k={k!r}")
    if type(message) is not bytes:
        if not isinstance(message, (bytearray, memoryview)):
            raise SidaError(f"message must be bytes, got {type(message).__name__}")
        message = bytes(message)
    size = len(message)
    if size > MAX_MESSAGE:
        raise SidaError(f"message of {size} bytes over the {MAX_MESSAGE}-byte limit")
    rnd = random_bytes(KEY_LEN * k + (MSG_ID_LEN if msg_id is None else 0))
    if msg_id is None:
        msg_id = rnd[KEY_LEN * k:]
    elif type(msg_id) is not bytes or len(msg_id) != MSG_ID_LEN:
        raise SidaError(f"msg_id must be {MSG_ID_LEN} bytes")
    key = rnd[:KEY_LEN]

    # 1. AEAD under a one-time key.
    ct = Aead(key).seal(_NONCE, message, _AAD_PREFIX + msg_id + bytes((n, k)))
    # 2. Rabin IDA (systematic RS): k equal blocks, then n fragments.
    b = -(-(size + _TRAILER) // k)
    pad = b * k - size - _TRAILER
    last = (k - 1) * b
    if last <= len(ct):  # the trailer fits in the last block: copy only that one
        blocks = [ct[i:i + b] for i in range(0, last, b)]
        blocks.append(ct[last:] + _PADS[pad])
    else:  # tiny message, large k: the trailer spans blocks
        ext = ct + _PADS[pad]
        blocks = [ext[i:i + b] for i in range(0, k * b, b)]
    frags = _encoder(n, k).encode(blocks) if n > k else blocks
    # 3. Shamir over GF(2^8), byte-wise; coefficients from the same draw.
    coeffs = [rnd[j:j + KEY_LEN] for j in range(KEY_LEN, KEY_LEN * k, KEY_LEN)]
    shares = gf256.eval_shares(key, coeffs, _XS[n])
    # 4. Fingerprints of every fragment and share, in every clove.
    fps = b"".join(
        [blake2b(f, size=FP_LEN, person=_P_FRAG) for f in frags]
        + [blake2b(s, size=FP_LEN, person=_P_SHARE) for s in shares]
    )
    return [Clove(msg_id, i, n, k, frags[i], shares[i], fps) for i in range(n)]


# --------------------------------------------------------------------------- wire


def encode_clove(c: Clove) -> bytes:
    """``c`` as a compact codec payload (msgpack, wire type 200, no length prefix)."""
    return codec.encode(c)


def decode_clove(data: bytes, *, peer: str | None = None) -> Clove:
    """Strictly decode one clove payload.

    :class:`codec.RemoteProtocolError` (naming ``peer``) on anything malformed:
    bad msgpack, another message type, wrong field types or sizes, and every
    ill-formed :class:`Clove` (index ≥ n, k > n, n > MAX_N, share or
    fingerprint lengths, a fragment length no message could give). Use this,
    not bare :func:`codec.decode`, for clove payloads.
    """
    obj = codec.decode(data, peer=peer)
    if type(obj) is not Clove:
        raise codec.RemoteProtocolError(
            f"expected a Clove, got {type(obj).__name__}", peer=peer, evidence=data
        )
    problem = clove_problem(obj)
    if problem is not None:
        raise codec.RemoteProtocolError(f"Clove: {problem}", peer=peer, evidence=data)
    return obj


# --------------------------------------------------------------------------- recover


def _self_consistent(c: Clove) -> bool:
    """Do this clove's fragment and share hash to its own slots of its own vector?"""
    fp = c.fingerprints
    i = c.index * FP_LEN
    j = (c.n + c.index) * FP_LEN
    return (
        blake2b(c.fragment, size=FP_LEN, person=_P_FRAG) == fp[i:i + FP_LEN]
        and blake2b(c.share, size=FP_LEN, person=_P_SHARE) == fp[j:j + FP_LEN]
    )


def _group_key(c: Clove) -> tuple[bytes, int, int, int, bytes]:
    return (c.msg_id, c.n, c.k, len(c.fragment), c.fingerprints)


def _decode_group(cloves: list[Clove]) -> bytes | None:
    """Message from k verified cloves of one group (distinct indexes), or None if
    the AEAD tag (or the pad trailer) does not check out."""
    cloves = sorted(cloves, key=lambda c: c.index)
    first = cloves[0]
    n, k = first.n, first.k
    idx = [c.index for c in cloves]
    if idx[-1] == k - 1 or n == k:  # the k primary blocks: no decoding needed
        joined = b"".join([c.fragment for c in cloves])
    else:
        # idx is sorted, distinct and < n: zfec hangs on repeated share numbers.
        joined = b"".join(_decoder(n, k).decode([c.fragment for c in cloves], idx))
    pad = joined[-1]
    end = len(joined) - 1 - pad
    if pad >= k or end < AEAD_TAG_LEN or joined[end:-1] != bytes(pad):
        return None
    key = gf256.combine([(c.index + 1, c.share) for c in cloves])
    try:
        return Aead(key).open(_NONCE, memoryview(joined)[:end], _aad(first.msg_id, n, k))
    except CryptoError:
        return None


def recover(cloves: Iterable[Clove]) -> bytes:
    """The message from any k authentic cloves among ``cloves`` (paper §3.2, receiver).

    Robust and linear-time: forged, tampered, duplicated and other-message
    cloves are ignored. Cloves are grouped by (msg_id, n, k, fragment length,
    fingerprint vector); groups with at least k distinct indexes are tried,
    largest first (ties: first seen), and the first whose k self-consistent
    cloves pass the AES-GCM tag wins. Pass the cloves of one message: if
    several messages are complete, one of them is returned.

    :class:`SidaError` if no group yields k authentic cloves; never garbage.
    """
    groups: dict[tuple[bytes, int, int, int, bytes], list[Clove]] = {}
    seen = 0
    for c in cloves:
        if type(c) is not Clove:
            raise SidaError(f"expected Clove, got {type(c).__name__}")
        seen += 1
        if clove_problem(c) is not None:
            continue  # ill-formed: a forgery like any other
        key = _group_key(c)
        g = groups.get(key)
        if g is None:
            groups[key] = [c]
        else:
            g.append(c)
    best = 0
    tried = 0
    for members in sorted(groups.values(), key=len, reverse=True):
        k = members[0].k
        if len(members) < k:  # k differs between groups: no early exit
            continue
        verified: dict[int, Clove] = {}
        for c in members:
            if c.index not in verified and _self_consistent(c):
                verified[c.index] = c
                if len(verified) == k:
                    break
        best = max(best, len(verified))
        if len(verified) < k:
            continue
        tried += 1
        out = _decode_group(list(verified.values()))
        if out is not None:
            return out
    if not seen:
        raise SidaError("no cloves")
    if tried:
        raise SidaError(f"{tried} candidate group(s) of k cloves failed authentication")
    raise SidaError(
        f"not enough authentic cloves: at most {best} consistent in one group "
        f"out of {seen} given, need k"
    )


# --------------------------------------------------------------------------- reassembly

_CLOVE_OVERHEAD = 256  # object and bookkeeping bytes charged per stored clove
_MAX_DEAD_GROUPS = 64


def _clove_cost(c: Clove) -> int:
    return len(c.fragment) + len(c.fingerprints) + KEY_LEN + MSG_ID_LEN + _CLOVE_OVERHEAD


def _message_cap(n: int, k: int) -> int:
    """Bytes one in-progress message may hold: twice an authentic MAX_MESSAGE one."""
    return 2 * n * (fragment_len(MAX_MESSAGE, k) + 2 * n * FP_LEN + KEY_LEN + MSG_ID_LEN + _CLOVE_OVERHEAD)


class _Pending:
    __slots__ = ("cap", "created", "dead", "groups", "slots", "used")

    def __init__(self, created: float) -> None:
        self.created = created
        self.cap = 0
        self.used = 0
        # index -> candidate cloves at that index (any group)
        self.slots: dict[int, list[Clove]] = {}
        # group key -> {index: self-consistent clove}
        self.groups: dict[tuple[bytes, int, int, int, bytes], dict[int, Clove]] = {}
        # group keys that failed authentication (ordered set, bounded)
        self.dead: dict[tuple[bytes, int, int, int, bytes], None] = {}


class Reassembler:
    """Collects cloves from the network and yields each message once (paper §3.2).

    I/O-free: :meth:`add` takes a decoded clove and the caller's monotonic
    ``now`` (seconds) and returns the message the first time k authentic
    cloves of it are in, else ``None``. Later cloves of a finished message
    are ignored for ``ttl`` seconds after it finished.

    Bounded against hostile input, and never raising on it:

    - at most ``max_messages`` messages in progress; when full, the oldest is
      dropped (``stats["evicted"]``); at most ``max_messages`` finished ids
      are remembered;
    - an ill-formed clove (see :class:`Clove`), or one whose fragment or
      share does not match its own fingerprint slot, is dropped at once
      (``stats["rejected"]``): it can never help;
    - at most ``max_candidates_per_index`` candidates per index and message;
      when an index is full, a newcomer replaces the oldest candidate of the
      smallest fingerprint group unless that group is larger than the
      newcomer's would be, so forged cloves arriving first do not block the
      real ones (real cloves gain support from each other across indexes);
    - per message at most twice the bytes of an authentic MAX_MESSAGE
      message for the largest n/k seen, and ``max_bytes`` over all messages
      (oldest messages dropped first);
    - cloves with another (n, k) or fingerprint vector than the first clove
      of a msg_id form their own group and cannot poison the real one; each
      group is decoded at most once (failed groups are remembered).

    :meth:`expire` drops messages whose first clove is older than ``ttl``.
    """

    def __init__(
        self,
        *,
        max_messages: int = 4096,
        max_candidates_per_index: int = 4,
        ttl: float = 30.0,
        max_bytes: int = 256 * 1024 * 1024,
    ) -> None:
        if max_messages < 1 or max_candidates_per_index < 1 or ttl <= 0 or max_bytes < 1:
            raise ValueError("Reassembler limits must be positive")
        self.max_messages = max_messages
        self.max_candidates_per_index = max_candidates_per_index
        self.ttl = ttl
        self.max_bytes = max_bytes
        self._pending: dict[bytes, _Pending] = {}  # insertion order = age order
        self._finished: dict[bytes, float] = {}  # msg_id -> finish time, in order
        self._used = 0
        self.stats: dict[str, int] = {
            "completed": 0,
            "evicted": 0,
            "expired": 0,
            "rejected": 0,
            "dropped": 0,
            "duplicates": 0,
            "failed_groups": 0,
            "late": 0,
        }

    def __len__(self) -> int:
        return len(self._pending)

    @property
    def bytes_held(self) -> int:
        """Bytes charged for the cloves held now (≤ ``max_bytes``)."""
        return self._used

    # ------------------------------------------------------------ internals

    def _drop_message(self, msg_id: bytes) -> None:
        p = self._pending.pop(msg_id)
        self._used -= p.used

    def _forget_clove(self, p: _Pending, c: Clove) -> None:
        slot = p.slots[c.index]
        for i, other in enumerate(slot):
            if other is c:
                del slot[i]
                break
        cost = _clove_cost(c)
        p.used -= cost
        self._used -= cost

    def _prune_finished(self, now: float) -> None:
        fin = self._finished
        while fin:
            mid, at = next(iter(fin.items()))
            if now - at <= self.ttl and len(fin) <= self.max_messages:
                break
            del fin[mid]

    # ------------------------------------------------------------ API

    def add(self, clove: Clove, now: float) -> bytes | None:
        """Take one clove; return its message the first time it completes, else None.

        Never raises on what a peer can send (any well-formed :class:`Clove`);
        ``TypeError`` only for a non-Clove argument (a bug in the caller).
        Steps: screen the clove (ill-formed, late, known), store it if the
        bounds allow (:meth:`_make_room`), then decode its group once it has k.
        """
        if type(clove) is not Clove:
            raise TypeError(f"expected Clove, got {type(clove).__name__}")
        reason = self._screen(clove, now)
        if reason is not None:
            self.stats[reason] += 1
            return None
        mid, key = clove.msg_id, _group_key(clove)
        p = self._pending.get(mid)
        if p is None:
            p = self._open(mid, now)
        p.cap = max(p.cap, _message_cap(clove.n, clove.k))
        group = p.groups.setdefault(key, {})
        if not self._make_room(p, group, clove):
            self.stats["dropped"] += 1
            self._gc_group(p, key)
            return None
        self._store(p, group, clove)
        if len(group) < clove.k:
            return None
        return self._decode(p, key, group, now)

    def _screen(self, clove: Clove, now: float) -> str | None:
        """The stats counter a clove that cannot help is dropped under, or ``None`` to keep it.

        Cheap checks first; the fingerprint hashes (:func:`_self_consistent`) only
        for a clove that is neither late, nor of a failed group, nor a duplicate."""
        if clove_problem(clove) is not None:
            return "rejected"
        self._prune_finished(now)
        if clove.msg_id in self._finished:
            return "late"
        p = self._pending.get(clove.msg_id)
        if p is not None:
            key = _group_key(clove)
            if key in p.dead:
                return "dropped"
            group = p.groups.get(key)
            if group is not None and clove.index in group:
                return "duplicates"  # same vector and index: identical content if self-consistent
        if not _self_consistent(clove):
            return "rejected"
        return None

    def _open(self, mid: bytes, now: float) -> _Pending:
        """Start a message, evicting the oldest while ``max_messages`` are in progress."""
        while len(self._pending) >= self.max_messages:
            self._drop_message(next(iter(self._pending)))
            self.stats["evicted"] += 1
        p = self._pending[mid] = _Pending(now)
        return p

    def _make_room(self, p: _Pending, group: dict[int, Clove], clove: Clove) -> bool:
        """Make room for ``clove`` in its index slot, its message's cap and ``max_bytes``;
        ``False`` if it must be dropped instead.

        A full slot gives up its oldest least-supported candidate unless that
        candidate's group is larger than the newcomer's would be (the newcomer wins
        ties); other messages are evicted, oldest first, to stay under ``max_bytes``.
        """
        slot = p.slots.setdefault(clove.index, [])
        cost = _clove_cost(clove)
        victim = None
        if len(slot) >= self.max_candidates_per_index:
            victim = min(slot, key=lambda c: len(p.groups[_group_key(c)]))
            if len(p.groups[_group_key(victim)]) > len(group) + 1:
                return False
        if p.used + cost - (_clove_cost(victim) if victim is not None else 0) > p.cap:
            return False
        if victim is not None:
            self._remove_candidate(p, victim)
        while self._used + cost > self.max_bytes:
            other = next((m for m in self._pending if m != clove.msg_id), None)
            if other is None:
                return False
            self._drop_message(other)
            self.stats["evicted"] += 1
        return True

    def _store(self, p: _Pending, group: dict[int, Clove], clove: Clove) -> None:
        p.slots[clove.index].append(clove)
        group[clove.index] = clove
        cost = _clove_cost(clove)
        p.used += cost
        self._used += cost

    def _decode(self, p: _Pending, key: tuple[bytes, int, int, int, bytes], group: dict[int, Clove],
                now: float) -> bytes | None:
        """Decode a group of k cloves: the message (finished), or ``None`` and the group is
        remembered as dead (its cloves freed) if it does not authenticate."""
        out = _decode_group(list(group.values()))
        mid = next(iter(group.values())).msg_id
        if out is None:
            self.stats["failed_groups"] += 1
            for c in list(group.values()):
                self._forget_clove(p, c)
            del p.groups[key]
            p.dead[key] = None
            if len(p.dead) > _MAX_DEAD_GROUPS:
                del p.dead[next(iter(p.dead))]
            return None
        self._drop_message(mid)
        self._finished[mid] = now
        self._prune_finished(now)
        self.stats["completed"] += 1
        return out

    def _remove_candidate(self, p: _Pending, c: Clove) -> None:
        self._forget_clove(p, c)
        gkey = _group_key(c)
        group = p.groups[gkey]
        del group[c.index]
        if not group:
            del p.groups[gkey]

    def _gc_group(self, p: _Pending, key: tuple[bytes, int, int, int, bytes]) -> None:
        if not p.groups.get(key, True):
            del p.groups[key]

    def expire(self, now: float) -> int:
        """Drop messages in progress whose first clove came more than ``ttl`` ago.

        Returns how many were dropped. ``now`` is the same monotonic clock as
        :meth:`add`'s.
        """
        dropped = 0
        pending = self._pending
        while pending:
            mid, p = next(iter(pending.items()))
            if now - p.created <= self.ttl:
                break
            self._drop_message(mid)
            dropped += 1
        self.stats["expired"] += dropped
        self._prune_finished(now)
        return dropped
