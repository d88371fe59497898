"""`igrpo serve` against a real Prefect server, as an operator runs it.

The server is the session's (conftest.py's `prefect_harness`: Prefect's own server app in a process of its own),
reached from a temporary PREFECT_HOME: `igrpo serve --cron` registers its schedule, read back through the Prefect
client. `igrpo deploy` to a work pool, a worker's run, its cancel and the resume by the deployment's next run are
tests/test_stack.py's, on the stack's server and workers.
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

from tests.helpers import child_env, mini_config

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("isolated")]

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
            proc.wait(timeout=10)  # a server stops in a few seconds; past that, no reason to wait
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory, prefect_harness):
    """The environment that points commands at the session's Prefect server, from a Prefect home of their own."""
    from prefect.settings import PREFECT_API_URL

    return child_env(PREFECT_HOME=str(tmp_path_factory.mktemp("prefect-home")), PREFECT_API_URL=PREFECT_API_URL.value(),
                     PREFECT_SERVER_ANALYTICS_ENABLED="false")


@contextlib.contextmanager
def _client(env):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: env["PREFECT_API_URL"]}), get_client(sync_client=True) as c:
        yield c


def test_serve_registers_its_cron_schedule(tmp_path, server):
    (tmp_path / "mini.yaml").write_text(yaml.safe_dump(mini_config(tmp_path)))
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        # Its temp dir in tmp_path: Prefect's runner leaves an empty `runner_storage` folder in the temp dir.
        proc = subprocess.Popen([*IGRPO, "serve", "mini.yaml", "--cron", "0 3 * * *", "--name", "mini-nightly"],
                                env={**server, "TMPDIR": str(tmp_path)}, cwd=tmp_path, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
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
