"""Pass@K / Maj@K estimators against plain subset enumeration, the RM-weighted vote against a plain loop,
worked examples, and the plot."""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from fractions import Fraction

import pytest

from pipeline.evaluate import (
    best_of_n_accuracy,
    ks_up_to,
    maj_at_k,
    majority_answer,
    pass_at_k,
    plot_pass_maj,
    summarize_samples,
    weighted_vote,
)


def brute_pass(n: int, c: int, k: int) -> float:
    """Fraction of k-subsets of n samples (the first c correct) holding at least one correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


def brute_maj(answers, correct, k: int) -> float:
    """Mean over every k-subset of the majority vote's correctness, ties split evenly, None never votes."""
    total = 0.0
    subsets = list(itertools.combinations(range(len(answers)), k))
    for s in subsets:
        votes = Counter(answers[i] for i in s if answers[i] is not None)
        if not votes:
            continue  # an all-None subset is wrong
        top = max(votes.values())
        leaders = [a for a, v in votes.items() if v == top]
        right = {answers[i] for i in range(len(answers)) if correct[i]}
        total += sum(a in right for a in leaders) / len(leaders)
    return total / len(subsets)


# --- pass@k ---


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_matches_subset_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_pass(n, c, k), abs=1e-12)


def test_pass_at_k_worked_example():
    # 4 samples, 1 correct, K=2: 3 of the 6 pairs miss it, so 1 - 3/6.
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5, abs=1e-15)
    # K=1 is the plain fraction correct.
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3, abs=1e-15)


@pytest.mark.parametrize(
    "c,k", [(0, 1), (1, 1), (1, 64), (3, 256), (10, 10), (500, 512), (100, 900), (1024, 1)]
)
def test_pass_at_k_stable_at_n_1024(c, k):
    n = 1024
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))  # the binomials here overflow floats
    got = pass_at_k(n, c, k)
    assert 0.0 <= got <= 1.0
    assert got == pytest.approx(float(exact), rel=1e-12, abs=1e-14)


def test_pass_at_k_rejects_bad_arguments():
    for n, c, k in [(4, 1, 5), (4, 1, 0), (4, -1, 1), (4, 5, 1), (0, 0, 1)]:
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


# --- maj@k ---

MAJ_CASES = [
    (["a", "a", "b"], [1, 1, 0]),
    (["a", "b", "c", "a", "b"], [0, 1, 0, 0, 1]),  # two-way ties between a right and a wrong answer
    (["a", "b", "c", "d"], [1, 0, 0, 0]),  # every pair a tie
    (["a", None, None, "b", "a", None], [1, 0, 0, 0, 1, 0]),  # None samples
    ([None, None, None], [0, 0, 0]),  # all None: always wrong
    ([None, "x", None, None], [0, 1, 0, 0]),  # a lone answer beats any number of Nones
    (["w", "w", "w", "r", "r", None, "v", "r"], [0, 0, 0, 1, 1, 0, 0, 1]),
    (["a"] * 7, [1] * 7),
]


@pytest.mark.parametrize("answers,correct", MAJ_CASES)
def test_maj_at_k_matches_subset_enumeration(answers, correct):
    for k in range(1, len(answers) + 1):
        assert maj_at_k(answers, correct, k) == pytest.approx(brute_maj(answers, correct, k), abs=1e-12)


def test_maj_at_k_worked_example():
    # answers a, a, b with a right, K=2: the 3 pairs are {a,a} -> a wins (1), and {a,b} twice -> a 1-1
    # tie, right half the time (0.5 each), so (1 + 0.5 + 0.5) / 3 = 2/3.
    assert maj_at_k(["a", "a", "b"], [True, True, False], 2) == pytest.approx(2 / 3, abs=1e-12)
    # K=1 with a None: the None draw is wrong, so Maj@1 = 2 right of 4 samples.
    assert maj_at_k(["a", None, "a", "b"], [True, False, True, False], 1) == pytest.approx(0.5, abs=1e-12)
    # K=n is the single full vote: b 2, a 2, None 1 -> a 2-2 tie -> 0.5.
    assert maj_at_k(["a", "b", None, "b", "a"], [1, 0, 0, 0, 1], 5) == pytest.approx(0.5, abs=1e-12)


