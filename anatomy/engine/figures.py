"""A run's figures as they come, for the user's own channels: each device's latest sample, its
peak since a reader last read, each phase's memory at its end, the steps, the samples stored.

The collector hands it every message it handles, in the process that records the run
(engine/collector.py); the Trainer callback's logs and `Run.metrics()` read it through a
`Reader` of their own, the /metrics endpoint (engine/prometheus.py) as it is scraped. The names a
tracker sees are analysis/trackers.py's, which the TensorBoard export of a stored run uses too.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from anatomy.analysis.trackers import (
    PREDICTED_PEAK,
    components_in_mib,
    device_label,
    in_mib,
    peak_name,
    phase_name,
)
from anatomy.engine import protocol
from anatomy.store import Components

# A phase's memory is the last sample at its end; its end mark and the samples after it come on
# two queues, so the samples are kept a while (2 s at 2 kHz) until the mark is matched.
KEPT_SAMPLES = 4096


@dataclass(frozen=True)
class DeviceNow:
    """A device as its last sample saw it: its label (`gpu0`, `cpu`), the rank training on it
    and that rank's open phase (None where unknown)."""
    label: str
    used: int
    peak: int  # the run's highest sample so far
    rank: int | None
    phase: str | None


@dataclass(frozen=True)
class PhaseStart:
    """A phase's latest start, on the wall clock (Grafana's annotations)."""
    rank: int
    name: str
    at: float  # seconds since the epoch


@dataclass
class _Reading:
    """What one reader has not read yet."""
    peaks: dict[int, int] = field(default_factory=dict)
    phases_read: int = 0
    components_read: bool = False


