"""The model node's side of decision 0037 (model_node/reveals.py over model_node/served.py) against
four real verifiers (verifier/abci_app.py's queries, tests/unit/test_escrow_intake.py's committee):
a framer escrows two requests to the node, reveals only the bad reply and withholds the good one.
The node's store holds what it served; its reveal driver, polling the verifiers' RPC, gets the
released shares once epoch + 1 is eleven minutes old (a reply window and a minute), rebuilds the secret, finds the good request and
hands its transcript to every verifier, whose books then count it. Before the release it hands in
nothing and asks again; a verifier that is down does not stop it."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import msgpack
import pytest
import trio

from model_node.reveals import EPOCHS, MAX_PLANS, PLANS_FILE, Reveals, decode_plans, encode_plans
from model_node.served import ServedStore
from overlay.anon import signing
from overlay.directory import escrow
from overlay.directory import transcripts as wire
from overlay.directory.donation import KEY_PATH
from overlay.wire import crypto
from overlay.wire.messages import ReplyChunk, Request
from tests.unit.test_escrow_intake import CHAIN, KEYS, MODEL, NOW_MS, Donated, donate
from tests.unit.test_escrow_intake import Committee as Books
from verifier import quorum
from verifier.abci_app import CommitteeAbciApp
from verifier.audit.escrow_intake import RELEASE_DELAY_MS
from verifier.audit.pool import DonationPool

ADDRESSES = [f"verifier-{i}:26657" for i in range(4)]
VALIDATORS = {k.public_bytes: 10 for k in KEYS}  # the committee the node trusts, with powers


class Committee(Books):
    """The four verifiers as ``--audit`` runs them: with a donation pool too, so that each answers
    ``/audit/donate_key`` (the key a node reveal is sealed to)."""

    def __init__(self, reply_window_s: int | None = None) -> None:
        super().__init__(reply_window_s)
        self.apps = [CommitteeAbciApp(self.core, None, k, pool=DonationPool(), transcripts=b, clock=self.clock)
                     for k, b in zip(KEYS, self.books, strict=True)]


class Rpc:
    """The verifiers' CometBFT RPC, answered by the committee's apps; ``down``: addresses that
    raise ``OSError``. ``calls``: (address, path) of every query answered."""

    def __init__(self, w: Committee) -> None:
        self.w = w
        self.down: set[str] = set()
        self.junk: set[str] = set()  # addresses whose released pages carry altered shares
        self.made_up = False  # ... and points of their own making
        self.invented: set[str] = set()  # addresses whose pages add a commitment of their own, every unit's shares
        self.invented_plan: escrow.Plan | None = None  # ... dealt under this plan (None: the committee's)
        self.foreign_key: set[str] = set()  # addresses that answer a key outside the committee
        self.window: dict[str, int] = {}  # addresses whose /audit claims this reply window
        self.calls: list[tuple[str, str]] = []

    async def __call__(self, address: str, method: str, params: dict[str, str]) -> Any:
        assert method == "abci_query"
        if address in self.down:
            raise OSError(f"{address} is down")
        path = params["path"].strip('"')
        data = bytes.fromhex(params.get("data", "0x")[2:])
        self.calls.append((address, path))
        code, why, value = self.w.query(ADDRESSES.index(address), path, data)
        if address in self.window and path == "/audit":
            value = msgpack.packb({**msgpack.unpackb(value), "reply_window_s": self.window[address]})
        if address in self.foreign_key and path == KEY_PATH:
            value = crypto.SigningKey.from_bytes(b"\x77" * 32).public_bytes
        if address in self.invented and path == wire.RELEASED_PATH and code == 0:
            epoch, items = wire.decode_released(value)
            if not items:  # the last page: one made-up commitment, all its units' shares on its own points
                deal = escrow.deal(escrow.new_secret(), self.invented_plan or self.w.plan)
                value = wire.encode_released(epoch, [(b"\xff" * 32, deal.commitments,
                                                      tuple(x for held in deal.shares for x in held)[:64])])
        if address in self.junk and path == wire.RELEASED_PATH and code == 0:
            epoch, items = wire.decode_released(value)
            fake = escrow.deal(escrow.new_secret(), self.w.plan).commitments
            value = wire.encode_released(epoch, [(v, fake if self.made_up else pts,
                                                  tuple(escrow.Share(x.x, (x.y + 1) % escrow.L) for x in got))
                                                 for v, pts, got in items])
        return {"response": {"code": code, "log": why, "value": base64.b64encode(value).decode()}}


def served_by_node(w: Committee, store: ServedStore, d: Donated) -> None:
    """The node serves ``d``'s request and its store keeps the reply as it went out."""
    req = Request(request_id=d.rid, model=MODEL, messages=d.msgs, params=d.params, k=3, return_paths=(),
                  continuation="")
    body = d.served()
    rec = store.begin(req, w.node.node_id)
    assert rec is not None
    (text, ids), = body.chunks
    kept = rec.add(ReplyChunk(request_id=d.rid, seq=0, text=text, token_ids=ids, done=True, error="",
                              node=w.node.node_id, chain=signing.chain_next(signing.chain_start(d.digest), text, ids),
                              signature=body.signature, signed_at_ms=body.signed_at_ms))
    assert kept is not None and kept.digest == d.digest
    store.keep(kept, int(w.clock.unix() * 1000))


