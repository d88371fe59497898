"""SIGINT and SIGTERM stop `igrpo run` within seconds at any phase, and a SIGKILL anywhere leaves a run that
resumes: to the same figures, with nothing lost, redone or doubled.

Small subprocesses drive `flows.signals.stop_on_signals` (a cleanup that finishes, one that hangs, a second
signal); in-process tests hit the windows a signal can land in (an MLflow read, a phase run just created, an
exception swallowed); one chain stops a real `igrpo run` again and again (tests/helpers.py's `stop_run`: a
subprocess of its own session, its process group killed after it): signalled in SFT as a terminal does (Ctrl-C to
the whole process group) and in GRPO as `timeout` and systemd do, then SIGKILLed inside round 1's RM training,
each resume stopped one phase further.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from pipeline.loading import config_from_dict
from pipeline.phases import PHASES
from pipeline.rounds import open_run
from pipeline.rundir import Manifest, last_checkpoint, phase_key, read_json
from tests.helpers import NAME, SIZES, assert_complete_run, child_env, mini_config, mlflow_structure, stop_run

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
    proc = subprocess.Popen([sys.executable, "-c", STOPPABLE, mode, str(grace), str(tmp_path)], env=child_env(),
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not (tmp_path / "working").exists():
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read() if proc.poll() is not None else ""
        time.sleep(0.02)
    return proc


@pytest.mark.slow  # a subprocess
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_unwinds_the_body(tmp_path, signum):
    proc = _stoppable(tmp_path, "clean", grace=30)
    proc.send_signal(signum)
    assert proc.wait(timeout=20) == 128 + signum
    assert (tmp_path / "cleaned").exists() and not (tmp_path / "tidied").exists()
    assert f"igrpo: {signal.Signals(signum).name}: stopping" in proc.stderr.read()


@pytest.mark.slow  # a subprocess
@pytest.mark.parametrize("mode", ["swallowed", "swallowed-in-flow"])
def test_a_signal_swallowed_by_a_weakref_callback_still_stops(tmp_path, mode):
    """Seen in GRPO: the KeyboardInterrupt landed in a WeakSet callback, Python printed and dropped it, and the run
    went on to finish. And in collection, inside a flow: Prefect's TerminationSignal, dropped the same way before
    our watchdog thread had seen the signal."""
    proc = _stoppable(tmp_path, mode, grace=300)
    assert proc.wait(timeout=20) == 128 + signal.SIGTERM
    assert (tmp_path / "cleaned").exists() and not (tmp_path / "tidied").exists()
    assert "Traceback" not in proc.stderr.read()


@pytest.mark.slow  # a subprocess
def test_a_cleanup_that_hangs_is_cut_after_the_grace(tmp_path):
    proc = _stoppable(tmp_path, "hang", grace=1.0)
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 128 + signal.SIGTERM
    assert 0.9 < time.monotonic() - start < 15
    assert (tmp_path / "tidied").exists() and not (tmp_path / "cleaned").exists()
    assert "cleanup still running after 1 s" in proc.stderr.read()


EPHEMERAL = """
import sys
from prefect.settings import PREFECT_API_URL, temporary_settings
from flows.signals import ephemeral_server_apart
with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:9/api"}):  # a server of the user's
    ephemeral_server_apart()
