"""Users' transcripts as audit evidence (verifier/audit/transcripts.py, decision 0015): each test
plays a user who wants to frame an honest node, with everything the code and docs tell it, and
fails if its transcripts count."""

from __future__ import annotations

import os
import random
from collections.abc import Callable

import pytest

from overlay.anon import signing
from overlay.wire import crypto
from overlay.wire.identity import node_id_of
from overlay.wire.messages import ChatMessage, SamplingParams
from verifier.audit import transcripts as tr
from verifier.audit.tx import Opening, ReplyOutcome

MODEL = "smollm2-135m-instruct"
T0_MS = 1_800_000_000_000


class Node:
    def __init__(self) -> None:
        self.key = crypto.SigningKey.generate()
        self.node_id = node_id_of(self.key.public_bytes)
        self.answered: set[bytes] = set()

    def answer(self, opening: Opening, request_id: bytes, text: str, at_ms: int,
               forwarded_by: Node | None = None) -> ReplyOutcome:
        """The honest node's signed reply, to the request addressed to it (or to the member that
        forwarded it); like overlay/anon/replay.py, each request id once."""
        assert request_id not in self.answered, "an honest node answers a request id once"
        self.answered.add(request_id)
        target = (forwarded_by or self).node_id
        signer = signing.ReplySigner(signing.request_digest(opening.request(request_id), target), MODEL, self.node_id)
        _, sig = signer.add(text, (1, 2, 3), True, at_ms, self.key.sign)
        return ReplyOutcome(self.node_id, ((text, (1, 2, 3)),), sig, at_ms, 0)

    def busy(self, opening: Opening, request_id: bytes, at_ms: int) -> ReplyOutcome:
        """The honest node's signed "busy" before any output (decision 0044): that id is answered."""
        assert request_id not in self.answered, "an honest node answers a request id once"
        self.answered.add(request_id)
        digest = signing.request_digest(opening.request(request_id), self.node_id)
        return ReplyOutcome(self.node_id, (), self.key.sign(signing.busy_signing_bytes(digest, MODEL, self.node_id,
                                                                                      at_ms)), at_ms, 0)


HONEST, OTHER = Node(), Node()
BUSY = "<busy>"  # Donor.commit_and_send's text for a request the node refuses as busy
KEYS = {HONEST.node_id: HONEST.key.public_bytes, OTHER.node_id: OTHER.key.public_bytes}


def key_of(node_id: bytes, model: str) -> bytes | None:
    return KEYS.get(node_id) if model == MODEL else None


def request(q: str = "how do tides work?", seed: int | None = None) -> tuple[Opening, bytes]:
    return (Opening(bytes(16), MODEL, (ChatMessage("user", q),), SamplingParams(0.7, 1.0, 0, 256, seed)),
            os.urandom(16))


class Donor:
    """A donor's client: commits, sends, reveals (what user_client will do)."""

    def __init__(self, book: tr.TranscriptBook, epoch: int = 5) -> None:
        self.book, self.epoch = book, epoch
        self.id = os.urandom(20)
        self.got: list[tr.Transcript] = []

    def commit_and_send(self, node: Node, text: str, *, q: str = "how do tides work?", seed: int | None = None,
                        commit_at: int = T0_MS, reply_at: int = T0_MS + 900,
                        forwards_to: Node | None = None) -> tr.Transcript:
        opening, rid = request(q, seed)
        nonce = os.urandom(16)
        digest = signing.request_digest(opening.request(rid), node.node_id)
        assert self.book.commit(self.id, tr.commitment(nonce, node.node_id, digest), self.epoch, commit_at) is None
        server = forwards_to or node
        reply = (server.busy(opening, rid, reply_at) if text == BUSY
                 else server.answer(opening, rid, text, reply_at, forwarded_by=node if forwards_to else None))
        t = tr.Transcript(node.node_id, nonce, opening, rid, reply)
        self.got.append(t)
        return t

    def reveal(self, t: tr.Transcript) -> str | None:
        return self.book.reveal(self.id, t, key_of)


