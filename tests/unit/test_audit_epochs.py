"""The audit's chain rules (verifier/audit/chain.py, decision 0013), on four app cores fed the
same blocks. Each attack of issue 27 that the chain must stop has a test here that plays it:
the schedule read from the chain, a forwarder, a node silent to some verifiers, a verifier
framing an honest node or saving a cheater, a replayed reply, an honest node with a bad epoch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import msgpack
import pytest

from overlay.directory import registration as tx
from overlay.wire.constants import TRUST_LINE
from tests.audit_helpers import MODEL, Committee, Plan, fresh_opening, fresh_script
from verifier.audit import chain as audits
from verifier.audit import tx as at
from verifier.audit.reputation import R0

DEGRADED = 450_000  # a cheap model's typical calibrated score (decision 0010: mean 0.47)


def started(n_nodes: int = 3, **kw: object) -> Committee:
    c = Committee(n_nodes=n_nodes, **kw)  # type: ignore[arg-type]
    c.to_epoch_start(1)
    return c


# ------------------------------------------------------------------ windows and shape


def test_a_commit_is_taken_only_in_the_commit_window_and_once() -> None:
    c = started()
    p = c.plan(c.pk(0))
    c.block([c.commit_tx(p)])
    assert c.rejected(c.commit_tx(c.plan(c.pk(0)))).code == tx.Code.DUPLICATE
    c.to_height(c.audit.commit_until())
    assert c.rejected(c.commit_tx(c.plan(c.pk(1)))).code == tx.Code.LATE


def test_a_report_is_taken_only_in_the_report_window_after_a_commit() -> None:
    c = started()
    p, q = c.plan(c.pk(0)), c.plan(c.pk(1))
    c.block([c.commit_tx(p)])
    early = c.report_tx(p, c.answers(p))
    assert c.rejected(early).code == tx.Code.TOO_EARLY
    c.to_height(c.audit.report_from() - 1)
    assert c.rejected(c.report_tx(q, c.answers(q))).code == tx.Code.CONFLICT  # never committed
    c.block([c.report_tx(p, c.answers(p))])
    assert c.rejected(c.report_tx(p, c.answers(p))).code == tx.Code.DUPLICATE


def test_a_report_must_reveal_exactly_the_committed_plan() -> None:
    c = started()
    p = c.plan(c.pk(0))
    c.block([c.commit_tx(p)])
    c.to_height(c.audit.report_from() - 1)
    entries = c.answers(p)
    swapped = [*entries[:-1], at.ReportEntry(entries[-1].node_id, fresh_opening(),
                                             c.node(entries[-1].node_id).reply(fresh_opening()))]
    assert "does not match the hash" in c.rejected(c.report_tx(p, swapped)).log
    assert "does not match the hash" in c.rejected(c.report_tx(replace(p, salt=bytes(16)), entries)).log
    skipped = replace(p, items=p.items[2:])  # a node left out: its own hash would differ too
    assert c.rejected(c.report_tx(skipped, entries[2:])).code == tx.Code.INVALID_FIELD
    c.block([c.report_tx(p, entries)])


def test_report_entries_must_be_grouped_by_node_with_k_each() -> None:
    c = started()
    pk = c.pk(0)
    ids = sorted(n.node_id for n in c.nodes)
    bad_orders = [
        [(ids[1], fresh_opening()), (ids[1], fresh_opening()), (ids[0], fresh_opening()), (ids[0], fresh_opening())],
        [(ids[0], fresh_opening()), (ids[1], fresh_opening()), (ids[0], fresh_opening()), (ids[1], fresh_opening())],
        [(ids[0], fresh_opening()), (ids[0], fresh_opening()), (ids[0], fresh_opening())],
    ]
    for items in bad_orders:
        p = replace(c.plan(pk, node_ids=[]), items=items)
        c.to_epoch_start(c.audit.epoch + 1)
        c.block([c.commit_tx(p)])
        c.to_height(c.audit.report_from() - 1)
        assert "grouped by node id" in c.rejected(c.report_tx(p, c.answers(p))).log


def test_a_reply_that_does_not_verify_is_the_reporters_lie_and_refused() -> None:
    c = started()
    p = c.plan(c.pk(0))
    c.block([c.commit_tx(p)])
    c.to_height(c.audit.report_from() - 1)
    entries = c.answers(p)
    out = entries[0].outcome
    assert isinstance(out, at.ReplyOutcome)
    altered = replace(entries[0], outcome=replace(out, chunks=(("A different answer", (1, 2)),)))
    assert c.rejected(c.report_tx(p, [altered, *entries[1:]])).code == tx.Code.BAD_SIGNATURE


# ------------------------------------------------------------------ issue 27's attacks


def test_the_schedule_cannot_be_read_from_the_chain_before_the_challenges_are_answered() -> None:
    """Item 2: what /audit shows during the send window names who committed, never a prompt, a
    node chosen, a time or a path; the committed bytes hold only a hash of the plan."""
    c = started()
    plans = [c.plan(pk) for pk in c.pks()]
    commits = [c.commit_tx(p) for p in plans]
    c.block(commits)
    c.to_height(c.audit.commit_until() + 1)
    view = audits.decode_query(c.app.query("/audit", b"")[1])
    state = c.app.committed.canonical_bytes()
    for p, raw in zip(plans, commits, strict=True):
        for _node, op in p.items:
            for secret in (op.salt, op.commitment(), op.prompt_key(), op.messages[-1].content.encode()):
                assert secret not in state and secret not in raw
                assert secret not in repr(view).encode()
        assert p.salt not in state
    assert sorted(view["committed"]) == sorted(c.pks()) and view["reported"] == []
    # every model node is audited by every verifier: "who" carries no information
    assert sorted(dict(view["nodes"])[MODEL]) == sorted(n.node_id for n in c.nodes)


def test_a_forwarded_challenge_is_scored_for_the_node_it_was_sent_to() -> None:
    """Item 3: the challenged node answers for what it returns; the reply was signed by a peer."""
    c = started()
    cheat, peer = c.nodes[0].node_id, c.nodes[1].node_id

    def forwarded(p: object) -> list[at.ReportEntry]:
        out = []
        for n, op in p.items:  # type: ignore[attr-defined]
            signer = c.node(peer if n == cheat else n)
            out.append(at.ReportEntry(n, op, signer.reply(op, score=DEGRADED if n == cheat else 950_000, target=n)))
        return out

    c.epoch(entries=forwarded)
    assert c.audit.reputation.get(cheat).epochs == 1
    assert c.reputation(cheat) < c.reputation(peer)


def test_a_reply_forwarded_to_a_node_that_left_is_void_not_a_refused_report() -> None:
    """The signer of a forwarded reply left before the report: its signature can no longer be
    checked, so the entry is void; the report (and its other entries) still counts."""
    c = started()
    a, peer, other = (n.node_id for n in c.nodes)
    p = c.plan(c.pk(0))
    c.block([c.commit_tx(p)])
    c.to_height(c.audit.report_from() - 2)
    entries = [at.ReportEntry(n, op, c.node(peer if n == a else n).reply(op, target=n)) for n, op in p.items]
    c.block([c.node(peer).node.leave()])
    c.block([c.report_tx(p, entries)])
    tallies = dict(dict(c.audit.reports)[c.pk(0)])
    assert a not in tallies and peer not in tallies and len(tallies[other]) == 2


def test_a_reply_signed_outside_the_epoch_counts_as_no_answer() -> None:
    """Item 8: a reply signed before the commit (precomputed, leaked early) or long after is no answer."""
    c = started()
    old = (c.now - 10_000) * 1000

    def stale(p: object) -> list[at.ReportEntry]:
        return [at.ReportEntry(n, op, c.node(n).reply(op, signed_at_ms=old)) for n, op in p.items]  # type: ignore[attr-defined]

    out = c.epoch(entries=stale)
    assert "3 missed" in out.reason
    assert all(c.reputation(n.node_id) == R0 for n in c.nodes)
    assert dict(c.audit.misses) == {n.node_id: 1 for n in c.nodes}


def test_one_verifier_cannot_frame_an_honest_node_nor_save_a_cheater() -> None:
    """Collusion below 1/3: a Byzantine verifier reports 0 for the honest node and 1.0 for the
    cheater; the per-node median follows the honest verifiers."""
    c = started(n_nodes=2)
    honest, cheat = sorted(n.node_id for n in c.nodes)
    liar = c.pk(3)

    def entries(p: object) -> list[at.ReportEntry]:
        out = []
        for n, op in p.items:  # type: ignore[attr-defined]
            truth = 950_000 if n == honest else DEGRADED
            lie = {honest: 0, cheat: 1_000_000}[n]
            out.append(at.ReportEntry(n, op, c.node(n).reply(op, score=lie if p.pk == liar else truth)))  # type: ignore[attr-defined]
        return out

    for _ in range(3):
        c.epoch(entries=entries)
    assert c.reputation(honest) > 0.9e6
    assert c.reputation(cheat) < TRUST_LINE


def test_leaked_challenges_answered_honestly_do_not_save_a_cheater() -> None:
    """One colluding verifier tells the cheater its challenges (answered with the real model);
    the others' are answered cheaply."""
    c = started(n_nodes=1)
    cheat = c.nodes[0].node_id
    leaker = c.pk(0)

    def entries(p: object) -> list[at.ReportEntry]:
        score = 990_000 if p.pk == leaker else DEGRADED  # type: ignore[attr-defined]
        return [at.ReportEntry(n, op, c.node(n).reply(op, score=score)) for n, op in p.items]  # type: ignore[attr-defined]

    epochs = 0
    while c.reputation(cheat) >= TRUST_LINE:
        c.epoch(entries=entries)
        epochs += 1
    assert epochs <= 2


