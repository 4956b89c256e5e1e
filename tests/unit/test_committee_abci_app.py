"""The ABCI adapter (verifier/abci_app.py) over the socket server: protobuf in, core calls, state on disk."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from overlay.directory.registration import Code
from overlay.wire.constants import ROLE_MODEL
from tests.committee_helpers import CHAIN, Node
from verifier.abci import server, wire
from verifier.abci.proto.tendermint.abci import types_pb2 as abci
from verifier.abci.proto.tendermint.crypto import keys_pb2
from verifier.abci_app import STATE_FILE, CommitteeAbciApp, StateStore
from verifier.app import StateError


class Client:
    """A fake CometBFT connection: send one request, read one response."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.buf = bytearray()

    async def call(self, **kw: Any) -> abci.Response:
        await self.stream.send_all(wire.encode_request(abci.Request(**kw)))
        while True:
            got = wire.decode_uvarint(self.buf)
            if got is not None and len(self.buf) >= got[0] + got[1]:
                n, start = got
                resp: abci.Response = abci.Response.FromString(bytes(self.buf[start : start + n]))
                del self.buf[: start + n]
                return resp
            data = await self.stream.receive_some(65536)
            assert data
            self.buf += data


def _genesis() -> abci.RequestInitChain:
    vals = [abci.ValidatorUpdate(pub_key=keys_pb2.PublicKey(ed25519=bytes([i]) * 32), power=10) for i in range(4)]
    return abci.RequestInitChain(chain_id=CHAIN, validators=vals, initial_height=1)


async def _run_chain(app: CommitteeAbciApp, nodes: list[Node]) -> bytes:
    client, srv = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.serve_connection, app, srv)
        c = Client(client)
        info = (await c.call(info=abci.RequestInfo())).info
        assert (info.last_block_height, info.last_block_app_hash) == (0, b"")
        await c.call(init_chain=_genesis())
        good = [n.register() for n in nodes]
        bad = [b"junk", good[0]]
        checks = [(await c.call(check_tx=abci.RequestCheckTx(tx=t))).check_tx for t in good + bad[:1]]
        assert [r.code for r in checks] == [0] * len(good) + [Code.MALFORMED]
        assert checks[-1].log
        t = abci.RequestPrepareProposal(txs=good + bad, max_tx_bytes=1 << 20)
        t.time.seconds = 1_700_000_000
        prepared = (await c.call(prepare_proposal=t)).prepare_proposal
        assert list(prepared.txs) == good
        p = abci.RequestProcessProposal(txs=good + bad[:1], height=1)
        p.time.seconds = 1_700_000_000
        assert (await c.call(process_proposal=p)).process_proposal.status == abci.ResponseProcessProposal.REJECT
        p = abci.RequestProcessProposal(txs=good, height=1)
        p.time.seconds = 1_700_000_000
        assert (await c.call(process_proposal=p)).process_proposal.status == abci.ResponseProcessProposal.ACCEPT
        f = abci.RequestFinalizeBlock(txs=good, height=1)
        f.time.seconds = 1_700_000_000
        fin = (await c.call(finalize_block=f)).finalize_block
        assert [r.code for r in fin.tx_results] == [0] * len(good) and len(fin.app_hash) == 32
        ext = (await c.call(extend_vote=abci.RequestExtendVote(height=1))).extend_vote
        assert ext.vote_extension == b""
        vve = (await c.call(verify_vote_extension=abci.RequestVerifyVoteExtension(height=1))).verify_vote_extension
        assert vve.status == abci.ResponseVerifyVoteExtension.ACCEPT
        await c.call(commit=abci.RequestCommit())
        q = (await c.call(query=abci.RequestQuery(path="/node", data=nodes[0].node_id))).query
        assert q.code == 0 and q.height == 1
        replay = (await c.call(check_tx=abci.RequestCheckTx(tx=good[0]))).check_tx
        assert replay.code == Code.REPLAYED
        info = (await c.call(info=abci.RequestInfo())).info
        assert info.last_block_height == 1 and info.last_block_app_hash == fin.app_hash
        await client.aclose()
    return fin.app_hash


async def test_a_block_through_the_socket_then_restart_from_disk(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    app_hash = await _run_chain(CommitteeAbciApp(store.load(), store), [Node(port=9000 + i) for i in range(3)])
    assert (tmp_path / STATE_FILE).exists() and not (tmp_path / (STATE_FILE[:-4] + ".tmp")).exists()
    restarted = CommitteeAbciApp(StateStore(tmp_path).load())
    info = restarted.info(abci.RequestInfo())
    assert (info.last_block_height, info.last_block_app_hash) == (1, app_hash)


def test_corrupt_state_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / STATE_FILE).write_bytes(b"\x94\x01")
    with pytest.raises(StateError):
        StateStore(tmp_path).load()


def test_model_registration_fields_survive_the_adapter() -> None:
    app = CommitteeAbciApp(StateStore("/nonexistent-never-written").load())
    app.init_chain(_genesis())
    n = Node()
    assert app.check_tx(abci.RequestCheckTx(tx=n.register(ROLE_MODEL, capacity=7))).code == 0
