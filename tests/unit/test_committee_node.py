"""Supervision (verifier/run.py) with stand-in cometbft executables: exit reporting and clean stops."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest
import trio

from overlay.testing import wait_until
from overlay.wire import crypto
from verifier.abci import wire
from verifier.abci.proto.tendermint.abci import types_pb2 as abci
from verifier.run import CometExited, run_verifier


def _home(tmp_path: Path) -> Path:
    d = tmp_path / "v"
    (d / "cometbft" / "config").mkdir(parents=True)
    (d / "cometbft" / "config" / "genesis.json").write_text("{}")
    key = crypto.SigningKey.generate()
    b64 = base64.b64encode
    (d / "cometbft" / "config" / "priv_validator_key.json").write_text(json.dumps({
        "pub_key": {"type": "tendermint/PubKeyEd25519", "value": b64(key.public_bytes).decode()},
        "priv_key": {"type": "tendermint/PrivKeyEd25519",
                     "value": b64(key.private_bytes() + key.public_bytes).decode()}}))
    return d


def _script(tmp_path: Path, body: str) -> str:
    p = tmp_path / "fake-cometbft"
    p.write_text("#!/bin/sh\n" + body + "\n")
    p.chmod(0o755)
    return str(p)


async def test_cometbft_dying_raises_with_its_status_and_log_tail(tmp_path: Path) -> None:
    d = _home(tmp_path)
    exe = _script(tmp_path, 'echo "starting with $*"; echo "CONSENSUS FAILURE!!!" >&2; exit 3')
    with pytest.raises(CometExited) as info:
        await run_verifier(d, binary=exe, handle_signals=False)
    msg = str(info.value)
    assert "status 3" in msg and "CONSENSUS FAILURE!!!" in msg
    assert f"--proxy_app unix://{d.resolve() / 'abci.sock'}" in msg  # started on our socket
    assert not (d / "abci.sock").exists()


async def test_cancel_stops_cometbft_and_the_server(tmp_path: Path) -> None:
    d = _home(tmp_path)
    pidfile = tmp_path / "pid"
    exe = _script(tmp_path, f'echo $$ > {pidfile}; exec sleep 600')
    async with trio.open_nursery() as nursery:
        where = await nursery.start(lambda task_status: run_verifier(
            d, binary=exe, handle_signals=False, task_status=task_status))
        stream = await trio.open_unix_socket(where.path)  # the ABCI server answers while CometBFT runs
        async with stream:
            await stream.send_all(wire.encode_request(abci.Request(echo=abci.RequestEcho(message="x"))))
            data = await stream.receive_some(100)
            n, start = wire.decode_uvarint(data) or (0, 0)
            assert abci.Response.FromString(data[start : start + n]).echo.message == "x"
        with trio.fail_after(30):  # the shell standing in for CometBFT writes it
            await wait_until(lambda: pidfile.exists() and pidfile.read_text().strip())
        pid = int(await trio.Path(pidfile).read_text())
        nursery.cancel_scope.cancel()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not await trio.Path(where.path).exists()
