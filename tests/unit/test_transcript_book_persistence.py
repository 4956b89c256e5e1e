"""A verifier's book of users' transcripts survives its restarts (decision 0015, "Done since"):
``TranscriptBook.to_bytes``/``from_bytes`` (verifier/audit/transcripts.py) and the verifier's file
(verifier/run.py: ``load_book``, ``save_book``, ``Keeper``, ``book_keeper``, and ``run_verifier``'s use of them).

A restarted verifier that forgot its book counted nothing of the sets open at the restart and
voided nothing: a donor who committed before it could withhold the good replies after it for
free. Each test here fails if the book read back answers anything differently from the book
that wrote it, or if a damaged file is taken for a book."""

from __future__ import annotations

import errno
import logging
import os
import random
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from overlay.anon import signing
from overlay.directory import transcripts as wire
from overlay.wire import crypto, identity
from overlay.wire.identity import node_id_of
from overlay.wire.messages import ChatMessage, SamplingParams
from tests.unit.test_auditor import auditor
from tests.unit.test_committee_node import _home, _script
from tests.unit.test_transcript_intake import World
from verifier.audit import transcripts as tr
from verifier.audit import tx as at
from verifier.audit.loop import AuditSettings
from verifier.audit.transcripts import BookError, Transcript, TranscriptBook
from verifier.audit.tx import Opening, ReplyOutcome
from verifier.run import BOOK_FILE, BookFileError, book_keeper, load_book, run_verifier, save_book

MODEL = "smollm2-135m-instruct"
T0_MS = 1_800_000_000_000
NODE_KEYS = [crypto.SigningKey.from_bytes(bytes([0x51 + i]) * 32) for i in range(2)]
NODES = [node_id_of(k.public_bytes) for k in NODE_KEYS]
KEYS = {n: k.public_bytes for n, k in zip(NODES, NODE_KEYS, strict=True)}
DONORS = [bytes([0xD0 + i]) * 20 for i in range(3)]


def key_of(node_id: bytes, model: str) -> bytes | None:
    return KEYS.get(node_id) if model == MODEL else None


def transcript(i: int, node: int, received_ms: int, kind: str = "ok") -> Transcript:
    """Request ``i`` to ``NODES[node]``, committed at ``received_ms``, and its signed reply: signed
    900 ms later ("ok"), before the commitment arrived ("late"), by another node's key ("forged"),
    or to a seeded request ("seeded"); or the node's signed "busy" ("busy", decision 0044). The
    same ``i`` gives the same transcript."""
    seed = 7 if kind == "seeded" else None
    opening = Opening(bytes(16), MODEL, (ChatMessage("user", f"question {i}"),), SamplingParams(0.7, 1.0, 0, 64, seed))
    rid, nonce = crypto.blake2b(b"rid %d" % i, size=16), crypto.blake2b(b"nonce %d" % i, size=16)
    at_ms = received_ms - 1 if kind == "late" else received_ms + 900
    key = NODE_KEYS[1 - node] if kind == "forged" else NODE_KEYS[node]
    text = f"answer {i}"
    digest = signing.request_digest(opening.request(rid), NODES[node])
    if kind == "busy":
        sig = key.sign(signing.busy_signing_bytes(digest, MODEL, NODES[node], at_ms))
        return Transcript(NODES[node], nonce, opening, rid, ReplyOutcome(NODES[node], (), sig, at_ms, 0))
    _, sig = signing.ReplySigner(digest, MODEL, NODES[node]).add(text, (1, 2, 3), True, at_ms, key.sign)
    return Transcript(NODES[node], nonce, opening, rid, ReplyOutcome(NODES[node], ((text, (1, 2, 3)),), sig, at_ms, 0))


# --------------------------------------------------------------------------- a script of calls


@dataclass(frozen=True)
class Call:
    """One call on a book: what a donor, the ABCI intake or the audit loop does."""

    kind: str
    donor: bytes = b""
    value: bytes = b""
    epoch: int = 0
    now_ms: int = 0
    transcript: Transcript | None = None
    scored: tuple[tuple[bytes, int], ...] = ()


def play(book: TranscriptBook, c: Call) -> Any:
    """The call's answer (a refusal, what counts, what the carry hands out)."""
    if c.kind == "commit":
        return book.commit(c.donor, c.value, c.epoch, c.now_ms)
    if c.kind == "reveal":
        assert c.transcript is not None
        return book.reveal(c.donor, c.transcript, key_of)
    if c.kind == "no_reply":
        return book.no_reply(c.donor, c.value)
    if c.kind == "close":
        return book.close(c.epoch)
    if c.kind == "close_before":
        return book.close_before(c.epoch)
    if c.kind == "take_round":
        return book.take_round(c.epoch, {c.epoch - 1})
    if c.kind == "scored_round":
        return book.scored_rounds([c.epoch])
    return book.carry.add(c.epoch, c.scored)


