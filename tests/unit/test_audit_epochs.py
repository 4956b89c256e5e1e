"""The audit protocol on the committee chain (verifier/audit.py in verifier/app.py): whole epochs,
block by block, on four app cores with real validator keys, real VRF proofs, sealed challenges and
replies signed by registered model nodes."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest

from tests.audit_helpers import MODEL, Committee, ModelNode, fresh_opening
from verifier import audit as audits
from verifier import audit_tx as at
from verifier.app import CommitteeApp
from verifier.reputation import R0
from verifier.tx import Code


def run_to_report(c: Committee, leader_index: int | None = 0) -> bytes:
    """Epoch 0: a leader commits epoch 1's challenges; epoch 1: a leader is elected. Returns the
    leader of epoch 1 (the report is the caller's)."""
    lead0 = c.elect(leader_index)
    commit, _ = c.commit_tx(lead0)
    c.block([commit])
    c.to_epoch_start(1)
    assert c.outcome(0).status == audits.ABORTED and "no challenges" in c.outcome(0).reason
    return c.elect(leader_index)


def test_an_epoch_completes_and_every_app_agrees() -> None:
    c = Committee()
    lead0 = c.elect()  # every validator sends its proof: the VRF picks the leader
    st = c.audit
    assert len(st.proofs) == 4 and st.leader in {v.public_key for v in c.validators}
    commit, openings = c.commit_tx(lead0)
    c.block([commit])
    assert c.audit.next_challenges is not None and len(c.audit.next_challenges) == 2 * 3
    # The prompts stay off the chain: only commitments and sealed boxes are in the state.
    state_bytes = c.app.committed.canonical_bytes()
    assert not any(op.messages[0].content.encode() in state_bytes for op in openings)
    c.to_epoch_start(1)
    lead1 = c.elect()
    assert c.opened(lead1) == openings  # each validator opens its own sealed box
    for pk in c.others(lead1):
        assert c.opened(pk) == openings
    report = c.report_tx(lead1, c.honest_entries(lead1))
    c.block([report])
    assert c.audit.report_hash == at.report_hash(report)
    assert c.app.query("/audit/report", b"") == (c.app.query("/audit/report", b"")[0], report)
    a, b, _ = c.others(lead1)
    c.block([c.attest_tx(a, [951_000] * 6)])
    assert c.audit.status == audits.OPEN  # 20 of 40 power
    c.block([c.attest_tx(b, [940_000] * 6)])  # 30 of 40: applied in this very block
    assert c.audit.status == audits.APPLIED
    out = c.outcome(1)
    assert out.status == audits.APPLIED and out.height == c.height and "3 node(s) scored" in out.reason
    for n in c.nodes:
        rep = c.audit.reputation.get(n.node_id)
        assert rep.epochs == 1 and rep.value == 400_000 * R0 // 1_000_000 + 600_000 * 950_000 // 1_000_000
    # Identical reputation tables and app hashes on every app (Committee.block checks the hashes).
    assert len({app.query("/reputation", b"")[1] for app in c.apps}) == 1
    rows = msgpack.unpackb(c.app.query("/reputation", b"")[1])
    assert [r[0] for r in rows] == sorted(n.node_id for n in c.nodes) and rows[0][3] == 1
    # Late attestations are refused once the epoch is settled.
    last = [pk for pk in c.others(lead1) if pk not in (a, b)][0]
    assert c.rejected(c.attest_tx(last, [950_000] * 6)).code == Code.SETTLED
    # The epoch's end starts epoch 2 with this block's hash as the seed.
    c.to_epoch_start(2)
    assert c.audit.epoch == 2 and c.audit.challenges == () and c.audit.status == audits.OPEN
    assert c.audit.used_prompts[-1][0] == 1 and len(c.audit.used_prompts[-1][1]) == 6


def test_the_audit_query_tells_a_driver_what_to_do() -> None:
    c = Committee()
    q = audits.decode_query(c.app.query("/audit", b"")[1])
    assert q["epoch"] == 0 and q["start_height"] == 1 and q["proof_until"] == 5 and q["leader"] is None
    assert q["model"] == MODEL and q["challenges_per_node"] == 2 and q["epoch_blocks"] == 10
    assert sorted(q["audit_nodes_next"]) == sorted(n.node_id for n in c.nodes)
    assert q["validators"] == [[v.public_key, v.power] for v in c.app.committed.validators]
    assert q["seed"] == c.audit.seed and len(q["seed"]) == 32 and q["next_committed"] is False
    assert q["report_hash"] is None and q["silent"] == [] and q["outcomes"] == []
    lead = c.elect(2)
    commit, _ = c.commit_tx(lead)
    c.block([commit])
    q = audits.decode_query(c.app.query("/audit", b"")[1])
    assert q["leader"] == lead and q["next_committed"] is True and q["total_power"] == 40
    c.to_epoch_start(1)
    q = audits.decode_query(c.app.query("/audit", b"")[1])
    assert len(q["challenges"]) == 6 and q["sealed_to"] == [v.public_key for v in c.app.committed.validators]
    assert q["outcomes"][0][:2] == [0, "aborted"]
    assert c.app.query("/audit/report", b"")[0].code == Code.UNAVAILABLE


def test_snapshot_restore_round_trip_with_audit_state() -> None:
    c = Committee()
    lead = run_to_report(c)
    c.block([c.report_tx(lead, c.honest_entries(lead))])
    restored = CommitteeApp.restore(c.app.snapshot())
    assert restored.committed.canonical_bytes() == c.app.committed.canonical_bytes()
    assert restored.committed.audit == c.audit
    c.apps[3] = restored  # it keeps going in lockstep with the others
    a = c.others(lead)[0]
    c.block([c.attest_tx(a, [950_000] * 6)])
    c.to_epoch_start(2)
    out = c.outcome(1)  # the leader and one validator agree: 20 of 40 power is not more than 2/3
    assert out.status == audits.ABORTED and "no agreement" in out.reason and "20 of 40" in out.reason
    assert c.audit.epoch == 2


def test_older_state_formats_are_refused_with_a_clear_error() -> None:
    from verifier.app import SNAPSHOT_VERSION, StateError
    from verifier.tx import pack

    c = Committee()
    st = c.app.committed
    v2 = pack([2, st.chain_id, [[v.key_type, v.public_key, v.power] for v in st.validators], [], [], 0])
    with pytest.raises(StateError, match="format 2.*reads 3"):
        CommitteeApp.restore(pack([SNAPSHOT_VERSION, 5, b"x" * 32, v2]))
    raw = bytearray(c.app.snapshot())
    with pytest.raises(StateError):
        CommitteeApp.restore(bytes(raw[:-3]))


def test_check_tx_never_changes_state() -> None:
    c = Committee()
    lead = run_to_report(c)
    report = c.report_tx(lead, c.honest_entries(lead))
    before = (c.app.app_hash, c.app.committed.canonical_bytes(), c.app.committed.audit)
    for raw in [report, c.proof(lead), report, c.commit_tx(lead)[0]]:
        c.app.check_tx(raw)
    assert (c.app.app_hash, c.app.committed.canonical_bytes(), c.app.committed.audit) == before
    assert c.app.check_tx(report).ok  # still acceptable: nothing was recorded


def test_audits_are_off_without_an_audit_section() -> None:
    from tests.committee_helpers import CHAIN
    from verifier.app import Validator

    c = Committee()
    a = CommitteeApp()
    a.init_chain(CHAIN, [Validator("ed25519", v.public_key, v.power) for v in c.validators])
    assert a.committed.audit is None
    raw = c.proof(c.pk(0))
    assert a.check_tx(raw).code == Code.AUDITS_OFF
    assert a.query("/audit", b"")[0].code == Code.AUDITS_OFF
    with pytest.raises(audits.AuditParamsError):
        a.init_chain(CHAIN, [], b'{"audit": {"epoch_blocks": 3}}')
    with pytest.raises(audits.AuditParamsError):
        a.init_chain(CHAIN, [], b'{"audit": {"modle": "x"}}')
    assert audits.params_from_app_state(b'{"audit": {}}') == audits.AuditParams()
    assert audits.params_from_app_state(b"null") is None


# --------------------------------------------------------------------------- Byzantine leaders


def _alter_text(c: Committee, es: list[at.Entry]) -> list[at.Entry]:
    e = es[1]
    assert isinstance(e, at.ReplyEntry)
    es[1] = dataclasses.replace(e, chunks=(("The answer", (791, 4245)), (" is 8.", (318, 767, 13))))
    return es


def _alter_token(c: Committee, es: list[at.Entry]) -> list[at.Entry]:
    e = es[2]
    assert isinstance(e, at.ReplyEntry)
    es[2] = dataclasses.replace(e, chunks=(("The answer", (791, 4245)), (" is 7.", (318, 767, 14))))
    return es


def _skip_node(c: Committee, es: list[at.Entry]) -> list[at.Entry]:
    return [dataclasses.replace(e, index=i) for i, e in enumerate(es[2:])]


def _out_of_order(c: Committee, es: list[at.Entry]) -> list[at.Entry]:
    es[1], es[2] = es[2], es[1]
    return es


def _out_of_order_reindexed(c: Committee, es: list[at.Entry]) -> list[at.Entry]:
    es[1], es[2] = dataclasses.replace(es[2], index=1), dataclasses.replace(es[1], index=2)
    return es


def _swap_prompt(c: Committee, es: list[at.Entry]) -> list[at.Entry]:
    e = es[0]
    assert isinstance(e, at.ReplyEntry)
    node = next(n for n in c.nodes if n.node_id == e.node_id)
    es[0] = node.answer(fresh_opening(), 0)  # an easier prompt, really answered and signed
    return es


def _reply_to_another_prompt(c: Committee, es: list[at.Entry]) -> list[at.Entry]:
    e = es[0]
    assert isinstance(e, at.ReplyEntry)
    node = next(n for n in c.nodes if n.node_id == e.node_id)
    other = node.answer(fresh_opening(), 0)
    es[0] = dataclasses.replace(e, chunks=other.chunks, signature=other.signature)
    return es


@pytest.mark.parametrize("fault, words", [
    (_alter_text, "altered reply"), (_alter_token, "altered reply"), (_skip_node, "skipped"),
    (_out_of_order, "out of order"), (_out_of_order_reindexed, "out of order"), (_swap_prompt, "swapped prompt"),
    (_reply_to_another_prompt, "another prompt"),
])
def test_a_byzantine_leader_aborts_its_epoch(fault, words) -> None:  # type: ignore[no-untyped-def]
    c = Committee()
    lead = run_to_report(c)
    before = c.audit.reputation
    entries = fault(c, c.honest_entries(lead))
    c.block([c.report_tx(lead, entries)])  # accepted: signed evidence
    assert c.audit.status == audits.ABORTED
    out = c.outcome(1)
    assert out.status == audits.ABORTED and words in out.reason and lead.hex()[:16] in out.reason
    assert c.audit.reputation == before
    assert c.rejected(c.attest_tx(c.others(lead)[0], [950_000] * 6)).code == Code.SETTLED
    c.to_epoch_start(2)
    assert c.audit.reputation == before


def test_a_reused_prompt_aborts_when_the_leader_committed_it_and_voids_the_entry_otherwise() -> None:
    for same_leader in (True, False):
        c = Committee()
        lead0 = c.elect(0)
        ops = [fresh_opening() for _ in range(6)]
        ops[3] = fresh_opening(question=ops[0].messages[0].content.upper() + "  ")  # the same prompt
        commit, _ = c.commit_tx(lead0, ops)
        c.block([commit])
        c.to_epoch_start(1)
        lead1 = c.elect(0 if same_leader else 1)
        assert (lead1 == lead0) == same_leader
        c.block([c.report_tx(lead1, c.honest_entries(lead1))])
        if same_leader:
            assert c.audit.status == audits.ABORTED and "reused prompt" in c.outcome(1).reason
        else:
            assert c.audit.status == audits.OPEN and "entry 3 void: prompt reused" in c.audit.notes[0]
            others = c.others(lead1)
            c.block([c.attest_tx(pk, [950_000] * 6) for pk in others[:2]])
            assert c.audit.status == audits.APPLIED and "entry 3 void" in c.outcome(1).reason
            node3 = c.audit.challenges[3].node_id
            assert c.audit.reputation.get(node3).epochs == 1  # its other entry counted


def test_a_prompt_used_in_an_earlier_epoch_is_caught() -> None:
    c = Committee()
    lead = run_to_report(c)
    c.block([c.report_tx(lead, c.honest_entries(lead))])
    used = c.audit.challenges
    first = c.opened(lead)[0]
    commit, _ = c.commit_tx(lead, [fresh_opening(question=first.messages[0].content)]
                            + [fresh_opening() for _ in range(5)])
    c.block([commit])
    c.to_epoch_start(2)
    assert c.audit.challenges != used
    lead2 = c.elect(0)
    assert lead2 == lead
    c.block([c.report_tx(lead2, c.honest_entries(lead2))])
    assert c.audit.status == audits.ABORTED and "reused prompt" in c.outcome(2).reason


def test_entries_of_nodes_that_left_are_void() -> None:
    c = Committee()
    lead = run_to_report(c)
    gone = c.audit.challenges[0].node_id
    node = next(n for n in c.nodes if n.node_id == gone)
    c.block([node.node.leave()])
    c.block([c.report_tx(lead, c.honest_entries(lead))])
    assert c.audit.status == audits.OPEN and sum("no longer registered" in n for n in c.audit.notes) == 2
    # the two void entries need not agree (a verifier may not score a node that left)
    void_scores = [0 if ch.node_id == gone else 950_000 for ch in c.audit.challenges]
    third = c.attest_tx(c.others(lead)[2], void_scores)
    assert c.app.prepare_proposal([c.attest_tx(pk, void_scores) for pk in c.others(lead)[:2]] + [third],
                                  1 << 22, c.now + 1, c.height + 1)[2:] == []  # settled by the second one
    c.block([c.attest_tx(pk, void_scores) for pk in c.others(lead)[:2]])
    assert c.audit.status == audits.APPLIED and all(agrees for _, agrees, _ in c.audit.attested)
    assert gone not in c.audit.reputation.nodes and len(c.audit.reputation.nodes) == 2


# --------------------------------------------------------------------------- rejected transactions


def test_structural_faults_are_rejected_with_their_codes() -> None:
    c = Committee()
    pks = [v.public_key for v in c.app.committed.validators]
    # VRF proofs: a forged one, one for another epoch, one from a stranger, one after the window.
    forged = at.prove_leader(0, b"another seed" + bytes(20), c.seeds[pks[1]])
    assert c.rejected(c.sign(forged, pks[1])).code == Code.BAD_SIGNATURE
    stolen = dataclasses.replace(at.decode_audit_tx(c.proof(pks[1]), "gt-test-chain"), validator_pk=pks[2])
    assert c.rejected(at.encode_tx(stolen)).code == Code.BAD_SIGNATURE
    assert c.rejected(c.proof(pks[1], epoch=1)).code == Code.WRONG_EPOCH
    from overlay import crypto

    stranger = crypto.SigningKey.generate()
    c.seeds[stranger.public_bytes] = stranger.private_bytes()
    assert c.rejected(c.proof(stranger.public_bytes)).code == Code.NOT_VALIDATOR
    c.block([c.proof(pks[0])])
    assert c.rejected(c.proof(pks[0])).code == Code.DUPLICATE
    # A commit or report before the leader is known.
    assert c.rejected(c.commit_tx(pks[0])[0]).code == Code.TOO_EARLY
    c.to_height(c.audit.proof_until())
    assert c.audit.leader == pks[0]
    assert c.rejected(c.proof(pks[1])).code == Code.LATE
    # Commits: not from the leader, wrong node set, wrong k, duplicate commitments, wrong box count.
    assert c.rejected(c.commit_tx(pks[1])[0]).code == Code.NOT_LEADER
    ids = audits.audit_nodes(c.audit, c.app.committed.nodes)
    assert c.rejected(c.commit_tx(pks[0], node_ids=list(reversed(ids)))[0]).code == Code.INVALID_FIELD
    assert c.rejected(c.commit_tx(pks[0], node_ids=ids[:2])[0]).code == Code.INVALID_FIELD
    assert c.rejected(c.commit_tx(pks[0], [fresh_opening() for _ in range(5)])[0]).code == Code.INVALID_FIELD
    assert c.rejected(c.commit_tx(pks[0], [fresh_opening() for _ in range(7)])[0]).code == Code.INVALID_FIELD
    op = fresh_opening()
    twice = [op] + [fresh_opening() for _ in range(4)] + [op]
    r = c.rejected(c.commit_tx(pks[0], twice)[0])
    assert r.code == Code.INVALID_FIELD and "commitment" in r.log
    order = [pk for pk, _ in c.app.committed.validator_powers()]
    few = tuple(at.seal_challenge(ids[i // 2], fresh_opening(), order[:3]) for i in range(6))
    r = c.rejected(c.sign(at.ChallengeCommit(1, pks[0], few), pks[0]))
    assert r.code == Code.INVALID_FIELD and "sealed" in r.log
    wrong_epoch = c.sign(at.ChallengeCommit(2, pks[0], few), pks[0])
    assert c.rejected(wrong_epoch).code == Code.WRONG_EPOCH
    commit, _ = c.commit_tx(pks[0])
    c.block([commit])
    assert c.rejected(c.commit_tx(pks[0])[0]).code == Code.DUPLICATE
    # A report for an epoch without challenges.
    assert c.rejected(c.report_tx(pks[0], [])).code == Code.CONFLICT
    c.to_epoch_start(1)
    # Epoch 1: a report before the window ends, by a non-leader, twice, for another epoch.
    c.block([c.proof(pks[3])])
    entries = [at.SilentEntry(ch.node_id, i, "no reply") for i, ch in enumerate(c.audit.challenges)]
    assert c.rejected(c.report_tx(pks[3], entries)).code == Code.TOO_EARLY
    c.to_height(c.audit.proof_until())
    assert c.audit.leader == pks[3]
    assert c.rejected(c.report_tx(pks[1], c.honest_entries(pks[3]))).code == Code.NOT_LEADER
    assert c.rejected(c.report_tx(pks[3], c.honest_entries(pks[3]), epoch=0)).code == Code.WRONG_EPOCH
    att = c.attest_tx(pks[1], [950_000] * 6, report_hash=bytes(32))
    assert c.rejected(att).code == Code.TOO_EARLY
    report = c.report_tx(pks[3], c.honest_entries(pks[3]))
    c.block([report])
    assert c.rejected(c.report_tx(pks[3], c.honest_entries(pks[3]))).code == Code.DUPLICATE
    # Attestations: wrong hash, wrong count, by the leader, by a stranger, twice.
    assert c.rejected(c.attest_tx(pks[1], [950_000] * 6, report_hash=bytes(32))).code == Code.CONFLICT
    assert c.rejected(c.attest_tx(pks[1], [950_000] * 5)).code == Code.INVALID_FIELD
    assert c.rejected(c.attest_tx(pks[3], [950_000] * 6)).code == Code.DUPLICATE
    assert c.rejected(c.attest_tx(stranger.public_bytes, [950_000] * 6)).code == Code.NOT_VALIDATOR
    c.block([c.attest_tx(pks[1], [950_000] * 6)])
    assert c.rejected(c.attest_tx(pks[1], [950_000] * 6)).code == Code.DUPLICATE
    # Silence confirmations for a node the report does not call silent.
    assert c.rejected(c.silence_tx(pks[1], c.nodes[0].node_id, False)).code == Code.INVALID_FIELD


def test_the_cli_defaults_are_the_cores() -> None:
    from verifier import cli

    assert (cli._DEFAULT_AUDIT_MODEL, cli._DEFAULT_EPOCH_BLOCKS, cli._DEFAULT_CHALLENGES) == (
        audits.DEFAULT_MODEL, audits.DEFAULT_EPOCH_BLOCKS, audits.DEFAULT_CHALLENGES_PER_NODE)


def test_hostile_audit_bytes_get_a_code_and_change_nothing() -> None:
    import random

    c = Committee()
    lead = run_to_report(c)
    valid = [c.report_tx(lead, c.honest_entries(lead)), c.commit_tx(lead)[0], c.proof(lead)]
    before = c.app.committed.canonical_bytes()
    rng = random.Random(5)
    for _ in range(500):
        raw = bytearray(rng.choice(valid))
        i = rng.randrange(len(raw))
        raw[i] ^= 1 << rng.randrange(8)
        r = c.app.check_tx(bytes(raw))
        assert isinstance(r.code, Code)
    assert c.app.committed.canonical_bytes() == before


def test_a_challenge_the_node_forwarded_is_scored_for_the_node_that_served_it() -> None:
    """Algorithm 2 lets a model node forward any request, a challenge included, to a member of its
    group; the reply then carries that member's signature. It is checked against and scored for
    the serving node; a serving node that is not a registered model node aborts the epoch."""
    c = Committee()
    lead0 = c.elect()
    c.block([c.commit_tx(lead0)[0]])
    c.to_epoch_start(1)
    lead1 = c.elect()
    entries = c.honest_entries(lead1)
    first = c.audit.challenges[0].node_id
    server = next(n for n in c.nodes if n.node_id != first)
    served = server.answer(c.opened(lead1)[0], 0, score=700_000)
    entries[0] = dataclasses.replace(served, node_id=first, server=server.node_id)
    assert entries[0].served_by == server.node_id
    c.block([c.report_tx(lead1, entries)])
    scores = [e.score for e in entries if isinstance(e, at.ReplyEntry)]
    for pk in c.others(lead1)[:2]:
        c.block([c.attest_tx(pk, scores)])
    assert c.outcome(1).status == audits.APPLIED
    per_node = {n.node_id: sum(ch.node_id == n.node_id for ch in c.audit.challenges) for n in c.nodes}
    assert c.audit.reputation.get(first).epochs == (1 if per_node[first] > 1 else 0)
    assert c.audit.reputation.get(server.node_id).epochs == 1


@pytest.mark.parametrize("who", ["stranger", "wrong signer"])
def test_a_forwarded_reply_must_be_signed_by_a_registered_model_node_it_names(who: str) -> None:
    c = Committee()
    lead0 = c.elect()
    c.block([c.commit_tx(lead0)[0]])
    c.to_epoch_start(1)
    lead1 = c.elect()
    entries = c.honest_entries(lead1)
    first = c.audit.challenges[0].node_id
    others = [n for n in c.nodes if n.node_id != first]
    if who == "stranger":  # signed by a key the committee never registered
        stranger = ModelNode()
        entries[0] = dataclasses.replace(stranger.answer(c.opened(lead1)[0], 0), node_id=first,
                                         server=stranger.node_id)
    else:  # names one member, signed by another
        entries[0] = dataclasses.replace(others[0].answer(c.opened(lead1)[0], 0), node_id=first,
                                         server=others[1].node_id)
    c.block([c.report_tx(lead1, entries)])
    out = c.outcome(1)
    assert out.status == audits.ABORTED and "entry 0" in out.reason
