"""The supervision modes of the GRPO phase as one table, `MODES`, read by the config's validation, the active
reward functions, `rewards.reward_models_needed`, `ProcessGRPOTrainer` and the eval phase.

A mode says whether GRPO scores each step (a PRM, or the oracle's gold labels), whether TRL's own outcome
advantage is its starting point, which reward functions it reads, which `grpo:` fields it replaces, which
`supervision.*` fields it reads, and how it turns those into the advantages (`advantages`: a pure function of
tensors, `pipeline.advantages`). Torch-free: the config imports it, the tensor math is imported when a trainer
calls it. A new mode is one function and one `MODES.register(NAME, ...)` call (docs/extending.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pipeline.registry import Registry

# Every mode: TRL's `reward_weights` is set by the pipeline from `supervision.rewards`.
_REWARD_WEIGHTS = "set by the pipeline from supervision.rewards; set that instead"


@dataclass(frozen=True)
class AdvantageInputs:
    """What a mode's `advantages` receives for one GRPO batch, gathered over processes.

    Attributes:
        outcome: TRL's group-normalised outcome advantages, (B,), where the mode has `trl_advantage`, else None.
        process: per-token process advantages from the step rewards, (B, T), where the mode has `step_rewards`.
        rewards: each reward function's reward, (B, F), in `active_rewards`' order (the verifier first).
        lengths: each completion's tokens in the loss (0: masked out).
        supervision: the `supervision:` config section (its weights and options).
    """

    outcome: Any
    process: Any
    rewards: Any
    lengths: list[int]
    supervision: Any


# (inputs) -> (advantages (B,) or (B, T), metrics to log under the mode's name)
Advantages = Callable[[AdvantageInputs], tuple[Any, dict[str, float]]]


@dataclass(frozen=True)
class SupervisionMode:
    """One supervision mode, declared.

    Attributes:
        description: one line, for the docs' table and messages.
        advantages: how the batch's advantages are made; None keeps TRL's outcome advantages as they are.
        step_rewards: GRPO scores every step of every completion (`supervision.process_reward_model`, or the oracle).
        trl_advantage: TRL's outcome advantage of the weighted rewards is an input (`AdvantageInputs.outcome`).
        weighted_rewards: the reward functions are `supervision.rewards` (which need a weight above 0); False:
            the verifier alone, weight 1 (logged as the training accuracy, or the mode's reward).
        replaces: `grpo:` fields the mode replaces -> why; giving one is an error saying so.
        reads: `supervision.*` fields it reads besides `mode`; a non-default value of one it does not read
            is an error (a knob that does nothing).
        check: more validation of the `supervision:` section, raising ValueError; None: none.
    """

    description: str
    advantages: Advantages | None = None
    step_rewards: bool = False
    trl_advantage: bool = True
    weighted_rewards: bool = True
    replaces: Mapping[str, str] = field(default_factory=dict)
    reads: tuple[str, ...] = ()
    check: Callable[[Any], None] | None = None


def _process(x: AdvantageInputs):
    return x.process, {}


def _hybrid(x: AdvantageInputs):
    from pipeline.advantages import hybrid_advantages, process_variance_share

    w = x.supervision.process_weight
    share = process_variance_share(x.outcome, x.process, w, x.lengths)
    return hybrid_advantages(x.outcome, x.process, w), {"process_variance_share": share}


def _rft(x: AdvantageInputs):
    from pipeline.advantages import rft_advantages

    return rft_advantages(x.rewards[:, 0]), {}  # the verifier is reward column 0


def _verifier_only(supervision) -> None:
    others = [name for name, w in supervision.rewards.items() if name != "verifier" and w > 0]
    if others:
        raise ValueError(f"rft mode rewards the verifier's correct samples only: drop {', '.join(others)} from "
                         "supervision.rewards (or use mode: outcome to mix them in)")


_STEP_FIELDS = ("process_credit", "process_baseline", "process_centring", "process_reward", "process_reward_model")

MODES: Registry[SupervisionMode] = Registry("supervision mode", SupervisionMode, {
    "outcome": SupervisionMode(
        "one scalar per completion from supervision.rewards (verifier, ORM, a weighted mix), group-normalised "
        "by TRL, the same advantage on every token",
        replaces={"reward_weights": _REWARD_WEIGHTS}),
    "process": SupervisionMode(
        "the PRM scores every step; the group's step rewards are normalised together and a token gets the sum "
        "(or min) of those at or after it (DeepSeekMath §4.1.3)",
        _process, step_rewards=True, trl_advantage=False, weighted_rewards=False, reads=_STEP_FIELDS,
        replaces={"reward_weights": _REWARD_WEIGHTS,
                  "multi_objective_aggregation": "not used in process or rft mode: it combines reward functions "
                  "into TRL's outcome advantages, which these modes replace; remove it"}),
    "hybrid": SupervisionMode(
        "the verifier's outcome advantage on every token plus process_weight times the process advantage",
        _hybrid, step_rewards=True, reads=("process_weight", *_STEP_FIELDS),
        replaces={"reward_weights": _REWARD_WEIGHTS}),
    "rft": SupervisionMode(
        "Online RFT (DeepSeekMath §5.2.1): the verifier's 0/1 reward as the advantage, no baseline",
        _rft, trl_advantage=False, weighted_rewards=False, check=_verifier_only,
        replaces={"reward_weights": _REWARD_WEIGHTS,
                  "scale_rewards": "not used in rft mode: the advantage is the verifier's 0/1 reward itself, with "
                  "no group baseline and no scaling (DeepSeekMath §5.2.1); remove it, or use mode outcome or process",
                  "multi_objective_aggregation": "not used in process or rft mode: it combines reward functions "
                  "into TRL's outcome advantages, which these modes replace; remove it"}),
})


def supervision_mode(name: str) -> SupervisionMode:
    """The table entry of `name` (an unknown one: the registry's error, listing the known ones)."""
    return MODES[name]


def step_reward_modes() -> list[str]:
    """The modes whose GRPO advantages come from step rewards (which `reward_model.oracle` can replace)."""
    return [name for name, m in MODES.items() if m.step_rewards]
