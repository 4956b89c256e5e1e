"""Prompts users donated for audit challenges (decision 0013 §4; ``user_client/donate.py`` is the
client's side).

A user who turns on ``--donate-prompts`` hands, now and then, a request's system prompt and user
turns (:func:`overlay.directory.donation.donated_messages`: the latest 8, no replies, decision
0027) and sampling parameters to one verifier, sealed to that verifier's validator key
(:func:`overlay.directory.donation.seal_donation`) and signed by the user's node key, through the verifier's
RPC (``abci_query /audit/donate``, answered by :mod:`verifier.abci_app`). The verifier keeps them
here, in a private pool (never on the chain), and challenges model nodes with them: a challenge is
then a user's own prompt, which a node cannot tell from users' traffic by its text.

The wire format is :mod:`overlay.directory.donation`'s, the one codec both sides use (at most
``MAX_DONATION_BYTES`` = 16 KiB sealed). :func:`open_donation` takes a donation only if it opens
with this verifier's key, decodes strictly (:func:`overlay.directory.donation.decode`: exact types, no
trailing bytes), its signature verifies with the key the committee registered for the donor's
node id, the donor is a currently registered **user** node, the model is one this verifier
audits, and the messages and parameters pass a challenge's limits as a script
(:func:`opening_of`: the conversation's user turns without any replies it carries, decision 0025;
:meth:`verifier.audit.tx.Opening.check`: at most 16 messages, the last the user's, at most 8 user
turns, and so on).
:meth:`DonationPool.add` then refuses a prompt already held or already used (the normalised first
user turn, :meth:`~verifier.audit.tx.Opening.prompt_key`) and a donor's prompt over
:data:`PER_DONOR` live ones; past :data:`MAX_POOL` prompts the oldest prompt of the *network*
holding the most is dropped (below). Every refusal is a :class:`DonationError` with a code
(:class:`overlay.directory.registration.Code`) and a reason, and leaves the pool unchanged; nothing
else is raised on any input.

:meth:`DonationPool.draw` picks a **network** uniformly among those holding unused prompts for the
model (the /24 or /48 of the donor's registered address, :func:`verifier.admission.cap_keys`),
then a donor of it uniformly, then one of its prompts uniformly, and removes it (a prompt is used
once). Drawn for a node, only prompts whose donor did not name that node as having read the
conversation count (a donation's ``seen_by``: the nodes it was sent to or signed by; decision
0029): a node that keeps what it is sent would otherwise recognise its challenges by memory.
Decision 0028: a cheating model node that registers users of its own and donates prompts
it will know again (*sybil donors*) recognises the challenges drawn from them; drawn by donor, 9
such identities per honest donor left challenges catching a selective cheater within 5 epochs in
30 % of runs (the bench's 90 % share), and 157 filled the pool, the oldest (honest) prompts
dropped. By network, the attacker needs as many networks as the honest donors hold, where the
committee lists up to 16 nodes on one; a flood drops its own network's prompts first.

The pool is I/O-free; :func:`load_pool` and :func:`save_pool` keep it in
``DATA_DIR/audit-pool.msgpack`` (mode 0600; a corrupt file is logged and set aside).
"""

from __future__ import annotations

import logging
import os
import random
from collections import OrderedDict
from collections.abc import Callable, Container
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgpack

from overlay.directory import donation, transcripts
from overlay.directory.donation import MAX_DONATION_BYTES as MAX_DONATION_BYTES
from overlay.directory.donation import Donation as Donation
from overlay.directory.registration import Code, pack
from overlay.wire.identity import write_private
from overlay.wire.messages import ChatMessage, SamplingParams

if TYPE_CHECKING:
    from verifier.audit.tx import Opening

log = logging.getLogger("gentorrent.audit")

PER_DONOR = 64  # live prompts one donor may have in the pool
MAX_POOL = 10_000  # prompts in the pool (past it, the oldest of the network holding the most is dropped)
MAX_USED_KEYS = 4 * MAX_POOL  # prompt keys of used prompts remembered (a used prompt is refused again)
POOL_FILE = "audit-pool.msgpack"
_FILE_VERSION = 3  # 3: each prompt with the nodes that read it; 2: with its donor's network; 1: neither (2, 1 read)

