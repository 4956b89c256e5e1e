"""Escrowed commitments at the verifiers (decision 0037; verifier/audit/escrow_intake.py through
verifier/abci_app.py's queries): a committee of four equal validators, each with its own book, a
donor who escrows, certifies and then withholds, and the honest node who hands in what it served
after the release. Each test plays the framer (or a colluding verifier) and fails if it gets its way."""

from __future__ import annotations

import json
import random

import pytest

from overlay.anon import signing
from overlay.directory import escrow
from overlay.directory import transcripts as wire
from overlay.directory.registration import OP_REGISTER, Code, Entry, make_tx
from overlay.wire import crypto
from overlay.wire.clock import FakeClock
from overlay.wire.constants import ROLE_MODEL, ROLE_USER
from overlay.wire.identity import Identity
from overlay.wire.messages import ChatMessage, Request, SamplingParams
from verifier.abci.proto.tendermint.abci import types_pb2 as abci
from verifier.abci_app import CommitteeAbciApp
from verifier.app import CommitteeApp, Validator
from verifier.audit import escrow_intake
from verifier.audit.transcripts import TranscriptBook

MODEL = "smollm2-135m-instruct"
CHAIN = "escrow"
EPOCH_BLOCKS = 60
KEYS = [crypto.SigningKey.from_bytes(bytes([i]) * 32) for i in range(1, 5)]
NOW_MS = 1_700_000_000_000 + 5_000


class Committee:
    """Four equal validators over one committed state, each answering queries from its own book;
    ``reply_window_s``: the genesis's (decision 0040; none: the default)."""

    def __init__(self, reply_window_s: int | None = None) -> None:
        self.donor, self.node, self.other = Identity.generate(), Identity.generate(), Identity.generate()
        self.core = CommitteeApp()
        state: dict[str, dict[str, int]] = {"audit": {"epoch_blocks": EPOCH_BLOCKS, "challenges_per_node": 2}}
        if reply_window_s is not None:
            state["audit"]["reply_window_s"] = reply_window_s
        self.core.init_chain(CHAIN, [Validator("ed25519", k.public_bytes, 10) for k in KEYS],
                             json.dumps(state).encode())
        txs = [make_tx(self.donor.signing, CHAIN, OP_REGISTER, 1,
                       Entry(ROLE_USER, self.donor.x25519.public_bytes, "127.0.0.1:7000", "default")),
               *(make_tx(n.signing, CHAIN, OP_REGISTER, 1,
                         Entry(ROLE_MODEL, n.x25519.public_bytes, f"127.0.0.1:{p}", "default", MODEL, 1))
                 for n, p in ((self.node, 7998), (self.other, 7999)))]
        results, _ = self.core.finalize_block(1, 1_700_000_000, txs, b"\x01" * 32)
        assert all(r.ok for r in results), results
        self.core.commit()
        self.clock = FakeClock(unix=NOW_MS / 1000)
        self.books = [TranscriptBook() for _ in KEYS]
        self.apps = [CommitteeAbciApp(self.core, None, k, transcripts=b, clock=self.clock)
                     for k, b in zip(KEYS, self.books, strict=True)]
        self.validators = {k.public_bytes: 10 for k in KEYS}
        self.order = [k for k, _ in escrow.holders(self.validators)]
        self.plan = escrow.plan_of(self.validators)

    @property
    def epoch(self) -> int:
        audit = self.core.committed.audit
        assert audit is not None
        return audit.epoch

    def query(self, i: int, path: str, data: bytes) -> tuple[int, str, bytes]:
        res = self.apps[i].query(abci.RequestQuery(path=path, data=data))
        return res.code, res.log, bytes(res.value)

    def next_epoch(self) -> None:
        """Empty blocks up to the first of the next epoch, whose Commit goes through verifier 0's app."""
        h, last = self.core.height, (self.epoch + 1) * EPOCH_BLOCKS + 1
        for height in range(h + 1, last + 1):
            self.core.finalize_block(height, 1_700_000_000 + height, [], height.to_bytes(32, "big"))
            if height < last:
                self.core.commit()
        self.apps[0].commit(abci.RequestCommit())