def test_an_honest_donor_who_reveals_everything_counts() -> None:
    book = tr.TranscriptBook()
    d = Donor(book)
    for i in range(3):
        assert d.reveal(d.commit_and_send(HONEST, f"reply {i}")) is None
    got = book.close(d.epoch)
    assert [c.transcript.reply.chunks[0][0] for c in got] == ["reply 0", "reply 1", "reply 2"]
    assert {c.node_id for c in got} == {HONEST.node_id} and book.voided == 0
    assert book.close(d.epoch) == []  # closed once


def test_withholding_the_good_replies_voids_the_whole_set() -> None:
    book = tr.TranscriptBook()
    d = Donor(book)
    sent = [d.commit_and_send(HONEST, text) for text in ("good", "bad", "good", "bad")]
    for t in sent:
        if "bad" in t.reply.chunks[0][0]:
            assert d.reveal(t) is None
    assert book.close(d.epoch) == [] and book.refused["unrevealed"] == 1


def test_saying_no_reply_came_for_the_good_ones_voids_the_set() -> None:
    book = tr.TranscriptBook()
    d = Donor(book)
    good, bad = d.commit_and_send(HONEST, "good"), d.commit_and_send(HONEST, "bad")
    assert d.reveal(bad) is None
    assert book.no_reply(d.id, good.commitment()) is None
    assert book.close(d.epoch) == []


def test_committing_after_seeing_the_reply_counts_for_nothing() -> None:
    book = tr.TranscriptBook()
    d = Donor(book)
    t = d.commit_and_send(HONEST, "bad", commit_at=T0_MS + 1_000, reply_at=T0_MS + 900)
    assert (d.reveal(t) or "").startswith("late")
    assert book.close(d.epoch) == []


def test_a_reply_signed_long_after_the_commitment_counts_for_nothing() -> None:
    book = tr.TranscriptBook()
    d = Donor(book)
    t = d.commit_and_send(HONEST, "x", reply_at=T0_MS + tr.WINDOW_MS + 1)
    assert (d.reveal(t) or "").startswith("late") and book.close(d.epoch) == []


def test_a_committed_request_sent_to_several_nodes_opens_for_the_named_node_only() -> None:
    book = tr.TranscriptBook()
    d = Donor(book)
    t = d.commit_and_send(HONEST, "honest's reply")
    # the same request (same id) to another node: its reply cannot open the commitment for HONEST
    other = OTHER.answer(t.opening, t.request_id, "other's unlucky reply", T0_MS + 950)
    as_honest = tr.Transcript(HONEST.node_id, t.nonce, t.opening, t.request_id, other)
    assert (d.reveal(as_honest) or "").startswith("forged")  # OTHER's reply names OTHER, not HONEST
    assert book.close(d.epoch) == []
    book2 = tr.TranscriptBook()
    d2 = Donor(book2)
    t2 = d2.commit_and_send(HONEST, "x")
    named_other = tr.Transcript(OTHER.node_id, t2.nonce, t2.opening, t2.request_id, t2.reply)
    assert (d2.reveal(named_other) or "").startswith("unknown")  # the commitment named HONEST


def test_a_reply_from_the_member_the_node_forwarded_to_counts_for_that_member() -> None:
    book = tr.TranscriptBook()
    d = Donor(book)
    assert d.reveal(d.commit_and_send(HONEST, "forwarded", forwards_to=OTHER)) is None
    assert d.reveal(d.commit_and_send(HONEST, "served")) is None
    assert sorted((c.node_id == OTHER.node_id, c.transcript.reply.chunks[0][0]) for c in book.close(d.epoch)) == \
        [(False, "served"), (True, "forwarded")]


def test_resending_the_committed_request_draws_no_second_sample() -> None:
    d = Donor(tr.TranscriptBook())
    t = d.commit_and_send(HONEST, "first")
    with pytest.raises(AssertionError, match="once"):
        HONEST.answer(t.opening, t.request_id, "second", T0_MS + 1000)
    # and a fresh id is another request, whose reply does not open this commitment
    rid = os.urandom(16)
    again = tr.Transcript(HONEST.node_id, t.nonce, t.opening, rid, HONEST.answer(t.opening, rid, "b", T0_MS + 999))
    assert (d.reveal(again) or "").startswith("unknown")