print("prefect.server.api.server" in sys.modules)
ephemeral_server_apart()  # none: Prefect would start its own, so ours is set apart
from prefect.server.api import server
print(type(server.SubprocessASGIServer._instances.get(None)).__name__)
"""


@pytest.mark.slow  # a subprocess
def test_a_run_on_a_users_server_sets_up_no_ephemeral_one(tmp_path):
    # Importing Prefect's server app costs 1-2 s of every `igrpo run`'s start: paid only where Prefect starts one.
    proc = subprocess.run([sys.executable, "-c", EPHEMERAL], env=child_env(user_home=tmp_path), cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["False", "Apart"]


@pytest.mark.slow  # a subprocess
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


def _round_zero_config(tmp_path):
    """mini_config with round 0's training as cheap as a real one gets (the tests below run it up to a signal):
    the smallest policy, one SFT step."""
    return config_from_dict(mini_config(tmp_path, policy={"tiny": dict(SIZES["tiny"])},
                                        bootstrap={"sft_args": {"max_steps": 1, "per_device_train_batch_size": 8}}))


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

# Every stop of one run directory, in run order, each resume stopped again further on: (round, phase, signal, to
# the whole process group, where). "step": as soon as a trainer step of the phase begins (inside the training loop);
# "start": as soon as the phase's MLflow run is recorded; (module, attribute, needle): that call blocks for good
# and the run is SIGKILLed there, the phase half done. A signal to the whole group reaches the run's own ephemeral
# Prefect server too, as a terminal's does; the other runs use the session's server, as runs with PREFECT_API_URL
# set do (the 10-20 s of a server start saved).
STOPS = [
    (0, "policy", signal.SIGINT, True, "step"),  # SFT; Ctrl-C in a terminal reaches Prefect's server too
    # GRPO; SIGTERM as `kill`, `timeout`, systemd, Kubernetes send it (SIGKILLed in its loop: test_resume.py's GRPO
    # test). Round 0's collect, stopped as it started, was a stop here too until 2026-12-06: ~11 s of the suite's
    # 10 minutes for the same handler at another phase (test_resume.py: SIGTERM in a step longer than the grace).
    (1, "policy", signal.SIGTERM, False, "step"),
    # collect: not stopped here since 2026-12-06 (~11 s): a SIGKILL with every sample labelled and the shard not yet
    # written left the phase unrecorded and was redone whole, as the reward_model stop below shows for a phase's
    # half-written outputs (test_resume.py: a collection stopped after a part resumes after it).
    # reward_model: the PRM trained and saved, the ORM trained but not saved
    (1, "reward_model", signal.SIGKILL, False, ("pipeline.reward_model", "save_reward_model", "round-001/reward_model/orm")),
    # eval: not stopped here (~13 s a stop). A SIGKILL there, after eval.json and before its record, was this
    # chain's collect stop again: a phase's output partly written, its record and MLflow logging not; redone whole.
]
ORDER = [phase_key(r, p) for r in (0, 1) for p in ("policy", "collect", "reward_model", "eval")]


def _inside(manifest_path: Path, key: str):
    def ready() -> bool:
        try:
            m = read_json(manifest_path)
        except (FileNotFoundError, ValueError):
            return False
        return key in m["mlflow"] and key not in m["phases"]
    return ready


def _figures(run_dir: Path, rounds: int) -> dict:
    """Every recorded phase's metrics of rounds 0..`rounds`, timings left out (the machine's, not the run's)."""
    phases = read_json(run_dir / "manifest.json")["phases"]
    return {key: {k: v for k, v in out["metrics"].items() if not k.endswith(("_per_s", "seconds"))}
            for key, out in phases.items() if int(key.split("/")[0].split("-")[1]) <= rounds}


def _assert_nothing_redone(before: dict, after: dict, stopped: str | None) -> None:
    """Phases finished before a stop keep their recorded outputs; the stopped phase's MLflow run is reused."""
    for key, output in before["phases"].items():
        assert after["phases"][key] == output, key  # finished phases were not redone
    if stopped is not None:
        assert after["mlflow"][stopped] == before["mlflow"][stopped], stopped


