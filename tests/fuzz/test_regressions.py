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


@pytest.mark.parametrize("slot", [7, 8, 1])  # validators, signatures, a scalar field
def test_signed_list_of_nested_arrays_costs_no_more_than_its_bytes(slot: int) -> None:
    """Found by reading the ``signed-list`` target's memory figures: ``verify_document`` unpacked
    the whole document before checking anything, so 3 MB of nested empty arrays from a hostile
    verifier took 195 MB. It now reads the document by shape and refuses it at once."""
    import tracemalloc

    import msgpack

    from overlay.committee import ListError, verify_document

    junk = [[[]] * 15] * 200_000
    doc: list[object] = [1, "chain", 1, 1, b"", b"\0" * 32, b"\0" * 32, [], []]
    doc[slot] = junk
    raw = msgpack.packb(doc)
    assert len(raw) > 3_000_000
    tracemalloc.start()
    try:
        with pytest.raises(ListError):
            verify_document(raw, "chain", [], kind=1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * len(raw), f"refusing {len(raw)} bytes took {peak} bytes"


def _hostile_audit_tx(case: str) -> bytes:
    """Audit transactions within their kind's byte limit whose bodies are mostly arrays where the
    schema has values: nested empty arrays, or arrays of 2-character strings."""
    import msgpack

    from verifier import audit_tx as at

    nest = [[[]] * 15] * 268  # 4,291 bytes, 4,289 arrays
    key, sig, node = b"k" * 32, b"s" * 64, b"n" * 20
    opening = [b"s" * 16, "m", [["user", "q"]], [0.7, 1.0, 0, 32, 7]]
    fields: list[object] = {
        "commit-of-one-field": [2, [nest] * 244],
        "commit-epoch": [2, [nest] * 243, key, [], sig],
        "commit-sealed-boxes": [2, 1, key, [[node, b"c" * 32, [nest] * 120]] * 2, sig],
        "commit-sealed-strings": [2, 1, key, [[node, b"c" * 32, [["ab"] * 268] * 120]] * 10, sig],
        "report-token-ids": [3, 1, key, [[0, node, 0, opening, [["x", [[[]] * 15] * 256]] * 120, sig, 1, 1, 1, node]],
                             sig],
    }[case]
    return at.AUDIT_TAG + msgpack.packb(fields, use_bin_type=True)


@pytest.mark.parametrize("case", ["commit-of-one-field", "commit-epoch", "commit-sealed-boxes",
                                  "commit-sealed-strings", "report-token-ids"])
def test_audit_tx_of_nested_arrays_costs_no_more_than_its_bytes(case: str) -> None:
    """Found by reading the ``audit_tx`` target's memory figures: ``decode_audit_tx`` unpacked
    the whole body before checking its shape, so a 1 MiB challenge commit of nested empty arrays
    took 66 MB (and 1 MiB of 2-character strings where sealed boxes belong 20 MB) before it was
    refused, in every verifier's CheckTx. It now reads the body by shape and refuses it at once."""
    import tracemalloc

    from verifier import audit_tx as at
    from verifier.tx import Code, TxError

    raw = _hostile_audit_tx(case)
    limit = at.MAX_REPORT_BYTES if case.startswith("report") else at.MAX_COMMIT_BYTES
    assert limit * 0.9 < len(raw) - len(at.AUDIT_TAG) <= limit  # refused for its shape, not its size
    tracemalloc.start()
    try:
        with pytest.raises(TxError) as exc:
            at.decode_audit_tx(raw, "chain")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert exc.value.code == Code.MALFORMED
    assert peak < 2 * len(raw) + 1_000_000, f"refusing {len(raw)} bytes took {peak} bytes"
