"""Reward-model checkpoints by kind: building a kind's model on a policy's backbone, saving it with its kind and
PRM layout recorded, loading it back as that kind, and the layout a loaded checkpoint is read in. What needs the kinds' table (`RM_KINDS`), a PRM's head
layout (`PRM_HEADS`) or the step tag checks lives here; `models.factories` builds and loads from plain arguments.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from transformers import AutoConfig, PreTrainedModel, PreTrainedTokenizerBase

from models.factories import add_tokens, checkpoint_record, load_checkpoint, model_from_policy, resolve_spec, save_model
from pipeline.config import RewardModelConfig
from pipeline.rm_kinds.base import RM_KINDS, PrmLayout, layout_of, prm_head, rm_entry
from pipeline.rm_kinds.heads import tag_kept_apart


def model_class(kind: str, layout: PrmLayout | None = None) -> str:
    """The transformers auto class of a reward-model kind's model (`RM_KINDS`), or of a PRM's head layout
    (`PRM_HEADS`) where one is given."""
    entry = RM_KINDS[kind]  # an unknown kind: the registry's error, listing the known ones
    return prm_head(layout.head).model_class if layout else entry.head


def reward_model_from_policy(spec: str, kind: str, layout: PrmLayout | None = None,
                             ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A reward model of `kind` (its head: an ORM's sequence classification, a PRM's token classification) with
    one logit on a policy's backbone; a PRM `layout` other than the value head: its model instead, the policy's
    causal LM itself (label tokens, its LM head reused) or a 2-class head, with the layout's step tag added to the
    tokenizer (and the embeddings) where the tokenizer lacks it or does not keep it apart.

    The backbone weights come from the policy; the head is new (round 0 of the loop).
    """
    name = model_class(kind, layout)
    model, tokenizer = model_from_policy(spec, name, prm_head(layout.head).num_labels if layout else 1)
    tag = layout.step_tag if layout else None
    if tag and (tag not in tokenizer.get_vocab() or not tag_kept_apart(tokenizer, tag)):
        add_tokens(model, tokenizer, [tag])
    return model, tokenizer


def save_reward_model(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: str | os.PathLike,
                      kind: str, layout: PrmLayout | None = None, meta: dict | None = None) -> Path:
    """`models.save_model`, with the kind recorded in the checkpoint's `igrpo.json` (`reward_model_kind` reads it
    back), a PRM's layout (`reward_model_layout`), and `meta`: more entries (the implicit PRM's reference model,
    `RewardModelKind.prepare`)."""
    record = {"kind": kind, **({"layout": layout.to_json()} if layout else {}), **(meta or {})}
    return save_model(model, tokenizer, path, record)


def reward_model_layout(path: str | os.PathLike) -> PrmLayout | None:
    """The PRM layout a checkpoint records; the value head for a PRM saved here before layouts were recorded (its
    kind recorded, no layout); None for an ORM or a checkpoint saved elsewhere (a published PRM: its layout is the
    config's `reward_model.head`)."""
    record = checkpoint_record(path)
    if isinstance(record.get("layout"), dict):
        return PrmLayout.from_json(record["layout"])
    kind = RM_KINDS.get(record.get("kind"))
    return PrmLayout() if kind is not None and kind.layouts else None


def reward_model_kind(path: str | os.PathLike) -> str:
    """The kind ('prm', 'orm', ...) of a saved reward model: the one its `igrpo.json` records, else the first kind
    of the table whose head its config's architecture is (checkpoints written before the kind was recorded)."""
    recorded = checkpoint_record(path).get("kind")
    if recorded in RM_KINDS:
        return recorded
    config = AutoConfig.from_pretrained(str(path))
    for kind, entry in RM_KINDS.items():
        if entry.head == "AutoModelForCausalLM":
            continue  # a causal LM is a policy unless its igrpo.json names its kind (the implicit PRM's always does)
        suffix = entry.head.removeprefix("AutoModel")  # LlamaForTokenClassification ends in ForTokenClassification
        if any(arch.endswith(suffix) for arch in config.architectures or []):
            return kind
    expected = " or ".join(kind_name(kind) for kind in RM_KINDS)
    raise ValueError(f"{path}: not a reward model (architectures {config.architectures}); expected {expected}")


def kind_name(kind: str) -> str:
    """The kind said as letters, with its article, for messages.

    >>> kind_name("prm"), kind_name("orm")
    ('a PRM', 'an ORM')
    """
    return f"{'an' if kind[0].upper() in 'AEFHILMNORSX' else 'a'} {kind.upper()}"


def load_reward_model(path: str | os.PathLike, expect: str | None = None, layout: PrmLayout | None = None,
                      dtype: torch.dtype = torch.float32) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, str]:
    """Load a saved reward model as its kind, its weights in `dtype` (float32 to train; `reward_model.dtype` to
    score); `expect` (a kind) refuses another kind with a clear error.

    A PRM loads in the layout its checkpoint records; `layout` is the one to take where it records none (a
    published PRM, `reward_model.init`: then it is `expect`'s kind, whatever its architecture). A local path or a
    hub id.
    """
    resolved, _ = resolve_spec(str(path))
    recorded = checkpoint_record(resolved).get("kind")
    kind = expect if layout is not None and recorded is None else reward_model_kind(resolved)
    if expect is not None and kind != expect:
        raise ValueError(f"{path}: is {kind_name(kind)} but {kind_name(expect)} is needed here")
    layout = reward_model_layout(resolved) or layout
    model, tokenizer = load_checkpoint(path, model_class(kind, layout), dtype)
    return model, tokenizer, kind


def with_layout(rm: RewardModelConfig, layout: PrmLayout | None) -> RewardModelConfig:
    """`rm` with a checkpoint's PRM layout in place of the config's: what its kind's examples, scorer and loss read."""
    if layout is None:
        return rm
    tokens = list(layout.label_tokens) if layout.label_tokens else None
    return rm.model_copy(update={"head": layout.head, "step_tag": layout.step_tag, "label_tokens": tokens})


def init_layout(rm: RewardModelConfig, kind: str, path: str | Path) -> PrmLayout | None:
    """The layout of an RM of `kind` loaded from `path`: the one its checkpoint records, else the config's (a
    published PRM, `reward_model.init`); None for a kind without layouts (`RMKindEntry.layouts`)."""
    if not rm_entry(kind).layouts:
        return None
    local = Path(str(path)).expanduser()
    return (reward_model_layout(local) if local.is_dir() else None) or layout_of(rm)