def test_maj_at_k_monte_carlo_agrees_with_exact():
    answers = ["r"] * 5 + ["w"] * 4 + ["v"] * 3 + [None] * 4
    correct = [a == "r" for a in answers]
    for k in (3, 8):
        exact = maj_at_k(answers, correct, k)
        mc = maj_at_k(answers, correct, k, max_exact=0, seed=1)
        assert mc == pytest.approx(exact, abs=0.02)
        assert maj_at_k(answers, correct, k, max_exact=0, seed=1) == mc  # seeded


def test_maj_at_k_monte_carlo_at_n_1024():
    # C(1024, 64) subsets is far past max_exact. With only r, w and None the vote depends on how many
    # r and w a subset draws, so the exact value is a plain sum over that hypergeometric law.
    n_r, n_w, n_none, k = 400, 300, 324, 64
    answers = ["r"] * n_r + ["w"] * n_w + [None] * n_none
    correct = [a == "r" for a in answers]
    exact = Fraction(0)
    for x_r in range(k + 1):
        for x_w in range(k - x_r + 1):
            score = 1 if x_r > x_w else Fraction(1, 2) if x_r == x_w > 0 else 0
            exact += score * math.comb(n_r, x_r) * math.comb(n_w, x_w) * math.comb(n_none, k - x_r - x_w)
    exact /= math.comb(n_r + n_w + n_none, k)
    assert maj_at_k(answers, correct, k, num_samples=4000) == pytest.approx(float(exact), abs=0.02)


def test_maj_at_k_rejects_bad_input():
    with pytest.raises(ValueError, match="length"):
        maj_at_k(["a", "b"], [True], 1)
    with pytest.raises(ValueError, match="both correct and wrong"):
        maj_at_k(["a", "b", "a"], [True, False, False], 2)
    for k in (0, 4):
        with pytest.raises(ValueError):
            maj_at_k(["a", "b", "a"], [True, False, True], k)


def test_majority_answer():
    assert majority_answer(["b", None, "a", "a", "b", None, None]) == "b"  # tie: b seen first
    assert majority_answer([None, "c", "a", "a"]) == "a"
    assert majority_answer([None, None]) is None
    assert majority_answer([]) is None


# --- grid, summary, plot ---


def test_ks_up_to():
    assert ks_up_to(1) == [1]
    assert ks_up_to(64) == [1, 2, 4, 8, 16, 32, 64]
    assert ks_up_to(100) == [1, 2, 4, 8, 16, 32, 64]
    with pytest.raises(ValueError):
        ks_up_to(0)


def test_summarize_samples_means_over_problems():
    problems = [
        (["a", "a", "b", "c"], [True, True, False, False]),
        ([None, "x", "y", "y"], [False, True, False, False]),
    ]
    summary = summarize_samples(problems, [1, 2, 4])
    assert list(summary) == ["pass@1", "maj@1", "pass@2", "maj@2", "pass@4", "maj@4"]
    # Pass@1 is the mean fraction correct: (2/4 + 1/4) / 2.
    assert summary["pass@1"] == pytest.approx(0.375, abs=1e-12)
    # Maj@4 is the full vote: a wins problem 1 (1), y wins problem 2 (0).
    assert summary["maj@4"] == pytest.approx(0.5, abs=1e-12)
    expected_maj2 = (brute_maj(*problems[0], 2) + brute_maj(*problems[1], 2)) / 2
    assert summary["maj@2"] == pytest.approx(expected_maj2, abs=1e-12)
    assert all(0.0 <= v <= 1.0 for v in summary.values())


