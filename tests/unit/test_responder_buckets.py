"""A model node's per-proxy delivery limit (overlay/anon/responder.py) is kept per proxy identity:
an attacker who grinds a node id whose short id (the first 8 hex digits, 32 bits: minutes of
work) equals an honest proxy's cannot spend that proxy's tokens."""

from __future__ import annotations

import os

from overlay.anon.responder import Responder
from overlay.wire.clock import FakeClock
from overlay.wire.identity import Identity, short_id
from overlay.wire.messages import PROXY_PATH_ID_LEN, Deliver


class Conn:
    def __init__(self, peer_id: bytes) -> None:
        self.peer_id = peer_id
        self.peer = short_id(peer_id)


async def test_a_proxy_with_the_same_short_id_does_not_share_the_honest_proxys_bucket() -> None:
    responder = Responder(Identity.generate(), lambda peer, msg: True, lambda node_id: None,
                          delivers_per_s=0.001, deliver_burst=2.0, clock=FakeClock())
    honest = os.urandom(20)
    twin = honest[:4] + os.urandom(16)  # the attacker's ground id: same short id, another identity
    assert short_id(twin) == short_id(honest) and twin != honest
    junk = Deliver(os.urandom(PROXY_PATH_ID_LEN), b"not sealed")
    for _ in range(5):
        await responder.on_deliver(Conn(twin), junk)
    assert responder.dropped["deliver-rate-limited"] == 3  # the twin spent its own burst of 2
    await responder.on_deliver(Conn(honest), junk)
    assert responder.dropped == {"clove-unsealable": 3, "deliver-rate-limited": 3}  # the honest one still had tokens


