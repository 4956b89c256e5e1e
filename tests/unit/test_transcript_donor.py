"""Donating transcripts, the user's side (user_client/transcripts.py, decision 0015): a chosen
request is committed to with every verifier BEFORE it leaves, sent under the committed id to the
committed node, then revealed sealed to each verifier; a request whose committed try does not
answer it whole is still answered for the user, and "no reply" is revealed. The verifiers here run
the real intake (verifier/abci_app.py take_commit / take_reveal) over a TranscriptBook; the
anonymous client is a fake whose model node signs real replies. Trio's MockClock runs the waits."""

from __future__ import annotations

import base64
import logging
import random
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from functools import partial
from typing import Any

import pytest
import trio

from overlay.anon import signing
from overlay.anon.client import AllBusy, AnonError
from overlay.directory import transcripts as wire
from overlay.wire import crypto
from overlay.wire.clock import TrioClock
from overlay.wire.failures import Failure
from overlay.wire.identity import Identity
from overlay.wire.messages import ChatMessage, ReplyChunk, Request, SamplingParams
from user_client.chat import ChatSession
from user_client.transcripts import EXIT_WAIT_S, DonatingClient, TranscriptDonor, reveal_before_stopping
from verifier.abci_app import take_commit, take_reveal
from verifier.audit.transcripts import MAX_COMMITS, TranscriptBook

MODEL = "echo"
MSGS = [ChatMessage("user", "what is a quine?")]
PARAMS = SamplingParams(temperature=1, top_p=1, max_tokens=32)  # ints, as a gateway may hold them
EPOCH = 3


@dataclass
class Entry:
    node_id: bytes


class ModelNode:
    def __init__(self) -> None:
        self.identity = Identity.generate()

    @property
    def node_id(self) -> bytes:
        return self.identity.node_id

    def reply(self, req: Request, target: bytes, texts: list[str]) -> list[ReplyChunk]:
        signer = signing.ReplySigner(signing.request_digest(req, target), req.model, self.node_id)
        at_ms = int(TrioClock().unix() * 1000)
        out = []
        for i, t in enumerate(texts):
            chain, sig = signer.add(t, (i + 1,), i == len(texts) - 1, at_ms, self.identity.signing.sign)
            out.append(ReplyChunk(request_id=req.request_id, seq=i, text=t, token_ids=(i + 1,),
                                  done=i == len(texts) - 1, error="", node=self.node_id, chain=chain, signature=sig,
                                  signed_at_ms=at_ms))
        return out

    def busy(self, req: Request, target: bytes, *, signed: bool = True) -> ReplyChunk:
        """Its "busy" before any output: signed (decision 0044), or as a node before it sent it."""
        at_ms = int(TrioClock().unix() * 1000)
        digest = signing.request_digest(req, target)
        sig = self.identity.signing.sign(signing.busy_signing_bytes(digest, req.model, self.node_id, at_ms)) \
            if signed else b""
        return ReplyChunk(request_id=req.request_id, seq=0, text="", token_ids=(), done=True, error="busy: full",
                          node=self.node_id, chain=b"", signature=sig, signed_at_ms=at_ms if signed else 0,
                          failure=Failure.BUSY)