def calls(ops: list[tuple[Any, ...]]) -> list[Call]:
    """Turn drawn operations into calls; reveals and "no reply" name one of the commitments made."""
    out: list[Call] = []
    made: list[tuple[bytes, Transcript]] = []
    for i, op in enumerate(ops):
        now = T0_MS + 1000 * i
        if op[0] == "commit":
            _, d, epoch, node, kind = op
            t = transcript(i, node, now, kind)
            made.append((DONORS[d], t))
            out.append(Call("commit", DONORS[d], t.commitment(), epoch, now))
        elif op[0] == "stray":  # a commitment nobody can open
            out.append(Call("commit", DONORS[op[1]], crypto.blake2b(b"stray %d" % i), op[2], now))
        elif op[0] in ("recommit", "reveal", "no_reply") and made:
            donor, t = made[op[1] % len(made)]
            if op[2]:
                donor = DONORS[(DONORS.index(donor) + 1) % len(DONORS)]
            if op[0] == "recommit":
                out.append(Call("commit", donor, t.commitment(), 1, now))
            else:
                out.append(Call(op[0], donor, t.commitment(), transcript=t))
        elif op[0] in ("close", "close_before", "take_round", "scored_round"):
            out.append(Call(op[0], epoch=op[1]))
        elif op[0] == "carry":
            out.append(Call("carry", epoch=op[1], scored=tuple((NODES[n], s) for n, s in op[2])))
    return out


COMMIT = st.tuples(st.just("commit"), st.integers(0, 2), st.integers(0, 2), st.integers(0, 1),
                   st.sampled_from(["ok", "ok", "ok", "ok", "late", "forged", "seeded", "busy"]))
REVEAL = st.tuples(st.just("reveal"), st.integers(0, 63), st.integers(0, 9).map(lambda n: n == 0))
OPS = st.lists(st.one_of(
    COMMIT, COMMIT, COMMIT, REVEAL, REVEAL, REVEAL,  # weighted: sets get filled and revealed
    st.tuples(st.just("stray"), st.integers(0, 2), st.integers(0, 2)),
    st.tuples(st.just("recommit"), st.integers(0, 63), st.booleans()),
    st.tuples(st.just("no_reply"), st.integers(0, 63), st.booleans()),
    st.tuples(st.just("close"), st.integers(0, 2)),
    st.tuples(st.just("close_before"), st.integers(0, 3)),
    st.tuples(st.just("take_round"), st.integers(0, 5)),
    st.tuples(st.just("scored_round"), st.integers(0, 5)),
    st.tuples(st.just("carry"), st.integers(0, 8),
              st.lists(st.tuples(st.integers(0, 1), st.integers(0, 1_000_000)), max_size=5)),
), min_size=10, max_size=120)


def state(book: TranscriptBook) -> tuple[Any, ...]:
    return (book.to_bytes(), book.burnt, book.history, book.refused, book.voided, book.open_epochs(),
            book.carry.held(), book.carry.dropped)


def restarted(book: TranscriptBook) -> TranscriptBook:
    """The book a restarted verifier reads back from what this one wrote."""
    return TranscriptBook.from_bytes(book.to_bytes())


@settings(max_examples=200, deadline=None)
@given(OPS, st.data())
def test_a_book_read_back_answers_every_later_call_as_the_book_that_wrote_it(ops: list[tuple[Any, ...]],
                                                                             data: st.DataObject) -> None:
    script = calls(ops)
    restarts = data.draw(st.sets(st.integers(0, len(script))), label="restart before call")
    original, book = TranscriptBook(), TranscriptBook()
    for i, c in enumerate(script):
        if i in restarts:
            raw = book.to_bytes()
            book = TranscriptBook.from_bytes(raw)
            assert book.to_bytes() == raw
        assert play(book, c) == play(original, c), (i, c.kind)
    assert state(book) == state(original)
    assert state(restarted(book)) == state(original)


# --------------------------------------------------------------------------- decision 0015's worry


def committed_set(book: TranscriptBook, donor: bytes, n: int, epoch: int = 5) -> list[Transcript]:
    """``donor`` commits ``n`` requests in ``epoch`` and gets their replies."""
    out = []
    for i in range(n):
        t = transcript(100 * epoch + i, i % 2, T0_MS + i)
        assert book.commit(donor, t.commitment(), epoch, T0_MS + i) is None
        out.append(t)
    return out


def test_a_donor_who_withholds_after_the_restart_voids_its_set_as_without_one() -> None:
    donor = DONORS[0]
    kept, lost = TranscriptBook(), TranscriptBook()
    for book in (kept, lost):
        got = committed_set(book, donor, 3)  # the same three transcripts in both
        assert book.reveal(donor, got[0], key_of) is None  # a bad one, say, before the restart
    kept, lost = restarted(kept), TranscriptBook()  # the restart: read back, or forgotten
    for book in (kept, lost):
        book.reveal(donor, got[1], key_of)  # another after it; the third, a good one, is withheld
    assert kept.close(5) == [] and kept.history[donor] == (0, 1) and kept.voided == 1  # void, as without a restart
    assert lost.close(5) == [] and lost.history == {} and lost.voided == 0  # what a forgetful verifier did


