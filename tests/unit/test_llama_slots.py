"""``gentorrent model-node --slots N``: how many requests the model node generates at once."""

from __future__ import annotations

import pytest

from gentorrent.cli import build_parser
from model_node.run import SLOTS, plan_engine


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


def test_extra_buffers_are_off_where_the_cpu_advertises_amx() -> None:
    """llama.cpp's AMX repacking faults on hosts that advertise AMX but do not let a guest use it
    (a CI host: every decode was a general protection fault); the plain kernels run there."""
    from model_node.llama import EXTRA_BUFFERS_ENV, extra_buffers

    amd = "flags\t\t: fpu vme avx2 avx512f sha_ni\n"
    intel = "flags\t\t: fpu vme avx2 avx512f amx_bf16 amx_tile amx_int8\n"
    assert extra_buffers(amd, {}) is True
    assert extra_buffers(intel, {}) is False
    assert extra_buffers(intel, {EXTRA_BUFFERS_ENV: "1"}) is True
    assert extra_buffers(amd, {EXTRA_BUFFERS_ENV: "0"}) is False
    assert extra_buffers(intel, {EXTRA_BUFFERS_ENV: "maybe"}) is False