def framed(w: Committee) -> tuple[int, ServedStore, Reveals, Rpc]:
    """Two escrowed requests to the node, both served and kept; the donor reveals only the bad reply."""
    epoch = w.epoch
    good, bad = donate(w, "good"), donate(w, "bad")
    store = ServedStore()
    for d in (good, bad):
        served_by_node(w, store, d)
    for i, k in enumerate(KEYS):
        sealed = wire.seal_reveal(k.public_bytes, w.donor, w.donor.node_id, bad.served())
        assert w.query(i, wire.REVEAL_PATH, sealed)[0] == 0
    rpc = Rpc(w)
    return epoch, store, Reveals(ADDRESSES, lambda: VALIDATORS, w.node, store, rpc=rpc, clock=w.clock), rpc


async def through_the_release(w: Committee, reveals: Reveals) -> None:
    """Epoch + 1 begins (a poll: too early at every verifier), then the release is due (a poll)."""
    w.next_epoch()
    await reveals.step()
    w.clock.advance(RELEASE_DELAY_MS / 1000)
    await reveals.step()


def counted(w: Committee, i: int, epoch: int) -> list[str]:
    return sorted(c.transcript.reply.chunks[0][0] for c in w.books[i].close(epoch))


async def test_a_withheld_good_reply_is_handed_in_by_the_node_after_the_release() -> None:
    w = Committee()
    epoch, store, reveals, rpc = framed(w)
    w.next_epoch()
    await reveals.step()  # epoch + 1 has just begun: every verifier answers TOO_EARLY
    assert reveals.counts["handed"] == 0 and epoch not in reveals.done
    assert not [c for c in rpc.calls if c[1] == wire.NODE_REVEAL_PATH]
    assert {a for a, p in rpc.calls if p == wire.RELEASED_PATH} == set(ADDRESSES)
    w.clock.advance(RELEASE_DELAY_MS / 1000)
    await reveals.step()
    assert reveals.counts["handed"] == 4 and reveals.counts["refused"] == 0 and epoch in reveals.done
    assert len(store) == 2  # the store keeps both: it never learns which reply the donor revealed
    for i in range(4):
        assert counted(w, i, epoch) == ["bad", "good"]
    # done: the next poll asks for no page of it
    before = len(rpc.calls)
    await reveals.step()
    assert all(p == "/audit" for _, p in rpc.calls[before:])


