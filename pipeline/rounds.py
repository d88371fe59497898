"""DeepSeekMath's Algorithm 1 (§4.2, iterative RL) over a registry of phases, each run once and recorded.

`run_round` is one round of the algorithm, written as data flow between phases: round 0 bootstraps the
policy (SFT, or the given model), round r trains it with GRPO against round r-1's reward models; then
collect -> reward_model -> eval. `PHASES` declares each phase: its function, whether it may run under
`accelerate launch`, and how it logs to MLflow. `run_phase` runs a phase unless the manifest records it
done, so running the rounds again resumes a killed run. The Prefect flow (`flows/iterative.py`) passes its
task wrapper as `step`; nothing here imports Prefect.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pipeline import tracking
from pipeline.config import PipelineConfig, resumed_config_diff
from pipeline.problems import problem_set_from_config
from pipeline.rundir import Manifest, RunDir, RunDirError, phase_key, read_json, refuse_if_locked, stop_if_told

log = logging.getLogger(__name__)  # one line per phase; `igrpo` shows it on the console (flows/console.py)

# --------------------------------------------------------------------------------------- phase records


@dataclass(frozen=True)
class PhaseResult:
    """What a finished phase records in the manifest: its output(s) and metrics."""

    metrics: dict[str, float]
    path: str | None = None  # its one output: a checkpoint, a shard, eval.json
    paths: dict[str, str] | None = None  # or one checkpoint per trained model, by kind
    versions: dict[str, str] | None = None  # MLflow model versions registered, by kind

    def to_manifest(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    @classmethod
    def from_manifest(cls, data: dict) -> PhaseResult:
        return cls(**data)


@dataclass(frozen=True)
class PhaseRuns:
    """The MLflow runs a phase logs into: its own, one per trained model, and the pipeline's (cross-round)."""

    run_id: str | None = None
    models: dict[str, str] = field(default_factory=dict)
    pipeline: str | None = None
    logging: bool = True  # False on the other processes of `accelerate launch`: only the main one logs

    @property
    def report_to(self) -> str:
        return "mlflow" if self.run_id or self.models else "none"

    def active(self):
        """The phase's run made active around its body; not for phases with a run per model."""
        return tracking.active(self.run_id if self.logging and not self.models else None)

    def model(self, kind: str):
        """The run of one trained model made active (MLflow refuses one param with two values in one run)."""
        return tracking.active(self.models.get(kind) if self.logging else None)


# --------------------------------------------------------------------------------------------- phases


def _bootstrap(cfg: PipelineConfig, runs: PhaseRuns, round_index: int) -> PhaseResult:
    """π_0: SFT on the gold solutions (or the given model as it is)."""
    from pipeline.bootstrap import run_bootstrap

    res = run_bootstrap(cfg, RunDir(cfg.run_dir).policy(round_index))
    return PhaseResult(res.metrics, path=str(res.policy_path))


def _grpo(cfg: PipelineConfig, runs: PhaseRuns, round_index: int, policy: str,
          reward_models: dict[str, str]) -> PhaseResult:
    """GRPO from `policy` against `reward_models`, the reference model reset to `policy`."""
    from pipeline.policy import run_policy_phase

    res = run_policy_phase(cfg, problem_set_from_config(cfg), policy, RunDir(cfg.run_dir).policy(round_index),
                           round_index, reward_models, report_to=runs.report_to)
    return PhaseResult(res.metrics, path=str(res.policy_path))


def _collect(cfg: PipelineConfig, runs: PhaseRuns, round_index: int, policy: str) -> PhaseResult:
    from pipeline.collect import run_collection_phase

    res = run_collection_phase(cfg, problem_set_from_config(cfg), policy, cfg.run_dir, round_index)
    return PhaseResult(res.metrics, path=str(res.shard_path))


