"""Several flows at once (issue 48, point 2): N mini runs submitted together to the stack's work pool (`igrpo stack
up --workers 2`, one deployment per run) against the same N started together on sqlite stores (`igrpo run`, one
Prefect home, its ephemeral server, and one new ./mlflow.db), each checked against a lone run of its seed.

  python -m bench.concurrent_flows                      # 4 runs (seeds 0-3), 1 round each: about 10 minutes, 2 cores
  python -m bench.concurrent_flows --runs 2 --no-sqlite   # or --no-stack
  python -m bench.concurrent_flows --overhead 3         # a mini round tracked to the stack's MLflow vs a sqlite file
  python -m bench.concurrent_flows --overhead 2 --quickstart   # the same on a quickstart round: ~12 min

Per load: runs completed, errors (the first line of each failure), metrics lost or changed against the lone run of
the same seed (every metric of the parent, round, phase and model runs but timings; `lost`), registered-model
aliases that point at another run's version, and the wall time from submission to the last run's end.
`--overhead K`: K interleaved pairs of one lone mini run tracked to the stack's MLflow server and to a sqlite file,
the ratio server/sqlite of each pair (goal <= 1.05). Needs the `[stack]` extra; everything lives in a temp folder,
removed at the end (the stack stopped by pid first).
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from bench._common import ROOT, mini_config, spread

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
FLOW = "iterative-rl"  # flows/iterative.py's flow name: deployments are FLOW/<run.name>
TIMING = re.compile(r"^profiling/|(_per_s|_per_second|seconds|runtime|_time|_s)$")  # timings: never equal twice
DONE = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_config(work: Path, name: str, seed: int, tracking_uri: str, overrides: dict | None = None,
               base: dict | None = None) -> Path:
    """configs/mini.yaml (or the config `base`) as run `name` of seed `seed`, its runs in `work`/runs, tracked to
    `tracking_uri`; `overrides` ({section: {field: value}}) update its sections. The YAML file's path."""
    data = mini_config(work) if base is None else copy.deepcopy(base)
    data["run"].update(name=name, seed=seed, runs_dir=str(work / "runs"))
    data["tracking"]["tracking_uri"] = tracking_uri
    for section, values in (overrides or {}).items():
        data.setdefault(section, {}).update(values)
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# --- what a run logged -------------------------------------------------------------------------------------------


def logged(tracking_uri: str, experiment: str, run_name: str) -> tuple[str, dict[str, dict[str, float]]]:
    """The parent run named `run_name` and every metric (timings aside) of it and the runs below it, by run name
    ('parent', 'round-001', 'round-001-policy', ...): the parent's id and {run: {metric: value}}."""
    from mlflow import MlflowClient

    from pipeline.tracking import PARENT_TAG

    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], max_results=5000)
    parents = [r for r in runs if PARENT_TAG not in r.data.tags and r.info.run_name == run_name]
    if len(parents) != 1:
        raise ValueError(f"{len(parents)} parent runs named {run_name!r} in experiment {experiment!r}")
    below, out, todo = {}, {}, [("parent", parents[0])]
    for r in runs:
        below.setdefault(r.data.tags.get(PARENT_TAG), []).append(r)
    while todo:
        name, run = todo.pop()
        out[name] = {k: v for k, v in run.data.metrics.items() if not TIMING.search(k)}
        todo += [(child.info.run_name, child) for child in below.get(run.info.run_id, [])]
    return parents[0].info.run_id, out


def lost(alone: dict[str, dict[str, float]], run: dict[str, dict[str, float]]) -> list[str]:
    """Metrics of the lone run that `run` lacks or logged with another value, as 'run: metric (why)'."""
    out = []
    for name, metrics in alone.items():
        for key, value in metrics.items():
            got = run.get(name, {}).get(key)
            if got is None:
                out.append(f"{name}: {key} (missing)")
            elif got != value and not (got != got and value != value):  # NaN is NaN
                out.append(f"{name}: {key} ({got} != {value})")
    return out


