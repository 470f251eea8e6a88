"""What several commands print the same way: tables, refusals, progress, each phase's memory as it
ends, and lines that outlive a closed terminal."""

from __future__ import annotations

import os
import sys
import unicodedata
from collections.abc import Collection

from anatomy.analysis.options import InvalidOptions
from anatomy.analysis.report import RunReport
from anatomy.engine.locks import DeviceBusy, DeviceLock
from anatomy.prediction.workspaces import Measurer, WorkspaceError
from anatomy.store import Store
from anatomy.units import mib_text
from anatomy.views import gpus, text
from anatomy.vocabulary import Status


def say(*args, **kwargs) -> None:
    """Print, unless the terminal is gone (a hang-up): the run is recorded either way."""
    try:
        print(*args, **kwargs)
    except OSError:
        pass


def refused(error: InvalidOptions) -> int:
    """Each refused option on a line of its own; the exit status of a refusal."""
    for message in error.errors.values():
        print(f"error: {message}", file=sys.stderr)
    return 2


class SaidMeasurer(Measurer):
    """cuDNN's convolution workspaces measured on GPU `gpu` (predict --measure-convolutions,
    sweep --from-prediction), each request said on stderr as it starts. The measurement takes
    tens of GB of the GPU at the edge's sizes (a convolution's input, output, their gradients
    and its workspace): it holds the GPU's device lock (`lock_key`) while it measures, as a run
    does, and is refused in one line while a run holds it."""

    def __init__(self, gpu: int, lock_key: str | None = None):
        super().__init__(gpu)
        self.lock_key, self.lock = lock_key, None

    def __call__(self, keys: list[tuple], batches: list[int]):
        if self.lock_key is not None and self.lock is None:
            lock = DeviceLock(self.lock_key)
            try:
                taken = lock.acquire(f"measuring convolutions (pid {os.getpid()})")
            except DeviceBusy as error:
                raise WorkspaceError(str(error)) from None
            if not taken:
                raise WorkspaceError(f"GPU {self.gpu} is busy: {lock.holder()}")
            self.lock = lock
        print(f"measuring {len(keys)} convolutions' cuDNN workspaces on GPU {self.gpu} at "
              f"batch size{'s' if len(batches) > 1 else ''} {', '.join(map(str, batches))}",
              file=sys.stderr, flush=True)
        return super().__call__(keys, batches)

    def close(self, keep_errors: bool = False) -> None:
        super().close(keep_errors)
        if self.lock is not None and not keep_errors:
            self.lock.release()
            self.lock = None


def peak(peak_bytes: int | None) -> str:
    """A run's peak as `run` and `show` print it: a run stopped before its first sample has
    none ("peak: None MB" before)."""
    return "not measured" if peak_bytes is None else mib_text(peak_bytes)


class PhaseEnds:
    """Each phase's memory as it ends, as `anatomy run` and `watch` print it (`text.phase_line`),
    read from the run's report: the figures `show` prints, whichever command prints them. A phase
    is said once the samples have passed its end (one taken before the end may still be on its
    way to the store) or the run is over; each rank's, of a run of a few."""

    def __init__(self, store: Store, held: tuple[str, ...] = ()):
        self.store = store
        self.held = held  # phases the command says elsewhere (`run`: training, with its summary)
        self.said: set[tuple[int, int]] = set()  # (rank, the phase's place among its phases)

    def new(self, rep: RunReport, only: Collection[int] | None = None) -> list[str]:
        """The lines of the run's phases that have ended since the last call; `only`: those of
        these ranks (a host's own, of a run across hosts)."""
        sampled_to = self.store.last_time(rep.id)
        ranks = rep.ranks if 1 < len(rep.ranks) <= gpus.LISTED_AT_MOST else ()
        if only is not None and ranks:
            ranks = [r for r in ranks if r.rank in only]
            if not ranks:
                return []
        elif only is not None and 0 not in only:
            return []  # the run's phases are rank 0's: its host says them
        lines = []
        for rank, phases in [(r, r.phases) for r in ranks] or [(None, rep.phases)]:
            for index, phase in enumerate(phases):
                key = (0 if rank is None else rank.rank, index)
                if key in self.said or not phase.done or \
                        (rep.status == Status.RUNNING and sampled_to < phase.end_s):
                    continue
                self.said.add(key)
                if phase.name not in self.held:
                    lines.append(text.phase_line(rep, phase, rank))
        return lines


CELL_WIDTH = 48  # a long name or a model's path shortened in its middle; --json has it whole


def printable(value: object) -> str:
    """A value on one line: its line breaks and tabs as spaces, any other control character as
    "?" (a name's terminal escape would colour the rest of the line, a carriage return write
    its line over). Names stored before they had to be one line of printable text, or
    imported, may hold them."""
    return "".join(" " if c.isspace() else "?" if unicodedata.category(c) == "Cc" else c
                   for c in str(value))


def _cell(value: object) -> str:
    """A value on one line of a table (`printable`), at most CELL_WIDTH wide (one run named
    with 100,000 characters padded every row of `runs` to as many)."""
    text = "-" if value is None else printable(value)
    return text if len(text) <= CELL_WIDTH else f"{text[:30]}…{text[-(CELL_WIDTH - 31):]}"


def table(rows: list[list[str]], header: list[str]) -> str:
    """Columns aligned; a missing value ("None") shows as "-"."""
    rows = [[_cell(x) for x in row] for row in rows]
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(line, widths)) for line in [header, *rows]]
    return "\n".join(lines)
