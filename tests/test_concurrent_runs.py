"""Several runs at once on one MLflow store: starting them together on a new sqlite store (one creates and migrates
it, the others wait for it). The runs themselves, at once on the stack's servers, are tests/test_stack.py's."""

from __future__ import annotations

import multiprocessing

from pipeline import tracking


def _connect(uri: str, start, results) -> None:
    start.wait()  # all at once, as `igrpo run`s started together reach their tracking setup
    try:
        results.put(("ok", tracking.connect(uri, "together")))
    except Exception as e:  # the failure is the figure: reported, not raised in a child
        results.put(("error", str(e)))


def test_runs_started_at_once_on_a_new_sqlite_store_all_open_it(tmp_path):
    # Before the lock, 1-3 of 4 failed in MLflow's schema migration racing itself ("Online migration expected to
    # match one row", "index ... already exists"). Forked children: the tracking setup alone, no training.
    n, uri = 4, f"sqlite:///{tmp_path / 'new' / 'mlflow.db'}"
    (tmp_path / "new").mkdir()
    ctx = multiprocessing.get_context("fork")
    start, results = ctx.Barrier(n), ctx.Queue()
    children = [ctx.Process(target=_connect, args=(uri, start, results)) for _ in range(n)]
    for child in children:
        child.start()
    got = [results.get(timeout=120) for _ in children]
    for child in children:
        child.join(timeout=30)
    assert [what for what, _ in got] == ["ok"] * n, got
    assert len({experiment for _, experiment in got}) == 1  # one experiment, not one each
    left = {p.name for p in (tmp_path / "new").iterdir()}  # the store and its WAL files; no lock file beside it
    assert left <= {"mlflow.db", "mlflow.db-wal", "mlflow.db-shm"} and "mlflow.db" in left, left