@pytest.mark.slow
@pytest.mark.usefixtures("isolated")
def test_stopped_phase_after_phase_then_resumed_to_the_figures_of_an_uninterrupted_run(tmp_path, prefect_harness,
                                                                                     mlflow_tmp, mini_run):
    """`igrpo run` stopped inside round 0 (SIGINT in SFT) and inside round 1 (SIGTERM in GRPO's training loop, then
    SIGKILL held inside reward_model with its work half done), each
    resume stopped again further on, all in one run directory; a last, in-process rerun finishes the run. Every
    stop within seconds, cleanly or (SIGKILL) with a stale lock that the next run takes over; nothing lost, redone
    or doubled; the figures those of the session's uninterrupted mini run (the same config, one round less)."""
    from prefect.settings import PREFECT_API_URL

    from flows.iterative import iterative_rl

    data = mini_config(tmp_path, run={"rounds": 1})
    cfg = config_from_dict(data)
    manifest = cfg.run_dir / "manifest.json"
    before, stopped_last = {"phases": {}, "mlflow": {}}, None
    for r, phase, signum, group, where in STOPS:
        key = phase_key(r, phase)
        hold = where if isinstance(where, tuple) else None
        stopped = stop_run(tmp_path, data, hold=hold, ready=None if hold else _inside(manifest, key),
                           in_steps=where == "step", signum=signum, group=group,
                           prefect_api=None if group else PREFECT_API_URL.value())
        at = f"{signal.Signals(signum).name} in round {r}'s {phase}"
        assert stopped.reached, f"the run ended or stalled (rc {stopped.returncode}) before {at}:\n{stopped.log}"
        m = read_json(manifest)
        # Inside the phase: every phase before it done, it not (its MLflow run recorded), nothing before redone.
        assert [k for k in ORDER if k in m["phases"]] == ORDER[: ORDER.index(key)], at
        assert key in m["mlflow"], at
        _assert_nothing_redone(before, m, stopped_last)
        if signum == signal.SIGKILL:
            assert stopped.returncode == -signal.SIGKILL, f"{at}: rc {stopped.returncode}\n{stopped.log}"
            assert (cfg.run_dir / ".lock").exists(), at  # left by the dead process: a stale lock
        else:  # stopped on its own, within seconds, cleanly, saying how to resume
            assert stopped.returncode == 128 + signum, f"{at}: rc {stopped.returncode}\n{stopped.log}"
            assert stopped.seconds < 30, at
            assert "Traceback" not in stopped.log, stopped.log
            assert "resumes it" in stopped.log
            assert not (cfg.run_dir / ".lock").exists(), at
            # Nothing half-written; a trainer's scratch folder stays only with a whole checkpoint to resume from.
            kept = [p for p in cfg.run_dir.rglob(".trainer-*") if last_checkpoint(p)]
            leftovers = [str(p.relative_to(cfg.run_dir)) for p in cfg.run_dir.rglob(".*")
                         if not any(p == k or k in p.parents for k in kept)]
            assert leftovers == [], f"{at}: half-written {leftovers}"
            if (r, phase) == (1, "policy"):  # GRPO saved a checkpoint at the step it was stopped in
                assert kept, f"{at}: no checkpoint to resume from"
            client = MlflowClient(cfg.tracking.tracking_uri)
            for run in ("parent", phase_key(r), key):
                assert client.get_run(m["mlflow"][run]).info.status == "KILLED", (at, run)
        before, stopped_last = m, key

    iterative_rl(cfg.model_dump(mode="json"))  # resumes, taking over the stale lock, and runs to the end
    assert_complete_run(cfg, NAME)
    _assert_nothing_redone(before, read_json(manifest), stopped_last)
    assert not (cfg.run_dir / ".lock").exists()
    leftovers = [str(p.relative_to(cfg.run_dir)) for p in cfg.run_dir.rglob(".*")]
    assert leftovers == []  # no temp file, temp checkpoint or trainer scratch dir left behind
    runs = mlflow_structure(NAME)["all"].values()
    assert {r.info.run_name: r.info.status for r in runs if r.info.status != "FINISHED"} == {}
    for kind in ("prm", "orm"):  # one version per round and kind: the attempt killed in reward_model registered none
        versions = MlflowClient().search_model_versions(f"name='mini-mini-{kind}'")
        assert sorted(v.tags["round"] for v in versions) == ["0", "1"]
    assert _figures(cfg.run_dir, 1) == _figures(mini_run.cfg.run_dir, 1)


@pytest.mark.usefixtures("isolated")
@pytest.mark.parametrize("where", ["reopen", "model_run"])
def test_a_signal_right_after_a_phase_run_is_created_still_ends_it_killed(tmp_path, monkeypatch, where):
    """The window the slow test above hit under load: the phase's MLflow run is recorded, and the signal lands
    before the phase's body (reopening the run, or creating the RM phase's run per model): every run the
    manifest records that had not finished ends KILLED, none is left RUNNING."""
    from pipeline import rounds, tracking

    cfg = _round_zero_config(tmp_path)
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
        rounds.run_rounds(cfg, checked=True)  # round 0's recorded outputs are stand-ins: no preflight
    runs = read_json(cfg.run_dir / "manifest.json")["mlflow"]
    assert phase_key(0, phase) in runs
    statuses = {key: MlflowClient().get_run(run_id).info.status for key, run_id in runs.items()}
    assert statuses[phase_key(0, phase)] == "KILLED" and "RUNNING" not in statuses.values(), statuses


