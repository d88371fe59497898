"""Scheduling the iterative flow with Prefect: `serve` (this process runs it on a cron) and `deploy` (to a work pool).

Both allow one run at a time, so a scheduled run never overlaps the previous one on the same run directory.
"""

from __future__ import annotations

from pathlib import Path

from flows.iterative import iterative_rl
from pipeline.config import PipelineConfig

REPO_ROOT = Path(__file__).resolve().parent.parent


def serve(cfg: PipelineConfig, cron: str, name: str | None = None) -> None:
    """Serve the flow from this process with a cron schedule (blocks; Ctrl-C stops serving)."""
    iterative_rl.serve(name=name or cfg.run.name, cron=cron, parameters={"config": cfg.model_dump(mode="json")},
                       global_limit=1)


def deploy(cfg: PipelineConfig, pool: str, cron: str | None = None, name: str | None = None):
    """Register a deployment of the flow on the work pool `pool`, run from this checkout; returns its id."""
    return iterative_rl.from_source(source=str(REPO_ROOT), entrypoint="flows/iterative.py:iterative_rl").deploy(
        name=name or cfg.run.name, work_pool_name=pool, cron=cron, concurrency_limit=1,
        parameters={"config": cfg.model_dump(mode="json")}, build=False, push=False,
    )
