"""Why a store cannot be used, in one line a user acts on."""

from __future__ import annotations

import sqlite3
from pathlib import Path


class StoreError(RuntimeError):
    """The store cannot be used: one line that names its path and the reason. `full` when the
    disk (or the store's size limit) is full."""

    def __init__(self, path: Path, reason: str, full: bool = False):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason, self.full = path, reason, full


class StoreMissing(StoreError):
    """A read-only open of a store that does not exist (yet): nothing recorded there."""


def why(error: sqlite3.Error) -> str:
    """SQLite's error in words a user acts on."""
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


def store_error(path: Path, error: sqlite3.Error) -> StoreError:
    return StoreError(path, why(error), full=getattr(error, "sqlite_errorname", "") == "SQLITE_FULL")
