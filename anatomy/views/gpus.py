"""A run's GPUs side by side once there are several, computed without Streamlit: a row
per GPU (its host, rank, peak, memory at each phase's end, its own samples a second), the spread
of the peaks across them, and the GPUs that stand out, in words. Drawn by the Live and Runs pages
beside the heat strip (figures/gpus.py), and summed up on Anatomy and Compare."""

from __future__ import annotations

import statistics
from typing import NamedTuple

from anatomy.analysis.components import MEASURED_STEPS
from anatomy.analysis.report import RankReading, RunReport, steady_rate
from anatomy.store import PHASES, Store
from anatomy.units import mib, mib_text
from anatomy.vocabulary import Phase

# A GPU whose peak is this far above the median's is said to be out of balance (SCALING.md's
# design): the first to run out of memory when the batch grows.
IMBALANCE = 0.05
# A rank that begins training this much later than the median rank is a straggler: the others
# wait for it in their first collective.
STRAGGLER_S = 1.0
LISTED_AT_MOST = 8  # GPUs a line of text names one by one; beyond, their spread


class GpuRow(NamedTuple):
    """One GPU (one rank) of a run of several: what its line in the table shows."""
    gpu: str  # "node-1 · GPU 3 (rank 11)"; "rank 1" for a CPU rank
    host: str | None
    rank: int
    peak_mb: int | None
    phase_mb: dict[str, int | None]  # memory at each walkthrough phase's end, by name
    training_start_s: float | None
    samples_per_second: float | None  # this rank's own, after the first steps


class Spread(NamedTuple):
    """The peaks across a run's GPUs (bytes)."""
    count: int
    low: int
    median: float
    high: int
    highest: str  # the GPU with the highest peak, as its label


def gpu_rows(store: Store, report: RunReport) -> list[GpuRow]:
    """A row per rank, in rank order: its peak, its phases' memory, its steady samples/s."""
    spans = store.step_spans(report.id, MEASURED_STEPS)
    batch, accumulation = report.ran_with.batch_size, report.ran_with.grad_accum
    rows = []
    for rank in report.ranks:
        rate = steady_rate(spans.get(rank.rank), batch, accumulation, 1)
        training = rank.phase(Phase.TRAINING)
        rows.append(GpuRow(rank.label(), rank.host, rank.rank, rank.peak_mb,
                           {name: rank.phase(name).memory_mb if rank.phase(name) else None
                            for name in PHASES},
                           None if training is None else training.start_s, rate))
    return rows


def _own_devices(report: RunReport) -> list[RankReading]:
    """One rank per device measured (on the CPU, a store of before has the ranks of a host share
    its RSS)."""
    seen: dict[int, RankReading] = {}
    for rank in report.ranks:
        if rank.peak_bytes is not None:
            seen.setdefault(rank.device, rank)
    return list(seen.values())


def spread(report: RunReport) -> Spread | None:
    """Lowest, median and highest peak over the run's devices; None with fewer than two."""
    ranks = _own_devices(report)
    if len(ranks) < 2:
        return None
    peaks = [r.peak_bytes for r in ranks]
    top = max(ranks, key=lambda r: r.peak_bytes)
    return Spread(len(ranks), min(peaks), statistics.median(peaks), max(peaks), top.label())


def spread_line(report: RunReport) -> str | None:
    """The spread in one line: "64 GPUs on 8 hosts: peak 7,940 MiB to 8,712 MiB, median …"."""
    found = spread(report)
    if found is None:
        return None
    what = ("GPUs" if report.on_gpu else "processes (each one's own RSS)"
            if all(r.measured_alone for r in report.ranks) else "hosts' CPU memory (RSS)")
    hosts = f" on {len(report.hosts)} hosts" if len(report.hosts) > 1 and report.on_gpu else ""
    return (f"{found.count} {what}{hosts}: peak {mib_text(found.low)} to {mib_text(found.high)}, "
            f"median {mib_text(found.median)}; highest on {found.highest}")


def standouts(report: RunReport) -> list[str]:
    """The GPUs that differ from the others, in words: a peak more than IMBALANCE above the
    median's, a training phase that began more than STRAGGLER_S after the median rank's."""
    found = spread(report)
    lines = []
    if found is not None:
        for rank in _own_devices(report):
            above = rank.peak_bytes / found.median - 1 if found.median else 0.0
            if above > IMBALANCE:
                lines.append(f"{rank.label()}: peak {mib_text(rank.peak_bytes)}, {above:.0%} above "
                             f"the median ({mib_text(found.median)}): out of balance, the first "
                             "to run out of memory")
    starts = [(rank, rank.phase(Phase.TRAINING).start_s) for rank in report.ranks
              if rank.phase(Phase.TRAINING) is not None]
    if len(starts) > 1:
        median = statistics.median(t for _, t in starts)
        lines += [f"{rank.label()}: began training {t - median:.1f} s after the median rank: a "
                  "straggler, the others wait for it" for rank, t in starts
                  if t - median > STRAGGLER_S]
    return lines


def peaks_text(report: RunReport) -> str:
    """Each GPU's peak in a line ("GPU 0: 12,345 · GPU 1: 12,400", MiB), or their spread where
    there are more than LISTED_AT_MOST; "" without a GPU."""
    peaks = report.gpu_peaks()
    if len(peaks) > LISTED_AT_MOST:
        found = spread(report)
        return (f"{found.count} GPUs: {mib(found.low):,} to {mib(found.high):,}, median "
                f"{mib(round(found.median)):,}")
    places = {r.device: r.place() for r in report.ranks}
    return " · ".join(f"{places.get(device) or f'GPU {device}'}: "
                      f"{'—' if peak is None else f'{mib(peak):,}'}"
                      for device, peak in peaks.items())