class Donated:
    """An escrowed, committed request to ``node`` and the donor's view of it."""

    def __init__(self, w: Committee, text: str, *, junk_for: int | None = None) -> None:
        self.w, self.text = w, text
        self.msgs, self.params = (ChatMessage("user", f"question {text}"),), SamplingParams(0.7, 1.0, 0, 64, None)
        self.rid = crypto.random_bytes(16)
        req = Request(request_id=self.rid, model=MODEL, messages=self.msgs, params=self.params, k=3, return_paths=(),
                      continuation="")
        self.digest = signing.request_digest(req, w.node.node_id)
        self.secret = wire.escrowed_secret(self.digest)
        self.deal = escrow.deal(self.secret, w.plan)
        self.points_raw = escrow.encode_commitments(self.deal.commitments)
        self.value = wire.commitment(escrow.nonce_of(self.secret), w.node.node_id, self.digest)
        self.junk_for = junk_for

    def commit(self, i: int) -> tuple[int, str, bytes]:
        key = KEYS[i].public_bytes
        shares = self.deal.shares[self.w.order.index(key)]
        if i == self.junk_for:
            shares = tuple(escrow.Share(s.x, (s.y + 1) % escrow.L) for s in shares)
        raw = wire.encode_escrow_commit(self.w.donor, self.w.donor.node_id, key, NOW_MS, self.value, self.points_raw,
                                        shares)
        return self.w.query(i, wire.ESCROW_COMMIT_PATH, raw)

    def certify(self, acceptances: list[bytes], to: range = range(4)) -> list[tuple[int, str, bytes]]:
        cert = wire.encode_certificate(self.w.donor.node_id, self.value, NOW_MS, self.points_raw, acceptances)
        return [self.w.query(i, wire.CERTIFY_PATH, cert) for i in to]

    def served(self, at_ms: int = NOW_MS + 900, by: Identity | None = None) -> wire.Revealed:
        """The node's signed reply (``by``: the member it forwarded the request to, which signed
        it), as both the donor and the node keep it."""
        signer = by or self.w.node
        _, sig = signing.ReplySigner(self.digest, MODEL, signer.node_id).add(self.text, (4, 5), True, at_ms,
                                                                             signer.signing.sign)
        return wire.Revealed(self.w.node.node_id, escrow.nonce_of(self.secret), MODEL, self.msgs, self.params,
                             self.rid, signer.node_id, ((self.text, (4, 5)),), sig, at_ms,
                             escrow.scalar_bytes(self.secret))


def donate(w: Committee, text: str) -> Donated:
    d = Donated(w, text)
    acceptances = []
    for i in range(4):
        code, _, acceptance = d.commit(i)
        assert code == 0
        acceptances.append(acceptance)
    assert [c for c, _, _ in d.certify(acceptances)] == [0] * 4
    return d


def node_reveals(w: Committee, epoch: int, served: dict[bytes, wire.Revealed], *, from_: range = range(4),
                 to: range = range(4)) -> int:
    """The node's side: every page each verifier in ``from_`` released, the secrets rebuilt, its
    stored requests matched, its transcripts sealed to every verifier (those in ``to`` take them).
    How many it handed in."""
    shares: dict[bytes, list[escrow.Share]] = {}
    points: dict[bytes, tuple[bytes, ...]] = {}
    for i in from_:
        code, why, page = w.query(i, wire.RELEASED_PATH, wire.released_query(epoch))
        assert code == 0, why
        for value, pts, got in wire.decode_released(page)[1]:
            points[value] = pts
            shares.setdefault(value, []).extend(got)
    handed = 0
    for value, held in shares.items():
        try:
            secret = escrow.recover(points[value], held)
        except escrow.EscrowError:
            continue
        for digest, body in served.items():
            if wire.locator(digest) == wire.secret_locator(secret) \
                    and wire.commitment(escrow.nonce_of(secret), w.node.node_id, digest) == value:
                for i, k in enumerate(KEYS):
                    sealed = wire.seal_node_reveal(k.public_bytes, w.node.signing, w.node.node_id, body)
                    code, why, _ = w.query(i, wire.NODE_REVEAL_PATH, sealed)
                    assert code == 0 if i in to else why.startswith("unknown"), (i, why)
                handed += 1
    return handed


