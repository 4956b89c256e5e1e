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

from overlay.wire.codec import field, message
from overlay.wire.identity import NODE_ID_LEN

IV_LEN = 16  # a cell's iv: one AES block, permuted at every hop (overlay.anon.onion)

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
    ``AUTH_CONTEXT || channel binding || nonce`` (see :mod:`overlay.net.handshake`)."""

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
    rtt_us: int = field()
    last_ok_unix: float = field()


@message(12)
@dataclass(frozen=True, slots=True)
class PeerStatusRequest:
    pass


@message(13)
@dataclass(frozen=True, slots=True)
class PeerStatus:
    node_id: bytes = field(exact=NODE_ID_LEN)
    uptime_s: float = field()
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


# --------------------------------------------------------------------------- onion paths (100-119)
# Link ids are chosen by the upstream end of each link and differ on every link.

LINK_ID_LEN = 16
MAX_CELL_BODY = 1024 * 1024 + 4096  # a padded clove of the largest prompt, plus layers
PROXY_PATH_ID_LEN = 16


@message(100)
@dataclass(frozen=True, slots=True)
class Create:
    """Set up one hop of a path: the fixed-size establishment onion (overlay.anon.onion)."""

    link_id: bytes = field(exact=LINK_ID_LEN)
    onion: bytes = field(max=1024)


@message(101)
@dataclass(frozen=True, slots=True)
class CellFwd:
    """A cell travelling towards the proxy; each hop strips one layer."""

    link_id: bytes = field(exact=LINK_ID_LEN)
    iv: bytes = field(exact=IV_LEN)
    body: bytes = field(max=MAX_CELL_BODY)


@message(102)
@dataclass(frozen=True, slots=True)
class CellBack:
    """A cell travelling towards the user; each hop adds one layer."""

    link_id: bytes = field(exact=LINK_ID_LEN)
    iv: bytes = field(exact=IV_LEN)
    body: bytes = field(max=MAX_CELL_BODY)


@message(103)
@dataclass(frozen=True, slots=True)
class Destroy:
    """Tear down the path on this link (propagated hop by hop)."""

    link_id: bytes = field(exact=LINK_ID_LEN)
    reason: str = field(max=64)


@message(104)
@dataclass(frozen=True, slots=True)
class Deliver:
    """Proxy → model node over TLS: one request clove, sealed to the model node.
    ``proxy_path_id`` names the path at this proxy (replies for it come back as
    :class:`ReturnClove`)."""

    proxy_path_id: bytes = field(exact=PROXY_PATH_ID_LEN)
    sealed: bytes = field(max=MAX_CELL_BODY)


@message(105)
@dataclass(frozen=True, slots=True)
class ReturnClove:
    """Model node → proxy over TLS: one reply clove, sealed with a per-path return key."""

    proxy_path_id: bytes = field(exact=PROXY_PATH_ID_LEN)
    data: bytes = field(max=MAX_CELL_BODY)


# Payloads inside cells (after the user<->proxy AEAD), 110-119.


@message(110)
@dataclass(frozen=True, slots=True)
class ToModel:
    """User → proxy: deliver ``sealed`` to model node ``dest``."""

    dest: bytes = field(exact=NODE_ID_LEN)
    sealed: bytes = field(max=MAX_CELL_BODY)


@message(111)
@dataclass(frozen=True, slots=True)
class PathReady:
    """Proxy → user: the path is up; model nodes reach it at this proxy under ``proxy_path_id``."""

    proxy_path_id: bytes = field(exact=PROXY_PATH_ID_LEN)


@message(112)
@dataclass(frozen=True, slots=True)
class FromModel:
    """Proxy → user: a reply clove as the model node sealed it."""

    data: bytes = field(max=MAX_CELL_BODY)


@message(113)
@dataclass(frozen=True, slots=True)
class PathNotice:
    """Proxy → user: something went wrong beyond the proxy. ``code`` ``model-unreachable``
    (could not deliver to ``model_node``) and ``model-lost`` (the proxy's connection to
    ``model_node``, which it delivered to or got reply cloves from on this path, closed)
    are failover signals; ``model_node`` is empty for other codes. The proxy originates
    this message, so the user treats it as a claim about one path, never as a reply."""

    code: str = field(max=64)
    detail: str = field(max=512)
    model_node: bytes = field(max=NODE_ID_LEN)


# --------------------------------------------------------------------------- anonymous requests (120-139)
# These travel inside S-IDA cloves between a user and a model node; relays and
# proxies never see them in the clear.

MAX_PROMPT_CHARS = 512 * 1024
MAX_QUOTA_TOKEN = 1024  # a Request's quota token (overlay.directory.quota.MAX_TOKEN_BYTES fits)
REQUEST_ID_LEN = 16


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str = field(max=16)  # "system" | "user" | "assistant"
    content: str = field(max=MAX_PROMPT_CHARS)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Sampling parameters as the user asked; the model node validates ranges."""

    temperature: float = 0.7
    top_p: float = 1.0
    top_k: int = 0  # 0 = no top-k cut
    max_tokens: int = 256
    seed: int | None = None


