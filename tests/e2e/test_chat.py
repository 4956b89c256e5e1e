"""`gentorrent user chat` non-interactive, as a script would run it, against relay and model-node
processes: the reply on stdout, and an exit status that says what failed."""

from __future__ import annotations

import subprocess

import pytest

from gentorrent.tools.localnet import LocalNet, cli
from user_client import chat

pytestmark = pytest.mark.slow

SMALL = ("--cloves", "3", "--threshold", "2", "--proxies", "3")


def run_chat(net: LocalNet, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    config = net.config_toml("you", net.root / "you.toml")
    return subprocess.run(cli("user", "chat", "--config", str(config), *SMALL, "--temperature", "0", *args),
                          input=stdin if stdin is not None else "", capture_output=True, text=True, timeout=120)


def test_replies_on_stdout_and_failure_statuses(tmp_path):
    with LocalNet(tmp_path, 9, users=("you",)) as net:
        net.start()
        r = run_chat(net, "--prompt", "first turn", "--prompt", "second turn")
        assert r.returncode == chat.EXIT_OK, r.stderr
        assert r.stdout == "first turn\nsecond turn\n"
        r = run_chat(net, stdin="a prompt from a pipe\n")
        assert (r.returncode, r.stdout) == (chat.EXIT_OK, "a prompt from a pipe\n"), r.stderr
        r = run_chat(net, "--verbose", "--prompt", "shown")
        assert r.returncode == 0 and "signature verified" in r.stderr and "first token" in r.stderr
        # the model node refuses max_tokens over its limit: it answers with an error
        r = run_chat(net, "--prompt", "x", "--max-tokens", "5000", "--context-tokens", "10000")
        assert r.returncode == chat.EXIT_MODEL_ERROR and r.stdout == "" and "max_tokens" in r.stderr
        r = run_chat(net, "--model", "not-served", "--prompt", "x")
        assert r.returncode == chat.EXIT_USAGE and "not-served" in r.stderr
        r = run_chat(net)
        assert r.returncode == chat.EXIT_USAGE and "empty" in r.stderr
        net.kill("model-0")
        r = run_chat(net, "--prompt", "anyone?", "--timeout", "2")
        assert r.returncode == chat.EXIT_NO_MODEL_NODE and r.stdout == "", r.stderr


def test_too_few_relays_is_exit_status_3(tmp_path):
    with LocalNet(tmp_path, 4, users=("you",)) as net:
        net.start(names=[*net.models, *net.relays[:2]])
        r = run_chat(net, "--prompt", "x", "--paths-timeout", "2")
        assert r.returncode == chat.EXIT_PATHS and "relays" in r.stderr
