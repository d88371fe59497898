"""One pipeline run on disk: every path under `runs/<name>/`, the manifest, the lock, and atomic writes.

```
runs/<name>/manifest.json              finished phases (key `round-XXX/<phase>`), outputs, metrics, MLflow run ids;
                                       outputs relative to runs/<name>/, so that it resumes moved or from anywhere
runs/<name>/.lock                      the pid of the process running it (locked with flock: freed when it dies)
runs/<name>/pass_maj_rounds.png        Pass@K and Maj@K against K, one line per round
runs/<name>/round-XXX/policy/          the round's policy checkpoint
runs/<name>/round-XXX/samples.parquet  the round's labelled shard (the replay buffer is all shards)
runs/<name>/round-XXX/collect.json     collection figures
runs/<name>/round-XXX/reward_model/<kind>/
runs/<name>/round-XXX/reward_model/<kind>/calibration.json   the RM on its held-out slice (the hacking monitor's base)
runs/<name>/round-XXX/eval.json        greedy, Pass@K, Maj@K, best-of-N, the hacking monitor
runs/<name>/round-XXX/pass_maj.png
runs/<name>/round-XXX/.launch-<phase>/ a phase under `accelerate launch`: request, result, log, torchrun/
runs/<name>/round-XXX/.trainer-<out>/  a trainer's output_dir and checkpoints while it trains (kept across a stop)
runs/<name>/round-XXX/.collect-parts/  a collection's finished batches while it runs (kept across a stop)
```

Every write goes through `atomic_path` (`models/atomic.py`, below everything: checkpoints are saved by `models/`
too): a temp file (or directory) beside the target, renamed over it, so a reader, or a run resumed after a SIGKILL,
sees the old file or the new one, never half of one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from models.atomic import atomic_path

SHARD_NAME = "samples.parquet"
CALIBRATION_NAME = "calibration.json"  # inside an RM checkpoint: it travels with it (frozen reuse, MLflow registry)
TRAINER_STATE = "trainer_state.json"  # transformers writes it last into a checkpoint: there, the checkpoint is whole
_CHECKPOINT = re.compile(r"checkpoint-(\d+)")
_ROUND_DIR = re.compile(r"round-(\d{3,})")
_OLD_PHASE_KEY = re.compile(r"(\d{3,})/(\w+)")  # before one key format: "001/policy" in `phases`


class RunDirError(RuntimeError):
    """The run directory cannot be used as asked (locked, changed config, corrupted manifest)."""


# ----------------------------------------------------------------------------------------- atomic writes


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def write_json_atomic(path: str | os.PathLike, data: Any) -> Path:
    return write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    return json.loads(Path(path).read_text())


# ------------------------------------------------------------------------------------------------- paths


def round_dir(run_dir: str | os.PathLike, round: int) -> Path:
    """`run_dir/round-XXX`, XXX the round with 3 digits (more past 999): where a round's outputs live."""
    if isinstance(round, bool) or not isinstance(round, int) or round < 0:
        raise ValueError(f"round must be an integer >= 0, got {round!r}")
    return Path(run_dir) / f"round-{round:03d}"


def calibration_path(checkpoint: str | os.PathLike) -> Path:
    """Where an RM checkpoint keeps its calibration (`pipeline.reward_model.write_calibration`)."""
    return Path(checkpoint) / CALIBRATION_NAME


def round_of(path: str | os.PathLike) -> int | None:
    """The round of a `round-XXX` directory name, or None for any other name."""
    m = _ROUND_DIR.fullmatch(Path(path).name)
    return int(m.group(1)) if m else None


def scratch_dir(out_dir: str | os.PathLike) -> Path:
    """The output_dir of a Trainer whose model goes to `out_dir`: hidden beside it, and stable rather than a random
    temp name, so that a resumed phase logs the same params to MLflow and finds its checkpoints there
    (`pipeline.resume.train_resumable`, which removes it once the model is trained)."""
    return Path(out_dir).parent / f".trainer-{Path(out_dir).name}"


def online_reward_model_dir(policy_dir: str | os.PathLike, kind: str) -> Path:
    """Where a GRPO phase whose policy goes to `policy_dir` saves the RM of `kind` it updated online (PRIME's implicit
    PRM): beside the policy, named for it (`round-001/policy-online-implicit`)."""
    return Path(policy_dir).parent / f"{Path(policy_dir).name}-online-{kind}"


