"""The eval phase: sample the policy on held-out problems; greedy, Pass@K, Maj@K; best-of-N with each RM
beside majority vote and a random pick; the reward-hacking monitor; eval.json and the Pass@K / Maj@K plot.

Shared by the pipeline's eval phase and `igrpo eval` (which may give no RMs and no shard: then best-of-N
and the monitor are skipped). Every sample is scored once per RM, whatever the Ns of best-of-N.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pipeline.config import PipelineConfig
from pipeline.evaluate import best_of_n_accuracy, evaluate_policy, plot_pass_maj
from pipeline.problems import problem_set_from_config
from pipeline.prompts import renderer_from_config
from pipeline.rundir import write_json_atomic

Scorer = Callable[[list[str], list[str]], list[float]]  # (prompts, completions) -> one solution score each


@dataclass(frozen=True)
class EvalPhaseResult:
    metrics: dict[str, float]  # eval/*, bon/*, monitor/*
    curve: dict[str, float]  # pass@K and maj@K for every K, the plot's points
    json_path: Path | None = None
    plot_path: Path | None = None


def run_eval_phase(
    cfg: PipelineConfig,
    policy_path: str | Path,
    round_index: int = 0,
    reward_models: dict[str, str] | None = None,
    trained_against: dict[str, str] | None = None,
    shard_path: str | Path | None = None,
    json_path: Path | None = None,
    plot_path: Path | None = None,
) -> EvalPhaseResult:
    """Evaluate `policy_path` on `eval.num_problems` held-out problems.

    Args:
        reward_models: kind -> checkpoint, for best-of-N (none: skipped).
        trained_against: kind -> the RM the policy was trained against (the previous round's), for the
            hacking monitor on the fresh samples of `shard_path` (either missing: skipped).
        json_path, plot_path: where eval.json and the Pass@K / Maj@K plot go (None: not written).
    """
    from pipeline.generation import load_sampling_model
    from pipeline.reward_model import load_scorer

    e = cfg.eval
    problem_set = problem_set_from_config(cfg)
    problems = problem_set.test[: e.num_problems]
    model, tokenizer = load_sampling_model(str(policy_path), e.backend, e.vllm_args)
    rendered = [renderer_from_config(cfg, tokenizer).render(p) for p in problems]  # what the RMs score after, too
    ev = evaluate_policy(
        model, tokenizer, problem_set, problems, n=e.samples_per_problem, temperature=e.temperature,
        top_p=e.top_p, max_new_tokens=e.max_new_tokens, batch_size=e.batch_size, seed=cfg.run.seed + round_index,
        prompts=rendered,
    )
    metrics = {f"eval/{k}": v for k, v in ev.metrics.items()}
    scorers = {kind: load_scorer(kind, path, cfg.reward_model, e.batch_size) for kind, path in (reward_models or {}).items()}

    # Best-of-N with each RM on the same samples, beside majority vote and a random pick.
    prompts = [[q] * len(t) for q, t in zip(rendered, ev.texts)]
    scores = {kind: [score(ps, ts) for ps, ts in zip(prompts, ev.texts)] for kind, score in scorers.items()}
    for n in e.best_of_n:
        for kind, s in scores.items():
            metrics[f"bon/{kind}@{n}"] = best_of_n_accuracy(s, ev.correct, ev.answers, n)["rm"]
        base = best_of_n_accuracy([[0.0] * len(c) for c in ev.correct], ev.correct, ev.answers, n)
        metrics[f"bon/majority@{n}"], metrics[f"bon/random@{n}"] = base["majority"], base["random"]

    if trained_against and shard_path:
        for kind, path in trained_against.items():
            same = path == (reward_models or {}).get(kind)
            score = scorers[kind] if same else load_scorer(kind, path, cfg.reward_model, e.batch_size)
            metrics[f"monitor/{kind}_gap"] = hacking_gap(score, shard_path)

    curve = {k: v for k, v in ev.metrics.items() if "@" in k}
    if json_path is not None:
        write_json_atomic(json_path, {"round": round_index, "metrics": metrics, "curve": curve})
    if plot_path is not None:
        plot_pass_maj({f"round {round_index}": curve}, plot_path)
    return EvalPhaseResult(metrics, curve, json_path, plot_path)


def hacking_gap(score: Scorer, shard_path: str | Path) -> float:
    """What an RM thinks of the fresh samples minus what the verifier says: mean RM score - accuracy.

    Read against the RM the policy trained against, a growing gap means the policy exploits a stale RM.
    """
    from pipeline.replay import read_shard

    rows = read_shard(shard_path)
    verifier = sum(x["outcome"] for x in rows) / max(len(rows), 1)
    predicted = score([x["prompt"] for x in rows], [x["completion"] for x in rows])
    return sum(predicted) / max(len(predicted), 1) - verifier


def plot_rounds(curves: dict[int, dict[str, float]], path: Path) -> Path:
    """Pass@K and Maj@K against K, one line per round (DeepSeekMath Fig. 7 across rounds)."""
    return plot_pass_maj({f"round {r}": c for r, c in sorted(curves.items())}, path)
