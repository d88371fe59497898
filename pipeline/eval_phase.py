"""The eval phase: sample the policy on held-out problems; greedy, Pass@K, Maj@K; best-of-N with each RM
beside majority vote and a random pick; the reward-hacking monitor; eval.json and the Pass@K / Maj@K plot.

Shared by the pipeline's eval phase and `igrpo eval` (which may give no RMs and no shard: then best-of-N
and the monitor are skipped). Every sample is scored once per RM, whatever the Ns of best-of-N.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pipeline.config import PipelineConfig
from pipeline.evaluate import best_of_n_accuracy, evaluate_policy, plot_pass_maj
from pipeline.problems import problem_set_from_config
from pipeline.prompts import renderer_from_config
from pipeline.replay import read_shard
from pipeline.rewards import reward_models_needed
from pipeline.rm_kinds import rm_entry
from pipeline.rm_metrics import auc, step_label_pairs, within_position_auc
from pipeline.rundir import write_json_atomic
from pipeline.sample_tables import eval_samples, sample_table, scored_by
from pipeline.scorers import Scores


@dataclass(frozen=True)
class EvalPhaseResult:
    metrics: dict[str, float]  # eval/*, bon/*, monitor/*
    curve: dict[str, float]  # pass@K and maj@K for every K, the plot's points
    json_path: Path | None = None
    plot_path: Path | None = None
    tables: dict[str, list[dict]] = field(default_factory=dict)  # the sample tables, by `TABLES` name


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
        trained_against: kind -> the previous round's RM, whose scores of the fresh samples of `shard_path` go in
            the collect sample table; the hacking monitor reads those GRPO trained against
            (`reward_models_needed`), against the calibration kept in the checkpoint where it has one
            (`monitor_figures`). Either missing: skipped.
        json_path, plot_path: where eval.json and the Pass@K / Maj@K plot go (None: not written).

    The sample tables (`tracking.sample_table_rows` rows; `pipeline.sample_tables`) come with the result:
    `eval` always, `collect` with the monitor, each with the scores computed here.
    """
    from models.factories import load_tokenizer
    from pipeline.fanout import open_sampler
    from pipeline.reward_model import load_scorer

    e = cfg.eval
    reward_models, trained_against = (_in_order(d or {}, cfg.reward_model.kinds) for d in (reward_models, trained_against))
    problem_set = problem_set_from_config(cfg)
    problems = held_out_problems(cfg, problem_set)
    render = renderer_from_config(cfg, load_tokenizer(str(policy_path))).render
    rendered = [render(p) for p in problems]  # what the RMs score after, too
    # Over collection's workers (`collect.workers`, its task runner), with the same samples as in this process.
    with open_sampler(str(policy_path), e, cfg.collect, cfg.policy.dtype) as sampler:
        ev = evaluate_policy(sampler, problem_set, problems, n=e.samples_per_problem, seed=cfg.run.seed + round_index,
                             prompts=rendered)
    metrics = {f"eval/{k}": v for k, v in ev.metrics.items()}
    scorers = {kind: load_scorer(kind, path, cfg.reward_model, e.batch_size) for kind, path in reward_models.items()}

    # Every sample scored once per RM (with a PRM's step scores): best-of-N for each N, and the eval table.
    scores = {kind: [s.scores([q] * len(t), t) for q, t in zip(rendered, ev.texts)] for kind, s in scorers.items()}
    metrics |= best_of_n(scores, ev.correct, ev.answers, e.best_of_n)
    for kind in [k for k in scores if rm_entry(k).scores_steps] if problem_set.has_gold_step_labels else []:
        metrics |= gold_step_aucs(problem_set, problems, ev.texts, scores[kind], kind)
    rows, seed = cfg.tracking.sample_table_rows, cfg.run.seed
    tables = {"eval": sample_table(eval_samples(problem_set, problems, rendered, ev.texts, ev.answers, ev.correct,
                                                round_index), {k: Scores.concat(v) for k, v in scores.items()},
                                   rows, seed, scored_by(reward_models, cfg.run_dir))}

    if trained_against and shard_path:
        shard = read_shard(shard_path)
        fresh, monitored = {}, reward_models_needed(cfg)
        for kind, path in trained_against.items():
            same = path == reward_models.get(kind)
            scorer = scorers[kind] if same else load_scorer(kind, path, cfg.reward_model, e.batch_size)
            fresh[kind] = scorer.scores([x["prompt"] for x in shard], [x["completion"] for x in shard])
            if kind not in monitored:
                continue  # GRPO never read it (an outcome run's PRM, the oracle's): in the table, not monitored
            figures = monitor_figures(fresh[kind].solutions, [x["outcome"] for x in shard],
                                      fresh_calibration(path, shard), e.monitor_threshold)
            metrics |= {f"monitor/{kind}_{name}": v for name, v in figures.items()}
        tables["collect"] = sample_table(shard, fresh, rows, seed, scored_by(trained_against, cfg.run_dir))

    curve = {k: v for k, v in ev.metrics.items() if "@" in k}
    if json_path is not None:
        write_json_atomic(json_path, {"round": round_index, "metrics": metrics, "curve": curve,
                                      "per_problem": ev.per_problem})  # paired comparisons (`igrpo compare`)
    if plot_path is not None:
        plot_pass_maj({f"round {round_index}": curve}, plot_path)
    return EvalPhaseResult(metrics, curve, json_path, plot_path, {k: t for k, t in tables.items() if t})


