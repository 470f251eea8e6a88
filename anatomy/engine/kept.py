"""What a run's recording could not write, kept on this host's disk until its store takes it.

A recording whose database server is away keeps its rows in memory and writes them, then the
run's ending, once the server is back (engine/collector.py, engine/recording.py). Once the
training has ended, nothing but that memory holds them: a process ended while it waits (Ctrl-C,
a scheduler's SIGTERM, a closed terminal) took them with it, and its run read "ended without a
word", its last phases and steps gone. So an ending that finds the server away puts everything
it waits to write in a file of the user's data directory, named by the store's id and the run's,
removed once it is written; the next manager on that store (`anatomy run`, `sweep`, the
dashboard: recording.py's `end_orphans`) writes a file left there, with the run's own ending.

A pickle of the rows and the run's changes as the collector holds them: read back only by this
user's anatomy, from this user's data directory (made 0700).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from anatomy.engine.collector import Outcome, Rows, RunChange
from anatomy.engine.endings import Ending
from anatomy.store import TrainingSummary, default_store


@dataclass
class Kept:
    """A run's ending and every write that waits before it, as its recording left them."""
    run_id: int
    rows: Rows
    changes: list[RunChange]
    outcome: Outcome
    ending: Ending
    stop_summary: TrainingSummary | None = None

    def words(self) -> str:
        """What it holds, as a user counts it: "1,234 samples, 12 steps, 8 phase marks"."""
        counts = ((len(self.rows.samples), "sample"), (len(self.rows.steps), "step"),
                  (len(self.rows.phases), "phase mark"), (len(self.rows.messages), "message"))
        return ", ".join(f"{n:,} {what}{'s' if n > 1 else ''}" for n, what in counts if n) \
            or "no row"


def folder() -> Path:
    """Beside the default store, in the user's data directory, whichever store the run is in."""
    return default_store().parent / "kept"


def path_of(identity: str, run_id: int) -> Path:
    return folder() / f"{identity}-run-{run_id}.pickle"


def keep(kept: Kept, identity: str) -> Path:
    """`kept` on disk, whole or not at all (a file renamed over the last): a process ended while
    it writes leaves the last whole one. OSError where it cannot be written."""
    target = path_of(identity, kept.run_id)
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=target.parent, prefix=".", suffix=".part",
                                     delete=False) as out:
        try:
            pickle.dump(kept, out, protocol=pickle.HIGHEST_PROTOCOL)
            out.flush()
            os.fsync(out.fileno())
        except BaseException:
            os.unlink(out.name)
            raise
    os.replace(out.name, target)
    return target


def forget(identity: str, run_id: int) -> None:
    with contextlib.suppress(OSError):
        path_of(identity, run_id).unlink(missing_ok=True)


def run_ids(identity: str) -> set[int]:
    """The runs of the store `identity` whose writes are kept on this host."""
    name = re.compile(rf"{re.escape(identity)}-run-(\d+)\.pickle")
    try:
        return {int(m.group(1)) for p in folder().iterdir() if (m := name.fullmatch(p.name))}
    except OSError:
        return set()


def found(identity: str, run_id: int) -> Kept | None:
    """The run's kept writes; None where there are none, or none this anatomy can read (a file
    damaged, or written by an anatomy whose rows were others': left where it is)."""
    try:
        with path_of(identity, run_id).open("rb") as source:
            kept = pickle.load(source)
    except Exception:  # noqa: BLE001 - whatever the file holds, the run is ended as before
        return None
    return kept if isinstance(kept, Kept) and kept.run_id == run_id else None
