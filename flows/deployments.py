"""Scheduling the iterative flow with Prefect: `serve` (this process runs it on a cron) and `deploy` (to a work pool).

Both allow one run at a time, so a scheduled run never overlaps the previous one on the same run directory.
"""

from __future__ import annotations

from pathlib import Path

from flows.iterative import iterative_rl
from pipeline.config import PipelineConfig


def serve(cfg: PipelineConfig, cron: str, name: str | None = None) -> None:
    """Serve the flow from this process with a cron schedule (blocks; Ctrl-C stops serving)."""
    iterative_rl.serve(name=name or cfg.run.name, cron=cron, parameters={"config": cfg.model_dump(mode="json")},
                       global_limit=1)


def deploy(cfg: PipelineConfig, pool: str, cron: str | None = None, name: str | None = None):
    """Register a deployment of the flow on the work pool `pool`; returns its id.

    Its runs run in this directory, as `igrpo run` would here: the deployment's pull step changes into it, so a
    relative `run.runs_dir` or tracking store resolves against it, not against the checkout. The flow is imported by
    its module path, from the project installed where the worker runs.
    """
    return iterative_rl.from_source(source=str(Path.cwd()), entrypoint="flows.iterative.iterative_rl").deploy(
        name=name or cfg.run.name, work_pool_name=pool, cron=cron, concurrency_limit=1,
        parameters={"config": cfg.model_dump(mode="json")}, build=False, push=False,
    )
