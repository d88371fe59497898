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
instead (`ray_launch`), one per node: Ray Train forms the torch process group (gloo on CPU, nccl on GPU) and sets
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

from pipeline.config import LauncherConfig, PipelineConfig, accelerate_config_path
from pipeline.registry import plugin_env
from pipeline.rundir import read_json, write_json_atomic

LOG_TAIL_LINES = 40


class LaunchError(RuntimeError):
    """A launched phase failed; the message holds the tail of its output (accelerate) or its worker's error (Ray)."""


def launch_command(launcher: LauncherConfig, target: Sequence[str]) -> list[str]:
    """The `accelerate launch` command line running `target` (`['-m', 'module', ...]` or `['script.py', ...]`)."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch"]
    if launcher.config_file:
        cmd += ["--config_file", str(accelerate_config_path(launcher.config_file))]
    if launcher.num_processes is not None:
        cmd += ["--num_processes", str(launcher.num_processes)]
    return cmd + list(launcher.extra_args) + list(target)


def check_launchable(launcher: LauncherConfig) -> None:
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


def launch_phase(cfg: PipelineConfig, phase: str, kwargs: dict[str, Any], work_dir: str | Path,
                 runs: dict[str, Any], entry: Callable[[list[str]], None]) -> dict:
    """Run a launchable phase under `accelerate launch` or on Ray (`launcher.kind`); return its main process's
    result (`PhaseResult`'s manifest form).

    Args:
        kwargs: the phase function's arguments (paths as strings, JSON-serialisable).
        work_dir: holds the request, the result and `launch.log`, the processes' output (accelerate).
        runs: the phase's MLflow run ids (`PhaseRuns`' fields); the main process logs into them.
        entry: what each process runs, `pipeline.rounds.launched` (`python -m pipeline.rounds WORK_DIR` under
            accelerate; called with `[WORK_DIR]` in each Ray Train worker).
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
    env = {"MLFLOW_TRACKING_URI": mlflow.get_tracking_uri()}
    if runs.get("run_id"):
        env["MLFLOW_EXPERIMENT_ID"] = mlflow.MlflowClient().get_run(runs["run_id"]).info.experiment_id
    if cfg.launcher.kind == "ray":
        ray_launch(cfg.launcher, entry, [[str(work_dir)]], env, work_dir / "ray", f"the {phase} phase")
    else:
        cmd = launch_command(cfg.launcher, ["-m", "pipeline.rounds", str(work_dir)])
        child = {k: v for k, v in os.environ.items() if k != "MLFLOW_RUN_ID"}
        run_logged(cmd, work_dir / "launch.log", {**child, **env}, f"the {phase} phase")
    if not result.exists():
        output = "Ray's logs" if cfg.launcher.kind == "ray" else work_dir / "launch.log"
        raise LaunchError(f"the {phase} phase exited without writing {result}; see {output}")
    return read_json(result)


def ray_launch(launcher: LauncherConfig, target: Callable[..., object], args: Sequence[Any], env: dict[str, str],
               storage: Path, what: str) -> None:
    """Run `target(*args)` in each worker of a Ray Train `TorchTrainer` job on the cluster at `launcher.ray_address`:
    `launcher.num_processes` workers (None: one per live node), on a GPU each and nccl where the cluster has GPUs,
    else on CPU and gloo. Each worker starts in this process's working directory, with `env` added; a Ray joined
    here gives the job this process's plugin path (`plugin_env`: PYTHONPATH, set before a worker starts, as
    `accelerate launch`'s processes inherit it), one joined by the caller keeps its own `runtime_env`. `storage`:
    Ray Train's folder for the job (emptied first). A failed worker is a LaunchError quoting its error.
    """
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    owned = not ray.is_initialized()
    if owned:
        ray.init(address=launcher.ray_address, log_to_driver=False, runtime_env={"env_vars": plugin_env()})
    try:
        gpus = ray.cluster_resources().get("GPU", 0) > 0
        workers = launcher.num_processes or sum(node["Alive"] for node in ray.nodes())
        env = {**env, **({} if gpus else {"ACCELERATE_USE_CPU": "true"})}  # accelerate's PartialState: gloo on CPU
        shutil.rmtree(storage, ignore_errors=True)  # Ray Train would take a killed attempt's state for this job's
        trainer = TorchTrainer(
            _ray_worker, train_loop_config={"target": target, "args": list(args), "cwd": os.getcwd(), "env": env},
            scaling_config=ScalingConfig(num_workers=workers, use_gpu=gpus),
            torch_config=TorchConfig(backend="nccl" if gpus else "gloo"),
            run_config=RunConfig(storage_path=str(storage.resolve()), name="job"))
        try:
            trainer.fit()
        except Exception as e:  # Ray Train's TrainingFailedError, holding the worker's traceback
            raise LaunchError(f"{what} failed under Ray Train ({workers} workers): {e}") from e
    finally:
        if owned:
            ray.shutdown()


def _ray_worker(config: dict[str, Any]) -> None:
    """One Ray Train worker: as a process of `accelerate launch` would start (the launcher's working directory and
    environment), then `target(*args)`."""
    os.chdir(config["cwd"])  # Ray Train starts a worker in a folder of its own; a run's paths may be relative
    os.environ.update(config["env"])
    os.environ.pop("MLFLOW_RUN_ID", None)  # the node's, if any: the request names the runs to log into
    config["target"](*config["args"])
