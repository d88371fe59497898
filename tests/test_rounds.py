"""Algorithm 1 as data flow between phases, the phase registry, and resuming run directories of earlier versions."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.loading import config_from_dict
from pipeline.phases import PHASES, PhaseResult, recorded
from pipeline.rounds import open_run
from pipeline.rundir import Manifest, RunDirError, phase_key, write_json_atomic
from tests.helpers import mini_config


def _walk_round(cfg, r: int) -> list:
    """Round r's phases in order as `run_phase` runs them: each one's inputs as its declaration reads them from
    the manifest, then a made-up output named after it, in the run directory, recorded there. Returns what each
    phase was handed, its paths relative to the run directory."""
    at, calls = lambda name: str(Path(cfg.run_dir, name)), []
    for name, phase in PHASES.items():
        calls.append((r, name, _relative(phase.inputs(recorded(cfg), r), cfg.run_dir)))
        out = ({"paths": {"prm": at(f"rm{r}/prm"), "orm": at(f"rm{r}/orm")}} if name == "reward_model"
               else {"path": at(f"{name}{r}")})
        Manifest.load(cfg.run_dir).record(r, name, {"metrics": {}, **out})
    return calls


def _relative(inputs, run_dir):
    """A phase's inputs with each path under `run_dir` written relative to it."""
    if isinstance(inputs, dict):
        return {k: _relative(v, run_dir) for k, v in inputs.items()}
    return str(Path(inputs).relative_to(run_dir)) if isinstance(inputs, str) else inputs


def test_round_zero_bootstraps_and_its_monitor_reads_its_own_rms(tmp_path):
    cfg = config_from_dict(mini_config(tmp_path), check_trl=False)
    Manifest(cfg.run_dir, {"config": {}, "phases": {}, "mlflow": {}}).save()
    assert _walk_round(cfg, 0) == [
        (0, "policy", {}),  # no policy given: the bootstrap
        (0, "collect", {"policy": "policy0"}),
        (0, "reward_model", {"policy": "policy0", "previous": None}),  # heads new on policy_0's backbone
        (0, "eval", {"policy": "policy0", "reward_models": {"prm": "rm0/prm", "orm": "rm0/orm"}, "shard": "collect0",
                     "trained_against": {"prm": "rm0/prm", "orm": "rm0/orm"}}),
    ]


@pytest.mark.parametrize("oracle", [None, "gold"], ids=["prm", "oracle"])
def test_round_r_trains_from_the_previous_policy_against_the_previous_rms(tmp_path, oracle):
    # With the oracle, the gold labels stand in for the PRM inside GRPO only: the RMs are trained, warm-started
    # and evaluated as usual, so the round's other figures compare with a PRM arm's.
    cfg = config_from_dict(mini_config(tmp_path, reward_model={"oracle": oracle}), check_trl=False)
    manifest, at = Manifest(cfg.run_dir, {"config": {}, "phases": {}, "mlflow": {}}), lambda n: str(cfg.run_dir / n)
    for name, output in {"policy": {"path": at("p0"), "metrics": {}}, "collect": {"path": at("s0"), "metrics": {}},
                         "reward_model": {"paths": {"prm": at("r0")}, "versions": {}, "metrics": {}},
                         "eval": {"path": at("e0"), "metrics": {}}}.items():
        manifest.record(0, name, output)
    assert _walk_round(cfg, 1) == [
        (1, "policy", {"policy": "p0", "reward_models": {"prm": "r0"}}),  # GRPO from π_0 against rm_0
        (1, "collect", {"policy": "policy1"}),
        (1, "reward_model", {"policy": "policy1", "previous": {"prm": "r0"}}),  # warm start from rm_0
        (1, "eval", {"policy": "policy1", "reward_models": {"prm": "rm1/prm", "orm": "rm1/orm"}, "shard": "collect1",
                     "trained_against": {"prm": "r0"}}),  # the monitor reads the RM GRPO trained against
    ]


def test_registry_declares_launch_and_mlflow_runs(tmp_path):
    assert list(PHASES) == ["policy", "collect", "reward_model", "eval"]
    assert [p for p, d in PHASES.items() if d.launchable] == ["policy", "reward_model"]
    cfg = config_from_dict(mini_config(tmp_path, reward_model={"kinds": ["prm", "orm"], "retrain": False}),
                           check_trl=False)
    models = PHASES["reward_model"].models
    assert models(cfg, 0) == ["prm", "orm"] and models(cfg, 1) == []  # frozen RMs train (and log) in round 0 only


