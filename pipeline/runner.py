"""One pipeline run on disk: the manifest, the lock, and each phase run once with its MLflow run.

The manifest (`runs/<name>/manifest.json`, written atomically) records every finished phase and its
outputs, and the MLflow run ids. A phase recorded done is never redone, so a killed run resumes at the
first unfinished phase. A lock file holding the owner's pid refuses a second run on the same directory;
a lock whose pid is dead is taken over.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from pipeline import tracking
from pipeline.config import PipelineConfig, config_diff
from pipeline.fsutil import read_json, write_json_atomic

PHASES = ("policy", "collect", "reward_model", "eval")


class RunDirError(RuntimeError):
    """The run directory cannot be used as asked (locked, changed config, corrupted manifest)."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def lock_holder(run_dir: Path) -> int | None:
    """The pid of a live process holding `run_dir`'s lock, or None (no lock, or a stale one)."""
    try:
        pid = int((run_dir / ".lock").read_text().strip() or 0)
    except (OSError, ValueError):
        return None
    return pid if pid and pid != os.getpid() and _pid_alive(pid) else None


def refuse_if_locked(run_dir: Path) -> None:
    pid = lock_holder(run_dir)
    if pid:
        raise RunDirError(f"{run_dir} is in use by another run (pid {pid}); wait for it or stop it")


@contextlib.contextmanager
def run_lock(run_dir: Path):
    """Hold `run_dir/.lock` (our pid inside) for the duration; refuse a live holder, take over a dead one."""
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = run_dir / ".lock"
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            break
        except FileExistsError:
            refuse_if_locked(run_dir)
            lock.unlink(missing_ok=True)  # stale: its process is gone
    else:
        raise RunDirError(f"could not take the lock {lock}")
    with os.fdopen(fd, "w") as f:
        f.write(str(os.getpid()))
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)


class Manifest:
    """What is done in a run directory, where its outputs are, and the MLflow run ids."""

    def __init__(self, run_dir: Path, data: dict):
        self.run_dir, self.data = run_dir, data

    @property
    def path(self) -> Path:
        return self.run_dir / "manifest.json"

    @classmethod
    def load(cls, run_dir: str | Path) -> Manifest:
        run_dir = Path(run_dir)
        path = run_dir / "manifest.json"
        try:
            data = read_json(path)
            if not isinstance(data, dict):
                raise ValueError(f"expected a JSON object, got {type(data).__name__}")
            missing = [k for k in ("config", "phases", "mlflow") if not isinstance(data.get(k), dict)]
            if missing:
                raise ValueError(f"missing or malformed {', '.join(repr(k) for k in missing)}")
        except FileNotFoundError:
            raise
        except (ValueError, json.JSONDecodeError) as e:
            raise RunDirError(
                f"{path} is corrupted ({e}). Move the run directory aside to start over, or restore the file"
            ) from None
        return cls(run_dir, data)

    def save(self) -> None:
        write_json_atomic(self.path, self.data)

    def key(self, round_index: int, phase: str) -> str:
        return f"{round_index:03d}/{phase}"

    def done(self, round_index: int, phase: str) -> bool:
        return self.key(round_index, phase) in self.data["phases"]

    def output(self, round_index: int, phase: str) -> dict:
        return self.data["phases"][self.key(round_index, phase)]

    def record(self, round_index: int, phase: str, output: dict) -> None:
        self.data["phases"][self.key(round_index, phase)] = output
        self.save()

    def mlflow_run(self, key: str) -> str | None:
        return self.data["mlflow"].get(key)

    def set_mlflow_run(self, key: str, run_id: str) -> None:
        self.data["mlflow"][key] = run_id
        self.save()


def preflight(cfg: PipelineConfig) -> None:
    """What can be checked before any work: the problem set loads, the policy spec resolves, the prompt
    format suits its tokenizer, MLflow answers.

    Raises the loader's own clear error (naming the file, row, path or URI); writes nothing in the run dir.
    """
    from models.factories import resolve_spec
    from pipeline.problems import problem_set_from_config
    from pipeline.prompts import check_prompt_format

    problem_set = problem_set_from_config(cfg)
    if cfg.policy.model != "tiny":
        resolve_spec(cfg.policy.model)
    check_prompt_format(cfg, problem_set.train[0])
    tracking.connect(cfg.tracking.tracking_uri, cfg.tracking.experiment)


def open_run(cfg: PipelineConfig, force: bool = False) -> Manifest:
    """Create the run directory's manifest, or check a resumed one against `cfg`; attach the parent MLflow run."""
    run_dir = cfg.run_dir
    current = cfg.model_dump(mode="json")
    try:
        manifest = Manifest.load(run_dir)
    except FileNotFoundError:
        manifest = Manifest(run_dir, {"config": current, "phases": {}, "mlflow": {}})
    diff = config_diff(manifest.data["config"], current)
    if diff and not force:
        raise RunDirError(
            f"{run_dir} was started with another config; differing keys:\n  " + "\n  ".join(diff)
            + "\nUse another run.name, or --force to continue with the new config"
        )
    manifest.data["config"] = current
    experiment = tracking.connect(cfg.tracking.tracking_uri, cfg.tracking.experiment)
    manifest.data["experiment_id"] = experiment
    parent = manifest.mlflow_run("parent")
    if parent is None or not tracking.run_exists(parent):
        parent = tracking.create_run(experiment, cfg.run.name, tags={"igrpo.run_dir": str(run_dir.resolve())})
        tracking.log_params(parent, _flat(current))
        manifest.data["mlflow"]["parent"] = parent
    manifest.save()
    return manifest


def _flat(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _ensure_run(manifest: Manifest, key: str, name: str, parent: str, tags: dict) -> str:
    """The MLflow run recorded under `key`, created (and recorded) once, reused on resume."""
    run_id = manifest.mlflow_run(key)
    if run_id is None or not tracking.run_exists(run_id):
        run_id = tracking.create_run(manifest.data["experiment_id"], name, parent, tags)
        manifest.set_mlflow_run(key, run_id)
    return run_id


def phase_run(manifest: Manifest, round_index: int, phase: str) -> str:
    """The MLflow run of a phase (grandchild of the pipeline run), created once and reused on resume."""
    round_key = f"round-{round_index:03d}"
    tags = {"round": str(round_index)}
    round_id = _ensure_run(manifest, round_key, round_key, manifest.data["mlflow"]["parent"], tags)
    return _ensure_run(manifest, f"{round_key}/{phase}", f"{round_key}-{phase}", round_id, {**tags, "phase": phase})


def sub_run(manifest: Manifest, round_index: int, phase: str, name: str) -> str:
    """A run under a phase's run (one per trainer, e.g. the PRM and the ORM of the reward-model phase)."""
    parent = phase_run(manifest, round_index, phase)
    round_key = f"round-{round_index:03d}"
    return _ensure_run(manifest, f"{round_key}/{phase}/{name}", f"{round_key}-{phase}-{name}", parent,
                       {"round": str(round_index), "phase": phase})