class FakeClient:
    """The anonymous client: one try per node in ``tries`` (a node id -> "ok", "fail", "busy",
    "busy-unsigned", "partial"); a failed try fails over to the next node (fresh id), as AnonClient
    does, and a "busy" refusal goes into ``refusals``. Every send is logged in ``log`` as ("send",
    request id, node)."""

    def __init__(self, nodes: list[ModelNode], log: list[tuple[Any, ...]], behaviour: dict[bytes, str]) -> None:
        self.nodes, self.log, self.behaviour = nodes, log, behaviour
        self.sent: list[Request] = []
        self.waited_first: list[bool] = []  # each request's wait_first
        self.first_sent = trio.Event()

    def choose_model_node(self, model: str, prefer: bytes | None = None) -> Entry:
        if model != MODEL:
            raise AnonError("no model node serves it")
        return Entry(prefer or self.nodes[0].node_id)

    async def request(self, model: str, messages: Any, params: Any = None, *, node: bytes | None = None,
                      chunk_timeout: float = 60.0, paths_timeout: float = 30.0,
                      request_id: bytes | None = None, sent_to: set[bytes] | None = None,
                      refusals: list[ReplyChunk] | None = None,
                      wait_first: bool = False) -> AsyncGenerator[ReplyChunk, None]:
        self.waited_first.append(wait_first)
        order = [n for n in self.nodes if n.node_id == (node or self.nodes[0].node_id)] + \
            [n for n in self.nodes if n.node_id != (node or self.nodes[0].node_id)]
        produced = ""
        for n in order:
            rid = request_id or crypto.random_bytes(16)
            request_id = None
            req = Request(request_id=rid, model=model, messages=tuple(messages), params=params or SamplingParams(),
                          k=3, return_paths=(), continuation=produced)
            self.sent.append(req)
            self.first_sent.set()
            self.log.append(("send", rid, n.node_id))
            if sent_to is not None:
                sent_to.add(n.node_id)
            how = self.behaviour.get(n.node_id, "ok")
            if how in ("busy", "busy-unsigned", "fail"):  # refused, or failed before any output: the next node
                if how != "fail" and refusals is not None:
                    await trio.sleep(0.2)
                    refusals.append(n.busy(req, n.node_id, signed=how == "busy"))
                continue
            await trio.sleep(0.2)  # the cloves' way to the node: it signs after the send
            texts = ["a quine ", "prints itself"]
            chunks = n.reply(req, n.node_id, texts[len(produced) and 1:])
            for c in chunks[:1] if how == "partial" else chunks:
                await trio.sleep(0.1)
                produced += c.text
                yield c
            if how == "ok":
                return
        raise AllBusy("every model node is busy")


class Verifier:
    """One verifier's RPC: its key, and the real intake over its own book (``answer``: "ok",
    "refuse", "down", or a delay in seconds before it answers a commit)."""

    def __init__(self, address: str, donor: Identity, nodes: list[ModelNode], log: list[tuple[Any, ...]],
                 answer: str | float = "ok") -> None:
        self.address, self.donor, self.log, self.answer = address, donor, log, answer
        self.key = crypto.SigningKey.generate()
        self.book = TranscriptBook()
        self.keys = {n.node_id: n.identity.ed25519_public for n in nodes}
        self.reveals: list[tuple[int, str]] = []

    def user_key(self, node_id: bytes) -> bytes | None:
        return self.donor.ed25519_public if node_id == self.donor.node_id else None

    def key_of(self, node_id: bytes, model: str) -> bytes | None:
        return self.keys.get(node_id) if model == MODEL else None

    async def handle(self, path: str, data: bytes) -> tuple[int, str, bytes]:
        if self.answer == "down":
            raise OSError("connection refused")
        if path == "/audit/donate_key":
            return 0, "", self.key.public_bytes
        if path == wire.COMMIT_PATH:
            if self.answer == "refuse":
                code, why = 11, "not now"
            else:
                code, why = take_commit(self.book, data, self.key.public_bytes, self.user_key, EPOCH,
                                        int(TrioClock().unix() * 1000))
            if isinstance(self.answer, float):  # taken at once, answered late
                await trio.sleep(self.answer)
            self.log.append(("commit", self.address, code))
            return int(code), why, b""
        assert path == wire.REVEAL_PATH
        if self.answer == "hang":  # takes commits, never answers a reveal
            await trio.sleep_forever()
        code, why = take_reveal(self.book, data, self.key.private_bytes(), self.key.public_bytes, self.user_key,
                                self.key_of)
        self.reveals.append((int(code), why))
        return int(code), why, b""


