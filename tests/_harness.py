"""Drivers of whole runs for the tests: `igrpo run` in-process (a user error's exit code and message), in a
subprocess SIGKILLed or signalled at a chosen point (the one kill harness), and the check of a complete mini run."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import yaml
from mlflow import MlflowClient

from flows.cli import main
from pipeline.phases import PHASES
from pipeline.replay import read_shard
from pipeline.rundir import RunDir, phase_key, read_json
from pipeline.tracking import PARENT_TAG, metric_name

ROOT = Path(__file__).resolve().parent.parent
NAME = "mini"  # run.name of mini_config


# --- igrpo run in-process: user errors --------------------------------------------------------------------


def load_bench(name: str):
    """The script bench/<name>.py as a module, the session's environment and sys.path left as they were (the
    scripts quiet tqdm and logging for themselves and put bench/ on the path)."""
    import importlib.util

    env, path = dict(os.environ), list(sys.path)
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        os.environ.clear()
        os.environ.update(env)
        sys.path[:] = path


def run_cli(tmp_path, capsys, data, *sets: str) -> tuple[int, str]:
    """`igrpo run` in-process on `data` (a dict dumped as YAML, or raw text); (exit code, stderr)."""
    path = tmp_path / "run.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    capsys.readouterr()
    rc = main(["run", str(path), *[a for s in sets for a in ("--set", s)]])
    return rc, capsys.readouterr().err


def assert_user_error(tmp_path, rc: int, err: str, *expected: str) -> None:
    """rc 2, one `igrpo: error:` message containing every `expected` string, and no run directory."""
    assert rc == 2, err
    assert err.startswith("igrpo: error: "), err
    assert "Traceback" not in err
    for text in expected:
        assert text in err, f"{text!r} not in {err!r}"
    assert not (tmp_path / "runs" / NAME).exists()


# --- igrpo run in a subprocess, SIGKILLed ---------------------------------------------------------------

# Run by the subprocess: `igrpo run CONFIG`, optionally held for good inside one call (then killed there).
HOLD_THEN_RUN = """
import importlib, os, sys, time
config, marker, *hold = sys.argv[1:]
if hold:
    module, name, needle = hold
    mod = importlib.import_module(module)
    real = getattr(mod, name)
    def held(*args, **kwargs):
        if any(needle in str(a) for a in (*args, *kwargs.values()) if isinstance(a, (str, os.PathLike))):
            open(marker, "w").close()
            time.sleep(600)  # killed here
        return real(*args, **kwargs)
    setattr(mod, name, held)
from flows.cli import main
sys.exit(main(["run", config]))
"""


class Killed(NamedTuple):
    reached: bool  # the kill point was reached (False: the run ended or stalled before it)
    returncode: int | None  # -signal.SIGKILL when killed there; 128 + the signal when it stopped on its own
    log: str  # the tail of the run's stdout and stderr, for failure messages
    seconds: float | None = None  # from the signal to the process's exit


def sigkill_run(tmp_path, data: dict, *, hold: tuple[str, str, str] | None = None,
                ready: Callable[[], bool] | None = None, settle: float = 0.0, timeout: float = 400,
                signum: int = signal.SIGKILL, group: bool = False, prefect_api: str | None = None) -> Killed:
    """`igrpo run` on the config `data` in a subprocess, SIGKILLed (or sent `signum`) at a chosen point.

    hold: (module, function, needle): the first call of `module.function` whose arguments name a path
        containing `needle` blocks for good, and the run is killed there: deterministic, unlike a kill
        after a guessed delay.
    ready: otherwise, a predicate polled every 0.05 s; the run is killed `settle` seconds after it holds.
    signum, group: the signal, sent to the process or (as a terminal's Ctrl-C) to its whole process group;
        a run that has not exited 60 s after it is SIGKILLed.
    prefect_api: the URL of a running Prefect server for the run (as a user's PREFECT_API_URL); None: the run
        starts its own ephemeral server, as a first `igrpo run` does (10-20 s on a loaded 2-core machine).
    The subprocess has a session of its own; whatever it leaves (its Prefect server) is killed with its group.
    """
    path = tmp_path / "mini.yaml"
    path.write_text(yaml.safe_dump(data))
    marker = tmp_path / "held"
    marker.unlink(missing_ok=True)
    if hold is not None:
        ready = marker.exists
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-sub"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           # Prefect's default 20 s to start the run's own server is too short on a loaded machine (seen: the run
           # failed at connect, before any phase); 120 s as for the session's harness in conftest.py.
           "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120"}
    env.pop("PREFECT_API_URL", None)
    if prefect_api:
        env["PREFECT_API_URL"] = prefect_api
    log = tmp_path / "killed-run.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", HOLD_THEN_RUN, str(path), str(marker), *(hold or ())],
                                env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + timeout
    reached, seconds = False, None
    try:
        while time.time() < deadline and proc.poll() is None:
            if ready():
                reached = True
                time.sleep(settle)
                sent = time.monotonic()
                os.killpg(proc.pid, signum) if group else proc.send_signal(signum)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=60)
                seconds = time.monotonic() - sent
                break
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=60)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # what the dead run left behind
    return Killed(reached, proc.returncode, log.read_text(errors="replace")[-3000:], seconds)


# --- a complete mini run ----------------------------------------------------------------------------------


def mlflow_structure(experiment: str) -> dict:
    """Parent, round and phase runs of an experiment, by name."""
    exp = MlflowClient().get_experiment_by_name(experiment)
    runs = MlflowClient().search_runs([exp.experiment_id], max_results=1000)
    by_id = {r.info.run_id: r for r in runs}
    parents = [r for r in runs if PARENT_TAG not in r.data.tags]
    children = lambda pid: sorted(r.info.run_name for r in runs if r.data.tags.get(PARENT_TAG) == pid)
    rounds = {r.info.run_name: r.info.run_id for r in runs if r.data.tags.get(PARENT_TAG) in {p.info.run_id for p in parents}}
    return {"parents": parents, "rounds": rounds, "phases": {name: children(rid) for name, rid in rounds.items()},
            "all": by_id}


def assert_complete_run(cfg, experiment: str, maj_k: int = 4) -> None:
    """Every phase of every round done, one shard of M x G samples per round, one MLflow run per round and phase,
    and Maj@`maj_k` on the parent run once per round."""
    run_dir, rounds = cfg.run_dir, cfg.run.rounds
    manifest = read_json(run_dir / "manifest.json")
    assert set(manifest["phases"]) == {phase_key(r, p) for r in range(rounds + 1) for p in PHASES}
    # Each shard holds exactly M prompts x G samples of its own round.
    for r in range(rounds + 1):
        rows = read_shard(RunDir(run_dir).shard(r))
        assert len(rows) == cfg.collect.prompts_per_round * cfg.collect.samples_per_prompt
        assert {x["round"] for x in rows} == {r}
        assert len({(x["prompt_id"], x["sample_index"]) for x in rows}) == len(rows)
    s = mlflow_structure(experiment)
    assert len(s["parents"]) == 1
    assert sorted(s["rounds"]) == [f"round-{r:03d}" for r in range(rounds + 1)]
    for name, phases in s["phases"].items():
        assert phases == sorted(f"{name}-{p}" for p in PHASES)
    parent = s["parents"][0].info.run_id
    history = MlflowClient().get_metric_history(parent, metric_name(f"eval/maj@{maj_k}"))
    assert sorted(h.step for h in history) == list(range(rounds + 1))
