"""The store's rows, as readers get them and writers give them: read by name, never by position
or string key. Times are seconds since the run's start; memory is in bytes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

from anatomy.store.facts import Origin, RunFacts, RunSource, TrainingSummary
from anatomy.store.liveness import Recorder
from anatomy.vocabulary import Backend, Edge, Level, MemoryApi, Phase, Status

# Every stretch a run may mark, and every status (vocabulary.py).
SPANS = tuple(Phase)
STATUSES = tuple(Status)


# A run on several hosts stores each host's devices under a number of the run's own:
# the first host's GPU i as i (its NVML index, as a run of one host stores it), the k-th host's
# as k × HOST_STRIDE + i (a host has far fewer GPUs). The samples, their buckets and the device
# panel key by that number as they always did; the run's facts name its hosts.
HOST_STRIDE = 1000


def device_key(host: int, gpu: int) -> int:
    """The number a run stores device `gpu` (NVML index; 0 for the RSS) of its `host`-th host
    under."""
    return host * HOST_STRIDE + gpu


# A CPU run measures RSS, not a device: its whole process tree under 0, and where several ranks
# train, each rank's own processes (the rank and its data loaders) under 1 + its local rank.
def rank_series(local_rank: int) -> int:
    """The number a CPU rank's own RSS is stored under on its host (before `device_key`)."""
    return 1 + local_rank


def series_rank(key: int) -> int | None:
    """The local rank whose own RSS a CPU run's sample key holds; None for the whole tree."""
    index = key % HOST_STRIDE
    return index - 1 if index else None


class Sample(NamedTuple):
    """One reading of one device: the sampler sends these, the store keeps them as they are."""
    t: float  # seconds since the run's start
    gpu: int  # the device's NVML index (0 for a CPU run's RSS); on a later host, `device_key`
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
    # The longest sequence its batches held (a user's Trainer pads each batch to its own
    # longest): what the step's activations were made at. None where it was not read.
    seq_len: int | None = None


class Message(NamedTuple):
    t: float
    level: Level | str  # anatomy's own, or the level a user's `run.note` named
    text: str


class HostStatus(NamedTuple):
    """The machine at one moment, as nvitop's host panel shows it."""
    t: float
    cpu_percent: float | None  # of all cores together, since the reading before
    ram_used: int  # bytes: total − available
    ram_total: int
    host: int = 0  # of a run across hosts, its place (its GPUs stored as device_key(host, i))


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
    edge: Edge
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
    status: Status
    preset: str
    options: dict[str, Any]  # the RunOptions it ran with, as stored (a user's run: those it reported)
    environment: RunFacts
    backend: Backend
    memory_api: MemoryApi | None
    gpu: int
    summary: TrainingSummary
    error: str | None
    samples_sent: int | None
    tags: tuple[str, ...]
    sweep: str | None
    worker_pid: int | None
    source: RunSource = field(default_factory=RunSource)  # who started it
    origin: Origin | None = None  # where an imported run came from; None: recorded here
    # The process that records it and writes its ending (store/liveness.py); None for an
    # imported run or one stored before recorders were kept.
    recorder: Recorder | None = None

    def to_dict(self) -> dict[str, Any]:
        """The row as an export carries it: every column, the facts as they are stored; not its
        recorder, a process of this machine that nothing elsewhere can use."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "recorder"}
        out.update(environment=self.environment.to_dict(), summary=self.summary.to_dict(),
                   source=self.source.to_dict(), tags=list(self.tags),
                   origin=None if self.origin is None else self.origin.to_dict())
        return out


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
    status: Status
    error: str | None
    pid: int | None
