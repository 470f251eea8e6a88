"""What a memory figure is, in words: which NVML figure, or CPU RSS. Every screen (the pages, the
CLI, an exported chart) says it the same way."""

from __future__ import annotations

from datetime import datetime

from anatomy.analysis.report import known_option
from anatomy.store import RunRow
from anatomy.units import MIB
from anatomy.vocabulary import Backend, MemoryApi


def source(backend: Backend, memory_api: MemoryApi | None) -> str:
    if backend == Backend.CPU_RSS:
        return "CPU resident memory (RSS) of the training process tree: no GPU on this machine"
    if memory_api == MemoryApi.V2:
        return "NVML v2 'used' (driver-reserved memory excluded, as on the walkthrough's driver)"
    return "NVML v1 'used' (on R510+ drivers this includes driver-reserved memory)"


def occupied_line(memory_bytes: int | None, backend: Backend) -> str:
    """The walkthrough's line, `GPU memory occupied: N MB.` (N = bytes // 2**20, as it computes)."""
    value = "?" if memory_bytes is None else str(memory_bytes // MIB)
    what = "GPU memory" if backend == Backend.NVML else "CPU memory (RSS)"
    return f"{what} occupied: {value} MB."


def run_choice(run: RunRow) -> str:
    """A run in a picker: its id, the device it ran on (first: H200 and CPU runs must not look
    alike), its name, model, batch size, precision, how it ended and when it started."""
    started = datetime.fromtimestamp(run.created_at).strftime("%Y-%m-%d %H:%M")
    return (f"{run.id} · {run.environment.device} · {run.name + ' · ' if run.name else ''}"
            f"{run.preset}, batch {known_option(run, 'batch_size')}, "
            f"{known_option(run, 'precision')} — {run.status} ({started})")


def axis_title(backend: Backend) -> str:
    return "GPU memory used (MiB)" if backend == Backend.NVML else "CPU memory, RSS (MiB)"


def missing_run(wanted: str, shown: int | None, filtered: bool = False) -> str:
    """What a page says when the URL asks for a run it cannot show (`shown` is the one it shows
    instead, if any); `filtered`: the run exists but the page's filters leave it out."""
    if filtered:
        return f"Run {wanted} is not among the runs these filters keep: showing run {shown}."
    what = f"Run {wanted} not found" if wanted.isdigit() else f"{wanted!r} is not a run id"
    return what + ("." if shown is None else f": showing run {shown}.")
