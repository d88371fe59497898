"""Where the launchable phases (GRPO, the RM phase) train, as one table, `LAUNCHERS`: the choices of `launcher.kind`.

An entry says whether the phase trains in this process or is started elsewhere, which `launcher.*` fields it never
reads (set, they are an error naming it), what it needs installed (the preflight's check), and its line in `igrpo
check`. Torch-free and free of the config (which validates `launcher.kind` against it); the processes are started by
`pipeline/launch.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipeline.registry import Registry


@dataclass(frozen=True, kw_only=True)
class Launcher:
    """One launcher (`LAUNCHERS.register(NAME, description=..., summary=..., ...)`).

    Attributes:
        description: where the phase trains, for the docs.
        summary: (the `launcher:` section) -> the preflight's line saying where it will train.
        in_process: the phase trains in this process (nothing is launched).
        ignores: `launcher.*` fields it does not read: one set is an error saying so.
        extra: (pip extra, module) it needs installed, checked by the preflight; None: nothing more.
        start: what starts the phase's processes and waits for them (`pipeline.launch.Start`), given as
            `registry.resolve` takes it (a function importing it: the table stays free of the launch code); None
            for `in_process`.
    """

    description: str
    summary: Callable[[Any], str]
    in_process: bool = False
    ignores: tuple[str, ...] = ()
    extra: tuple[str, str] | None = None
    start: Any = None


def _accelerate():
    from pipeline.launch import accelerate_phase

    return accelerate_phase


def _ray():
    from pipeline.launch import ray_phase

    return ray_phase


def _ray_summary(launcher: Any) -> str:
    workers = launcher.num_processes or "a worker per GPU, else per live node"
    where = launcher.ray_address or "RAY_ADDRESS, or a local Ray"
    return f"a Ray Train job on the cluster at {where}, workers: {workers}"


LAUNCHERS: Registry[Launcher] = Registry("launcher", Launcher, {
    "local": Launcher(description="the GRPO and RM phases train in this process", in_process=True,
                      summary=lambda launcher: "local (this process)", ignores=("ray_address",)),
    "accelerate": Launcher(description="under `accelerate launch`", ignores=("ray_address",), start=_accelerate,
                           summary=lambda launcher: "accelerate launch "
                                                    f"({launcher.config_file or 'accelerate default config'})"),
    "ray": Launcher(description="as a Ray Train TorchTrainer job on the cluster at `ray_address`, `num_processes` "
                                "workers (the [ray] extra)",
                    summary=_ray_summary, ignores=("config_file", "extra_args"), extra=("ray", "ray.train"),
                    start=_ray),
})