def _reward_model(cfg: PipelineConfig, runs: PhaseRuns, round_index: int, policy: str,
                  previous: dict[str, str] | None = None) -> PhaseResult:
    from pipeline.reward_model import run_reward_model_phase

    res = run_reward_model_phase(cfg, cfg.run_dir, round_index, policy, previous, report_to=runs.report_to,
                                 run_context=runs.model)
    return PhaseResult(res.metrics, paths={k: str(v) for k, v in res.paths.items()})


def _trained_rms(cfg: PipelineConfig, round_index: int) -> list[str]:
    """The RMs a round trains (none after round 0 when they are frozen): each gets an MLflow run."""
    return list(cfg.reward_model.kinds) if cfg.reward_model.retrain or round_index == 0 else []


def _eval(cfg: PipelineConfig, runs: PhaseRuns, round_index: int, policy: str, reward_models: dict[str, str],
          trained_against: dict[str, str], shard: str) -> PhaseResult:
    from pipeline.eval_phase import plot_rounds, run_eval_phase
    from pipeline.sample_tables import TABLES

    run = RunDir(cfg.run_dir)
    res = run_eval_phase(cfg, policy, round_index, reward_models, trained_against, shard,
                         json_path=run.eval_json(round_index), plot_path=run.eval_plot(round_index))
    tracking.log_artifact(runs.run_id, res.plot_path)
    for name, rows in res.tables.items():  # the same file names every round: MLflow compares them across runs
        tracking.log_table(runs.run_id, rows, TABLES[name])
    curves = {q: read_json(run.eval_json(q))["curve"] for q in run.rounds()
              if q <= round_index and run.eval_json(q).exists()}
    tracking.log_artifact(runs.pipeline, plot_rounds(curves, run.rounds_plot))
    return PhaseResult(res.metrics, path=str(res.json_path))


@dataclass(frozen=True)
class Phase:
    """A phase of a round, declared: what runs, where it may run, how it logs to MLflow."""

    name: str
    run: Callable[..., PhaseResult]  # run(cfg, runs, round_index, **inputs); inputs are paths (JSON)
    first: Callable[..., PhaseResult] | None = None  # what round 0 runs instead, if anything (Algorithm 1's π_0)
    launchable: bool = False  # `run` goes under `accelerate launch` with `launcher.kind: accelerate`
    models: Callable[[PipelineConfig, int], list[str]] | None = None  # one MLflow run per model it trains
    # The checkpoints of its result (by kind) that become MLflow model versions `<experiment>-<kind>`.
    registers: Callable[[PipelineConfig, PhaseResult], dict[str, str]] | None = None
    figures: tuple[str, ...] = ()  # its key metrics, for the console line when it ends (`@K`: the largest K)


def _policy_checkpoint(cfg: PipelineConfig, result: PhaseResult) -> dict[str, str]:
    return {"policy": result.path} if cfg.tracking.register_policy and result.path else {}


def _rm_checkpoints(cfg: PipelineConfig, result: PhaseResult) -> dict[str, str]:
    return dict(result.paths or {}) if cfg.tracking.register_models else {}


PHASES: dict[str, Phase] = {p.name: p for p in (
    Phase("policy", _grpo, first=_bootstrap, launchable=True, registers=_policy_checkpoint,
          figures=("sft/train_loss", "policy/reward_start", "policy/reward_end",
                   "policy/process_variance_share")),
    Phase("collect", _collect, figures=("collect/samples", "collect/verifier_accuracy", "collect/he_gold_agreement")),
    Phase("reward_model", _reward_model, launchable=True, models=_trained_rms, registers=_rm_checkpoints,
          figures=("prm/step_auc_mc", "prm/step_auc_gold", "orm/auc")),
    Phase("eval", _eval, figures=("eval/greedy", "eval/pass@1", "eval/maj@K", "eval/pass@K")),
)}


