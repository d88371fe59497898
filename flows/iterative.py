"""The iterative RL flow: `pipeline.rounds.run_rounds` with a Prefect subflow per round and a task per phase.

Flows only orchestrate: Algorithm 1 is `pipeline.rounds.run_round`, given Prefect's task as its `step`;
`run_phase` skips what the manifest records as done, so re-running the flow on a run directory resumes it.
Tasks pass paths, never models.
"""

from __future__ import annotations

from prefect import flow, get_run_logger, task
from prefect.artifacts import (
    create_link_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)

from pipeline import rounds, tracking
from pipeline.config import PipelineConfig
from pipeline.rundir import run_lock


@task(task_run_name="{phase}-round-{round_index}")
def phase_task(config: dict, round_index: int, phase: str, inputs: dict) -> rounds.PhaseResult:
    """Run one phase of one round (a no-op when already done)."""
    return rounds.run_phase(PipelineConfig.model_validate(config), round_index, phase, **inputs)


@flow(flow_run_name="round-{round_index}")
def round_flow(config: dict, round_index: int) -> dict:
    """One round of Algorithm 1, a task per phase; a table artifact of its figures."""
    cfg = PipelineConfig.model_validate(config)
    task_ = phase_task.with_options(retries=cfg.orchestration.retries,
                                    retry_delay_seconds=cfg.orchestration.retry_delay_seconds)
    results = rounds.run_round(cfg, round_index, step=lambda r, phase, **inputs: task_(config, r, phase, inputs))
    figures = {k: v for p in ("eval", "reward_model", "collect") for k, v in results[p].metrics.items()}
    create_table_artifact(
        key=f"round-{round_index}", description=f"Round {round_index}: Pass@K, Maj@K, greedy, RM quality",
        table=[{"metric": k, "value": round(v, 4)} for k, v in sorted(figures.items())],
    )
    get_run_logger().info("round %d: %s", round_index, {k: round(v, 3) for k, v in results["eval"].metrics.items()})
    return {phase: result.to_manifest() for phase, result in results.items()}


@flow(name="iterative-rl")
def iterative_rl(config: dict, force: bool = False) -> dict:
    """DeepSeekMath iterative RL (Algorithm 1) over `run.rounds` rounds; resumes an unfinished run directory."""
    cfg = PipelineConfig.model_validate(config)
    rounds.preflight(cfg)  # bad data, model path or tracking URI: fail before the run directory is touched
    with run_lock(cfg.run_dir):
        manifest = rounds.open_run(cfg, force)
        parent = manifest.data["mlflow"]["parent"]
        create_link_artifact(key="mlflow-run", link=f"{tracking.mlflow.get_tracking_uri()}#/runs/{parent}",
                             description="The pipeline's MLflow parent run")
        progress = create_progress_artifact(0.0, description=f"Rounds done of {cfg.run.rounds + 1}")

        def one_round(r: int) -> None:
            round_flow(config, r)
            update_progress_artifact(progress, 100.0 * (r + 1) / (cfg.run.rounds + 1))

        rounds.run_rounds(cfg, one_round)  # ends the rounds' and the parent's MLflow runs
    return {"run_dir": str(cfg.run_dir), "mlflow_run": parent, "tracking_uri": tracking.mlflow.get_tracking_uri()}
