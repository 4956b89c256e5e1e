"""Escrowed commitments in the book of users' transcripts (verifier/audit/transcripts.py, rules 10
and 11; decision 0037): each test plays a framer who wants its counted sample of an honest node's
replies to be worse than the node's replies are, with everything the code and docs tell it, and
fails if the framer gets its way; and a node that signs two replies to one request."""

from __future__ import annotations

import os
import random

import msgpack
import pytest

from overlay.anon import signing
from overlay.directory import escrow
from overlay.directory import transcripts as wire
from tests.unit.test_transcript_book_persistence import forge
from tests.unit.test_transcripts import HONEST, T0_MS, Node, key_of, request
from verifier.audit import transcripts as tr

POWERS = [10, 10, 10, 10]  # this verifier is holder 0; one colluder (holder 3) holds a quarter
PLAN = escrow.plan(POWERS)
ME, COLLUDER = 0, 3
EPOCH = 5


class Committed:
    """A request an escrowed donor committed to, and everything it knows of it."""

    def __init__(self, node: Node, text: str, rng: random.Random, *, other_nonce: bool = False,
                 locator: bool = True) -> None:
        self.opening, self.request_id = request(f"question {text}")
        self.digest = signing.request_digest(self.opening.request(self.request_id), node.node_id)
        self.secret = wire.escrowed_secret(self.digest, rng) if locator else escrow.new_secret(rng)
        self.deal = escrow.deal(self.secret, PLAN, rng)
        self.points_raw = escrow.encode_commitments(self.deal.commitments)
        nonce = os.urandom(16) if other_nonce else escrow.nonce_of(self.secret)
        self.value = tr.commitment(nonce, node.node_id, self.digest)
        self.node, self.text, self.nonce = node, text, nonce

    def transcript(self, reply_at: int) -> tr.Transcript:
        reply = self.node.answer(self.opening, self.request_id, self.text, reply_at)
        return tr.Transcript(self.node.node_id, self.nonce, self.opening, self.request_id, reply,
                             escrow.scalar_bytes(self.secret))


class EscrowDonor:
    """A donor's client under decision 0037: escrow, commit to every verifier (this book is one),
    certificate, then the request; the reveals are its choice."""

    def __init__(self, book: tr.TranscriptBook, seed: int = 1) -> None:
        self.book, self.id, self.rng = book, os.urandom(20), random.Random(seed)

    def commit(self, node: Node, text: str, *, certify: bool = True, other_nonce: bool = False,
               locator: bool = True, at: int = T0_MS) -> Committed:
        c = Committed(node, text, self.rng, other_nonce=other_nonce, locator=locator)
        mine = c.deal.shares[ME]
        assert escrow.verify_holder(PLAN, ME, c.deal.commitments, mine)  # what the intake checks
        assert self.book.hold(self.id, c.value, c.points_raw, mine, EPOCH, at) is None
        if certify:
            assert self.book.certify(self.id, c.value, c.points_raw, EPOCH, at + 200) is None
        return c

    def reveal(self, t: tr.Transcript) -> str | None:
        return self.book.reveal(self.id, t, key_of)


