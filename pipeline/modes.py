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
        group_size: G, the completions of a prompt (consecutive rows).
        scale: TRL's `scale_rewards` ("group", "batch", "none").
        step: (the trainer's global step, its max_steps): where the phase is, for a schedule over steps.
        round: (RL rounds done before this one, run.rounds): where the run is, for a schedule over rounds.
        reward_names: the reward functions' names, in the order of `rewards`' columns.
    """

    outcome: Any
    process: Any
    rewards: Any
    lengths: list[int]
    supervision: Any
    group_size: int = 0
    scale: str = "group"
    step: tuple[int, int] = (0, 1)
    round: tuple[int, int] = (0, 1)
    reward_names: tuple[str, ...] = ()


# (inputs) -> (advantages (B,) or (B, T), metrics to log under the mode's name)
Advantages = Callable[[AdvantageInputs], tuple[Any, dict[str, float]]]


@dataclass(frozen=True)
class SupervisionMode:
    """One supervision mode, declared.

    Attributes:
        description: what the advantage is, for the docs' table of modes (`docs/generate.py`).
        use: when to use it, for the table.
        advantages: how the batch's advantages are made; None keeps TRL's outcome advantages as they are.
        step_rewards: GRPO scores every step of every completion (`supervision.process_reward_model`, or the oracle).
        trl_advantage: TRL's outcome advantage of the weighted rewards is an input (`AdvantageInputs.outcome`).
        weighted_rewards: the reward functions are `supervision.rewards` (which need a weight above 0); False:
            the verifier alone, weight 1 (logged as the training accuracy, or the mode's reward).
        replaces: `grpo:` fields the mode replaces -> why; giving one is an error saying so.
        reads: `supervision.*` fields it reads besides `mode`; a non-default value of one it does not read
            is an error (a knob that does nothing).
        check: more validation of the `supervision:` section, raising ValueError; None: none.
        check_group: validation of the `supervision:` section against G (`grpo.num_generations`, TRL's default
            where not given), run where TRL's config is built at load (`pipeline.passthrough`), raising ValueError
            whose message starts with the field's dotted path; None: none.
    """

    description: str
    advantages: Advantages | None = None
    use: str = ""
    step_rewards: bool = False
    trl_advantage: bool = True
    weighted_rewards: bool = True
    replaces: Mapping[str, str] = field(default_factory=dict)
    reads: tuple[str, ...] = ()
    check: Callable[[Any], None] | None = None
    check_group: Callable[[Any, int], None] | None = None


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


def _passk(x: AdvantageInputs):
    from pipeline.passk import passk_advantages, passk_estimate, scheduled_k

    p = x.supervision.passk
    k = scheduled_k(p.k_values(), *(x.step if p.over == "steps" else x.round))
    verifier = x.rewards[:, 0]  # (B,) the verifier is reward column 0, the only one in passk mode
    bad = ((verifier != 0) & (verifier != 1)).nonzero().flatten()  # NaN (a reward of None) included
    if bad.numel():
        name = x.reward_names[0] if x.reward_names else "verifier"
        raise ValueError(f"passk mode needs a binary reward: reward function {name!r} returned "
                         f"{verifier[int(bad[0])].item()} for completion {int(bad[0])} of the batch; pass@k counts "
                         "right (1) and wrong (0) samples: make it return 0 or 1, or use mode: outcome")
    adv = passk_advantages(verifier, x.group_size, k, x.scale)  # (B,)
    return adv, {"reward": passk_estimate(verifier, x.group_size, k).mean().item(), "k": float(k)}


def _binary_reward(supervision) -> None:
    others = [name for name, w in supervision.rewards.items() if name != "verifier" and w > 0]
    if others:
        raise ValueError(f"passk mode reads the verifier's 0/1 reward alone (pass@k counts right samples): drop "
                         f"{', '.join(others)} from supervision.rewards, whose reward is not 0 or 1 (or use mode: "
                         "outcome to mix them in)")


def _passk_fits_group(supervision, group_size: int) -> None:
    p = supervision.passk
    field = "supervision.passk.schedule" if p.schedule is not None else "supervision.passk.k"
    for k in p.k_values():
        if k > group_size:
            raise ValueError(f"{field}: k = {k} is more than grpo.num_generations ({group_size}): pass@k is "
                             f"estimated from the k-subsets of a group's samples; use k < {group_size}, or raise "
                             "num_generations")
        if k == group_size:
            raise ValueError(f"{field}: k = {k} equals grpo.num_generations: every sample of a group then gets the "
                             "same pass@k reward (the group passes or not as a whole) and GRPO's advantages are all 0; "
                             f"use k < {group_size}, or raise num_generations")


_STEP_FIELDS = ("process_credit", "process_baseline", "process_centring", "process_reward", "process_reward_model")

_RESULTS_1 = "[results §1](docs/results.md#1-process-against-outcome-supervision-and-online-rft)"

MODES: Registry[SupervisionMode] = Registry("supervision mode", SupervisionMode, {
    "outcome": SupervisionMode(
        "one scalar per completion, the weighted sum of `supervision.rewards` (`verifier`, `orm`), group-normalised, "
        "on every token: TRL's own",
        use=f"a verifier (or an ORM) is what you have or trust; on the embedded set it ended above process "
            f"supervision ({_RESULTS_1})",
        replaces={"reward_weights": _REWARD_WEIGHTS}),
    "process": SupervisionMode(
        "the PRM's step rewards normalised over the group's steps; a token gets their sum (`process_credit: sum`, "
        "DeepSeekMath) or minimum (`min`, PURE) over the steps at or after it; `process_reward: progress` credits "
        "a step with the change in value it makes (PAV), `prime` is PRIME's credit from the implicit PRM",
        _process, step_rewards=True, trl_advantage=False, weighted_rewards=False, reads=_STEP_FIELDS,
        use="studying process supervision; a PRM that ranks steps well (`reward_model.oracle: gold` gives its upper "
            "bound)",
        replaces={"reward_weights": _REWARD_WEIGHTS,
                  "multi_objective_aggregation": "not used in process or rft mode: it combines reward functions "
                  "into TRL's outcome advantages, which these modes replace; remove it"}),
    "hybrid": SupervisionMode(
        "outcome mode's advantage plus `process_weight` times process mode's",
        _hybrid, step_rewards=True, reads=("process_weight", *_STEP_FIELDS),
        use="a verifier plus a PRM's step credit on top (PURE's recipe)",
        replaces={"reward_weights": _REWARD_WEIGHTS}),
    "rft": SupervisionMode(
        "Online RFT (DeepSeekMath §5.2.1): the verifier's 0/1 reward itself, no baseline, never negative",
        _rft, trl_advantage=False, weighted_rewards=False, check=_verifier_only,
        use=f"the paper's baseline; on the embedded set it ended highest ({_RESULTS_1})",
        replaces={"reward_weights": _REWARD_WEIGHTS,
                  "scale_rewards": "not used in rft mode: the advantage is the verifier's 0/1 reward itself, with "
                  "no group baseline and no scaling (DeepSeekMath §5.2.1); remove it, or use mode outcome or process",
                  "multi_objective_aggregation": "not used in process or rft mode: it combines reward functions "
                  "into TRL's outcome advantages, which these modes replace; remove it"}),
    "passk": SupervisionMode(
        "PKPO's pass@k rewards, then outcome mode's baseline (k = 1: outcome mode)",
        _passk, trl_advantage=False, weighted_rewards=False, reads=("passk",), check=_binary_reward,
        check_group=_passk_fits_group,
        use="training for Pass@K, not Pass@1",
        replaces={"reward_weights": _REWARD_WEIGHTS,
                  "multi_objective_aggregation": "not used in passk mode: it combines reward functions into TRL's "
                  "outcome advantages, and passk reads the verifier alone; remove it"}),
})


def supervision_mode(name: str) -> SupervisionMode:
    """The table entry of `name` (an unknown one: the registry's error, listing the known ones)."""
    return MODES[name]


def step_reward_modes() -> list[str]:
    """The modes whose GRPO advantages come from step rewards (which `reward_model.oracle` can replace)."""
    return [name for name, m in MODES.items() if m.step_rewards]


def check_supervision(supervision: Any) -> None:
    """The `supervision:` section against its mode: a reward weighed above 0 where the mode weighs rewards, the
    mode's own `check`, progress and PRIME's credit where they apply, and no knob the mode never reads (values, not
    fields set, so a stored config with every default written out still loads). Raises ValueError saying the fix."""
    s, mode, fields = supervision, supervision_mode(supervision.mode), type(supervision).model_fields
    if mode.weighted_rewards and not any(w > 0 for w in s.rewards.values()):
        raise ValueError(f"{s.mode} mode needs a weight above 0 in supervision.rewards, e.g. {{verifier: 1.0}}")
    if mode.check:
        mode.check(s)
    if s.process_reward == "progress" and s.process_baseline != "group":
        raise ValueError(f"process_baseline {s.process_baseline!r} normalises step values, and progress "
                         "(process_reward: progress) is not normalised: drop process_baseline")
    _check_prime(s, fields)
    for name in ("process_weight", "process_credit", "process_baseline", "process_centring", "process_reward",
                 "process_reward_model", "passk"):
        modes = [m for m, spec in MODES.items() if name in spec.reads]
        value = getattr(s, name)
        if value != fields[name].get_default(call_default_factory=True) and s.mode not in modes:
            shown = value.model_dump(exclude_defaults=True) if hasattr(value, "model_dump") else value
            raise ValueError(f"{name} {shown!r} is only used in {' and '.join(modes)} mode, not in "
                             f"{s.mode} mode: remove it, or set mode: {modes[-1]}")


def _check_prime(s: Any, fields: Mapping) -> None:
    if s.process_reward != "prime":
        set_ = [n for n in ("prime_process_coef", "prime_outcome_coef") if getattr(s, n) != fields[n].default]
        if set_:
            raise ValueError(f"{', '.join(set_)} is only used with process_reward: prime: remove it")
        return
    if s.mode != "process":  # the step scorer's kind giving token rewards: `pipeline.rm_kinds.check_kinds`
        raise ValueError("process_reward: prime is PRIME's advantage from the step scorer's token rewards and the "
                         "verifier's outcome together: it needs mode: process (hybrid would add the outcome twice)")
    steps = [n for n in ("process_credit", "process_baseline", "process_centring")
             if getattr(s, n) != fields[n].default]
    if steps:
        raise ValueError(f"{', '.join(steps)} shapes step rewards, and process_reward: prime credits token "
                         "rewards as returns with its own baselines: remove it")
