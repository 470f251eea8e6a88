"""The collector: one run's messages, from any of its senders, written into the store in batches.

The recording (engine/recording.py) drives it for every front: the manager's worker, a user's
process that records itself (the phase API, the Trainer callback), `anatomy watch`'s command.
Messages are the protocol's (engine/protocol.py); rows wait here until the next flush, so the
store sees one transaction per FLUSH_SECONDS.

While a database server cannot be reached, every write waits here, in order (the rows, then the
changes to the run's row), and goes in once it is back, with a line each way that the run's
messages keep too. Samples are bounded (KEPT_SAMPLES): past it the oldest are thinned to each
0.1 s's lowest and highest reading of each device, as the store's buckets keep them, so the chart
and every peak survive; the device panel's readings past KEPT_READINGS are dropped, oldest first.
Phase marks, steps, messages and the run's changes are never dropped.
"""

from __future__ import annotations

import math
import queue as queue_module
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from anatomy.engine import protocol
from anatomy.engine.figures import Figures
from anatomy.store import (
    BUCKET_SECONDS,
    Components,
    DatabaseError,
    GpuProcess,
    GpuStatus,
    HostStatus,
    Message,
    PhaseMark,
    Sample,
    Step,
    Store,
    TrainingSummary,
    unreachable,
    why,
)
from anatomy.vocabulary import Level

FLUSH_SECONDS = 0.1
# What an outage of the database server may keep in memory: ~220 bytes a sample, so ~220 MB
# (2 minutes of 8 GPUs at 1 kHz, 10 of one GPU at the default 200 Hz before any thinning)
KEPT_SAMPLES = 1_000_000
KEPT_READINGS = 100_000  # the device panel's rows of each kind (a few a second)


@dataclass
class Outcome:
    """What the collector learnt besides the rows it wrote, and what whoever follows the run's
    processes learnt about them."""
    failure: protocol.Failure | None = None
    summary: TrainingSummary | None = None
    components: Components | None = None
    operations: dict | None = None
    rank_components: dict[int, Components] = field(default_factory=dict)  # ranks 1…: by rank
    samples_sent: int | None = None
    sampler_ended_by: str | None = None  # what the sampler said ended it, besides the manager
    last_step: Step | None = None
    sampler_lost: str | None = None  # the sampler ended while training went on: why and when
    worker_seen: float = 0.0  # the run's clock when the worker was last seen alive
    worker_left: float | None = None  # the sampler's last tick before the worker began to exit
    worker_ended: float | None = None  # when it was first seen gone
    # Where a phase the worker did not end (stopped, killed) ends: where the worker was last
    # known to hold its memory — the stop, or the sampler's last tick before it began to exit —
    # never at a sample of its exit, when the memory is already being given back.
    phases_end: float = 0.0

    def training_summary(self) -> TrainingSummary:
        """What the run's `summary` column keeps: the Trainer's figures, the components measured
        and the profile, where they came."""
        return replace(self.summary or TrainingSummary(), components=self.components,
                       operations=self.operations or None,
                       rank_components=self.rank_components or None)


@dataclass
class Rows:
    """Rows waiting for the next write, in arrival order."""
    samples: list[Sample] = field(default_factory=list)
    phases: list[PhaseMark] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    hosts: list[HostStatus] = field(default_factory=list)
    gpus: list[GpuStatus] = field(default_factory=list)
    processes: list[GpuProcess] = field(default_factory=list)

    def _all(self) -> tuple[list, ...]:
        return (self.samples, self.phases, self.steps, self.messages, self.hosts, self.gpus,
                self.processes)

    def __bool__(self) -> bool:
        return any(self._all())

    def clear(self) -> None:
        for rows in self._all():
            rows.clear()


@dataclass(frozen=True)
class RunValues:
    """Columns of the run's row to set (`Store.update_run`), kept in order with the others."""
    values: dict[str, Any]


# What changes the run's row rather than adding rows: applied after the rows, in arrival order.
RunChange = protocol.Environment | protocol.Named | protocol.Described | RunValues


def thinned(samples: list[Sample]) -> list[Sample]:
    """Each device's lowest and highest reading of each 0.1 s (the store's buckets), in the
    order they came: the chart and every peak as they were."""
    kept: dict[tuple[int, int], list[int]] = {}
    for index, sample in enumerate(samples):
        key = (sample.gpu, math.floor(sample.t / BUCKET_SECONDS))
        ends = kept.get(key)
        if ends is None:
            kept[key] = [index, index]
            continue
        if sample.used < samples[ends[0]].used:
            ends[0] = index
        if sample.used > samples[ends[1]].used:
            ends[1] = index
    return [samples[i] for i in sorted({i for ends in kept.values() for i in ends})]


def options_over(known: Mapping[str, Any], said: protocol.Described) -> dict[str, Any]:
    """A run's options with what a description said over them (a script's batch size beside a
    Trainer's arguments), less those it drops (the training's, where its Trainer only
    evaluated). A None said stays: a max_steps of None is a training by its epochs."""
    return {name: value for name, value in {**known, **said.options}.items()
            if name not in said.dropped or name in said.options}


