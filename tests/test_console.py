"""What `igrpo run` prints: progress bars, one line per finished phase, the final table; no traceback, no warning.

The slow tests read the session's finished mini run (conftest.py's `mini_run`: the main command on the mini config
in a subprocess, as a user runs it, with none of the test suite's own quieting: conftest.py sets Prefect's and
tqdm's environment for in-process tests) and run a failing one.
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import pytest
import yaml

from pipeline.loading import config_from_dict
from pipeline.passthrough import grpo_config, sft_config
from tests.helpers import child_env, mini_config

PHASE_LINE = re.compile(r"^round (\d+)  (policy|collect|reward_model|eval) +\d+s  (.*)$", re.M)


def assert_quiet(output: str) -> None:
    for noise in ("Traceback", "Warning", "WARNING", "[transformers]", "database is locked", "Task run",
                  "Loading weights", "Creating initial MLflow database tables", "{'loss'", "'train_runtime'"):
        assert noise not in output, f"{noise!r} in the console:\n{output[-6000:]}"


# --- the main command on the mini config ----------------------------------------------------------------


@pytest.mark.slow  # the session's finished mini run: `igrpo run` in a subprocess, none of the suite's settings
def test_igrpo_run_prints_bars_one_line_per_phase_and_the_table(mini_run):
    from pipeline.rundir import read_json

    output, rounds = mini_run.output, mini_run.cfg.run.rounds
    assert_quiet(output)
    # Progress bars: the trainers' and our sampling's.
    assert "MC rollouts:" in output and "eval samples:" in output and "it/s]" in output
    # One line per finished phase, in Algorithm 1's order, each with its key figures.
    lines = PHASE_LINE.findall(output)
    assert [(int(r), p) for r, p, _ in lines] == [(r, p) for r in range(rounds + 1) for p in ("policy", "collect",
                                                                                                 "reward_model", "eval")]
    figures = {(int(r), p): f for r, p, f in lines}
    assert figures[0, "policy"].startswith("sft/train_loss ")
    assert figures[1, "policy"].startswith("policy/reward_start ") and "policy/reward_end " in figures[1, "policy"]
    assert figures[1, "collect"].startswith("collect/samples 12  collect/verifier_accuracy ")
    assert figures[0, "reward_model"].startswith("prm/step_auc_mc ") and "orm/auc " in figures[0, "reward_model"]
    assert re.fullmatch(r"eval/greedy [\d.]+  eval/pass@1 [\d.]+  eval/maj@4 [\d.]+  eval/pass@4 [\d.]+",
                        figures[1, "eval"])
    # The final tables: a row per round; best-of-N, a row per round and N; then where the run and its MLflow runs are.
    table = output[output.index("run                      round"):].splitlines()
    assert table[0].split() == ["run", "round", "greedy", "pass@1", "maj@1", "pass@2", "maj@2", "pass@4", "maj@4"]
    end = 1 + rounds + 1
    assert [row.split()[:2] for row in table[1:end]] == [["mini", str(r)] for r in range(rounds + 1)]
    assert table[end] == "" and table[end + 1].startswith("best-of-N among the first N samples")
    bon = table[end + 2 :]
    assert bon[0].split() == ["run", "round", "N", "orm", "orm_vote", "prm", "prm_vote", "majority", "random"]
    n_rows = 2 * (rounds + 1)
    assert [row.split()[:3] for row in bon[1 : 1 + n_rows]] == [["mini", str(r), str(n)] for r in range(rounds + 1)
                                                                for n in (2, 4)]
    # The last round against round 0, paired per eval problem: the gain a newcomer reads first, and its SE.
    assert re.fullmatch(rf"mini: maj@4 round {rounds} - round 0 = [+-][\d.]+, paired SE [\d.]+ over 8 eval problems"
                        r"( \([+-][\d.]+ SE\))?", bon[1 + n_rows])
    assert bon[2 + n_rows].startswith(f"run directory: {mini_run.cfg.run_dir}")
    parent = read_json(mini_run.cfg.run_dir / "manifest.json")["mlflow"]["parent"]
    assert bon[3 + n_rows].startswith(f"MLflow: parent run {parent}, experiment 'mini'")


@pytest.mark.slow
@pytest.mark.usefixtures("isolated", "prefect_harness")
def test_a_failing_phase_still_shows_its_error(tmp_path, monkeypatch, capfd):
    """The quieting must not hide a real error: a phase that raises prints it (and where), the run stops. `igrpo
    run` in this process (its console set up as in a terminal; captured at the file descriptors, where Prefect's
    handler writes), on the session's Prefect server (the session's mini run starts the run's own)."""
    import pipeline.bootstrap
    from flows.cli import main

    def broken(*a, **k):
        raise RuntimeError("the disk caught fire")

    monkeypatch.setattr(pipeline.bootstrap, "run_bootstrap", broken)
    config = tmp_path / "mini.yaml"
    config.write_text(yaml.safe_dump(mini_config(tmp_path)))
    # Prefect sets its console handlers up once a process, on the stderr of that moment: after an earlier test's
    # in-process flow (the GSM8K recipe's, say), that test's capture. Point them at this stderr, as in a fresh process.
    from prefect.logging.handlers import PrefectConsoleHandler
    for h in {h for name in ("", "prefect", "prefect.flow_runs", "prefect.task_runs")
              for h in logging.getLogger(name).handlers if isinstance(h, PrefectConsoleHandler)}:
        monkeypatch.setattr(h, "stream", sys.stderr)
        monkeypatch.setattr(h.console, "file", sys.stderr)
    capfd.readouterr()
    with pytest.raises(RuntimeError, match="the disk caught fire"):  # out of igrpo: Python prints it and exits 1
        main(["run", str(config)])
    said = "".join(capfd.readouterr())
    assert "RuntimeError: the disk caught fire" in said  # and the console showed it as it happened,
    assert "Traceback" in said and "in broken" in said  # with where it was raised
    assert not PHASE_LINE.search(said)  # no phase finished
    assert not (tmp_path / "runs" / "mini" / ".lock").exists()


