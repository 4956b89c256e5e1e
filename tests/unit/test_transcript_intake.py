"""Users' transcripts at a verifier (decision 0015): the ABCI queries /audit/transcript_commit and
/audit/transcript_reveal feed the verifier's TranscriptBook (verifier/abci_app.py), and at its
report time the audit loop closes the earlier epochs, scores what counts with its engine and
submits one TranscriptScores (kind 3) (verifier/audit/auditor.py)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
import trio

from overlay.anon import signing
from overlay.directory import transcripts as wire
from overlay.directory.registration import OP_REGISTER, Code, Entry, make_tx
from overlay.wire import crypto
from overlay.wire.clock import FakeClock
from overlay.wire.constants import ROLE_MODEL, ROLE_USER
from overlay.wire.crypto import SigningKey
from overlay.wire.identity import Identity
from overlay.wire.messages import ChatMessage, Request, SamplingParams
from tests.unit.test_auditor import END, MODEL, PKS, REPORT_FROM, SEEDS, FakeChain, FakeEngine, auditor, view
from verifier.abci.proto.tendermint.abci import types_pb2 as abci
from verifier.abci_app import CommitteeAbciApp
from verifier.app import CommitteeApp, Validator
from verifier.audit import tx as at
from verifier.audit.auditor import ScoreTranscripts, Submit
from verifier.audit.loop import AuditDriver
from verifier.audit.transcripts import Counted, Transcript, TranscriptBook

VERIFIER = crypto.SigningKey.from_bytes(b"\x07" * 32)
CHAIN = "transcripts"
NOW_MS = 1_700_000_000_000 + 5_000  # the chain's block time is 1_700_000_000 s


class World:
    """A committee core with a registered user (the donor), a stranger (not registered) and a
    model node serving MODEL, and this verifier's ABCI app over a book, on a hand-set clock;
    ``version1``: it takes version-1 commits (``--take-version1-commits``), as these tests of the
    book's intake need (escrowed ones: tests/unit/test_escrow_intake.py)."""

    def __init__(self, *, book: TranscriptBook | None = None, audits: bool = True, version1: bool = True) -> None:
        self.donor, self.stranger, self.node = Identity.generate(), Identity.generate(), Identity.generate()
        core = CommitteeApp()
        state = {"audit": {"epoch_blocks": 60, "challenges_per_node": 2}} if audits else {}
        core.init_chain(CHAIN, [Validator("ed25519", VERIFIER.public_bytes, 10)], json.dumps(state).encode())
        txs = [make_tx(self.donor.signing, CHAIN, OP_REGISTER, 1,
                       Entry(ROLE_USER, self.donor.x25519.public_bytes, "127.0.0.1:7000", "default")),
               make_tx(self.node.signing, CHAIN, OP_REGISTER, 1,
                       Entry(ROLE_MODEL, self.node.x25519.public_bytes, "127.0.0.1:7999", "default", MODEL, 1))]
        results, _ = core.finalize_block(1, 1_700_000_000, txs, b"\x01" * 32)
        assert all(r.ok for r in results), results
        core.commit()
        self.book = TranscriptBook() if book is None else book
        self.clock = FakeClock(unix=NOW_MS / 1000)
        self.app = CommitteeAbciApp(core, None, VERIFIER, transcripts=self.book, clock=self.clock,
                                    version1_commits=version1)

    def query(self, path: str, data: bytes) -> tuple[int, str]:
        res = self.app.query(abci.RequestQuery(path=path, data=data))
        return res.code, res.log

    def request(self, text: str = "how do tides work?") -> tuple[wire.Revealed, bytes]:
        """A committed request to the model node, answered and signed by it 900 ms after NOW."""
        msgs, params = (ChatMessage("user", text),), SamplingParams(0.7, 1.0, 0, 64, None)
        rid, nonce = crypto.random_bytes(16), crypto.random_bytes(16)
        req = Request(request_id=rid, model=MODEL, messages=msgs, params=params, k=3, return_paths=(),
                      continuation="")
        digest = signing.request_digest(req, self.node.node_id)
        at_ms = NOW_MS + 900
        _, sig = signing.ReplySigner(digest, MODEL, self.node.node_id).add("tides are...", (4, 5), True, at_ms,
                                                                           self.node.signing.sign)
        b = wire.Revealed(self.node.node_id, nonce, MODEL, msgs, params, rid, self.node.node_id,
                          (("tides are...", (4, 5)),), sig, at_ms)
        return b, wire.commitment(nonce, self.node.node_id, digest)

    def commit(self, value: bytes, who: Identity | None = None, *, to: bytes | None = None,
               sent_ms: int = NOW_MS) -> tuple[int, str]:
        who = who or self.donor
        return self.query(wire.COMMIT_PATH, wire.encode_commit(who, who.node_id, to or VERIFIER.public_bytes,
                                                                sent_ms, value))

    def reveal(self, body: wire.Body, who: Identity | None = None) -> tuple[int, str]:
        who = who or self.donor
        return self.query(wire.REVEAL_PATH, wire.seal_reveal(VERIFIER.public_bytes, who, who.node_id, body))


def test_a_committed_transcript_is_taken_and_counts_for_the_signing_node() -> None:
    w = World()
    b, value = w.request()
    assert w.commit(value) == (0, "committed: reveal the transcript (or that no reply came) before the next "
                                  "epoch's report")
    code, why = w.reveal(b)
    assert code == 0 and "taken" in why
    epoch = w.app.core.committed.audit.epoch  # type: ignore[union-attr]
    (counted,) = w.book.close(epoch)
    assert counted.donor == w.donor.node_id and counted.node_id == w.node.node_id
    assert counted.transcript.reply.chunks == (("tides are...", (4, 5)),)


def test_a_verifier_takes_no_commitment_without_escrow_unless_told_to() -> None:
    """Decision 0037: a donor that commits without escrow could withhold its good replies, and the
    node could not hand them in; so by default the verifier refuses such a commit, whatever it holds."""
    w = World(version1=False)
    b, value = w.request()
    code, why = w.commit(value)
    assert code == Code.UNSUPPORTED_VERSION and "without escrow" in why and "/audit/transcript_escrow_commit" in why
    assert w.book.open_epochs() == [] and w.book.refused == {}
    assert w.reveal(b)[0] == Code.INVALID_FIELD  # nothing to reveal: unknown


