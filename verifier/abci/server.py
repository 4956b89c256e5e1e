"""The ABCI 2.0 socket server: a thin trio driver around :mod:`verifier.abci.wire`.

CometBFT (``proxy_app = "unix://..."`` or ``"tcp://127.0.0.1:PORT"``) opens four connections
(consensus, mempool, query, snapshot) and writes requests on each; this server answers every
request in order on the connection it came on. ``Echo`` and ``Flush`` are answered here; every other
method goes to the :class:`Application`'s method of the same name (``info``, ``check_tx``,
``finalize_block``...), which takes the request message and returns the response message.

Only this machine may reach the port: :func:`parse_address` refuses anything but a unix socket or
a loopback TCP address. A connection that sends a malformed frame is closed and logged with the
evidence; an application that raises answers ``Response.exception`` (CometBFT then stops, which is
right: a deterministic application that fails is a bug to fix, not to skip) and the connection
closes.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import socket as _stdsocket
import stat
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from verifier.abci.proto.tendermint.abci import types_pb2 as abci
from verifier.abci.wire import MAX_MESSAGE, AbciWireError, RequestDecoder, encode_response

log = logging.getLogger("gentorrent.abci")

_READ_SIZE = 256 * 1024


class AbciAddressError(ValueError):
    """The ABCI listen address is not one we serve on (unix socket or loopback TCP only)."""


class Application(Protocol):
    """What the server dispatches to: one method per ABCI method, request in, response out."""

    def info(self, req: abci.RequestInfo) -> abci.ResponseInfo: ...
    def init_chain(self, req: abci.RequestInitChain) -> abci.ResponseInitChain: ...
    def query(self, req: abci.RequestQuery) -> abci.ResponseQuery: ...
    def check_tx(self, req: abci.RequestCheckTx) -> abci.ResponseCheckTx: ...
    def commit(self, req: abci.RequestCommit) -> abci.ResponseCommit: ...
    def list_snapshots(self, req: abci.RequestListSnapshots) -> abci.ResponseListSnapshots: ...
    def offer_snapshot(self, req: abci.RequestOfferSnapshot) -> abci.ResponseOfferSnapshot: ...
    def load_snapshot_chunk(self, req: abci.RequestLoadSnapshotChunk) -> abci.ResponseLoadSnapshotChunk: ...
    def apply_snapshot_chunk(self, req: abci.RequestApplySnapshotChunk) -> abci.ResponseApplySnapshotChunk: ...
    def prepare_proposal(self, req: abci.RequestPrepareProposal) -> abci.ResponsePrepareProposal: ...
    def process_proposal(self, req: abci.RequestProcessProposal) -> abci.ResponseProcessProposal: ...
    def extend_vote(self, req: abci.RequestExtendVote) -> abci.ResponseExtendVote: ...
    def verify_vote_extension(self, req: abci.RequestVerifyVoteExtension) -> abci.ResponseVerifyVoteExtension: ...
    def finalize_block(self, req: abci.RequestFinalizeBlock) -> abci.ResponseFinalizeBlock: ...


@dataclass(frozen=True, slots=True)
class ListenAddress:
    """A parsed ABCI address: ``unix`` with ``path``, or ``tcp`` with ``host`` and ``port``."""

    kind: str
    path: str = ""
    host: str = ""
    port: int = 0

    def url(self) -> str:
        """The form CometBFT's ``--proxy_app`` takes."""
        if self.kind == "unix":
            return f"unix://{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"tcp://{host}:{self.port}"


def parse_address(address: str) -> ListenAddress:
    """``unix:///abs/path``, ``unix://rel/path`` or ``tcp://127.0.0.1:PORT`` (any loopback IP).

    Anything else raises :class:`AbciAddressError`: the ABCI port gives whoever reaches it full
    control of this verifier's state, so it must never be reachable from another machine.
    """
    if address.startswith("unix://"):
        path = address[len("unix://"):]
        if not path:
            raise AbciAddressError("unix:// address without a path; give e.g. unix:///tmp/gt-abci.sock")
        return ListenAddress("unix", path=path)
    if address.startswith("tcp://"):
        rest = address[len("tcp://"):]
        host, sep, port_s = rest.rpartition(":")
        host = host.strip("[]")
        if not sep or not port_s.isdigit() or not 0 <= int(port_s) <= 65535:
            raise AbciAddressError(f"{address!r}: expected tcp://127.0.0.1:PORT")
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            raise AbciAddressError(
                f"{address!r}: the ABCI port takes a loopback IP literal (127.0.0.1 or ::1), not a host name"
            ) from None
        if not ip.is_loopback:
            raise AbciAddressError(
                f"{address!r}: the ABCI port must listen on loopback or a unix socket only; whoever reaches it "
                "controls this verifier's state"
            )
        return ListenAddress("tcp", host=str(ip), port=int(port_s))
    raise AbciAddressError(f"{address!r}: expected unix:///PATH or tcp://127.0.0.1:PORT")




