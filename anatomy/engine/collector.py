"""The collector: one run's messages, from any of its senders, written into the store in batches.

The recording (engine/recording.py) drives it for every front: the manager's worker, a user's
process that records itself (the phase API, the Trainer callback), `anatomy watch`'s command.
Messages are the protocol's (engine/protocol.py); rows wait here until the next flush, so the
store sees one transaction per FLUSH_SECONDS.
"""

from __future__ import annotations

import queue as queue_module
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from anatomy.engine import protocol
from anatomy.engine.figures import Figures
from anatomy.store import (
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

FLUSH_SECONDS = 0.1


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
                 figures: Figures | None = None, say: Callable[[str], None] | None = None):
        self.store, self.run_id = store, run_id
        self.figures = figures  # the run's live figures, for its trackers and /metrics
        self.say = say or (lambda text: None)
        self.unreachable_since: float | None = None  # the database server went away: rows kept
        self.rows = Rows()
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
            case protocol.Environment(facts=facts):
                self.flush()
                self.store.merge_environment(self.run_id, facts)
            case protocol.Named(name=name):
                if self.store.run(self.run_id).name is None:  # `watch --name` comes first
                    self.store.rename_run(self.run_id, name)
            case protocol.Described(options=options, model=model):
                # Over what was said before: a script's batch size beside a Trainer's arguments
                known = self.store.run(self.run_id, as_recorded=True).options
                self.store.update_run(self.run_id, options={**known, **options},
                                      **({"preset": model} if model else {}))
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
            case protocol.Failure(source=source):
                # Of several ranks, the first to fail is the cause: the others fail after it
                # (a collective whose peer is gone) or are ended by the launcher. A rank that
                # only lost its peer gives way to any rank that says more.
                first = self.outcome.failure
                if first is None or first.source.rank == source.rank \
                        or (first.after_peer and not message.after_peer):
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

    def flush(self, keep: bool = True) -> bool:
        """Write what waits; False when the database server cannot be reached: the rows stay
        here, in order, and go in with the next flush that reaches it (said once each way).
        `keep=False` raises instead (the run's ending, retried until the server is back)."""
        self._flushed_at = time.monotonic()
        if not self.rows:
            return True
        rows = self.rows
        try:
            self.store.write(self.run_id, samples=rows.samples, phases=rows.phases,
                             steps=rows.steps, messages=rows.messages, hosts=rows.hosts,
                             gpus=rows.gpus, processes=rows.processes)
        except DatabaseError as error:
            if not (keep and unreachable(error)):
                raise
            if self.unreachable_since is None:
                self.unreachable_since = time.monotonic()
                self.say(f"the store {self.store.path} cannot be reached ({why(error)}); the"
                         " recording goes on and keeps what it records until it is back")
            return False
        if self.unreachable_since is not None:
            self.say(f"the store {self.store.path} is back after"
                     f" {time.monotonic() - self.unreachable_since:.0f} s: the"
                     f" {len(rows.samples)} samples kept meanwhile are written")
            self.unreachable_since = None
        if self.figures is not None:
            self.figures.stored_samples(len(rows.samples))
        self.rows.clear()
        return True

    def drop(self) -> None:
        """Forget the rows waiting: the store refused them (full, not unreachable), and the run's
        ending, written next, must not wait on rows that cannot go in."""
        self.rows.clear()

    def flush_when_due(self) -> None:
        if time.monotonic() - self._flushed_at >= FLUSH_SECONDS:
            self.flush()

    def summary_values(self) -> dict:
        return self.outcome.summary_values()