def test_refused_commits_say_why_and_change_nothing() -> None:
    w = World()
    _, value = w.request()
    assert w.commit(value, w.stranger)[0] == Code.UNKNOWN_NODE
    assert w.commit(value, to=crypto.SigningKey.generate().public_bytes) == (
        Code.INVALID_FIELD, "this commit names another verifier's key; make one for each verifier with the key its "
                            "/audit/donate_key answers")
    code, why = w.commit(value, sent_ms=NOW_MS - wire.MAX_SKEW_MS - 1)
    assert code == Code.INVALID_FIELD and "check your clock" in why
    forged = wire.encode_commit(w.stranger, w.donor.node_id, VERIFIER.public_bytes, NOW_MS, value)
    assert w.query(wire.COMMIT_PATH, forged)[0] == Code.BAD_SIGNATURE
    assert w.query(wire.COMMIT_PATH, b"rubbish")[0] == Code.MALFORMED
    assert w.query(wire.COMMIT_PATH, b"\x00" * (wire.MAX_COMMIT_BYTES + 1))[0] == Code.OVERSIZE
    assert w.book.open_epochs() == [] and not w.book.burnt
    assert w.commit(value)[0] == 0
    assert w.commit(value)[0] == Code.DUPLICATE


def test_refused_reveals_say_why_and_a_bad_one_voids_the_set() -> None:
    w = World()
    b, value = w.request()
    assert w.commit(value)[0] == 0
    assert w.query(wire.REVEAL_PATH, b"rubbish")[0] == Code.MALFORMED
    other_key = wire.seal_reveal(crypto.SigningKey.generate().public_bytes, w.donor, w.donor.node_id, b)
    code, why = w.query(wire.REVEAL_PATH, other_key)
    assert code == Code.MALFORMED and "/audit/donate_key" in why
    assert w.reveal(b, w.stranger)[0] == Code.UNKNOWN_NODE
    assert not w.book.burnt
    code, why = w.reveal(wire.Revealed(*[*_fields(b)[:9], b.signed_at_ms + 1]))
    assert code == Code.BAD_SIGNATURE and why.startswith("forged")
    assert w.book.history[w.donor.node_id] == (0, 1)  # a reveal that fails its checks voids the set (rule 3, 6)
    w.book.burnt.add(w.donor.node_id)  # as past its void budget (rule 6)
    assert w.commit(w.request()[1])[0] == Code.CONFLICT


def _fields(b: wire.Revealed) -> list[Any]:
    return [b.node_id, b.nonce, b.model, b.messages, b.params, b.request_id, b.served_by, b.chunks, b.signature,
            b.signed_at_ms]


def test_no_reply_voids_the_set_and_an_unknown_commitment_burns_nobody() -> None:
    w = World()
    b, value = w.request()
    assert w.reveal(b)[0] == Code.INVALID_FIELD  # never committed: refused as unknown
    assert w.reveal(wire.NoReply(value))[0] == Code.INVALID_FIELD
    assert not w.book.burnt
    assert w.commit(value)[0] == 0
    code, why = w.reveal(wire.NoReply(value))
    assert code == 0 and "counts for nothing" in why
    assert w.book.history[w.donor.node_id] == (0, 1)  # one void set: within its budget (rule 6)


def test_a_verifier_that_lost_its_book_burns_no_honest_donor() -> None:
    """A verifier that starts with an empty book (its book file was lost, or moved aside because it
    did not load: verifier/run.py) refuses the reveals of commitments it never saw, voiding
    nothing; the donor's commitments made after the restart count."""
    w = World()
    old, old_value = w.request("before the restart")
    assert w.commit(old_value)[0] == 0
    w.app.transcripts = w.book = TranscriptBook()  # the restart, without the book
    new, new_value = w.request("after the restart")
    assert w.commit(new_value)[0] == 0
    code, why = w.reveal(old)
    assert code == Code.INVALID_FIELD and why.startswith("unknown")
    assert w.reveal(new)[0] == 0
    assert not w.book.burnt
    epoch = w.app.core.committed.audit.epoch  # type: ignore[union-attr]
    assert [c.transcript.opening.messages[-1].content for c in w.book.close(epoch)] == ["after the restart"]


def test_a_verifier_without_a_book_or_a_chain_without_audits_refuses_transcripts() -> None:
    for w in (World(audits=False), World()):
        if w.app.core.committed.audit is not None:
            w.app.transcripts = None
        _, _value = w.request()
        for path in (wire.COMMIT_PATH, wire.REVEAL_PATH):
            assert w.query(path, b"x")[0] == Code.AUDITS_OFF


# --------------------------------------------------------------------------- epoch close -> kind 3


def counted(node: bytes, text: str, model: str = MODEL, donor: bytes = b"\x0d" * 20) -> Counted:
    opening = at.Opening(bytes(16), model, (ChatMessage("user", text),), SamplingParams(0.7, 1.0, 0, 64, None))
    return Counted(donor, node, Transcript(node, b"\x01" * 16, opening, b"\x02" * 16,
                                           at.ReplyOutcome(node, (("x", (5, 6, 7)),), b"\x03" * 64, 1, 0)))


class StubBook(TranscriptBook):
    """A book whose closes hand out ``sets[epoch]`` (what counted), recording each close."""

    def __init__(self, sets: dict[int, list[Counted]]) -> None:
        super().__init__()
        self.sets = sets
        self.closed: list[int] = []

    def open_epochs(self) -> list[int]:
        return sorted(e for e in self.sets if e not in self.closed)

    def close(self, epoch: int) -> list[Counted]:
        self.closed.append(epoch)
        return list(self.sets.get(epoch, []))


def reported(a: Any) -> Any:
    return view(committed=(a.public_key,), reported=(a.public_key,))


def test_the_earlier_epochs_close_once_this_verifiers_report_is_on_the_chain() -> None:
    n1, n2 = b"\x0a" * 20, b"\x0b" * 20
    book = StubBook({0: [counted(n1, "a"), counted(n2, "b"), counted(n1, "c", model="other-model")],
                     1: [counted(n1, "now")]})
    a = auditor(0, transcripts=book)
    assert [x for x in a.plan(view(committed=(a.public_key,)), REPORT_FROM) if isinstance(x, ScoreTranscripts)] == []
    assert book.closed == []  # not before the report is on the chain
    (act,) = a.plan(reported(a), REPORT_FROM + 1)
    assert isinstance(act, ScoreTranscripts) and act.epoch == 1
    assert [c.transcript.opening.messages[0].content for c in act.counted] == ["a", "b"]  # models held only
    assert book.closed == [0]  # epoch 1's commitments still have an epoch to be revealed
    assert a.plan(reported(a), REPORT_FROM + 2) == []  # once
    sub = a.transcript_scores(1, [(n2, 300_000), (n1, 900_000), (n1, 800_000), (n1, 700_000), (n1, 600_000)])
    assert sub is not None
    tx = at.decode_audit_tx(sub.raw, "audit-test")
    assert isinstance(tx, at.TranscriptScores) and tx.epoch == 1 and tx.validator_pk == PKS[0]
    # n2 has one score: held until it has the chain's minimum (audits.MIN_TRANSCRIPTS), or dropped
    assert tx.nodes == ((n1, (900_000, 800_000, 700_000, 600_000)),)
    a.submitted(sub.key, retry=True)  # a network error: handed out again while the window lasts
    assert a.plan(reported(a), REPORT_FROM + 3) == [sub]
    a.submitted(sub.key, retry=False)
    assert a.plan(reported(a), REPORT_FROM + 4) == [] and a.plan(reported(a), END + 1) == []
    assert a.transcript_scores(2, []) is None
    later = a.transcript_scores(3, [(n2, 310_000)] * 3)  # n2's held score and three more: a vote
    assert later is not None
    scores = at.decode_audit_tx(later.raw, "audit-test")
    assert isinstance(scores, at.TranscriptScores) and scores.nodes == ((n2, (300_000, 310_000, 310_000, 310_000)),)