def released_after_the_delay(w: Committee, epoch: int) -> None:
    w.next_epoch()
    for i in range(4):  # each sees epoch + 1 begin (a block's commit, or its first query, tells it)
        code, why, _ = w.query(i, wire.RELEASED_PATH, wire.released_query(epoch))
        assert code == Code.TOO_EARLY and "660 s old" in why
    w.clock.advance(escrow_intake.RELEASE_DELAY_MS / 1000)


def test_a_framer_who_withholds_its_good_replies_gets_them_counted_at_every_verifier() -> None:
    w = Committee()
    epoch = w.epoch
    good, bad = donate(w, "good"), donate(w, "bad")
    served = {d.digest: d.served() for d in (good, bad)}
    for i, k in enumerate(KEYS):  # the framer reveals the bad reply only
        sealed = wire.seal_reveal(k.public_bytes, w.donor, w.donor.node_id, served[bad.digest])
        assert w.query(i, wire.REVEAL_PATH, sealed)[0] == 0
    released_after_the_delay(w, epoch)
    # one colluding verifier (a quarter of the power) releases nothing: the other three suffice
    assert node_reveals(w, epoch, served, from_=range(3)) == 1
    for book in w.books:
        assert sorted(c.transcript.reply.chunks[0][0] for c in book.close(epoch)) == ["bad", "good"]


def test_a_framer_who_certifies_at_one_verifier_only_gets_its_withheld_reply_filled_in_there() -> None:
    """A one-shot framer commits to all four verifiers (a certificate needs acceptances above two
    thirds of the power) but hands the certificate to verifier 0 alone, a quarter of the power:
    fewer units than rebuild the secret. A bad reply it would reveal there, where it counts; the
    good one it withholds. Were only certified commitments released (decision 0037 as first
    built), verifier 0's shares alone would rebuild nothing, the good reply would stay out, and
    framed honest verifiers beside colluding ones below a third could hold the median of the
    node's transcript means. Every verifier releases what it holds shares of and no transcript,
    certified or not (decision 0039), so the node rebuilds it and verifier 0 counts it."""
    w = Committee()
    epoch = w.epoch
    good = Donated(w, "good")
    acceptances = [good.commit(i)[2] for i in range(4)]
    assert [c for c, _, _ in good.certify(acceptances, to=range(1))] == [0]
    released_after_the_delay(w, epoch)
    assert node_reveals(w, epoch, {good.digest: good.served()}, to=range(1)) == 1
    assert [c.transcript.reply.chunks[0][0] for c in w.books[0].close(epoch)] == ["good"]
    assert all(book.close(epoch) == [] for book in w.books[1:])  # uncertified there: no part in a set


def test_an_honest_donors_commitments_are_never_released() -> None:
    w = Committee()
    epoch = w.epoch
    d = donate(w, "fine")
    for i, k in enumerate(KEYS):
        sealed = wire.seal_reveal(k.public_bytes, w.donor, w.donor.node_id, d.served())
        assert w.query(i, wire.REVEAL_PATH, sealed)[0] == 0
    released_after_the_delay(w, epoch)
    for i in range(4):
        code, _, page = w.query(i, wire.RELEASED_PATH, wire.released_query(epoch))
        assert code == 0 and wire.decode_released(page) == (epoch, ())


def test_shares_that_do_not_check_get_no_acceptance_and_a_short_certificate_is_refused() -> None:
    w = Committee()
    d = Donated(w, "x", junk_for=0)
    code, why, acceptance = d.commit(0)
    assert code == Code.INVALID_FIELD and "not accepted" in why and acceptance == b""
    acceptances = [d.commit(i)[2] for i in range(1, 3)]  # two of four: half the power
    code, why, _ = d.certify(acceptances, range(1))[0]
    assert code == Code.INVALID_FIELD and "20 of 40 power" in why
    acceptances.append(d.commit(3)[2])  # three of four: above two thirds
    assert [c for c, _, _ in d.certify(acceptances)] == [0] * 4
    # verifier 0 took the certificate with no shares of its own: it releases nothing of it
    assert w.books[0].released(w.epoch) == [] and len(w.books[1].released(w.epoch)) == 1


