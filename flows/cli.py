"""The `igrpo` command: the whole loop (`run`), each phase alone, `compare`, scheduling, and the servers (`stack`).

The top of the house: it starts flows (`run`, `serve`, `deploy`) and single phases, so it lives in `flows/`
and `pipeline/` never imports `flows/`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
from pathlib import Path

from pipeline.config import ConfigError, PipelineConfig
from pipeline.loading import load_config
from pipeline.registry import PluginError, load_plugins


def _config(args) -> PipelineConfig:
    from pipeline.preflight import check_extras

    cfg = load_config(args.config, args.set)
    check_extras(cfg)  # a missing optional engine fails every command at once, as a config error
    return cfg


def cmd_run(args) -> None:
    cfg = _config(args)
    from pipeline.preflight import preflight
    from pipeline.rounds import abandon
    from pipeline.rundir import refuse_if_locked

    refuse_if_locked(cfg.run_dir)
    if args.redo:  # before the preflight, which refuses a damaged output still recorded
        from pipeline.phases import redo

        print(f"igrpo: --redo {', '.join(args.redo)}: redoing {', '.join(redo(cfg, *args.redo))}", file=sys.stderr)
    preflight(cfg)  # fail fast and quietly, before Prefect starts
    if args.stopper:  # stopped at once: no MLflow run left RUNNING, no lock left held
        from flows.signals import ephemeral_server_apart

        ephemeral_server_apart()
        args.stopper.at_hard_exit(lambda: abandon(cfg))
    from flows.console import database_errors_folded
    from flows.iterative import iterative_rl
    from pipeline.compare import round_gain, rounds_from_run_dir, tables_text

    with database_errors_folded(lambda: _why_down(cfg)) as folded:
        try:
            result = iterative_rl(cfg.model_dump(mode="json"), force=args.force, checked=True)
        except Exception:
            _database_down(folded.reason(), args.config)
            raise
    print(tables_text([(cfg.run.name, rounds_from_run_dir(cfg.run_dir))]))
    if gain := round_gain(cfg.run_dir, cfg.run.name):
        print(gain)
    print(f"run directory: {result['run_dir']}  (igrpo compare {result['run_dir']}: the same tables and a plot)")
    print(f"MLflow: parent run {result['mlflow_run']}, experiment {cfg.tracking.experiment!r}, "
          f"at {result['tracking_uri']}")


def _why_down(cfg: PipelineConfig) -> str | None:
    """Why the run's Prefect and MLflow servers cannot reach their database, or None (flows.postgres.database_down)."""
    from prefect.settings import PREFECT_API_URL

    from flows.postgres import database_down
    from pipeline import tracking

    return database_down(PREFECT_API_URL.value(), cfg.tracking.tracking_uri or tracking.mlflow.get_tracking_uri())


def _database_down(why: str | None, config: str) -> None:
    """A run that failed because its servers lost their database (`why`: the stack's PostgreSQL stopped or killed)
    stops with one error naming it, not the traceback of whichever call met it first (Prefect's, dropped from the
    console by `console.DatabaseDown`, which found `why` first); the run directory keeps the rest."""
    from flows.stack import StackError

    if why:
        raise StackError(f"the run stopped: the database is down: {why}. Start it again (`igrpo stack up`), then "
                         f"`igrpo run {config}` resumes the run") from None


def cmd_check(args) -> int:
    """Validate the config and run the preflight, creating nothing; the resolved config on stdout."""
    import yaml

    from pipeline.preflight import check_run

    cfg = _config(args)
    found, errors = check_run(cfg)
    print(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False, default_flow_style=None), end="")
    for name, what in found.items():
        print(f"igrpo: check: {name}: {what}", file=sys.stderr)
    for error in errors:
        print(f"igrpo: error: {error}", file=sys.stderr)
    if errors:
        return 2
    print(f"igrpo: check: {args.config} is ready to run (nothing was created)", file=sys.stderr)
    return 0


# The single-phase commands run the phase table's own body (`pipeline.phases.PHASES`: the models it loads, where
# its outputs go, its inputs by name), alone: in this process, outside a run, so no manifest and no MLflow runs
# (`PhaseRuns()`), and its inputs from the options rather than from what a run recorded.


def _alone(cfg: PipelineConfig, phase: str, round_index: int, first: bool = False, **inputs):
    """Phase `phase`'s body (`first`: what round 0 runs instead) with `inputs`; its `PhaseResult`."""
    from pipeline.phases import PHASES, PhaseRuns

    body = PHASES[phase].first if first else PHASES[phase].run
    return body(cfg, PhaseRuns(), round_index=round_index, **inputs)


def cmd_bootstrap(args) -> None:
    res = _alone(_config(args), "policy", 0, first=True, out=args.out)
    print(json.dumps({"policy": res.path, **res.metrics}, indent=2))


