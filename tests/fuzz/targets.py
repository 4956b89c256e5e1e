"""Fuzz targets: every place bytes from the network (or a peer process) enter the code.

A target is a class whose instance holds one piece of state under test (a core, a decoder, or
nothing) and whose *steps* (``STEPS``, method names) each take a :class:`~tests.fuzz.mutate.Source`,
feed it one or more hostile or valid inputs, assert the target's contract on them and return
how many inputs were fed. :meth:`Target.check` asserts the invariants that must hold between
steps (bounded tables, consistent indexes). The table in docs/fuzzing.md lists the contract of
each entry point.

The same classes run under hypothesis (``tests/fuzz/test_fuzz.py``: stateless targets with
``@given``, stateful ones as a ``RuleBasedStateMachine``) and in the long run
(``python -m tests.fuzz``).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random
from collections.abc import Sequence
from typing import Any, ClassVar

import msgpack

from model_node.forwarding import Load
from model_node.group import GroupState
from model_node.messages import LengthProposal, LoadReport, SubtreeRequest, SubtreeUpdate
from model_node.server import check_params
from overlay.anon import onion, sida
from overlay.anon.actions import Send
from overlay.anon.relay import RelayCore, RelayLimits
from overlay.anon.seal import ReturnKey, SealError, open_sealed, seal_to
from overlay.anon.signing import (
    ReplyChecker,
    ReplySigner,
    ReplyVerifyError,
    chain_next,
    chain_start,
    reply_signing_bytes,
    request_digest,
)
from overlay.directory import escrow
from overlay.directory import quota as qw
from overlay.directory import registration as vtx
from overlay.directory import transcripts as tw
from overlay.directory.lists import (
    KIND_MODELS,
    KIND_USERS,
    ListError,
    ValidatorKey,
    encode_document,
    signing_message,
    validators_digest,
    verify_document,
)
from overlay.net.handshake import AuthError, check_proof, make_proof
from overlay.wire import codec, crypto
from overlay.wire.constants import ROLE_MODEL
from overlay.wire.identity import Identity, node_id_of
from overlay.wire.messages import (
    IV_LEN,
    MAX_PROMPT_CHARS,
    AuthProof,
    CellBack,
    CellFwd,
    ChatMessage,
    Create,
    Deliver,
    Destroy,
    FromModel,
    PathNotice,
    PathReady,
    Request,
    ReturnClove,
    ReturnPath,
    SamplingParams,
    ToModel,
)
from tests.audit_helpers import Committee
from tests.committee_helpers import CHAIN, Node
from tests.fuzz import mutate
from tests.fuzz.mutate import Source, chance, choice
from tests.unit.test_codec_roundtrip import REGISTERED
from user_client import openai_api as api
from verifier.abci import wire as abci_wire
from verifier.abci.proto.tendermint.abci import types_pb2 as abci
from verifier.app import CommitteeApp, Result, Validator
from verifier.audit import tx as at
from verifier.quota import Issuer

T0 = 1_700_000_000


def _encoded_corpus(classes: Sequence[type], per_class: int = 3, seed: int = 0) -> list[bytes]:
    """Valid payloads: ``per_class`` instances of each wire class."""
    out = []
    for i, cls in enumerate(classes):
        for j in range(per_class):
            out.append(codec.encode(mutate.message_of(mutate.RandomSource(seed * 7919 + i * 31 + j), cls)))
    return out


def _pieces(src: Source, stream: bytes) -> list[bytes]:
    """``stream`` cut at up to 6 points (a network delivers bytes in arbitrary pieces)."""
    cuts = sorted(src.int(0, len(stream)) for _ in range(src.int(0, 6)))
    bounds = [0, *cuts, len(stream)]
    return [stream[a:b] for a, b in itertools.pairwise(bounds)]


class Target:
    """A fuzz target: ``STEPS`` name the methods that feed inputs; ``check`` the invariants."""

    NAME: ClassVar[str]
    STEPS: ClassVar[tuple[str, ...]]
    STATEFUL: ClassVar[bool] = False

    def __init__(self) -> None:
        self.rejected = 0  # inputs refused with the documented error or drop

    def check(self) -> None:
        """Invariants between steps (none for a stateless target)."""

    def state_size(self) -> int:
        """Entries the target's state holds now (0 for stateless targets)."""
        return 0


# =========================================================================== stateless


class CodecTarget(Target):
    """``codec.decode``: every registered message type of every role. Contract: a payload either
    decodes to a message whose encoding is exactly that payload (one encoding per message), or
    raises :class:`codec.RemoteProtocolError`."""

    NAME = "codec"
    STEPS = ("feed",)
    CORPUS = _encoded_corpus(list(REGISTERED.values()))

    def feed(self, src: Source) -> int:
        _, data = mutate.payload(src, self.CORPUS)
        try:
            msg = codec.decode(data, peer="fuzz")
        except codec.RemoteProtocolError as exc:
            assert exc.peer == "fuzz" and len(exc.evidence) <= 64
            self.rejected += 1
            return 1
        assert codec.encode(msg) == data, "a decoded message must re-encode to the same bytes"
        return 1


class FramingTarget(Target):
    """``codec.FrameDecoder`` on a stream cut anywhere: honest length prefixes give back exactly
    the payloads sent; a lying prefix (0, over the limit) raises :class:`codec.RemoteProtocolError`
    at once; a drained decoder never holds more than one frame's bytes."""

    NAME = "framing"
    STEPS = ("feed",)
    MAX = 4096  # a small limit so over-limit frames are cheap to make

    def feed(self, src: Source) -> int:
        payloads = [mutate.payload(src, CodecTarget.CORPUS)[1] or b"\0" for _ in range(src.int(1, 4))]
        stream = bytearray()
        liar = None
        for i, p in enumerate(payloads):
            n = len(p)
            if chance(src, 15):
                n = choice(src, (0, self.MAX + 1, 2**32 - 1, max(0, len(p) - 1), len(p) + 3))
                if liar is None and n != len(p):
                    liar = i
            elif len(p) > self.MAX and liar is None:
                liar = i
            stream += n.to_bytes(4, "big") + p
        dec = codec.FrameDecoder(max_frame=self.MAX, peer="fuzz")
        got: list[bytes] = []
        try:
            for piece in _pieces(src, bytes(stream)):
                dec.feed(piece)
                while (payload := dec.next_payload()) is not None:
                    got.append(payload)
                assert dec.buffered <= self.MAX + codec.HEADER_LEN
        except codec.RemoteProtocolError:
            self.rejected += 1
            assert liar is not None, "honest frames must not be refused"
        upto = len(payloads) if liar is None else liar
        assert got[:upto] == payloads[:min(upto, len(got))]
        if liar is None:
            assert got == payloads
        return len(payloads)


class HandshakeTarget(Target):
    """The dialer's proof (``AuthProof``) at the server: decodes or raises
    :class:`codec.RemoteProtocolError`; verifies or raises :class:`AuthError`; only the honest
    proof for this binding and nonce is accepted."""

    NAME = "handshake"
    STEPS = ("feed",)
    IDENTITY = Identity.generate()

    def feed(self, src: Source) -> int:
        binding, nonce = src.bytes(32), src.bytes(32)
        honest = make_proof(self.IDENTITY, binding, nonce)
        _, data = mutate.payload(src, [codec.encode(honest)])
        try:
            proof = codec.decode(data)
        except codec.RemoteProtocolError:
            self.rejected += 1
            return 1
        if not isinstance(proof, AuthProof):
            self.rejected += 1
            return 1
        try:
            got = check_proof(proof, binding, nonce)
        except AuthError:
            self.rejected += 1
            return 1
        assert got == self.IDENTITY.node_id
        assert (proof.ed25519_public, proof.signature) == (honest.ed25519_public, honest.signature)
        return 1


class OnionTarget(Target):
    """Path establishment onions (``onion.peel_onion``) and cell layers at the proxy and the user
    (``ProxyCrypt.open_forward``, ``PathCrypt.unwrap_backward``): anything but the exact bytes
    made for this hop raises :class:`onion.OnionError`."""

    NAME = "onion"
    STEPS = ("peel", "forward_cell", "backward_cell")
    STATIC: ClassVar[list[crypto.X25519Key]] = [crypto.X25519Key.generate() for _ in range(3)]
    IDS: ClassVar[list[bytes]] = [bytes([i]) * 20 for i in range(1, 4)]

    def __init__(self) -> None:
        super().__init__()
        pubs = [k.public_bytes for k in self.STATIC]
        self.onion, keys = onion.build_onion(pubs, self.IDS, T0)
        self.path = onion.PathCrypt(keys)
        self.proxy = onion.ProxyCrypt(keys[-1])
        self.hops = [onion.HopCrypt(k) for k in keys]

    def peel(self, src: Source) -> int:
        data = mutate.mutate_bytes(src, self.onion) if chance(src, 90) else src.bytes(onion.ONION_LEN)
        try:
            r = onion.peel_onion(self.STATIC[0], data)
        except onion.OnionError as exc:
            assert exc.reason in ("bad-size", "bad-key", "bad-mac", "bad-flags")
            self.rejected += 1
            return 1
        assert data == self.onion and r.next_node == self.IDS[1]
        return 1

    def _mutated_cell(self, src: Source, iv: bytes, body: bytes) -> tuple[bytes, bytes]:
        if chance(src, 50):
            iv = mutate.mutate_bytes(src, iv)[:IV_LEN].ljust(IV_LEN, b"\0")
        if chance(src, 70):
            body = mutate.mutate_bytes(src, body)
        return iv, body

    def forward_cell(self, src: Source) -> int:
        payload = src.bytes(src.int(0, 200))
        iv, body = self.path.wrap_forward(payload)
        for h in self.hops[:-1]:
            iv, body = h.relay_forward(iv, body)
        bad_iv, bad_body = self._mutated_cell(src, iv, body)
        try:
            got = self.proxy.open_forward(bad_iv, bad_body)
        except onion.OnionError:
            self.rejected += 1
            return 1
        assert (bad_iv, bad_body) == (iv, body) and got == payload
        return 1

    def backward_cell(self, src: Source) -> int:
        payload = src.bytes(src.int(0, 200))
        iv, body = self.proxy.seal_backward(payload)
        for h in reversed(self.hops[:-1]):
            iv, body = h.relay_backward(iv, body)
        bad_iv, bad_body = self._mutated_cell(src, iv, body)
        try:
            got = self.path.unwrap_backward(bad_iv, bad_body)
        except onion.OnionError:
            self.rejected += 1
            return 1
        assert (bad_iv, bad_body) == (iv, body) and got == payload
        return 1


