"""The iterative RL flow: round 0 (bootstrap) then rounds 1..R, each a subflow with a task per phase.

Flows only orchestrate: every phase is `pipeline.rounds.run_phase`, which skips what the manifest records
as done, so re-running the flow on a run directory resumes it. Tasks pass paths, never models.
"""

from __future__ import annotations

from prefect import flow, get_run_logger, task
from prefect.artifacts import (
    create_link_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)

from pipeline import tracking
from pipeline.config import PipelineConfig
from pipeline.rounds import run_phase
from pipeline.runner import PHASES, open_run, preflight, run_lock


@task(task_run_name="{phase}-round-{round_index}")
def phase_task(config: dict, round_index: int, phase: str) -> dict:
    """Run one phase of one round (a no-op when already done)."""
    return run_phase(PipelineConfig.model_validate(config), round_index, phase)


@flow(flow_run_name="round-{round_index}")
def round_flow(config: dict, round_index: int) -> dict:
    """Policy -> collect -> reward model -> eval for one round; a table artifact of its figures."""
    o = PipelineConfig.model_validate(config).orchestration
    task_ = phase_task.with_options(retries=o.retries, retry_delay_seconds=o.retry_delay_seconds)
    outputs = {phase: task_(config, round_index, phase) for phase in PHASES}
    figures = {k: v for p in ("eval", "reward_model", "collect") for k, v in outputs[p]["metrics"].items()}
    create_table_artifact(
        key=f"round-{round_index}", description=f"Round {round_index}: Pass@K, Maj@K, greedy, RM quality",
        table=[{"metric": k, "value": round(v, 4)} for k, v in sorted(figures.items())],
    )
    return outputs


@flow(name="iterative-rl")
def iterative_rl(config: dict, force: bool = False) -> dict:
    """DeepSeekMath iterative RL (Algorithm 1) over `run.rounds` rounds; resumes an unfinished run directory."""
    cfg = PipelineConfig.model_validate(config)
    preflight(cfg)  # bad data, model path or tracking URI: fail before the run directory is touched
    with run_lock(cfg.run_dir):
        manifest = open_run(cfg, force)
        parent = manifest.data["mlflow"]["parent"]
        create_link_artifact(key="mlflow-run", link=f"{tracking.mlflow.get_tracking_uri()}#/runs/{parent}",
                             description="The pipeline's MLflow parent run")
        progress = create_progress_artifact(0.0, description=f"Rounds done of {cfg.run.rounds + 1}")
        for r in range(cfg.run.rounds + 1):
            outputs = round_flow(config, r)
            update_progress_artifact(progress, 100.0 * (r + 1) / (cfg.run.rounds + 1))
            get_run_logger().info("round %d: %s", r, {k: round(v, 3) for k, v in outputs["eval"]["metrics"].items()})
        tracking.finish(parent)
    return {"run_dir": str(cfg.run_dir), "mlflow_run": parent}
