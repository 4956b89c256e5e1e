"""How ``gentorrent bench audit-evasion`` sends challenges: as built (decision 0026,
``script_personas``: every challenge over the paths its verifier's persona holds for the epoch),
and decision 0020's what-if (``persona``: challenges made by the users' own traffic model from
donors' prompts, their paths retired at each epoch's end); the node's path age is an extra
feature; a revealed challenge labels its paths from the next epoch on."""

from __future__ import annotations

import math

import pytest

from verifier.audit import chain
from verifier.bench import audit_evasion as ae

TIMING = ae.Timing(120, chain.COMMIT_BLOCKS)
USERS = [f"user prompt {i}" for i in range(40)]
DONORS = [f"donor prompt {i}" for i in range(40)]


def _persona_paths(mode: str) -> dict[int, set[int]]:
    """Each persona path id -> the epochs it carried challenges in."""
    reqs, served = ae.stream(3, "donated", 30, TIMING, 2, USERS, DONORS, paths=mode)
    chs = [r for r in reqs if r.source == "donated"]
    assert chs and all(r.ident in served for r in chs)  # donors' conversations: a colluder knows them all
    assert {r.messages[-1].content for r in chs} <= set(DONORS)
    epochs: dict[int, set[int]] = {}
    for r in chs:
        for p in r.paths:
            epochs.setdefault(p, set()).add(int(r.t // TIMING.epoch_s))
    return epochs


def test_persona_paths_never_outlive_their_epoch() -> None:
    epochs = _persona_paths("persona")
    assert epochs and all(len(e) == 1 for e in epochs.values())


def test_persona_challenges_spread_over_the_whole_epoch() -> None:
    reqs, _ = ae.stream(4, "donated", 40, TIMING, 2, USERS, DONORS, paths="persona")
    offsets = {int(r.t / ae.BLOCK_S) % TIMING.epoch_blocks for r in reqs if r.source == "donated"}
    assert offsets & set(range(TIMING.send_first)) and offsets & set(range(TIMING.send_last + 1, TIMING.epoch_blocks))


def _req(t: float, paths: tuple[int, ...], source: str) -> ae.Req:
    from overlay.wire.messages import ChatMessage, SamplingParams

    params = SamplingParams(temperature=0.7, top_p=1.0, top_k=0, max_tokens=256, seed=None)
    return ae.Req(t, (ChatMessage("user", "hello there"),), params, paths, paths, int(t), 0, False, source)


def test_a_challenge_labels_its_paths_once_its_epoch_has_ended() -> None:
    e = TIMING.epoch_s
    reqs = [_req(10.0, (1, 2), "donated"), _req(20.0, (1, 2), "user"), _req(e + 10.0, (1, 2), "user"),
            _req(e + 20.0, (3, 4), "user")]
    obs = ae.observe(reqs, set(), TIMING, ae.TemplateMatcher(), path_age=True)
    revealed, age = ae.FEATURES.index("revealed_paths"), len(ae.FEATURES)
    assert [row[revealed] for row in obs.rows] == [0.0, 0.0, 1.0, 0.0]  # revealed by the report at its end
    obs.rows.pop(1)
    assert obs.rows[0][age] == 0.0 and obs.rows[1][age] == pytest.approx(math.log1p(e)) and obs.rows[2][age] == 0.0
    assert len(obs.rows[0]) == len(ae.FEATURES) + 1


def test_scripts_replay_donated_turns_after_the_nodes_own_replies_within_the_window() -> None:
    """Decision 0025 as the bench models it: a script's follow-up turn continues a reply this node
    served, after an earlier turn of the same script; with held paths it comes over that turn's
    paths (with fresh ones per turn, over paths never seen before; with personas, over the paths
    its verifier's persona holds for the epoch, which its other scripts share); no turn falls after the send
    window; no script holds an assistant message of the donor's or more than MAX_SCRIPT_TURNS turns."""
    for mode in ("script_held", "script_personas", "script"):
        reqs, _ = ae.stream(5, "donated", 30, TIMING, 2, USERS, DONORS, paths=mode)
        chs = sorted((r for r in reqs if r.source == "donated"), key=lambda r: r.t)
        follow = [r for r in chs if r.prev_reply]
        assert follow
        for r in chs:
            assert sum(m.role == "user" for m in r.messages) <= ae.MAX_SCRIPT_TURNS
            assert [m.role for m in r.messages if m.role != "system"][::2] == ["user"] * ((len(
                [m for m in r.messages if m.role != "system"]) + 1) // 2)  # user, assistant, user, ...
            last = int(r.t // TIMING.epoch_s) * TIMING.epoch_s + (TIMING.send_last + 1) * ae.BLOCK_S
            assert r.t < last or r.prev_reply == 0
        for r in follow:
            assert r.served_prev
            before = [q for q in chs if q.t < r.t and r.messages[:len(q.messages)] == q.messages]
            assert before
            if mode != "script":
                assert any(q.paths == r.paths for q in before)
            else:
                assert all(q.paths != r.paths for q in chs if q is not r)


def test_a_verifiers_persona_sends_several_scripts_over_the_paths_it_holds_for_the_epoch() -> None:
    """Decision 0026 as the bench models it (``script_personas``): scripts of one persona share
    paths, never across epochs."""
    reqs, _ = ae.stream(5, "donated", 30, TIMING, 2, USERS, DONORS, paths="script_personas", personas_per_verifier=1)
    firsts = [r for r in reqs if r.source == "donated" and not r.prev_reply]
    by_paths: dict[tuple[int, ...], set[int]] = {}
    for r in firsts:
        by_paths.setdefault(r.paths, set()).add(int(r.t // TIMING.epoch_s))
    assert any(sum(r.paths == p for r in firsts) > 1 for p in by_paths)
    assert all(len(epochs) == 1 for epochs in by_paths.values())