def test_a_donor_flooding_long_transcripts_gets_its_budget_scored_and_no_more() -> None:
    """Rule 8 in the audit loop: of a donor's 16 transcripts of the longest requests, the loop
    asks its engine to score what fits in the donor's budget (4 here); another donor's typical set
    is scored whole."""
    from verifier.audit.transcripts import SCORE_BUDGET, cost

    n = b"\x0a" * 20
    flood, honest = b"\xf1" * 20, b"\xa1" * 20

    def long(i: int) -> Counted:
        c = counted(n, f"{i} " + "w" * 4000, donor=flood)
        reply = at.ReplyOutcome(n, (("x", tuple(range(3000))),), b"\x03" * 64, 1, 0)
        return Counted(flood, n, Transcript(n, b"\x01" * 16, c.transcript.opening, b"\x02" * 16, reply))

    typical = [counted(n, f"typical {i}", donor=honest) for i in range(16)]
    a = auditor(0, transcripts=StubBook({0: [*(long(i) for i in range(16)), *typical]}))
    (act,) = a.plan(reported(a), REPORT_FROM + 1)
    assert isinstance(act, ScoreTranscripts)
    flooded = [c for c in act.counted if c.donor == flood]
    assert len(flooded) == 4 and sum(cost(c.transcript) for c in flooded) <= SCORE_BUDGET
    assert [c for c in act.counted if c.donor == honest] == typical


def test_the_loop_scores_a_round_within_this_verifiers_budget_node_by_node() -> None:
    """Rule 9 in the audit loop: many donors' transcripts of many nodes past the verifier's
    ``transcript_budget`` (``--transcript-budget``): the engine is asked to score a share of each
    node's within three quarters of it, every node some, the rest kept for the second draw with a
    quarter of the budget; under the budget, everything at once."""
    from verifier.audit.transcripts import cost

    nodes = [bytes([0x20 + j]) * 20 for j in range(8)]
    round_ = [counted(n, f"question {i} " + "w" * 400, donor=bytes([i]) * 20) for n in nodes for i in range(10)]
    per = cost(round_[0].transcript)
    a = auditor(0, transcripts=StubBook({0: round_}), transcript_budget=8 * 4 * per)
    (act,) = a.plan(reported(a), REPORT_FROM + 1)
    assert isinstance(act, ScoreTranscripts) and act.reserve == 8 * per
    assert sorted(c.node_id for c in act.counted) == sorted(nodes * 3)  # a share of 3 each
    assert sorted(c.node_id for c in act.spare) == sorted(nodes * 7) and not set(act.spare) & set(act.counted)
    b = auditor(0, transcripts=StubBook({0: round_}), transcript_budget=80 * per)
    (whole,) = b.plan(reported(b), REPORT_FROM + 1)
    assert isinstance(whole, ScoreTranscripts) and list(whole.counted) == round_ and whole.spare == ()


def _sizing_warnings(caplog: pytest.LogCaptureFixture, round_: list[Counted], budget: int,
                     listed: tuple[bytes, ...]) -> tuple[Any, list[str]]:
    caplog.clear()
    a = auditor(0, transcripts=StubBook({0: round_}), transcript_budget=budget)
    with caplog.at_level("WARNING", logger="gentorrent.audit"):
        acts = a.plan(view(committed=(a.public_key,), reported=(a.public_key,), nodes=((MODEL, listed),)),
                      REPORT_FROM + 1)
    return acts, [r.getMessage() for r in caplog.records if "raise --audit-threads" in r.getMessage()]


def test_a_verifier_whose_budget_is_too_small_for_the_network_says_what_to_raise(caplog: pytest.LogCaptureFixture) -> None:
    """Rule 9 shares the budget among the nodes; below NODE_BUDGET a node (decision 0034: less,
    and the bench audit-evasion's cheaters last longer or a cheater's boosters save it) the loop
    warns with the flags and the budget the nodes need, each round; at NODE_BUDGET a node,
    binding or not, it does not."""
    from verifier.audit.transcripts import NODE_BUDGET, cost

    nodes = (bytes([0x20]) * 20, bytes([0x21]) * 20)
    round_ = [counted(n, f"question {i} " + "w" * 6000, donor=bytes([i]) * 20) for n in nodes for i in range(10)]
    assert sum(cost(c.transcript) for c in round_) > 2 * NODE_BUDGET  # the budget binds either way
    for budget, warned in ((2 * NODE_BUDGET - 1, True), (2 * NODE_BUDGET, False)):
        (act,), said = _sizing_warnings(caplog, round_, budget, nodes)
        assert isinstance(act, ScoreTranscripts) and act.spare
        assert bool(said) is warned, (budget, said)
        if warned:
            assert f"each of the 2 nodes (listed on the chain or with transcripts) about {budget // 2}" in said[0]
            assert f"--transcript-budget to {2 * NODE_BUDGET}" in said[0]


def test_a_verifier_sized_for_this_rounds_nodes_only_still_warns(caplog: pytest.LogCaptureFixture) -> None:
    """The chain lists 5 nodes of the model, this round's transcripts are of 2 and fit a budget of
    2 × NODE_BUDGET: a cheater's boosters can make the budget bind in any round, so the loop
    warns, naming 5 nodes, though nothing is left out this round; at 5 × NODE_BUDGET it does not.
    Fails when the warning counts the round's nodes only, or fires only when the budget binds."""
    from verifier.audit.transcripts import NODE_BUDGET

    nodes = (bytes([0x20]) * 20, bytes([0x21]) * 20)
    listed = (*nodes, *(bytes([0x30 + j]) * 20 for j in range(3)))
    small = [counted(n, f"question {i}", donor=bytes([i]) * 20) for n in nodes for i in range(2)]
    (act,), said = _sizing_warnings(caplog, small, 2 * NODE_BUDGET, listed)
    assert isinstance(act, ScoreTranscripts) and not act.spare  # everything fits this round ...
    assert len(said) == 1 and f"each of the 5 nodes (listed on the chain or with transcripts) about " \
        f"{2 * NODE_BUDGET // 5}" in said[0] and f"--transcript-budget to {5 * NODE_BUDGET}" in said[0]  # ... yet
    (act,), said = _sizing_warnings(caplog, small, 5 * NODE_BUDGET, listed)
    assert isinstance(act, ScoreTranscripts) and said == []