def key_figures(metrics: dict[str, float], figures: tuple[str, ...]) -> dict[str, float]:
    """The metrics named in `figures` that are present, in that order; a name ending in `@K` picks the largest K.

    >>> key_figures({"eval/maj@1": 0.5, "eval/maj@16": 0.8, "eval/greedy": 0.7}, ("eval/greedy", "eval/maj@K", "x"))
    {'eval/greedy': 0.7, 'eval/maj@16': 0.8}
    """
    out = {}
    for name in figures:
        if name.endswith("@K"):
            ks = [int(k) for key in metrics if key.startswith(name[:-1]) and (k := key[len(name) - 1:]).isdigit()]
            name = f"{name[:-1]}{max(ks)}" if ks else name
        if name in metrics:
            out[name] = metrics[name]
    return out


def phase_line(round_index: int, name: str, seconds: float, metrics: dict[str, float]) -> str:
    """The console's line for a finished phase: round, phase, wall time, key figures."""
    shown = "  ".join(f"{k} {int(v) if float(v).is_integer() and abs(v) >= 2 else f'{v:.3f}'}"
                      for k, v in key_figures(metrics, PHASES[name].figures).items())
    return f"round {round_index}  {name:<13}{seconds:5.0f}s  {shown}"


# ------------------------------------------------------------------------------------------ Algorithm 1

Step = Callable[..., PhaseResult]  # step(round_index, phase, **inputs)


def run_round(cfg: PipelineConfig, r: int, step: Step | None = None) -> dict[str, PhaseResult]:
    """Round `r` of Algorithm 1. `step` runs one phase (default `run_phase`; the flow gives a Prefect task)."""
    step = step or (lambda round_index, name, **inputs: run_phase(cfg, round_index, name, **inputs))
    if r == 0:  # π_0 (the policy phase's `first`): SFT on the gold solutions; the RMs start from its backbone
        policy = step(r, "policy")
        previous_rms = None
    else:  # GRPO from π_{r-1} against round r-1's RMs, the reference model reset to π_{r-1}
        before = recorded_round(cfg, r - 1)
        previous_rms = before["reward_model"].paths
        policy = step(r, "policy", policy=before["policy"].path, reward_models=previous_rms)
    shard = step(r, "collect", policy=policy.path)
    rms = step(r, "reward_model", policy=policy.path, previous=previous_rms)  # warm start, new shard + replay
    ev = step(r, "eval", policy=policy.path, reward_models=rms.paths, shard=shard.path,
              trained_against=previous_rms or rms.paths)  # what GRPO read of these: the hacking monitor's
    return {"policy": policy, "collect": shard, "reward_model": rms, "eval": ev}


def run_rounds(cfg: PipelineConfig, round_fn: Callable[[int], object] | None = None) -> None:
    """Rounds 0..`run.rounds` in order (`round_fn(r)` default: `run_round`; the flow gives a subflow).

    Each round's MLflow run, then the pipeline's, ends FINISHED; a round that stops ends them KILLED (a signal,
    a cancellation) or FAILED (an error), and a resumed round is RUNNING again.
    """
    round_fn = round_fn or (lambda q: run_round(cfg, q))
    parent = Manifest.load(cfg.run_dir).data["mlflow"]["parent"]
    with tracking.ending(parent), _ending_recorded(cfg):
        for r in range(cfg.run.rounds + 1):
            manifest = Manifest.load(cfg.run_dir)  # fresh: the phases record into it
            round_run = _ensure_run(manifest, phase_key(r), parent, {"round": str(r)})
            if not all(manifest.done(r, name) for name in PHASES):  # a finished round keeps its end time
                tracking.reopen(round_run)
                with tracking.ending(round_run):
                    round_fn(r)
                tracking.finish(round_run)
            else:
                round_fn(r)  # every phase skipped; the flow still shows the round
    tracking.finish(parent)


def recorded_round(cfg: PipelineConfig, r: int) -> dict[str, PhaseResult]:
    """The recorded results of a finished round's phases."""
    manifest = Manifest.load(cfg.run_dir)
    return {name: PhaseResult.from_manifest(manifest.output(r, name)) for name in PHASES}


