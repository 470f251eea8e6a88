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
    part = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, suffix=".part") as file:
            part = file.name
            file.write(data)
        os.replace(part, path)
    except OSError:
        if part is not None:  # half written (a full disk): not left behind
            Path(part).unlink(missing_ok=True)
        return False
    return True
