"""Faults of a team's setup (issue 48, point 4), on a real stack (`igrpo stack up`, 1 worker) in a temp folder:

  python -m bench.stack_faults                     # both, a 1-round mini run each: about 10 minutes on 2 cores
  python -m bench.stack_faults --fault postgres    # or --fault worker

- `postgres`: `igrpo run` (the stack's exports set: Prefect's API and MLflow's server) is started, and once round 0's
  policy is recorded PostgreSQL is SIGKILLed (its process group: the server and its backends). The run must stop
  with one error naming the database, not a traceback. Then `igrpo stack up` again and `igrpo run` again: it
  must resume and complete.
- `worker`: the run is the deployment's (`igrpo deploy --pool stack`, `prefect deployment run`); once round 0's
  policy is recorded, the worker and every process below it (the flow run's) are SIGKILLed, as a lost machine or
  the OOM killer does. Prefect must mark the flow run CRASHED (the stack's automation: no heartbeat for 3 periods),
  and after `igrpo stack up` (the worker again) the deployment's next run must resume the run directory.

Each resumed run is checked as bench.faults checks a killed run: every phase recorded, no temp file or lock left,
one MLflow parent run FINISHED with its round and phase runs, and one registered version per round and kind, its
manifest and its MLflow runs agreeing. Output: one line per fault with what happened and the seconds each step took.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from bench.concurrent_flows import Stack, deploy, run_config, user_env
from bench.faults import check_mlflow, leftovers, read_manifest

FIRST_DONE = "round-000/policy"  # the kill comes once this phase is recorded: mid-run, with work to keep


def wait_for(what, timeout: float, every: float = 0.5):
    """`what()` once it is truthy, else None after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := what():
            return got
        time.sleep(every)
    return None


def recorded(run_dir: Path) -> bool:
    return FIRST_DONE in ((read_manifest(run_dir) or {}).get("phases") or {})


def kill_tree(pid: int) -> None:
    """SIGKILL `pid` and every process below it (a worker and the flow runs it started in sessions of their own)."""
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def verdict(stack: Stack, run_dir: Path, name: str) -> list[str]:
    """What the resumed, finished run lost: bench.faults' checks of a killed run."""
    manifest = read_manifest(run_dir)
    if manifest is None:
        return ["no manifest"]
    problems = [f"left behind: {left}"] if (left := leftovers(run_dir)) else []
    return problems + check_mlflow(stack.mlflow, "mini", name, manifest, 1)


def postgres_killed(work: Path, stack: Stack) -> str:
    name, run_dir = "pg", work / "runs" / "pg"
    config = run_config(work, name, 0, stack.mlflow, {"run": {"rounds": 1}})
    env = user_env(work, PREFECT_API_URL=stack.prefect_api)
    run = [sys.executable, "-m", "flows.cli", "run", str(config)]
    proc = subprocess.Popen(run, env=env, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    if not wait_for(lambda: recorded(run_dir) or proc.poll() is not None, 600) or proc.poll() is not None:
        return f"postgres: the run ended before {FIRST_DONE} (rc {proc.poll()})"
    record = stack.records()["postgres"]
    os.killpg(record["pid"], signal.SIGKILL)
    killed = time.monotonic()
    try:
        out = proc.communicate(timeout=300)[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return "postgres: the run did not stop within 300 s of the database's kill"
    stopped = time.monotonic() - killed
    lines = [line for line in out.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("igrpo: error")]
    tracebacks = sum(line.startswith("Traceback") for line in lines)
    said = errors[-1] if errors else (lines[-1] if lines else "(nothing)")
    t0 = time.monotonic()
    stack.igrpo("up")
    up_s = time.monotonic() - t0
    again = subprocess.run(run, env=env, cwd=work, capture_output=True, text=True, timeout=900)
    lost = verdict(stack, run_dir, name) if again.returncode == 0 else [f"resume failed: {again.stdout[-500:]}"]
    return (f"postgres killed after {FIRST_DONE}: the run stopped in {stopped:.0f} s, rc {proc.returncode}, "
            f"{tracebacks} traceback(s), saying: {said[:400]}\n  `igrpo stack up` again: {up_s:.0f} s; "
            f"`igrpo run` again: rc {again.returncode}; " + ("nothing lost" if not lost else "lost: " + "; ".join(lost)))


def worker_killed(work: Path, stack: Stack) -> str:
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    name, run_dir = "wk", work / "runs" / "wk"
    deploy([run_config(work, name, 0, stack.mlflow, {"run": {"rounds": 1}})], "stack")
    first = run_deployment(f"iterative-rl/{name}", timeout=0).id
    if not wait_for(lambda: recorded(run_dir), 600):
        return f"worker: the flow run never recorded {FIRST_DONE}"
    kill_tree(stack.records()["worker-1"]["pid"])
    killed = time.monotonic()
    with get_client(sync_client=True) as client:
        state = lambda i: client.read_flow_run(i).state  # noqa: E731
        crashed = wait_for(lambda: state(first).type.value in ("CRASHED", "FAILED", "COMPLETED"), 300, every=2)
        first_state, crashed_s = state(first), time.monotonic() - killed
        stack.igrpo("up")  # the worker again
        second = run_deployment(f"iterative-rl/{name}", timeout=0).id
        wait_for(lambda: state(second).is_final(), 900, every=2)
        second_state = state(second)
    lost = verdict(stack, run_dir, name) if second_state.type.value == "COMPLETED" else [
        f"the next run is {second_state.type.value}: {second_state.message}"]
    return (f"worker killed after {FIRST_DONE}: the flow run is {first_state.type.value}"
            + (f" after {crashed_s:.0f} s ({first_state.message})" if crashed else " (never marked crashed)")
            + f"\n  the deployment's next run: {second_state.type.value}; "
            + ("nothing lost" if not lost else "lost: " + "; ".join(lost)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fault", choices=["postgres", "worker"], action="append", help="which (default: both)")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="igrpo-stack-faults-"))
    work.chmod(0o755)  # PostgreSQL may run as a user of its own, which must pass through it
    try:
        with Stack(work / "stack", 1, user_env(work, PREFECT_WORKER_QUERY_SECONDS="1")) as stack:
            os.environ["PREFECT_API_URL"] = stack.prefect_api  # this process deploys and submits
            for fault in args.fault or ["postgres", "worker"]:
                print((postgres_killed if fault == "postgres" else worker_killed)(work, stack), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