def test_a_node_silent_to_some_verifiers_aborts_nothing_and_is_scored_by_the_others() -> None:
    """Item 7: a node silent to one verifier (the old epoch aborter) changes no other node's
    epoch; with answers from the majority it is scored as usual."""
    c = started(n_nodes=2)
    a, b = sorted(n.node_id for n in c.nodes)
    muted = c.pk(0)

    def entries(p: object) -> list[at.ReportEntry]:
        out = []
        for n, op in p.items:  # type: ignore[attr-defined]
            silent = n == a and p.pk == muted  # type: ignore[attr-defined]
            out.append(at.ReportEntry(n, op, at.FailOutcome("silent", 3) if silent else c.node(n).reply(op)))
        return out

    out = c.epoch(entries=entries)
    assert out.status == audits.APPLIED and "2 node(s) scored" in out.reason
    assert c.reputation(a) == c.reputation(b) > R0


def test_an_honest_node_with_a_missed_epoch_stays_trusted_and_three_in_a_row_score_zero() -> None:
    """Item 6: one silent or busy epoch (a restart) costs nothing; only MISS_LIMIT in a row count."""
    c = started(n_nodes=2)
    node, other = sorted(n.node_id for n in c.nodes)
    for _ in range(3):
        c.epoch()
    trusted = c.reputation(node)

    def silent(p: object) -> list[at.ReportEntry]:
        return [at.ReportEntry(n, op, at.FailOutcome("busy", 3) if n == node else c.node(n).reply(op))
                for n, op in p.items]  # type: ignore[attr-defined]

    c.epoch(entries=silent)
    assert c.reputation(node) == trusted and dict(c.audit.misses) == {node: 1}
    c.epoch()
    assert c.audit.misses == () and c.reputation(node) >= trusted
    for _ in range(audits.MISS_LIMIT):
        c.epoch(entries=silent)
    assert c.reputation(node) < trusted and c.audit.reputation.get(node).window[-1]  # scored 0: abnormal
    assert c.reputation(other) > 0.9e6


