"""The collection phase: sample the fresh policy, label outcomes with the verifier, label steps by Monte Carlo.

Math-Shepherd (arXiv 2312.08935 §3.3): from the prefix ending at step i, the completer (the current
policy, or round 0's with `collect.prover: round0`: PAV's prover) writes N completions; hard estimation (HE) is 1 if any reaches the gold answer, soft estimation
(SE) the fraction that do. A prefix that already states a final answer needs no rollouts: the verifier
labels it. Strategy `first_error` (OmegaPRM's idea) binary-searches the first step whose prefix can no
longer reach the gold answer, assuming reachability is monotone, with about log2(K) probed prefixes; the
labels of the steps it never probes are imputed from the search (HE, and SE set to HE: a hard label where
`target: soft` asks for a soft one), and `collect/imputed_label_share` logs their share. With
`collect.rollouts_per_step: 0` no prefix is rolled out and no step is labelled (empty `he_labels`, `se_labels`): for
the RMs that train on outcomes only (the implicit PRM, the ORM).

The prompts are sampled and labelled in parts (`collect.prompts_per_part`), each seeded by its index and kept in
the round's `.collect-parts/` as it finishes, so that a stopped collection resumes after its last finished part to
the same shard (`pipeline/resume.py`).

A prefix is cut from the policy's own tokens: the prompt's ids, then the sampled completion's ids up to
the token holding the step's end (`steps.step_token_ends`, the token the PRM is trained on). Rollouts go on
from those ids, never from the prefix's text tokenized again (which can give other tokens: SentencePiece
spaces, a character split over byte tokens, a merge across the cut).
"""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass
from pathlib import Path

from pipeline.collect_choices import PROVERS, STRATEGIES
from pipeline.config import PipelineConfig
from pipeline.generation import Continuation
from pipeline.mc_labels import Labels, agreement, imputed_share, make_request
from pipeline.problems import Problem, ProblemSet
from pipeline.replay import ReplayBuffer, write_shard
from pipeline.rundir import RunDir, read_json, write_json_atomic
from pipeline.steps import split_steps


def draw_prompts(problem_set: ProblemSet, run_dir: Path, round_index: int, count: int, seed: int) -> list[Problem]:
    """M training problems for this round: ones not drawn in earlier rounds first, until the pool runs out."""
    used = {row["prompt_id"] for row in ReplayBuffer(run_dir).history(round_index)}
    rng = random.Random(seed * 7919 + round_index)
    fresh = [p for p in problem_set.train if p.id not in used]
    rng.shuffle(fresh)
    if len(fresh) < count:  # pool exhausted: top up from the problems seen before
        seen = [p for p in problem_set.train if p.id in used]
        rng.shuffle(seen)
        fresh += seen[: count - len(fresh)]
    return fresh[:count]


@dataclass
class CollectResult:
    shard_path: Path
    metrics: dict[str, float]


PART_SEED_STRIDE = 1_000_003  # part b samples with seed + b * this: apart from part 0's MC streams (seed + 17 k)


def collect_part(problem_set: ProblemSet, c, sample, prove, problems: list[Problem], prompts: dict[str, str],
                 tokenizer, seed: int) -> dict:
    """Sample and label one part's prompts, all from `seed`: the rows of its samples (the shard's columns but
    `round` and `policy`), their imputed label counts, and the timings and counts the phase's figures sum."""
    stats = {"rollout_seconds": 0.0, "rollout_tokens": 0, "rollouts": 0, "calls": 0}

    def completer(prefixes: list[Continuation], n: int) -> list[list[str]]:
        stats["calls"] += 1
        out = prove(prefixes, n, seed=seed + 17 * stats["calls"], desc="MC rollouts")
        stats["rollout_seconds"] += out.seconds
        stats["rollout_tokens"] += out.total_tokens
        stats["rollouts"] += len(prefixes) * n
        return out.texts

    # Sample the fresh policy.
    fresh = sample([prompts[p.id] for p in problems], c.samples_per_prompt, seed=seed, desc="samples")
    items = [(p, j, fresh.texts[i][j], fresh.num_tokens[i][j], fresh.ids[i][j])
             for i, p in enumerate(problems) for j in range(c.samples_per_prompt)]
    # Label: verifier outcome, then MC step labels through one batched stream.
    reqs = [make_request(problem_set, p, tokenizer, ids, prompts[p.id]) for p, _, _, _, ids in items]
    label = STRATEGIES[c.strategy].label
    if c.rollouts_per_step == 0:  # no MC labels: the RMs trained need none (config: `mc_label_kinds`)
        labels = [Labels([], []) for _ in reqs]
    else:
        labels = label(problem_set, completer, reqs, c.rollouts_per_step)
    rows = []
    for (p, j, text, ntok, _), lab in zip(items, labels):
        g = problem_set.gold_step_labels(text, p) if problem_set.has_gold_step_labels else None
        rows.append({
            "prompt_id": p.id, "prompt": prompts[p.id],
            "sample_index": j, "completion": text, "answer": problem_set.extract_answer(text),
            "steps": split_steps(text, problem_set.step_separator), "outcome": int(problem_set.is_correct(text, p)),
            "he_labels": lab.he, "se_labels": lab.se, "gold_labels": g, "rollouts": lab.rollouts,
            "num_tokens": ntok,
        })
    stats.update(sample_seconds=fresh.seconds, sample_tokens=fresh.total_tokens)
    return {"rows": rows, "imputed": [lab.imputed for lab in labels], "stats": stats}


