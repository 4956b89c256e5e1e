"""Shared helpers for committee tests: node keys and signed registration transactions."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from overlay.directory import registration as tx
from overlay.wire import crypto
from overlay.wire.constants import ROLE_MODEL, ROLE_USER
from overlay.wire.identity import node_id_of

if TYPE_CHECKING:
    from overlay.directory.membership import CommitteeSettings
    from overlay.wire.clock import Clock
    from verifier.admission import AdmissionParams
    from verifier.app import Result

CHAIN = "gt-test-chain"


@dataclass
class Node:
    """A node that signs its own transactions and keeps its seq, as a real client does."""

    key: crypto.SigningKey = field(default_factory=crypto.SigningKey.generate)
    x25519: bytes = field(default_factory=lambda: crypto.X25519Key.generate().public_bytes)
    seq: int = 0
    port: int = 9000

    @property
    def node_id(self) -> bytes:
        return node_id_of(self.key.public_bytes)

    def entry(self, role: int = ROLE_USER, *, region: str = "eu-west", address: str | None = None,
              model_id: str = "", capacity: int = 0) -> tx.Entry:
        if role == ROLE_MODEL and not model_id:
            model_id, capacity = "smollm2-135m", capacity or 5
        return tx.Entry(role, self.x25519, address or f"127.0.0.1:{self.port}", region, model_id, capacity)

    def sign_tx(self, op: int, entry: tx.Entry | None = None, *, seq: int | None = None, chain: str = CHAIN) -> bytes:
        if seq is None:
            self.seq += 1
            seq = self.seq
        return tx.make_tx(self.key, chain, op, seq, entry)

    def register(self, role: int = ROLE_USER, **kw: Any) -> bytes:
        return self.sign_tx(tx.OP_REGISTER, self.entry(role, **kw))

    def update(self, role: int = ROLE_USER, **kw: Any) -> bytes:
        return self.sign_tx(tx.OP_UPDATE, self.entry(role, **kw))

    def leave(self) -> bytes:
        return self.sign_tx(tx.OP_LEAVE)


class InProcessCommittee:
    """A committee of ``n`` validator keys around one in-process :class:`verifier.app.CommitteeApp`,
    answering the CometBFT RPC calls nodes make (``abci_query``, ``broadcast_tx_commit``) and the
    signed-list fetches, with blocks run the way CometBFT runs them (vote extensions, certificates).
    ``now`` is the block time in seconds; every committed transaction is followed by empty heights
    so the signed lists cover it."""

    def __init__(self, n: int = 4, chain: str = CHAIN, admission: AdmissionParams | None = None, *,
                 probe_all: bool = False, clock: Clock | None = None) -> None:
        """``admission``: the genesis's :class:`verifier.admission.AdmissionParams` (None: none, open
        admission); ``probe_all``: every validator reports every pending registration reached, as
        soon as it is committed (its address answered with its key). ``clock``: an
        :class:`overlay.wire.clock.Clock` the block time follows (:meth:`tick`), as a running chain's
        empty blocks do; inside trio without one, :class:`overlay.wire.clock.TrioClock`'s."""
        import json

        from overlay.directory.lists import ValidatorKey
        from verifier.app import CommitteeApp, Validator

        self.chain = chain
        self.keys = [crypto.SigningKey.generate() for _ in range(n)]
        self.pinned = [ValidatorKey(k.public_bytes, 10) for k in self.keys]
        self.app = CommitteeApp()
        state = b"" if admission is None else json.dumps({"admission": admission.to_json()}).encode()
        self.probe_all = probe_all
        self.app.init_chain(chain, [Validator("ed25519", k.public_bytes, 10) for k in self.keys], state)
        self.clock = clock
        self.now = int(clock.unix()) if clock is not None else 1_700_000_000
        self._votes: list[tuple[bytes, bytes]] = []
        self.sent: list[bytes] = []  # every transaction broadcast, accepted or not
        self.down = False  # True: every call raises OSError, as an unreachable verifier
        self.height()

    def height(self, txs: list[bytes] | None = None) -> tuple[int, list[Result]]:
        a, h = self.app, self.app.height + 1
        block = a.prepare_proposal(txs or [], 1 << 20, self.now, h, self._votes)
        block_hash = crypto.sha256(b"".join(block) + h.to_bytes(8, "big"))
        assert a.process_proposal(block, self.now, h, block_hash)
        self._votes = [(crypto.sha256(k.public_bytes)[:20], a.extend_vote(h, k, block_hash, block, self.now))
                       for k in self.keys]
        results, _ = a.finalize_block(h, self.now, block, block_hash)
        a.commit()
        return h, list(results)

    def probe(self, keys: list[crypto.SigningKey] | None = None) -> None:
        """``keys`` (default: every validator) report every pending registration reached."""
        from verifier.admission import make_probe_tx

        reached = sorted((p.node_id, p.seq) for p in self.app.committed.pending.values())
        if reached:
            self.height([make_probe_tx(k, self.chain, reached) for k in (self.keys if keys is None else keys)])

    def settle(self) -> None:
        """Two empty heights: the lists signed after them hold every committed transaction."""
        self.height()
        self.height()

    def tick(self) -> None:
        """Empty blocks up to the clock's time, when it is past the block time (in trio without a
        clock: trio's clock, anchored to the wall clock, as the nodes' own clocks are)."""
        clock = self.clock
        if clock is None:
            import trio

            from overlay.wire.clock import TrioClock

            try:
                trio.lowlevel.current_task()
            except RuntimeError:
                return
            clock = self.clock = TrioClock()
        unix = int(clock.unix())
        if unix > self.now:
            self.now = unix
            self.settle()

    async def rpc(self, address: str, method: str, params: dict[str, str]) -> object:
        import base64

        self.tick()
        if self.down:
            raise OSError(f"{address}: connection refused")
        if method == "status":
            return {"sync_info": {"latest_block_height": str(self.app.height), "catching_up": False}}
        if method == "abci_query":
            path = params["path"].strip('"')
            data = bytes.fromhex(params.get("data", "0x")[2:])
            res, value = self.app.query(path, data)
            return {"response": {"code": int(res.code), "log": res.log, "value": base64.b64encode(value).decode()}}
        if method == "broadcast_tx_commit":
            raw = bytes.fromhex(params["tx"][2:])
            self.sent.append(raw)
            check = self.app.check_tx(raw)
            if not check.ok:
                return {"check_tx": {"code": int(check.code), "log": check.log}, "tx_result": {"code": 0},
                        "height": "0"}
            h, results = self.height([raw])
            outcome = results[-1]
            if self.probe_all:
                self.probe()
            self.settle()
            return {"check_tx": {"code": 0}, "tx_result": {"code": int(outcome.code), "log": outcome.log},
                    "height": str(h)}
        raise OSError(f"no such method {method}")

    async def fetch(self, address: str, path: str) -> bytes:
        from overlay.directory.lists import ListError

        self.tick()
        if self.down:
            raise OSError(f"{address}: connection refused")
        res, value = self.app.query(path, b"")
        if not res.ok:
            raise ListError(f"{address} answered code {int(res.code)}: {res.log}")
        return value

    def settings(self, addresses: tuple[str, ...] = ("v0:26657", "v1:26657")) -> CommitteeSettings:
        from overlay.directory.membership import CommitteeSettings

        return CommitteeSettings(addresses, self.chain, tuple(self.pinned))
