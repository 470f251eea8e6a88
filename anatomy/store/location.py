"""Where a store is: a SQLite file (a path, or a `sqlite:///` URL) or a PostgreSQL database (a
`postgresql://` URL). A URL is never taken for a file name, and its password is never shown: a
location prints as the user wrote it with the password as `***`."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

STORE_ENV = "ANATOMY_STORE"
URL_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
SERVER_SCHEMES = ("postgresql", "postgres")
SHOWN_FORMS = "a file path, sqlite:///PATH or postgresql://USER@HOST:PORT/DATABASE"


class BadLocation(ValueError):
    """--store or $ANATOMY_STORE names no store anatomy can use: one line that says why."""


@dataclass(frozen=True)
class ServerUrl:
    """A PostgreSQL database, as the user wrote it. Printed with its password masked; `secret()`
    only for the processes of the same run (through their environment, never a line)."""
    url: URL

    def __str__(self) -> str:
        return self.url.render_as_string(hide_password=True)

    def secret(self) -> str:
        return self.url.render_as_string(hide_password=False)

    def driver(self) -> URL:
        """The URL SQLAlchemy connects with: psycopg 3 is the one driver (postgres://, libpq's
        spelling, and +psycopg2 mean the same database)."""
        return self.url.set(drivername="postgresql+psycopg")


def default_store() -> Path:
    """The one store every front shares when neither --store nor $ANATOMY_STORE names one: the
    user's data directory (XDG), so that a clone, an installed package, a user's script and the
    dashboard find the same runs whatever their working directory."""
    data = os.environ.get("XDG_DATA_HOME", "")
    base = Path(data) if os.path.isabs(data) else Path.home() / ".local" / "share"
    return base / "anatomy" / "anatomy.sqlite"


def resolve_path(path: str | os.PathLike | ServerUrl | None = None) -> Path | ServerUrl:
    """--store, then $ANATOMY_STORE, then the user's default store: a file's Path, or the
    ServerUrl of a database. A `~` is the home folder, as a shell would have made it: a path
    quoted in an environment file or given to `anatomy.start(store=…)` made a folder named "~" in
    the working directory. A blank $ANATOMY_STORE is unset (it made a file named " ").
    BadLocation for a URL of another kind."""
    if isinstance(path, ServerUrl):
        return path
    chosen = os.environ.get(STORE_ENV)
    if chosen is not None and not chosen.strip():
        chosen = None
    value = os.fspath(path) if path else (chosen or default_store())
    if isinstance(value, Path) or not URL_SCHEME.match(str(value)):
        return Path(value).expanduser()
    return _url(str(value))


def _url(value: str) -> Path | ServerUrl:
    scheme = value.split("://", 1)[0].lower()
    if scheme == "sqlite":
        rest = value[len("sqlite://"):]
        if rest in ("", "/", "/:memory:"):
            raise BadLocation(f"{value}: a store in memory keeps nothing; give a file"
                              f" (sqlite:///PATH)")
        return Path(rest[1:] if rest.startswith("/") else rest).expanduser()
    if scheme.split("+")[0] not in SERVER_SCHEMES:
        raise BadLocation(f"{_masked(value)}: not a store anatomy can use; give {SHOWN_FORMS}")
    try:
        url = make_url(value)
    except (ArgumentError, ValueError):  # ValueError: int() of a port that is no number
        raise BadLocation(f"{_masked(value)}: not a URL anatomy can read; give {SHOWN_FORMS}"
                          ) from None
    return ServerUrl(url)


def _masked(value: str) -> str:
    """A URL anatomy cannot read, shown without what may be its password."""
    return re.sub(r"(://[^/:@]*:)[^@/]*@", r"\1***@", value)
