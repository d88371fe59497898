"""Pass@K and Maj@K estimators over n sampled answers per problem, best-of-N and the RM-weighted vote, and
the Pass/Maj-vs-K plot.

DeepSeekMath (Shao et al., 2024, Sec. 5.2.2, Fig. 7) reads RL's effect off these two curves: RL sharpens
the output distribution, so Maj@K rises while Pass@K at large K does not. The estimators here are pure
functions of answer strings and correctness flags; sampling a policy lives below them.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from models.atomic import atomic_path


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased Pass@K from n samples of which c are correct (Chen et al., 2021, Codex, Sec. 2.1).

    `1 - C(n-c, k) / C(n, k)`, computed as `1 - prod_{i=n-c+1}^{n} (1 - k/i)`: the binomials overflow
    floats long before n = 1024, the product of c factors in (0, 1] does not.

    >>> pass_at_k(4, 1, 2)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    0.5
    """
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got c={c}, n={n}")
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def majority_answer(answers: Sequence[str | None]) -> str | None:
    """The most common non-None answer, ties going to the one seen first; None if there is none.

    >>> majority_answer(["b", None, "a", "a", "b", None, None])
    'b'
    """
    votes = Counter(a for a in answers if a is not None)
    # Counter keeps first-insertion order and most_common sorts stably, so ties go to the first seen.
    return votes.most_common(1)[0][0] if votes else None


def merge_equivalent(
    answers: Sequence[str | None], correct: Sequence[bool], equivalent: Callable[[str, str], bool]
) -> list[str | None]:
    """Each answer replaced by the first one before it that is equivalent and judged alike, so that votes count
    values, not spellings (``\\frac{1}{2}`` and ``0.5`` are one answer); None stays None (no vote).

    Joining a class needs the same verdict too: an equivalence that is not transitive (math-verify's numeric
    tolerance) could otherwise put a right and a wrong answer in one class.

    >>> from fractions import Fraction
    >>> merge_equivalent(["1/2", "0.5", None, "2", "0.50"], [True, True, False, False, True],
    ...                  lambda a, b: Fraction(a) == Fraction(b))
    ['1/2', '1/2', None, '2', '1/2']
    """
    firsts: list[tuple[str, bool]] = []
    out: list[str | None] = []
    for a, ok in zip(answers, correct):
        if a is None:
            out.append(None)
            continue
        first = next((f for f, f_ok in firsts if f_ok == bool(ok) and (f == a or equivalent(f, a))), None)
        if first is None:
            firsts.append((first := a, bool(ok)))
        out.append(first)
    return out


def _answer_classes(
    answers: Sequence[str | None], correct: Sequence[bool]
) -> tuple[np.ndarray, list[int], np.ndarray]:
    """Label samples by distinct answer: (labels (n,), counts per class, class correct (m,)).

    Class 0 is "no answer" (None, always wrong, never votes); classes 1.. are the distinct strings.
    """
    if len(answers) != len(correct):
        raise ValueError(f"answers and correct differ in length: {len(answers)} != {len(correct)}")
    index: dict[str | None, int] = {None: 0}
    verdict: list[bool] = [False]
    labels = np.empty(len(answers), dtype=np.int64)
    for i, (a, ok) in enumerate(zip(answers, correct)):
        if a not in index:
            index[a] = len(verdict)
            verdict.append(bool(ok))
        elif a is not None and verdict[index[a]] != bool(ok):
            raise ValueError(f"answer {a!r} is marked both correct and wrong")
        labels[i] = index[a]
    counts = np.bincount(labels, minlength=len(verdict)).tolist()
    return labels, counts, np.array(verdict)


def _vote_scores(votes: np.ndarray, class_correct: np.ndarray) -> np.ndarray:
    """Expected correctness of the majority vote for each row of vote counts (S, m), class 0 = None.

    The winner is drawn uniformly among the most-voted answers, so a row scores the fraction of its
    tied leaders that are correct; a row with no answer at all scores 0.
    """
    cast = votes[:, 1:]  # None never wins a vote
    top = cast.max(axis=1, keepdims=True, initial=0)  # (S, 1); initial covers all-None problems
    leaders = (cast == top) & (top > 0)  # (S, m-1)
    n_leaders = leaders.sum(axis=1)
    n_right = (leaders & class_correct[1:]).sum(axis=1)
    return np.where(n_leaders > 0, n_right / np.maximum(n_leaders, 1), 0.0)


