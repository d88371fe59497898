"""Online RFT (`supervision.mode: rft`) and a frozen round-0 RM (`reward_model.retrain: false`): the two
options behind the comparisons of experiments/runner.py (DeepSeekMath §5.2.1 and Fig. 6)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from datasets import Dataset
from transformers import TrainerCallback

from models import char_tokenizer
from pipeline.advantages import outcome_advantages, rft_advantages
from pipeline.config import ConfigError
from pipeline.loading import config_from_dict
from pipeline.passthrough import grpo_config
from pipeline.grpo_trainer import ProcessGRPOTrainer
from pipeline.policy import build_reward_funcs
from pipeline.problems import problem_set_from_config
from tests.helpers import mini_config


def test_rft_worked_example_has_no_baseline():
    # I(o): correct -> 1, wrong -> 0, whatever the rest of the group did.
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])
    assert rft_advantages(rewards).tolist() == [1.0, 0.0, 1.0, 1.0]
    # GRPO on the same group (mean 0.75, unbiased std 0.5): wrong gets a negative advantage.
    grpo = outcome_advantages(rewards, group_size=4)
    assert grpo[1].item() == pytest.approx(-0.75 / (0.5 + 1e-4), abs=1e-6)


def test_rft_all_correct_group_still_reinforced():
    # GRPO gives an all-correct group zero advantages; Online RFT reinforces each correct sample.
    rewards = torch.ones(4)
    assert outcome_advantages(rewards, group_size=4).abs().max().item() == 0.0
    assert rft_advantages(rewards).tolist() == [1.0] * 4


@pytest.mark.parametrize("rewards, match", [
    (torch.tensor([1.0, 0.5]), "row 1 is 0.5"),
    (torch.tensor([float("nan"), 1.0]), "row 0 is nan"),
    (torch.ones(2, 2), "shape"),
])
def test_rft_bad_rewards(rewards, match):
    with pytest.raises(ValueError, match=match):
        rft_advantages(rewards)


def test_rft_config_and_reward_functions(tmp_path):
    cfg = config_from_dict(mini_config(tmp_path, supervision={"mode": "rft"}), check_trl=False)
    funcs, weights = build_reward_funcs(cfg, problem_set_from_config(cfg), scorers={})
    assert [f.__name__ for f in funcs] == ["verifier"] and weights == [1.0]
    # An ORM weight, old spelling or new, is refused: rft's reward is the verifier alone.
    for supervision in ({"mode": "rft", "orm_weight": 1.0}, {"mode": "rft", "rewards": {"verifier": 1.0, "orm": 1.0}}):
        with pytest.raises(ConfigError, match="supervision: .*rft mode .*drop orm from supervision.rewards"):
            config_from_dict(mini_config(tmp_path, supervision=supervision), check_trl=False)


def test_rft_trainer_uses_the_verifier_reward_as_advantage(tmp_path, tiny_policy_dir, seen_advantages):
    """One GRPO step of a tiny policy in rft mode: the loss sees each completion's 0/1 reward, no baseline."""
    tok = char_tokenizer()
    cfg = config_from_dict(mini_config(tmp_path, grpo={"max_steps": 1, "per_device_train_batch_size": 4,
                                                        "num_generations": 4, "max_completion_length": 6}),
                           check_trl=False)

    def alternating(completions, **kwargs):  # 1, 0, 1, 0: GRPO would give +-0.87, RFT gives 1 and 0
        return [float(i % 2 == 0) for i in range(len(completions))]

    alternating.__name__ = "verifier"
    seen = seen_advantages
    trainer = ProcessGRPOTrainer(
        model=str(tiny_policy_dir), reward_funcs=[alternating], processing_class=tok,
        args=grpo_config(cfg, str(tmp_path / "scratch"), reward_weights=[1.0]),
        train_dataset=Dataset.from_list([{"prompt": "7 +5\n"}] * 4), supervision="rft",
    )
    trainer.train()
    # TRL shuffles the generation batch before the loss: compare as multisets. No baseline: exactly 1s and 0s.
    assert seen and all(sorted(a.tolist()) == [0.0, 0.0, 1.0, 1.0] for a in seen)


