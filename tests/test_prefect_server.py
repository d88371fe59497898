"""`igrpo deploy` and `igrpo serve` against a real Prefect server and a process worker, as an operator runs them.

The server is the session's (conftest.py's `prefect_harness`: Prefect's own server app in a process of its own);
a process work pool and `prefect worker start` with a temporary PREFECT_HOME. A deployment's run completes with
the run directory and MLflow structure of `igrpo run`; a cancel (what `prefect flow-run cancel` sends) stops a
running one, which ends cancelled with its MLflow runs KILLED and its lock released, and the next run resumes it;
`igrpo serve --cron` registers its schedule, read back through the Prefect client.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

from flows.cli import main
from pipeline.loading import config_from_dict
from pipeline.rundir import phase_key, read_json
from tests.helpers import assert_complete_run, child_env, mini_config

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("isolated")]

PREFECT = [sys.executable, "-m", "prefect"]
IGRPO = [sys.executable, "-m", "flows.cli"]


def _wait(predicate, timeout: float, what: str, log: Path | None = None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if value := predicate():
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}"
                         + (f":\n{log.read_text(errors='replace')[-3000:]}" if log and log.exists() else ""))


def _stop(proc: subprocess.Popen) -> None:
    """Stop a process started in a session of its own, and whatever it started, by its pid."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)  # a worker or server stops in a few seconds; past that, no reason to wait
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory, prefect_harness):
    """The environment that points commands at the session's Prefect server, from a Prefect home of their own."""
    from prefect.settings import PREFECT_API_URL

    return child_env(PREFECT_HOME=str(tmp_path_factory.mktemp("prefect-home")), PREFECT_API_URL=PREFECT_API_URL.value(),
                     PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_WORKER_QUERY_SECONDS="1",
                     PREFECT_WORKER_PREFETCH_SECONDS="1")


@contextlib.contextmanager
def _client(env):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: env["PREFECT_API_URL"]}), get_client(sync_client=True) as c:
        yield c


def _state(env, flow_run_id) -> str:
    with _client(env) as c:
        return c.read_flow_run(flow_run_id).state.type.value


def test_deploy_to_a_worker_run_cancel_and_resume(tmp_path, server):
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.states import Cancelling

    # SFT twice mini's epochs (~4-5 s idle): long enough for the cancel below, sent 1 s after it begins, to land
    # inside it (the worker hears of a cancel by Prefect's event stream at once); the resumed run trains it again.
    data = mini_config(tmp_path, run={"rounds": 1},
                       bootstrap={"sft_args": {"learning_rate": 3e-3, "num_train_epochs": 4,
                                               "per_device_train_batch_size": 32}})
    cfg = config_from_dict(data)
    (tmp_path / "mini.yaml").write_text(yaml.safe_dump(data))
    with _client(server) as c:  # what `prefect work-pool create cpu --type process` does
        c.create_work_pool(WorkPoolCreate(name="cpu", type="process"))
    worker_log = tmp_path / "worker.log"
    with open(worker_log, "wb") as out:
        worker = subprocess.Popen([*PREFECT, "worker", "start", "--pool", "cpu"], env=server, cwd=tmp_path,
                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        assert main(["deploy", "mini.yaml", "--pool", "cpu", "--name", "mini-worker"]) == 0  # in-process, as it exits
        with _client(server) as c:
            deployment = c.read_deployment_by_name("iterative-rl/mini-worker")
            first = c.create_flow_run_from_deployment(deployment.id).id

        manifest = cfg.run_dir / "manifest.json"

        def in_sft() -> bool:
            with contextlib.suppress(FileNotFoundError, ValueError):
                return phase_key(0, "policy") in read_json(manifest)["mlflow"]
            return False

        _wait(in_sft, 240, "the worker's run to reach SFT", worker_log)
        time.sleep(1.0)
        with _client(server) as c:  # what `prefect flow-run cancel` does
            c.set_flow_run_state(first, Cancelling())
        _wait(lambda: _state(server, first) == "CANCELLED", 60, "the cancelled run to stop", worker_log)
        _wait(lambda: not (cfg.run_dir / ".lock").exists(), 30, "the lock to be released", worker_log)
        m = read_json(manifest)
        assert phase_key(0, "policy") not in m["phases"]
        client = MlflowClient(cfg.tracking.tracking_uri)
        assert client.get_run(m["mlflow"][phase_key(0, "policy")]).info.status == "KILLED"

        with _client(server) as c:
            second = c.create_flow_run_from_deployment(deployment.id).id
        _wait(lambda: _state(server, second) in ("COMPLETED", "FAILED", "CRASHED"), 600, "the second run", worker_log)
        assert _state(server, second) == "COMPLETED", worker_log.read_text(errors="replace")[-3000:]
    finally:
        _stop(worker)
    import mlflow

    mlflow.set_tracking_uri(cfg.tracking.tracking_uri)
    assert_complete_run(cfg, "mini")  # what `igrpo run` leaves: every phase, the shards, one MLflow run each
    assert read_json(cfg.run_dir / "manifest.json")["mlflow"]["parent"] == m["mlflow"]["parent"]  # resumed


def test_serve_registers_its_cron_schedule(tmp_path, server):
    (tmp_path / "mini.yaml").write_text(yaml.safe_dump(mini_config(tmp_path)))
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([*IGRPO, "serve", "mini.yaml", "--cron", "0 3 * * *", "--name", "mini-nightly"],
                                env=server, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def deployment():
            with _client(server) as c, contextlib.suppress(Exception):
                return c.read_deployment_by_name("iterative-rl/mini-nightly")

        d = _wait(deployment, 120, "igrpo serve to register its deployment", log)
        assert [s.schedule.cron for s in d.schedules] == ["0 3 * * *"]
        assert d.global_concurrency_limit.limit == 1  # one run at a time: a scheduled run never overlaps the last
    finally:
        proc.send_signal(signal.SIGINT)  # how an operator stops `igrpo serve`
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        _stop(proc)
