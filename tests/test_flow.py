"""The iterative flow end to end: a real mini run (2 rounds) in the Prefect harness (its resumes: test_resume.py)."""

from __future__ import annotations

import os

import mlflow
import pytest
from mlflow import MlflowClient

from pipeline.config import config_from_dict
from pipeline.rundir import read_json
from tests._harness import assert_complete_run, mlflow_structure
from tests.conftest import mini_config

pytestmark = pytest.mark.slow
ROUNDS = 2  # round 0 (bootstrap) + rounds 1, 2


def test_mini_flow_end_to_end(tmp_path, prefect_harness, mlflow_tmp):
    from flows.iterative import iterative_rl

    cfg = config_from_dict(mini_config(tmp_path))
    result = iterative_rl(cfg.model_dump(mode="json"))
    assert_complete_run(cfg, "mini")
    client = MlflowClient()
    parent = result["mlflow_run"]
    assert client.get_run(parent).info.status == "FINISHED"
    # Cross-round metrics on the parent, step = round.
    metrics = client.get_run(parent).data.metrics
    for key in ("eval/greedy", "eval/pass_at_4", "eval/maj_at_2", "prm/mean_score", "collect/he_gold_agreement",
                "monitor/prm_gap", "policy/reward_end", "bon/prm@4".replace("@", "_at_")):
        assert key in metrics, key
    # TRL's own metrics landed in the GRPO phase's run.
    s = mlflow_structure("mini")
    grpo_run = next(r for r in s["all"].values() if r.info.run_name == "round-001-policy")
    assert {"reward", "loss", "process/step_reward_mean", "policy/reward_end"} <= set(grpo_run.data.metrics)
    # RM versions registered per round, with round aliases; models:/ URIs resolve.
    for kind in ("prm", "orm"):
        versions = client.search_model_versions(f"name='mini-{kind}'")
        assert sorted(v.tags["round"] for v in versions) == ["0", "1", "2"]
        assert client.get_model_version_by_alias(f"mini-{kind}", "round-2").tags["round"] == "2"
    local = mlflow.artifacts.download_artifacts("models:/mini-prm@round-1")
    assert os.path.exists(os.path.join(local, "model.safetensors"))
    # Plots and eval files.
    assert (cfg.run_dir / "pass_maj_rounds.png").stat().st_size > 1000
    assert read_json(cfg.run_dir / "round-002" / "eval.json")["round"] == 2
    # `igrpo compare`: the run directory and the MLflow parent run give the same table.
    from pipeline.compare import compare

    table, png = compare([str(cfg.run_dir), parent], tmp_path / "cmp.png", mlflow_tmp)
    lines = table.splitlines()
    assert lines[0].split()[:3] == ["run", "round", "greedy"] and "maj@4" in lines[0]
    assert len(lines) == 1 + 2 * (ROUNDS + 1)
    by_dir, by_mlflow = lines[1 : ROUNDS + 2], lines[ROUNDS + 2 :]
    assert [x.split()[1:] for x in by_dir] == [x.split()[1:] for x in by_mlflow]
    assert png.stat().st_size > 1000