def cause_before(failure: protocol.Failure, cause: protocol.Failure | None) -> bool:
    """Whether `failure` is the run's cause rather than `cause`, the one known so far. Of
    several ranks, the first to fail is the cause: the others fail after it (a collective whose
    peer is gone) or are ended by the launcher. First by the run's clock, not by arrival: each
    rank's words come on a connection (or queue) of its own, and on a loaded machine a peer's,
    ended by the launcher after it, can arrive first. A rank that only lost its peer gives way
    to any rank that says more; a rank's later word on itself replaces its earlier one."""
    if cause is None or cause.source.rank == failure.source.rank:
        return True
    if cause.after_peer != failure.after_peer:
        return cause.after_peer
    return _failed_at(failure) < _failed_at(cause)


def _failed_at(failure: protocol.Failure) -> float:
    return math.inf if failure.t is None else failure.t


@dataclass
class StepCount:
    """One rank's steps as the run numbers them. A count that starts again within the run — a
    second `train()` or a second Trainer, a resume from an earlier checkpoint, `anatomy.start()`
    again under `watch` — goes on from the rank's last step (its total with it), so that no
    step number is stored twice and every reader's "step N" is one step."""
    last: int | None = None
    offset: int = 0

    def number(self, step: Step) -> Step:
        number = step.step + self.offset
        if self.last is not None and number <= self.last:
            self.offset = self.last + 1 - step.step
            number = self.last + 1
        self.last = number
        total = None if step.total is None else step.total + self.offset
        return step._replace(step=number, total=total)


