"""Real short trainings on the embedded problems: SFT bootstrap, GRPO (outcome and process), PRM/ORM phase.

One small bootstrapped policy is shared by the module (about half a minute to train).
"""

from __future__ import annotations

import functools
import random

import pytest
import torch
from transformers import TrainerCallback

from models import load_policy, save_model
from pipeline.bootstrap import initial_policy, run_bootstrap
from pipeline.evaluate import evaluate_policy
from pipeline.generation import sample
from pipeline.loading import config_from_dict
from pipeline.policy import run_policy_phase
from pipeline.problems import problem_set_from_config
from pipeline.problems.arithmetic import answer_slip
from pipeline.replay import ReplayBuffer, write_shard
from pipeline.reward_model import evaluate_reward_model, read_calibration, run_reward_model_phase, train_reward_model
from pipeline.rm_kinds.loading import load_reward_model, reward_model_from_policy
from pipeline.rundir import RunDir
from tests.helpers import SIZES, mini_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("train")
    # The quickstart's problems, a policy of 3/4 its width and half its depth, 5 epochs of SFT (about 30 s): a
    # competent but imperfect policy.
    cfg = config_from_dict(mini_config(
        tmp,
        policy={"tiny": SIZES["trained"]},
        problems={"arithmetic": {"num_train": 3000, "num_test": 40, "min_steps": 2, "max_steps": 3}},
        bootstrap={"sft_args": {"learning_rate": 2e-3, "num_train_epochs": 5, "per_device_train_batch_size": 32,
                                "lr_scheduler_type": "cosine", "warmup_steps": 20}},
        grpo={"max_completion_length": 48}, collect={"max_new_tokens": 48}, eval={"max_new_tokens": 48},
    ))
    ps = problem_set_from_config(cfg)
    policy = run_bootstrap(cfg, tmp / "policy").policy_path
    return cfg, ps, policy, tmp


def greedy_accuracy(model, tok, ps, n_problems=40) -> float:
    sampler = functools.partial(sample, model, tok, max_new_tokens=48)  # only its greedy figure is read
    return evaluate_policy(sampler, ps, ps.test[:n_problems], n=1).metrics["greedy"]


def test_sft_bootstrap_raises_held_out_accuracy(setup):
    cfg, ps, policy, _ = setup
    untrained, tok = initial_policy(cfg)
    before = greedy_accuracy(untrained, tok, ps)
    after = greedy_accuracy(*load_policy(str(policy)), ps)
    # Random weights never write a right "Answer:" line; five epochs of SFT on 3000 chains do, often (0.53 measured).
    assert before == 0.0
    assert after >= 0.15, after


def test_process_grpo_trains_on_per_token_advantages(setup, seen_advantages):
    cfg, ps, policy, tmp = setup
    prm, tok = reward_model_from_policy(str(policy), "prm")
    save_model(prm, tok, tmp / "prm")
    seen = seen_advantages
    before = load_policy(str(policy))[0].state_dict()
    out = tmp / "policy-process"
    res = run_policy_phase(cfg, ps, policy, out, 1, reward_models={"prm": tmp / "prm"})
    assert seen and all(a.dim() == 2 for a in seen)  # (B, T): one advantage per token
    # Per-token, not per-sequence: within some completion the advantage changes from step to step.
    assert any((a[:, 1:] != a[:, :-1]).any() for a in seen)
    after = load_policy(str(out))[0].state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the policy really moved
    assert res.metrics["policy/steps"] == cfg.grpo["max_steps"]


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "bnpo", "dapo"])
def test_process_mode_with_each_loss_type(setup, loss_type):
    cfg, ps, policy, tmp = setup
    prm, tok = reward_model_from_policy(str(policy), "prm")
    save_model(prm, tok, tmp / f"prm-{loss_type}")
    cfg = config_from_dict({**cfg.model_dump(mode="json"), "grpo": {**cfg.grpo, "loss_type": loss_type, "max_steps": 1}})
    res = run_policy_phase(cfg, ps, policy, tmp / f"p-{loss_type}", 1, reward_models={"prm": tmp / f"prm-{loss_type}"})
    assert res.metrics["policy/loss_end"] == res.metrics["policy/loss_end"]  # finite, not NaN