def test_a_certificate_of_forged_or_foreign_acceptances_is_refused() -> None:
    w = Committee()
    d = Donated(w, "x")
    real = [d.commit(i)[2] for i in range(2)]
    stranger = crypto.SigningKey.generate()
    forged = [wire.encode_acceptance(stranger, stranger.public_bytes, w.donor.node_id, d.value,
                                     wire.points_digest(d.points_raw), NOW_MS),
              wire.encode_acceptance(KEYS[2], KEYS[3].public_bytes, w.donor.node_id, d.value,
                                     wire.points_digest(d.points_raw), NOW_MS)]
    assert d.certify(real + real + forged, range(1))[0][0] == Code.INVALID_FIELD


def test_a_node_reveal_is_taken_only_from_the_node_addressed() -> None:
    w = Committee()
    epoch = w.epoch
    d = donate(w, "good")
    body = d.served()
    released_after_the_delay(w, epoch)
    sealed = wire.seal_node_reveal(KEYS[0].public_bytes, w.other.signing, w.other.node_id, body)
    assert w.query(0, wire.NODE_REVEAL_PATH, sealed)[0] == Code.BAD_SIGNATURE  # it names another node
    stranger = Identity.generate()
    as_stranger = wire.Revealed(stranger.node_id, *(getattr(body, f) for f in (
        "nonce", "model", "messages", "params", "request_id", "served_by", "chunks", "signature", "signed_at_ms",
        "secret")))
    sealed = wire.seal_node_reveal(KEYS[0].public_bytes, stranger.signing, stranger.node_id, as_stranger)
    assert w.query(0, wire.NODE_REVEAL_PATH, sealed)[0] == Code.UNKNOWN_NODE
    sealed = wire.seal_node_reveal(KEYS[1].public_bytes, w.node.signing, w.node.node_id, body)
    assert w.query(0, wire.NODE_REVEAL_PATH, sealed)[0] == Code.MALFORMED  # sealed to another verifier
    assert w.query(0, wire.NODE_REVEAL_PATH, b"\x00" * (wire.MAX_REVEAL_BYTES + 1))[0] == Code.OVERSIZE
    assert node_reveals(w, epoch, {d.digest: body}) == 1
    assert [c.transcript.reply.chunks[0][0] for c in w.books[2].close(epoch)] == ["good"]


def test_the_release_waits_a_reply_window_from_the_block_that_began_the_next_epoch() -> None:
    w = Committee()
    epoch = w.epoch
    w.next_epoch()  # verifier 0 commits the epoch's first block now
    w.clock.advance(escrow_intake.RELEASE_DELAY_MS / 1000 - 1)
    assert w.query(0, wire.RELEASED_PATH, wire.released_query(epoch))[0] == Code.TOO_EARLY
    w.clock.advance(1)
    assert w.query(0, wire.RELEASED_PATH, wire.released_query(epoch))[0] == 0
    assert w.query(1, wire.RELEASED_PATH, wire.released_query(epoch))[0] == Code.TOO_EARLY  # saw it now
    assert w.query(0, wire.RELEASED_PATH, wire.released_query(epoch + 1))[0] == Code.TOO_EARLY


