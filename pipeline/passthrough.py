"""The TRL pass-through: `grpo:` becomes TRL's GRPOConfig, `bootstrap.sft_args` its SFTConfig and
`reward_model.train_args` the RMs' TrainingArguments, unchanged but for the defaults derived here (seed, device,
checkpoints for resuming inside a phase). `check_passthrough` builds each once at load, so a field they reject fails before any work;
before that, each value is checked against the type the dataclass declares for it, and after, the values they
accept but fail on later (a batch of 0, a temperature of 0).
"""

from __future__ import annotations

import re
import tempfile
from typing import Any

from pipeline.config import ConfigError, PipelineConfig
from pipeline.modes import supervision_mode
from pipeline.rm_kinds.sections import ORM_LOSSES


def grpo_config(cfg: PipelineConfig, output_dir: str, **overrides: Any):
    """Build TRL's GRPOConfig from the YAML pass-through (our derived values fill only what is unset)."""
    from trl import GRPOConfig

    from pipeline.dtypes import lora_base_dtype

    base = lora_base_dtype(cfg.policy.dtype, cfg.policy.lora is not None)  # TRL loads the policy in it
    args = {"report_to": "none", "seed": cfg.run.seed, **RESUMABLE, **device_defaults(cfg.policy.dtype),
            "model_init_kwargs": {"dtype": str(base).removeprefix("torch.")},
            **checkpointing_defaults(GRPOConfig, {**memory_defaults(cfg), **cfg.grpo})}
    args.update(cfg.grpo)
    args.update(overrides)
    return GRPOConfig(output_dir=output_dir, **args)


def sft_config(cfg: PipelineConfig, output_dir: str, **overrides: Any):
    """Build TRL's SFTConfig for the bootstrap from ``bootstrap.sft_args``."""
    from trl import SFTConfig

    args = {"report_to": "none", "seed": cfg.run.seed, "save_strategy": "no", **device_defaults(cfg.policy.dtype),
            **checkpointing_defaults(SFTConfig, {**memory_defaults(cfg), **cfg.bootstrap.sft_args})}
    args.update(cfg.bootstrap.sft_args)
    args.update(overrides)
    return SFTConfig(output_dir=output_dir, **args)


# Trainers that resume inside a phase (GRPO, the RMs: `pipeline.resume`) save a checkpoint every SAVE_STEPS
# optimizer steps into their scratch folder, only the newest kept. 25: no measurable cost on a quickstart GRPO
# phase (bench/policy_phase.py --checkpoint-cost: 0.96); a stop saves one at the next step anyway. Each is
# overridable (`grpo.save_steps`, `reward_model.train_args.save_steps`; `save_strategy: "no"` turns them off).
SAVE_STEPS = 25
RESUMABLE = {"save_strategy": "steps", "save_steps": SAVE_STEPS, "save_total_limit": 1}


def rm_resumable(train_args: dict[str, Any]) -> dict[str, Any]:
    """The RMs' checkpoints: once an epoch, or every `save_steps` where `reward_model.train_args` gives it. An RM's
    steps are short: every 25 of them cost the quickstart's RM phase 8% of its time, once an epoch nothing
    measurable (`igrpo train-rm` timed with and without, docs/benchmarks.md)."""
    return {**RESUMABLE, "save_strategy": "steps" if "save_steps" in train_args else "epoch"}


def memory_defaults(cfg: PipelineConfig) -> dict[str, Any]:
    """The tiny policy built here fits in memory many times over: no activation checkpointing, which TRL's
    configs turn on by default and which recomputes every layer's forward pass during the backward pass (a
    quarter of the quickstart's SFT time, a tenth of its GRPO time, for no memory it needs). The gradients are
    the same. A value the user gives wins."""
    return {"gradient_checkpointing": False} if cfg.policy.model == "tiny" else {}