def test_a_node_is_not_judged_without_reports_from_more_than_two_thirds_of_the_power() -> None:
    c = started()
    out = c.epoch(scores={n.node_id: 0 for n in c.nodes}, pks=c.pks()[:2])
    assert "3 not audited" in out.reason
    assert all(c.reputation(n.node_id) == R0 for n in c.nodes)


def test_an_untrusted_node_stays_listed_and_audited_and_an_honest_one_comes_back() -> None:
    """Item 6: untrusted nodes stay on the list (marked by their reputation) so audits reach them."""
    c = started(n_nodes=1)
    node = c.nodes[0].node_id
    c.epoch(scores={node: 100_000})
    assert c.reputation(node) < TRUST_LINE
    assert node in dict(audits.nodes_by_model(c.audit, c.app.committed.nodes))[MODEL]
    assert [r[0] for r in c.listed_models()] == [node]
    c.epoch()
    c.epoch()
    assert c.reputation(node) >= TRUST_LINE


def test_a_model_is_audited_only_while_holders_have_more_than_two_thirds_of_the_power() -> None:
    """Item 5: every model a node may register is audited by verifiers that hold it, or listed as unaudited."""
    c = started()
    assert audits.audited_models(c.audit, c.app.committed.validator_powers()) == frozenset()
    plans = [c.plan(pk, models=(MODEL, "other-model")) if i < 2 else c.plan(pk) for i, pk in enumerate(c.pks())]
    c.block([c.commit_tx(p) for p in plans])
    powers = c.app.committed.validator_powers()
    assert audits.audited_models(c.audit, powers) == {MODEL}
    records = c.listed_models()
    assert records and all(r[10] is True for r in records)  # their model is audited
    assert audits.decode_query(c.app.query("/audit", b"")[1])["audited_models"] == [MODEL]