async def test_on_a_chain_with_a_short_reply_window_the_release_and_the_polls_come_sooner() -> None:
    """Decision 0040: a chain whose genesis sets a 20-s reply window releases 40 s into epoch + 1
    (the window and as long again), and the node, reading the window from ``/audit``, polls every
    2 s: it hands the withheld good reply in within the first 84 blocks of a 100-block epoch, before
    the close. At the default window the same framing would stand for 11 minutes."""
    w = Committee(reply_window_s=20)
    epoch, _, reveals, _ = framed(w)
    assert reveals.poll == wire.node_poll_s(wire.DEFAULT_REPLY_WINDOW_S) == 60.0  # before it asked
    w.next_epoch()
    await reveals.step()
    assert reveals.window_s == 20 and reveals.poll == 2.0 and reveals.counts["handed"] == 0
    w.clock.advance(39)
    await reveals.step()
    assert reveals.counts["handed"] == 0 and epoch not in reveals.done  # too early at every verifier
    w.clock.advance(1)
    await reveals.step()
    assert reveals.counts["handed"] == 4 and epoch in reveals.done
    for i in range(4):
        assert counted(w, i, epoch) == ["bad", "good"]


async def test_a_verifier_cannot_stretch_the_nodes_polls_alone() -> None:
    """The window is the lower median of the verifiers' ``/audit`` answers: one verifier claiming the
    longest window does not slow the node's polls down, and one out of range is not taken."""
    w = Committee(reply_window_s=20)
    _, _, reveals, rpc = framed(w)
    rpc.window = {ADDRESSES[0]: wire.MAX_REPLY_WINDOW_S, ADDRESSES[1]: 10**6}
    await reveals.step()
    assert reveals.window_s == 20 and reveals.poll == 2.0


def change_power(w: Committee, key: bytes, power: int) -> None:
    """A committee change (``gentorrent verifier change``) every validator approved, in a block."""
    seq = w.core.committed.change_seq + 1
    tx = quorum.make_change(seq, key, power, [quorum.approve(k, CHAIN, seq, key, power) for k in KEYS])
    h = w.core.height + 1
    results, _ = w.core.finalize_block(h, 1_700_000_000 + h, [tx], h.to_bytes(32, "big"))
    assert all(r.ok for r in results), results
    w.core.commit()


async def test_a_change_of_the_validator_set_before_the_release_does_not_keep_the_reply_out() -> None:
    """The framer's commitments were dealt under the set of its epoch; before the release, a
    committee change moves the verifiers' units (the third holder's power 10 to 1), and the node's
    membership gives the new set. The node remembers the set it polled under in the framer's epoch
    and rebuilds the secret under it. Fails when the node reads shares under the current set only:
    of the units each verifier released, too few are still its own under the new plan."""
    w = Committee()
    epoch, _, reveals, _ = framed(w)
    powers = dict(VALIDATORS)
    reveals.validators = lambda: powers
    await reveals.step()  # a poll in the framer's epoch: the set as it is
    third = sorted(powers)[2]
    change_power(w, third, 1)
    powers[third] = 1
    assert dict(w.core.committed.validator_powers()) == powers
    old, new = escrow.plan_of(VALIDATORS), escrow.plan_of(powers)
    still = sum(len(set(escrow.holder_xs(old, i)) & set(escrow.holder_xs(new, i))) for i in range(4))
    assert still < old.threshold  # what the current set alone would keep of every release
    await through_the_release(w, reveals)
    assert reveals.counts["handed"] == 4 and epoch in reveals.done
    for i in range(4):
        assert counted(w, i, epoch) == ["bad", "good"]
    assert len(reveals.plans) == 2


