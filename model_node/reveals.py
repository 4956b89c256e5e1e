"""The model node's reveals of withheld replies (decision 0037, step 6): the trio driver.

A donor who escrowed a commitment to a request addressed to this node and then withheld its
reveal cannot keep a good reply from counting: once epoch ``e + 1`` is the chain's release delay
old (eleven minutes at the default: the 10-minute reply window and a minute), each verifier releases
its shares of the escrowed commitments of ``e`` it holds no reveal for, at most
:data:`~overlay.directory.transcripts.MAX_RELEASED`, shared out among donors (decision 0039)
(``abci_query`` :data:`~overlay.directory.transcripts.RELEASED_PATH`, pages of up to 256 after a
given commitment; ``TOO_EARLY`` before). Times scale with the chain's reply window (decision 0040:
the release is :func:`~overlay.directory.transcripts.release_delay_s` into ``e + 1``). Every
:func:`~overlay.directory.transcripts.node_poll_s` of the window (at most :data:`POLL_S`: a minute
at the default 10-minute window) :meth:`Reveals.step`:

1. reads the current epoch and the reply window from the verifiers' ``/audit`` (the lower median of
   each among those that answer, so one verifier cannot move them far);
2. for each of the last :data:`EPOCHS` epochs below it not done yet, pages through the released
   shares at EVERY verifier (at most :data:`MAX_PAGES` pages a verifier an epoch a poll, and
   :data:`~overlay.directory.transcripts.MAX_RELEASED` commitments a verifier an epoch in all);
   ``TOO_EARLY``, another refusal, a page that does not decode or an RPC that fails: that
   verifier is asked again at the next poll, from where it stopped;
3. keeps of each verifier's shares only those of its own units under the committee's plan
   (:func:`overlay.directory.escrow.holder_xs`), and only of commitments with as many points as the
   plan's threshold (what verifiers check a donor's deal against): a colluding verifier below a
   third of the power cannot make up a commitment the node would rebuild and look up alone, of
   the plan's degree or a lower one; groups them
   by commitment, points and plan, rebuilds each secret
   (:func:`overlay.directory.escrow.recover`: only shares that verify against the points count;
   too few and it waits for more verifiers' pages) and finds the served request it commits to
   (:meth:`model_node.served.ServedStore.find`, by the locator in the secret's low bits, decision
   0038: addressed to this node, or forwarded here by the node addressed, whose reply this node
   signed); at most :data:`MAX_REBUILDS` an epoch a poll (a verifier's whole release: the node
   has only the few polls between the release and the close), the commitments more verifiers
   released first, then in an order salted by this node (never by value, which donors choose);
4. hands the transcript (kind 2, with the secret) to EVERY verifier, sealed to the key its
   ``/audit/donate_key`` answers, which must be one of the committee's validator keys
   (:data:`~overlay.directory.transcripts.NODE_REVEAL_PATH`). Code 0 and ``DUPLICATE`` count as
   taken; another code is final for that verifier and logged (info); an RPC failure is retried at
   the next poll.

**Across a change of the validator set** (``gentorrent verifier change``): donors deal, and
verifiers check shares, under the plan of the set current when the commitment is made, and a
change moves units between holders. So the node remembers each set :attr:`Reveals.validators`
gave at a poll, with the last epoch it was current then (at most :data:`MAX_PLANS`, for
:data:`EPOCHS` epochs), and reads an epoch's release under every set current in or after it: each
verifier's shares are kept under each plan that gives it units, and grouped by plan, so a secret is
rebuilt only from shares of one plan's units (a colluder's units under two plans together could
reach the threshold). A node that was not running while a set was current cannot rebuild what was
dealt under it. The sets remembered are written to ``plans_file`` (``DATA_DIR/reveal-plans.msgpack``
beside the served store) whenever they change, and read back at start, so a node restarted across
a change still rebuilds what was dealt under the set before it; a file that does not decode is
logged and left for the next write to replace (the node then knows the current set only).

An epoch is done once every verifier answered all its pages and took (or refused) every
transcript found; it is then forgotten. Each epoch's state: what each verifier's pages gave so far
and where to go on, the shares per commitment, the transcripts found and who took them. Nothing
raises out of :meth:`Reveals.run` (a failed poll is logged and the next one goes on).

``rpc`` (default :func:`overlay.directory.rpc.rpc_call`) is injectable, and the loop sleeps on
trio's clock (tests: ``MockClock``, or call :meth:`Reveals.step`).
"""

