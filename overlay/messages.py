"""Wire messages of the node substrate (transport authentication, liveness).

Type numbers are allocated by range so roles never collide:

====================  =======================================
1–99                  transport and node (this module)
100–199               onion paths, relaying (overlay)
200–299               cloves, S-IDA (overlay)
300–399               model nodes
400–499               verifier committee
====================  =======================================
"""

from __future__ import annotations

from dataclasses import dataclass

from overlay.codec import field, message
from overlay.identity import NODE_ID_LEN

NONCE_LEN = 32


@message(1)
@dataclass(frozen=True, slots=True)
class AuthChallenge:
    """Server → dialer, first frame after TLS: prove your identity over ``nonce``."""

    nonce: bytes = field(exact=NONCE_LEN)


@message(2)
@dataclass(frozen=True, slots=True)
class AuthProof:
    """Dialer → server: keys and an Ed25519 signature over
    ``AUTH_CONTEXT || channel binding || nonce`` (see :mod:`overlay.handshake`)."""

    ed25519_public: bytes = field(exact=32)
    x25519_public: bytes = field(exact=32)
    signature: bytes = field(exact=64)


@message(3)
@dataclass(frozen=True, slots=True)
class AuthOk:
    """Server → dialer: accepted. Carries the server's X25519 key for later layers."""

    x25519_public: bytes = field(exact=32)


@message(4)
@dataclass(frozen=True, slots=True)
class Error:
    """Sent before closing a connection on a protocol error. ``code`` is a stable
    machine-readable word (``bad-frame``, ``auth-failed``, ``timeout``...)."""

    code: str = field(max=64)
    detail: str = field(max=1024)


@message(10)
@dataclass(frozen=True, slots=True)
class Ping:
    nonce: int


@message(11)
@dataclass(frozen=True, slots=True)
class Pong:
    nonce: int


@dataclass(frozen=True, slots=True)
class PeerSeen:
    """One row of a node's view of its peers. ``rtt_us`` is -1 when unreachable."""

    node_id: bytes = field(exact=NODE_ID_LEN)
    address: str = field(max=256)
    rtt_us: int
    last_ok_unix: float


@message(12)
@dataclass(frozen=True, slots=True)
class PeerStatusRequest:
    pass


@message(13)
@dataclass(frozen=True, slots=True)
class PeerStatus:
    node_id: bytes = field(exact=NODE_ID_LEN)
    uptime_s: float
    peers: tuple[PeerSeen, ...] = field(max=4096)


@message(14)
@dataclass(frozen=True, slots=True)
class Echo:
    """Diagnostic: the peer answers with :class:`EchoReply` carrying the same bytes
    (used by ``gentorrent bench wire`` to time authenticated round trips)."""

    nonce: int
    data: bytes = field(max=64 * 1024)


@message(15)
@dataclass(frozen=True, slots=True)
class EchoReply:
    nonce: int
    data: bytes = field(max=64 * 1024)
