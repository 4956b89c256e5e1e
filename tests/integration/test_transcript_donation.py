"""Transcript donation over the in-memory overlay (decision 0015; user_client/transcripts.py), on
trio's mock clock: a donor's request, committed to with every verifier before it leaves, is
answered by an echo model node through the anonymous client users run, and its sealed transcript
is taken by each verifier's TranscriptBook (through the verifier's intake, verifier/abci_app.py)
and counts, for the node that signed the reply, once the epoch closes. The model node sees a
request like any other: the committed id, addressed to it."""

from __future__ import annotations

import base64
import io
from typing import Any

import trio

from model_node.testing import echo_node
from overlay.directory import transcripts as wire
from overlay.testing import Net, record_requests, start_overlay
from overlay.wire import crypto
from overlay.wire.clock import TrioClock
from overlay.wire.identity import node_id_of
from overlay.wire.messages import SamplingParams
from user_client.chat import ChatSession
from user_client.transcripts import DonatingClient, TranscriptDonor
from verifier.abci_app import take_commit, take_reveal
from verifier.audit.transcripts import TranscriptBook

EPOCH = 7


class Verifier:
    """One verifier's RPC for transcripts: its key, the intake over its book; the keys come from
    the overlay's registry (``net``), as a verifier's come from the committee's."""

    def __init__(self, net: Net, donor_key: bytes) -> None:
        self.net, self.donor_key = net, donor_key
        self.key = crypto.SigningKey.generate()
        self.book = TranscriptBook()
        self.answers: list[tuple[str, int, str]] = []

    def user_key(self, node_id: bytes) -> bytes | None:
        return self.donor_key if node_id_of(self.donor_key) == node_id else None

    def key_of(self, node_id: bytes, model: str) -> bytes | None:
        e = self.net.registry.by_id.get(node_id)
        return e.ed25519_public if e is not None and model in e.models else None

    def handle(self, path: str, data: bytes) -> tuple[int, str, bytes]:
        if path == "/audit/donate_key":
            return 0, "", self.key.public_bytes
        if path == wire.COMMIT_PATH:
            code, why = take_commit(self.book, data, self.key.public_bytes, self.user_key, EPOCH,
                                    int(TrioClock().unix() * 1000))
        else:
            code, why = take_reveal(self.book, data, self.key.private_bytes(), self.key.public_bytes,
                                    self.user_key, self.key_of)
        self.answers.append((path, int(code), why))
        return int(code), why, b""


async def test_a_committed_request_is_answered_and_its_transcript_counts(autojump_clock: Any) -> None:
    async with trio.open_nursery() as nursery:
        net = await start_overlay(nursery, 15, models=[echo_node(), echo_node()])
        user = net.client
        assert user.client is not None and user.paths is not None
        verifiers = {f"v{i}:26657": Verifier(net, user.identity.ed25519_public) for i in range(3)}

        async def rpc(address: str, method: str, params: dict[str, str]) -> Any:
            await trio.sleep(0.05)  # the RPC's round trip
            data = bytes.fromhex(params["data"][2:]) if "data" in params else b""
            code, why, value = verifiers[address].handle(params["path"].strip('"'), data)
            return {"response": {"code": code, "log": why, "value": base64.b64encode(value).decode()}}

        seen = {m.identity.node_id: record_requests(m) for m in net.models}
        donor = TranscriptDonor(user.identity, list(verifiers), lambda: [v.key.public_bytes for v in verifiers.values()],
                                rate=1.0, rpc=rpc)
        await nursery.start(donor.run)
        with trio.fail_after(30):
            await user.paths.wait_ready(user.client.n)
        session = ChatSession(DonatingClient(user.client, donor), "echo", SamplingParams(max_tokens=32), None)
        turn = await session.turn("What makes the tides?", io.StringIO(), 30)
        assert turn.verified and turn.text == "What makes the tides?"  # the echo engine
        with trio.fail_after(30):
            assert await donor.wait_idle()
        (got,) = [r for reqs in seen.values() for r in reqs]
        assert turn.node in seen and seen[turn.node] == [got]  # the committed node, and only it
        for v in verifiers.values():
            assert [(p, c) for p, c, _ in v.answers] == [(wire.COMMIT_PATH, 0), (wire.REVEAL_PATH, 0)], v.answers
            (counted,) = v.book.close(EPOCH)
            assert counted.donor == user.identity.node_id and counted.node_id == turn.node
            assert counted.transcript.request_id == got.request_id
            assert "".join(t for t, _ in counted.transcript.reply.chunks) == "What makes the tides?"
            assert not v.book.burnt
        nursery.cancel_scope.cancel()