def test_plot_pass_maj_writes_png(tmp_path):
    curves = {
        "round 0": {"pass@1": 0.3, "maj@1": 0.3, "pass@2": 0.45, "maj@2": 0.32, "pass@4": 0.6, "maj@4": 0.4},
        "round 3": {"pass@1": 0.4, "maj@1": 0.4, "pass@2": 0.5, "maj@2": 0.43, "pass@4": 0.58, "maj@4": 0.47},
    }
    out = plot_pass_maj(curves, tmp_path / "plots" / "pass_maj.png")
    assert out == tmp_path / "plots" / "pass_maj.png"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 1000
    assert [p.name for p in out.parent.iterdir()] == ["pass_maj.png"]  # no temp file left behind


# --- RM-weighted majority vote ---


def loop_vote(answers, correct, scores) -> float:
    """Plain loop: exact (Fraction) weight per answer, None and zero weights never lead, ties split evenly."""
    totals: dict[str, Fraction] = {}
    for a, s in zip(answers, scores):
        if a is not None:
            totals[a] = totals.get(a, Fraction(0)) + Fraction(s)
    top = max(totals.values(), default=Fraction(0))
    leaders = [a for a, t in totals.items() if t == top and t > 0]
    right = {a for a, c in zip(answers, correct) if c}
    return sum(a in right for a in leaders) / len(leaders) if leaders else 0.0


def test_weighted_vote_worked_examples():
    # Gold "5". Majority: "7" has 3 votes -> wrong. Best-of-N: 0.8 is the top score, on "9" -> wrong.
    # Weighted: 7 gets 0.1 + 0.2 + 0.1 = 0.4, 5 gets 0.6 + 0.5 = 1.1, 9 gets 0.8 -> "5", right.
    answers, correct = ["7", "7", "7", "5", "5", "9"], [0, 0, 0, 1, 1, 0]
    scores = [0.1, 0.2, 0.1, 0.6, 0.5, 0.8]
    assert weighted_vote(answers, correct, scores) == 1.0
    assert maj_at_k(answers, correct, 6) == 0.0
    assert best_of_n_accuracy([scores], [correct], [answers], 6) == pytest.approx(
        {"rm": 0.0, "majority": 0.0, "random": 2 / 6, "vote": 1.0}, abs=1e-12)
    # A weighted tie between a right and a wrong answer (0.25 + 0.5 against 0.75) is right half the time.
    assert weighted_vote(["r", "w", "r"], [1, 0, 1], [0.25, 0.75, 0.5]) == 0.5
    # A three-way tie with one right answer: 1/3.
    assert weighted_vote(["a", "b", "c"], [0, 1, 0], [0.5, 0.5, 0.5]) == pytest.approx(1 / 3, abs=1e-12)
    # None never votes, however high its score: the lone answered sample wins with 0.1.
    assert weighted_vote([None, "x", None], [0, 1, 0], [0.99, 0.1, 0.9]) == 1.0
    # No answer at all, or every vote of weight 0: no answer leads, the problem scores 0.
    assert weighted_vote([None, None], [0, 0], [0.7, 0.2]) == 0.0
    assert weighted_vote(["x", "y"], [1, 0], [0.0, 0.0]) == 0.0
    # A zero-score sample adds nothing: "y" (0.3) beats "x" (0 + 0 + 0) despite x's three samples.
    assert weighted_vote(["x", "x", "x", "y"], [0, 0, 0, 1], [0.0, 0.0, 0.0, 0.3]) == 1.0


def test_weighted_vote_does_not_depend_on_sample_order():
    # Summed left to right, 0.1 + 0.2 + 0.3 is 0.6000000000000001 but 0.3 + 0.2 + 0.1 is 0.6: plain sums
    # would make "w" win in one order and tie with "r" (0.6) in the other. fsum gives 0.6 in every order.
    answers, correct, scores = ["w", "w", "w", "r"], [0, 0, 0, 1], [0.1, 0.2, 0.3, 0.6]
    for order in itertools.permutations(range(4)):
        pick = lambda xs: [xs[i] for i in order]  # noqa: E731
        assert weighted_vote(pick(answers), pick(correct), pick(scores)) == 0.5


