"""experiments/smollm2_budgets.py: the real model's budgets and its learning check, as read from kept files."""
import json

from experiments import smollm2_budgets


def _kept(tmp_path, seconds: float, after: list[float]) -> None:
    run = {"config": "configs/smollm2-arith.yaml", "overrides": ["supervision.mode=outcome"], "commit": "abc1234",
           "machine": "AMD EPYC, 2 cores", "dtype": {"policy": "bfloat16", "reward_model": "bfloat16"},
           "seconds": seconds, "phase_seconds": {"0": {"policy": 98.0, "eval": 49.0}, "1": {"policy": 151.0}}}
    before = [0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0]
    values = {"greedy": before, "pass@1": before, "maj@4": before}
    noise = {"command": "python -m experiments.round_noise R --rounds 0 2", "problems": 8, "fresh": 6, "samples": 4,
             "temperature": 0.7, "policies": {"round 0": "R/round-000/policy", "round 2": "R/round-002/policy"},
             "per_problem": {"0": {"round 0": values, "round 2": {k: after for k in values}}}}
    (tmp_path / "arith.json").write_text(json.dumps(run))
    (tmp_path / "round-noise.json").write_text(json.dumps(noise))


def test_the_budget_and_the_learning_check_are_judged_from_the_kept_files(tmp_path):
    _kept(tmp_path, 689.0, [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0])  # 4 problems gained of 8, none lost
    text = "\n".join(smollm2_budgets.section(tmp_path))
    assert "| 11.5 min | <= 12 min: met |" in text and "round 1: policy 151 s" in text
    assert "greedy +0.500 ± 0.189 SE (+2.6 SE): met" in text
    _kept(tmp_path, 760.0, [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0])  # 12.7 min; one problem gained
    text = "\n".join(smollm2_budgets.section(tmp_path))
    assert "| 12.7 min | <= 12 min: not met |" in text and "greedy +0.125 ± 0.125 SE (+1.0 SE): not met" in text


def test_nothing_kept_says_so(tmp_path):
    assert smollm2_budgets.section(tmp_path) == ["Not measured yet."]
