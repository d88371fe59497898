"""Problem sets by kind: prompts, gold answers, a verifier and gold step labels where known.

`PROBLEM_SETS` is the registry: each problem-set module gives one `ProblemSetKind` (its config section
``problems.<kind>`` and a builder from it). The config's ``problems.kind`` choices and sections come from
it, and `load_problem_set` / `problem_set_from_config` both build through `build_problem_set`. A new
problem set is its module plus one `PROBLEM_SETS.register(KIND, ...)` call (docs/extending.md).
"""

from __future__ import annotations

import os
from typing import Any

from pipeline.problems import arithmetic, dataset, gsm8k
from pipeline.problems.arithmetic import EmbeddedArithmetic
from pipeline.problems.base import Problem, ProblemSet, ProblemSetConfig, ProblemSetKind
from pipeline.problems.dataset import DatasetProblems
from pipeline.problems.gsm8k import GSM8K
from pipeline.registry import Registry

# `on_register`: the config adds a registered set's `problems.<kind>` section (`pipeline.config`).
PROBLEM_SETS: Registry[ProblemSetKind] = Registry(
    "problem set kind", ProblemSetKind, {p.kind: p for p in (arithmetic.PROBLEM_SET, gsm8k.PROBLEM_SET,
                                                              dataset.PROBLEM_SET)}, name_field="kind")
KNOWN_KINDS = tuple(PROBLEM_SETS)  # the built-in ones

__all__ = [
    "GSM8K", "KNOWN_KINDS", "DatasetProblems", "PROBLEM_SETS", "EmbeddedArithmetic", "Problem", "ProblemSet", "ProblemSetConfig",
    "ProblemSetKind", "build_problem_set", "load_problem_set", "problem_set_from_config",
    "step_separator",
]


def problem_set_kind(kind: str) -> ProblemSetKind:
    """The registry entry of `kind` (an unknown one: the registry's error, listing the known ones)."""
    return PROBLEM_SETS[kind]


def build_problem_set(kind: str, section: ProblemSetConfig, seed: int) -> ProblemSet:
    """The problem set of `kind` from its config section (``problems.<kind>``) and the run seed."""
    entry = problem_set_kind(kind)
    section.check_selected()
    return entry.build(section, seed)


def load_problem_set(kind: str, seed: int = 0, **fields: Any) -> ProblemSet:
    """Build a problem set by kind from the fields of its config section, as in YAML.

    Args:
        kind: a key of `PROBLEM_SETS`: ``"arithmetic"`` (fields of ``problems.arithmetic``) or ``"gsm8k"``
            (``train_path`` and ``test_path`` for local jsonl files, or ``hub_name``; ``num_train`` / ``num_test``)
            or ``"dataset"`` (the fields of ``problems.dataset``: files or a hub id, columns, answer format).
        seed: the run seed (it draws the embedded set).
        **fields: the section's fields; paths may be `os.PathLike`.

    Raises:
        ValueError: an unknown kind (listing the known ones), a bad field, or a section that cannot build
            its set (e.g. gsm8k with train_path but no test_path).
    """
    entry = problem_set_kind(kind)
    fields = {k: os.fspath(v) if isinstance(v, os.PathLike) else v for k, v in fields.items()}
    return build_problem_set(kind, entry.config(**fields), seed)


def step_separator(cfg) -> str:
    """The step separator of the config's problem set, known without building the set (the reward-model phase
    needs it, not the data): its section's `step_separator` field, else its class's."""
    kind = cfg.problems.kind
    field = getattr(getattr(cfg.problems, kind), "step_separator", None)
    return field if field is not None else problem_set_kind(kind).problem_set.step_separator


def problem_set_from_config(cfg) -> ProblemSet:
    """The problem set a `PipelineConfig` asks for (the run seed also seeds the embedded set)."""
    return build_problem_set(cfg.problems.kind, getattr(cfg.problems, cfg.problems.kind), cfg.run.seed)
