"""RM metrics as pure functions (`pipeline/rm_metrics.py`): AUC is scikit-learn's, checked against the plain rank-sum
(Mann-Whitney) count it replaced, ties and soft labels included."""

from __future__ import annotations

import math
import random

import pytest

from pipeline.rm_metrics import auc


def rank_sum_auc(scores, labels):
    """The plain reference: the share of (positive, negative) pairs ranked right, a tie counting half."""
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    return sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / (len(pos) * len(neg))


def test_auc_is_scikit_learns_and_equals_the_rank_sum_count(monkeypatch):
    rng = random.Random(0)
    for _ in range(50):
        n = rng.randint(2, 30)
        scores = [rng.choice([0.0, 0.25, 0.5, 0.75, 1.0]) for _ in range(n)]  # many ties
        labels = [rng.choice([0, 1, 0.75]) for _ in range(n)]  # a soft label counts as positive
        if len({bool(y) for y in labels}) < 2:
            continue
        assert auc(scores, labels) == pytest.approx(rank_sum_auc(scores, labels), abs=1e-12)
    # The worked example: the positives 0.35 and 0.8 beat 0.1 both, 0.4 once: 3 of 4 pairs.
    assert auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == 0.75
    # scikit-learn computes it: no hand-written count is left.
    import sklearn.metrics

    monkeypatch.setattr(sklearn.metrics, "roc_auc_score", lambda y, s: 0.125)
    assert auc([0.1, 0.4], [0, 1]) == 0.125


@pytest.mark.parametrize("labels", [[1, 1, 1], [0, 0, 0], []])
def test_auc_of_one_class_is_nan(labels):
    assert math.isnan(auc([0.2, 0.5, 0.9][: len(labels)], labels))
