"""The store's rows, as readers get them and writers give them: read by name, never by position
or string key. Times are seconds since the run's start; memory is in bytes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

PHASES = ("baseline", "kernel", "weights", "training")
# A stretch marked like a phase but outside the walkthrough's four: torch.profiler's steps after
# training. The run's peak leaves it out (the training never held that memory).
PROFILING = "profiling"
PROCESS = "process"  # the one phase of a watched command that marks none of its own
SPANS = (*PHASES, PROFILING, PROCESS)
STATUSES = ("running", "completed", "failed", "oom", "stopped")


class Sample(NamedTuple):
    """One reading of one device: the sampler sends these, the store keeps them as they are."""
    t: float  # seconds since the run's start
    gpu: int  # the device's NVML index (0 for a CPU run's RSS)
    used: int  # bytes
    reserved: int | None  # NVML v2's driver reservation
    total: int | None
    util: int | None  # percent


class Step(NamedTuple):
    t: float
    step: int
    total: int | None
    loss: float | None
    allocated: int | None  # torch's allocator at the step's end (GPU runs)
    reserved: int | None
    rank: int = 0  # the training process that took it (0 for a single process)


class Message(NamedTuple):
    t: float
    level: str
    text: str


class HostStatus(NamedTuple):
    """The machine at one moment, as nvitop's host panel shows it."""
    t: float
    cpu_percent: float | None  # of all cores together, since the reading before
    ram_used: int  # bytes: total − available
    ram_total: int


class GpuStatus(NamedTuple):
    """One GPU at one moment, beside its memory (which the samples hold): None where the driver
    does not support the figure."""
    t: float
    gpu: int  # NVML index
    util: int | None  # percent of the time a kernel ran
    power_w: float | None
    power_limit_w: float | None
    temperature_c: int | None


class GpuProcess(NamedTuple):
    """A process with a context on a GPU at one moment: this run's, or anyone else's."""
    t: float
    gpu: int
    pid: int
    name: str | None  # None: not visible from here (another container)
    used: int | None  # bytes; None where the driver does not say


class PhaseMark(NamedTuple):
    """A phase's start or end as it happens: the collector writes these in arrival order."""
    edge: str  # "start" or "end"
    name: str
    t: float
    rank: int = 0  # the training process it is about (0 for a single process)


class PhaseSpan(NamedTuple):
    """A phase as stored: end_s is None while it lasts."""
    name: str
    start_s: float
    end_s: float | None
    rank: int = 0


@dataclass(frozen=True)
class RunRow:
    """A run's own row: what it is and how it ended, without its samples."""
    id: int
    name: str | None
    created_at: float
    ended_at: float | None
    status: str
    preset: str
    options: dict[str, Any]
    environment: dict[str, Any]
    backend: str  # "nvml" or "cpu-rss"
    memory_api: str | None
    gpu: int
    summary: dict[str, Any]
    error: str | None
    samples_sent: int | None
    tags: tuple[str, ...]
    sweep: str | None
    worker_pid: int | None
    # Who started it: {} for anatomy's own worker (`anatomy run`, the dashboard, a sweep);
    # {"kind": "script", "script": …} for a user's script (the callback or the phase API);
    # {"kind": "watch", "command": […]} for `anatomy watch -- COMMAND`; with "host", "cwd".
    source: dict[str, Any] = field(default_factory=dict)
    # Where an imported run came from: {"store": the exporting store's id, "host", "path", "run":
    # its id there, "created_at"}; None for a run recorded here.
    origin: dict[str, Any] | None = None


@dataclass(frozen=True)
class RunRecord:
    """A whole run as an import brings it: its row and everything it recorded."""
    run: RunRow
    samples: Sequence[Sample]
    phases: Sequence[PhaseSpan]
    steps: Sequence[Step]
    messages: Sequence[Message]


@dataclass(frozen=True)
class SweepRow:
    id: int
    key: str
    name: str | None
    created_at: float
    ended_at: float | None
    base: dict[str, Any]
    vary: dict[str, list]
    until_oom: bool
    planned: int
    skipped: int
    status: str
    error: str | None
    pid: int | None
