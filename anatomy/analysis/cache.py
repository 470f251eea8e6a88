"""Where anatomy keeps what it can make again but would rather not: `$ANATOMY_CACHE`, else the
user's cache directory (`$XDG_CACHE_HOME/anatomy` or ~/.cache/anatomy); "off" turns it off.
Every file in it is made again when it is missing, unreadable or stale."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

CACHE_ENV = "ANATOMY_CACHE"


def cache_dir() -> Path | None:
    chosen = os.environ.get(CACHE_ENV, "")
    if chosen.lower() == "off":
        return None
    if chosen:
        return Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(base) if os.path.isabs(base) else Path.home() / ".cache") / "anatomy"


def write_atomically(path: Path, data: bytes) -> bool:
    """`data` into `path` whole or not at all (a reader never sees half a file); False where it
    could not be written — a cache that cannot be written is a slower start, not a failure."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, suffix=".part") as file:
            file.write(data)
        os.replace(file.name, path)
    except OSError:
        return False
    return True
