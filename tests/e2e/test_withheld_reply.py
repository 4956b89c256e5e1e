"""A donor's withheld reveals, handed in by the model node (decisions 0037 and 0040), on real
processes: 4 ``gentorrent verifier --audit`` (real CometBFT, 160-block epochs, the reply window
:func:`~gentorrent.tools.localnet.fitting_reply_window` gives them), relays, and one llama.cpp model
node serving ``smollm2-135m-instruct`` with its served store and reveals on (``--committee``).

A user chats with ``--donate-transcripts`` (rate 1) through RPC proxies that pass its commits and
certificates to the verifiers and drop every reveal, as a framer who withholds, or a client that
crashed, would. No verifier ever gets a donor's reveal. Each verifier releases its shares of the
withheld commitments the chain's release delay into the next epoch; the node rebuilds the secrets,
finds the requests it served and hands the transcripts in, before the verifiers close the epoch;
the verifiers count them and put transcript scores on the chain. Without the node's hand-ins the
donor's sets would be void and no transcript score would appear: nothing else donates here.
Every wait is bounded; nothing asserts on time.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import msgpack
import pytest

from gentorrent.tools.localnet import LocalNet, cli
from overlay.directory import transcripts as wire
from tests.e2e.test_audits import wait_transcript_scores

# serial: four verifiers and a llama.cpp node judge replies by when they were signed (the reply window)
pytestmark = [pytest.mark.slow, pytest.mark.serial]

MODEL = "smollm2-135m-instruct"
EPOCH_BLOCKS = 160  # 140 blocks before the report window: at least 70 s at half-second blocks
TURNS = ("Name three rivers in Europe.", "Which is the longest?", "Where does it rise?", "Which seas does it reach?")


class WithholdingProxy:
    """An HTTP proxy in front of one verifier's CometBFT RPC that forwards every call but a donor's
    reveal (``abci_query`` of :data:`~overlay.directory.transcripts.REVEAL_PATH`), whose connection
    it closes unanswered. ``dropped`` and ``passed`` count the reveals and the other calls."""

    def __init__(self, target: str) -> None:
        self.target, self.dropped, self.passed = target, 0, 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                if query.get("path", [""])[0].strip('"') == wire.REVEAL_PATH:
                    proxy.dropped += 1
                    self.close_connection = True
                    return
                proxy.passed += 1
                try:
                    with urllib.request.urlopen(f"http://{proxy.target}{self.path}", timeout=30) as r:
                        status, body = r.status, r.read()
                except OSError:
                    self.close_connection = True
                    return
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalNet]:
    root = tmp_path_factory.mktemp("withheld-net")
    with LocalNet(root, 8, users=("donor",), models=1, model=MODEL, engine="llama.cpp", committee=4, audits=True,
                  epoch_blocks=EPOCH_BLOCKS, challenges_per_node=1,
                  model_args=("--no-forwarding", "--threads", "2", "--slots", "2", "--max-queue-wait", "60",
                              "--log-level", "info")) as n:
        n.start_committee(timeout=180)
        n.start(timeout=300)
        yield n


def audit_view(net: LocalNet) -> dict[str, Any]:
    answer = net.query("verifier-0", "/audit", timeout=10)
    assert answer.code == 0, answer.log
    doc: dict[str, Any] = msgpack.unpackb(answer.value)
    return doc


def handed_in(log: Path) -> int:
    """Transcripts the model node's log says it handed in, over the epochs it finished."""
    text = log.read_text(errors="replace")
    return sum(int(n) for n in re.findall(r"reveals: epoch \d+ done \((\d+) transcript\(s\) handed in\)", text))


def test_the_node_hands_in_what_a_donor_withheld_and_the_chain_counts_it(net: LocalNet) -> None:
    assert net.reply_window < wire.DEFAULT_REPLY_WINDOW_S  # the fitted window, not the public default
    view = audit_view(net)
    assert view["reply_window_s"] == net.reply_window
    deadline = time.monotonic() + 3 * EPOCH_BLOCKS * 3.0
    while MODEL not in view["audited_models"]:  # once the verifiers' first plans declare it
        assert time.monotonic() < deadline, f"{MODEL} never audited: {view['outcomes']}; logs in {net.root}"
        time.sleep(1.0)
        view = audit_view(net)
    time.sleep(3.0)  # the signed model list, a block or two behind the state
    proxies = [WithholdingProxy(a) for a in net.committee_addresses.split(",")]
    try:
        config = net.config_toml("donor", net.root / "donor.toml")
        text = config.read_text()
        config.write_text(text.replace(f'committee = "{net.committee_for("donor")}"',
                                       f'committee = "{",".join(p.address for p in proxies)}"'))
        assert ",".join(p.address for p in proxies) in config.read_text()
        start = audit_view(net)["epoch"]
        r = subprocess.run(cli("user", "chat", "--config", str(config), "--donate-transcripts",
                               "--donate-transcripts-rate", "1", "--max-tokens", "48", "--log-level", "info",
                               *(x for p in TURNS for x in ("--prompt", p))),
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        assert "without donating" not in r.stderr and "committing without it" not in r.stderr, r.stderr[-3000:]
        assert "donate: revealing to" in r.stderr, r.stderr[-3000:]  # escrowed, certified, sent, then withheld
        assert all(p.dropped >= len(TURNS) for p in proxies), [(p.dropped, p.passed) for p in proxies]
        assert "donate: revealed" not in r.stderr, r.stderr[-3000:]  # nothing of the donor's reached a verifier
    finally:
        for p in proxies:
            p.close()
    log = net.root / "model-0.log"
    deadline = time.monotonic() + 5 * EPOCH_BLOCKS * 3.0
    while handed_in(log) < len(TURNS):
        assert time.monotonic() < deadline, (f"the node handed in {handed_in(log)} of {len(TURNS)}; "
                                             f"logs in {net.root}")
        time.sleep(2.0)
    wait_transcript_scores(lambda: audit_view(net), start, deadline, f"logs in {net.root}")
