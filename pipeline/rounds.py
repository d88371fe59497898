"""Each phase of a round, run once: outputs recorded in the manifest, metrics in the phase's MLflow run.

Round 0: policy = SFT bootstrap (or the given model); rounds r >= 1: policy = GRPO from round r-1's
policy against round r-1's reward models. Then collect -> reward_model -> eval, as in DESIGN.md.
"""

from __future__ import annotations

from pathlib import Path

from pipeline import tracking
from pipeline.config import PipelineConfig
from pipeline.evaluate import best_of_n_accuracy, evaluate_policy, plot_pass_maj
from pipeline.fsutil import read_json, write_json_atomic
from pipeline.problems import problem_set_from_config
from pipeline.prompts import renderer_from_config
from pipeline.replay import round_dir
from pipeline.runner import Manifest, phase_run, sub_run


def run_phase(cfg: PipelineConfig, r: int, phase: str) -> dict:
    """Run `phase` of round `r` unless the manifest says it is done; return its recorded output."""
    manifest = Manifest.load(cfg.run_dir)
    if manifest.done(r, phase):
        return manifest.output(r, phase)
    run_id = phase_run(manifest, r, phase)
    # The reward-model phase trains two models: each gets a run of its own below the phase's run,
    # since MLflow refuses the same param with two values in one run.
    with tracking.active(run_id if phase != "reward_model" else None):
        output = PHASE_FUNCS[phase](cfg, manifest, r, "mlflow")
    metrics = output.get("metrics", {})
    tracking.log_metrics(run_id, metrics)
    tracking.log_metrics(manifest.data["mlflow"]["parent"], metrics, step=r)  # cross-round curves
    tracking.finish(run_id)
    manifest = Manifest.load(cfg.run_dir)
    manifest.record(r, phase, output)
    return output


def _policy(cfg: PipelineConfig, manifest: Manifest, r: int, report_to: str) -> dict:
    out = round_dir(cfg.run_dir, r) / "policy"
    if r == 0:
        from pipeline.bootstrap import run_bootstrap

        res = run_bootstrap(cfg, out)
        return {"path": str(res.policy_path), "metrics": res.metrics}
    prev_rms = manifest.output(r - 1, "reward_model")["paths"]
    kwargs = {"policy_path": manifest.output(r - 1, "policy")["path"], "out_dir": str(out), "round_index": r,
              "reward_model_path": prev_rms.get("prm"), "orm_path": prev_rms.get("orm")}
    if cfg.launcher.kind == "accelerate":
        from pipeline.launch import launch_phase

        run_id = manifest.mlflow_run(f"round-{r:03d}/policy")
        return launch_phase(cfg, "policy", kwargs, _launch_dir(cfg, r, "policy"), mlflow_run=run_id)
    from pipeline.policy import run_policy_phase

    res = run_policy_phase(cfg, problem_set_from_config(cfg), report_to=report_to, **kwargs)
    return {"path": str(res.policy_path), "metrics": res.metrics}


def _launch_dir(cfg: PipelineConfig, r: int, phase: str):
    """Where a launched phase's request, result and log live (`round-XXX/.launch-<phase>`)."""
    return round_dir(cfg.run_dir, r) / f".launch-{phase}"


def _collect(cfg: PipelineConfig, manifest: Manifest, r: int, report_to: str) -> dict:
    from pipeline.collect import run_collection_phase

    res = run_collection_phase(cfg, problem_set_from_config(cfg), manifest.output(r, "policy")["path"], cfg.run_dir, r)
    return {"path": str(res.shard_path), "metrics": res.metrics}


def _reward_model(cfg: PipelineConfig, manifest: Manifest, r: int, report_to: str) -> dict:
    from pipeline.reward_model import RewardModelResult, run_reward_model_phase

    previous = manifest.output(r - 1, "reward_model")["paths"] if r > 0 else None
    if cfg.launcher.kind == "accelerate":
        from pipeline.launch import launch_phase

        kwargs = {"run_dir": str(cfg.run_dir), "round_index": r, "policy_path": manifest.output(r, "policy")["path"],
                  "previous": previous}
        sub_runs = {kind: sub_run(manifest, r, "reward_model", kind) for kind in cfg.reward_model.kinds}
        res = launch_phase(cfg, "reward_model", kwargs, _launch_dir(cfg, r, "reward_model"), sub_runs=sub_runs)
        res = RewardModelResult({k: Path(v) for k, v in res["paths"].items()}, res["metrics"])
    else:
        res = run_reward_model_phase(
            cfg, cfg.run_dir, r, manifest.output(r, "policy")["path"], previous, report_to=report_to,
            run_context=lambda kind: tracking.active(sub_run(manifest, r, "reward_model", kind)),
        )
    versions = {}
    if cfg.tracking.register_models:
        run_id = manifest.mlflow_run(f"round-{r:03d}/reward_model")
        for kind, path in res.paths.items():
            name = f"{cfg.tracking.experiment}-{kind}"
            versions[kind] = tracking.register_checkpoint(run_id, path, name, r, manifest.data["mlflow"]["parent"])
    return {"paths": {k: str(v) for k, v in res.paths.items()}, "versions": versions, "metrics": res.metrics}


