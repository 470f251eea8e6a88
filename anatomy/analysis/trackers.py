"""anatomy's figures in a user's tracker: their names, once (the Trainer callback's logs,
`run.metrics()` and a stored run's TensorBoard export all use these), and a stored run written
as TensorBoard's event files (`anatomy export --format tensorboard`).

One prefix, MiB as every front writes them (anatomy/units.py). The README lists the names
("Your tracker and your cluster's metrics"); they are kept as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from anatomy.units import MIB
from anatomy.vocabulary import Backend, Part

PREFIX = "anatomy/"
PREDICTED_PEAK = f"{PREFIX}predicted_peak_mib"  # the prediction's peak, where one is known
LOSS = f"{PREFIX}loss"  # a stored run's loss at each step (the export: the Trainer logs its own)


def device_label(backend: str, device: int) -> str:
    """`gpu0` (NVML's index), or `cpu` (the RSS of the training's processes)."""
    return "cpu" if backend == Backend.CPU_RSS else f"gpu{device}"


def phase_name(phase: str) -> str:
    """`anatomy/training_memory_mib`: the memory of the run's device as the phase ended."""
    return f"{PREFIX}{phase}_memory_mib"


def peak_name(device: str) -> str:
    """`anatomy/peak_mib/gpu0` (NVML's used memory), `anatomy/peak_mib/cpu` (the RSS of the
    training's processes): the highest sample since the last log (the export: since the last
    step)."""
    return f"{PREFIX}peak_mib/{device}"


def component_name(part: str) -> str:
    """`anatomy/components/activations_mib`: a component the probe measured over the first
    steps."""
    return f"{PREFIX}components/{part}_mib"


def timeline_name(device: str) -> str:
    """`anatomy/memory_mib/gpu0`: every sample of a stored run (the export), at its millisecond
    since the run's start."""
    return f"{PREFIX}memory_mib/{device}"


def in_mib(value: int) -> float:
    return round(value / MIB, 3)


def components_in_mib(components) -> dict[str, float]:
    """The measured components a run has, by their names."""
    found = {}
    for part in Part:
        value = getattr(components, part.value, None)
        if isinstance(value, int):
            found[component_name(part)] = in_mib(value)
    return found


class ExportRefused(Exception):
    """The folder cannot take the export: one line."""


def event_folder(output: Path, run_id: int) -> Path:
    """Each run's events in a folder of its own, as `tensorboard --logdir OUTPUT` lists runs."""
    return output / f"run-{run_id}"


def check_event_folders(output: Path, run_ids: Sequence[int]) -> None:
    """ExportRefused where the export cannot be written, before any work: a run exported there
    already would have its scalars twice (TensorBoard reads every event file of a folder)."""
    if output.exists() and not output.is_dir():
        raise ExportRefused(f"cannot write {output}: it is a file (the TensorBoard export writes "
                            "a folder)")
    if not output.exists() and not output.absolute().parent.is_dir():
        raise ExportRefused(f"cannot write {output}: its directory {output.absolute().parent} "
                            "does not exist")
    for run_id in run_ids:
        folder = event_folder(output, run_id)
        if folder.exists() and any(folder.iterdir()):
            raise ExportRefused(f"cannot write {folder}: it holds an export already (TensorBoard "
                                "would read both); remove it or choose another --output")


class _Events:
    """One run's event file: scalars stamped with the run's wall clock."""

    def __init__(self, folder: Path, created_at: float):
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.writer, self.created_at = EventFileWriter(str(folder)), created_at

    def scalar(self, tag: str, value: float, step: int, t: float) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        self.writer.add_event(Event(wall_time=self.created_at + t, step=step, summary=Summary(
            value=[Summary.Value(tag=tag, simple_value=value)])))

    def close(self) -> None:
        self.writer.close()


def write_tensorboard(store, run_ids: Sequence[int], output: Path) -> list[Path]:
    """Each run's figures as TensorBoard's scalars (the folders written): every sample on a
    millisecond axis, and at each training step its peak per device and its loss, each phase's
    memory at the step it ended by, the components measured. KeyError for a run not there."""
    from anatomy.analysis.report import reports

    written = []
    for rep in reports(store, run_ids):
        folder = event_folder(output, rep.id)
        folder.mkdir(parents=True, exist_ok=True)
        events = _Events(folder, rep.created_at)
        samples = sorted(store.samples(rep.id), key=lambda s: s.t)
        steps = sorted(store.steps(rep.id), key=lambda s: s.t)
        for sample in samples:
            events.scalar(timeline_name(device_label(rep.backend, sample.gpu)),
                          in_mib(sample.used), round(sample.t * 1000), sample.t)
        index = 0
        for step in steps:  # each step's peak: the samples since the step before it
            peaks: dict[int, int] = {}
            while index < len(samples) and samples[index].t <= step.t:
                sample = samples[index]
                peaks[sample.gpu] = max(peaks.get(sample.gpu, 0), sample.used)
                index += 1
            for device, peak in sorted(peaks.items()):
                events.scalar(peak_name(device_label(rep.backend, device)), in_mib(peak),
                              step.step, step.t)
            if step.loss is not None:
                events.scalar(LOSS, step.loss, step.step, step.t)
        for phase in rep.phases:
            if phase.end_s is not None and phase.memory_bytes is not None:
                by = sum(1 for step in steps if step.t <= phase.end_s)
                events.scalar(phase_name(phase.name), in_mib(phase.memory_bytes),
                              steps[by - 1].step if by else 0, phase.end_s)
        if rep.components is not None:
            last = steps[-1] if steps else None
            for name, value in components_in_mib(rep.components).items():
                events.scalar(name, value, last.step if last else 0, last.t if last else 0.0)
        events.close()
        written.append(folder)
    return written