UserKey = Callable[[bytes], bytes | None]
"""``user_key(node_id)``: the Ed25519 key the committee registered for a current USER node, else None."""
NetworkOf = Callable[[bytes], str | None]
"""``network_of(node_id)``: the network of a registered node's address (``"net 192.0.2.0/24"``),
else None (the donor is then a network of its own)."""


def own_network(donor: bytes) -> str:
    """The group of a donor whose network is not known: its own."""
    return f"donor {donor.hex()}"


def _drop_one(counts: dict[Any, int], key: Any) -> None:
    if counts[key] > 1:
        counts[key] -= 1
    else:
        del counts[key]


class DonationError(Exception):
    """A donation refused: ``code`` (:class:`overlay.directory.registration.Code`) and ``reason`` (words for the donor)."""

    def __init__(self, code: Code, reason: str) -> None:
        self.code = code
        self.reason = reason
        super().__init__(f"{code.name} ({int(code)}): {reason}")


def opening_of(d: Donation, salt: bytes = bytes(16)) -> Opening:
    """``d`` as a challenge: its conversation as a script (:func:`verifier.audit.tx.script_of`:
    its user turns, without the replies it carries; decision 0025)."""
    from verifier.audit.tx import Opening, script_of

    return Opening(salt, d.model, script_of(d.messages), d.params)


def prompt_key(d: Donation) -> bytes:
    """:meth:`verifier.audit.tx.Opening.prompt_key` of ``d``'s prompt (its first user turn, normalised)."""
    return opening_of(d).prompt_key()


def _refuse(code: Code, reason: str) -> DonationError:
    return DonationError(code, reason)


def _malformed(why: str) -> DonationError:
    return DonationError(Code.MALFORMED, f"the donation is not {why}")


def open_donation(sealed: bytes, seed32: bytes, user_key: UserKey, models: Container[str]) -> Donation:
    """The donation in ``sealed`` (sealed to the Ed25519 key of ``seed32``, this verifier's
    validator seed), checked as the module docstring says: from a current user node
    (``user_key``), for one of ``models`` (those this verifier audits), within a challenge's
    limits. :class:`DonationError` with the reason otherwise; never anything else."""
    from overlay.directory.registration import TxError

    if type(sealed) is not bytes:
        raise _malformed("bytes")
    if len(sealed) > MAX_DONATION_BYTES:
        raise DonationError(Code.OVERSIZE, f"a donation of {len(sealed)} bytes; at most {MAX_DONATION_BYTES}")
    try:
        plain = donation.unseal(seed32, sealed)
    except donation.DonationError:
        raise _refuse(Code.MALFORMED, "the donation does not open with this verifier's key (sealed to another "
                                      "key, or altered); fetch the key from /audit/donate_key") from None
    try:
        d, sig = donation.decode(plain)
    except donation.DonationError as exc:
        raise _refuse(Code.UNSUPPORTED_VERSION if exc.unsupported_version else Code.MALFORMED, exc.reason) from None
    public = user_key(d.donor)
    if public is None:
        raise _refuse(Code.UNKNOWN_NODE, f"donor {d.donor.hex()[:16]} is not a registered user node of this "
                                         "committee")
    try:
        donation.verify(d, sig, public)
    except donation.DonationError:
        raise _refuse(Code.BAD_SIGNATURE, "the donation's signature does not verify with the donor's registered "
                                          "key") from None
    if d.model not in models:
        raise _refuse(Code.INVALID_FIELD, f"this verifier does not audit model {d.model[:64]!r}")
    why = transcripts.opening_problem(d.model, d.messages, d.params)  # the request as the donor sent it
    if why is not None:
        raise _refuse(Code.INVALID_FIELD, f"challenge: {why}")
    try:
        opening_of(d).check_script()
    except TxError as exc:
        raise _refuse(Code.INVALID_FIELD, f"the prompt is not one a challenge may carry: {exc.reason}") from None
    return d