def last_checkpoint(scratch: str | Path) -> Path | None:
    """The newest whole `checkpoint-N` in `scratch`; half-written ones (a kill while saving) are deleted."""
    found = []
    for path in Path(scratch).glob("checkpoint-*"):
        if m := _CHECKPOINT.fullmatch(path.name):
            if (path / TRAINER_STATE).is_file():
                found.append((int(m.group(1)), path))
            else:
                shutil.rmtree(path, ignore_errors=True)
    return max(found)[1] if found else None


def keep_resumable(folder: str | Path) -> None:
    """For a phase that stopped or failed: every scratch folder (`.trainer-*`, `.collect-*`) under `folder` that
    holds nothing to resume is removed, and every half-written checkpoint; the rest stays for the next attempt."""
    for path in Path(folder).rglob(".trainer-*"):
        if path.is_dir() and last_checkpoint(path) is None:
            shutil.rmtree(path, ignore_errors=True)
    for path in Path(folder).rglob(".collect-*"):
        if path.is_dir() and not any(path.glob("part-*.json")):
            shutil.rmtree(path, ignore_errors=True)


@dataclass(frozen=True)
class RunDir:
    """Every path of one run directory, spelled once."""

    root: Path

    def __post_init__(self):
        object.__setattr__(self, "root", Path(self.root))

    manifest = property(lambda self: self.root / "manifest.json")
    lock = property(lambda self: self.root / ".lock")
    rounds_plot = property(lambda self: self.root / "pass_maj_rounds.png")

    def round(self, r: int) -> Path:
        return round_dir(self.root, r)

    def policy(self, r: int) -> Path:
        return self.round(r) / "policy"

    def shard(self, r: int) -> Path:
        return self.round(r) / SHARD_NAME

    def collect_json(self, r: int) -> Path:
        return self.round(r) / "collect.json"

    def reward_model(self, r: int, kind: str) -> Path:
        return self.round(r) / "reward_model" / kind

    def eval_json(self, r: int) -> Path:
        return self.round(r) / "eval.json"

    def eval_plot(self, r: int) -> Path:
        return self.round(r) / "pass_maj.png"

    def collect_parts(self, r: int) -> Path:
        """A collection's finished parts while it runs (`pipeline.collect`), kept across a stop."""
        return self.round(r) / ".collect-parts"

    def launch(self, r: int, phase: str) -> Path:
        return self.round(r) / f".launch-{phase}"

    def rounds(self) -> list[int]:
        """Rounds that have a directory, ascending."""
        if not self.root.is_dir():
            return []
        return sorted(r for p in self.root.iterdir() if p.is_dir() and (r := round_of(p)) is not None)


# ---------------------------------------------------------------------------------------------- manifest


DTYPES = "dtype"  # the manifest's record of the dtypes the run runs in (`pipeline.dtypes.run_dtypes`)
RELATIVE = "outputs_relative_to_run_dir"  # the manifest's mark that its outputs' paths are kept by `kept_path`


def kept_path(path: str | os.PathLike, run_dir: str | os.PathLike) -> str:
    """A phase output's path as the manifest keeps it: relative to the run directory when inside it (so that the
    directory resumes moved elsewhere, or from another working directory), else absolute.

    Manifests written before kept the path as the run gave it, absolute or relative to the working directory of
    that day: one inside a round folder of a directory named as this one is read from the round folder on.

    >>> kept_path("runs/a/round-001/policy", "runs/a"), kept_path("/old/place/a/round-001/policy", "/new/a")
    ('round-001/policy', 'round-001/policy')
    """
    p = Path(path)
    with contextlib.suppress(ValueError):
        return Path(os.path.abspath(p)).relative_to(os.path.abspath(run_dir)).as_posix()
    parts = p.parts
    for i in range(len(parts) - 1, 0, -1):
        if parts[i - 1] == Path(run_dir).name and _ROUND_DIR.fullmatch(parts[i]):
            return Path(*parts[i:]).as_posix()
    return os.path.abspath(p)