def test_registry_declares_what_each_phase_registers_and_the_config_turns_it_off(tmp_path):
    policy, rms = PhaseResult({}, path="p1"), PhaseResult({}, paths={"prm": "r/prm", "orm": "r/orm"})
    registers = {name: phase.registers for name, phase in PHASES.items() if phase.registers}
    assert list(registers) == ["policy", "reward_model"]  # as <experiment>-<run>-policy, -prm / -orm
    on = config_from_dict(mini_config(tmp_path), check_trl=False)
    assert registers["policy"](on, policy) == {"policy": "p1"}
    assert registers["reward_model"](on, rms) == {"prm": "r/prm", "orm": "r/orm"}
    off = config_from_dict(mini_config(tmp_path, tracking={"register_policy": False}), check_trl=False)
    assert registers["policy"](off, policy) == {} and registers["reward_model"](off, rms) == rms.paths
    off = config_from_dict(mini_config(tmp_path, tracking={"register_models": False}), check_trl=False)
    assert registers["policy"](off, policy) == {"policy": "p1"} and registers["reward_model"](off, rms) == {}


def test_phase_result_round_trips_through_the_manifest_in_the_old_format():
    policy = PhaseResult({"policy/steps": 2.0}, path="runs/x/round-001/policy")
    assert policy.to_manifest() == {"metrics": {"policy/steps": 2.0}, "path": "runs/x/round-001/policy"}
    rms = PhaseResult({}, paths={"prm": "a"}, versions={})
    assert rms.to_manifest() == {"metrics": {}, "paths": {"prm": "a"}, "versions": {}}
    assert PhaseResult.from_manifest(rms.to_manifest()) == rms


def test_a_manifest_of_the_older_key_format_resumes(tmp_path):
    # Before one key format, phases were recorded as "001/policy" while MLflow runs were "round-001/policy".
    write_json_atomic(tmp_path / "manifest.json", {
        "config": {}, "mlflow": {"parent": "p", "round-001/policy": "x"},
        "phases": {"000/policy": {"path": "a", "metrics": {}}, "001/policy": {"path": "b", "metrics": {}}},
    })
    manifest = Manifest.load(tmp_path)
    assert manifest.done(0, "policy") and manifest.done(1, "policy") and not manifest.done(1, "collect")
    assert manifest.output(1, "policy")["path"] == os.path.abspath("b")  # relative to the working directory then
    assert set(manifest.data["phases"]) == {phase_key(0, "policy"), phase_key(1, "policy")} == {
        "round-000/policy", "round-001/policy"}


def _stored(tmp_path, cfg, edit) -> None:
    stored = cfg.model_dump(mode="json")
    edit(stored)
    write_json_atomic(cfg.run_dir / "manifest.json", {"config": stored, "phases": {}, "mlflow": {}})


def test_a_field_added_since_with_its_default_is_no_change_on_resume(tmp_path, mlflow_tmp):
    cfg = config_from_dict(mini_config(tmp_path, tracking={"tracking_uri": mlflow_tmp}), check_trl=False)
    # A run directory written before `collect.workers` and `reward_model.retrain` existed.
    _stored(tmp_path, cfg, lambda c: (c["collect"].pop("workers"), c["reward_model"].pop("retrain")))
    open_run(cfg)  # no RunDirError
    assert "workers" in Manifest.load(cfg.run_dir).data["config"]["collect"]


def test_a_changed_field_is_still_refused_on_resume(tmp_path, mlflow_tmp):
    cfg = config_from_dict(mini_config(tmp_path, tracking={"tracking_uri": mlflow_tmp}), check_trl=False)
    _stored(tmp_path, cfg, lambda c: (c["collect"].pop("workers"), c["reward_model"].update(replay_fraction=0.5)))
    with pytest.raises(RunDirError, match=r"reward_model\.replay_fraction: 0\.5 -> 0\.1") as e:
        open_run(cfg)
    assert "workers" not in str(e.value)
    open_run(cfg, force=True)
