"""Model factories from plain arguments: the tiny char-level tokenizer and Llama-style policy, a head on a policy's
backbone, and loaders for saved and real models. The ground floor: nothing here imports `pipeline` (the reward-model
kinds build and load through `pipeline.rm_kinds.loading`)."""

from models.factories import (
    apply_lora,
    load_checkpoint,
    load_policy,
    model_from_policy,
    save_model,
    tiny_policy,
)
from models.tokenizer import char_tokenizer

__all__ = [
    "apply_lora",
    "char_tokenizer",
    "load_checkpoint",
    "load_policy",
    "model_from_policy",
    "save_model",
    "tiny_policy",
]