def collection_metrics(parts: list[dict], has_gold: bool) -> dict[str, float]:
    """The phase's figures over its parts' rows and counts."""
    rows = [r for part in parts for r in part["rows"]]
    total = lambda key: sum(part["stats"][key] for part in parts)  # noqa: E731
    labels = [Labels(r["he_labels"], r["se_labels"], r["rollouts"], k)
              for part in parts for r, k in zip(part["rows"], part["imputed"])]
    metrics = {
        "collect/samples": float(len(rows)),
        "collect/verifier_accuracy": sum(r["outcome"] for r in rows) / max(len(rows), 1),
        "collect/steps_per_sample": sum(len(r["steps"]) for r in rows) / max(len(rows), 1),
        "collect/imputed_label_share": imputed_share(labels),  # first_error's inferred labels (SE = HE there)
        "collect/rollouts": float(total("rollouts")),
        "collect/rollouts_per_s": total("rollouts") / max(total("rollout_seconds"), 1e-9),
        "collect/rollout_tokens_per_s": total("rollout_tokens") / max(total("rollout_seconds"), 1e-9),
        "collect/sample_tokens_per_s": total("sample_tokens") / max(total("sample_seconds"), 1e-9),
    }
    if has_gold and total("rollouts"):  # no rollouts (`collect.rollouts_per_step: 0`): no MC labels to compare
        gold = [r["gold_labels"] for r in rows]
        metrics["collect/he_gold_agreement"] = agreement([r["he_labels"] for r in rows], gold)
        metrics["collect/se_gold_agreement"] = agreement([r["se_labels"] for r in rows], gold)
    return metrics


def run_collection_phase(
    cfg: PipelineConfig, problem_set: ProblemSet, policy_path: str | Path, run_dir: str | Path, round_index: int
) -> CollectResult:
    """Sample G completions for M fresh prompts, label outcomes and steps, write the round's shard.

    The prompts go in parts of `collect.prompts_per_part`, each seeded by its index and written to the round's
    `.collect-parts/` as it finishes: a resumed collection (same config, round and policy: `pipeline.resume`)
    reads the finished parts back and goes on with the next, to the shard of a collection never stopped.
    With `collect.workers > 1` every generation call (the samples, then each MC rollout stream) is sharded over
    the workers (`pipeline/fanout.py`) and merged here; labelling itself stays here, as it only reads strings.
    The shard is the same as with one worker.
    """
    import shutil

    from models.factories import load_tokenizer
    from pipeline.fanout import open_sampler
    from pipeline.prompts import renderer_from_config
    from pipeline.resume import claim, fingerprint

    c, run = cfg.collect, RunDir(run_dir)
    tokenizer = load_tokenizer(str(policy_path))  # the policy's: step prefixes are cut from its tokens
    render = renderer_from_config(cfg, tokenizer).render
    seed = cfg.run.seed * 1000 + round_index
    prover = PROVERS[c.prover].path(run, policy_path)  # who writes the MC rollouts
    problems = draw_prompts(problem_set, Path(run_dir), round_index, c.prompts_per_round, cfg.run.seed)
    prompts = {p.id: render(p) for p in problems}  # what the policy, the rollouts and the RMs read
    scratch = run.collect_parts(round_index)
    claim(scratch, fingerprint(cfg, "collect", round_index, policy=str(policy_path), prover=str(prover)))
    parts = []
    with contextlib.ExitStack() as models:
        sample = models.enter_context(open_sampler(str(policy_path), c, dtype=cfg.policy.dtype))
        prove = sample if str(prover) == str(policy_path) else models.enter_context(
            open_sampler(str(prover), c, dtype=cfg.policy.dtype))
        for b, start in enumerate(range(0, len(problems), c.prompts_per_part)):
            path = scratch / f"part-{b:05d}.json"
            if not path.exists():  # else finished before a stop: read back, as every part is
                part = collect_part(problem_set, c, sample, prove, problems[start:start + c.prompts_per_part],
                                    prompts, tokenizer, seed + b * PART_SEED_STRIDE)
                write_json_atomic(path, part)
            parts.append(read_json(path))

    rows = [{"round": round_index, "policy": str(policy_path), **r} for part in parts for r in part["rows"]]
    metrics = collection_metrics(parts, problem_set.has_gold_step_labels)
    path = write_shard(rows, run.shard(round_index))
    write_json_atomic(run.collect_json(round_index), metrics)
    shutil.rmtree(scratch, ignore_errors=True)
    return CollectResult(path, metrics)
