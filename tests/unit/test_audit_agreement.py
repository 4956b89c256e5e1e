"""Agreement on scores and silence (issue 14 item 5) on the committee chain: the > 2/3 boundaries,
the tolerance, and silent nodes confirmed (or not) by the validators' own challenges."""

from __future__ import annotations

import pytest

from tests.audit_helpers import Committee
from verifier import audit as audits
from verifier import audit_tx as at
from verifier.reputation import R0, SCALE


def epoch1(c: Committee, leader: int = 0) -> bytes:
    lead0 = c.elect(leader)
    c.block([c.commit_tx(lead0)[0]])
    c.to_epoch_start(1)
    return c.elect(leader)


def test_three_of_four_agreeing_apply_two_of_four_do_not() -> None:
    for agreeing, applied in ((2, True), (1, False)):
        c = Committee()
        lead = epoch1(c)
        c.block([c.report_tx(lead, c.honest_entries(lead))])
        a, b, d = c.others(lead)
        good = [950_000] * 6
        far = [950_000 - 20_001] * 6
        c.block([c.attest_tx(a, good), c.attest_tx(b, good if agreeing == 2 else far), c.attest_tx(d, far)]
                if agreeing == 1 else [c.attest_tx(a, good), c.attest_tx(b, good)])
        assert (c.audit.status == audits.APPLIED) == applied
        c.to_epoch_start(2)
        out = c.outcome(1)
        assert out.status == (audits.APPLIED if applied else audits.ABORTED)
        if not applied:
            assert "no agreement" in out.reason and "20 of 40" in out.reason
            assert all(c.reputation(n.node_id) == R0 for n in c.nodes)


def test_the_tolerance_is_inclusive_and_one_score_out_of_it_disagrees() -> None:
    c = Committee()
    lead = epoch1(c)
    proposed = [1_000_000, 950_000, 930_000, 700_000, 20_000, 0]
    c.block([c.report_tx(lead, c.honest_entries(lead, proposed))])
    a, b, d = c.others(lead)
    edge = [p - 20_000 if p >= 20_000 else p + 20_000 for p in proposed]
    one_off = list(proposed)
    one_off[3] += 20_001
    c.block([c.attest_tx(a, one_off), c.attest_tx(b, edge)])
    st = c.audit
    assert {k: agrees for k, agrees, _ in st.attested} == {lead: True, a: False, b: True}
    assert st.status == audits.OPEN  # 20 of 40 agree
    c.block([c.attest_tx(d, proposed)])
    assert c.audit.status == audits.APPLIED


def test_the_applied_score_is_the_median_of_the_agreeing_votes_not_the_leaders_proposal() -> None:
    """A leader that shifts every score by the whole tolerance moves no reputation when honest
    verifiers (who compute identical scores) make the agreement; the weighted median decides."""
    honest = [880_000] * 6  # the same for every entry: committees assign challenges to nodes differently

    def run(proposed: list[int], votes: list[list[int]], powers: tuple[int, ...] = (10, 10, 10, 10)
            ) -> list[int]:
        c = Committee(powers=powers)
        lead = epoch1(c)
        c.block([c.report_tx(lead, c.honest_entries(lead, proposed))])
        for v, sc in zip(c.others(lead), votes, strict=False):
            assert c.audit.status == audits.OPEN
            c.block([c.attest_tx(v, sc)])
        assert c.audit.status == audits.APPLIED  # leader + 2 of 4: applied at once
        return sorted(c.reputation(n.node_id) for n in c.nodes)

    want = run(honest, [honest, honest])
    up = [s + 20_000 for s in honest]
    down = [s - 20_000 for s in honest]
    assert run(up, [honest, honest]) == want
    assert run(down, [honest, honest]) == want
    assert run(honest, [down, honest]) == want
    assert run(up, [up, honest]) != want  # a leader with a colluder (2 of 4) is past the model's f
    assert run(up, [up, honest]) == run(up, [up, up])


def test_the_applied_score_is_weighted_by_voting_power() -> None:
    """Powers 10/10/10/40, the leader light: two light verifiers vote one score, the leader and the
    heavy one another. A head count's median would take the light votes; the power's takes the heavy."""
    honest, up = [880_000] * 6, [900_000] * 6

    def run(light_votes: list[int]) -> list[int]:
        c = Committee(powers=(10, 10, 10, 40))
        powers = dict(c.app.committed.validator_powers())
        lead = epoch1(c, leader=next(i for i in range(4) if powers[c.pk(i)] == 10))
        c.block([c.report_tx(lead, c.honest_entries(lead, up))])
        lights = [pk for pk in c.others(lead) if powers[pk] == 10]
        heavy = next(pk for pk in c.others(lead) if powers[pk] == 40)
        c.block([c.attest_tx(pk, light_votes) for pk in lights])
        assert c.audit.status == audits.OPEN  # 30 of 70
        c.block([c.attest_tx(heavy, up)])
        assert c.audit.status == audits.APPLIED
        return sorted(c.reputation(n.node_id) for n in c.nodes)

    assert run(honest) == run(up)  # 50 of 70 voted up


