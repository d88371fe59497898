"""Reward functions by name (a registry) with TRL's signature, and the checks every reward goes through.

TRL's reward signature is `(completions, **kwargs) -> list[float]`, the dataset columns arriving as kwargs
(here `prompt_text`, `answer`, `prompt_id`, `solution`). TRL gets the rendered prompt as text, chat prompts
included (`pipeline/prompts.py`), so completions come as text; were a dataset conversational, TRL would hand
over messages, and `checked`, which wraps every reward given to TRL, turns them back into their text. A reward
that raises, returns something other than a list of one number (or None) per completion, or returns NaN/inf is
an error naming the function and the sample: a silent NaN would poison a whole round.

`REWARD_FUNCS` maps the names that `supervision.rewards` weighs (`{verifier: 1.0, orm: 0.5}`) to a factory
and the reward-model kind the function scores with, if any: the config then requires that kind in
`reward_model.kinds`, and the policy phase loads its checkpoint and hands the scorer to the factory. A new
reward function is a factory and one `REWARD_FUNCS.register(NAME, build=...)` call (docs/extending.md).
"""

from __future__ import annotations

import math
import numbers
import reprlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from pipeline.problems import Problem, ProblemSet
from pipeline.registry import Registry

RewardFunc = Callable[..., list[float]]
# A reward model's scorer (`pipeline.scorers`): (prompts, completions) -> one score per solution.
SolutionScorer = Callable[[Sequence[str], Sequence[str]], list[float]]


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

    def verifier(completions: list, **kwargs) -> list[float]:
        problems = _problems_from_columns(completions, kwargs)
        return [float(problem_set.is_correct(completion_text(c), p)) for c, p in zip(completions, problems)]

    return verifier


def completion_text(completion: str | list[dict]) -> str:
    """A completion as text: TRL gives a conversational one as messages (`[{"role": "assistant", "content": ...}]`).

    >>> completion_text([{"role": "assistant", "content": "Answer: 4"}]), completion_text("Answer: 4")
    ('Answer: 4', 'Answer: 4')
    """
    return completion if isinstance(completion, str) else "".join(m["content"] for m in completion)


def scorer_reward(scorer: SolutionScorer) -> RewardFunc:
    """A TRL reward function from a reward model's scorer: its score of `prompt + completion`.

    >>> length = scorer_reward(lambda prompts, completions: [float(len(p + c)) for p, c in zip(prompts, completions)])
    >>> length(["ab", "c"], prompts=["x", "yz"])
    [3.0, 3.0]
    """

    def rm(completions: list[str], prompts: list | None = None, **kwargs) -> list[float]:
        # The rendered prompt (`round_prompts`' `prompt_text`; a conversational dataset's `prompts` would be
        # messages). Without that column: `prompts` (GRPOTrainer's), else the `prompt` column.
        texts = kwargs.get("prompt_text") or (prompts if prompts is not None else kwargs["prompt"])
        return scorer(texts, completions)

    return rm


@dataclass(frozen=True)
class RewardSpec:
    """One named reward function.

    Attributes:
        build: (problem set, RM kind -> loaded scorer) -> the reward function.
        reward_model: the RM kind whose scorer `build` needs (its checkpoint is loaded for it), or None.
    """

    build: Callable[[ProblemSet, Mapping[str, SolutionScorer]], RewardFunc]
    reward_model: str | None = None


REWARD_FUNCS: Registry[RewardSpec] = Registry("reward function", RewardSpec, {
    # First: the reward functions run in this order, and rft mode reads the verifier as column 0.
    "verifier": RewardSpec(lambda problem_set, scorers: verifier_reward(problem_set)),
    "orm": RewardSpec(lambda problem_set, scorers: scorer_reward(scorers["orm"]), reward_model="orm"),
})


def reward_spec(name: str) -> RewardSpec:
    """The registry entry of `name` (an unknown one: the registry's error, listing the known ones)."""
    return REWARD_FUNCS[name]


def active_rewards(mode: str, weights: Mapping[str, float]) -> dict[str, float]:
    """The GRPO reward functions of a supervision mode, name -> weight, in the registry's order.

    The verifier always runs. In process and rft mode it is the only one, weight 1 (process mode logs it as
    the training accuracy, rft takes it as the advantage); in outcome and hybrid mode (whose outcome term is
    TRL's advantage of these rewards) it runs even at weight 0, so its accuracy is logged, beside every
    other reward of positive weight in `weights`.

    >>> active_rewards("outcome", {"orm": 1.0})
    {'verifier': 0.0, 'orm': 1.0}
    >>> active_rewards("hybrid", {"verifier": 1.0, "orm": 0.5})
    {'verifier': 1.0, 'orm': 0.5}
    >>> active_rewards("process", {"verifier": 0.5, "orm": 1.0})
    {'verifier': 1.0}
    """
    from pipeline.modes import supervision_mode

    if not supervision_mode(mode).weighted_rewards:
        return {"verifier": 1.0}
    return {n: weights.get(n, 0.0) for n in REWARD_FUNCS if n == "verifier" or weights.get(n, 0.0) > 0}