def test_outcome_grpo_raises_training_reward(setup):
    """Verifier-only GRPO from the bootstrapped policy: the training reward rises (fixed seed).

    16 prompts seen again and again: the clearest signal a short run can give (on fresh prompts every
    step the gain per step is far below the step-to-step spread of prompt difficulty).
    """
    cfg, ps, policy, tmp = setup
    data = cfg.model_dump(mode="json")
    data["supervision"] = {**data["supervision"], "mode": "outcome", "prompts_per_round": 16}
    data["grpo"] = {**data["grpo"], "learning_rate": 1e-4, "max_steps": 30, "per_device_train_batch_size": 64,
                    "num_generations": 8, "num_train_epochs": 1000}
    res = run_policy_phase(config_from_dict(data), ps, policy, tmp / "p-outcome", 1)
    # Mean reward of the last quarter of steps against the first quarter.
    assert res.metrics["policy/reward_end"] >= res.metrics["policy/reward_start"] + 0.05, res.metrics


def slipped_rows(ps, problems) -> list[dict]:
    """Gold solutions (correct) and copies whose Answer line states the first step's result (incorrect)."""
    rows = []
    for p in problems:
        bad = answer_slip(p.solution)
        if bad == p.solution:
            continue  # the first result is the answer: no wrong copy
        for j, t in enumerate([p.solution, bad]):
            rows.append({"round": 0, "prompt_id": p.id, "prompt": p.prompt, "sample_index": j, "completion": t,
                         "outcome": int(ps.is_correct(t, p))})
    return rows


def corrupted_rows(ps, problems, seed: int) -> list[dict]:
    """Gold solutions and copies with one step's result nudged, labelled with the gold step labels."""
    rng = random.Random(seed)
    rows = []
    for p in problems:
        lines = p.solution.split("\n")
        texts = [p.solution]
        k = rng.randrange(len(lines) - 1)
        a, c = lines[k].split("=")
        bad = lines[:k] + [f"{a}={int(c) + rng.choice([-2, -1, 1, 2])}"] + lines[k + 1:]
        texts.append("\n".join(bad))
        for j, t in enumerate(texts):
            gold = ps.gold_step_labels(t, p)
            rows.append({"round": 0, "policy": "gold", "prompt_id": p.id, "prompt": p.prompt, "sample_index": j,
                         "completion": t, "answer": ps.extract_answer(t), "steps": t.split("\n"),
                         "outcome": int(ps.is_correct(t, p)), "he_labels": gold, "se_labels": [float(g) for g in gold],
                         "gold_labels": gold, "rollouts": 0, "num_tokens": len(t)})
    return rows


def test_prm_trained_on_gold_labels_separates_steps(setup):
    cfg, ps, policy, tmp = setup
    data = cfg.model_dump(mode="json")
    data["reward_model"]["train_args"] = {"learning_rate": 2e-3, "num_train_epochs": 3, "per_device_train_batch_size": 16,
                                         "lr_scheduler_type": "cosine"}
    cfg = config_from_dict(data)
    train, held = corrupted_rows(ps, ps.train[:1000], 0), corrupted_rows(ps, ps.test[:40], 1)
    path = train_reward_model(cfg, "prm", train, policy, tmp / "prm-gold", warm=False)
    metrics = evaluate_reward_model(path, "prm", held)
    # Chance is 0.5. The PRM must tell a wrong result from a right one at the step where it happens,
    # which takes arithmetic the tiny backbone only half knows: 0.74 measured at this budget.
    assert metrics["prm/step_auc_gold"] >= 0.65, metrics


def test_pairwise_orm_with_trl_reward_trainer_ranks_correct_above_wrong(setup):
    cfg, ps, policy, tmp = setup
    data = cfg.model_dump(mode="json")
    data["reward_model"] = {**data["reward_model"], "orm": {"loss": "pairwise"}, "train_args": {
        "learning_rate": 1e-3, "num_train_epochs": 2, "per_device_train_batch_size": 16, "lr_scheduler_type": "cosine"}}
    cfg = config_from_dict(data)
    train, held = slipped_rows(ps, ps.train[:300]), slipped_rows(ps, ps.test[:60])
    path = train_reward_model(cfg, "orm", train, policy, tmp / "orm-pairwise", warm=False)
    model, _, _ = load_reward_model(path, expect="orm")  # saved as an ordinary ORM checkpoint
    metrics = evaluate_reward_model(path, "orm", held)
    # Chance is 0.5: each held-out prompt has its gold solution and a copy whose Answer line is wrong (0.82 measured).
    assert metrics["orm/auc"] >= 0.6, metrics


