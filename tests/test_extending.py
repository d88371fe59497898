"""Extension points proven from outside: this file alone registers a problem set, a reward function, a supervision
mode, a reward-model kind and a phase, with no edit under `pipeline/` or `models/`, and runs two real rounds with
all five (round 0: SFT on the new set, MC-labelled collection, the new phase reading its shard, the new RM trained;
round 1: GRPO in the new mode, its step rewards from the new RM kind, its outcome term from the new reward
function). docs/extending.md walks through it.
"""

from __future__ import annotations

import json
import re

import pytest
from pydantic import Field

from pipeline.modes import MODES, AdvantageInputs
from pipeline.phases import PHASES, PhaseResult
from pipeline.problems import PROBLEM_SETS, Problem, ProblemSet, ProblemSetConfig
from pipeline.rewards import REWARD_FUNCS
from pipeline.rm_kinds import RM_KINDS, RewardModelKind
from pipeline.rm_kinds.sections import KindSection
from tests.helpers import mini_config

# --- a problem set: doubling a number, step by step --------------------------------------------------------


class Doubling(ProblemSet):
    """'Double 37 twice.' -> '37+37=74\\n74+74=148\\nAnswer: 148'; a step is right when its sum is right."""

    has_gold_step_labels = True

    def __init__(self, num_train: int, num_test: int, seed: int):
        import random

        rng = random.Random(seed)
        starts = rng.sample(range(1, 200), num_train + num_test)

        def problem(i: int, start: int) -> Problem:
            times = 1 + i % 2
            lines, value = [], start
            for _ in range(times):
                lines.append(f"{value}+{value}={2 * value}")
                value *= 2
            return Problem(f"double-{i:04d}", f"Double {start}{' twice' if times == 2 else ''}.\n", str(value),
                           "\n".join([*lines, f"Answer: {value}"]))

        made = [problem(i, s) for i, s in enumerate(starts)]
        self.name, self.train, self.test = "doubling", made[:num_train], made[num_train:]

    def extract_answer(self, completion: str) -> str | None:
        from pipeline.problems.base import answer_line_value

        value = answer_line_value(completion)
        return value if value is not None and value.isdigit() else None

    def gold_step_labels(self, completion: str, problem: Problem) -> list[int] | None:
        from pipeline.steps import split_steps

        labels, right = [], True
        for step in split_steps(completion):
            m = re.fullmatch(r"\s*(\d+)\+(\d+)=(\d+)\s*", step)
            if m:
                right = right and m[1] == m[2] and int(m[3]) == 2 * int(m[1])
            else:
                right = right and self.is_correct(completion, problem)  # the Answer line
            labels.append(int(right))
        return labels


class DoublingConfig(ProblemSetConfig):
    num_train: int = Field(150, ge=1, description="Training problems.")
    num_test: int = Field(16, ge=1, description="Held-out problems.")


# --- a reward function: shorter is better ------------------------------------------------------------------


def brevity(problem_set, scorers):
    """1 for an empty completion, falling linearly to 0 at 64 characters."""

    def reward(completions, **kwargs):
        return [max(0.0, 1.0 - len(c) / 64) for c in completions]

    return reward


# --- a supervision mode: hybrid, with the process term centred over the batch's tokens -------------------


def centred_hybrid(x: AdvantageInputs):
    """TRL's outcome advantage plus the process advantage minus its mean over the tokens in the loss."""
    import torch

    from pipeline.advantages import loss_tokens

    mean = float(loss_tokens(x.process, x.lengths).mean())
    width = x.process.shape[1]
    in_loss = torch.arange(width).unsqueeze(0) < torch.tensor(x.lengths).unsqueeze(1)  # (B, T)
    centred = torch.where(in_loss, x.process - mean, torch.zeros_like(x.process))  # (B, T)
    return x.outcome.unsqueeze(1) + centred, {"process_mean_removed": mean}


# --- a reward-model kind: a PRM on soft (SE) labels, a solution scored by its last step --------------------


def _soft_prm_metrics(scorer, rows):
    from pipeline.rm_metrics import auc, mean

    scores = scorer([r["prompt"] for r in rows], [r["completion"] for r in rows])
    return {"soft_prm/solution_auc": auc(scores, [r["outcome"] for r in rows]), "soft_prm/mean_score": mean(scores)}


def _soft_prm_scorer(model, tokenizer, batch_size, rm):
    from pipeline.scorers import PrmScorer

    return PrmScorer(model, tokenizer, batch_size, aggregation="last")


def _soft_prm_examples(rows, tokenizer, rm):
    from pipeline.rm_kinds.prm import prm_examples

    return prm_examples(rows, tokenizer, rm.soft_prm.target)  # its own section, `reward_model.soft_prm`


class SoftPrmSection(KindSection):
    target: str = Field("soft", pattern="^(soft|hard)$", description="The MC labels it trains on.")


SOFT_PRM = RewardModelKind(examples=_soft_prm_examples, pairwise=lambda rm: False, scorer=_soft_prm_scorer,
                           metrics=_soft_prm_metrics, lora_task_type="TOKEN_CLS", solution_auc="soft_prm/solution_auc")


# --- a phase: the shard's figures, after collection ------------------------------------------------------


def shard_stats(cfg, runs, round_index: int, shard: str) -> PhaseResult:
    from pipeline.replay import read_shard

    rows = read_shard(shard)
    return PhaseResult({"shard_stats/rows": float(len(rows)),
                        "shard_stats/steps_per_sample": sum(len(r["steps"]) for r in rows) / len(rows)})


# --- the registrations: one keyword-only call each, the same shape for every extension point ----------------