@pytest.mark.parametrize("kept", [True, False])
async def test_a_node_restarted_across_a_change_still_reads_under_the_set_before_it(tmp_path: Path, kept: bool) -> None:
    """As above, but the node restarts after the change: the new process's membership gives the new
    set only. The set of the framer's epoch, written at the poll before, is read back, and the
    withheld reply counts. Without the file (the control) it does not: too few shares are the
    verifiers' own under the new plan."""
    w = Committee()
    epoch, store, before, rpc = framed(w)
    plans_file = tmp_path / PLANS_FILE
    before = Reveals(ADDRESSES, lambda: VALIDATORS, w.node, store, rpc=rpc, clock=w.clock, plans_file=plans_file)
    await before.step()  # a poll in the framer's epoch: the set as it is, written
    third = sorted(VALIDATORS)[2]
    change_power(w, third, 1)
    powers = {**VALIDATORS, third: 1}
    if not kept:
        plans_file.unlink()
    after = Reveals(ADDRESSES, lambda: powers, w.node, store, rpc=rpc, clock=w.clock, plans_file=plans_file)
    await through_the_release(w, after)
    assert (after.counts["handed"] == 4) is kept
    for i in range(4):
        assert counted(w, i, epoch) == (["bad", "good"] if kept else [])  # the set void without it
    assert sorted(p for p, _ in decode_plans(plans_file.read_bytes())) == sorted(
        [tuple(sorted(VALIDATORS.items())), tuple(sorted(powers.items()))][0 if kept else 1:])


@pytest.mark.parametrize("raw", [b"", b"\xc1", encode_plans([((( b"\x01" * 31, 10),), 3)]),
                                 encode_plans([(((b"\x02" * 32, 10), (b"\x01" * 32, 10)), 3)]),
                                 encode_plans([(((b"\x01" * 32, 0),), 3)]),
                                 encode_plans([(((b"\x01" * 32, 10),), 3)] * (MAX_PLANS + 1))])
async def test_a_plans_file_that_does_not_decode_is_replaced_and_the_node_goes_on(tmp_path: Path, raw: bytes,
                                                                                caplog: pytest.LogCaptureFixture) -> None:
    w = Committee()
    _, store, _, rpc = framed(w)
    plans_file = tmp_path / PLANS_FILE
    plans_file.write_bytes(raw)
    reveals = Reveals(ADDRESSES, lambda: VALIDATORS, w.node, store, rpc=rpc, clock=w.clock, plans_file=plans_file)
    assert reveals.plans == {} and "does not decode" in caplog.text
    await reveals.step()
    assert decode_plans(plans_file.read_bytes()) == [(tuple(sorted(VALIDATORS.items())), w.epoch)]


async def test_a_set_the_node_no_longer_reads_under_is_forgotten() -> None:
    w = Committee()
    _, _, reveals, _ = framed(w)
    powers = dict(VALIDATORS)
    reveals.validators = lambda: powers
    for power in range(11, 11 + MAX_PLANS + 1):  # more sets than it keeps, each at a poll
        powers[min(powers)] = power
        await reveals.step()
    assert len(reveals.plans) == MAX_PLANS and tuple(sorted(powers.items())) in reveals.plans
    for _ in range(EPOCHS + 1):
        w.next_epoch()
    await reveals.step()
    assert list(reveals.plans) == [tuple(sorted(powers.items()))]  # only the set current in the epochs it reads


async def test_without_the_node_the_withheld_reply_does_not_count() -> None:
    w = Committee()  # the control: the same framing, no driver
    epoch, _, _, _ = framed(w)
    w.next_epoch()
    w.clock.advance(RELEASE_DELAY_MS / 1000)
    assert counted(w, 0, epoch) == []  # the set is void without the good reply


async def test_one_verifier_down_does_not_stop_the_others_and_it_is_served_once_back() -> None:
    w = Committee()
    epoch, _, reveals, rpc = framed(w)
    rpc.down.add(ADDRESSES[3])
    await through_the_release(w, reveals)  # three verifiers' shares rebuild the secret; three take the transcript
    assert reveals.counts["handed"] == 3 and epoch not in reveals.done
    for i in range(3):
        assert counted(w, i, epoch) == ["bad", "good"]
    rpc.down.clear()
    await reveals.step()  # verifier 3 is back: it takes the transcript; its release is not due on its clock yet
    assert reveals.counts["handed"] == 4 and epoch not in reveals.done
    assert counted(w, 3, epoch) == ["bad", "good"]
    w.clock.advance(RELEASE_DELAY_MS / 1000)
    await reveals.step()  # its pages read (nothing more to rebuild): the epoch is done
    assert epoch in reveals.done and reveals.counts["handed"] == 4


