"""The `igrpo` command: the whole loop (`run`), each phase alone, `compare`, and scheduling."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pipeline.config import ConfigError, PipelineConfig, load_config


def _config(args) -> PipelineConfig:
    return load_config(args.config, args.set)


def cmd_run(args) -> None:
    cfg = _config(args)
    from pipeline.runner import preflight, refuse_if_locked

    preflight(cfg)  # fail fast and quietly, before Prefect starts
    refuse_if_locked(cfg.run_dir)
    from flows.iterative import iterative_rl

    result = iterative_rl(cfg.model_dump(mode="json"), force=args.force)
    print(json.dumps(result, indent=2))


def cmd_bootstrap(args) -> None:
    from pipeline.bootstrap import run_bootstrap

    cfg = _config(args)
    from pipeline.replay import round_dir

    out = args.out or round_dir(cfg.run_dir, 0) / "policy"
    res = run_bootstrap(cfg, out)
    print(json.dumps({"policy": str(res.policy_path), **res.metrics}, indent=2))


def cmd_eval(args) -> None:
    from pipeline.evaluate import evaluate_policy
    from pipeline.generation import load_sampling_model
    from pipeline.problems import problem_set_from_config
    from pipeline.prompts import renderer_from_config

    cfg = _config(args)
    e = cfg.eval
    ps = problem_set_from_config(cfg)
    model, tok = load_sampling_model(args.policy, e.backend, e.vllm_args)
    problems = ps.test[: e.num_problems]
    ev = evaluate_policy(model, tok, ps, problems, n=e.samples_per_problem,
                         temperature=e.temperature, top_p=e.top_p, max_new_tokens=e.max_new_tokens,
                         batch_size=e.batch_size, seed=cfg.run.seed,
                         prompts=[renderer_from_config(cfg, tok).render(p) for p in problems])
    print(f"{'metric':<20}{'value':>10}")
    for k, v in ev.metrics.items():
        print(f"{k:<20}{v:>10.4f}")


def cmd_grpo(args) -> None:
    from pipeline.policy import run_policy_phase
    from pipeline.problems import problem_set_from_config
    from pipeline.tracking import resolve_model_uri

    cfg = _config(args)
    rm = resolve_model_uri(args.reward_model) if args.reward_model else None
    res = run_policy_phase(
        cfg, problem_set_from_config(cfg), args.policy, args.out, args.round,
        reward_model_path=rm if cfg.supervision.mode == "process" else None,
        orm_path=rm if cfg.supervision.mode == "outcome" else None,
    )
    print(json.dumps({"policy": str(res.policy_path), **res.metrics}, indent=2))


def cmd_collect(args) -> None:
    from pipeline.collect import run_collection_phase
    from pipeline.problems import problem_set_from_config

    cfg = _config(args)
    res = run_collection_phase(cfg, problem_set_from_config(cfg), args.policy, args.run_dir, args.round)
    print(json.dumps({"shard": str(res.shard_path), **res.metrics}, indent=2))


def cmd_train_rm(args) -> None:
    from pipeline.replay import round_dir
    from pipeline.reward_model import run_reward_model_phase
    from pipeline.tracking import resolve_model_uri

    cfg = _config(args)
    run_dir = Path(args.run_dir)
    policy = args.policy or round_dir(run_dir, args.round) / "policy"
    previous = {}
    for kind in cfg.reward_model.kinds:
        given = dict(p.split("=", 1) for p in args.previous).get(kind)
        default = round_dir(run_dir, args.round - 1) / "reward_model" / kind if args.round > 0 else None
        if given:
            previous[kind] = resolve_model_uri(given)
        elif default is not None and default.exists():
            previous[kind] = str(default)
    res = run_reward_model_phase(cfg, run_dir, args.round, policy, previous)
    print(json.dumps({"paths": {k: str(v) for k, v in res.paths.items()}, **res.metrics}, indent=2))


def cmd_compare(args) -> None:
    from pipeline.compare import compare

    table, png = compare(args.runs, args.out, args.tracking_uri)
    print(table)
    print(f"plot: {png}")


def cmd_serve(args) -> None:
    from flows.iterative import iterative_rl

    cfg = _config(args)
    # One run at a time: a scheduled run never overlaps the previous one on the same run directory.
    iterative_rl.serve(name=args.name or cfg.run.name, cron=args.cron,
                       parameters={"config": cfg.model_dump(mode="json")}, global_limit=1)


def cmd_deploy(args) -> None:
    from flows.iterative import iterative_rl

    cfg = _config(args)
    root = Path(__file__).resolve().parent.parent
    iterative_rl.from_source(source=str(root), entrypoint="flows/iterative.py:iterative_rl").deploy(
        name=args.name or cfg.run.name, work_pool_name=args.pool, cron=args.cron, concurrency_limit=1,
        parameters={"config": cfg.model_dump(mode="json")}, build=False, push=False,
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="igrpo", description="DeepSeekMath iterative RL: GRPO + PRM/ORM retrained each round.")
    sub = p.add_subparsers(dest="command", required=True)

    def cmd(name, func, help_, config=True):
        s = sub.add_parser(name, help=help_, description=help_)
        if config:
            s.add_argument("config", help="YAML run config (see configs/)")
            s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                           help="override a config field, e.g. --set grpo.learning_rate=1e-5 (repeatable)")
        s.set_defaults(func=func)
        return s

    s = cmd("run", cmd_run, "Run the whole iterative loop (resumes an unfinished run directory).")
    s.add_argument("--force", action="store_true", help="resume even though the config changed")
    s = cmd("bootstrap", cmd_bootstrap, "Round 0's policy: SFT on the gold solutions.")
    s.add_argument("--out", help="checkpoint directory (default: the run's round-000/policy)")
    s = cmd("eval", cmd_eval, "Greedy accuracy, Pass@K and Maj@K of a policy on held-out problems.")
    s.add_argument("--policy", required=True, help="policy checkpoint, .gguf file, package:NAME or hub id")
    s = cmd("grpo", cmd_grpo, "One GRPO phase (outcome or process supervision) from a policy.")
    s.add_argument("--policy", required=True)
    s.add_argument("--reward-model", help="PRM (process) or ORM (outcome with orm_weight): path or models:/name@alias")
    s.add_argument("--out", required=True, help="where the new policy checkpoint goes")
    s.add_argument("--round", type=int, default=1, help="round index (seeds the prompt draw)")
    s = cmd("collect", cmd_collect, "Sample a policy and label its samples (verifier + MC step labels).")
    s.add_argument("--policy", required=True)
    s.add_argument("--round", type=int, required=True)
    s.add_argument("--run-dir", required=True)
    s = cmd("train-rm", cmd_train_rm, "Retrain the PRM/ORM of a round on its shard plus replay.")
    s.add_argument("--run-dir", required=True)
    s.add_argument("--round", type=int, required=True)
    s.add_argument("--policy", help="backbone for a new RM (default: the round's policy)")
    s.add_argument("--previous", action="append", default=[], metavar="KIND=PATH",
                   help="warm start, e.g. prm=models:/iterative-grpo-prm@round-0 (default: the previous round's)")
    s = cmd("compare", cmd_compare, "Pass@K / Maj@K / greedy per round of one or more runs, and a Fig. 7-style plot.", config=False)
    s.add_argument("runs", nargs="+", help="run directories or MLflow parent run ids")
    s.add_argument("--out", default="compare.png", help="plot path")
    s.add_argument("--tracking-uri", help="MLflow tracking URI (for run ids)")
    s = cmd("serve", cmd_serve, "Serve the flow with a cron schedule (Prefect), one run at a time.")
    s.add_argument("--cron", required=True, help='e.g. "0 2 * * *"')
    s.add_argument("--name", help="deployment name (default: run.name)")
    s = cmd("deploy", cmd_deploy, "Deploy the flow to a Prefect work pool.")
    s.add_argument("--pool", required=True)
    s.add_argument("--cron", help="optional schedule")
    s.add_argument("--name", help="deployment name (default: run.name)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (ConfigError, FileNotFoundError) as e:
        print(f"igrpo: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        from pipeline.rewards import RewardError
        from pipeline.runner import RunDirError
        from pipeline.tracking import TrackingError

        if isinstance(e, (RunDirError, TrackingError, RewardError, ValueError)):
            print(f"igrpo: error: {e}", file=sys.stderr)
            return 2
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
