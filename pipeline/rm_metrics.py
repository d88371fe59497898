"""Reward-model metrics: pure functions of scores and labels (lists of numbers), shared by the RM phase's held-out
metrics (each kind's `metrics`, `pipeline.rm_kinds`), the eval phase's step AUCs and the hacking monitor.
"""

from __future__ import annotations

from collections.abc import Sequence


def mean(xs: Sequence[float]) -> float:
    """The mean; NaN for no values.

    >>> mean([1, 0, 0.5]), mean([])
    (0.5, nan)
    """
    return sum(xs) / len(xs) if xs else float("nan")


def auc(scores: Sequence[float], labels: Sequence[int]) -> float:
    """ROC AUC (scikit-learn's `roc_auc_score`: ties counted half), a label counting as positive where it is true;
    NaN when one class is absent (where scikit-learn would raise).

    >>> auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1])
    0.75
    """
    from sklearn.metrics import roc_auc_score  # installed with MLflow; imported here, as the config imports none of it

    binary = [int(bool(y)) for y in labels]
    if len(set(binary)) < 2:
        return float("nan")
    return float(roc_auc_score(binary, list(scores)))


def accuracy(scores: Sequence[float], labels: Sequence[float], threshold: float = 0.5) -> float:
    """Share of scores on the same side of `threshold` as their label; NaN for no scores.

    >>> accuracy([0.9, 0.2, 0.6], [1, 0, 0])
    0.6666666666666666
    """
    pairs = list(zip(scores, labels))
    return sum((s >= threshold) == (y >= threshold) for s, y in pairs) / len(pairs) if pairs else float("nan")


def step_label_pairs(step_scores: Sequence[Sequence[float]], labels: Sequence[Sequence | None]) -> list[tuple]:
    """(score, label) of every step whose sample has labels lined up with its scores (one per step); the others
    (no labels, a count that differs, e.g. a blank completion) are left out.

    >>> step_label_pairs([[0.9, 0.2], [0.5], [0.7]], [[1, 0], None, [1, 1]])
    [(0.9, 1), (0.2, 0)]
    """
    return [(s, y) for sc, ls in zip(step_scores, labels) if ls and len(ls) == len(sc) for s, y in zip(sc, ls)]


def within_position_auc(step_scores: Sequence[Sequence[float]], labels: Sequence[Sequence | None]) -> float:
    """Step AUC over the (right, wrong) pairs of steps at the same position (step index) only: what a PRM tells
    apart beyond "later steps are wrong more often". First-error labels make every step after a mistake wrong,
    so a PRM that learned only where a step sits gets a fair step AUC and 0.5 here. Samples whose labels do not
    line up with their scores are left out (as `step_label_pairs`); NaN where no position has both classes.

    >>> within_position_auc([[0.8, 0.3], [0.8, 0.3], [0.8, 0.3]], [[1, 0], [1, 1], [0, 0]])  # position only
    0.5
    """
    by_position: dict[int, list[tuple]] = {}
    for sc, ls in zip(step_scores, labels):
        if ls and len(ls) == len(sc):
            for j, pair in enumerate(zip(sc, ls)):
                by_position.setdefault(j, []).append(pair)
    wins = pairs = 0.0
    for found in by_position.values():
        n_pos = sum(1 for _, y in found if y)
        n = n_pos * (len(found) - n_pos)
        if n:  # Mann-Whitney within the position, pooled by its pair count
            wins, pairs = wins + auc(*zip(*found)) * n, pairs + n
    return wins / pairs if pairs else float("nan")
