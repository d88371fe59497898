"""SIGKILL inside a phase of round 1, then resume: the rerun finishes with nothing lost, redone or doubled.

Every kill goes through the one harness, `tests/_harness.py`'s `sigkill_run`: `igrpo run` in a subprocess
of its own session, killed at a chosen point, its process group (its Prefect server) killed after it.
"""

from __future__ import annotations

import signal

import pytest

from pipeline.config import config_from_dict
from pipeline.rundir import read_json
from tests._harness import assert_complete_run, sigkill_run
from tests.conftest import mini_config

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("isolated")]

# Where the run is held (then killed) inside round 1's phase: (module, function, a path the call must name).
# Each point leaves the phase half done: collect: every sample labelled, the shard not yet written;
# reward_model: the PRM trained and saved, the ORM trained but not saved; eval: eval.json written, the
# plots, artifacts and manifest record not.
KILL_POINTS = {
    "collect": ("pipeline.collect", "write_shard", "round-001/samples.parquet"),
    "reward_model": ("pipeline.reward_model", "save_model", "round-001/reward_model/orm"),
    "eval": ("pipeline.eval_phase", "plot_pass_maj", "round-001/pass_maj.png"),
}


@pytest.mark.parametrize("phase", ["collect", "reward_model", "eval"])
def test_sigkill_in_phase_then_resume(tmp_path, prefect_harness, mlflow_tmp, phase):
    """SIGKILL the run inside round 1's `phase`; an in-process rerun finishes with nothing lost or redone."""
    from flows.iterative import iterative_rl

    data = mini_config(tmp_path)
    cfg = config_from_dict(data)
    killed = sigkill_run(tmp_path, data, hold=KILL_POINTS[phase])
    assert killed.reached, f"the run ended or stalled (rc {killed.returncode}) before round 1's {phase}:\n{killed.log}"
    assert killed.returncode == -signal.SIGKILL
    manifest_path = cfg.run_dir / "manifest.json"
    before = read_json(manifest_path)
    assert f"round-001/{phase}" in before["mlflow"] and f"round-001/{phase}" not in before["phases"]  # inside the phase
    previous = {"collect": "policy", "reward_model": "collect", "eval": "reward_model"}[phase]
    assert f"round-001/{previous}" in before["phases"]
    assert (cfg.run_dir / ".lock").exists()  # left by the dead process

    iterative_rl(cfg.model_dump(mode="json"))  # resumes, taking over the stale lock
    assert_complete_run(cfg, "mini")
    after = read_json(manifest_path)
    for key, output in before["phases"].items():
        assert after["phases"][key] == output  # finished phases were not redone
    assert after["mlflow"][f"round-001/{phase}"] == before["mlflow"][f"round-001/{phase}"]  # the phase run reused
    assert not (cfg.run_dir / ".lock").exists()
    leftovers = [str(p.relative_to(cfg.run_dir)) for p in cfg.run_dir.rglob(".*") if p.name != ".lock"]
    assert leftovers == []  # no temp file, temp checkpoint or trainer scratch dir left behind
    if phase == "reward_model":  # one version per round and kind: the killed attempt registered nothing
        from mlflow import MlflowClient

        for kind in ("prm", "orm"):
            versions = MlflowClient().search_model_versions(f"name='mini-{kind}'")
            assert sorted(v.tags["round"] for v in versions) == ["0", "1", "2"]


def test_sigkill_mid_grpo_then_resume(tmp_path, prefect_harness, mlflow_tmp):
    """Kill the run a second into round 1's GRPO phase (the trainer running); a rerun finishes with nothing
    lost or doubled."""
    from flows.iterative import iterative_rl

    data = mini_config(tmp_path, grpo={"max_steps": 12})
    cfg = config_from_dict(data)
    manifest_path = cfg.run_dir / "manifest.json"

    def in_grpo_phase() -> bool:
        try:
            m = read_json(manifest_path)
        except (FileNotFoundError, ValueError):
            return False
        return "round-001/policy" in m["mlflow"] and "round-001/policy" not in m["phases"]

    killed = sigkill_run(tmp_path, data, ready=in_grpo_phase, settle=1.0)  # well inside the phase
    assert killed.reached, f"the run ended or stalled (rc {killed.returncode}) before round 1's GRPO:\n{killed.log}"
    assert killed.returncode == -signal.SIGKILL
    before = read_json(manifest_path)
    assert "round-000/eval" in before["phases"] and "round-001/policy" not in before["phases"]
    assert (cfg.run_dir / ".lock").exists()  # left by the dead process: a stale lock

    iterative_rl(cfg.model_dump(mode="json"))  # resumes: takes over the stale lock
    assert_complete_run(cfg, "mini")
    after = read_json(manifest_path)
    for key, output in before["phases"].items():
        assert after["phases"][key] == output  # finished phases were not redone