def test_an_altered_reply_or_a_seeded_request_voids_the_set() -> None:
    book = tr.TranscriptBook()
    d = Donor(book)
    t = d.commit_and_send(HONEST, "the real reply")
    ok = d.commit_and_send(HONEST, "fine")
    altered = tr.Transcript(t.node_id, t.nonce, t.opening, t.request_id,
                            ReplyOutcome(t.reply.served_by, (("an altered reply", (1, 2, 3)),), t.reply.signature,
                                         t.reply.signed_at_ms, 0))
    assert (d.reveal(altered) or "").startswith("forged")
    assert d.reveal(ok) is None
    assert book.close(d.epoch) == []
    book2 = tr.TranscriptBook()
    d2 = Donor(book2)
    assert (d2.reveal(d2.commit_and_send(HONEST, "x", seed=42)) or "").startswith("seeded")
    assert book2.close(d2.epoch) == []


def test_a_nodes_signed_busy_is_no_sample_and_the_rest_of_the_set_counts() -> None:
    """Decision 0044: the honest donor's committed request met a busy node; its signed refusal
    closes the commitment without voiding the set (before, the donor had to say "no reply")."""
    book = tr.TranscriptBook()
    d = Donor(book)
    refused, served = d.commit_and_send(HONEST, BUSY), d.commit_and_send(OTHER, "a reply")
    assert d.reveal(refused) is None and d.reveal(served) is None
    (c,) = book.close(d.epoch)
    assert c.node_id == OTHER.node_id and c.transcript == served
    assert book.history[d.id] == (1, 0) and book.voided == 0
    # a set of refusals alone is neither complete nor void: it widens no void budget
    d.epoch += 1
    assert d.reveal(d.commit_and_send(HONEST, BUSY)) is None
    assert book.close(d.epoch) == [] and book.history[d.id] == (1, 0)


def test_a_framer_cannot_pass_a_good_reply_off_as_busy() -> None:
    """A framer holding a good reply it would hide, and a signed "busy" of the same node for
    another of its committed requests, presents the refusal in the reply's place: it opens only
    its own request's commitment, so the swap is forged (and voids the set, as any forgery)."""
    book = tr.TranscriptBook()
    d = Donor(book)
    good, refused = d.commit_and_send(HONEST, "a good reply"), d.commit_and_send(HONEST, BUSY)
    swapped = tr.Transcript(good.node_id, good.nonce, good.opening, good.request_id, refused.reply)
    # nor does the reply's own signature stand for a refusal
    as_busy = tr.Transcript(good.node_id, good.nonce, good.opening, good.request_id,
                            ReplyOutcome(good.reply.served_by, (), good.reply.signature, good.reply.signed_at_ms, 0))
    for fake in (swapped, as_busy):
        d2 = Donor(tr.TranscriptBook())
        d2.id, d2.epoch = d.id, d.epoch
        book2 = d2.book
        for t in (good, refused):
            assert book2.commit(d.id, t.commitment(), d.epoch, T0_MS) is None
        assert (d2.reveal(fake) or "").startswith("forged")
        assert d2.reveal(refused) is None
        assert book2.close(d.epoch) == [] and book2.history[d.id] == (0, 1)


def test_refusals_from_a_framers_own_node_do_not_widen_its_void_budget() -> None:
    """A framer whose own registered model node signs "busy" to its every request makes as many
    sets of refusals as it likes: they leave its count of sets alone, so it is burnt after as few
    void sets as a donor with none."""
    book = tr.TranscriptBook()
    d = Donor(book, epoch=0)
    for epoch in range(20):
        d.epoch = epoch
        assert d.reveal(d.commit_and_send(OTHER, BUSY)) is None
        assert book.close(epoch) == []
    for epoch in range(20, 20 + tr.VOID_ALLOWANCE + 1):
        d.epoch = epoch
        d.commit_and_send(HONEST, "withheld")
        assert book.close(epoch) == []
    assert d.id in book.burnt