class World:
    def __init__(self, n_verifiers: int = 3, answers: dict[int, str | float] | None = None,
                 behaviour: dict[int, str] | None = None, rate: float = 1.0) -> None:
        self.log: list[tuple[Any, ...]] = []
        self.me = Identity.generate()
        self.nodes = [ModelNode(), ModelNode()]
        self.verifiers = {f"v{i}:26657": Verifier(f"v{i}:26657", self.me, self.nodes, self.log,
                                                  (answers or {}).get(i, "ok")) for i in range(n_verifiers)}
        self.client = FakeClient(self.nodes, self.log,
                                 {self.nodes[i].node_id: b for i, b in (behaviour or {}).items()})
        self.donor = TranscriptDonor(self.me, list(self.verifiers), lambda: [v.key.public_bytes
                                                                             for v in self.verifiers.values()],
                                     rate=rate, rpc=self.rpc, rng=random.Random(4), reveal_retry=1.0)
        self.wrapped = DonatingClient(self.client, self.donor)

    async def rpc(self, address: str, method: str, params: dict[str, str]) -> Any:
        assert method == "abci_query"
        data = bytes.fromhex(params["data"][2:]) if "data" in params else b""
        code, why, value = await self.verifiers[address].handle(params["path"].strip('"'), data)
        return {"response": {"code": code, "log": why, "value": base64.b64encode(value).decode()}}

    async def ask(self, messages: list[ChatMessage] = MSGS, params: SamplingParams = PARAMS,
                  sent_to: set[bytes] | None = None) -> str:
        text = ""
        async for c in self.wrapped.request(MODEL, messages, params, node=None, chunk_timeout=30, sent_to=sent_to):
            text += c.text
        return text

    def counted(self, v: Verifier) -> list[Any]:
        return v.book.close(EPOCH)


async def test_the_request_leaves_only_after_every_verifier_answered_its_commit(autojump_clock: Any) -> None:
    w = World(answers={1: 3.0, 2: 1.0})  # two slow verifiers
    async with trio.open_nursery() as nursery:
        await nursery.start(w.donor.run)
        assert await w.ask() == "a quine prints itself"
        with trio.fail_after(EXIT_WAIT_S):
            assert await w.donor.wait_idle()
        nursery.cancel_scope.cancel()
    (send_at,) = [i for i, e in enumerate(w.log) if e[0] == "send"]
    commits = [i for i, e in enumerate(w.log) if e[0] == "commit"]
    assert len(commits) == 3 and max(commits) < send_at, w.log  # every commit answered before the send
    rid, node = w.log[send_at][1:]
    req = w.client.sent[0]
    assert node == w.nodes[0].node_id and req.request_id == rid and type(req.params.temperature) is float
    for v in w.verifiers.values():  # each verifier took the transcript, sealed to its own key
        assert v.reveals == [(0, "taken: the transcript counts once every commitment of its epoch is revealed")]
        (c,) = w.counted(v)
        assert c.donor == w.me.node_id and c.node_id == node and c.transcript.request_id == rid
    assert (w.donor.committed, w.donor.revealed, w.donor.no_reply) == (1, 3, 0)
    assert w.client.waited_first == [True]  # the committed try waits out a loaded node's stall


async def test_a_failed_committed_try_still_answers_the_user_and_reveals_no_reply(autojump_clock: Any) -> None:
    for how in ("fail", "busy-unsigned", "partial"):  # an unsigned "busy": a node from before decision 0044
        w = World(behaviour={0: how})
        sent_to: set[bytes] = set()
        async with trio.open_nursery() as nursery:
            await nursery.start(w.donor.run)
            assert (await w.ask(sent_to=sent_to)).endswith("prints itself"), how  # the other node answered
            with trio.fail_after(EXIT_WAIT_S):
                assert await w.donor.wait_idle()
            nursery.cancel_scope.cancel()
        assert [e[2] for e in w.log if e[0] == "send"] == [w.nodes[0].node_id, w.nodes[1].node_id]
        assert sent_to == {w.nodes[0].node_id, w.nodes[1].node_id}  # the committed send names both
        assert w.client.sent[1].request_id != w.client.sent[0].request_id  # the committed id went out once
        for v in w.verifiers.values():
            assert v.reveals[0][0] == 0 and "counts for nothing" in v.reveals[0][1], how
            assert v.book.history[w.me.node_id] == (0, 1)  # the rules' price: one void set of its budget
        assert w.donor.no_reply == 1