class SealTarget(Target):
    """Sealed request cloves at the model node (``open_sealed``) and return-key sealed reply
    cloves at the user (``ReturnKey.open``): anything but the sealed bytes raises
    :class:`SealError`."""

    NAME = "seal"
    STEPS = ("sealed", "return_key")
    KEY = crypto.X25519Key.generate()
    RETURN_KEY = ReturnKey.generate()

    def sealed(self, src: Source) -> int:
        plain = src.bytes(src.int(0, 100))
        good = seal_to(self.KEY.public_bytes, plain)
        data = mutate.mutate_bytes(src, good) if chance(src, 90) else src.bytes(src.int(0, 100))
        try:
            got = open_sealed(self.KEY, data)
        except SealError:
            self.rejected += 1
            return 1
        assert data == good and got == plain
        return 1

    def return_key(self, src: Source) -> int:
        plain = src.bytes(src.int(0, 100))
        good = self.RETURN_KEY.seal(plain)
        data = mutate.mutate_bytes(src, good) if chance(src, 90) else src.bytes(src.int(0, 100))
        try:
            got = self.RETURN_KEY.open(data)
        except SealError:
            self.rejected += 1
            return 1
        assert data == good and got == plain
        return 1


class CloveTarget(Target):
    """``sida.decode_clove`` (what a model node or a user does with an opened clove): a
    well-formed clove that re-encodes to the same bytes, or :class:`codec.RemoteProtocolError`."""

    NAME = "clove"
    STEPS = ("feed",)
    CORPUS: ClassVar[list[bytes]] = [
        sida.encode_clove(c) for size, n, k in ((0, 1, 1), (50, 4, 3), (300, 5, 2), (700, 16, 16))
        for c in sida.split(bytes(range(256)) * (size // 256) + bytes(size % 256), n, k)]

    def feed(self, src: Source) -> int:
        _, data = mutate.payload(src, self.CORPUS)
        try:
            c = sida.decode_clove(data, peer="fuzz")
        except codec.RemoteProtocolError:
            self.rejected += 1
            return 1
        assert sida.clove_problem(c) is None and sida.encode_clove(c) == data
        return 1


class TxTarget(Target):
    """Committee transactions: ``overlay.directory.registration.decode_tx`` raises only :class:`TxError`;
    ``CommitteeApp.check_tx`` answers every input with a result and accepts only transactions
    signed by their node (the valid corpus)."""

    NAME = "tx"
    STEPS = ("feed",)

    def __init__(self) -> None:
        super().__init__()
        nodes = [Node(port=9000 + i) for i in range(4)]
        self.corpus = [nodes[0].register(), nodes[1].register(ROLE_MODEL), nodes[2].update(),
                       nodes[3].leave()]
        self.app = CommitteeApp()
        self.app.init_chain(CHAIN, [Validator("ed25519", bytes([i]) * 32, 10) for i in range(4)])

    def feed(self, src: Source) -> int:
        _, data = mutate.payload(src, self.corpus)
        try:
            t = vtx.decode_tx(data, CHAIN)
        except vtx.TxError as exc:
            assert isinstance(exc.code, vtx.Code)
            self.rejected += 1
        else:
            assert data in self.corpus, "only a transaction its node signed decodes"
            assert t.node_id in {node_id_of(vtx.decode_tx(c, CHAIN).ed25519_public) for c in self.corpus}
        result = self.app.check_tx(data)
        assert result.ok == (data == self.corpus[0] or data == self.corpus[1]), (
            "check_tx accepts exactly the valid registrations")
        return 1


class AbciFramingTarget(Target):
    """``verifier.abci.wire.RequestDecoder`` on a stream from the CometBFT side: honest frames
    give back the requests sent, bad ones raise :class:`AbciWireError`; a drained decoder holds
    at most one frame."""

    NAME = "abci"
    STEPS = ("feed",)
    MAX = 4096

    @staticmethod
    def _requests() -> list[bytes]:
        reqs = [
            abci.Request(echo=abci.RequestEcho(message="hello")),
            abci.Request(flush=abci.RequestFlush()),
            abci.Request(info=abci.RequestInfo(version="0.38.26", block_version=11, p2p_version=8)),
            abci.Request(check_tx=abci.RequestCheckTx(tx=Node().register())),
            abci.Request(query=abci.RequestQuery(path="/lists/users", data=b"")),
            abci.Request(finalize_block=abci.RequestFinalizeBlock(txs=[b"a", Node().register()], height=3,
                                                                  hash=bytes(32))),
            abci.Request(commit=abci.RequestCommit()),
        ]
        return [r.SerializeToString() for r in reqs]

    def __init__(self) -> None:
        super().__init__()
        self.corpus = self._requests()

    def feed(self, src: Source) -> int:
        bodies = []
        for _ in range(src.int(1, 4)):
            base = choice(src, self.corpus)
            bodies.append(base if chance(src, 40) else mutate.mutate_bytes(src, base, self.corpus))
        stream = bytearray()
        honest = True
        for b in bodies:
            if chance(src, 5):
                stream += b"\xff" * 11  # a varint over 10 bytes
                honest = False
                continue
            n = choice(src, (0, self.MAX + 1, 2**63, len(b) + 2)) if chance(src, 10) else len(b)
            honest = honest and n == len(b) and len(b) <= self.MAX
            stream += abci_wire.encode_uvarint(n) + b
        dec = abci_wire.RequestDecoder(max_message=self.MAX)
        got = []
        try:
            for piece in _pieces(src, bytes(stream)):
                dec.feed(piece)
                while (r := dec.next_request()) is not None:
                    got.append(r)
                assert dec.buffered <= self.MAX + abci_wire.MAX_VARINT_LEN
        except abci_wire.AbciWireError:
            self.rejected += 1
            return len(bodies)
        assert all(r.WhichOneof("value") for r in got), "every request handed out names a method"
        if honest:  # every frame parsed: the requests are exactly those sent
            assert [r.SerializeToString() for r in got] == [
                abci_wire.decode_request(b).SerializeToString() for b in bodies]
        return len(bodies)


class ListTarget(Target):
    """The signed user and model lists (``overlay.directory.lists.verify_document``): refused with
    :class:`ListError`, or accepted with exactly the entries the committee signed — also when
    the committee signed a list whose records are garbage."""

    NAME = "signed-list"
    STEPS = ("document", "signed_garbage")

    def __init__(self) -> None:
        super().__init__()
        self.keys = [crypto.SigningKey.generate() for _ in range(4)]
        self.pinned = [ValidatorKey(k.public_bytes, 10) for k in self.keys]
        users = sorted((self._record(i, 1) for i in range(5)), key=lambda r: r[0])
        models = sorted((self._record(i, 2) for i in range(3)), key=lambda r: r[0])
        self.ub = msgpack.packb(users, use_bin_type=True)
        self.mb = msgpack.packb(models, use_bin_type=True)
        self.docs = [self._document(7, self.ub, self.mb, KIND_USERS, 4), self._document(7, self.ub, self.mb,
                                                                                       KIND_MODELS, 3)]
        self.entries = [verify_document(d, CHAIN, self.pinned, kind=k).entries
                        for d, k in zip(self.docs, (KIND_USERS, KIND_MODELS), strict=True)]

    @staticmethod
    def _record(i: int, role: int) -> list[Any]:
        key = crypto.SigningKey.generate()
        return [node_id_of(key.public_bytes), key.public_bytes, role, bytes(32), f"10.0.{role}.{i}:9000",
                "eu-west", "smollm2" if role == 2 else "", 5 if role == 2 else 0, T0,
                *([900_000, True] if role == 2 else [])]  # model records: reputation, audited (lists format 3)

    def _document(self, height: int, ub: bytes, mb: bytes, kind: int, signers: int) -> bytes:
        ud, md = crypto.sha256(ub), crypto.sha256(mb)
        msg = signing_message(CHAIN, height, T0, ud, md, validators_digest(self.pinned))
        sigs = [(k.public_bytes, k.sign(msg)) for k in self.keys[:signers]]
        return encode_document(CHAIN, height, T0, kind, ub if kind == KIND_USERS else mb, ud, md, self.pinned, sigs)

    def document(self, src: Source) -> int:
        i = src.int(0, 1)
        kind = (KIND_USERS, KIND_MODELS)[i]
        _, data = mutate.payload(src, [self.docs[i]])
        try:
            got = verify_document(data, CHAIN, self.pinned, kind=kind, min_height=src.int(0, 8))
        except ListError:
            self.rejected += 1
            return 1
        assert got.entries == self.entries[i], "only the signed entries are ever accepted"
        return 1

    def signed_garbage(self, src: Source) -> int:
        """The committee itself signs a mutated list: the client refuses it or decodes it strictly."""
        _, users = mutate.payload(src, [self.ub, self.mb])
        data = self._document(5, users, self.mb, KIND_USERS, 4)
        try:
            got = verify_document(data, CHAIN, self.pinned, kind=KIND_USERS)
        except ListError:
            self.rejected += 1
            return 1
        assert all(e.role == "user" for e in got.entries)
        return 1


class RequestTarget(Target):
    """A request as a model node receives it (``Request`` after reassembly or over TLS), through
    ``model_node.server.check_params``: a reason string for out-of-range parameters (sent back as
    an error chunk), never an exception, and ``None`` only for parameters within the ranges."""

    NAME = "request"
    STEPS = ("feed",)
    CORPUS: ClassVar[list[bytes]] = [codec.encode(Request(
        bytes(16), "echo", (ChatMessage("user", "hi"),), SamplingParams(), 3,
        (ReturnPath(bytes(20), bytes(16), bytes(32), bytes(8)),) * 4, ""))]
    CORPUS += _encoded_corpus([Request], 4)

    def feed(self, src: Source) -> int:
        _, data = mutate.payload(src, self.CORPUS)
        try:
            req = codec.decode(data)
        except codec.RemoteProtocolError:
            self.rejected += 1
            return 1
        if not isinstance(req, Request):
            self.rejected += 1
            return 1
        why = check_params(req, 4096)
        p = req.params
        if why is None:
            assert math.isfinite(p.temperature) and 0 < p.top_p <= 1 and 1 <= p.max_tokens <= 4096
        else:
            assert isinstance(why, str) and why
            self.rejected += 1
        return 1


class GatewayTarget(Target):
    """The gateway's request bodies (``user_client.openai_api.parse_json``, then ``parse_chat`` /
    ``parse_completion``): a :class:`Call` within the limits, or :class:`ApiError` with a 4xx
    status."""

    NAME = "gateway"
    STEPS = ("chat", "completion")
    CHAT: ClassVar[list[bytes]] = [
        json.dumps({"model": "echo", "messages": [{"role": "user", "content": "hi"}]}).encode(),
        json.dumps({"model": "m", "stream": True, "max_tokens": 5, "temperature": 0.5, "top_p": 0.9,
                    "stop": ["a", "b"], "seed": 3, "messages": [
                        {"role": "system", "content": "s"},
                        {"role": "user", "content": [{"type": "text", "text": "x"}]}]}).encode()]
    COMPLETION: ClassVar[list[bytes]] = [
        json.dumps({"model": "echo", "prompt": "hi", "max_tokens": 3}).encode(),
        json.dumps({"model": "echo", "prompt": "x", "stream": True, "stop": "z",
                    "stream_options": {"include_usage": True}}).encode()]

    def _json(self, src: Source, corpus: list[bytes]) -> object:
        base = choice(src, corpus)
        k = src.int(0, 3)
        if k == 0:  # the JSON tree, mutated
            tree = json.loads(base)
            return _mutate_json(src, tree)
        if k == 1:  # deep nesting, as text
            depth = choice(src, (10, 1000, 100_000))
            data = choice(src, (b"[", b'{"a":', b'{"messages":[')) * depth
        else:
            data = mutate.mutate_bytes(src, base, corpus)
        return api.parse_json(data)  # what the gateway does with a body

    def _parse(self, src: Source, corpus: list[bytes], parse: Any) -> int:
        try:
            call = parse(self._json(src, corpus))
        except api.ApiError as exc:
            assert 400 <= exc.status < 500
            self.rejected += 1
            return 1
        assert isinstance(call.model, str) and 0 < len(call.model) <= 128
        assert sum(len(m.content) for m in call.messages) <= MAX_PROMPT_CHARS
        return 1

    def chat(self, src: Source) -> int:
        return self._parse(src, self.CHAT, api.parse_chat)

    def completion(self, src: Source) -> int:
        return self._parse(src, self.COMPLETION, api.parse_completion)


def _weird_json(src: Source) -> object:
    k = src.int(0, 9)
    vals: tuple[object, ...] = (None, True, False, 0, -1, 1.5, 2**64, 10**400 if k == 9 else 1e308, "", "x" * 200,
                                [], {}, [1, "a"], {"a": None}, float("nan"), float("inf"), -0.0)
    if k < 8:
        return choice(src, vals)
    v: object = "deep"
    for _ in range(src.int(1, 300)):
        v = [v] if chance(src, 50) else {"a": v}
    return v


def _mutate_json(src: Source, tree: object) -> object:
    if not isinstance(tree, (dict, list)) or chance(src, 15):
        return _weird_json(src)
    if isinstance(tree, list):
        out = list(tree)
        if out and chance(src, 50):
            i = src.int(0, len(out) - 1)
            out[i] = _mutate_json(src, out[i])
        elif chance(src, 50):
            out.append(_weird_json(src))
        else:
            out = out * choice(src, (2, 300, 2000))
        return out
    d = dict(tree)
    keys = [*list(d), "n", "logprobs", "tools", "echo", "unknown", "stream_options", "seed", "top_k"]
    key = choice(src, keys)
    if chance(src, 20):
        d.pop(key, None)
    else:
        d[key] = _mutate_json(src, d[key]) if key in d else _weird_json(src)
    return d


# =========================================================================== stateful


def _sends_ok(out: list[Send]) -> None:
    assert isinstance(out, list)
    for s in out:
        assert isinstance(s, Send) and type(s.peer) is bytes and len(s.peer) == 20
        codec.encode(s.msg)  # everything a core asks to send is a valid wire message


class RelayTarget(Target):
    """``RelayCore.on_message`` (paper §3.2 steps 2–4) fed valid paths and cells interleaved with
    hostile messages from neighbours and strangers: never raises; a message that yields nothing
    is counted in ``dropped`` (or tore down a path); a mutated onion never sets up a path; the
    tables stay within the limits; a valid cell on a live path is still forwarded exactly. A Create
    from a peer the list does not hold (a stranger) is held within the bounds or refused at once,
    and a held one is accepted once the list holds its peer or refused when due."""

    NAME = "relay"
    STATEFUL = True
    STEPS = ("create_relay", "create_proxy", "valid_cell", "valid_return", "hostile_message",
             "hostile_cell", "hostile_create", "peer_lost", "advance", "unlisted_create")
    LIMITS = RelayLimits(max_paths=48, max_paths_per_peer=12, cells_per_s=1e12, cell_burst=1e12,
                         creates_per_s=1e12, create_burst=1e12, max_replay_entries=64, idle_timeout=300.0,
                         max_held=6, max_held_per_peer=2)

    def __init__(self) -> None:
        super().__init__()
        self.me = bytes([0xEE]) * 20
        self.key = crypto.X25519Key.generate()
        self.hop_keys = [crypto.X25519Key.generate() for _ in range(2)]
        self.hop_ids = [bytes([0xA1]) * 20, bytes([0xA2]) * 20]
        self.neighbours = [bytes([0xB0 + i]) * 20 for i in range(3)]
        self.model = bytes([0xCC]) * 20
        known = set(self.hop_ids) | set(self.neighbours) | {self.model}
        self.strangers = [bytes([0xD0 + i]) * 20 for i in range(4)]
        self.listed_late: set[bytes] = set()  # strangers a later list holds
        self.core = RelayCore(self.me, self.key, knows=known.__contains__, limits=self.LIMITS,
                              is_model=lambda n: n == self.model,
                              admits=lambda n: n in known or n in self.listed_late)
        self.now, self.unix = 1000.0, float(T0)
        # (pred, link) -> (succ, hop keys for our layer) for relay paths we made;
        # (pred, link) -> (hop crypts before us, path crypt) for proxy paths we made
        self.relays: dict[tuple[bytes, bytes], tuple[bytes, onion.HopCrypt]] = {}
        self.proxies: dict[tuple[bytes, bytes], tuple[list[onion.HopCrypt], onion.PathCrypt]] = {}
        self.corpus: list[bytes] = _encoded_corpus(
            [Create, CellFwd, CellBack, Destroy, ReturnClove, Deliver, ToModel, FromModel, PathNotice,
             PathReady], 1)

    def state_size(self) -> int:
        return len(self.core.by_pred) + len(self.core.replay) + len(self.core._cell_buckets) + self.core.held

    def _drops(self) -> int:
        return sum(self.core.dropped.values())

    def _feed(self, peer: bytes, msg: Any) -> list[Send]:
        before_drops, before_paths, before_held = self._drops(), len(self.core), self.core.holds["held"]
        out = self.core.on_message(peer, msg, now=self.now, unix=self.unix)
        _sends_ok(out)
        if not out:
            assert self._drops() > before_drops or len(self.core) < before_paths or \
                self.core.holds["held"] > before_held, (
                f"{type(msg).__name__} from a peer yielded nothing and was not counted as a drop")
        self._forget_gone()
        return out

    def _forget_gone(self) -> None:
        for table in (self.relays, self.proxies):
            for key in [k for k in table if k not in self.core.by_pred]:
                del table[key]

    def _onion(self, as_proxy: bool) -> tuple[bytes, list[onion.HopKeys]]:
        if as_proxy:
            ids = [*self.hop_ids, self.me]
            pubs = [k.public_bytes for k in self.hop_keys] + [self.key.public_bytes]
        else:
            ids = [self.me, *self.hop_ids]
            pubs = [self.key.public_bytes] + [k.public_bytes for k in self.hop_keys]
        packet, keys = onion.build_onion(pubs, ids, [int(self.unix) + 600] * 3)
        if as_proxy:  # what the hop before us passes on
            for k in self.hop_keys:
                packet = onion.peel_onion(k, packet).next_onion
        return packet, keys

    def create_relay(self, src: Source) -> int:
        peer, link = choice(src, self.neighbours), src.bytes(16)
        packet, keys = self._onion(False)
        in_use = (peer, link) in self.core.by_pred  # the path already on this link stays as it was
        full = len(self.core) >= self.LIMITS.max_paths or \
            self.core.per_peer[peer] >= self.LIMITS.max_paths_per_peer or in_use
        out = self._feed(peer, Create(link, packet))
        if full:
            assert in_use or (peer, link) not in self.relays
            return 1
        assert len(out) == 1 and out[0].peer == self.hop_ids[0] and isinstance(out[0].msg, Create)
        self.relays[(peer, link)] = (self.hop_ids[0], onion.HopCrypt(keys[0]))
        return 1

    def create_proxy(self, src: Source) -> int:
        peer, link = self.hop_ids[1], src.bytes(16)
        packet, keys = self._onion(True)
        full = len(self.core) >= self.LIMITS.max_paths or \
            self.core.per_peer[peer] >= self.LIMITS.max_paths_per_peer or (peer, link) in self.core.by_pred
        out = self._feed(peer, Create(link, packet))
        if full:
            return 1
        assert len(out) == 1 and isinstance(out[0].msg, CellBack)
        crypt = onion.PathCrypt(keys)
        msg = out[0].msg
        iv, body = msg.iv, msg.body
        for h in reversed(crypt.hops[:-1]):  # the earlier hops add their layers on the way back
            iv, body = h.relay_backward(iv, body)
        assert isinstance(codec.decode(crypt.unwrap_backward(iv, body)), PathReady)
        self.proxies[(peer, link)] = ([onion.HopCrypt(k) for k in keys[:-1]], crypt)
        return 1

    def valid_cell(self, src: Source) -> int:
        if self.relays and chance(src, 50):
            (peer, link), (succ, hop) = choice(src, sorted(self.relays.items()))
            iv, body = src.bytes(IV_LEN), src.bytes(src.int(0, 300))
            succ_link = self.core.by_pred[(peer, link)].succ_link
            assert succ_link is not None  # a relay path's hop links on
            out = self._feed(peer, CellFwd(link, iv, body))
            exp_iv, exp_body = hop.relay_forward(iv, body)
            assert out == [Send(succ, CellFwd(succ_link, exp_iv, exp_body))], "a live relay path must forward"
            return 1
        if self.proxies:
            (peer, link), (before, crypt) = choice(src, sorted(self.proxies.items(), key=lambda kv: kv[0]))
            sealed = src.bytes(src.int(1, 300))
            iv, body = crypt.wrap_forward(codec.encode(ToModel(self.model, sealed)))
            for h in before:
                iv, body = h.relay_forward(iv, body)
            ppid = self.core.by_pred[(peer, link)].proxy_path_id
            assert ppid is not None  # a proxy path's last hop has one
            out = self._feed(peer, CellFwd(link, iv, body))
            assert out == [Send(self.model, Deliver(ppid, sealed))], "a live proxy path must deliver"
        return 1

    def valid_return(self, src: Source) -> int:
        if not self.proxies:
            return 0
        key = choice(src, sorted(self.proxies))
        _before, crypt = self.proxies[key]
        path = self.core.by_pred[key]
        ppid = path.proxy_path_id
        assert ppid is not None
        data = src.bytes(src.int(0, 300))
        delivered = self.model in path.delivered
        stranger_drops = self.core.dropped["return-clove-stranger"]
        out = self._feed(self.model, ReturnClove(ppid, data))
        if not delivered:  # only the model node the path delivered to may answer on it
            assert out == [] and self.core.dropped["return-clove-stranger"] == stranger_drops + 1
            return 1
        assert len(out) == 1 and out[0].peer == key[0] and isinstance(out[0].msg, CellBack)
        iv, body = out[0].msg.iv, out[0].msg.body
        for h in reversed(crypt.hops[:-1]):
            iv, body = h.relay_backward(iv, body)
        assert codec.decode(crypt.unwrap_backward(iv, body)) == FromModel(data)
        return 1

    def _live_corpus(self) -> list[bytes]:
        """The static corpus plus frames naming our live links and proxy path ids."""
        out = list(self.corpus)
        for peer, link in list(self.relays)[:4] + list(self.proxies)[:4]:
            out.append(codec.encode(CellFwd(link, bytes(16), b"x" * 40)))
            out.append(codec.encode(Destroy(link, "fuzz")))
            ppid = self.core.by_pred[(peer, link)].proxy_path_id
            if ppid is not None:
                out.append(codec.encode(ReturnClove(ppid, b"y" * 40)))
        return out

    def hostile_message(self, src: Source) -> int:
        """Any decodable mutation of a relay message, from a neighbour, a hop or a stranger."""
        peer = choice(src, [*self.neighbours, *self.hop_ids, self.model, src.bytes(20)])
        _, data = mutate.payload(src, self._live_corpus())
        try:
            msg = codec.decode(data)
        except codec.RemoteProtocolError:
            self.rejected += 1  # the driver closes the connection; the core never sees it
            return 1
        self._feed(peer, msg)
        return 1

    def hostile_cell(self, src: Source) -> int:
        """A tampered forward cell on a live proxy path: a PathNotice once, then counted drops."""
        if not self.proxies:
            return 0
        (peer, link), (before, crypt) = choice(src, sorted(self.proxies.items(), key=lambda kv: kv[0]))
        iv, body = crypt.wrap_forward(codec.encode(ToModel(self.model, b"z" * 50)))
        for h in before:
            iv, body = h.relay_forward(iv, body)
        bad = mutate.mutate_bytes(src, body)
        out = self._feed(peer, CellFwd(link, iv, bad))
        if bad != body:
            assert all(isinstance(s.msg, CellBack) and s.peer == peer for s in out), "nothing is delivered"
        return 1

    def hostile_create(self, src: Source) -> int:
        """A mutated or replayed onion never sets up a path."""
        peer = choice(src, self.neighbours)
        good, _ = self._onion(chance(src, 50))
        packet = mutate.mutate_bytes(src, good)
        if packet == good:
            return 0
        link = src.bytes(16)
        before = len(self.core)
        out = self._feed(peer, Create(link, packet))
        assert len(self.core) == before and all(isinstance(s.msg, Destroy) for s in out)
        return 1

    def peer_lost(self, src: Source) -> int:
        peer = choice(src, [*self.neighbours, *self.hop_ids, src.bytes(20)])
        _sends_ok(self.core.on_peer_lost(peer))
        assert all(p.pred != peer and p.succ != peer for p in self.core.by_pred.values())
        assert all(h.peer != peer for h in self.core._held.values())
        self._forget_gone()
        return 0

    def advance(self, src: Source) -> int:
        dt = choice(src, (0.0, 1.0, 30.0, 400.0))
        self.now += dt
        self.unix += dt
        _sends_ok(self.core.expire(self.now))
        out = self.core.release_held(self.now, self.unix)
        _sends_ok(out)
        assert all(h.until > self.now for h in self.core._held.values()), "a due held Create was kept"
        self._forget_gone()
        return 0

    def unlisted_create(self, src: Source) -> int:
        """A valid Create from a stranger: held while there is room (else refused at once); once a
        list holds the stranger, its held Creates are re-fed and none stays held."""
        c, lim = self.core, self.LIMITS
        unlisted = [s for s in self.strangers if s not in self.listed_late]
        if not unlisted:
            return 0
        peer = choice(src, unlisted)
        if chance(src, 25):  # the next list holds it
            self.listed_late.add(peer)
            _sends_ok(c.release_held(self.now, self.unix))
            assert all(h.peer not in self.listed_late for h in c._held.values()), "a listed peer's Create kept"
            self._forget_gone()
            return 1
        packet, _ = self._onion(chance(src, 50))
        link = src.bytes(16)
        room = c.held < lim.max_held and c._held_per_peer[peer] < lim.max_held_per_peer
        dup = (peer, link) in c._held
        held = c.held
        out = self._feed(peer, Create(link, packet))
        if dup:
            assert out == [] and c.held == held
        elif room:
            assert out == [] and c.held == held + 1, "a Create from an unlisted peer with room is held"
        else:
            assert [(s.peer, s.msg) for s in out] == [(peer, Destroy(link, "not-registered"))]
        return 1

    def check(self) -> None:
        c, lim = self.core, self.LIMITS
        assert len(c.by_pred) <= lim.max_paths
        assert all(n <= lim.max_paths_per_peer for n in c.per_peer.values())
        assert sum(c.per_peer.values()) == len(c.by_pred)
        assert len(c.replay) <= lim.max_replay_entries
        assert len(c._cell_buckets) <= 4 * lim.max_paths + 1 and len(c._create_buckets) <= 4 * lim.max_paths + 1
        live = set(map(id, c.by_pred.values()))
        assert all(id(p) in live for p in c.by_succ.values())
        assert all(id(p) in live for p in c.by_proxy_path.values())
        assert len(c.by_succ) + len(c.by_proxy_path) == len(c.by_pred)
        assert c.held <= lim.max_held and sum(c._held_per_peer.values()) == c.held
        assert all(0 < n <= lim.max_held_per_peer for n in c._held_per_peer.values())


class ReassemblerTarget(Target):
    """``sida.Reassembler.add`` (a model node's request cloves, a user's reply cloves) fed
    authentic cloves interleaved with forged, mutated and foreign ones: never raises; only
    authentic messages come out, each once; a message whose n cloves arrive together
    completes; memory and message counts stay under the limits."""

    NAME = "reassembler"
    STATEFUL = True
    STEPS = ("whole_message", "authentic_clove", "forged_clove", "mutated_clove", "decoded_clove", "expire")
    KEEP = 512  # authentic messages the harness remembers

    def __init__(self) -> None:
        super().__init__()
        self.r = sida.Reassembler(max_messages=32, max_candidates_per_index=3, ttl=30.0,
                                  max_bytes=2 * 1024 * 1024)
        self.now = 0.0
        self.messages: dict[bytes, bytes] = {}  # msg_id -> authentic message
        self.delivered: dict[bytes, float] = {}  # msg_id -> when it came out
        self.pending: list[sida.Clove] = []  # authentic cloves not yet added

    def state_size(self) -> int:
        return len(self.r)

    def _new(self, src: Source) -> list[sida.Clove]:
        k = src.int(1, 5)
        n = src.int(k, min(k + 3, sida.MAX_N))
        message = src.bytes(choice(src, (0, 1, 40, 300, 5000)))
        cloves = sida.split(message, n, k)
        self.messages[cloves[0].msg_id] = message
        if len(self.messages) > self.KEEP:  # bound the harness's own memory: forget the oldest
            gone = set(list(self.messages)[: len(self.messages) - self.KEEP // 2])
            for mid in gone:
                del self.messages[mid]
                self.delivered.pop(mid, None)
            self.pending = [c for c in self.pending if c.msg_id not in gone]
            # the reassembler must forget them too before their cloves could come back
            self.now += self.r.ttl + 1
            self.r.expire(self.now)
        return cloves

    def _add(self, c: sida.Clove) -> None:
        out = self.r.add(c, self.now)
        if out is not None:
            assert self.messages.get(c.msg_id) == out, "only authentic messages are recovered"
            last = self.delivered.get(c.msg_id)
            # Once per ttl: the reassembler forgets finished ids after ttl (documented), so a late
            # clove after that may deliver again; the consumers drop repeated request ids.
            assert last is None or self.now - last > self.r.ttl, "a message is delivered once"
            self.delivered[c.msg_id] = self.now

    def whole_message(self, src: Source) -> int:
        cloves = self._new(src)
        for c in cloves:
            self._add(c)
        assert cloves[0].msg_id in self.delivered, "n authentic cloves in a row complete the message"
        return len(cloves)

    def authentic_clove(self, src: Source) -> int:
        if not self.pending or chance(src, 20):
            fresh = self._new(src)  # (not ``self.pending += self._new(src)``: _new may replace the list)
            self.pending += fresh
        c = self.pending.pop(src.int(0, len(self.pending) - 1))
        self._add(c)
        return 1

    def _victim(self, src: Source) -> sida.Clove:
        if self.pending and chance(src, 70):
            return choice(src, self.pending)
        return self._new(src)[0]

    def forged_clove(self, src: Source) -> int:
        """Self-consistent forgeries under a live message id: their fingerprints match."""
        c = self._victim(src)
        frag = src.bytes(len(c.fragment))
        share = src.bytes(32)
        fps = bytearray(c.fingerprints)
        fpl = sida.FP_LEN
        fps[c.index * fpl:(c.index + 1) * fpl] = crypto.blake2b(frag, size=fpl, person=b"gt-sida-frag")
        j = c.n + c.index
        fps[j * fpl:(j + 1) * fpl] = crypto.blake2b(share, size=fpl, person=b"gt-sida-share")
        self._add(sida.Clove(c.msg_id, c.index, c.n, c.k, frag, share, bytes(fps)))
        return 1

    def mutated_clove(self, src: Source) -> int:
        """A clove with fields replaced by other cloves' or odd values (ill-formed ones too)."""
        c = self._victim(src)
        other = self._victim(src)
        fields: list[Any] = [c.msg_id, c.index, c.n, c.k, c.fragment, c.share, c.fingerprints]  # then any value
        for _ in range(src.int(1, 3)):
            i = src.int(0, 6)
            pick = src.int(0, 2)
            if pick == 0:
                fields[i] = [other.msg_id, other.index, other.n, other.k, other.fragment, other.share,
                             other.fingerprints][i]
            elif pick == 1 and isinstance(fields[i], bytes):
                fields[i] = mutate.mutate_bytes(src, fields[i])
            elif isinstance(fields[i], int):
                fields[i] = choice(src, (-1, 0, 1, 16, 17, 255, 2**63))
        self._add(sida.Clove(*fields))
        return 1

    def decoded_clove(self, src: Source) -> int:
        """What ``decode_clove`` lets through from a mutated payload."""
        c = self._victim(src)
        _, data = mutate.payload(src, [sida.encode_clove(c)])
        try:
            got = sida.decode_clove(data)
        except codec.RemoteProtocolError:
            self.rejected += 1
            return 1
        self._add(got)
        return 1

    def expire(self, src: Source) -> int:
        self.now += choice(src, (0.0, 1.0, 10.0, 31.0))
        self.r.expire(self.now)
        return 0

    def check(self) -> None:
        r = self.r
        assert len(r) <= r.max_messages
        assert 0 <= r.bytes_held <= r.max_bytes
        assert all(v >= 0 for v in r.stats.values())
        assert r.bytes_held == sum(p.used for p in r._pending.values())
        assert len(r._finished) <= r.max_messages


class GroupTarget(Target):
    """``GroupState.on_message`` (paper §3.3 state sync) fed an honest peer's rounds interleaved
    with hostile messages from another member and from non-members: never raises; everything it
    asks to send is valid; the honest peer's load reports keep being applied; the table holds
    members only and the tree stays within its per-node bound."""

    NAME = "group"
    STATEFUL = True
    STEPS = ("honest_round", "hostile_member", "hostile_stranger", "tick", "advance")

    def __init__(self) -> None:
        super().__init__()
        self.me, self.honest, self.bad, self.other = (bytes([b]) * 20 for b in (0x20, 0x30, 0x10, 0x40))
        members = [self.me, self.honest, self.bad, self.other]
        self.state = GroupState(self.me, members, capacity=3, initial_seq=1000)
        self.peer = GroupState(self.honest, members, capacity=5, initial_seq=1000)
        self.peer.set_local_prefixes([list(range(i, i + 300)) for i in range(0, 40, 7)])
        self.now = 0.0
        self.corpus: list[bytes] = []
        self.round = 0

    def state_size(self) -> int:
        return len(self.state.peers) + sum(len(self.state.tree.paths(p)) for p in self.state.members)

    def _feed(self, peer: bytes, msg: Any) -> list[Send]:
        out = self.state.on_message(peer, msg, self.now)
        _sends_ok(out)
        return out

    def honest_round(self, src: Source) -> int:
        self.peer.set_local_load(Load(active=src.int(0, 5), queued=src.int(0, 5), capacity=5))
        sends = [s for s in self.peer.tick(self.now) if s.peer == self.me]
        for s in sends:
            self._feed(self.honest, s.msg)
        self.corpus = [codec.encode(s.msg) for s in sends] or self.corpus
        st = self.state.peers.get(self.honest)
        assert st is not None and st.load_seq == self.peer.seq, "the honest peer's report must be applied"
        return len(sends)

    def _hostile(self, src: Source, peer: bytes) -> int:
        corpus = self.corpus + _encoded_corpus([LoadReport, SubtreeUpdate, LengthProposal, SubtreeRequest], 1,
                                               seed=self.round)
        self.round += 1
        _, data = mutate.payload(src, corpus)
        try:
            msg = codec.decode(data)
        except codec.RemoteProtocolError:
            self.rejected += 1
            return 1
        before = sum(self.state.dropped.values())
        out = self._feed(peer, msg)
        if peer not in self.state.members:
            assert not out and sum(self.state.dropped.values()) == before + 1
        return 1

    def hostile_member(self, src: Source) -> int:
        return self._hostile(src, self.bad)

    def hostile_stranger(self, src: Source) -> int:
        return self._hostile(src, src.bytes(20))

    def tick(self, src: Source) -> int:
        _sends_ok(self.state.tick(self.now))
        return 0

    def advance(self, src: Source) -> int:
        self.now += choice(src, (0.5, 5.0, 20.0))
        return 0

    def check(self) -> None:
        s = self.state
        assert set(s.peers) <= s.members - {self.me}
        assert set(s.quarantined) <= s.members
        for p in s.members:
            assert len(s.tree.paths(p)) <= s.config.max_paths_per_node
        assert not math.isnan(sum(ld.relative for ld in s.table().values()))


class CommitteeTarget(Target):
    """The committee core (``CommitteeApp``: CheckTx, PrepareProposal, FinalizeBlock, Commit) fed
    blocks that mix valid registrations with hostile transactions: never raises; one result per
    transaction; a valid registration after hostile ones is applied; two verifiers fed the same
    blocks agree on every app hash (determinism)."""

    NAME = "committee"
    STATEFUL = True
    STEPS = ("check_tx", "block")

    def __init__(self) -> None:
        super().__init__()
        vals = [Validator("ed25519", bytes([i]) * 32, 10) for i in range(4)]
        self.apps = [CommitteeApp(), CommitteeApp()]
        for a in self.apps:
            a.init_chain(CHAIN, vals)
        self.height = 0
        self.nodes: list[Node] = []
        self.time = T0

    def state_size(self) -> int:
        return len(self.apps[0].committed.nodes)

    def _hostile(self, src: Source) -> bytes:
        n = Node(port=10_000 + len(self.nodes))
        corpus = [n.register(), n.update(), n.leave(), n.sign_tx(vtx.OP_REGISTER, n.entry(), seq=2**40)]
        return mutate.payload(src, corpus)[1]

    def check(self) -> None:
        a, b = self.apps
        assert a.app_hash == b.app_hash and a.height == b.height

    def check_tx(self, src: Source) -> int:
        raw = self._hostile(src)
        for a in self.apps:
            r = a.check_tx(raw)
            assert isinstance(r.code, int)
        return 1

    def block(self, src: Source) -> int:
        txs = [self._hostile(src) for _ in range(src.int(0, 4))]
        good = Node(port=20_000 + len(self.nodes))
        self.nodes.append(good)
        reg = good.register()
        txs.insert(src.int(0, len(txs)), reg)
        self.height += 1
        self.time += src.int(0, 100)
        prepared = self.apps[0].prepare_proposal(txs, 1 << 20, self.time, self.height)
        assert reg in prepared, "the valid registration is proposed"
        hashes = []
        for a in self.apps:
            assert a.process_proposal(prepared, self.time, self.height) in (True, False)
            results, app_hash = a.finalize_block(self.height, self.time, txs)
            assert len(results) == len(txs)
            a.commit()
            hashes.append(app_hash)
        assert hashes[0] == hashes[1], "verifiers must agree on the app hash"
        assert good.node_id in self.apps[0].committed.nodes, "a valid registration is applied"
        return len(txs)


class AuditTxTarget(Target):
    """Audit transactions (``verifier.audit.tx.decode_audit_tx``, then ``CommitteeApp.check_tx``
    on an app with audits on, in an epoch's report window: three validators' plans committed, one
    report on the chain with replies and failed challenges). Contract: decoding raises only
    :class:`TxError` with a code and decodes only the signed corpus; ``check_tx`` answers every
    input with a :class:`Result`, accepts exactly the corpus transactions it accepted unmutated,
    and never changes the state."""

    NAME = "audit_tx"
    STEPS = ("feed",)

    def __init__(self) -> None:
        super().__init__()
        c = Committee()
        c.to_epoch_start(1)
        plans = [c.plan(pk) for pk in c.pks()[:3]]
        c.block([c.commit_tx(p) for p in plans])
        c.to_height(c.audit.report_from() - 1)
        silent = plans[0].items[0][0]
        entries = [at.ReportEntry(n, op, at.FailOutcome("silent", 3)) if n == silent else e
                   for (n, op), e in zip(plans[0].items, c.answers(plans[0]), strict=True)]
        c.block([c.report_tx(plans[0], entries)])
        late = c.plan(c.pks()[3])
        scores = [(plans[0].items[0][0], (900_000, 120_000)), (plans[0].items[-1][0], (1_000_000,))]
        transcripts = [c.sign(at.TranscriptScores(c.audit.epoch, p.pk, tuple(sorted(scores))), p.pk)
                       for p in plans[:2]]  # the first follows its validator's report; the second has none yet
        self.corpus = [c.commit_tx(late), c.report_tx(plans[0], entries), c.report_tx(plans[1], c.answers(plans[1])),
                       c.report_tx(plans[2], plans[2].failed()), *transcripts]
        self.kinds = [at.KIND_COMMIT, at.KIND_REPORT, at.KIND_REPORT, at.KIND_REPORT, at.KIND_TRANSCRIPTS,
                      at.KIND_TRANSCRIPTS]
        for raw, kind in zip(self.corpus, self.kinds, strict=True):
            assert at.decode_audit_tx(raw, CHAIN).KIND == kind
        self.bodies = [raw[len(at.AUDIT_TAG):] for raw in self.corpus]
        self.app = c.app
        self.state = self.app.committed.canonical_bytes()
        self.accepted = {raw for raw in self.corpus if self.app.check_tx(raw).ok}
        assert len(self.accepted) == 3, "the two fresh reports and the reported validator's transcripts are valid"

    def feed(self, src: Source) -> int:
        if chance(src, 10):  # the tag itself mutated too
            _, data = mutate.payload(src, self.corpus)
        else:  # structure mutations need the msgpack body without the tag
            _, body = mutate.payload(src, self.bodies)
            data = at.AUDIT_TAG + body
        try:
            at.decode_audit_tx(data, CHAIN)
        except vtx.TxError as exc:
            assert isinstance(exc.code, vtx.Code) and exc.code != vtx.Code.OK
            self.rejected += 1
        else:
            assert data in self.corpus, "only a transaction its validator signed decodes"
        result = self.app.check_tx(data)
        assert isinstance(result, Result) and isinstance(result.code, vtx.Code)
        assert result.ok == (data in self.accepted), "check_tx accepts exactly the valid corpus"
        assert result.ok or result.log, "a refusal says why"
        assert self.app.committed.canonical_bytes() == self.state, "check_tx never changes the state"
        return 1


def _flip(src: Source, data: bytes) -> bytes:
    """``data`` with one bit flipped (one byte if it is empty)."""
    if not data:
        return b"\x01"
    i = src.int(0, len(data) - 1)
    return data[:i] + bytes([data[i] ^ (1 << src.int(0, 7))]) + data[i + 1:]


class ReplyTarget(Target):
    """Signed replies (``overlay.anon.signing.ReplyChecker.check``): an honest multi-chunk reply passes;
    a sequence that is not a prefix of it (text, token ids, chain, signature, signing time or final
    flag altered; chunks reordered, dropped, duplicated, merged, or foreign ones inserted: random,
    with a right chain but a wrong key, or from the same node's reply to another request) raises
    :class:`ReplyVerifyError` at the first altered chunk and nothing else, and every chunk before
    it passes. A prefix passes chunk by chunk: only its final flag tells a client it is whole."""

    NAME = "reply"
    STEPS = ("feed",)
    MODEL = "smollm2-135m"
    TEXTS = ("", "The", " answer", " is 7.", "caf\u00e9", "\u2603\U0001f600", "\ud800", "\x00", "a" * 300)

    def __init__(self) -> None:
        super().__init__()
        self.key = crypto.SigningKey.generate()
        self.other_key = crypto.SigningKey.generate()
        self.node_id = node_id_of(self.key.public_bytes)
        self.digest, self.other_digest = (
            request_digest(Request(bytes(16), self.MODEL, (ChatMessage("user", q),), SamplingParams(), 1, (), ""),
                           self.node_id)
            for q in ("What is 3 plus 4?", "What is 3 plus 5?"))

    def _reply(self, src: Source, digest: bytes, key: crypto.SigningKey, n: int) -> list[tuple[Any, ...]]:
        """``n`` chunks (text, ids, final, chain, signature, signed_at_ms) as ``key``'s node signs them."""
        signer = ReplySigner(digest, self.MODEL, self.node_id)
        out: list[tuple[Any, ...]] = []
        t = T0 * 1000 + src.int(0, 10**6)
        for i in range(n):
            text = choice(src, self.TEXTS)
            ids = tuple(src.int(0, 2**32 - 1) if chance(src, 10) else src.int(0, 49_151)
                        for _ in range(src.int(0, 4)))
            t += src.int(0, 3000)
            chain, sig = signer.add(text, ids, i == n - 1, t, key.sign)
            out.append((text, ids, i == n - 1, chain, sig, t))
        return out

    def _altered(self, src: Source, c: tuple[Any, ...], prev_chain: bytes) -> tuple[Any, ...]:
        text, ids, final, chain, sig, t = c
        what = src.int(0, 5)
        if what == 0:
            text = choice(src, (text + "!", text[:-1], "", choice(src, self.TEXTS), text.upper()))
        elif what == 1:
            bad = choice(src, (0, 1, -1, 2**32, 2**64 - 1, -(2**63)))
            ids = choice(src, ((*ids, bad), ids[:-1], (bad, *ids[1:]), tuple(reversed(ids))))
        elif what == 2:
            chain = choice(src, (src.bytes(32), chain[:-1], b"", chain + b"\x00", prev_chain, _flip(src, chain)))
        elif what == 3:
            sig = choice(src, (src.bytes(64), sig[:-1], b"", sig + b"\x00", _flip(src, sig), self.other_key.sign(b"x")))
        elif what == 4:
            t = choice(src, (t + 1, t - 1, 0, -1, 2**64, 2**64 - 1))
        else:
            final = not final
        return (text, ids, final, chain, sig, t)

    def _foreign(self, src: Source, prev_chain: bytes, index: int) -> tuple[Any, ...]:
        """A chunk the node did not sign for this position of this reply."""
        text = choice(src, self.TEXTS)
        ids = tuple(src.int(0, 49_151) for _ in range(src.int(0, 3)))
        final = chance(src, 50)
        t = T0 * 1000 + src.int(0, 10**6)
        chain = chain_next(prev_chain, text, ids)
        how = src.int(0, 3)
        if how == 0:  # random bytes throughout
            return (text, ids, final, src.bytes(src.int(0, 33)), src.bytes(src.int(0, 65)), src.int(0, 2**64 - 1))
        if how == 1:  # the right chain, a made-up signature
            return (text, ids, final, chain, src.bytes(64), t)
        if how == 2:  # the right chain, signed by another node's key
            return (text, ids, final, chain,
                    self.other_key.sign(reply_signing_bytes(self.digest, chain, final, self.MODEL, self.node_id, t)), t)
        other = self._reply(src, self.other_digest, self.key, index + 1)  # the node's reply to another request
        return other[index]

    def feed(self, src: Source) -> int:
        honest = self._reply(src, self.digest, self.key, src.int(1, 6))
        chains = [chain_start(self.digest)] + [c[3] for c in honest]  # chains[i]: the chain before chunk i
        seq = list(honest)
        if chance(src, 80):
            for _ in range(src.int(1, 3)):
                op = src.int(0, 5)
                i = src.int(0, max(0, len(seq) - 1))
                if op == 0 and seq:  # one field altered
                    seq[i] = self._altered(src, seq[i], chains[min(i, len(chains) - 1)])
                elif op == 1 and len(seq) > 1:  # two chunks swapped
                    j = src.int(0, len(seq) - 1)
                    seq[i], seq[j] = seq[j], seq[i]
                elif op == 2 and seq:  # a chunk dropped
                    del seq[i]
                elif op == 3 and seq:  # a chunk duplicated
                    seq.insert(i, seq[i])
                elif op == 4 and i + 1 < len(seq):  # two chunks merged into one, the later one's signature
                    a, b = seq[i], seq[i + 1]
                    seq[i:i + 2] = [(a[0] + b[0], a[1] + b[1], *b[2:])]
                else:  # a foreign chunk
                    seq.insert(i, self._foreign(src, chains[min(i, len(chains) - 1)], i))
        first = next((i for i, (a, b) in enumerate(zip(seq, honest, strict=False)) if a != b),
                     None if len(seq) <= len(honest) else len(honest))
        checker = ReplyChecker(self.digest, self.MODEL, self.node_id, self.key.public_bytes)
        for i, c in enumerate(seq):
            try:
                checker.check(c[0], c[1], c[2], c[3], c[4], c[5])
            except ReplyVerifyError:
                assert i == first, f"chunk {i} refused, the first altered one is {first}"
                self.rejected += 1
                return len(seq)
        assert first is None and seq == honest[:len(seq)], f"an altered reply (first altered chunk {first}) passed"
        assert checker.chunks == len(seq)
        assert (bool(seq) and seq[-1][2]) == (seq == honest), "only the whole reply ends with its final chunk"
        return len(seq)


def _count(obj: Any) -> int:
    """The items of a msgpack tree, itself included."""
    return 1 + sum(_count(v) for v in obj) if isinstance(obj, list) else 1


def _loose_pack(obj: Any, at: list[int]) -> bytes:
    """``obj`` as msgpack, its item number ``at[0]`` (in :func:`_count`'s order) in the widest
    encoding of its type (an int as an int64 or uint64, a bin, str or array header of 32 bits):
    a non-canonical encoding of the same values, where the type has a wider one."""
    wide = at[0] == 0
    at[0] -= 1
    if isinstance(obj, list):
        n = len(obj)
        head = (b"\xdd" + n.to_bytes(4, "big") if wide or n > 0xFFFF else bytes([0x90 | n]) if n <= 15
                else b"\xdc" + n.to_bytes(2, "big"))
        return head + b"".join(_loose_pack(v, at) for v in obj)
    if not wide or isinstance(obj, bool):
        return mutate.pack(obj)
    if isinstance(obj, int):
        return b"\xcf" + obj.to_bytes(8, "big") if obj >= 0 else b"\xd3" + obj.to_bytes(8, "big", signed=True)
    if isinstance(obj, bytes):
        return b"\xc6" + len(obj).to_bytes(4, "big") + obj
    if isinstance(obj, str):
        raw = obj.encode("utf-8", errors="surrogatepass")
        return b"\xdb" + len(raw).to_bytes(4, "big") + raw
    return mutate.pack(obj)


class TranscriptWireTarget(Target):
    """A donor's transcript commit and reveal at a verifier (``overlay.directory.transcripts.decode_commit``,
    ``decode_reveal``, then ``verify_commit`` / ``verify_reveal``; decision 0015). Contract: only
    :class:`TranscriptError` with a reason is raised; what decodes is canonical (it encodes back to
    exactly the input); only the donor-signed corpus verifies with the donor's key.

    ``feed_escrow``: version 2 (decision 0037), every decoder of the module on escrowed commits,
    acceptances, certificates, node reveals, released shares and reveals of kind 2, whole or with
    the msgpack nested in their bins (points, acceptances, shares) mutated. Contract: as above, and
    only the corpus verifies with its signer's key (the donor's, the verifier's, the node's); sealed
    shares open only to the corpus's; a certificate certifies power only for the corpus's
    commitment, points and sent_ms, at most the validators' total, never raising."""

    NAME = "transcript_wire"
    STEPS = ("feed", "feed_escrow")

    def __init__(self) -> None:
        super().__init__()
        donor, node = Identity.generate(), Identity.generate()
        verifier = crypto.SigningKey.generate().public_bytes
        self.key = donor.ed25519_public
        body = tw.Revealed(node.node_id, b"\x01" * 16, "echo", (ChatMessage("system", "be brief"),
                                                               ChatMessage("user", "why is the sky blue?")),
                           SamplingParams(0.7, 1.0, 0, 64, None), b"\x02" * 16, node.node_id,
                           (("Rayleigh", (5, 6)), (" scattering", (7,))), b"\x03" * 64, T0 * 1000)
        self.corpus = [tw.encode_commit(donor, donor.node_id, verifier, T0 * 1000, b"\x09" * 32),
                       tw.encode_reveal(donor, donor.node_id, verifier, body),
                       tw.encode_reveal(donor, donor.node_id, verifier, tw.NoReply(b"\x07" * 32)),
                       tw.encode_reveal(donor, donor.node_id, verifier, dataclasses.replace(body, chunks=()))]
        self._escrow_corpus(donor, node, body)

    def _escrow_corpus(self, donor: Identity, node: Identity, body: tw.Revealed) -> None:
        rng = random.Random(37)
        self.donor, self.node = donor, node
        self.verifiers = [crypto.SigningKey.from_bytes(bytes([i + 1]) * 32) for i in range(3)]
        self.powers = {k.public_bytes: p for k, p in zip(self.verifiers, (1, 2, 3), strict=True)}
        secret = escrow.new_secret(rng)
        d = escrow.deal(secret, escrow.plan([1, 2, 3]), rng)
        points = escrow.encode_commitments(d.commitments)
        self.bound = (donor.node_id, b"\x09" * 32, T0 * 1000, tw.points_digest(points))
        v0 = self.verifiers[0]
        kind2 = dataclasses.replace(body, nonce=escrow.nonce_of(secret), secret=escrow.scalar_bytes(secret))
        self.shares = d.shares[0]
        self.acceptances = [tw.encode_acceptance(k, k.public_bytes, donor.node_id, b"\x09" * 32, self.bound[3],
                                                 T0 * 1000) for k in self.verifiers]
        self.signed_by = {  # what verifies, and with which key
            tw.encode_escrow_commit(donor, donor.node_id, v0.public_bytes, T0 * 1000, b"\x09" * 32, points,
                                    self.shares): donor.ed25519_public,
            **{a: k.public_bytes for a, k in zip(self.acceptances, self.verifiers, strict=True)},
            tw.encode_node_reveal(node, node.node_id, v0.public_bytes, kind2): node.ed25519_public,
            tw.encode_reveal(donor, donor.node_id, v0.public_bytes, kind2): donor.ed25519_public,
        }
        self.escrow_corpus = [
            *self.signed_by,
            tw.encode_certificate(donor.node_id, b"\x09" * 32, T0 * 1000, points, self.acceptances),
            tw.encode_released(7, [(b"\x05" * 32, d.commitments, d.shares[1]),
                                   (b"\x06" * 32, d.commitments, d.shares[2])]),
            *self.corpus,
        ]

    def _nested(self, src: Source, data: bytes) -> bytes:
        """``data`` (a corpus item) with a bin that holds msgpack (points, an acceptance, shares)
        mutated in place, the rest as it was."""
        tree = mutate.unpack(data)
        bins: list[tuple[list[Any], int]] = []

        def walk(node: Any) -> None:
            if isinstance(node, list):
                for i, v in enumerate(node):
                    if isinstance(v, bytes) and len(v) > 1 and v[0] in (0x90, 0x91, 0x92, 0x93, 0x94, 0x95, 0x96,
                                                                        0x97, 0x98, 0x99, 0x9A, 0x9B, 0x9C, 0x9D,
                                                                        0x9E, 0x9F, 0xDC):
                        bins.append((node, i))
                    walk(v)

        walk(tree)
        if not bins:
            return data
        node, i = choice(src, bins)
        node[i] = mutate.payload(src, [node[i]])[1]
        return mutate.pack(tree)

    def feed(self, src: Source) -> int:
        _, data = mutate.payload(src, self.corpus)
        for decode in (tw.decode_commit, tw.decode_reveal):
            try:
                m = decode(data)
            except tw.TranscriptError as exc:
                assert exc.reason, "a refusal says why"
                self.rejected += 1
                continue
            assert msgpack.packb([tw.TRANSCRIPT_VERSION, *m.signed(), m.signature], use_bin_type=True) == data, (
                "one encoding per message")
            try:
                if isinstance(m, tw.Commit):
                    tw.verify_commit(m, self.key)
                else:
                    tw.verify_reveal(m, self.key)
            except tw.TranscriptError:
                self.rejected += 1
            else:
                assert data in self.corpus, "only what the donor signed verifies"
        return 1


    def feed_escrow(self, src: Source) -> int:
        _, data = mutate.payload(src, self.escrow_corpus)
        if chance(src, 30):
            data = self._nested(src, choice(src, self.escrow_corpus))
        elif chance(src, 15):  # the same values, one of them in a wider encoding than msgpack's shortest
            tree = mutate.unpack(choice(src, self.escrow_corpus))
            data = _loose_pack(tree, [src.int(0, _count(tree) - 1)])
        decoders: tuple[Any, ...] = (tw.decode_commit, tw.decode_reveal, tw.decode_escrow_commit, tw.decode_acceptance,
                                     tw.decode_certificate, tw.decode_node_reveal, tw.decode_released)
        for decode in decoders:
            try:
                m = decode(data)
            except tw.TranscriptError as exc:
                assert exc.reason, "a refusal says why"
                self.rejected += 1
                continue
            assert self._encoded(m) == data, "one encoding per message"
            self._check(m, data)
        return 1

    @staticmethod
    def _encoded(m: Any) -> bytes:
        if isinstance(m, tw.Commit | tw.Reveal):
            wire: list[Any] = [tw.TRANSCRIPT_VERSION, *m.signed(), m.signature]
        elif isinstance(m, tw.NodeReveal):
            wire = [tw.ESCROW_VERSION, *m.signed(), m.signature]
        elif isinstance(m, tuple):  # released shares
            return tw.encode_released(m[0], m[1])
        else:
            wire = m.wire()
        out: bytes = msgpack.packb(wire, use_bin_type=True)
        return out

    def _check(self, m: Any, data: bytes) -> None:
        if isinstance(m, tw.Certificate):
            power = tw.certified_power(m, self.powers)
            assert 0 <= power <= sum(self.powers.values())
            assert not power or (m.donor, m.value, m.sent_ms, tw.points_digest(m.points_raw)) == self.bound, (
                "only what the verifiers accepted is certified")
            return
        if isinstance(m, tuple):
            return
        if isinstance(m, tw.EscrowCommit):
            try:
                shares = tw.open_shares(self.verifiers[0].private_bytes(), m)
            except tw.TranscriptError as exc:
                assert exc.reason
            else:
                assert shares == self.shares or data not in self.signed_by, "the corpus's shares open as sealed"
        verify: Any = {tw.Commit: tw.verify_commit, tw.Reveal: tw.verify_reveal,
                       tw.EscrowCommit: tw.verify_escrow_commit, tw.Acceptance: tw.verify_acceptance,
                       tw.NodeReveal: tw.verify_node_reveal}[type(m)]
        keys = {self.key, self.node.ed25519_public, *self.powers}
        for key in keys:
            try:
                verify(m, key)
            except tw.TranscriptError:
                self.rejected += 1
            else:
                assert self.signed_by.get(data) == key or (data in self.corpus and key == self.key), (
                    "only what its signer signed verifies, with its signer's key")


class QuotaWireTarget(Target):
    """Anonymous usage quotas at a verifier (issue 31): ``overlay.directory.quota``'s ``decode_*``
    and ``verify_*``, and ``verifier.quota.Issuer``'s ``/quota/key``, ``/quota/issue`` and
    ``/quota/redeem``. Contract: the decoders raise only :class:`QuotaError` with a reason; what
    decodes is canonical (it encodes back to exactly the input); only what the user or the issuer
    signed verifies; the issuer answers every input with a code and a reason and never raises,
    issues only for the user's signed request, and spends only the outputs it evaluated, once."""

    NAME = "quota_wire"
    STEPS = ("feed", "query")
    MODEL = "echo"

    def __init__(self) -> None:
        super().__init__()
        signer, self.user = crypto.SigningKey.generate(), Identity.generate()
        self.issuer = Issuer.of_validator(signer, CHAIN, qw.QuotaParams(tokens=100_000, burst=100_000))
        self.now = float(T0)
        epoch = self.issuer.params.epoch_at(self.now)
        b = qw.Blinding(qw.new_nonces(2))
        self.issue = qw.encode_issue(self.user.signing, CHAIN, qw.IssueRequest(
            self.user.node_id, signer.public_bytes, self.MODEL, epoch, b.blinded))
        code, why, answer = self.issuer.issue(self.issue, self.now, self.user_key, self.listed)
        assert code == vtx.Code.OK, why
        record = self.issuer.key_record(self.MODEL, epoch)
        outputs = b.finalize(qw.decode_issued(answer), qw.decode_key_record(record).key)
        tokens = [qw.Token(self.MODEL, epoch, n, ((signer.public_bytes, o),)) for n, o in zip(b.nonces, outputs,
                                                                                            strict=True)]
        self.redeems = {t.redeem(signer.public_bytes) for t in tokens}
        self.spent: set[bytes] = set()
        relabelled = qw.Token(self.MODEL, epoch, tokens[0].nonce, tokens[0].evaluations, priority=True)
        self.corpus = [record, self.issue, answer, qw.encode_token(tokens[0]), *sorted(self.redeems),
                       qw.encode_key_query(self.MODEL, epoch), qw.encode_token(relabelled),
                       relabelled.redeem(signer.public_bytes)]  # the other class: decodes, never spends

    def user_key(self, node_id: bytes) -> bytes | None:
        return self.user.ed25519_public if node_id == self.user.node_id else None

    def listed(self, model: str) -> bool:
        return model == self.MODEL

    def feed(self, src: Source) -> int:
        _, data = mutate.payload(src, self.corpus)
        for decode in (qw.decode_key_record, qw.decode_issue, qw.decode_issued, qw.decode_token, qw.decode_redeem,
                       qw.decode_key_query):
            try:
                m = decode(data)
            except qw.QuotaError as exc:
                assert exc.reason, "a refusal says why"
                self.rejected += 1
                continue
            wire = list(m) if isinstance(m, tuple) else m.wire()
            assert msgpack.packb(wire, use_bin_type=True) == data, "one encoding per message"
            self._verify(m, data)
        return 1

    def _verify(self, m: object, data: bytes) -> None:
        try:
            if isinstance(m, qw.KeyRecord):
                qw.verify_key_record(m, CHAIN)
            elif isinstance(m, qw.IssueRequest):
                qw.verify_issue(m, CHAIN, self.user.ed25519_public)
            else:
                return
        except qw.QuotaError:
            self.rejected += 1
        else:
            assert data in self.corpus, "only what the user or the issuer signed verifies"

    def query(self, src: Source) -> int:
        _, data = mutate.payload(src, self.corpus)
        code, why, value = self.issuer.key_query(data, self.now)
        # a record for OK, and for WRONG_EPOCH (the current epoch's); nothing else has a value
        assert (code in (vtx.Code.OK, vtx.Code.WRONG_EPOCH)) == bool(value) and (code == vtx.Code.OK or why)
        code, why, value = self.issuer.issue(data, self.now, self.user_key, self.listed)
        assert code != vtx.Code.OK or data == self.issue, "only the user's signed request is answered"
        assert code == vtx.Code.OK or (why and value == b"")
        code, why = self.issuer.redeem(data, self.now)
        if code == vtx.Code.OK:
            assert data in self.redeems and data not in self.spent, "only an issued output spends, once"
            self.spent.add(data)
        else:
            assert why
            self.rejected += 1
        return 3


STATELESS: tuple[type[Target], ...] = (CodecTarget, FramingTarget, HandshakeTarget, OnionTarget, SealTarget,
                                       CloveTarget, RequestTarget, TxTarget, AbciFramingTarget, ListTarget,
                                       GatewayTarget, AuditTxTarget, ReplyTarget, TranscriptWireTarget,
                                       QuotaWireTarget)
STATEFUL: tuple[type[Target], ...] = (RelayTarget, ReassemblerTarget, GroupTarget, CommitteeTarget)
ALL: tuple[type[Target], ...] = STATELESS + STATEFUL