def test_weight_is_bounded_per_donor() -> None:
    book = tr.TranscriptBook()
    d = Donor(book)
    for i in range(tr.MAX_COMMITS):
        assert d.reveal(d.commit_and_send(HONEST if i % 2 else OTHER, f"r{i}")) is None
    opening, rid = request()
    assert (book.commit(d.id, tr.commitment(os.urandom(16), HONEST.node_id,
                                            signing.request_digest(opening.request(rid), HONEST.node_id)),
                        d.epoch, T0_MS)
            or "").startswith("too many")
    got = book.close(d.epoch)
    assert sum(c.node_id == HONEST.node_id for c in got) == tr.MAX_PER_NODE
    assert sum(c.node_id == OTHER.node_id for c in got) == tr.MAX_PER_NODE


def test_sets_are_per_donor_and_epoch_and_garbage_never_raises() -> None:
    book = tr.TranscriptBook()
    a, b = Donor(book), Donor(book, epoch=6)
    ta = a.commit_and_send(HONEST, "a")
    assert book.reveal(b.id, ta, key_of) is not None  # another donor cannot open it
    assert a.reveal(ta) is None and a.reveal(ta) is not None  # once
    assert book.commit(b"short", b"x", 5, T0_MS) is not None
    assert book.commit(b.id, ta.commitment(), 6, T0_MS) is not None  # a commitment is one donor's, once
    assert book.no_reply(b.id, b"\x00" * 32) is not None
    assert [c.donor for c in book.close(5)] == [a.id]


