"""Toxiproxy driven by gentorrent/tools/toxiproxy.py, with the real ``toxiproxy-server`` (``make
setup`` installs it; these tests skip without it, as the CometBFT ones do without cometbft).

Each test's echo listener and proxies sit on their own 127.x.y.z addresses, as the testbed's
nodes do. Nothing here asserts on wall-clock time: the delays are checked as the toxics the
server reports, not by timing bytes."""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gentorrent.tools import regions
from gentorrent.tools.toxiproxy import ProxySpec, Toxiproxy, ToxiproxyError, find_toxiproxy, free_port

IO_TIMEOUT = 10.0  # seconds for any socket operation of a test


def _binary() -> str:
    try:
        return find_toxiproxy()
    except ToxiproxyError as exc:
        pytest.skip(str(exc))


def _loopback() -> str:
    """A 127.x.y.z address unlikely to be used by anything else (the whole /8 is loopback)."""
    return f"127.29.{random.randrange(1, 255)}.{random.randrange(1, 255)}"


class Echo:
    """A TCP echo listener on ``host`` (any port), served by a thread until closed."""

    def __init__(self, host: str) -> None:
        self.sock = socket.create_server((host, 0))
        self.sock.settimeout(IO_TIMEOUT)
        host, port = self.sock.getsockname()[:2]
        self.address = f"{host}:{port}"
        self.peers: list[str] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return
            self.peers.append(peer[0])
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(IO_TIMEOUT)
            try:
                while data := conn.recv(65536):
                    conn.sendall(data)
            except OSError:
                pass

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() (close() alone would not)
        self.sock.close()
        self._thread.join(IO_TIMEOUT)


def _round_trip(address: str, payload: bytes) -> bytes:
    """Send ``payload`` through ``address`` to the echo listener and read as much back. (Not by
    half-closing: Toxiproxy turns a half-close into a full close of the other side.)"""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=IO_TIMEOUT) as s:
        s.sendall(payload)
        got = b""
        while len(got) < len(payload) and (chunk := s.recv(65536)):
            got += chunk
    return got


def _refused(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=IO_TIMEOUT).close()
    except ConnectionRefusedError:
        return True
    return False


@pytest.fixture
def echo() -> Iterator[Echo]:
    e = Echo(_loopback())
    yield e
    e.close()


@pytest.fixture
def tp(tmp_path: Path) -> Iterator[Toxiproxy]:
    t = Toxiproxy(_binary()).start(log_path=tmp_path / "toxiproxy.log", seed=1)
    yield t
    t.stop()


def test_find_toxiproxy_names_make_setup_when_missing(tmp_path: Path) -> None:
    with pytest.raises(ToxiproxyError, match="make setup"):
        find_toxiproxy(python=str(tmp_path / "python"), path=str(tmp_path))
    exe = tmp_path / "toxiproxy-server"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    assert find_toxiproxy(python=str(tmp_path / "python"), path="") == str(exe)


@pytest.mark.slow
def test_bytes_cross_a_proxy_with_a_link_on_both_streams(tp: Toxiproxy, echo: Echo) -> None:
    listen = f"{_loopback()}:0"
    [made] = tp.populate([ProxySpec("n1:7000@us-east", listen, echo.address)])
    assert made["name"] == "n1:7000@us-east" and made["upstream"] == echo.address
    address = made["listen"]
    assert address.startswith(listen[:-1]) and not address.endswith(":0")  # the server picked a port

    link = regions.link("us-east", "eu-west")  # 42 ms one way, 2.1 ms jitter, 6605 KB/s
    tp.set_link("n1:7000@us-east", link)
    payload = os.urandom(200_000)
    assert _round_trip(address, payload) == payload
    assert echo.peers == ["127.0.0.1"]  # a proxied connection comes from 127.0.0.1, not the dialler's address

    toxics = {t["name"]: t for t in tp.proxies()["n1:7000@us-east"]["toxics"]}
    assert set(toxics) == {f"{kind}_{stream}" for kind in ("latency", "bandwidth", "loss")
                           for stream in ("upstream", "downstream")}
    for stream in ("upstream", "downstream"):
        lat, bw, loss = toxics[f"latency_{stream}"], toxics[f"bandwidth_{stream}"], toxics[f"loss_{stream}"]
        assert (lat["type"], lat["stream"], lat["toxicity"]) == ("latency", stream, 1.0)
        assert lat["attributes"] == {"latency": 42, "jitter": 2}
        assert (bw["type"], bw["stream"], bw["attributes"]) == ("bandwidth", stream, {"rate": 6605})
        # 0.1% of segments lost, repaired as on a path of twice the one-way delay
        assert (loss["type"], loss["stream"]) == ("loss", stream)
        assert loss["attributes"] == {"probability": regions.LOSS, "rtt": 84, "mss": 0}
    assert tp.toxics("n1:7000@us-east") == tp.proxies()["n1:7000@us-east"]["toxics"]

    # Setting the link again updates it; without a rate the bandwidth toxics go, without loss
    # the loss toxics.
    tp.set_link("n1:7000@us-east", regions.link("us-east", "ap-southeast", rate_kbps=None))
    toxics = {t["name"]: t for t in tp.toxics("n1:7000@us-east")}
    assert set(toxics) == {"latency_upstream", "latency_downstream", "loss_upstream", "loss_downstream"}
    assert toxics["latency_downstream"]["attributes"] == {"latency": 112, "jitter": 6}
    assert toxics["loss_downstream"]["attributes"]["rtt"] == 224
    tp.set_link("n1:7000@us-east", regions.link("us-east", "ap-southeast", rate_kbps=None, loss=0.0))
    assert {t["name"] for t in tp.toxics("n1:7000@us-east")} == {"latency_upstream", "latency_downstream"}
    assert _round_trip(address, b"still there") == b"still there"