def _arithmetic_rows(round_: int, prompts: int) -> list[dict]:
    """A shard's rows: each prompt with a right and a slipped (wrong) solution, labelled by the gold chain."""
    rows = []
    for k in range(prompts):
        a = 3 + k
        for j, (answer, ok) in enumerate([(2 * a + 1, 1), (a + 1, 0)]):
            completion = f"{a}+1={a + 1}\n{a + 1}*2={2 * a + 2}\n{2 * a + 2}-1={2 * a + 1}\nAnswer: {answer}"
            labels = [1, 1, 1, ok]
            rows.append({"round": round_, "policy": "p", "prompt_id": f"r{round_}-{k}", "prompt": f"{a} +1 *2 -1\n",
                         "sample_index": j, "completion": completion, "answer": str(answer),
                         "steps": completion.split("\n"), "outcome": ok, "he_labels": labels,
                         "se_labels": [float(y) for y in labels], "gold_labels": labels, "rollouts": 2,
                         "num_tokens": len(completion)})
    return rows


@pytest.mark.slow  # RM trainings, both ways
def test_frozen_rm_reuses_round_0_checkpoints_and_their_calibration(tmp_path, tiny_policy_dir, monkeypatch):
    """retrain: false -> round 1 trains nothing and returns round 0's paths, whose calibration (round 0's
    held-out slice, written when they were trained) stays theirs; retrain: true trains and calibrates anew."""
    import pipeline.reward_model as rm_mod
    from pipeline.eval_phase import fresh_calibration
    from pipeline.replay import write_shard
    from pipeline.rundir import RunDir

    trained, real_train = [], rm_mod.train_reward_model

    def spy(cfg, kind, rows, init, out_dir, *args, **kwargs):  # the real training, recorded
        trained.append((kind, Path(out_dir).parent.parent.name))
        return real_train(cfg, kind, rows, init, out_dir, *args, **kwargs)

    monkeypatch.setattr(rm_mod, "train_reward_model", spy)
    shards = [_arithmetic_rows(0, 3), _arithmetic_rows(1, 3)]
    for r, rows in enumerate(shards):
        write_shard(rows, RunDir(tmp_path).shard(r))
    one_step = {"max_steps": 1, "per_device_train_batch_size": 4, "learning_rate": 1e-3}
    frozen = config_from_dict(mini_config(tmp_path, reward_model={"retrain": False, "train_args": one_step}),
                              check_trl=False)

    # Round 0 of a frozen run still trains (there is nothing to freeze yet) and calibrates each RM on its
    # held-out slice: round(0.34 x 3) = 1 prompt, a right and a wrong solution (accuracy 0.5).
    r0 = rm_mod.run_reward_model_phase(frozen, tmp_path, 0, tiny_policy_dir, None)
    assert trained == [("prm", "round-000"), ("orm", "round-000")]
    previous = {k: str(v) for k, v in r0.paths.items()}
    cal0 = {k: rm_mod.read_calibration(p) for k, p in previous.items()}
    for kind, auc_key in (("prm", "prm/solution_auc"), ("orm", "orm/auc")):
        mean = r0.metrics[f"{kind}/mean_score"]
        assert cal0[kind] == {"kind": kind, "round": 0, "rows": 2, "auc": r0.metrics[auc_key], "mean_score": mean,
                              "accuracy": 0.5, "gap": mean - 0.5}

    res = rm_mod.run_reward_model_phase(frozen, tmp_path, 1, tiny_policy_dir, previous)
    assert trained == [("prm", "round-000"), ("orm", "round-000")] and res.paths == {k: Path(v) for k, v in previous.items()}
    assert res.metrics["rm/train_rows"] == 0.0
    # Evaluated on round 1's held-out slice, but the checkpoint keeps round 0's calibration, which the monitor
    # finds for round 1's fresh samples; on round 0's own samples (in-sample) it compares nothing.
    assert {k: rm_mod.read_calibration(p) for k, p in previous.items()} == cal0
    assert fresh_calibration(previous["prm"], shards[1]) == cal0["prm"]
    assert fresh_calibration(previous["prm"], shards[0]) is None
    # Frozen without round 0's checkpoints: one clear error, nothing trained afresh behind the user's back.
    with pytest.raises(ValueError, match="retrain is false: round 1 .* none was given for orm"):
        rm_mod.run_reward_model_phase(frozen, tmp_path, 1, tiny_policy_dir, {"prm": previous["prm"]})
    assert len(trained) == 2

    retrained = config_from_dict(mini_config(tmp_path, reward_model={"train_args": one_step}), check_trl=False)
    r1 = rm_mod.run_reward_model_phase(retrained, tmp_path, 1, tiny_policy_dir, previous)
    assert trained[2:] == [("prm", "round-001"), ("orm", "round-001")]
    assert rm_mod.read_calibration(r1.paths["prm"])["round"] == 1


