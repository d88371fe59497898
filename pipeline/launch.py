"""The launchable phases (`pipeline.phases.PHASES`: policy, reward_model) under `accelerate launch` (DDP or ZeRO) or
as a Ray Train job.

With `launcher.kind: accelerate`, `launch_phase` (in the pipeline's process) writes the config, the
phase's arguments and its MLflow run ids to a work directory and starts

    python -m accelerate.commands.launch --config_file F [--num_processes N] -m pipeline.rounds WORK_DIR

Every process runs `pipeline.rounds.launched`, which calls the same phase function as the in-process path
(`pipeline.rounds.execute`); TRL and transformers' Trainer split the batches and gather what they need. The
main process writes the phase's result to `WORK_DIR/result.json` (atomically), which `launch_phase` reads
back. MLflow: the tracking URI and the experiment travel in the environment, the run ids in the request;
the main process makes the runs active around the trainers, as the in-process path does, so Trainer's own
metrics land in the round's phase run (or each trained model's run).

With `launcher.kind: ray`, a Ray Train `TorchTrainer` job on the cluster runs `launched` in each of its workers
instead (`ray_launch`), sized by the cluster's resources (`ray_workers`: a worker per GPU, else per node), once
every node is seen to reach the run's paths (`check_nodes_see`). Ray Train forms the torch process group (gloo on CPU, nccl on GPU) and sets
the variables torchrun would (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT), which accelerate's `PartialState`
reads, so each worker is what a process of `accelerate launch` is. The request and the result are the same files.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from pipeline.registry import plugin_env
from pipeline.rundir import read_json, write_json_atomic
from pipeline.sections import accelerate_config_path

LOG_TAIL_LINES = 40


class LaunchError(RuntimeError):
    """A launched phase failed; the message holds the tail of its output (accelerate) or its worker's error (Ray)."""


def launch_command(launcher: Any, target: Sequence[str], log_dir: Path | None = None) -> list[str]:
    """The `accelerate launch` command line running `target` (`['-m', 'module', ...]` or `['script.py', ...]`).

    `log_dir`: torchrun's log folder (unless `launcher.extra_args` names one). Without it torchrun makes a
    `torchelastic_*` folder in the temp dir at each launch and leaves it there."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch"]
    if launcher.config_file:
        cmd += ["--config_file", str(accelerate_config_path(launcher.config_file))]
    if launcher.num_processes is not None:
        cmd += ["--num_processes", str(launcher.num_processes)]
    if log_dir is not None and not any(a.split("=")[0] == "--log_dir" for a in launcher.extra_args):
        cmd += ["--log_dir", str(log_dir)]
    return cmd + list(launcher.extra_args) + list(target)


def check_launchable(launcher: Any) -> None:
    """Refuse, before starting anything, an accelerate config whose engine is not installed."""
    if not launcher.config_file:
        return
    data = yaml.safe_load(accelerate_config_path(launcher.config_file).read_text())
    if data.get("distributed_type") == "DEEPSPEED" and importlib.util.find_spec("deepspeed") is None:
        raise LaunchError(
            f"launcher.config_file: {launcher.config_file} uses DeepSpeed, which is not installed here: "
            "pip install deepspeed (on a CUDA machine), or use configs/accelerate/multi_gpu.yaml"
        )


def run_logged(cmd: Sequence[str], log_path: Path, env: dict[str, str], what: str) -> None:
    """Run `cmd` with stdout and stderr in `log_path`; a non-zero exit is a LaunchError quoting the log's tail."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        rc = subprocess.run(list(cmd), stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    if rc != 0:
        tail = "\n".join(_children_output(log_path.read_text(errors="replace"))[-LOG_TAIL_LINES:])
        raise LaunchError(f"{what} failed under accelerate launch (exit code {rc}); full log: {log_path}\n{tail}")


def _children_output(log: str) -> list[str]:
    """The log's lines up to the launcher's own report (torchrun's traceback and failure table), which
    would otherwise fill the tail and hide the processes' errors."""
    lines = log.splitlines()
    for i, line in enumerate(lines):
        launcher_traceback = line.startswith("Traceback") and any(
            "accelerate/commands/launch.py" in later for later in lines[i + 1 : i + 6])
        if launcher_traceback or ("torch/distributed/elastic" in line and "failed (exitcode" in line):
            return lines[:i] or lines
    return lines


