"""Long-running services started, watched and stopped by pid: what `igrpo stack` is made of, knowing none of them.

A service is a table entry (`Service`): its command, its environment (secrets go there, never on the command line,
which every local user can read), its port, and a health check. `bring_up` starts stages of them in order (each
stage's services at once, then waits for each to answer), recording every start in a state file; on any error it
stops what it started itself, so nothing is left half-started. A record holds the pid, the process's start time and
its command line: a later `stop` or `is_ours` acts only on that very process, never on a reused pid.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import signal
import socket
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
    user: str | None = None  # run as this system user (PostgreSQL refuses to run as root)
    cwd: str | None = None
    stop_signal: int = signal.SIGTERM
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
    """Whether something already listens on (or holds) `host:port`."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free to listen on
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return True
            raise
    return False


class State:
    """The state file (`pids.json`): service name -> record (pid, start time, argv, url, log), in start order."""

    def __init__(self, path: Path):
        self.path = path
        self.records: dict[str, dict] = read_json(path) if path.exists() else {}

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


def start(service: Service, log: Path) -> dict:
    """Start `service` in a session of its own (its children share its group), its output to `log`; its record."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(service.argv, env={**os.environ, **service.env}, cwd=service.cwd, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True, **as_user(service.user))
    try:
        started = psutil.Process(proc.pid).create_time()
    except psutil.NoSuchProcess:  # exited at once: its log says why
        started = 0.0
    return {"pid": proc.pid, "started": started, "argv": service.argv, "url": service.url, "log": str(log),
            "stop_signal": int(service.stop_signal)}


def wait_healthy(service: Service, record: dict, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not service.healthy():
        if not is_ours(record):
            raise StackError(f"{service.name} exited as it started; see its log {record['log']}")
        if time.monotonic() > deadline:
            raise StackError(f"{service.name} did not answer within {timeout:.0f} s; see its log {record['log']}")
        time.sleep(0.25)


def stop(record: dict, grace: float = 20.0) -> None:
    """Stop the process of `record` and its group, if it is still the one started: its service's stop signal, then
    SIGKILL after `grace` seconds."""
    if not is_ours(record):
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(record["pid"], record["stop_signal"])
    deadline = time.monotonic() + grace
    while is_ours(record) and time.monotonic() < deadline:
        time.sleep(0.1)
    if is_ours(record):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(record["pid"], signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):  # reap it if this process started it (a zombie holds its pid)
        os.waitpid(record["pid"], os.WNOHANG)


def bring_up(stages: list[list[Service]], state: State, logs: Path, timeout: float,
             say: Callable[[str, str], None]) -> None:
    """Start each stage's services that are not running (at once), then wait for each to answer, stage by stage.

    Ports are checked before anything starts. On any error (or Ctrl-C) the services this call started are stopped
    and their records removed; those already running before it are left as they were.
    """
    for service in (s for stage in stages for s in stage):
        if service.port and not state.running(service.name) and port_taken(*service.port):
            host, port = service.port
            raise StackError(f"{service.name}: port {port} on {host} is taken by another program; free it or choose "
                             f"another port (its log would be {logs / (service.name + '.log')})")
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