class LogSpy(TrainerCallback):
    """Keeps every log dict of a training (TRL's per-step metrics), as MLflow's callback receives them."""

    def __init__(self):
        self.logs = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs or {}))


def test_hybrid_policy_phase_reports_the_prms_variance_share(tmp_path, tiny_dirs):
    """The GRPO phase in hybrid mode (issue 16, point 1): the share the PRM term carried reaches the phase's
    metrics (manifest, MLflow), the mean of the logged steps' shares."""
    from pipeline.policy import run_policy_phase

    cfg = config_from_dict(mini_config(tmp_path, supervision={"mode": "hybrid", "process_weight": 2.0,
                                                              "process_credit": "min", "prompts_per_round": 4},
                                       grpo={"max_steps": 1, "per_device_train_batch_size": 4, "num_generations": 4,
                                             "max_completion_length": 8}), check_trl=False)
    spy = LogSpy()
    result = run_policy_phase(cfg, problem_set_from_config(cfg), tiny_dirs / "policy", tmp_path / "out", 1,
                              reward_models={"prm": tiny_dirs / "prm"}, callbacks=[spy])
    shares = [h["hybrid/process_variance_share"] for h in spy.logs if "hybrid/process_variance_share" in h]
    assert len(shares) == 1 and 0.0 <= shares[0] <= 1.0
    assert result.metrics["policy/process_variance_share"] == pytest.approx(shares[0], abs=1e-12)
    assert (tmp_path / "out" / "config.json").exists()



@pytest.mark.parametrize("mode", ["outcome", "rft"])
def test_every_mode_logs_the_mean_of_its_advantages_and_its_share_of_their_rms(tiny_policy_dir, tmp_path, mode):
    # Outcome advantages are TRL's and were not logged by the pipeline: whether a run's advantages are centred
    # (the process modes' are not) is a figure of every mode now.
    from datasets import Dataset

    from models import char_tokenizer
    from pipeline.grpo_trainer import ProcessGRPOTrainer

    cfg = config_from_dict(mini_config(tmp_path, grpo={"max_steps": 1, "per_device_train_batch_size": 4,
                                                        "num_generations": 4, "max_completion_length": 6},
                                       supervision={"mode": mode}), check_trl=False)

    def alternating(completions, **kwargs):  # 1, 0, 1, 0
        return [float(i % 2 == 0) for i in range(len(completions))]

    alternating.__name__ = "verifier"
    trainer = ProcessGRPOTrainer(
        model=str(tiny_policy_dir), reward_funcs=[alternating], processing_class=char_tokenizer(),
        args=grpo_config(cfg, str(tmp_path / "scratch"), reward_weights=[1.0]),
        train_dataset=Dataset.from_list([{"prompt": "7 +5\n"}] * 4), supervision=mode,
    )
    trainer.train()
    logged = next(h for h in trainer.state.log_history if f"{mode}/advantage_mean" in h)
    assert {f"{mode}/advantage_{k}" for k in ("mean", "std", "rms", "mean_share")} <= set(logged)
    share = logged[f"{mode}/advantage_mean_share"]
    # rft's advantages are 1s and 0s (mean > 0: share above 0); outcome's are centred per group.
    assert (share > 0.3) if mode == "rft" else (share < 0.3)
    # The phase's figures (the manifest's, experiments/credit_study.py's table) carry it too, averaged over the steps.
    from pipeline.policy import policy_metrics

    assert policy_metrics(trainer.state.log_history)["policy/advantage_mean_share"] == pytest.approx(share)
