"""What GRPO's step rewards are, as two tables the config validates its choices against: `ORACLES`, what scores the
steps in a trained PRM's place (`reward_model.oracle`), and `PROCESS_REWARDS`, how the step scorer's output becomes
the process advantages (`supervision.process_reward`). `ProcessGRPOTrainer` (`pipeline/grpo_trainer.py`) and the
policy phase read the same entries; a plugin adds one with `ORACLES.register(NAME, ...)` or
`PROCESS_REWARDS.register(NAME, ...)`.

Torch-free: the entries' functions import their tensor math (`pipeline.advantages`) and scorers when first called.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipeline.registry import Registry


@dataclass(frozen=True)
class ProcessInputs:
    """What a process reward's `advantages` receives for one GRPO batch, gathered over processes.

    Attributes:
        scores: each completion's step values from the step scorer, one per step (a masked completion: none); None
            where the entry reads token rewards.
        ends: the token each step's reward lands on, in each completion's ids (the eos carries the last step's).
        token_rewards: the step scorer's token rewards on the policy's tokens, (B, T'), where the entry reads them.
        verifier: the verifier's 0/1 reward of each completion, (B,).
        lengths: each completion's tokens in the loss (0: masked out).
        group_size: completions per prompt (a group: consecutive rows).
        width: T', the advantages' width.
        scale_rewards: TRL's `scale_rewards` (how a group's rewards are scaled).
        supervision: the `supervision:` config section (credit, baseline, centring, PRIME's weights).
    """

    scores: list[list[float]] | None
    ends: list[list[int]] | None
    token_rewards: Any
    verifier: Any
    lengths: list[int]
    group_size: int
    width: int
    scale_rewards: Any
    supervision: Any


@dataclass(frozen=True, kw_only=True)
class ProcessReward:
    """One way step values become process advantages (`PROCESS_REWARDS.register(NAME, advantages=..., ...)`).

    Attributes:
        description: what a step's reward is, for the docs.
        advantages: (inputs) -> (the (B, T') advantages, figures logged as `process/NAME`): a pure function of the
            batch's tensors and lists (`pipeline.advantages`).
        token_rewards: it reads the step scorer's token rewards (`scorer.token_rewards`: the implicit PRM's), not its
            step values; an oracle, which gives step values only, cannot drive it.
    """

    description: str
    advantages: Callable[[ProcessInputs], tuple[Any, dict[str, float]]]
    token_rewards: bool = False


def _value(x: ProcessInputs):
    from pipeline.advantages import centred_advantages, process_advantages

    s = x.supervision
    adv = process_advantages(x.scores, x.ends, x.width, x.group_size, x.scale_rewards, s.process_credit,
                             s.process_baseline)
    return centred_advantages(adv, x.lengths, x.group_size, s.process_centring), {}


def _progress(x: ProcessInputs):
    from pipeline.advantages import centred_advantages, progress_advantages, progress_anchors, uniform_group_means

    s, verifier = x.supervision, x.verifier.tolist()
    start, values = progress_anchors(x.scores, verifier, x.group_size)  # PAV's V_0 and V_K: the outcomes
    adv = progress_advantages(values, x.ends, x.width, start, s.process_credit)
    # Where the verifier says nothing the process term should net ~0: a bias shows here first.
    figures = {f"progress_mean_{k}": v for k, v in uniform_group_means(adv, x.lengths, verifier, x.group_size).items()}
    return centred_advantages(adv, x.lengths, x.group_size, s.process_centring), figures


def _prime(x: ProcessInputs):
    from pipeline.advantages import prime_advantages

    s = x.supervision
    return prime_advantages(x.token_rewards, x.verifier, x.lengths, x.group_size, s.prime_process_coef,
                            s.prime_outcome_coef), {}


PROCESS_REWARDS: Registry[ProcessReward] = Registry("process reward", ProcessReward, {
    "value": ProcessReward(
        description="the step scorer's value (Math-Shepherd's Q), normalised over the group (DeepSeekMath "
                    "§4.1.3)",
        advantages=_value),
    "progress": ProcessReward(
        description="the change of the value over the step (PAV, arXiv 2410.08146), from the group's other outputs' "
                    "mean outcome before the first step to the output's own outcome after the last",
        advantages=_progress),
    "prime": ProcessReward(
        description="PRIME's advantage (arXiv 2502.01456): the implicit PRM's token rewards and the verifier's outcome, "
                    "each with a leave-one-out baseline, as returns",
        advantages=_prime, token_rewards=True),
})


@dataclass(frozen=True, kw_only=True)
class Oracle:
    """What scores GRPO's steps in a trained PRM's place (`ORACLES.register(NAME, scorer=..., source=..., ...)`).

    Attributes:
        description: what a step's value is, for the docs.
        scorer: (problem set, the round's GRPO prompts, the policy's tokenizer, the `PipelineConfig`) -> the step
            scorer (`step_scores`, or `rolls_out` and `step_values`: `pipeline/grpo_trainer.py`'s `scored_steps`).
        source: (the `PipelineConfig`) -> the values' source as the logs name it (`oracle:gold`, `mc:4`).
        gold_labels: it reads the problem set's gold step labels (only a set that has them can use it).
        reads: the `reward_model.*` fields it reads besides `oracle`; one of them set under another oracle is an error.
    """

    description: str
    scorer: Callable[[Any, Any, Any, Any], Any]
    source: Callable[[Any], str]
    gold_labels: bool = False
    reads: tuple[str, ...] = ()


def _gold(problem_set, data, tokenizer, cfg):
    from pipeline.scorers import GoldStepScorer

    return GoldStepScorer.from_rows(problem_set, data)


def _mc(problem_set, data, tokenizer, cfg):
    from pipeline.online_mc import McStepScorer

    return McStepScorer.from_rows(problem_set, data, tokenizer, cfg.reward_model.mc_rollouts, cfg.collect.batch_size)


ORACLES: Registry[Oracle] = Registry("oracle", Oracle, {
    "gold": Oracle(description="the problem set's exact gold step labels (0/1): a perfect PRM's upper bound",
                   scorer=_gold, source=lambda cfg: "oracle:gold", gold_labels=True),
    "mc": Oracle(description="online Monte-Carlo values (VinePPO): the share of `mc_rollouts` completions of the "
                             "policy being trained, from each step's prefix, that the verifier accepts",
                 scorer=_mc, source=lambda cfg: f"mc:{cfg.reward_model.mc_rollouts}", reads=("mc_rollouts",)),
})