def test_a_donor_who_says_no_reply_after_the_restart_burns_as_without_one() -> None:
    donor = DONORS[1]
    book = TranscriptBook()
    for epoch in range(1, 3):  # two void sets: within the budget (2 + a fifth of its sets)
        (t,) = committed_set(book, donor, 1, epoch)
        assert book.no_reply(donor, t.commitment()) is None
    (t,) = committed_set(book, donor, 1, 3)
    book = restarted(book)
    assert donor not in book.burnt and book.history[donor] == (0, 2)
    assert book.no_reply(donor, t.commitment()) is None
    assert donor in book.burnt
    assert (book.commit(donor, b"\x01" * 32, 4, T0_MS) or "").startswith("burnt")
    assert (restarted(book).commit(donor, b"\x01" * 32, 4, T0_MS) or "").startswith("burnt")


def test_a_donor_who_reveals_everything_after_the_restart_counts_as_without_one() -> None:
    donor = DONORS[2]
    plain, book = TranscriptBook(), TranscriptBook()
    for b in (plain, book):
        got = committed_set(b, donor, 6)
        for t in got[:2]:
            assert b.reveal(donor, t, key_of) is None
    book = restarted(book)
    for b in (plain, book):
        for t in got[2:]:
            assert b.reveal(donor, t, key_of) is None
    counted = book.close(5)
    assert counted == plain.close(5) and len(counted) == 6
    assert book.history[donor] == (1, 0)


def test_a_transcript_at_a_transcripts_limits_survives_the_restart() -> None:
    """The longest transcript a donor may hand in (decision 0032: 256 messages, 128 KiB of them,
    max_tokens 4,096 and a reply of 8,192 token ids), past every limit of a challenge, is kept."""
    messages = (*[ChatMessage(r, "w" * 500) for _ in range(127) for r in ("user", "assistant")],
                ChatMessage("system", "s"), ChatMessage("user", "x" * (wire.TRANSCRIPT_PROMPT_BYTES - 127_001)))
    opening = Opening(bytes(16), MODEL, messages, SamplingParams(0.7, 1.0, 0, wire.TRANSCRIPT_MAX_TOKENS))
    assert len(messages) == wire.TRANSCRIPT_MAX_MESSAGES and wire.fits(MODEL, messages, opening.params) is None
    assert wire.opening_problem(MODEL, messages, opening.params) is not None
    rid, nonce, at_ms = b"\x07" * 16, b"\x08" * 16, T0_MS + 900
    signer = signing.ReplySigner(signing.request_digest(opening.request(rid), NODES[0]), MODEL, NODES[0])
    per = wire.TRANSCRIPT_MAX_REPLY_TOKENS // 16
    chunks = tuple((f"part {j} ", tuple(range(j * per, (j + 1) * per))) for j in range(16))
    for j, (text, ids) in enumerate(chunks):
        _, sig = signer.add(text, ids, j == 15, at_ms, NODE_KEYS[0].sign)
    t = Transcript(NODES[0], nonce, opening, rid, ReplyOutcome(NODES[0], chunks, sig, at_ms, 0))
    book = TranscriptBook()
    assert book.commit(DONORS[0], t.commitment(), 5, T0_MS) is None
    assert book.reveal(DONORS[0], t, key_of) is None
    [c] = restarted(book).close(5)
    assert c.transcript == t


def test_a_commitment_taken_before_the_restart_still_refuses_a_late_reply_after_it() -> None:
    book = TranscriptBook()
    t = transcript(1, 0, T0_MS, "late")  # signed before the commitment arrived: committed after the reply
    assert book.commit(DONORS[0], t.commitment(), 5, T0_MS) is None
    book = restarted(book)
    assert (book.reveal(DONORS[0], t, key_of) or "").startswith("late")
    assert book.voided == 1 and book.close(5) == []


def test_a_restarted_verifier_voids_what_it_took_before_the_restart_through_its_queries() -> None:
    """The intake (verifier/abci_app.py) over a book read back: the reveal of a commitment taken
    before the restart is taken, a "no reply" for another voids the set."""
    w = World()
    b1, v1 = w.request("first")
    _b2, v2 = w.request("second")
    assert w.commit(v1)[0] == 0 and w.commit(v2)[0] == 0
    w.app.transcripts = w.book = restarted(w.book)
    assert w.reveal(b1)[0] == 0
    assert w.reveal(wire.NoReply(v2))[0] == 0
    epoch = w.app.core.committed.audit.epoch  # type: ignore[union-attr]
    assert w.book.close(epoch) == [] and w.book.history[w.donor.node_id] == (0, 1)


def test_scores_held_for_the_chains_minimum_survive_the_restart() -> None:
    node = NODES[0]
    book = TranscriptBook()
    a = auditor(0, transcripts=book)
    assert a.transcript_scores(1, [(node, 600_000)] * 3) is None  # three: held for a fourth
    b = auditor(0, transcripts=restarted(book))
    sub = b.transcript_scores(2, [(node, 700_000)])
    assert sub is not None
    scores = at.decode_audit_tx(sub.raw, "audit-test")
    assert isinstance(scores, at.TranscriptScores) and scores.nodes == ((node, (600_000,) * 3 + (700_000,)),)