@pytest.mark.slow
def test_a_link_that_loses_every_segment_still_delivers_every_byte_in_order(tp: Toxiproxy, echo: Echo) -> None:
    """The loss toxic holds chunks for TCP's repair time; it must never drop or reorder bytes,
    even when every segment of every chunk is drawn lost (the holds here are a few ms to 0.2 s:
    1 ms one way)."""
    [made] = tp.populate([ProxySpec("lossy", f"{_loopback()}:0", echo.address)])
    tp.set_link("lossy", regions.Link(latency_ms=1, jitter_ms=0, rate_kbps=None, loss=1.0))
    assert {t["type"] for t in tp.toxics("lossy")} == {"latency", "loss"}
    payload = os.urandom(100_000)
    assert _round_trip(made["listen"], payload) == payload


STOCK_SERVER = """\
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

toxics = {}  # proxy -> toxics made, as a stock server would keep them


class Stock(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def answer(self, status, body, kind="application/json"):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        parts = self.path.strip("/").split("/")
        if parts == ["version"]:
            return self.answer(200, "git", "text/plain")  # what a `go install` build reports
        if len(parts) == 3 and parts[0] == "proxies" and parts[2] == "toxics":
            return self.answer(200, json.dumps(toxics.get(parts[1], [])))
        self.answer(404, json.dumps({"error": "not found"}))

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        parts = self.path.strip("/").split("/")
        if len(parts) == 3 and parts[0] == "proxies" and parts[2] == "toxics":
            toxics.setdefault(parts[1], []).append(body)
            return self.answer(200, json.dumps(body))
        self.answer(404, json.dumps({"error": "not found"}))

    def log_message(self, *args):
        pass


args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
HTTPServer((args["-host"], int(args["-port"])), Stock).serve_forever()
"""


def test_a_lossy_link_on_a_stock_server_says_how_to_get_the_loss_toxic(tmp_path: Path) -> None:
    """A stock ``go install`` Toxiproxy answers GET /version with "git" and has no loss toxic (a
    stand-in for one, given as the binary, answers as it would): a link with loss is refused
    before any toxic is made; a link without loss still gets its latency and bandwidth toxics."""
    stock = tmp_path / "toxiproxy-server"
    stock.write_text(f"#!{sys.executable}\n{STOCK_SERVER}")
    stock.chmod(0o755)
    with Toxiproxy(str(stock)).start(log_path=tmp_path / "stock.log") as tp:
        with pytest.raises(ToxiproxyError, match=r"version 'git'.*no `loss` toxic.*make setup"):
            tp.set_link("stock", regions.link("eu-west", "us-east"))
        assert tp.toxics("stock") == []
        tp.set_link("stock", regions.link("eu-west", "us-east", loss=0.0))
        assert {t["type"] for t in tp.toxics("stock")} == {"latency", "bandwidth"}
        for bad in (-0.1, 1.5, float("nan")):
            with pytest.raises(ToxiproxyError, match="loss must be a fraction"):
                tp.set_link("stock", regions.link("eu-west", "us-east", loss=bad))


