"""The transcript dimension of ``gentorrent bench audit-evasion`` (verifier/bench/audit_evasion.py,
decision 0015): users' transcripts go through the real book and chain, count for the node that
signed the reply, a silent node burns its donors, every framer commitment is either counted or
withheld (and withholding burns identities), and the timing-leak simulation agrees with its closed form."""

from __future__ import annotations

import math

import numpy as np
import pytest

from overlay.wire.messages import ChatMessage, SamplingParams
from verifier.audit import chain
from verifier.audit import transcripts as tr
from verifier.bench import audit_evasion as ae

PARAMS = SamplingParams(temperature=0.7, top_p=1.0, top_k=0, max_tokens=256, seed=None)


def req(i: int, source: str = "user") -> ae.Req:
    return ae.Req(float(i), (ChatMessage("user", f"question number {i}?"),), PARAMS, (i,), (i,), i, 0, False, source,
                  i % 5 if source == "user" else -1)


def view(user_score: float) -> ae.View:
    """A view whose detector scores every challenge 0 and every user request ``user_score``."""
    users = [req(i) for i in range(40)]
    return ae.View("test", "combined", 0.5, [(req(100 + i, "donated"), 0.0) for i in range(40)],
                   np.full(len(users), user_score), users)


@pytest.fixture(scope="module")
def scores() -> ae.ScoreTable:
    if not ae.SCORES_FILE.is_file():
        pytest.skip(f"{ae.SCORES_FILE} is missing")
    return ae.ScoreTable()


def run(scores: ae.ScoreTable, specs: list[ae.NodeSpec], epochs: int, **kw: object) -> ae.RunResult:
    return ae.ChainRun(7, specs, scores, view(-1.0), chain.DEFAULT_EPOCH_BLOCKS, chain.DEFAULT_CHALLENGES_PER_NODE,
                       **kw).run(epochs)  # type: ignore[arg-type]


def test_a_forwarders_flagged_transcripts_count_for_the_peer_that_signed_them(scores: ae.ScoreTable) -> None:
    flags_all = view(1.0)  # every user request scores above every challenge: all flagged
    specs = [ae.NodeSpec("honest", "honest"), ae.NodeSpec("fwd", "forwarder", flags_all, 1.0, 0)]
    res = run(scores, specs, 3, rho=1.0)  # epochs 0 and 1 counted (in the next epoch's report window)
    own_at_most = 2 * 5 * tr.MAX_PER_NODE  # 2 epochs, 5 donors, each at most MAX_PER_NODE a node and epoch
    assert res.counted["fwd"] == 0 and res.counted["honest"] > own_at_most  # its own + the forwarded ones
    no_flags = run(scores, [ae.NodeSpec("honest", "honest"), ae.NodeSpec("fwd", "forwarder", view(-1.0), 0.5, 0)], 3,
                   rho=1.0)
    assert no_flags.counted["fwd"] > 0


def test_an_aborter_burns_the_donors_it_leaves_without_reply(scores: ae.ScoreTable) -> None:
    res = run(scores, [ae.NodeSpec("abort", "aborter", view(1.0), 1.0, 0)], 8, rho=1.0)
    assert res.counted["abort"] == 0 and res.burnt["abort"] == 5  # its users: 5 donors, every set void


def test_without_donations_nothing_is_committed(scores: ae.ScoreTable) -> None:
    res = run(scores, [ae.NodeSpec("honest", "honest")], 2, rho=0.0)
    assert res.counted["honest"] == 0 and res.burnt["honest"] == 0


def test_every_framer_commitment_is_counted_or_burns_its_identity(scores: ae.ScoreTable) -> None:
    res = run(scores, [ae.NodeSpec("victim", "honest")], 12, framers=6, frame_from=1)
    # each commitment is revealed (bad: counted once its epoch closes, the next one) or withheld
    assert 6 * 10 <= res.framer_counted + res.framer_withheld <= 6 * 11
    assert res.counted["victim"] == res.framer_counted > 0  # no donations: only the framers' reveals
    assert res.framer_burnt > 0  # withholding burns identities (past the book's void budget)


def test_short_reply_framers_get_nothing_once_transcripts_weigh_by_length(scores: ae.ScoreTable) -> None:
    """Decision 0021: framers asking for 4-token replies (measured honest replies) found many under
    τ before the length weight, none after: every commitment withheld, nothing counted."""
    if not ae.SHORT_FILE.is_file():
        pytest.skip(f"{ae.SHORT_FILE} is missing")
    weighted, unweighted = ae.ShortReplies(True), ae.ShortReplies(False)
    assert min(weighted.rows) >= ae.FRAMER_TAU
    assert sum(x < ae.FRAMER_TAU for x in unweighted.rows) >= 0.2 * len(unweighted.rows)
    before = run(scores, [ae.NodeSpec("victim", "honest")], 8, framers=6, frame_from=1, framer_scores=unweighted)
    after = run(scores, [ae.NodeSpec("victim", "honest")], 8, framers=6, frame_from=1, framer_scores=weighted)
    assert before.framer_counted > 0
    assert after.framer_counted == 0 and after.counted["victim"] == 0 and after.framer_withheld >= 6 * 6


