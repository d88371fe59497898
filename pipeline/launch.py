"""The launchable phases (`pipeline.phases.PHASES`: policy, reward_model) under `accelerate launch`: DDP or ZeRO.

With `launcher.kind: accelerate`, `launch_phase` (in the pipeline's process) writes the config, the
phase's arguments and its MLflow run ids to a work directory and starts

    python -m accelerate.commands.launch --config_file F [--num_processes N] -m pipeline.rounds WORK_DIR

Every process runs `pipeline.rounds.launched`, which calls the same phase function as the in-process path
(`pipeline.rounds.execute`); TRL and transformers' Trainer split the batches and gather what they need. The
main process writes the phase's result to `WORK_DIR/result.json` (atomically), which `launch_phase` reads
back. MLflow: the tracking URI and the experiment travel in the environment, the run ids in the request;
the main process makes the runs active around the trainers, as the in-process path does, so Trainer's own
metrics land in the round's phase run (or each trained model's run).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from pipeline.config import LauncherConfig, PipelineConfig, accelerate_config_path
from pipeline.rundir import read_json, write_json_atomic

LOG_TAIL_LINES = 40


class LaunchError(RuntimeError):
    """A phase under `accelerate launch` failed; the message holds the tail of its output."""


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
                 runs: dict[str, Any]) -> dict:
    """Run a launchable phase under `accelerate launch`; return its main process's result (`PhaseResult`'s
    manifest form).

    Args:
        kwargs: the phase function's arguments (paths as strings, JSON-serialisable).
        work_dir: holds the request, the result and `launch.log`, the processes' output.
        runs: the phase's MLflow run ids (`PhaseRuns`' fields); the main process logs into them.
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
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow.get_tracking_uri()}
    env.pop("MLFLOW_RUN_ID", None)
    if runs.get("run_id"):
        env["MLFLOW_EXPERIMENT_ID"] = mlflow.MlflowClient().get_run(runs["run_id"]).info.experiment_id
    cmd = launch_command(cfg.launcher, ["-m", "pipeline.rounds", str(work_dir)])
    run_logged(cmd, work_dir / "launch.log", env, f"the {phase} phase")
    if not result.exists():
        raise LaunchError(f"the {phase} phase exited without writing {result}; see {work_dir / 'launch.log'}")
    return read_json(result)