def test_weighted_vote_matches_plain_loop_on_random_inputs():
    rng = random.Random(0)
    grid = [i / 8 for i in range(9)]  # exact in binary: sums are exact, so ties (frequent here) are real ties
    for case in range(600):
        n = rng.randint(1, 10)
        gold = rng.choice("abc")
        answers = [rng.choice(["a", "b", "c", "d", None]) for _ in range(n)]
        correct = [a == gold for a in answers]
        scores = [rng.choice(grid) if case % 2 else rng.random() for _ in range(n)]
        assert weighted_vote(answers, correct, scores) == pytest.approx(loop_vote(answers, correct, scores), abs=1e-12)
        k = rng.randint(1, n)  # best_of_n_accuracy votes among the first k only
        assert best_of_n_accuracy([scores], [correct], [answers], k)["vote"] == pytest.approx(
            loop_vote(answers[:k], correct[:k], scores[:k]), abs=1e-12)


def test_weighted_vote_rejects_bad_input():
    with pytest.raises(ValueError, match="scores and answers differ in length: 1 != 2"):
        weighted_vote(["a", "b"], [1, 0], [0.5])
    with pytest.raises(ValueError, match="both correct and wrong"):
        weighted_vote(["a", "a"], [1, 0], [0.5, 0.5])
    with pytest.raises(ValueError, match="score of sample 1 is -0.5"):
        weighted_vote(["a", "b"], [1, 0], [0.5, -0.5])
    with pytest.raises(ValueError, match="score of sample 0 is nan"):
        weighted_vote(["a"], [1], [float("nan")])
    with pytest.raises(ValueError, match="problem 1: score of sample 0 is inf"):
        best_of_n_accuracy([[0.5], [math.inf]], [[1], [0]], [["a"], ["b"]], 1)


def test_best_of_n_accuracy_keeps_its_other_figures_beside_the_vote():
    # Two problems, first 3 samples. Problem 1: top score 0.9 on a right one (rm 1), majority "1" wrong (0),
    # 1 right of 3 (random 1/3), vote "1" 0.3 against "2" 0.9 -> right. Problem 2: top score 0.3 on "5"
    # (rm 0; the 0.9 of sample 4 is past N), majority "4" (right), 2 of 3 (random 2/3), vote "4" 0.2 + 0.2
    # = 0.4 against "5" 0.3 -> right. So the vote beats every other pick here.
    scores = [[0.2, 0.9, 0.1, 1.0], [0.2, 0.2, 0.3, 0.9]]
    correct = [[False, True, False, True], [True, True, False, False]]
    answers = [["1", "2", "1", "2"], ["4", "4", "5", None]]
    assert best_of_n_accuracy(scores, correct, answers, 3) == pytest.approx(
        {"rm": 0.5, "majority": 0.5, "random": 0.5, "vote": 1.0}, abs=1e-12)
    # All-zero scores (best_of_n's baseline call) do not crash: no weighted vote is cast.
    assert best_of_n_accuracy([[0.0] * 4] * 2, correct, answers, 4)["vote"] == 0.0