def reward_models_needed(cfg) -> dict[str, str]:
    """The RM kinds the GRPO phase loads, each with the setting that needs it: the step scorer
    (`supervision.process_reward_model`, the PRM by default) in a mode with step rewards (process, hybrid), and
    the RM of each active reward function (`orm` for `supervision.rewards.orm > 0` in outcome and hybrid mode).
    With `reward_model.oracle` the gold step labels replace the step scorer's scores: it is not loaded for them."""
    from pipeline.modes import supervision_mode

    mode = cfg.supervision.mode
    steps = supervision_mode(mode).step_rewards and cfg.reward_model.oracle is None
    needed = {cfg.supervision.process_reward_model: f"{mode} supervision"} if steps else {}
    for name in active_rewards(cfg.supervision.mode, cfg.supervision.rewards):
        kind = reward_spec(name).reward_model
        if kind is not None:
            needed.setdefault(kind, f"supervision.rewards.{name} > 0")
    return needed


def build_reward_func(name: str, problem_set: ProblemSet, scorers: Mapping[str, SolutionScorer]) -> RewardFunc:
    """The reward function `name`, wrapped by `checked` and named `name` (TRL logs `rewards/<name>/mean`)."""
    return checked(reward_spec(name).build(problem_set, scorers), name)


def checked(func: RewardFunc, name: str | None = None) -> RewardFunc:
    """Wrap a reward function so that misbehaviour is one clear `RewardError` naming it and the sample.

    The wrapped function gets the completions as text (`completion_text`), in either prompt format. It must
    return one reward per completion: a real number (a bool counts) or None (TRL: no reward for that sample).
    When it raises on a batch, it is called on each sample alone to name the first one it fails on.
    """
    name = name or getattr(func, "__name__", repr(func))

    def wrapper(completions: list, **kwargs) -> list[float]:
        completions = [completion_text(c) for c in completions]
        n = len(completions)
        try:
            out = func(completions, **kwargs)
            # list(x) of a string or dict would be its characters or keys; of a 0-d array, an error.
            values = None if _not_a_batch(out) else list(out)  # inside the try: a generator raises here
        except Exception as e:  # the user's function: anything can come out
            culprit = _first_raising(func, completions, kwargs)
            raise RewardError(f"reward function {name!r} raised on a batch of {n}: {e!r}{culprit}") from e
        if values is None:
            shown = "None" if out is None else f"{reprlib.repr(out)} ({type(out).__name__})"
            hint = " (a missing return?)" if out is None else ""
            raise RewardError(
                f"reward function {name!r} returned {shown}, not a list of one reward per completion{hint}"
            )
        if len(values) != n:
            raise RewardError(f"reward function {name!r} returned {len(values)} rewards for {n} completions")
        rewards = []
        for i, v in enumerate(values):
            try:
                reward = None if v is None else _real(v)
            except Exception as e:  # float() of a list, a dict, an int beyond float's range, a user's type
                raise RewardError(
                    f"reward function {name!r} returned {reprlib.repr(v)} for sample {i} "
                    f"({_preview(completions[i])!r}), not a float or None: {e}"
                ) from None
            if reward is not None and not math.isfinite(reward):
                preview = _preview(completions[i])
                raise RewardError(f"reward function {name!r} returned {v} for sample {i} ({preview!r})")
            rewards.append(reward)
        return rewards

    wrapper.__name__ = name
    return wrapper


def _preview(completion: str) -> str:
    """The start of a completion, on one line, for an error message."""
    return completion[:60].replace("\n", "\\n")


def _not_a_batch(out: object) -> bool:
    """Whether a reward function's output cannot be a list of rewards (None, one number, a string, a dict)."""
    return (out is None or isinstance(out, (str, bytes, Mapping)) or not isinstance(out, Iterable)
            or getattr(out, "ndim", 1) == 0)  # a 0-d array or tensor: one number


def _real(v: object) -> float:
    """One reward as a float; TypeError where it is not a real number.

    float() alone would take the text "0.5" and drop a numpy complex's imaginary part.
    """
    if isinstance(v, (str, bytes)) or (isinstance(v, numbers.Complex) and not isinstance(v, numbers.Real)):
        raise TypeError(f"a reward must be a real number, not {type(v).__name__!r}")
    return float(v)


def _first_raising(func: RewardFunc, completions: list[str], kwargs: dict) -> str:
    """'; called alone, sample i (...) raises ...' for the first sample `func` raises on alone, else ''.

    Each kwarg that is a column of the batch (a sequence of its length) is sliced to the sample's row; the
    others (TRL's `trainer_state`, ...) are passed as they are. Only run once the batch has failed.
    """
    n = len(completions)

    def row(v: object, i: int) -> object:
        is_column = isinstance(v, Sequence) and not isinstance(v, (str, bytes)) and len(v) == n
        return v[i : i + 1] if is_column else v

    for i in range(n):
        try:
            out = func(completions[i : i + 1], **{k: row(v, i) for k, v in kwargs.items()})
            if not _not_a_batch(out):
                list(out)  # as the batch's call: a generator raises here
        except Exception as e:  # the user's function, as above
            return f"; called alone, sample {i} ({_preview(completions[i])!r}) raises {e!r}"
    return ""  # it fails on the batch only: no one sample to blame


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
