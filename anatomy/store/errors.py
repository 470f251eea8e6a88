"""Why a store cannot be used, in one line a user acts on."""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

from sqlalchemy.exc import DBAPIError

from anatomy.store.location import ServerUrl

# What a store's database raises: SQLAlchemy's wrapper of the driver's error (SQLite's or
# psycopg's), as every caller that writes or reads catches it.
DatabaseError = DBAPIError


class StoreError(RuntimeError):
    """The store cannot be used: one line that names its path and the reason. `full` when the
    disk (or the store's size limit) is full; `unreachable` when its database server cannot be
    reached now (`unreachable()`): one may wait for it."""

    def __init__(self, path: Path | ServerUrl, reason: str, full: bool = False,
                 unreachable: bool = False):
        if isinstance(path, ServerUrl) and path.url.password:  # a driver that quoted it back
            reason = reason.replace(str(path.url.password), "***")
        super().__init__(f"{path}: {reason}")
        self.path, self.reason, self.full = path, reason, full
        self.unreachable = unreachable


class StoreMissing(StoreError):
    """A read-only open of a store that does not exist (yet): nothing recorded there."""


def unreachable(error: BaseException) -> bool:
    """The database server cannot be reached now (down, restarting, the network gone): what
    was to be written can wait for it. SQLite's errors never are: a file is there or not."""
    from sqlalchemy.exc import OperationalError
    return (isinstance(error, OperationalError)
            and not isinstance(_driver_error(error), sqlite3.Error))


def _driver_error(error: BaseException) -> BaseException:
    return error.orig if isinstance(error, DBAPIError) and error.orig is not None else error


def why(error: BaseException) -> str:
    """The database's error in words a user acts on: never SQLAlchemy's wrapping, which prints
    the statement and its values."""
    error = _driver_error(error)
    if not isinstance(error, sqlite3.Error):  # PostgreSQL's: libpq's first line names the cause
        return (str(error).strip().splitlines() or [type(error).__name__])[0]
    name = getattr(error, "sqlite_errorname", "") or ""
    if name == "SQLITE_FULL":
        return f"the disk is full (SQLite: {error})"
    if name.startswith("SQLITE_READONLY"):
        return f"it cannot be written: the file or its directory is read-only ({error})"
    if name.startswith("SQLITE_CANTOPEN"):
        return f"it cannot be opened: check that it is a file in a writable directory ({error})"
    if name == "SQLITE_NOTADB":
        return "it is not an SQLite database (another kind of file?)"
    if name.startswith("SQLITE_CORRUPT"):
        return f"the file is corrupt ({error})"
    if name.startswith("SQLITE_BUSY") or name.startswith("SQLITE_LOCKED"):
        return f"another process holds it locked ({error})"
    return str(error)


# A file system with less than this free is full to SQLite. Not a few pages: by the time the
# error is read, SQLite may have given back what its failed write held (its WAL's new frames,
# its shared-memory index), and a 64 MB disk filled to the byte then shows a few hundred KB free
# (the e2e full-disk test, under load).
FULL_BELOW_BYTES = 1024 * 1024


def store_error(path: Path | ServerUrl, error: BaseException) -> StoreError:
    """The error as one line about the store at `path`: what SQLite's own words hide is told
    from the file system — a store deleted while in use, a disk I/O error that is a full disk
    (a reader that cannot make its WAL index)."""
    away = unreachable(error)
    error = _driver_error(error)
    if isinstance(path, ServerUrl) or not isinstance(error, sqlite3.Error):
        return StoreError(path, why(error), unreachable=away)
    name = getattr(error, "sqlite_errorname", "") or ""
    if name.startswith("SQLITE_CANTOPEN") and not path.exists() and path.parent.is_dir():
        return StoreError(path, "it is gone: the file was deleted or moved while in use")
    if name.startswith("SQLITE_CANTOPEN") and path.exists() and read_only(path):
        return StoreError(path, "it cannot be written: the file or its directory is read-only"
                                f" ({error})")
    full = name == "SQLITE_FULL" or (name.startswith("SQLITE_IOERR") and _disk_full(path))
    return StoreError(path, f"the disk is full (SQLite: {error})" if full else why(error),
                      full=full)


def read_only(path: Path) -> bool:
    """The file or its folder cannot be written: permissions, or read-only media (which
    os.access does not tell root)."""
    try:
        media = os.statvfs(path).f_flag & os.ST_RDONLY
    except OSError:
        media = False
    return bool(media) or not os.access(path, os.W_OK) or not os.access(path.parent, os.W_OK)


def _disk_full(path: Path) -> bool:
    try:
        return shutil.disk_usage(path.parent).free < FULL_BELOW_BYTES
    except OSError:
        return False