class FirstWeights(TrainerCallback):
    def __init__(self):
        self.weights = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.weights = {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_reward_model_phase_warm_start_replay_and_holdout(setup):
    cfg, ps, policy, tmp = setup
    run_dir = tmp / "rm-run"
    rows0, rows1 = corrupted_rows(ps, ps.train[:40], 0), corrupted_rows(ps, ps.train[40:70], 1)
    for r in rows1:
        r["round"] = 1
    write_shard(rows0, RunDir(run_dir).shard(0))
    write_shard(rows1, RunDir(run_dir).shard(1))
    r0 = run_reward_model_phase(cfg, run_dir, 0, policy)
    spy = FirstWeights()
    r1 = run_reward_model_phase(cfg, run_dir, 1, policy, previous={k: str(v) for k, v in r0.paths.items()},
                                callbacks=[spy])
    # Replay: exactly round(0.1 x 80 historical rows) = 8 rows; the new shard minus the held-out prompts.
    assert r1.metrics["rm/replay_rows"] == 8
    held_prompts = round(cfg.reward_model.holdout_fraction * 30)
    assert r1.metrics["rm/train_rows"] == 8 + 2 * (30 - held_prompts)
    # Warm start: round 1's last-trained RM (the ORM) began from round 0's ORM weights exactly.
    prev, _, _ = load_reward_model(r0.paths["orm"], expect="orm")
    assert all(torch.equal(prev.state_dict()[k], spy.weights[k]) for k in prev.state_dict())
    assert {"orm/auc", "prm/step_auc_gold", "prm/step_auc_mc"} <= set(r1.metrics)
    # Each RM keeps its calibration on the round's held-out slice in its checkpoint, for the hacking monitor.
    for kind in ("prm", "orm"):
        cal = read_calibration(r1.paths[kind])
        assert (cal["round"], cal["rows"]) == (1, 2 * held_prompts)
        assert cal["gap"] == pytest.approx(r1.metrics[f"{kind}/mean_score"] - cal["accuracy"])
    assert ReplayBuffer(run_dir).rounds() == [0, 1]


def test_reward_models_start_afresh_from_the_configured_backbone_not_the_policy(setup):
    """`reward_model.model`: an RM trained afresh (round 0, or any round without warm_start) starts from that
    backbone, a model of another size than the policy here; a warm start keeps the previous RM's."""
    from models import char_tokenizer, tiny_policy

    cfg, ps, policy, tmp = setup
    tok = char_tokenizer()
    wide = tmp / "rm-backbone"
    save_model(tiny_policy(tok, hidden_size=64, num_layers=3, num_heads=2, intermediate_size=128,
                           max_position_embeddings=96, seed=1), tok, wide)
    start = load_policy(str(wide))[0].state_dict()
    run_dir = tmp / "rm-backbone-run"
    write_shard(corrupted_rows(ps, ps.train[:40], 0), RunDir(run_dir).shard(0))
    write_shard([{**r, "round": 1} for r in corrupted_rows(ps, ps.train[40:70], 1)], RunDir(run_dir).shard(1))
    with_backbone = config_from_dict(cfg.model_dump(mode="json"),
                                     [f"reward_model.model={wide}", "reward_model.kinds=[prm]"], check_trl=False)

    def began_from_backbone(spy) -> bool:  # every backbone weight at train begin is the saved backbone's
        inner = {k.split(".", 1)[1]: v for k, v in spy.weights.items() if k.startswith("model.")}
        return inner.keys() == {k.split(".", 1)[1] for k in start if k.startswith("model.")} and all(
            torch.equal(v, start[f"model.{k}"]) for k, v in inner.items())

    spy = FirstWeights()
    r0 = run_reward_model_phase(with_backbone, run_dir, 0, policy, callbacks=[spy])
    assert began_from_backbone(spy)  # not from the policy
    model, _, _ = load_reward_model(r0.paths["prm"], expect="prm")
    assert (model.config.hidden_size, model.config.num_hidden_layers) == (64, 3)  # the policy is 96 x 2
    assert 0 <= r0.metrics["prm/step_auc_gold"] <= 1  # scored on the policy's text with the backbone's tokenizer
    previous = {k: str(v) for k, v in r0.paths.items()}
    spy = FirstWeights()
    run_reward_model_phase(with_backbone, run_dir, 1, policy, previous=previous, callbacks=[spy])
    assert not began_from_backbone(spy)  # warm: from round 0's PRM
    cold = config_from_dict(with_backbone.model_dump(mode="json"), ["reward_model.warm_start=false"], check_trl=False)
    spy = FirstWeights()
    run_reward_model_phase(cold, run_dir, 1, policy, previous=previous, callbacks=[spy])
    assert began_from_backbone(spy)