# --------------------------------------------------------------------------- limits


def test_the_books_limits_hold_after_the_restart() -> None:
    book = TranscriptBook()
    for i in range(tr.MAX_COMMITS):
        assert book.commit(DONORS[0], crypto.blake2b(b"c %d" % i), 0, T0_MS) is None
    for i in range(1, tr.MAX_DONORS):
        assert book.commit(i.to_bytes(20, "big"), crypto.blake2b(b"d %d" % i), 1, T0_MS) is None
    book = restarted(book)
    assert (book.commit(DONORS[0], b"\x02" * 32, 0, T0_MS) or "").startswith("too many")
    assert (book.commit(DONORS[1], b"\x03" * 32, 2, T0_MS) or "").startswith("full")
    assert (book.commit(DONORS[0], crypto.blake2b(b"c 3"), 0, T0_MS) or "").startswith("duplicate")
    assert (book.commit((7).to_bytes(20, "big"), crypto.blake2b(b"d 8"), 1, T0_MS) or "").startswith("duplicate")


def forge(body: list[Any], version: int = tr.BOOK_VERSION) -> bytes:
    """A file in the book's format (module docstring of verifier/audit/transcripts.py) around ``body``."""
    packed = msgpack.packb(body, use_bin_type=True)
    return bytes(msgpack.packb([version, crypto.blake2b(packed, person=b"gt-book"), body], use_bin_type=True))


def a_set(epoch: int, donor: bytes, values: list[bytes], void: str = "", at: int = T0_MS) -> list[Any]:
    return [epoch, donor, void, [[v, at, None, None, None] for v in values]]


def body(sets: list[Any] | None = None, burnt: list[Any] | None = None, history: list[Any] | None = None,
         refused: list[Any] | None = None, voided: int = 0, carry: list[Any] | None = None,
         pending: list[Any] | None = None, idle: list[Any] | None = None) -> list[Any]:
    return [sets or [], burnt or [], history or [], refused or [], voided, carry or [0, []], pending or [], idle or []]


def test_the_format_is_as_documented() -> None:
    book = TranscriptBook()
    t = transcript(1, 0, T0_MS)
    book.commit(DONORS[0], t.commitment(), 3, T0_MS)
    book.reveal(DONORS[0], t, key_of)
    book.commit(DONORS[1], b"\x05" * 32, 4, T0_MS + 1)
    book.no_reply(DONORS[1], b"\x05" * 32)
    book.carry.add(3, [(NODES[1], 42)])
    reply = msgpack.packb(t.reply.to_wire(), use_bin_type=True)
    want = body(
        sets=[[3, DONORS[0], "", [[t.commitment(), T0_MS, [t.node_id, t.nonce, t.opening.encode(), t.request_id,
                                                           reply, b""], None, None]]],
              a_set(4, DONORS[1], [b"\x05" * 32], "no reply: a committed request got none", T0_MS + 1)],
        history=[[DONORS[1], 0, 1]], refused=[["no reply", 1]], voided=1, carry=[0, [[NODES[1], [[3, 42]]]]])
    assert book.to_bytes() == forge(want)
    assert TranscriptBook.from_bytes(forge(want)).to_bytes() == forge(want)