class Figures:
    """One run's live figures. `devices`: the NVML indices the sampler reads, in the order the
    training's processes number them (a CPU run's RSS comes as device 0); `t0`: the run's start
    on the monotonic clock."""

    def __init__(self, devices: Sequence[int], backend: str, t0: float):
        self.devices = list(devices) or [0]
        self.backend = backend
        self.wall_offset = time.time() - time.monotonic() + t0  # run clock -> epoch seconds
        self.run_id: int | None = None
        self.predicted_peak: int | None = None  # bytes, set by a front that has a prediction
        self.stored = 0  # samples written into the store
        self.failed: str | None = None  # why the figures stopped following the run, if they did
        self._lock = threading.Lock()
        self._latest: dict[int, int] = {}
        self._peak: dict[int, int] = {}
        self._recent: deque[tuple[float, int]] = deque(maxlen=KEPT_SAMPLES)  # the run's device
        self._pending: list[tuple[str, float]] = []  # phases ended, their sample not come yet
        self._phase_memory: list[tuple[str, float, int]] = []  # name, end, bytes: as they ended
        self._open: dict[int, str] = {}  # rank -> its open phase
        self._starts: dict[tuple[int, str], PhaseStart] = {}
        self._unmarked: PhaseStart | None = None  # the run's phase until its training marks one
        self._positions: dict[int, int] = {}  # a device's position -> the rank training on it
        self._steps: dict[int, int] = {}
        self._components: Components | None = None
        self._readings: list[_Reading] = []

    def label(self, device: int) -> str:
        return device_label(self.backend, device)

    # --- fed by the collector (its thread) ---
    def see(self, message) -> None:
        if self.failed is not None:
            return
        try:
            self._see(message)
        except Exception as error:  # noqa: BLE001 - the store is the record: a live figure
            self.failed = f"{type(error).__name__}: {error}"  # that fails never ends the run

    def _see(self, message) -> None:
        with self._lock:
            match message:
                case protocol.Samples(samples=samples):
                    self._sampled(samples)
                case protocol.Phase(mark=mark, source=source):
                    self._marked(mark, source)
                case protocol.StepReport(step=step, source=source):
                    self._steps[source.rank or 0] = step.step
                case protocol.ComponentsMeasured(components=components, source=source):
                    if not source.rank and self._components is None:
                        self._components = components
                case protocol.Predicted(peak=peak):
                    self.predicted_peak = peak

    def _sampled(self, samples) -> None:
        own = self.devices[0]
        for sample in samples:
            self._latest[sample.gpu] = sample.used
            if sample.used > self._peak.get(sample.gpu, -1):
                self._peak[sample.gpu] = sample.used
            for reading in self._readings:
                if sample.used > reading.peaks.get(sample.gpu, -1):
                    reading.peaks[sample.gpu] = sample.used
            if sample.gpu == own:
                self._recent.append((sample.t, sample.used))
        self._match_ends()

    def _marked(self, mark, source: protocol.Source) -> None:
        self._unmarked = None  # the training marks its own phases
        rank = source.rank or 0
        self._positions.setdefault(source.device or 0, rank)
        if mark.edge == "start":
            self._open[rank] = mark.name
            self._starts[(rank, mark.name)] = PhaseStart(rank, mark.name,
                                                         self.wall_offset + mark.t)
            return
        if self._open.get(rank) == mark.name:
            del self._open[rank]
        if rank == 0:  # the run's phases are rank 0's, as every reader's are
            self._pending.append((mark.name, mark.t))
            self._match_ends()

    def _match_ends(self) -> None:
        """Each ended phase's memory, once a sample at or after its end has come: the last
        sample at its end (`report`'s figure)."""
        if not self._pending or not self._recent or self._recent[-1][0] < self._pending[0][1]:
            return
        waiting = []
        for name, end in self._pending:
            if self._recent[-1][0] < end:
                waiting.append((name, end))
                continue
            at_end = next((used for t, used in reversed(self._recent) if t <= end), None)
            if at_end is not None:
                self._phase_memory.append((name, end, at_end))
        self._pending = waiting

    def until_marked(self, name: str, t: float) -> None:
        """The phase the run is in from `t` (the run's clock) until its training marks one: a
        watched command's one phase, whose mark is written only once the command has ended
        without marking any (engine/watch.py), and which /metrics serves while it runs."""
        with self._lock:
            if not self._starts:
                self._unmarked = PhaseStart(0, name, self.wall_offset + t)

    def stored_samples(self, count: int) -> None:
        with self._lock:
            self.stored += count

    # --- read ---
    def reader(self) -> Reader:
        """A reader of its own: what it takes, another reader still gets. Its first `take()`
        gives each device's peak since the run began."""
        with self._lock:
            reading = _Reading(peaks=dict(self._peak))
            self._readings.append(reading)
            return Reader(self, reading)

    def _take(self, reading: _Reading) -> dict[str, float]:
        with self._lock:
            taken = {peak_name(self.label(device)): in_mib(peak)
                     for device, peak in sorted(reading.peaks.items())}
            reading.peaks.clear()
            for name, _, used in self._phase_memory[reading.phases_read:]:
                taken[phase_name(name)] = in_mib(used)
            reading.phases_read = len(self._phase_memory)
            if self._components is not None and not reading.components_read:
                reading.components_read = True
                taken.update(components_in_mib(self._components))
            if self.predicted_peak is not None:
                taken[PREDICTED_PEAK] = in_mib(self.predicted_peak)
            return taken

    def devices_now(self) -> list[DeviceNow]:
        with self._lock:
            found = []
            for position, device in enumerate(self.devices):
                if device not in self._latest:
                    continue
                rank = self._positions.get(position)
                if rank is None and len(self.devices) == 1 and self._open:
                    rank = min(self._open)
                phase = None if rank is None else self._open.get(rank)
                if phase is None and self._unmarked is not None:
                    phase = self._unmarked.name
                found.append(DeviceNow(self.label(device), self._latest[device],
                                       self._peak[device], rank, phase))
            return found

    def phase_memory(self) -> list[tuple[str, int]]:
        """Each phase's memory as it ended (bytes), the latest occurrence of a name."""
        with self._lock:
            return list({name: used for name, _, used in self._phase_memory}.items())

    def phase_starts(self) -> list[PhaseStart]:
        with self._lock:
            unmarked = [] if self._unmarked is None else [self._unmarked]
            return [*self._starts.values(), *unmarked]

    def steps(self) -> dict[int, int]:
        """Each rank's last step."""
        with self._lock:
            return dict(self._steps)

    def wait_for_phase(self, name: str, end: float, timeout: float) -> bool:
        """Whether the memory of `name` as it ended at `end` (the run's clock) is known, waiting
        up to `timeout` seconds: its mark and the sampler's next tick are on their way."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if any(ended == name and t >= end for ended, t, _ in self._phase_memory):
                    return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)


class Reader:
    """One consumer's view of a run's figures (the callback's logs, the script's `run.metrics()`):
    `take()` gives what came since it last took."""

    def __init__(self, figures: Figures, reading: _Reading):
        self.figures, self._reading = figures, reading

    def take(self) -> dict[str, float]:
        """The figures since the last `take()`, by their tracker names: each device's peak, the
        phases that ended, the components once measured, the predicted peak where known."""
        return self.figures._take(self._reading)


class Answers:
    """The watch's side of the figures of a process it runs (one per link, engine/watch.py): a
    reader of its own for each of that process's readers, so that the callback's logs and
    `run.metrics()` under `anatomy watch` take what they would take where the process records
    its run itself."""

    def __init__(self, figures: Figures):
        self.figures = figures
        self._readers: dict[int, Reader] = {}

    def answer(self, asked: protocol.FiguresAsked) -> protocol.FiguresTaken:
        if asked.phase is not None:
            self.figures.wait_for_phase(asked.phase, asked.end, asked.wait)
        taken: dict[str, float] = {}
        if asked.reader is not None:
            reader = self._readers.get(asked.reader)
            if reader is None:
                reader = self._readers[asked.reader] = self.figures.reader()
            taken = reader.take()
        return protocol.FiguresTaken(asked.asked, taken)


class LinkedFigures:
    """A watched process's view of its run's figures, which the watch's recording holds: what
    `Figures` gives the callback and `run.metrics()`, each read asked over the link the process
    marks its phases through (`ask`: engine/attach.py; {} where the watch did not answer)."""

    def __init__(self, ask: Callable[[protocol.FiguresAsked], dict[str, float]]):
        self._ask = ask
        self._readers = 0

    def reader(self) -> LinkedReader:
        self._readers += 1
        return LinkedReader(self._ask, self._readers)

    def wait_for_phase(self, name: str, end: float, timeout: float) -> None:
        self._ask(protocol.FiguresAsked(None, name, end, timeout))


class LinkedReader:
    """`Reader` for a watched process: its `take()` is the watch's reader's of the same number."""

    def __init__(self, ask: Callable[[protocol.FiguresAsked], dict[str, float]], number: int):
        self._ask, self.number = ask, number

    def take(self) -> dict[str, float]:
        return self._ask(protocol.FiguresAsked(self.number))
