"""Shared helpers for committee tests: node keys and signed registration transactions."""

from __future__ import annotations

from dataclasses import dataclass, field

from overlay import crypto
from overlay.identity import node_id_of
from verifier import tx

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

    def entry(self, role: int = tx.ROLE_USER, *, region: str = "eu-west", address: str | None = None,
              model_id: str = "", capacity: int = 0) -> tx.Entry:
        if role == tx.ROLE_MODEL and not model_id:
            model_id, capacity = "smollm2-135m", capacity or 5
        return tx.Entry(role, self.x25519, address or f"127.0.0.1:{self.port}", region, model_id, capacity)

    def sign_tx(self, op: int, entry: tx.Entry | None = None, *, seq: int | None = None, chain: str = CHAIN) -> bytes:
        if seq is None:
            self.seq += 1
            seq = self.seq
        return tx.make_tx(self.key, chain, op, seq, entry)

    def register(self, role: int = tx.ROLE_USER, **kw: object) -> bytes:
        return self.sign_tx(tx.OP_REGISTER, self.entry(role, **kw))  # type: ignore[arg-type]

    def update(self, role: int = tx.ROLE_USER, **kw: object) -> bytes:
        return self.sign_tx(tx.OP_UPDATE, self.entry(role, **kw))  # type: ignore[arg-type]

    def leave(self) -> bytes:
        return self.sign_tx(tx.OP_LEAVE)