@pytest.mark.parametrize("made_up", [False, True])
async def test_a_verifier_releasing_junk_does_not_stop_the_node(made_up: bool) -> None:
    w = Committee()
    epoch, _, reveals, rpc = framed(w)
    rpc.junk.add(ADDRESSES[0])  # its shares do not lie on the points (or on points of its own making)
    rpc.made_up = made_up
    await through_the_release(w, reveals)
    assert reveals.counts["handed"] == 4 and epoch in reveals.done
    for i in range(4):
        assert counted(w, i, epoch) == ["bad", "good"]


async def test_a_node_that_kept_none_of_them_hands_nothing_in() -> None:
    w = Committee()
    epoch, _, _, rpc = framed(w)
    reveals = Reveals(ADDRESSES, lambda: VALIDATORS, w.node, ServedStore(), rpc=rpc, clock=w.clock)
    await through_the_release(w, reveals)  # the good reply's commitment is released and rebuilt, but matches nothing kept
    assert reveals.counts["unmatched"] == 1 and reveals.counts["handed"] == 0 and epoch in reveals.done
    assert counted(w, 0, epoch) == []


async def test_a_verifier_whose_key_is_not_the_committees_gets_no_transcript() -> None:
    w = Committee()
    epoch, store, _, rpc = framed(w)
    rpc.foreign_key.add(ADDRESSES[1])
    reveals = Reveals(ADDRESSES, lambda: VALIDATORS, w.node, store, rpc=rpc, clock=w.clock)
    await through_the_release(w, reveals)
    assert reveals.counts["handed"] == 3 and epoch not in reveals.done
    assert not [c for c in rpc.calls if c == (ADDRESSES[1], wire.NODE_REVEAL_PATH)]
    assert counted(w, 0, epoch) == ["bad", "good"] and counted(w, 1, epoch) == []


async def test_the_loop_polls_on_trios_clock_and_survives_failures(autojump_clock: trio.testing.MockClock) -> None:
    w = Committee()
    epoch, _, reveals, rpc = framed(w)
    rpc.down.update(ADDRESSES)  # nobody answers at first
    w.next_epoch()
    async with trio.open_nursery() as nursery:
        await nursery.start(reveals.run)
        await trio.sleep(reveals.poll * 2.5)
        assert reveals.counts["errors"] >= 8 and reveals.counts["handed"] == 0
        rpc.down.clear()
        await trio.sleep(reveals.poll)  # a poll: TOO_EARLY everywhere
        w.clock.advance(RELEASE_DELAY_MS / 1000)
        await trio.sleep(reveals.poll)
        assert reveals.counts["handed"] == 4 and epoch in reveals.done
        nursery.cancel_scope.cancel()


async def test_the_member_a_request_was_forwarded_to_hands_in_the_reply_it_signed() -> None:
    """A user's request the addressed node forwarded is answered straight to the user's proxies: the
    member that served it keeps it (under the node addressed) and its own driver hands it in."""
    w = Committee()
    epoch = w.epoch
    d = donate(w, "good")
    req = Request(request_id=d.rid, model=MODEL, messages=d.msgs, params=d.params, k=3, return_paths=(),
                  continuation="")
    body = d.served(by=w.other)
    member_store = ServedStore()
    rec = member_store.begin(req, w.node.node_id)  # forwarded in by the node addressed
    assert rec is not None
    (text, ids), = body.chunks
    kept = rec.add(ReplyChunk(request_id=d.rid, seq=0, text=text, token_ids=ids, done=True, error="",
                              node=w.other.node_id, chain=signing.chain_next(signing.chain_start(d.digest), text, ids),
                              signature=body.signature, signed_at_ms=body.signed_at_ms))
    assert kept is not None
    member_store.keep(kept, int(w.clock.unix() * 1000))
    rpc = Rpc(w)
    member = Reveals(ADDRESSES, lambda: VALIDATORS, w.other, member_store, rpc=rpc, clock=w.clock)
    w.next_epoch()
    await member.step()
    w.clock.advance(RELEASE_DELAY_MS / 1000)
    await member.step()
    assert member.counts["handed"] == 4
    for book in w.books:
        (c,) = book.close(epoch)
        assert c.node_id == w.other.node_id and c.transcript.reply.chunks[0][0] == "good"


