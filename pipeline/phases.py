"""The phases of a round as one table, `PHASES`: each phase's body and how it is run, declared as data.

Each phase is declared: its body, what it reads of the results already recorded (DeepSeekMath's Algorithm 1,
§4.2, as data flow: round r's GRPO starts from round r-1's policy against round r-1's reward models, and so on),
what round 0 runs instead (π_0: SFT, or the given model), whether it may run under `accelerate launch`, and how it
logs to MLflow. Data moves between phases as paths recorded in the manifest, never as objects, so a phase runs
alone (`igrpo` and a Prefect task alike give only its round and name), and a run resumes at the first phase not
recorded. The executor that runs a phase once and records it, and the loop over the table, are `pipeline.rounds`.
Nothing here imports Prefect.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from pipeline import tracking
from pipeline.config import PipelineConfig
from pipeline.problems import problem_set_from_config
from pipeline.registry import Registry
from pipeline.rundir import Manifest, RunDir, RunDirError, phase_key, read_json, round_of

# --------------------------------------------------------------------------------------- phase records


@dataclass(frozen=True)
class PhaseResult:
    """What a finished phase records in the manifest: its output(s) and metrics."""

    metrics: dict[str, float]
    path: str | None = None  # its one output: a checkpoint, a shard, eval.json
    paths: dict[str, str] | None = None  # or one checkpoint per trained model, by kind (GRPO: those it updated online)
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


# ------------------------------------------------------------------------------------ the phases' bodies


# A body writes where the run directory puts its outputs; `out` / `run_dir` are for `igrpo grpo --out`, `igrpo collect
# --run-dir` and the like (flows/cli.py), which run the same body on their own, outside a run.


def _bootstrap(cfg: PipelineConfig, runs: PhaseRuns, round_index: int, out: str | None = None, **_) -> PhaseResult:
    """π_0: SFT on the gold solutions (or the given model as it is)."""
    from pipeline.bootstrap import run_bootstrap

    res = run_bootstrap(cfg, out or RunDir(cfg.run_dir).policy(round_index))
    return PhaseResult(res.metrics, path=str(res.policy_path))


def _grpo(cfg: PipelineConfig, runs: PhaseRuns, round_index: int, policy: str,
          reward_models: dict[str, str] | None, out: str | None = None) -> PhaseResult:
    """GRPO from `policy` against `reward_models`, the reference model reset to `policy`."""
    from pipeline.policy import run_policy_phase, value_source

    if cfg.supervision.process_reward == "progress" and runs.logging and runs.run_id:  # whose values are credited
        tracking.log_params(runs.run_id, {"process/value_source": value_source(cfg)})
    res = run_policy_phase(cfg, problem_set_from_config(cfg), policy, out or RunDir(cfg.run_dir).policy(round_index),
                           round_index, reward_models, report_to=runs.report_to)
    online = {kind: str(p) for kind, p in res.online_reward_models.items()}  # PRIME's PRM as it left it
    return PhaseResult(res.metrics, path=str(res.policy_path), paths=online or None)


def _collect(cfg: PipelineConfig, runs: PhaseRuns, round_index: int, policy: str,
             run_dir: str | None = None) -> PhaseResult:
    from pipeline.collect import run_collection_phase

    res = run_collection_phase(cfg, problem_set_from_config(cfg), policy, run_dir or cfg.run_dir, round_index)
    return PhaseResult(res.metrics, path=str(res.shard_path))


def _reward_model(cfg: PipelineConfig, runs: PhaseRuns, round_index: int, policy: str,
                  previous: dict[str, str] | None = None, run_dir: str | None = None) -> PhaseResult:
    from pipeline.reward_model import run_reward_model_phase

    res = run_reward_model_phase(cfg, run_dir or cfg.run_dir, round_index, policy, previous,
                                 report_to=runs.report_to, run_context=runs.model)
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


# ------------------------------------------------------------------------------------------ the table

# done(r, name): the recorded result of phase `name` of round r, None before round 0 (nothing is recorded there).
Done = Callable[[int, str], "PhaseResult | None"]


def _paths(result: PhaseResult | None) -> dict[str, str] | None:
    return result.paths if result else None


@dataclass(frozen=True)
class Phase:
    """A phase of a round, declared: what runs, what it reads, where it may run, how it logs to MLflow."""

    name: str
    run: Callable[..., PhaseResult]  # run(cfg, runs, round_index, **inputs); inputs are paths (JSON)
    inputs: Callable[[Done, int], dict]  # its inputs in round r, from what earlier phases recorded
    first: Callable[..., PhaseResult] | None = None  # what round 0 runs instead, if anything (Algorithm 1's π_0)
    launchable: bool = False  # `run` goes under `accelerate launch` with `launcher.kind: accelerate`
    models: Callable[[PipelineConfig, int], list[str]] | None = None  # one MLflow run per model it trains
    # The checkpoints of its result (by kind) that become MLflow model versions `<experiment>-<run>-<kind>`.
    registers: Callable[[PipelineConfig, PhaseResult], dict[str, str]] | None = None
    figures: tuple[str, ...] = ()  # its key metrics, for the console line when it ends (`@K`: the largest K)

    def body(self, round_index: int) -> Callable[..., PhaseResult]:
        return self.first if round_index == 0 and self.first else self.run


def _policy_checkpoint(cfg: PipelineConfig, result: PhaseResult) -> dict[str, str]:
    return {"policy": result.path} if cfg.tracking.register_policy and result.path else {}


def _rm_checkpoints(cfg: PipelineConfig, result: PhaseResult) -> dict[str, str]:
    return dict(result.paths or {}) if cfg.tracking.register_models else {}


def _rm_warm_starts(done: Done, r: int) -> dict[str, str] | None:
    """What round r's RM phase warm-starts from: round r-1's RMs, each replaced by the one round r's GRPO updated online
    (PRIME's implicit PRM, recorded in the policy phase's `paths`), which carries its updates forward."""
    return {**(_paths(done(r - 1, "reward_model")) or {}), **(_paths(done(r, "policy")) or {})} or None


def _grpo_inputs(done: Done, r: int) -> dict:
    before = done(r - 1, "policy")  # None in round 0, which bootstraps π_0 instead (`first`)
    return {"policy": before.path, "reward_models": _paths(done(r - 1, "reward_model"))} if before else {}


# In run order; `PHASES.register(NAME, after="collect", run=..., inputs=...)` puts a phase in every round, recorded
# in the manifest as the others (a resumed run skips it once done).
PHASES: Registry[Phase] = Registry("phase", Phase, {p.name: p for p in (
    # π_r: GRPO from π_{r-1} against round r-1's RMs, the reference model reset to π_{r-1}; π_0 by SFT.
    Phase("policy", _grpo, _grpo_inputs, first=_bootstrap, launchable=True, registers=_policy_checkpoint,
          figures=("sft/train_loss", "policy/reward_start", "policy/reward_end",
                   "policy/process_variance_share")),
    # Fresh samples of π_r, labelled by the verifier and by MC step rollouts.
    Phase("collect", _collect, lambda done, r: {"policy": done(r, "policy").path},
          figures=("collect/samples", "collect/verifier_accuracy", "collect/he_gold_agreement")),
    # RMs warm-started from round r-1's (afresh from π_r's backbone in round 0; PRIME's PRM from round r's GRPO), on
    # the new shard + a replay.
    Phase("reward_model", _reward_model,
          lambda done, r: {"policy": done(r, "policy").path, "previous": _rm_warm_starts(done, r)},
          launchable=True, models=_trained_rms, registers=_rm_checkpoints,
          figures=("prm/step_auc_mc", "prm/step_auc_gold", "orm/auc")),
    # π_r on held-out problems; best-of-N with round r's RMs; the hacking monitor on the RMs GRPO trained against
    # (round r-1's; in round 0, round 0's own, whose scores of their own samples it reads without calibration).
    Phase("eval", _eval, lambda done, r: {
        "policy": done(r, "policy").path, "reward_models": done(r, "reward_model").paths,
        "shard": done(r, "collect").path,
        "trained_against": _paths(done(r - 1, "reward_model")) or done(r, "reward_model").paths},
          figures=("eval/greedy", "eval/pass@1", "eval/maj@K", "eval/pass@K")),
)}, name_field="name")


def recorded(cfg: PipelineConfig, manifest: Manifest | None = None) -> Done:
    """`done(r, name)`: what the manifest (`manifest`, else the run directory's) records of phase `name` of round r
    (None before round 0)."""
    manifest = manifest or Manifest.load(cfg.run_dir)
    return lambda r, name: PhaseResult.from_manifest(manifest.output(r, name)) if r >= 0 else None


def recorded_round(cfg: PipelineConfig, r: int) -> dict[str, PhaseResult]:
    """The recorded results of a finished round's phases."""
    done = recorded(cfg)
    return {name: done(r, name) for name in PHASES}


def redo(cfg: PipelineConfig, *specs: str) -> list[str]:
    """Forget the recorded phases `specs` (`ROUND/PHASE`: `1/policy` or `round-001/policy`) and every phase after
    the first of them in run order (the rest of its round, the later rounds: all that read it, directly or not), so
    that the next `igrpo run` redoes them; returns their keys. Their outputs are rewritten atomically when redone.

    Every request is checked before anything is written: one that cannot apply (malformed, a round past
    `run.rounds`, no run yet, a phase not recorded) is a RunDirError saying why.
    """
    points = {spec: _redo_point(cfg, spec) for spec in specs}
    if not RunDir(cfg.run_dir).manifest.exists():
        raise RunDirError(f"--redo {specs[0]}: {cfg.run_dir} has no run yet (no manifest.json); "
                          "`igrpo run` without --redo starts it")
    manifest = Manifest.load(cfg.run_dir)
    for spec, (r, name) in points.items():
        if not manifest.done(r, name):
            raise RunDirError(f"--redo {spec}: {phase_key(r, name)} is not recorded done in {manifest.path}: "
                              "`igrpo run` runs it anyway")
    order = list(PHASES)

    def position(key: str) -> tuple[int, int]:
        round_part, _, phase = key.partition("/")
        return round_of(round_part) or 0, order.index(phase) if phase in order else len(order)

    first = min((r, order.index(name)) for r, name in points.values())
    dropped = [key for key in manifest.data["phases"] if position(key) >= first]
    for key in dropped:
        del manifest.data["phases"][key]
    manifest.save()
    return dropped


def _redo_point(cfg: PipelineConfig, spec: str) -> tuple[int, str]:
    """The round and phase of a `--redo` request, checked against the config (not yet the run directory)."""
    r, _, name = spec.partition("/")
    r = int(r) if r.isdigit() else round_of(r)
    if r is None or name not in PHASES:
        raise RunDirError(f"--redo {spec}: expected ROUND/PHASE, e.g. 1/policy or round-001/collect; phases: "
                          f"{', '.join(PHASES)}")
    if r > cfg.run.rounds:
        raise RunDirError(f"--redo {spec}: round {r} is past run.rounds ({cfg.run.rounds}): nothing to redo there")
    return r, name


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