CHEATER = b"\x0c" * 20


class DonorEngine(FakeEngine):
    """Replies whose ids start at 5 (a cheater's to its users) are far from sampling (z of a
    128-token reply −6: one alone passes rule 7's test for one set); the others (to its boosters,
    to other nodes) are as likely as sampling gives (z 0)."""

    async def score(self, prompt: list[int], ids: list[int], params: Any) -> Any:
        from model_node.engine import TokenScore

        if ids[0] == 5:
            var = (0.6931471805599453 * 128 / 6.0) ** 2 / 128
            return [TokenScore(t, -1.0 - 0.6931471805599453, -1.0, t, var_logprob=var) for t in ids]
        return [TokenScore(t, -1.0, -1.0, t, var_logprob=0.25) for t in ids]


def _reply_of(node: bytes, donor: bytes, first_id: int, i: int) -> Counted:
    c = counted(node, f"{donor.hex()} {i}", donor=donor)
    reply = at.ReplyOutcome(node, (("x" * 128, tuple(range(first_id, first_id + 128))),), b"\x03" * 64, 1, 0)
    return Counted(donor, node, Transcript(node, b"\x01" * 16, c.transcript.opening, b"\x02" * 16, reply))


def _boosted_round() -> list[Counted]:
    """A cheater with 2 users (one transcript each, far off) and 30 boosters (4 each, honest),
    beside 7 other nodes with 40 honest transcripts each: the budget binds."""
    users = [_reply_of(CHEATER, bytes([0xe0 + u]) * 20, 5, 0) for u in range(2)]
    boosters = [_reply_of(CHEATER, bytes([0x40 + b]) * 20, 300, i) for b in range(30) for i in range(4)]
    others = [_reply_of(bytes([0x20 + n]) * 20, bytes([0x20 + n, *[0x90 + d] * 19]), 300, 0)  # donors of their own
              for n in range(7) for d in range(40)]
    return [*boosters, *users, *others]


async def test_the_second_draw_gives_a_boosted_cheaters_users_a_second_chance() -> None:
    """A cheater's boosters crowd its share of the first draw; when one of its users' far-off
    transcripts is drawn anyway, the cheater is a suspect and the second draw scores more of its
    donors' transcripts: its other user's with them, so two far-off sets cap every score of the
    cheater (rule 7). Without the second draw it is capped only when both users are drawn first."""
    from verifier.audit.transcripts import cost

    per = cost(_boosted_round()[0].transcript)
    first_had_user = capped = 0
    for seed in range(40):
        a = auditor(0, transcripts=StubBook({0: _boosted_round()}), transcript_budget=8 * 16 * per,
                    rng=random.Random(seed))
        chain = FakeChain(reported(a), REPORT_FROM + 1)
        driver = AuditDriver(a, "127.0.0.1:1", client=None, engine=DonorEngine(), rpc=chain.rpc)  # type: ignore[arg-type]
        async with trio.open_nursery() as nursery:
            await driver.step(nursery)
        (raw,) = chain.sent
        tx = at.decode_audit_tx(raw, "audit-test")
        assert isinstance(tx, at.TranscriptScores)
        mine = dict(tx.nodes).get(CHEATER, ())
        assert len(mine) >= 12  # a share of the first draw (12 of 122), more in the second when suspect
        if max(mine) < 300_000:  # every score capped (an honest reply alone scores 1,000,000)
            capped += 1
        first = [c for c in _first_draw(seed) if c.node_id == CHEATER and c.donor[0] >= 0xE0]
        first_had_user += bool(first)
        if first:
            assert max(mine) < 300_000, (seed, mine)  # capped
    assert 5 <= first_had_user < 40 and capped >= first_had_user


def _first_draw(seed: int) -> tuple[Counted, ...]:
    from verifier.audit.transcripts import cost

    per = cost(_boosted_round()[0].transcript)
    a = auditor(0, transcripts=StubBook({0: _boosted_round()}), transcript_budget=8 * 16 * per,
                rng=random.Random(seed))
    (act,) = a.plan(reported(a), REPORT_FROM + 1)
    assert isinstance(act, ScoreTranscripts)
    return act.counted


def test_the_second_draw_takes_suspect_nodes_spare_transcripts_first_then_everyones() -> None:
    from verifier.audit.transcripts import cost

    n1, n2 = b"\x0a" * 20, b"\x0b" * 20
    spare = tuple(_reply_of(n, bytes([d]) * 20, 300, 0) for n in (n1, n2) for d in range(1, 11))
    per = cost(spare[0].transcript)
    a = auditor(0)
    act = ScoreTranscripts(3, (), spare, 4 * per)
    far = [(n1, b"\x01" * 20, 9.0), (n2, b"\x02" * 20, 0.5)]
    more = a.second_draw(act, far)
    assert len(more) == 4 and {c.node_id for c in more} == {n1}  # the suspect takes the whole reserve
    calm = auditor(0).second_draw(act, [(n1, b"\x01" * 20, 0.5), (n2, b"\x02" * 20, 1.0)])
    assert sorted(c.node_id for c in calm) == [n1, n1, n2, n2]  # no suspect: the reserve goes to all alike
    wide = a.second_draw(ScoreTranscripts(3, (), spare, 12 * per), far)
    assert sorted(c.node_id for c in wide) == [n1] * 10 + [n2] * 2  # what the suspect leaves goes to the others
    assert a.second_draw(ScoreTranscripts(3, (), spare, 0), far) == []


def test_a_suspect_keeps_its_second_draw_for_the_next_rounds() -> None:
    """A cheater's boosters may keep its users' transcripts out of a round's first draw by luck;
    a node found a suspect once keeps the second draw for SUSPECT_EPOCHS more rounds."""
    from verifier.audit.transcripts import SUSPECT_EPOCHS, cost

    n1, n2 = b"\x0a" * 20, b"\x0b" * 20
    spare = tuple(_reply_of(n, bytes([d]) * 20, 300, 0) for n in (n1, n2) for d in range(1, 11))
    per = cost(spare[0].transcript)
    calm = [(n1, b"\x01" * 20, 0.5), (n2, b"\x02" * 20, 1.0)]
    a = auditor(0)
    assert {c.node_id for c in a.second_draw(ScoreTranscripts(3, (), spare, 4 * per), [(n1, b"\x01" * 20, 9.0)])} \
        == {n1}
    for epoch in range(4, 4 + SUSPECT_EPOCHS):
        assert {c.node_id for c in a.second_draw(ScoreTranscripts(epoch, (), spare, 4 * per), calm)} == {n1}
    later = a.second_draw(ScoreTranscripts(4 + SUSPECT_EPOCHS, (), spare, 4 * per), calm)
    assert sorted(c.node_id for c in later) == [n1, n1, n2, n2]  # forgotten: the reserve goes to all alike