def cmd_eval(args) -> None:
    # Not the eval phase's body: that one reads a run's shard (the hacking monitor's calibration) and the RMs GRPO
    # trained against, and writes the run's eval.json and plots; `igrpo eval` scores any checkpoint outside a run,
    # so it calls the body's core, `run_eval_phase`, with what it has.
    from pipeline.eval_phase import run_eval_phase
    from pipeline.tracking import resolve_model_uri

    cfg = _config(args)
    rms = {kind: resolve_model_uri(path) for kind, path in _kind_paths(args.reward_model, "--reward-model").items()}
    res = run_eval_phase(cfg, args.policy, reward_models=rms, round_index=args.round,
                         json_path=Path(args.out) if args.out else None)
    width = max(map(len, ["metric", *res.metrics])) + 2  # the longest name still leaves its value a column
    print(f"{'metric':<{width}}{'value':>10}")
    for k, v in res.metrics.items():
        print(f"{k:<{width}}{v:>10.4f}")


def _kind_paths(pairs: list[str], option: str) -> dict[str, str]:
    """['prm=PATH', ...] -> {'prm': 'PATH'}; a pair without '=' is a ConfigError naming the option."""
    bad = [p for p in pairs if "=" not in p]
    if bad:
        raise ConfigError(f"{option} takes KIND=PATH (e.g. prm=runs/q/round-000/reward_model/prm), got {bad[0]!r}")
    return dict(p.split("=", 1) for p in pairs)


def cmd_grpo(args) -> None:
    from pipeline.rewards import reward_models_needed
    from pipeline.tracking import resolve_model_uri

    cfg = _config(args)
    rm = resolve_model_uri(args.reward_model) if args.reward_model else None
    res = _alone(cfg, "policy", args.round, policy=args.policy, out=args.out,
                 reward_models={kind: rm for kind in reward_models_needed(cfg)} if rm else None)
    print(json.dumps({"policy": res.path, **res.metrics}, indent=2))


def cmd_collect(args) -> None:
    res = _alone(_config(args), "collect", args.round, policy=args.policy, run_dir=args.run_dir)
    print(json.dumps({"shard": res.path, **res.metrics}, indent=2))


def cmd_train_rm(args) -> None:
    from pipeline.rundir import RunDir
    from pipeline.tracking import resolve_model_uri

    cfg = _config(args)
    run = RunDir(args.run_dir)
    policy = args.policy or run.policy(args.round)
    given = _kind_paths(args.previous, "--previous")
    previous = {}
    for kind in cfg.reward_model.kinds:  # a run's RM phase reads these from its manifest; here, from the folder
        default = run.reward_model(args.round - 1, kind) if args.round > 0 else None
        if given.get(kind):
            previous[kind] = resolve_model_uri(given[kind])
        elif default is not None and default.exists():
            previous[kind] = str(default)
    res = _alone(cfg, "reward_model", args.round, policy=policy, previous=previous, run_dir=run.root)
    print(json.dumps({"paths": res.paths, **res.metrics}, indent=2))


def cmd_compare(args) -> None:
    from pipeline.compare import compare

    table, png = compare(args.runs, args.out, args.tracking_uri)
    print(table)
    print(f"plot: {png}")


def cmd_serve(args) -> None:
    from flows.deployments import serve

    serve(_config(args), args.cron, args.name)