# --- the pieces, in-process -----------------------------------------------------------------------------


def test_trl_configs_are_built_without_the_deprecated_checkpointing_name():
    # A real model keeps TRL's default (the tiny policy trains without checkpointing: test_config.py).
    cfg = config_from_dict(mini_config(Path("unused"), policy={"model": "org/some-model"}), check_trl=False)
    with warnings.catch_warnings(record=True) as seen, tempfile.TemporaryDirectory() as tmp:
        warnings.simplefilter("always")
        built = [grpo_config(cfg, tmp), sft_config(cfg, tmp)]
    assert [str(w.message) for w in seen if "checkpointing" in str(w.message)] == []
    for args in built:  # TRL's default, unchanged: the same training as before, under the new name
        assert args.activation_checkpointing is True and args.gradient_checkpointing is True


@pytest.mark.parametrize("value", [False, True])
def test_a_users_gradient_checkpointing_is_kept(value):
    data = mini_config(Path("unused"), grpo={"gradient_checkpointing": value},
                       bootstrap={"sft_args": {"gradient_checkpointing": value}})
    cfg = config_from_dict(data, check_trl=False)
    with tempfile.TemporaryDirectory() as tmp:
        for args in (grpo_config(cfg, tmp), sft_config(cfg, tmp)):
            assert args.activation_checkpointing is value and args.gradient_checkpointing is value


def test_phase_line_shows_the_phase_and_its_key_figures():
    from pipeline.phases import phase_line

    metrics = {"eval/greedy": 0.745, "eval/pass@1": 0.6694, "eval/maj@4": 0.7, "eval/maj@16": 0.80625,
               "eval/pass@16": 0.97, "eval/completions_per_s": 412.0, "bon/prm@4": 0.76}
    assert phase_line(3, "eval", 12.4, metrics) == (
        "round 3  eval            12s  eval/greedy 0.745  eval/pass@1 0.669  eval/maj@16 0.806  eval/pass@16 0.970")
    # A count shows as an integer; a figure the phase did not produce (no gold labels) is left out.
    assert phase_line(0, "collect", 61, {"collect/samples": 1536.0, "collect/verifier_accuracy": 0.625}) == (
        "round 0  collect         61s  collect/samples 1536  collect/verifier_accuracy 0.625")


def test_a_phase_done_before_is_one_skip_line(tmp_path, caplog):
    from pipeline.rounds import run_phase
    from pipeline.rundir import Manifest, RunDir

    cfg = config_from_dict(mini_config(tmp_path), check_trl=False)
    shard = str(RunDir(cfg.run_dir).shard(0))
    Manifest(cfg.run_dir, {"config": {}, "phases": {}, "mlflow": {}}).record(0, "collect", {"metrics": {}, "path": shard})
    with caplog.at_level("INFO", logger="pipeline.rounds"):
        assert run_phase(cfg, 0, "collect").path == shard
    assert [r.getMessage() for r in caplog.records] == ["round 0  collect       done before: skipped"]


PREFECT_DEFAULTS = """
import os, sys
from flows.console import prefect_defaults
from prefect.settings import get_current_settings
case = sys.argv[1]
if case == "profile":
    open(os.environ["PREFECT_PROFILES_PATH"], "w").write(
        'active = "mine"\\n[profiles.mine]\\nPREFECT_SERVER_ANALYTICS_ENABLED = "true"\\n')
prefect_defaults()
print(os.environ.get("PREFECT_SERVER_ANALYTICS_ENABLED"), get_current_settings().server.analytics_enabled,
      os.environ.get("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL"))
"""


@pytest.mark.slow  # a subprocess
def test_prefect_analytics_are_off_unless_the_user_turned_them_on(tmp_path):
    results = {}
    for case, extra in (("nothing", {}), ("env", {"PREFECT_SERVER_ANALYTICS_ENABLED": "true"}),
                        ("profile", {"PREFECT_PROFILES_PATH": str(tmp_path / "profiles.toml")})):
        env = child_env(user_home=tmp_path, **extra)
        proc = subprocess.run([sys.executable, "-c", PREFECT_DEFAULTS, case], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        results[case] = proc.stdout.split()
    assert results["nothing"] == ["false", "False", "WARNING"]  # ours: off, in this process and the server's env
    assert results["env"] == ["true", "True", "WARNING"]  # the user's, kept
    assert results["profile"] == ["None", "True", "WARNING"]  # the profile's, not overridden from the environment
