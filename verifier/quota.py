"""The verifier's half of anonymous usage quotas (issue 31, decision 0017): the *issuer*.

A verifier whose genesis has an ``app_state.quota`` section gives registered users tokens and
spends them for model nodes; :mod:`overlay.directory.quota` is the wire contract and says how a
token works. Three queries reach the issuer (:meth:`verifier.abci_app.CommitteeAbciApp.quota`):

- ``/quota/key`` (``[model, epoch]``): its signed key record for that model and epoch
  (:meth:`Issuer.key_query`), for the epochs around the current one;
- ``/quota/issue`` (a registered user's signed request, :meth:`Issuer.issue`): the blinded inputs
  evaluated under that key with a DLEQ proof, within the user's allowance of the model at this
  issuer (:class:`~overlay.directory.quota.Allowance`: a bucket of ``burst`` tokens filled by
  ``tokens`` an epoch; more than it holds now: QUOTA_LATER, more than it can ever hold: QUOTA_USED),
  under the key of the class asked for: priority tokens only from the top ``priority`` of the
  bucket (decision 0022; more than that now: QUOTA_LATER);
  the same signed request again gets the same answer and counts once;
- ``/quota/redeem`` (a token's part for this issuer, :meth:`Issuer.redeem`): code 0 when the
  output is this issuer's for the nonce, model and epoch and the nonce was not spent before; it is
  spent from then on, whichever model node asks.

Unlinkability: issuance shows the issuer a user and random-looking group elements (the nonces
blinded by factors only the user knows); redemption shows it a nonce and an output, which it never
saw blinded. The issuer keeps no blinded input; nothing but the output's validity ties a
redemption to some issuance, and every issuance of the epoch is an equally good candidate.

I/O-free and clockless (``now_unix`` is passed in). The VOPRF keys derive from ``seed``
(:func:`quota_seed` of the validator key: a restarted verifier has the same keys). State is kept
per epoch, only for the epochs still issued or redeemed (the current one and the one before:
older ones are forgotten at the first call with a later time, and stay refused even if the clock
goes back): the spent nonces per model, within :data:`MAX_SPENT` per epoch, and the last
:data:`MAX_ANSWERS` answers for replays. Allowances are kept across epochs while they are not
full (a full one is what a user never seen has), within :data:`MAX_ACCOUNTS` (past either cap the
issuer refuses, code UNAVAILABLE, rather than forget an allowance or a spent nonce).
:meth:`Issuer.snapshot` and :meth:`Issuer.restore` carry the allowances and spent nonces (not the
answers) across a restart; ``verifier/run.py`` writes the snapshot atomically every
few seconds while it changes, and at shutdown.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack
from voprf import ristretto

from overlay.directory import quota
from overlay.directory.quota import QuotaError, QuotaParams
from overlay.directory.registration import MAX_MODEL_ID, Code
from overlay.wire import codec, crypto
from overlay.wire.identity import NODE_ID_LEN

SEED_PERSON = b"gt-quota-seed"  # BLAKE2b personalization of quota_seed
EVALUATORS = 64  # (model, epoch) keys kept derived, with their signed records
MAX_ACCOUNTS = 100_000  # (user, model) allowances not full held at once: past them, new users are refused
MAX_SPENT = 500_000  # spent nonces one epoch holds (all models): past them, redeems are refused
MAX_ANSWERS = 4_096  # answers one epoch keeps for replayed requests (about 10 MB at most)
KEY_EPOCHS = (-1, 0, 1)  # key records answered: the epochs around the current one
MAX_KEY_QUERY_BYTES = 32 + MAX_MODEL_ID  # overlay.directory.quota.decode_key_query's limit
STATE_VERSION = 3
MAX_FULL_AT = float(quota.MAX_EPOCH * 86_400)  # past any epoch: a saved allowance's time is below it
MAX_STATE_BYTES = 80 * 1024 * 1024  # two epochs at the caps above take about 70 MB

UserKey = Callable[[bytes], bytes | None]
ModelListed = Callable[[str], bool]


class QuotaStateError(ValueError):
    """Bytes that are not a snapshot of this issuer (:meth:`Issuer.restore`); ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