def foreign_aliases(tracking_uri: str, experiment: str, run_name: str, parent: str, rounds: int,
                    kinds: tuple[str, ...] = ("prm", "orm", "policy")) -> list[str]:
    """The run's registered models' `round-<r>` aliases that are missing or point at a version of another run."""
    from mlflow import MlflowClient

    from pipeline.tracking import model_name

    client, out = MlflowClient(tracking_uri), []
    for kind in kinds:
        name = model_name(experiment, run_name, kind)
        for r in range(rounds + 1):
            try:
                v = client.get_model_version_by_alias(name, f"round-{r}")
            except Exception:
                out.append(f"{name}@round-{r} missing")
                continue
            if (v.tags.get("pipeline_run"), v.tags.get("round")) != (parent, str(r)):
                out.append(f"{name}@round-{r} is run {v.tags.get('pipeline_run')}'s round {v.tags.get('round')}")
    return out


# --- the two loads -----------------------------------------------------------------------------------------------


def user_env(work: Path, **extra: str) -> dict:
    """A user's environment: this checkout importable, one Prefect home, no servers configured unless `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI")}
    env.update(PREFECT_HOME=str(work / "prefect-home"), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_LOGGING_LEVEL="WARNING", TQDM_DISABLE="1", PYTHONPATH=str(ROOT), **extra)
    return env


def on_sqlite(work: Path, configs: list[Path]) -> tuple[dict[str, str], float]:
    """`igrpo run` of each config, all started at once in `work`; ({config: 'COMPLETED' or its error}, wall s)."""
    t0 = time.monotonic()
    procs = {c: subprocess.Popen([sys.executable, "-m", "flows.cli", "run", str(c)], env=user_env(work), cwd=work,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for c in configs}
    states = {}
    for c, p in procs.items():
        out = p.communicate()[0]
        errors = [line for line in out.splitlines() if line.startswith(("igrpo: error", "Traceback"))
                  or "Error:" in line]
        states[c.stem] = "COMPLETED" if p.returncode == 0 else (errors[-1] if errors else f"rc {p.returncode}")[:300]
    return states, time.monotonic() - t0


def deploy(configs: list[Path], pool: str) -> None:
    """`igrpo deploy CONFIG --pool POOL` of each config, in this process (PREFECT_API_URL: the stack's)."""
    from flows.cli import main

    for c in configs:
        if main(["deploy", str(c), "--pool", pool]):
            raise SystemExit(f"igrpo deploy {c} failed")


def submit(names: list[str]) -> dict:
    """A run of each deployment FLOW/<name>, all submitted at once (`prefect deployment run`): {name: its id}."""
    from prefect.deployments import run_deployment

    return {name: run_deployment(f"{FLOW}/{name}", timeout=0).id for name in names}


def wait(ids: dict, timeout: float) -> dict[str, str]:
    """Each flow run's end state ({name: state, or state: its message}) once all have ended or `timeout` s passed."""
    from prefect.client.orchestration import get_client

    t0 = time.monotonic()
    with get_client(sync_client=True) as client:
        while True:
            states = {name: client.read_flow_run(i).state for name, i in ids.items()}
            if all(s.type.value in DONE for s in states.values()) or time.monotonic() - t0 > timeout:
                break
            time.sleep(0.5)
    return {name: s.type.value if s.type.value in ("COMPLETED", "RUNNING", "PENDING", "SCHEDULED")
            else f"{s.type.value}: {(s.message or '')[:300]}" for name, s in states.items()}


def submit_and_wait(names: list[str], timeout: float) -> tuple[dict[str, str], float]:
    """A run of each deployment FLOW/<name>, all submitted at once; then each one's end state and the wall seconds
    from submission to the last end."""
    t0 = time.monotonic()
    states = wait(submit(names), timeout)
    return states, time.monotonic() - t0


class Stack:
    """`igrpo stack up` in `root` on free ports with `workers` workers (a subprocess, as a user runs it); stopped by
    pid (`igrpo stack down`) on exit, also on failure."""

    def __init__(self, root: Path, workers: int, env: dict):
        self.root, self.workers, self.env = root, workers, env
        self.ports = {"postgres": free_port(), "prefect": free_port(), "mlflow": free_port()}
        self.prefect_api = f"http://127.0.0.1:{self.ports['prefect']}/api"
        self.mlflow = f"http://127.0.0.1:{self.ports['mlflow']}"

    def igrpo(self, *args: str) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, "-m", "flows.cli", "stack", *args, "--dir", str(self.root)],
                              env=self.env, cwd=self.root.parent, capture_output=True, text=True, timeout=300)
        if done.returncode:
            raise SystemExit(f"igrpo stack {args[0]} failed: {done.stderr}")
        return done

    def records(self) -> dict:
        """What `up` started: service name -> pid record (flows/services.py)."""
        from flows.services import State

        return State(self.root / "pids.json").records

    def __enter__(self) -> Stack:
        self.igrpo("up", f"--workers={self.workers}", *[f"--{k}-port={v}" for k, v in self.ports.items()])
        return self

    def __exit__(self, *exc) -> None:
        from flows.services import stop

        for record in self.records().values():
            stop(record)