def _with_paths(output: dict, change) -> dict:
    """A phase's recorded output with `change` applied to its path(s)."""
    out = dict(output)
    if out.get("path"):
        out["path"] = change(out["path"])
    if out.get("paths"):
        out["paths"] = {kind: change(p) for kind, p in out["paths"].items()}
    return out


def phase_key(round_index: int, *parts: str) -> str:
    """The one key format of the manifest, for outputs and MLflow runs alike: `round-001[/policy[/prm]]`."""
    return "/".join((round_dir("", round_index).name, *parts))


class Manifest:
    """What is done in a run directory, where its outputs are, and the MLflow run ids."""

    def __init__(self, run_dir: str | os.PathLike, data: dict):
        self.run_dir, self.data = Path(run_dir), {**data, RELATIVE: True}

    @property
    def path(self) -> Path:
        return RunDir(self.run_dir).manifest

    @classmethod
    def load(cls, run_dir: str | os.PathLike) -> Manifest:
        """Read the manifest (FileNotFoundError if there is none); a corrupted one is a RunDirError."""
        path = RunDir(run_dir).manifest
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
        # Run directories written before the one key format recorded phases as "001/policy".
        data["phases"] = {
            (phase_key(int(m.group(1)), m.group(2)) if (m := _OLD_PHASE_KEY.fullmatch(k)) else k): v
            for k, v in data["phases"].items()
        }
        if not data.get(RELATIVE):  # written before outputs were kept relative to the run directory
            data["phases"] = {k: _with_paths(v, lambda p: kept_path(p, run_dir)) if isinstance(v, dict) else v
                              for k, v in data["phases"].items()}
        return cls(run_dir, data)

    def save(self) -> None:
        write_json_atomic(self.path, self.data)

    @property
    def dtypes(self) -> dict[str, str]:
        """The dtypes the run runs in ({'policy': 'bfloat16', 'reward_model': ...}); {} in a manifest from before
        they were recorded, when every model ran in float32."""
        return dict(self.data.get(DTYPES) or {})

    def set_dtypes(self, dtypes: dict[str, str]) -> None:
        self.data[DTYPES] = dict(dtypes)

    def done(self, round_index: int, phase: str) -> bool:
        return phase_key(round_index, phase) in self.data["phases"]

    def output(self, round_index: int, phase: str) -> dict:
        """A finished phase's record, its paths under this run directory as it is now."""
        return _with_paths(self.data["phases"][phase_key(round_index, phase)], lambda p: str(self.run_dir / p))

    def outputs(self) -> list[tuple[str, Path]]:
        """(phase key, path) of every recorded output, under this run directory as it is now."""
        return [(key, self.run_dir / p) for key, out in self.data["phases"].items()
                for p in ([out["path"]] if out.get("path") else []) + list((out.get("paths") or {}).values())]

    def record(self, round_index: int, phase: str, output: dict) -> None:
        self.data["phases"][phase_key(round_index, phase)] = _with_paths(output, lambda p: kept_path(p, self.run_dir))
        self.save()

    def slot(self, key: str) -> str:
        """`<this manifest's id>/<key>`: the tag that finds this run directory's MLflow run `key` again
        (`tracking.find_or_create_run`). The id is new with each manifest, so a run directory deleted and
        started over never adopts the runs of the one before."""
        return f"{self.data.setdefault('id', uuid.uuid4().hex)}/{key}"

    def mlflow_run(self, key: str) -> str | None:
        return self.data["mlflow"].get(key)

    def set_mlflow_run(self, key: str, run_id: str) -> None:
        self.data["mlflow"][key] = run_id
        self.save()


# ---------------------------------------------------------------------------------------------- stopping

# Set by flows.signals when a stop signal comes. The signal's exception unwinds the run, but library code on the
# way can swallow it (seen: a SIGTERM in collection, and the run went on to finish): phases check this too.
STOP = threading.Event()


