"""The last list certificate survives a restart (issue 28, item 7): ProcessProposal and
FinalizeBlock refuse a certificate not above the last one recorded, so a verifier that forgot it
on restart would accept a replayed one that the others refuse, and the committee would disagree."""

from __future__ import annotations

import msgpack
import pytest

from overlay.directory.registration import Code
from overlay.wire import crypto
from tests.committee_helpers import InProcessCommittee, Node
from verifier import quorum
from verifier.app import CommitteeApp, StateError


def _certs(c: InProcessCommittee) -> list[bytes]:
    """Run heights until two certificates have been recorded; the block transactions that carried them."""
    seen: list[bytes] = []
    while len(seen) < 2:
        a, h = c.app, c.app.height + 1
        block = a.prepare_proposal([], 1 << 20, c.now, h, c._votes)
        seen += [t for t in block if t.startswith(quorum.CERT_TAG)]
        block_hash = crypto.sha256(b"".join(block) + h.to_bytes(8, "big"))
        assert a.process_proposal(block, c.now, h, block_hash)
        c._votes = [(crypto.sha256(k.public_bytes)[:20], a.extend_vote(h, k, block_hash, block, c.now))
                    for k in c.keys]
        a.finalize_block(h, c.now, block, block_hash)
        a.commit()
        c.now += 1
    return seen


def test_a_restarted_verifier_agrees_with_a_running_one_on_a_replayed_certificate() -> None:
    c = InProcessCommittee()
    c.height([Node(port=7000).register()])
    old, last = _certs(c)
    running = c.app
    restarted = CommitteeApp.restore(running.snapshot())
    h = running.height + 1
    for replay in (old, last):  # genuine certificates, signed by every validator, but not new
        answers = [app.process_proposal([replay], c.now, h) for app in (running, restarted)]
        assert answers == [False, False]
        assert [app._run([replay], c.now, h).results[0].code for app in (running, restarted)] == [Code.REPLAYED] * 2
    assert restarted.cert == running.cert == quorum.decode_cert(last)
    # Both go on recording the next certificate alike.
    c.app = restarted
    _certs(c)
    assert restarted.cert is not None and restarted.cert.height > quorum.decode_cert(last).height


def test_a_snapshot_with_a_bad_certificate_is_refused() -> None:
    c = InProcessCommittee()
    _certs(c)
    fields = msgpack.unpackb(c.app.snapshot())
    fields[5] = fields[5][:-1]
    with pytest.raises(StateError, match="certificate"):
        CommitteeApp.restore(msgpack.packb(fields, use_bin_type=True))
    fields[5] = None  # before any certificate: restores with none
    app = CommitteeApp.restore(msgpack.packb(fields, use_bin_type=True))
    assert app.cert is None