class DonationPool:
    """The donated prompts one verifier holds (module docstring). ``models``: the models this
    verifier audits (set by the audit loop once its engine is loaded; until then every donation
    is refused). ``dirty`` says the pool changed since :func:`save_pool` last wrote it."""

    def __init__(self, *, per_donor: int = PER_DONOR, cap: int = MAX_POOL) -> None:
        self.per_donor = per_donor
        self.cap = cap
        self.models: frozenset[str] = frozenset()
        self.dirty = False
        self._seq = 0
        self._items: OrderedDict[int, tuple[Donation, str]] = OrderedDict()  # (donation, network), oldest first
        self._keys: dict[bytes, int] = {}  # prompt key -> seq, live prompts
        self._used: OrderedDict[bytes, None] = OrderedDict()  # prompt keys drawn (bounded)
        self._by_model: dict[str, dict[str, dict[bytes, list[int]]]] = {}  # model -> network -> donor -> seqs
        self._per_donor: dict[bytes, int] = {}
        self._per_network: dict[str, int] = {}
        self._seen: dict[bytes, set[int]] = {}  # model node -> live prompts its donor says it read

    def __len__(self) -> int:
        return len(self._items)

    def count(self, model: str | None = None, donor: bytes | None = None) -> int:
        """Live prompts (for ``model`` and/or from ``donor`` when given)."""
        return sum(1 for d, _ in self._items.values()
                   if (model is None or d.model == model) and (donor is None or d.donor == donor))

    def donors(self, model: str) -> int:
        """How many donors hold unused prompts for ``model``."""
        return sum(len(donors) for donors in self._by_model.get(model, {}).values())

    def networks(self, model: str) -> int:
        """How many networks hold unused prompts for ``model``."""
        return len(self._by_model.get(model, {}))

    # ------------------------------------------------------------------ taking

    def offer(self, sealed: bytes, seed32: bytes, user_key: UserKey,
              network_of: NetworkOf | None = None) -> Donation:
        """Open, check and add one sealed donation (:func:`open_donation`, :meth:`add`), under the
        donor's network (``network_of``; the donor's own group without it)."""
        if not self.models:
            raise DonationError(Code.UNAVAILABLE, "this verifier's audit loop has not started yet (its model is "
                                                  "still loading); retry in a minute")
        d = open_donation(sealed, seed32, user_key, self.models)
        self.add(d, None if network_of is None else network_of(d.donor))
        return d

    def add(self, d: Donation, network: str | None = None) -> None:
        """Keep ``d`` under ``network`` (default: a group of the donor's own): :class:`DonationError`
        (pool unchanged) for a prompt already held or used, or a donor at :attr:`per_donor` live
        prompts; past :attr:`cap` the oldest prompt of the network holding the most is dropped."""
        key = prompt_key(d)
        if key in self._keys or key in self._used:
            raise DonationError(Code.DUPLICATE, "this prompt was already donated")
        if self._per_donor.get(d.donor, 0) >= self.per_donor:
            raise DonationError(Code.UNAVAILABLE, f"this donor already has {self.per_donor} prompts waiting in "
                                                  "this verifier's pool; donate again later")
        while len(self._items) >= self.cap:
            largest = max(self._per_network.values())
            self._remove(next(seq for seq, (_, net) in self._items.items() if self._per_network[net] == largest))
        self._insert(d, key, own_network(d.donor) if network is None else network)

    def _insert(self, d: Donation, key: bytes, network: str) -> None:
        self._seq += 1
        self._items[self._seq] = (d, network)
        self._keys[key] = self._seq
        self._by_model.setdefault(d.model, {}).setdefault(network, {}).setdefault(d.donor, []).append(self._seq)
        self._per_donor[d.donor] = self._per_donor.get(d.donor, 0) + 1
        self._per_network[network] = self._per_network.get(network, 0) + 1
        for node in d.seen_by:
            self._seen.setdefault(node, set()).add(self._seq)
        self.dirty = True

    def _remove(self, seq: int) -> Donation:
        d, network = self._items.pop(seq)
        self._keys.pop(prompt_key(d), None)
        networks = self._by_model[d.model]
        donors = networks[network]
        donors[d.donor].remove(seq)
        if not donors[d.donor]:
            del donors[d.donor]
        if not donors:
            del networks[network]
        if not networks:
            del self._by_model[d.model]
        _drop_one(self._per_donor, d.donor)
        _drop_one(self._per_network, network)
        for node in d.seen_by:
            self._seen[node].discard(seq)
            if not self._seen[node]:
                del self._seen[node]
        self.dirty = True
        return d

    # ------------------------------------------------------------------ drawing

    def draw(self, model: str, rng: random.Random, avoid: bytes | None = None) -> Donation | None:
        """A prompt for ``model``, removed from the pool (used once): a network chosen uniformly
        among those holding prompts for it, then a donor of it, then one of its prompts, each
        uniformly; with ``avoid`` (the node to be challenged), only among the prompts whose donor
        did not name that node as having read the conversation (``seen_by``, decision 0029). None
        when there is none."""
        networks = self._by_model.get(model)
        if not networks:
            return None
        seen = self._seen.get(avoid, set()) if avoid is not None else set()
        left: dict[tuple[str, bytes], int] = {}  # (network, donor) -> its prompts avoid has not read
        for seq in seen:
            d, net = self._items[seq]
            if d.model == model:
                left[net, d.donor] = left.get((net, d.donor), len(networks[net][d.donor])) - 1
        open_nets = [net for net, donors in networks.items()
                     if any(left.get((net, donor), 1) > 0 for donor in donors)]
        if not open_nets:
            return None
        net = rng.choice(open_nets)
        donor = rng.choice([donor for donor in networks[net] if left.get((net, donor), 1) > 0])
        seq = rng.choice([s for s in networks[net][donor] if s not in seen])
        d = self._remove(seq)
        self._used[prompt_key(d)] = None
        while len(self._used) > MAX_USED_KEYS:
            self._used.popitem(last=False)
        return d

    # ------------------------------------------------------------------ persistence

    def to_bytes(self) -> bytes:
        return pack([_FILE_VERSION, [[d.wire(), net] for d, net in self._items.values()], list(self._used)])

    @classmethod
    def from_bytes(cls, raw: bytes, *, per_donor: int = PER_DONOR, cap: int = MAX_POOL) -> DonationPool:
        """A pool from :meth:`to_bytes`; ValueError if the bytes are not one."""
        try:
            doc = msgpack.unpackb(raw, raw=False, strict_map_key=True)
            version, items, used = doc
            if version not in (1, 2, _FILE_VERSION):
                raise ValueError(f"pool file version {version!r}")
            pool = cls(per_donor=per_donor, cap=cap)
            for item in items:
                wire, net = (item, None) if version == 1 else item
                donor, model, messages, p, *rest = wire if version == _FILE_VERSION else [*wire, []]
                if len(rest) != 1:
                    raise ValueError(f"a prompt of {len(wire)} fields")
                d = Donation(bytes(donor), str(model), tuple(ChatMessage(str(r), str(c)) for r, c in messages),
                             SamplingParams(float(p[0]), float(p[1]), int(p[2]), int(p[3]),
                                            None if p[4] is None else int(p[4])),
                             donation.seen_by_of(bytes(n) for n in rest[0]))
                key = prompt_key(d)
                if key not in pool._keys:  # version 1 kept no networks: each donor its own, as it drew then
                    pool._insert(d, key, own_network(d.donor) if net is None else str(net))
            for k in used:
                if bytes(k) not in pool._keys:
                    pool._used[bytes(k)] = None
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError, StopIteration,
                msgpack.UnpackException, donation.DonationError) as exc:
            raise ValueError(f"not a donation pool ({type(exc).__name__}: {exc})") from None
        pool.dirty = False
        return pool


def load_pool(data_dir: str | os.PathLike[str]) -> DonationPool:
    """The pool kept in ``data_dir`` (:data:`POOL_FILE`), or an empty one. A file that does not
    decode is logged and renamed ``.corrupt`` (never fatal)."""
    path = Path(data_dir) / POOL_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return DonationPool()
    except OSError as exc:
        log.warning("audit: cannot read the donation pool %s (%s); starting with an empty pool", path, exc)
        return DonationPool()
    try:
        return DonationPool.from_bytes(raw)
    except ValueError as exc:
        log.warning("audit: the donation pool %s is corrupt (%s); set aside as %s.corrupt, starting empty",
                    path, exc, path.name)
        try:
            os.replace(path, path.with_name(path.name + ".corrupt"))
        except OSError:
            pass
        return DonationPool()


def save_pool(pool: DonationPool, data_dir: str | os.PathLike[str]) -> None:
    """Write the pool to ``data_dir`` (:data:`POOL_FILE`, mode 0600) if it changed. OSError passes."""
    if not pool.dirty:
        return
    write_private(Path(data_dir) / POOL_FILE, pool.to_bytes())
    pool.dirty = False
