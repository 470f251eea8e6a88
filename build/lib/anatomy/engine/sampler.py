"""The sampler process: memory of the GPUs a run can use (NVML), or of the worker's process tree
(RSS).

It starts before the worker, so the baseline is measured, and stops after it, so the end is too.
Samples go out in batches (`protocol.Samples`); the last message is `protocol.SamplerDone` with
the count sent, so the store can prove it lost nothing.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence

from anatomy.engine import nvml
from anatomy.engine.protocol import Sample, SamplerDone, Samples

BATCH_SECONDS = 0.05
UTIL_SECONDS = 0.1  # NVML's utilisation counter itself only changes every ~1/6 s
TREE_SECONDS = 0.1


class _ProcessTree:
    """RSS of a process and its descendants. Finding the descendants walks /proc, which costs
    more than a tick at 1,000 Hz, so the tree is re-listed every TREE_SECONDS, not every tick."""

    def __init__(self, pid: int):
        import psutil

        self.psutil = psutil
        self.root = psutil.Process(pid)
        self.own_pid = os.getpid()
        self.members: list = []
        self.listed_at = float("-inf")

    def rss(self, t: float) -> int | None:
        psutil = self.psutil
        if t - self.listed_at >= TREE_SECONDS:
            try:
                # Not the sampler itself: a user's process that records its own run is the
                # sampler's parent, and its tree would otherwise hold the sampler too.
                self.members = [self.root, *(p for p in self.root.children(recursive=True)
                                             if p.pid != self.own_pid)]
            except psutil.Error:
                return None
            self.listed_at = t
        total = 0
        for process in self.members:
            try:
                total += process.memory_info().rss
            except psutil.Error:
                if process is self.root:
                    return None  # the worker is gone: nothing of it to measure
        return total


class Reader:
    """One tick's readings, NVML or RSS; the same object is used by tests without a process."""

    def __init__(self, backend: str, gpus: Sequence[int] = (0,), worker_pid=None):
        self.backend = backend
        self.worker_pid = worker_pid  # a multiprocessing.Value, set once the worker has started
        self.gpus = list(gpus) if backend == "nvml" else [0]  # NVML indices
        self._util: dict[int, int | None] = {}
        self._util_at = float("-inf")
        self._tree: _ProcessTree | None = None
        if backend == "cpu-rss":
            import psutil

            self._ram_total = psutil.virtual_memory().total

    def read(self, t: float) -> list[Sample]:
        if self.backend == "nvml":
            if t - self._util_at >= UTIL_SECONDS:
                self._util = {g: nvml.utilization(g) for g in self.gpus}
                self._util_at = t
            rows = []
            for gpu in self.gpus:
                reading = nvml.memory(gpu)
                if reading is not None:
                    rows.append(Sample(t, gpu, reading.used, reading.reserved, reading.total,
                                       self._util.get(gpu)))
            return rows
        if self._tree is None:
            pid = self.worker_pid.value if self.worker_pid is not None else 0
            if not pid:
                return []  # the worker has not started: nothing of it to measure yet
            try:
                self._tree = _ProcessTree(pid)
            except Exception:  # psutil.NoSuchProcess: it ended before its first sample
                return []
        rss = self._tree.rss(t)
        return [] if rss is None else [Sample(t, 0, rss, None, self._ram_total, None)]


def run(queue, stop, backend: str, rate: float, t0: float, gpus: Sequence[int] = (0,),
        worker_pid=None) -> None:
    """Process target: sample the devices `gpus` (NVML indices) at `rate` Hz until `stop` is set."""
    # Ctrl-C at a terminal reaches the whole process group; the sampler stops when its run says
    # so (`stop`), after the end has been measured, and then sends its count.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    reader = Reader(backend, gpus, worker_pid)
    period = 1.0 / rate
    batch: list[Sample] = []
    sent = 0
    flushed_at = time.monotonic()
    next_tick = flushed_at
    while True:
        stopping = stop.is_set()
        now = time.monotonic()
        batch.extend(reader.read(now - t0))
        if batch and (stopping or now - flushed_at >= BATCH_SECONDS):
            queue.put(Samples(batch))
            sent += len(batch)
            batch = []
            flushed_at = now
        if stopping:
            break
        next_tick += period
        delay = next_tick - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        elif delay < -10 * period:
            next_tick = time.monotonic()  # fell far behind (a stalled machine): don't burst
    queue.put(SamplerDone(sent))
