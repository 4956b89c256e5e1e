"""Inputs the fuzzer found that broke a contract, each fixed in the code; kept as regressions.

Each test names the target that found it (docs/fuzzing.md "Found and fixed").
"""

from __future__ import annotations

from collections.abc import Callable

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

    from overlay.directory.lists import ListError, verify_document

    junk: list[list[list[object]]] = [[[]] * 15] * 200_000
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
    """Audit reports just within their byte limit whose bodies are mostly arrays where the schema
    has values: nested empty arrays, or arrays of 2-character strings."""
    import msgpack

    from verifier.audit import tx as at

    nest: list[list[list[object]]] = [[[]] * 15] * 268  # 4,291 bytes, 4,289 arrays
    key, sig, node, salt = b"k" * 32, b"s" * 64, b"n" * 20, b"t" * 16
    opening = [b"s" * 16, "m", [["user", "q"]], [0.7, 1.0, 0, 32, 7]]

    def fill(make: Callable[[int], list[object]]) -> bytes:
        """The largest ``make(n)`` that fits the report's byte limit."""
        n = 1
        while len(at.AUDIT_TAG + msgpack.packb(make(2 * n), use_bin_type=True)) - len(at.AUDIT_TAG) \
                <= at.MAX_REPORT_BYTES:
            n *= 2
        lo, hi = n, 2 * n
        while hi - lo > 1:
            mid = (lo + hi) // 2
            size = len(msgpack.packb(make(mid), use_bin_type=True))
            lo, hi = (mid, hi) if size <= at.MAX_REPORT_BYTES else (lo, mid)
        body: bytes = msgpack.packb(make(lo), use_bin_type=True)
        return at.AUDIT_TAG + body

    makers: dict[str, Callable[[int], list[object]]] = {
        "report-of-one-field": lambda n: [2, [nest] * n],
        "report-epoch": lambda n: [2, [nest] * n, key, salt, [], sig],
        "report-entry-nodes": lambda n: [2, 1, key, salt, [[nest, opening, [1, "busy", 1]]] * (n // 100 + 1), sig],
        "report-chunk-strings": lambda n: [2, 1, key, salt, [[node, opening, [0, node, [[["ab"] * n, [1]]], sig, 1,
                                                                                1, 1]]], sig],
        "report-token-ids": lambda n: [2, 1, key, salt, [[node, opening, [0, node, [["x", [[[]] * 15] * n]], sig,
                                                                             1, 1, 1]]], sig],
    }
    return fill(makers[case])


@pytest.mark.parametrize("case", ["report-of-one-field", "report-epoch", "report-entry-nodes",
                                  "report-chunk-strings", "report-token-ids"])
def test_audit_tx_of_nested_arrays_costs_no_more_than_its_bytes(case: str) -> None:
    """Found by reading the ``audit_tx`` target's memory figures: ``decode_audit_tx`` unpacked
    the whole body before checking its shape, so a 1 MiB transaction of nested empty arrays
    took 66 MB (and 1 MiB of 2-character strings where values belong 20 MB) before it was
    refused, in every verifier's CheckTx. It reads the body by shape (the wire codec's
    ShapeReader) and refuses it at once."""
    import tracemalloc

    from overlay.directory.registration import Code, TxError
    from verifier.audit import tx as at

    raw = _hostile_audit_tx(case)
    limit = at.MAX_REPORT_BYTES
    assert limit * 0.9 < len(raw) - len(at.AUDIT_TAG) <= limit  # refused for its shape, not its size
    tracemalloc.start()
    try:
        with pytest.raises(TxError) as exc:
            at.decode_audit_tx(raw, "chain")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert exc.value.code in (Code.MALFORMED, Code.INVALID_FIELD)  # a shape or a count over its bound
    assert peak < 2 * len(raw) + 1_000_000, f"refusing {len(raw)} bytes took {peak} bytes"
