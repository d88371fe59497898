"""A finished run extended by more rounds, and a damaged eval.json named by `igrpo compare`."""

from __future__ import annotations

import pytest

from pipeline.loading import config_from_dict
from pipeline.rundir import Manifest, RunDirError
from tests.conftest import mini_config


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
    assert "round-000/eval' entry in the manifest's phases" in err and "Traceback" not in err
