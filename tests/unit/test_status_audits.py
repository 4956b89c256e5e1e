"""`gentorrent status` reads the committee's audits; a genesis without audits is said as such,
from the refusal's code (overlay.directory.rpc.QueryRefused), not from its text."""

from __future__ import annotations

import pytest
import trio

from gentorrent.tools import status
from overlay.directory import rpc
from overlay.directory.registration import Code


@pytest.mark.parametrize(("code", "line"), [
    (Code.AUDITS_OFF, "  audits: off (the committee's genesis has no audit section)"),
    (Code.UNAVAILABLE, "  audits unknown: v:1 answered code 17: whatever the log says"),
])
def test_the_audit_rows_follow_the_refusals_code(monkeypatch: pytest.MonkeyPatch, code: int, line: str) -> None:
    async def refuse(address: str, path: str, data: bytes = b"", **_: object) -> bytes:
        raise rpc.QueryRefused(f"{address} answered code 17: whatever the log says", int(code))

    monkeypatch.setattr(rpc, "abci_value", refuse)
    assert trio.run(status._audit_view, "v:1", []) == [line]
