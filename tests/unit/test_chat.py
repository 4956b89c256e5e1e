"""The chat's session (history window, affinity, status), its /commands and its exit statuses."""

from __future__ import annotations

import io

import pytest

from overlay.anon.client import AllBusy, AnonError, ModelUnaudited, QuotaExhausted, ReplyUnverified
from overlay.anon.paths import PathError
from overlay.wire.failures import Failure
from overlay.wire.messages import ChatMessage, ReplyChunk, SamplingParams
from user_client import chat

NODE = b"N" * 32


class FakeClient:
    """Echoes the last message back in two chunks; records what it was sent."""

    def __init__(self, fail: str | None = None) -> None:
        self.sent: list[tuple[str, tuple[ChatMessage, ...], bytes | None]] = []
        self.fail = fail

    async def request(self, model, messages, params=None, *, node=None, chunk_timeout=60.0, sent_to=None):
        self.sent.append((model, tuple(messages), node))
        if self.fail:
            raise AnonError(self.fail)
        text = messages[-1].content
        half = len(text) // 2
        yield ReplyChunk(b"r" * 16, 0, text[:half], tuple(range(half)), False, "", NODE, b"c" * 32, b"s" * 64, 1)
        yield ReplyChunk(b"r" * 16, 1, text[half:], tuple(range(len(text) - half)), True, "", NODE, b"c" * 32, b"s" * 64, 1)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 0.25
        return self.t


async def test_a_turn_streams_records_and_goes_back_to_the_same_node():
    client = FakeClient()
    s = chat.ChatSession(client, "m", SamplingParams(max_tokens=16), "be brief", now=Clock())
    out = io.StringIO()
    t = await s.turn("hello there", out, 5)
    assert out.getvalue() == "hello there\n"
    assert (t.text, t.node, t.verified, t.tokens, t.first_token_s) == ("hello there", NODE, True, 11, 0.25)
    await s.turn("again", io.StringIO(), 5)
    assert client.sent[0][2] is None and client.sent[1][2] == NODE  # affinity
    assert [m.role for m in client.sent[1][1]] == ["system", "user", "assistant", "user"]
    assert "verified" in chat.describe(t) and NODE.hex()[:8] in chat.describe(t)
    assert "trust unknown (no committee)" in chat.describe(t)
    # With a committee's model list, the serving node's reputation shows as its trust.
    from overlay.net.peers import PeerEntry

    listed = [PeerEntry(NODE, "h:1", b"e" * 32, b"x" * 32, role="model", models=("m",), reputation=912_000)]
    line = chat.describe(t, lambda n: chat.reputation_of(listed, n))
    assert f"model node {NODE.hex()[:8]} · trust 0.91 · signature verified" in line
    assert chat.reputation_of(listed, b"z" * 20) is None


async def test_a_failed_turn_is_forgotten():
    s = chat.ChatSession(FakeClient(fail="no reply from model node 01020304 within 5s"), "m", SamplingParams(), None)
    with pytest.raises(AnonError):
        await s.turn("hello", io.StringIO(), 5)
    assert s.history == [] and s.node is None


async def test_history_is_trimmed_to_the_context_window_keeping_the_system_prompt():
    client = FakeClient()
    s = chat.ChatSession(client, "m", SamplingParams(max_tokens=50), "sys", context_tokens=200)
    for i in range(10):
        await s.turn(f"turn {i} " + "x" * 60, io.StringIO(), 5)
    sent = client.sent[-1][1]
    assert sent[0] == ChatMessage("system", "sys") and sent[-1].content.startswith("turn 9")
    assert sent[1].role == "user"  # a window starts with a user turn
    assert len(sent) < 2 * 10
    estimate = sum(s.estimate(m.content) for m in sent)
    assert estimate <= 200 - 50 + 10  # within the budget (assistant turns count their tokens)
    with pytest.raises(AnonError, match="does not fit"):
        await s.turn("y" * 600, io.StringIO(), 5)
    assert s.history[-1].role == "assistant"  # the refused prompt is not kept


def _model_node(model: str, reputation: int | None = 900_000, audited: bool | None = True):
    from overlay.net.peers import PeerEntry

    return PeerEntry(NODE[:20], "h:1", b"e" * 32, b"x" * 32, role="model", models=(model,), reputation=reputation,
                     audited=audited)