def test_a_report_may_not_name_a_model_its_commit_did_not_declare() -> None:
    c = started()
    p = c.plan(c.pk(0), models=("other-model",))
    c.block([c.commit_tx(p)])
    c.to_height(c.audit.report_from() - 1)
    assert "not one the commit declared" in c.rejected(c.report_tx(p, c.answers(p))).log


def test_a_revealed_prompt_reused_in_a_later_epoch_is_void() -> None:
    c = started(n_nodes=1)
    node = c.nodes[0].node_id
    first = c.plan(c.pk(0))
    # epoch 1: validator 0's plan reveals its prompts
    plans = [first, *(c.plan(pk) for pk in c.pks()[1:])]
    c.block([c.commit_tx(p) for p in plans])
    c.to_height(c.audit.report_from() - 1)
    c.block([c.report_tx(p, c.answers(p)) for p in plans])
    c.to_height(c.audit.end_height())
    # epoch 2: every verifier reuses those revealed prompts, reporting 0: all void, node not audited
    reused = [c.plan(pk) for pk in c.pks()]
    for p in reused:
        p.items = [(n, replace(op, salt=bytes(16))) for n, op in first.items]
    before = c.reputation(node)
    c.block([c.commit_tx(p) for p in reused])
    c.to_height(c.audit.report_from() - 1)
    c.block([c.report_tx(p, c.answers(p, score=0)) for p in reused])
    c.to_height(c.audit.end_height())
    assert c.reputation(node) == before


@pytest.mark.parametrize("powers", [(10, 10, 10, 10), (40, 10, 10, 10), (1, 2, 3, 4), (5, 5, 5, 6)])
@pytest.mark.parametrize("lie", [0, 1_000_000])
def test_the_median_lies_within_the_honest_verifiers_scores(powers: tuple[int, ...], lie: int) -> None:
    """Whatever validators below 1/3 of the power report, a node's C(T) lies within the honest
    verifiers' own measurements."""
    c = started(n_nodes=1, powers=powers)
    node = c.nodes[0].node_id
    vals = c.app.committed.validator_powers()
    total = sum(p for _, p in vals)
    liars, power = set(), 0
    for pk, p in sorted(vals, key=lambda v: v[1]):  # as many of the lightest as stay below 1/3
        if 3 * (power + p) < total:
            liars.add(pk)
            power += p
    honest = {pk: 700_000 + 50_000 * i for i, (pk, _) in enumerate(vals)}
    plans = [c.plan(pk) for pk, _ in vals]
    c.block([c.commit_tx(p) for p in plans])
    c.to_height(c.audit.report_from() - 1)
    c.block([c.report_tx(p, c.answers(p, score=lie if p.pk in liars else honest[p.pk])) for p in plans])
    got = audits.node_epoch(c.audit, node, dict(vals))
    truthful = [s for pk, s in honest.items() if pk not in liars]
    assert isinstance(got, int) and min(truthful) <= got <= max(truthful)


def test_audit_state_round_trips_through_its_wire_form() -> None:
    c = started()
    c.epoch()
    p = c.plan(c.pk(0))
    c.block([c.commit_tx(p)])
    st = c.audit
    assert audits.AuditState.from_wire(st.to_wire()) == st


