"""The ORM: sequence classification, one logit, binary cross-entropy on the verifier's outcome labels; or pairwise
(Bradley-Terry, TRL's `RewardTrainer`) on correct/incorrect completions of one prompt."""

from __future__ import annotations

from pipeline.rm_kinds.base import RewardModelKind
from pipeline.rm_kinds.sections import ORM_LOSSES
from pipeline.rm_metrics import accuracy, auc, mean
from pipeline.scorers import OrmScorer


def sequence_ids(tokenizer, row: dict) -> list[int]:
    """Token ids of a row's `prompt + completion` as the ORM sees it (no eos appended)."""
    return tokenizer(row["prompt"] + row["completion"])["input_ids"]


def orm_examples(rows: list[dict], tokenizer) -> list[dict]:
    return [{"input_ids": sequence_ids(tokenizer, r), "labels": float(r["outcome"])} for r in rows]


def orm_pairs(rows: list[dict], tokenizer) -> list[dict]:
    """Every (correct, incorrect) pair of completions of one prompt from one round, as TRL's tokenized columns.

    Tokenized like `orm_examples` (`sequence_ids`), so pairwise and BCE ORMs score the same text.
    """
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["round"], r["prompt_id"]), []).append(r)
    return [
        {"chosen_ids": sequence_ids(tokenizer, good), "rejected_ids": sequence_ids(tokenizer, bad)}
        for group in groups.values()
        for good in group if good["outcome"]
        for bad in group if not bad["outcome"]
    ]


def _examples(rows: list[dict], tokenizer, rm) -> list[dict]:
    if not ORM_LOSSES[rm.orm.loss].pairwise:
        return orm_examples(rows, tokenizer)
    pairs = orm_pairs(rows, tokenizer)
    if not pairs:
        raise ValueError(f"reward_model.orm.loss={rm.orm.loss}: no prompt has both a correct and an incorrect "
                         "completion in the training rows; use loss: bce or sample more per prompt")
    return pairs


def orm_metrics(scorer: OrmScorer, rows: list[dict]) -> dict[str, float]:
    """Held-out ORM quality against the verifier's outcomes."""
    s = scorer([r["prompt"] for r in rows], [r["completion"] for r in rows])
    outcomes = [r["outcome"] for r in rows]
    return {"orm/auc": auc(s, outcomes), "orm/accuracy": accuracy(s, outcomes), "orm/mean_score": mean(s)}


ORM = RewardModelKind(
    examples=_examples,
    pairwise=lambda rm: ORM_LOSSES[rm.orm.loss].pairwise,
    scorer=lambda model, tokenizer, batch_size, rm: OrmScorer(model, tokenizer, batch_size),
    metrics=orm_metrics,
    lora_task_type="SEQ_CLS",
    solution_auc="orm/auc",
)
