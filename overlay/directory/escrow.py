"""Weighted verifiable secret sharing (Feldman VSS over edwards25519): a donor escrows a secret
among the verifier committee's validators, in proportion to their voting power (decision 0037).

A donor draws a secret ``s`` (:func:`new_secret`, uniform in ``[1, L)``; the transcript nonce is
derived from it, :func:`nonce_of`) and deals it (:func:`deal`) as the constant term of a random
polynomial ``f`` of degree ``t − 1`` over the scalars mod :data:`L`, the order of edwards25519's
prime subgroup. The committee's validators hold ``units`` shares ``(x, f(x))`` between them,
``x = 1..units``, each in proportion to its CometBFT voting power (:func:`plan`), and the donor
publishes the commitments ``C_j = a_j·B`` to the coefficients (``C_0 = s·B``). A validator checks
at once that its shares lie on the committed polynomial (:func:`verify_holder`: ``y·B == Σ_j
x^j·C_j``), so a dealer cannot hand out shares that only fail later; anyone who gathers ``t``
shares rebuilds ``s`` (:func:`recover`) and checks it against ``C_0`` (:func:`opens`).

The threshold (:func:`plan`). Shares are apportioned by largest remainder (ties to the lower
index; a validator of small power may get none), and ``t`` is one more than the most units any
coalition strictly below a third of the power (``3·power < total``) holds, found exactly by a
0/1 knapsack over units (the least power that holds ``u`` units), so no such coalition reaches
``t``: it learns nothing of ``s`` beyond what the public commitments show (Feldman's hiding is
computational: ``s·B`` is public, so ``s`` must be uniform). The plan is refused unless every
coalition strictly above a third of the power (``3·power > total``) holds at least ``t`` units: in
decision 0037's proposal, a donor's commitment counts once validators above two thirds of the
power accepted their shares, and the honest among them hold above a third, so they can rebuild ``s`` without
any colluder. Rounding can break this (16 validators, one holding 30 %: with 32 units a coalition
just above a third holds 11 against ``t = 15``), so by default :func:`plan` takes the first of 32,
64, ... 1,024 units that keeps it (64 there). ``t = 1`` (every share is the secret) when no
coalition below a third holds a unit, e.g. one validator, or two or three of equal power.

A verifier must check that the commitments are as many as its plan's threshold and its shares'
``x`` those the plan assigns it (:func:`verify_holder` does both): a dealer of a higher degree
would make ``s`` unrecoverable by the honest validators.

Zero. libsodium refuses a zero scalar and an identity result, so no coefficient is zero
(:func:`deal` draws them in ``[1, L)``; the secret is in ``[1, L)``) and no commitment is the
identity (it is not a valid point); a share's value ``y`` may be 0 (chance 1/L), and ``0·B`` is
taken as the identity's encoding, which a sum of points may also give.

Format (msgpack with bin types; canonical: the decoders refuse any other encoding of the same
values, and trailing bytes)::

    scalar      = 32 bytes, little-endian, < L                     (a secret, a share's value)
    point       = 32 bytes, an edwards25519 point that passes crypto_core_ed25519_is_valid_point
                  (canonical, on the curve, in the prime-order subgroup, not of small order)
    commitments = [C_0(point), ..., C_{t-1}(point)]               1 to ``most`` points
    shares      = [[x(int), y(scalar)], ...]                      0 to ``most``, x strictly increasing
                                                                  within 1..MAX_UNITS

The enclosing message (a transcript commit) carries the version.

Limits: 1 to :data:`MAX_HOLDERS` holders, each of power 1 to :data:`MAX_POWER` (CometBFT's int64);
1 to :data:`MAX_UNITS` units. Costs (docs/benchmarks.md "escrow"): :func:`plan` is a knapsack of
holders × units steps (cache it per validator set); :func:`deal` takes ``t`` fixed-base
multiplications; :func:`verify_holder` (:func:`verify_shares`) one batch check of all the holder's
shares, ``t + 1`` multiplications (random weights: a wrong share passes with chance below
2^-128); :func:`verify_share` ``t`` multiplications for one share; :func:`recover` one when the
first ``t`` shares are good, else it verifies shares one by one until ``t`` pass (each share given
is verified at most once; the caller bounds how many it gives, as :func:`decode_shares` bounds
each holder's). A validity check of a point from outside costs about a third of a multiplication;
commitments that :func:`deal` or :func:`decode_commitments` returned are not checked again.

Python's integers are not constant-time: a local observer of the dealer's timing may learn about
``s``. The ``rng`` of :func:`deal`/:func:`new_secret` is for tests and benchmarks; without it the
``secrets`` module draws.

Every refusal is an :class:`EscrowError` with a reason; nothing else is raised on any input
(:func:`verify_share`, :func:`verify_shares`, :func:`verify_holder` and :func:`opens` answer False
instead).
"""