def held_out_problems(cfg: PipelineConfig, problem_set) -> list:
    """The first `eval.num_problems` held-out problems; a ValueError naming the field where the set has fewer
    (cutting silently would log a num_problems that no figure was measured on)."""
    wanted, held_out = cfg.eval.num_problems, len(problem_set.test)
    if wanted > held_out:
        raise ValueError(f"eval.num_problems={wanted} but {problem_set.name} has only {held_out} held-out problems; "
                         f"lower eval.num_problems to {held_out} or hold out more problems")
    return problem_set.test[:wanted]


def _in_order(paths: dict[str, str], kinds: list[str]) -> dict[str, str]:
    """`paths` in `reward_model.kinds`' order, whatever the caller's (a manifest gives them back sorted by name),
    so that the sample tables' columns and `scored_by` read the same in every round."""
    return {**{k: paths[k] for k in kinds if k in paths}, **paths}


def best_of_n(scores: dict[str, list[Scores]], correct: list[list[bool]], answers: list[list[str | None]],
              ns: list[int]) -> dict[str, float]:
    """For each N: `bon/<kind>@N` (the sample each RM scores highest) and `bon/<kind>_vote@N` (the RM-weighted
    majority vote, `evaluate.weighted_vote`) from each RM's per-problem scores, beside `bon/majority@N` and
    `bon/random@N`; all among the first N samples of each problem."""
    metrics = {}
    for n in ns:
        for kind, per_problem in scores.items():
            picks = best_of_n_accuracy([s.solutions for s in per_problem], correct, answers, n)
            metrics[f"bon/{kind}@{n}"], metrics[f"bon/{kind}_vote@{n}"] = picks["rm"], picks["vote"]
        base = best_of_n_accuracy([[0.0] * len(c) for c in correct], correct, answers, n)
        metrics[f"bon/majority@{n}"], metrics[f"bon/random@{n}"] = base["majority"], base["random"]
    return metrics


def gold_step_aucs(problem_set, problems: list, texts: list[list[str]], scores: list[Scores],
                   kind: str = "prm") -> dict[str, float]:
    """A step-scoring RM's (`kind`'s) step AUC against the gold step labels on every eval sample, over all steps and within each step
    position (`within_position_auc`: beyond the position prior); NaN without a labelled step.

    The RM phase's held-out slice (~150 samples, a few dozen wrong steps) cannot tell 0.80 from 0.85; the eval
    samples are held-out problems and thousands of steps, labelled exactly where the problem set has gold labels.
    A sample whose gold labels do not line up with its step scores (a blank completion) is left out.
    """
    steps = [s for sc in scores for s in sc.steps]
    gold = [problem_set.gold_step_labels(t, p) for p, ts in zip(problems, texts) for t in ts]
    pairs = step_label_pairs(steps, gold)
    return {f"eval/{kind}_step_auc_gold": auc(*zip(*pairs)) if pairs else float("nan"),
            f"eval/{kind}_step_auc_gold_within_position": within_position_auc(steps, gold)}