@dataclass(frozen=True, slots=True)
class ReturnPath:
    """How the model node reaches the user back through one proxy (paper §3.2 step 4)."""

    proxy: bytes = field(exact=NODE_ID_LEN)
    proxy_path_id: bytes = field(exact=PROXY_PATH_ID_LEN)
    key: bytes = field(exact=32)  # per-request, per-path return key
    tag: bytes = field(exact=8)


@message(120)
@dataclass(frozen=True, slots=True)
class Request:
    """A prompt (paper §3.2 step 3): what to run and how to answer; nothing about the user."""

    request_id: bytes = field(exact=REQUEST_ID_LEN)
    model: str = field(max=128)
    messages: tuple[ChatMessage, ...] = field(max=256)
    params: SamplingParams = field()
    k: int = field()
    return_paths: tuple[ReturnPath, ...] = field(max=16)
    # Failover (from Petals): the part of the assistant's reply another node already
    # produced; the serving node continues it without repeating it. Empty normally.
    continuation: str = field(max=MAX_PROMPT_CHARS)
    # An anonymous usage-quota token (overlay/directory/quota.py, decision 0017): the serving
    # node redeems it with its issuers and serves the request ahead of requests without one.
    # Empty: none (quotas off, or a client without tokens). Inside the sealed clove: relays never see it.
    quota: bytes = field(max=MAX_QUOTA_TOKEN, default=b"")


@message(121)
@dataclass(frozen=True, slots=True)
class ReplyChunk:
    """One streamed piece of a reply; ``done`` marks the last. ``error`` is empty unless
    the request failed (then ``done`` is true and ``error`` says why, for the user).

    ``node`` names the serving node on every chunk (session affinity). Every output chunk
    carries ``chain``, the running hash over the text and token ids of this chunk and all
    before it (:func:`overlay.anon.signing.chain_next`), and the node's Ed25519 ``signature``
    over :func:`overlay.anon.signing.reply_signing_bytes` (request digest, ``chain``, ``done``,
    model, node id, ``signed_at_ms``). Error chunks carry an empty chain and are never an answer;
    their signature is empty but on a model node's "busy" before any output (seq 0), signed over
    :func:`overlay.anon.signing.busy_signing_bytes` (decision 0044). ``prompt_tokens`` (output
    chunks; 0 on error chunks) is how many tokens the serving node's prompt held, for the
    ``usage`` a client reports. It is not
    signed: an accounting figure, not part of the answer. ``failure`` (error chunks) is why,
    as a code (:class:`overlay.wire.failures.Failure`: node error, busy or invalid; the client reads
    any other value as a node error); 0 on answer chunks."""

    request_id: bytes = field(exact=REQUEST_ID_LEN)
    seq: int = field()
    text: str = field(max=MAX_PROMPT_CHARS)
    token_ids: tuple[int, ...] = field(max=65536)
    done: bool = field()
    error: str = field(max=1024)
    node: bytes = field(exact=NODE_ID_LEN)
    chain: bytes = field(max=32)
    signature: bytes = field(max=64)
    signed_at_ms: int = field()
    prompt_tokens: int = field(default=0)
    failure: int = field(default=0)