from __future__ import annotations

import functools
import itertools
import random
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import msgpack

from overlay.wire import codec, crypto

__all__ = [
    "MAX_HOLDERS",
    "MAX_POWER",
    "MAX_UNITS",
    "NONCE_LEN",
    "POINT_LEN",
    "SECRET_LEN",
    "UNITS",
    "Deal",
    "EscrowError",
    "L",
    "Plan",
    "Share",
    "deal",
    "decode_commitments",
    "decode_shares",
    "encode_commitments",
    "encode_shares",
    "holder_xs",
    "holders",
    "new_secret",
    "nonce_of",
    "opens",
    "plan",
    "plan_of",
    "recover",
    "scalar_bytes",
    "scalar_of",
    "verify_holder",
    "verify_share",
    "verify_shares",
]

L = 2**252 + 27742317777372353535851937790883648493  # the order of edwards25519's prime subgroup
UNITS = 32  # share units dealt over the whole committee, by default
MAX_UNITS = 1024
MAX_HOLDERS = 256
MAX_POWER = 2**63 - 1
SECRET_LEN = 32
POINT_LEN = 32
NONCE_LEN = 16
_PERSON = b"gt-escrow-nonce"
_IDENTITY = b"\x01" + bytes(31)  # the neutral element's encoding (y = 1, x = 0)
_WEIGHT_BITS = 128  # batch verification's random weights
# Encoded sizes: an array header of at most 3 bytes (≤ 1024 items); a point 2 + 32; a share 1 + 3 + 2 + 32
_POINT_WIRE, _SHARE_WIRE, _HEAD = 34, 38, 3
_DECODE_ERRORS = (ValueError, TypeError, RecursionError, OverflowError, msgpack.UnpackException)


class EscrowError(Exception):
    """A plan, deal, share, commitment or encoding refused; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


@dataclass(frozen=True, slots=True)
class Share:
    """The value ``y = f(x)`` of the dealt polynomial at ``x`` (1..units; 0 ≤ y < L). Not checked
    when built: the functions that take shares check them."""

    x: int
    y: int


@dataclass(frozen=True, slots=True)
class Plan:
    """How ``units`` shares go to the holders: ``counts[i]`` to holder ``i`` (the order of the
    powers given), any ``threshold`` of them rebuild the secret."""

    counts: tuple[int, ...]
    threshold: int

    @property
    def units(self) -> int:
        return sum(self.counts)


@dataclass(frozen=True, slots=True)
class Deal:
    """A dealt secret: the commitments ``C_j = a_j·B`` (``threshold`` points, ``C_0 = s·B``) and
    each holder's shares, in the plan's holder order, ``x`` assigned consecutively from 1."""

    commitments: tuple[bytes, ...]
    shares: tuple[tuple[Share, ...], ...]


# --------------------------------------------------------------------------- the group


@functools.cache
def _sodium() -> ModuleType:
    """libsodium through PyNaCl, loaded on first use (as overlay/wire/crypto.py loads it)."""
    from nacl import bindings

    return bindings


@functools.cache
def _sodium_errors() -> tuple[type[Exception], ...]:
    from nacl import exceptions

    return (exceptions.CryptoError, exceptions.RuntimeError, exceptions.TypeError, exceptions.ValueError)


def _call(fn: str, *args: bytes) -> Any:
    """``nacl.bindings.fn(*args)``; libsodium's refusals as :class:`EscrowError`."""
    try:
        return getattr(_sodium(), fn)(*args)
    except _sodium_errors() as exc:
        raise EscrowError(f"libsodium refused {fn} ({exc})") from None