def node_of(s: chat.ChatSession) -> bytes | None:
    """The model node ``s`` sticks to, read afresh: after ``s.node = NODE`` mypy would hold
    ``s.node`` to NODE's type across the commands that reset it."""
    return s.node


def test_commands():
    s = chat.ChatSession(FakeClient(), "m", SamplingParams(), "sys")
    s.history.append(ChatMessage("user", "x"))
    s.node = NODE

    def models(name):
        if name == "plain":
            return [_model_node(name, audited=False)]
        if name == "sunk":
            return [_model_node(name, reputation=100_000)]
        return [_model_node(name)] if name in ("m", "other") else []

    assert chat.command(s, "/help", models) == (True, chat.HELP)
    assert chat.command(s, "/new", models)[0] and s.history == [ChatMessage("system", "sys")] and node_of(s) is None
    s.node = NODE
    assert "no model node" in chat.command(s, "/model nope", models)[1] and s.model == "m" and s.node == NODE
    said = chat.command(s, "/model plain", models)[1]
    assert "model plain is not audited" in said and "--allow-unaudited" in said and s.model == "m"
    assert "no model node serving 'sunk' is trusted" in chat.command(s, "/model sunk", models, True)[1]
    assert s.model == "m"
    assert chat.command(s, "/model plain", models, True)[1] == "[model: plain]" and s.model == "plain"
    assert chat.command(s, "/model other", models)[0] and s.model == "other" and node_of(s) is None
    assert "other" in chat.command(s, "/model", models)[1]
    assert chat.command(s, "/quit", models)[0] is False
    assert "unknown command" in chat.command(s, "/frobnicate", models)[1]


@pytest.mark.parametrize("exc,status", [
    (PathError("only 1 of the 4 proxy paths needed are ready after 60s"), chat.EXIT_PATHS),
    (AnonError("only 1 of the 4 proxy paths needed are ready after 30s (...)", Failure.NO_PATHS), chat.EXIT_PATHS),
    (AnonError("no reply from model node 0a0b0c0d within 5s (...)", Failure.SILENT), chat.EXIT_NO_MODEL_NODE),
    (AnonError("no model node in the registry serves 'x'", Failure.NO_MODEL_NODE), chat.EXIT_NO_MODEL_NODE),
    (AnonError("model node 0a0b0c0d: max_tokens must be within 1..4096, got 5000", Failure.INVALID),
     chat.EXIT_MODEL_ERROR),
    (AnonError("model node 0a0b0c0d failed: engine error", Failure.NODE_ERROR), chat.EXIT_MODEL_ERROR),
    (AllBusy("every model node tried for 'm' (3) is busy"), chat.EXIT_MODEL_ERROR),
    (ReplyUnverified("reply chunk 3 from node 0a0b0c0d does not match its hash chain"), chat.EXIT_UNVERIFIED),
    (AnonError("no reply from model node 0a0b0c0d: it is gone (model-lost: ...)", Failure.LOST), chat.EXIT_NO_MODEL_NODE),
    (AnonError("reply chunks arrived too far out of order"), chat.EXIT_OTHER),
    (ModelUnaudited("m"), chat.EXIT_UNAUDITED),
    (QuotaExhausted("your quota of 'm' for this period is used up; it refills in 42 s", 1e9, 42.0), chat.EXIT_QUOTA),
    # the words are never read: only the kind says what failed
    (AnonError("no reply from model node 0a0b0c0d within 5s; the reply was discarded"), chat.EXIT_OTHER),
    (AnonError("a message in no known form", Failure.UNVERIFIED), chat.EXIT_UNVERIFIED),
    (RuntimeError("x"), chat.EXIT_OTHER),
])
def test_exit_status_says_what_failed(exc, status):
    assert chat.exit_status(exc) == status
    assert status in chat.EXIT_CODES


def test_every_kind_of_failure_has_its_exit_status():
    assert set(chat.EXIT_FOR) == set(Failure) - {Failure.NONE, Failure.OTHER}
    assert set(chat.EXIT_FOR.values()) <= set(chat.EXIT_CODES) - {chat.EXIT_OK, chat.EXIT_USAGE}