from __future__ import annotations

import logging
import secrets
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgpack
import trio

from model_node.served import ServedStore
from overlay.directory import escrow
from overlay.directory import transcripts as wire
from overlay.directory.donation import KEY_PATH
from overlay.directory.registration import Code
from overlay.directory.rpc import QueryRefused, Rpc, RpcError, abci_value
from overlay.wire import crypto
from overlay.wire.clock import Clock, TrioClock
from overlay.wire.identity import Identity, write_private

log = logging.getLogger("gentorrent.model.reveals")

POLL_S = 60.0  # the longest poll (node_poll_s of the default window)
EPOCHS = 2  # epochs below the current one looked at: the store keeps about two
MAX_PAGES = 16  # pages read from one verifier for one epoch in one poll
MAX_REBUILDS = wire.MAX_RELEASED  # secrets rebuilt for one epoch in one poll: a verifier's whole release
RPC_TIMEOUT_S = 10.0
AUDIT_PATH = "/audit"
MAX_AUDIT_BYTES = 1 << 20
MAX_PLANS = 4  # validator sets remembered (module docstring): a change of set takes two

PLANS_FILE = "reveal-plans.msgpack"  # the sets remembered, under the node's data directory
PLANS_VERSION = 1
MAX_PLANS_BYTES = 1 << 20

__all__ = ["EPOCHS", "MAX_PAGES", "MAX_PLANS", "PLANS_FILE", "POLL_S", "Reveals", "decode_plans", "encode_plans"]

_Key = tuple[bytes, tuple[bytes, ...], int]  # a commitment, the points a verifier released it with, the plan's id
_Powers = tuple[tuple[bytes, int], ...]  # a validator set: (Ed25519 key, power), by key
_Units = tuple[frozenset[int], int]  # a verifier's units under a plan, and the plan's threshold


def encode_plans(plans: Sequence[tuple[_Powers, int]]) -> bytes:
    """The sets remembered, each with the last epoch it was current: what :data:`PLANS_FILE` holds."""
    return bytes(msgpack.packb([PLANS_VERSION, [[[list(v) for v in powers], last] for powers, last in plans]],
                               use_bin_type=True))


def decode_plans(raw: bytes) -> list[tuple[_Powers, int]]:
    """:func:`encode_plans`' bytes back, strictly: at most :data:`MAX_PLANS` sets, each of 1 to
    :data:`~overlay.directory.escrow.MAX_HOLDERS` distinct 32-byte keys with powers in 1..
    :data:`~overlay.directory.escrow.MAX_POWER`, by key; :class:`ValueError` otherwise."""
    if len(raw) > MAX_PLANS_BYTES:
        raise ValueError(f"{len(raw)} bytes, more than {MAX_PLANS_BYTES}")
    doc = msgpack.unpackb(raw, raw=False, strict_map_key=True, use_list=True)
    if not (isinstance(doc, list) and len(doc) == 2 and doc[0] == PLANS_VERSION and isinstance(doc[1], list)
            and len(doc[1]) <= MAX_PLANS):
        raise ValueError(f"not version {PLANS_VERSION} with at most {MAX_PLANS} sets")
    out: list[tuple[_Powers, int]] = []
    for item in doc[1]:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], list)
                and 1 <= len(item[0]) <= escrow.MAX_HOLDERS and type(item[1]) is int and item[1] >= 0):
            raise ValueError("a set is not [validators, last epoch]")
        powers = tuple(_validator(v) for v in item[0])
        if [k for k, _ in powers] != sorted({k for k, _ in powers}):
            raise ValueError("a set's keys are not distinct, by key")
        out.append((powers, item[1]))
    return out


def _validator(v: object) -> tuple[bytes, int]:
    if not (isinstance(v, list) and len(v) == 2 and type(v[0]) is bytes and len(v[0]) == 32 and type(v[1]) is int
            and 1 <= v[1] <= escrow.MAX_POWER):
        raise ValueError("a validator is not [32-byte key, power in range]")
    return v[0], v[1]


