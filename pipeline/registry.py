"""One small registry type for every extension point, and the plugin loader that fills them in every process.

Each extension point is a `Registry`: supervision modes (`pipeline.modes.MODES`), reward functions
(`pipeline.rewards.REWARD_FUNCS`), RM kinds and PRM head layouts (`pipeline.rm_kinds.RM_KINDS`, `PRM_HEADS`), problem
sets (`pipeline.problems.PROBLEM_SETS`), phases (`pipeline.phases.PHASES`), and the config's other choices: process
rewards and oracles (`pipeline.step_rewards.PROCESS_REWARDS`, `ORACLES`), process credits, baselines and centrings
(`pipeline.credit.CREDITS`, `BASELINES`, `CENTRINGS`), PRM aggregations and targets and ORM losses
(`pipeline.rm_kinds.AGGREGATIONS`, `PRM_TARGETS`, `ORM_LOSSES`), collection strategies, task runners and provers
(`pipeline.collect_choices.STRATEGIES`, `TASK_RUNNERS`, `PROVERS`), sampling backends
(`pipeline.sampling_backends.BACKENDS`), answer formats (`pipeline.problems.dataset.ANSWER_FORMATS`) and launchers
(`pipeline.launchers.LAUNCHERS`). A registry is the dict of its entries, in order; `register(NAME, field=value, ...)`
adds one, keyword-only, and `table[NAME]` of an unknown name is one error shape everywhere:
``unknown <what> 'x'; known: a, b, c``.

A package extends the project by declaring an entry point in the group `iterative_grpo.plugins` (pytest's `pytest11`,
MLflow's `mlflow.*` groups): `load_plugins` imports it once per process, so its registrations reach every process
the project starts (the flow, `igrpo`, each `accelerate launch` rank, Ray workers, Prefect workers), each of which
calls it where it starts. Torch-free: the config's validation reads these tables.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import Annotated, Any, Generic, TypeVar

from pydantic import AfterValidator

T = TypeVar("T")

PLUGIN_GROUP = "iterative_grpo.plugins"


class UnknownName(ValueError, KeyError):
    """A name no registry entry has. A ValueError for the config's validators, a KeyError for dict's contract."""

    __str__ = ValueError.__str__  # KeyError's would quote the whole message


_TABLES: list[Registry] = []  # every Registry made, in order: `tables()`


def tables() -> list[Registry]:
    """Every extension point's table made so far (those of the modules imported): what a test restores after it
    registers, and what the tests of the one error shape go through."""
    return list(_TABLES)


class Registry(dict[str, T], Generic[T]):
    """The entries of one extension point by name, in registration order (a dict: read it as one).

    Args:
        what: what an entry is, for messages (`"reward model kind"`).
        entry: the entry's type, which `register` builds from its keywords.
        entries: the built-in entries.
        name_field: the entry's field that holds its own name (a `Phase`'s `name`), filled by `register`.
    """

    def __init__(self, what: str, entry: Callable[..., T], entries: Mapping[str, T] | None = None,
                 name_field: str | None = None):
        super().__init__(entries or {})
        self.what, self.entry, self.name_field = what, entry, name_field
        self.on_register: list[Callable[[], None]] = []  # called after each registration (the config's rebuild)
        _TABLES.append(self)

    def __missing__(self, name: str) -> T:
        raise UnknownName(f"unknown {self.what} {name!r}; known: {', '.join(self)}")

    def register(self, name: str, /, *, after: str | None = None, **fields: Any) -> T:
        """Add entry `name`, built from `fields` (the entry type's keywords), last or right after entry `after`.

        A name already taken is refused: a plugin cannot silently replace a built-in entry or another plugin's.
        """
        if name in self:
            raise ValueError(f"{self.what} {name!r} is already registered; register yours under another name")
        names = list(self)
        if after is not None:
            self[after]  # an unknown one: the error above
        names.insert(names.index(after) + 1 if after is not None else len(names), name)
        table = {**self, name: self.entry(**fields, **({self.name_field: name} if self.name_field else {}))}
        self.clear()
        self.update((n, table[n]) for n in names)
        for hook in self.on_register:
            hook()
        return self[name]


def name_in(table: Registry) -> Any:
    """A config field's type: a name of `table`'s, looked up as the config loads (an unknown one: the registry's
    error, under the field's dotted path), so an entry a plugin registered is a valid value too."""

    def known(name: str) -> str:
        table[name]  # an unknown one: the registry's error, listing the known ones
        return name

    return Annotated[str, AfterValidator(known)]


def resolve(ref: Any) -> Any:
    """An object given as itself, as a function of no arguments that imports and returns it, or as where it is,
    "module:attribute" (imported now: tables stay torch-free). The project's own entries give a function (a real
    import, which the import graph sees); a string is for a plugin's module, outside the project's graph."""
    if isinstance(ref, str):
        module, _, attr = ref.partition(":")
        return getattr(importlib.import_module(module), attr)
    return ref() if callable(ref) else ref


class PluginError(RuntimeError):
    """A plugin's entry point failed to load; the message names it and its distribution."""


_loaded: set[tuple[str, str]] = set()  # (distribution, entry point) of each plugin loaded in this process
_scanned: tuple[str, ...] | None = None  # sys.path at the last scan: the installed distributions only change with it


def load_plugins() -> None:
    """Load every entry point of the group `iterative_grpo.plugins` that this process has not loaded yet.

    An entry point names a module whose import makes its registrations, or a function of no arguments, called
    once, that makes them. Called where each process starts and where a config is validated: after the first call,
    a call costs a comparison of `sys.path` unless it changed.

    Raises:
        PluginError: a plugin failed to import or to register, naming the entry point and its distribution.
    """
    global _scanned
    if _scanned == tuple(sys.path):
        return
    for ep in entry_points(group=PLUGIN_GROUP):
        dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist else "an unknown distribution"
        key = (ep.dist.name if ep.dist else "", ep.name)
        if key in _loaded:
            continue
        try:
            plugin = ep.load()
            if callable(plugin):
                plugin()
        except Exception as e:  # the plugin's own code: anything can come out of it
            raise PluginError(f"plugin {ep.name!r} ({ep.value}) of {dist}, entry point group {PLUGIN_GROUP!r}, "
                              f"failed to load: {type(e).__name__}: {e}") from e
        _loaded.add(key)
    _scanned = tuple(sys.path)


def plugin_env() -> dict[str, str]:
    """The environment variables a process started elsewhere (a Ray worker, on this node or another) needs to see
    this process's plugins: its PYTHONPATH, where a plugin installed beside the project's checkout is found.
    `accelerate launch`'s processes inherit it; Ray's workers inherit their node's, so Ray is given it."""
    path = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": path} if path else {}
