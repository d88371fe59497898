"""The iterative RL flow: `pipeline.rounds.run_rounds` with a Prefect subflow per round and a task per phase of
`pipeline.phases.PHASES` as its steps.

Flows only orchestrate: the loop (lock, preflight, run directory, MLflow runs) is `pipeline.rounds`', what each
phase reads of the earlier ones (Algorithm 1's data flow) is declared in the phase table, and `run_phase` reads it
from the run directory's manifest and skips what is recorded as done, so re-running the flow on a run directory
resumes it. Tasks pass a round and a phase's name, never models; this module adds Prefect's retries and artifacts.
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
from pipeline.phases import PhaseResult
from pipeline.registry import load_plugins
from pipeline.rounds import run_phase


@task(task_run_name="{phase}-round-{round_index}")
def phase_task(config: dict, round_index: int, phase: str) -> PhaseResult:
    """Run one phase of one round (a no-op when already done)."""
    return run_phase(PipelineConfig.model_validate(config), round_index, phase)


@flow(flow_run_name="round-{round_index}")
def round_flow(config: dict, round_index: int) -> dict:
    """One round of Algorithm 1, a task per phase; a table artifact of its figures."""
    cfg = PipelineConfig.model_validate(config)
    task_ = phase_task.with_options(retries=cfg.orchestration.retries,
                                    retry_delay_seconds=cfg.orchestration.retry_delay_seconds)
    results = rounds.run_round(cfg, round_index, lambda _cfg, r, name: task_(config, r, name))
    figures = {k: v for p in ("eval", "reward_model", "collect") for k, v in results[p].metrics.items()}
    create_table_artifact(
        key=f"round-{round_index}", description=f"Round {round_index}: Pass@K, Maj@K, greedy, RM quality",
        table=[{"metric": k, "value": round(v, 4)} for k, v in sorted(figures.items())],
    )
    get_run_logger().info("round %d: %s", round_index, {k: round(v, 3) for k, v in results["eval"].metrics.items()})
    return {phase: result.to_manifest() for phase, result in results.items()}


@flow(name="iterative-rl")
def iterative_rl(config: dict, force: bool = False, checked: bool = False) -> dict:
    """DeepSeekMath iterative RL (Algorithm 1) over `run.rounds` rounds; resumes an unfinished run directory.

    `checked`: the caller ran the preflight already (`igrpo run`), so it is not run twice.
    """
    load_plugins()  # a deployment's run starts in a Prefect worker's process of its own
    cfg = PipelineConfig.model_validate(config)
    total = cfg.run.rounds + 1
    progress = None  # made once the run is open: a refused run leaves none

    def opened(parent: str) -> None:
        nonlocal progress
        create_link_artifact(key="mlflow-run", link=f"{tracking.mlflow.get_tracking_uri()}#/runs/{parent}",
                             description="The pipeline's MLflow parent run")
        progress = create_progress_artifact(0.0, description=f"Rounds done of {total}")

    def round_step(cfg: PipelineConfig, r: int) -> None:
        round_flow(config, r)
        update_progress_artifact(progress, 100.0 * (r + 1) / total)

    parent = rounds.run_rounds(cfg, round_step, force=force, checked=checked, opened=opened)
    return {"run_dir": str(cfg.run_dir), "mlflow_run": parent, "tracking_uri": tracking.mlflow.get_tracking_uri()}
