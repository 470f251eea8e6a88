"""Running a sweep: its planned runs one after another through a RunManager, in a thread of its
own (the dashboard) or the caller's (the CLI). The plan and the grid are analysis/sweeps.py's.

The sweep holds its device for its whole length: a run started elsewhere meanwhile (the CLI,
another tab) is told "busy: sweep N holds this device" instead of slipping in between two runs.
Each run is a normal run whose `sweep` column holds the sweep's key; the sweep's own row (status,
planned and skipped counts) is in the store, so a page shows progress by reading the store only.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from anatomy.analysis.options import FIELDS, Checked, RunOptions
from anatomy.analysis.sweeps import LADDER, ladders, ordered, plan
from anatomy.engine.devices import machine
from anatomy.engine.locks import held_by
from anatomy.engine.manager import DeviceLock, RunManager
from anatomy.store import Store
from anatomy.vocabulary import Status


@dataclass(frozen=True)
class SweepEvent:
    """What a sweep tells its listener: a run started or ended, or a planned run was skipped."""
    kind: str  # "start", "end" or "skip"
    index: int  # 1-based among the runs started (for "skip": the runs started so far)
    planned: int
    values: dict[str, Any]  # the varied options' values of this run
    run_id: int | None = None
    status: str | None = None


class Sweep:
    """A planned sweep, run through `manager` one run after another.

    `start()` runs it in a thread of its own (the dashboard keeps the object in a cached
    resource); `run()` in the caller's. `stop()` stops the current run and drops the rest."""

    def __init__(self, manager: RunManager, base: RunOptions | Mapping[str, Any],
                 vary: dict[str, list],
                 until_oom: bool = False, name: str | None = None, gpu_count: int | None = None,
                 on_event: Callable[[SweepEvent], None] | None = None):
        if gpu_count is None:
            gpu_count = machine().gpu_count
        self.planned = plan(base, vary, until_oom, gpu_count)
        self.manager = manager
        self.store: Store = manager.store
        # What the sweep stores as its base: a varied option's base value is no run's (the form's
        # batch size of 0 beside batch sizes 1, 2, 4 varied): refused there, its default here.
        self.base = base if isinstance(base, RunOptions) else RunOptions.from_dict(base)
        self.vary = ordered(vary)
        self.until_oom = until_oom
        self.name = name or f"{' × '.join(self.vary)} on {self.base.preset}"
        self.on_event = on_event
        self.id: int | None = None
        self.key: str | None = None
        self.current_run: int | None = None
        self.status: str | None = None
        self.error: str | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()  # a stop never falls between a run's start and its record
        self._thread: threading.Thread | None = None
        self._reservations: list[DeviceLock] = []
        self._started = 0
        self._skipped = 0

    # --- control ---
    def start(self) -> int:
        """Take the devices, record the sweep and run it in a background thread; returns the
        sweep's id. DeviceBusy, with nothing recorded, when a device is taken."""
        self._create()
        self._thread = threading.Thread(target=self._run, name=f"anatomy-sweep-{self.id}",
                                        daemon=True)
        self._thread.start()
        return self.id

    def run(self) -> str:
        """Take the devices, record the sweep and run it here, to its end; returns its
        status."""
        self._create()
        self._run()
        return self.status

    def stop(self, reason: str = "stopped by the user") -> None:
        with self._lock:
            self._stop.set()
            run_id = self.current_run
        if run_id is not None:
            self.manager.stop(run_id, reason)

    def wait(self, timeout: float | None = None) -> str | None:
        """The status once the sweep has ended (None if it is still running after `timeout`)."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self.status

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # --- running ---
    def _create(self) -> None:
        holder = f"a sweep (pid {os.getpid()})"
        by_device: dict[str, Checked] = {}
        for run in self.planned:
            by_device.setdefault(self.manager.device_key(run.options), run)
        try:
            for options in by_device.values():
                self._reservations.append(self.manager.reserve(options, holder))
            self.id = self.store.create_sweep(self.name, self.base.to_dict(), self.vary,
                                              self.until_oom, len(self.planned))
            self.key = self.store.sweep(self.id).key
        except BaseException:
            self._release()
            raise
        for lock in self._reservations:
            lock.describe(held_by(f"sweep {self.id}", self.store.path, self.manager.front))

    def _release(self) -> None:
        for lock in self._reservations:
            lock.release()
        self._reservations = []

    def _run(self) -> None:
        error = None
        try:
            status = self._run_ladders()
        except Exception as failure:  # noqa: BLE001 - whatever ended it is said, not lost
            status, error = Status.FAILED, f"{type(failure).__name__}: {failure}"
        finally:
            self._release()
        self.store.update_sweep(self.id, status=status, error=error, ended_at=time.time())
        self.error, self.status = error, status

    def _run_ladders(self) -> Status:
        for ladder in ladders(self.planned):
            for k, options in enumerate(self._climb(ladder)):
                status = self._run_one(options)
                if self._stop.is_set():
                    return Status.STOPPED
                if status == Status.OOM:
                    self._skip(ladder[k + 1:])
                    break
        return Status.COMPLETED

    def _climb(self, ladder: list[Checked]) -> Iterator[Checked | RunOptions]:
        yield from ladder
        if self.until_oom:  # past the planned sizes: double until out of memory, or the range ends
            size = ladder[-1].options.batch_size * 2
            while size <= FIELDS[LADDER].high:
                yield replace(ladder[-1].options, batch_size=size)  # judged as it starts
                size *= 2

    def _values(self, run: Checked | RunOptions) -> dict[str, Any]:
        options = run.options if isinstance(run, Checked) else run
        return {name: getattr(options, name) for name in self.vary}

    def _run_one(self, options: Checked | RunOptions) -> str | None:
        values = self._values(options)
        with self._lock:
            if self._stop.is_set():
                return None
            label = ", ".join(f"{k}={v}" for k, v in values.items())
            lock = next(lock for lock in self._reservations if lock.key == self.manager.device_key(
                options.options if isinstance(options, Checked) else options))
            run_id = self.manager.start(options, name=f"sweep {self.id}: {label}", sweep=self.key,
                                        reservation=lock)
            self.current_run = run_id
        self._started += 1
        self._tell("start", values, run_id)
        status = self.manager.wait(run_id)
        with self._lock:
            self.current_run = None
        self._tell("end", values, run_id, status)
        return status

    def _skip(self, rest: list[Checked]) -> None:
        if not rest:
            return
        self._skipped += len(rest)
        self.store.update_sweep(self.id, skipped=self._skipped)
        for options in rest:
            self._tell("skip", self._values(options))

    def _tell(self, kind: str, values: dict, run_id: int | None = None,
              status: str | None = None) -> None:
        if self.on_event is not None:
            self.on_event(SweepEvent(kind, self._started, len(self.planned), values, run_id, status))
