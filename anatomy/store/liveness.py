"""Whether a run the store holds as running is still being recorded — the one answer every
reader (the CLI's runs, show and export, the pages) and the next manager share.

A run is recorded by one process, its *recorder*: the CLI or the dashboard's server (anatomy's own
runs), `anatomy watch`, or the user's script (the phase API, the Trainer callback). The recorder
writes how the run ended; once it is gone nobody will. The run's row keeps the recorder's pid, its
host and its start time (a pid alone may come back as another process), so a reader on the same
host can tell without writing anything: such a run is shown ended, "ended without a word (its
processes are gone)", at once; the next manager to start writes that ending into the store.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

import psutil

from anatomy.vocabulary import Status

ENDED_WITHOUT_A_WORD = "ended without a word (its processes are gone); what it recorded is kept"
START_TOLERANCE_SECONDS = 1.0  # psutil's start times of one process agree well within this


@dataclass(frozen=True)
class Recorder:
    """The process that records a run and writes its ending."""
    pid: int
    started: float  # its start time, seconds since the epoch (psutil's create_time)
    host: str

    @classmethod
    def here(cls) -> Recorder:
        """This process."""
        return cls(os.getpid(), psutil.Process().create_time(), socket.gethostname())

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "started": self.started, "host": self.host}

    @classmethod
    def from_dict(cls, value: Any) -> Recorder | None:
        """A stored recorder; None for what is not one (a row written before recorders were)."""
        if not isinstance(value, dict):
            return None
        pid, started, host = value.get("pid"), value.get("started"), value.get("host")
        if not (isinstance(pid, int) and isinstance(started, (int, float))
                and isinstance(host, str)):
            return None
        return cls(pid, float(started), host)

    def alive(self) -> bool:
        """Whether this process still runs. Another host's cannot be seen from here: it is taken
        as alive (the store may be shared; only its own host can tell)."""
        if self.host != socket.gethostname():
            return True
        return _alive(self.pid, self.started)


def _alive(pid: int | None, started: float | None = None) -> bool:
    if not pid:
        return False
    try:
        process = psutil.Process(pid)
        if started is not None and abs(process.create_time() - started) > START_TOLERANCE_SECONDS:
            return False  # the pid came back as another process
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class _Run(Protocol):
    """What liveness reads of a run's row (store/rows.py's RunRow, which names its recorder)."""

    status: str
    origin: object
    recorder: Recorder | None
    worker_pid: int | None


R = TypeVar("R", bound=_Run)


def is_alive(run: _Run) -> bool:
    """Whether `run`, running as stored, is being recorded still: its recorder lives. A run
    stored before recorders were kept has only its training process's pid to go by."""
    if run.status != Status.RUNNING or run.origin is not None:
        return False
    if run.recorder is not None:
        return run.recorder.alive()
    return _alive(run.worker_pid)


def as_seen(run: R) -> R:
    """The run as readers show it: a run stored as running whose processes are gone has ended (failed,
    without a word). The store is not touched."""
    if run.status == Status.RUNNING and not is_alive(run):
        return replace(run, status=Status.FAILED, error=ENDED_WITHOUT_A_WORD)
    return run