def test_a_verifiers_budget_grows_with_its_scoring_threads() -> None:
    from verifier.audit.loop import AuditSettings
    from verifier.audit.transcripts import ROUND_BUDGET

    assert AuditSettings().scoring_budget() == ROUND_BUDGET
    assert AuditSettings(threads=3).scoring_budget() == 3 * ROUND_BUDGET
    assert AuditSettings(threads=3, transcript_budget=1000).scoring_budget() == 1000


def test_held_scores_are_dropped_after_carry_epochs() -> None:
    from verifier.audit.transcripts import CARRY_EPOCHS

    a = auditor(0)
    n = b"\x0a" * 20
    assert a.transcript_scores(1, [(n, 1)] * 3) is None
    assert a.transcript_scores(1 + CARRY_EPOCHS, [(n, 2)]) is None  # the three are too old now
    got = a.transcript_scores(2 + CARRY_EPOCHS, [(n, 3)] * 3)
    assert got is not None
    scores = at.decode_audit_tx(got.raw, "audit-test")
    assert isinstance(scores, at.TranscriptScores) and scores.nodes == ((n, (2, 3, 3, 3)),)


def test_scores_that_come_after_their_epoch_go_out_with_the_next_epochs() -> None:
    """Scoring outlasted the epoch (a loaded machine): the chain refuses the scores as of an ended
    epoch, and they go out in the next epoch, after this verifier's report there, even when that
    epoch has no transcripts of its own. Refusals for any other reason are final."""
    n = b"\x0a" * 20
    a = auditor(0, transcripts=StubBook({}))
    late = a.transcript_scores(1, [(n, 700_000)] * 4)
    assert late is not None
    a.submitted(late.key, retry=False)
    a.refused(late.key, "a transcript scores for epoch 1; the chain is in epoch 2", Code.WRONG_EPOCH)
    next_epoch = view(epoch=2, committed=(a.public_key,), reported=(a.public_key,))
    (again,) = a.plan(next_epoch, REPORT_FROM + 1)
    assert isinstance(again, Submit) and again.key == ("transcripts", 2)
    tx = at.decode_audit_tx(again.raw, "audit-test")
    assert isinstance(tx, at.TranscriptScores) and tx.epoch == 2 and tx.nodes == ((n, (700_000,) * 4),)
    a.submitted(again.key, retry=False)
    a.refused(again.key, f"validator {a.public_key.hex()[:8]} already gave transcript scores", Code.DUPLICATE)
    assert a.plan(view(epoch=3, committed=(a.public_key,), reported=(a.public_key,)), REPORT_FROM + 1) == []


def test_held_scores_go_out_at_the_report_and_the_rounds_own_wait_for_the_next_epoch() -> None:
    """Decision 0043. A report that waited for late replies lands a block or two before the
    epoch's end, and scoring a round takes longer: on a devnet of 2 cores, held scores that went
    out only with the next round's were refused as late again and counted four epochs after their
    transcripts. Held scores go out as soon as the report is on the chain; the round scored after
    them is held for the next epoch's (the chain takes one submission a validator an epoch)."""
    n, m = b"\x0a" * 20, b"\x0b" * 20
    a = auditor(0, transcripts=StubBook({1: [counted(m, "a"), counted(m, "b")]}))
    late = a.transcript_scores(1, [(n, 700_000)] * 4)
    assert late is not None
    a.submitted(late.key, retry=False)
    a.refused(late.key, "a transcript scores for epoch 1; the chain is in epoch 2", Code.WRONG_EPOCH)
    acts = a.plan(view(epoch=2, committed=(a.public_key,), reported=(a.public_key,)), REPORT_FROM + 1)
    assert [type(x) for x in acts] == [Submit, ScoreTranscripts]  # the held ones first, not after scoring
    first, round_ = acts
    assert isinstance(first, Submit) and first.key == ("transcripts", 2)
    tx = at.decode_audit_tx(first.raw, "audit-test")
    assert isinstance(tx, at.TranscriptScores) and tx.nodes == ((n, (700_000,) * 4),)
    assert isinstance(round_, ScoreTranscripts) and round_.epoch == 2 and len(round_.counted) == 2
    a.submitted(first.key, retry=True)  # a network error: the held ones again, and nothing of the round
    assert a.plan(view(epoch=2, committed=(a.public_key,), reported=(a.public_key,)), REPORT_FROM + 2) == [first]
    a.submitted(first.key, retry=False)
    assert a.transcript_scores(2, [(m, 600_000)] * 4) is None  # not a second submission of epoch 2: held
    (nxt,) = a.plan(view(epoch=3, committed=(a.public_key,), reported=(a.public_key,)), REPORT_FROM + 1)
    assert isinstance(nxt, Submit) and nxt.key == ("transcripts", 3)
    tx = at.decode_audit_tx(nxt.raw, "audit-test")
    assert isinstance(tx, at.TranscriptScores) and tx.epoch == 3 and tx.nodes == ((m, (600_000,) * 4),)


def test_a_verifier_restarted_after_this_epochs_scores_went_out_holds_the_round_for_the_next() -> None:
    """Decision 0043: the chain lists this verifier's scores of the epoch (sent before a restart:
    held ones, before the round was scored), so the round it scores again is held, not sent as a
    second submission of the epoch, which the chain refuses for good."""
    m = b"\x0b" * 20
    a = auditor(0, transcripts=StubBook({1: [counted(m, "a"), counted(m, "b")]}))  # just restarted
    on_chain = view(epoch=2, committed=(a.public_key,), reported=(a.public_key,), transcribed=(a.public_key,))
    (act,) = a.plan(on_chain, REPORT_FROM + 1)
    assert isinstance(act, ScoreTranscripts) and act.epoch == 2
    assert a.transcript_scores(2, [(m, 600_000)] * 4) is None
    (nxt,) = a.plan(view(epoch=3, committed=(a.public_key,), reported=(a.public_key,)), REPORT_FROM + 1)
    assert isinstance(nxt, Submit) and nxt.key == ("transcripts", 3)
    tx = at.decode_audit_tx(nxt.raw, "audit-test")
    assert isinstance(tx, at.TranscriptScores) and tx.nodes == ((m, (600_000,) * 4),)


