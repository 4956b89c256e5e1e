"""Inputs the fuzzer found that broke a contract, each fixed in the code; kept as regressions.

Each test names the target that found it (docs/fuzzing.md "Found and fixed").
"""

from __future__ import annotations

import pytest

from user_client import openai_api as api


@pytest.mark.parametrize("role", [["user"], {"user": 1}, 1.5, None, True])
def test_gateway_chat_role_of_any_json_type_is_a_400(role: object) -> None:
    """Target ``gateway``: a message whose role was a JSON array or object raised ``TypeError``
    (unhashable, looked up in the role table) out of ``parse_chat``: a 500 instead of a 400."""
    with pytest.raises(api.ApiError) as exc:
        api.parse_chat({"model": "m", "messages": [{"role": role, "content": "hi"}]})
    assert exc.value.status == 400 and "role" in str(exc.value)


@pytest.mark.parametrize("body", [b"[" * 100_000, b'{"a":' * 100_000])
def test_gateway_body_nested_too_deep_is_a_400(body: bytes) -> None:
    """Target ``gateway``: a body of 100,000 opening brackets made ``json.loads`` raise
    ``RecursionError``, which the gateway did not catch: a 500 and a traceback per request."""
    with pytest.raises(api.ApiError) as exc:
        api.parse_json(body)
    assert exc.value.status == 400 and "not valid JSON" in str(exc.value)
