"""Anonymous usage quotas (issue 31, decision 0017): the wire formats every side shares, and the
user's half of the blind issuance.

A registered user gets tokens of a model from each verifier (an *issuer*) at a bounded rate: its
allowance there is a token bucket of ``burst`` tokens that fills by ``tokens`` per quota epoch
(:class:`Allowance`, decision 0018), and a token is good in the epoch it was issued for only (plus a
short grace), so tokens cannot be saved up for a burst larger than that. A token is an RFC 9497
VOPRF output (ristretto255-SHA512, the ``voprf`` package: no
curve arithmetic here) of a random nonce under the issuer's key for that model and epoch, obtained
*blind*: the issuer evaluates ``r·H(nonce)`` and proves (DLEQ) it used the key it published, never
seeing the nonce. A token carries the evaluations of ``issuers`` distinct verifiers for one nonce
(each blinded separately, so issuers cannot match their views), so no single issuer can mint one.
The model node that serves a request redeems its token by asking each of those issuers, who
recompute the output from the nonce, compare, and record the nonce as spent for the epoch: a
token spends once across every node, and no issuer can tell which issuance it came from.

Pure: no I/O, no clock (times are passed in). Wire format (msgpack with bin types; canonical:
every ``decode_*`` refuses any other encoding of the same values, and trailing bytes)::

    key record = [2, issuer(32), model(str), epoch(int), key(32), priority key(32), params, signature(64)]
                 params: [epoch_s, tokens, issuers, grace_s, burst, priority];  signature: Ed25519(issuer's
                 validator key, KEY_CONTEXT + msgpack([chain_id, issuer, model, epoch, key, priority key, params]))
    issue      = [2, user(20), issuer(32), model(str), epoch(int), priority(bool), [blinded(32), ...], signature(64)]
                 signature: Ed25519(user's node key, ISSUE_CONTEXT + msgpack([chain_id, user, issuer,
                 model, epoch, priority, [blinded, ...]]))
    issued     = [2, evaluated(bytes: a VOPRF batch output with its proof), left(int)]
    token      = [2, model(str), epoch(int), priority(bool), nonce(32), [[issuer(32), output(64)], ...]]
    redeem     = [2, model(str), epoch(int), priority(bool), nonce(32), output(64)]

**Two classes** (decision 0022). Each issuer has two keys per model and epoch: a *priority* one
and a *standard* one. A user's tokens are priority while they come from the top ``priority`` of
its bucket (:meth:`Allowance.top`: what it holds above ``burst - priority``), standard below
that; the request for tokens names the class and the issuer evaluates under that class's key, so
a token's class is proved by its output (a standard token relabelled priority does not redeem).
Model nodes serve priority tokens first, then standard, then requests without. A user keeping
to its rate gets priority tokens; what a full bucket adds beyond ``priority`` at once is standard.

Every refusal of a ``decode_*``/``verify_*`` function and of :class:`Blinding` is a
:class:`QuotaError` with a reason; nothing else is raised on any input.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import msgpack
from voprf import ristretto

from overlay.directory.donation import Signer
from overlay.directory.registration import MAX_MODEL_ID
from overlay.wire import codec, crypto
from overlay.wire.identity import NODE_ID_LEN, node_id_of
from overlay.wire.messages import MAX_QUOTA_TOKEN

QUOTA_VERSION = 2
KEY_CONTEXT = b"gentorrent/quota-key/v1\x00"
ISSUE_CONTEXT = b"gentorrent/quota-issue/v1\x00"
_INFO = b"gentorrent/quota-voprf/v1\x00"  # DeriveKeyPair's info prefix
_INPUT = b"gentorrent/quota-token/v1\x00"  # a token's VOPRF input prefix

# The verifier's CometBFT RPC queries (abci_query; answered by verifier/abci_app.py)
KEY_PATH = "/quota/key"  # data: msgpack([model, epoch]) -> a key record
ISSUE_PATH = "/quota/issue"  # data: an issue request -> issued
REDEEM_PATH = "/quota/redeem"  # data: a redeem -> code 0 (spent now) or why not

NONCE_LEN = 32
OUTPUT_LEN = 64  # SHA-512
ELEMENT_LEN = 32  # a ristretto255 element: a blinded input, a public key
KEY_LEN = 32  # an issuer's Ed25519 validator key
SIGNATURE_LEN = 64
MAX_BATCH = 64  # blinded inputs in one issue request
MAX_ISSUERS = 8  # evaluations a token may carry
MAX_EPOCH = 2**40
MAX_ISSUE_BYTES = 256 + MAX_BATCH * (ELEMENT_LEN + 2)
MAX_ISSUED_BYTES = 128 + MAX_BATCH * (ELEMENT_LEN + 2) + 64
MAX_TOKEN_BYTES = 64 + MAX_MODEL_ID + MAX_ISSUERS * (KEY_LEN + OUTPUT_LEN + 6)
assert MAX_TOKEN_BYTES <= MAX_QUOTA_TOKEN
MAX_REDEEM_BYTES = 64 + MAX_MODEL_ID + NONCE_LEN + OUTPUT_LEN
MAX_KEY_BYTES = 320 + MAX_MODEL_ID


class QuotaError(Exception):
    """A quota message that is not in this format or does not verify, or a blind issuance that
    failed; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


