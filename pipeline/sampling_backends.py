"""The generation engines as one table, `BACKENDS`: the choices of `collect.backend` and `eval.backend`.

An entry loads the sampling model and its tokenizer (`pipeline.generation.load_sampling_model` reads it) and names
the extra it needs installed (the preflight's check). A plugin adds one with `BACKENDS.register(NAME, ...)`.
Torch-free: the entries import their engine when first called.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.registry import Registry


@dataclass(frozen=True, kw_only=True)
class Backend:
    """One generation engine (`BACKENDS.register(NAME, description=..., load=..., extra=...)`).

    Attributes:
        description: the engine, for the docs.
        load: (checkpoint path, `vllm_args`, resolved dtype name) -> (model, tokenizer) for `generation.sample`.
        extra: (pip extra, module) it needs installed, checked by the preflight; None: nothing more.
    """

    description: str
    load: Callable[[str, Mapping[str, Any], str], tuple[Any, Any]]
    extra: tuple[str, str] | None = None


def _hf(path: str, vllm_args: Mapping[str, Any], dtype: str):
    import torch

    from models import load_policy
    from pipeline.dtypes import torch_dtype

    model, tokenizer = load_policy(str(path), torch_dtype(dtype))
    return (model.to("cuda") if torch.cuda.is_available() else model), tokenizer  # Ray: the worker's own GPU


def _vllm(path: str, vllm_args: Mapping[str, Any], dtype: str):
    from vllm import LLM  # the [vllm] extra; the preflight refuses backend vllm without it

    llm = LLM(model=str(path), **{"dtype": dtype, **dict(vllm_args)})  # every request carries its own seed
    return llm, llm.get_tokenizer()


BACKENDS: Registry[Backend] = Registry("sampling backend", Backend, {
    "hf": Backend(description="HF generate", load=_hf),
    "vllm": Backend(description="vLLM (`pip install 'iterative-grpo[vllm]'` and a GPU; `vllm_args` go to vllm.LLM)",
                    load=_vllm, extra=("vllm", "vllm")),
})