def test_the_carry_is_ready_while_held_scores_reach_the_minimum_within_carry_epochs() -> None:
    from verifier.audit.transcripts import CARRY_EPOCHS, ScoreCarry

    n = b"\x0a" * 20
    c = ScoreCarry(minimum=4)
    c.hold(1, [(n, 1)] * 3)
    assert not c.ready(1)
    c.hold(2, [(n, 2)])
    assert c.ready(2) and c.ready(CARRY_EPOCHS) and not c.ready(1 + CARRY_EPOCHS)  # epoch 1's too old then
    assert c.held() == 4  # ready() hands nothing out


@pytest.mark.parametrize("held", [False, True], ids=["nothing held", "held scores"])
def test_a_report_leaves_blocks_for_held_scores_after_it(held: bool) -> None:
    """Decision 0043. A report waiting for a challenge still out goes two blocks before the end,
    and on a devnet the verifier's next poll already saw the next epoch: held scores never went
    out. With held scores it goes :data:`HELD_MARGIN_BLOCKS` earlier, and they follow it."""
    from tests.unit.test_auditor import START, committed, reply, run_sends
    from verifier.audit.auditor import HELD_MARGIN_BLOCKS, grace_height

    a = auditor(1, transcripts=TranscriptBook())
    if held:  # epoch 0's came after its end
        late = a.transcript_scores(0, [(b"\x0a" * 20, 700_000)] * 4)
        assert late is not None
        a.submitted(late.key, retry=False)
        a.refused(late.key, "a transcript scores for epoch 0; the chain is in epoch 1", Code.WRONG_EPOCH)
    a.plan(view(), START)
    v = committed(1)
    run_sends(a, v, range(START, REPORT_FROM), lambda s, h: None if s.index == 0 else reply(s.node_id, s.index))
    grace = END - 2 - (HELD_MARGIN_BLOCKS if held else 0)
    assert grace_height(REPORT_FROM, END, held) == grace
    assert a.plan(v, grace - 1) == []  # still waiting for the challenge out
    (report,) = a.plan(v, grace)
    assert isinstance(report, Submit) and report.key == ("report", 1)
    after = [x for x in a.plan(view(committed=(a.public_key,), reported=(a.public_key,)), grace + 1)
             if isinstance(x, Submit)]
    assert [x.key for x in after] == ([("transcripts", 1)] if held else [])


def test_scores_keep_to_the_chains_limits_by_a_random_sample() -> None:
    a = auditor(0)
    many = [(bytes([i % 7]) * 20, 1000 + i) for i in range(7 * (at.MAX_TRANSCRIPTS_PER_NODE + 3))]
    sub = a.transcript_scores(1, many)
    assert sub is not None
    tx = at.decode_audit_tx(sub.raw, "audit-test")
    assert isinstance(tx, at.TranscriptScores)
    assert len(tx.nodes) == 7 and all(len(s) == at.MAX_TRANSCRIPTS_PER_NODE for _, s in tx.nodes)
    assert any(s != tuple(sorted(s)) or s[0] != min(x for n, x in many if n == node) for node, s in tx.nodes)


class HalfBrokenEngine(FakeEngine):
    async def score(self, prompt: list[int], ids: list[int], params: Any) -> Any:
        from model_node.engine import EngineError

        if ids == [9]:
            raise EngineError("out of memory")
        return await super().score(prompt, ids, params)


async def drive_once(book: TranscriptBook, engine: FakeEngine) -> tuple[AuditDriver, FakeChain, at.TranscriptScores]:
    """One driver step of a verifier whose report is on the chain: the transcript scores it sent."""
    a = auditor(0, transcripts=book)
    chain = FakeChain(reported(a), REPORT_FROM + 1)
    driver = AuditDriver(a, "127.0.0.1:1", client=None, engine=engine, rpc=chain.rpc)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await driver.step(nursery)
    (raw,) = chain.sent
    tx = at.decode_audit_tx(raw, "audit-test")
    assert isinstance(tx, at.TranscriptScores)
    return driver, chain, tx


async def test_the_driver_scores_counted_transcripts_with_its_engine_and_submits_kind_3() -> None:
    n1, n2 = b"\x0a" * 20, b"\x0b" * 20
    broken = counted(n2, "unscorable")
    broken = Counted(broken.donor, n2, Transcript(n2, b"\x01" * 16, broken.transcript.opening, b"\x02" * 16,
                                                  at.ReplyOutcome(n2, (("y", (9,)),), b"\x03" * 64, 1, 0)))
    book = StubBook({0: [*(counted(n, f"{q} {i}") for n, q in ((n1, "a"), (n2, "b")) for i in range(4)), broken]})
    driver, chain, tx = await drive_once(book, HalfBrokenEngine())
    assert tx.epoch == 1
    # FakeEngine: every token half as likely (0.5); a transcript weighs by its 3-token reply (decision 0021)
    from verifier.audit.reputation import to_fixed
    from verifier.audit.scoring import length_weighted

    weighted = to_fixed(length_weighted(0.5, 3))
    assert 500_000 < weighted < 1_000_000
    assert tx.nodes == ((n1, (weighted,) * 4), (n2, (weighted,) * 4))
    assert driver.submitted[-1][0].startswith("transcript scores of epoch 1")
    async with trio.open_nursery() as nursery:
        await driver.step(nursery)
    assert len(chain.sent) == 1  # once an epoch


class SpreadEngine(FakeEngine):
    """Every token half as likely as sampling gives (C = 0.5), with the variance that puts a
    128-token reply's z at −2.9: each reply within decision 0019's per-reply limit, a donor's
    four together far outside what sampling spreads (pooled z 4.6)."""

    async def score(self, prompt: list[int], ids: list[int], params: Any) -> Any:
        from model_node.engine import TokenScore

        var = (0.6931471805599453 * 128 / 2.9) ** 2 / 128
        return [TokenScore(t, -1.0 - 0.6931471805599453, -1.0, t, var_logprob=var) for t in ids]


