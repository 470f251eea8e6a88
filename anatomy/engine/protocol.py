"""What travels on a run's queues, from the sampler and the training processes to the collector.

Every message is a typed record read by name. Each says who sent it (`Source`: the rank of the
training process and its pid; the sampler is rank None), because a run can have several
senders: the sampler, and one training process per GPU. Samples are the store's own rows, so the
collector writes them as they come.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from anatomy.store import (
    Components,
    GpuProcess,
    GpuStatus,
    HostStatus,
    Message,
    PhaseMark,
    RunFacts,
    Sample,
    Step,
    TrainingSummary,
)
from anatomy.vocabulary import Status

__all__ = ["SAMPLER", "ComponentsMeasured", "Described", "DeviceStatus", "Environment",
           "Failure", "FiguresAsked", "FiguresTaken", "GpuProcess", "GpuStatus", "HostStatus",
           "Message", "Note", "OperationsProfiled", "Phase", "PhaseMark", "Predicted", "Sample",
           "SamplerDone", "Samples", "Source", "Step", "StepReport", "Summarised", "WorkerLeft"]


@dataclass(frozen=True)
class Source:
    """Who sent a message: a training process (its rank, 0 for a single process) or the sampler
    (rank None); its pid; the device it trains on (torch's index), if any."""

    rank: int | None = 0
    pid: int = field(default_factory=os.getpid)
    device: int | None = None


SAMPLER = Source(rank=None)


@dataclass(frozen=True)
class Samples:
    """A batch of readings, every device's, in the order they were taken."""

    samples: list[Sample]
    source: Source = SAMPLER


@dataclass(frozen=True)
class DeviceStatus:
    """The device panel's reading, a few times a second: the host's CPU and RAM, each GPU's
    utilisation, power and temperature, and every process on a GPU (not only this run's)."""

    host: HostStatus
    gpus: list[GpuStatus]
    processes: list[GpuProcess]
    source: Source = SAMPLER


@dataclass(frozen=True)
class SamplerDone:
    """The sampler's last word: how many samples it sent, so the store can prove it lost none;
    and what ended it when the manager did not ("SIGTERM", "an error: …"), else None."""

    sent: int
    ended_by: str | None = None
    source: Source = SAMPLER


@dataclass(frozen=True)
class WorkerLeft:
    """The training process began to exit (killed, crashed or done) after `t`, the last time the
    sampler saw it whole: a phase it left open ends there, before its memory was given back."""

    t: float
    source: Source = SAMPLER


@dataclass(frozen=True)
class Phase:
    """A phase begins (its state is reached) or ends (the next step begins)."""

    mark: PhaseMark
    source: Source


@dataclass(frozen=True)
class StepReport:
    """An optimizer step has ended: its loss and the allocator's figures."""

    step: Step
    source: Source


@dataclass(frozen=True)
class Environment:
    """Versions, device and model facts, merged into the run's environment."""

    facts: RunFacts
    source: Source


@dataclass(frozen=True)
class Described:
    """What a user's training is, as far as it is known: run options by anatomy's names (those
    it could read), and the model's name for lists; `dropped`: options said before that no
    longer hold (a training's, where its Trainer only evaluated)."""

    options: dict[str, Any]
    model: str | None
    source: Source
    dropped: tuple[str, ...] = ()


@dataclass(frozen=True)
class Named:
    """The name a user's script gave its run (`anatomy.start(name=…)` under `anatomy watch`): the
    run's name, unless `watch --name` gave it one."""

    name: str
    source: Source


@dataclass(frozen=True)
class Note:
    """Something the user should know (shown with the run)."""

    message: Message
    source: Source


@dataclass(frozen=True)
class ComponentsMeasured:
    """Measured memory components of the first steps, in bytes (analysis/components.py)."""

    components: Components
    source: Source


@dataclass(frozen=True)
class OperationsProfiled:
    """The operation classes of profiled steps (analysis/operations.py's OperationProfile)."""

    values: dict[str, Any]
    source: Source


@dataclass(frozen=True)
class Summarised:
    """The Trainer's figures at the end: time_s, samples_per_second, steps, loss."""

    summary: TrainingSummary
    source: Source


@dataclass(frozen=True)
class Failure:
    """The training failed (Status.OOM or Status.FAILED; Status.STOPPED for a signal to the
    process), and the error. `after_peer`: a rank of several whose collective failed because
    another rank is gone — the other's end is the cause, this one is said only if nothing else
    is. `t`: when it failed, on the run's clock, which every rank of the machine shares: of
    several ranks the earliest is the cause, whichever word arrives first; None where the
    sender did not say (an anatomy of before it said), which counts after any time said."""

    status: Status
    text: str
    source: Source
    after_peer: bool = False
    t: float | None = None


@dataclass(frozen=True)
class FiguresAsked:
    """A process under `anatomy watch` asks the watch for its run's figures (the callback's logs,
    `run.metrics()`; the watch's recording has them, engine/figures.py): what its reader
    `reader` has not taken yet, after waiting up to `wait` seconds for the memory of the phase
    `phase` as it ended at `end` (the run's clock), where one is named. `asked` numbers the
    question: an answer that came too late for its question is known by it and dropped."""

    reader: int | None
    phase: str | None = None
    end: float = 0.0
    wait: float = 0.0
    asked: int = 0


@dataclass(frozen=True)
class FiguresTaken:
    """The watch's answer to `FiguresAsked` number `asked`, by the names a tracker shows."""

    asked: int
    figures: dict[str, float]


@dataclass(frozen=True)
class Predicted:
    """The prediction's peak for a user's training, once worked out beside it
    (engine/predicting.py), in bytes on the axis of the run's samples: for the run's live
    figures (the callback's logs, /metrics); the store keeps no copy (the Anatomy page predicts
    the stored run itself)."""

    peak: int
    source: Source
