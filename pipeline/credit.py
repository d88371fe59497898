"""How step values become token advantages, as three tables the config validates its choices against: `CREDITS`, how
a token gathers the values of the steps ahead of it (`supervision.process_credit`); `BASELINES`, which steps a step
reward is normalised with (`supervision.process_baseline`); `CENTRINGS`, whose mean is removed from the process
advantages (`supervision.process_centring`). `pipeline.advantages` reads the same entries; a plugin adds one with
`CREDITS.register(NAME, description=..., credited=...)` (and so on).

Torch-free: the entries' functions import their tensor math (`pipeline.credit_math`) when first called.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipeline.registry import Registry


@dataclass(frozen=True, kw_only=True)
class Credit:
    """How a token is credited with step values (`CREDITS.register(NAME, description=..., credited=...)`).

    Attributes:
        description: what a token gets, for the docs.
        credited: (completion (S,), end (S,), value (S,) float64, B, T) -> the (B, T) token advantages, from every
            step of the batch flattened: its completion, its last token and its value (`pipeline.credit_math`).
    """

    description: str
    credited: Callable[[Any, Any, Any, int, int], Any]


@dataclass(frozen=True, kw_only=True)
class Baseline:
    """Which steps a step reward is normalised with (`BASELINES.register(NAME, description=..., segments=...)`).

    Attributes:
        description: which steps, for the docs.
        segments: (completion (S,), steps per completion (B,), G) -> (each step's segment (S,), the number of
            segments): a step's reward is normalised with the mean and std of its segment's.
    """

    description: str
    segments: Callable[[Any, Any, int], tuple[Any, int]]


@dataclass(frozen=True, kw_only=True)
class Centring:
    """Whose mean is removed from the process advantages (`CENTRINGS.register(NAME, description=..., centre=...)`).

    Attributes:
        description: whose mean, for the docs.
        centre: (advantages (B, T), the loss tokens (B, T) bool, G) -> the (B, T) advantages.
    """

    description: str
    centre: Callable[[Any, Any, int], Any]


def _sum(completion, end, value, batch_size, length):
    from pipeline.credit_math import sum_credit

    return sum_credit(completion, end, value, batch_size, length)


def _min(completion, end, value, batch_size, length):
    from pipeline.credit_math import min_credit

    return min_credit(completion, end, value, batch_size, length)


def _step(completion, end, value, batch_size, length):
    from pipeline.credit_math import step_credit

    return step_credit(completion, end, value, batch_size, length)


def _group(completion, counts, group_size):
    from pipeline.credit_math import group_segments

    return group_segments(completion, counts, group_size)


def _position(completion, counts, group_size):
    from pipeline.credit_math import position_segments

    return position_segments(completion, counts, group_size)


def _over_group(advantages, mask, group_size):
    from pipeline.credit_math import mean_removed

    return mean_removed(advantages, mask, group_size)


def _over_output(advantages, mask, group_size):
    from pipeline.credit_math import mean_removed

    return mean_removed(advantages, mask, 1)


CREDITS: Registry[Credit] = Registry("process credit", Credit, {
    "sum": Credit(description="the sum of the step values of the steps ending at or after the token (DeepSeekMath "
                              "§4.1.3)", credited=_sum),
    "min": Credit(description="the minimum of the step values of the steps ending at or after the token (PURE, arXiv "
                              "2504.15275)", credited=_min),
    "step": Credit(description="the value of the token's own step, the first ending at or after it", credited=_step),
})

BASELINES: Registry[Baseline] = Registry("process baseline", Baseline, {
    "group": Baseline(description="every step of the group (DeepSeekMath §4.1.3)", segments=_group),
    "position": Baseline(description="the group's steps at the same index only, so a PRM's prior over positions "
                                     "cancels", segments=_position),
})

CENTRINGS: Registry[Centring] = Registry("process centring", Centring, {
    "none": Centring(description="none: as DeepSeekMath", centre=lambda advantages, mask, group_size: advantages),
    "group": Centring(description="the mean over the group's loss tokens", centre=_over_group),
    "output": Centring(description="the mean over the output's loss tokens", centre=_over_output),
})
