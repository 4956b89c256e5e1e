"""Address probes over real TLS on loopback (issue 28 item 2, decision 0014): a registration is
listed only where the registering key answers; a squatter that registers a running node's address
(or an address nobody serves) under its own key is never reached, so never listed."""

from __future__ import annotations

import json

import trio

from overlay.directory.registration import OP_REGISTER, Entry, make_tx
from overlay.net.node import Node as OverlayNode
from overlay.net.transport import TLSTransport
from overlay.wire import crypto
from overlay.wire.constants import ROLE_USER
from overlay.wire.identity import Identity
from verifier.admission import AdmissionParams
from verifier.app import CommitteeApp, Validator
from verifier.prober import ProbePlan, probe_once

CHAIN = "gt-probe"
T0 = 1_700_000_000


def committee() -> tuple[CommitteeApp, list[crypto.SigningKey]]:
    keys = [crypto.SigningKey.generate() for _ in range(4)]
    app = CommitteeApp()
    app.init_chain(CHAIN, [Validator("ed25519", k.public_bytes, 10) for k in keys],
                   json.dumps({"admission": AdmissionParams.local().to_json()}).encode())
    return app, keys


def block(app: CommitteeApp, txs: list[bytes]) -> list[int]:
    results, _ = app.finalize_block(app.height + 1, T0 + app.height, txs)
    app.commit()
    return [int(r.code) for r in results]


def register(app: CommitteeApp, ident: Identity, address: str) -> None:
    entry = Entry(ROLE_USER, ident.x25519.public_bytes, address, "r")
    assert block(app, [make_tx(ident.signing, CHAIN, OP_REGISTER, 1, entry)]) == [0]


async def test_only_the_key_that_answers_at_the_address_is_listed(nursery: trio.Nursery) -> None:
    app, keys = committee()
    owner = Identity.generate()
    node = OverlayNode(owner, TLSTransport(owner), ping_interval=0)
    address: str = await nursery.start(node.serve, "127.0.0.1", 0)
    squatter = Identity.generate()
    register(app, owner, address)
    register(app, squatter, "127.0.0.1:1")  # nothing listens there
    other = Identity.generate()  # claims the owner's running address under its own key
    register(app, other, address)  # pending entries reserve nothing: both await their probe

    sent: list[bytes] = []

    async def broadcast(raw: bytes) -> None:
        sent.append(raw)

    dial = TLSTransport(Identity.generate()).dial
    for key in keys:
        reached = await probe_once(app, ProbePlan(key.public_bytes), key, dial, broadcast, 0.0)
        assert reached == [(owner.node_id, 1)]
    assert block(app, sent) == [0, 0, 0, 5]  # the fourth comes after the owner is listed: REPLAYED
    assert owner.node_id in app.committed.nodes
    for stranger in (squatter, other):  # never reached, never listed; dropped when their probe time runs out
        assert stranger.node_id not in app.committed.nodes and stranger.node_id in app.committed.pending


async def test_a_failed_dial_waits_before_it_is_tried_again() -> None:
    app, keys = committee()
    ghost = Identity.generate()
    register(app, ghost, "127.0.0.1:1")
    plan = ProbePlan(keys[0].public_bytes, retry=10.0)
    dials: list[str] = []

    async def dial(address: str, node_id: bytes) -> object:
        dials.append(address)
        raise OSError("refused")

    async def broadcast(raw: bytes) -> None:
        raise AssertionError("nothing was reached")

    for now in (0.0, 5.0, 10.0):
        assert await probe_once(app, plan, keys[0], dial, broadcast, now) == []
    assert dials == ["127.0.0.1:1", "127.0.0.1:1"]  # at 0 and at 10, not at 5