class StepClock:
    """When the trainer in flight next reaches a step it can stop and save at (`pipeline.resume.StopAtStepBoundary`).

    flows.signals' watchdog counts a stop's grace from there: a real model's step on a CPU (~20 s for SmolLM2's
    GRPO) outlasts the grace, and exiting at once lost the phase's steps since its last periodic checkpoint.
    Times are `time.monotonic()`.
    """

    def __init__(self):
        self.began: float | None = None  # when the stretch to the next save point began; None: no trainer running
        self.longest = 0.0  # the longest such stretch of this training so far
        self.ended = 0.0  # when the last training stopped, or reached the save point it stops at

    def start(self) -> None:
        self.began, self.longest = time.monotonic(), 0.0

    def boundary(self) -> None:
        """A save point reached: the next stretch begins, unless the trainer stops here."""
        now = time.monotonic()
        if self.began is not None:
            self.longest = max(self.longest, now - self.began)
        if STOP.is_set():
            self.began, self.ended = None, now
        else:
            self.began = now

    def stop(self) -> None:
        self.began, self.ended = None, time.monotonic()

    def next_boundary(self) -> float | None:
        """The expected time of the next save point: its stretch's start plus 1.5 times the longest stretch (None:
        no trainer running, or none of its stretches measured yet)."""
        began = self.began
        return began + 1.5 * self.longest if began is not None and self.longest else None


STEP_CLOCK = StepClock()


def stop_if_told() -> None:
    """KeyboardInterrupt once a stop signal has come (`STOP`): between phases, and before a phase is recorded."""
    if STOP.is_set():
        raise KeyboardInterrupt("a stop signal came and its exception was swallowed on the way")


# -------------------------------------------------------------------------------------------------- lock
# `flock` on `.lock`: the kernel drops it when its holder dies (SIGKILL included), so a lock is never guessed stale
# from a pid, which a new process may have reused. The pid inside names the holder in a second run's refusal.

_held: dict[Path, int] = {}  # the locks this process holds: path -> its open file


def _try_flock(fd: int, how: int, tries: int = 1) -> bool:
    for _ in range(tries):
        try:
            fcntl.flock(fd, how | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            time.sleep(0.01)
    return False


def _refuse(run_dir: str | os.PathLike, fd: int) -> NoReturn:
    """Raise the refusal for `run_dir`, whose lock another process holds (`fd`: the lock file, opened)."""
    for _ in range(100):  # its holder writes the pid just after taking the lock
        pid = os.pread(fd, 32, 0).strip()
        if pid.isdigit():
            break
        time.sleep(0.01)
    holder = f" (pid {int(pid)})" if pid.isdigit() else ""
    raise RunDirError(f"{run_dir} is in use by another run{holder}; wait for it or stop it")


def refuse_if_locked(run_dir: str | os.PathLike) -> None:
    """Refuse `run_dir` if another process holds its lock (a check before starting; `run_lock` takes it)."""
    lock = RunDir(run_dir).lock.resolve()
    if lock in _held:
        return
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:  # no lock (or no folder to hold one: the preflight names what is wrong with it)
        return
    try:
        if not _try_flock(fd, fcntl.LOCK_SH):  # shared: two runs checking at once never refuse each other
            _refuse(run_dir, fd)
    finally:
        os.close(fd)  # drops the check's own shared lock


def release_lock(run_dir: str | os.PathLike) -> None:
    """Remove `run_dir`'s lock if this process holds it (at a hard exit: the kernel frees it, the file would stay)."""
    _release(RunDir(run_dir).lock.resolve())


def _release(lock: Path) -> None:
    fd = _held.pop(lock, None)  # None: released already (a hard exit's `release_lock`, then the `finally`)
    if fd is not None:
        lock.unlink(missing_ok=True)  # still locked: a run that opened this file finds it gone, and opens anew
        os.close(fd)


@contextlib.contextmanager
def run_lock(run_dir: str | os.PathLike):
    """Hold `run_dir/.lock` (our pid inside) for the duration; refuse another holder. A dead holder's file is
    taken as it is: nothing holds it."""
    RunDir(run_dir).root.mkdir(parents=True, exist_ok=True)
    lock = RunDir(run_dir).lock.resolve()  # one name for it, whatever the working directory at release
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        if not _try_flock(fd, fcntl.LOCK_EX, tries=20):  # a second run's check holds it (shared) for an instant
            try:
                _refuse(run_dir, fd)
            finally:
                os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            if os.path.samestat(os.fstat(fd), os.stat(lock)):
                break
        os.close(fd)  # its holder removed the file between our open and our lock: the lock is the new file's
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    _held[lock] = fd
    try:
        yield
    finally:
        _release(lock)
