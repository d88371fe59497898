"""The collection phase: sample the fresh policy, label outcomes with the verifier, label steps by Monte Carlo.

Math-Shepherd (arXiv 2312.08935 §3.3): from the prefix ending at step i, the completer (the current
policy, or round 0's with `collect.prover: round0`: PAV's prover) writes N completions; hard estimation (HE) is 1 if any reaches the gold answer, soft estimation
(SE) the fraction that do. A prefix that already states a final answer needs no rollouts: the verifier
labels it. Strategy `first_error` (OmegaPRM's idea) binary-searches the first step whose prefix can no
longer reach the gold answer, assuming reachability is monotone, with about log2(K) probed prefixes; the
labels of the steps it never probes are imputed from the search (HE, and SE set to HE: a hard label where
`target: soft` asks for a soft one), and `collect/imputed_label_share` logs their share.

A prefix is cut from the policy's own tokens: the prompt's ids, then the sampled completion's ids up to
the token holding the step's end (`steps.step_token_ends`, the token the PRM is trained on). Rollouts go on
from those ids, never from the prefix's text tokenized again (which can give other tokens: SentencePiece
spaces, a character split over byte tokens, a merge across the cut).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.config import PipelineConfig
from pipeline.generation import Continuation, prompt_ids
from pipeline.problems import Problem, ProblemSet
from pipeline.replay import ReplayBuffer, write_shard
from pipeline.rundir import RunDir, write_json_atomic
from pipeline.steps import split_steps, step_char_ends, step_token_ends, token_spans

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


def _fractions(
    problem_set: ProblemSet, completer: Completer, jobs: list[tuple[int, int]], reqs: list[LabelRequest], n: int
) -> list[float]:
    """Share of N rollouts from each (request, step) prefix that reach the gold answer: one batched call."""
    if not jobs:
        return []
    rollouts = completer([reqs[r].continuations[k] for r, k in jobs], n)
    return [
        sum(problem_set.is_correct(c, reqs[r].problem) for c in conts) / n for (r, k), conts in zip(jobs, rollouts)
    ]


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


def draw_prompts(problem_set: ProblemSet, run_dir: Path, round_index: int, count: int, seed: int) -> list[Problem]:
    """M training problems for this round: ones not drawn in earlier rounds first, until the pool runs out."""
    used = {row["prompt_id"] for row in ReplayBuffer(run_dir).history(round_index)}
    rng = random.Random(seed * 7919 + round_index)
    fresh = [p for p in problem_set.train if p.id not in used]
    rng.shuffle(fresh)
    if len(fresh) < count:  # pool exhausted: top up from the problems seen before
        seen = [p for p in problem_set.train if p.id in used]
        rng.shuffle(seen)
        fresh += seen[: count - len(fresh)]
    return fresh[:count]


@dataclass
class CollectResult:
    shard_path: Path
    metrics: dict[str, float]


def run_collection_phase(
    cfg: PipelineConfig, problem_set: ProblemSet, policy_path: str | Path, run_dir: str | Path, round_index: int
) -> CollectResult:
    """Sample G completions for M fresh prompts, label outcomes and steps, write the round's shard.

    With `collect.workers > 1` every generation call (the samples, then each MC rollout stream) is
    sharded over the workers (`pipeline/fanout.py`) and merged here; labelling itself stays here, as it
    only reads strings. The shard is the same as with one worker.
    """
    from models.factories import load_tokenizer
    from pipeline.fanout import open_sampler
    from pipeline.prompts import renderer_from_config

    c = cfg.collect
    tokenizer = load_tokenizer(str(policy_path))  # the policy's: step prefixes are cut from its tokens
    render = renderer_from_config(cfg, tokenizer).render
    run_dir = Path(run_dir)
    seed = cfg.run.seed * 1000 + round_index
    stats = {"rollout_seconds": 0.0, "rollout_tokens": 0, "rollouts": 0}
    prover = RunDir(run_dir).policy(0) if c.prover == "round0" else policy_path  # who writes the MC rollouts
    with contextlib.ExitStack() as models:
        sample = models.enter_context(open_sampler(str(policy_path), c))
        prove = sample if str(prover) == str(policy_path) else models.enter_context(open_sampler(str(prover), c))

        def completer(prefixes: list[Continuation], n: int) -> list[list[str]]:
            stats["calls"] = stats.get("calls", 0) + 1
            out = prove(prefixes, n, seed=seed + 17 * stats["calls"], desc="MC rollouts")
            stats["rollout_seconds"] += out.seconds
            stats["rollout_tokens"] += out.total_tokens
            stats["rollouts"] += len(prefixes) * n
            return out.texts

        # Sample the fresh policy.
        problems = draw_prompts(problem_set, run_dir, round_index, c.prompts_per_round, cfg.run.seed)
        prompts = {p.id: render(p) for p in problems}  # what the policy, the rollouts and the RMs read
        fresh = sample([prompts[p.id] for p in problems], c.samples_per_prompt, seed=seed, desc="samples")
        items = [(p, j, fresh.texts[i][j], fresh.num_tokens[i][j], fresh.ids[i][j])
                 for i, p in enumerate(problems) for j in range(c.samples_per_prompt)]

        # Label: verifier outcome, then MC step labels through one batched stream.
        reqs = [make_request(problem_set, p, tokenizer, ids, prompts[p.id]) for p, _, _, _, ids in items]
        label = label_exhaustive if c.strategy == "exhaustive" else label_first_error
        labels = label(problem_set, completer, reqs, c.rollouts_per_step)

    rows, gold = [], []
    for (p, j, text, ntok, _), lab in zip(items, labels):
        g = problem_set.gold_step_labels(text, p) if problem_set.has_gold_step_labels else None
        gold.append(g)
        rows.append({
            "round": round_index, "policy": str(policy_path), "prompt_id": p.id, "prompt": prompts[p.id],
            "sample_index": j, "completion": text, "answer": problem_set.extract_answer(text),
            "steps": split_steps(text, problem_set.step_separator), "outcome": int(problem_set.is_correct(text, p)),
            "he_labels": lab.he, "se_labels": lab.se, "gold_labels": g, "rollouts": lab.rollouts,
            "num_tokens": ntok,
        })

    metrics = {
        "collect/samples": float(len(rows)),
        "collect/verifier_accuracy": sum(r["outcome"] for r in rows) / max(len(rows), 1),
        "collect/steps_per_sample": sum(len(r["steps"]) for r in rows) / max(len(rows), 1),
        "collect/imputed_label_share": imputed_share(labels),  # first_error's inferred labels (SE = HE there)
        "collect/rollouts": float(stats["rollouts"]),
        "collect/rollouts_per_s": stats["rollouts"] / max(stats["rollout_seconds"], 1e-9),
        "collect/rollout_tokens_per_s": stats["rollout_tokens"] / max(stats["rollout_seconds"], 1e-9),
        "collect/sample_tokens_per_s": fresh.total_tokens / max(fresh.seconds, 1e-9),
    }
    if problem_set.has_gold_step_labels:
        he = [r["he_labels"] for r in rows]
        se = [r["se_labels"] for r in rows]
        metrics["collect/he_gold_agreement"] = agreement(he, gold)
        metrics["collect/se_gold_agreement"] = agreement(se, gold)
    path = write_shard(rows, RunDir(run_dir).shard(round_index))
    write_json_atomic(RunDir(run_dir).collect_json(round_index), metrics)
    return CollectResult(path, metrics)
