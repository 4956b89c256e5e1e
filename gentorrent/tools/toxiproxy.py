"""Toxiproxy (Shopify, v2.5.0) driven from plain synchronous Python: the wide-area testbed's
source of delay and loss (docs/testbed.md "Toxiproxy").

:class:`Toxiproxy` starts ``toxiproxy-server`` (``make setup`` builds it from tools/toxiproxy,
Toxiproxy's server with our ``loss`` toxic added, next to the venv's python;
:func:`find_toxiproxy`) in its own session, waits for its HTTP API, and speaks to it over one
keep-alive ``http.client`` connection with a timeout on every call. A proxy (:class:`ProxySpec`)
listens on ``listen`` and forwards each connection to ``upstream``; :meth:`Toxiproxy.set_link`
gives it a :class:`~gentorrent.tools.regions.Link`: the one-way delay with jitter (``latency``
toxic), a bandwidth cap (``bandwidth`` toxic) and TCP's repair time for lost segments (``loss``
toxic, tools/toxiproxy/loss.go) on *both* streams.
Every error the server reports, and every failure to reach it, raises :class:`ToxiproxyError`
with the server's message.

The API used (Toxiproxy README, "HTTP API"): ``GET /version``, ``GET /proxies``,
``POST /proxies``, ``POST /populate`` (create or replace a list of proxies),
``POST /proxies/{proxy}`` (update, e.g. ``enabled``), ``DELETE /proxies/{proxy}``,
``POST /proxies/{proxy}/toxics`` (create), ``POST /proxies/{proxy}/toxics/{toxic}`` (update),
``DELETE /proxies/{proxy}/toxics/{toxic}``, ``POST /reset``. Toxic attributes: ``latency`` and
``jitter`` in ms (integers; the delay is latency +/- jitter, uniform, per chunk), ``rate`` in KB/s
(integer, 1 KB = 1,000 bytes, per connection); ``loss``: ``probability`` per TCP segment,
``rtt`` the path's round trip in ms, ``mss`` in bytes (0: 1,448).
"""

from __future__ import annotations

import errno
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote

from gentorrent.tools.regions import Link
from overlay.wire.clock import SystemClock

BINARY = "toxiproxy-server"
VERSION = "v2.5.0"
LOSS_SUFFIX = "+gentorrent-loss"  # GET /version of our build (tools/toxiproxy/main.go) ends so
INSTALL_HINT = (f"run `make setup` (it builds tools/toxiproxy, Toxiproxy {VERSION}'s server with our `loss` toxic, "
                f"as .venv/bin/{BINARY})")

DEFAULT_TIMEOUT = 10.0  # seconds, every API call
READY_TIMEOUT = 15.0  # seconds for a started server to answer GET /version
POPULATE_BATCH = 200  # proxies per POST /populate
# Toxiproxy's API server (Go net/http, ReadTimeout 10 s) closes a keep-alive connection idle for
# 10 s; we open a fresh one after this many idle seconds rather than find it closed mid-request.
_IDLE_RECONNECT = 5.0
_LOG_TAIL = 2000  # characters of the server's log quoted when it fails to start


_CLOCK = SystemClock()  # overlay.wire.clock: the one place clocks are read


class ToxiproxyError(Exception):
    """Toxiproxy is missing, would not start, or refused or failed a request."""


@dataclass(frozen=True)
class ProxySpec:
    """A proxy: ``name`` (unique), ``listen`` (``host:port``; port 0: the server picks one) and
    ``upstream`` (``host:port`` it forwards each connection to)."""

    name: str
    listen: str
    upstream: str


