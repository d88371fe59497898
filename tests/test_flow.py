"""The iterative flow end to end: what the session's finished mini run (2 rounds, `igrpo run` as a user runs it:
conftest.py's `mini_run`) leaves in its run directory and in MLflow, and `igrpo compare` on it. Its console output:
test_console.py; its sample tables: test_sample_tables.py; its stops and resumes: test_signals.py."""

from __future__ import annotations

import os

import mlflow
import pytest
from mlflow import MlflowClient

from pipeline.rundir import read_json
from tests.helpers import NAME, assert_complete_run, mlflow_structure

pytestmark = pytest.mark.slow
ROUNDS = 2  # round 0 (bootstrap) + rounds 1, 2


def _parent(run) -> str:
    return read_json(run.cfg.run_dir / "manifest.json")["mlflow"]["parent"]


def test_every_phase_of_every_round_is_done_and_tracked(finished):
    cfg = finished.cfg
    assert_complete_run(cfg, NAME)
    client = MlflowClient()
    parent = _parent(finished)
    assert client.get_run(parent).info.status == "FINISHED"
    # Cross-round metrics on the parent, step = round.
    metrics = client.get_run(parent).data.metrics
    for key in ("accuracy/greedy", "accuracy/pass_at_4", "accuracy/maj_at_2", "prm/mean_score", "collect/he_gold_agreement",
                "monitor/prm_gap", "policy/reward_end", "bon/prm_at_4", "bon/prm_vote_at_4", "bon/orm_vote_at_2"):
        assert key in metrics, key
    # TRL's own metrics landed in the GRPO phase's run.
    s = mlflow_structure(NAME)
    grpo_run = next(r for r in s["all"].values() if r.info.run_name == "round-001-policy")
    assert {"reward", "loss", "process/step_reward_mean", "policy/reward_end"} <= set(grpo_run.data.metrics)
    # The monitor compares with the RMs' calibration from round 1 on (round 0 reads its RMs on their own shard).
    assert sorted(p.step for p in client.get_metric_history(parent, "monitor/prm_gap_rise")) == [1, 2]
    assert sorted(p.step for p in client.get_metric_history(parent, "monitor/prm_gap")) == [0, 1, 2]
    # MLflow 3 opens the experiment in its model-training view.
    assert client.get_experiment_by_name(NAME).tags["mlflow.experimentKind"] == "custom_model_development"
    # Plots and eval files.
    assert (cfg.run_dir / "pass_maj_rounds.png").stat().st_size > 1000
    assert read_json(cfg.run_dir / "round-002" / "eval.json")["round"] == 2


def test_each_rounds_reward_models_and_policy_are_registered_with_round_aliases(finished, tmp_path):
    client = MlflowClient()
    # RM versions registered per round, with round aliases; models:/ URIs resolve.
    for kind in ("prm", "orm"):
        versions = client.search_model_versions(f"name='mini-mini-{kind}'")
        assert sorted(v.tags["round"] for v in versions) == ["0", "1", "2"]
        assert client.get_model_version_by_alias(f"mini-mini-{kind}", "round-2").tags["round"] == "2"
    local = mlflow.artifacts.download_artifacts("models:/mini-mini-prm@round-1", dst_path=str(tmp_path / "prm"))
    assert os.path.exists(os.path.join(local, "model.safetensors"))
    assert os.path.exists(os.path.join(local, "calibration.json"))  # the RM's calibration travels with it
    # The policy of every round registered the same way, from its phase's run.
    versions = client.search_model_versions("name='mini-mini-policy'")
    assert sorted(v.tags["round"] for v in versions) == ["0", "1", "2"]
    policy_1 = client.get_model_version_by_alias("mini-mini-policy", "round-1")
    assert client.get_run(policy_1.run_id).info.run_name == "round-001-policy"
    policy = mlflow.artifacts.download_artifacts("models:/mini-mini-policy@round-1", dst_path=str(tmp_path / "policy"))
    assert os.path.exists(os.path.join(policy, "model.safetensors"))


def test_compare_gives_the_same_tables_from_the_run_directory_and_its_mlflow_run(finished, tmp_path):
    from pipeline.compare import compare

    cfg = finished.cfg
    text, png = compare([str(cfg.run_dir), _parent(finished)], tmp_path / "cmp.png", cfg.tracking.tracking_uri)
    table, bon, gain = (part.splitlines() for part in text.split("\n\n"))
    assert table[0].split()[:3] == ["run", "round", "greedy"] and "maj@4" in table[0]
    assert len(table) == 1 + 2 * (ROUNDS + 1)
    by_dir, by_mlflow = table[1 : ROUNDS + 2], table[ROUNDS + 2 :]
    assert [x.split()[1:] for x in by_dir] == [x.split()[1:] for x in by_mlflow]
    # Best-of-N (N = 2, 4): each RM's pick and weighted vote, majority, random, from both sources alike.
    assert bon[1].split() == ["run", "round", "N", "orm", "orm_vote", "prm", "prm_vote", "majority", "random"]
    rows = 2 * (ROUNDS + 1)
    assert len(bon) == 2 + 2 * rows and all("-" not in x.split() for x in bon[2:])
    assert [x.split()[1:] for x in bon[2 : 2 + rows]] == [x.split()[1:] for x in bon[2 + rows :]]
    assert png.stat().st_size > 1000
    # The run directory keeps each problem's figures: the last round against round 0, paired per problem, agrees
    # with the table's means (the MLflow run has no per-problem figures: no line for it).
    k = max(int(c.split("@")[1]) for c in table[0].split() if c.startswith("maj@"))
    col = table[0].split().index(f"maj@{k}")  # a row's label and round sit under "run" and "round"
    first, last = (float(row.split()[col]) for row in (by_dir[0], by_dir[-1]))
    assert len(gain) == 1 and gain[0].startswith(f"{cfg.run.name}: maj@{k} round {ROUNDS} - round 0 = ")
    assert float(gain[0].split("= ")[1].split(",")[0]) == pytest.approx(last - first, abs=2e-3)
    assert "paired SE" in gain[0] and "over 8 eval problems" in gain[0]