@pytest.mark.parametrize(("raw", "why"), [
    (forge(body([a_set(0, i.to_bytes(20, "big"), [crypto.blake2b(b"%d" % i)]) for i in range(tr.MAX_DONORS + 1)])),
     r"4097 sets .* over the book's limit of 4096"),
    (forge(body([a_set(0, DONORS[0], [crypto.blake2b(b"%d" % i) for i in range(tr.MAX_COMMITS + 1)])])),
     r"17 commitments of one donor and epoch, over the book's limit of 16"),
    (forge(body([a_set(0, DONORS[0], [b"\x01" * 32]), a_set(1, DONORS[0], [b"\x01" * 32])])), "in two sets"),
    (forge(body([a_set(0, DONORS[0], [b"\x01" * 32]), a_set(0, DONORS[0], [b"\x02" * 32])])), "stands twice"),
    (forge(body(history=[[DONORS[1], 0, 1], [DONORS[0], 0, 1]])), "canonical"),
    (forge(body(history=[[DONORS[0], 0, 1], [DONORS[0], 0, 2]])), "canonical"),
    (forge(body(burnt=[DONORS[0]])), "burnt donor has no history"),
    (forge(body(history=[[DONORS[0], -1, 1]])), "count of complete sets"),
    (forge(body(refused=[["x" * 65, 1]])), "refusal kind"),
    (forge(body([a_set(0, DONORS[0][:19], [])])), "a donor is not 20 bytes"),
    (forge(body([a_set(0, DONORS[0], [b"\x01" * 31])])), "a commitment is not 32 bytes"),
    (forge(body([[0, DONORS[0], "", [[b"\x01" * 32, T0_MS, [NODES[0], b"\x00" * 16, b"junk", b"\x00" * 16,
                                                                   b"junk", b""], None, None]]]])),
     "a transcript in it does not decode"),
    (forge(body(carry=[0, [[NODES[0], []]]])), "held with no scores"),
    (forge(body()[:5]), "not a saved book"),
    (forge(body()[:6]), "not a saved book"),  # format 2 has pending rounds
    (forge(body()[:7]), "not a saved book"),  # format 4 has idle marks
    (forge(body(), version=3), "not a saved book"),  # format 3 has none
    (forge(body(), version=1), "not a saved book"),  # format 1 has none
    (forge(body(idle=[[DONORS[0], 0]])), "marked 0 times"),
    (forge(body(idle=[[DONORS[0], 1], [DONORS[0], 2]])), "twice"),
    (forge(body(idle=[[DONORS[1], 1], [DONORS[0], 1]])), "canonical"),
    (forge(body(idle=[[DONORS[0][:19], 1]])), "an idle donor is not 20 bytes"),
    (forge(body(pending=[[4, []]])), "holds no transcripts"),
    (forge(body(pending=[[r, [[DONORS[0], NODES[0], None]]] for r in range(tr.PENDING_ROUNDS + 1)])),
     "3 rounds in progress, over the book's limit of 2"),
    (forge(body(pending=[[4, [[DONORS[0], NODES[0], b"junk"]]]])), "not a saved book"),
    (forge(body(), version=5), "format version 5; this verifier reads versions 1 to 4"),
    (msgpack.packb([tr.BOOK_VERSION, b"\x00" * 32, body()], use_bin_type=True), "checksum"),
    (forge(body()) + b"\x00", "checksum"),
    (b"", "cut short"),
    (b"\x93\x01", "cut short"),
    (b"\xc1", "malformed msgpack"),
    (msgpack.packb({"sets": []}), "not a saved book|malformed"),
    (b"gentorrent transcripts\n", "not a saved book|malformed"),
])
def test_what_is_not_a_saved_book_is_refused_with_the_reason(raw: bytes, why: str) -> None:
    with pytest.raises(BookError, match=why):
        TranscriptBook.from_bytes(raw)


def test_a_transcript_that_does_not_open_its_commitment_is_refused() -> None:
    t = transcript(1, 0, T0_MS)
    entry = wire_of(t)
    assert TranscriptBook.from_bytes(forge(body([[0, DONORS[0], "", [[t.commitment(), T0_MS, entry, None, None]]]])))
    with pytest.raises(BookError, match="does not open its commitment"):
        TranscriptBook.from_bytes(forge(body([[0, DONORS[0], "", [[b"\x01" * 32, T0_MS, entry, None, None]]]])))


def wire_of(t: Transcript, version: int = tr.BOOK_VERSION) -> list[Any]:
    out = [t.node_id, t.nonce, t.opening.encode(), t.request_id, msgpack.packb(t.reply.to_wire(), use_bin_type=True)]
    return [*out, t.secret] if version > 2 else out


def test_a_round_in_progress_is_refused_when_it_stands_twice_or_counts_for_another_node() -> None:
    t = transcript(1, 0, T0_MS)
    good = [DONORS[0], NODES[0], wire_of(t)]
    assert TranscriptBook.from_bytes(forge(body(pending=[[4, [good]]]))).pending[4][0].transcript == t
    with pytest.raises(BookError, match="not counted for the node that signed"):
        TranscriptBook.from_bytes(forge(body(pending=[[4, [[DONORS[0], NODES[1], wire_of(t)]]]])))
    with pytest.raises(BookError, match="stands twice"):
        TranscriptBook.from_bytes(forge(body(pending=[[4, [good]], [4, [good]]])))
    with pytest.raises(BookError, match="canonical"):
        TranscriptBook.from_bytes(forge(body(pending=[[5, [good]], [4, [good]]])))


def test_a_book_of_format_1_loads_with_no_round_in_progress() -> None:
    """A verifier upgraded past format 1 keeps the book its earlier version wrote."""
    t = transcript(1, 0, T0_MS)
    old = body([[3, DONORS[0], "", [[t.commitment(), T0_MS, wire_of(t, 1)]]]], carry=[0, [[NODES[1], [[3, 42]]]]])[:6]
    book = TranscriptBook.from_bytes(forge(old, version=1))
    assert book.pending == {} and book.carry.held() and book.open_epochs() == [3]
    assert book.take_round(4) == ([tr.Counted(DONORS[0], NODES[0], t)], (4,))


def test_a_book_of_format_2_loads_with_no_escrowed_commitment() -> None:
    """A verifier upgraded past format 2 (before decision 0037) keeps the book its earlier version
    wrote, and writes it in format 4 from then on."""
    t = transcript(1, 0, T0_MS)
    old = body([[3, DONORS[0], "", [[t.commitment(), T0_MS, wire_of(t, 2)]]]],
               pending=[[2, [[DONORS[1], NODES[0], wire_of(t, 2)]]]])[:7]
    book = TranscriptBook.from_bytes(forge(old, version=2))
    assert book.open_epochs() == [3] and book.pending[2][0].transcript == t
    assert book.to_bytes() == forge(body([[3, DONORS[0], "", [[t.commitment(), T0_MS, wire_of(t), None, None]]]],
                                         pending=[[2, [[DONORS[1], NODES[0], wire_of(t)]]]]))
    with pytest.raises(BookError, match="not a saved book"):  # format 2 entries have three items
        TranscriptBook.from_bytes(forge(body([[3, DONORS[0], "", [[t.commitment(), T0_MS, wire_of(t), None, None]]]]),
                                        version=2))


