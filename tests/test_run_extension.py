"""A finished run extended by more rounds, a damaged output named with the way to redo it (`--redo`), and what a
stopped phase leaves."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipeline.loading import config_from_dict
from pipeline.rundir import Manifest, RunDirError, read_json
from tests.helpers import mini_config


def test_more_rounds_extend_a_run_without_force_and_fewer_are_a_change(tmp_path, mlflow_tmp):
    from pipeline.rounds import open_run

    data = mini_config(tmp_path, run={"rounds": 1}, tracking={"tracking_uri": mlflow_tmp})
    manifest = open_run(config_from_dict(data, check_trl=False))
    manifest.record(1, "eval", {"metrics": {}, "path": "e1"})  # as a finished run records its last phase
    # --set run.rounds=3 on a finished 1-round run: refused as a config change before; now it resumes into round 2.
    more = open_run(config_from_dict(data, ["run.rounds=3"], check_trl=False))
    assert more.data["config"]["run"]["rounds"] == 3 and more.done(1, "eval")
    assert more.mlflow_run("parent") == manifest.mlflow_run("parent")  # the same MLflow run, extended
    with pytest.raises(RunDirError, match=r"run.rounds: 3 -> 2"):  # fewer than recorded: a change, as any other
        open_run(config_from_dict(data, ["run.rounds=2"], check_trl=False))
    with pytest.raises(RunDirError, match=r"run.seed: 0 -> 1"):  # and more rounds hide no other change
        open_run(config_from_dict(data, ["run.rounds=4", "run.seed=1"], check_trl=False))
    assert Manifest.load(config_from_dict(data, check_trl=False).run_dir).data["config"]["run"]["rounds"] == 3


@pytest.mark.parametrize("text", ['{"round": 0, "metrics": {"eval/gree', '{"round": 0}', "[1, 2]"],
                         ids=["truncated", "no-metrics", "not-an-object"])
def test_compare_names_a_damaged_eval_json_and_how_to_recover(tmp_path, capsys, text):
    from flows.cli import main

    run = tmp_path / "runs" / "mini"
    (run / "round-000").mkdir(parents=True)
    (run / "round-000" / "eval.json").write_text(text)
    capsys.readouterr()
    assert main(["compare", str(run), "--out", str(tmp_path / "c.png")]) == 2
    err = capsys.readouterr().err
    # Before: a JSONDecodeError ("Expecting value: line 2 column 1") or a KeyError traceback, without the file.
    assert err.startswith(f"igrpo: error: {run / 'round-000' / 'eval.json'}: damaged"), err
    assert "`igrpo run CONFIG --redo round-000/eval`" in err and "Traceback" not in err


def _recorded_run(tmp_path, tiny_policy_dir):
    """A run directory whose round 0 is recorded done: the tiny policy, a shard, an eval.json (no training)."""
    import shutil

    from pipeline.replay import write_shard
    from pipeline.rundir import RunDir, write_json_atomic

    data = mini_config(tmp_path)
    cfg = config_from_dict(data, check_trl=False)
    run = RunDir(cfg.run_dir)
    shutil.copytree(tiny_policy_dir, run.policy(0))
    row = {"round": 0, "policy": "p", "prompt_id": "a", "prompt": "1+1\n", "sample_index": 0, "completion": "x\n",
           "answer": "2", "steps": ["x"], "outcome": 0, "he_labels": [0], "se_labels": [0.0], "gold_labels": None,
           "rollouts": 2, "num_tokens": 2}
    write_shard([row], run.shard(0))
    write_json_atomic(run.eval_json(0), {"round": 0, "metrics": {}, "curve": {}})
    manifest = Manifest(cfg.run_dir, {"config": cfg.model_dump(mode="json"), "phases": {}, "mlflow": {}})
    manifest.record(0, "policy", {"metrics": {}, "path": str(run.policy(0))})
    manifest.record(0, "collect", {"metrics": {}, "path": str(run.shard(0))})
    manifest.record(0, "eval", {"metrics": {}, "path": str(run.eval_json(0))})
    return data, run


@pytest.mark.parametrize(("damaged", "recorded", "expected"), [
    # truncated weights: before, "invalid header length" from the phase that loaded it, naming no file
    (lambda run: run.policy(0) / "model.safetensors", lambda run: run.policy(0), "SafetensorError"),
    (lambda run: run.shard(0), lambda run: run.shard(0), "Parquet"),  # a parquet file cut short: no footer
    (lambda run: run.eval_json(0), lambda run: run.eval_json(0), "JSONDecodeError"),  # half a JSON
], ids=["checkpoint", "shard", "eval-json"])
def test_a_resume_names_a_damaged_recorded_output_before_any_work(tmp_path, capsys, tiny_policy_dir, damaged,
                                                                  recorded, expected):
    from tests.helpers import run_cli

    data, run = _recorded_run(tmp_path, tiny_policy_dir)
    from pipeline.preflight import preflight

    preflight(config_from_dict(data, check_trl=False))  # whole, it passes
    path = damaged(run)
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    before = sorted(p.name for p in run.root.rglob("*"))
    recorded_key = lambda run: {str(p): k for k, p in Manifest.load(run.root).outputs()}[str(recorded(run))]  # noqa: E731
    rc, err = run_cli(tmp_path, capsys, data)
    assert rc == 2 and err.startswith(f"igrpo: error: {recorded(run)}: recorded as the output"), err
    assert expected in err and f"--redo {recorded_key(run)}`" in err and "Traceback" not in err
    assert sorted(p.name for p in run.root.rglob("*")) == before  # nothing written, nothing started


@pytest.mark.parametrize("written", ["now", "before"])
def test_a_run_directory_moved_elsewhere_resumes_from_another_working_directory(tmp_path, tiny_policy_dir, monkeypatch,
                                                                                 written):
    """A run directory copied to another disk or machine, then resumed from another working directory with a
    relative run.runs_dir: its recorded outputs are found where the directory is now, and where it lives is not a
    change of config. Before, the manifest kept each output's path as the run gave it, and the resume stopped on
    "recorded as the output of round-000/policy, but it is missing" though the checkpoint was there; with that
    mended, on "started with another config: run.runs_dir". Manifests written before (absolute paths) too."""
    import shutil

    from pipeline.phases import recorded
    from pipeline.preflight import check_run, preflight
    from pipeline.rundir import RELATIVE, write_json_atomic

    data, run = _recorded_run(tmp_path, tiny_policy_dir)
    raw = read_json(run.manifest)
    assert raw["phases"]["round-000/policy"]["path"] == "round-000/policy"
    if written == "before":
        for out in raw["phases"].values():
            out["path"] = str(run.root / out["path"])
        write_json_atomic(run.manifest, {k: v for k, v in raw.items() if k != RELATIVE})
    elsewhere = tmp_path / "elsewhere"
    shutil.move(run.root, elsewhere / "runs" / run.root.name)
    monkeypatch.chdir(elsewhere)
    cfg = config_from_dict({**data, "run": {**data["run"], "runs_dir": "runs"}}, check_trl=False)
    preflight(cfg)  # before: RunDirError, round-000/policy "missing"
    found, errors = check_run(cfg)  # `igrpo check`; before: run.runs_dir's new spelling was a config change
    assert errors == [] and found["run directory"] == f"{cfg.run_dir}: resumes it (3 phases done)"
    policy = recorded(cfg)(0, "policy").path
    assert policy == str(Path("runs", run.root.name, "round-000", "policy")) and Path(policy, "config.json").is_file()
    assert sorted(str(p) for _, p in Manifest.load(cfg.run_dir).outputs()) == sorted(
        str(Path("runs", run.root.name, "round-000", name)) for name in ("policy", "samples.parquet", "eval.json"))


def test_redo_forgets_a_recorded_phase_and_every_phase_after_it(tmp_path, tiny_policy_dir, capsys):
    """The way out the damaged-output error names: `igrpo run CONFIG --redo ROUND/PHASE` drops that phase's record
    and those after it in run order (here round 0's eval: collect, reward_model and eval come after policy), so
    the preflight passes and the run redoes them; a phase not recorded, or not a phase, is one clear error."""
    from flows.cli import main
    from pipeline.phases import redo
    from pipeline.preflight import preflight
    from pipeline.rundir import RunDirError

    data, run = _recorded_run(tmp_path, tiny_policy_dir)
    cfg = config_from_dict(data, check_trl=False)
    shard = run.shard(0)
    shard.write_bytes(shard.read_bytes()[:10])  # damaged
    with pytest.raises(RunDirError, match="--redo round-000/collect"):
        preflight(cfg)
    assert redo(cfg, "0/collect") == ["round-000/collect", "round-000/eval"]
    assert list(read_json(run.manifest)["phases"]) == ["round-000/policy"]
    preflight(cfg)  # the damaged shard is no longer a recorded output: it will be rewritten
    for spec, why in (("0/collect", "is not recorded done"), ("0/bogus", "expected ROUND/PHASE"),
                      ("x/policy", "expected ROUND/PHASE")):
        with pytest.raises(RunDirError, match=why):
            redo(cfg, spec)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(data))
    capsys.readouterr()
    assert main(["run", str(tmp_path / "run.yaml"), "--redo", "round-000/eval"]) == 2
    assert "igrpo: error: --redo round-000/eval: round-000/eval is not recorded done" in capsys.readouterr().err


def test_a_phase_stopped_anywhere_leaves_no_trainer_scratch(tmp_path, mlflow_tmp, monkeypatch):
    # Seen in the stop-and-resume chain: a SIGTERM in round 0's reward_model left round-000/reward_model/.trainer-prm
    # (a Trainer makes its output_dir as it is built, before `train_resumable` claims it): one without a checkpoint
    # holds nothing to resume and goes (`keep_resumable`).
    from pipeline import rounds
    from pipeline.rundir import RunDir

    cfg = config_from_dict(mini_config(tmp_path, tracking={"tracking_uri": mlflow_tmp}), check_trl=False)
    rounds.open_run(cfg).record(0, "policy", {"metrics": {}, "path": "p0"})
    scratch = RunDir(cfg.run_dir).reward_model(0, "prm").parent / ".trainer-prm"

    def built_then_stopped(*args, **kwargs):
        scratch.mkdir(parents=True)  # as Trainer.__init__ does
        raise KeyboardInterrupt

    monkeypatch.setattr(rounds, "execute", built_then_stopped)
    with pytest.raises(KeyboardInterrupt):
        rounds.run_phase(cfg, 0, "reward_model", policy="p0", previous=None)
    assert not scratch.exists() and not Manifest.load(cfg.run_dir).done(0, "reward_model")


def test_a_redo_that_cannot_apply_is_one_sentence_before_anything_is_written(tmp_path, tiny_policy_dir, capsys):
    """Issue 49: `igrpo run CONFIG --redo 7/collect` on a run directory not made yet said `[Errno 2] No such file or
    directory: '.../manifest.json'`. Each request that cannot apply (no run yet, a round past run.rounds, a phase
    not recorded, a malformed spec) is one sentence saying why, and nothing is written, also when it is the second
    of two requests and the first alone would apply."""
    from flows.cli import main

    def igrpo_run(data, *specs):
        (tmp_path / "run.yaml").write_text(yaml.safe_dump(data))
        capsys.readouterr()
        rc = main(["run", str(tmp_path / "run.yaml"), *[f"--redo={s}" for s in specs]])
        return rc, capsys.readouterr().err

    data = mini_config(tmp_path)
    run_dir = Path(data["run"]["runs_dir"]) / "mini"
    rc, err = igrpo_run(data, "1/collect")
    assert rc == 2 and err == f"igrpo: error: --redo 1/collect: {run_dir} has no run yet (no manifest.json); " \
                              "`igrpo run` without --redo starts it\n", err
    assert not run_dir.exists()
    data, run = _recorded_run(tmp_path, tiny_policy_dir)
    before = read_json(run.manifest)
    for spec, why in (("7/collect", "round 7 is past run.rounds (2): nothing to redo there"),
                      ("0/reward_model", "round-000/reward_model is not recorded done"),
                      ("0/bogus", "expected ROUND/PHASE"), ("-1/policy", "expected ROUND/PHASE"),
                      ("policy", "expected ROUND/PHASE")):
        rc, err = igrpo_run(data, "0/collect", spec)
        assert rc == 2 and err.startswith(f"igrpo: error: --redo {spec}: ") and why in err, err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert read_json(run.manifest) == before  # the first request, which alone applies, dropped nothing
