"""The precision the models run in: `policy.dtype` and `reward_model.dtype` (`auto`, `float32` or `bfloat16`).

`auto` is bfloat16 where the hardware does bf16 arithmetic natively (a CUDA GPU with bf16; a CPU with AMX or
AVX512-BF16), float32 elsewhere: on an AVX2-only CPU bf16 is emulated and slower than float32. One resolved dtype a
run: inference (sampling in collection, evaluation and MC rollouts; RM scoring; a frozen reference) loads the weights
in it; training keeps float32 master weights and runs its forward under autocast (the trainers' own `bf16=True`).
The run records it (`Manifest.dtypes`, the MLflow param `igrpo.dtype`), and a resume that would run in another dtype
is refused (`dtype_change`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

DtypeSetting = Literal["auto", "float32", "bfloat16"]
DTYPES = ("float32", "bfloat16")  # what a setting resolves to; torch's names (torch is imported where it computes)
# /proc/cpuinfo flags of a CPU that computes in bf16 natively: Intel AMX (Sapphire Rapids on) and AVX512-BF16 (Cooper
# Lake, Zen 4). Either makes oneDNN's bf16 matmuls faster than its float32 ones; without them torch emulates bf16.
BF16_CPU_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})
MLFLOW_PARAMS = {"policy": "igrpo.dtype", "reward_model": "igrpo.reward_model.dtype"}  # on the pipeline's run


def resolve_dtype(setting: str, cpu_flags: Iterable[str], cuda_bf16: bool | None) -> str:
    """The dtype a setting runs in on a machine: `setting` itself unless it is `auto`.

    Args:
        setting: `auto`, `float32` or `bfloat16`.
        cpu_flags: the CPU's feature flags (/proc/cpuinfo `flags`).
        cuda_bf16: None without a CUDA GPU (the CPU computes); else whether the GPU supports bf16 (the GPU computes,
            whatever the CPU).

    >>> resolve_dtype("auto", {"avx2", "avx512f", "amx_bf16"}, None)   # Sapphire Rapids: AMX
    'bfloat16'
    >>> resolve_dtype("auto", {"avx2", "avx512f", "avx512_bf16"}, None)  # Cooper Lake, Zen 4
    'bfloat16'
    >>> resolve_dtype("auto", {"avx2", "fma"}, None)  # bf16 would be emulated
    'float32'
    >>> resolve_dtype("auto", {"avx2"}, True), resolve_dtype("auto", {"amx_bf16"}, False)  # an A100; a V100
    ('bfloat16', 'float32')
    >>> resolve_dtype("float32", {"amx_bf16"}, True), resolve_dtype("bfloat16", {"avx2"}, None)  # as asked
    ('float32', 'bfloat16')
    """
    if setting in DTYPES:
        return setting
    if setting != "auto":
        raise ValueError(f"unknown dtype {setting!r}: expected auto, {', '.join(DTYPES)}")
    native = bool(cuda_bf16) if cuda_bf16 is not None else bool(BF16_CPU_FLAGS & set(cpu_flags))
    return "bfloat16" if native else "float32"


def read_cpu_flags(text: str) -> frozenset[str]:
    """The feature flags of /proc/cpuinfo's text (its first `flags` line; x86 Linux), empty where it has none.

    >>> sorted(read_cpu_flags("processor\\t: 0\\nflags\\t\\t: fpu avx2 amx_bf16\\n"))
    ['amx_bf16', 'avx2', 'fpu']
    """
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


@functools.cache
def cpu_flags() -> frozenset[str]:
    """This machine's CPU flags (none where /proc/cpuinfo does not read: macOS, Windows; `auto` is then float32 on
    the CPU)."""
    try:
        with open("/proc/cpuinfo") as f:
            return read_cpu_flags(f.read())
    except OSError:
        return frozenset()


def machine_dtype(setting: str) -> str:
    """`resolve_dtype` on this machine: its GPU where CUDA has one, else its CPU."""
    import torch

    cuda_bf16 = torch.cuda.is_bf16_supported() if torch.cuda.is_available() else None
    return resolve_dtype(setting, cpu_flags(), cuda_bf16)


def torch_dtype(setting: str) -> torch.dtype:
    """The torch dtype to load inference weights in (`machine_dtype` of the setting)."""
    import torch

    return getattr(torch, machine_dtype(setting))


def trainer_precision(setting: str) -> dict[str, bool]:
    """A trainer's arguments for the setting: bf16 autocast over float32 master weights (`bf16=True`, which
    transformers runs on the CPU too), or plain float32 (`bf16=False`, also on a GPU, where TRL defaults to bf16)."""
    return {"bf16": machine_dtype(setting) == "bfloat16"}


def lora_base_dtype(setting: str, lora: bool) -> torch.dtype:
    """The dtype to load a model's weights in for training: bfloat16 where the setting resolves to it and a LoRA
    adapter trains (the frozen base needs no float32 master copy, and autocast would cast each of its weights to bf16
    for every matmul anyway: loading them in bf16 drops that cast; a SmolLM2 LoRA step on an AVX512-BF16 EPYC, 2 cores:
    float32 3.90 s, autocast over float32 weights 1.80 s, over a bf16 base 1.70 s, bench/training_dtype.py); float32 otherwise (every weight trains: the optimizer keeps float32 masters). The
    adapter itself is float32 either way (peft's `autocast_adapter_dtype`), and `models.save_model` merges it into
    float32 weights."""
    import torch

    return torch.bfloat16 if lora and machine_dtype(setting) == "bfloat16" else torch.float32


def run_dtypes(cfg) -> dict[str, str]:
    """The dtypes a run config resolves to on this machine: {'policy': ..., 'reward_model': ...}."""
    return {"policy": machine_dtype(cfg.policy.dtype), "reward_model": machine_dtype(cfg.reward_model.dtype)}


def dtype_change(run_dir: str, recorded: Mapping[str, str], current: Mapping[str, str],
                 settings: Mapping[str, str]) -> str | None:
    """The one sentence refusing to resume `run_dir` in other dtypes than it ran in, or None where they agree.

    Args:
        recorded: what the run ran in ({'policy': 'bfloat16', ...}; a manifest from before dtypes: float32 both).
        current: what the config resolves to now, on this machine (`run_dtypes`).
        settings: the config's settings ({'policy': 'auto', ...}), named in the sentence.

    >>> dtype_change("runs/a", {"policy": "bfloat16", "reward_model": "bfloat16"},
    ...              {"policy": "float32", "reward_model": "bfloat16"}, {"policy": "auto", "reward_model": "auto"})
    "runs/a ran in bfloat16 and policy.dtype 'auto' is float32 on this machine: set policy.dtype: bfloat16 to resume it as it ran, or use another run.name"
    >>> dtype_change("runs/a", {}, {"policy": "float32", "reward_model": "float32"}, {}) is None
    True
    """
    for part, now in current.items():
        then = recorded.get(part, "float32")
        if then != now:
            setting = settings.get(part, now)
            where = " on this machine" if setting == "auto" else ""
            return (f"{run_dir} ran in {then} and {part}.dtype {setting!r} is {now}{where}: set {part}.dtype: {then} "
                    "to resume it as it ran, or use another run.name")
    return None
