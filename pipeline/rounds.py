"""A whole run: DeepSeekMath's Algorithm 1 (§4.2, iterative RL), rounds 0..`run.rounds` of the phase table
(`pipeline.phases.PHASES`: policy -> collect -> reward_model -> eval), and the executor that runs a phase once and
records it.

`run_rounds` is the loop, the one every caller runs: `igrpo run` and the Prefect flow (`flows/iterative.py`, which
passes a subflow per round and a task per phase as its steps), tests and scripts (with the default steps, in this
process). `open_run` creates or reattaches the run directory's manifest and the pipeline's MLflow run; `whole_run`
and `one_round` are the MLflow lifecycle of the pipeline's run and a round's run, as context managers; `run_phase`
runs one phase unless the manifest records it done, so running the rounds again resumes. Each process of
`accelerate launch` runs a launchable phase's body here too (`launched`: `python -m pipeline.rounds WORK_DIR`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable

from pipeline import tracking
from pipeline.config import PipelineConfig
from pipeline.launchers import LAUNCHERS
from pipeline.phases import PHASES, Phase, PhaseResult, PhaseRuns, phase_line, recorded
from pipeline.dtypes import MLFLOW_PARAMS, run_dtypes
from pipeline.preflight import preflight, refuse_changed_config, refuse_changed_dtype
from pipeline.registry import load_plugins, resolve
from pipeline.rundir import Manifest, RunDir, keep_resumable, phase_key, read_json, run_lock, stop_if_told

log = logging.getLogger(__name__)  # one line per phase; `igrpo` shows it on the console (flows/console.py)

PhaseStep = Callable[[PipelineConfig, int, str], PhaseResult]  # (cfg, round, phase name) -> its result
RoundStep = Callable[[PipelineConfig, int], object]  # (cfg, round): runs the round's phases

# ------------------------------------------------------------------------------------------ the loop


def run_rounds(cfg: PipelineConfig, round_step: RoundStep | None = None, *, force: bool = False,
               checked: bool = False, opened: Callable[[str], None] | None = None) -> str:
    """Rounds 0..`run.rounds`, each by `round_step(cfg, r)` (default `run_round`: its phases in this process),
    under the run directory's lock and inside the pipeline's MLflow run; returns that run's id.

    Args:
        force: resume even though the config changed (`open_run`).
        checked: the caller ran the preflight already (`igrpo run`, before Prefect starts); else it runs here,
            before the run directory is touched.
        opened: called with the pipeline's MLflow run id once the run is open (the flow's link to it).
    """
    if not checked:
        preflight(cfg)  # bad data, model path or tracking URI: fail before the run directory is touched
    with run_lock(cfg.run_dir):
        parent = open_run(cfg, force).data["mlflow"]["parent"]
        if opened:
            opened(parent)
        with whole_run(cfg):  # ends the rounds' and the parent's MLflow runs
            for r in range(cfg.run.rounds + 1):
                (round_step or run_round)(cfg, r)
    return parent


def run_round(cfg: PipelineConfig, r: int, phase_step: PhaseStep | None = None) -> dict[str, PhaseResult]:
    """Round r: each phase of the table in order by `phase_step(cfg, r, name)` (default `run_phase`, in this
    process), inside the round's MLflow run."""
    with one_round(cfg, r):
        return {name: (phase_step or run_phase)(cfg, r, name) for name in PHASES}


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
    current, dtypes = cfg.model_dump(mode="json"), run_dtypes(cfg)
    try:
        manifest = Manifest.load(cfg.run_dir)
        if not force:
            refuse_changed_dtype(manifest, cfg)
    except FileNotFoundError:
        manifest = Manifest(cfg.run_dir, {"config": current, "phases": {}, "mlflow": {}})
    if not force:
        refuse_changed_config(manifest, cfg)
    manifest.data["config"] = current
    manifest.set_dtypes(dtypes)
    experiment = tracking.connect(cfg.tracking.tracking_uri, cfg.tracking.experiment)
    manifest.data["experiment_id"] = experiment
    manifest.slot("parent")  # gives a new manifest its id: saved before any MLflow run a kill could leave unrecorded
    manifest.save()
    parent = manifest.mlflow_run("parent")
    if parent is None or not tracking.run_exists(parent):
        parent = tracking.find_or_create_run(experiment, manifest.slot("parent"), cfg.run.name,
                                             tags={"igrpo.run_dir": str(cfg.run_dir.resolve())})
        tracking.log_params(parent, {**tracking.flatten(current), **{MLFLOW_PARAMS[k]: v for k, v in dtypes.items()}})
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


# ------------------------------------------------------------------------------------------ one phase


