"""Rewards: the verifier as a TRL reward function, ORM and PRM scorers, weighted mixes, and checks on all of them.

TRL's reward signature is `(completions, **kwargs) -> list[float]`, the dataset columns arriving as kwargs
(here `prompt`, `answer`, `prompt_id`, `solution`). A reward that raises, returns the wrong length, or
returns NaN/inf is an error naming the function and the sample: a silent NaN would poison a whole round.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from pipeline.problems import Problem, ProblemSet
from pipeline.steps import step_token_ends

RewardFunc = Callable[..., list[float]]


class RewardError(RuntimeError):
    """A reward function or reward model misbehaved; the message names it and the sample."""


def _problems_from_columns(completions: Sequence[str], kwargs: dict) -> list[Problem]:
    n = len(completions)
    cols = {k: kwargs.get(k) or [""] * n for k in ("prompt_id", "prompt", "answer", "solution")}
    return [Problem(cols["prompt_id"][i], cols["prompt"][i], cols["answer"][i], cols["solution"][i]) for i in range(n)]


def verifier_reward(problem_set: ProblemSet) -> RewardFunc:
    """A TRL reward function: 1.0 when the completion's final answer is the gold one, else 0.0.

    >>> from pipeline.problems import EmbeddedArithmetic
    >>> verifier = verifier_reward(EmbeddedArithmetic(num_train=5, num_test=5))
    >>> verifier(["1+1=2\\nAnswer: 2", "Answer: 3"], answer=["2", "2"])
    [1.0, 0.0]
    """

    def verifier(completions: list[str], **kwargs) -> list[float]:
        problems = _problems_from_columns(completions, kwargs)
        return [float(problem_set.is_correct(c, p)) for c, p in zip(completions, problems)]

    return verifier


def checked(func: RewardFunc, name: str | None = None) -> RewardFunc:
    """Wrap a reward function so that misbehaviour is one clear `RewardError` naming it and the sample."""
    name = name or getattr(func, "__name__", repr(func))

    def wrapper(completions: list[str], **kwargs) -> list[float]:
        try:
            values = func(completions, **kwargs)
        except Exception as e:  # the user's function: anything can come out
            raise RewardError(f"reward function {name!r} raised on a batch of {len(completions)}: {e!r}") from e
        values = list(values)
        if len(values) != len(completions):
            raise RewardError(f"reward function {name!r} returned {len(values)} rewards for {len(completions)} completions")
        for i, v in enumerate(values):
            if v is not None and not math.isfinite(float(v)):
                preview = completions[i][:60].replace("\n", "\\n")
                raise RewardError(f"reward function {name!r} returned {v} for sample {i} ({preview!r})")
        return [None if v is None else float(v) for v in values]

    wrapper.__name__ = name
    return wrapper


def _forward(model, tokenizer, texts: list[str], batch_size: int, offsets: bool):
    """Yield (batch start, logits (b, T), encodings) over right-padded batches, no grad."""
    device = next(model.parameters()).device
    for s in range(0, len(texts), batch_size):
        enc = tokenizer(
            texts[s : s + batch_size], return_tensors="pt", padding=True, padding_side="right",
            return_offsets_mapping=offsets,
        )
        offs = enc.pop("offset_mapping", None)
        with torch.inference_mode():
            logits = model(**enc.to(device)).logits.float()
        yield s, logits, offs


class OrmScorer:
    """Batched no-grad ORM: P(correct) = sigmoid(logit) of `prompt + completion`."""

    def __init__(self, model, tokenizer, batch_size: int = 64):
        self.model, self.tokenizer, self.batch_size = model.eval(), tokenizer, batch_size

    def __call__(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
        texts = [p + c for p, c in zip(prompts, completions)]
        out: list[float] = []
        for s, logits, _ in _forward(self.model, self.tokenizer, texts, self.batch_size, offsets=False):
            out += torch.sigmoid(logits[:, 0]).tolist()  # (b,)
        _refuse_nonfinite("ORM", out, completions)
        return out

    def as_reward(self) -> RewardFunc:
        def orm(completions: list[str], prompts: list[str] | None = None, **kwargs) -> list[float]:
            # GRPOTrainer passes the prompts as `prompts`; the dataset's `prompt` column is not among its kwargs.
            return self(prompts if prompts is not None else kwargs["prompt"], completions)

        return orm


class PrmScorer:
    """Batched no-grad PRM: one forward pass per batch, P(step correct) read at each step end.

    Steps follow `pipeline.steps`; a blank completion is read at its last character (one score).
    """

    def __init__(self, model, tokenizer, batch_size: int = 64):
        self.model, self.tokenizer, self.batch_size = model.eval(), tokenizer, batch_size

    def step_scores(self, prompts: Sequence[str], completions: Sequence[str]) -> list[list[float]]:
        texts = [p + c for p, c in zip(prompts, completions)]
        out: list[list[float]] = []
        for s, logits, offs in _forward(self.model, self.tokenizer, texts, self.batch_size, offsets=True):
            probs = torch.sigmoid(logits[..., 0])  # (b, T)
            for r in range(probs.shape[0]):
                i = s + r
                idx = step_token_ends(offs[r].tolist(), completions[i], start=len(prompts[i]))
                out.append(probs[r, idx].tolist())
        for i, scores in enumerate(out):
            _refuse_nonfinite("PRM", scores, [completions[i]] * len(scores), sample=i)
        return out

    def __call__(self, prompts, completions, aggregation: str = "min") -> list[float]:
        return [aggregate(s, aggregation) for s in self.step_scores(prompts, completions)]


def aggregate(step_scores: Sequence[float], how: str = "min") -> float:
    """A solution's PRM score from its step scores (Math-Shepherd uses the minimum).

    >>> aggregate([0.9, 0.5, 0.8]), aggregate([0.9, 0.5, 0.8], "last"), round(aggregate([0.5, 0.5], "product"), 2)
    (0.5, 0.8, 0.25)
    """
    if how == "min":
        return min(step_scores)
    if how == "last":
        return step_scores[-1]
    if how == "product":
        return math.prod(step_scores)
    raise ValueError(f"aggregation must be one of min, last, product; got {how!r}")


def _refuse_nonfinite(what: str, values, completions, sample: int | None = None) -> None:
    # Decided: a non-finite score is an error, not masked: it means a broken checkpoint, and masking
    # would silently train on the rest.
    for i, v in enumerate(values):
        if not math.isfinite(v):
            k = sample if sample is not None else i
            preview = completions[i][:60].replace("\n", "\\n")
            raise RewardError(f"{what} returned {v} for sample {k} ({preview!r}): the reward model is broken")


def weighted_mix(funcs: dict[str, RewardFunc], weights: dict[str, float]) -> RewardFunc:
    """One reward function summing weighted ones (e.g. verifier + 0.5 ORM).

    >>> mix = weighted_mix({"a": lambda c, **k: [1.0] * len(c), "b": lambda c, **k: [0.5] * len(c)}, {"a": 1, "b": 2})
    >>> mix(["x"])
    [2.0]
    """

    def mix(completions: list[str], **kwargs) -> list[float]:
        total = [0.0] * len(completions)
        for name, f in funcs.items():
            for i, v in enumerate(checked(f, name)(completions, **kwargs)):
                total[i] += weights[name] * v
        return total

    return mix
