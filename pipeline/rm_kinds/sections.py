"""The built-in RM kinds' own config sections (`reward_model.orm.*`, `reward_model.implicit.*`) and the checks of
the whole config that only they need: torch-free, so the config validates without importing a kind's code.

A kind's `RMKindEntry` names its section (`config`) and its check (`check`: the whole `PipelineConfig` -> None, raising ValueError that names the field and says the fix), run
while the kind is in `reward_model.kinds`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field

from pipeline.launchers import LAUNCHERS
from pipeline.modes import supervision_mode
from pipeline.registry import Registry, name_in
from pipeline.sections import Section


class KindSection(Section):
    """Base of an RM kind's config section, `reward_model.<kind>`: strict, every field documented once."""


@dataclass(frozen=True, kw_only=True)
class OrmLoss:
    """How the ORM trains (`ORM_LOSSES.register(NAME, description=..., pairwise=...)`), the choices of
    `reward_model.orm.loss`.

    Attributes:
        description: the loss, for the docs.
        pairwise: trained by TRL's RewardTrainer on (correct, incorrect) pairs of one prompt's completions, which
            needs `collect.samples_per_prompt` >= 2; else by BCE on each completion's verifier outcome.
    """

    description: str
    pairwise: bool = False


ORM_LOSSES: Registry[OrmLoss] = Registry("ORM loss", OrmLoss, {
    "bce": OrmLoss(description="BCE on the verifier's 0/1 outcomes"),
    "pairwise": OrmLoss(description="Bradley-Terry (TRL's RewardTrainer) on correct/incorrect pairs of one prompt",
                        pairwise=True),
})


class OrmSection(KindSection):
    loss: name_in(ORM_LOSSES) = Field("bce", description=(
        "ORM loss (pipeline.rm_kinds.sections ORM_LOSSES): BCE on outcomes (bce), or pairwise (Bradley-Terry, TRL's "
        "RewardTrainer) on correct/incorrect pairs of one prompt."))


def check_orm(cfg) -> None:
    loss = cfg.reward_model.orm.loss
    if ORM_LOSSES[loss].pairwise and cfg.collect.samples_per_prompt < 2:
        raise ValueError(f"reward_model.orm.loss: {loss} needs a right and a wrong sample of one prompt, and "
                         f"collect.samples_per_prompt is {cfg.collect.samples_per_prompt}: set it to 2 or more, "
                         "or loss: bce")


class ImplicitSection(KindSection):
    beta: float = Field(0.05, gt=0, description=(
        "beta in r = beta * log(pi/pi_ref) (PRIME: 0.05); the scale of its rewards before the sigmoid. Recorded in "
        "its checkpoint, which is scored with the beta it was trained with."))
    online_lr: float | None = Field(None, gt=0, description=(
        "As the step scorer of process or hybrid mode: PRIME's online update, one AdamW step at this learning rate "
        "(PRIME: 1e-6) on every GRPO training batch with its verifier outcomes, before the batch's steps are scored; "
        "the PRM it leaves is saved with the phase and warm-starts the round's RM phase, one process only. None: no "
        "online update."))


def check_implicit(cfg) -> None:
    rm, online_lr = cfg.reward_model, cfg.reward_model.implicit.online_lr
    if online_lr is not None:
        if not (supervision_mode(cfg.supervision.mode).step_rewards and rm.oracle is None
                and cfg.supervision.process_reward_model == "implicit"):
            raise ValueError("reward_model.implicit.online_lr updates the implicit PRM that gives GRPO its step "
                             "rewards: it needs a mode with step rewards and supervision.process_reward_model: "
                             "implicit (no oracle); drop it otherwise")
        if rm.exploit is not None:  # its wrapper scores only: GRPO would go on with a PRM never updated
            raise ValueError("reward_model.implicit.online_lr: the exploitable RM (reward_model.exploit) wraps the "
                             "implicit PRM's scores and takes no online update: drop one of them")
        if not LAUNCHERS[cfg.launcher.kind].in_process:
            raise ValueError("reward_model.implicit.online_lr: the online update runs in one process (each process "
                             "would update its own copy); use launcher.kind: local, or drop it")
    # A causal LM starts from the backbone as it is, head included: one that is not a language model (a reward
    # model's checkpoint) would fail only when the RM phase loads it.
    archs = _local_architectures(rm.model) if rm.model else []
    if archs and not any(a.endswith("ForCausalLM") for a in archs):
        raise ValueError(f"reward_model.model: {rm.model!r} holds a {archs[0]}, not a causal language model, which "
                         "implicit needs (its reward is a log-likelihood ratio); give a policy checkpoint, or drop "
                         "reward_model.model")


def _local_architectures(spec: str) -> list[str]:
    """The architectures a local checkpoint directory's config.json names ([] for anything else: a .gguf file, a
    package, a hub id, a missing path, which the preflight checks)."""
    try:
        return list(json.loads((Path(spec).expanduser() / "config.json").read_text()).get("architectures") or [])
    except (OSError, ValueError, AttributeError):
        return []
