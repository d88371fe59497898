"""The GRPO phase: a round of GRPO from a policy, by `ProcessGRPOTrainer` (`pipeline/grpo_trainer.py`), with the
reward functions, the step scorer (a PRM, or an oracle: `pipeline.step_rewards.ORACLES`) and the prompts it trains on.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from datasets import Dataset

from models import save_model
from models.factories import load_tokenizer, lora_config
from pipeline.config import PipelineConfig
from pipeline.grpo_trainer import ProcessGRPOTrainer
from pipeline.passthrough import grpo_config
from pipeline.problems import ProblemSet
from pipeline.prompts import PromptRenderer, renderer_from_config
from pipeline.resume import fingerprint, train_resumable
from pipeline.reward_model import load_scorer
from pipeline.rewards import SolutionScorer, active_rewards, build_reward_func, reward_models_needed
from pipeline.rm_kinds.loading import kind_name, save_reward_model
from pipeline.rundir import online_reward_model_dir, scratch_dir
from pipeline.step_rewards import ORACLES

@dataclass
class PolicyPhaseResult:
    policy_path: Path
    metrics: dict[str, float]
    # RM kind -> the checkpoint of the step scorer as the online update left it (PRIME's implicit PRM), if updated
    online_reward_models: dict[str, Path] = field(default_factory=dict)


def round_prompts(
    problem_set: ProblemSet, count: int, seed: int, round_index: int, *, renderer: PromptRenderer
) -> Dataset:
    """The training prompts offered to GRPO in a round: a seeded draw from the training problems.

    `prompt` is what TRL generates after and `prompt_text`, the same text, what the reward functions (ORM)
    and the PRM score the completions after: the rendered prompt, in chat format too (`pipeline/prompts.py`).
    """
    problems = list(problem_set.train)
    random.Random(seed * 1000 + round_index).shuffle(problems)
    texts = [renderer.render(p) for p in problems[:count]]
    return Dataset.from_list([{"prompt": text, "prompt_text": text, "answer": p.answer, "prompt_id": p.id,
                               "solution": p.solution} for p, text in zip(problems, texts)])


def build_reward_funcs(cfg: PipelineConfig, problem_set: ProblemSet, scorers: Mapping[str, SolutionScorer]):
    """Reward functions and weights for GRPOTrainer, from `supervision.rewards` through the registry
    (`pipeline.rewards.active_rewards`: in process mode the verifier is there for logging only; in rft mode
    it is the reward, weight 1). `scorers`: RM kind -> the loaded scorer a reward function needs."""
    weights = active_rewards(cfg.supervision.mode, cfg.supervision.rewards)
    return [build_reward_func(name, problem_set, scorers) for name in weights], list(weights.values())


def policy_peft_config(cfg: PipelineConfig):
    """The GRPO phase's adapter (`policy.lora`) as a PEFT LoraConfig; None trains every weight."""
    lo = cfg.policy.lora
    return lora_config(lo.r, lo.alpha, lo.dropout, lo.target_modules, "CAUSAL_LM") if lo else None


