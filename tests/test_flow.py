"""The iterative flow end to end: a real mini run (2 rounds) in the Prefect harness (its resumes: test_resume.py)."""

from __future__ import annotations

import json
import os

import mlflow
import pytest
from mlflow import MlflowClient

from pipeline.loading import config_from_dict
from pipeline.replay import read_shard
from pipeline.rundir import RunDir, read_json
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
    for key in ("accuracy/greedy", "accuracy/pass_at_4", "accuracy/maj_at_2", "prm/mean_score", "collect/he_gold_agreement",
                "monitor/prm_gap", "policy/reward_end", "bon/prm_at_4", "bon/prm_vote_at_4", "bon/orm_vote_at_2"):
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
    assert os.path.exists(os.path.join(local, "calibration.json"))  # the RM's calibration travels with it
    # The monitor compares with that calibration from round 1 on (round 0 reads its RMs on their own shard).
    assert sorted(p.step for p in client.get_metric_history(parent, "monitor/prm_gap_rise")) == [1, 2]
    assert sorted(p.step for p in client.get_metric_history(parent, "monitor/prm_gap")) == [0, 1, 2]
    # The policy of every round registered the same way, from its phase's run.
    versions = client.search_model_versions("name='mini-policy'")
    assert sorted(v.tags["round"] for v in versions) == ["0", "1", "2"]
    policy_1 = client.get_model_version_by_alias("mini-policy", "round-1")
    assert client.get_run(policy_1.run_id).info.run_name == "round-001-policy"
    assert os.path.exists(os.path.join(mlflow.artifacts.download_artifacts("models:/mini-policy@round-1"),
                                       "model.safetensors"))
    # MLflow 3 opens the experiment in its model-training view.
    assert client.get_experiment_by_name("mini").tags["mlflow.experimentKind"] == "custom_model_development"
    _assert_sample_tables(cfg, s)
    # Plots and eval files.
    assert (cfg.run_dir / "pass_maj_rounds.png").stat().st_size > 1000
    assert read_json(cfg.run_dir / "round-002" / "eval.json")["round"] == 2
    # `igrpo compare`: the run directory and the MLflow parent run give the same tables.
    from pipeline.compare import compare

    text, png = compare([str(cfg.run_dir), parent], tmp_path / "cmp.png", mlflow_tmp)
    table, bon = (part.splitlines() for part in text.split("\n\n"))
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


def _table(run_id: str, name: str) -> list[dict]:
    with open(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=f"samples/{name}.json")) as f:
        table = json.load(f)
    return [dict(zip(table["columns"], row)) for row in table["data"]]


def _assert_sample_tables(cfg, structure) -> None:
    """Each round's eval run holds its sample tables: the same held-out prompts every round, the shard's rows."""
    runs = {r.info.run_name: r.info.run_id for r in structure["all"].values()}
    eval_ids = []
    for r in range(ROUNDS + 1):
        run_id = runs[f"round-{r:03d}-eval"]
        evals, collected = _table(run_id, "eval"), _table(run_id, "collect")
        assert len(evals) == cfg.tracking.sample_table_rows == 16  # of 8 problems x 4 samples: 2 of each
        assert len(collected) == 12  # the whole shard: 6 prompts x 2 samples
        assert {x["round"] for x in evals + collected} == {r}
        assert all(len(x["prm_step_scores"]) >= 1 and 0 <= x["orm_score"] <= 1 for x in evals + collected)
        assert all(x["he_labels"] is None and isinstance(x["gold_labels"], list) for x in evals)
        shard = {(x["prompt_id"], x["sample_index"]): x for x in read_shard(RunDir(cfg.run_dir).shard(r))}
        for x in collected:
            row = shard[x["prompt_id"], x["sample_index"]]
            assert (x["completion"], x["verifier"], x["he_labels"]) == (row["completion"], row["outcome"],
                                                                      row["he_labels"])
        rms = f"round-{max(r - 1, 0):03d}/reward_model"  # the RMs GRPO trained against score the shard
        assert collected[0]["scored_by"] == f"prm={rms}/prm, orm={rms}/orm"
        assert evals[0]["scored_by"] == f"prm=round-{r:03d}/reward_model/prm, orm=round-{r:03d}/reward_model/orm"
        eval_ids.append([(x["prompt_id"], x["sample_index"]) for x in evals])
    assert eval_ids[0] == eval_ids[1] == eval_ids[2]
