"""The quota queries at a verifier (verifier/abci_app.py's routing to verifier/quota.py) and the
issuer's keeping in verifier/run.py: the genesis section, the saved state, its writing."""

from __future__ import annotations

import base64
import json
import logging
from functools import partial
from pathlib import Path

import pytest
import trio

from overlay.directory import quota as q
from overlay.directory.quota import QuotaParams
from overlay.directory.registration import OP_REGISTER, Code, Entry, make_tx
from overlay.wire import crypto
from overlay.wire.clock import FakeClock
from overlay.wire.constants import ROLE_MODEL, ROLE_USER
from overlay.wire.identity import Identity
from verifier.abci.proto.tendermint.abci import types_pb2 as abci
from verifier.abci_app import CommitteeAbciApp
from verifier.app import CommitteeApp, Validator
from verifier.quota import Issuer
from verifier.run import (
    QUOTA_FILE,
    CometExited,
    QuotaFileError,
    genesis_quota,
    keep_issuer,
    load_issuer,
    make_issuer,
    run_verifier,
)

VERIFIER = crypto.SigningKey.from_bytes(b"\x07" * 32)
CHAIN = "quotas"
MODEL = "smollm2-135m-instruct"
PARAMS = QuotaParams(tokens=3, burst=3)
NOW = 1_700_000_000.0


class World:
    """A committee core with a registered user, a stranger and a model node serving MODEL, and
    this verifier's ABCI app over an issuer (or none), on a hand-set clock."""

    def __init__(self, *, quotas: bool = True) -> None:
        self.user, self.stranger, self.node = Identity.generate(), Identity.generate(), Identity.generate()
        core = CommitteeApp()
        state = {"quota": PARAMS.to_json()} if quotas else {}
        core.init_chain(CHAIN, [Validator("ed25519", VERIFIER.public_bytes, 10)], json.dumps(state).encode())
        txs = [make_tx(self.user.signing, CHAIN, OP_REGISTER, 1,
                       Entry(ROLE_USER, self.user.x25519.public_bytes, "127.0.0.1:7000", "default")),
               make_tx(self.node.signing, CHAIN, OP_REGISTER, 1,
                       Entry(ROLE_MODEL, self.node.x25519.public_bytes, "127.0.0.1:7999", "default", MODEL, 1))]
        results, _ = core.finalize_block(1, 1_700_000_000, txs, b"\x01" * 32)
        assert all(r.ok for r in results), results
        core.commit()
        self.clock = FakeClock(unix=NOW)
        self.issuer = Issuer.of_validator(VERIFIER, CHAIN, PARAMS) if quotas else None
        self.app = CommitteeAbciApp(core, None, VERIFIER, clock=self.clock, issuer=self.issuer)
        self.epoch = PARAMS.epoch_at(NOW)

    def query(self, path: str, data: bytes) -> abci.ResponseQuery:
        return self.app.query(abci.RequestQuery(path=path, data=data))

    def request(self, n: int = 1, who: Identity | None = None, model: str = MODEL) -> tuple[q.Blinding, bytes]:
        who = who or self.user
        b = q.Blinding(q.new_nonces(n))
        return b, q.encode_issue(who.signing, CHAIN, q.IssueRequest(who.node_id, VERIFIER.public_bytes, model,
                                                                     self.epoch, b.blinded))


def test_a_user_gets_a_token_through_the_queries_and_a_node_spends_it_once() -> None:
    w = World()
    res = w.query(q.KEY_PATH, q.encode_key_query(MODEL, w.epoch))
    assert res.code == 0
    rec = q.decode_key_record(res.value)
    q.verify_key_record(rec, CHAIN)
    assert rec.issuer == VERIFIER.public_bytes and rec.params == PARAMS
    b, raw = w.request(2)
    res = w.query(q.ISSUE_PATH, raw)
    assert res.code == 0, res.log
    issued = q.decode_issued(res.value)
    assert issued.left == 1
    outputs = b.finalize(issued, rec.key)
    redeem = q.encode_redeem(q.Redeem(MODEL, w.epoch, b.nonces[0], outputs[0]))
    res = w.query(q.REDEEM_PATH, redeem)
    assert (res.code, res.value) == (0, b"")
    res = w.query(q.REDEEM_PATH, redeem)
    assert res.code == Code.SPENT and res.log
    assert w.query(q.ISSUE_PATH, w.request(2)[1]).code == Code.QUOTA_LATER


