"""Escrowed transcript donation, the user's side (user_client/transcripts.py, decision 0037 steps 2
and 3): with the validators' powers, a chosen request's secret is dealt among four real verifiers
(verifier/abci_app.py's CommitteeAbciApp over one committed state, each with its own book, as in
tests/unit/test_escrow_intake.py), their acceptances are checked and handed back as a
certificate, and only then does the request leave; the reveal carries the secret. Acceptances of
two thirds of the power or less donate nothing, and the request goes as a normal one. Without
powers the version-1 commit is used. Trio's MockClock runs the waits; every clock is trio's."""

from __future__ import annotations

import base64
import logging
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
import trio

from overlay.anon import signing
from overlay.anon.client import AllBusy
from overlay.directory import escrow
from overlay.directory import transcripts as wire
from overlay.directory.donation import KEY_PATH
from overlay.directory.registration import Code
from overlay.wire import crypto
from overlay.wire.clock import TrioClock
from overlay.wire.failures import Failure
from overlay.wire.messages import ChatMessage, ReplyChunk, Request, SamplingParams
from tests.unit.test_escrow_intake import KEYS, MODEL, Committee
from user_client.transcripts import EXIT_WAIT_S, DonatingClient, TranscriptDonor
from verifier.abci.proto.tendermint.abci import types_pb2 as abci
from verifier.abci_app import CommitteeAbciApp

MSGS = [ChatMessage("user", "what is a quine?")]
PARAMS = SamplingParams(temperature=0.7, top_p=1.0, max_tokens=32)
TEXTS = ["a quine ", "prints itself"]


@dataclass
class Entry:
    node_id: bytes


class FakeClient:
    """The anonymous client: every request goes to the committee's registered model node, which
    signs a two-chunk reply on trio's clock (with ``busy``, its signed "busy" refusal, decision 0044,
    into ``refusals``, and no node is left); each send is logged as ("send", request id)."""

    def __init__(self, w: Committee, log: list[tuple[Any, ...]]) -> None:
        self.node, self.log = w.node, log
        self.busy = False

    def choose_model_node(self, model: str, prefer: bytes | None = None) -> Entry:
        return Entry(prefer or self.node.node_id)

    async def request(self, model: str, messages: Any, params: Any = None, *, node: bytes | None = None,
                      chunk_timeout: float = 60.0, paths_timeout: float = 30.0, request_id: bytes | None = None,
                      sent_to: set[bytes] | None = None,
                      refusals: list[ReplyChunk] | None = None,
                      wait_first: bool = False) -> AsyncGenerator[ReplyChunk, None]:
        rid = request_id or crypto.random_bytes(16)
        req = Request(request_id=rid, model=model, messages=tuple(messages), params=params or SamplingParams(), k=3,
                      return_paths=(), continuation="")
        self.log.append(("send", rid))
        await trio.sleep(0.2)  # the cloves' way to the node: it signs after the send
        if self.busy:
            at_ms = int(TrioClock().unix() * 1000)
            sig = self.node.signing.sign(signing.busy_signing_bytes(signing.request_digest(req, self.node.node_id),
                                                                     model, self.node.node_id, at_ms))
            assert refusals is not None
            refusals.append(ReplyChunk(request_id=rid, seq=0, text="", token_ids=(), done=True, error="busy: full",
                                       node=self.node.node_id, chain=b"", signature=sig, signed_at_ms=at_ms,
                                       failure=Failure.BUSY))
            raise AllBusy("busy: full; every model node tried is busy")
        signer = signing.ReplySigner(signing.request_digest(req, self.node.node_id), model, self.node.node_id)
        for i, t in enumerate(TEXTS):
            await trio.sleep(0.1)
            at_ms = int(TrioClock().unix() * 1000)
            chain, sig = signer.add(t, (i + 1,), i == len(TEXTS) - 1, at_ms, self.node.signing.sign)
            yield ReplyChunk(request_id=rid, seq=i, text=t, token_ids=(i + 1,), done=i == len(TEXTS) - 1, error="",
                             node=self.node.node_id, chain=chain, signature=sig, signed_at_ms=at_ms)