def _base(v: int) -> bytes:
    """``v·B`` for a scalar ``0 ≤ v < L``; the identity for 0."""
    if v == 0:
        return _IDENTITY
    out: bytes = _call("crypto_scalarmult_ed25519_base_noclamp", scalar_bytes(v))
    return out


def _mul(v: int, point: bytes) -> bytes:
    """``v·P`` for a scalar ``0 < v < L`` and a valid point (so never the identity)."""
    out: bytes = _call("crypto_scalarmult_ed25519_noclamp", scalar_bytes(v), point)
    return out


def _add(p: bytes, q: bytes) -> bytes:
    out: bytes = _call("crypto_core_ed25519_add", p, q)
    return out


def _seq(v: Any) -> bool:
    """A sequence of items (not a string of bytes or characters, which are sequences too)."""
    return isinstance(v, Sequence) and not isinstance(v, str | bytes | bytearray | memoryview)


def _valid_point(p: Any) -> bool:
    return type(p) is bytes and len(p) == POINT_LEN and bool(_sodium().crypto_core_ed25519_is_valid_point(p))


def _combination(commitments: Sequence[bytes], scalars: Sequence[int]) -> bytes:
    """``Σ_j scalars[j]·C_j`` (scalars reduced mod L; a zero term is skipped)."""
    acc = _IDENTITY
    for v, c in zip(scalars, commitments, strict=True):
        if v == 1:
            acc = _add(acc, c)
        elif v:
            acc = _add(acc, _mul(v, c))
    return acc


class _Points(tuple[bytes, ...]):
    """Commitments already checked (1 to :data:`MAX_UNITS` valid points): what :func:`deal` and
    :func:`decode_commitments` return, so that the checks that take them do not check each point
    again. A tuple, immutable."""

    __slots__ = ()


def _checked_commitments(commitments: Any) -> tuple[bytes, ...]:
    """``commitments`` as a tuple of 1 to :data:`MAX_UNITS` valid points; :class:`EscrowError`."""
    if type(commitments) is _Points:
        return commitments
    if not _seq(commitments) or not 1 <= len(commitments) <= MAX_UNITS:
        raise EscrowError(f"the commitments are not a sequence of 1 to {MAX_UNITS} points")
    out = tuple(commitments)
    if not all(_valid_point(c) for c in out):
        raise EscrowError("a commitment is not a valid edwards25519 point of the prime-order subgroup")
    return _Points(out)


def _share_ok(s: Any) -> bool:
    return type(s) is Share and type(s.x) is int and 1 <= s.x <= MAX_UNITS and type(s.y) is int and 0 <= s.y < L


def _powers_of(x: int, n: int) -> list[int]:
    out, v = [], 1
    for _ in range(n):
        out.append(v)
        v = v * x % L
    return out


# --------------------------------------------------------------------------- scalars


def scalar_bytes(v: int) -> bytes:
    """A scalar ``0 ≤ v < L`` as 32 bytes, little-endian; :class:`EscrowError` otherwise."""
    if type(v) is not int or not 0 <= v < L:
        raise EscrowError("a scalar is an int within 0..L-1")
    return v.to_bytes(SECRET_LEN, "little")


def scalar_of(b: bytes) -> int:
    """The scalar of 32 little-endian bytes; :class:`EscrowError` for another length or a value
    of ``L`` or more (non-canonical)."""
    if type(b) is not bytes or len(b) != SECRET_LEN:
        raise EscrowError(f"a scalar is {SECRET_LEN} bytes")
    v = int.from_bytes(b, "little")
    if v >= L:
        raise EscrowError("a scalar is not canonical (L or more)")
    return v