def cmd_deploy(args) -> None:
    from flows.deployments import deploy

    deploy(_config(args), args.pool, args.cron, args.name)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="igrpo", description="DeepSeekMath iterative RL: GRPO + PRM/ORM retrained each round.")
    sub = p.add_subparsers(dest="command", required=True)

    def cmd(name, func, help_, description, config=True, console=True):
        # help_: its line in `igrpo --help` and the README's table of commands (docs/generate.py); description: its own
        s = sub.add_parser(name, help=help_, description=description)
        if config:
            s.add_argument("config", help="YAML run config (see configs/)")
            s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                           help="override a config field, e.g. --set grpo.learning_rate=1e-5 (repeatable)")
        # console: set up for a person watching it (flows/console.py); stoppable: SIGINT/SIGTERM (flows/signals.py)
        s.set_defaults(func=func, console=console, stoppable=name != "serve")  # serve: Prefect's runner owns them
        return s

    s = cmd("run", cmd_run, "the whole loop; resumes an unfinished run (--force, --redo)",
            "Run the whole iterative loop (resumes an unfinished run directory).")
    s.add_argument("--force", action="store_true", help="resume even though the config changed")
    s.add_argument("--redo", action="append", default=[], metavar="ROUND/PHASE",
                   help="redo a recorded phase and every phase after it, e.g. --redo 1/collect (repeatable)")
    cmd("check", cmd_check, "validate a config and run the preflight, creating nothing", "Validate a config and run "
        "the preflight (data, model, MLflow, run directory) without creating anything; print the resolved config. "
        "Exit 0 if `igrpo run` would start, else 2.", console=False)
    s = cmd("bootstrap", cmd_bootstrap, "round 0's policy: SFT on the gold solutions",
            "Round 0's policy: SFT on the gold solutions.")
    s.add_argument("--out", help="checkpoint directory (default: the run's round-000/policy)")
    s = cmd("eval", cmd_eval, "greedy, Pass@K, Maj@K; best-of-N with each --reward-model",
            "Greedy accuracy, Pass@K and Maj@K of a policy on held-out problems; best-of-N with RMs.")
    s.add_argument("--policy", required=True, metavar="P", help="policy checkpoint, .gguf file, package:NAME or hub id")
    s.add_argument("--reward-model", action="append", default=[], metavar="KIND=PATH",
                   help="an RM for best-of-N, e.g. prm=runs/q/round-001/reward_model/prm or orm=models:/NAME@round-1")
    s.add_argument("--out", help="also write the figures to this JSON file (eval.json's format)")
    s.add_argument("--round", type=int, default=0,
                   help="round index: seeds the sampling as that round's eval phase does (run.seed + round)")
    s = cmd("grpo", cmd_grpo, "one GRPO phase from any policy",
            "One GRPO phase (outcome or process supervision) from a policy.")
    s.add_argument("--policy", required=True, metavar="P")
    s.add_argument("--reward-model", help="PRM (process) or ORM (an orm reward): path or models:/name@alias")
    s.add_argument("--out", required=True, metavar="D", help="where the new policy checkpoint goes")
    s.add_argument("--round", type=int, default=1, help="round index (seeds the prompt draw)")
    s = cmd("collect", cmd_collect, "sample a policy, label its samples",
            "Sample a policy and label its samples (verifier + MC step labels).")
    s.add_argument("--policy", required=True, metavar="P")
    s.add_argument("--round", type=int, required=True, metavar="R")
    s.add_argument("--run-dir", required=True, metavar="D")
    s = cmd("train-rm", cmd_train_rm, "retrain a round's RMs on its shard + replay",
            "Retrain the PRM/ORM of a round on its shard plus replay.")
    s.add_argument("--run-dir", required=True, metavar="D")
    s.add_argument("--round", type=int, required=True, metavar="R")
    s.add_argument("--policy", help="backbone for a new RM (default: the round's policy)")
    s.add_argument("--previous", action="append", default=[], metavar="KIND=PATH",
                   help="warm start, e.g. prm=models:/iterative-grpo-quickstart-prm@round-0 (default: the previous round's)")
    s = cmd("compare", cmd_compare, "runs side by side, and a Fig. 7-style plot", "Pass@K / Maj@K / greedy and "
            "best-of-N per round of one or more runs, and a Fig. 7-style plot.", config=False, console=False)
    s.add_argument("runs", nargs="+", metavar="RUN", help="run directories or MLflow parent run ids")
    s.add_argument("--out", default="compare.png", help="plot path")
    s.add_argument("--tracking-uri", help="MLflow tracking URI (for run ids)")
    # serve and deploy keep Prefect's own console: an operator's commands, against a real server
    s = cmd("serve", cmd_serve, "serve the flow on a schedule (Prefect)",
            "Serve the flow with a cron schedule (Prefect), one run at a time.", console=False)
    s.add_argument("--cron", required=True, help='e.g. "0 2 * * *"')
    s.add_argument("--name", help="deployment name (default: run.name)")
    s = cmd("deploy", cmd_deploy, "deploy the flow to a Prefect work pool", "Deploy the flow to a Prefect work pool.",
            console=False)
    s.add_argument("--pool", required=True, metavar="NAME")
    s.add_argument("--cron", help="optional schedule")
    s.add_argument("--name", help="deployment name (default: run.name)")
    from flows.stack import add_parser

    add_parser(sub)  # `igrpo stack up|status|down`: the servers a team's runs share
    return p


def main(argv: list[str] | None = None, console: bool | None = None) -> int:
    """`igrpo ARGV...`; returns the exit code. `console` (default: called as the program, `argv` None) sets the
    console up for a person (flows/console.py); in-process callers such as tests keep their own."""
    args = build_parser().parse_args(argv)
    if (argv is None if console is None else console) and args.console:
        from flows.console import quiet

        quiet()
    from flows.signals import stop_on_signals

    with stop_on_signals() if args.stoppable else contextlib.nullcontext() as stopper:
        args.stopper = stopper
        try:
            return _run_command(args)
        except BaseException as e:
            code = stopper.exit_code(e) if stopper else None
            if code is None:
                raise
            print(f"igrpo: stopped by {signal.Signals(code - 128).name}; nothing half-written is left"
                  + (f": `igrpo run {args.config}` resumes it" if args.command == "run" else ""), file=sys.stderr)
            return code


def _run_command(args) -> int:
    try:
        load_plugins()  # before any config is read: it may name what a plugin registers
        return args.func(args) or 0
    except (ConfigError, FileNotFoundError, PluginError) as e:
        print(f"igrpo: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        from flows.services import StackError
        from pipeline.launch import LaunchError
        from pipeline.rewards import RewardError
        from pipeline.rundir import RunDirError
        from pipeline.tracking import TrackingError

        if isinstance(e, (RunDirError, TrackingError, RewardError, LaunchError, StackError, ValueError)):
            print(f"igrpo: error: {e}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