class HonestNode:
    """The node's side (decision 0037, 5 and 6): it keeps what it served, and after the release
    rebuilds each secret from the shares the verifiers released and hands in what it served."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.served: dict[bytes, tr.Transcript] = {}  # request digest -> what it served (signed)

    def serve(self, c: Committed, reply_at: int) -> tr.Transcript:
        t = c.transcript(reply_at)
        self.served[c.digest] = t
        return t

    def reveal_withheld(self, book: tr.TranscriptBook, deals: dict[bytes, escrow.Deal],
                        *, holders: tuple[int, ...] = (0, 1, 2, 3), forged_by: int | None = None) -> list[str | None]:
        """For each commitment ``book`` released: the shares every holder in ``holders`` released
        (this book's as it released them, the others' from ``deals``, what the other verifiers would
        answer; ``forged_by`` releases junk), the secret rebuilt, the commitment matched against
        the stored requests of the locator the secret carries (decision 0038), the stored
        transcript handed in."""
        answers = []
        for value, points_raw, mine in book.released(EPOCH):
            points = escrow.decode_commitments(points_raw, escrow.MAX_UNITS)
            shares = list(mine)
            for h in holders:
                if h == ME:
                    continue
                theirs = deals[value].shares[h]
                if h == forged_by:
                    theirs = tuple(escrow.Share(s.x, (s.y + 1) % escrow.L) for s in theirs)
                shares.extend(theirs)
            secret = escrow.recover(points, shares)
            nonce = escrow.nonce_of(secret)
            for digest, t in self.served.items():
                if wire.locator(digest) == wire.secret_locator(secret) \
                        and tr.commitment(nonce, self.node.node_id, digest) == value:
                    answers.append(book.node_reveal(t, key_of))
        return answers


def bad(t: tr.Transcript) -> bool:
    return t.reply.chunks[0][0].startswith("bad")


def test_a_framer_who_withholds_the_good_replies_gets_them_counted_by_the_node() -> None:
    book = tr.TranscriptBook()
    framer, node = EscrowDonor(book), HonestNode(HONEST)
    texts = ["good 0", "bad 1", "good 2", "bad 3", "good 4"]
    committed = [framer.commit(HONEST, x) for x in texts]
    sent = [node.serve(c, T0_MS + 900 + i) for i, c in enumerate(committed)]
    for t in sent:
        if bad(t):
            assert framer.reveal(t) is None
    # without the node, the set counts for nothing, as before decision 0037
    released = book.released(EPOCH)
    assert [v for v, _, _ in released] == [c.value for c in committed if not c.text.startswith("bad")]
    # the node rebuilds the withheld secrets from honest holders' shares, a colluder withholding its own
    deals = {c.value: c.deal for c in committed}
    assert node.reveal_withheld(book, deals, holders=(0, 1, 2)) == [None] * 3
    counted = book.close(EPOCH)
    assert sorted(c.transcript.reply.chunks[0][0] for c in counted) == sorted(texts[:tr.MAX_PER_NODE])
    assert book.history[framer.id] == (0, 1)  # withholding still costs the framer a void set


def test_a_colluding_holder_that_releases_junk_cannot_stop_the_node() -> None:
    book = tr.TranscriptBook()
    framer, node = EscrowDonor(book, seed=2), HonestNode(HONEST)
    good, worse = framer.commit(HONEST, "good"), framer.commit(HONEST, "bad")
    node.serve(good, T0_MS + 900)
    assert framer.reveal(node.serve(worse, T0_MS + 950)) is None
    assert node.reveal_withheld(book, {good.value: good.deal}, forged_by=COLLUDER) == [None]
    assert sorted(c.transcript.reply.chunks[0][0] for c in book.close(EPOCH)) == ["bad", "good"]


def test_the_framer_gains_nothing_over_many_epochs_of_withholding() -> None:
    """Without the node's side a framer's revealed replies would be its worst; with it, the sample
    counted is every reply it committed to, whatever it reveals."""
    rng = random.Random(3)
    counted_bad = counted = committed_bad = 0
    for epoch_seed in range(20):
        book = tr.TranscriptBook()
        framer, node = EscrowDonor(book, seed=100 + epoch_seed), HonestNode(HONEST)
        committed = [framer.commit(HONEST, "bad" if rng.random() < 0.25 else "good") for _ in range(4)]
        committed_bad += sum(c.text == "bad" for c in committed)
        for i, c in enumerate(committed):
            t = node.serve(c, T0_MS + 900 + i)
            if bad(t):
                assert framer.reveal(t) is None
        node.reveal_withheld(book, {c.value: c.deal for c in committed})
        got = book.close(EPOCH)
        assert len(got) == len(committed)
        counted += len(got)
        counted_bad += sum(bad(c.transcript) for c in got)
    assert counted == 80 and counted_bad == committed_bad < counted  # every reply, as often bad as they were


def test_a_commitment_under_another_nonce_than_the_escrowed_one_never_counts() -> None:
    book = tr.TranscriptBook()
    framer = EscrowDonor(book)
    c = framer.commit(HONEST, "bad", other_nonce=True)
    t = c.transcript(T0_MS + 900)
    assert (framer.reveal(t) or "").startswith("escrowed")  # its nonce opens the commitment, not the escrow
    assert book.close(EPOCH) == [] and book.history[framer.id] == (0, 1)


def test_a_secret_without_its_requests_locator_never_counts_whatever_the_reply() -> None:
    """Decision 0038: the node finds a withheld request by the locator in the secret's low bits.
    A framer that deals a secret without it, so that the node cannot find a good reply it
    withholds, cannot get a bad one counted either: settled before the reply, whichever it gets."""
    book = tr.TranscriptBook()
    framer, node = EscrowDonor(book), HonestNode(HONEST)
    bad_one, good_one = framer.commit(HONEST, "bad", locator=False), framer.commit(HONEST, "good", locator=False)
    assert wire.secret_locator(bad_one.secret) != wire.locator(bad_one.digest)
    assert (framer.reveal(node.serve(bad_one, T0_MS + 900)) or "").endswith("locator (decision 0038)")
    node.serve(good_one, T0_MS + 950)
    deals = {c.value: c.deal for c in (bad_one, good_one)}
    assert node.reveal_withheld(book, deals) == []  # the node finds neither by its locator
    assert sorted(v for v, _, _ in book.released(EPOCH)) == sorted([bad_one.value, good_one.value])
    assert book.close(EPOCH) == [] and book.history[framer.id] == (0, 1)  # nothing counted; a void set
    # and the book checks it of a node's reveal too: the rebuilt secret must carry the locator
    book2 = tr.TranscriptBook()
    lone = EscrowDonor(book2).commit(HONEST, "good", locator=False)
    assert (book2.node_reveal(lone.transcript(T0_MS + 900), key_of) or "").endswith("locator (decision 0038)")


def test_a_commitment_without_a_certificate_counts_for_nothing_and_costs_nothing() -> None:
    book = tr.TranscriptBook()
    donor = EscrowDonor(book)
    c = donor.commit(HONEST, "bad", certify=False)
    t = c.transcript(T0_MS + 900)
    assert (donor.reveal(t) or "").startswith("uncertified")
    assert (book.no_reply(donor.id, c.value) or "").startswith("uncertified")
    assert (book.node_reveal(t, key_of) or "").startswith("unknown")
    # released all the same (decision 0039): where the donor certified it elsewhere, the node it
    # went to rebuilds the secret from every acceptor's shares and hands the reply in there
    assert [v for v, _, _ in book.released(EPOCH)] == [c.value]
    assert book.close(EPOCH) == [] and donor.id not in book.history


def test_the_window_starts_at_the_certificate() -> None:
    book = tr.TranscriptBook()
    framer = EscrowDonor(book)
    c = framer.commit(HONEST, "bad")  # held at T0, certified at T0 + 200
    assert (framer.reveal(c.transcript(T0_MS + 100)) or "").startswith("late")


def test_a_verifier_that_held_no_shares_takes_the_certificate_and_releases_nothing() -> None:
    book = tr.TranscriptBook()
    donor, rng = os.urandom(20), random.Random(4)
    c = Committed(HONEST, "good", rng)
    assert book.certify(donor, c.value, c.points_raw, EPOCH, T0_MS) is None
    assert (book.certify(donor, c.value, c.points_raw, EPOCH, T0_MS) or "").startswith("duplicate")
    assert (book.certify(os.urandom(20), c.value, c.points_raw, EPOCH, T0_MS) or "").startswith("unknown")
    assert book.released(EPOCH) == []
    assert book.reveal(donor, c.transcript(T0_MS + 900), key_of) is None
    assert len(book.close(EPOCH)) == 1


def test_an_honest_donors_revealed_commitments_are_never_released() -> None:
    book = tr.TranscriptBook()
    donor, node = EscrowDonor(book), HonestNode(HONEST)
    committed = [donor.commit(HONEST, f"reply {i}") for i in range(3)]
    for i, c in enumerate(committed):
        assert donor.reveal(node.serve(c, T0_MS + 900 + i)) is None
    assert book.released(EPOCH) == []
    assert len(book.close(EPOCH)) == 3 and book.history[donor.id] == (1, 0)


def test_no_reply_claimed_for_a_served_request_is_filled_by_the_node() -> None:
    book = tr.TranscriptBook()
    framer, node = EscrowDonor(book), HonestNode(HONEST)
    good = framer.commit(HONEST, "good")
    node.serve(good, T0_MS + 900)
    assert book.no_reply(framer.id, good.value) is None
    assert node.reveal_withheld(book, {good.value: good.deal}) == [None]
    assert [c.transcript.reply.chunks[0][0] for c in book.close(EPOCH)] == ["good"]


def test_a_node_reveal_is_checked_as_a_donors_is() -> None:
    book = tr.TranscriptBook()
    donor = EscrowDonor(book)
    c = donor.commit(HONEST, "x")
    t = c.transcript(T0_MS + 900)
    wrong = tr.Transcript(t.node_id, t.nonce, t.opening, t.request_id, t.reply, escrow.scalar_bytes(c.secret + 1))
    assert (book.node_reveal(wrong, key_of) or "").startswith("escrowed")
    no_secret = tr.Transcript(t.node_id, t.nonce, t.opening, t.request_id, t.reply)
    assert (book.node_reveal(no_secret, key_of) or "").startswith("malformed")
    other = Node()
    forged = tr.Transcript(t.node_id, t.nonce, t.opening, t.request_id,
                           other.answer(t.opening, t.request_id, "x", T0_MS + 950), t.secret)
    assert (book.node_reveal(forged, key_of) or "").startswith("unverifiable")
    assert book.node_reveal(t, key_of) is None
    assert (book.node_reveal(t, key_of) or "").startswith("duplicate")


def test_a_node_that_signs_two_replies_to_one_request_loses_to_the_donors_copy() -> None:
    book = tr.TranscriptBook()
    donor = EscrowDonor(book)
    c = donor.commit(HONEST, "what the user got")
    got = c.transcript(T0_MS + 900)
    HONEST.answered.discard(c.request_id)  # the node signs a second reply to the same request
    other = tr.Transcript(got.node_id, got.nonce, got.opening, got.request_id,
                          HONEST.answer(c.opening, c.request_id, "a better one", T0_MS + 950), got.secret)
    assert donor.reveal(got) is None
    assert (book.node_reveal(other, key_of) or "").startswith("equivocation")
    assert (book.node_reveal(got, key_of) or "").startswith("duplicate")
    assert [x.transcript.reply.chunks[0][0] for x in book.close(EPOCH)] == ["what the user got"]
    # the node's copy first, then the donor's: the donor's stands all the same
    book2 = tr.TranscriptBook()
    donor2 = EscrowDonor(book2, seed=5)
    c2 = donor2.commit(HONEST, "what the user got")
    got2 = c2.transcript(T0_MS + 900)
    HONEST.answered.discard(c2.request_id)
    other2 = tr.Transcript(got2.node_id, got2.nonce, got2.opening, got2.request_id,
                           HONEST.answer(c2.opening, c2.request_id, "a better one", T0_MS + 950), got2.secret)
    assert book2.no_reply(donor2.id, c2.value) is None
    assert book2.node_reveal(other2, key_of) is None
    assert donor2.reveal(got2) is None
    assert book2.refused.get("equivocation") == 1
    assert [x.transcript.reply.chunks[0][0] for x in book2.close(EPOCH)] == ["what the user got"]


def test_a_version_1_commitment_is_filled_by_nobody_but_its_donor() -> None:
    book = tr.TranscriptBook()
    donor, rng = os.urandom(20), random.Random(6)
    c = Committed(HONEST, "good", rng)
    assert book.commit(donor, c.value, EPOCH, T0_MS) is None
    t = c.transcript(T0_MS + 900)
    assert (book.node_reveal(t, key_of) or "").startswith("unknown")
    assert book.released(EPOCH) == []
    assert (book.reveal(donor, t, key_of) or "").startswith("malformed")  # a secret where none was escrowed


def test_a_book_with_escrowed_commitments_is_saved_and_answers_as_before() -> None:
    book = tr.TranscriptBook()
    framer, node = EscrowDonor(book, seed=7), HonestNode(HONEST)
    good, worse = framer.commit(HONEST, "good"), framer.commit(HONEST, "bad")
    held = framer.commit(HONEST, "held only", certify=False)
    node.serve(good, T0_MS + 900)
    assert framer.reveal(node.serve(worse, T0_MS + 950)) is None
    again = tr.TranscriptBook.from_bytes(book.to_bytes())
    assert again.to_bytes() == book.to_bytes()
    assert again.released(EPOCH) == book.released(EPOCH)
    # the held one is released too (decision 0039); the node never served it, so finds nothing
    assert [v for v, _, _ in again.released(EPOCH)] == [good.value, held.value]
    assert node.reveal_withheld(again, {good.value: good.deal, held.value: held.deal}) == [None]
    third = tr.TranscriptBook.from_bytes(again.to_bytes())
    assert third.to_bytes() == again.to_bytes()
    fourth = tr.TranscriptBook.from_bytes(third.to_bytes())  # the held one is still held, uncertified
    assert fourth.certify(framer.id, held.value, held.points_raw, EPOCH, T0_MS + 300) is None
    assert fourth.released(EPOCH) == [(v, c.points_raw, c.deal.shares[ME]) for v, c in ((good.value, good),
                                                                                     (held.value, held))]
    assert sorted(c.transcript.reply.chunks[0][0] for c in third.close(EPOCH)) == ["bad", "good"]


def test_a_saved_book_whose_escrow_does_not_hold_together_is_refused() -> None:
    book = tr.TranscriptBook()
    donor, node = EscrowDonor(book, seed=8), HonestNode(HONEST)
    c = donor.commit(HONEST, "good", certify=False)
    t = node.serve(c, T0_MS + 900)
    _, _, body = msgpack.unpackb(book.to_bytes(), raw=False)
    entry = body[0][0][3][0]  # [commitment, received_ms, transcript, escrow, node's transcript]
    assert entry[3][0] is False  # held, not certified
    entry[4] = tr._transcript_wire(t)
    with pytest.raises(tr.BookError, match="not certified and escrowed"):
        tr.TranscriptBook.from_bytes(forge(body))
    entry[4], entry[3] = None, None
    entry[2] = tr._transcript_wire(t)  # a transcript with a secret, of a commitment not escrowed
    with pytest.raises(tr.BookError, match="carries a secret"):
        tr.TranscriptBook.from_bytes(forge(body))
    entry[2], entry[3] = None, [True, c.points_raw, b"junk"]
    with pytest.raises(tr.BookError, match="shares do not decode"):
        tr.TranscriptBook.from_bytes(forge(body))


def _sybils(book: tr.TranscriptBook, n: int | list[bytes], *, certify: bool, at: int = T0_MS - 10_000,
            epoch: int = EPOCH) -> list[bytes]:
    """``n`` registered identities (new ones, or these), each holding one escrowed commitment in
    ``epoch`` (the same points and shares: the book does not check them) and certifying it or not;
    their ids. A full book drops a set for each hold that finds no room."""
    c = Committed(HONEST, "any", random.Random(3))
    ids = [os.urandom(20) for _ in range(n)] if isinstance(n, int) else n
    for i, donor in enumerate(ids):
        value = os.urandom(32)
        assert book.hold(donor, value, c.points_raw, c.deal.shares[ME], epoch, at + i) is None
        if certify:
            assert book.certify(donor, value, c.points_raw, epoch, at + i) is None
    return ids


def test_identities_holding_uncertified_commitments_cannot_keep_donors_out() -> None:
    """The cheapest denial of transcripts (decision 0039): MAX_DONORS registered identities each
    hold one escrowed commitment and never certify it, epoch after epoch. It costs them nothing (an
    uncertified commitment counts for nothing and voids nothing, so they are never burnt), and
    the book used to refuse every other donor as "full" for as long as they kept at it. A full
    book now drops the oldest set that holds nothing that may count, and the honest donor's
    transcripts count."""
    book = tr.TranscriptBook()
    _sybils(book, tr.MAX_DONORS, certify=False)
    donor, node = EscrowDonor(book), HonestNode(HONEST)
    c = Committed(HONEST, "a fair question", donor.rng)
    assert book.hold(donor.id, c.value, c.points_raw, c.deal.shares[ME], EPOCH, T0_MS) is None  # a sybil's went
    # the sybils hold on while its certificate is on the way: each new hold drops the oldest
    # uncertified set, never the honest one, newer than every sybil's but these
    _sybils(book, 100, certify=False, at=T0_MS + 1)
    assert book.certify(donor.id, c.value, c.points_raw, EPOCH, T0_MS + 200) is None
    assert c.value in {v for v, _, _ in book.released(EPOCH)}  # its shares are still held here
    assert donor.reveal(node.serve(c, T0_MS + 900)) is None
    assert [t.transcript.reply.chunks[0][0] for t in book.close(EPOCH)] == ["a fair question"]
    assert book.refused["evicted"] == 101


def test_a_book_full_of_sets_that_may_count_still_refuses() -> None:
    """Only sets that count for nothing are dropped: to keep donors out, identities must certify
    their commitments, and then reveal them with real replies or be burnt past their void budget."""
    book = tr.TranscriptBook()
    _sybils(book, tr.MAX_DONORS - 1, certify=True)
    _sybils(book, 1, certify=False, at=T0_MS + 10_000)  # the newest hold, uncertified: dropped first
    first = EscrowDonor(book)
    first.commit(HONEST, "room for one")  # held and certified: the uncertified set made room
    late = EscrowDonor(book, seed=2)
    c = Committed(HONEST, "no room", late.rng)
    why = book.hold(late.id, c.value, c.points_raw, c.deal.shares[ME], EPOCH, T0_MS)
    assert (why or "").startswith("full") and book.refused["evicted"] == 1


def _held_by(book: tr.TranscriptBook, epoch: int) -> set[bytes]:
    return {v for v, _, _ in book.released(epoch)}


def _one_shot_framer(book: tr.TranscriptBook, epoch: int, seed: int) -> Committed:
    """A one-shot framer's good reply, held at this verifier and certified elsewhere only (decision
    0039's second hole): this verifier's shares are what the node needs to rebuild its secret."""
    c = Committed(HONEST, "good", random.Random(seed))
    assert book.hold(os.urandom(20), c.value, c.points_raw, c.deal.shares[ME], epoch, T0_MS) is None
    return c


def test_reused_identities_cannot_push_a_one_shot_framers_shares_out_of_the_book() -> None:
    """Decision 0041. The framer of decision 0039's second hole certifies at too few verifiers and
    must then drop its hold from enough honest books for the node not to rebuild its withheld good
    reply: a flood of holds after its own, a book's worth, within the epoch. Identities that never
    certify cost nothing, so the same registered ones served every epoch, and the oldest idle set
    went first: the framer's. Now a set of a donor that left idle sets here before goes first, so
    the flood drops its own sets and the framer's shares stay to be released. Fails with the oldest
    set dropped first."""
    book = tr.TranscriptBook()
    flood = _sybils(book, tr.MAX_DONORS, certify=False, at=T0_MS - 900_000, epoch=EPOCH - 1)
    assert book.close(EPOCH - 1) == [] and set(book.idle) == set(flood)  # each left one idle set here
    target = _one_shot_framer(book, EPOCH, seed=9)
    _sybils(book, flood, certify=False, at=T0_MS + 1)  # every one of them again, each hold newer than the framer's
    assert book.refused["evicted"] == 1 and target.value in _held_by(book, EPOCH)
    assert sum(book.idle.values()) == tr.MAX_DONORS + 1  # the dropped set marked its donor once more
    again = tr.TranscriptBook.from_bytes(book.to_bytes())  # a restart keeps the marks
    assert again.idle == book.idle and again.to_bytes() == book.to_bytes()


def test_a_flood_that_drops_a_framers_shares_spends_a_book_of_fresh_identities() -> None:
    """What decision 0041 leaves: identities never idle here before still push the framer's hold
    out, oldest first, as before. Each of them is then marked, so the same flood cannot do it again:
    every framed epoch takes a book's worth of newly registered identities at each verifier it
    must empty."""
    book = tr.TranscriptBook()
    first = _one_shot_framer(book, EPOCH, seed=10)
    flood = _sybils(book, tr.MAX_DONORS, certify=False, at=T0_MS + 1)
    assert first.value not in _held_by(book, EPOCH)  # the price paid once: out
    book.close(EPOCH)
    assert all(book.idle[d] == 1 for d in flood)
    second = _one_shot_framer(book, EPOCH + 1, seed=11)
    _sybils(book, flood, certify=False, at=T0_MS + 900_001, epoch=EPOCH + 1)
    assert second.value in _held_by(book, EPOCH + 1)


def test_only_sets_that_count_for_nothing_mark_their_donor_idle() -> None:
    book = tr.TranscriptBook()
    held, certified, node = EscrowDonor(book, seed=12), EscrowDonor(book, seed=13), HonestNode(HONEST)
    held.commit(HONEST, "held", certify=False)
    mixed = certified.commit(HONEST, "certified")
    certified.commit(HONEST, "held too", certify=False)
    assert certified.reveal(node.serve(mixed, T0_MS + 900)) is None
    assert book.commit(os.urandom(20), os.urandom(32), EPOCH, T0_MS) is None  # version 1: unrevealed, void
    book.close(EPOCH)
    assert book.idle == {held.id: 1}


def test_a_book_filled_with_sets_that_count_still_pushes_a_framers_hold_out() -> None:
    """A known limit of decision 0041: identities that certify (and would reveal real replies)
    leave no idle set and are never marked. A book filled with their sets leaves the framer's hold
    the only idle one, and one more hold drops it. The price is a book's worth of sets that count,
    each framed epoch, during which every honest donor here is refused "full"."""
    book = tr.TranscriptBook()
    _sybils(book, tr.MAX_DONORS - 1, certify=True)
    target = _one_shot_framer(book, EPOCH, seed=14)
    late = EscrowDonor(book, seed=15)
    c = Committed(HONEST, "pushes it out", late.rng)
    assert book.hold(late.id, c.value, c.points_raw, c.deal.shares[ME], EPOCH, T0_MS + 1) is None
    assert target.value not in _held_by(book, EPOCH) and book.refused["evicted"] == 1
