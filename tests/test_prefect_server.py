"""`igrpo deploy` and `igrpo serve` against a real Prefect server and a process worker, as an operator runs them.

A module-scoped `prefect server start` on a free localhost port with a temporary PREFECT_HOME (stopped by its
own pid at the end); a process work pool and `prefect worker start`. A deployment's run completes with the
run directory and MLflow structure of `igrpo run`; `prefect flow-run cancel` stops a running one, which
ends cancelled with its MLflow runs KILLED and its lock released, and the next run resumes it;
`igrpo serve --cron` registers its schedule, read back through the Prefect client.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

from pipeline.loading import config_from_dict
from pipeline.rundir import phase_key, read_json
from tests.helpers import assert_complete_run, child_env, mini_config

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("isolated")]

PREFECT = [sys.executable, "-m", "prefect"]
IGRPO = [sys.executable, "-m", "flows.cli"]


def _free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(predicate, timeout: float, what: str, log: Path | None = None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if value := predicate():
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}"
                         + (f":\n{log.read_text(errors='replace')[-3000:]}" if log and log.exists() else ""))


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return r.read().strip() == b"true"
    except OSError:
        return False


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
def server(tmp_path_factory):
    """A real Prefect server; yields the environment that points commands at it."""
    home = tmp_path_factory.mktemp("prefect-server")
    port = _free_port()
    url = f"http://127.0.0.1:{port}/api"
    env = child_env(PREFECT_HOME=str(home), PREFECT_API_URL=url, PREFECT_SERVER_ANALYTICS_ENABLED="false",
                    PREFECT_UI_ENABLED="false", PREFECT_WORKER_QUERY_SECONDS="1", PREFECT_WORKER_PREFETCH_SECONDS="1")
    log = home / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([*PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait(lambda: _healthy(url), 180, "prefect server start", log)
        yield env
    finally:
        _stop(proc)


@contextlib.contextmanager
def _client(env):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: env["PREFECT_API_URL"]}), get_client(sync_client=True) as c:
        yield c


def _cli(cmd: list[str], env, tmp_path) -> str:
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{cmd}: rc {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def _state(env, flow_run_id) -> str:
    with _client(env) as c:
        return c.read_flow_run(flow_run_id).state.type.value


def test_deploy_to_a_worker_run_cancel_and_resume(tmp_path, server):
    data = mini_config(tmp_path, run={"rounds": 1},
                       bootstrap={"sft_args": {"learning_rate": 3e-3, "num_train_epochs": 8,
                                               "per_device_train_batch_size": 32}})
    cfg = config_from_dict(data)
    (tmp_path / "mini.yaml").write_text(yaml.safe_dump(data))
    _cli([*PREFECT, "work-pool", "create", "cpu", "--type", "process"], server, tmp_path)
    worker_log = tmp_path / "worker.log"
    with open(worker_log, "wb") as out:
        worker = subprocess.Popen([*PREFECT, "worker", "start", "--pool", "cpu"], env=server, cwd=tmp_path,
                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _cli([*IGRPO, "deploy", "mini.yaml", "--pool", "cpu", "--name", "mini-worker"], server, tmp_path)
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
        _cli([*PREFECT, "flow-run", "cancel", str(first)], server, tmp_path)
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
