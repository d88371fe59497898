"""The verifier at the compute of a costlier arm (issue 57, point 3): its overrides are a pure function of two GRPO
runtimes (`credit_arms.compute_matched`), the runtimes are read from kept unit files (`kept_grpo_seconds`,
`verifier_matched`), and a unit keeps them from its run's MLflow runs (`runner.grpo_seconds`, `run_figures`)."""

from __future__ import annotations

import doctest

import pytest

from experiments import credit_arms
from experiments.credit_arms import ARMS, compute_matched, kept_grpo_seconds, unit_files, verifier_matched
from pipeline.rundir import Manifest, write_json_atomic


def test_compute_matched_worked_example():
    # The quickstart's 80 steps of 8 prompts; the verifier's GRPO 44.5 s a round, the arm's 165 s: 3.708x, so
    # 80 * 3.708 = 296.6 -> 297 steps, and 297 * 8 = 2376 prompts a round (each step fresh prompts).
    assert compute_matched(44.5, 165.0, 80, 8) == ["grpo.max_steps=297", "supervision.prompts_per_round=2376"]
    # An arm as fast as the verifier: the verifier's own budget; a cheaper one: fewer steps, never below 1.
    assert compute_matched(60.0, 60.0, 80, 8) == ["grpo.max_steps=80", "supervision.prompts_per_round=640"]
    assert compute_matched(100.0, 0.1, 80, 8) == ["grpo.max_steps=1", "supervision.prompts_per_round=8"]
    with pytest.raises(ValueError, match="GRPO runtimes must be positive"):
        compute_matched(0.0, 165.0, 80, 8)
    with pytest.raises(ValueError, match="steps and prompts_per_step must be >= 1"):
        compute_matched(44.5, 165.0, 80, 0)
    assert doctest.testmod(credit_arms).failed == 0


def _unit(figures, name: str, grpo: dict[str, float] | None) -> None:
    write_json_atomic(figures / f"{name}.json", {"unit": name, "seconds": 600.0, "rounds": {},
                                                 **({"grpo_seconds": grpo} if grpo is not None else {})})


def test_the_matched_verifier_is_read_from_the_kept_units(tmp_path):
    # Each unit's mean over its rounds, then the median over the units. The verifier's: means 40, 45, 50 -> 45;
    # mc-progress's: 180; vineppo's: 160, 170 -> 165. The costliest is mc-progress, 180 / 45 = 4x: 80 -> 320 steps.
    _unit(tmp_path, "verifier-s0", {"1": 40.0, "2": 40.0})
    _unit(tmp_path, "verifier-s1", {"1": 40.0, "2": 50.0})
    _unit(tmp_path, "verifier-s2", {"1": 50.0, "2": 50.0})
    _unit(tmp_path, "mc-progress-s0", {"1": 170.0, "2": 190.0})
    _unit(tmp_path, "mc-progress-wc-s0", {"1": 900.0})  # another arm, though its name begins alike
    _unit(tmp_path, "vineppo-s0", {"1": 160.0})
    _unit(tmp_path, "vineppo-s1", {"1": 170.0})
    assert [p.stem for p in unit_files(tmp_path, "mc-progress")] == ["mc-progress-s0"]
    assert kept_grpo_seconds(unit_files(tmp_path, "verifier")) == 45.0
    assert kept_grpo_seconds(unit_files(tmp_path, "vineppo")) == 165.0
    assert verifier_matched(tmp_path, ["mc-progress", "vineppo"], 80, 8) == [
        *ARMS["verifier"], "grpo.max_steps=320", "supervision.prompts_per_round=2560"]
    # A unit kept before the runner recorded GRPO runtimes cannot set one: named, not skipped.
    _unit(tmp_path, "oracle-progress-s0", None)
    with pytest.raises(ValueError, match=r"oracle-progress-s0.json: no `grpo_seconds` kept"):
        verifier_matched(tmp_path, ["mc-progress", "oracle-progress"], 80, 8)
    with pytest.raises(ValueError, match="no kept unit file"):
        kept_grpo_seconds(unit_files(tmp_path, "implicit-prime"))


def test_a_unit_keeps_each_rl_rounds_grpo_runtime_from_its_mlflow_runs(tmp_path):
    from mlflow import MlflowClient

    from experiments.runner import grpo_seconds, run_figures

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("x")
    runs = {key: client.create_run(experiment).info.run_id
            for key in ("parent", "round-000/policy", "round-001/policy", "round-001/reward_model/prm",
                        "round-002/policy")}
    client.log_metric(runs["round-000/policy"], "train_runtime", 90.0)  # round 0's policy: SFT, not GRPO
    client.log_metric(runs["round-001/policy"], "train_runtime", 41.5)
    client.log_metric(runs["round-001/reward_model/prm"], "train_runtime", 12.0)
    client.log_metric(runs["round-002/policy"], "train_runtime", 47.25)
    run = tmp_path / "run"
    Manifest(run, {"config": {"tracking": {"tracking_uri": uri}}, "phases": {}, "mlflow": runs}).save()
    assert grpo_seconds(run) == {"1": 41.5, "2": 47.25}  # the store the run's config names
    assert run_figures(run)["grpo_seconds"] == {"1": 41.5, "2": 47.25}
    # A GRPO run without it is no finished GRPO phase: said, not kept as nothing.
    Manifest(run, {"config": {}, "phases": {}, "mlflow": {**runs, "round-003/policy": client.create_run(experiment)
                                                          .info.run_id}}).save()
    with pytest.raises(ValueError, match=r"round 3's policy\) has no train_runtime"):
        grpo_seconds(run, uri)
    # A run that recorded no GRPO run (a fake run directory, a run from before any round) keeps no runtimes.
    Manifest(run, {"config": {}, "phases": {}, "mlflow": {}}).save()
    assert grpo_seconds(run) == {} and "grpo_seconds" not in run_figures(run)