@pytest.mark.usefixtures("isolated")
def test_a_signal_whose_exception_is_swallowed_stops_the_run_at_the_phase_end(tmp_path, monkeypatch):
    """Seen in CI: a SIGTERM in collection whose exception library code caught on the way, and the run went on to
    finish (rc 0). The watchdog saw the signal: the phase that ran is not recorded and the run stops there."""
    from flows.signals import stop_on_signals
    from pipeline import rounds
    from pipeline.rundir import STOP

    cfg = _round_zero_config(tmp_path)
    real = rounds.execute

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

    monkeypatch.setattr(rounds, "execute", swallowing)
    with stop_on_signals(grace_s=300) as stopper, pytest.raises(KeyboardInterrupt) as stopped:
        rounds.run_rounds(cfg)
    assert stopper.exit_code(stopped.value) == 128 + signal.SIGTERM and not STOP.is_set()
    m = read_json(cfg.run_dir / "manifest.json")
    assert phase_key(0, "policy") in m["phases"] and phase_key(0, "collect") not in m["phases"]
    assert phase_key(0, "reward_model") not in m["mlflow"]  # no phase started after it
    statuses = {key: MlflowClient().get_run(run_id).info.status for key, run_id in m["mlflow"].items()}
    assert statuses[phase_key(0, "collect")] == "KILLED" and "RUNNING" not in statuses.values(), statuses


def test_a_run_writes_its_store_while_another_connection_reads_it(mlflow_tmp):
    """A read left open on a sqlite store (MLflow's UI or `igrpo compare` reading it, a cursor an interrupted read
    left alive in a thread or frame) held SQLite's shared lock, and every write of the run waited MLflow's 20 s busy
    timeout and failed: seen in CI, a SIGTERM's cleanup ending the phase's runs KILLED ran out its grace and the run's
    last words were SQLAlchemy's "database is locked". `connect` puts a sqlite store in WAL mode, where readers do
    not block the writer."""
    import sqlite3

    from pipeline import tracking

    run_id = tracking.create_run(tracking.connect(mlflow_tmp, "readers"), "run")
    with contextlib.closing(sqlite3.connect(mlflow_tmp.removeprefix("sqlite:///"))) as reader:
        rows = reader.execute("SELECT run_uuid FROM runs UNION ALL SELECT run_uuid FROM runs")
        rows.fetchone()  # mid-read: the statement, and its lock, stay open
        tracking.log_metrics(run_id, {"x": 1.0})
        tracking.finish(run_id, "KILLED")
    run = MlflowClient().get_run(run_id)
    assert (run.info.status, run.data.metrics) == ("KILLED", {"x": 1.0})


def test_a_store_on_a_network_filesystem_keeps_sqlites_default_mode(mlflow_tmp, monkeypatch):
    """WAL mode needs every process on one host (its index is shared memory): a store on NFS, which processes on
    other hosts may open, stays in the default rollback mode; on a local disk it is WAL."""
    import sqlite3

    from pipeline import tracking

    def journal_mode(path: str) -> str:
        with contextlib.closing(sqlite3.connect(path)) as db:
            return db.execute("PRAGMA journal_mode").fetchone()[0]

    local = mlflow_tmp.removeprefix("sqlite:///")
    tracking.connect(mlflow_tmp, "local")
    assert journal_mode(local) == "wal"
    monkeypatch.setattr(tracking, "filesystem_type", lambda path: "nfs4")
    shared = str(Path(local).with_name("shared.db"))
    tracking.connect(f"sqlite:///{shared}", "shared")
    assert journal_mode(shared) == "delete"


# --- a kill between creating an MLflow run and recording it --------------------------------------------------


@pytest.mark.usefixtures("isolated")
def test_a_kill_after_an_mlflow_run_is_created_but_not_recorded_does_not_double_it(tmp_path, monkeypatch):
    """Seen in `python -m bench.faults --kills 2 --seed 4`: a SIGKILL at start-up, after the parent run was created and
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