async def test_the_driver_caps_a_nodes_transcripts_when_two_of_its_donors_sets_are_far_off() -> None:
    """Decision 0028 through the driver: n1's transcripts come from three donors whose sets are
    each far off (every score of n1 capped), n2's from one such donor (not capped: one donor's
    luck, or choice, caps nothing)."""
    n1, n2 = b"\x0a" * 20, b"\x0b" * 20

    def long(node: bytes, text: str, donor: bytes) -> Counted:
        c = counted(node, text, donor=donor)
        reply = at.ReplyOutcome(node, (("x" * 128, tuple(range(5, 5 + 128))),), b"\x03" * 64, 1, 0)
        return Counted(donor, node, Transcript(node, b"\x01" * 16, c.transcript.opening, b"\x02" * 16, reply))

    rows = [long(n, f"{n.hex()} {d} {i}", bytes([d]) * 20) for n, ds in ((n1, (1, 2, 3)), (n2, (4,)))
            for d in ds for i in range(4)]
    _, _, tx = await drive_once(StubBook({0: rows}), SpreadEngine())
    got = dict(tx.nodes)
    assert got[n2] == (500_000,) * 4  # scored as each reply scores alone
    assert len(got[n1]) == 12 and max(got[n1]) < 400_000  # capped


async def test_nothing_is_submitted_when_no_transcript_counts() -> None:
    a = auditor(0, transcripts=StubBook({0: [counted(b"\x0a" * 20, "x", model="other-model")]}))
    chain = FakeChain(reported(a), REPORT_FROM + 1)
    driver = AuditDriver(a, "x:1", client=None, engine=FakeEngine(), rpc=chain.rpc)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await driver.step(nursery)
    assert chain.sent == []


def test_kind_3_is_signed_by_this_verifiers_key() -> None:
    from overlay.directory.registration import TxError

    a = auditor(0, rng=random.Random(1))
    sub = a.transcript_scores(2, [(b"\x0a" * 20, 5)] * 4)
    assert isinstance(sub, Submit) and sub.key == ("transcripts", 2)
    assert at.decode_audit_tx(sub.raw, "audit-test").validator_pk == PKS[0] == SigningKey.from_bytes(SEEDS[0]).public_bytes
    with pytest.raises(TxError, match="signature"):
        at.decode_audit_tx(sub.raw, "another-chain")


def test_a_restarted_verifier_still_knows_its_suspects() -> None:
    """Rule 9's suspects are saved with the plan: a verifier restarted the round after it found a
    suspect still gives that node the second draw (a cheater gains nothing by a verifier's restart),
    and a saved list that is not [node id, round] pairs is refused with the plan."""
    from overlay.directory.registration import pack
    from verifier.audit.auditor import _PLAN_VERSION
    from verifier.audit.transcripts import cost

    n1, n2 = b"\x0a" * 20, b"\x0b" * 20
    spare = tuple(_reply_of(n, bytes([d]) * 20, 300, 0) for n in (n1, n2) for d in range(1, 11))
    per = cost(spare[0].transcript)
    calm = [(n1, b"\x01" * 20, 0.5), (n2, b"\x02" * 20, 1.0)]
    a = auditor(0)
    a.second_draw(ScoreTranscripts(3, (), spare, 4 * per), [(n1, b"\x01" * 20, 9.0)])
    assert a.changed  # the driver writes the plan file
    saved = a.snapshot()
    b = auditor(0)
    assert b.restore(saved)
    assert {c.node_id for c in b.second_draw(ScoreTranscripts(4, (), spare, 4 * per), calm)} == {n1}
    fresh = auditor(0)  # what a restart without them would draw: the reserve to every node alike
    assert sorted(c.node_id for c in fresh.second_draw(ScoreTranscripts(4, (), spare, 4 * per), calm)) == \
        [n1, n1, n2, n2]
    for bad in ([[n1[:5], 3]], [[n1, -1]], [[n1, "3"]], [n1], "x", [[n1, 3]] * 5000):
        c = auditor(0)
        assert not c.restore(pack([_PLAN_VERSION, a.chain_id, a.public_key, None, bad])), bad
        assert {x.node_id for x in c.second_draw(ScoreTranscripts(4, (), spare, 4 * per), calm)} == {n1, n2}
    old = pack([4, a.chain_id, a.public_key, None])  # a plan file from before suspects were saved
    assert auditor(0).restore(old) and not auditor(0).restore(pack([4, a.chain_id, a.public_key, None, []]))


def test_a_verifier_restarted_while_it_scores_a_round_scores_it_again() -> None:
    """Its report of epoch 1 on the chain, the loop takes the round's transcripts and scores them,
    which takes most of an epoch when the budget binds; restarted before the scores went to the
    carry, it takes the same ones again from the book it saved, and once they did, none. Fails
    when the round's transcripts leave the book at the close (a restart lost the round) or stay
    in it once scored (a restart would score them twice)."""
    n1, n2 = b"\x0a" * 20, b"\x0b" * 20
    round_ = [counted(n, f"q {n[0]} {i}", donor=bytes([i + 1]) * 20) for n in (n1, n2) for i in range(4)]
    book = StubBook({0: round_})
    a = auditor(0, transcripts=book)
    (act,) = a.plan(reported(a), REPORT_FROM + 1)
    assert isinstance(act, ScoreTranscripts) and list(act.counted) == round_
    saved = TranscriptBook.from_bytes(book.to_bytes())  # what the verifier wrote while it scored
    b = auditor(0, transcripts=saved)
    (again,) = b.plan(reported(b), REPORT_FROM + 1)
    assert isinstance(again, ScoreTranscripts) and list(again.counted) == round_
    assert b.transcript_scores(1, [(c.node_id, 900_000) for c in again.counted]) is not None
    c = auditor(0, transcripts=TranscriptBook.from_bytes(saved.to_bytes()))
    assert not [x for x in c.plan(reported(c), REPORT_FROM + 1) if isinstance(x, ScoreTranscripts)]


def test_a_round_still_being_scored_is_not_taken_again_by_the_next() -> None:
    """Scoring runs beside the loop: when round 2 begins while round 1's scoring still runs, round
    2 takes only its own transcripts (round 1's would be scored, and counted, twice); a round
    whose scoring failed is not retried while the process runs (it stays busy), but a restart
    takes it with the next round's. Fails when a round still being scored is taken again."""
    n1 = b"\x0a" * 20
    one = [counted(n1, f"one {i}", donor=bytes([i + 1]) * 20) for i in range(4)]
    two = [counted(n1, f"two {i}", donor=bytes([i + 1]) * 20) for i in range(4)]
    book = StubBook({0: one, 1: two})
    a = auditor(0, transcripts=book)
    (first,) = a.plan(reported(a), REPORT_FROM + 1)
    assert isinstance(first, ScoreTranscripts) and list(first.counted) == one
    later = view(epoch=2, committed=(a.public_key,), reported=(a.public_key,))
    (second,) = [x for x in a.plan(later, REPORT_FROM + 1) if isinstance(x, ScoreTranscripts)]
    assert list(second.counted) == two  # round 1's are still being scored
    a.transcript_scores(2, [(n1, 900_000)] * 4)  # round 2's done; round 1's never finishes
    b = auditor(0, transcripts=TranscriptBook.from_bytes(book.to_bytes()))  # a restart
    (again,) = [x for x in b.plan(view(epoch=2, committed=(b.public_key,), reported=(b.public_key,)),
                                  REPORT_FROM + 1) if isinstance(x, ScoreTranscripts)]
    assert list(again.counted) == one


