"""Algorithm 1 as data flow between phases, the phase registry, and resuming run directories of earlier versions."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

from pipeline.loading import config_from_dict
from pipeline.phases import PHASES, PhaseResult, recorded
from pipeline.rounds import open_run
from pipeline.rundir import Manifest, RunDirError, phase_key, write_json_atomic
from tests.helpers import mini_config

ROOT = Path(__file__).resolve().parent.parent


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
    assert list(registers) == ["policy", "reward_model"]  # as <experiment>-policy, <experiment>-prm / -orm
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


# --- the layout ----------------------------------------------------------------------------------------


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return names | {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}


def test_pipeline_never_imports_flows():
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "pipeline").rglob("*.py")
                 if any(m == "flows" or m.startswith("flows.") for m in _imports(p))]
    assert offenders == []


def test_no_test_module_imports_another_or_conftest():
    """Shared functions and constants live in tests/helpers.py, fixtures in conftest.py: a module of tests/ that
    imports a test module (or conftest) runs its import-time work and ties the two files' tests together."""
    def imported(path: Path) -> set[str]:
        tree = ast.parse(path.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and n.module:
                names |= {n.module} | {f"{n.module}.{a.name}" for a in n.names}  # `from tests import test_x` too
        return names

    def a_test_module(name: str) -> bool:
        last = name.split(".")[-1]
        return last == "conftest" or last.startswith("test_")

    offenders = {p.name: sorted(filter(a_test_module, imported(p))) for p in (ROOT / "tests").glob("*.py")}
    assert {name: found for name, found in offenders.items() if found} == {}


def test_the_module_map_matches_the_tree():
    page = (ROOT / "docs" / "extending.md").read_text()
    section = page[page.index("## Module map"):]
    listed = set(re.findall(r"^\| `((?:pipeline|models|flows)/[\w/]+(?:\.py|/))` \|", section, flags=re.M))
    tree = {str(p.relative_to(ROOT)) for d in ("pipeline", "models", "flows") for p in (ROOT / d).glob("*.py")
            if p.name != "__init__.py"}
    tree |= {f"{p.relative_to(ROOT)}/" for d in ("pipeline", "models", "flows") for p in (ROOT / d).iterdir()
             if p.is_dir() and (p / "__init__.py").exists()}
    assert listed == tree


# --- igrpo eval: the eval phase's code on any policy ----------------------------------------------------


@pytest.mark.slow  # the session's finished mini run
def test_igrpo_eval_gives_best_of_n_for_the_reward_models_given_and_remakes_a_rounds_eval_json(finished, tmp_path,
                                                                                             capsys):
    import math

    from flows.cli import main
    from pipeline.rundir import RunDir, read_json

    run = RunDir(finished.cfg.run_dir)
    policy, prm, orm = run.policy(2), run.reward_model(2, "prm"), run.reward_model(2, "orm")
    base = ["eval", str(finished.root / "mini.yaml"), "--policy", str(policy)]

    assert main([*base, "--out", str(tmp_path / "plain.json")]) == 0
    plain = read_json(tmp_path / "plain.json")["metrics"]
    assert {"eval/greedy", "eval/maj@4", "bon/majority@2", "bon/random@4"} <= set(plain)
    assert not any(k.startswith(("bon/prm", "bon/orm", "monitor/")) for k in plain)  # no RM, no shard: skipped

    assert main([*base, "--reward-model", f"prm={prm}", "--out", str(tmp_path / "prm.json")]) == 0
    with_prm = read_json(tmp_path / "prm.json")["metrics"]
    assert {"bon/prm@2", "bon/prm@4", "bon/prm_vote@2", "bon/prm_vote@4"} <= set(with_prm)
    assert not any(k.startswith("bon/orm") for k in with_prm)
    timings = ("eval/completions_per_s",)
    same = lambda a, b: a == b or (math.isnan(a) and math.isnan(b))  # noqa: E731  (no gold step AUC: NaN)
    assert {k for k in with_prm if k in plain} == set(plain)
    assert all(same(with_prm[k], v) for k, v in plain.items() if k not in timings)  # the same seeded samples
    printed = capsys.readouterr().out.split("metric ")[-1].splitlines()[1:]  # the table of the last command
    assert len(printed) == len(with_prm) and len({len(line) for line in printed}) == 1, printed  # values aligned
    assert {line.split()[0]: float(line.split()[1]) for line in printed}["bon/prm_vote@4"] == pytest.approx(
        with_prm["bon/prm_vote@4"], abs=5e-5)

    # --round R samples as round R's eval phase did (seed run.seed + R): with that round's RMs, its eval.json remade
    # (all but the monitor's figures, which read the round's shard).
    assert main([*base, "--round", "2", "--reward-model", f"prm={prm}", "--reward-model", f"orm={orm}",
                 "--out", str(tmp_path / "round2.json")]) == 0
    remade = read_json(tmp_path / "round2.json")["metrics"]
    recorded = {k: v for k, v in read_json(run.eval_json(2))["metrics"].items() if not k.startswith("monitor/")}
    assert set(remade) == set(recorded)
    assert {k for k in recorded if k not in timings and not same(remade[k], recorded[k])} == set()

    assert main([*base, "--reward-model", str(prm)]) == 2
    assert "--reward-model takes KIND=PATH" in capsys.readouterr().err


# --- a kill between creating an MLflow run and recording it --------------------------------------------------


@pytest.mark.usefixtures("isolated")
def test_a_kill_after_an_mlflow_run_is_created_but_not_recorded_does_not_double_it(tmp_path, monkeypatch):
    """Seen in `bench/faults.py --kills 2 --seed 4`: a SIGKILL at start-up, after the parent run was created and
    before the manifest recorded it, left two parent runs named after the run once it was resumed. The same
    window is there for every round, phase and model run."""
    from mlflow import MlflowClient

    from pipeline import tracking
    from pipeline.rounds import phase_runs

    cfg = config_from_dict(mini_config(tmp_path), check_trl=False)
    client = MlflowClient(cfg.tracking.tracking_uri)

    def named(name: str) -> list[str]:
        experiment = client.get_experiment_by_name("mini").experiment_id
        return [r.info.run_id for r in client.search_runs([experiment]) if r.info.run_name == name]

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # the process dies here: nothing after it runs

    with monkeypatch.context() as m:  # killed right after the parent run is created
        m.setattr(tracking, "log_params", killed)
        with pytest.raises(KeyboardInterrupt):
            open_run(cfg)
    assert len(named("mini")) == 1 and "parent" not in Manifest.load(cfg.run_dir).data["mlflow"]
    manifest = open_run(cfg)  # the resume finds it
    assert named("mini") == [manifest.mlflow_run("parent")]

    with monkeypatch.context() as m:  # killed right after round 0's run is created
        m.setattr(Manifest, "set_mlflow_run", killed)
        with pytest.raises(KeyboardInterrupt):
            phase_runs(manifest, cfg, 0, PHASES["collect"])
    runs = phase_runs(Manifest.load(cfg.run_dir), cfg, 0, PHASES["collect"])
    assert len(named("round-000")) == 1 and named("round-000-collect") == [runs.run_id]

    # A run directory deleted and started over is a new run: it never adopts the runs of the one before.
    import shutil

    shutil.rmtree(cfg.run_dir)
    assert open_run(cfg).mlflow_run("parent") != manifest.mlflow_run("parent") and len(named("mini")) == 2
