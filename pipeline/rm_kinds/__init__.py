"""The reward-model kinds as one table, `RM_KINDS`: torch-free, so the config validates `reward_model.kinds`
without importing transformers.

An entry says how the kind's model is built (a transformers head, one logit, on a policy's backbone), whether it
scores steps (then it can drive process and hybrid mode: `supervision.process_reward_model`), and where its
implementation is: a `RewardModelKind` (training examples and loss, scorer, held-out metrics), imported when first
used. The reward-model phase, every scorer (`pipeline.reward_model.load_scorer`), `models.factories` and the eval
phase read the table. A new kind is its module plus one `register_rm_kind` call (docs/extending.md).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RewardModelKind:
    """What the pipeline does differently for one kind of reward model.

    Attributes:
        examples: (training rows, tokenizer, `reward_model:` config) -> training examples: `input_ids` and
            `labels` for BCE (`reward_model.bce_loss`: -100 where unlabelled), TRL's `chosen_ids` /
            `rejected_ids` when `pairwise`.
        pairwise: (`reward_model:` config) -> True to train with TRL's RewardTrainer on pairs, else BCE.
        scorer: (model, tokenizer, batch size, `reward_model:` config) -> its scorer (`pipeline.scorers`):
            `scorer(prompts, completions)` is one score per solution, `scorer.scores(...)` a `Scores`, and a kind
            that scores steps has `scorer.step_scores(...)`; `scorer.model` is the model.
        metrics: (scorer, held-out rows) -> RM quality, `<kind>/...`, `<kind>/mean_score` (mean solution score)
            among them.
        lora_task_type: peft's task type of its head.
        solution_auc: the metric of `metrics` that is the AUC of its solution scores against the verifier.
        loss: (`reward_model:` config) -> Trainer's `compute_loss_func` for its examples, returning the mean over its
            micro-batch (Trainer then divides by the accumulation steps); None: `reward_model.bce_loss`.
        collate: (pad token id) -> the data collator of its examples; None: `reward_model.collate`.
        prepare: (examples, what training starts from, warm, `reward_model:` config) -> (the examples with what the
            loss needs from outside the trained model, what the checkpoint's `igrpo.json` records beside its kind);
            None: the examples as they are, nothing more recorded. The implicit PRM's: its reference model's
            log-probabilities, and which reference (`pipeline/rm_kinds/implicit.py`).
    """

    examples: Callable[[list[dict], Any, Any], list[dict]]
    pairwise: Callable[[Any], bool]
    scorer: Callable[[Any, Any, int, Any], Callable[[Sequence[str], Sequence[str]], list[float]]]
    metrics: Callable[[Any, list[dict]], dict[str, float]]
    lora_task_type: str
    solution_auc: str
    loss: Callable[[Any], Callable] | None = None
    collate: Callable[[int], Callable] | None = None
    prepare: Callable[[list[dict], str, bool, Any], tuple[list[dict], dict]] | None = None


@dataclass(frozen=True)
class RMKindEntry:
    """One registered kind.

    Attributes:
        head: the transformers auto class of its model, by name (`AutoModelForTokenClassification`): one logit on
            the backbone, new in round 0; a checkpoint's architecture tells its kind where `igrpo.json` does not.
        scores_steps: its scorer reads a score at every step end (it can give process supervision's step rewards).
        implementation: its `RewardModelKind`, or where it is, "module:attribute" (imported on first use).
        description: one line, for the docs' table.
        mc_labels: it trains on the collection's Monte-Carlo step labels, so `collect.rollouts_per_step: 0` (no
            rollouts) is refused while it is in `reward_model.kinds`.
    """

    head: str
    scores_steps: bool
    implementation: str | RewardModelKind
    description: str = ""
    mc_labels: bool = True


RM_KINDS: dict[str, RMKindEntry] = {
    "prm": RMKindEntry("AutoModelForTokenClassification", True, "pipeline.rm_kinds.prm:PRM",
                       "process RM: P(step correct) at each step's end, BCE on the MC step labels (hard or soft)"),
    "orm": RMKindEntry("AutoModelForSequenceClassification", False, "pipeline.rm_kinds.orm:ORM",
                       "outcome RM: P(correct) of a whole solution, BCE on the verifier's labels, or pairwise",
                       mc_labels=False),
    "implicit": RMKindEntry("AutoModelForCausalLM", True, "pipeline.rm_kinds.implicit:IMPLICIT",
                            "implicit PRM: beta log(pi/pi_ref) of a causal LM, BCE on the verifier's labels; "
                            "its partial sums value every step", mc_labels=False),
}


def register_rm_kind(name: str, entry: RMKindEntry) -> None:
    """Add a reward-model kind: `reward_model.kinds: [..., NAME]` then trains and scores with it everywhere."""
    RM_KINDS[name] = entry


def rm_entry(kind: str) -> RMKindEntry:
    """The registry entry of `kind`; an unknown kind is a ValueError listing the known ones."""
    if kind not in RM_KINDS:
        raise ValueError(f"unknown reward model kind {kind!r}; known: {', '.join(RM_KINDS)}")
    return RM_KINDS[kind]


def rm_kind(kind: str) -> RewardModelKind:
    """The implementation of `kind` (imported on first use)."""
    impl = rm_entry(kind).implementation
    if isinstance(impl, str):
        module, _, attr = impl.partition(":")
        impl = getattr(importlib.import_module(module), attr)
    return impl


def mc_label_kinds() -> list[str]:
    """The kinds that train on Monte-Carlo step labels (`RMKindEntry.mc_labels`)."""
    return [name for name, e in RM_KINDS.items() if e.mc_labels]


def step_kinds() -> list[str]:
    """The kinds whose scorers read a score at every step end."""
    return [name for name, e in RM_KINDS.items() if e.scores_steps]