_RENAMED = (("gradient_checkpointing", "activation_checkpointing"),
            ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs"))


def checkpointing_defaults(config_class: type, given: dict[str, Any]) -> dict[str, Any]:
    """TRL's configs default `gradient_checkpointing` to True, a name transformers 5 deprecates (a FutureWarning
    each time one is built): the same setting under its new name, so nothing changes but the warning.

    A value the user gives under either name wins (it is copied to the new name, which transformers reads).
    Returns only names `config_class` has, so an older transformers without them gets nothing.
    """
    import dataclasses

    defaults = {f.name: f.default for f in dataclasses.fields(config_class)}
    out = {}
    for old, new in _RENAMED:
        if new in defaults and new not in given:
            value = given.get(old, defaults.get(old))
            if value is not None:
                out[new] = value
    return out


def device_defaults(dtype: str = "float32") -> dict[str, Any]:
    """Trainer arguments that follow the machine and the model's dtype setting (`policy.dtype`,
    `reward_model.dtype`): the CPU where there is no GPU, and bf16 autocast exactly where the setting resolves to
    bfloat16 (`pipeline.dtypes.trainer_precision`; TRL's own default, bf16 everywhere, is refused by a CPU without
    it and would make float32 mean bf16 on a GPU)."""
    import torch

    from pipeline.dtypes import trainer_precision

    return {**({} if torch.cuda.is_available() else {"use_cpu": True}), **trainer_precision(dtype)}


def rm_training_config(cfg: PipelineConfig, output_dir: str):
    """The RMs' trainer arguments from `reward_model.train_args`, for the check at load (`_rm_class`)."""
    rm = cfg.reward_model
    config_class = _rm_class(cfg)
    extra = {"max_length": None} if config_class is not _training_arguments() else {}
    return config_class(output_dir=output_dir, **{"report_to": "none", **rm_resumable(rm.train_args), **extra,
                                                  **device_defaults(rm.dtype),
                                                  **checkpointing_defaults(config_class, rm.train_args), **rm.train_args})


def check_passthrough(cfg: PipelineConfig) -> None:
    """Build GRPOConfig, SFTConfig and the RMs' TrainingArguments once so a field they reject fails now, not
    after round 0's work; then the values they accept but fail on later (a batch of 0, a temperature of 0)."""
    n = cfg.grpo.get("num_generations")
    if isinstance(n, int) and not isinstance(n, bool) and n < 2:
        # Checked before TRL, whose own message for this does not name the field.
        raise ConfigError(f"grpo.num_generations: must be at least 2, got {n} (GRPO compares the completions of a group)")
    with tempfile.TemporaryDirectory() as tmp:
        for section, given, build in (
            ("grpo", cfg.grpo, lambda: grpo_config(cfg, tmp)),
            ("bootstrap.sft_args", cfg.bootstrap.sft_args, lambda: sft_config(cfg, tmp)),
            ("reward_model.train_args", cfg.reward_model.train_args, lambda: rm_training_config(cfg, tmp)),
        ):
            check_types(section, _CLASSES[section](cfg), given)
            built = _build(section, build)
            _check_ranges(section, given)
            mode = cfg.supervision.mode
            if section == "grpo" and supervision_mode(mode).step_rewards and built.num_generations < 2:
                raise ConfigError(f"grpo.num_generations: must be at least 2 in {mode} mode (steps are normalised per group)")
            if section == "grpo" and supervision_mode(mode).check_group:  # the mode's fields against G (TRL's default)
                try:
                    supervision_mode(mode).check_group(cfg.supervision, built.num_generations)
                except ValueError as e:
                    raise ConfigError(str(e)) from None


def _build(section: str, build):
    try:
        return build()
    except TypeError as e:
        m = re.search(r"unexpected keyword argument '(\w+)'", str(e))
        key = f".{m.group(1)}" if m else ""
        raise ConfigError(f"{section}{key}: not a field of {_OWNER[section]} ({e})") from None
    except ValueError as e:
        raise ConfigError(f"{section}: {_OWNER[section]} rejects it: {e}") from None


_OWNER = {"grpo": "TRL's GRPOConfig", "bootstrap.sft_args": "TRL's SFTConfig",
          "reward_model.train_args": "the RMs' TrainingArguments"}


def _grpo_class(cfg: PipelineConfig) -> type:
    from trl import GRPOConfig

    return GRPOConfig


def _sft_class(cfg: PipelineConfig) -> type:
    from trl import SFTConfig

    return SFTConfig


def _training_arguments() -> type:
    from transformers import TrainingArguments

    return TrainingArguments


def _rm_class(cfg: PipelineConfig) -> type:
    """transformers' TrainingArguments, which every RM but a pairwise ORM trains with, or, where that is the only
    RM, TRL's RewardConfig (a subclass, with fields of its own)."""
    from trl import RewardConfig

    rm = cfg.reward_model
    return RewardConfig if rm.kinds == ["orm"] and ORM_LOSSES[rm.orm.loss].pairwise else _training_arguments()


# The dataclass each pass-through section becomes.
_CLASSES = {"grpo": _grpo_class, "bootstrap.sft_args": _sft_class, "reward_model.train_args": _rm_class}

def _at_least(low: float) -> tuple:
    return (lambda v: v >= low, f"at least {low}")


def _above(low: float, why: str = "") -> tuple:
    return (lambda v: v > low, f"above {low}{why}")


def _within(low: float, high: float, closed: str = "[]") -> tuple:
    def valid(v):
        return (low <= v if closed[0] == "[" else low < v) and (v <= high if closed[1] == "]" else v < high)

    return (valid, f"in {closed[0]}{low}, {high}{closed[1]}")


# The range of every numeric field of GRPOConfig, SFTConfig, RewardConfig and TrainingArguments that has one:
# values they accept at build time but fail on, or train nothing with, later (`save_steps: -1` stopped at the
# first save). Their dataclasses declare no ranges (their fields' metadata is help text only), so the table
# holds them; tests/test_config.py checks each key is a field of one of them.
_RANGES = {
    # the optimizer and the schedule
    "learning_rate": _at_least(0), "weight_decay": _at_least(0), "adam_epsilon": _at_least(0),
    "adam_beta1": _within(0, 1, "[)"), "adam_beta2": _within(0, 1, "[)"), "max_grad_norm": _at_least(0),
    "warmup_steps": _at_least(0), "label_smoothing_factor": _within(0, 1, "[)"), "neftune_noise_alpha": _above(0),
    "num_train_epochs": _above(0),
    "max_steps": (lambda v: v == -1 or v >= 1, "-1 (train num_train_epochs) or at least 1"),
    # batches, steps between saves, logs and evaluations (below 1: a fraction of the training steps)
    "per_device_train_batch_size": _at_least(1), "per_device_eval_batch_size": _at_least(1),
    "gradient_accumulation_steps": _at_least(1), "eval_accumulation_steps": _at_least(1),
    "save_steps": _above(0), "logging_steps": _above(0), "eval_steps": _above(0), "eval_delay": _at_least(0),
    "torch_empty_cache_steps": _at_least(1),
    "seed": _within(0, 2**32, "[)"), "data_seed": _within(0, 2**32, "[)"),
    "dataloader_num_workers": _at_least(0), "dataloader_prefetch_factor": _at_least(1),
    "dataset_num_proc": _at_least(1), "max_length": _at_least(1),
    # GRPO: generation, the loss
    "num_generations_eval": _at_least(1), "generation_batch_size": _at_least(1), "steps_per_generation": _at_least(1),
    "max_completion_length": _at_least(1),
    "temperature": _above(0, " (GRPO samples: at 0 a group's completions would all be alike)"),
    "top_p": _within(0, 1, "(]"), "top_k": _at_least(0), "min_p": _within(0, 1), "repetition_penalty": _above(0),
    "beta": _at_least(0), "num_iterations": _at_least(1), "epsilon": _at_least(0), "epsilon_high": _at_least(0),
    "delta": _above(0), "top_entropy_quantile": _within(0, 1), "num_completions_to_print": _at_least(0),
    "vllm_gpu_memory_utilization": _within(0, 1, "(]"), "vllm_tensor_parallel_size": _at_least(1),
}


def _check_ranges(section: str, given: dict[str, Any]) -> None:
    """The values a user gave (not the configs' defaults): finite numbers, and in range where `_RANGES` knows."""
    import math

    for key, value in given.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if not math.isfinite(value):
            raise ConfigError(f"{section}.{key}: must be a finite number, got {value}")
        valid, what = _RANGES.get(key, (None, ""))
        if valid is not None and not valid(value):
            raise ConfigError(f"{section}.{key}: must be {what}, got {value}")


# Values TRL documents and converts beyond the type it declares: key -> the other types it takes.
_ALSO_TAKES: dict[str, tuple[type, ...]] = {"scale_rewards": (bool,)}  # True/False: "group"/"none"


def check_types(section: str, config_class: type, given: dict[str, Any]) -> None:
    """Each value a user gave against the type `config_class` (a TRL or transformers dataclass) declares for its
    field: the dataclasses check none themselves, so `num_generations: banana` failed inside TRL's arithmetic
    (naming neither the field nor the fix) and `max_steps: 1.5` trained on. A type that cannot be judged from
    here (an enum, a class) is left to the dataclass; an unknown key to the build, which names it."""
    import typing

    hints = typing.get_type_hints(config_class)
    for key, value in given.items():
        if key not in hints:
            continue
        verdict = _matches(value, hints[key])
        if verdict is False and not isinstance(value, _ALSO_TAKES.get(key, ())):
            raise ConfigError(f"{section}.{key}: expected {_describe(hints[key])}, got {value!r} "
                              f"({_OWNER[section]} declares {key}: {_type_name(hints[key])})")


def _matches(value: Any, tp: Any) -> bool | None:
    """Whether `value` is of type `tp`: True, False, or None where that cannot be told here.

    >>> _matches(3, int | None), _matches(1.5, int), _matches(2, float), _matches(True, int), _matches("x", list[str])
    (True, False, True, False, False)
    """
    import enum
    import types
    import typing

    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is typing.Any:
        return True
    if origin in (typing.Union, types.UnionType):
        verdicts = [_matches(value, a) for a in args]
        return True if True in verdicts else None if None in verdicts else False
    if origin is typing.Literal:
        return value in args
    simple = {type(None): lambda v: v is None, bool: lambda v: isinstance(v, bool),
              int: lambda v: isinstance(v, int) and not isinstance(v, bool),
              float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
              str: lambda v: isinstance(v, str)}
    if tp in simple:
        return simple[tp](value)
    if tp in (list, tuple) or origin in (list, tuple):
        return isinstance(value, (list, tuple))
    if tp is dict or origin is dict:
        return isinstance(value, dict)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return None  # the dataclass converts a name to its member and says which names it knows
    return None


def _describe(tp: Any) -> str:
    """What a type asks for, in words: `int | None` -> 'an integer or null'."""
    import types
    import typing

    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(dict.fromkeys(_describe(a) for a in args))
    if origin is typing.Literal:
        return "one of " + ", ".join(map(repr, args))
    words = {type(None): "null", bool: "true or false", int: "an integer", float: "a number", str: "a string",
             list: "a list", tuple: "a list", dict: "a mapping"}
    return words.get(origin or tp, getattr(tp, "__name__", str(tp)))


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) if isinstance(tp, type) else str(tp).replace("typing.", "")