def test_refusals_are_codes_with_reasons() -> None:
    w = World()
    cases = [
        (q.ISSUE_PATH, w.request(who=w.stranger)[1], Code.UNKNOWN_NODE),
        (q.ISSUE_PATH, w.request(who=w.node)[1], Code.UNKNOWN_NODE),  # a model node is no user
        (q.ISSUE_PATH, w.request(model="another-model")[1], Code.INVALID_FIELD),  # no listed node serves it
        (q.ISSUE_PATH, b"\x00" * 40, Code.MALFORMED),
        (q.REDEEM_PATH, q.encode_redeem(q.Redeem(MODEL, w.epoch, b"\x01" * 32, b"\x02" * 64)), Code.BAD_TOKEN),
        (q.REDEEM_PATH, b"\xc1", Code.MALFORMED),
        (q.KEY_PATH, b"\x92", Code.MALFORMED),
        (q.KEY_PATH, q.encode_key_query(MODEL, w.epoch + 5), Code.WRONG_EPOCH),
        (q.ISSUE_PATH, b"\x90" * (q.MAX_ISSUE_BYTES + 1), Code.OVERSIZE),
        (q.REDEEM_PATH, b"\x90" * (q.MAX_REDEEM_BYTES + 1), Code.OVERSIZE),
        (q.KEY_PATH, b"\x90" * 1000, Code.OVERSIZE),
    ]
    for path, data, code in cases:
        res = w.query(path, data)
        wrong_epoch_key = code == Code.WRONG_EPOCH and path == q.KEY_PATH  # answered with the current record
        assert res.code == code and res.log and bool(res.value) == wrong_epoch_key, (path, res.code, res.log)


def test_the_clock_tells_the_epoch() -> None:
    w = World()
    _, raw = w.request()
    assert w.query(q.ISSUE_PATH, raw).code == 0
    w.clock.advance(PARAMS.epoch_s)  # the request's epoch is over
    assert w.query(q.ISSUE_PATH, w.request()[1]).code == Code.WRONG_EPOCH


def test_without_an_issuer_every_quota_query_is_off() -> None:
    w = World(quotas=False)
    for path, data in ((q.KEY_PATH, q.encode_key_query(MODEL, w.epoch)), (q.ISSUE_PATH, w.request()[1]),
                       (q.REDEEM_PATH, q.encode_redeem(q.Redeem(MODEL, w.epoch, b"\x01" * 32, b"\x02" * 64)))):
        res = w.query(path, data)
        assert res.code == Code.QUOTA_OFF and "no quota section" in res.log


def test_the_listed_models_follow_the_committed_state() -> None:
    w = World()
    assert w.app._model_listed(MODEL) and not w.app._model_listed("other")
    core = w.app.core
    other = Identity.generate()
    tx = make_tx(other.signing, CHAIN, OP_REGISTER, 1,
                 Entry(ROLE_MODEL, other.x25519.public_bytes, "127.0.0.1:7998", "default", "other", 1))
    results, _ = core.finalize_block(2, 1_700_000_001, [tx], b"\x02" * 32)
    assert results[0].ok
    core.commit()
    assert w.app._model_listed("other")


# --------------------------------------------------------------------------- verifier/run.py

def _home(tmp_path: Path, app_state: dict[str, object] | None, validators: int = 2) -> Path:
    d = tmp_path / "v"
    (d / "cometbft" / "config").mkdir(parents=True)
    genesis: dict[str, object] = {"chain_id": CHAIN, "validators": [{}] * validators}
    if app_state is not None:
        genesis["app_state"] = app_state
    (d / "cometbft" / "config" / "genesis.json").write_text(json.dumps(genesis))
    b64 = base64.b64encode
    (d / "cometbft" / "config" / "priv_validator_key.json").write_text(json.dumps({
        "pub_key": {"type": "tendermint/PubKeyEd25519", "value": b64(VERIFIER.public_bytes).decode()},
        "priv_key": {"type": "tendermint/PrivKeyEd25519",
                     "value": b64(VERIFIER.private_bytes() + VERIFIER.public_bytes).decode()}}))
    return d