OTHER = b"O" * 32


class FailoverClient:
    """Two chunks from NODE, then (after a failover) two from OTHER."""

    async def request(self, model, messages, params=None, *, node=None, chunk_timeout=60.0, sent_to=None):
        for i, (who, text) in enumerate([(NODE, "one "), (NODE, "two "), (OTHER, "three "), (OTHER, "four")]):
            yield ReplyChunk(b"r" * 16, i, text, (i,), i == 3, "", who, b"c" * 32, b"s" * 64, 1)


async def test_a_failed_over_reply_says_which_node_wrote_which_part():
    s = chat.ChatSession(FailoverClient(), "m", SamplingParams(), None)
    t = await s.turn("hi", io.StringIO(), 5)
    assert t.text == "one two three four" and t.node == OTHER and t.verified
    assert t.parts == ((NODE, 8), (OTHER, 10))
    line = chat.describe(t)
    assert (f"{NODE.hex()[:8]} (8 characters; trust unknown (no committee)) then {OTHER.hex()[:8]} "
            "(10 characters; trust unknown (no committee))") in line
    trusted = chat.describe(t, {NODE: 930_000, OTHER: 412_345}.get)
    assert f"{NODE.hex()[:8]} (8 characters; trust 0.93) then {OTHER.hex()[:8]} (10 characters; trust 0.41)" in trusted
    assert "each part's signature verified" in line
    assert s.node == OTHER  # follow-ups go to the node that wrote the end


class RefusingClient:
    async def request(self, model, messages, params=None, *, node=None, chunk_timeout=60.0, sent_to=None):
        yield ReplyChunk(b"r" * 16, 0, "checked ", (1,), False, "", NODE, b"c" * 32, b"s" * 64, 1)
        raise ReplyUnverified("reply chunk 1 from node 4e4e4e4e does not match its hash chain")


async def test_a_reply_that_fails_verification_is_not_kept():
    s = chat.ChatSession(RefusingClient(), "m", SamplingParams(), None)
    out = io.StringIO()
    with pytest.raises(ReplyUnverified):
        await s.turn("hi", out, 5)
    assert out.getvalue() == "checked "  # only what passed its check was printed
    assert s.history == [] and s.node is None


THIRD, FOURTH = b"T" * 32, b"F" * 32


class ScriptedClient:
    """Per request, the next of ``tries``: the nodes it is sent to (added to ``sent_to``, as
    AnonClient does for each target tried), then the node that signs the reply, or None: the
    request fails."""

    def __init__(self, tries: list[tuple[tuple[bytes, ...], bytes | None]]) -> None:
        self.tries = tries

    async def request(self, model, messages, params=None, *, node=None, chunk_timeout=60.0, sent_to=None):
        targets, signer = self.tries.pop(0)
        if sent_to is not None:
            sent_to.update(targets)
        if signer is None:
            raise AnonError(f"model node {targets[-1].hex()[:8]} failed: engine error", Failure.NODE_ERROR)
        yield ReplyChunk(b"r" * 16, 0, "ok", (1,), True, "", signer, b"c" * 32, b"s" * 64, 1)


async def test_a_turn_says_every_node_that_has_read_the_conversation():
    """Decision 0029: the nodes each request was sent to (one refused as busy, one it failed over
    to) and the chunks' signers (a member a node forwarded it to), kept for the whole
    conversation, a failed turn's targets too; /new forgets them."""
    s = chat.ChatSession(ScriptedClient([
        ((NODE, OTHER), THIRD),  # NODE refused as busy, OTHER forwarded it to THIRD, which signed
        ((THIRD,), THIRD),
        ((THIRD, FOURTH), None),  # sent to THIRD, failed over to FOURTH, which failed: the turn fails
        ((THIRD,), THIRD),
        ((OTHER,), OTHER),
    ]), "m", SamplingParams(), None)
    t1 = await s.turn("one", io.StringIO(), 5)
    assert t1.seen_by == tuple(sorted((NODE, OTHER, THIRD)))
    t2 = await s.turn("two", io.StringIO(), 5)
    assert t2.seen_by == t1.seen_by  # the follow-up keeps the first turn's nodes
    with pytest.raises(AnonError):
        await s.turn("three", io.StringIO(), 5)
    t4 = await s.turn("four", io.StringIO(), 5)
    assert t4.seen_by == tuple(sorted((NODE, OTHER, THIRD, FOURTH)))  # the failed turn's nodes read the history
    s.new()
    assert (await s.turn("five", io.StringIO(), 5)).seen_by == (OTHER,)


