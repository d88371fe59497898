"""A whole run: DeepSeekMath's Algorithm 1 (§4.2, iterative RL), rounds 0..`run.rounds` of the phase table
(`pipeline.phases.PHASES`: policy -> collect -> reward_model -> eval), and its run directory and MLflow runs.

`open_run` creates or reattaches the run directory's manifest and the pipeline's MLflow run; `whole_run` and
`one_round` are the MLflow lifecycle of the pipeline's run and a round's run, as context managers; `run_rounds`
is the loop without Prefect (the flow, `flows/iterative.py`, is the same loop with a subflow per round and a task
per phase). Each phase skips itself when the manifest records it done, so running the rounds again resumes.
"""

from __future__ import annotations

import contextlib

from pipeline import tracking
from pipeline.config import PipelineConfig
from pipeline.phases import PHASES, ensure_run, run_phase
from pipeline.preflight import refuse_changed_config
from pipeline.rundir import Manifest, phase_key


def run_rounds(cfg: PipelineConfig) -> None:
    """Rounds 0..`run.rounds`, each phase of the table in order, in this process (`open_run` first)."""
    with whole_run(cfg):
        for r in range(cfg.run.rounds + 1):
            with one_round(cfg, r):
                for name in PHASES:
                    run_phase(cfg, r, name)


@contextlib.contextmanager
def whole_run(cfg: PipelineConfig):
    """The pipeline's MLflow run around the rounds: FINISHED after them; a stop or a failure ends every run the
    manifest records that is still RUNNING KILLED or FAILED (`end_running`)."""
    parent = Manifest.load(cfg.run_dir).data["mlflow"]["parent"]
    with tracking.ending(parent), tracking.ending_on_exception(lambda status: end_running(cfg, status)):
        yield parent
    tracking.finish(parent)


@contextlib.contextmanager
def one_round(cfg: PipelineConfig, r: int):
    """Round r's MLflow run around its phases: RUNNING again when resumed, FINISHED after them, KILLED or FAILED
    when a phase stops or fails. A round whose phases are all recorded keeps its end time."""
    manifest = Manifest.load(cfg.run_dir)
    round_run = ensure_run(manifest, phase_key(r), manifest.data["mlflow"]["parent"], {"round": str(r)})
    done = all(manifest.done(r, name) for name in PHASES)
    with contextlib.nullcontext() if done else tracking.scope(round_run):
        yield round_run


def open_run(cfg: PipelineConfig, force: bool = False) -> Manifest:
    """Create the run directory's manifest, or check a resumed one against `cfg`; attach the parent MLflow run."""
    current = cfg.model_dump(mode="json")
    try:
        manifest = Manifest.load(cfg.run_dir)
    except FileNotFoundError:
        manifest = Manifest(cfg.run_dir, {"config": current, "phases": {}, "mlflow": {}})
    if not force:
        refuse_changed_config(manifest, cfg)
    manifest.data["config"] = current
    experiment = tracking.connect(cfg.tracking.tracking_uri, cfg.tracking.experiment)
    manifest.data["experiment_id"] = experiment
    manifest.slot("parent")  # gives a new manifest its id: saved before any MLflow run a kill could leave unrecorded
    manifest.save()
    parent = manifest.mlflow_run("parent")
    if parent is None or not tracking.run_exists(parent):
        parent = tracking.find_or_create_run(experiment, manifest.slot("parent"), cfg.run.name,
                                             tags={"igrpo.run_dir": str(cfg.run_dir.resolve())})
        tracking.log_params(parent, tracking.flatten(current))
        manifest.data["mlflow"]["parent"] = parent
    else:
        tracking.reopen(parent)  # resumed: it was ended KILLED (stopped) or FAILED
    manifest.save()
    return manifest


def end_running(cfg: PipelineConfig, status: str) -> None:
    """End every MLflow run the manifest records that is still RUNNING (a phase's run created a moment before a
    signal, before the phase's own `tracking.scope` covers it, included)."""
    try:
        runs = Manifest.load(cfg.run_dir).data["mlflow"]
    except FileNotFoundError:
        runs = {}
    for run_id in runs.values():
        if tracking.run_status(run_id) == "RUNNING":
            tracking.finish(run_id, status)


def abandon(cfg: PipelineConfig) -> None:
    """What a process exiting at once leaves tidy: the run's MLflow runs still RUNNING end KILLED, and the lock
    goes if this process holds it. Outputs need nothing: they are whole or absent."""
    from pipeline.rundir import release_lock

    end_running(cfg, "KILLED")
    release_lock(cfg.run_dir)
