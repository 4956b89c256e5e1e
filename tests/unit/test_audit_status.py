"""``gentorrent status --committee`` shows the audits and each model node's trust (gentorrent/tools/status.py)."""

from __future__ import annotations

import msgpack

from gentorrent.tools.status import audit_rows, format_rows
from overlay.net.peers import PeerEntry
from tests.audit_helpers import Committee


def _rows(c: Committee, listed: set[bytes]) -> list[str]:
    audit = msgpack.unpackb(c.app.query("/audit", b"")[1], raw=False, strict_map_key=False)
    reputation = msgpack.unpackb(c.app.query("/reputation", b"")[1], raw=False)
    return audit_rows(audit, reputation, listed)


def test_status_shows_the_epoch_commits_outcomes_and_reputations() -> None:
    c = Committee()
    rows = _rows(c, set())
    assert "audits: epoch 0 (heights 1-12: commits until 3, reports from 10), 2 challenge(s) per node" in rows[0]
    assert "audited models: none" in rows[1]
    c.to_epoch_start(1)
    c.epoch(scores={c.nodes[0].node_id: 100_000})
    listed = {n.node_id for n in c.nodes[1:]}
    text = "\n".join(_rows(c, listed))
    assert "epoch 2 (heights 25-36" in text and "audited models: smollm2-135m" in text
    assert "epoch 1: applied at height 24: 3 node(s) scored, 0 missed; 4 of 4 validators reported" in text
    assert "reputation of 3 audited model node(s)" in text
    assert text.count("UNTRUSTED") == 1 and c.nodes[0].node_id.hex()[:8] in text


def test_node_rows_show_trust() -> None:
    model = PeerEntry(b"m" * 20, "h:1", b"e" * 32, b"x" * 32, role="model", models=("m",), reputation=876_543)
    user = PeerEntry(b"u" * 20, "h:2", b"e" * 32, b"x" * 32)
    rows = format_rows([model, user], {})
    assert "trust" in rows[0] and " 0.88 " in rows[1] and " - " in rows[2]
