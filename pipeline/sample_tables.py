"""The sample tables a round logs to MLflow: what the policy wrote, on a fixed, seeded slice of its samples.

Two tables per round, both in the round's eval-phase run (`tracking.log_table`): `samples/collect.json`, a
slice of the round's shard (the fresh policy on training prompts, with its verifier and MC step labels),
and `samples/eval.json`, a slice of the eval phase's samples on held-out problems. Which samples a table
shows depends on `run.seed` and the prompt ids only, never on the round (`pick`): every round's eval table
shows the same held-out prompts. Collection draws fresh prompts each round, so its tables share prompts
only where two rounds drew the same ones (then they show them).

The RM scores are the ones the eval phase computes anyway, not a second pass: on the eval samples the
round's new RMs' (best-of-N's), on the shard those of the RMs GRPO trained against, round r-1's (round 0:
its own; the reward-hacking monitor's). `scored_by` names the checkpoints.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.steps import split_steps

if TYPE_CHECKING:  # pipeline.scorers imports torch; these functions only read its Scores
    from pipeline.scorers import Scores

TABLES = {"collect": "samples/collect.json", "eval": "samples/eval.json"}  # artifact file of each table


def pick(keys: Sequence[tuple[str, int]], rows: int, seed: int) -> list[int]:
    """The indices of the `rows` samples a table shows, from each sample's (prompt_id, sample_index).

    Every prompt id gets a rank from `seed` (a hash: a prompt's rank does not depend on which other prompts
    are there). A table takes sample 0 of the best-ranked prompts, then their sample 1, ...: as many prompts
    as it holds. It lists them by rank, a prompt's samples together.

    >>> keys = [("a", 0), ("a", 1), ("b", 0), ("b", 1), ("c", 0), ("c", 1)]
    >>> [keys[i] for i in pick(keys, 4, seed=0)]
    [('a', 0), ('a', 1), ('c', 0), ('b', 0)]
    """
    rank = {pid: hashlib.sha256(f"{seed}:{pid}".encode()).hexdigest() for pid, _ in keys}
    chosen = sorted(range(len(keys)), key=lambda i: (keys[i][1], rank[keys[i][0]]))[: max(rows, 0)]
    return sorted(chosen, key=lambda i: (rank[keys[i][0]], keys[i][1]))


def sample_table(samples: Sequence[dict], scores: dict[str, Scores], rows: int, seed: int,
                 scored_by: str = "") -> list[dict]:
    """The rows of one table: `pick`'s slice of `samples` (rows in the shard's columns) with each RM's scores.

    `scores[kind]` is that RM's scores of every sample, in order. Columns: round, prompt_id, sample_index,
    prompt, completion, steps, answer (extracted; null when none), verifier (0/1), then per RM
    `<kind>_step_scores` (a PRM's, one per step) and `<kind>_score` (the solution's), then the MC labels
    `he_labels`, `se_labels` and `gold_labels` (null where not known: eval samples have no MC labels, GSM8K
    no gold step labels), and `scored_by`.
    """
    for kind, s in scores.items():
        if len(s.solutions) != len(samples) or (s.steps is not None and len(s.steps) != len(s.solutions)):
            raise ValueError(f"{kind} scores: {len(s.solutions)} for {len(samples)} samples")
    picked = pick([(x["prompt_id"], x["sample_index"]) for x in samples], rows, seed)
    return [_row(samples[i], {kind: _one(s, i) for kind, s in scores.items()}, scored_by) for i in picked]


def _one(scores: Scores, i: int) -> dict[str, object]:
    steps = {} if scores.steps is None else {"step_scores": scores.steps[i]}
    return {**steps, "score": scores.solutions[i]}


def _row(sample: dict, scores: dict[str, dict[str, object]], scored_by: str) -> dict:
    row = {k: sample[k] for k in ("round", "prompt_id", "sample_index", "prompt", "completion", "steps", "answer")}
    row["verifier"] = sample["outcome"]
    row |= {f"{kind}_{name}": v for kind, s in scores.items() for name, v in s.items()}
    row |= {k: sample.get(k) for k in ("he_labels", "se_labels", "gold_labels")}
    row["scored_by"] = scored_by
    return row


def eval_samples(problem_set, problems: Sequence, prompts: Sequence[str], texts: Sequence[Sequence[str]],
                 answers: Sequence[Sequence[str | None]], correct: Sequence[Sequence[bool]],
                 round_index: int) -> list[dict]:
    """The eval phase's samples as rows in the shard's columns, problem by problem; no MC labels (the eval
    phase runs no rollouts), gold step labels where the problem set knows them."""
    gold = problem_set.gold_step_labels if problem_set.has_gold_step_labels else lambda text, problem: None
    return [
        {"round": round_index, "prompt_id": p.id, "sample_index": j, "prompt": q, "completion": t,
         "steps": split_steps(t, problem_set.step_separator), "answer": a, "outcome": int(c), "he_labels": None, "se_labels": None,
         "gold_labels": gold(t, p)}
        for p, q, ts, ans, cs in zip(problems, prompts, texts, answers, correct)
        for j, (t, a, c) in enumerate(zip(ts, ans, cs))
    ]


def scored_by(checkpoints: dict[str, str], run_dir: Path | None = None) -> str:
    """'prm=round-000/reward_model/prm, orm=...': the RMs behind a table's scores, inside `run_dir` relative to it.

    >>> scored_by({"prm": "/r/x/round-000/reward_model/prm", "orm": "models:/x-orm@round-0"}, Path("/r/x"))
    'prm=round-000/reward_model/prm, orm=models:/x-orm@round-0'
    """
    def short(path: str) -> str:
        if run_dir is not None and Path(path).absolute().is_relative_to(run_dir.absolute()):
            return str(Path(path).absolute().relative_to(run_dir.absolute()))
        return str(path)

    return ", ".join(f"{kind}={short(path)}" for kind, path in checkpoints.items())