# ------------------------------------------------------------------------------------------ one phase


def run_phase(cfg: PipelineConfig, round_index: int, name: str, **inputs) -> PhaseResult:
    """Run phase `name` of round `round_index` unless the manifest records it done; record and return it."""
    manifest = Manifest.load(cfg.run_dir)
    if manifest.done(round_index, name):
        log.info("round %d  %-13s done before: skipped", round_index, name)
        return PhaseResult.from_manifest(manifest.output(round_index, name))
    stop_if_told()
    phase = PHASES[name]
    runs = phase_runs(manifest, cfg, round_index, phase)
    start = time.monotonic()
    kwargs = {"round_index": round_index, **inputs}
    with tracking.ending(runs.run_id, *runs.models.values()):  # stopped or failed: not left RUNNING
        tracking.reopen(runs.run_id)  # a resumed phase's run was ended KILLED or FAILED (inside: a signal may land here)
        if phase.launchable and cfg.launcher.kind == "accelerate" and _body(phase, round_index) is phase.run:
            from pipeline.launch import launch_phase

            result = launch_phase(cfg, name, kwargs, RunDir(cfg.run_dir).launch(round_index, name), runs)
        else:
            result = execute(cfg, name, runs, kwargs)
        stop_if_told()  # told to stop while it ran, and it finished all the same: not recorded, a resume redoes it
        if phase.registers:
            result = dataclasses.replace(result, versions=_register(cfg, runs, round_index, phase.registers(cfg, result)))
        tracking.log_metrics(runs.run_id, result.metrics)
        tracking.log_metrics(runs.pipeline, result.metrics, step=round_index)  # cross-round curves
    tracking.finish(runs.run_id)
    manifest = Manifest.load(cfg.run_dir)
    manifest.record(round_index, name, result.to_manifest())
    log.info("%s", phase_line(round_index, name, time.monotonic() - start, result.metrics))
    return result


def execute(cfg: PipelineConfig, name: str, runs: PhaseRuns, kwargs: dict) -> PhaseResult:
    """A phase's body in this process (the pipeline's, or each process of `accelerate launch`)."""
    with runs.active():
        return _body(PHASES[name], kwargs["round_index"])(cfg, runs, **kwargs)


def _body(phase: Phase, round_index: int) -> Callable[..., PhaseResult]:
    return phase.first if round_index == 0 and phase.first else phase.run


def _register(cfg: PipelineConfig, runs: PhaseRuns, round_index: int, paths: dict[str, str]) -> dict[str, str]:
    """Each checkpoint in `paths` (kind -> path) as a version of `<experiment>-<kind>`, alias `round-<r>`."""
    return {kind: tracking.register_checkpoint(runs.run_id, path, f"{cfg.tracking.experiment}-{kind}", round_index,
                                               runs.pipeline) for kind, path in paths.items()}


def phase_runs(manifest: Manifest, cfg: PipelineConfig, round_index: int, phase: Phase) -> PhaseRuns:
    """The phase's MLflow runs (below the round's, below the pipeline's), created once and reused on resume."""
    pipeline = manifest.data["mlflow"]["parent"]
    tags = {"round": str(round_index)}
    round_run = _ensure_run(manifest, phase_key(round_index), pipeline, tags)
    tags["phase"] = phase.name
    run_id = _ensure_run(manifest, phase_key(round_index, phase.name), round_run, tags)
    kinds = phase.models(cfg, round_index) if phase.models else []
    models = {kind: _ensure_run(manifest, phase_key(round_index, phase.name, kind), run_id, tags) for kind in kinds}
    return PhaseRuns(run_id, models, pipeline)


def _ensure_run(manifest: Manifest, key: str, parent: str, tags: dict) -> str:
    run_id = manifest.mlflow_run(key)
    if run_id is None or not tracking.run_exists(run_id):
        run_id = tracking.find_or_create_run(manifest.data["experiment_id"], manifest.slot(key),
                                             key.replace("/", "-"), parent, tags)
        manifest.set_mlflow_run(key, run_id)
    return run_id


