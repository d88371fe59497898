"""A strict config, checked without running: `igrpo check`, a YAML key given twice, an empty config file, and
`igrpo compare` on something that is not a run, and its best-of-N table.

In-process (`main([...])` returns the exit code; messages on stderr), in a temp working directory, so
that "nothing was created" can be checked on the directory itself.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest
import yaml

from flows.cli import main
from pipeline.loading import load_config
from tests.helpers import mini_config

pytestmark = pytest.mark.usefixtures("isolated")


@pytest.fixture(autouse=True)
def mlflow_default_uri():
    """No tracking URI left set by an earlier test: the tests below read MLflow's default (./mlflow.db)."""
    import mlflow

    mlflow.set_tracking_uri(None)


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def write(tmp_path: Path, data, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


# --- igrpo check ------------------------------------------------------------------------------------------


def test_check_on_a_valid_config_prints_it_resolved_and_creates_nothing(tmp_path, capsys):
    config = write(tmp_path, mini_config(tmp_path))
    before = tree(tmp_path)
    rc, out, err = cli(capsys, "check", str(config), "--set", "grpo.learning_rate=3e-5")
    assert rc == 0, err
    assert tree(tmp_path) == before  # no runs/, no mlflow.db, no mlruns/, no Prefect home
    assert not Path("mlflow.db").exists() and not Path("mlruns").exists()
    # stdout is the resolved config: every field, the override applied, loadable as a config of its own.
    resolved = yaml.safe_load(out)
    assert resolved["grpo"]["learning_rate"] == 3e-5
    assert resolved["reward_model"]["replay_fraction"] == 0.1  # a default, written out
    again = write(tmp_path, out, "resolved.yaml")
    assert load_config(again) == load_config(config, ["grpo.learning_rate=3e-5"])
    # stderr says what the preflight found.
    assert "igrpo: check: problems: arithmetic: 400 train, 20 held-out problems" in err
    assert f"igrpo: check: tracking: sqlite:///{tmp_path / 'mlflow.db'}: {tmp_path / 'mlflow.db'} (will be created)" in err
    assert f"igrpo: check: run directory: {tmp_path / 'runs' / 'mini'}: new (will be created)" in err
    assert err.rstrip().endswith("is ready to run (nothing was created)")


def test_check_with_mlflows_default_store_creates_no_store(tmp_path, capsys):
    data = mini_config(tmp_path)
    del data["tracking"]  # MLflow's default: ./mlflow.db
    rc, _, err = cli(capsys, "check", str(write(tmp_path, data)))
    assert rc == 0, err
    assert "mlflow.db (will be created)" in err
    assert tree(tmp_path) == {"run.yaml"}


def test_check_reads_an_existing_store_without_writing_it(tmp_path, capsys):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(uri).create_experiment("mini")  # a store `igrpo run` made before
    db = tmp_path / "mlflow.db"
    digest, mtime = hashlib.sha256(db.read_bytes()).hexdigest(), db.stat().st_mtime_ns
    time.sleep(0.01)
    rc, _, err = cli(capsys, "check", str(write(tmp_path, mini_config(tmp_path))))
    assert rc == 0, err
    assert f"igrpo: check: tracking: {uri}: experiment 'mini' exists" in err
    assert hashlib.sha256(db.read_bytes()).hexdigest() == digest and db.stat().st_mtime_ns == mtime
    assert len(MlflowClient(uri).search_runs([MlflowClient(uri).get_experiment_by_name("mini").experiment_id])) == 0
    assert not (tmp_path / "runs").exists()


def test_check_reports_every_failed_check_and_exits_2(tmp_path, capsys):
    uri = "http://127.0.0.1:9"  # the discard port: nothing listens there
    data = mini_config(tmp_path, problems={"kind": "gsm8k", "gsm8k": {"train_path": str(tmp_path / "no-train.jsonl"),
                                                                       "test_path": str(tmp_path / "no-test.jsonl")}},
                       policy={"model": str(tmp_path / "no-model")}, tracking={"tracking_uri": uri})
    rc, out, err = cli(capsys, "check", str(write(tmp_path, data)))
    assert rc == 2
    errors = [line for line in err.splitlines() if line.startswith("igrpo: error: ")]
    assert len(errors) == 3, err
    assert f"GSM8K file not found: {tmp_path / 'no-train.jsonl'}" in errors[0]
    assert f"model path {str(tmp_path / 'no-model')!r} does not exist" in errors[1]
    assert f"MLflow tracking URI {uri!r} cannot be used" in errors[2]
    assert "Traceback" not in err
    assert yaml.safe_load(out)["tracking"]["tracking_uri"] == uri  # the config itself resolved
    assert tree(tmp_path) == {"run.yaml"}


def test_check_refuses_a_run_directory_started_with_another_config(tmp_path, capsys):
    from pipeline.loading import config_from_dict
    from pipeline.rundir import write_json_atomic

    other = config_from_dict(mini_config(tmp_path, collect={"prompts_per_round": 7}), check_trl=False)
    write_json_atomic(other.run_dir / "manifest.json",
                      {"config": other.model_dump(mode="json"), "phases": {}, "mlflow": {}})
    before = tree(tmp_path)
    rc, _, err = cli(capsys, "check", str(write(tmp_path, mini_config(tmp_path))))
    assert rc == 2
    assert f"igrpo: error: {other.run_dir} was started with another config" in err
    assert "--force" in err and "collect.prompts_per_round: 7 -> 6" in err
    assert tree(tmp_path) == before | {"run.yaml"}


def test_check_on_a_bad_config_exits_2_before_any_check(tmp_path, capsys):
    rc, out, err = cli(capsys, "check", str(write(tmp_path, mini_config(tmp_path, run={"rounds": 0}))))
    assert rc == 2 and out == ""
    assert err.startswith("igrpo: error: ") and "run.rounds: Input should be greater than or equal to 1" in err


@pytest.mark.parametrize(("setting", "expected"), [
    ("problems.arithmetic.start_range=[5, 1]", "start_range is reversed: low 5 > high 1"),
    ("problems.arithmetic.max_value=10", "start_range must have low >= 0 and high <= 10, got (1, 20)"),
    ("problems.arithmetic.operators=['+', '+']", "operators has duplicates"),
], ids=["reversed", "above-max-value", "duplicate-operators"])
def test_an_arithmetic_section_that_cannot_build_its_set_names_the_section(tmp_path, capsys, setting, expected):
    # Fields each valid alone but not together: EmbeddedArithmetic's error, which named only the field.
    rc, _, err = cli(capsys, "check", str(write(tmp_path, mini_config(tmp_path))), "--set", setting)
    assert rc == 2
    errors = [line for line in err.splitlines() if line.startswith("igrpo: error: ")]
    assert len(errors) == 1 and errors[0].startswith(f"igrpo: error: problems.arithmetic: {expected}"), err


# --- a YAML key given twice -------------------------------------------------------------------------------

DUPLICATES = {
    "section": ("run:\n  name: mini\ngrpo:\n  beta: 0.1\nrun:\n  seed: 3\n", "run: given twice, at line 1 and line 5"),
    "field": ("run:\n  name: mini\n  rounds: 2\n  name: other\n", "run.name: given twice, at line 2 and line 4"),
    "nested": ("policy:\n  tiny:\n    hidden_size: 64\n    num_layers: 2\n    hidden_size: 32\n",
               "policy.tiny.hidden_size: given twice, at line 3 and line 5"),
    "pass-through": ("grpo: {beta: 0.0, learning_rate: 1.0e-5, beta: 0.04}\n", "grpo.beta: given twice, at line 1 and line 1"),
}


@pytest.mark.parametrize("command", ["run", "check"])
@pytest.mark.parametrize("case", sorted(DUPLICATES))
def test_a_key_given_twice_names_it_and_both_lines(tmp_path, capsys, command, case):
    text, expected = DUPLICATES[case]
    path = write(tmp_path, text)
    rc, out, err = cli(capsys, command, str(path))
    assert rc == 2 and out == ""
    assert err == f"igrpo: error: {path}: {expected} (YAML would silently keep the last one; remove one of them)\n"
    assert tree(tmp_path) == {"run.yaml"}  # no run directory, no MLflow store


def test_the_same_key_in_two_sections_is_no_duplicate(tmp_path):
    path = write(tmp_path, "collect:\n  temperature: 0.9\neval:\n  temperature: 0.5\n")
    cfg = load_config(path, check_trl=False)
    assert (cfg.collect.temperature, cfg.eval.temperature) == (0.9, 0.5)


# --- an empty config --------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "\n\n", "# a comment only\n# and another\n", "---\n"],
                         ids=["empty", "blank", "comments", "bare-document"])
