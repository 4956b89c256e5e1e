"""The committed ABCI types are exactly what `python -m verifier.abci.gen` makes from CometBFT's protos."""

from __future__ import annotations

from pathlib import Path

import pytest

from verifier.abci import gen


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
            and "__pycache__" not in p.parts}


def test_generated_code_matches_a_fresh_generation(tmp_path: Path) -> None:
    try:
        gen.source_dirs()
    except gen.GenError as exc:
        pytest.skip(f"cannot regenerate: {exc}")
    pytest.importorskip("grpc_tools", reason="grpcio-tools (test extra) is not installed; run `make setup`")
    gen.generate(tmp_path / "proto")
    fresh, committed = _tree(tmp_path / "proto"), _tree(gen.OUT_DEFAULT)
    assert sorted(fresh) == sorted(committed), "the set of generated files changed: run `python -m verifier.abci.gen`"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"generated files differ from a fresh generation: {stale}; run `python -m verifier.abci.gen`"


def test_generated_types_round_trip() -> None:
    from verifier.abci.proto.tendermint.abci import types_pb2 as t

    req = t.Request(finalize_block=t.RequestFinalizeBlock(txs=[b"a", b"bc"], height=7))
    back = t.Request.FromString(req.SerializeToString())
    assert back.WhichOneof("value") == "finalize_block"
    assert list(back.finalize_block.txs) == [b"a", b"bc"] and back.finalize_block.height == 7