def quota_seed(validator_private: bytes) -> bytes:
    """The issuer's secret 32-byte VOPRF seed, derived from its validator key's private bytes (one
    way: the seed reveals nothing of the key), so a restarted verifier derives the same keys."""
    if len(validator_private) != 32:
        raise ValueError("a validator's Ed25519 private key is 32 bytes")
    return crypto.blake2b(validator_private, person=SEED_PERSON)


@dataclass(frozen=True, slots=True)
class _Key:
    evaluator: ristretto.Evaluator  # standard tokens
    priority: ristretto.Evaluator  # priority tokens (decision 0022)
    record: bytes  # the signed key record

    def of(self, priority: bool) -> ristretto.Evaluator:
        return self.priority if priority else self.evaluator


@dataclass(slots=True)
class _Epoch:
    """What one epoch's issuance and redemption hold."""

    spent: dict[str, set[bytes]] = field(default_factory=dict)  # model -> spent nonces
    spent_count: int = 0
    answers: OrderedDict[bytes, bytes] = field(default_factory=OrderedDict)  # request digest -> answer

    def remember(self, digest: bytes, answer: bytes, most: int) -> None:
        self.answers[digest] = answer
        if len(self.answers) > most:
            self.answers.popitem(last=False)


@dataclass(frozen=True, slots=True)
class Caps:
    """What an issuer may hold: ``accounts`` (user, model) allowances not full, and per epoch
    ``spent`` nonces and ``answers`` kept for replays (defaults :data:`MAX_ACCOUNTS`, :data:`MAX_SPENT`, :data:`MAX_ANSWERS`;
    tests pass smaller ones)."""

    accounts: int = MAX_ACCOUNTS
    spent: int = MAX_SPENT
    answers: int = MAX_ANSWERS