def run_phase(cfg: PipelineConfig, round_index: int, name: str, **inputs) -> PhaseResult:
    """Run phase `name` of round `round_index` unless the manifest records it done; record and return it.

    `inputs`: its arguments (paths); by default what its declaration reads of the recorded results.
    """
    manifest = Manifest.load(cfg.run_dir)
    if manifest.done(round_index, name):
        log.info("round %d  %-13s done before: skipped", round_index, name)
        return PhaseResult.from_manifest(manifest.output(round_index, name))
    stop_if_told()
    phase = PHASES[name]
    inputs = inputs or phase.inputs(recorded(cfg, manifest), round_index)  # the manifest read above, not again
    runs = phase_runs(manifest, cfg, round_index, phase)
    start = time.monotonic()
    kwargs = {"round_index": round_index, **inputs}
    try:
        with tracking.scope(runs.run_id, *runs.models.values()):  # stopped or failed: not left RUNNING
            in_process = LAUNCHERS[cfg.launcher.kind].in_process  # else its processes are launched
            if phase.launchable and not in_process:  # round 0's SFT too
                from pipeline.launch import launch_phase

                work = RunDir(cfg.run_dir).launch(round_index, name)
                result = PhaseResult.from_manifest(launch_phase(cfg, name, kwargs, work, dataclasses.asdict(runs),
                                                                launched, resolve(LAUNCHERS[cfg.launcher.kind].start)))
            else:
                result = execute(cfg, name, runs, kwargs)
            stop_if_told()  # told to stop while it ran and it finished all the same: not recorded, a resume redoes it
            if phase.registers:
                result = dataclasses.replace(result, versions=_register(cfg, runs, round_index,
                                                                        phase.registers(cfg, result)))
            tracking.log_metrics(runs.run_id, result.metrics)
            tracking.log_metrics(runs.pipeline, result.metrics, step=round_index)  # cross-round curves
    except BaseException:
        # Checkpoints and finished batches stay for the next attempt (`pipeline.resume`); nothing half-written does.
        keep_resumable(RunDir(cfg.run_dir).round(round_index))
        raise
    manifest = Manifest.load(cfg.run_dir)
    manifest.record(round_index, name, result.to_manifest())
    log.info("%s", phase_line(round_index, name, time.monotonic() - start, result.metrics))
    return result


def execute(cfg: PipelineConfig, name: str, runs: PhaseRuns, kwargs: dict) -> PhaseResult:
    """A phase's body in this process (the pipeline's, or each process of `accelerate launch`)."""
    with runs.active():
        return PHASES[name].body(kwargs["round_index"])(cfg, runs, **kwargs)


def _register(cfg: PipelineConfig, runs: PhaseRuns, round_index: int, paths: dict[str, str]) -> dict[str, str]:
    """Each checkpoint in `paths` (kind -> path) as a version of the run's model of its kind
    (`tracking.model_name`), alias `round-<r>`."""
    return {kind: tracking.register_checkpoint(
        runs.run_id, path, tracking.model_name(cfg.tracking.experiment, cfg.run.name, kind), round_index,
        runs.pipeline) for kind, path in paths.items()}


def phase_runs(manifest: Manifest, cfg: PipelineConfig, round_index: int, phase: Phase) -> PhaseRuns:
    """The phase's MLflow runs (below the round's, below the pipeline's), created once and reused on resume."""
    pipeline = manifest.data["mlflow"]["parent"]
    tags = {"round": str(round_index)}
    round_run = ensure_run(manifest, phase_key(round_index), pipeline, tags)
    tags["phase"] = phase.name
    run_id = ensure_run(manifest, phase_key(round_index, phase.name), round_run, tags)
    kinds = phase.models(cfg, round_index) if phase.models else []
    models = {kind: ensure_run(manifest, phase_key(round_index, phase.name, kind), run_id, tags) for kind in kinds}
    return PhaseRuns(run_id, models, pipeline)


def ensure_run(manifest: Manifest, key: str, parent: str, tags: dict) -> str:
    """The MLflow run the manifest records under `key`, created (below `parent`) and recorded if it has none."""
    run_id = manifest.mlflow_run(key)
    if run_id is None or not tracking.run_exists(run_id):
        run_id = tracking.find_or_create_run(manifest.data["experiment_id"], manifest.slot(key),
                                             key.replace("/", "-"), parent, tags)
        manifest.set_mlflow_run(key, run_id)
    return run_id


def launched(argv: list[str] | None = None) -> None:
    """Each process of `accelerate launch` (`pipeline.launch.launch_phase`): `python -m pipeline.rounds WORK_DIR`.

    Runs the phase's body as the pipeline's process would (`execute`); the main process writes its result.
    """
    import os
    import sys
    from pathlib import Path

    from pipeline.loading import config_from_dict
    from pipeline.rundir import write_json_atomic

    load_plugins()  # a process of its own: the plugins' phases, kinds and modes are registered here too
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1:
        raise SystemExit("usage: python -m pipeline.rounds WORK_DIR (started by pipeline.launch.launch_phase)")
    work_dir = Path(argv[0])
    request = read_json(work_dir / "request.json")
    cfg = config_from_dict(request["config"], check_trl=False)  # checked in full by the parent
    with contextlib.suppress(FileNotFoundError):  # every process, on any node, runs in the dtypes the run records
        refuse_changed_dtype(Manifest.load(cfg.run_dir), cfg)
    main_process = int(os.environ.get("RANK", "0")) == 0
    # Only the main process logs: its runs are made active around the trainers, as in the pipeline's process.
    runs = PhaseRuns(**request["runs"], logging=main_process)
    result = execute(cfg, request["phase"], runs, request["kwargs"])
    if main_process:
        write_json_atomic(work_dir / "result.json", result.to_manifest())
    with contextlib.suppress(Exception):  # the group may already be gone; nothing is left to synchronise
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    launched()