class World:
    """Four equal verifiers (tests/unit/test_escrow_intake.py's committee, on trio's clock) behind
    a fake RPC; ``answers[i]``: "ok", "down" (every query fails), "commit-down" (only the escrowed
    commit fails: it answers the certificate) or "forge" (it answers an acceptance that does not
    verify). The committee's donor donates, its model node serves; with ``escrowed``, the donor
    knows the validators' powers, else ``powers`` (None: not known); ``version1``: the verifiers
    also take commitments without escrow (``--take-version1-commits``)."""

    def __init__(self, answers: Mapping[int, str] | None = None, *, escrowed: bool = True,
                 powers: Callable[[], Mapping[bytes, int]] | None = None, version1: bool = False) -> None:
        self.w = w = Committee()
        w.apps = [CommitteeAbciApp(w.core, None, k, transcripts=b, clock=TrioClock(), version1_commits=version1)
                  for k, b in zip(KEYS, w.books, strict=True)]
        self.answers = dict(answers or {})
        self.addresses = [f"v{i}:26657" for i in range(len(KEYS))]
        self.log: list[tuple[Any, ...]] = []
        self.reveals: dict[int, list[wire.Body]] = {i: [] for i in range(len(KEYS))}
        self.client = FakeClient(w, self.log)
        self.donor = TranscriptDonor(w.donor, self.addresses, lambda: [k.public_bytes for k in KEYS],
                                     powers=(lambda: w.validators) if escrowed else powers,
                                     rate=1.0, rpc=self.rpc, reveal_retry=1.0)
        self.wrapped = DonatingClient(self.client, self.donor)

    async def rpc(self, address: str, method: str, params: dict[str, str]) -> Any:
        assert method == "abci_query"
        await trio.sleep(0.05)  # the RPC's round trip
        i = self.addresses.index(address)
        path, data = params["path"].strip('"'), bytes.fromhex(params["data"][2:]) if "data" in params else b""
        how = self.answers.get(i, "ok")
        if how == "down" or (how == "commit-down" and path == wire.ESCROW_COMMIT_PATH):
            self.log.append((path, i, "down"))
            raise OSError("connection refused")
        if path == KEY_PATH:  # what a verifier that runs --audit answers: its validator key
            return {"response": {"code": 0, "log": "", "value": base64.b64encode(KEYS[i].public_bytes).decode()}}
        if path == wire.REVEAL_PATH:
            self.reveals[i].append(wire.decode_reveal(wire.unseal(KEYS[i].private_bytes(), data)).body)
        res = self.w.apps[i].query(abci.RequestQuery(path=path, data=data))
        value = bytes(res.value)
        if how == "forge" and path == wire.ESCROW_COMMIT_PATH and res.code == 0:
            value = value[:-1] + bytes([value[-1] ^ 1])  # its signature no longer verifies
        self.log.append((path, i, res.code))
        return {"response": {"code": res.code, "log": res.log, "value": base64.b64encode(value).decode()}}

    async def ask(self) -> str:
        async with trio.open_nursery() as nursery:
            await nursery.start(self.donor.run)
            text = ""
            try:
                async for c in self.wrapped.request(MODEL, MSGS, PARAMS, node=None, chunk_timeout=30):
                    text += c.text
            except AllBusy as exc:
                text = f"error: {exc}"
            with trio.fail_after(EXIT_WAIT_S + 60):
                assert await self.donor.wait_idle()
            nursery.cancel_scope.cancel()
        return text

    def paths(self, path: str) -> list[tuple[int, Any]]:
        return [(e[1], e[2]) for e in self.log if e[0] == path]

    def counted(self, i: int) -> list[Any]:
        return self.w.books[i].close(self.w.epoch)


def _secret_opens(body: wire.Body) -> bool:
    return isinstance(body, wire.Revealed) and len(body.secret) == wire.SECRET_LEN \
        and escrow.nonce_of(escrow.scalar_of(body.secret)) == body.nonce


async def test_an_escrowed_donation_is_certified_before_the_request_and_counts_at_every_verifier(
        autojump_clock: Any) -> None:
    world = World()
    assert await world.ask() == "a quine prints itself"
    order = [e[0] for e in world.log]
    send = order.index("send")
    # commit, then certify, at all four; only then the request; then the reveals
    assert order[:send] == [wire.ESCROW_COMMIT_PATH] * 4 + [wire.CERTIFY_PATH] * 4, world.log
    assert sorted(world.paths(wire.ESCROW_COMMIT_PATH)) == [(i, 0) for i in range(4)]
    assert sorted(world.paths(wire.CERTIFY_PATH)) == [(i, 0) for i in range(4)]
    assert sorted(world.paths(wire.REVEAL_PATH)) == [(i, 0) for i in range(4)]
    assert not world.paths(wire.COMMIT_PATH)  # no version-1 commit
    (rid,) = [e[1] for e in world.log if e[0] == "send"]
    for i in range(4):
        (body,) = world.reveals[i]
        assert _secret_opens(body)  # the reveal carries the secret (a body of kind 2)
        (c,) = world.counted(i)
        assert c.donor == world.w.donor.node_id and c.node_id == world.w.node.node_id
        assert c.transcript.request_id == rid and c.transcript.secret == body.secret  # type: ignore[union-attr]
    assert (world.donor.committed, world.donor.escrowed, world.donor.revealed) == (1, 1, 4)