# ---------------------------------------------------------------------------------------- a whole run


def _problems(cfg: PipelineConfig) -> str:
    from pipeline.eval_phase import held_out_problems

    problems = problem_set_from_config(cfg)
    held_out_problems(cfg, problems)
    return f"{problems.name}: {len(problems.train)} train, {len(problems.test)} held-out problems"


def _model(spec: str, field: str, causal_lm: bool = False) -> str:
    from models.factories import check_model_available

    path, gguf = check_model_available(spec, field, causal_lm=causal_lm)
    return f"{path}/{gguf}" if gguf else path


def _policy_model(cfg: PipelineConfig) -> str:
    return "tiny (built here)" if cfg.policy.model == "tiny" else _model(cfg.policy.model, "policy.model", causal_lm=True)


def _reward_model_backbone(cfg: PipelineConfig) -> str:
    spec = cfg.reward_model.model
    return "the round's policy" if spec is None else _model(spec, "reward_model.model")


def _prompts(cfg: PipelineConfig) -> str:
    from pipeline.prompts import check_prompt_format

    try:
        problem = problem_set_from_config(cfg).train[0]
    except Exception:  # the problems check reports it
        return "not checked: the problem set does not load"
    try:
        _policy_model(cfg)
    except Exception:  # the policy.model check reports it
        return "not checked: the policy does not load"
    return f"prompt format {check_prompt_format(cfg, problem)}"


# GRPOTrainer's own keyword arguments, which a probe before any training cannot give a reward function.
_TRL_ONLY_KWARGS = {"completion_ids", "trainer_state", "log_extra", "log_metric", "environments"}


def _rewards(cfg: PipelineConfig) -> str:
    """Call each GRPO reward function that needs no trained RM on the gold solutions of a few training problems,
    as GRPO will (the dataset's columns as keyword arguments; the prompt as plain text), so that one which
    raises or returns NaN, a string or the wrong count fails now, as `checked`'s RewardError, not after round 0."""
    from pipeline.rewards import REWARD_FUNCS, RewardError, active_rewards, build_reward_func

    try:
        problem_set = problem_set_from_config(cfg)
    except Exception:  # the problems check reports it
        return "not checked: the problem set does not load"
    problems = problem_set.train[:8]
    names = [n for n in active_rewards(cfg.supervision.mode, cfg.supervision.rewards)
             if REWARD_FUNCS[n].reward_model is None]
    columns = {"prompts": [p.prompt for p in problems], "prompt": [p.prompt for p in problems],
               "prompt_text": [p.prompt for p in problems], "answer": [p.answer for p in problems],
               "prompt_id": [p.id for p in problems], "solution": [p.solution for p in problems]}
    probed = []
    for name in names:
        try:
            build_reward_func(name, problem_set, {})([p.solution for p in problems], **columns)
        except RewardError as e:
            if isinstance(e.__cause__, KeyError) and e.__cause__.args and e.__cause__.args[0] in _TRL_ONLY_KWARGS:
                continue  # it reads what only GRPO gives: GRPO's own call checks it
            raise RewardError(f"supervision.rewards: {e} (probed on the gold solutions of {len(problems)} "
                              "training problems before any work)") from e
        probed.append(name)
    return f"{', '.join(probed) or 'none'} probed on {len(problems)} gold solutions"


def _launcher(cfg: PipelineConfig) -> str:
    if cfg.launcher.kind == "local":
        return "local (this process)"
    from pipeline.launch import check_launchable

    check_launchable(cfg.launcher)
    return f"accelerate launch ({cfg.launcher.config_file or 'accelerate default config'})"