def test_a_withheld_reply_the_addressed_node_forwarded_is_handed_in_by_the_member_that_signed_it() -> None:
    """A user's forwarded request is answered straight to the user's proxies: only the member saw
    the reply. It may hand it in (a registered node that neither was addressed nor signed it may
    not: tests/unit/test_transcript_escrow_wire.py)."""
    w = Committee()
    epoch = w.epoch
    d = donate(w, "good")
    body = d.served(by=w.other)
    released_after_the_delay(w, epoch)
    stranger = Identity.generate()
    sealed = wire.seal_node_reveal(KEYS[0].public_bytes, stranger.signing, stranger.node_id, body)
    assert w.query(0, wire.NODE_REVEAL_PATH, sealed)[0] == Code.UNKNOWN_NODE  # not a model node of the model
    for i, k in enumerate(KEYS):
        sealed = wire.seal_node_reveal(k.public_bytes, w.other.signing, w.other.node_id, body)
        assert w.query(i, wire.NODE_REVEAL_PATH, sealed)[0] == 0
    for book in w.books:
        (counted,) = book.close(epoch)
        assert counted.node_id == w.other.node_id  # scored for the member that signed it, as a donor's would be


@pytest.mark.parametrize("data", [b"", b"\x00" * 7, b"\x00" * 9, b"\x00" * 41])
def test_a_released_query_that_is_not_an_epoch_is_refused(data: bytes) -> None:
    assert Committee().query(0, wire.RELEASED_PATH, data)[0] in (Code.MALFORMED, Code.OVERSIZE)