@pytest.mark.parametrize("command", ["run", "check"])
def test_an_empty_config_is_refused_saying_how_to_run_the_defaults(tmp_path, capsys, text, command):
    path = write(tmp_path, text)
    rc, out, err = cli(capsys, command, str(path))
    assert rc == 2 and out == ""
    assert err.startswith(f"igrpo: error: {path} is empty")
    assert "write `{}` in it" in err and "`run: {}`" in err
    assert tree(tmp_path) == {"run.yaml"}


@pytest.mark.parametrize("text", ["{}\n", "run: {}\n", "# every default\n{}\n"])
def test_what_the_empty_config_error_suggests_does_run_the_defaults(tmp_path, capsys, text):
    rc, out, err = cli(capsys, "check", str(write(tmp_path, text)))
    assert rc == 0, err
    assert yaml.safe_load(out)["run"] == {"name": "quickstart", "runs_dir": "runs", "seed": 0, "rounds": 3}
    assert tree(tmp_path) == {"run.yaml"}


# --- igrpo compare on something that is not a run --------------------------------------------------------


def assert_one_line_error(rc: int, err: str, *expected: str) -> None:
    assert rc == 2, err
    assert err.startswith("igrpo: error: ") and err.count("\n") == 1, err
    for text in expected:
        assert text in err, f"{text!r} not in {err!r}"


