"""SIGINT and SIGTERM stop `igrpo run` within seconds at any phase, leaving a run that resumes to the same figures.

The fast tests drive `flows.signals.stop_on_signals` in a small subprocess (a cleanup that finishes, one that
hangs, a second signal); the slow one signals a real `igrpo run` in SFT, collection, RM training and GRPO,
as a terminal (Ctrl-C to the whole process group), `timeout` and systemd do, then resumes it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from pipeline.loading import config_from_dict
from pipeline.rundir import phase_key, read_json
from tests._harness import ROOT, assert_complete_run, mlflow_structure, sigkill_run
from tests.conftest import mini_config

# A body that works until signalled; its cleanup then finishes ("clean") or never ends ("hang").
STOPPABLE = """
import pathlib, sys, time
from flows.signals import stop_on_signals
mode, grace, out = sys.argv[1], float(sys.argv[2]), pathlib.Path(sys.argv[3])
with stop_on_signals(grace_s=grace) as stopper:
    stopper.at_hard_exit(lambda: (out / "tidied").touch())
    try:
        (out / "working").touch()
        if mode.startswith("swallowed"):  # the signal lands while Python runs a weakref callback, which drops
            import contextlib, os, signal, weakref  # exceptions; "swallowed-in-flow": Prefect's SIGTERM bridge
            from prefect.utilities.engine import capture_sigterm  # (a flow's) takes it, not our handler
            class Obj: pass
            with capture_sigterm() if mode == "swallowed-in-flow" else contextlib.nullcontext():
                obj = Obj()
                ref = weakref.ref(obj, lambda _: (os.kill(os.getpid(), signal.SIGTERM), time.sleep(0.5)))
                del obj
                time.sleep(600)
        time.sleep(600)
    except BaseException as e:
        if mode == "hang":
            time.sleep(600)
        (out / "cleaned").touch()
        sys.exit(stopper.exit_code(e))
"""


def _stoppable(tmp_path, mode: str, grace: float) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", STOPPABLE, mode, str(grace), str(tmp_path)], env=env,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not (tmp_path / "working").exists():
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read() if proc.poll() is not None else ""
        time.sleep(0.02)
    return proc


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_unwinds_the_body(tmp_path, signum):
    proc = _stoppable(tmp_path, "clean", grace=30)
    proc.send_signal(signum)
    assert proc.wait(timeout=20) == 128 + signum
    assert (tmp_path / "cleaned").exists() and not (tmp_path / "tidied").exists()
    assert f"igrpo: {signal.Signals(signum).name}: stopping" in proc.stderr.read()


@pytest.mark.parametrize("mode", ["swallowed", "swallowed-in-flow"])
def test_a_signal_swallowed_by_a_weakref_callback_still_stops(tmp_path, mode):
    """Seen in GRPO: the KeyboardInterrupt landed in a WeakSet callback, Python printed and dropped it, and the run
    went on to finish. And in collection, inside a flow: Prefect's TerminationSignal, dropped the same way before
    our watchdog thread had seen the signal."""
    proc = _stoppable(tmp_path, mode, grace=300)
    assert proc.wait(timeout=20) == 128 + signal.SIGTERM
    assert (tmp_path / "cleaned").exists() and not (tmp_path / "tidied").exists()
    assert "Traceback" not in proc.stderr.read()


def test_a_cleanup_that_hangs_is_cut_after_the_grace(tmp_path):
    proc = _stoppable(tmp_path, "hang", grace=1.0)
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 128 + signal.SIGTERM
    assert 0.9 < time.monotonic() - start < 15
    assert (tmp_path / "tidied").exists() and not (tmp_path / "cleaned").exists()
    assert "cleanup still running after 1 s" in proc.stderr.read()


def test_a_second_ctrl_c_exits_at_once(tmp_path):
    proc = _stoppable(tmp_path, "hang", grace=300)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    start = time.monotonic()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=20) == 128 + signal.SIGINT
    assert time.monotonic() - start < 10  # not the 300 s grace
    assert (tmp_path / "tidied").exists()
    assert "a second signal" in proc.stderr.read()


def _terminated():
    from prefect.exceptions import TerminationSignal

    return TerminationSignal(signal.SIGTERM)


@pytest.mark.parametrize("in_active", [False, True], ids=["", "active"])
@pytest.mark.parametrize("stop", [KeyboardInterrupt, _terminated], ids=["SIGINT", "SIGTERM-in-a-flow"])
def test_a_signal_inside_an_mlflow_read_still_ends_the_run_killed(mlflow_tmp, monkeypatch, stop, in_active):
    """Seen in the RM phase: the signal landed in `mlflow.start_run`'s read of the run, just after SQLite had
    stepped the cursor. The cursor lived on in the exception's traceback with SQLite's shared lock, so ending the
    run KILLED waited MLflow's 20 s busy timeout, failed, and the run was left RUNNING (the stop's grace ran out
    too). "active": the same inside a phase's body, its run the active one (`tracking.active`), which ends it on
    the way out before `ending` does: seen in collection, the wait then replaced the stop by SQLAlchemy's
    "database is locked" and the run's last words were a traceback instead of how to resume."""
    from sqlalchemy.engine.default import DefaultDialect

    from pipeline import tracking

    client = MlflowClient()
    run_id = client.create_run(client.create_experiment("stop")).info.run_id
    real, error = DefaultDialect.do_execute, stop()

    def interrupted(self, cursor, statement, parameters, context=None):
        real(self, cursor, statement, parameters, context)
        if statement.lstrip().upper().startswith("SELECT") and "FROM runs" in statement:
            monkeypatch.setattr(DefaultDialect, "do_execute", real)
            raise error  # where a signal handler raises: between two bytecodes, the cursor stepped

    with pytest.raises(type(error)), tracking.ending(run_id), tracking.active(run_id if in_active else None):
        monkeypatch.setattr(DefaultDialect, "do_execute", interrupted)
        client.get_run(run_id)
    assert client.get_run(run_id).info.status == "KILLED"