def test_genesis_params_refuse_the_old_form_with_a_reason() -> None:
    with pytest.raises(audits.AuditParamsError, match="verifiers now declare their models"):
        audits.params_from_app_state(b'{"audit": {"model": "m", "epoch_blocks": 20}}')
    assert audits.params_from_app_state(b'{"audit": {}}') == audits.AuditParams()
    with pytest.raises(audits.AuditParamsError):
        audits.AuditParams(epoch_blocks=audits.MIN_EPOCH_BLOCKS - 1)


def test_the_reply_window_is_a_genesis_parameter_that_leaves_older_chains_bytes_alone() -> None:
    """Decision 0040: ``reply_window_s`` in ``app_state.audit`` (default 600). A chain at the default
    encodes its parameters as before, so its state and app hash do not change; another window is in
    the state, round-trips and is shown by ``/audit``; one out of range is refused with its bounds."""
    from overlay.directory import transcripts as tw

    default = audits.AuditParams()
    assert default.to_wire() == [audits.DEFAULT_EPOCH_BLOCKS, audits.DEFAULT_CHALLENGES_PER_NODE]
    assert audits.params_from_app_state(b'{"audit": {"epoch_blocks": 120}}') == audits.AuditParams(120)
    short = audits.params_from_app_state(b'{"audit": {"epoch_blocks": 120, "reply_window_s": 22}}')
    assert short == audits.AuditParams(120, audits.DEFAULT_CHALLENGES_PER_NODE, 22) and short.reply_window_ms() == 22_000
    assert short.to_wire() == [120, audits.DEFAULT_CHALLENGES_PER_NODE, 22]
    assert audits.AuditParams.from_json(short.to_json()) == short
    st = audits.initial(short, "c")
    assert audits.AuditState.from_wire(st.to_wire()) == st
    assert audits.AuditState.from_wire(audits.initial(default, "c").to_wire()).params == default
    for bad in (tw.MIN_REPLY_WINDOW_S - 1, tw.MAX_REPLY_WINDOW_S + 1, 30.0, "30"):
        with pytest.raises(audits.AuditParamsError, match=r"reply_window_s must be an integer 10\.\.600"):
            audits.AuditParams(120, 2, bad)  # type: ignore[arg-type]
    for window, shown in ((22, 22), (None, tw.DEFAULT_REPLY_WINDOW_S)):
        result, raw = started(reply_window_s=window).app.query("/audit", b"")
        assert result.ok and msgpack.unpackb(raw)["reply_window_s"] == shown


def test_the_median_of_four_equal_verifiers_with_one_liar_is_not_the_lowest_honest_mean() -> None:
    """Three honest means 0.70, 0.90, 0.95 and a liar's 0: C(T) is the midpoint of the two middle
    values (0.80), not the lowest honest one (the lower median's 0.70, under τ)."""
    assert audits._median([(0, 10), (700_000, 10), (900_000, 10), (950_000, 10)]) == 800_000
    assert audits._median([(1_000_000, 10), (700_000, 10), (900_000, 10), (950_000, 10)]) == 925_000
    assert audits._median([(5, 1), (7, 3)]) == 7
    assert audits._median([(5, 2), (8, 2)]) == 7  # (5 + 8) / 2 rounded half up


@pytest.mark.parametrize(("epoch_blocks", "report_blocks"), [(12, 3), (60, 10), (120, 20), (900, 20), (3600, 20)])
def test_the_report_window_is_a_sixth_of_the_epoch_capped_at_twenty_blocks(epoch_blocks: int,
                                                                          report_blocks: int) -> None:
    """Decision 0024: a long epoch keeps a short report window, so that no long span of it is one
    in which no challenge can come (a node would serve cheaply there)."""
    params = audits.AuditParams(epoch_blocks=epoch_blocks)
    assert params.report_blocks() == report_blocks
    st = audits.initial(params, "c")
    assert st.end_height() - st.report_from() + 1 == report_blocks


