"""Batched no-grad scoring of `prompt + completion` by a reward model: the ORM's and the PRM's scorers.

Shared by GRPO (process advantages, the ORM reward), RM evaluation and the eval phase (best-of-N, the
reward-hacking monitor). Every scorer is called as `scorer(prompts, completions) -> list[float]`, one
solution score per (prompt, completion); the PRM also gives its step scores (`PrmScorer.step_scores`).
`scorer.scores(prompts, completions)` gives both from one pass (`Scores`: the step scores only where the
kind has them), for the eval phase, which keeps them for MLflow's sample tables. `GoldStepScorer` gives
GRPO a problem set's gold step labels in the PRM's place (`reward_model.oracle: gold`).
Which scorer a reward-model kind has, and how a checkpoint becomes one, is its entry in `pipeline.rm_kinds.RM_KINDS`.

A non-finite score is an error naming the sample (a broken checkpoint), never masked.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch

from pipeline.problems.base import Problem, ProblemSet
from pipeline.rewards import RewardError
from pipeline.rm_kinds.base import AGGREGATIONS, PrmLayout
from pipeline.rm_kinds.heads import StepReader
from pipeline.steps import STEP_SEPARATOR, scored_step_ends


def _forward(model, tokenizer, texts: list[str], batch_size: int, offsets: bool):
    """Yield (batch start, logits (b, T, C), offsets (b, T, 2) or None, input ids (b, T)) over right-padded
    batches, no grad."""
    device = next(model.parameters()).device
    for s in range(0, len(texts), batch_size):
        enc = tokenizer(
            texts[s : s + batch_size], return_tensors="pt", padding=True, padding_side="right",
            return_offsets_mapping=offsets,
        )
        offs, ids = enc.pop("offset_mapping", None), enc["input_ids"]
        with torch.inference_mode():
            logits = model(**enc.to(device)).logits.float()
        yield s, logits, offs, ids


@dataclass(frozen=True)
class Scores:
    """One RM's scores of a list of samples: a solution score each, and each one's step scores (PRM; else None)."""

    solutions: list[float]
    steps: list[list[float]] | None = None

    @staticmethod
    def concat(parts: Sequence[Scores]) -> Scores:
        """The scores of several lists of samples, one after the other."""
        steps = [s for p in parts for s in p.steps] if parts and all(p.steps is not None for p in parts) else None
        return Scores([v for p in parts for v in p.solutions], steps)


class OrmScorer:
    """Batched no-grad ORM: P(correct) = sigmoid(logit) of `prompt + completion`."""

    def __init__(self, model, tokenizer, batch_size: int = 64):
        self.model, self.tokenizer, self.batch_size = model.eval(), tokenizer, batch_size

    def __call__(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
        texts = [p + c for p, c in zip(prompts, completions)]
        out: list[float] = []
        for s, logits, _, _ in _forward(self.model, self.tokenizer, texts, self.batch_size, offsets=False):
            out += torch.sigmoid(logits[:, 0]).tolist()  # (b,)
        _refuse_nonfinite("ORM", out, completions)
        return out

    def scores(self, prompts: Sequence[str], completions: Sequence[str]) -> Scores:
        return Scores(self(prompts, completions))


class StepScorer:
    """A scorer of steps (`step_scores`, `aggregation`): a solution's score is its steps' aggregate."""

    aggregation: str

    def __call__(self, prompts, completions, aggregation: str | None = None) -> list[float]:
        """One score per solution: its step scores aggregated (`aggregation`, else the scorer's own)."""
        how = aggregation or self.aggregation
        return [aggregate(s, how) for s in self.step_scores(prompts, completions)]

    def scores(self, prompts: Sequence[str], completions: Sequence[str]) -> Scores:
        """The solution scores (the scorer's aggregation) with the step scores they come from, in one pass."""
        steps = self.step_scores(prompts, completions)
        return Scores([aggregate(s, self.aggregation) for s in steps], steps)


class PrmScorer(StepScorer):
    """Batched no-grad PRM: one forward pass per batch, P(step correct) read at each step end.

    Steps follow `pipeline.steps` with the separator the PRM was trained on (`separator`: by default the one
    its checkpoint records, `trained_separator`); a blank completion is read at its last character (one score).
    A solution's score is the `aggregation` (min, last, product) of its step scores. `reader` is the PRM's
    layout (`pipeline.rm_kinds.heads.StepReader`): where it reads (a step's end, or a tag put after each step)
    and its formula; None: the value head, one logit at each step's end.
    """

    def __init__(self, model, tokenizer, batch_size: int = 64, aggregation: str = "min", reader: StepReader | None = None,
                 separator: str | None = None):
        self.model, self.tokenizer, self.batch_size = model.eval(), tokenizer, batch_size
        self.aggregation = aggregation
        self.reader = reader or StepReader(PrmLayout())
        self.separator = separator if separator is not None else trained_separator(model)

    def step_scores(self, prompts: Sequence[str], completions: Sequence[str]) -> list[list[float]]:
        texts, reads = zip(*(self.reader.place(p, c, self.separator) for p, c in zip(prompts, completions))) if prompts else ((), ())
        out: list[list[float]] = []
        for s, logits, offs, ids in _forward(self.model, self.tokenizer, list(texts), self.batch_size, offsets=True):
            idx = [self.reader.tokens(offs[r].tolist(), ids[r], reads[s + r]) for r in range(len(ids))]
            sizes = [len(i) for i in idx]
            # The read tokens' logits picked in one indexing and the scores copied back in one: on a GPU two
            # transfers a batch, not two a completion. Each row is still read on its own (the same values).
            rows = torch.repeat_interleave(torch.arange(len(idx)), torch.tensor(sizes))  # (N,)
            picked = logits[rows, torch.tensor([t for i in idx for t in i])].split(sizes)  # b x (n_r, C)
            flat = torch.cat([self.reader.read(x) for x in picked]).tolist()  # (N,)
            out += [flat[end - n : end] for n, end in zip(sizes, itertools.accumulate(sizes))]
        for i, scores in enumerate(out):
            _refuse_nonfinite("PRM", scores, [completions[i]] * len(scores), sample=i)
        return out



class GoldStepScorer:
    """The oracle PRM (`reward_model.oracle: gold`): a problem set's exact gold 0/1 step labels as step scores.

    `step_scores` is `PrmScorer.step_scores`'s interface, one score per step end a PRM reads
    (`steps.scored_step_ends`), so GRPO's process supervision takes it in the PRM's place unchanged (the
    trainer locates the same steps on the policy's tokens, `policy.completion_steps`, and merges those ending
    on one token, `policy.dedupe_steps`: the last one's label wins, as the last one's score does for a PRM).
    `gold_step_labels` labels the steps of `steps.split_steps`, the non-blank lines, which are the lines
    `steps.step_spans` keeps too (both test `line.strip()`), so the counts agree on every non-blank text. A
    blank completion (empty, or only whitespace) has no gold steps but one score read at its last character:
    it gets one label, 0 (an empty answer takes no correct step). Any other count that differs is an error.

    Args:
        problem_set: the set whose `gold_step_labels` judge the completions (`has_gold_step_labels`).
        problems: prompt text -> the problem it states, for every prompt the trainer will score after
            (`from_rows`: the round's GRPO dataset).
    """

    def __init__(self, problem_set: ProblemSet, problems: Mapping[str, Problem]):
        if not problem_set.has_gold_step_labels:
            raise ValueError(f"{problem_set.name}: has no gold step labels, so it cannot be the oracle PRM")
        self.problem_set, self.problems = problem_set, dict(problems)
        self.separator = problem_set.step_separator

    @classmethod
    def from_rows(cls, problem_set: ProblemSet, rows: Iterable[Mapping]) -> GoldStepScorer:
        """From GRPO's dataset (`policy.round_prompts`): each row's `prompt_text` and the training problem `prompt_id`."""
        return cls(problem_set, problems_by_prompt(problem_set, rows))

    def step_scores(self, prompts: Sequence[str], completions: Sequence[str]) -> list[list[float]]:
        return [self.labels(p, c) for p, c in zip(prompts, completions)]

    def labels(self, prompt: str, completion: str) -> list[float]:
        """The gold label of each step of `completion` (one per `scored_step_ends`), the problem found by `prompt`."""
        problem = self.problems.get(prompt)
        if problem is None:
            raise ValueError(f"oracle PRM: no problem has the prompt {prompt[:60]!r} (not among the round's prompts)")
        gold = self.problem_set.gold_step_labels(completion, problem) if completion.strip() else [0]
        ends = scored_step_ends(completion, self.separator)
        if len(gold) != len(ends):
            raise ValueError(f"oracle PRM: {len(gold)} gold labels but {len(ends)} steps in {completion[:60]!r} "
                             f"({problem.id}): the problem set splits steps unlike pipeline.steps")
        return [float(v) for v in gold]


def problems_by_prompt(problem_set: ProblemSet, rows: Iterable[Mapping]) -> dict[str, Problem]:
    """Prompt text -> training problem, from GRPO's dataset rows (`policy.round_prompts`: `prompt_text`, `prompt_id`):
    how a step scorer that judges by the problem finds it from the prompt the trainer hands it."""
    by_id = {p.id: p for p in problem_set.train}
    problems: dict[str, Problem] = {}
    for row in rows:
        if row["prompt_id"] not in by_id:
            raise ValueError(f"prompt_id {row['prompt_id']!r}: not a training problem of {problem_set.name}")
        problem = problems.setdefault(row["prompt_text"], by_id[row["prompt_id"]])
        if problem.id != row["prompt_id"]:  # one text, two problems: which labels would be ambiguous
            raise ValueError(f"prompt_id {row['prompt_id']!r} and {problem.id!r} have the same prompt text")
    return problems


def trained_separator(model) -> str:
    """The step separator a PRM was trained on: recorded in its config (`config.json`) when trained, so that every
    phase reads its scores at the step ends it learned; a line for a checkpoint that records none."""
    recorded = getattr(getattr(model, "config", None), SEPARATOR_KEY, None)
    return recorded if isinstance(recorded, str) and recorded else STEP_SEPARATOR


SEPARATOR_KEY = "igrpo_step_separator"  # the model config's key of `trained_separator`


def aggregate(step_scores: Sequence[float], how: str = "min") -> float:
    """A solution's PRM score from its step scores, by the entry `how` of `pipeline.rm_kinds.AGGREGATIONS`
    (Math-Shepherd uses the minimum); an unknown one: the registry's error, listing the known ones.

    >>> aggregate([0.9, 0.5, 0.8]), aggregate([0.9, 0.5, 0.8], "last"), round(aggregate([0.5, 0.5], "product"), 2)
    (0.5, 0.8, 0.25)
    """
    return AGGREGATIONS[how].aggregate(step_scores)


def _refuse_nonfinite(what: str, values, completions, sample: int | None = None) -> None:
    # Decided: a non-finite score is an error, not masked: it means a broken checkpoint, and masking
    # would silently train on the rest.
    for i, v in enumerate(values):
        if not math.isfinite(v):
            k = sample if sample is not None else i
            preview = completions[i][:60].replace("\n", "\\n")
            raise RewardError(f"{what} returned {v} for sample {k} ({preview!r}): the reward model is broken")