@pytest.mark.parametrize("degree", ["the plan's", "its units'"])
async def test_a_colluding_verifier_cannot_make_the_node_rebuild_a_commitment_of_its_own(degree: str) -> None:
    """One verifier (a quarter of the power) adds to its release a commitment it made up, with
    every unit's shares on points of its own: were they taken, the node would rebuild it and scan
    its whole store for it, as often as the verifier likes, at no cost to it. The node takes of
    each verifier's shares only those of its own units, fewer than the threshold; and only of
    commitments with the plan's number of points, so a lower degree, as many points as the
    verifier has units, does not do either (fails without that check)."""
    w = Committee()
    epoch, _, reveals, rpc = framed(w)
    rpc.invented.add(ADDRESSES[2])
    if degree != "the plan's":
        rpc.invented_plan = escrow.Plan(w.plan.counts, w.plan.counts[2])
    await through_the_release(w, reveals)
    assert reveals.counts["handed"] == 4 and reveals.counts["unmatched"] == 0  # the good reply; nothing made up
    # every unit but verifier 2's own eight; of a lower degree, every one
    assert reveals.counts["foreign shares"] == (32 - 8 if degree == "the plan's" else 32)
    assert counted(w, 0, epoch) == ["bad", "good"]


async def test_a_colluders_units_under_two_sets_together_do_not_rebuild_a_commitment_of_its_own() -> None:
    """Two committee changes in one epoch leave the node reading its release under two sets with
    the same threshold, 8: powers (4, 5, 5, 10) and then (4, 5, 5, 9), by key. The second holder
    (a fifth of the power) has 7 units under each, but 8 distinct ones under both together (x 6 to
    12, then 7 to 13). Its made-up commitment of degree 7, with shares on all of them, is not
    rebuilt: the node groups shares by set. It is when the node pools them (decision 0042). (The
    fake colluder's pages do not follow one another after the made-up one, so the epoch is not
    done here.)"""
    w = Committee()
    epoch = w.epoch
    order = sorted(VALIDATORS)
    powers = dict(VALIDATORS)
    reveals = Reveals(ADDRESSES, lambda: powers, w.node, ServedStore(), rpc=Rpc(w), clock=w.clock)
    for key, power in zip(order, (4, 5, 5), strict=False):
        change_power(w, key, power)
        powers[key] = power
    await reveals.step()  # the first set, at a poll of the epoch
    change_power(w, order[3], 9)
    powers[order[3]] = 9
    assert w.epoch == epoch and dict(w.core.committed.validator_powers()) == powers
    first, second = escrow.plan_of({**powers, order[3]: 10}), escrow.plan_of(powers)
    assert first.threshold == second.threshold == 8
    assert len(escrow.holder_xs(first, 1)) == len(escrow.holder_xs(second, 1)) == 7
    assert len(set(escrow.holder_xs(first, 1)) | set(escrow.holder_xs(second, 1))) == 8
    colluder = ADDRESSES[[k.public_bytes for k in KEYS].index(order[1])]
    rpc = reveals.rpc
    assert isinstance(rpc, Rpc)
    rpc.invented.add(colluder)
    rpc.invented_plan = second
    await through_the_release(w, reveals)
    assert len(reveals.plans) == 2 and epoch in reveals.epochs
    assert reveals.counts["foreign shares"] == 32 - 8  # its 8 units' shares taken, 7 under each set
    assert reveals.counts["unrebuilt"] == 2 and reveals.counts["unmatched"] == 0  # too few under either: no lookup