@pytest.fixture
def registered(registries):
    """The five registrations, undone after the test (`registries`: the tables as they were, the config's too)."""
    PROBLEM_SETS.register("doubling", config=DoublingConfig, problem_set=Doubling,
                          build=lambda c, seed: Doubling(c.num_train, c.num_test, seed),
                          description="Doubling, once or twice (tests/test_extending.py).")
    REWARD_FUNCS.register("brevity", build=brevity)
    MODES.register("centred_hybrid", description="hybrid with the process term centred", advantages=centred_hybrid,
                   step_rewards=True, reads=("process_credit", "process_baseline", "process_reward_model"),
                   replaces={"reward_weights": "set by the pipeline from supervision.rewards"})
    RM_KINDS.register("soft_prm", head="AutoModelForTokenClassification", scores_steps=True, implementation=SOFT_PRM,
                      description="soft-label PRM", config=SoftPrmSection)
    PHASES.register("shard_stats", after="collect", run=shard_stats, figures=("shard_stats/rows",),
                    inputs=lambda done, r: {"shard": done(r, "collect").path})


def test_the_registrations_reach_the_config(registered):
    from docs.generate import config_reference
    from pipeline.config import ConfigError
    from pipeline.loading import config_from_dict

    cfg = config_from_dict({"problems": {"kind": "doubling", "doubling": {"num_train": 10}},
                            "supervision": {"mode": "centred_hybrid", "rewards": {"verifier": 1.0, "brevity": 0.5},
                                            "process_reward_model": "soft_prm"},
                            "reward_model": {"kinds": ["soft_prm"]}}, check_trl=False)
    assert cfg.problems.doubling.num_train == 10 and "problems.doubling.num_train" in config_reference()
    assert cfg.reward_model.soft_prm.target == "soft" and "reward_model.soft_prm.target" in config_reference()
    with pytest.raises(ConfigError, match="supervision.process_reward_model: 'orm' scores whole solutions"):
        config_from_dict({"supervision": {"mode": "centred_hybrid", "process_reward_model": "orm"},
                          "reward_model": {"kinds": ["orm"]}}, check_trl=False)
    with pytest.raises(ConfigError,
                       match="unknown supervision mode 'centred'; known: outcome, process, hybrid, rft, passk"):
        config_from_dict({"supervision": {"mode": "centred"}}, check_trl=False)


def test_unregistered_again_the_config_refuses_them():
    # The fixture above undoes its registrations: the built-in tables alone.
    from pipeline.config import ConfigError
    from pipeline.loading import config_from_dict

    with pytest.raises(ConfigError, match="problems.kind"):
        config_from_dict({"problems": {"kind": "doubling"}}, check_trl=False)
    with pytest.raises(ConfigError, match="unknown reward model kind 'soft_prm'"):
        config_from_dict({"reward_model": {"kinds": ["soft_prm"]}}, check_trl=False)


@pytest.mark.slow  # two real rounds: SFT, collection, RM training, GRPO, eval
def test_two_rounds_with_every_registered_component(registered, tmp_path, mlflow_tmp):
    from mlflow import MlflowClient

    from pipeline import rounds
    from pipeline.loading import config_from_dict
    from pipeline.rundir import Manifest, RunDir, read_json

    data = mini_config(
        tmp_path, run={"rounds": 1}, problems={"kind": "doubling", "doubling": {"num_train": 150, "num_test": 8}},
        supervision={"mode": "centred_hybrid", "rewards": {"verifier": 1.0, "brevity": 0.5},
                     "process_reward_model": "soft_prm", "prompts_per_round": 8},
        reward_model={"kinds": ["soft_prm", "orm"], "holdout_fraction": 0.34,
                      "train_args": {"learning_rate": 1e-3, "num_train_epochs": 1, "per_device_train_batch_size": 8}},
        tracking={"tracking_uri": mlflow_tmp, "experiment": "extending"})
    cfg = config_from_dict(data)
    rounds.run_rounds(cfg)

    run = RunDir(cfg.run_dir)
    manifest = Manifest.load(cfg.run_dir)
    # The RM kind: trained in its own layout, recorded as its kind, scored with in best-of-N and the gold step AUC.
    rm = manifest.output(0, "reward_model")["paths"]["soft_prm"]
    assert json.loads((run.reward_model(0, "soft_prm") / "igrpo.json").read_text())["kind"] == "soft_prm"
    assert rm == str(run.reward_model(0, "soft_prm"))
    figures = read_json(run.eval_json(1))["metrics"]
    assert {"bon/soft_prm@2", "bon/soft_prm_vote@4", "eval/soft_prm_step_auc_gold"} <= set(figures)
    assert "soft_prm/solution_auc" in manifest.output(1, "reward_model")["metrics"]
    # The problem set: its prompts were what the policy was evaluated on.
    shard = __import__("pipeline.replay", fromlist=["read_shard"]).read_shard(run.shard(1))
    assert all(row["prompt"].startswith("Double ") and row["prompt_id"].startswith("double-") for row in shard)
    # The mode and the reward function: round 1's GRPO logged the mode's own figure and TRL's brevity reward.
    metrics = MlflowClient().get_run(manifest.mlflow_run("round-001/policy")).data.metrics
    assert {"centred_hybrid/process_mean_removed", "centred_hybrid/advantage_mean", "rewards/brevity/mean",
            "process/step_reward_mean"} <= set(metrics)
    # The phase: run in both rounds after collection, recorded, logged into its own MLflow run.
    assert list(PHASES) == ["policy", "collect", "shard_stats", "reward_model", "eval"]
    for r in (0, 1):
        assert manifest.output(r, "shard_stats")["metrics"]["shard_stats/rows"] == len(shard)
    stats = MlflowClient().get_run(manifest.mlflow_run("round-001/shard_stats")).data.metrics
    assert stats["shard_stats/rows"] == len(shard)