@dataclass(slots=True)
class _Epoch:
    """What one epoch's release gave so far (see the module docstring)."""

    after: dict[str, bytes] = field(default_factory=dict)  # verifier address -> last commitment read
    read: Counter[str] = field(default_factory=Counter)  # commitments read from each verifier
    answered: set[str] = field(default_factory=set)  # verifiers whose every page is read
    shares: dict[_Key, list[escrow.Share]] = field(default_factory=dict)
    fresh: set[_Key] = field(default_factory=set)  # keys given shares since the last rebuild
    sources: dict[_Key, set[str]] = field(default_factory=dict)  # the verifiers that released each
    settled: set[_Key] = field(default_factory=set)  # rebuilt, and no served request of this node's
    found: dict[bytes, wire.Revealed] = field(default_factory=dict)  # commitment -> transcript to hand in
    taken: dict[bytes, set[str]] = field(default_factory=dict)  # commitment -> verifiers that answered it
    owner: dict[tuple[int, int], str] = field(default_factory=dict)  # (plan id, a share's x) -> whose unit it is
    liars: set[str] = field(default_factory=set)  # verifiers a released share of which did not verify


class Reveals:
    """The driver (see the module docstring). ``addresses``: the committee's RPC addresses
    (``--committee``); ``validators()``: the committee's validator keys (Ed25519, 32 bytes) the
    node trusts, with their voting powers (the escrow's plan: the node runs with its membership's,
    the signed lists' latest set, as donors deal by; the sets it gave at polls are remembered for
    the epochs they were current in, module docstring); ``identity``: the node's; ``store``: what
    it served."""

    def __init__(self, addresses: Sequence[str], validators: Callable[[], Mapping[bytes, int]], identity: Identity,
                 store: ServedStore, *, rpc: Rpc | None = None, clock: Clock | None = None,
                 poll: float | None = None, max_rebuilds: int = MAX_REBUILDS,
                 plans_file: Path | None = None) -> None:
        if not addresses:
            raise ValueError("the reveals need the committee's RPC addresses")
        self.addresses = tuple(addresses)
        self.validators = validators
        self.identity = identity
        self.store = store
        self.rpc = rpc
        self.clock: Clock = clock or TrioClock()
        self.fixed_poll, self.max_rebuilds = poll, max_rebuilds
        self.window_s = wire.DEFAULT_REPLY_WINDOW_S  # the chain's, as the verifiers' /audit last said
        self.epochs: dict[int, _Epoch] = {}
        self.done: set[int] = set()
        self.keys: dict[str, bytes] = {}  # verifier address -> its validator key (checked)
        self.plans: dict[_Powers, tuple[int, int]] = {}  # a set seen at a poll -> (its id, the last epoch it was current)
        self._next_plan = 0
        # handed, duplicate, refused, unmatched, unrebuilt, errors, foreign shares, share checks, lying verifiers
        self.counts: Counter[str] = Counter()
        self.plans_file = plans_file
        self._load_plans()
        self._last_error = ""
        self._salt = secrets.token_bytes(16)  # orders the rebuilds: no donor can choose to come first

    @property
    def poll(self) -> float:
        """Seconds between two polls: ``poll`` as given, else the chain's reply window's
        :func:`~overlay.directory.transcripts.node_poll_s`."""
        return self.fixed_poll if self.fixed_poll is not None else wire.node_poll_s(self.window_s)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Poll every :attr:`poll` seconds until cancelled; never raises otherwise."""
        task_status.started()
        while True:
            try:
                await self.step()
            except Exception as exc:  # never out of the loop: the next poll goes on
                log.exception("reveals: a poll failed: %s", exc)
            await trio.sleep(self.poll)

    async def step(self) -> None:
        """One poll (module docstring)."""
        self.store.prune(int(self.clock.unix() * 1000))
        now = await self._current_epoch()
        if now is None:
            return
        self._saw_plan(now)
        wanted = [e for e in range(max(0, now - EPOCHS), now) if e not in self.done]
        for e in list(self.epochs):
            if e < now - EPOCHS or e >= now:
                del self.epochs[e]
        self.done = {e for e in self.done if now - EPOCHS <= e < now}
        for e in wanted:
            st = self.epochs.setdefault(e, _Epoch())
            await self._read(e, st)
            await self._rebuild(st)
            await self._hand_in(e, st)
            if self._finished(st):
                log.info("reveals: epoch %d done (%d transcript(s) handed in)", e, len(st.found))
                self.done.add(e)
                del self.epochs[e]

    def _saw_plan(self, now: int) -> None:
        """Note the set :attr:`validators` gives as current in epoch ``now``; forget those last
        current before the oldest epoch read, and past :data:`MAX_PLANS` the longest gone."""
        powers = tuple(sorted(self.validators().items()))
        known = self.plans.get(powers)
        if known is None:
            known, self._next_plan = (self._next_plan, now), self._next_plan + 1
        seen = {**self.plans, powers: (known[0], now)}
        kept = sorted(seen.items(), key=lambda kv: (-kv[1][1], -kv[1][0]))[:MAX_PLANS]  # latest first
        plans = {p: v for p, v in kept if v[1] >= now - EPOCHS}
        if plans != self.plans:
            self.plans = plans
            self._save_plans()

    def _load_plans(self) -> None:
        """The sets a run before this one remembered (:data:`PLANS_FILE`), if any."""
        if self.plans_file is None:
            return
        try:
            raw = self.plans_file.read_bytes()
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning("reveals: cannot read %s (%s): the validator sets before this start are not known",
                        self.plans_file, exc)
            return
        try:
            plans = decode_plans(raw)
        except (ValueError, msgpack.UnpackException) as exc:
            log.warning("reveals: %s does not decode (%s): the validator sets before this start are not known; it "
                        "is replaced at the next change", self.plans_file, exc)
            return
        self.plans = {powers: (pid, last) for pid, (powers, last) in enumerate(plans)}
        self._next_plan = len(plans)

    def _save_plans(self) -> None:
        if self.plans_file is None:
            return
        try:
            write_private(self.plans_file, encode_plans([(p, last) for p, (_, last) in self.plans.items()]))
        except OSError as exc:
            self.counts["errors"] += 1
            log.warning("reveals: cannot write %s (%s): a restart would forget the validator sets before it",
                        self.plans_file, exc)

    def _plans_of(self, epoch: int) -> list[tuple[int, dict[bytes, int]]]:
        """``(id, powers)`` of each remembered set current in or after ``epoch``."""
        return [(pid, dict(p)) for p, (pid, last) in self.plans.items() if last >= epoch]

    # ------------------------------------------------------------------ RPC

    async def _query(self, address: str, path: str, data: bytes = b"") -> bytes:
        """``abci_value`` under :data:`RPC_TIMEOUT_S`: ``QueryRefused`` for a refusal; ``OSError``,
        :class:`RpcError` or ``trio.TooSlowError`` when it could not be asked."""
        with trio.fail_after(RPC_TIMEOUT_S):
            return await abci_value(address, path, data, rpc=self.rpc)

    def _failed(self, address: str, what: str, exc: Exception) -> None:
        self.counts["errors"] += 1
        why = f"{address}: {what}: {exc}"
        if why != self._last_error:  # once per distinct error, not once a poll
            log.info("reveals: %s (asked again at the next poll)", why)
        self._last_error = why

    async def _current_epoch(self) -> int | None:
        """The lower median of the epochs the verifiers' ``/audit`` answers (``None``: none answered);
        :attr:`window_s` set to the lower median of their reply windows."""
        got, windows = [], []
        for address in self.addresses:
            try:
                raw = await self._query(address, AUDIT_PATH)
                if len(raw) > MAX_AUDIT_BYTES:
                    raise RpcError(f"an /audit answer of {len(raw)} bytes")
                doc = msgpack.unpackb(raw, raw=False, strict_map_key=False)
                epoch = doc.get("epoch") if isinstance(doc, dict) else None
                if type(epoch) is not int or epoch < 0:
                    raise RpcError("the /audit answer holds no epoch")
                window = doc.get("reply_window_s", wire.DEFAULT_REPLY_WINDOW_S)
                if type(window) is not int or not wire.MIN_REPLY_WINDOW_S <= window <= wire.MAX_REPLY_WINDOW_S:
                    raise RpcError(f"the /audit answer's reply window {window!r} is out of range")
                got.append(epoch)
                windows.append(window)
            except QueryRefused as exc:
                self._failed(address, "/audit refused", exc)
            except (OSError, RpcError, trio.TooSlowError, ValueError, msgpack.UnpackException) as exc:
                self._failed(address, "/audit", exc)
        if not got:
            return None
        self.window_s = sorted(windows)[(len(windows) - 1) // 2]
        return sorted(got)[(len(got) - 1) // 2]

    async def _key(self, address: str, held: set[bytes] | None = None) -> bytes | None:
        """The validator key the verifier at ``address`` takes reveals sealed to (``/audit/donate_key``),
        one of ``held`` (default: the committee's current validator keys); ``None`` when it cannot
        be had now."""
        held = set(self.validators()) if held is None else held
        key = self.keys.get(address)
        if key is not None and key in held:
            return key
        try:
            key = await self._query(address, KEY_PATH)
        except (OSError, RpcError, trio.TooSlowError) as exc:
            self._failed(address, "/audit/donate_key", exc)
            return None
        if len(key) != 32 or key not in held:
            self._failed(address, "/audit/donate_key", ValueError(
                f"the key {key.hex()[:16] or 'empty'} is not one of the committee's validator keys"))
            return None
        self.keys[address] = key
        return key

    async def _units(self, address: str, plans: list[tuple[int, dict[bytes, int]]]) -> dict[int, _Units] | None:
        """The ``x`` of the shares the verifier at ``address`` holds under each of ``plans`` that
        it is a holder of (its key's place in :func:`overlay.directory.escrow.holders`), with the
        plan's threshold, by plan id; ``None`` when its key cannot be had now."""
        key = await self._key(address, {k for _, powers in plans for k in powers})
        if key is None:
            return None
        out = {}
        for pid, powers in plans:
            if key not in powers:
                continue
            try:
                order = [k for k, _ in escrow.holders(powers)]
                plan = escrow.plan_of(powers)
                out[pid] = (frozenset(escrow.holder_xs(plan, order.index(key))), plan.threshold)
            except (escrow.EscrowError, ValueError) as exc:
                self._failed(address, "the escrow's plan", exc)
        return out

    # ------------------------------------------------------------------ the steps

    async def _read(self, epoch: int, st: _Epoch) -> None:
        """Every verifier's next pages of ``epoch``'s released shares (of its own units only),
        into ``st``, under each remembered plan current in or after it."""
        plans = self._plans_of(epoch)
        for address in self.addresses:
            units = None if address in st.answered else await self._units(address, plans)
            if units is None:
                continue  # asked again at the next poll
            for pid, (xs, _) in units.items():
                st.owner.update({(pid, x): address for x in xs})
            for _ in range(MAX_PAGES):
                if address in st.answered:
                    break
                after = st.after.get(address, b"")
                try:
                    page = await self._query(address, wire.RELEASED_PATH, wire.released_query(epoch, after))
                    got, items = wire.decode_released(page)
                    if got != epoch:
                        raise ValueError(f"a page of epoch {got}, not {epoch}")
                    if items and items[0][0] <= after:
                        raise ValueError("a page that does not follow the one before")
                except QueryRefused as exc:
                    if exc.code != Code.TOO_EARLY:
                        self._failed(address, f"epoch {epoch}'s released shares refused", exc)
                    break  # too early: not yet; asked again at the next poll
                except (OSError, RpcError, trio.TooSlowError, ValueError, wire.TranscriptError) as exc:
                    self._failed(address, f"epoch {epoch}'s released shares", exc)
                    break
                if not items:
                    st.answered.add(address)
                    break
                self._take(st, address, units, items)
                st.after[address] = items[-1][0]
                if st.read[address] >= wire.MAX_RELEASED:
                    log.info("reveals: %s released over %d commitments of epoch %d; the rest are not read",
                             address, wire.MAX_RELEASED, epoch)
                    st.answered.add(address)

    def _take(self, st: _Epoch, address: str, units: dict[int, _Units], items: Sequence[wire.ReleasedItem]) -> None:
        """One page of ``address``'s release into ``st``: of each commitment, the shares of the
        verifier's own units under each plan whose threshold is its number of points, grouped by
        plan (at most :data:`~overlay.directory.transcripts.MAX_RELEASED` commitments a verifier an
        epoch)."""
        for value, points, shares in items:
            if st.read[address] >= wire.MAX_RELEASED:
                break
            st.read[address] += 1
            fits = {pid: xs for pid, (xs, t) in units.items() if t == len(points)}
            mine = {s for xs in fits.values() for s in shares if s.x in xs}
            self.counts["foreign shares"] += len(shares) - len(mine)
            for pid, xs in fits.items():
                key = (value, points, pid)
                own = [s for s in shares if s.x in xs]
                if own and value not in st.found and key not in st.settled:
                    st.shares.setdefault(key, []).extend(own)
                    st.sources.setdefault(key, set()).add(address)
                    st.fresh.add(key)

    async def _rebuild(self, st: _Epoch) -> None:
        """Each commitment given new shares (at most :attr:`max_rebuilds`, those more verifiers
        released first: one verifier's inventions come last; then in an order of this node's own,
        not by value, which a donor chooses): its secret rebuilt and the served request it commits
        to, by the locator the secret carries (decision 0038: a lookup, so a whole release fits in
        one poll). The rest wait for the next poll."""
        order = sorted(st.fresh, key=lambda k: (-len(st.sources.get(k, ())),
                                                crypto.blake2b(self._salt + k[0], size=16)))
        st.fresh = set(order[self.max_rebuilds:])
        for key in order[:self.max_rebuilds]:
            value, points, pid = key
            if value in st.found:
                continue
            try:
                secret = self._recover(st, points, st.shares[key], pid)
            except escrow.EscrowError:
                self.counts["unrebuilt"] += 1  # too few verified shares yet (or none will come)
                continue
            kept = self.store.find(secret, value)
            await trio.lowlevel.checkpoint()
            if kept is None:
                self.counts["unmatched"] += 1  # another node's request, or one no longer kept
                st.settled.add(key)
                del st.shares[key], st.sources[key]
                continue
            st.found[value] = kept.revealed(secret)
            for other in [k for k in st.shares if k[0] == value]:
                del st.shares[other], st.sources[other]

    def _recover(self, st: _Epoch, points: tuple[bytes, ...], shares: list[escrow.Share], pid: int) -> int:
        """The secret from ``shares`` (of plan ``pid``'s units) but those of verifiers caught lying
        this epoch. Where the first ``t`` do not open the points, each verifier's shares are
        checked in one batch and a verifier whose do not verify is a liar for the rest of the
        epoch: a colluding verifier that forges its shares of every released commitment costs the
        node one such check, not a share-by-share search per commitment (``t²`` multiplications:
        55 to 65 ms at ``t`` = 22, bench escrow), which over a release of 4,096 would outlast the
        polls before the close.
        :class:`~overlay.directory.escrow.EscrowError` when too few remain."""
        usable = [s for s in shares if st.owner.get((pid, s.x)) not in st.liars]
        try:
            return escrow.recover(points, usable, verify=False)
        except escrow.EscrowError:
            if len({s.x for s in usable}) < len(points):
                raise  # too few yet: no check to make
        by_source: dict[str, list[escrow.Share]] = {}
        for s in usable:
            by_source.setdefault(st.owner.get((pid, s.x), ""), []).append(s)
        for address, group in by_source.items():
            self.counts["share checks"] += 1
            if not escrow.verify_shares(points, group):
                st.liars.add(address)
                self.counts["lying verifiers"] += 1
                log.warning("reveals: %s released shares that do not lie on their points; its shares are not used "
                            "for the rest of this epoch", address)
        return escrow.recover(points, [s for s in usable if st.owner.get((pid, s.x)) not in st.liars], verify=False)

    async def _hand_in(self, epoch: int, st: _Epoch) -> None:
        """Each transcript found, sealed to every verifier that has not answered it yet (one
        sealed over :data:`~overlay.directory.transcripts.MAX_REVEAL_BYTES` goes to none)."""
        for address in self.addresses:
            wanting = [v for v in st.found if address not in st.taken.setdefault(v, set())]
            if not wanting:
                continue
            key = await self._key(address)
            if key is None:
                continue
            for value in wanting:
                sealed = wire.seal_node_reveal(key, self.identity.signing, self.identity.node_id, st.found[value])
                if len(sealed) > wire.MAX_REVEAL_BYTES:  # a verifier would refuse it: none is sent
                    self.counts["too large"] += 1
                    st.taken[value].update(self.addresses)
                    continue
                try:
                    await self._query(address, wire.NODE_REVEAL_PATH, sealed)
                    self.counts["handed"] += 1
                except QueryRefused as exc:
                    if exc.code == Code.DUPLICATE:
                        self.counts["duplicate"] += 1
                    else:
                        self.counts["refused"] += 1
                        log.info("reveals: %s refused the transcript of commitment %s (epoch %d): %s", address,
                                 value.hex()[:16], epoch, exc)
                except (OSError, RpcError, trio.TooSlowError) as exc:
                    self._failed(address, "a node reveal", exc)
                    break  # this verifier again at the next poll
                st.taken[value].add(address)

    def _finished(self, st: _Epoch) -> bool:
        everyone = set(self.addresses)
        return not st.fresh and st.answered >= everyone and all(st.taken.get(v, set()) >= everyone for v in st.found)
