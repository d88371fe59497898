"""The RM kinds' and PRM head layouts' interface: the types a kind module builds (`RewardModelKind`), the two tables
(`RM_KINDS`, `PRM_HEADS`) and their lookups. Torch-free, and below every kind module: each imports its types from
here, and the package (`pipeline/rm_kinds/__init__.py`) registers the built-in entries, so the tables never import
the modules that read them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.registry import Registry, resolve
from pipeline.rm_kinds.sections import KindSection


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
        updated_online: (`reward_model:` config) -> True where its scorer trains the model as it scores (the
            implicit PRM's online update): the model then loads in float32 whatever `reward_model.dtype` says, as
            training keeps float32 weights; None: never.
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
    updated_online: Callable[[Any], bool] | None = None


@dataclass(frozen=True, kw_only=True)
class RMKindEntry:
    """One registered kind (`RM_KINDS.register(NAME, head=..., scores_steps=..., implementation=..., ...)`).

    Attributes:
        head: the transformers auto class of its model, by name (`AutoModelForTokenClassification`): one logit on
            the backbone, new in round 0; a checkpoint's architecture tells its kind where `igrpo.json` does not.
        scores_steps: its scorer reads a score at every step end (it can give process supervision's step rewards).
        implementation: its `RewardModelKind`; or, so that the table stays torch-free, a function of no arguments
            that imports and returns it (a real import, which the import graph sees: the built-in kinds'), or where
            it is, "module:attribute" (a plugin's module), imported on first use.
        description: what it scores, for the docs' table of kinds.
        training: how it is trained, for the table.
        use: when to use it, for the table.
        mc_labels: it trains on the collection's Monte-Carlo step labels, so `collect.rollouts_per_step: 0` (no
            rollouts) is refused while it is in `reward_model.kinds`.
        layouts: its model takes a PRM head layout (`reward_model.head`, `step_tag`, `label_tokens`, `init`;
            `PRM_HEADS`), recorded in its checkpoint.
        token_rewards: its scorer also gives per-token rewards (`scorer.token_rewards`), which PRIME's credit
            (`supervision.process_reward: prime`, `pipeline.step_rewards.PROCESS_REWARDS`) reads: only a kind with
            them can be the step scorer there (the implicit PRM's).
        config: its own config section, `reward_model.<kind>` (a `KindSection`); None: none.
        check: (the whole `PipelineConfig`) -> None, raising ValueError that names the field and says the fix;
            run at load while the kind is in `reward_model.kinds`.
    """

    head: str
    scores_steps: bool
    implementation: RewardModelKind | Callable[[], RewardModelKind] | str
    description: str = ""
    training: str = ""
    use: str = ""
    mc_labels: bool = True
    layouts: bool = False
    token_rewards: bool = False
    config: type[KindSection] | None = None
    check: Callable[[Any], None] | None = None


RM_KINDS: Registry[RMKindEntry] = Registry("reward model kind", RMKindEntry)  # built-ins: `__init__.py`


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


def token_reward_kinds() -> list[str]:
    """The kinds whose scorers also give per-token rewards (`RMKindEntry.token_rewards`: PRIME's credit reads them)."""
    return [name for name, e in RM_KINDS.items() if e.token_rewards]


@dataclass(frozen=True)
class PrmHead:
    """One published layout of a PRM's head: where a step's score is read and how (REFERENCE, "Step-tag PRMs").

    Attributes:
        model_class: the transformers auto class of its model.
        num_labels: a token-classification head's classes; None for a causal LM's own LM head.
        step_tag: the default tag token put after each step, read there; None: no tag, read at the step's end
            (`pipeline.steps`: the closing newline stands in for the tag).
        label_tokens: the default (right, wrong) label tokens read from the LM head's logits; None: no label tokens.
        math: its pure functions (a `pipeline.rm_kinds.heads.HeadMath`), or a function of no arguments that imports
            and returns them, or where they are, "module:attribute".
        description: one line, for the docs.
        lora_task_type: peft's task type of its model.
    """

    model_class: str
    num_labels: int | None
    step_tag: str | None
    label_tokens: tuple[str, str] | None
    math: Any
    description: str = ""
    lora_task_type: str = "TOKEN_CLS"


PRM_HEADS: Registry[PrmHead] = Registry("PRM head", PrmHead)  # built-ins: `__init__.py`


@dataclass(frozen=True, kw_only=True)
class Aggregation:
    """How a solution's score comes from its step scores (`AGGREGATIONS.register(NAME, description=...,
    aggregate=...)`), the choices of `reward_model.aggregation`.

    Attributes:
        description: what the solution's score is, for the docs.
        aggregate: (a solution's step scores, at least one) -> its score.
    """

    description: str
    aggregate: Callable[[Sequence[float]], float]


AGGREGATIONS: Registry[Aggregation] = Registry("aggregation", Aggregation, {
    "min": Aggregation(description="the weakest step's score (Math-Shepherd)", aggregate=min),
    "last": Aggregation(description="the last step's score", aggregate=lambda step_scores: step_scores[-1]),
    "product": Aggregation(description="the product of the step scores", aggregate=math.prod),
})



@dataclass(frozen=True, kw_only=True)
class PrmTarget:
    """Which MC step labels a PRM trains on (`PRM_TARGETS.register(NAME, description=..., column=...)`), the
    choices of `reward_model.target`.

    Attributes:
        description: the labels, for the docs.
        column: the collected shard's column of per-step labels it reads (`pipeline.replay`).
    """

    description: str
    column: str


PRM_TARGETS: Registry[PrmTarget] = Registry("PRM target", PrmTarget, {
    "hard": PrmTarget(description="hard estimation (HE): 1 if any MC rollout from the step reaches the gold answer",
                      column="he_labels"),
    "soft": PrmTarget(description="soft estimation (SE): the share of the step's MC rollouts that reach it",
                      column="se_labels"),
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


def head_math(name: str):
    """The pure functions of head `name` (a `pipeline.rm_kinds.heads.HeadMath`), imported on first use."""
    return resolve(prm_head(name).math)


def prm_head(name: str) -> PrmHead:
    """The entry of head `name` (an unknown one: the registry's error, listing the known ones)."""
    return PRM_HEADS[name]


def layout_of(rm: Any) -> PrmLayout:
    """The layout that `reward_model:` (`rm`) asks for: its head, with the head's default tokens where none is given."""
    entry = prm_head(rm.head)
    tokens = tuple(rm.label_tokens) if rm.label_tokens else entry.label_tokens
    return PrmLayout(rm.head, rm.step_tag or entry.step_tag, tokens)