def launch_phase(cfg: Any, phase: str, kwargs: dict[str, Any], work_dir: str | Path,
                 runs: dict[str, Any], entry: Callable[[list[str]], None], start: Start) -> dict:
    """Run a launchable phase under `accelerate launch` or on Ray; return its main process's result (`PhaseResult`'s
    manifest form).

    Args:
        kwargs: the phase function's arguments (paths as strings, JSON-serialisable).
        work_dir: holds the request, the result and `launch.log`, the processes' output (accelerate).
        runs: the phase's MLflow run ids (`PhaseRuns`' fields); the main process logs into them.
        entry: what each process runs, `pipeline.rounds.launched` (`python -m pipeline.rounds WORK_DIR` under
            accelerate; called with `[WORK_DIR]` in each Ray Train worker).
        start: how the processes start: `launcher.kind`'s entry in pipeline/launchers.py (`accelerate_phase`,
            `ray_phase`, or a plugin's).
    """
    check_launchable(cfg.launcher)
    import mlflow

    work_dir = Path(work_dir)
    result = work_dir / "result.json"
    result.unlink(missing_ok=True)  # a stale result from a killed attempt must not pass for this one
    run_ids = {k: runs.get(k) for k in ("run_id", "models", "pipeline")}
    write_json_atomic(work_dir / "request.json", {
        "config": cfg.model_dump(mode="json"), "phase": phase, "kwargs": kwargs, "runs": run_ids,
    })
    from pipeline.tracking import absolute_uri

    env = {"MLFLOW_TRACKING_URI": absolute_uri(mlflow.get_tracking_uri())}  # a worker's relative path is its own
    if runs.get("run_id"):
        env["MLFLOW_EXPERIMENT_ID"] = mlflow.MlflowClient().get_run(runs["run_id"]).info.experiment_id
    output = start(cfg, phase, work_dir, env, entry)
    if not result.exists():
        raise LaunchError(f"the {phase} phase exited without writing {result}; see {output}")
    return read_json(result)


# A launcher's `start` (pipeline/launchers.py): the phase's processes, run to their end; returns where their
# output is, for an error.
Start = Callable[[Any, str, Path, dict[str, str], Callable[[list[str]], None]], str]


def accelerate_phase(cfg: Any, phase: str, work_dir: Path, env: dict[str, str],
                     entry: Callable[[list[str]], None]) -> str:
    """`accelerate launch ... -m pipeline.rounds WORK_DIR`, its output in `WORK_DIR/launch.log`."""
    cmd = launch_command(cfg.launcher, ["-m", "pipeline.rounds", str(work_dir)], log_dir=work_dir / "torchrun")
    child = {k: v for k, v in os.environ.items() if k != "MLFLOW_RUN_ID"}
    run_logged(cmd, work_dir / "launch.log", {**child, **env}, f"the {phase} phase")
    return str(work_dir / "launch.log")


def ray_phase(cfg: Any, phase: str, work_dir: Path, env: dict[str, str],
              entry: Callable[[list[str]], None]) -> str:
    """A Ray Train job running `entry([WORK_DIR])` in each worker (`ray_launch`), once every node is seen to reach
    the run directory and a local tracking store."""
    from pipeline.tracking import local_store

    store = local_store(env["MLFLOW_TRACKING_URI"])  # a server's URI: none to check
    ray_launch(cfg.launcher, entry, [[str(work_dir.resolve())]], env, work_dir / "ray", f"the {phase} phase",
               shared={"the run directory": work_dir, **({"the MLflow tracking store": store} if store else {})})
    return "the output above (Ray's workers)"


