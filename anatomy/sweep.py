"""Sweeps: one base configuration, one or two options varied, the runs one after another.

`plan` checks every planned option set before anything starts. A `Sweep` runs the plan through a
RunManager (in a thread of its own for the dashboard, or in the caller's for the CLI); each run is
a normal run whose `sweep` column holds the sweep's key. The sweep's own row (status, planned and
skipped counts) is in the store, so a page shows progress by reading the store only, and `grid`
turns a sweep's runs into the table of peak memory, speed and the largest batch size that fit.

Batch sizes form a ladder: they run smallest first, and at a ladder's first out-of-memory run its
larger batch sizes are skipped (they would not fit either). With `until_oom`, a ladder that runs
out of planned sizes keeps doubling until a run is out of memory.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from anatomy.options import FIELDS, RunOptions, validate
from anatomy.runs import InvalidOptions, RunManager, machine
from anatomy.store import Store, report

LADDER = "batch_size"
MAX_VARIED = 2
FLAG_WORDS = {"on": True, "true": True, "yes": True, "1": True,
              "off": False, "false": False, "no": False, "0": False}


@dataclass(frozen=True)
class SweepEvent:
    """What a sweep tells its listener: a run started or ended, or a planned run was skipped."""
    kind: str  # "start", "end" or "skip"
    index: int  # 1-based among the runs started (for "skip": the runs started so far)
    planned: int
    values: dict[str, Any]  # the varied options' values of this run
    run_id: int | None = None
    status: str | None = None


def parse_value(name: str, text: str) -> Any:
    """One value of an option as typed (`--vary`): flags take on/off/true/false, numbers whole
    numbers, choices their names (checked against their range by `plan`)."""
    field = FIELDS[name]
    text = text.strip()
    dashed = name.replace("_", "-")
    if field.choices is not None:
        return text
    if field.low is None:
        if text.lower() not in FLAG_WORDS:
            raise ValueError(f"{dashed}: {text!r} is not on, off, true or false")
        return FLAG_WORDS[text.lower()]
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{dashed}: {text!r} is not a whole number") from None


def parse_vary(specs: list[str]) -> dict[str, list]:
    """`["batch-size=1,2,4", "precision=fp32,bf16"]` -> {"batch_size": [1, 2, 4], ...}.

    InvalidOptions with a message per wrong spec."""
    vary: dict[str, list] = {}
    errors: dict[str, str] = {}
    for spec in specs:
        option, equals, values = spec.partition("=")
        name = option.strip().replace("-", "_")
        if not equals or not values.strip():
            errors[spec] = f"--vary {spec}: write OPTION=V1,V2,… (e.g. batch-size=1,2,4)"
        elif name not in FIELDS:
            errors[spec] = (f"--vary {spec}: {option.strip()!r} is not an option (one of "
                            f"{', '.join(n.replace('_', '-') for n in FIELDS)})")
        elif name in vary:
            errors[spec] = f"--vary {spec}: {option.strip()} is varied twice"
        else:
            try:
                vary[name] = [parse_value(name, v) for v in values.split(",") if v.strip()]
            except ValueError as error:
                errors[spec] = str(error)
    if errors:
        raise InvalidOptions(errors)
    return vary


def _ordered(vary: dict[str, list]) -> dict[str, list]:
    """Each option's values once; batch sizes smallest first (a ladder climbs); the ladder's
    option last, so each value of the other option gets a whole ladder."""
    out = {name: list(dict.fromkeys(values)) for name, values in vary.items()}
    if LADDER in out:
        sizes = out.pop(LADDER)
        out[LADDER] = sorted(sizes) if all(type(v) is int for v in sizes) else sizes
    return out


def plan(base: RunOptions, vary: dict[str, list], until_oom: bool = False,
         gpu_count: int | None = None) -> list[RunOptions]:
    """Every run of the sweep (the cartesian product of the varied values), each checked as a run
    would be: InvalidOptions, with one message per wrong option, before anything starts."""
    errors: dict[str, str] = {}
    if not vary:
        errors["vary"] = "vary: choose one or two options to vary"
    elif len(vary) > MAX_VARIED:
        errors["vary"] = f"vary: at most {MAX_VARIED} options, got {len(vary)}: {', '.join(vary)}"
    for name, values in vary.items():
        if name not in FIELDS:
            errors[name] = f"{name}: not an option (one of {', '.join(FIELDS)})"
        elif not values:
            errors[name] = f"{name}: no values to try"
    if until_oom and LADDER not in vary:
        errors["until_oom"] = "until_oom: needs batch_size among the varied options (its ladder)"
    if errors:
        raise InvalidOptions(errors)
    if gpu_count is None:
        gpu_count = machine()["gpu_count"]
    vary = _ordered(vary)
    planned = [replace(base, **dict(zip(vary, values)))
               for values in itertools.product(*vary.values())]
    for options in planned:
        for name, message in validate(options, gpu_count).items():
            errors.setdefault(name, message)
    if errors:
        raise InvalidOptions(errors)
    return planned


def _ladders(planned: list[RunOptions]) -> list[list[RunOptions]]:
    """Consecutive runs that differ only in batch size (one run each when it is not varied)."""
    return [list(group) for _, group in
            itertools.groupby(planned, key=lambda options: replace(options, batch_size=1))]


class Sweep:
    """A planned sweep, run through `manager` one run after another.

    `start()` runs it in a thread of its own (the dashboard keeps the object in a cached
    resource); `run()` in the caller's. `stop()` stops the current run and drops the rest."""

    def __init__(self, manager: RunManager, base: RunOptions, vary: dict[str, list],
                 until_oom: bool = False, name: str | None = None, gpu_count: int | None = None,
                 on_event: Callable[[SweepEvent], None] | None = None):
        self.planned = plan(base, vary, until_oom, gpu_count)
        self.manager = manager
        self.store: Store = manager.store
        self.base = base
        self.vary = _ordered(vary)
        self.until_oom = until_oom
        self.name = name or f"{' × '.join(self.vary)} on {base.preset}"
        self.on_event = on_event
        self.id: int | None = None
        self.key: str | None = None
        self.current_run: int | None = None
        self.status: str | None = None
        self.error: str | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()  # a stop never falls between a run's start and its record
        self._thread: threading.Thread | None = None
        self._started = 0
        self._skipped = 0

    # --- control ---
    def start(self) -> int:
        """Record the sweep and run it in a background thread; returns the sweep's id."""
        self._create()
        self._thread = threading.Thread(target=self._run, name=f"anatomy-sweep-{self.id}",
                                        daemon=True)
        self._thread.start()
        return self.id

    def run(self) -> str:
        """Record the sweep and run it here, to its end; returns its status."""
        self._create()
        self._run()
        return self.status

    def stop(self) -> None:
        with self._lock:
            self._stop.set()
            run_id = self.current_run
        if run_id is not None:
            self.manager.stop(run_id)

    def wait(self, timeout: float | None = None) -> str | None:
        """The status once the sweep has ended (None if it is still running after `timeout`)."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self.status

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # --- running ---
    def _create(self) -> None:
        self.id = self.store.create_sweep(self.name, self.base.to_dict(), self.vary,
                                          self.until_oom, len(self.planned))
        self.key = self.store.sweep(self.id)["key"]

    def _run(self) -> None:
        error = None
        try:
            status = self._run_ladders()
        except Exception as failure:  # noqa: BLE001 - a device taken by another run, or worse: said
            status, error = "failed", f"{type(failure).__name__}: {failure}"
        self.store.update_sweep(self.id, status=status, error=error, ended_at=time.time())
        self.error, self.status = error, status

    def _run_ladders(self) -> str:
        for ladder in _ladders(self.planned):
            for k, options in enumerate(self._climb(ladder)):
                status = self._run_one(options)
                if self._stop.is_set():
                    return "stopped"
                if status == "oom":
                    self._skip(ladder[k + 1:])
                    break
        return "completed"

    def _climb(self, ladder: list[RunOptions]) -> Iterator[RunOptions]:
        yield from ladder
        if self.until_oom:  # past the planned sizes: double until out of memory, or the range ends
            size = ladder[-1].batch_size * 2
            while size <= FIELDS[LADDER].high:
                yield replace(ladder[-1], batch_size=size)
                size *= 2

    def _values(self, options: RunOptions) -> dict[str, Any]:
        return {name: getattr(options, name) for name in self.vary}

    def _run_one(self, options: RunOptions) -> str | None:
        values = self._values(options)
        with self._lock:
            if self._stop.is_set():
                return None
            label = ", ".join(f"{k}={v}" for k, v in values.items())
            run_id = self.manager.start(options, name=f"sweep {self.id}: {label}", sweep=self.key)
            self.current_run = run_id
        self._started += 1
        self._tell("start", values, run_id)
        status = self.manager.wait(run_id)
        with self._lock:
            self.current_run = None
        self._tell("end", values, run_id, status)
        return status

    def _skip(self, rest: list[RunOptions]) -> None:
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


def grid(store: Store, sweep_id: int) -> dict:
    """A sweep's progress and results, from the store alone: its runs oldest first (the varied
    values, status, peak, speed, time) and the largest batch size that completed (per value of
    the other varied option when there are two; None when batch size is not varied)."""
    sweep = store.sweep(sweep_id)
    if sweep is None:
        raise KeyError(f"sweep {sweep_id} is not in {store.path}")
    vary = sweep["vary"]
    runs = []
    for run in reversed(store.find_runs(sweep=sweep["key"])):
        summary = report(store, run["id"])["summary"]
        runs.append({"run": run["id"], "values": {n: run["options"].get(n) for n in vary},
                     "status": run["status"], "peak_mb": summary["peak_mb"],
                     "samples_per_second": summary["samples_per_second"],
                     "time_s": summary["time_s"]})
    return {"sweep": sweep["id"], "name": sweep["name"], "status": sweep["status"],
            "error": sweep["error"], "vary": vary, "until_oom": sweep["until_oom"],
            "planned": sweep["planned"], "skipped": sweep["skipped"], "runs": runs,
            "largest_fitting": largest_fitting(vary, runs)}


def largest_fitting(vary: dict[str, list], runs: list[dict]) -> int | dict | None:
    if LADDER not in vary:
        return None
    other = next((name for name in vary if name != LADDER), None)

    def largest(rows: list[dict]) -> int | None:
        return max((r["values"][LADDER] for r in rows if r["status"] == "completed"), default=None)

    if other is None:
        return largest(runs)
    return {value: largest([r for r in runs if r["values"][other] == value])
            for value in vary[other]}