class Collector:
    def __init__(self, store: Store, run_id: int, outcome: Outcome | None = None,
                 figures: Figures | None = None, say: Callable[[str], None] | None = None,
                 clock: Callable[[], float] | None = None):
        self.store, self.run_id = store, run_id
        self.figures = figures  # the run's live figures, for its trackers and /metrics
        self.say = say or (lambda text: None)
        # The run's clock, for the messages it writes itself (default: its latest sample's time)
        self.clock = clock or (lambda: self._latest_t)
        self._latest_t = 0.0
        self.unreachable_since: float | None = None  # the database server went away: rows kept
        self.thinned = self.dropped = 0  # samples thinned, device readings dropped, in an outage
        self.rows = Rows()
        self.changes: list[RunChange] = []  # to the run's row, after the rows, in order
        self.outcome = outcome or Outcome()
        self.sampled = False  # a sample has come
        self.summary_rank: int | None = None  # the rank whose summary is the run's
        self.counts: dict[int, StepCount] = {}  # each rank's steps, as the run numbers them
        self._flushed_at = time.monotonic()

    def handle(self, message) -> None:
        if self.figures is not None:
            self.figures.see(message)
        match message:
            case protocol.Samples(samples=samples):
                self.rows.samples.extend(samples)
                self.sampled = self.sampled or bool(samples)
                if samples:
                    self._latest_t = max(self._latest_t, samples[-1].t)
            case protocol.DeviceStatus(host=host, gpus=gpus, processes=processes):
                self.rows.hosts.append(host)
                self.rows.gpus.extend(gpus)
                self.rows.processes.extend(processes)
            case protocol.Phase(mark=mark, source=source):
                self.rows.phases.append(mark._replace(rank=source.rank or 0))
            case protocol.StepReport(step=step, source=source):
                rank = source.rank or 0
                step = self.counts.setdefault(rank, StepCount()).number(step._replace(rank=rank))
                self.rows.steps.append(step)
                last = self.outcome.last_step
                if last is None or step.rank <= last.rank:  # the lowest rank's that reports
                    self.outcome.last_step = step
            case protocol.Note(message=note):
                self.rows.messages.append(note)
            case protocol.Environment() | protocol.Named() | protocol.Described():
                self.changes.append(message)
                self.flush()
            case protocol.Summarised(summary=summary, source=source):
                # The run's figures: the lowest rank's that says them (every rank says the
                # same), rank 0's unless it never reported.
                if self.summary_rank is None or (source.rank or 0) <= self.summary_rank:
                    self.outcome.summary, self.summary_rank = summary, source.rank or 0
            case protocol.ComponentsMeasured(components=components, source=source):
                # The first training's: readers pair them with the first occurrence of the
                # training phase (a second `train()` in the run measures its own again).
                if source.rank:  # another rank of several: kept beside rank 0's, by rank
                    self.outcome.rank_components.setdefault(source.rank, components)
                elif self.outcome.components is None:
                    self.outcome.components = components
            case protocol.OperationsProfiled(values=values):
                self.outcome.operations = values
            case protocol.Failure():
                if cause_before(message, self.outcome.failure):
                    self.outcome.failure = message
            case protocol.WorkerLeft(t=t):
                self.outcome.worker_left = t
            case protocol.SamplerDone(sent=sent, ended_by=ended_by):
                self.outcome.samples_sent = sent
                self.outcome.sampler_ended_by = ended_by

    def drain(self, source) -> None:
        """Every message waiting on `source` (a queue), without blocking: all of it, so a loaded
        machine never lags behind."""
        while True:
            try:
                self.handle(source.get_nowait())
            except queue_module.Empty:
                return

    def change_run(self, **values: Any) -> None:
        """Set columns of the run's row with the next write (kept through an outage)."""
        self.changes.append(RunValues(values))

    def flush(self, keep: bool = True) -> bool:
        """Write what waits; False when the database server cannot be reached: the rows and the
        run's changes stay here, in order, and go in with the next flush that reaches it (said
        once each way). `keep=False` raises instead (the run's ending, which waits for it)."""
        self._flushed_at = time.monotonic()
        if not (self.rows or self.changes):
            return True
        rows, kept = self.rows, len(self.rows.samples)
        try:
            if rows:
                self.store.write(self.run_id, samples=rows.samples, phases=rows.phases,
                                 steps=rows.steps, messages=rows.messages, hosts=rows.hosts,
                                 gpus=rows.gpus, processes=rows.processes)
                rows.clear()
            while self.changes:
                self._apply(self.changes[0])
                self.changes.pop(0)
        except DatabaseError as error:
            if not unreachable(error):
                raise
            self._kept(error)
            if not keep:
                raise
            return False
        if self.figures is not None:
            self.figures.stored_samples(kept)
        if self.unreachable_since is not None:
            self._tell(f"the store {self.store.path} is back after"
                       f" {time.monotonic() - self.unreachable_since:.0f} s: the {kept:,} samples"
                       " and every other write kept meanwhile are written")
            self.unreachable_since = None
            # Written now: where this was the run's last flush (its ending's), no next write
            # would take the line into the run's messages.
            return self.flush(keep)
        return True

    def _apply(self, change: RunChange) -> None:
        match change:
            case protocol.Environment(facts=facts):
                self.store.merge_environment(self.run_id, facts)
            case protocol.Named(name=name):
                if self.store.run(self.run_id).name is None:  # `watch --name` comes first
                    self.store.rename_run(self.run_id, name)
            case protocol.Described(model=model):
                # Over what was said before: a script's batch size beside a Trainer's arguments;
                # the options it drops go (a training's, where its Trainer only evaluated).
                known = self.store.run(self.run_id, as_recorded=True).options
                self.store.update_run(self.run_id, options=options_over(known, change),
                                      **({"preset": model} if model else {}))
            case RunValues(values=values):
                self.store.update_run(self.run_id, **values)

    def _tell(self, text: str) -> None:
        """A line for the user now, and for the run's messages with the next write."""
        self.say(text)
        self.rows.messages.append(Message(self.clock(), Level.WARNING, text))

    def _kept(self, error: DatabaseError) -> None:
        """The server is away: said once, and what waits kept within its bounds."""
        if self.unreachable_since is None:
            self.unreachable_since = time.monotonic()
            self._tell(f"the store {self.store.path} cannot be reached at {self.clock():.1f} s"
                       f" ({why(error)}); the recording goes on and keeps what it records until"
                       " it is back")
        samples = self.rows.samples
        if len(samples) > KEPT_SAMPLES:
            before = len(samples)
            samples[:] = thinned(samples)
            if len(samples) > KEPT_SAMPLES:  # thinned already: the oldest go
                del samples[:len(samples) - KEPT_SAMPLES]
            if not self.thinned:
                self._tell(f"the store has been unreachable for"
                           f" {time.monotonic() - self.unreachable_since:.0f} s: past"
                           f" {KEPT_SAMPLES:,} samples kept, they are thinned to each"
                           f" {BUCKET_SECONDS:g} s's lowest and highest reading of each device"
                           " (the chart and every peak survive; past that the oldest go)")
            self.thinned += before - len(samples)
        for readings in (self.rows.hosts, self.rows.gpus, self.rows.processes):
            if len(readings) > KEPT_READINGS:
                if not self.dropped:
                    self._tell(f"the store has been unreachable for"
                               f" {time.monotonic() - self.unreachable_since:.0f} s: the device"
                               f" panel's readings past {KEPT_READINGS:,} are dropped, oldest"
                               " first")
                self.dropped += len(readings) - KEPT_READINGS
                del readings[:len(readings) - KEPT_READINGS]

    def drop(self) -> None:
        """Forget the rows and changes waiting: the store refused them (full, not unreachable),
        and the run's ending, written next, must not wait on writes that cannot go in."""
        self.rows.clear()
        self.changes.clear()

    def flush_when_due(self) -> None:
        if time.monotonic() - self._flushed_at >= FLUSH_SECONDS:
            self.flush()

    def summary_values(self) -> dict:
        return self.outcome.summary_values()