# ---------------------------------------------------------------------------------------------- a real run

# Where each stop lands, in run order: (round, phase, signal, to the whole process group, seconds after the
# phase's MLflow run appears). The trainers are sized to last several seconds, so 0.5 s in is inside their
# steps; collection is over in about a second here, so its signal goes at once (into its model load and first
# batch), and the test checks that the phase did not finish first. A signal to the whole group reaches the run's
# own ephemeral Prefect server too, as a terminal's does; the others run on the session's server (the 10-20 s
# of a server start saved).
STOPS = [
    (0, "policy", signal.SIGINT, True, 0.5),  # SFT; Ctrl-C in a terminal reaches Prefect's server too
    (0, "collect", signal.SIGTERM, False, 0.0),  # `timeout`, Kubernetes
    (0, "reward_model", signal.SIGTERM, False, 0.5),  # `kill`, systemd (KillMode=mixed)
    (1, "policy", signal.SIGINT, False, 0.5),  # GRPO
]


def _config(tmp_path) -> dict:
    return mini_config(
        tmp_path, run={"rounds": 1},
        bootstrap={"sft_args": {"learning_rate": 3e-3, "num_train_epochs": 4, "per_device_train_batch_size": 32}},
        grpo={"max_steps": 4},
        collect={"prompts_per_round": 16},
        reward_model={"train_args": {"learning_rate": 1e-3, "num_train_epochs": 3, "per_device_train_batch_size": 8}},
    )


def _inside(manifest_path: Path, r: int, phase: str):
    def ready() -> bool:
        try:
            m = read_json(manifest_path)
        except (FileNotFoundError, ValueError):
            return False
        return phase_key(r, phase) in m["mlflow"] and phase_key(r, phase) not in m["phases"]
    return ready


def _figures(run_dir: Path) -> dict:
    """Every recorded phase's metrics, timings left out (the machine's, not the run's)."""
    phases = read_json(run_dir / "manifest.json")["phases"]
    return {key: {k: v for k, v in out["metrics"].items() if not k.endswith(("_per_s", "seconds"))}
            for key, out in phases.items()}


@pytest.mark.slow
@pytest.mark.usefixtures("isolated")
def test_signals_in_each_phase_then_resume(tmp_path, prefect_harness):
    from prefect.settings import PREFECT_API_URL

    from flows.iterative import iterative_rl

    data = _config(tmp_path / "stopped")
    cfg = config_from_dict(data)
    manifest = cfg.run_dir / "manifest.json"
    for r, phase, signum, group, settle in STOPS:
        stopped = sigkill_run(tmp_path, data, ready=_inside(manifest, r, phase), settle=settle, signum=signum,
                              group=group, prefect_api=None if group else PREFECT_API_URL.value())
        where = f"{signal.Signals(signum).name} in round {r}'s {phase}"
        assert stopped.reached, f"the run ended before {where}:\n{stopped.log}"
        assert stopped.returncode == 128 + signum, f"{where}: rc {stopped.returncode}\n{stopped.log}"
        assert stopped.seconds < 30, where
        assert "Traceback" not in stopped.log, stopped.log
        assert "resumes it" in stopped.log
        m = read_json(manifest)
        assert phase_key(r, phase) not in m["phases"], f"{where}: the phase finished before the signal"
        assert not (cfg.run_dir / ".lock").exists()
        leftovers = [str(p.relative_to(cfg.run_dir)) for p in cfg.run_dir.rglob(".*")]
        assert leftovers == [], f"{where}: half-written {leftovers}"
        client = MlflowClient(cfg.tracking.tracking_uri)
        for key in ("parent", phase_key(r), phase_key(r, phase)):
            assert client.get_run(m["mlflow"][key]).info.status == "KILLED", (where, key)

    iterative_rl(cfg.model_dump(mode="json"))  # the last resume runs to the end
    assert_complete_run(cfg, "mini")
    runs = mlflow_structure("mini")["all"].values()
    assert {r.info.run_name: r.info.status for r in runs if r.info.status != "FINISHED"} == {}

    reference = config_from_dict(_config(tmp_path / "uninterrupted"))
    iterative_rl(reference.model_dump(mode="json"))
    assert _figures(cfg.run_dir) == _figures(reference.run_dir)