class Issuer:
    """One verifier's issuer: see the module docstring."""

    def __init__(self, seed: bytes, signer: crypto.SigningKey, chain_id: str, params: QuotaParams,
                 caps: Caps = Caps()) -> None:
        """``seed``: :func:`quota_seed` of ``signer``'s private bytes; ``signer``: the validator key,
        which signs the key records (its public key names this issuer on the wire); ``caps``: what
        one epoch may hold."""
        if len(seed) != 32:
            raise ValueError("the issuer's seed is 32 bytes")
        self._seed = seed
        self._signer = signer
        self.public = signer.public_bytes
        self.chain_id = chain_id
        self.params = params
        self.caps = caps
        self.floor = 0  # epochs below it are forgotten, and refused
        self.changes = 0  # grows with every change a snapshot would show
        self._epochs: dict[int, _Epoch] = {}
        self._allowances: dict[tuple[bytes, str], float] = {}  # (user, model) -> full_at (Allowance), not full
        self._keys: OrderedDict[tuple[str, int], _Key] = OrderedDict()

    @classmethod
    def of_validator(cls, signer: crypto.SigningKey, chain_id: str, params: QuotaParams) -> Issuer:
        """The issuer of validator key ``signer``, its seed derived with :func:`quota_seed`."""
        return cls(quota_seed(signer.private_bytes()), signer, chain_id, params)

    def revision(self) -> int:
        """A number that grows whenever :meth:`snapshot` may have changed."""
        return self.changes

    # ----------------------------------------------------------------- keys

    def _key(self, model: str, epoch: int) -> _Key:
        """The VOPRF keys of ``model`` and ``epoch`` with their signed record, derived once and cached."""
        k = (model, epoch)
        got = self._keys.get(k)
        if got is not None:
            self._keys.move_to_end(k)
            return got
        ev = quota.evaluator(self._seed, self.chain_id, model, epoch)
        top = quota.evaluator(self._seed, self.chain_id, model, epoch, priority=True)
        rec = quota.KeyRecord(self.public, model, epoch, ev.public_key.serialize(), top.public_key.serialize(),
                              self.params)
        got = self._keys[k] = _Key(ev, top, quota.encode_key_record(self._signer, self.chain_id, rec))
        if len(self._keys) > EVALUATORS:
            self._keys.popitem(last=False)
        return got

    def key_record(self, model: str, epoch: int) -> bytes:
        """The signed :class:`~overlay.directory.quota.KeyRecord` of ``model`` and ``epoch``."""
        return self._key(model, epoch).record

    def key_query(self, raw: bytes, now_unix: float) -> tuple[Code, str, bytes]:
        """``/quota/key``: the key record asked for by ``raw`` (``encode_key_query``), for an epoch
        within :data:`KEY_EPOCHS` of the current one; for another epoch WRONG_EPOCH with the
        current epoch's record as the value (a client that does not know the epoch length yet
        learns it from the record's params). ``(code, reason, value)``; never raises."""
        try:
            model, epoch = quota.decode_key_query(raw)
        except QuotaError as exc:
            return Code.MALFORMED, exc.reason, b""
        current = self.params.epoch_at(now_unix)
        if epoch - current not in KEY_EPOCHS:
            return Code.WRONG_EPOCH, (f"keys of epoch {epoch} are not given now: the current epoch is {current} "
                                      f"(epochs of {self.params.epoch_s} s from the Unix epoch)"), \
                self.key_record(model, current)
        return Code.OK, "", self.key_record(model, epoch)

    # ----------------------------------------------------------------- epochs

    def forget(self, now_unix: float) -> None:
        """Drop the epochs that can no longer be issued or redeemed at ``now_unix`` (older than the
        one before the current one); they stay refused after, even if a later call's time is earlier."""
        floor = self.params.epoch_at(now_unix) - 1
        if floor <= self.floor:
            return
        self.floor = floor
        for e in [e for e in self._epochs if e < floor]:
            del self._epochs[e]
        self._prune(now_unix)
        self.changes += 1

    def _prune(self, now_unix: float) -> None:
        """Forget the allowances full again at ``now_unix`` (the same as a user never seen)."""
        for k in [k for k, full_at in self._allowances.items() if quota.Allowance(self.params, full_at).full(now_unix)]:
            del self._allowances[k]

    def _epoch(self, epoch: int) -> _Epoch:
        got = self._epochs.get(epoch)
        if got is None:
            got = self._epochs[epoch] = _Epoch()
        return got

    def allowance(self, user: bytes, model: str) -> quota.Allowance:
        """``user``'s allowance of ``model`` at this issuer (a copy: changing it changes nothing here)."""
        return quota.Allowance(self.params, self._allowances.get((user, model), 0.0))

    def left(self, user: bytes, model: str, now_unix: float) -> int:
        """How many tokens ``user`` may take of ``model`` at this issuer at ``now_unix``."""
        return self.allowance(user, model).level(now_unix)

    def spent(self, model: str, epoch: int) -> int:
        """How many tokens of ``model`` and ``epoch`` were spent here."""
        held = self._epochs.get(epoch)
        return 0 if held is None else len(held.spent.get(model, ()))

    # ----------------------------------------------------------------- issue

    def issue(self, raw: bytes, now_unix: float, user_key: UserKey,
              model_listed: ModelListed) -> tuple[Code, str, bytes]:
        """``/quota/issue``: evaluate a registered user's blinded inputs, within its budget.

        ``user_key(node_id)``: the Ed25519 key of a registered user node, or None;
        ``model_listed(model)``: whether a listed model node serves ``model``. ``(code, reason,
        value)``, value an :class:`~overlay.directory.quota.Issued` when the code is 0; never raises.
        """
        self.forget(now_unix)
        try:
            req = quota.decode_issue(raw)
        except QuotaError as exc:
            return Code.MALFORMED, exc.reason, b""
        refused = self._refuse_issue(req, now_unix, user_key, model_listed)
        if refused is not None:
            return (*refused, b"")
        ep = self._epoch(req.epoch)
        digest = crypto.blake2b(raw, size=16)
        answer = ep.answers.get(digest)
        if answer is not None:
            return Code.OK, "this request was answered before: the same answer, counted once", answer
        return self._grant(ep, req, digest, now_unix)

    def _refuse_issue(self, req: quota.IssueRequest, now_unix: float, user_key: UserKey,
                      model_listed: ModelListed) -> tuple[Code, str] | None:
        """Why ``req`` gets nothing, before its budget: another issuer's, a stranger's, forged, an
        unlisted model, another epoch."""
        if req.issuer != self.public:
            return Code.INVALID_FIELD, ("the request names another issuer's key: make one for each issuer, with "
                                        "the key its validator signs its /quota/key records with")
        public = user_key(req.user)
        if public is None:
            return Code.UNKNOWN_NODE, (f"user {req.user.hex()[:16]} is not a registered user node of this "
                                       "committee: only registered users get tokens")
        try:
            quota.verify_issue(req, self.chain_id, public)
        except QuotaError as exc:
            return Code.BAD_SIGNATURE, exc.reason
        if not model_listed(req.model):
            return Code.INVALID_FIELD, f"no listed model node serves {req.model!r}: no tokens for it"
        current = self.params.epoch_at(now_unix)
        if not self.params.issuable(req.epoch, now_unix) or req.epoch < self.floor:
            return Code.WRONG_EPOCH, (f"tokens of epoch {req.epoch} are not issued now: the current epoch is "
                                      f"{current}, until Unix time {self.params.refills_at(current):.0f}")
        return None

    def _grant(self, ep: _Epoch, req: quota.IssueRequest, digest: bytes, now_unix: float) -> tuple[Code, str, bytes]:
        """Evaluate ``req``'s inputs under its class's key if its user's allowance holds that many of
        the class now (and there is room)."""
        account = (req.user, req.model)
        allowance, n, p = self.allowance(req.user, req.model), len(req.blinded), self.params
        if n > p.burst:
            return Code.QUOTA_USED, (f"{n} tokens asked at once; a user's allowance of a model at an issuer holds "
                                     f"{p.burst} at most: ask for fewer"), b""
        if req.priority and n > min(p.burst, p.priority):
            return Code.QUOTA_USED, (f"{n} priority tokens asked at once; priority tokens come from the top "
                                     f"{min(p.burst, p.priority)} of a user's allowance: ask for fewer"), b""
        if not allowance.take_class(n, req.priority, now_unix):
            return Code.QUOTA_LATER, _later(allowance, req, n, now_unix), b""
        if account not in self._allowances and len(self._allowances) >= self.caps.accounts:
            self._prune(now_unix)  # full ones take no room; pruned here too, not only once an epoch
        if account not in self._allowances and len(self._allowances) >= self.caps.accounts:
            return Code.UNAVAILABLE, (f"this issuer holds {self.caps.accounts} users' allowances now, its most: "
                                      "ask the other issuers, or again later"), b""
        try:
            inputs = [ristretto.BlindedInput.deserialize(b) for b in req.blinded]
        except ValueError:
            return Code.MALFORMED, "a blinded input is not a valid element", b""
        batch = self._key(req.model, req.epoch).of(req.priority).evaluate_batch(inputs)
        self._allowances[account] = allowance.full_at
        left = allowance.level(now_unix)
        answer = quota.encode_issued(quota.Issued(batch.serialize(), left))
        ep.remember(digest, answer, self.caps.answers)
        self.changes += 1
        kind = "priority" if req.priority else "standard"
        return Code.OK, f"{n} {kind} tokens issued; {left} more can be had now", answer

    # ----------------------------------------------------------------- redeem

    def redeem(self, raw: bytes, now_unix: float) -> tuple[Code, str]:
        """``/quota/redeem``: spend a token's part for this issuer. Code 0 when its output is this
        issuer's for its nonce, model and epoch (redeemable now) and the nonce was not spent yet;
        it is spent from then on. ``(code, reason)``; never raises."""
        self.forget(now_unix)
        try:
            r = quota.decode_redeem(raw)
        except QuotaError as exc:
            return Code.MALFORMED, exc.reason
        if not self.params.redeemable(r.epoch, now_unix) or r.epoch < self.floor:
            current = self.params.epoch_at(now_unix)
            return Code.BAD_TOKEN, (f"the token is another epoch's ({r.epoch}; the current one is {current}): a token "
                                    f"redeems within its epoch and {self.params.grace_s} s after")
        expected = self._key(r.model, r.epoch).of(r.priority).evaluate_known_input(quota.token_input(r.nonce))
        if not crypto.ct_equal(expected, r.output):
            kind = "priority" if r.priority else "standard"
            return Code.BAD_TOKEN, (f"the token does not verify: not issued by this issuer as a {kind} token for this "
                                    "model and epoch")
        return self._spend(self._epoch(r.epoch), r.model, r.nonce)

    def _spend(self, ep: _Epoch, model: str, nonce: bytes) -> tuple[Code, str]:
        spent = ep.spent.get(model)
        if spent is not None and nonce in spent:
            return Code.SPENT, "this token was already spent"
        if ep.spent_count >= self.caps.spent:
            return Code.UNAVAILABLE, (f"this issuer holds {self.caps.spent} spent tokens this epoch, its most: it takes "
                                      "no more until the next epoch")
        ep.spent.setdefault(model, set()).add(nonce)
        ep.spent_count += 1
        self.changes += 1
        return Code.OK, "spent"

    # ----------------------------------------------------------------- persistence

    def snapshot(self) -> bytes:
        """The allowances not full and the spent nonces of the epochs held (not the answers kept
        for replays), for :meth:`restore`: ``[version, chain_id, issuer, params, floor, [[user,
        model, full_at(float)], ...], [[epoch, [[model, [nonce, ...]], ...]], ...]]``, msgpack,
        every list sorted."""
        return _pack(self._wire())

    def _wire(self) -> list[Any]:
        allowances = [[u, m, float(t)] for (u, m), t in sorted(self._allowances.items())]
        epochs = [[e, [[m, sorted(s)] for m, s in sorted(ep.spent.items())]] for e, ep in sorted(self._epochs.items())]
        return [STATE_VERSION, self.chain_id, self.public, self.params.wire(), self.floor, allowances, epochs]

    @classmethod
    def restore(cls, raw: bytes, seed: bytes, signer: crypto.SigningKey, chain_id: str,
                params: QuotaParams) -> Issuer:
        """The issuer :meth:`snapshot` saved, for the same key, chain and params; :class:`QuotaStateError`
        for anything else (another format, issuer, chain or params, a limit the issuer never
        passes, a non-canonical encoding), never a half-restored issuer."""
        if type(raw) is not bytes or len(raw) > MAX_STATE_BYTES:
            raise QuotaStateError(f"not bytes of at most {MAX_STATE_BYTES}")
        out = cls(seed, signer, chain_id, params)
        r = codec.ShapeReader(raw, 1024)  # the longest string or bin in a state: a model id, the chain id
        try:
            _read_state(r, out)
            done = r.done()
        except QuotaStateError:
            raise
        except codec.ShapeError as exc:
            raise QuotaStateError(f"not a saved quota state ({exc})") from None
        except msgpack.OutOfData:
            raise QuotaStateError("cut short") from None
        except (ValueError, TypeError, RecursionError, OverflowError, msgpack.UnpackException) as exc:
            raise QuotaStateError(f"not a saved quota state (malformed msgpack: {type(exc).__name__})") from None
        if not done:
            raise QuotaStateError("trailing bytes after the state")
        if out.snapshot() != raw:
            raise QuotaStateError("not in canonical form (items out of order or repeated, or encoded wider)")
        return out