def test_a_round_taken_and_not_yet_scored_is_taken_again_by_a_restarted_verifier() -> None:
    """The audit loop takes round 6's transcripts (they leave the open sets) and scores them for
    most of the epoch; a verifier restarted before the scores went to the carry takes the same
    ones again from its saved book, and none once they did. Fails when the round's transcripts
    leave the book at the close (as before) or stay after they were scored."""
    book = TranscriptBook()
    for d, e in zip(DONORS[:2], (4, 5), strict=True):
        for t in committed_set(book, d, 2, e):
            assert book.reveal(d, t, key_of) is None
    taken, rounds = book.take_round(6)
    assert len(taken) == 4 and rounds == (6,) and book.open_epochs() == []
    again = restarted(book)
    assert again.take_round(6) == (taken, (6,))
    again.carry.add(6, [(NODES[0], 1)])
    again.scored_rounds(rounds)
    assert again.take_round(6) == ([], ()) and restarted(again).take_round(6) == ([], ())


def test_a_round_left_unscored_is_scored_with_the_next_and_dropped_after_it() -> None:
    """A round whose scoring never finished (the verifier was down for the rest of it) is taken
    with the next round's transcripts, so nothing is lost to one restart, unless it is still being
    scored (``busy``: never scored twice); past PENDING_ROUNDS it is dropped and counted, so the
    book does not grow while scoring keeps failing."""
    book = TranscriptBook()
    first = [t for t in committed_set(book, DONORS[0], 2, epoch=4) if book.reveal(DONORS[0], t, key_of) is None]
    round5, _ = book.take_round(5)
    assert [c.transcript for c in round5] == first
    later = [t for t in committed_set(book, DONORS[1], 2, epoch=5) if book.reveal(DONORS[1], t, key_of) is None]
    round6, rounds = book.take_round(6)
    assert [c.transcript for c in round6] == first + later and rounds == (5, 6)  # round 5's, then round 6's
    assert [c.transcript for c in restarted(book).take_round(6, busy={5})[0]] == later
    assert [c.transcript for c in book.take_round(7)[0]] == later and book.refused["unscored"] == 2
    assert book.take_round(8) == ([], ()) and book.refused["unscored"] == 4 and book.pending == {}


def a_small_book() -> bytes:
    book = TranscriptBook()
    got = committed_set(book, DONORS[0], 2)
    book.reveal(DONORS[0], got[0], key_of)
    book.commit(DONORS[1], b"\x09" * 32, 6, T0_MS)
    book.no_reply(DONORS[1], b"\x09" * 32)
    book.carry.add(5, [(NODES[0], 1)])
    return book.to_bytes()


def test_no_cut_and_no_damaged_byte_of_a_book_loads() -> None:
    raw = a_small_book()
    for n in range(len(raw)):
        with pytest.raises(BookError):
            TranscriptBook.from_bytes(raw[:n])
        with pytest.raises(BookError):
            TranscriptBook.from_bytes(raw[:n] + bytes([raw[n] ^ 0x01]) + raw[n + 1:])


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512), st.integers(0, 4096), st.binary(min_size=1, max_size=8))
def test_garbage_and_spliced_books_raise_only_book_errors(junk: bytes, at_: int, patch: bytes) -> None:
    raw = a_small_book()
    at_ %= len(raw)
    for candidate in (junk, raw[:at_] + patch + raw[at_ + len(patch):], raw[:at_] + junk):
        if candidate == raw:
            continue
        with pytest.raises(BookError):
            TranscriptBook.from_bytes(candidate)


def test_a_book_over_the_size_limit_is_neither_written_nor_read() -> None:
    book = book_with_a_reveal()
    raw = book.to_bytes()
    assert TranscriptBook.from_bytes(raw, limit=len(raw)).to_bytes(limit=len(raw)) == raw
    with pytest.raises(BookError, match=f"{len(raw)} bytes, over the {len(raw) - 1} a saved book may take"):
        TranscriptBook.from_bytes(raw, limit=len(raw) - 1)
    with pytest.raises(BookError, match=f"the book takes {len(raw)} bytes, over the {len(raw) - 1}"):
        book.to_bytes(limit=len(raw) - 1)


def book_with_a_reveal() -> TranscriptBook:
    book = TranscriptBook()
    got = committed_set(book, DONORS[0], 2)
    book.reveal(DONORS[0], got[0], key_of)
    return book


# --------------------------------------------------------------------------- the verifier's file