async def test_a_committed_try_refused_busy_reveals_the_signed_refusal_and_the_set_still_counts(
        autojump_clock: Any) -> None:
    """Decision 0044: the committed node was busy; the user is answered by the other node, the
    donor reveals the node's signed refusal, and its next donated request of the epoch counts."""
    w = World(behaviour={0: "busy"})
    async with trio.open_nursery() as nursery:
        await nursery.start(w.donor.run)
        assert (await w.ask()).endswith("prints itself")  # the other node answered
        w.client.behaviour = {}
        assert await w.ask() == "a quine prints itself"  # the next request: a transcript of node 0
        with trio.fail_after(EXIT_WAIT_S):
            assert await w.donor.wait_idle()
        nursery.cancel_scope.cancel()
    assert (w.donor.committed, w.donor.busy, w.donor.no_reply) == (2, 1, 0)
    for v in w.verifiers.values():
        assert [code for code, _ in v.reveals] == [0, 0] and "busy refusal" in v.reveals[0][1], v.reveals
        (c,) = w.counted(v)
        assert c.node_id == w.nodes[0].node_id and c.transcript.request_id == w.client.sent[2].request_id
        assert v.book.history[w.me.node_id] == (1, 0)  # no void set: the busy node was no sample


async def test_when_every_verifier_refuses_the_request_is_sent_as_a_normal_one(autojump_clock: Any) -> None:
    w = World(answers={0: "refuse", 1: "refuse", 2: "down"})
    sent_to: set[bytes] = set()
    async with trio.open_nursery() as nursery:
        await nursery.start(w.donor.run)
        assert await w.ask(sent_to=sent_to) == "a quine prints itself"
        nursery.cancel_scope.cancel()
    assert w.donor.committed == 0 and w.donor.pending == 0
    assert sent_to == {w.nodes[0].node_id}  # the normal send names its node too
    assert all(v.reveals == [] for v in w.verifiers.values())


async def test_verifiers_that_took_the_commitment_get_the_transcript_when_others_refuse(autojump_clock: Any) -> None:
    w = World(answers={0: "refuse", 2: 30.0})  # 2 answers after the commit timeout: it may hold it
    async with trio.open_nursery() as nursery:
        await nursery.start(w.donor.run)
        assert await w.ask() == "a quine prints itself"
        with trio.fail_after(60):
            assert await w.donor.wait_idle()
        nursery.cancel_scope.cancel()
    v0, v1, v2 = w.verifiers.values()
    assert v0.reveals == []  # it refused: it holds nothing to reveal
    for v in (v1, v2):  # v2's answer never came in time, but it holds the commitment: revealed too
        assert v.reveals[0][0] == 0 and len(w.counted(v)) == 1


LONG_CHAT = [ChatMessage("system", "you are terse")] + \
    [ChatMessage(r, f"turn {i} " + "words " * 40) for i in range(19) for r in ("user", "assistant")] + \
    [ChatMessage("user", "now sum up this log:\n" + "line of a pasted log file\n" * 800)]