# --------------------------------------------------------------------------- parameters and epochs

@dataclass(frozen=True, slots=True)
class QuotaParams:
    """The committee's quota settings (genesis ``app_state.quota``; documented defaults, decision
    0018): ``epoch_s`` seconds per quota epoch (epochs count from the Unix epoch; each has its own
    keys, and a token is good in its epoch only), ``tokens`` by which a user's allowance at one
    issuer grows per epoch (its rate: ``tokens / epoch_s`` a second), ``issuers`` distinct issuers'
    evaluations a token needs, ``grace_s`` seconds after its epoch's end a token still redeems
    (clock skew, a request sent just before the end), ``burst`` the most a user's allowance at one
    issuer holds (what a user who was idle may take at once: a token bucket of depth ``burst``
    filled at that rate, across epochs), ``priority`` how many of a full bucket's tokens are of the
    priority class (the top ones: :meth:`Allowance.top`; all of them when ``priority >= burst``;
    decision 0022)."""

    epoch_s: int = 60
    tokens: int = 6
    issuers: int = 2
    grace_s: int = 15
    burst: int = 16
    priority: int = 4

    BOUNDS: ClassVar[dict[str, tuple[int, int]]] = {"epoch_s": (10, 86_400), "tokens": (1, 100_000), "issuers": (1, MAX_ISSUERS), "grace_s": (0, 3_600), "burst": (1, 100_000), "priority": (1, 100_000)}

    def __post_init__(self) -> None:
        for name, (lo, hi) in self.BOUNDS.items():
            v = getattr(self, name)
            if type(v) is not int or not lo <= v <= hi:
                raise QuotaError(f"quota {name} must be an int within {lo}..{hi}, not {v!r}")
        if self.grace_s >= self.epoch_s:
            raise QuotaError(f"quota grace_s ({self.grace_s}) must be under epoch_s ({self.epoch_s})")

    def wire(self) -> list[int]:
        return [self.epoch_s, self.tokens, self.issuers, self.grace_s, self.burst, self.priority]

    def to_json(self) -> dict[str, int]:
        return dict(zip(self.BOUNDS, self.wire(), strict=True))

    @classmethod
    def from_json(cls, obj: Any) -> QuotaParams:
        """The genesis section; :class:`QuotaError` for unknown keys or values out of bounds
        (missing keys take the defaults)."""
        if not isinstance(obj, dict) or not all(isinstance(k, str) for k in obj):
            raise QuotaError("app_state.quota must be an object")
        unknown = set(obj) - set(cls.BOUNDS)
        if unknown:
            raise QuotaError(f"app_state.quota has unknown keys {sorted(unknown)}; known: {sorted(cls.BOUNDS)}")
        return cls(**obj)

    def epoch_at(self, unix_s: float) -> int:
        """The quota epoch at Unix time ``unix_s``."""
        return int(unix_s // self.epoch_s)

    def refills_at(self, epoch: int) -> float:
        """When ``epoch`` ends and the next one's keys are used (Unix seconds)."""
        return float((epoch + 1) * self.epoch_s)

    def redeemable(self, epoch: int, unix_s: float) -> bool:
        """Whether a token of ``epoch`` may be spent at ``unix_s``: within its epoch or the grace after."""
        return epoch * self.epoch_s <= unix_s < self.refills_at(epoch) + self.grace_s

    def issuable(self, epoch: int, unix_s: float) -> bool:
        """Whether an issuer gives tokens of ``epoch`` at ``unix_s``: the current epoch only (a
        client a little ahead of the issuer's clock asks for the next one: refused, it retries)."""
        return epoch == self.epoch_at(unix_s)

    @property
    def per_token_s(self) -> float:
        """Seconds in which a user's allowance at one issuer grows by one token."""
        return self.epoch_s / self.tokens


class Allowance:
    """A user's allowance of one model at one issuer: a token bucket of ``params.burst`` tokens
    filled at ``params.tokens`` per ``params.epoch_s``, kept as the one number ``full_at``, the Unix
    time at which it is full again (GCRA's theoretical arrival time; 0: full since ever). Pure and
    exact to the float: the issuer grants with it, the wallet estimates with it."""

    __slots__ = ("full_at", "params")

    def __init__(self, params: QuotaParams, full_at: float = 0.0) -> None:
        self.params = params
        self.full_at = full_at

    def level(self, now: float) -> int:
        """Whole tokens that can be taken at ``now``."""
        p = self.params
        return max(0, min(p.burst, int((p.burst * p.per_token_s - max(0.0, self.full_at - now)) / p.per_token_s
                                       + 1e-9)))

    def take(self, n: int, now: float) -> bool:
        """Take ``n`` tokens at ``now`` if the bucket holds that many (``True``), else change nothing."""
        if n > self.level(now):
            return False
        self.full_at = max(self.full_at, now) + n * self.params.per_token_s
        return True

    def ready_at(self, n: int, now: float) -> float:
        """When ``n`` tokens (at most ``burst``) can be taken: ``now`` or later."""
        p = self.params
        return max(now, self.full_at - (p.burst - min(n, p.burst)) * p.per_token_s)

    def full(self, now: float) -> bool:
        """Whether the bucket is full at ``now`` (such an allowance need not be kept)."""
        return self.full_at <= now

    def top(self, now: float) -> int:
        """Whole tokens that can be taken at ``now`` as priority tokens: what the bucket holds above
        ``burst - priority`` (decision 0022)."""
        p = self.params
        return max(0, self.level(now) - max(0, p.burst - p.priority))

    def take_class(self, n: int, priority: bool, now: float) -> bool:
        """Take ``n`` tokens of the class asked for at ``now`` if the bucket holds them (priority
        ones from :meth:`top` only), else change nothing."""
        if priority and n > self.top(now):
            return False
        return self.take(n, now)

    def top_at(self, n: int, now: float) -> float:
        """When ``n`` priority tokens (at most ``priority``) can be taken: ``now`` or later (when the
        bucket holds ``n`` above ``burst - priority``)."""
        p = self.params
        return self.ready_at(max(0, p.burst - p.priority) + min(n, p.burst, p.priority), now)


def key_info(chain_id: str, model: str, epoch: int, priority: bool = False) -> bytes:
    """The ``info`` of RFC 9497's DeriveKeyPair for an issuer's key of ``model``, ``epoch`` and class
    (``priority`` or standard): each has its own key, so a token is good for one of each."""
    return _INFO + _pack([chain_id, model, epoch] + (["priority"] if priority else []))


def token_input(nonce: bytes) -> bytes:
    """The VOPRF input a token's nonce stands for."""
    return _INPUT + nonce


def evaluator(seed: bytes, chain_id: str, model: str, epoch: int, priority: bool = False) -> ristretto.Evaluator:
    """An issuer's VOPRF key for ``model``, ``epoch`` and class, derived from its secret 32-byte ``seed``."""
    return ristretto.Evaluator.from_seed(seed, key_info(chain_id, model, epoch, priority))


# --------------------------------------------------------------------------- messages

@dataclass(frozen=True, slots=True)
class KeyRecord:
    """An issuer's VOPRF public keys for ``model`` and ``epoch`` (``key`` for standard tokens,
    ``priority_key`` for priority ones) and the committee's ``params``, signed with the issuer's
    validator key (``issuer``)."""

    issuer: bytes
    model: str
    epoch: int
    key: bytes
    priority_key: bytes
    params: QuotaParams
    signature: bytes = b""

    def signed(self, chain_id: str) -> bytes:
        return KEY_CONTEXT + _pack([chain_id, self.issuer, self.model, self.epoch, self.key, self.priority_key,
                                    self.params.wire()])

    def wire(self) -> list[Any]:
        return [QUOTA_VERSION, self.issuer, self.model, self.epoch, self.key, self.priority_key, self.params.wire(),
                self.signature]

    def key_of(self, priority: bool) -> bytes:
        """The public key of the class asked for."""
        return self.priority_key if priority else self.key


@dataclass(frozen=True, slots=True)
class IssueRequest:
    """A registered ``user``'s request to ``issuer`` for tokens of ``model``, ``epoch`` and class
    (``priority`` or standard): the ``blinded`` inputs, signed with the user's node key."""

    user: bytes
    issuer: bytes
    model: str
    epoch: int
    blinded: tuple[bytes, ...]
    signature: bytes = b""
    priority: bool = False

    def signed(self, chain_id: str) -> bytes:
        return ISSUE_CONTEXT + _pack([chain_id, self.user, self.issuer, self.model, self.epoch, self.priority,
                                      list(self.blinded)])

    def wire(self) -> list[Any]:
        return [QUOTA_VERSION, self.user, self.issuer, self.model, self.epoch, self.priority, list(self.blinded),
                self.signature]


@dataclass(frozen=True, slots=True)
class Issued:
    """An issuer's answer: the ``evaluated`` batch (a VOPRF batch output with its proof) and how
    many tokens the user could take ``left`` at that issuer right after it (its allowance's level:
    :class:`Allowance`)."""

    evaluated: bytes
    left: int

    def wire(self) -> list[Any]:
        return [QUOTA_VERSION, self.evaluated, self.left]


@dataclass(frozen=True, slots=True)
class Token:
    """What a request carries (inside its sealed clove): the ``nonce`` and each issuer's
    ``(issuer key, output)`` for it, for ``model``, ``epoch`` and class (``priority`` or standard:
    every issuer evaluated it under that class's key)."""

    model: str
    epoch: int
    nonce: bytes
    evaluations: tuple[tuple[bytes, bytes], ...]
    priority: bool = False

    def wire(self) -> list[Any]:
        return [QUOTA_VERSION, self.model, self.epoch, self.priority, self.nonce, [list(e) for e in self.evaluations]]

    def redeem(self, issuer: bytes) -> bytes:
        """The redeem message for ``issuer`` (one of this token's)."""
        output = dict(self.evaluations)[issuer]
        return encode_redeem(Redeem(self.model, self.epoch, self.nonce, output, self.priority))


@dataclass(frozen=True, slots=True)
class Redeem:
    """A token's part for one issuer: the issuer recomputes ``output`` from ``nonce`` under the
    key of the token's class (``priority`` or standard)."""

    model: str
    epoch: int
    nonce: bytes
    output: bytes
    priority: bool = False

    def wire(self) -> list[Any]:
        return [QUOTA_VERSION, self.model, self.epoch, self.priority, self.nonce, self.output]


# --------------------------------------------------------------------------- making

def _pack(obj: object) -> bytes:
    out: bytes = msgpack.packb(obj, use_bin_type=True)
    return out


def encode_key_record(signer: Signer, chain_id: str, rec: KeyRecord) -> bytes:
    """``rec`` signed by ``signer`` (the issuer's validator key)."""
    signed = KeyRecord(rec.issuer, rec.model, rec.epoch, rec.key, rec.priority_key, rec.params,
                       signer.sign(rec.signed(chain_id)))
    return _pack(signed.wire())


def encode_issue(signer: Signer, chain_id: str, req: IssueRequest) -> bytes:
    """``req`` signed by ``signer`` (the user's node key)."""
    signed = IssueRequest(req.user, req.issuer, req.model, req.epoch, req.blinded, signer.sign(req.signed(chain_id)),
                          req.priority)
    return _pack(signed.wire())


def encode_issued(issued: Issued) -> bytes:
    return _pack(issued.wire())


def encode_token(token: Token) -> bytes:
    return _pack(token.wire())


def encode_redeem(redeem: Redeem) -> bytes:
    return _pack(redeem.wire())


def encode_key_query(model: str, epoch: int) -> bytes:
    return _pack([model, epoch])


# --------------------------------------------------------------------------- taking

def _bad(what: str, why: str) -> QuotaError:
    return QuotaError(f"the {what} is not {why}")


def _bytes(v: Any, n: int, what: str, field: str) -> bytes:
    if type(v) is not bytes or len(v) != n:
        raise _bad(what, f"well formed: {field} is not {n} bytes")
    return v


def _int(v: Any, lo: int, hi: int, what: str, field: str) -> int:
    if type(v) is not int or not lo <= v <= hi:
        raise _bad(what, f"well formed: {field} is not an int within {lo}..{hi}")
    return v


def _flag(v: Any, what: str, field: str) -> bool:
    if type(v) is not bool:
        raise _bad(what, f"well formed: {field} is not a boolean")
    return v


def _model(v: Any, what: str) -> str:
    if type(v) is not str or not 1 <= len(v.encode()) <= MAX_MODEL_ID:
        raise _bad(what, f"well formed: the model id is not a string of 1..{MAX_MODEL_ID} bytes")
    return v


def _array(r: codec.ShapeReader, lo: int, hi: int, what: str, field: str) -> int:
    n = r.array()
    if not lo <= n <= hi:
        raise _bad(what, f"well formed: {field} has {n} items, not {lo}..{hi}")
    return n


def _version(r: codec.ShapeReader, n: int, what: str) -> None:
    if r.array() != n:
        raise _bad(what, f"an array of {n}")
    version = r.value()
    if type(version) is not int or version != QUOTA_VERSION:
        raise QuotaError(f"{what} version {version!r} is not {QUOTA_VERSION}")


def _read(raw: Any, limit: int, what: str, read: Any) -> Any:
    """``read`` of a shape reader over ``raw``: every byte taken, the encoding canonical."""
    if type(raw) is not bytes:
        raise _bad(what, "bytes")
    if len(raw) > limit:
        raise QuotaError(f"a {what} of {len(raw)} bytes; at most {limit}")
    r = codec.ShapeReader(raw, limit)
    try:
        out = read(r)
    except codec.ShapeError as exc:
        raise _bad(what, f"in this format ({exc})") from None
    except (ValueError, TypeError, RecursionError, OverflowError, msgpack.UnpackException) as exc:
        raise _bad(what, f"msgpack ({type(exc).__name__})") from None
    if not r.done():
        raise _bad(what, "alone (trailing bytes)")
    if _pack(out.wire()) != raw:
        raise _bad(what, "in canonical msgpack form")
    return out


def _read_params(r: codec.ShapeReader, what: str) -> QuotaParams:
    fields = _array(r, len(QuotaParams.BOUNDS), len(QuotaParams.BOUNDS), what, "the params")
    values = [r.value() for _ in range(fields)]
    if any(type(v) is not int for v in values):
        raise _bad(what, "well formed: the params are not ints")
    try:
        return QuotaParams(*values)
    except QuotaError as exc:
        raise _bad(what, f"well formed: {exc.reason}") from None


def _read_key_record(r: codec.ShapeReader) -> KeyRecord:
    what = "quota key record"
    _version(r, 8, what)
    issuer = _bytes(r.value(), KEY_LEN, what, "the issuer")
    model = _model(r.value(), what)
    epoch = _int(r.value(), 0, MAX_EPOCH, what, "the epoch")
    key = _bytes(r.value(), ELEMENT_LEN, what, "the key")
    priority_key = _bytes(r.value(), ELEMENT_LEN, what, "the priority key")
    params = _read_params(r, what)
    return KeyRecord(issuer, model, epoch, key, priority_key, params,
                     _bytes(r.value(), SIGNATURE_LEN, what, "the signature"))


def _read_issue(r: codec.ShapeReader) -> IssueRequest:
    what = "quota issue request"
    _version(r, 8, what)
    user = _bytes(r.value(), NODE_ID_LEN, what, "the user")
    issuer = _bytes(r.value(), KEY_LEN, what, "the issuer")
    model = _model(r.value(), what)
    epoch = _int(r.value(), 0, MAX_EPOCH, what, "the epoch")
    priority = _flag(r.value(), what, "the class")
    n = _array(r, 1, MAX_BATCH, what, "the blinded inputs")
    blinded = tuple(_bytes(r.value(), ELEMENT_LEN, what, "a blinded input") for _ in range(n))
    return IssueRequest(user, issuer, model, epoch, blinded, _bytes(r.value(), SIGNATURE_LEN, what, "the signature"),
                        priority)


def _read_issued(r: codec.ShapeReader) -> Issued:
    what = "quota issue answer"
    _version(r, 3, what)
    evaluated = r.value()
    if type(evaluated) is not bytes or not 0 < len(evaluated) <= MAX_ISSUED_BYTES:
        raise _bad(what, "well formed: the evaluated batch is not bytes")
    return Issued(evaluated, _int(r.value(), 0, 10**9, what, "left"))


def _read_token(r: codec.ShapeReader) -> Token:
    what = "quota token"
    _version(r, 6, what)
    model = _model(r.value(), what)
    epoch = _int(r.value(), 0, MAX_EPOCH, what, "the epoch")
    priority = _flag(r.value(), what, "the class")
    nonce = _bytes(r.value(), NONCE_LEN, what, "the nonce")
    n = _array(r, 1, MAX_ISSUERS, what, "the evaluations")
    evaluations = []
    for _ in range(n):
        _array(r, 2, 2, what, "an evaluation")
        evaluations.append((_bytes(r.value(), KEY_LEN, what, "an issuer"),
                            _bytes(r.value(), OUTPUT_LEN, what, "an output")))
    if len({i for i, _ in evaluations}) != n:
        raise _bad(what, "well formed: an issuer appears twice")
    return Token(model, epoch, nonce, tuple(evaluations), priority)


def _read_redeem(r: codec.ShapeReader) -> Redeem:
    what = "quota redeem"
    _version(r, 6, what)
    model = _model(r.value(), what)
    epoch = _int(r.value(), 0, MAX_EPOCH, what, "the epoch")
    priority = _flag(r.value(), what, "the class")
    return Redeem(model, epoch, _bytes(r.value(), NONCE_LEN, what, "the nonce"),
                  _bytes(r.value(), OUTPUT_LEN, what, "the output"), priority)


class _Query:
    __slots__ = ("epoch", "model")

    def __init__(self, model: str, epoch: int) -> None:
        self.model, self.epoch = model, epoch

    def wire(self) -> list[Any]:
        return [self.model, self.epoch]


def _read_key_query(r: codec.ShapeReader) -> _Query:
    what = "quota key query"
    _array(r, 2, 2, what, "[model, epoch]")
    return _Query(_model(r.value(), what), _int(r.value(), 0, MAX_EPOCH, what, "the epoch"))


def decode_key_record(raw: bytes) -> KeyRecord:
    out: KeyRecord = _read(raw, MAX_KEY_BYTES, "quota key record", _read_key_record)
    return out


def decode_issue(raw: bytes) -> IssueRequest:
    out: IssueRequest = _read(raw, MAX_ISSUE_BYTES, "quota issue request", _read_issue)
    return out


def decode_issued(raw: bytes) -> Issued:
    out: Issued = _read(raw, MAX_ISSUED_BYTES + 16, "quota issue answer", _read_issued)
    return out


def decode_token(raw: bytes) -> Token:
    out: Token = _read(raw, MAX_TOKEN_BYTES, "quota token", _read_token)
    return out


def decode_redeem(raw: bytes) -> Redeem:
    out: Redeem = _read(raw, MAX_REDEEM_BYTES, "quota redeem", _read_redeem)
    return out


def decode_key_query(raw: bytes) -> tuple[str, int]:
    q: _Query = _read(raw, 32 + MAX_MODEL_ID, "quota key query", _read_key_query)
    return q.model, q.epoch


def _verify(public: bytes, signature: bytes, message: bytes, what: str) -> None:
    try:
        crypto.ed25519_verify(public, signature, message)
    except crypto.CryptoError:
        raise QuotaError(f"the {what}'s signature does not verify") from None


def verify_key_record(rec: KeyRecord, chain_id: str) -> None:
    """:class:`QuotaError` unless the issuer signed ``rec`` for ``chain_id``."""
    _verify(rec.issuer, rec.signature, rec.signed(chain_id), "quota key record")


def checked_key_record(raw: bytes, chain_id: str, model: str, validators: Collection[bytes] | None) -> KeyRecord:
    """A key record a verifier answered, decoded and checked: signed for ``chain_id`` by its issuer,
    for ``model``, and (unless ``validators`` is None) by one of the committee's validator keys;
    :class:`QuotaError` saying which check failed."""
    rec = decode_key_record(raw)
    verify_key_record(rec, chain_id)
    if rec.model != model:
        raise QuotaError(f"the key record is for model {rec.model!r}, not {model!r}")
    if validators is not None and rec.issuer not in validators:
        raise QuotaError("the key record's issuer is not one of the committee's validators")
    return rec


def verify_issue(req: IssueRequest, chain_id: str, user_public: bytes) -> None:
    """:class:`QuotaError` unless ``user_public`` is the user's key and signed ``req`` for ``chain_id``."""
    if type(user_public) is not bytes or len(user_public) != crypto.ED25519_PK_LEN or node_id_of(user_public) != req.user:
        raise QuotaError("the key is not the user's")
    _verify(user_public, req.signature, req.signed(chain_id), "quota issue request")


# --------------------------------------------------------------------------- the user's blind half

def _panic(exc: BaseException) -> bool:
    """``voprf`` (Rust, pyo3) reports a proof that does not verify by panicking, which Python sees
    as ``pyo3_runtime.PanicException``, a BaseException; nothing else of it is caught here."""
    return type(exc).__name__ == "PanicException"


class Blinding:
    """The user's side of one issuance: ``nonces`` blinded for one issuer (fresh blinds each time,
    so two issuers see unrelated elements for the same nonces)."""

    def __init__(self, nonces: Sequence[bytes]) -> None:
        if not 1 <= len(nonces) <= MAX_BATCH or any(len(n) != NONCE_LEN for n in nonces):
            raise QuotaError(f"1..{MAX_BATCH} nonces of {NONCE_LEN} bytes")
        self.nonces = tuple(nonces)
        pairs = [ristretto.Client.blind(token_input(n)) for n in self.nonces]
        self._clients = [c for c, _ in pairs]
        self.blinded = tuple(b.serialize() for _, b in pairs)

    def finalize(self, issued: Issued, key: bytes) -> list[bytes]:
        """The outputs for :attr:`nonces`, from the issuer's answer, checked against its public
        ``key`` (the DLEQ proof); :class:`QuotaError` if the answer does not verify."""
        try:
            batch = ristretto.VerifiableBatchOutput.deserialize(issued.evaluated)
            public = ristretto.PublicKey.deserialize(key)
        except ValueError as exc:
            raise QuotaError(f"the issuer's answer does not decode ({exc})") from None
        try:
            outputs = ristretto.Client.finalize_batch(self._clients, batch, public)
        except ValueError as exc:
            raise QuotaError(f"the issuer's answer does not verify ({exc})") from None
        except BaseException as exc:  # only voprf's panic (a failed proof) is taken; see _panic
            if not _panic(exc):
                raise
            raise QuotaError("the issuer's proof does not verify with its published key") from None
        if len(outputs) != len(self.nonces) or any(len(o) != OUTPUT_LEN for o in outputs):
            raise QuotaError("the issuer's answer has the wrong number of outputs")
        return list(outputs)


def new_nonces(n: int) -> list[bytes]:
    return [os.urandom(NONCE_LEN) for _ in range(n)]
