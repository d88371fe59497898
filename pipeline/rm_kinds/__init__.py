"""The reward-model kinds as one table, `RM_KINDS`: torch-free, so the config validates `reward_model.kinds`
without importing transformers.

An entry says how the kind's model is built (a transformers head, one logit, on a policy's backbone), whether it
scores steps (then it can drive process and hybrid mode: `supervision.process_reward_model`), and where its
implementation is: a `RewardModelKind` (training examples and loss, scorer, held-out metrics), imported when first
used. The reward-model phase, every scorer (`pipeline.reward_model.load_scorer`), `models.factories` and the eval
phase read the table. A new kind is its module plus one `RM_KINDS.register(NAME, ...)` call (docs/extending.md).

A kind that scores steps is read in one of the published PRM layouts, `PRM_HEADS` (`reward_model.head`): today's
one-logit value head at each step's closing newline, Math-Shepherd's label tokens at a step tag, or Qwen2.5-Math-PRM's
2-class head at a separator. A checkpoint records its layout in `igrpo.json`; loading and scoring read it there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.registry import Registry, resolve


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
        loss: (`reward_model:` config, tokenizer) -> Trainer's `compute_loss_func` where it is not BCE on one logit
            (a PRM's tag layouts, the implicit PRM); None, or a None returned: `reward_model.bce_loss`. It follows
            `bce_loss`'s contract (its sum over Trainer's `num_items_in_batch`), unless `loss_is_mean`.
        loss_is_mean: its loss returns its micro-batch's mean (Trainer cannot count items of its labels, e.g. a
            tuple): Trainer then divides it by the accumulation steps.
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
    loss: Callable[[Any, Any], Callable | None] | None = None
    loss_is_mean: bool = False
    collate: Callable[[int], Callable] | None = None
    prepare: Callable[[list[dict], str, bool, Any], tuple[list[dict], dict]] | None = None


@dataclass(frozen=True, kw_only=True)
class RMKindEntry:
    """One registered kind (`RM_KINDS.register(NAME, head=..., scores_steps=..., implementation=..., ...)`).

    Attributes:
        head: the transformers auto class of its model, by name (`AutoModelForTokenClassification`): one logit on
            the backbone, new in round 0; a checkpoint's architecture tells its kind where `igrpo.json` does not.
        scores_steps: its scorer reads a score at every step end (it can give process supervision's step rewards).
        implementation: its `RewardModelKind`, or where it is, "module:attribute" (imported on first use).
        description: one line, for the docs' table.
        mc_labels: it trains on the collection's Monte-Carlo step labels, so `collect.rollouts_per_step: 0` (no
            rollouts) is refused while it is in `reward_model.kinds`.
        layouts: its model takes a PRM head layout (`reward_model.head`, `step_tag`, `label_tokens`, `init`;
            `PRM_HEADS`), recorded in its checkpoint.
    """

    head: str
    scores_steps: bool
    implementation: str | RewardModelKind
    description: str = ""
    mc_labels: bool = True
    layouts: bool = False


RM_KINDS: Registry[RMKindEntry] = Registry("reward model kind", RMKindEntry, {
    "prm": RMKindEntry(
        head="AutoModelForTokenClassification", scores_steps=True, implementation="pipeline.rm_kinds.prm:PRM",
        description="process RM: P(step correct) at each step's end, BCE on the MC step labels (hard or soft)",
        layouts=True),
    "orm": RMKindEntry(
        head="AutoModelForSequenceClassification", scores_steps=False, implementation="pipeline.rm_kinds.orm:ORM",
        description="outcome RM: P(correct) of a whole solution, BCE on the verifier's labels, or pairwise",
        mc_labels=False),
    "implicit": RMKindEntry(
        head="AutoModelForCausalLM", scores_steps=True, implementation="pipeline.rm_kinds.implicit:IMPLICIT",
        description="implicit PRM: beta log(pi/pi_ref) of a causal LM, BCE on the verifier's labels; its partial "
        "sums value every step", mc_labels=False),
})


def rm_entry(kind: str) -> RMKindEntry:
    """The registry entry of `kind` (an unknown one: the registry's error, listing the known ones)."""
    return RM_KINDS[kind]


def rm_kind(kind: str) -> RewardModelKind:
    """The implementation of `kind` (imported on first use)."""
    return resolve(RM_KINDS[kind].implementation)


def mc_label_kinds() -> list[str]:
    """The kinds that train on Monte-Carlo step labels (`RMKindEntry.mc_labels`)."""
    return [name for name, e in RM_KINDS.items() if e.mc_labels]


def layout_kinds() -> list[str]:
    """The kinds whose model takes a PRM head layout (`RMKindEntry.layouts`)."""
    return [name for name, e in RM_KINDS.items() if e.layouts]


def step_kinds() -> list[str]:
    """The kinds whose scorers read a score at every step end."""
    return [name for name, e in RM_KINDS.items() if e.scores_steps]


@dataclass(frozen=True)
class PrmHead:
    """One published layout of a PRM's head: where a step's score is read and how (REFERENCE, "Step-tag PRMs").

    Attributes:
        model_class: the transformers auto class of its model.
        num_labels: a token-classification head's classes; None for a causal LM's own LM head.
        step_tag: the default tag token put after each step, read there; None: no tag, read at the step's end
            (`pipeline.steps`: the closing newline stands in for the tag).
        label_tokens: the default (right, wrong) label tokens read from the LM head's logits; None: no label tokens.
        math: where its pure functions are, "module:attribute" (a `pipeline.rm_kinds.heads.HeadMath`).
        description: one line, for the docs.
        lora_task_type: peft's task type of its model.
    """

    model_class: str
    num_labels: int | None
    step_tag: str | None
    label_tokens: tuple[str, str] | None
    math: str
    description: str = ""
    lora_task_type: str = "TOKEN_CLS"


PRM_HEADS: Registry[PrmHead] = Registry("PRM head", PrmHead, {
    "value": PrmHead("AutoModelForTokenClassification", 1, None, None, "pipeline.rm_kinds.heads:VALUE",
                     "one logit on the backbone at each step's closing newline: sigmoid(logit), trained by BCE"),
    # Math-Shepherd (peiyi9979/math-shepherd-mistral-7b-prm): the LM head itself; a tag token after each step.
    "label_tokens": PrmHead("AutoModelForCausalLM", None, "ки", ("+", "-"), "pipeline.rm_kinds.heads:LABEL_TOKENS",
                            "a causal LM: P('+') normalised against '-' at a tag after each step, CE on the label token",
                            lora_task_type="CAUSAL_LM"),
    # Qwen2.5-Math-PRM: a 2-class head on every token, read at a separator after each step.
    "classification": PrmHead("AutoModelForTokenClassification", 2, "<extra_0>", None,
                              "pipeline.rm_kinds.heads:CLASSIFICATION",
                              "2 classes on the backbone: softmax(logits)[1] at a separator after each step, CE"),
})


@dataclass(frozen=True)
class PrmLayout:
    """A PRM's head and its tokens, as its checkpoint records them (`igrpo.json`) and the config asks for them."""

    head: str = "value"
    step_tag: str | None = None
    label_tokens: tuple[str, str] | None = None

    def to_json(self) -> dict:
        return {"head": self.head, "step_tag": self.step_tag,
                "label_tokens": list(self.label_tokens) if self.label_tokens else None}

    @staticmethod
    def from_json(data: dict) -> PrmLayout:
        tokens = data.get("label_tokens")
        return PrmLayout(data.get("head", "value"), data.get("step_tag"), tuple(tokens) if tokens else None)


def prm_head(name: str) -> PrmHead:
    """The entry of head `name` (an unknown one: the registry's error, listing the known ones)."""
    return PRM_HEADS[name]


def layout_of(rm: Any) -> PrmLayout:
    """The layout that `reward_model:` (`rm`) asks for: its head, with the head's default tokens where none is given."""
    entry = prm_head(rm.head)
    tokens = tuple(rm.label_tokens) if rm.label_tokens else entry.label_tokens
    return PrmLayout(rm.head, rm.step_tag or entry.step_tag, tokens)
