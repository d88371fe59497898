"""Math-Shepherd's Monte-Carlo step labels (arXiv 2312.08935 §3.3), as functions of a problem set, a completer and
the completions to label: a completion's step prefixes on the policy's own tokens (`make_request`), exhaustive or
first-error labelling (`label_exhaustive`, `label_first_error`), and the labels' figures. The collection phase
(`pipeline/collect.py`) and online MC values during GRPO (`pipeline/online_mc.py`) share them; neither the config
nor a phase is read here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pipeline.generation import Continuation, prompt_ids
from pipeline.problems import Problem, ProblemSet
from pipeline.steps import step_char_ends, step_token_ends, token_spans

# completer(continuations, n) -> n whole completions from each (its prefix and what the policy wrote on):
# the batched generation stream.
Completer = Callable[[list[Continuation], int], list[list[str]]]


@dataclass
class Labels:
    """Step labels of one completion: HE and SE per step, rollouts spent, and how many steps' labels are
    imputed (inferred by the first-error search from the prefixes it probed, not measured themselves)."""

    he: list[int]
    se: list[float]
    rollouts: int = 0
    imputed: int = 0


@dataclass
class LabelRequest:
    """One completion to label: its problem, its step prefixes, and what the verifier says of each."""

    problem: Problem
    prefixes: list[str]  # the completion's text up to the end of each step's end token
    continuations: list[Continuation]  # what each prefix's rollouts go on from: the policy's own ids
    # Per prefix: None if it states no answer yet (needs rollouts), else whether that answer is right.
    settled: list[bool | None] = field(default_factory=list)
    # The text the completion continued (`PromptRenderer.render`); rollouts continue `prompt + prefix`.
    prompt: str | None = None

    def __post_init__(self):
        if self.prompt is None:
            self.prompt = self.problem.prompt


def make_request(problem_set: ProblemSet, problem: Problem, tokenizer, completion_ids: list[int],
                 prompt: str | None = None) -> LabelRequest:
    """The step prefixes of a sampled completion (its ids, eos excluded), as text and as the policy's tokens.

    `prompt`: the rendered prompt the completion was sampled after (default: the problem's plain prompt).
    """
    text, spans = token_spans(tokenizer, completion_ids)
    sep = problem_set.step_separator
    ends = step_token_ends(spans, text, separator=sep) if step_char_ends(text, sep) else []  # blank: no step
    prompt_tokens = tuple(prompt_ids(tokenizer, prompt or problem.prompt))
    prefixes = [text[: spans[e][1]] for e in ends]
    continuations = [Continuation(prompt_tokens, tuple(completion_ids[: e + 1])) for e in ends]
    settled = [
        None if problem_set.extract_answer(p) is None else problem_set.is_correct(p, problem) for p in prefixes
    ]
    return LabelRequest(problem, prefixes, continuations, settled, prompt)


def success_rate(verdicts: Sequence[bool]) -> float:
    """The Monte-Carlo value of a step prefix: the share of the rollouts from it that the verifier accepts
    (Math-Shepherd's soft estimate, VinePPO's value estimate).

    >>> success_rate([True, False, True, True])
    0.75
    """
    return sum(verdicts) / len(verdicts)


def _fractions(
    problem_set: ProblemSet, completer: Completer, jobs: list[tuple[int, int]], reqs: list[LabelRequest], n: int
) -> list[float]:
    """Share of N rollouts from each (request, step) prefix that reach the gold answer: one batched call."""
    if not jobs:
        return []
    rollouts = completer([reqs[r].continuations[k] for r, k in jobs], n)
    return [success_rate([problem_set.is_correct(c, reqs[r].problem) for c in conts])
            for (r, k), conts in zip(jobs, rollouts)]


def label_exhaustive(problem_set: ProblemSet, completer: Completer, reqs: list[LabelRequest], n: int) -> list[Labels]:
    """HE and SE for every step of every request; all unsettled prefixes in one generation stream."""
    jobs = [(r, k) for r, req in enumerate(reqs) for k, s in enumerate(req.settled) if s is None]
    fractions = dict(zip(jobs, _fractions(problem_set, completer, jobs, reqs, n)))
    out = []
    for r, req in enumerate(reqs):
        se = [fractions[(r, k)] if s is None else float(s) for k, s in enumerate(req.settled)]
        spent = n * sum(s is None for s in req.settled)
        out.append(Labels([int(v > 0) for v in se], se, spent))
    return out


def label_first_error(problem_set: ProblemSet, completer: Completer, reqs: list[LabelRequest], n: int) -> list[Labels]:
    """Binary search per request for the first unreachable step, all requests probed together per level.

    Steps before it are labelled 1, it and those after 0 (HE). SE is the measured fraction where a prefix
    was probed (or settled by the verifier) and equals HE elsewhere: those steps count in `Labels.imputed`.
    """
    lo = [0] * len(reqs)
    hi = [len(r.prefixes) for r in reqs]  # the first error lies in [lo, hi]; hi == K means none
    known: list[dict[int, float]] = [{} for _ in reqs]
    for r, req in enumerate(reqs):
        # A right final answer makes every prefix reachable (the completion itself reaches it).
        if req.settled and req.settled[-1] is True:
            lo[r] = hi[r]
            known[r][len(req.prefixes) - 1] = 1.0
    spent = [0] * len(reqs)
    while True:
        probes = [(r, (lo[r] + hi[r]) // 2) for r in range(len(reqs)) if lo[r] < hi[r]]
        if not probes:
            break
        need = [(r, k) for r, k in probes if reqs[r].settled[k] is None]
        measured = dict(zip(need, _fractions(problem_set, completer, need, reqs, n)))
        for r, k in probes:
            frac = measured[(r, k)] if (r, k) in measured else float(reqs[r].settled[k])
            spent[r] += n * ((r, k) in measured)
            known[r][k] = frac
            if frac > 0:
                lo[r] = k + 1
            else:
                hi[r] = k
    out = []
    for r, req in enumerate(reqs):
        he = [int(k < lo[r]) for k in range(len(req.prefixes))]
        se = [known[r].get(k, float(h)) for k, h in enumerate(he)]
        out.append(Labels(he, se, spent[r], imputed=len(req.prefixes) - len(known[r])))
    return out


def imputed_share(labels: Sequence[Labels]) -> float:
    """Share of all step labels that are imputed, not measured (0 for exhaustive; 0 when there are no steps).

    >>> imputed_share([Labels([1, 1, 0], [1.0, 0.75, 0.0], 8, imputed=1), Labels([1], [1.0])])
    0.25
    """
    steps = sum(len(lab.he) for lab in labels)
    return sum(lab.imputed for lab in labels) / steps if steps else 0.0


def agreement(labels: Sequence[Sequence[float]], gold: Sequence[Sequence[int]], threshold: float = 0.5) -> float:
    """Share of steps whose label (>= threshold counts as 1) equals the gold label, over the samples with gold
    labels (None: a sample whose steps the set cannot judge).

    >>> agreement([[1, 0], [0.75], [0]], [[1, 1], [1], None])
    0.6666666666666666
    """
    pairs = [(int(v >= threshold), g) for ls, gs in zip(labels, gold) if gs is not None for v, g in zip(ls, gs)]
    return sum(a == b for a, b in pairs) / len(pairs) if pairs else float("nan")
