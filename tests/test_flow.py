"""The iterative flow end to end: a real mini run (2 rounds) in the Prefect harness, and a SIGKILL resume."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import mlflow
import pytest
import yaml
from mlflow import MlflowClient

from pipeline.config import config_from_dict
from pipeline.replay import read_shard
from pipeline.rounds import PHASES
from pipeline.rundir import RunDir, phase_key, read_json
from pipeline.tracking import PARENT_TAG
from tests.conftest import mini_config

pytestmark = pytest.mark.slow
ROUNDS = 2  # round 0 (bootstrap) + rounds 1, 2


def mlflow_structure(experiment: str) -> dict:
    """Parent, round and phase runs of an experiment, by name."""
    exp = MlflowClient().get_experiment_by_name(experiment)
    runs = MlflowClient().search_runs([exp.experiment_id], max_results=1000)
    by_id = {r.info.run_id: r for r in runs}
    parents = [r for r in runs if PARENT_TAG not in r.data.tags]
    children = lambda pid: sorted(r.info.run_name for r in runs if r.data.tags.get(PARENT_TAG) == pid)
    rounds = {r.info.run_name: r.info.run_id for r in runs if r.data.tags.get(PARENT_TAG) in {p.info.run_id for p in parents}}
    return {"parents": parents, "rounds": rounds, "phases": {name: children(rid) for name, rid in rounds.items()},
            "all": by_id}


def assert_complete_run(cfg, experiment: str) -> None:
    run_dir = cfg.run_dir
    manifest = read_json(run_dir / "manifest.json")
    assert set(manifest["phases"]) == {phase_key(r, p) for r in range(ROUNDS + 1) for p in PHASES}
    # Each shard holds exactly M prompts x G samples of its own round.
    for r in range(ROUNDS + 1):
        rows = read_shard(RunDir(run_dir).shard(r))
        assert len(rows) == cfg.collect.prompts_per_round * cfg.collect.samples_per_prompt
        assert {x["round"] for x in rows} == {r}
        assert len({(x["prompt_id"], x["sample_index"]) for x in rows}) == len(rows)
    s = mlflow_structure(experiment)
    assert len(s["parents"]) == 1
    assert sorted(s["rounds"]) == [f"round-{r:03d}" for r in range(ROUNDS + 1)]
    for name, phases in s["phases"].items():
        assert phases == sorted(f"{name}-{p}" for p in PHASES)
    parent = s["parents"][0].info.run_id
    history = MlflowClient().get_metric_history(parent, "eval/maj_at_4")
    assert sorted(h.step for h in history) == list(range(ROUNDS + 1))


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


def test_sigkill_mid_phase_then_resume(tmp_path, prefect_harness, mlflow_tmp):
    """Kill the flow's process during round 1's GRPO phase; a rerun finishes with nothing lost or doubled."""
    from flows.iterative import iterative_rl

    data = mini_config(tmp_path, grpo={"max_steps": 12})
    cfg = config_from_dict(data)
    path = tmp_path / "mini.yaml"
    path.write_text(yaml.safe_dump(data))
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-sub"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    # A session of its own: the ephemeral Prefect server it starts is killed with its group afterwards.
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "run", str(path)], env=env, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    manifest_path = cfg.run_dir / "manifest.json"
    deadline = time.time() + 400
    killed_in_phase = False
    while time.time() < deadline and proc.poll() is None:
        try:
            m = read_json(manifest_path)
        except (FileNotFoundError, ValueError):
            m = {"phases": {}, "mlflow": {}}
        if "round-001/policy" in m["mlflow"] and "001/policy" not in m["phases"]:
            time.sleep(1.0)  # well inside the phase: the trainer is running
            proc.send_signal(signal.SIGKILL)
            killed_in_phase = True
            break
        time.sleep(0.05)
    proc.wait(timeout=60)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # what the dead run left behind (its Prefect server)
    assert killed_in_phase, "the run finished or stalled before round 1's GRPO phase could be killed"
    before = read_json(manifest_path)
    assert "000/eval" in before["phases"] and "001/policy" not in before["phases"]
    assert (cfg.run_dir / ".lock").exists()  # left by the dead process: a stale lock

    iterative_rl(cfg.model_dump(mode="json"))  # resumes: takes over the stale lock
    assert_complete_run(cfg, "mini")
    after = read_json(manifest_path)
    for key, output in before["phases"].items():
        assert after["phases"][key] == output  # finished phases were not redone