def test_eval_phase_best_of_n_gives_each_rms_vote_beside_its_pick_majority_and_random():
    from pipeline.eval_phase import best_of_n
    from pipeline.scorers import Scores
    from pipeline.tracking import metric_name

    # One problem, 4 samples, "5" right. PRM solution scores (with step scores: only `solutions` counts);
    # ORM scores rank the two "5"s last.
    answers, correct = [["7", "5", "7", "5"]], [[False, True, False, True]]
    scores = {"prm": [Scores([0.2, 0.6, 0.3, 0.3], [[0.2], [0.6], [0.3], [0.3]])],
              "orm": [Scores([0.9, 0.1, 0.8, 0.2])]}
    metrics = best_of_n(scores, correct, answers, [2, 4])
    assert list(metrics) == [f"bon/{w}@{n}" for n in (2, 4)
                             for w in ("prm", "prm_vote", "orm", "orm_vote", "majority", "random")]
    assert metrics == pytest.approx({
        # N = 2 ("7" 0.2, "5" 0.6 by the PRM; 0.9 and 0.1 by the ORM): one vote each, a majority tie.
        "bon/prm@2": 1.0, "bon/prm_vote@2": 1.0, "bon/orm@2": 0.0, "bon/orm_vote@2": 0.0,
        "bon/majority@2": 0.5, "bon/random@2": 0.5,
        # N = 4: PRM "7" 0.5 against "5" 0.9 -> right; ORM "7" 1.7 against "5" 0.3 -> wrong; majority 2-2 tie.
        "bon/prm@4": 1.0, "bon/prm_vote@4": 1.0, "bon/orm@4": 0.0, "bon/orm_vote@4": 0.0,
        "bon/majority@4": 0.5, "bon/random@4": 0.5}, abs=1e-12)
    # The PRM's vote differs from its pick where two mid scores outweigh a top one: 0.4 + 0.4 > 0.7.
    flip = best_of_n({"prm": [Scores([0.7, 0.4, 0.4])]}, [[True, False, False]], [["5", "7", "7"]], [3])
    assert (flip["bon/prm@3"], flip["bon/prm_vote@3"]) == (1.0, 0.0)
    # MLflow's names, as `tracking.log_metrics` writes them on the parent run.
    assert [metric_name(k) for k in flip] == ["bon/prm_at_3", "bon/prm_vote_at_3", "bon/majority_at_3",
                                              "bon/random_at_3"]


def test_a_rounds_gain_is_paired_per_eval_problem_with_its_standard_error(tmp_path):
    from pipeline.compare import round_gain
    from pipeline.evaluate import paired_difference
    from pipeline.rundir import write_json_atomic

    # d = (0.5, 0, 0, 0.5): mean 0.25, sd 0.2887, SE 0.2887 / 2.
    assert paired_difference([0.0, 0.5, 1.0, 0.5], [0.5, 0.5, 1.0, 1.0]) == pytest.approx((0.25, 0.14434), abs=1e-5)
    with pytest.raises(ValueError, match="equally long"):
        paired_difference([0.0, 1.0], [1.0])

    def eval_json(r, per_problem):
        write_json_atomic(tmp_path / f"round-{r:03d}" / "eval.json", {"round": r, "metrics": {}, "curve": {},
                                                                      **per_problem})

    eval_json(0, {})  # written before per-problem figures were kept: no paired line
    eval_json(2, {"per_problem": {"maj@8": [1.0, 0.0, 0.5], "maj@16": [1.0, 1.0, 1.0]}})
    assert round_gain(tmp_path, "run") == ""
    eval_json(0, {"per_problem": {"maj@8": [0.0, 0.0, 0.5], "maj@16": [0.0, 0.0, 0.0]}})
    eval_json(1, {"per_problem": {"maj@8": [0.0, 0.0, 0.0], "maj@16": [0.0, 0.0, 0.0]}})  # not the last round
    assert round_gain(tmp_path, "run") == "run: maj@8 round 2 - round 0 = +0.333, paired SE 0.333 over 3 eval problems (+1.0 SE)"
    # Without Maj@8 the largest Maj@K both rounds have.
    eval_json(2, {"per_problem": {"maj@4": [1.0, 1.0, 1.0], "maj@16": [1.0, 1.0, 1.0]}})
    eval_json(0, {"per_problem": {"maj@4": [0.0, 0.0, 1.0], "maj@16": [1.0, 1.0, 1.0]}})
    assert round_gain(tmp_path, "run").startswith("run: maj@16 round 2 - round 0 = +0.000, paired SE 0.000 over 3")