def test_no_file_is_an_empty_book_and_a_saved_one_comes_back(tmp_path: Path) -> None:
    assert load_book(tmp_path).to_bytes() == TranscriptBook().to_bytes()
    book = book_with_a_reveal()
    save_book(tmp_path, book)
    assert (tmp_path / BOOK_FILE).stat().st_mode & 0o777 == 0o600
    assert state(load_book(tmp_path)) == state(book)


@pytest.mark.parametrize(("damage", "why"), [
    (lambda raw: raw[: len(raw) // 2], "checksum"),
    (lambda raw: b"", "cut short"),
    (lambda raw: random.Random(3).randbytes(300), "not a saved book|malformed|checksum|version|cut short"),
    (lambda raw: raw[:3] + bytes([raw[3] ^ 0x40]) + raw[4:], "checksum"),
])
def test_a_damaged_file_stops_the_verifier_naming_the_file_and_the_way_out(tmp_path: Path, damage: Any,
                                                                           why: str) -> None:
    path = tmp_path / BOOK_FILE
    path.write_bytes(damage(book_with_a_reveal().to_bytes()))
    with pytest.raises(BookFileError, match=why) as info:
        load_book(tmp_path)
    msg = str(info.value)
    assert str(path) in msg and f"mv {path} {path}.bad" in msg and "does not start" in msg
    assert isinstance(info.value, ValueError)


def test_an_oversized_or_unreadable_file_stops_the_verifier(tmp_path: Path) -> None:
    path = tmp_path / BOOK_FILE
    with path.open("wb") as f:
        f.truncate(tr.MAX_BOOK_BYTES + 1)  # sparse: nothing is written, and nothing may be read
    with pytest.raises(BookFileError, match=f"{tr.MAX_BOOK_BYTES + 1} bytes, over") as info:
        load_book(tmp_path)
    assert str(path) in str(info.value)
    path.unlink()
    path.mkdir()
    with pytest.raises(BookFileError, match="cannot be read"):
        load_book(tmp_path)


def test_a_write_that_fails_midway_leaves_the_old_file_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = book_with_a_reveal()
    save_book(tmp_path, old)
    before = (tmp_path / BOOK_FILE).read_bytes()
    new = restarted(old)
    new.commit(DONORS[2], b"\x07" * 32, 9, T0_MS)
    real_write = os.write

    def half_then_full(fd: int, data: Any) -> int:
        real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    def no_rename(src: Any, dst: Any) -> None:
        raise OSError(errno.EIO, "Input/output error")

    for name, fail in (("write", half_then_full), ("replace", no_rename)):  # the disk fills; the machine dies
        with monkeypatch.context() as m:
            m.setattr(os, name, fail)  # the os module identity.write_private writes through
            with pytest.raises(OSError):
                save_book(tmp_path, new)
        assert (tmp_path / BOOK_FILE).read_bytes() == before
        assert state(load_book(tmp_path)) == state(old)
    save_book(tmp_path, new)
    assert state(load_book(tmp_path)) == state(new)


async def test_the_book_is_written_while_it_changes_and_a_failed_write_is_tried_again(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    every = 0.005  # the book keeper's turn here (BOOK_SAVE_S in the verifier)
    path = tmp_path / BOOK_FILE
    book = TranscriptBook()
    real = identity.write_private
    failures = [OSError(errno.ENOSPC, "No space left on device")]
    send, written = trio.open_memory_channel[bytes](64)

    def flaky(p: Path, data: bytes) -> None:  # in the keeper's worker thread
        if failures:
            raise failures.pop()
        real(p, data)
        trio.from_thread.run_sync(send.send_nowait, data)

    with trio.fail_after(60):  # only so that a broken keeper fails instead of hanging: each wait ends at a write
        async with trio.open_nursery() as nursery:
            nursery.start_soon(book_keeper(tmp_path, book, write=flaky).keep, every)
            await trio.sleep(20 * every)
            assert not path.exists()  # nothing changed: nothing written
            book.commit(DONORS[0], b"\x01" * 32, 3, T0_MS)
            with caplog.at_level(logging.ERROR, "gentorrent.verifier"):
                assert await written.receive() == path.read_bytes()
            assert "No space left" in caplog.text and not failures  # the first write failed; a later one came
            assert (load_book(tmp_path).commit(DONORS[0], b"\x01" * 32, 3, T0_MS) or "").startswith("duplicate")
            book.carry.add(3, [(NODES[0], 5)])
            await written.receive()
            assert load_book(tmp_path).carry.held() == 1
            await trio.sleep(20 * every)
            nursery.cancel_scope.cancel()
    assert written.statistics().current_buffer_used == 0  # no change, no write


async def test_the_verifier_refuses_to_start_on_a_damaged_book(tmp_path: Path) -> None:
    d = _home(tmp_path)
    (d / BOOK_FILE).write_bytes(b"\x93\x01")
    started = tmp_path / "started"
    exe = _script(tmp_path, f"touch {started}; exit 3")  # had it started, it would exit at once (CometExited)
    with pytest.raises(BookFileError, match=str(d / BOOK_FILE)):
        await run_verifier(d, binary=exe, handle_signals=False, audit=AuditSettings())
    assert not started.exists()  # refused before CometBFT was started


async def test_the_verifier_writes_its_book_when_it_stops(tmp_path: Path) -> None:
    d = _home(tmp_path)
    before = book_with_a_reveal()
    save_book(d, before)
    exe = _script(tmp_path, "exec sleep 600")
    took = trio.Event()
    seen: list[TranscriptBook] = []
    written: list[TranscriptBook] = []

    async def audits(data_dir: Path, settings: Any, seed: bytes, pool: Any, book: TranscriptBook,
                     save: Any) -> None:
        seen.append(book)
        book.commit(DONORS[2], b"\x0c" * 32, 7, T0_MS)  # what the ABCI queries would have added
        assert await save()  # the loop's writer of the book (before its transcript scores go out)
        written.append(load_book(data_dir))
        took.set()
        await trio.sleep_forever()

    with trio.fail_after(60):  # only so that a broken run_verifier fails instead of hanging
        async with trio.open_nursery() as nursery:
            await nursery.start(lambda task_status: run_verifier(d, binary=exe, handle_signals=False,
                                                                  audit=AuditSettings(), audit_loop=audits,
                                                                  task_status=task_status))
            await took.wait()
            nursery.cancel_scope.cancel()
    (book,) = seen
    assert before.open_epochs() == [5] and book.open_epochs() == [5, 7]  # taken back at start, and what came since
    assert state(load_book(d)) == state(book) == state(written[0])


async def test_writes_of_the_book_take_turns_so_an_older_one_never_lands_last(tmp_path: Path) -> None:
    """The audit loop writes the book at once (before its transcript scores go out) beside the
    periodic writer: a write whose bytes were made first lands first. Fails when a second write
    can start while the first is still in its thread (the older bytes would land last)."""
    book = TranscriptBook()
    release = threading.Event()
    stalled: list[bool] = []

    def slow(p: Path, data: bytes) -> None:  # in the keeper's worker thread: the first write stalls
        if not stalled:
            stalled.append(True)
            assert release.wait(60)
        identity.write_private(p, data)

    keeper = book_keeper(tmp_path, book, write=slow)
    assert await keeper.save() and not stalled  # nothing changed: nothing written
    book.commit(DONORS[0], b"\x01" * 32, 3, T0_MS)
    with trio.fail_after(60):  # only so that a broken keeper fails instead of hanging
        async with trio.open_nursery() as nursery:
            nursery.start_soon(keeper.save)  # its bytes: one commitment; stalls in its thread
            await trio.testing.wait_all_tasks_blocked()
            book.commit(DONORS[1], b"\x02" * 32, 3, T0_MS)  # the book changes meanwhile
            nursery.start_soon(keeper.save)  # waits for its turn, then writes both commitments
            await trio.testing.wait_all_tasks_blocked()
            release.set()
    assert state(load_book(tmp_path)) == state(book)
    assert (load_book(tmp_path).commit(DONORS[1], b"\x02" * 32, 3, T0_MS) or "").startswith("duplicate")


def test_the_command_says_which_file_and_how_to_recover(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gentorrent.cli import main

    d = _home(tmp_path)
    (d / BOOK_FILE).write_bytes(b"\x93\x01")
    # the book is read before CometBFT is looked for: this holds on a machine without cometbft too
    assert main(["verifier", "--data-dir", str(d), "--audit"]) == 2
    err = capsys.readouterr().err
    assert f"{d / BOOK_FILE}: the book of users' transcripts does not load (cut short)" in err
    assert f"mv {d / BOOK_FILE} {d / BOOK_FILE}.bad" in err and "Traceback" not in err


def test_a_book_of_format_3_loads_with_no_idle_marks() -> None:
    """A verifier upgraded past format 3 (before decision 0041) keeps the book its earlier version
    wrote, and writes it in format 4 from then on."""
    book = TranscriptBook()
    t = transcript(1, 0, T0_MS)
    book.commit(DONORS[0], t.commitment(), 3, T0_MS)
    old = tr._encode_book(book, tr.MAX_BOOK_BYTES, 3)
    again = TranscriptBook.from_bytes(old)
    assert again.idle == {} and again.open_epochs() == [3] and again.to_bytes() == book.to_bytes() != old


def test_a_busy_refusal_taken_before_the_restart_is_read_back_and_still_no_sample() -> None:
    """Decision 0044: a book holding a node's signed "busy" (a transcript without chunks) is saved
    and read back, and the set closes as it would have: the refusal no sample, the reply counted."""
    donor = DONORS[0]
    plain, book = TranscriptBook(), TranscriptBook()
    refused, served = transcript(7, 0, T0_MS, "busy"), transcript(8, 1, T0_MS)
    for b in (plain, book):
        for t in (refused, served):
            assert b.commit(donor, t.commitment(), 5, T0_MS) is None
        assert b.reveal(donor, refused, key_of) is None
    book = restarted(book)
    for b in (plain, book):
        assert b.reveal(donor, served, key_of) is None
    (c,) = book.close(5)
    assert [c] == plain.close(5) and c.transcript == served and book.history[donor] == (1, 0)