def test_released_pages_follow_one_another() -> None:
    book, rng = TranscriptBook(), random.Random(9)
    validators = {k.public_bytes: 10 for k in KEYS}
    plan, me = escrow.plan_of(validators), escrow.holders(validators)[0][0]
    values = []
    for n in range(escrow_intake.RELEASE_PAGE + 3):
        deal = escrow.deal(escrow.new_secret(rng), plan, rng)
        value = rng.randbytes(32)
        donor = (n // 16).to_bytes(20, "big")
        assert book.hold(donor, value, escrow.encode_commitments(deal.commitments), deal.shares[0], 3, NOW_MS) is None
        assert book.certify(donor, value, escrow.encode_commitments(deal.commitments), 3, NOW_MS) is None
        values.append(value)
    assert me == KEYS[[k.public_bytes for k in KEYS].index(me)].public_bytes
    seen = {4: NOW_MS}
    got: list[bytes] = []
    after = b""
    while True:
        code, _, page = escrow_intake.released_page(escrow_intake.release_list(book, 3, bytes(32)),
                                                    wire.released_query(3, after), 4, seen,
                                                    NOW_MS + escrow_intake.RELEASE_DELAY_MS)
        assert code == 0
        items = wire.decode_released(page)[1]
        got.extend(v for v, _, _ in items)
        if len(items) < escrow_intake.RELEASE_PAGE:
            break
        after = items[-1][0]
    assert got == sorted(values)
    assert escrow_intake.released_page([], wire.released_query(3), 4, seen,
                                       NOW_MS + escrow_intake.RELEASE_DELAY_MS - 1)[0] == Code.TOO_EARLY
    assert escrow_intake.released_page([], wire.released_query(3), 3, seen,
                                       NOW_MS + escrow_intake.RELEASE_DELAY_MS)[0] == Code.TOO_EARLY


def test_a_certificate_after_its_commitments_epoch_is_refused() -> None:
    """The framer holds a commitment in epoch e and certifies it in e + 1, after e's release was
    chosen: a reply to it would then be signed after the node looked for it, so the framer could
    withhold it unseen. Rule 10 takes a certificate only in its commitment's epoch."""
    w = Committee()
    d = Donated(w, "late")
    acceptances = [d.commit(i)[2] for i in range(4)]
    w.next_epoch()
    for code, why, _ in d.certify(acceptances):
        assert code == Code.LATE and "certificate must come in its commitment's epoch" in why
    for book in w.books:  # released (decision 0039: it is held, uncertified), and it never counts
        assert [v for v, _, _ in book.released(w.epoch - 1)] == [d.value] and book.close(w.epoch - 1) == []


def test_no_reply_signed_once_the_release_is_out_can_count() -> None:
    """The framer certifies at its epoch's last moment and sends the request only once the node has
    read the release (the node finds nothing it served, so it hands nothing in), then reveals the
    reply only if it is bad. The release waits until no reply to that commitment can count."""
    w = Committee()
    epoch = w.epoch
    d = donate(w, "after")  # certified now; the epoch ends at once
    w.next_epoch()
    waited = 0
    while w.query(0, wire.RELEASED_PATH, wire.released_query(epoch))[0] == Code.TOO_EARLY:
        w.clock.advance(1)
        waited += 1
    assert node_reveals(w, epoch, {}, from_=range(1)) == 0  # served nothing yet
    body = d.served(at_ms=int(w.clock.unix() * 1000))  # the node answers now, honestly
    sealed = wire.seal_reveal(KEYS[0].public_bytes, w.donor, w.donor.node_id, body)
    code, why, _ = w.query(0, wire.REVEAL_PATH, sealed)
    assert code == Code.LATE, (waited, why)


def _junk_book(junk: int, target: bytes, rng: random.Random, book: TranscriptBook | None = None,
               epoch: int = 3) -> TranscriptBook:
    """A book (``book``, or a new one) with ``junk`` withheld certified commitments of values below
    every other (a framer's: they need never be asked) and the framer's ``target``, all of ``epoch``."""
    book = book if book is not None else TranscriptBook()
    validators = {k.public_bytes: 10 for k in KEYS}
    deal = escrow.deal(escrow.new_secret(rng), escrow.plan_of(validators), rng)
    points = escrow.encode_commitments(deal.commitments)
    values = [b"\x00" + rng.randbytes(31) for _ in range(junk)] + [target]
    for n, value in enumerate(values):
        donor = (n // 16).to_bytes(20, "big")
        assert book.hold(donor, value, points, deal.shares[0], epoch, NOW_MS) is None
        assert book.certify(donor, value, points, epoch, NOW_MS) is None
    return book


def test_junk_withheld_commitments_of_low_value_cannot_push_a_framers_one_out_of_the_release() -> None:
    """The framer withholds MAX_RELEASED junk commitments whose values sort below its target's: a
    node reads at most MAX_RELEASED of a verifier's, so by value it would never read the target.
    A verifier chooses what it releases by a rank of the next epoch's seed, which no donor knew."""
    rng = random.Random(5)
    target = b"\xff" * 32
    book = _junk_book(wire.MAX_RELEASED, target, rng)
    seen = {4: NOW_MS}
    released = escrow_intake.release_list(book, 3, rng.randbytes(32))
    assert len(released) == wire.MAX_RELEASED
    read: list[bytes] = []  # as a node pages through it
    after = b""
    while True:
        code, _, page = escrow_intake.released_page(released, wire.released_query(3, after), 4, seen,
                                                    NOW_MS + escrow_intake.RELEASE_DELAY_MS)
        items = wire.decode_released(page)[1]
        assert code == 0 and [v for v, _, _ in items] == sorted(v for v, _, _ in items)
        read.extend(v for v, _, _ in items)
        if len(items) < escrow_intake.RELEASE_PAGE:
            break
        after = items[-1][0]
    assert len(read) == wire.MAX_RELEASED and target in read
    # with twice as many junk commitments, ranked by the seed alone the target went out about half
    # the time (decision 0037), and a proposer who tried block contents chose the seed that left it
    # out; shared out by donor, the target's donor withheld one and it comes out under every seed
    book = _junk_book(2 * wire.MAX_RELEASED, target, rng)
    for s in range(64):  # a grinding proposer's tries
        released = escrow_intake.release_list(book, 3, bytes([s]) * 32)
        assert len(released) == wire.MAX_RELEASED and target in {v for v, _, _ in released}


def test_a_one_shot_donors_withheld_commitment_comes_out_beside_the_largest_flood_the_book_takes() -> None:
    """Decision 0039, played at the book's limits: every other donor slot a verifier has
    (MAX_DONORS - 1) filled with a junk donor withholding MAX_COMMITS commitments, 65,520 in all,
    and a proposer free to pick the seed: the one-shot framer's withheld commitment comes out
    whatever the seed, so the node that served it hands it in. Only donors that withheld more than
    the level lose any, and what the seed picks is which of their own."""
    from verifier.audit.transcripts import MAX_COMMITS, MAX_DONORS

    assert MAX_DONORS <= wire.MAX_RELEASED  # the guarantee: the level is at least one
    rng = random.Random(7)
    junk = [[rng.randbytes(32) for _ in range(MAX_COMMITS)] for _ in range(MAX_DONORS - 1)]
    target = rng.randbytes(32)
    for _ in range(8):  # a grinding proposer's tries
        chosen = escrow_intake.release_choice([*junk, [target]], rng.randbytes(32))
        assert len(chosen) == len(set(chosen)) == wire.MAX_RELEASED and target in chosen
        out = set(chosen)  # the level is 1: each junk donor has one of its 16 out
        assert {sum(v in out for v in values) for values in junk} == {1}


@pytest.mark.parametrize("counts", [[1], [16] * 300, [1] * 4096, [3, 16, 1, 16] * 700, [16] * 4096, [2, 1] * 1500])
def test_the_release_level_shares_the_cap_out_fairly(counts: list[int]) -> None:
    """:func:`release_level`: the most each donor may have out such that all of it fits, and no
    higher level does; a donor at or below it has every one out."""
    cap = wire.MAX_RELEASED
    level = escrow_intake.release_level(counts)
    assert sum(min(c, level) for c in counts) <= cap
    assert sum(counts) <= cap or sum(min(c, level + 1) for c in counts) > cap
    rng = random.Random(len(counts))
    donors = [[rng.randbytes(32) for _ in range(c)] for c in counts]
    chosen = set(escrow_intake.release_choice(donors, bytes(32)))
    assert len(chosen) == min(cap, sum(counts))
    for values in donors:
        n = sum(v in chosen for v in values)
        assert n == len(values) if len(values) <= level else level <= n <= level + 1



def test_a_verifier_releases_by_the_seed_of_the_epoch_after() -> None:
    """Through the app: over MAX_RELEASED withheld commitments of an epoch, the verifier releases
    those :func:`escrow_intake.release_list` ranks lowest under the seed of the epoch after (drawn
    by the chain from the epoch's last block, after every commitment of it was made)."""
    w = Committee()
    epoch = w.epoch
    _junk_book(wire.MAX_RELEASED, b"\xff" * 32, random.Random(11), w.books[0], epoch)
    released_after_the_delay(w, epoch)
    audit = w.core.committed.audit
    assert audit is not None and audit.epoch == epoch + 1
    got: list[bytes] = []
    after = b""
    while True:
        code, why, page = w.query(0, wire.RELEASED_PATH, wire.released_query(epoch, after))
        assert code == 0, why
        items = wire.decode_released(page)[1]
        got.extend(v for v, _, _ in items)
        if len(items) < escrow_intake.RELEASE_PAGE:
            break
        after = items[-1][0]
    want = [v for v, _, _ in escrow_intake.release_list(w.books[0], epoch, audit.seed)]
    assert got == want and len(got) == wire.MAX_RELEASED
    assert got != [v for v, _, _ in escrow_intake.release_list(w.books[0], epoch, bytes(32))]


def test_a_chains_reply_window_bounds_the_replies_that_count() -> None:
    """Decision 0040: the genesis's ``reply_window_s`` is rule 1's window. A reply signed 21 s after
    its commitment counts at the default window and voids the set as late at a 20-s one; the
    release waits that window and as long again."""
    for window, taken in ((20, False), (None, True)):
        w = Committee(reply_window_s=window)
        d = donate(w, "slow")
        sealed = wire.seal_reveal(KEYS[0].public_bytes, w.donor, w.donor.node_id, d.served(at_ms=NOW_MS + 21_000))
        code, why, _ = w.query(0, wire.REVEAL_PATH, sealed)
        assert (code == 0) is taken, why
        assert taken or ("late" in why and "over 20 s after it" in why)
    w = Committee(reply_window_s=20)
    epoch = w.epoch
    w.next_epoch()
    query = wire.released_query(epoch, b"")
    w.clock.advance(39)
    code, why, _ = w.query(0, wire.RELEASED_PATH, query)
    assert code == Code.TOO_EARLY and "40 s old" in why
    w.clock.advance(1)
    assert w.query(0, wire.RELEASED_PATH, query)[0] == 0