def check(tracking_uri: str, names: dict[str, int], alone: dict[int, dict]) -> dict[str, list[str]]:
    """Per run name, what it lost against the lone run of its seed and its aliases that are not its own."""
    out = {}
    for name, seed in names.items():
        try:
            parent, metrics = logged(tracking_uri, "mini", name)
        except ValueError as e:
            out[name] = [str(e)]
            continue
        out[name] = lost(alone[seed], metrics) + foreign_aliases(tracking_uri, "mini", name, parent, 1)
    return out


def report(load: str, states: dict[str, str], wall: float, problems: dict[str, list[str]]) -> str:
    done = sum(s == "COMPLETED" for s in states.values())
    errors = [f"{n}: {s}" for n, s in states.items() if s != "COMPLETED"]
    missing = sum(len(p) for n, p in problems.items() if states.get(n) == "COMPLETED")
    line = (f"| {load} | {done} of {len(states)} | {len(errors)} | {missing} | {wall:.0f} s |")
    for e in errors:
        line += f"\n    {e}"
    for n, p in problems.items():
        if p and states.get(n) == "COMPLETED":
            line += f"\n    {n}: " + "; ".join(p[:5]) + (f" (+{len(p) - 5})" if len(p) > 5 else "")
    return line


def concurrent(work: Path, runs: int, workers: int, sqlite: bool, stack: bool) -> None:
    seeds = {f"mini-s{i}": i for i in range(runs)}
    # The lone runs, one after another, each on a sqlite store of its own: what a run alone logs.
    alone = {}
    for name, seed in seeds.items():
        folder = work / f"alone-{seed}"
        folder.mkdir()
        uri = f"sqlite:///{folder / 'mlflow.db'}"
        states, _ = on_sqlite(folder, [run_config(folder, name, seed, uri, {"run": {"rounds": 1}})])
        if states[name] != "COMPLETED":
            raise SystemExit(f"the lone run of seed {seed} failed: {states[name]}")
        alone[seed] = logged(uri, "mini", name)[1]
    rows = []
    if sqlite:
        folder = work / "sqlite"
        folder.mkdir()
        uri = f"sqlite:///{folder / 'mlflow.db'}"
        states, wall = on_sqlite(folder, [run_config(folder, n, s, uri, {"run": {"rounds": 1}}) for n, s in seeds.items()])
        rows.append(report(f"{runs} at once, sqlite stores (`igrpo run`)", states, wall, check(uri, seeds, alone)))
    if stack:
        rows.append(on_stack(work / "stack", seeds, workers, alone))
    print("| load | runs completed | errors | metrics lost or changed | wall time |\n|---|---|---|---|---|")
    print("\n".join(rows))