def find_toxiproxy(*, python: str | None = None, path: str | None = None) -> str:
    """The ``toxiproxy-server`` binary: next to ``python`` (default: this interpreter; ``make
    setup`` puts it in .venv/bin), else on ``PATH`` (``path`` overrides it); else ToxiproxyError."""
    python = python or sys.executable
    beside = Path(python).parent / BINARY
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(BINARY, path=path)
    if found:
        return found
    raise ToxiproxyError(f"the {BINARY} binary was not found next to {python} or on PATH; {INSTALL_HINT}")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now (the OS's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def _check_spec(spec: ProxySpec, *, server_checks: bool = True) -> None:
    """ToxiproxyError for a name the API could not address afterwards ('/' in it) and, with
    ``server_checks``, for the empty fields the server would refuse itself."""
    if "/" in spec.name:
        raise ToxiproxyError(f"proxy name {spec.name!r}: '/' cannot be used in a name")
    if server_checks and (not spec.name or not spec.upstream):
        raise ToxiproxyError(f"proxy {spec!r}: name and upstream must not be empty")


def _check_port_free(host: str, port: int) -> None:
    """ToxiproxyError if something listens on ``host:port`` (Go's listener sets SO_REUSEADDR, so
    only a listener stops it); other bind errors are left for the server to report."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise ToxiproxyError(f"cannot start Toxiproxy's API on {host}:{port}: the address is in use") from e


def _tail(path: Path | None) -> str:
    if path is None:
        return ""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return text[-_LOG_TAIL:].strip()


def _toxic_names(kind: str) -> tuple[str, str]:
    return f"{kind}_upstream", f"{kind}_downstream"


class Toxiproxy:
    """A ``toxiproxy-server`` process and a client of its API.

    ``Toxiproxy().start()`` (or ``with Toxiproxy() as tp:``) runs the server on
    ``host:port``; :meth:`stop` ends it. ``timeout`` bounds every API call."""

    def __init__(self, binary: str | None = None, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.binary = binary
        self.timeout = timeout
        self.host = ""
        self.port = 0
        self.log_path: Path | None = None
        self._own_log = False
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: http.client.HTTPConnection | None = None
        self._last_use = 0.0
        self._has_loss: bool | None = None  # whether the server has the loss toxic; asked once

    # -- process ---------------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs (started by us), else None."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    @property
    def api(self) -> str:
        """The API's ``host:port``."""
        return f"{self.host}:{self.port}"

    def start(self, host: str = "127.0.0.1", port: int = 0, log_path: str | os.PathLike[str] | None = None, *,
              ready_timeout: float = READY_TIMEOUT, seed: int | None = None, log_level: str = "warn") -> Toxiproxy:
        """Start the server with its API on ``host:port`` (``port`` 0: a free one), its output in
        ``log_path`` (default: a temporary file, removed by :meth:`stop`), and wait until it
        answers ``GET /version`` (at most ``ready_timeout`` seconds). ``seed`` seeds its jitter;
        ``log_level`` is its ``LOG_LEVEL`` (``warn`` keeps per-connection lines out)."""
        if self._proc is not None:
            raise ToxiproxyError(f"this Toxiproxy already runs (pid {self._proc.pid}, API {self.api})")
        binary = self.binary or find_toxiproxy()
        if port:
            _check_port_free(host, port)  # else another server there would answer our readiness probe
        self.host, self.port = host, port or free_port(host)
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix="toxiproxy-", suffix=".log")
            os.close(fd)
            self.log_path, self._own_log = Path(name), True
        else:
            self.log_path, self._own_log = Path(log_path), False
        args = [binary, "-host", host, "-port", str(self.port)]
        if seed is not None:
            args += ["-seed", str(seed)]
        env = {**os.environ, "LOG_LEVEL": log_level}
        with open(self.log_path, "ab") as log:
            try:
                self._proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                              env=env, start_new_session=True)
            except OSError as e:
                self.stop()
                raise ToxiproxyError(f"cannot run {binary}: {e}; {INSTALL_HINT}") from e
        api, deadline = self.api, _CLOCK.monotonic() + ready_timeout
        while True:
            code = self._proc.poll()
            if code is not None:
                tail = _tail(self.log_path)
                self.stop()
                raise ToxiproxyError(f"{binary} exited with status {code} before its API answered on {api}"
                                     + (f"; its log ends:\n{tail}" if tail else ""))
            try:
                self.version(timeout=0.5)
                return self
            except ToxiproxyError:
                pass
            if _CLOCK.monotonic() > deadline:
                tail = _tail(self.log_path)
                self.stop()
                raise ToxiproxyError(f"{binary}'s API did not answer on {api} within {ready_timeout:g} s"
                                     + (f"; its log ends:\n{tail}" if tail else ""))
            time.sleep(0.05)

    def stop(self, timeout: float = 5.0) -> None:
        """End the server (SIGTERM, then SIGKILL after ``timeout`` seconds) and wait for it; every
        proxy goes with it. Does nothing if it does not run."""
        self._close()
        self.port = 0
        self._has_loss = None
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)
        if self._own_log and self.log_path is not None:
            self.log_path.unlink(missing_ok=True)
            self.log_path, self._own_log = None, False

    def __enter__(self) -> Toxiproxy:
        if self._proc is None:
            self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- HTTP ------------------------------------------------------------------------------------

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _request(self, method: str, path: str, body: Any = None, *, timeout: float | None = None,
                 ok: tuple[int, ...] = (200, 201, 204)) -> Any:
        """One API call; the decoded JSON answer (None when empty). Raises ToxiproxyError."""
        if not self.port:
            raise ToxiproxyError("Toxiproxy is not started")
        timeout = self.timeout if timeout is None else timeout
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        now = _CLOCK.monotonic()
        if self._conn is not None and now - self._last_use > _IDLE_RECONNECT:
            self._close()
        # A GET is retried once on a fresh connection if the kept-alive one turns out closed; a
        # change is not (the server may have applied it).
        for attempt in (1, 2):
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
            conn = self._conn
            try:
                if conn.sock is not None:
                    conn.sock.settimeout(timeout)
                else:
                    conn.timeout = timeout
                conn.request(method, path, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
                status = resp.status
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as e:
                self._close()
                if method == "GET" and attempt == 1:
                    continue
                raise ToxiproxyError(f"{method} {path} to Toxiproxy on {self.api}: connection lost: {e}") from e
            except (OSError, http.client.HTTPException) as e:
                self._close()
                raise ToxiproxyError(f"{method} {path} to Toxiproxy on {self.api} failed: {e!r}") from e
            break
        self._last_use = _CLOCK.monotonic()
        text = raw.decode(errors="replace").strip()
        try:
            answer = json.loads(text) if text else None
        except ValueError:
            answer = text
        if status not in ok:
            message = answer.get("error") if isinstance(answer, dict) else answer
            raise ToxiproxyError(f"{method} {path}: Toxiproxy answered {status}: {message or '(no message)'}")
        return answer

    # -- API -------------------------------------------------------------------------------------

    def version(self, *, timeout: float | None = None) -> str:
        """The server's version string (``v2.5.0+gentorrent-loss`` for ours, ``git`` for a stock
        ``go install`` build)."""
        # GET /version answers text/plain, which _request hands back as it is.
        return str(self._request("GET", "/version", timeout=timeout))

    def proxies(self) -> dict[str, dict[str, Any]]:
        """Every proxy by name: ``name``, ``listen``, ``upstream``, ``enabled``, ``toxics``."""
        answer = self._request("GET", "/proxies")
        return dict(answer) if isinstance(answer, dict) else {}

    def create(self, spec: ProxySpec, *, enabled: bool = True) -> dict[str, Any]:
        """Create one proxy; ToxiproxyError if its name is taken or it cannot listen."""
        _check_spec(spec, server_checks=False)
        answer = self._request("POST", "/proxies", {"name": spec.name, "listen": spec.listen,
                                                    "upstream": spec.upstream, "enabled": enabled})
        return dict(answer)

    def populate(self, specs: Iterable[ProxySpec], *, replace: bool = False,
                 batch: int = POPULATE_BATCH) -> list[dict[str, Any]]:
        """Create the proxies ``specs`` (``POST /populate``, ``batch`` at a time) and return them
        as the server made them (``listen`` with its real port). Names must be unique; unless
        ``replace``, a name the server already has is an error too (Toxiproxy itself would
        silently restart that proxy, dropping its connections, if its addresses differ). If a
        proxy cannot be made (its listen address taken, say), ToxiproxyError: the ones before it
        exist."""
        specs = list(specs)
        seen: set[str] = set()
        for s in specs:
            _check_spec(s)
            if s.name in seen:
                raise ToxiproxyError(f"proxy name {s.name!r} is given twice")
            seen.add(s.name)
        if not replace and specs:
            taken = sorted(seen & set(self.proxies()))
            if taken:
                raise ToxiproxyError(f"proxies already exist: {', '.join(taken[:5])}"
                                     + (f" and {len(taken) - 5} more" if len(taken) > 5 else ""))
        made: list[dict[str, Any]] = []
        for i in range(0, len(specs), batch):
            chunk = [{"name": s.name, "listen": s.listen, "upstream": s.upstream, "enabled": True}
                     for s in specs[i:i + batch]]
            try:
                answer = self._request("POST", "/populate", chunk, timeout=max(self.timeout, 30.0))
            except ToxiproxyError as e:
                raise ToxiproxyError(f"{e} (after {len(made)} of {len(specs)} proxies were made)") from e
            made += list(answer.get("proxies") or []) if isinstance(answer, dict) else []
        return made

    def delete(self, name: str) -> None:
        """Delete the proxy ``name`` (it stops listening; its connections close)."""
        self._request("DELETE", f"/proxies/{quote(name, safe='')}")

    def set_enabled(self, name: str, enabled: bool) -> None:
        """Enable or disable the proxy ``name`` (disabled: it stops listening and drops its
        connections; enabled again: it listens on the same address)."""
        self._request("POST", f"/proxies/{quote(name, safe='')}", {"enabled": enabled})

    def reset(self) -> None:
        """Enable every proxy and remove every toxic (``POST /reset``)."""
        self._request("POST", "/reset")

    def toxics(self, name: str) -> list[dict[str, Any]]:
        """The toxics of the proxy ``name``."""
        answer = self._request("GET", f"/proxies/{quote(name, safe='')}/toxics")
        return list(answer) if isinstance(answer, list) else []

    def _put_toxic(self, proxy: str, toxic: dict[str, Any]) -> bool:
        """Create ``toxic`` on ``proxy``, or update it if one of its name exists; True if created."""
        base = f"/proxies/{quote(proxy, safe='')}/toxics"
        try:
            self._request("POST", base, toxic)
            return True
        except ToxiproxyError as e:
            if "toxic already exists" not in str(e):
                raise
        self._request("POST", f"{base}/{quote(toxic['name'], safe='')}",
                      {"attributes": toxic["attributes"], "toxicity": toxic["toxicity"]})
        return False

    def has_loss(self) -> bool:
        """Whether the server has the ``loss`` toxic (our build's ``GET /version`` says so)."""
        if self._has_loss is None:
            self._has_loss = self.version().endswith(LOSS_SUFFIX)
        return self._has_loss

    def set_link(self, name: str, link: Link) -> None:
        """Give the proxy ``name`` the link ``link`` on both streams: a ``latency`` toxic
        (``latency_ms`` and ``jitter_ms`` rounded to whole ms), when ``rate_kbps`` is set and not
        0 a ``bandwidth`` toxic, and when ``loss`` is above 0 a ``loss`` toxic (each TCP segment
        lost with probability ``loss`` and repaired as on a path of round trip 2 x
        ``latency_ms``). Setting a link again updates it and removes the toxics the new link has
        no use for. A link with loss on a server without the loss toxic (a stock one) is a
        ToxiproxyError that says how to build ours."""
        latency, jitter = round(link.latency_ms), round(link.jitter_ms)
        if latency < 0 or jitter < 0:
            raise ToxiproxyError(f"link {link!r}: latency and jitter must be >= 0")
        rate = int(link.rate_kbps or 0)
        if rate < 0:
            raise ToxiproxyError(f"link {link!r}: rate must be >= 0")
        if not 0.0 <= link.loss <= 1.0:  # also NaN
            raise ToxiproxyError(f"link {link!r}: loss must be a fraction in [0, 1]")
        if link.loss > 0 and not self.has_loss():
            raise ToxiproxyError(f"the Toxiproxy server on {self.api} (version {self.version()!r}) has no `loss` "
                                 f"toxic, so link {link!r} cannot be made; {INSTALL_HINT}")
        created = True
        for toxic_name, stream in zip(_toxic_names("latency"), ("upstream", "downstream"), strict=True):
            created &= self._put_toxic(name, {"name": toxic_name, "type": "latency", "stream": stream,
                                              "toxicity": 1.0, "attributes": {"latency": latency, "jitter": jitter}})
        self._set_optional(name, "bandwidth", {"rate": rate} if rate else None, known=not created)
        loss = {"probability": link.loss, "rtt": 2 * latency, "mss": 0} if link.loss > 0 else None
        self._set_optional(name, "loss", loss, known=not created)

    def _set_optional(self, proxy: str, kind: str, attributes: dict[str, Any] | None, *, known: bool) -> None:
        """Put the toxics ``kind`` with ``attributes`` on both streams of ``proxy``, or, with
        none, remove them if the proxy had a link before (``known``)."""
        for toxic_name, stream in zip(_toxic_names(kind), ("upstream", "downstream"), strict=True):
            if attributes is not None:
                self._put_toxic(proxy, {"name": toxic_name, "type": kind, "stream": stream,
                                        "toxicity": 1.0, "attributes": attributes})
            elif known:
                try:
                    self._request("DELETE", f"/proxies/{quote(proxy, safe='')}/toxics/{toxic_name}")
                except ToxiproxyError as e:
                    if "toxic not found" not in str(e):
                        raise

    def set_links(self, links: Iterable[tuple[str, Link]]) -> None:
        """:meth:`set_link` for each ``(proxy name, link)``."""
        for name, link in links:
            self.set_link(name, link)
