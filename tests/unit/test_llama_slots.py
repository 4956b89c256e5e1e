"""``gentorrent model-node --slots N``: how many requests the model node generates at once."""

from __future__ import annotations

import pytest

from model_node.run import SLOTS, plan_engine
from overlay.cli import build_parser


def test_slots_flag_defaults_to_the_engine_default() -> None:
    assert build_parser().parse_args(["model-node"]).slots is None
    assert build_parser().parse_args(["model-node", "--slots", "4"]).slots == 4
    assert SLOTS["llama.cpp"] > 1  # llama.cpp decodes several sequences in one batch (decision 0011)


@pytest.mark.parametrize("value", ["0", "-2", "many"])
def test_bad_slots_are_refused(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["model-node", "--slots", value])
    assert "--slots" in capsys.readouterr().err


def test_echo_plans_without_slots() -> None:
    model, factory = plan_engine("echo", None, slots=3)
    assert model == "echo" and factory().model == "echo"