def test_the_exact_two_thirds_boundary_with_unequal_power() -> None:
    c = Committee(powers=(10, 10, 5, 5))
    order = [v.public_key for v in c.app.committed.validators]
    heavy = [pk for pk in order if dict(c.app.committed.validator_powers())[pk] == 10]
    light = [pk for pk in order if pk not in heavy]
    lead = epoch1(c, order.index(heavy[0]))
    c.block([c.report_tx(lead, c.honest_entries(lead))])
    c.block([c.attest_tx(heavy[1], [950_000] * 6)])  # 20 of 30: exactly 2/3, not more
    assert c.audit.status == audits.OPEN
    c.block([c.attest_tx(light[0], [950_000] * 6)])  # 25 of 30
    assert c.audit.status == audits.APPLIED


def silent_report(c: Committee, lead: bytes, silent_node: bytes) -> bytes:
    entries: list[at.Entry] = []
    for e in c.honest_entries(lead):
        entries.append(at.SilentEntry(e.node_id, e.index, "no reply within 60 s") if e.node_id == silent_node else e)
    return c.report_tx(lead, entries)


@pytest.mark.parametrize("confirm, expect", [
    ([False, False], "zero"),  # 20 of 40 confirm silence (> 1/3): score 0
    ([True, True, True], "aborted"),  # 30 of 40 got an answer (> 2/3): the leader lied
    ([False], "ignored"),  # 10 of 40: not confirmed, not refuted
    ([True, True, False], "zero_two_answered"),  # 20 answered (not > 2/3), 10 silent (not > 1/3)
])
def test_silence(confirm: list[bool], expect: str) -> None:
    c = Committee()
    lead = epoch1(c)
    silent = c.audit.challenges[0].node_id
    c.block([silent_report(c, lead, silent)])
    assert [s[0] for s in audits.decode_query(c.app.query("/audit", b"")[1])["silent"]] == [silent]
    others = c.others(lead)
    c.block([c.attest_tx(pk, [950_000] * 4) for pk in others])
    assert c.audit.status == audits.OPEN  # silence waits for the epoch's end
    c.block([c.silence_tx(pk, silent, answered) for pk, answered in zip(others, confirm, strict=False)])
    q = audits.decode_query(c.app.query("/audit", b"")[1])
    assert q["silent"] == [[silent, 10 * confirm.count(False), 10 * confirm.count(True)]]
    assert c.rejected(c.silence_tx(others[0], silent, True)).code.name == "DUPLICATE"
    c.to_epoch_start(2)
    out = c.outcome(1)
    honest = [n.node_id for n in c.nodes if n.node_id != silent]
    if expect == "aborted":
        assert out.status == audits.ABORTED and "silent" in out.reason and "30 of 40" in out.reason
        assert c.reputation(silent) == R0 and all(c.reputation(n) == R0 for n in honest)
        return
    assert out.status == audits.APPLIED
    assert all(c.audit.reputation.get(n).epochs == 1 for n in honest)
    if expect == "zero":
        rep = c.audit.reputation.get(silent)
        assert rep.epochs == 1 and rep.window == (True,) and rep.value == 400_000 * R0 // SCALE
        assert silent not in c.listed_models()  # 0.2: untrusted at once
        assert "unconfirmed" not in out.reason
    else:
        assert silent not in c.audit.reputation.nodes and "2 unconfirmed silent entries ignored" in out.reason
        assert silent in c.listed_models()


def test_a_mixed_node_gets_its_replies_and_a_confirmed_zero() -> None:
    c = Committee()
    lead = epoch1(c)
    entries = c.honest_entries(lead)
    node = entries[0].node_id
    entries[1] = at.SilentEntry(node, 1, "no reply")
    report = c.report_tx(lead, entries)  # report and attestations in one block
    c.block([report, *[c.attest_tx(pk, [950_000] * 5, at.report_hash(report)) for pk in c.others(lead)[:2]]])
    c.block([c.silence_tx(pk, node, False) for pk in c.others(lead)[:2]])
    c.to_epoch_start(2)
    rep = c.audit.reputation.get(node)
    mean = (950_000 + 0 + 1) // 2  # half up
    assert rep.epochs == 1 and rep.window == (True,)  # 0.475 < tau
    assert rep.value < 400_000 * R0 // SCALE + 600_000 * mean // SCALE


def test_an_epoch_without_audited_nodes_records_why() -> None:
    c = Committee(n_nodes=0)
    lead = c.elect(0)
    commit, _ = c.commit_tx(lead, openings=[], node_ids=[])
    c.block([commit])
    c.to_epoch_start(1)
    assert c.audit.challenges == () and c.audit.committer == lead
    c.to_epoch_start(2)
    assert "named no model node" in c.outcome(1).reason