class WritingEngine(FakeEngine):
    """Writes the book (as the verifier's periodic writer would, since scoring takes minutes)
    when it scores its first reply: the round is then on disk as taken, not scored."""

    def __init__(self, write: Any) -> None:
        self.write = write

    async def score(self, prompt: list[int], ids: list[int], params: Any) -> Any:
        if self.write is not None:
            self.write, write = None, self.write
            write()
        return await super().score(prompt, ids, params)


class CrashingChain(FakeChain):
    """A :class:`FakeChain` that reads the book file as the chain takes the transcript scores: what
    a verifier stopped at that moment restarts from."""

    def __init__(self, v: Any, height: int, path: Any) -> None:
        super().__init__(v, height)
        self.path = path
        self.on_disk: list[bytes] = []

    async def rpc(self, address: str, method: str, params: dict[str, str]) -> Any:
        if method == "broadcast_tx_sync":
            self.on_disk.append(self.path.read_bytes())
        return await super().rpc(address, method, params)


async def test_a_verifier_stopped_once_its_scores_are_out_neither_scores_nor_hands_them_out_again(
        tmp_path: Any) -> None:
    """n1's four transcripts are scored and go out; n2's two wait in the carry. Stopped the moment
    the chain takes the scores, the verifier restarts from the book on disk: it must hold the
    round as scored and n1's scores out of the carry, or the restart scores the round again (or
    hands n1's scores out with a later epoch's) and the chain counts them twice. Fails when the
    driver broadcasts before it writes the book."""
    from verifier.run import BOOK_FILE, book_keeper, save_book

    n1, n2 = b"\x0a" * 20, b"\x0b" * 20
    round_ = [counted(n1, f"a {i}", donor=bytes([i + 1]) * 20) for i in range(4)] + \
             [counted(n2, f"b {i}", donor=bytes([i + 1]) * 20) for i in range(2)]
    book = StubBook({0: round_})
    a = auditor(0, transcripts=book)
    chain = CrashingChain(reported(a), REPORT_FROM + 1, tmp_path / BOOK_FILE)
    keeper = book_keeper(tmp_path, book)
    engine: Any = WritingEngine(lambda: save_book(tmp_path, book))
    driver = AuditDriver(a, "127.0.0.1:1", client=None, engine=engine,  # type: ignore[arg-type]
                         rpc=chain.rpc, save_transcripts=keeper.save)
    async with trio.open_nursery() as nursery:
        await driver.step(nursery)
    (raw,) = chain.sent
    tx = at.decode_audit_tx(raw, "audit-test")
    assert isinstance(tx, at.TranscriptScores) and [n for n, _ in tx.nodes] == [n1]
    (on_disk,) = chain.on_disk
    restarted = TranscriptBook.from_bytes(on_disk)
    assert restarted.pending == {} and restarted.carry.held() == 2  # n2's wait; n1's are on the chain
    for epoch in (1, 2):  # restarted in the same epoch, or the next
        b = auditor(0, transcripts=TranscriptBook.from_bytes(on_disk))
        acts = b.plan(view(epoch=epoch, committed=(b.public_key,), reported=(b.public_key,)), REPORT_FROM + 1)
        assert not [x for x in acts if isinstance(x, ScoreTranscripts)
                    or (isinstance(x, Submit) and x.key[0] == "transcripts")]


def test_a_verifier_whose_epochs_close_before_the_release_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """Decision 0037: epoch e's withheld escrowed replies are released 660 s into e + 1 and the book
    closes e at e + 1's report; with epochs too short for a node to hand them in between, framing is
    as without escrow, and the verifier says what epoch length is needed (once)."""
    from verifier.audit.escrow_intake import RELEASE_DELAY_MS

    a = auditor(0, transcripts=StubBook({}))
    with caplog.at_level("WARNING", logger="gentorrent.audit"):
        a.plan(reported(a), REPORT_FROM + 1, 1.0)  # the tests' 60-block epochs, at 1 s a block
        a.plan(reported(a), REPORT_FROM + 2, 1.0)
    said = [r.getMessage() for r in caplog.records if "epochs of 60 blocks close before" in r.getMessage()]
    assert len(said) == 1 and "about 800 or more" in said[0]
    caplog.clear()
    start = 1000
    long = view(committed=(a.public_key,), reported=(a.public_key,), epoch=2, epoch_blocks=800, start_height=start,
                commit_until=start + 2, report_from=start + 780, end_height=start + 799)
    b = auditor(0, transcripts=StubBook({}))
    with caplog.at_level("WARNING", logger="gentorrent.audit"):
        b.plan(long, start + 781, 1.0)
    assert not [r for r in caplog.records if "close before" in r.getMessage()]
    assert 780 >= RELEASE_DELAY_MS // 1000 + 120


def test_a_short_reply_window_lets_short_epochs_close_after_the_nodes_hand_in(caplog: pytest.LogCaptureFixture) -> None:
    """Decision 0040: a genesis's ``reply_window_s`` scales the release, so 120-block epochs (the
    devnet's) with a 22-s window close after the nodes' reveals (48.4 s of the 100 blocks before
    the report, 50 s at half-second blocks) and no warning is given; at the default window they
    warn. The devnet's :func:`~gentorrent.tools.localnet.fitting_reply_window` stops at 22 s (23 s
    would take 50.6 s). The warning goes by the pace the driver measured: at quarter-second blocks
    the 22-s window does not fit (it did not warn there while it counted blocks as seconds), and
    before a pace is measured it says nothing."""
    from gentorrent.tools.localnet import fitting_reply_window

    assert fitting_reply_window(120, 0.5) == 22 and fitting_reply_window(900, 1.0) == 600
    start = 1000
    for window, block_s, warned in ((22, 0.5, False), (600, 0.5, True), (22, 0.25, True), (600, None, False)):
        a = auditor(0, transcripts=StubBook({}))
        short = view(committed=(a.public_key,), reported=(a.public_key,), epoch=2, epoch_blocks=120,
                     start_height=start, commit_until=start + 2, report_from=start + 100, end_height=start + 119,
                     reply_window_s=window)
        caplog.clear()
        with caplog.at_level("WARNING", logger="gentorrent.audit"):
            a.plan(short, start + 101, block_s)
        said = [r.getMessage() for r in caplog.records if "close before" in r.getMessage()]
        assert bool(said) is warned, said
        assert not said or f"{block_s:.2f} s a block" in said[0]