def run_policy_phase(
    cfg: PipelineConfig,
    problem_set: ProblemSet,
    policy_path: str | Path,
    out_dir: str | Path,
    round_index: int,
    reward_models: Mapping[str, str | Path] | None = None,
    report_to: str = "none",
    callbacks=None,
) -> PolicyPhaseResult:
    """One round of GRPO from `policy_path`, saved to `out_dir`.

    The reference model is the round's starting policy (π_ref ← π_θ): TRL loads it from the same path.
    `reward_models`: RM kind -> checkpoint, for those the mode and rewards need (`reward_models_needed`):
    the PRM in process mode, the ORM for an `orm` reward; others are ignored. With `reward_model.oracle`
    no PRM gives the step rewards (`step_scorer`).
    A step scorer updated online (`reward_model.implicit.online_lr`, PRIME) is in GRPO's checkpoints, and saved with
    the phase beside the policy (`online_reward_model_dir`, the result's `online_reward_models`).
    """
    weights = list(active_rewards(cfg.supervision.mode, cfg.supervision.rewards).values())  # build_reward_funcs'
    args = grpo_config(cfg, str(scratch_dir(out_dir)), reward_weights=weights, report_to=report_to,
                       seed=cfg.run.seed + round_index, run_name=f"grpo-round-{round_index}")
    # Reward models next: a wrong path or a wrong kind fails before any training.
    scorers, batch = {}, scoring_batch_size(cfg.collect.batch_size, args.per_device_train_batch_size)
    for kind, why in reward_models_needed(cfg).items():
        if (reward_models or {}).get(kind) is None:
            raise ValueError(f"{why} needs {kind_name(kind)}: give --reward-model PATH")
        scorers[kind] = load_scorer(kind, reward_models[kind], cfg.reward_model, batch_size=batch)
    funcs, _ = build_reward_funcs(cfg, problem_set, scorers)
    tokenizer = load_tokenizer(str(policy_path))
    data = round_prompts(problem_set, cfg.supervision.prompts_per_round, cfg.run.seed, round_index,
                         renderer=renderer_from_config(cfg, tokenizer))
    prm = step_scorer(cfg, problem_set, data, tokenizer, scorers)
    check_step_separator(prm, problem_set)

    peft_config = policy_peft_config(cfg)
    trainer = ProcessGRPOTrainer(
        model=str(policy_path), reward_funcs=funcs, args=args, train_dataset=data,
        processing_class=tokenizer, peft_config=peft_config, callbacks=callbacks,
        prm_scorer=prm, supervision=cfg.supervision, step_separator=problem_set.step_separator,
        round_position=(max(round_index - 1, 0), cfg.run.rounds),
    )
    for scorer in scorers.values():  # on this process's device (its own GPU under accelerate launch)
        scorer.model.to(trainer.accelerator.device)
    train_resumable(trainer, fingerprint(cfg, "policy", round_index, policy=str(policy_path), out=str(out_dir),
                                         reward_models={k: str(v) for k, v in (reward_models or {}).items()}))
    save_model(trainer.model, tokenizer, out_dir)
    online = {}
    if getattr(prm, "online_lr", None):  # PRIME's PRM, as its updates left it: the warm start of the round's RM phase
        kind = cfg.supervision.process_reward_model
        online[kind] = save_reward_model(prm.model, prm.tokenizer, online_reward_model_dir(out_dir, kind), kind,
                                         meta=prm.record)  # the reference and beta it was loaded with
    return PolicyPhaseResult(Path(out_dir), policy_metrics(trainer.state.log_history), online)


def scoring_batch_size(collect_batch: int, grpo_batch: int) -> int:
    """Sequences per forward of the GRPO phase's reward models (the PRM scoring a batch's steps, PRIME's implicit PRM,
    an ORM reward): a GRPO micro-batch's completions (`grpo_batch`: `per_device_train_batch_size`, the rows TRL's own
    forwards of the policy take, so one padded forward of them fits where TRL's does) in one padded forward, or
    collection's batch (`collect.batch_size`) where it is larger. With `steps_per_generation` 1 (the default: no
    gradient accumulation) that is the whole of a step's completions on the process.

    >>> scoring_batch_size(16, 64), scoring_batch_size(128, 64)
    (64, 128)
    """
    return max(collect_batch, grpo_batch)


def step_scorer(cfg: PipelineConfig, problem_set: ProblemSet, data: Dataset, tokenizer,
                scorers: Mapping[str, SolutionScorer]):
    """What scores GRPO's steps: with `reward_model.oracle` its entry's scorer (`ORACLES`: `gold`, the gold step labels
    of each prompt's problem; `mc`, online Monte-Carlo values of the policy being trained), else the loaded step
    scorer (`supervision.process_reward_model`; None in a mode without step rewards)."""
    if cfg.reward_model.oracle is not None:
        return ORACLES[cfg.reward_model.oracle].scorer(problem_set, data, tokenizer, cfg)
    return scorers.get(cfg.supervision.process_reward_model)


