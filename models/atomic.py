"""Atomic writes: a temp file (or directory) beside the target, renamed over it, so that a reader, or a run resumed
after a SIGKILL, sees the old file or the new one, never half of one. What it leaves has the modes a plain create
gives (the process's umask), so a team's shared disk reads a run as its umask says.

The ground floor's own: `models.factories.save_model` writes checkpoints with it, and `pipeline.rundir` every other
file of a run directory.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path


def _fresh(path: Path, make: Callable[[Path], object], suffix: str = "") -> Path:
    """A new hidden name beside `path`, made by `make(name)`, which raises FileExistsError if it is taken.

    Not `tempfile.mkstemp` / `mkdtemp`: their modes (0600, 0700) survive the rename, and a run's files would be
    owner-only whatever the umask; here the kernel applies the process's umask, as to any file it creates."""
    for _ in range(100):
        name = path.with_name(f".{path.name}.{secrets.token_hex(4)}{suffix}")
        try:
            make(name)
            return name
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temp name beside {path}")


def _modes_as_created(tmp: Path, mode: int) -> None:
    """Give everything under `tmp` the mode a plain create gives: `mode` (tmp's own as made, 0666 or 0777 less the
    umask) for folders, its read and write bits for files. A writer may leave its files owner-only: safetensors >= 0.8
    renames a 0600 temp file into place (safetensors#782)."""
    for p in [tmp, *tmp.rglob("*")] if tmp.is_dir() else [tmp]:
        want = mode if p.is_dir() else mode & 0o666
        if not p.is_symlink() and p.stat().st_mode & 0o777 != want:
            p.chmod(want)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, directory: bool = False):
    """Yield a temp path beside `path` to write into; on success it is renamed over `path`.

    A directory target (a checkpoint) is swapped with two renames, so the old one stays whole until the new
    one is in place. On an error the temp path is removed and `path` is untouched. Files are fsynced first.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if directory:
        for stale in path.parent.glob(f".{path.name}.*"):  # left by a process killed while writing
            shutil.rmtree(stale, ignore_errors=True)
        tmp = _fresh(path, os.mkdir)  # 0777 less the umask
    else:
        create = lambda name: os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))  # 0666 less it
        tmp = _fresh(path, create, ".tmp")
    mode = tmp.stat().st_mode & 0o777
    try:
        yield tmp
        _modes_as_created(tmp, mode)
        if directory:
            if path.exists():
                old = path.with_name(f".{path.name}.old")
                os.replace(path, old)
                os.replace(tmp, path)
                shutil.rmtree(old)
            else:
                os.replace(tmp, path)
        else:
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())  # the bytes are on disk before the name points at them
            os.replace(tmp, path)
    except BaseException:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        raise