def _later(allowance: quota.Allowance, req: quota.IssueRequest, n: int, now: float) -> str:
    """Why ``req`` for ``n`` tokens is refused now, and when it would not be."""
    p = allowance.params
    if req.priority and allowance.level(now) >= n:
        top, ready = allowance.top(now), allowance.top_at(n, now)
        return (f"{top} priority tokens of {req.model!r} can be had from this issuer now and you asked for {n}; "
                f"{n} can be had at Unix time {ready:.1f} (in {ready - now:.1f} s), or standard ones now: priority "
                f"tokens come from the top {p.priority} of your allowance of {p.burst}")
    have, ready = allowance.level(now), allowance.ready_at(n, now)
    return (f"{have} tokens of {req.model!r} can be had from this issuer now and you asked for {n}; {n} can be had "
            f"at Unix time {ready:.1f} (in {ready - now:.1f} s): your allowance grows by {p.tokens} every "
            f"{p.epoch_s} s, to {p.burst} at most")


# --------------------------------------------------------------------------- snapshot reading

def _pack(obj: object) -> bytes:
    out: bytes = msgpack.packb(obj, use_bin_type=True)
    return out


def _count(r: codec.ShapeReader, lo: int, hi: int, what: str) -> int:
    n = r.array()
    if not lo <= n <= hi:
        raise QuotaStateError(f"{what}: {n} items, not {lo}..{hi}")
    return n