async def test_an_escrowed_commitment_its_node_refused_busy_is_revealed_by_its_nonce_and_never_released(
        autojump_clock: Any) -> None:
    """Decision 0044: the busy node's signed refusal (a body of kind 3, by the commitment's nonce,
    without the secret) is taken at every verifier; the set is not void, nothing counts, and no
    verifier releases shares of it (the node served nothing to hand in)."""
    world = World()
    world.client.busy = True
    assert (await world.ask()).startswith("error: busy")
    assert sorted(world.paths(wire.REVEAL_PATH)) == [(i, 0) for i in range(4)]
    for i in range(4):
        (body,) = world.reveals[i]
        assert isinstance(body, wire.Revealed) and body.busy and not body.secret
        book = world.w.books[i]
        assert book.released(world.w.epoch) == [] and world.counted(i) == []
        assert world.w.donor.node_id not in book.history and book.voided == 0
    assert (world.donor.escrowed, world.donor.busy, world.donor.no_reply) == (1, 1, 0)


@pytest.mark.parametrize(("how", "counting"), [("down", (0, 1, 2)), ("commit-down", (0, 1, 2, 3)),
                                               ("forge", (0, 1, 2, 3))])
async def test_three_of_four_acceptances_still_certify(autojump_clock: Any, how: str,
                                                       counting: tuple[int, ...]) -> None:
    """Verifier 3 is down, down for the commit only (it takes the certificate without shares of
    its own), or answers an acceptance that does not verify: 30 of 40 power accepted is above two
    thirds. The commitment is donated to every verifier that took the certificate."""
    world = World({3: how})
    assert await world.ask() == "a quine prints itself"
    assert world.donor.escrowed == 1
    for i in range(4):
        assert len(world.counted(i)) == (1 if i in counting else 0), (i, world.log)
        assert [_secret_opens(b) for b in world.reveals[i]] == ([True] if i in counting else [])
    if how == "commit-down":
        assert world.w.books[3].released(world.w.epoch) == []  # certified there without shares of its own


@pytest.mark.parametrize("how", ["down", "forge"])
async def test_two_of_four_acceptances_donate_nothing_and_the_request_still_goes(
        autojump_clock: Any, caplog: pytest.LogCaptureFixture, how: str) -> None:
    world = World({2: how, 3: how})
    with caplog.at_level(logging.INFO, "gentorrent.donate"):
        assert await world.ask() == "a quine prints itself"
    assert "20 of 40 power, not above two thirds" in caplog.text
    assert [e[0] for e in world.log].count("send") == 1
    assert not world.paths(wire.CERTIFY_PATH) and not world.paths(wire.REVEAL_PATH)
    assert (world.donor.committed, world.donor.escrowed, world.donor.pending) == (0, 0, 0)
    for i in range(4):  # those that held it hold it uncertified: it counts for nothing and costs nothing
        assert world.counted(i) == [] and world.w.donor.node_id not in world.w.books[i].burnt


@pytest.mark.parametrize("powers", [None, dict], ids=["no-powers", "no-plan"])
async def test_without_powers_or_a_plan_the_version_1_commit_is_used(
        autojump_clock: Any, powers: Callable[[], Mapping[bytes, int]] | None) -> None:
    world = World(escrowed=False, powers=powers, version1=True)
    assert await world.ask() == "a quine prints itself"
    assert sorted(world.paths(wire.COMMIT_PATH)) == [(i, 0) for i in range(4)]
    assert not world.paths(wire.ESCROW_COMMIT_PATH) and not world.paths(wire.CERTIFY_PATH)
    for i in range(4):
        (body,) = world.reveals[i]
        assert isinstance(body, wire.Revealed) and body.secret == b""
        (c,) = world.counted(i)
        assert c.transcript.secret == b""
    assert (world.donor.committed, world.donor.escrowed, world.donor.revealed) == (1, 0, 4)


async def test_a_commitment_without_escrow_is_refused_by_default_and_the_request_still_goes(
        autojump_clock: Any) -> None:
    world = World(escrowed=False)
    assert await world.ask() == "a quine prints itself"
    assert sorted(code for _, code in world.paths(wire.COMMIT_PATH)) == [int(Code.UNSUPPORTED_VERSION)] * 4
    assert all(not world.reveals[i] and not world.counted(i) for i in range(4))
    assert (world.donor.committed, world.donor.escrowed, world.donor.revealed) == (0, 0, 0)