def test_compare_on_a_path_that_is_not_there_names_it(tmp_path, capsys):
    rc, _, err = cli(capsys, "compare", "./nothing_here")
    assert_one_line_error(rc, err, "'./nothing_here' is neither a run directory (no such path) nor an MLflow run id")
    assert tree(tmp_path) == set()  # not even MLflow's default store


def test_compare_on_a_folder_that_is_not_a_run_directory(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    rc, _, err = cli(capsys, "compare", "empty")
    assert_one_line_error(rc, err, "empty: no round-*/eval.json: not a run directory")


def test_compare_on_a_run_id_without_a_store(tmp_path, capsys):
    rc, _, err = cli(capsys, "compare", "0123456789abcdef0123456789abcdef")
    assert_one_line_error(rc, err, "no store at", "mlflow.db")
    assert tree(tmp_path) == set()


def test_compare_on_a_run_id_the_store_does_not_hold(tmp_path, capsys):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(uri).create_experiment("mini")
    rc, _, err = cli(capsys, "compare", "0123456789abcdef0123456789abcdef", "--tracking-uri", uri)
    assert_one_line_error(rc, err, f"MLflow run 0123456789abcdef0123456789abcdef not found at {uri}",
                          "give --tracking-uri where it was logged")


# --- igrpo compare: best-of-N and the RM-weighted vote ------------------------------------------------------


def test_compare_shows_best_of_n_and_the_weighted_vote_from_a_run_dir_and_from_its_mlflow_run(tmp_path, capsys):
    from pipeline import tracking
    from pipeline.rundir import write_json_atomic

    # Two rounds of eval.json as the eval phase writes them (figures made up; round 1 has no ORM).
    curve = {"pass@1": 0.5, "maj@1": 0.5, "pass@2": 0.75, "maj@2": 0.625}
    bon = {0: {"bon/prm@2": 0.6, "bon/prm_vote@2": 0.7, "bon/orm@2": 0.4, "bon/orm_vote@2": 0.45,
               "bon/majority@2": 0.55, "bon/random@2": 0.5},
           1: {"bon/prm@2": 0.65, "bon/prm_vote@2": 0.8, "bon/majority@2": 0.6, "bon/random@2": 0.52}}
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent = tracking.create_run(tracking.connect(uri, "mini"), "mini")
    for r in (0, 1):
        metrics = {"eval/greedy": 0.5, **{f"eval/{k}": v for k, v in curve.items()}, **bon[r], "monitor/prm_gap": 0.1}
        write_json_atomic(tmp_path / "mini" / f"round-00{r}" / "eval.json", {"round": r, "metrics": metrics,
                                                                             "curve": curve})
        tracking.log_metrics(parent, metrics, step=r)  # as the pipeline logs the cross-round figures
    tracking.finish(parent)
    assert "bon/prm_vote_at_2" in tracking.MlflowClient().get_run(parent).data.metrics  # MLflow's spelling

    rc, out, _ = cli(capsys, "compare", "mini", parent, "--tracking-uri", uri, "--out", "cmp.png")
    assert rc == 0
    passmaj, bon_table = out.split("\n\n")  # the Pass@K / Maj@K table, a blank line, the best-of-N table
    assert passmaj.splitlines()[0].split() == ["run", "round", "greedy", "pass@1", "maj@1", "pass@2", "maj@2"]
    *lines, plot = bon_table.splitlines()
    assert lines[0].startswith("best-of-N among the first N samples") and "_vote: its weighted vote" in lines[0]
    assert lines[1].split() == ["run", "round", "N", "orm", "orm_vote", "prm", "prm_vote", "majority", "random"]
    assert len(lines) == 2 + 2 * 2  # title, header, 2 rounds x N = 2 for each source
    by_dir, by_mlflow = lines[2:4], lines[4:6]
    assert by_dir[0].split() == ["mini", "0", "2", "0.400", "0.450", "0.600", "0.700", "0.550", "0.500"]
    assert by_dir[1].split() == ["mini", "1", "2", "-", "-", "0.650", "0.800", "0.600", "0.520"]
    assert [x.split()[1:] for x in by_mlflow] == [x.split()[1:] for x in by_dir]  # the same figures from MLflow
    assert plot.strip() == "plot: cmp.png" and (tmp_path / "cmp.png").stat().st_size > 1000


def test_compare_keeps_long_run_names_and_rm_kinds_apart():
    # Seen: "implicitimplicit_vote" in a header, and a 26-character run name against its round, in fixed columns.
    from pipeline.compare import tables_text

    name = "smollm2-arith-implicit-prime"
    text = tables_text([(name, {0: {"greedy": 0.5, "pass@1": 0.4, "maj@1": 0.4, "bon/implicit@4": 0.25,
                                    "bon/implicit_vote@4": 0.75, "bon/majority@4": 0.5}})])
    rounds, bon = (part.splitlines() for part in text.split("\n\n"))
    assert rounds[1].split() == [name, "0", "0.500", "0.400", "0.400"]
    assert bon[1].split() == ["run", "round", "N", "implicit", "implicit_vote", "majority"]
    assert bon[2].split() == [name, "0", "4", "0.250", "0.750", "0.500"]
    for lines in (rounds, bon[1:]):  # every figure ends under its column's name
        header = lines[0]
        for word in header.split()[1:]:
            end = header.index(f"{word} ") + len(word) if f"{word} " in header else len(header)
            assert all(line[end - 1] != " " and (end == len(line) or line[end] == " ") for line in lines[1:])