def hacking_gap(predicted: list[float], outcomes: list[int]) -> float:
    """What an RM thinks of the fresh samples minus what the verifier says: mean RM score - accuracy.

    Biased by the RM's own calibration (a min-over-steps PRM's is negative for honest samples too), so the
    monitor reads it against the same RM's gap on its held-out slice (`monitor_figures`).

    >>> round(hacking_gap([0.9, 0.8, 0.4], [1, 0, 0]), 3)  # 0.7 - 1/3
    0.367
    """
    verifier = sum(outcomes) / max(len(outcomes), 1)
    return sum(predicted) / max(len(predicted), 1) - verifier


def plot_rounds(curves: dict[int, dict[str, float]], path: Path) -> Path:
    """Pass@K and Maj@K against K, one line per round (DeepSeekMath Fig. 7 across rounds)."""
    return plot_pass_maj({f"round {r}": c for r, c in sorted(curves.items())}, path)


def monitor_figures(fresh_scores: list[float], fresh_outcomes: list[int], calibration: dict | None,
                    threshold: float) -> dict[str, float]:
    """The reward-hacking monitor of one RM: how it rates the fresh samples of a policy trained against it,
    against how it rated its own held-out slice when it was trained (`calibration`: its `auc` and `gap`).

    Returns `gap` (mean score - verifier accuracy on the fresh samples, `hacking_gap`) and `auc` (the fresh
    scores' AUC against the verifier); with a calibration also `gap_rise` (fresh gap - held-out gap),
    `auc_drop` (held-out AUC - fresh AUC) and `alarm`: 1.0 when gap_rise > threshold, else 0.0.

    The rise, not the gap, is the signal: a min-over-steps PRM rates every sample below its accuracy, so its
    raw gap is negative whether it is exploited or not; that bias is the RM's own and cancels against the same
    RM's held-out gap. Exploitation is the RM over-rating what the policy learned to write, which is what
    lifts the mean score above where its calibration puts it. The AUC drop is reported but raises no alarm: a
    ranking degrades on a shifted distribution without being exploited (the frozen PRM's AUC falls as the
    policy moves on), an RM pessimistic about new correct samples loses AUC without over-rating anything, and
    the held-out AUC is noisy (bootstrap SE 0.08 on the quickstart's 152 held-out samples, against 0.05 for
    the gap), so a retrained RM whose AUC wobbles would fire. An exploited RM shows both; the gap rise alone
    says the error pays the policy.

    NaN: the AUC is undefined when the fresh samples are all correct or all wrong (as is the held-out one when
    that slice was), and then so is `auc_drop`; the gap, its rise and the alarm stay defined (an RM rating
    all-wrong samples high is what must fire). No fresh samples: gap and AUC NaN, and no alarm (0.0).

    >>> f = monitor_figures([0.9, 0.8, 0.4, 0.2], [1, 0, 1, 0], {"auc": 0.9, "gap": -0.2}, threshold=0.1)
    >>> {k: round(v, 3) for k, v in f.items()}  # gap 0.575 - 0.5; AUC 3 of 4 pairs ranked right
    {'gap': 0.075, 'auc': 0.75, 'gap_rise': 0.275, 'auc_drop': 0.15, 'alarm': 1.0}
    """
    gap = hacking_gap(fresh_scores, fresh_outcomes) if fresh_scores else float("nan")
    out = {"gap": gap, "auc": auc(fresh_scores, fresh_outcomes)}
    if calibration is None:
        return out
    out["gap_rise"] = gap - calibration["gap"]
    out["auc_drop"] = calibration["auc"] - out["auc"]
    out["alarm"] = 1.0 if out["gap_rise"] > threshold else 0.0  # NaN > threshold is False: no evidence, no alarm
    return out


def fresh_calibration(checkpoint: str | Path, shard: list[dict]) -> dict | None:
    """The calibration kept in the RM `checkpoint` if `shard`'s samples are new to it, else None.

    An RM trained in round c learned from shards 0..c (its own round's, minus the held-out prompts, and a
    replay of the earlier ones); on those, round 0's monitor among them (round 0's RMs on round 0's shard),
    no policy has trained against it yet and its scores are in-sample: nothing to compare.
    """
    from pipeline.reward_model import read_calibration

    cal = read_calibration(checkpoint)
    return cal if cal is not None and all(x["round"] > cal["round"] for x in shard) else None