def handle_request(app: Application, req: abci.Request) -> abci.Response:
    """The response to one request (``Echo``/``Flush`` here, the rest from ``app``)."""
    method = req.WhichOneof("value")
    if method == "echo":
        return abci.Response(echo=abci.ResponseEcho(message=req.echo.message))
    if method == "flush":
        return abci.Response(flush=abci.ResponseFlush())
    assert method is not None  # the decoder refuses requests without a method
    answer = getattr(app, method)(getattr(req, method))
    return abci.Response(**{method: answer})


async def serve_connection(app: Application, stream: trio.abc.Stream, *, name: str = "abci",
                           max_message: int = MAX_MESSAGE) -> None:
    """Answer requests on ``stream`` until the client closes it or breaks the protocol."""
    decoder = RequestDecoder(max_message=max_message)
    try:
        while True:
            data = await stream.receive_some(_READ_SIZE)
            if not data:
                return
            decoder.feed(data)
            out = bytearray()
            while True:
                try:
                    req = decoder.next_request()
                except AbciWireError as exc:
                    log.error("%s: closing the ABCI connection: %s", name, exc)
                    if out:
                        await stream.send_all(bytes(out))
                    return
                if req is None:
                    break
                try:
                    resp = handle_request(app, req)
                except Exception as exc:
                    log.exception("%s: the application failed on %s", name, req.WhichOneof("value"))
                    out += encode_response(abci.Response(exception=abci.ResponseException(
                        error=f"application error on {req.WhichOneof('value')}: {type(exc).__name__}: {exc}")))
                    await stream.send_all(bytes(out))
                    return
                out += encode_response(resp)
            if out:
                await stream.send_all(bytes(out))
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        log.info("%s: the ABCI client went away", name)
    finally:
        await trio.aclose_forcefully(stream)


async def _unix_listener(path: str) -> trio.SocketListener:
    p = trio.Path(path)
    if await p.exists() or await p.is_symlink():
        if not stat.S_ISSOCK((await p.lstat()).st_mode):
            raise AbciAddressError(f"{path} exists and is not a socket; remove it or pick another ABCI path")
        probe = trio.socket.socket(_stdsocket.AF_UNIX, _stdsocket.SOCK_STREAM)
        try:
            await probe.connect(path)
        except OSError as exc:
            if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
                raise
            await p.unlink(missing_ok=True)  # a stale socket from a process that died
        else:
            raise AbciAddressError(f"{path} is in use by a running ABCI server; stop it or pick another path")
        finally:
            probe.close()
    sock = trio.socket.socket(_stdsocket.AF_UNIX, _stdsocket.SOCK_STREAM)
    old = os.umask(0o077)  # the socket file is ours alone
    try:
        await sock.bind(path)
    finally:
        os.umask(old)
    sock.listen(128)
    return trio.SocketListener(sock)


async def open_listener(address: ListenAddress) -> trio.SocketListener:
    """A listener on ``address`` (already checked by :func:`parse_address`)."""
    if address.kind == "unix":
        return await _unix_listener(address.path)
    listeners = await trio.open_tcp_listeners(address.port, host=address.host)
    return listeners[0]


async def serve(app: Application, address: str, *,
                task_status: trio.TaskStatus[ListenAddress] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``app`` on ``address`` until cancelled; reports the bound address once listening."""
    where = parse_address(address)
    listener = await open_listener(where)
    if where.kind == "tcp":
        host, port, *_ = listener.socket.getsockname()
        where = ListenAddress("tcp", host=host, port=port)
    count = 0

    async def handler(stream: Any) -> None:
        nonlocal count
        count += 1
        await serve_connection(app, stream, name=f"abci#{count}")

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, handler, [listener])
            log.info("ABCI server listening on %s", where.url())
            task_status.started(where)
    finally:
        if where.kind == "unix":
            with trio.CancelScope(shield=True):  # the server ends by being cancelled
                await trio.Path(where.path).unlink(missing_ok=True)