@pytest.mark.parametrize(("messages", "params"), [
    (MSGS, SamplingParams(0.7, 1.0, 0, 2048)),  # an OpenAI client's max_tokens (the gateway takes up to 4,096)
    (LONG_CHAT, PARAMS),  # 40 messages, the last a 20-KiB paste
    (LONG_CHAT, SamplingParams(1.0, 1.0, 0, 4096)),
], ids=["max_tokens-2048", "40-messages-and-a-paste", "both"])
async def test_requests_past_a_challenges_limits_are_donated_and_count(
        autojump_clock: Any, messages: list[ChatMessage], params: SamplingParams) -> None:
    """A node that has read the audit's limits knows no challenge carries more than 16 messages, a
    message over 8 KiB or max_tokens over 1,024, and would serve exactly those requests (the
    longest, dearest ones) with a cheap model. Its users' transcripts of them count (decision
    0032): each verifier's real intake takes the commit and the reveal and counts the transcript."""
    assert wire.opening_problem(MODEL, messages, params) is not None  # no challenge can be this request
    w = World()
    async with trio.open_nursery() as nursery:
        await nursery.start(w.donor.run)
        assert await w.ask(messages=messages, params=params) == "a quine prints itself"
        with trio.fail_after(60):
            assert await w.donor.wait_idle()
        nursery.cancel_scope.cancel()
    assert w.donor.committed == 1 and w.donor.revealed == 3
    for v in w.verifiers.values():
        assert v.reveals == [(0, "taken: the transcript counts once every commitment of its epoch is revealed")]
        v.book = TranscriptBook.from_bytes(v.book.to_bytes())  # the book keeps it across a restart
        [c] = w.counted(v)
        assert c.transcript.opening.messages == tuple(messages) and c.transcript.opening.params == params


