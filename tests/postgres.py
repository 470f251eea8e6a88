"""A private PostgreSQL cluster for the tests: Debian's server (`apt-get install postgresql`, as
.ci/run installs it), initialised and started by an unprivileged user (initdb refuses root) in a
temporary folder, on a free port of 127.0.0.1, with a password: nothing of the machine's own
PostgreSQL is used or changed. Stopped (`immediate`) when the session ends, and by a watchdog
when the process that made it ends without ending the session (a worker killed, a CI job cut at
its time limit): `pg_ctl start` leaves the server to run on its own, and a cluster was once
found running after a CI run."""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

USER, PASSWORD = "anatomy", "s3cret-Pa55"
_NAMES = itertools.count()


def binaries() -> Path | None:
    """The folder of Debian's server programs (initdb, pg_ctl), the newest version installed."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parent.parent.name))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Cluster:
    def __init__(self, bin_dir: Path):
        self.bin = bin_dir
        self.folder = Path(tempfile.mkdtemp(prefix="anatomy-pg-"))
        self.data = self.folder / "data"
        self.port = _free_port()
        self.owner = None  # the unprivileged user that runs it, where we are root
        if os.geteuid() == 0:
            self.owner = next(name for name in ("postgres", "nobody") if _user(name))
            account = pwd.getpwnam(self.owner)
            os.chmod(self.folder, 0o700)
            os.chown(self.folder, account.pw_uid, account.pw_gid)
        secret = self.folder / "password"
        secret.write_text(PASSWORD)
        if self.owner:
            os.chown(secret, pwd.getpwnam(self.owner).pw_uid, -1)
        self._as_owner("initdb", "-D", str(self.data), "-U", USER, "--pwfile", str(secret),
                       "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8",
                       "--no-sync")
        # The watchdog reads a pipe whose only writer is this process (os.pipe's ends are not
        # inherited): at its end of file, however this process ended, it stops the server and
        # removes the folder. A session of its own: a signal to this process's group spares it.
        # Started through a process that exits at once, it is no child of this one: a test that
        # finds no process of its own left after a run must not find it.
        reader, self._lifeline = os.pipe()
        subprocess.run([sys.executable, "-c", _DETACHED, _WATCHDOG, str(self.bin), str(self.data),
                        str(self.folder), self.owner or ""], stdin=reader,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True,
                       timeout=60)
        os.close(reader)
        self.start()

    def _as_owner(self, program: str, *args: str) -> None:
        command = [str(self.bin / program), *args]
        if self.owner:
            command = ["runuser", "-u", self.owner, "--", *command]
        subprocess.run(command, check=True, capture_output=True, cwd=self.folder, timeout=120)

    def start(self) -> None:
        self._as_owner("pg_ctl", "-D", str(self.data), "-w", "-l", str(self.folder / "log"),
                       "-o", f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1"
                             " -c fsync=off -c synchronous_commit=off -c full_page_writes=off",
                       "start")

    def stop(self, mode: str = "fast") -> None:
        self._as_owner("pg_ctl", "-D", str(self.data), "-w", "-m", mode, "stop")

    def url(self, database: str = "postgres", password: str | None = PASSWORD,
            user: str = USER) -> str:
        secret = f":{password}" if password is not None else ""
        return f"postgresql://{user}{secret}@127.0.0.1:{self.port}/{database}"

    def sql(self, statement: str, database: str = "postgres") -> None:
        """A statement run as the cluster's superuser, outside a transaction (CREATE DATABASE)."""
        import psycopg
        with psycopg.connect(self.url(database), autocommit=True) as db:
            db.execute(statement)

    def new_database(self, password: bool = True) -> str:
        """A fresh empty database's URL: with the password, or without (libpq's PGPASSWORD)."""
        name = f"t{os.getpid()}_{next(_NAMES)}"
        self.sql(f"CREATE DATABASE {name}")
        return self.url(name, PASSWORD if password else None)

    def remove(self) -> None:
        try:
            self.stop("immediate")
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)
            os.close(self._lifeline)  # the watchdog finds nothing left to do, and ends


# Starts the watchdog (argv[1], its arguments after it) on this process's standard input, in a
# session of its own, and exits: the watchdog's parent is then init (or a subreaper).
_DETACHED = """
import subprocess, sys
subprocess.Popen([sys.executable, "-c", *sys.argv[1:]], stdin=0, stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL, start_new_session=True)
"""

_WATCHDOG = """
import os, shutil, subprocess, sys
bin_dir, data, folder, owner = sys.argv[1:]
sys.stdin.buffer.read()  # until its maker has ended (or removed the cluster)
if os.path.isdir(data):
    command = [os.path.join(bin_dir, "pg_ctl"), "-D", data, "-w", "-m", "immediate", "stop"]
    subprocess.run((["runuser", "-u", owner, "--"] if owner else []) + command,
                   capture_output=True, timeout=120)
shutil.rmtree(folder, ignore_errors=True)
"""


def _user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False
