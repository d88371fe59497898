"""Problem sets: prompts, gold answers, a verifier, a step splitter and gold step labels where known."""

from __future__ import annotations

from typing import Any

from pipeline.problems.arithmetic import EmbeddedArithmetic
from pipeline.problems.base import Problem, ProblemSet
from pipeline.problems.gsm8k import GSM8K

KNOWN_KINDS = ("arithmetic", "gsm8k")

__all__ = [
    "GSM8K", "KNOWN_KINDS", "EmbeddedArithmetic", "Problem", "ProblemSet", "load_problem_set", "problem_set_from_config",
]


def load_problem_set(kind: str, **kwargs: Any) -> ProblemSet:
    """Build a problem set by kind.

    Args:
        kind: ``"arithmetic"`` (kwargs go to `EmbeddedArithmetic`) or ``"gsm8k"``: with ``train_path`` and
            ``test_path`` it reads local jsonl files (`GSM8K.from_jsonl`), otherwise it loads from the hub
            (`GSM8K.from_hub`, kwargs ``name``, ``config``); ``num_train`` / ``num_test`` apply to both.
        **kwargs: Passed on as described.

    Raises:
        ValueError: for an unknown kind (listing the known ones) or only one of train_path/test_path.
    """
    if kind == "arithmetic":
        return EmbeddedArithmetic(**kwargs)
    if kind == "gsm8k":
        has_train, has_test = kwargs.get("train_path") is not None, kwargs.get("test_path") is not None
        if has_train != has_test:
            raise ValueError("gsm8k needs both train_path and test_path (or neither, to load from the hub)")
        if has_train:
            return GSM8K.from_jsonl(**kwargs)
        kwargs.pop("train_path", None)
        kwargs.pop("test_path", None)
        return GSM8K.from_hub(**kwargs)
    raise ValueError(f"unknown problem set kind {kind!r}; known: {', '.join(KNOWN_KINDS)}")


def problem_set_from_config(cfg) -> ProblemSet:
    """The problem set a `PipelineConfig` asks for (the run seed also seeds the embedded set)."""
    p = cfg.problems
    if p.kind == "arithmetic":
        a = p.arithmetic
        return EmbeddedArithmetic(
            seed=cfg.run.seed, num_train=a.num_train, num_test=a.num_test, min_steps=a.min_steps,
            max_steps=a.max_steps, start_range=tuple(a.start_range), operand_range=tuple(a.operand_range),
            operators=tuple(a.operators), max_value=a.max_value, sft_noise=a.sft_noise,
        )
    g = p.gsm8k
    if g.train_path:  # local files override the hub (a recipe names the hub, `--set` points at a copy)
        return load_problem_set(
            "gsm8k", train_path=g.train_path, test_path=g.test_path, num_train=g.num_train, num_test=g.num_test
        )
    return load_problem_set("gsm8k", name=g.hub_name, num_train=g.num_train, num_test=g.num_test)
