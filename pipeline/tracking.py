"""MLflow: a parent run per pipeline run, a child run per round, a grandchild per phase; RM registry.

Runs are created with explicit ids (kept in the run directory's manifest), so a resumed pipeline
reattaches to its runs instead of duplicating them. Trainers log through transformers' MLflow callback
into the phase run made active around them.

Metric names go through `metric_name`: '@' (which MLflow forbids) is spelled `_at_`, and the headline figures
(`eval/greedy`, `eval/pass@K`, `eval/maj@K`) are logged as `accuracy/greedy`, `accuracy/pass_at_K`, `accuracy/maj_at_K`,
so that MLflow's run page, whose chart sections are the name's part before the last '/' sorted alphabetically,
shows them first.
MLflow also reserves the alias `latest`; `models:/<name>/latest` already resolves to the newest version.
`connect` gives the experiment MLflow 3's model-training kind tag where nobody chose a kind (MLflow 3.17's UI
picks its view from its own GenAI / Model training switch instead: docs/tracking.md).
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import traceback
from pathlib import Path
from typing import Any

import mlflow
from mlflow import MlflowClient

PARENT_TAG = "mlflow.parentRunId"
SLOT_TAG = "igrpo.slot"  # which run directory's run, and which one in it (find_or_create_run)
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING = "custom_model_development"  # MLflow 3's kind for training runs (the other: genai_development)


class TrackingError(RuntimeError):
    """The tracking server cannot be used; the message names the URI."""


def _fail_fast(uri: str) -> None:
    if uri.startswith(("http://", "https://")):
        # Fail in seconds, not after MLflow's long default retries.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")


def connect(tracking_uri: str | None, experiment: str) -> str:
    """Point MLflow at `tracking_uri` and make sure it answers, before any work; returns the experiment id.

    The experiment is of MLflow 3's model-training kind (`EXPERIMENT_KIND_TAG`), unless it has a kind already.
    """
    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    uri = mlflow.get_tracking_uri()
    _fail_fast(uri)
    try:
        with _creating(uri):
            client = MlflowClient()  # opens the store: creates and migrates a sqlite file that does not exist yet
            exp = client.get_experiment_by_name(experiment)
            _write_ahead(uri)
            if exp is None:
                exp = _create_experiment(client, experiment)
        if not exp.tags.get(EXPERIMENT_KIND_TAG):  # one made before this tag, or by hand: a kind set is kept
            client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING)
        return exp.experiment_id
    except Exception as e:  # any failure here means no tracking: stop before training
        raise TrackingError(f"MLflow tracking URI {uri!r} cannot be used: {e}") from None


def _create_experiment(client: MlflowClient, name: str):
    """Experiment `name`, made now, or by a run that started beside this one on the same server and won the race."""
    from mlflow.exceptions import MlflowException

    try:
        client.create_experiment(name, tags={EXPERIMENT_KIND_TAG: MODEL_TRAINING})
    except MlflowException as e:
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    return client.get_experiment_by_name(name)


@contextlib.contextmanager
def _creating(uri: str):
    """For a sqlite store, an exclusive lock on its folder (the nearest that exists) while the store is opened:
    MLflow creates and migrates the file as it opens it, and several runs started at once on a new store raced
    on that migration (`Online migration expected to match one row`, `index ... already exists`). The first
    creates it; the others wait, then find it made. Other stores: no lock (their servers or databases order it)."""
    import fcntl

    if not uri.startswith("sqlite") or (path := _sqlite_file(uri)) is None:
        yield
        return
    folder = path.absolute().parent
    while not folder.exists():
        folder = folder.parent
    fd = os.open(folder, os.O_RDONLY)  # a folder's own lock: no lock file left beside the store
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing it releases the lock


# Filesystems whose files other hosts may open too: SQLite's WAL mode needs every process on one host.
NETWORK_FS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "ceph", "glusterfs", "beegfs", "9p",
              "fuse.sshfs", "fuse.s3fs", "fuse.gcsfuse", "fuse.juicefs")


def _write_ahead(uri: str) -> None:
    """A sqlite store on a local disk in WAL mode (kept in the file): in SQLite's default mode a read left open
    (MLflow's UI or `igrpo compare` reading the store, a cursor a signal's unwinding left alive) blocks every
    write, which waits MLflow's 20 s busy timeout and fails; in WAL mode readers never block the writer. A file
    on a network filesystem keeps the default mode (WAL does not work across hosts); other stores: nothing."""
    import sqlite3

    if not uri.startswith("sqlite") or (path := _sqlite_file(uri)) is None or filesystem_type(path) in NETWORK_FS:
        return
    with contextlib.closing(sqlite3.connect(path, timeout=20)) as db:
        db.execute("PRAGMA journal_mode=WAL")


def local_store(uri: str) -> Path | None:
    """The file or folder behind a local tracking URI (a sqlite database, a folder store), as the URI names it
    (relative or not); None for a server, another database or an in-memory store."""
    from urllib.parse import urlparse

    scheme = urlparse(uri).scheme
    if scheme.startswith("sqlite"):
        return _sqlite_file(uri)
    return Path(urlparse(uri).path if scheme else uri) if scheme in ("", "file") else None


def absolute_uri(uri: str) -> str:
    """`uri` with its local store named absolutely, as a process started elsewhere (a Ray worker) must read it.

    >>> absolute_uri("sqlite:////srv/mlflow.db"), absolute_uri("http://127.0.0.1:5000")
    ('sqlite:////srv/mlflow.db', 'http://127.0.0.1:5000')
    >>> absolute_uri("sqlite:///mlflow.db") == f"sqlite:///{Path.cwd() / 'mlflow.db'}"
    True
    """
    path = local_store(uri)
    if path is None or path.is_absolute():
        return uri
    return f"sqlite:///{path.resolve()}" if uri.startswith("sqlite:") else str(path.resolve())


def _sqlite_file(uri: str) -> Path | None:
    """The file of a sqlite URI; None for an in-memory store."""
    from sqlalchemy.engine import make_url

    database = make_url(uri).database
    return Path(database) if database and database != ":memory:" else None


def filesystem_type(path: Path) -> str | None:
    """The type of the filesystem `path` is on (Linux's /proc/self/mounts: its longest mount point above the
    path); None where that cannot be read."""
    try:
        mounts = [line.split()[1:3] for line in Path("/proc/self/mounts").read_text().splitlines()]
    except OSError:
        return None
    path = path.resolve()
    above = [(point, kind) for point, kind in mounts if path.is_relative_to(point.replace("\\040", " "))]
    return max(above, key=lambda m: len(m[0]))[1] if above else None


def probe(tracking_uri: str | None, experiment: str, must_exist: bool = False) -> str:
    """Check that `connect` would succeed, creating nothing: no store, no experiment, no run. Returns a one-line
    description of what `connect` will find (or create); raises TrackingError naming the URI, also for a local
    store that does not exist yet when `must_exist` (reading runs from it).

    MLflow creates a store as it opens one (a sqlite file and its tables, a database's tables), so stores are
    looked at from outside: a sqlite file read-only (or, absent, the folder it would go in), another database
    by connecting to it; a server is asked for the experiment by name, which reads only.
    """
    uri = tracking_uri or mlflow.get_tracking_uri()
    try:
        return _probe(uri, experiment, must_exist)
    except TrackingError:
        raise
    except Exception as e:  # any failure here means `igrpo run` would stop at the same point
        raise TrackingError(f"MLflow tracking URI {uri!r} cannot be used: {e}") from None


def _probe(uri: str, experiment: str, must_exist: bool) -> str:
    from urllib.parse import urlparse

    scheme = urlparse(uri).scheme
    if scheme in ("http", "https", "databricks"):
        _fail_fast(uri)
        exp = MlflowClient(tracking_uri=uri).get_experiment_by_name(experiment)
        return f"{uri} answers; experiment {experiment!r} " + ("exists" if exp else "will be created")
    if scheme.startswith("sqlite"):
        if (path := local_store(uri)) is None:
            return f"{uri}: an in-memory store (gone when the run ends)"
        return _probe_sqlite(uri, path, experiment, must_exist)
    if scheme in ("", "file"):
        path = local_store(uri)
        if path.exists() and not path.is_dir():
            raise TrackingError(f"MLflow tracking URI {uri!r}: {path} is a file, not a folder store")
        return f"{uri}: " + ("a folder store" if path.is_dir() else _creatable(uri, path, must_exist))
    import sqlalchemy  # another database MLflow supports (postgresql, mysql, mssql): reachable, nothing written

    with sqlalchemy.create_engine(uri).connect():
        pass
    return f"{uri} answers"


def _probe_sqlite(uri: str, path: Path, experiment: str, must_exist: bool) -> str:
    import sqlite3

    if not path.exists():
        return f"{uri}: {_creatable(uri, path, must_exist)}"
    try:
        with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as db:
            found = db.execute("SELECT 1 FROM experiments WHERE name = ?", (experiment,)).fetchone()
    except sqlite3.Error as e:
        raise TrackingError(f"MLflow tracking URI {uri!r}: {path} is not an MLflow database ({e})") from None
    return f"{uri}: experiment {experiment!r} " + ("exists" if found else "will be created")


def _creatable(uri: str, path: Path, must_exist: bool) -> str:
    """`path` does not exist: its nearest existing ancestor must be a folder this process can write in."""
    if must_exist:
        raise TrackingError(f"MLflow tracking URI {uri!r}: no store at {path}")
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise TrackingError(f"MLflow tracking URI {uri!r}: cannot create {path}: {parent} is not a writable folder")
    return f"{path} (will be created)"


# The headline figures, and the chart section MLflow's run page shows them in: its sections are the names' part
# before the last '/', sorted (`RunsChartsCardConfig.getBaseChartAndSectionConfigs` in MLflow's UI), and this one
# sorts before every other family's (`bon`, `collect`, `eval`, ...: tests/test_tracking_names.py).
_HEADLINE = re.compile(r"eval/(greedy|(?:pass|maj)@\d+)")
HEADLINE_SECTION = "accuracy"


def metric_name(key: str) -> str:
    """The MLflow name of metric `key`: '@' (which MLflow forbids) as `_at_`, and the headline figures in their
    own section, first on the run page; every other key keeps its family. `metric_key` reverses it.

    >>> metric_name("eval/pass@4"), metric_name("eval/greedy"), metric_name("bon/prm@4")
    ('accuracy/pass_at_4', 'accuracy/greedy', 'bon/prm_at_4')
    """
    if m := _HEADLINE.fullmatch(key):
        key = f"{HEADLINE_SECTION}/{m.group(1)}"
    return key.replace("@", "_at_")


def metric_key(name: str) -> str:
    """The metric key that `metric_name` logs as MLflow's `name`.

    >>> metric_key("accuracy/maj_at_16"), metric_key("bon/prm_vote_at_4")
    ('eval/maj@16', 'bon/prm_vote@4')
    """
    key = name.replace("_at_", "@")
    section, _, leaf = key.partition("/")
    return f"eval/{leaf}" if section == HEADLINE_SECTION and _HEADLINE.fullmatch(f"eval/{leaf}") else key


def create_run(experiment_id: str, name: str, parent_id: str | None = None, tags: dict | None = None) -> str:
    tags = dict(tags or {})
    if parent_id:
        tags[PARENT_TAG] = parent_id
    return MlflowClient().create_run(experiment_id, run_name=name, tags=tags).info.run_id


def find_or_create_run(experiment_id: str, slot: str, name: str, parent_id: str | None = None,
                       tags: dict | None = None) -> str:
    """The active run tagged `igrpo.slot = slot`, or a new one so tagged. A process killed after creating a run
    but before recording its id finds that run again on resume instead of making a second one (the slot names
    the run directory's manifest and the run's key in it; hex and `[a-z0-9/-]`, so it needs no quoting)."""
    found = MlflowClient().search_runs([experiment_id], filter_string=f"tags.`{SLOT_TAG}` = '{slot}'",
                                       max_results=1, order_by=["attributes.start_time ASC"])
    if found:
        return found[0].info.run_id
    return create_run(experiment_id, name, parent_id, {**(tags or {}), SLOT_TAG: slot})


def run_exists(run_id: str) -> bool:
    try:
        return MlflowClient().get_run(run_id).info.lifecycle_stage == "active"
    except Exception:
        return False


def log_metrics(run_id: str, metrics: dict[str, float], step: int | None = None) -> None:
    clean = {metric_name(k): float(v) for k, v in metrics.items() if v == v}  # NaN (one class absent) skipped
    if clean:
        MlflowClient().log_batch(
            run_id, metrics=[mlflow.entities.Metric(k, v, _now_ms(), step or 0) for k, v in clean.items()]
        )


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)


def log_params(run_id: str, params: dict[str, Any]) -> None:
    client = MlflowClient()
    existing = client.get_run(run_id).data.params
    fresh = {k: str(v)[:6000] for k, v in params.items() if k not in existing}
    for k, v in fresh.items():
        client.log_param(run_id, k, v)


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """A nested config as dotted params: {"grpo": {"beta": 0.04}} -> {"grpo.beta": 0.04}."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def log_artifact(run_id: str, path: str | Path) -> None:
    MlflowClient().log_artifact(run_id, str(path))


def log_table(run_id: str, rows: list[dict], artifact_file: str) -> None:
    """`rows` (one dict each, the same keys) as an MLflow table artifact, shown in the run's artifact view.

    MLflow appends to a table file already there; that is a resumed phase logging its seeded rows again, so
    the table there is kept, not doubled.
    """
    import pandas as pd

    client = MlflowClient()
    folder = os.path.dirname(artifact_file) or None
    if any(f.path == artifact_file for f in client.list_artifacts(run_id, folder)):
        return
    # Object columns, not pandas 3's str dtype: MLflow's image check on str columns warns on every table.
    table = pd.DataFrame(rows, columns=list(rows[0]) if rows else None, dtype=object)
    client.log_table(run_id, table, artifact_file)


def finish(run_id: str, status: str = "FINISHED") -> None:
    MlflowClient().set_terminated(run_id, status)


def end_status(error: BaseException | None) -> str:
    """The status of a run its body left with `error`: FINISHED, FAILED for an error, KILLED when stopped
    (Ctrl-C's KeyboardInterrupt, Prefect's TerminationSignal for a SIGTERM or a cancellation, SystemExit).

    >>> end_status(None), end_status(ValueError()), end_status(KeyboardInterrupt())
    ('FINISHED', 'FAILED', 'KILLED')
    """
    return "FINISHED" if error is None else "FAILED" if isinstance(error, Exception) else "KILLED"


@contextlib.contextmanager
def ending_on_exception(end):
    """The body left by an exception: `end(status)` (`end_status`: FAILED, or KILLED when stopped), after
    `release_interrupted`; a store that fails then does not replace the exception, which matters more."""
    try:
        yield
    except BaseException as e:
        release_interrupted(e)
        with contextlib.suppress(Exception):
            end(end_status(e))
        raise


def ending(*run_ids: str | None):
    """Runs that the body leaves by an exception are ended FAILED or KILLED (`end_status`), not left RUNNING."""
    def end(status: str) -> None:
        for run_id in filter(None, run_ids):
            with contextlib.suppress(Exception):  # the store may be gone too: end the others all the same
                finish(run_id, status)
    return ending_on_exception(end)


@contextlib.contextmanager
def scope(run_id: str | None, *others: str | None):
    """The body runs in MLflow run `run_id` (a phase's, a round's): RUNNING again if a stop ended it before,
    FINISHED when the body ends; left by an exception, it and `others` end FAILED or KILLED (`ending`)."""
    with ending(run_id, *others):
        if run_id:
            reopen(run_id)  # inside: a signal may land here
        yield
    if run_id:
        finish(run_id)


def release_interrupted(error: BaseException) -> None:
    """Free what the code a stop signal (`error`, not an Exception) interrupted still holds, before the store
    is written to again.

    A signal that lands in an MLflow read of a SQLite store leaves that read's cursor alive in the exception's
    traceback; SQLAlchemy closes the connection, but SQLite keeps the cursor's shared lock until the cursor
    goes, and every write (ending the runs KILLED) waits MLflow's 20 s busy timeout, then fails. The frames the
    exception unwound are finished with: clear them (the ones still running are left alone) and collect, once
    per exception (a collection costs ~0.3 s, and each `ending` on the way out sees the same exception).
    """
    if isinstance(error, Exception) or getattr(error, "_igrpo_released", False):
        return
    with contextlib.suppress(AttributeError):  # a frozen exception: collected again by the next `ending`
        error._igrpo_released = True
    pending, seen = [error], set()
    while pending:  # the exception, what it was raised from or during, an exception group's members
        e = pending.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        traceback.clear_frames(e.__traceback__)
        pending += [e.__cause__, e.__context__, *getattr(e, "exceptions", ())]
    gc.collect()


def run_status(run_id: str) -> str | None:
    """RUNNING, FINISHED, FAILED, KILLED; None for a run the store does not have."""
    try:
        return MlflowClient().get_run(run_id).info.status
    except Exception:
        return None


def reopen(run_id: str) -> None:
    """A resumed run is RUNNING again (it was ended KILLED or FAILED when its process stopped)."""
    if run_status(run_id) not in (None, "RUNNING"):
        MlflowClient().update_run(run_id, status="RUNNING")


@contextlib.contextmanager
def active(run_id: str | None):
    """Make `run_id` the active run (where Trainer's MLflow callback logs); no-op for None.

    Left by an exception, the run ends as `ending` ends it (`ending_on_exception`): `mlflow.start_run`'s own
    exit would write first, wait on the lock an interrupted read still holds, and raise SQLAlchemy's error
    instead of the stop.
    """
    if run_id is None:
        yield
        return
    mlflow.start_run(run_id=run_id)
    with ending_on_exception(lambda status: _end_active(run_id, status)):
        yield
    _end_active(run_id, "FINISHED")
    mlflow.flush_async_logging()


def _end_active(run_id: str, status: str) -> None:
    """End `run_id` if it is still the active run (as `mlflow.start_run`'s exit: the body may have ended it)."""
    if (run := mlflow.active_run()) is not None and run.info.run_id == run_id:
        mlflow.end_run(status)


def model_name(experiment: str, run_name: str, kind: str) -> str:
    """The registered model of a run's `kind` checkpoints (prm, orm, policy): one per run, its versions the run's
    rounds, aliased `round-<r>`. Runs side by side in one experiment (seeds, configs) never move each other's
    aliases: with one model per experiment, the last run to finish a round took `round-<r>` from the others.

    >>> model_name("iterative-grpo", "quickstart", "prm")
    'iterative-grpo-quickstart-prm'
    """
    return f"{experiment}-{run_name}-{kind}"


def register_checkpoint(run_id: str, path: str | Path, name: str, round_index: int, pipeline_run: str) -> str:
    """Log a checkpoint directory to `run_id` and register it as a version of `name`, aliased `round-<r>`."""
    client = MlflowClient()
    artifact_path = Path(path).name
    client.log_artifacts(run_id, str(path), artifact_path)
    with contextlib.suppress(mlflow.exceptions.MlflowException):  # already exists
        client.create_registered_model(name)
    version = client.create_model_version(
        name, source=f"{client.get_run(run_id).info.artifact_uri}/{artifact_path}", run_id=run_id,
        tags={"round": str(round_index), "pipeline_run": pipeline_run},
    ).version
    client.set_registered_model_alias(name, f"round-{round_index}", version)
    return version


def resolve_model_uri(path: str | Path) -> str:
    """A local checkpoint path for `path`, downloading a `models:/name@alias` (or `/version`) URI first."""
    path = str(path)
    if path.startswith("models:/"):
        return mlflow.artifacts.download_artifacts(artifact_uri=path)
    return path
