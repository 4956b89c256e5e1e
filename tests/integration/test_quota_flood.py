"""A flooding user uses up only its own quota (issue 31): two users with real wallets
(overlay/directory/wallet.py) fetching blind from real issuers (verifier/quota.py, behind an
in-process RPC, gentorrent.bench.quotas.Issuers), one echo model node redeeming at them, on trio's
mock clock. The flooder gets its allowance and is then refused before anything is sent
(QuotaExhausted, saying when the next token comes); the other user's requests are all answered
with its own tokens; the flooder's allowance grows back with time, not all at once."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from gentorrent.bench.quotas import Issuers
from model_node.testing import echo_node
from overlay.anon.client import AnonClient, QuotaExhausted
from overlay.directory.quota import QuotaParams
from overlay.testing import start_overlay
from overlay.wire.messages import ChatMessage, SamplingParams

PARAMS = QuotaParams(epoch_s=600, tokens=3, issuers=2, grace_s=60, burst=3)  # 2 issuers x 3 / 2: 3 requests at once


async def ask(client: AnonClient, text: str) -> str:
    chunks = [c async for c in client.request("echo", [ChatMessage("user", text)], SamplingParams(max_tokens=8),
                                              chunk_timeout=60)]
    return "".join(c.text for c in chunks)


async def test_a_flooder_uses_up_its_own_quota_and_another_user_is_still_served(autojump_clock: Any) -> None:
    issuers = Issuers(2, PARAMS)
    async with trio.open_nursery() as nursery:
        net = await start_overlay(nursery, 15, clients=2, models=[echo_node(redeemer=issuers.redeemer())])
        flooder, user = net.users[0], net.users[1]
        for u in (flooder, user):
            assert u.client is not None and u.paths is not None
            with trio.fail_after(60):
                await u.paths.wait_ready(u.client.n)
            u.client.quota = issuers.wallet(u)
        assert flooder.client is not None and user.client is not None
        answered = 0
        with pytest.raises(QuotaExhausted) as used_up:
            for i in range(50):
                assert await ask(flooder.client, f"flood {i}") == f"flood {i}"
                answered += 1
        assert answered == 3 and "the next token can be had in 200 s" in str(used_up.value)
        assert used_up.value.wait_s == pytest.approx(200, abs=1)  # one token every 600 / 3 s
        for i in range(3):  # the other user's share is whole
            assert await ask(user.client, f"mine {i}") == f"mine {i}"
        redeemer = net.models[0].redeemer
        assert redeemer is not None and (redeemer.tokened, redeemer.refused, redeemer.unchecked) == (6, 0, 0)
        await trio.sleep(used_up.value.wait_s + 1)  # one token back at each issuer, not three
        assert await ask(flooder.client, "again") == "again"
        with pytest.raises(QuotaExhausted):
            await ask(flooder.client, "and again")
        nursery.cancel_scope.cancel()
