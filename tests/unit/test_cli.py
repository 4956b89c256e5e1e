"""The ``gentorrent`` command tree: every --help works; unbuilt commands say so."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from gentorrent import cli
from gentorrent.cli import build_parser, main
from model_node.forwarding import DEFAULT_LOAD_THRESHOLD
from model_node.hrtree import DEFAULT_BITS
from model_node.server import MAX_QUEUE_WAIT


def command_paths(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command path of the tree: (), ("user",), ("user", "chat"), ..."""
    out = [prefix]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += command_paths(sub, (*prefix, name))
    return out


PATHS = command_paths(build_parser())


def leaf_parser(path: tuple[str, ...]) -> argparse.ArgumentParser:
    parser = build_parser()
    for name in path:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return parser


def test_the_documented_commands_exist() -> None:
    for path in [("user", "chat"), ("user", "serve"), ("user", "relay"), ("model-node",),
                 ("verifier",), ("devnet",), ("status",), ("bench",)]:
        assert path in PATHS, path


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "gentorrent")
def test_help(path: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ei:
        main([*path, "--help"])
    assert ei.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: gentorrent")
    assert len(out.splitlines()) > 3


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ei:
        main(["--version"])
    assert ei.value.code == 0
    assert capsys.readouterr().out.startswith("gentorrent ")


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ei:
        main([])
    assert ei.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_not_landed_helper_says_so_in_one_sentence(capsys: pytest.CaptureFixture[str]) -> None:
    run = cli.not_landed("'gentorrent x'", "issue 9")
    assert run(argparse.Namespace()) == 3
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "gentorrent: 'gentorrent x' is not available yet: it arrives with issue 9.\n"


def test_user_errors_are_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["status", "--data-dir", str(tmp_path)])  # no --peers
    err = capsys.readouterr().err
    assert status == 2
    assert err.startswith("gentorrent: error: ") and "--peers" in err
    assert len(err.strip().splitlines()) == 1


def test_bad_config_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "c.toml").write_text("nonsense = 1\n")
    status = main(["status", "--config", str(tmp_path / "c.toml")])
    err = capsys.readouterr().err
    assert status == 2 and "unknown setting 'nonsense'" in err


def test_bad_peer_list_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "p.json").write_text("[]")
    status = main(["status", "--data-dir", str(tmp_path), "--peers", str(tmp_path / "p.json")])
    assert status == 2 and "'peers' array" in capsys.readouterr().err


def test_bench_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--list"]) == 0
    assert "wire" in capsys.readouterr().out.split()


def test_unknown_bench(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "no-such-bench"]) == 2
    assert "no benchmark named 'no-such-bench'" in capsys.readouterr().err


def test_run_async_unwraps_a_single_error() -> None:
    import trio

    async def boom() -> None:
        async with trio.open_nursery() as n:
            n.start_soon(trio.sleep, 0)
            raise cli.CliError("one error")

    with pytest.raises(cli.CliError, match="one error"):
        cli.run_async(boom)


def test_run_async_long_lived_freezes_what_start_up_left() -> None:
    import gc

    async def frozen() -> int:
        return gc.get_freeze_count()

    assert cli.run_async(frozen) == gc.get_freeze_count()  # by default the collector is left alone
    try:
        assert cli.run_async(frozen, long_lived=True) > 0
    finally:
        gc.unfreeze()


def test_model_node_forwarding_flags() -> None:
    args = build_parser().parse_args(["model-node", "--no-forwarding", "--sync-interval", "0.5", "--threads", "1",
                                      "--prefix-snapshots", "3", "--load-threshold", "4.5", "--hash-bits", "16"])
    assert args.no_forwarding and args.sync_interval == 0.5 and args.threads == 1 and args.prefix_snapshots == 3
    assert args.load_threshold == 4.5 and args.hash_bits == 16
    assert not args.accept_direct_requests
    assert not hasattr(args, "forwarding_policy") and not hasattr(args, "echo_delay")  # bench-injected now
    default = build_parser().parse_args(["model-node"])
    assert not default.no_forwarding and default.sync_interval == 5.0
    assert default.load_threshold == DEFAULT_LOAD_THRESHOLD and default.hash_bits == DEFAULT_BITS
    assert default.threads is None and default.prefix_snapshots is None
    assert default.max_queue_wait == MAX_QUEUE_WAIT
    assert build_parser().parse_args(["model-node", "--max-queue-wait", "2.5"]).max_queue_wait == 2.5


@pytest.mark.parametrize("flags", [["--sync-interval", "0"], ["--sync-interval", "soon"], ["--threads", "0"],
                                   ["--prefix-snapshots", "-1"], ["--forwarding-policy", "load"], ["--echo-delay", "0.1"],
                                   ["--load-threshold", "0"], ["--hash-bits", "0"], ["--hash-bits", "17"], ["--load-threshold", "-2"], ["--load-threshold", "many"],
                                   ["--max-queue-wait", "0"], ["--max-queue-wait", "forever"]],
                         ids=lambda f: " ".join(f))
def test_model_node_forwarding_flag_errors(flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ei:
        build_parser().parse_args(["model-node", *flags])
    assert ei.value.code == 2 and flags[0] in capsys.readouterr().err


def test_a_listen_address_in_use_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A second node on the same config (two `user chat` of one devnet's chat.toml) said only
    "OSError: [Errno 98] Address already in use" under a traceback."""
    import socket

    from overlay.net.peers import save as save_peers

    save_peers(str(tmp_path / "peers.json"), [])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        status = main(["user", "relay", "--data-dir", str(tmp_path), "--listen", f"127.0.0.1:{port}",
                       "--peers", str(tmp_path / "peers.json"), "--log-level", "warning"])
    err = capsys.readouterr().err
    assert status == 2, err
    assert err.startswith(f"gentorrent: error: cannot listen on 127.0.0.1:{port}: ") and "another process" in err
    assert len(err.strip().splitlines()) == 1