@pytest.mark.usefixtures("isolated")
@pytest.mark.parametrize("where", ["reopen", "model_run"])
def test_a_signal_right_after_a_phase_run_is_created_still_ends_it_killed(tmp_path, monkeypatch, where):
    """The window the slow test above hit under load: the phase's MLflow run is recorded, and the signal lands
    before the phase's body (reopening the run, or creating the RM phase's run per model): every run the
    manifest records that had not finished ends KILLED, none is left RUNNING."""
    from pipeline import rounds, tracking

    cfg = config_from_dict(mini_config(tmp_path))
    rounds.open_run(cfg)
    if where == "reopen":
        real = tracking.reopen

        def interrupted(run_id):  # the phase run's reopen; the parent and round runs reopen as usual
            if "round-000/collect" in read_json(cfg.run_dir / "manifest.json")["mlflow"]:
                raise KeyboardInterrupt
            real(run_id)

        monkeypatch.setattr(tracking, "reopen", interrupted)
        phase = "collect"
    else:
        real_create = tracking.create_run

        def interrupted(experiment, name, parent=None, tags=None):  # the PRM's run, below the phase's
            if name.endswith("reward_model-prm"):
                raise KeyboardInterrupt
            return real_create(experiment, name, parent, tags)

        monkeypatch.setattr(tracking, "create_run", interrupted)
        phase = "reward_model"
        run = rounds.Manifest.load(cfg.run_dir)
        for done in ("policy", "collect"):  # round 0 as far as the RM phase, its outputs never read
            run.record(0, done, {"metrics": {}, "path": str(tmp_path)})
    with pytest.raises(KeyboardInterrupt):
        rounds.run_rounds(cfg)
    runs = read_json(cfg.run_dir / "manifest.json")["mlflow"]
    assert phase_key(0, phase) in runs
    statuses = {key: MlflowClient().get_run(run_id).info.status for key, run_id in runs.items()}
    assert statuses[phase_key(0, phase)] == "KILLED" and "RUNNING" not in statuses.values(), statuses


@pytest.mark.usefixtures("isolated")
def test_a_signal_whose_exception_is_swallowed_stops_the_run_at_the_phase_end(tmp_path, monkeypatch):
    """Seen in CI: a SIGTERM in collection whose exception library code caught on the way, and the run went on to
    finish (rc 0). The watchdog saw the signal: the phase that ran is not recorded and the run stops there."""
    from flows.signals import stop_on_signals
    from pipeline import phases, rounds
    from pipeline.rundir import STOP

    cfg = config_from_dict(mini_config(tmp_path))
    real = phases.execute

    def swallowing(cfg, name, runs, kwargs):
        result = real(cfg, name, runs, kwargs)
        if name == "collect":
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(30)  # the handler's KeyboardInterrupt lands here
            except BaseException:  # what the library code did
                pass
            assert STOP.wait(10)  # the watchdog's part
        return result

    monkeypatch.setattr(phases, "execute", swallowing)
    rounds.open_run(cfg)
    with stop_on_signals(grace_s=300) as stopper, pytest.raises(KeyboardInterrupt) as stopped:
        rounds.run_rounds(cfg)
    assert stopper.exit_code(stopped.value) == 128 + signal.SIGTERM and not STOP.is_set()
    m = read_json(cfg.run_dir / "manifest.json")
    assert phase_key(0, "policy") in m["phases"] and phase_key(0, "collect") not in m["phases"]
    assert phase_key(0, "reward_model") not in m["mlflow"]  # no phase started after it
    statuses = {key: MlflowClient().get_run(run_id).info.status for key, run_id in m["mlflow"].items()}
    assert statuses[phase_key(0, "collect")] == "KILLED" and "RUNNING" not in statuses.values(), statuses