def value_source(cfg: PipelineConfig) -> str:
    """The prover whose step values a process reward reads, named for the logs (PAV: values are one prover's):
    `oracle:gold`, `mc:<K>` (online MC, the policy itself with K rollouts a prefix), `prm:<head layout>` (`prm:value`,
    `prm:label_tokens`...), or the RM kind (`implicit`).

    >>> from pipeline.config import PipelineConfig
    >>> value_source(PipelineConfig()), value_source(PipelineConfig(reward_model={"oracle": "gold"}))
    ('prm:value', 'oracle:gold')
    >>> value_source(PipelineConfig(reward_model={"oracle": "mc", "mc_rollouts": 8}))
    'mc:8'
    """
    from pipeline.rm_kinds import layout_kinds

    if cfg.reward_model.oracle is not None:
        return ORACLES[cfg.reward_model.oracle].source(cfg)
    kind = cfg.supervision.process_reward_model
    return f"{kind}:{cfg.reward_model.head}" if kind in layout_kinds() else kind


def check_step_separator(scorer, problem_set: ProblemSet) -> None:
    """A ValueError where a step scorer reads steps at another separator than the problem set's (a PRM trained on
    another set): its scores would land on other tokens than the steps GRPO credits."""
    theirs = getattr(scorer, "separator", None)
    if theirs is not None and theirs != problem_set.step_separator:
        raise ValueError(f"the PRM was trained on steps split by {theirs!r}, and {problem_set.name}'s steps are split "
                         f"by {problem_set.step_separator!r}: train a PRM on this problem set's steps")


def policy_metrics(log_history: list[dict]) -> dict[str, float]:
    """Training reward at the start and end of the phase (first and last logged values), and the loss; in
    hybrid mode the mean share of the advantages' variance the PRM term carried over the phase; in every mode the
    advantages' per-token mean and its share of their RMS, averaged over the phase.

    >>> policy_metrics([{"reward": 0.2, "hybrid/process_variance_share": 0.3, "step": 1},
    ...                 {"reward": 0.6, "hybrid/process_variance_share": 0.5, "hybrid/advantage_mean": -0.2,
    ...                  "hybrid/advantage_mean_share": 0.25, "step": 2}])  # doctest: +NORMALIZE_WHITESPACE
    {'policy/reward_start': 0.2, 'policy/reward_end': 0.6, 'policy/steps': 2.0, 'policy/process_variance_share': 0.4,
     'policy/advantage_mean': -0.2, 'policy/advantage_mean_share': 0.25}
    """
    logs = [h for h in log_history if "reward" in h]
    if not logs:
        return {}
    k = max(1, len(logs) // 4)  # average a quarter at each end: single logs are noisy
    mean = lambda xs, key: sum(x[key] for x in xs) / len(xs)  # noqa: E731
    out = {
        "policy/reward_start": mean(logs[:k], "reward"),
        "policy/reward_end": mean(logs[-k:], "reward"),
        "policy/steps": float(log_history[-1].get("step", len(logs))),
    }
    if "loss" in logs[-1]:
        out["policy/loss_end"] = mean(logs[-k:], "loss")
    # Each logged step's share; NaN where no token was in the loss (every completion masked): left out.
    shares = [h["hybrid/process_variance_share"] for h in logs
              if math.isfinite(h.get("hybrid/process_variance_share", math.nan))]
    if shares:
        out["policy/process_variance_share"] = sum(shares) / len(shares)
    # The advantages' per-token mean and its share of their RMS (`advantage_stats`), over the phase: how much of
    # the update pushed every sampled token one way (REFERENCE, "The mean of process advantages").
    for stat in ("mean", "mean_share"):
        xs = [v for h in logs for k, v in h.items() if k.endswith(f"/advantage_{stat}") and math.isfinite(v)]
        if xs:
            out[f"policy/advantage_{stat}"] = sum(xs) / len(xs)
    return out