class Offers:
    """A donor that records what it is offered."""

    def __init__(self) -> None:
        self.offers: list[tuple[str, tuple[ChatMessage, ...], tuple[bytes, ...]]] = []

    def offer(self, model, messages, params, seen_by=()) -> bool:
        self.offers.append((model, tuple(messages), tuple(seen_by)))
        return True


async def test_a_chat_offers_its_donation_with_the_nodes_that_read_it(capsys):
    import argparse

    session = chat.ChatSession(ScriptedClient([((NODE, OTHER), THIRD)]), "m", SamplingParams(), None)
    run = chat.ChatRun(argparse.Namespace(timeout=5, verbose=False), None, None, session, registry=_NoModels(),
                       committee=None, listen=("127.0.0.1", 0), interactive=False, turns=[])
    run.donor = donor = Offers()  # type: ignore[assignment]
    assert await run.ask("one")
    assert donor.offers == [("m", (ChatMessage("user", "one"),), tuple(sorted((NODE, OTHER, THIRD))))]


class _NoModels:
    def models(self, model):
        return []


def test_a_turn_records_the_messages_it_sent():
    import trio

    client = FakeClient()
    s = chat.ChatSession(client, "m", SamplingParams(), "sys")
    t = trio.run(s.turn, "hello", io.StringIO(), 5)
    assert t.sent == client.sent[-1][1] == (ChatMessage("system", "sys"), ChatMessage("user", "hello"))


def _chat(tmp_path, capsys, *extra: str) -> tuple[int, str]:
    """``gentorrent user chat`` on a peers file whose only model node serves ``m`` (no committee)."""
    from gentorrent.cli import main
    from overlay.net import peers
    from overlay.net.peers import PeerEntry
    from overlay.wire.identity import Identity

    peers.save(tmp_path / "peers.json", [PeerEntry.of(Identity.generate(), "127.0.0.1:9", role="model",
                                                      models=("m",))])
    code = main(["user", "chat", "--data-dir", str(tmp_path), "--peers", str(tmp_path / "peers.json"), "--model",
                 "m", "--prompt", "hi", "--paths-timeout", "0.01", "--log-level", "error", *extra])
    return code, capsys.readouterr().err


def test_chat_refuses_an_unaudited_model_naming_the_flag() -> None:
    """A committee's list marks the model unaudited (trusted node, audited False): the chat's check
    refuses it naming the flag, exits 7, and lets it through with the opt-in. A node no committee
    vouches for (audited None: peer and registry files) is allowed."""
    from overlay.anon.client import ModelUnaudited
    from overlay.net.peers import PeerEntry

    def node(audited: bool | None) -> PeerEntry:
        return PeerEntry(b"\x01" * 20, "127.0.0.1:9", b"e" * 32, b"x" * 32, role="model", models=("m",),
                         reputation=None if audited is None else 600_000, audited=audited)

    problem = chat.model_problem([node(False)], "m", allow_unaudited=False)
    assert isinstance(problem, ModelUnaudited) and chat.exit_status(problem) == chat.EXIT_UNAUDITED == 7
    assert str(problem) == ("model m is not audited by the committee's verifiers (no verifier with enough voting "
                            "power holds it); pass --allow-unaudited to use it anyway")
    assert chat.model_problem([node(False)], "m", allow_unaudited=True) is None
    assert chat.model_problem([node(None)], "m", allow_unaudited=False) is None


def test_chat_checks_top_p_and_the_donation_settings(tmp_path, capsys):
    code, err = _chat(tmp_path, capsys, "--top-p", "0")
    assert code == 2 and "--top-p must be within (0, 1]" in err
    code, err = _chat(tmp_path, capsys, "--donate-rate", "1.5")
    assert code == 2 and "--donate-rate must be within 0..1" in err
    code, err = _chat(tmp_path, capsys, "--donate-prompts")
    assert code == 2 and "--donate-prompts" in err and "needs --committee" in err