def test_the_timing_leak_matches_its_closed_form() -> None:
    f = ae.timing_leak((0.25,), 2000, 120.0, 1)
    for nodes in ae.NETWORK_NODES:
        rate = 0.25 * nodes * ae.USER_REQUESTS_PER_S  # commitments a second, network-wide
        for w in ae.LEAK_WINDOWS_S:
            if w < ae.COMMIT_LEAD_S[1]:
                continue
            # every committed request is inside W; any other is when a commitment came in the W before it
            assert f[f"timing_nodes{nodes}_rho25_w{w:g}s_committed_dodged_share"] == 1.0
            got = f[f"timing_nodes{nodes}_rho25_w{w:g}s_served_honestly_share"]
            assert got == pytest.approx(0.25 + 0.75 * (1 - math.exp(-rate * w)), abs=0.03)


def test_boosters_keep_a_cheater_trusted_under_the_plain_mean_but_not_when_capped_by_donor(
        scores: ae.ScoreTable) -> None:
    """Decision 0028, the attacker played on the real book and chain: a cheater that recognises
    every challenge (and serves those honestly) degrades all its users' requests, and 32 registered
    sybil users of its own commit and reveal 4 requests to it an epoch, which it serves honestly.
    With the transcripts' plain mean their honest replies outweigh its users' bad ones and it stays
    trusted; capped by donor (as built), its users' sets cap every transcript score and it is
    untrusted within UNTRUSTED_WITHIN epochs."""
    from overlay.wire.constants import TRUST_LINE

    cheat_from = 2
    specs = [ae.NodeSpec("honest", "honest"), ae.NodeSpec("cheat", "selective", view(-1.0), 1.0, cheat_from)]
    epochs = cheat_from + ae.UNTRUSTED_WITHIN + 1
    alone = run(scores, specs, epochs, rho=0.1, boosters=0, by_donor=False)
    got = ae._epochs_to_untrusted(alone.reputation["cheat"], cheat_from, TRUST_LINE)
    assert got is not None and got <= ae.UNTRUSTED_WITHIN  # without boosters its users' transcripts catch it
    plain = run(scores, specs, epochs, rho=0.1, boosters=32, by_donor=False)
    capped = run(scores, specs, epochs, rho=0.1, boosters=32, by_donor=True)
    assert plain.booster_counted == capped.booster_counted > 0
    assert ae._epochs_to_untrusted(plain.reputation["cheat"], cheat_from, TRUST_LINE) is None
    got = ae._epochs_to_untrusted(capped.reputation["cheat"], cheat_from, TRUST_LINE)
    assert got is not None and got <= ae.UNTRUSTED_WITHIN
    assert min(capped.reputation["honest"]) >= TRUST_LINE


def test_the_benchs_verifiers_score_within_their_budget_as_the_audit_loop_draws(scores: ae.ScoreTable) -> None:
    """Decision 0034: the bench's verifiers score what rules 8 and 9 draw, not every counted
    transcript. Two honest nodes whose users donate everything (20 transcripts a node and round
    at 256 tokens: about 5,000 of cost) fit a verifier's budget alone; in a network of
    SCORING_NETWORK_NODES such nodes they do not (at one --audit-threads), so each verifier scores a share of them, a
    sample of its own. Unbudgeted, every verifier scores every counted transcript. Fails when the
    bench scores everything, when the network's other nodes are left out of the draw, or when a
    reply weighs as the few token ids it carries rather than as long as it is."""
    specs = [ae.NodeSpec("a", "honest"), ae.NodeSpec("b", "honest")]
    whole = run(scores, specs, 4, rho=1.0, budgeted=False)
    counted = sum(whole.counted.values())
    assert counted > 0 and whole.scored == ae.VERIFIERS * counted
    drawn = run(scores, specs, 4, rho=1.0, threads=1)  # one --audit-threads: the budget binds
    assert sum(drawn.counted.values()) == counted  # the same transcripts count ...
    share = ae.VERIFIERS * 2 * 3 * tr.ROUND_BUDGET / ae.SCORING_NETWORK_NODES / 256
    assert 0 < drawn.scored < whole.scored / 2 and drawn.scored < 2 * share  # ... a share of them is scored
    assert min(min(r) for r in drawn.reputation.values()) >= 500_000  # honest nodes stay trusted on fewer