def test_framers_who_reveal_by_what_they_see_count_for_nothing_and_are_burnt() -> None:
    """Framers who commit several requests and reveal by what they see: their sets are void, the
    honest donors' sets count, and the counted replies of the honest node keep its true mean."""
    rng = random.Random(3)
    book = tr.TranscriptBook()
    quality: dict[str, float] = {}  # reply text -> its score (the honest node's replies: uniform on [0, 1])
    strategies = {
        "honest": lambda ts: ts,
        "worst half": lambda ts: sorted(ts, key=lambda t: quality[t.reply.chunks[0][0]])[: len(ts) // 2],
        "under 0.3 only": lambda ts: [t for t in ts if quality[t.reply.chunks[0][0]] < 0.3],
    }
    framers, whole = [], 0  # whole: framers whose every reply happened to fall under their line
    for name, pick in strategies.items():
        for _ in range(30):
            d = Donor(book)
            sent = []
            for _ in range(4):
                text = f"{name} {rng.random()}"
                quality[text] = rng.random()
                sent.append(d.commit_and_send(HONEST, text))
            revealed = pick(sent)
            for t in revealed:
                d.reveal(t)
            if name != "honest":
                framers.append(d)
                whole += len(revealed) == len(sent)
    counted = book.close(5)
    honest = [c for c in counted if c.transcript.reply.chunks[0][0].startswith("honest ")]
    assert len(honest) == 30 * tr.MAX_PER_NODE
    assert len(counted) - len(honest) == whole * tr.MAX_PER_NODE  # only sets revealed whole count
    assert whole <= 2  # under 0.3 four times in a row: 0.8 % of those framers
    scores = [quality[c.transcript.reply.chunks[0][0]] for c in honest]
    assert abs(sum(scores) / len(scores) - 0.5) < 0.1
    assert all(f.id not in book.burnt for f in framers)  # one void set is within anyone's budget (rule 6)


def test_a_donor_past_its_void_budget_is_burnt() -> None:
    book = tr.TranscriptBook()
    d = Donor(book, epoch=0)
    for epoch in range(tr.VOID_ALLOWANCE + 1):
        d.epoch = epoch
        d.commit_and_send(HONEST, "withheld")
        assert book.close(epoch) == []
    assert d.id in book.burnt
    opening, rid = request()
    assert (book.commit(d.id, tr.commitment(os.urandom(16), HONEST.node_id,
                                            signing.request_digest(opening.request(rid), HONEST.node_id)),
                        9, T0_MS) or "").startswith("burnt")


def test_a_refused_duplicate_commitment_buys_no_complete_set_and_takes_no_slot() -> None:
    """A framer that sends, each epoch, a commitment someone already made (its own of an earlier
    epoch still open, or another donor's it saw) must not get an empty set that closes as
    "complete": that would raise its void allowance for free and hold one of MAX_DONORS slots."""
    book = tr.TranscriptBook()
    honest, framer = Donor(book, epoch=0), Donor(book, epoch=0)
    t = honest.commit_and_send(HONEST, "good")
    value = t.commitment()
    for epoch in range(3):
        assert (book.commit(framer.id, value, epoch, T0_MS) or "").startswith("duplicate")
    assert book.open_epochs() == [0] and len(book._sets) == 1
    assert honest.reveal(t) is None
    for epoch in range(3):
        book.close(epoch)
    assert framer.id not in book.history  # no set, complete or void, was ever counted for it
    assert book.history[honest.id] == (1, 0)


def _epochs(book: tr.TranscriptBook, d: Donor, rng: random.Random, epochs: int, q: float,
            keep: Callable[[bool, tuple[int, int]], bool]) -> list[str]:
    """``d`` commits one request an epoch to the honest node (bad with probability ``q``) and
    reveals it when ``keep(bad, its history)``; the counted replies."""
    counted = []
    for epoch in range(epochs):
        d.epoch = epoch
        if d.id in book.burnt:
            break
        bad = rng.random() < q
        t = d.commit_and_send(HONEST, "bad" if bad else "good", commit_at=T0_MS + epoch * 10**6,
                              reply_at=T0_MS + epoch * 10**6 + 900)
        if keep(bad, book.history.get(d.id, (0, 0))):
            assert d.reveal(t) is None
        counted += [c.transcript.reply.chunks[0][0] for c in book.close(epoch)]
    return counted


def test_a_cherry_picking_framer_gains_little_and_is_burnt_past_its_budget() -> None:
    """Rule 6 pinned: a framer that reveals bad replies and voids good ones as long as its budget
    allows moves the bad share of its counted replies from q to about q / (1 - VOID_SHARE); one that
    voids every good reply is burnt within a few epochs; an honest donor whose requests fail 10 %
    of the time is never burnt."""
    q = 0.2
    book = tr.TranscriptBook()

    def within_budget(bad: bool, hist: tuple[int, int]) -> bool:
        done, void = hist
        return bad or void + 1 > tr.VOID_ALLOWANCE + tr.VOID_SHARE * (done + void + 1)

    counted = _epochs(book, Donor(book), random.Random(11), 2000, q, within_budget)
    share = counted.count("bad") / len(counted)
    assert q < share <= q / (1 - tr.VOID_SHARE) + 0.03, share
    greedy = Donor(book)
    assert len(_epochs(book, greedy, random.Random(12), 2000, q, lambda bad, _: bad)) <= tr.VOID_ALLOWANCE + 2
    assert greedy.id in book.burnt
    honest = Donor(book)
    fails = random.Random(13)
    assert len(_epochs(book, honest, random.Random(14), 500, q, lambda *_: fails.random() >= 0.1)) > 400
    assert honest.id not in book.burnt


# --------------------------------------------------------------------------- rule 8: bounded work


def _counted(donor: bytes, i: int, reply_tokens: int, prompt_bytes: int = 180) -> tr.Counted:
    opening = Opening(bytes(16), MODEL, (ChatMessage("user", f"{i:04d}" + "x" * (prompt_bytes - 4)),),
                      SamplingParams(0.7, 1.0, 0, 4096, None))
    reply = ReplyOutcome(HONEST.node_id, (("y" * reply_tokens, tuple(range(reply_tokens))),), b"\x03" * 64, 1, 0)
    return tr.Counted(donor, HONEST.node_id, tr.Transcript(HONEST.node_id, os.urandom(16), opening, os.urandom(16),
                                                          reply))


def test_a_donor_flooding_the_longest_transcripts_gets_a_bounded_random_few_scored() -> None:
    """A donor (a cheater's sybil, say) hands in 16 transcripts of the longest requests a node
    serves: scoring them all would take a verifier longer than the epoch and delay every other
    donor's scores. Only a random few within the budget are scored, never the donor's choice; an
    honest donor's typical set beside it is scored whole."""
    flood, honest = b"\xf1" * 20, b"\xa1" * 20
    longest = [_counted(flood, i, 3000, 4000) for i in range(16)]  # cost 4,000 each
    typical = [_counted(honest, i, 141) for i in range(16)]  # cost 186 each
    assert tr.cost(longest[0].transcript) == 4000 and tr.cost(typical[0].transcript) == 186
    chosen: dict[int, int] = {}
    for seed in range(300):
        kept, over = tr.within_budget([*longest, *typical], random.Random(seed))
        mine = [c for c in kept if c.donor == flood]
        assert sum(tr.cost(c.transcript) for c in mine) <= tr.SCORE_BUDGET and len(mine) == 4 and over == 12
        assert [c for c in kept if c.donor == honest] == typical
        for c in mine:
            chosen[longest.index(c)] = chosen.get(longest.index(c), 0) + 1
    assert len(chosen) == 16 and max(chosen.values()) < 2 * min(chosen.values())  # uniform, not the donor's order


def test_one_transcript_over_the_budget_alone_is_still_scored() -> None:
    huge = _counted(b"\xf2" * 20, 0, 8192, 128 * 1024)
    assert tr.cost(huge.transcript) > tr.SCORE_BUDGET
    assert tr.within_budget([huge], random.Random(1)) == ([huge], 0)


# --------------------------------------------------------------------------- rule 9: bounded work per verifier


def _of(node: bytes, donor: bytes, i: int, reply_tokens: int = 141, prompt_bytes: int = 180) -> tr.Counted:
    c = _counted(donor, i, reply_tokens, prompt_bytes)
    return tr.Counted(donor, node, c.transcript)


NODES = [bytes([0x10 + j]) * 20 for j in range(32)]
CHEATER, OTHERS = NODES[0], NODES[1:]


def _flood(rng: random.Random, sybils: int) -> list[tr.Counted]:
    """``sybils`` donors, each with the 4 longest transcripts rule 8 leaves it, of nodes other than
    the cheater's (cost 4,000 each)."""
    return [_of(rng.choice(OTHERS), j.to_bytes(20, "big"), i, 3000, 4000) for j in range(sybils) for i in range(4)]


def _spent(kept: list[tr.Counted]) -> int:
    return sum(tr.cost(c.transcript) for c in kept)


def test_a_round_that_fits_is_scored_whole() -> None:
    rng = random.Random(3)
    counted = [_of(n, bytes([0xa0 + i]) * 20, i) for n in NODES[:10] for i in range(15)]
    assert _spent(counted) <= tr.ROUND_BUDGET
    assert tr.within_capacity(counted, rng) == counted


def test_a_sybil_flood_of_other_nodes_leaves_each_node_its_share_and_bounds_the_round() -> None:
    """A patient attacker's registered donors hand in the longest requests of every node but the
    cheater's: 1,024 of them would take one thread hours a round. The round costs the verifier's
    budget on average, and the cheater's honest donors' transcripts keep at least half the
    cheater's equal share of it (the half shared by node, decision 0035): the flood cannot starve
    the node it is meant to shield."""
    rng = random.Random(5)
    honest = [_of(CHEATER, bytes([0xa0 + i]) * 20, i) for i in range(15)]  # cost 186 each
    flood = _flood(rng, 1024)
    assert _spent(flood) > 100 * tr.ROUND_BUDGET
    share = tr.ROUND_BUDGET / len(NODES)
    spent = []
    for seed in range(40):
        kept = tr.within_capacity([*flood, *honest], random.Random(seed))
        spent.append(_spent(kept))
        mine = [c for c in kept if c.node_id == CHEATER]
        assert int(share / 2 // 186) <= len(mine) <= int(share // 186) + 1  # at least half its equal share: 4 of 15
    assert max(spent) < 1.5 * tr.ROUND_BUDGET and abs(sum(spent) / len(spent) / tr.ROUND_BUDGET - 1) < 0.1, spent


def test_a_nodes_share_goes_to_its_donors_alike_whoever_they_are() -> None:
    """The cheater's own registered users (boosters) flood its share with honest replies, 4 each,
    beside its 15 users' one each: the share goes to its donors alike, one transcript of each
    before a second of any, so its users keep their share of its *donors* (15 of 75), not merely
    of its transcripts (15 of 255): not by donor id, not by the order they came in, not by how
    many each handed in."""
    boosters = [_of(CHEATER, j.to_bytes(20, "big"), i) for j in range(60) for i in range(4)]  # low ids, first
    honest = [_of(CHEATER, bytes([0xf0]) + bytes([i]) * 19, 100 + i) for i in range(15)]  # high ids, last
    flood = [_of(n, n[:1] + b"\xee" * 19, 0, 3000, 4000) for n in OTHERS]  # the budget binds for every node
    ids = {id(c) for c in honest}
    budget = 32 * 5 * 186
    weights = tr.node_weights([75, *[1] * len(OTHERS)])
    share = budget * weights[0] / sum(weights)  # 51 of its transcripts (decision 0035)
    got = total = 0
    for seed in range(1000):
        kept = tr.within_capacity([*boosters, *flood, *honest], random.Random(seed), budget=budget)
        mine = [c for c in kept if c.node_id == CHEATER]
        got += sum(1 for c in mine if id(c) in ids)
        total += len(mine)
    assert abs(total / 1000 - share / 186) < 1, (total, share / 186)
    assert abs(got / total - 15 / 75) < 0.02, got / total


def test_a_flood_identity_weighs_one_however_many_nodes_it_hands_in() -> None:
    """Decision 0035: an attacker's 1,024 sybils each hand in 4 of the longest transcripts of 4
    other nodes (rules 5 and 8 allow up to 16), beside a cheater's 60 boosters and 15 users. Were a
    donor counted whole by each node it hands in, the flood would weigh 4,096 donors and shrink the
    cheater's share below what shares by node alone leave it (users' transcripts a round: 0.76,
    where by node alone 1.0); counted as a part of one for each, it weighs its 1,024 identities and
    the boosters raise the cheater's share: 29,760 × (75 / 3,128 + 1 / 64) / 186 × 15 / 75 = 1.27."""
    rng = random.Random(9)
    boosters = [_of(CHEATER, j.to_bytes(20, "big"), i) for j in range(60) for i in range(4)]
    users = [_of(CHEATER, bytes([0xf0]) + bytes([i]) * 19, 100 + i) for i in range(15)]
    others = [_of(n, n[:1] + bytes([0xb0 + i]) * 19, i) for n in OTHERS for i in range(15)]
    flood = [_of(n, (1 << 100 | j).to_bytes(20, "big"), i, 3000, 4000)
             for j in range(1024) for i, n in enumerate(rng.sample(OTHERS, 4))]
    ids = {id(c) for c in users}
    rounds = 600
    got = sum(id(c) in ids for seed in range(rounds) for c in tr.within_capacity(
        [*boosters, *others, *flood, *users], random.Random(seed), budget=32 * 5 * 186))
    assert 1.15 < got / rounds < 1.4, got / rounds


def test_what_a_verifier_draws_of_a_node_does_not_depend_on_the_other_nodes_transcripts() -> None:
    """Decision 0034: each node's draw comes from a stream of its own (the round's secret key and
    the node id), and rules 8 and 9 take the same randomness from the verifier's generator whatever
    the round holds; so while the share level stays, another node's transcripts (more of them, fewer,
    other donors: a restart voiding its users' sets, a flood) change nothing of what is drawn of
    this one, in this round or the next. Fails with one stream drawn node after node. (The share
    level stays while every node asks more than its share and the nodes' donors are as many:
    decision 0035 shares half the budget by donor.)"""
    mine = [_of(CHEATER, bytes([0xa0 + i]) * 20, i) for i in range(15)]
    a = [_of(n, bytes([0xb0 + i]) * 20, i) for n in OTHERS for i in range(15)]
    b = [_of(n, bytes([0xc0 + i % 15]) * 20, i) for n in OTHERS for i in range(15 + 2 * (n[0] % 5))]  # more, others' donors
    budget = 32 * 3 * 200  # a share of 3 of the 15 (a transcript costs 186), as far below b's as a's

    def rounds(others: list[tr.Counted], seed: int) -> list[list[int]]:
        rng, out = random.Random(seed), []
        for _ in range(3):
            kept, _ = tr.within_budget([*others, *mine], rng)
            first, spare, reserve = tr.first_draw(kept, rng, budget)
            more = tr.second_draw(spare, {CHEATER}, rng, reserve)  # its second draw, then the others'
            out.append([c.transcript.request_id[0] for c in first + more if c.node_id == CHEATER])
        return out

    for seed in range(20):
        got = rounds(a, seed)
        assert got == rounds(b, seed) and all(got), seed


def test_a_node_whose_every_transcript_is_over_its_share_spends_its_share_on_average() -> None:
    """Long transcripts (a cheater's padded replies, a flood's longest requests) neither leave a
    node out nor make it cost more than its share: a transcript four times the share is scored in
    a quarter of the rounds, a random one."""
    padded = [_of(CHEATER, bytes([0xa0 + i]) * 20, i, 3000, 4000) for i in range(15)]
    flood = [_of(n, n[:1] + bytes([0xe0 + i]) * 19, i, 3000, 4000) for n in OTHERS for i in range(15)]  # as many donors
    chosen: list[int] = []
    for seed in range(400):
        kept = tr.within_capacity([*flood, *padded], random.Random(seed), budget=32 * 1000)
        mine = [c for c in kept if c.node_id == CHEATER]
        assert len(mine) <= 1
        chosen.extend(padded.index(c) for c in mine)
    assert 70 <= len(chosen) <= 130 and len(set(chosen)) > 10, len(chosen)  # 100 expected


def test_the_share_level_is_max_min_fair() -> None:
    assert tr.share_level([10, 20, 100], 60) == 30
    assert tr.share_level([10, 20, 30], 60) == float("inf")
    assert tr.share_level([100, 100, 100, 100], 100) == 25
    assert tr.share_level([], 100) == float("inf")
    # weighted: the node of weight 2 may spend twice the level; the one asking 10 gets its 10
    assert tr.share_level([10, 100, 100], 90, [1, 2, 1]) == 80 / 3
    assert tr.share_level([10, 20, 30], 60, [1, 2, 1]) == float("inf")


def test_half_of_the_budget_goes_by_node_and_half_by_donor() -> None:
    """Decision 0035: a node's weight is its donors plus the mean, so that of a budget every node
    asks more of, half is shared equally among the nodes and half among the donors."""
    assert tr.node_weights([1, 3]) == [3.0, 5.0]
    assert tr.node_weights([]) == []
    w = tr.node_weights([100, 4, 4, 4])  # 112 donors: half by node (1/8 each), half by donor
    assert [round(x / sum(w), 6) for x in w] == [round(1 / 8 + 100 / 224, 6), *[round(1 / 8 + 4 / 224, 6)] * 3]


def test_a_cheaters_boosters_dilute_the_networks_donors_not_its_users() -> None:
    """Decision 0035: 120 boosters (its own registered users, 4 honest replies each) beside a
    cheater's 15 users, in a 32-node network whose other nodes have 15 donors each, the budget 5
    typical transcripts a node. Shared by node alone, the cheater's share stays 5 transcripts and
    its users get 5 × 15/135 = 0.56 of them a round; half by donor, the boosters raise its share
    with their number, and its users get 160 × 15 × (1/(2 × 600) + 1/(2 × 32 × 135)) = 2.28: the
    boosters dilute the network's 600 donors, not the cheater's 15 users."""
    boosters = [_of(CHEATER, j.to_bytes(20, "big"), i) for j in range(120) for i in range(4)]
    users = [_of(CHEATER, bytes([0xf0]) + bytes([i]) * 19, 100 + i) for i in range(15)]
    others = [_of(n, n[:1] + bytes([0xb0 + i]) * 19, i) for n in OTHERS for i in range(15)]  # donors of their own
    ids = {id(c) for c in users}
    rounds = 400
    got = sum(id(c) in ids for seed in range(rounds)
              for c in tr.within_capacity([*boosters, *others, *users], random.Random(seed), budget=32 * 5 * 186))
    assert abs(got / rounds - 2.28) < 0.2, got / rounds


def test_a_suspect_stays_one_for_a_few_rounds() -> None:
    a, b = b"\x0a" * 20, b"\x0b" * 20
    held: dict[bytes, int] = {}
    assert tr.remembered(held, 10, {a}) == {a}
    assert tr.remembered(held, 10 + tr.SUSPECT_EPOCHS, ()) == {a}  # its boosters' luck in later rounds
    assert tr.remembered(held, 11 + tr.SUSPECT_EPOCHS, {b}) == {b}  # then forgotten
    assert held == {b: 11 + tr.SUSPECT_EPOCHS}
