"""SIGKILL inside each phase of round 1, then resume: the reruns finish with nothing lost, redone or doubled.

Every kill goes through the one harness, `tests/_harness.py`'s `sigkill_run`: `igrpo run` in a subprocess
of its own session, killed at a chosen point, its process group (its Prefect server) killed after it.
The kills are chained in one run directory, each resume killed again one phase further, so the run's
round 0 (its SFT, its RMs) is paid once rather than once per kill point; the run ends after round 1, where
every kill lands (within round 1 each resumed phase's output is read by the next phase already). The killed
runs talk to the session's Prefect server, as runs with PREFECT_API_URL set do: a run that starts its own
(and a signal that reaches it) is test_signals.py's subject, and starting one costs more than a mini round.
"""

from __future__ import annotations

import signal

import pytest

from pipeline.loading import config_from_dict
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
PREVIOUS = {"collect": "policy", "reward_model": "collect", "eval": "reward_model"}


def _assert_nothing_redone(before: dict, after: dict, killed_phase: str) -> None:
    """Phases finished before a kill keep their recorded outputs; the killed phase reuses its MLflow run."""
    for key, output in before["phases"].items():
        assert after["phases"][key] == output, key  # finished phases were not redone
    key = f"round-001/{killed_phase}"
    assert after["mlflow"][key] == before["mlflow"][key], key  # the phase run reused


def test_sigkill_in_each_phase_of_round_1_then_resume(tmp_path, prefect_harness, mlflow_tmp):
    """Kill the run a second into round 1's GRPO phase (the trainer running), then kill each resumed run inside
    round 1's next phase (collect, reward_model, eval); a last, in-process rerun finishes the run."""
    from prefect.settings import PREFECT_API_URL

    from flows.iterative import iterative_rl

    data = mini_config(tmp_path, run={"rounds": 1}, grpo={"max_steps": 12})  # GRPO long enough to be killed inside
    cfg = config_from_dict(data)
    manifest_path = cfg.run_dir / "manifest.json"

    def in_grpo_phase() -> bool:
        try:
            m = read_json(manifest_path)
        except (FileNotFoundError, ValueError):
            return False
        return "round-001/policy" in m["mlflow"] and "round-001/policy" not in m["phases"]

    server = PREFECT_API_URL.value()  # the session's harness (conftest.py)
    killed = sigkill_run(tmp_path, data, ready=in_grpo_phase, settle=1.0, prefect_api=server)  # well inside the phase
    assert killed.reached, f"the run ended or stalled (rc {killed.returncode}) before round 1's GRPO:\n{killed.log}"
    assert killed.returncode == -signal.SIGKILL
    before = read_json(manifest_path)
    assert "round-000/eval" in before["phases"] and "round-001/policy" not in before["phases"]
    assert (cfg.run_dir / ".lock").exists()  # left by the dead process: a stale lock
    last = "policy"

    for phase in ("collect", "reward_model", "eval"):  # each resume takes over the stale lock, then is killed
        killed = sigkill_run(tmp_path, data, hold=KILL_POINTS[phase], prefect_api=server)
        assert killed.reached, (f"the run ended or stalled (rc {killed.returncode}) before round 1's {phase}:\n"
                                f"{killed.log}")
        assert killed.returncode == -signal.SIGKILL
        now = read_json(manifest_path)
        _assert_nothing_redone(before, now, last)
        assert f"round-001/{phase}" in now["mlflow"] and f"round-001/{phase}" not in now["phases"]  # inside the phase
        assert f"round-001/{PREVIOUS[phase]}" in now["phases"]
        assert (cfg.run_dir / ".lock").exists()
        before, last = now, phase

    iterative_rl(cfg.model_dump(mode="json"))  # resumes, taking over the stale lock
    assert_complete_run(cfg, "mini")
    _assert_nothing_redone(before, read_json(manifest_path), last)
    assert not (cfg.run_dir / ".lock").exists()
    leftovers = [str(p.relative_to(cfg.run_dir)) for p in cfg.run_dir.rglob(".*") if p.name != ".lock"]
    assert leftovers == []  # no temp file, temp checkpoint or trainer scratch dir left behind
    from mlflow import MlflowClient

    for kind in ("prm", "orm"):  # one version per round and kind: the attempt killed in reward_model registered none
        versions = MlflowClient().search_model_versions(f"name='mini-{kind}'")
        assert sorted(v.tags["round"] for v in versions) == ["0", "1"]