def _runs_dir_is_a_folder(cfg: PipelineConfig) -> None:
    """A RunDirError naming `run.runs_dir` where it, or a folder above it, is a file: the run could not start."""
    from pathlib import Path

    for path in (cfg.run_dir, *cfg.run_dir.parents):
        if path.exists() and not path.is_dir():
            raise RunDirError(f"run.runs_dir: {str(Path(cfg.run.runs_dir))!r} cannot hold run directories: "
                              f"{str(path)!r} is a file, not a folder")


def _run_directory(cfg: PipelineConfig) -> str:
    """What `igrpo run` would do with the run directory; a RunDirError where it would refuse."""
    _runs_dir_is_a_folder(cfg)
    refuse_if_locked(cfg.run_dir)
    try:
        manifest = Manifest.load(cfg.run_dir)
    except FileNotFoundError:
        return f"{cfg.run_dir}: new (will be created)"
    refuse_changed_config(manifest, cfg)
    return f"{cfg.run_dir}: resumes it ({len(manifest.data['phases'])} phases done)"


def refuse_changed_config(manifest: Manifest, cfg: PipelineConfig) -> None:
    """A RunDirError listing the differing keys when the run directory was started with another config."""
    diff = resumed_config_diff(manifest.data["config"], cfg)
    if diff:
        raise RunDirError(
            f"{cfg.run_dir} was started with another config; differing keys:\n  " + "\n  ".join(diff)
            + "\nUse another run.name, or --force to continue with the new config"
        )


def preflight(cfg: PipelineConfig) -> None:
    """What can be checked before any work: the problem set loads, the policy's and the RMs' model specs resolve
    and their checkpoints are whole, the prompt format suits its tokenizer, the reward functions that need no RM
    score gold solutions, MLflow answers.

    Raises the loader's own clear error (naming the file, row, path or URI); writes nothing in the run dir.
    """
    _runs_dir_is_a_folder(cfg)
    _problems(cfg)
    _policy_model(cfg)
    _reward_model_backbone(cfg)
    _prompts(cfg)
    _rewards(cfg)
    _launcher(cfg)
    tracking.connect(cfg.tracking.tracking_uri, cfg.tracking.experiment)


def check_run(cfg: PipelineConfig) -> tuple[dict[str, str], list[str]]:
    """`igrpo check`: the preflight, creating nothing (MLflow's store is probed, not opened), and the run directory.

    Every check runs, so all problems show at once. Returns (what each check found, the errors).
    """
    checks = {
        "problems": _problems,
        "policy.model": _policy_model,
        "reward_model.model": _reward_model_backbone,
        "problems.prompt_format": _prompts,
        "supervision.rewards": _rewards,
        "launcher": _launcher,
        "tracking": lambda c: tracking.probe(c.tracking.tracking_uri, c.tracking.experiment),
        "run directory": _run_directory,
    }
    found, errors = {}, []
    for name, check in checks.items():
        try:
            found[name] = check(cfg)
        except (ValueError, OSError, RuntimeError) as e:  # the loaders' and checks' own errors, one line each
            errors.append(str(e))
    return found, errors


def end_running(cfg: PipelineConfig, status: str) -> None:
    """End every MLflow run the manifest records that is still RUNNING (a phase's run created a moment before a
    signal, before the phase's own `tracking.ending` covers it, included)."""
    try:
        runs = Manifest.load(cfg.run_dir).data["mlflow"]
    except FileNotFoundError:
        runs = {}
    for run_id in runs.values():
        if tracking.run_status(run_id) == "RUNNING":
            tracking.finish(run_id, status)


def _ending_recorded(cfg: PipelineConfig):
    return tracking.ending_on_exception(lambda status: end_running(cfg, status))


def abandon(cfg: PipelineConfig) -> None:
    """What a process exiting at once leaves tidy: the run's MLflow runs still RUNNING end KILLED, and the lock
    goes if this process holds it. Outputs need nothing: they are whole or absent."""
    from pipeline.rundir import release_lock

    end_running(cfg, "KILLED")
    release_lock(cfg.run_dir)


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
