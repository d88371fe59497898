"""Several runs at once on one MLflow store: starting them together on a new sqlite store (one creates and migrates
it, the others wait for it). The runs themselves, at once on the stack's servers, are tests/test_stack.py's."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import child_env

# What each `igrpo run` does first with its store, in a fresh interpreter (as a run starts), all at one moment.
CONNECT = """
import os, sys, time
from pathlib import Path
from pipeline import tracking
ready = Path(sys.argv[2])
(ready / str(os.getpid())).touch()
while len(os.listdir(ready)) < 4:
    time.sleep(0.01)
print(tracking.connect(sys.argv[1], "together"))
"""


@pytest.mark.slow
def test_runs_started_at_once_on_a_new_sqlite_store_all_open_it(tmp_path):
    # Before the lock, 3 of 4 failed in MLflow's schema migration racing itself ("Online migration expected to
    # match one row", "table alembic_version already exists", "duplicate column name: step").
    uri = f"sqlite:///{tmp_path / 'new' / 'mlflow.db'}"
    (tmp_path / "new").mkdir()
    (tmp_path / "ready").mkdir()  # each child's file once imported: they connect when all 4 are there
    children = [subprocess.Popen([sys.executable, "-c", CONNECT, uri, str(tmp_path / "ready")], env=child_env(), cwd=tmp_path,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(4)]
    outs = [child.communicate(timeout=120)[0] for child in children]
    assert [child.returncode for child in children] == [0] * 4, outs
    assert len({out.splitlines()[-1] for out in outs}) == 1  # one experiment, not one each
    left = {p.name for p in (tmp_path / "new").iterdir()}  # the store and its WAL files; no lock file beside it
    assert left <= {"mlflow.db", "mlflow.db-wal", "mlflow.db-shm"} and "mlflow.db" in left, left