def _eval(cfg: PipelineConfig, manifest: Manifest, r: int, report_to: str) -> dict:
    from pipeline.generation import load_sampling_model
    from pipeline.replay import read_shard

    e = cfg.eval
    problem_set = problem_set_from_config(cfg)
    problems = problem_set.test[: e.num_problems]
    model, tokenizer = load_sampling_model(manifest.output(r, "policy")["path"], e.backend, e.vllm_args)
    rendered = [renderer_from_config(cfg, tokenizer).render(p) for p in problems]
    ev = evaluate_policy(
        model, tokenizer, problem_set, problems, n=e.samples_per_problem, temperature=e.temperature,
        top_p=e.top_p, max_new_tokens=e.max_new_tokens, batch_size=e.batch_size, seed=cfg.run.seed + r,
        prompts=rendered,
    )
    metrics = {f"eval/{k}": v for k, v in ev.metrics.items()}

    # Best-of-N with this round's RMs on the same samples, beside majority vote and a random pick.
    rms = manifest.output(r, "reward_model")["paths"]
    prompts = [[q] * len(t) for q, t in zip(rendered, ev.texts)]
    scorers = {kind: _scorer(path, kind, e.batch_size) for kind, path in rms.items()}
    for n in e.best_of_n:
        for kind, scorer in scorers.items():
            scores = [_score(scorer, kind, ps, ts, cfg) for ps, ts in zip(prompts, ev.texts)]
            metrics[f"bon/{kind}@{n}"] = best_of_n_accuracy(scores, ev.correct, ev.answers, n)["rm"]
        base = best_of_n_accuracy([[0.0] * len(c) for c in ev.correct], ev.correct, ev.answers, n)
        metrics[f"bon/majority@{n}"], metrics[f"bon/random@{n}"] = base["majority"], base["random"]

    # Reward-hacking monitor: what the RM the policy trained against thinks of the fresh samples,
    # minus what the verifier says. A growing gap: the policy exploits a stale RM.
    trained_against = manifest.output(r - 1, "reward_model")["paths"] if r > 0 else rms
    rows = read_shard(manifest.output(r, "collect")["path"])
    verifier = sum(x["outcome"] for x in rows) / max(len(rows), 1)
    for kind, path in trained_against.items():
        scorer = scorers[kind] if path == rms.get(kind) else _scorer(path, kind, e.batch_size)
        predicted = _score(scorer, kind, [x["prompt"] for x in rows], [x["completion"] for x in rows], cfg)
        metrics[f"monitor/{kind}_gap"] = sum(predicted) / max(len(predicted), 1) - verifier

    out_dir = round_dir(cfg.run_dir, r)
    curve = {k: v for k, v in ev.metrics.items() if "@" in k}
    write_json_atomic(out_dir / "eval.json", {"round": r, "metrics": metrics, "curve": curve})
    plot = plot_pass_maj({f"round {r}": curve}, out_dir / "pass_maj.png")
    run_id = manifest.mlflow_run(f"round-{r:03d}/eval")
    import mlflow

    mlflow.MlflowClient().log_artifact(run_id, str(plot))
    curves = {f"round {q}": read_json(round_dir(cfg.run_dir, q) / "eval.json")["curve"] for q in range(r + 1)
              if (round_dir(cfg.run_dir, q) / "eval.json").exists()}
    across = plot_pass_maj(curves, cfg.run_dir / "pass_maj_rounds.png")
    mlflow.MlflowClient().log_artifact(manifest.data["mlflow"]["parent"], str(across))
    return {"path": str(out_dir / "eval.json"), "metrics": metrics}


def _scorer(path: str, kind: str, batch_size: int):
    from models import load_reward_model
    from pipeline.rewards import OrmScorer, PrmScorer

    rm, tok, _ = load_reward_model(path, expect=kind)
    return PrmScorer(rm, tok, batch_size) if kind == "prm" else OrmScorer(rm, tok, batch_size)


def _score(scorer, kind: str, prompts: list[str], texts: list[str], cfg: PipelineConfig) -> list[float]:
    if kind == "prm":
        return scorer(prompts, texts, aggregation=cfg.reward_model.aggregation)
    return scorer(prompts, texts)


PHASE_FUNCS = {"policy": _policy, "collect": _collect, "reward_model": _reward_model, "eval": _eval}