def withhold_junk(w: Committee, epoch: int, n: int) -> None:
    """``n`` junk certified commitments at every verifier, withheld, their values below the
    framer's withheld one (one deal for all: the points and shares are real, the requests never
    sent), from donors of 16 each."""
    (good,) = [v for v, _, _ in w.books[0].released(epoch)]
    deal = escrow.deal(wire.escrowed_secret(bytes(32)), w.plan)
    points = escrow.encode_commitments(deal.commitments)
    junk = [bytes(2) + crypto.random_bytes(30) for _ in range(n)]
    assert all(v < good for v in junk)
    for i, (k, book) in enumerate(zip(KEYS, w.books, strict=True)):
        mine = deal.shares[w.order.index(k.public_bytes)]
        for j, value in enumerate(junk):
            donor = (j // 16 + 1).to_bytes(20, "big")
            assert book.hold(donor, value, points, mine, epoch, NOW_MS) is None, i
            assert book.certify(donor, value, points, epoch, NOW_MS) is None, i


async def test_junk_released_before_the_framers_commitment_does_not_use_up_the_nodes_time() -> None:
    """The framer withholds, beside its good reply, 600 junk certified commitments whose values sort
    below the good one's (their values are free: nobody asks them). The node has from the release
    (11 minutes into epoch + 1) to the close (about 14.7) for its reveals: a few polls. It used to
    rebuild at most 512 an epoch a poll, lowest value first, so 512 junk a poll pushed the good one
    past the close. With the lookup (decision 0038) it rebuilds a verifier's whole release in one
    poll, in an order of its own that no donor can predict: the good one is handed in at the
    first poll after the release."""
    w = Committee()
    epoch, _, reveals, _ = framed(w)
    withhold_junk(w, epoch, 600)
    await through_the_release(w, reveals)
    assert reveals.counts["handed"] == 4 and reveals.counts["unmatched"] == 600
    for i in range(4):
        assert counted(w, i, epoch) == ["bad", "good"]


def test_where_a_poll_cannot_rebuild_all_it_does_not_take_them_in_an_order_a_donor_chooses() -> None:
    """Past the cap of one poll (a union of verifiers' releases can be), the rebuilds come in an
    order of the node's own: not the lowest values first (a donor chooses its values), and not
    one every node shares (a donor could grind values that come first everywhere)."""
    from model_node.reveals import _Epoch

    points = escrow.deal(wire.escrowed_secret(bytes(32)), escrow.plan_of(VALIDATORS)).commitments
    keys = [(crypto.random_bytes(32), points, 0) for _ in range(600)]
    taken = []
    for _ in range(2):
        node = Reveals(ADDRESSES, lambda: VALIDATORS, Committee().node, ServedStore(), max_rebuilds=100)
        st = _Epoch()
        for k in keys:
            st.shares[k], st.sources[k] = [], {ADDRESSES[0]}  # too few shares: each rebuild fails at once
            st.fresh.add(k)
        trio.run(node._rebuild, st)
        assert len(st.fresh) == 500 and node.counts["unrebuilt"] == 100
        taken.append({k for k in keys if k not in st.fresh})
    assert taken[0] != {k for k in sorted(keys)[:100]} != taken[1]  # not the lowest values
    assert taken[0] != taken[1]  # nor the same at every node


async def test_a_verifier_forging_every_share_costs_the_node_one_check_not_one_per_commitment() -> None:
    """A colluding verifier (read first) forges its shares of every released commitment, 80 junk
    and the framer's. Its shares come first, so the first ``t`` never open the points; the node
    checks each verifier's shares once, finds it out, and rebuilds every other commitment
    without it (a share-by-share search each would cost ``t²`` multiplications: 4,096 of them at
    ``t`` = 22 outlast the polls before the close)."""
    w = Committee()
    epoch, _, reveals, rpc = framed(w)
    withhold_junk(w, epoch, 80)
    rpc.junk.add(ADDRESSES[0])
    await through_the_release(w, reveals)
    assert reveals.counts["lying verifiers"] == 1 and reveals.counts["share checks"] == 4
    assert reveals.counts["handed"] == 4 and reveals.counts["unmatched"] == 80
    for i in range(4):
        assert counted(w, i, epoch) == ["bad", "good"]