def check_nodes_see(shared: dict[str, Path], cwd: str) -> None:
    """Refuse, before a Ray job starts, a cluster where a live node cannot see what its workers will read and write:
    the working directory they start in and each path of `shared` (what -> path; a folder is checked by a token file
    written here and read back there, a file by its presence). One sentence names the node and the path. On one
    machine every node sees them; across machines they must be on a shared file system (NFS and the like)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    token = os.urandom(8).hex()
    checks = []
    for what, path in shared.items():
        path = Path(path).resolve()
        if path.is_dir():
            (path / ".node-check").write_text(token)
            checks.append((what, str(path / ".node-check"), token))
        else:
            checks.append((what, str(path), None))

    @ray.remote(num_cpus=0)
    def unseen() -> str | None:
        if not os.path.isdir(cwd):
            return f"the working directory {cwd}"
        for what, path, expected in checks:
            try:
                seen = open(path).read() if expected else ""
            except OSError:
                seen = None
            if seen != (expected or ""):
                return f"{what} ({os.path.dirname(path) if expected else path})"
        return None

    try:
        for node in (n for n in ray.nodes() if n["Alive"]):
            where = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
            missing = ray.get(unseen.options(scheduling_strategy=where).remote(), timeout=120)
            if missing:
                raise LaunchError(
                    f"Ray node {node['NodeManagerAddress']} ({node['NodeID'][:8]}) cannot see {missing}: every node "
                    "of a Ray cluster must see the run's paths (run it on a shared file system, and a tracking "
                    "server rather than a local store)")
    finally:
        for what, path, expected in checks:
            if expected:
                Path(path).unlink(missing_ok=True)


def ray_launch(launcher: Any, target: Callable[..., object], args: Sequence[Any], env: dict[str, str],
               storage: Path, what: str, shared: dict[str, Path] | None = None) -> None:
    """Run `target(*args)` in each worker of a Ray Train `TorchTrainer` job on the cluster at `launcher.ray_address`:
    `launcher.num_processes` workers (None: `ray_workers`), on a GPU each and nccl where the cluster has GPUs,
    else on CPU and gloo. Each worker starts in this process's working directory, with `env` added; a Ray joined
    here gives the job this process's plugin path (`plugin_env`: PYTHONPATH, set before a worker starts, as
    `accelerate launch`'s processes inherit it), one joined by the caller keeps its own `runtime_env`. `storage`:
    Ray Train's folder for the job (emptied first). `shared`: what every node must see (`check_nodes_see`), checked
    before the job starts. The workers' output is printed here; a failed worker is a LaunchError quoting its error.
    """
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    owned = not ray.is_initialized()
    if owned:  # the workers' output (their errors too) is printed here, prefixed by worker, as Ray does by default
        ray.init(address=launcher.ray_address, runtime_env={"env_vars": plugin_env()})
    try:
        check_nodes_see(shared or {}, os.getcwd())
        workers, each = ray_workers(ray.nodes(), launcher.num_processes)
        gpus = "GPU" in each
        env = {**env, **({} if gpus else {"ACCELERATE_USE_CPU": "true"})}  # accelerate's PartialState: gloo on CPU
        shutil.rmtree(storage, ignore_errors=True)  # Ray Train would take a killed attempt's state for this job's
        trainer = TorchTrainer(
            _ray_worker, train_loop_config={"target": target, "args": list(args), "cwd": os.getcwd(), "env": env},
            scaling_config=ScalingConfig(num_workers=workers, use_gpu=gpus, resources_per_worker=each,
                                         placement_strategy="PACK" if gpus else "SPREAD"),
            torch_config=TorchConfig(backend="nccl" if gpus else "gloo"),
            run_config=RunConfig(storage_path=str(storage.resolve()), name="job"))
        try:
            trainer.fit()
        except Exception as e:  # Ray Train's TrainingFailedError, holding the worker's traceback
            raise LaunchError(f"{what} failed under Ray Train ({workers} workers): {e}") from e
    finally:
        if owned:
            ray.shutdown()


def ray_workers(nodes: Sequence[dict], wanted: int | None = None) -> tuple[int, dict[str, float]]:
    """A Ray Train job's size from the cluster's resources (`ray.nodes()`): (workers, resources of each).

    Where the live nodes have GPUs: one worker per GPU (a node of 8 uses all 8; a head without one gets none), a GPU
    each. Else one worker per live node with CPUs, each taking the CPUs of the smallest such node, so that torch
    in a worker uses the node's cores (Ray sets a worker's thread count to its CPUs) and no two share a node.
    `wanted` (`launcher.num_processes`) sets the count instead; each still gets a GPU, or one CPU.

    >>> head = {"Alive": True, "Resources": {"CPU": 4.0}}
    >>> gpu_node = {"Alive": True, "Resources": {"CPU": 32.0, "GPU": 8.0}}
    >>> ray_workers([head, gpu_node])
    (8, {'GPU': 1.0})
    >>> ray_workers([head, {"Alive": True, "Resources": {"CPU": 2.0}}, {"Alive": False, "Resources": {"CPU": 8.0}}])
    (2, {'CPU': 2.0})
    >>> ray_workers([head, gpu_node], wanted=2)
    (2, {'GPU': 1.0})
    """
    live = [node["Resources"] for node in nodes if node["Alive"]]
    gpus = int(sum(r.get("GPU", 0) for r in live))
    if gpus:
        return wanted or gpus, {"GPU": 1.0}
    cpus = [r["CPU"] for r in live if r.get("CPU", 0) >= 1]
    if not cpus:
        raise LaunchError("the Ray cluster has no live node with a CPU or a GPU to run a training worker on")
    return (wanted, {"CPU": 1.0}) if wanted else (len(cpus), {"CPU": float(int(min(cpus)))})


def _ray_worker(config: dict[str, Any]) -> None:
    """One Ray Train worker: as a process of `accelerate launch` would start (the launcher's working directory and
    environment), then `target(*args)`."""
    os.chdir(config["cwd"])  # Ray Train starts a worker in a folder of its own; a run's paths may be relative
    os.environ.update(config["env"])
    os.environ.pop("MLFLOW_RUN_ID", None)  # the node's, if any: the request names the runs to log into
    config["target"](*config["args"])
