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