def _script_entry(c: Committee, node_id: bytes, opening: at.Opening, scores: Sequence[int],
                  last: at.FailOutcome | None = None, texts: Sequence[str] | None = None) -> at.ReportEntry:
    """``node_id``'s replies to the first turns of ``opening``, each after its own earlier replies
    (``texts``, default the replies' own), scored ``scores``; the last turn sent failed with ``last``."""
    node = c.node(node_id)
    replies: list[at.ReplyOutcome] = []
    got: list[str] = []
    for turn, score in enumerate(scores):
        r = node.reply(opening, score=score, turn=turn, replies=list(texts[:turn]) if texts else got,
                       chunks=((f"Reply {turn}", (5, 6)), ("", (2,))))
        replies.append(r)
        got.append(at.reply_text(r))
    if last is None:
        return at.ReportEntry(node_id, opening, replies[-1], tuple(replies[:-1]))
    return at.ReportEntry(node_id, opening, last, tuple(replies))


def _scripts_committed(*turns: int) -> tuple[Committee, Plan]:
    """Validator 0's committed plan in epoch 1: one script of each of ``turns`` turns for the first
    node, the chain at the block before the report window."""
    c = Committee()
    c.to_epoch_start(1)
    node = c.nodes[0].node_id
    p = c.plan(c.pks()[0], node_ids=[node])
    p.items = [(node, fresh_script(t)) for t in turns]
    c.block([c.commit_tx(p)])
    c.to_height(c.audit.report_from() - 1)
    return c, p


def test_a_script_counts_every_turn_the_node_answered_after_its_own_replies() -> None:
    """Decision 0025: a challenge is a script replayed turn by turn; the chain checks each turn's
    reply against the request with the node's own earlier replies in place, and every answered
    turn is a score of the node."""
    c, p = _scripts_committed(3, 2)
    pk, node = p.pk, p.items[0][0]
    entries = [_script_entry(c, node, p.items[0][1], [900_000, 800_000, 700_000]),
               _script_entry(c, node, p.items[1][1], [600_000], last=at.FailOutcome("busy", 3))]
    (res,) = c.block([c.report_tx(p, entries)])
    assert res.code == 0, res.log
    assert dict(c.audit.reports)[pk] == ((node, (900_000, 800_000, 700_000, 600_000)),)


@pytest.mark.parametrize("forge", ["history", "turn", "earlier"])
def test_a_script_reply_to_another_history_or_turn_is_the_reporters_lie(forge: str) -> None:
    """A verifier cannot pass off a reply to another conversation as the answer to a turn: a reply
    signed with other earlier replies in place, or for another turn, does not verify."""
    c, p = _scripts_committed(2, 1)
    node, script = p.items[0]
    turn = 0 if forge == "earlier" else 1
    if forge == "history":
        bad = _script_entry(c, node, script, [950_000, 950_000], texts=["something else"])
    elif forge == "earlier":  # turn 0's reply with its signature forged; turn 1 signed after its text
        good = _script_entry(c, node, script, [950_000, 950_000])
        bad = replace(good, earlier=(replace(good.earlier[0], signature=bytes(64)),))
    else:
        first = c.node(node).reply(script, turn=0)
        again = c.node(node).reply(script, turn=0, chunks=(("Another", (9,)), ("", (2,))))
        bad = at.ReportEntry(node, script, again, (first,))  # turn 0's reply reported as turn 1's
    entries = [bad, _script_entry(c, node, p.items[1][1], [950_000])]
    res = c.rejected(c.report_tx(p, entries))
    assert res.code == tx.Code.BAD_SIGNATURE and f"entry 0: turn {turn}" in res.log


def test_the_clis_audit_constants_are_the_chains() -> None:
    """verifier/cli.py repeats the defaults, and gentorrent/tools/devnet.py the challenges-per-node
    bound, to stay light to import; they must not drift."""
    from gentorrent.tools import devnet
    from overlay.directory import transcripts as tw
    from verifier import cli

    assert devnet.MAX_CHALLENGES_PER_NODE == at.MAX_CHALLENGES_PER_NODE

    assert (cli._DEFAULT_EPOCH_BLOCKS, cli._DEFAULT_CHALLENGES) == (audits.DEFAULT_EPOCH_BLOCKS,
                                                                    audits.DEFAULT_CHALLENGES_PER_NODE)
    assert (cli._DEFAULT_REPLY_WINDOW, cli._MIN_REPLY_WINDOW, cli._MAX_REPLY_WINDOW) == (
        tw.DEFAULT_REPLY_WINDOW_S, tw.MIN_REPLY_WINDOW_S, tw.MAX_REPLY_WINDOW_S)