def on_stack(folder: Path, seeds: dict[str, int], workers: int, alone: dict[int, dict]) -> str:
    folder.mkdir()
    with Stack(folder / "stack", workers, user_env(folder)) as stack:
        os.environ["PREFECT_API_URL"] = stack.prefect_api  # this process deploys and submits
        deploy([run_config(folder, n, s, stack.mlflow, {"run": {"rounds": 1}}) for n, s in seeds.items()], "stack")
        states, wall = submit_and_wait(list(seeds), timeout=1800)
        return report(f"{len(seeds)} on the stack, {workers} workers", states, wall, check(stack.mlflow, seeds, alone))


def overhead(work: Path, repeats: int, on_quickstart: bool) -> None:
    """`repeats` interleaved pairs, after an untimed warm-up run: a lone mini run (1 round) tracked to the stack's
    MLflow, then to sqlite; with `on_quickstart`, the quickstart's rounds 0 and 1 from its SFT policy (trained once,
    cached, untimed)."""
    base = None
    if on_quickstart:
        from bench._common import bootstrapped_policy, quickstart

        cfg = quickstart()
        base = cfg.model_dump(mode="json", exclude_unset=False)
        base["policy"]["model"] = str(bootstrapped_policy(cfg))
        base["bootstrap"]["sft"] = False
    ratios = []
    with Stack(work / "stack", 1, user_env(work)) as stack:
        # Untimed (a mini run): the first `igrpo run` in a new Prefect home creates and migrates its ephemeral
        # server's database (at a26a3e0, on the quickstart, the first pair's first run was 43 s slower than the rest).
        states, _ = on_sqlite(work, [run_config(work, "warm-up", 0, f"sqlite:///{work / 'w.db'}", {"run": {"rounds": 1}})])
        if states["warm-up"] != "COMPLETED":
            raise SystemExit(f"the warm-up run failed: {states['warm-up']}")
        for i in range(repeats):
            seconds = {}
            for kind, uri in (("server", stack.mlflow), ("sqlite", f"sqlite:///{work / f'm{i}.db'}")):
                name = f"over-{kind}-{i}"
                t0 = time.monotonic()
                states, _ = on_sqlite(work, [run_config(work, name, 0, uri, {"run": {"rounds": 1}}, base)])
                seconds[kind] = time.monotonic() - t0
                if states[name] != "COMPLETED":
                    raise SystemExit(f"{name} failed: {states[name]}")
            ratios.append(seconds["server"] / seconds["sqlite"])
            print(f"pair {i + 1}: server {seconds['server']:.1f} s, sqlite {seconds['sqlite']:.1f} s, "
                  f"ratio {ratios[-1]:.3f}", flush=True)
    what = "the quickstart's rounds 0-1" if on_quickstart else "the mini config's rounds 0-1"
    print(f"server/sqlite: {spread(ratios)} (median (min-max) of {repeats} pairs of {what}; goal <= 1.05)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=4, help="runs at once (4)")
    ap.add_argument("--workers", type=int, default=2, help="the stack's workers (2)")
    ap.add_argument("--no-sqlite", action="store_true", help="skip the load on sqlite stores")
    ap.add_argument("--no-stack", action="store_true", help="skip the load on the stack")
    ap.add_argument("--overhead", type=int, metavar="K", help="instead: K interleaved pairs, MLflow server vs sqlite")
    ap.add_argument("--quickstart", action="store_true", help="--overhead on the quickstart's round, not the mini's")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="igrpo-concurrent-"))  # not 0700-only: PostgreSQL may run as its own user
    work.chmod(0o755)
    try:
        if args.overhead:
            overhead(work, args.overhead, args.quickstart)
        else:
            concurrent(work, args.runs, args.workers, not args.no_sqlite, not args.no_stack)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
