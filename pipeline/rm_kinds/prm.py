"""The PRM: token classification, one logit, binary cross-entropy only at step ends (Math-Shepherd's format, the
step's closing newline standing in for the tag token), target HE or SE; a solution's score aggregates its steps."""

from __future__ import annotations

from pipeline.reward_model import accuracy, auc, mean, step_label_pairs
from pipeline.rm_kinds import RewardModelKind
from pipeline.scorers import PrmScorer, aggregate
from pipeline.steps import STEP_SEPARATOR, step_char_ends, step_token_ends


def prm_examples(rows: list[dict], tokenizer, target: str, separator: str | None = None) -> list[dict]:
    """Token ids of `prompt + completion` with a label at each step end and -100 elsewhere.

    `separator`: the problem set's step separator; by default each row's `step_separator` (the reward-model
    phase puts the run's there, `reward_model.with_separator`), else a line.
    """
    key = "he_labels" if target == "hard" else "se_labels"
    out = []
    for r in rows:
        sep = separator or r.get("step_separator") or STEP_SEPARATOR
        if not step_char_ends(r["completion"], sep):
            continue  # a blank completion has no step to label
        enc = tokenizer(r["prompt"] + r["completion"], return_offsets_mapping=True)
        # The tokens PrmScorer reads in GRPO and evaluation (the same helper, the same text).
        idx = step_token_ends(enc["offset_mapping"], r["completion"], start=len(r["prompt"]), separator=sep)
        labels = [-100.0] * len(enc["input_ids"])
        for i, y in zip(idx, r[key]):
            labels[i] = float(y)
        out.append({"input_ids": enc["input_ids"], "labels": labels})
    return out


def prm_metrics(scorer: PrmScorer, rows: list[dict]) -> dict[str, float]:
    """Held-out PRM quality: step AUC/accuracy against MC (HE) and gold labels, solution AUC against outcomes."""
    steps = scorer.step_scores([r["prompt"] for r in rows], [r["completion"] for r in rows])
    out: dict[str, float] = {}
    for name, key in (("mc", "he_labels"), ("gold", "gold_labels")):
        pairs = step_label_pairs(steps, [r[key] for r in rows])
        if pairs:
            out[f"prm/step_auc_{name}"] = auc(*zip(*pairs))
            out[f"prm/step_accuracy_{name}"] = accuracy(*zip(*pairs))
    solution = [aggregate(s, scorer.aggregation) for s in steps]
    out["prm/solution_auc"] = auc(solution, [r["outcome"] for r in rows])
    out["prm/mean_score"] = mean(solution)
    return out


PRM = RewardModelKind(
    examples=lambda rows, tokenizer, rm: prm_examples(rows, tokenizer, rm.target),
    pairwise=lambda rm: False,
    scorer=lambda model, tokenizer, batch_size, rm: PrmScorer(model, tokenizer, batch_size, rm.aggregation),
    metrics=prm_metrics,
    lora_task_type="TOKEN_CLS",
    solution_auc="prm/solution_auc",
)
