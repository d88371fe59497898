"""Long-running services started, watched and stopped by pid: what `igrpo stack` is made of, knowing none of them.

A service is a table entry (`Service`): its command, its environment (secrets go there, never on the command line,
which every local user can read), its port, and a health check. `bring_up` starts stages of them in order (each
stage's services at once, then waits for each to answer), recording every start in a state file; on any error it
stops what it started itself, so nothing is left half-started. A record holds the pid, the process's start time and
its command line: a later `stop` or `is_ours` acts only on that very process, never on a reused pid. The state file
is read and written under a lock (`State.locked`), so two `up`s at once never overwrite each other's records.

Run as root, services run as a system user of their own (`Service.user`); `reach` and `own` give that user what
it needs, and no more: o+x on the parents it cannot pass (each said), and the folders it writes.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import pwd
import signal
import socket
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import psutil

from pipeline.rundir import read_json, write_json_atomic


class StackError(RuntimeError):
    """A service cannot start or answer: one sentence naming the service and its log."""


@dataclass(frozen=True)
class Service:
    name: str
    argv: list[str]
    url: str  # what `status` and `up` print
    healthy: Callable[[], bool]  # one quick check: True once it answers
    env: dict[str, str] = field(default_factory=dict)  # added to this process's environment
    port: tuple[str, int] | None = None  # (host, port) it will listen on: checked free before anything starts
    user: str | None = None  # run as this system user (as root: the stack's user; PostgreSQL refuses root)
    cwd: str | None = None
    stop_signal: int = signal.SIGTERM
    pidfile: Path | None = None  # `argv` starts a daemon and returns once it is up (`pg_ctl start -w`): its pid is here
    stop_argv: list[str] | None = None  # how it stops itself (`pg_ctl stop`), instead of `stop_signal`
    before: Callable[[], None] | None = None  # before it starts (PostgreSQL's initdb)
    after: Callable[[], None] | None = None  # once it answers, on every `up` (create the databases)


def same_process(record: dict, cmdline: list[str], create_time: float) -> bool:
    """Whether a live process (its command line and start time) is the one `record` saw start.

    >>> r = {"pid": 7, "argv": ["postgres", "-D", "data"], "started": 100.0}
    >>> same_process(r, ["postgres", "-D", "data"], 100.0), same_process(r, ["sleep", "9"], 100.0)
    (True, False)
    >>> same_process(r, ["postgres", "-D", "data"], 250.0)  # the pid was reused by a new postgres
    False
    """
    return cmdline == record["argv"] and abs(create_time - record["started"]) < 0.01


def is_ours(record: dict) -> bool:
    """Whether `record`'s process still runs (a zombie does not) and is the one that was started."""
    try:
        p = psutil.Process(record["pid"])
        return p.status() != psutil.STATUS_ZOMBIE and same_process(record, p.cmdline(), p.create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def port_taken(host: str, port: int) -> bool:
    """Whether something already listens on (or holds) `host:port`; any other socket error (an address this machine
    does not have, a port it may not use) is a StackError naming both."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free to listen on
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return True
            hint = {errno.EADDRNOTAVAIL: f"; {host} is not an address of this machine",
                    errno.EACCES: "; ports below 1024 need root"}.get(e.errno, "")
            raise StackError(f"cannot listen on port {port} on {host}: {e.strerror}{hint}") from None
    return False


class State:
    """The state file (`pids.json`): service name -> record (pid, start time, argv, url, log), in start order."""

    def __init__(self, path: Path):
        self.path = path
        self.records: dict[str, dict] = read_json(path) if path.exists() else {}

    @classmethod
    @contextlib.contextmanager
    def locked(cls, path: Path, say: Callable[[str, str], None]):
        """The state in `path`, read and kept under an exclusive lock on `path`'s `.lock` file while the block runs
        (flock: the kernel releases it when its holder dies, so a stale lock is never guessed at)."""
        fd = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                say("waiting", f"another `igrpo stack` command is at work on {path.parent}")
                fcntl.flock(fd, fcntl.LOCK_EX)
            yield cls(path)
        finally:
            os.close(fd)

    def running(self, name: str) -> dict | None:
        record = self.records.get(name)
        return record if record and is_ours(record) else None

    def put(self, name: str, record: dict | None) -> None:
        if record is None:
            self.records.pop(name, None)
        else:
            self.records[name] = record
        write_json_atomic(self.path, self.records)


def as_user(name: str | None) -> dict:
    """subprocess's arguments that run a command as system user `name` with its own group alone (root's groups kept
    would open root's group-only folders to it, and make the permission checks below it group checks)."""
    return {"user": name, "group": pwd.getpwnam(name).pw_gid, "extra_groups": []} if name else {}


def allows(st: os.stat_result, uid: int, gid: int, what: int = 0o1) -> bool:
    """Whether a file of stat `st` lets user `uid` of group `gid` (its only group) do `what` (0o1 pass through or
    run, 0o2 write, 0o4 read; or several) by its mode's owner, group or others bits.

    >>> st = os.stat_result((0o40701, 0, 0, 0, 0, 0, 0, 0, 0, 0))  # drwx-----x root:root
    >>> allows(st, 999, 999), allows(st, 999, 999, 0o3), allows(st, 0, 0, 0o7)
    (True, False, True)
    """
    shift = 6 if st.st_uid == uid else 3 if st.st_gid == gid else 0
    return st.st_mode >> shift & what == what


def reach(uid: int, gid: int, paths: list[Path], say: Callable[[str, str], None]) -> None:
    """Let user `uid` (group `gid`) reach each of `paths`: each parent it cannot pass gets o+x (pass through, not
    list), and each change is said; every other folder keeps its mode."""
    for path in paths:
        for parent in reversed(Path(path).resolve().parents):
            st = parent.stat()
            if not allows(st, uid, gid):
                parent.chmod(stat.S_IMODE(st.st_mode) | stat.S_IXOTH)
                say("as root", f"chmod o+x {parent}, so that the stack's user can reach {path}")


def own(path: Path, uid: int, gid: int, say: Callable[[str, str], None]) -> None:
    """Make folder `path` if missing, and give it and what is in it (links not followed) to `uid`:`gid`; a folder
    that was someone else's is said."""
    made = not path.exists()
    path.mkdir(parents=True, exist_ok=True)
    if path.lstat().st_uid == uid:
        return
    for folder, dirs, files in os.walk(path):
        for name in [folder, *(os.path.join(folder, n) for n in dirs + files)]:
            os.lchown(name, uid, gid)
    if not made:
        say("as root", f"{path} now belongs to the stack's user")


def start(service: Service, log: Path) -> dict:
    """Start `service` in a session of its own (its children share its group), its output to `log`; its record.
    A daemon's starter (`pidfile`) is waited for, and the record is the daemon's, read from its pid file."""
    log.parent.mkdir(parents=True, exist_ok=True)
    run = {"env": {**os.environ, **service.env}, "cwd": service.cwd, "stdin": subprocess.DEVNULL,
           "start_new_session": True, **as_user(service.user)}
    with open(log, "ab") as out:
        if service.pidfile is None:
            pid = subprocess.Popen(service.argv, stdout=out, stderr=subprocess.STDOUT, **run).pid
        else:
            code = subprocess.run(service.argv, stdout=out, stderr=subprocess.STDOUT, **run).returncode
            pid = int(service.pidfile.read_text().split()[0]) if service.pidfile.exists() else 0
    try:
        p = psutil.Process(pid)
        started, argv = p.create_time(), service.argv if service.pidfile is None else p.cmdline()
    except (psutil.NoSuchProcess, ValueError):  # exited at once: its log says why
        started, argv = 0.0, service.argv
    record = {"pid": pid, "started": started, "argv": argv, "url": service.url, "log": str(log),
              "stop_signal": int(service.stop_signal), "stop_argv": service.stop_argv, "user": service.user,
              "port": service.port}
    if service.pidfile is not None and code:
        stop(record)  # a starter that gave up waiting may leave its daemon starting
        raise StackError(f"{service.name} exited as it started; see its log {log}")
    return record


def wait_healthy(service: Service, record: dict, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not service.healthy():
        if not is_ours(record):
            raise StackError(f"{service.name} exited as it started; see its log {record['log']}")
        if time.monotonic() > deadline:
            raise StackError(f"{service.name} did not answer within {timeout:.0f} s; see its log {record['log']}")
        time.sleep(0.25)


def _group(pgid: int) -> list[psutil.Process]:
    """The processes of process group `pgid`."""
    found = []
    for p in psutil.process_iter():
        with contextlib.suppress(ProcessLookupError, psutil.Error):
            if os.getpgid(p.pid) == pgid:
                found.append(p)
    return found


def stop(record: dict, grace: float = 20.0) -> None:
    """Stop the process of `record` and every process of its group (a server's children: uvicorn, gunicorn's
    workers), if it is still the one started: its own stop command, else its stop signal; SIGKILL to what is left
    after `grace` seconds. Returns once they are all gone and its port is free, so the next `up` finds it free."""
    if not is_ours(record):
        return
    group = _group(record["pid"])  # the leader is one; each is known by its start time, so none is a reused pid
    if record.get("stop_argv"):
        with contextlib.suppress(subprocess.TimeoutExpired):
            subprocess.run(record["stop_argv"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=grace, **as_user(record.get("user")))
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(record["pid"], record["stop_signal"])
    _, left = psutil.wait_procs(group, timeout=grace)
    for p in left:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(left, timeout=grace)
    with contextlib.suppress(ChildProcessError):  # reap it if this process started it (a zombie holds its pid)
        os.waitpid(record["pid"], os.WNOHANG)
    deadline = time.monotonic() + grace
    while record.get("port") and port_taken(*record["port"]) and time.monotonic() < deadline:
        time.sleep(0.1)


def check_ports(stages: list[list[Service]], state: State, logs: Path) -> None:
    """Each port of a service not running yet is free: else one sentence naming the service, host and port."""
    for service in (s for stage in stages for s in stage):
        if service.port and not state.running(service.name):
            host, port = service.port
            try:
                taken = port_taken(host, port)
            except StackError as e:
                raise StackError(f"{service.name}: {e} (its log would be {logs / (service.name + '.log')})") from None
            if taken:
                raise StackError(f"{service.name}: port {port} on {host} is taken by another program; free it or "
                                 f"choose another port (its log would be {logs / (service.name + '.log')})")


def bring_up(stages: list[list[Service]], state: State, logs: Path, timeout: float,
             say: Callable[[str, str], None]) -> None:
    """Start each stage's services that are not running (at once), then wait for each to answer, stage by stage.

    Ports are checked before anything starts. On any error (or Ctrl-C) the services this call started are stopped
    and their records removed; those already running before it are left as they were.
    """
    check_ports(stages, state, logs)
    started: list[tuple[Service, dict]] = []
    try:
        for stage in stages:
            waiting = []
            for service in stage:
                record, new = state.running(service.name), False
                if record is None:
                    if service.before:
                        service.before()
                    record = start(service, logs / f"{service.name}.log")
                    state.put(service.name, record)
                    started.append((service, record))
                    new = True
                waiting.append((service, record, new))
            for service, record, new in waiting:
                wait_healthy(service, record, timeout)
                if service.after:
                    service.after()
                say(service.name, f"{'started' if new else 'already running'} (pid {record['pid']}) at {record['url']}")
    except BaseException:
        for service, record in reversed(started):
            stop(record)
            state.put(service.name, None)
        raise