def _is_secret(v: Any) -> bool:
    return type(v) is int and 0 < v < L


def new_secret(rng: random.Random | None = None) -> int:
    """A secret uniform in ``[1, L)`` (from ``secrets`` unless a test's ``rng`` is given)."""
    return 1 + (rng.randrange(L - 1) if rng is not None else secrets.randbelow(L - 1))


def nonce_of(secret: int) -> bytes:
    """The transcript nonce of ``secret``: BLAKE2b-128 of its 32 bytes, personalised
    ``gt-escrow-nonce``; :class:`EscrowError` for a secret outside ``[1, L)``."""
    if not _is_secret(secret):
        raise EscrowError("a secret is an int within 1..L-1")
    return crypto.blake2b(scalar_bytes(secret), size=NONCE_LEN, person=_PERSON)


def opens(commitments: Sequence[bytes], secret: int) -> bool:
    """Whether ``secret·B == C_0`` (False on anything malformed)."""
    try:
        return _is_secret(secret) and _checked_commitments(commitments)[0] == _base(secret)
    except EscrowError:
        return False


# --------------------------------------------------------------------------- the plan


def _apportion(powers: Sequence[int], units: int, total: int) -> list[int]:
    """``units`` in proportion to ``powers``: largest remainder, ties to the lower index."""
    counts = [units * p // total for p in powers]
    rests = [units * p % total for p in powers]
    order = sorted(range(len(powers)), key=lambda i: (-rests[i], i))
    for i in order[:units - sum(counts)]:
        counts[i] += 1
    return counts


def _most_units_below(powers: Sequence[int], counts: Sequence[int], total: int, thirds: int) -> int:
    """The most units a coalition of power ``3·power < thirds·total`` holds: a 0/1 knapsack whose
    ``least[u]`` is the least power of a coalition holding exactly ``u`` units."""
    units = sum(counts)
    none = total + 1  # no coalition holds that many units (every coalition's power is ≤ total)
    least = [0] + [none] * units
    for c, p in zip(counts, powers, strict=True):
        if c:
            least = least[:c] + [a if a <= b + p else b + p for a, b in zip(least[c:], least, strict=False)]
    return max(u for u in range(units + 1) if 3 * least[u] < thirds * total)


def _plan(powers: Sequence[int], units: int, total: int) -> Plan | None:
    """The plan of ``units`` (module docstring), or None when some coalition above a third of the
    power would hold fewer units than the threshold."""
    counts = _apportion(powers, units, total)
    t = 1 + _most_units_below(powers, counts, total, 1)
    # the least a coalition above a third holds: every unit but the most its complement (below
    # two thirds) may hold
    if units - _most_units_below(powers, counts, total, 2) < t:
        return None
    return Plan(tuple(counts), t)


def plan(powers: Sequence[int], units: int | None = None) -> Plan:
    """How shares go to validators of these voting powers, and the threshold (module docstring):
    ``units`` of them, or by default the first of :data:`UNITS`, twice that, ... up to
    :data:`MAX_UNITS` with which every coalition above a third of the power holds the threshold
    (so one validator set always gets one plan). :class:`EscrowError` for no powers, more than
    :data:`MAX_HOLDERS`, a power not within 1..:data:`MAX_POWER`, ``units`` not within
    1..:data:`MAX_UNITS`, or when no such plan exists."""
    if units is not None and (type(units) is not int or not 1 <= units <= MAX_UNITS):
        raise EscrowError(f"units is an int within 1..{MAX_UNITS}")
    if not _seq(powers) or not 1 <= len(powers) <= MAX_HOLDERS:
        raise EscrowError(f"the powers are a sequence of 1 to {MAX_HOLDERS} ints")
    if any(type(p) is not int or not 1 <= p <= MAX_POWER for p in powers):
        raise EscrowError(f"a voting power is not an int within 1..{MAX_POWER}")
    total = sum(powers)
    tries = [units] if units is not None else [UNITS << k for k in range(6) if UNITS << k <= MAX_UNITS]
    for u in tries:
        found = _plan(powers, u, total)
        if found is not None:
            return found
    raise EscrowError(f"with {tries[-1]} units some coalition above a third of the power would hold fewer units "
                      "than the threshold that keeps every coalition below a third out: deal more units")


def holders(validators: Mapping[bytes, int]) -> tuple[tuple[bytes, int], ...]:
    """``(validator key, power)`` in the order a donor deals shares to a committee and its
    verifiers check them: keys in ascending bytes."""
    return tuple(sorted(validators.items()))


@functools.lru_cache(maxsize=8)
def _plan_of(ordered: tuple[tuple[bytes, int], ...]) -> Plan:
    return plan([p for _, p in ordered])


def plan_of(validators: Mapping[bytes, int]) -> Plan:
    """The plan of a committee (validator key to voting power): :func:`plan` of the powers in
    :func:`holders` order, by default units. :class:`EscrowError` when it has none."""
    return _plan_of(holders(validators))


def _check_plan(p: Any) -> Plan:
    if type(p) is not Plan or not isinstance(p.counts, tuple) or not 1 <= len(p.counts) <= MAX_HOLDERS \
            or any(type(c) is not int or c < 0 for c in p.counts) or not 1 <= sum(p.counts) <= MAX_UNITS \
            or type(p.threshold) is not int or not 1 <= p.threshold <= sum(p.counts):
        raise EscrowError(f"not a plan: counts of 1 to {MAX_HOLDERS} holders, 1 to {MAX_UNITS} units in all, "
                          "a threshold within 1..units")
    return p


def holder_xs(p: Plan, holder: int) -> range:
    """The ``x`` of holder ``holder``'s shares under plan ``p``; :class:`EscrowError` for no such
    holder."""
    p = _check_plan(p)
    if type(holder) is not int or not 0 <= holder < len(p.counts):
        raise EscrowError(f"no holder {holder!r} in a plan of {len(p.counts)}")
    first = 1 + sum(p.counts[:holder])
    return range(first, first + p.counts[holder])


# --------------------------------------------------------------------------- dealing and checking


def _evaluate(coefficients: Sequence[int], x: int) -> int:
    y = 0
    for a in reversed(coefficients):
        y = (y * x + a) % L
    return y


def deal(secret: int, p: Plan, rng: random.Random | None = None) -> Deal:
    """``secret`` (in ``[1, L)``) dealt under plan ``p``: a polynomial of degree
    ``p.threshold − 1`` with ``a_0 = secret`` and the other coefficients drawn uniform in
    ``[1, L)`` (from ``secrets`` unless a test's ``rng`` is given). :class:`EscrowError` for a
    secret out of range or a malformed plan."""
    p = _check_plan(p)
    if not _is_secret(secret):
        raise EscrowError("a secret is an int within 1..L-1")
    coefficients = [secret, *(new_secret(rng) for _ in range(p.threshold - 1))]
    commitments = _Points(_base(a) for a in coefficients)
    shares, x = [], 1
    for c in p.counts:
        shares.append(tuple(Share(x + k, _evaluate(coefficients, x + k)) for k in range(c)))
        x += c
    return Deal(commitments, tuple(shares))


def verify_share(commitments: Sequence[bytes], share: Share) -> bool:
    """Whether ``share.y·B == Σ_j share.x^j·C_j`` (False on anything malformed)."""
    try:
        return _verify_one(_checked_commitments(commitments), share)
    except EscrowError:
        return False


def _verify_one(commitments: tuple[bytes, ...], share: Share) -> bool:
    if not _share_ok(share):
        return False
    return _base(share.y) == _combination(commitments, _powers_of(share.x, len(commitments)))


def verify_shares(commitments: Sequence[bytes], shares: Sequence[Share]) -> bool:
    """Whether every one of ``shares`` (at most :data:`MAX_UNITS`, distinct ``x``) lies on the
    committed polynomial, in one batch check: ``(Σ_k r_k·y_k)·B == Σ_j (Σ_k r_k·x_k^j)·C_j`` for
    random 128-bit weights ``r_k``. False on anything malformed; True for no shares."""
    try:
        cs = _checked_commitments(commitments)
        if not _seq(shares) or len(shares) > MAX_UNITS or not all(_share_ok(s) for s in shares) \
                or len({s.x for s in shares}) != len(shares):
            return False
        if not shares:
            return True
        if len(shares) == 1:
            return _verify_one(cs, shares[0])
        left, right = 0, [0] * len(cs)
        for s in shares:
            r = 1 + secrets.randbelow(2**_WEIGHT_BITS - 1)
            left += r * s.y
            for j, xj in enumerate(_powers_of(s.x, len(cs))):
                right[j] += r * xj
        return _base(left % L) == _combination(cs, [v % L for v in right])
    except EscrowError:
        return False


def verify_holder(p: Plan, holder: int, commitments: Sequence[bytes], shares: Sequence[Share]) -> bool:
    """A validator's check of a deal: as many commitments as the plan's threshold, its shares at
    exactly the ``x`` the plan assigns holder ``holder``, in order, and all on the committed
    polynomial (:func:`verify_shares`). False on anything malformed."""
    try:
        xs = holder_xs(p, holder)
        if not _seq(commitments) or len(commitments) != p.threshold or not _seq(shares) or len(shares) != len(xs):
            return False
        if any(type(s) is not Share or s.x != x for s, x in zip(shares, xs, strict=True)):
            return False
    except EscrowError:
        return False
    return verify_shares(commitments, shares)


def _interpolate(points: Sequence[Share]) -> int:
    """``f(0)`` of the polynomial through ``points`` (distinct x), mod L (Lagrange)."""
    s = 0
    for i, pi in enumerate(points):
        num = den = 1
        for j, pj in enumerate(points):
            if j != i:
                num = num * pj.x % L
                den = den * (pj.x - pi.x) % L
        s += pi.y * num * pow(den, -1, L)
    return s % L


def recover(commitments: Sequence[bytes], shares: Iterable[Share], *, verify: bool = True) -> int:
    """The secret, from shares of which at least ``len(commitments)`` (distinct ``x``) verify,
    checked against ``C_0``. The first ``t`` well-formed shares of distinct ``x`` are tried first;
    if they do not open ``C_0``, every share is verified on its own and only those that verify
    are used (``verify=False``: not, and :class:`EscrowError` instead; the caller finds the bad
    shares its own way, about ``t²`` multiplications cheaper). :class:`EscrowError` when too few
    verify, or on anything malformed."""
    cs = _checked_commitments(commitments)
    t = len(cs)
    try:
        given = [s for s in shares if _share_ok(s)]
    except TypeError:
        raise EscrowError("the shares are not an iterable of shares") from None
    first: dict[int, Share] = {}
    for s in given:
        if len(first) == t:
            break
        first.setdefault(s.x, s)
    if len(first) < t:
        raise EscrowError(f"{len(first)} shares of distinct x; {t} are needed")
    secret = _interpolate(list(first.values()))
    if secret and _base(secret) == cs[0]:
        return secret
    if not verify:
        raise EscrowError(f"the first {t} shares do not open C_0")
    good: dict[int, Share] = {}
    for s in given:
        if len(good) == t:
            break
        if s.x not in good and _verify_one(cs, s):
            good[s.x] = s
    if len(good) < t:
        raise EscrowError(f"only {len(good)} shares of distinct x verify; {t} are needed")
    secret = _interpolate(list(good.values()))
    if not secret or _base(secret) != cs[0]:  # cannot happen when the shares verify
        raise EscrowError("the shares rebuild a secret that does not open C_0")
    return secret


# --------------------------------------------------------------------------- wire


def _pack(obj: object) -> bytes:
    out: bytes = msgpack.packb(obj, use_bin_type=True)
    return out


def _most(most: Any, lo: int) -> int:
    if type(most) is not int or not lo <= most <= MAX_UNITS:
        raise EscrowError(f"most is an int within {lo}..{MAX_UNITS}")
    return most


def encode_commitments(commitments: Sequence[bytes]) -> bytes:
    """``[C_0, ..., C_{t-1}]``; :class:`EscrowError` unless 1 to :data:`MAX_UNITS` valid points."""
    return _pack(list(_checked_commitments(commitments)))


def encode_shares(shares: Sequence[Share]) -> bytes:
    """``[[x, y], ...]``; :class:`EscrowError` unless at most :data:`MAX_UNITS` well-formed shares
    of strictly increasing ``x``."""
    if not _seq(shares) or len(shares) > MAX_UNITS or not all(_share_ok(s) for s in shares) \
            or any(a.x >= b.x for a, b in itertools.pairwise(shares)):
        raise EscrowError(f"shares are at most {MAX_UNITS} well-formed shares of strictly increasing x")
    return _pack([[s.x, scalar_bytes(s.y)] for s in shares])


def _read(raw: Any, limit: int, what: str, read: Any) -> Any:
    """``read`` of a shape reader over ``raw``: every byte taken, the encoding canonical."""
    if type(raw) is not bytes:
        raise EscrowError(f"the {what} are not bytes")
    if len(raw) > limit:
        raise EscrowError(f"{what} of {len(raw)} bytes; at most {limit}")
    try:
        r = codec.ShapeReader(raw, POINT_LEN)
        out, wire = read(r)
        done = r.done()
    except codec.ShapeError as exc:
        raise EscrowError(f"the {what} are not in this format ({exc})") from None
    except _DECODE_ERRORS as exc:
        raise EscrowError(f"the {what} are not msgpack ({type(exc).__name__})") from None
    if not done:
        raise EscrowError(f"the {what} are not alone (trailing bytes)")
    if _pack(wire) != raw:
        raise EscrowError(f"the {what} are not in canonical msgpack form")
    return out


def decode_commitments(raw: bytes, most: int) -> tuple[bytes, ...]:
    """Commitments, decoded strictly (module docstring): 1 to ``most`` valid points.
    :class:`EscrowError` with the reason otherwise."""
    most = _most(most, 1)

    def read(r: codec.ShapeReader) -> tuple[tuple[bytes, ...], list[bytes]]:
        n = r.array()
        if not 1 <= n <= most:
            raise EscrowError(f"{n} commitments; 1 to {most}")
        out = []
        for _ in range(n):
            c = r.value()
            if not _valid_point(c):
                raise EscrowError("a commitment is not a valid edwards25519 point of the prime-order subgroup")
            out.append(c)
        return _Points(out), out

    got: tuple[bytes, ...] = _read(raw, _HEAD + most * _POINT_WIRE, "commitments", read)
    return got


def decode_shares(raw: bytes, most: int) -> tuple[Share, ...]:
    """Shares, decoded strictly (module docstring): 0 to ``most``, ``x`` strictly increasing
    within 1..:data:`MAX_UNITS`, ``y`` canonical. Their values are not checked against any
    commitments here (:func:`verify_holder`). :class:`EscrowError` with the reason otherwise."""
    most = _most(most, 0)

    def read(r: codec.ShapeReader) -> tuple[tuple[Share, ...], list[list[Any]]]:
        n = r.array()
        if n > most:
            raise EscrowError(f"{n} shares; at most {most}")
        out: list[Share] = []
        wire: list[list[Any]] = []
        for _ in range(n):
            if r.array() != 2:
                raise EscrowError("a share is [x, y]")
            x, yb = r.value(), r.value()
            if type(x) is not int or not 1 <= x <= MAX_UNITS or (out and x <= out[-1].x):
                raise EscrowError(f"a share's x is not within 1..{MAX_UNITS}, above the one before")
            out.append(Share(x, scalar_of(yb)))
            wire.append([x, yb])
        return tuple(out), wire

    got: tuple[Share, ...] = _read(raw, _HEAD + most * _SHARE_WIRE, "shares", read)
    return got
