"""`gentorrent status` reads the committee's audits; a genesis without audits is said as such,
from the refusal's code (overlay.directory.rpc.QueryRefused), not from its text."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from gentorrent.tools import status
from overlay.directory.registration import Code


@pytest.mark.parametrize(("code", "line"), [
    (Code.AUDITS_OFF, "  audits: off (the committee's genesis has no audit section)"),
    (Code.UNAVAILABLE, "  audits unknown: v:1 answered code 10: code 17 says the log"),
])
def test_the_audit_rows_follow_the_refusals_code(code: int, line: str) -> None:
    async def refusing(address: str, method: str, params: dict[str, str]) -> Any:
        return {"response": {"code": int(code), "log": "code 17 says the log"}}

    assert trio.run(lambda: status._audit_view("v:1", [], rpc=refusing)) == [line]


def _issuer_rpc(issuer: Any, code: int | None = None) -> Any:
    """An RPC that answers ``/quota/key`` as ``issuer`` does (or with ``code`` and no value)."""
    import base64
    import time

    from overlay.directory import quota

    async def rpc(address: str, method: str, params: dict[str, str]) -> Any:
        assert method == "abci_query" and params["path"] == f'"{quota.KEY_PATH}"'
        if code is not None:
            return {"response": {"code": code, "log": "refused"}}
        got, log, value = issuer.key_query(bytes.fromhex(params["data"].removeprefix("0x")), time.time())
        return {"response": {"code": int(got), "log": log, "value": base64.b64encode(value).decode()}}

    return rpc


def test_the_quota_row_states_the_committees_settings_from_a_verified_key_record() -> None:
    """`gentorrent status --committee` shows the quota settings a verifier's issuer signs (decision
    0018), checked against the pinned validator keys; off, refused and forged are said as such."""
    from overlay.directory.quota import QuotaParams
    from overlay.wire import crypto
    from verifier.quota import Issuer

    signer = crypto.SigningKey.generate()
    issuer = Issuer.of_validator(signer, "chain", QuotaParams(epoch_s=60, tokens=6, issuers=2, grace_s=15, burst=16))
    keys = {signer.public_bytes}
    rows = trio.run(lambda: status._quota_view("v:1", "chain", keys, ["m"], rpc=_issuer_rpc(issuer)))
    assert rows == ["  quotas: a user's allowance at each issuer grows by 6 token(s) per 60 s epoch (one every "
                    "10 s) and holds at most 16, the top 4 priority tokens, the rest standard; a token needs 2 "
                    "issuer(s) and redeems until 15 s after its "
                    "epoch (signed key record of v:1)"]
    other = {crypto.SigningKey.generate().public_bytes}  # not the committee's key: not believed
    forged = trio.run(lambda: status._quota_view("v:1", "chain", other, ["m"], rpc=_issuer_rpc(issuer)))
    assert len(forged) == 1 and forged[0].startswith("  quotas unknown: the key record v:1 answered does not verify")
    off = trio.run(lambda: status._quota_view("v:1", "chain", keys, ["m"], rpc=_issuer_rpc(issuer, int(Code.QUOTA_OFF))))
    assert off == ["  quotas: off (the committee's genesis has no quota section: requests carry no tokens)"]
    refused = trio.run(lambda: status._quota_view("v:1", "chain", keys, ["m"], rpc=_issuer_rpc(issuer, 10)))
    assert refused == ["  quotas unknown: v:1 answered code 10: refused"]
    assert trio.run(lambda: status._quota_view("v:1", "chain", keys, [], rpc=_issuer_rpc(issuer))) == [
        "  quotas unknown: no model node is registered, so there is no model to ask the issuers about"]