def test_the_loss_toxic_passes_its_go_tests() -> None:
    """tools/toxiproxy's own tests (loss.go: segments, RACK and tail-loss-probe repair times,
    holds, byte-exact order, an interrupt during a hold), run with the Go that built it."""
    go = shutil.which("go")
    if go is None:
        pytest.skip("no `go` on PATH: tools/toxiproxy cannot be built or tested here")
    root = Path(__file__).resolve().parents[2] / "tools" / "toxiproxy"
    done = subprocess.run([go, "test", "-count=1", "."], cwd=root, capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
def test_populate_in_batches_then_delete_and_disable(tp: Toxiproxy, echo: Echo) -> None:
    host = _loopback()
    specs = [ProxySpec(f"n{i}@eu-west", f"{host}:{free_port(host)}", echo.address) for i in range(7)]
    made = tp.populate(specs, batch=3)
    assert [p["name"] for p in made] == [s.name for s in specs]
    assert set(tp.proxies()) == {s.name for s in specs}
    assert all(p["enabled"] and p["toxics"] == [] for p in tp.proxies().values())
    for s in specs[:2]:
        assert _round_trip(s.listen, b"hi") == b"hi"

    tp.delete(specs[0].name)
    assert specs[0].name not in tp.proxies()
    assert _refused(specs[0].listen)

    tp.set_enabled(specs[1].name, False)
    assert tp.proxies()[specs[1].name]["enabled"] is False
    assert _refused(specs[1].listen)
    tp.set_enabled(specs[1].name, True)
    assert _round_trip(specs[1].listen, b"back") == b"back"

    tp.set_link(specs[2].name, regions.link("eu-west", "eu-west"))
    tp.reset()
    assert tp.toxics(specs[2].name) == []


@pytest.mark.slow
def test_errors_carry_the_servers_message(tp: Toxiproxy, echo: Echo) -> None:
    host = _loopback()
    spec = ProxySpec("a@eu-west", f"{host}:0", echo.address)
    tp.create(spec)
    with pytest.raises(ToxiproxyError, match="proxy already exists"):
        tp.create(ProxySpec("a@eu-west", f"{host}:0", echo.address))
    with pytest.raises(ToxiproxyError, match="already exist: a@eu-west"):
        tp.populate([ProxySpec("a@eu-west", f"{host}:0", echo.address)])
    with pytest.raises(ToxiproxyError, match="given twice"):
        tp.populate([ProxySpec("b", f"{host}:0", echo.address), ProxySpec("b", f"{host}:0", echo.address)])
    with pytest.raises(ToxiproxyError, match="400: missing required field: upstream"):
        tp.create(ProxySpec("c", f"{host}:0", ""))
    with pytest.raises(ToxiproxyError, match="'/' cannot be used"):
        tp.populate([ProxySpec("a/b", f"{host}:0", echo.address)])
    with pytest.raises(ToxiproxyError, match="must not be empty"):
        tp.populate([ProxySpec("c", f"{host}:0", "")])
    taken = tp.proxies()["a@eu-west"]["listen"]
    with pytest.raises(ToxiproxyError, match="address already in use"):
        tp.populate([ProxySpec("d", taken, echo.address)])
    with pytest.raises(ToxiproxyError, match="404: proxy not found"):
        tp.delete("nope")
    with pytest.raises(ToxiproxyError, match="proxy not found"):
        tp.set_link("nope", regions.link("eu-west", "us-east"))
    assert set(tp.proxies()) == {"a@eu-west"}


@pytest.mark.slow
def test_stop_leaves_no_process_and_a_failed_start_quotes_the_log(tmp_path: Path) -> None:
    tp = Toxiproxy(_binary())
    with tp:
        pid = tp.pid
        assert pid is not None and tp.version()
    assert tp.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    tp.stop()  # stopping again is harmless
    with pytest.raises(ToxiproxyError, match=r"not started|connection|failed"):
        tp.proxies()

    # The API's port in use: refused before a server starts (its readiness probe would reach the
    # other server).
    with Toxiproxy(_binary()).start(log_path=tmp_path / "first.log") as first:
        second = Toxiproxy(_binary())
        with pytest.raises(ToxiproxyError, match="is in use"):
            second.start(port=first.port)
        assert second.pid is None
        assert first.version()

    # A server that cannot listen exits at once; the error quotes its log.
    third = Toxiproxy(_binary())
    with pytest.raises(ToxiproxyError, match=r"(?s)exited with status 1 .*cannot assign requested address"):
        third.start(host="192.0.2.1", port=free_port(), log_path=tmp_path / "third.log")  # TEST-NET-1: not ours
    assert third.pid is None


@pytest.mark.slow
def test_a_server_that_never_answers_is_stopped_after_the_ready_timeout(tmp_path: Path) -> None:
    fake = tmp_path / "toxiproxy-server"
    fake.write_text("#!/bin/sh\necho 'pretending to start'\nexec sleep 60\n")
    fake.chmod(0o755)
    tp = Toxiproxy(str(fake))
    with pytest.raises(ToxiproxyError, match=r"(?s)did not answer .* within 0\.5 s.*pretending to start"):
        tp.start(ready_timeout=0.5)
    assert tp.pid is None