def _vote_vectors(counts: list[int], k: int) -> Iterator[tuple[list[int], int]]:
    """Every way a k-subset can split over the classes: (votes per class, number of subsets giving it).

    A subset's vote depends only on how many samples it takes from each class, so enumerating these
    vectors, weighted by prod C(count_j, x_j), covers all C(n, k) subsets in far fewer steps.
    """
    after = np.cumsum(counts[::-1])[::-1].tolist()[1:] + [0]  # samples in the classes after j

    def rec(j: int, left: int, prefix: list[int], weight: int) -> Iterator[tuple[list[int], int]]:
        if j == len(counts):
            yield prefix, weight
            return
        for x in range(max(0, left - after[j]), min(counts[j], left) + 1):
            yield from rec(j + 1, left - x, prefix + [x], weight * math.comb(counts[j], x))

    yield from rec(0, k, [], 1)


def maj_at_k(
    answers: Sequence[str | None],
    correct: Sequence[bool],
    k: int,
    *,
    seed: int = 0,
    max_exact: int = 20000,
    num_samples: int = 20000,
) -> float:
    """Maj@K: expected correctness of the majority vote of a uniform k-subset of the n samples.

    DeepSeekMath (Shao et al., 2024, Sec. 5.2.2, Fig. 7); self-consistency (Wang et al., 2023). `None`
    (no extracted answer) never wins a vote and an all-None subset is wrong; ties among the most-voted
    answers are split uniformly, so a tie between one right and one wrong answer scores 0.5.

    Exact when C(n, k) <= max_exact: the subsets are enumerated grouped by their per-answer vote counts
    (one step per distinct vote vector, not per subset). Otherwise a Monte-Carlo mean over
    `num_samples` uniform k-subsets drawn with `seed` (standard error <= 0.5 / sqrt(num_samples)).

    Args:
        answers: (n,) extracted final answers, None where a completion gave none.
        correct: (n,) whether each answer is right; equal answers must agree.
        k: subset size, 1 <= k <= n.
        seed: seed of the Monte-Carlo draw.
        max_exact: largest C(n, k) computed exactly; 0 forces Monte-Carlo.
        num_samples: number of random subsets on the Monte-Carlo path.

    Returns:
        Maj@K in [0, 1].

    Raises:
        ValueError: lengths differ, an answer is both right and wrong, or k is out of range.
    """
    labels, counts, class_correct = _answer_classes(answers, correct)
    n = len(labels)
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")

    if math.comb(n, k) <= max_exact:
        vectors, weights = zip(*_vote_vectors(counts, k))
        scores = _vote_scores(np.array(vectors), class_correct)
        return float(np.dot(scores, np.array(weights, dtype=np.float64)) / math.comb(n, k))

    rng = np.random.default_rng(seed)
    m = len(counts)
    total = 0.0
    chunk = max(1, 2_000_000 // n)  # bounds the (chunk, n) random-key matrix to ~16 MB
    for start in range(0, num_samples, chunk):
        s = min(chunk, num_samples - start)
        # The k smallest of n iid uniform keys are a uniform k-subset, drawn for s rows at once.
        picks = np.argpartition(rng.random((s, n)), k - 1, axis=1)[:, :k]  # (s, k)
        rows = np.repeat(np.arange(s), k)
        votes = np.bincount(rows * m + labels[picks].ravel(), minlength=s * m).reshape(s, m)
        total += float(_vote_scores(votes, class_correct).sum())
    return total / num_samples


def ks_up_to(n: int) -> list[int]:
    """DeepSeekMath's K grid: the powers of two up to n (Fig. 7 plots K = 1 .. 64).

    >>> ks_up_to(100)
    [1, 2, 4, 8, 16, 32, 64]
    """
    if n < 1:
        raise ValueError(f"need n >= 1, got {n}")
    return [1 << e for e in range(n.bit_length())]


def per_problem_figures(
    samples_per_problem: list[tuple[list[str | None], list[bool]]], ks: list[int]
) -> dict[str, list[float]]:
    """Pass@K and Maj@K of each problem for each K: keys "pass@1", "maj@1", "pass@2", ..., each a list in the
    problems' order, kept in eval.json so that two rounds (or two runs) compare paired per problem
    (`paired_difference`).

    Args:
        samples_per_problem: per problem, its n answers and their correctness flags.
        ks: the K values; each must be <= every problem's n.
    """
    if not samples_per_problem:
        raise ValueError("no problems to summarize")
    out: dict[str, list[float]] = {}
    for k in ks:
        out[f"pass@{k}"] = [pass_at_k(len(c), sum(map(bool, c)), k) for _, c in samples_per_problem]
        out[f"maj@{k}"] = [maj_at_k(a, c, k) for a, c in samples_per_problem]
    return out


def summarize_samples(
    samples_per_problem: list[tuple[list[str | None], list[bool]]], ks: list[int]
) -> dict[str, float]:
    """Mean over problems of Pass@K and Maj@K for each K (`per_problem_figures`): keys "pass@1", "maj@1", ...

    Returns:
        Metric name to mean value in [0, 1].
    """
    return {name: float(np.mean(v)) for name, v in per_problem_figures(samples_per_problem, ks).items()}


def paired_difference(before: Sequence[float], after: Sequence[float]) -> tuple[float, float]:
    """Mean of after - before over paired items (the same eval problems), and its standard error
    sd(after - before) / sqrt(n): the SE that a gain between two rounds or two arms is judged by.

    >>> paired_difference([0.0, 0.5, 1.0, 0.5], [0.5, 0.5, 1.0, 1.0])
    (0.25, 0.14433756729740643)
    """
    if len(before) != len(after) or len(before) < 2:
        raise ValueError(f"need two equally long lists of at least 2 paired items, got {len(before)} and {len(after)}")
    d = np.asarray(after, dtype=np.float64) - np.asarray(before, dtype=np.float64)
    return float(d.mean()), float(d.std(ddof=1) / math.sqrt(len(d)))


def plot_pass_maj(curves: dict[str, dict[str, float]], path: str | os.PathLike) -> Path:
    """Plot Pass@K and Maj@K against K (log2 axis) side by side, one line per curve (DeepSeekMath Fig. 7).

    Args:
        curves: label (e.g. "round 0") to a `summarize_samples` dict.
        path: where to write the PNG; written to a temp file and renamed, so readers never see half a file.

    Returns:
        The PNG's path.
    """
    # The object API with no pyplot keeps this free of global figure state and GUI backends.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = Path(path)
    fig = Figure(figsize=(10, 4))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2, sharey=True)
    all_ks: set[int] = set()
    for ax, metric, title in zip(axes, ("pass", "maj"), ("Pass@K", "Maj@K")):
        for label, summary in curves.items():
            pts = sorted(
                (int(key.split("@")[1]), v) for key, v in summary.items() if key.startswith(metric + "@")
            )
            if pts:
                all_ks.update(k for k, _ in pts)
                ax.plot(*zip(*pts), marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_title(title)
        ax.set_xlabel("K: number of samples")
        ax.grid(True, alpha=0.3)
    for ax in axes:
        if all_ks:
            ax.set_xticks(sorted(all_ks), [str(k) for k in sorted(all_ks)])
    axes[0].set_ylabel("accuracy")
    axes[1].legend()
    fig.tight_layout()

    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    return path


# --- policy evaluation ---


@dataclass
class PolicyEval:
    """Metrics (`greedy`, `pass@K`, `maj@K`) and, per problem, the sampled texts and answers, whether the
    greedy answer was right, and each metric's value (`per_problem`: name -> one value per problem)."""

    metrics: dict[str, float]
    texts: list[list[str]]
    answers: list[list[str | None]]
    correct: list[list[bool]]
    greedy_correct: list[bool]
    per_problem: dict[str, list[float]]


def judged(problem_set, texts: Sequence[str], problem) -> tuple[list[str | None], list[bool]]:
    """One problem's samples as every estimator reads them: (answers, correct), the answers extracted and merged
    by the set's equivalence (`merge_equivalent`), so that Maj@K, best-of-N and the weighted vote count one vote
    per value and the verifier (`is_correct`) judges each sample as its answer's class."""
    correct = [problem_set.is_correct(t, problem) for t in texts]
    extracted = [problem_set.extract_answer(t) for t in texts]
    return merge_equivalent(extracted, correct, problem_set.equivalent), correct


def evaluate_policy(
    sampler,
    problem_set,
    problems: Sequence,
    *,
    n: int,
    seed: int = 0,
    prompts: Sequence[str] | None = None,
) -> PolicyEval:
    """Greedy accuracy, and Pass@K / Maj@K for K in 1, 2, 4, ... <= n from n samples per problem.

    `sampler(prompts, n, seed=..., greedy=..., desc=...) -> Samples`: the policy with the eval section's sampling
    settings, in this process or over workers (`fanout.open_sampler`), the same samples either way.
    `prompts`: the text each problem is sampled after (`PromptRenderer.render`; default its plain prompt).
    """
    prompts = list(prompts) if prompts is not None else [p.prompt for p in problems]
    greedy = sampler(prompts, 1, greedy=True, seed=seed, desc="eval greedy")
    sampled = sampler(prompts, n, seed=seed, desc="eval samples")
    judgements = [judged(problem_set, texts, p) for texts, p in zip(sampled.texts, problems)]
    answers, correct = [a for a, _ in judgements], [c for _, c in judgements]
    greedy_correct = [problem_set.is_correct(t[0], p) for t, p in zip(greedy.texts, problems)]
    per_problem = {"greedy": [float(c) for c in greedy_correct],
                   **per_problem_figures(list(zip(answers, correct)), ks_up_to(n))}
    metrics = {name: float(np.mean(v)) for name, v in per_problem.items()}
    metrics["completions_per_s"] = len(prompts) * n / sampled.seconds
    return PolicyEval(metrics, sampled.texts, answers, correct, greedy_correct, per_problem)


def weighted_vote(answers: Sequence[str | None], correct: Sequence[bool], scores: Sequence[float]) -> float:
    """Expected correctness of the RM-weighted majority vote over these samples (Math-Shepherd, "verification").

    The answer chosen is `argmax_a sum_i 1[a_i = a] * s_i`: each sample votes for its answer with its RM
    solution score (a PRM's: its `aggregation` over steps, min by default). As in `maj_at_k` (and
    best-of-N's majority), a no-answer sample (None) never votes, and the answers tied exactly for the most
    weight split the win uniformly: the result is the share of them that are right. The weights are
    summed with `math.fsum`, so the result does not depend on the samples' order.

    A score of 0 casts no vote: an answer whose weight is 0 is no better than one never sampled (it could
    never win `argmax` over all answers). So a problem whose samples all score 0, or have no answer,
    scores 0. A negative or non-finite score is an error: RM scores are probabilities in [0, 1] here,
    and a negative vote (a logit passed by mistake) is not defined by the formula.

    Example (the answer "5" is right): majority picks "7" (3 votes), best-of-N picks "9" (score 0.8), the
    weighted vote picks "5" (0.6 + 0.5 = 1.1 against 7's 0.4 and 9's 0.8):

    >>> weighted_vote(["7", "7", "7", "5", "5", "9"], [0, 0, 0, 1, 1, 0], [0.1, 0.2, 0.1, 0.6, 0.5, 0.8])
    1.0

    Args:
        answers: (n,) extracted final answers, None where a completion gave none.
        correct: (n,) whether each answer is right; equal answers must agree.
        scores: (n,) each sample's RM solution score, >= 0.

    Returns:
        The vote's expected correctness in [0, 1].

    Raises:
        ValueError: lengths differ, an answer is both right and wrong, or a score is negative or not finite.
    """
    labels, counts, class_correct = _answer_classes(answers, correct)
    if len(scores) != len(labels):
        raise ValueError(f"scores and answers differ in length: {len(scores)} != {len(labels)}")
    bad = next((i for i, s in enumerate(scores) if not (math.isfinite(s) and s >= 0)), None)
    if bad is not None:
        raise ValueError(f"score of sample {bad} is {scores[bad]}: a vote's weight must be a finite score >= 0")
    weights = [math.fsum(float(s) for s, c in zip(scores, labels) if c == j) for j in range(len(counts))]
    return float(_vote_scores(np.array([weights]), class_correct)[0])


def best_of_n_accuracy(
    scores: Sequence[Sequence[float]], correct: Sequence[Sequence[bool]], answers: Sequence[Sequence[str | None]], n: int
) -> dict[str, float]:
    """Accuracy when picking one of the first `n` samples per problem: by highest RM score (`rm`), by majority
    vote, at random (in expectation), and by the RM-weighted vote (`vote`, `weighted_vote`). Ties in score go
    to the earlier sample; ties in a vote split (the expected correctness).

    >>> best_of_n_accuracy([[0.2, 0.9, 0.1]], [[False, True, False]], [["1", "2", "1"]], 3)
    {'rm': 1.0, 'majority': 0.0, 'random': 0.3333333333333333, 'vote': 1.0}
    """
    rm, maj, rnd, vote = [], [], [], []
    for p, (s, c, a) in enumerate(zip(scores, correct, answers)):
        s, c, a = list(s)[:n], list(c)[:n], list(a)[:n]
        rm.append(float(c[max(range(len(s)), key=lambda i: (s[i], -i))]))
        maj.append(maj_at_k(a, c, len(a)))
        rnd.append(sum(c) / len(c))
        try:
            vote.append(weighted_vote(a, c, s))
        except ValueError as e:
            raise ValueError(f"problem {p}: {e}") from None
    return {"rm": float(np.mean(rm)), "majority": float(np.mean(maj)), "random": float(np.mean(rnd)),
            "vote": float(np.mean(vote))}
