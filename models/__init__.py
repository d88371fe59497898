"""Model factories: the tiny char-level tokenizer and Llama-style policy/ORM/PRM, and loaders for real models."""

from models.factories import (
    apply_lora,
    load_policy,
    load_reward_model,
    reward_model_from_policy,
    save_model,
    tiny_policy,
)
from models.tokenizer import char_tokenizer

__all__ = [
    "apply_lora",
    "char_tokenizer",
    "load_policy",
    "load_reward_model",
    "reward_model_from_policy",
    "save_model",
    "tiny_policy",
]
