"""Atomic writes: a temp file (or directory) beside the target, renamed over it, so that a reader, or a run resumed
after a SIGKILL, sees the old file or the new one, never half of one.

The ground floor's own: `models.factories.save_model` writes checkpoints with it, and `pipeline.rundir` every other
file of a run directory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path


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
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    else:
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        tmp = Path(name)
    try:
        yield tmp
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
