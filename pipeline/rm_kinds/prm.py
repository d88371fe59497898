"""The PRM: labels only at step ends, target HE or SE; a solution's score aggregates its steps.

Its head is one of the published layouts (`reward_model.head`, `pipeline.rm_kinds.PRM_HEADS`): one logit with BCE at
each step's closing newline (value, the newline standing in for Math-Shepherd's tag), the LM head's label tokens at a
tag after each step (label_tokens), or a 2-class head at a separator (classification). The `reward_model:` config
that reaches `examples`, `scorer` and `loss` carries the checkpoint's own layout (`pipeline.reward_model`).
"""

from __future__ import annotations

from pipeline.rm_kinds.base import PRM_TARGETS, PrmLayout, RewardModelKind, layout_of
from pipeline.rm_kinds.heads import StepReader
from pipeline.rm_metrics import accuracy, auc, mean, step_label_pairs
from pipeline.scorers import PrmScorer, aggregate
from pipeline.steps import STEP_SEPARATOR, step_char_ends


def prm_examples(rows: list[dict], tokenizer, target: str, reader: StepReader | None = None,
                 separator: str | None = None) -> list[dict]:
    """Token ids of the text the PRM reads (`prompt + completion`, with a tag after each step in a tag layout) with
    a label at each step's read token and -100 elsewhere. `reader`: the layout; None, the value head.

    `separator`: the problem set's step separator; by default each row's `step_separator` (the reward-model
    phase puts the run's there, `reward_model.with_separator`), else a line.
    """
    key = PRM_TARGETS[target].column
    reader = reader or StepReader(PrmLayout())
    out = []
    for r in rows:
        sep = separator or r.get("step_separator") or STEP_SEPARATOR
        if not step_char_ends(r["completion"], sep):
            continue  # a blank completion has no step to label
        text, reads = reader.place(r["prompt"], r["completion"], sep)
        enc = tokenizer(text, return_offsets_mapping=True)
        # The tokens PrmScorer reads in GRPO and evaluation (the same reader, the same text).
        idx = reader.tokens(enc["offset_mapping"], enc["input_ids"], reads)
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


def step_reader(rm, tokenizer) -> StepReader:
    """The reader of the layout `rm` (a `reward_model:` config) asks for, on `tokenizer`."""
    return StepReader.build(layout_of(rm), tokenizer)


PRM = RewardModelKind(
    examples=lambda rows, tokenizer, rm: prm_examples(rows, tokenizer, rm.target, step_reader(rm, tokenizer)),
    pairwise=lambda rm: False,
    scorer=lambda model, tokenizer, batch_size, rm: PrmScorer(model, tokenizer, batch_size, rm.aggregation,
                                                              step_reader(rm, tokenizer)),
    metrics=prm_metrics,
    lora_task_type="TOKEN_CLS",
    solution_auc="prm/solution_auc",
    loss=lambda rm, tokenizer: step_reader(rm, tokenizer).loss(),
)