def test_the_genesis_section_turns_quotas_on(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    d = _home(tmp_path, {"quota": PARAMS.to_json(), "admission": {}})
    assert genesis_quota(d / "cometbft") == (CHAIN, PARAMS, 2)
    with caplog.at_level(logging.INFO, "gentorrent.verifier"):
        iss = make_issuer(d, d / "cometbft", VERIFIER)
    assert iss is not None and iss.params == PARAMS and iss.chain_id == CHAIN
    assert "quotas on: epochs of 60 s, 3 tokens" in caplog.text
    off = _home(tmp_path / "off", {"admission": {}})
    with caplog.at_level(logging.INFO, "gentorrent.verifier"):
        assert make_issuer(off, off / "cometbft", VERIFIER) is None
    assert "quotas off" in caplog.text
    few = _home(tmp_path / "few", {"quota": QuotaParams(issuers=3).to_json()})
    with caplog.at_level(logging.WARNING, "gentorrent.verifier"):
        make_issuer(few, few / "cometbft", VERIFIER)
    assert "no token can be made" in caplog.text
    bad = _home(tmp_path / "bad", {"quota": {"tokens": 0}})
    with pytest.raises(QuotaFileError, match="tokens"):
        make_issuer(bad, bad / "cometbft", VERIFIER)
    (bad / "cometbft" / "config" / "genesis.json").write_text("{not json")
    with pytest.raises(QuotaFileError, match="genesis"):
        genesis_quota(bad / "cometbft")


def test_the_saved_state_comes_back_and_a_damaged_one_stops_the_verifier(tmp_path: Path) -> None:
    w = World()
    _, raw = w.request(2)
    assert w.query(q.ISSUE_PATH, raw).code == 0
    assert w.issuer is not None
    (tmp_path / QUOTA_FILE).write_bytes(w.issuer.snapshot())
    again = load_issuer(tmp_path, VERIFIER, CHAIN, PARAMS)
    assert again.left(w.user.node_id, MODEL, NOW) == 1
    assert load_issuer(tmp_path / "empty", VERIFIER, CHAIN, PARAMS).left(w.user.node_id, MODEL, NOW) == 3
    (tmp_path / QUOTA_FILE).write_bytes(w.issuer.snapshot()[:-1])
    with pytest.raises(QuotaFileError, match=f"{QUOTA_FILE}.*mv "):
        load_issuer(tmp_path, VERIFIER, CHAIN, PARAMS)
    with pytest.raises(QuotaFileError, match="another chain"):
        (tmp_path / QUOTA_FILE).write_bytes(w.issuer.snapshot())
        load_issuer(tmp_path, VERIFIER, "another-chain", PARAMS)


async def test_the_state_is_written_while_it_changes(tmp_path: Path) -> None:
    w = World()
    assert w.issuer is not None
    every = 0.005
    send, written = trio.open_memory_channel[bytes](64)

    def write(path: Path, data: bytes) -> None:  # in keep_issuer's worker thread
        path.write_bytes(data)
        trio.from_thread.run_sync(send.send_nowait, data)

    with trio.fail_after(60):  # only so that a broken keep_issuer fails instead of hanging
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(keep_issuer, tmp_path, w.issuer, every, write=write))
            await trio.sleep(20 * every)
            assert not (tmp_path / QUOTA_FILE).exists()  # nothing changed: nothing written
            assert w.query(q.ISSUE_PATH, w.request()[1]).code == 0
            assert await written.receive() == w.issuer.snapshot()
            await trio.sleep(20 * every)
            nursery.cancel_scope.cancel()
    assert written.statistics().current_buffer_used == 0  # no change, no write
    restored = load_issuer(tmp_path, VERIFIER, CHAIN, PARAMS)
    assert restored.left(w.user.node_id, MODEL, NOW) == 2


def _script(tmp_path: Path, body: str) -> str:
    p = tmp_path / "fake-cometbft"
    p.write_text("#!/bin/sh\n" + body + "\n")
    p.chmod(0o755)
    return str(p)


async def test_the_verifier_refuses_to_start_on_a_damaged_state(tmp_path: Path) -> None:
    d = _home(tmp_path, {"quota": PARAMS.to_json()})
    (d / QUOTA_FILE).write_bytes(b"\x96\x01")
    started = tmp_path / "started"
    exe = _script(tmp_path, f"touch {started}; exit 3")
    with pytest.raises(QuotaFileError, match=str(d / QUOTA_FILE)):
        await run_verifier(d, binary=exe, handle_signals=False)
    assert not started.exists()  # refused before CometBFT was started


async def test_the_verifier_writes_its_state_when_it_stops(tmp_path: Path) -> None:
    """CometBFT (a script here) exits at once; the issuer's state is written on the way out."""
    d = _home(tmp_path, {"quota": PARAMS.to_json()})
    exe = _script(tmp_path, "exit 3")
    assert not (d / QUOTA_FILE).exists()
    with pytest.raises(CometExited, match="status 3"):
        await run_verifier(d, binary=exe, handle_signals=False)
    assert load_issuer(d, VERIFIER, CHAIN, PARAMS).chain_id == CHAIN  # written, and it loads