async def test_seeded_or_unfit_requests_and_the_rate_are_decided_before_sending(autojump_clock: Any) -> None:
    w = World()
    async with trio.open_nursery() as nursery:
        await nursery.start(w.donor.run)
        await w.ask(params=SamplingParams(0.7, 1.0, 0, 32, seed=5))
        await w.ask(params=SamplingParams(0.7, 1.0, 0, wire.TRANSCRIPT_MAX_TOKENS + 1))
        await w.ask(messages=[ChatMessage("user", "x")] * (wire.TRANSCRIPT_MAX_MESSAGES + 1))
        await w.ask(messages=[ChatMessage("user", "x" * (wire.TRANSCRIPT_PROMPT_BYTES // 2 + 1))] * 2)
        nursery.cancel_scope.cancel()
    assert not [e for e in w.log if e[0] == "commit"] and w.donor.committed == 0
    w = World(rate=0.25)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.donor.run)
        for _ in range(200):
            await w.ask()
        nursery.cancel_scope.cancel()
    assert 30 <= w.donor.chosen <= 70 and w.donor.offered == 200
    # past the book's 16 commitments per donor and epoch the verifiers refuse: sent as normal requests
    assert w.donor.committed == MAX_COMMITS


async def test_a_caller_that_stops_early_still_gets_the_reply_revealed(autojump_clock: Any) -> None:
    w = World(n_verifiers=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.donor.run)
        stream = w.wrapped.request(MODEL, MSGS, PARAMS)
        first = await stream.__anext__()
        await stream.aclose()  # a stop string matched in the first chunk
        assert first.text == "a quine "
        with trio.fail_after(EXIT_WAIT_S):
            assert await w.donor.wait_idle()
        nursery.cancel_scope.cancel()
    (v,) = w.verifiers.values()
    assert v.reveals[0][0] == 0 and len(w.counted(v)) == 1


async def test_a_chat_session_through_the_donating_client(autojump_clock: Any, caplog: pytest.LogCaptureFixture) -> None:
    """ChatSession (``user chat``) over the donating client: the turn is answered; a donation that
    fails is logged, never a chat error."""
    import io

    w = World(answers={0: "down", 1: "down", 2: "down"})
    async with trio.open_nursery() as nursery:
        await nursery.start(w.donor.run)
        session = ChatSession(w.wrapped, MODEL, SamplingParams(max_tokens=32), None)
        with caplog.at_level(logging.INFO, "gentorrent.donate"):
            turn = await session.turn("what is a quine?", io.StringIO(), 30)
        nursery.cancel_scope.cancel()
    assert turn.text == "a quine prints itself" and turn.verified
    assert "sent without donating" in caplog.text and "connection refused" in caplog.text


def test_the_donor_needs_the_committee_and_a_rate_within_0_1() -> None:
    me = Identity.generate()
    with pytest.raises(ValueError, match="--committee"):
        TranscriptDonor(me, [], list)
    with pytest.raises(ValueError, match=r"within 0\.\.1"):
        TranscriptDonor(me, ["v:1"], list, rate=1.5)


def test_the_chat_flags_are_checked_before_anything_starts(tmp_path: Any, capsys: Any) -> None:
    from tests.unit.test_chat import _chat

    code, err = _chat(tmp_path, capsys, "--donate-transcripts-rate", "1.5")
    assert code == 2 and "--donate-transcripts-rate must be within 0..1" in err
    code, err = _chat(tmp_path, capsys, "--donate-transcripts")
    assert code == 2 and "--donate-transcripts" in err and "needs --committee" in err


async def _stop_once_sent(w: World, stops: trio.MemorySendChannel[None], then: float, *, again: float | None = None,
                          at: list[float] | None = None) -> None:
    """A Ctrl-C ``then`` seconds after the committed request left (its time appended to ``at``),
    and another ``again`` seconds after the first."""
    await w.client.first_sent.wait()
    await trio.sleep(then)
    await stops.send(None)
    if at is not None:
        at.append(trio.current_time())
    if again is not None:
        await trio.sleep(again)
        await stops.send(None)


async def test_a_stop_cuts_the_request_short_and_still_reveals_no_reply(autojump_clock: Any) -> None:
    """``user chat`` and ``user serve`` at Ctrl-C: the committed request is cut short, and its
    "no reply" reaches every verifier before the process goes (left unrevealed it would burn the
    donor, and its shares would tell the node after the epoch that the request was donated)."""
    w = World()
    send, stops = trio.open_memory_channel[None](2)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.donor.run)
        nursery.start_soon(_stop_once_sent, w, send, 0.25)  # before the reply's first chunk
        assert await reveal_before_stopping(w.ask, stops, w.donor, lambda _: None) is True
        assert w.donor.pending == 0
        nursery.cancel_scope.cancel()
    for v in w.verifiers.values():
        assert [c for c, _ in v.reveals] == [0] and "counts for nothing" in v.reveals[0][1]
    assert (w.donor.committed, w.donor.no_reply) == (1, 1)


async def test_without_a_stop_the_reveals_still_out_are_waited_for(autojump_clock: Any) -> None:
    w = World()
    _, stops = trio.open_memory_channel[None](1)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.donor.run)
        assert await reveal_before_stopping(w.ask, stops, w.donor, lambda _: None) is False
        assert w.donor.pending == 0 and w.donor.revealed == 3
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("again", [None, 2.0])
async def test_the_wait_for_reveals_is_bounded_and_a_second_stop_ends_it(autojump_clock: Any,
                                                                         again: float | None) -> None:
    """A verifier that never answers a reveal holds the stop up for EXIT_WAIT_S at most, and a
    second Ctrl-C ends the wait at once."""
    w = World(answers={0: "hang"})
    send, stops = trio.open_memory_channel[None](2)
    first: list[float] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(w.donor.run)
        nursery.start_soon(partial(_stop_once_sent, w, send, 5.0, again=again, at=first))  # the reply is whole by then

        async def serving() -> None:  # a gateway: one request, then waiting for the next
            await w.ask()
            await trio.sleep_forever()

        notes: list[str] = []
        assert await reveal_before_stopping(serving, stops, w.donor, notes.append) is True
        waited = trio.current_time() - first[0]
        assert w.donor.pending == 1  # the hanging verifier's reveal
        nursery.cancel_scope.cancel()
    assert waited == pytest.approx(EXIT_WAIT_S if again is None else again)
    assert notes == ["[revealing 1 donated transcript(s)... Ctrl-C again to stop now]"]
