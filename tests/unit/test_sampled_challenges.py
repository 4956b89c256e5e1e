"""The pure parts of ``gentorrent bench sampled-challenges`` (verifier/bench/sampled_challenges.py):
the halves, the true-positive rate at a false-positive rate, the node's detectors oriented on the
training half only, and the user turn's template prefix. No engine."""

from __future__ import annotations

import random

import numpy as np

from overlay.wire.messages import ChatMessage
from verifier.bench.sampled_challenges import DETECTORS, FEATURES, evaluate, halves, tpr_at_fpr, user_prefix


def test_halves_cut_a_seeded_shuffle_in_two() -> None:
    train, test = halves(7, random.Random(1))
    assert (len(train), len(test)) == (3, 4)
    assert sorted(train + test) == list(range(7))
    assert (train, test) == halves(7, random.Random(1))
    assert train != [0, 1, 2]  # shuffled (for this seed)


def test_tpr_at_fpr_flags_at_most_that_share_of_negatives() -> None:
    users = np.arange(20.0)  # 5 % of 20: one user's prompt may score above the threshold
    sampled = np.array([18.5, 19.5, 17.0])
    scores, labels = np.concatenate([sampled, users]), np.array([1, 1, 1] + [0] * 20)
    assert tpr_at_fpr(scores, labels, 0.05) == 2 / 3  # threshold 18: only 19 of the users lies above
    assert tpr_at_fpr(scores, labels, 0.0) == 1 / 3  # threshold 19: no user lies above
    assert tpr_at_fpr(scores, labels, 1.0) == 1.0


def test_each_feature_is_oriented_on_the_training_half_and_not_folded_on_the_test_half() -> None:
    rng = np.random.default_rng(3)
    pos_tr, neg_tr, pos_te, neg_te = (rng.normal(size=40) for _ in range(4))
    n = 40
    # column: loglik_plain lower for sampled (both halves), loglik_instructed higher on training and
    # lower on test, zscore_instructed constant, length higher for sampled (both halves)
    x_train = np.column_stack([
        np.concatenate([pos_tr - 10, neg_tr]),
        np.concatenate([pos_tr + 10, neg_tr]),
        np.zeros(2 * n),
        np.concatenate([pos_tr + 10, neg_tr]),
    ])
    x_test = np.column_stack([
        np.concatenate([pos_te - 10, neg_te]),
        np.concatenate([pos_te - 10, neg_te]),
        np.zeros(2 * n),
        np.concatenate([pos_te + 10, neg_te]),
    ])
    y = np.array([1] * n + [0] * n)
    aucs, best, tpr = evaluate(x_train, y, x_test, y)
    assert FEATURES == ("loglik_plain", "loglik_instructed", "zscore_instructed", "length")
    assert set(aucs) == set(DETECTORS)
    assert aucs["loglik_plain"] == 1.0  # lower is the sampled side, as training showed
    assert aucs["loglik_instructed"] == 0.0  # the direction training fixed, not max(auc, 1 - auc)
    assert aucs["zscore_instructed"] == 0.5
    assert aucs["length"] == 1.0
    assert 0.0 <= aucs["combined"] <= 1.0
    # every single separating feature and the combination score 1 on training: the first wins
    assert best == "loglik_plain" and tpr == 1.0


class _Template:
    """A chat template's tokens: BOS, a system turn, the user's content, the assistant's opening."""

    def chat_prompt(self, messages: list[ChatMessage]) -> list[int]:
        return [1, 7, 8, 2, 3, *(ord(c) for c in messages[0].content), 2, 4]


def test_user_prefix_is_the_template_before_the_users_content() -> None:
    assert user_prefix(_Template()) == [1, 7, 8, 2, 3]


def test_combined_loglik_leaves_the_length_out() -> None:
    rng = np.random.default_rng(4)
    n = 40
    noise_train, noise_test = rng.normal(size=(2 * n, 3)), rng.normal(size=(2 * n, 3))
    length_train = np.concatenate([rng.normal(size=n) + 10, rng.normal(size=n)])
    length_test = np.concatenate([rng.normal(size=n) + 10, rng.normal(size=n)])
    y = np.array([1] * n + [0] * n)
    aucs, best, _ = evaluate(np.column_stack([noise_train, length_train]), y,
                             np.column_stack([noise_test, length_test]), y)
    assert aucs["length"] == aucs["combined"] == 1.0
    assert aucs["combined_loglik"] < 0.8  # only the noise is left to it
    assert best == "length"