def _typed(v: Any, kind: type[str | bytes], what: str, n: int | None = None) -> Any:
    if type(v) is not kind or (n is not None and len(v) != n):
        raise QuotaStateError(f"{what} is not {kind.__name__}" + ("" if n is None else f" of length {n}"))
    return v


def _int(v: Any, lo: int, hi: int, what: str) -> int:
    if type(v) is not int or not lo <= v <= hi:
        raise QuotaStateError(f"{what} is not an int within {lo}..{hi}")
    return v


def _model(v: Any) -> str:
    if type(v) is not str or not 1 <= len(v.encode()) <= MAX_MODEL_ID:
        raise QuotaStateError(f"a model id is not a string of 1..{MAX_MODEL_ID} bytes")
    return v


def _read_state(r: codec.ShapeReader, out: Issuer) -> None:
    _count(r, 7, 7, "the state")
    version = r.value()
    if type(version) is not int or version != STATE_VERSION:
        raise QuotaStateError(f"format version {version!r}; this verifier reads version {STATE_VERSION} only")
    if _typed(r.value(), str, "the chain id") != out.chain_id:
        raise QuotaStateError(f"the state of another chain than {out.chain_id!r}")
    if _typed(r.value(), bytes, "the issuer", quota.KEY_LEN) != out.public:
        raise QuotaStateError("the state of another issuer (another validator key)")
    fields = _count(r, len(QuotaParams.BOUNDS), len(QuotaParams.BOUNDS), "the params")
    if [r.value() for _ in range(fields)] != out.params.wire():
        raise QuotaStateError(f"the state of other quota params than the genesis's {out.params.to_json()}")
    out.floor = _int(r.value(), 0, quota.MAX_EPOCH, "the floor")
    _read_allowances(r, out._allowances)
    for _ in range(_count(r, 0, 2, "the epochs")):
        _count(r, 2, 2, "an epoch")
        epoch = _int(r.value(), out.floor, quota.MAX_EPOCH, "an epoch")
        out._epochs[epoch] = ep = _Epoch()
        _read_spent(r, ep)


def _read_allowances(r: codec.ShapeReader, into: dict[tuple[bytes, str], float]) -> None:
    for _ in range(_count(r, 0, MAX_ACCOUNTS, "the allowances")):
        _count(r, 3, 3, "an allowance")
        user = _typed(r.value(), bytes, "a user", NODE_ID_LEN)
        model = _model(r.value())
        full_at = r.value()
        if type(full_at) is not float or not 0.0 < full_at < MAX_FULL_AT:
            raise QuotaStateError(f"an allowance's time is not a float within 0..{MAX_FULL_AT:g}")
        into[(user, model)] = full_at


def _read_spent(r: codec.ShapeReader, ep: _Epoch) -> None:
    for _ in range(_count(r, 0, MAX_SPENT, "the models spent")):
        _count(r, 2, 2, "a model's spent tokens")
        model = _model(r.value())
        n = _count(r, 1, MAX_SPENT - ep.spent_count, "a model's spent tokens")
        ep.spent[model] = {_typed(r.value(), bytes, "a nonce", quota.NONCE_LEN) for _ in range(n)}
        ep.spent_count += n

