"""The collection's choices as two tables the config validates them against: `STRATEGIES`, which step prefixes get MC
rollouts (`collect.strategy`), and `TASK_RUNNERS`, the Prefect task runner that the sampling workers run under
(`collect.task_runner`). The collection phase (`pipeline/collect.py`), the sampling fan-out (`pipeline/fanout.py`)
and the preflight's check of extras read the same entries; a plugin adds one with `STRATEGIES.register(NAME, ...)`
or `TASK_RUNNERS.register(NAME, ...)`.

Torch-free and Prefect-free: the entries' functions import the labelling (`pipeline.mc_labels`) and the task
runners when first called.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipeline.registry import Registry, plugin_env


@dataclass(frozen=True, kw_only=True)
class Strategy:
    """Which step prefixes get rollouts (`STRATEGIES.register(NAME, description=..., label=...)`).

    Attributes:
        description: which prefixes, for the docs.
        label: (problem set, completer, label requests, N rollouts) -> each request's `Labels` (`pipeline.mc_labels`:
            HE, SE, rollouts spent, the steps imputed rather than probed).
    """

    description: str
    label: Callable[[Any, Any, Any, int], Any]


@dataclass(frozen=True, kw_only=True)
class TaskRunner:
    """Where the sampling workers run (`TASK_RUNNERS.register(NAME, description=..., runner=..., ...)`).

    Attributes:
        description: where, for the docs.
        runner: (the `collect:` section) -> the Prefect task runner, a context manager, for `workers` workers.
        submit: (runner, task, its parameters, the `collect:` section) -> the shard's future; None: `runner.submit`.
        extra: (pip extra, module) it needs installed when `workers` > 1, checked by the preflight; None: nothing more.
    """

    description: str
    runner: Callable[[Any], Any]
    submit: Callable[[Any, Any, dict[str, Any], Any], Any] | None = None
    extra: tuple[str, str] | None = None


def _exhaustive(problem_set, completer, reqs, n):
    from pipeline.mc_labels import label_exhaustive

    return label_exhaustive(problem_set, completer, reqs, n)


def _first_error(problem_set, completer, reqs, n):
    from pipeline.mc_labels import label_first_error

    return label_first_error(problem_set, completer, reqs, n)


@dataclass(frozen=True, kw_only=True)
class Prover:
    """Whose completions from each step prefix label the steps (`PROVERS.register(NAME, description=..., path=...)`),
    the choices of `collect.prover`.

    Attributes:
        description: which policy, for the docs.
        path: (the run directory, a `pipeline.rundir.RunDir`; the round's policy checkpoint) -> the checkpoint that
            writes the MC rollouts (the round's policy's path itself: sampled by the same model).
    """

    description: str
    path: Callable[[Any, Any], Any]


PROVERS: Registry[Prover] = Registry("prover", Prover, {
    "policy": Prover(description="the round's policy (Math-Shepherd)", path=lambda run, policy: policy),
    "round0": Prover(description="round 0's policy, fixed across rounds (PAV's prover)",
                     path=lambda run, policy: run.policy(0)),
})


STRATEGIES: Registry[Strategy] = Registry("collection strategy", Strategy, {
    "exhaustive": Strategy(description="every prefix (Math-Shepherd)", label=_exhaustive),
    "first_error": Strategy(description="the prefixes a binary search for the first error probes (OmegaPRM's idea); "
                                        "the others' labels imputed", label=_first_error),
})


def ray_init_kwargs(ray_init: dict[str, Any]) -> dict[str, Any]:
    """`ray.init`'s arguments: `ray_init`, and this process's plugin path in the job's environment (`plugin_env`),
    so each worker's `load_plugins` finds what this process's does."""
    runtime_env = dict(ray_init.get("runtime_env") or {})
    runtime_env["env_vars"] = {**plugin_env(), **runtime_env.get("env_vars", {})}
    return {**ray_init, "runtime_env": runtime_env}


def _threads(c):
    from prefect.task_runners import ThreadPoolTaskRunner

    return ThreadPoolTaskRunner(max_workers=c.workers)


def _ray(c):
    from prefect_ray import RayTaskRunner  # the [ray] extra; the preflight refuses task_runner ray without it

    return RayTaskRunner(address=c.ray_address, init_kwargs=ray_init_kwargs(c.ray_init))


def _ray_submit(runner, shard_task, params: dict[str, Any], c):
    from prefect_ray.context import remote_options

    # SPREAD: the shards over the nodes; Ray's default packs tasks onto a node until half its CPUs are busy.
    options = {"scheduling_strategy": "SPREAD", **({"num_gpus": c.gpus_per_worker} if c.gpus_per_worker else {})}
    with remote_options(**options):
        return runner.submit(shard_task, params)


TASK_RUNNERS: Registry[TaskRunner] = Registry("task runner", TaskRunner, {
    "thread": TaskRunner(description="threads in this process", runner=_threads),
    "ray": TaskRunner(description="Ray tasks, on the cluster at `ray_address` (the [ray] extra)", runner=_ray,
                      submit=_ray_submit, extra=("ray", "prefect_ray")),
})
