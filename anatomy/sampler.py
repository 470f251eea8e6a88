"""The sampler process: memory of every visible GPU (NVML), or of the worker's process tree (RSS).

It starts before the worker, so the baseline is measured, and stops after it, so the end is too.
Samples go out in batches: ("samples", [(t, gpu, used, reserved, total, util), ...]); the last
message is ("sampler_done", count_sent), so the store can prove it lost nothing.
"""

from __future__ import annotations

import time

from anatomy import nvml

BATCH_SECONDS = 0.05
UTIL_SECONDS = 0.1  # NVML's utilisation counter itself only changes every ~1/6 s


def _rss_of_tree(pid: int) -> int | None:
    import psutil

    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0
    for process in processes:
        try:
            total += process.memory_info().rss
        except psutil.Error:
            pass  # a child that just ended
    return total


class Reader:
    """One tick's readings, NVML or RSS; the same object is used by tests without a process."""

    def __init__(self, backend: str, worker_pid=None):
        self.backend = backend
        self.worker_pid = worker_pid  # a multiprocessing.Value, set once the worker has started
        self.gpus = list(range(nvml.device_count())) if backend == "nvml" else [0]
        self._util: dict[int, int | None] = {}
        self._util_at = float("-inf")
        if backend == "cpu-rss":
            import psutil

            self._ram_total = psutil.virtual_memory().total

    def read(self, t: float) -> list[tuple]:
        if self.backend == "nvml":
            if t - self._util_at >= UTIL_SECONDS:
                self._util = {g: nvml.utilization(g) for g in self.gpus}
                self._util_at = t
            rows = []
            for gpu in self.gpus:
                reading = nvml.memory(gpu)
                if reading is not None:
                    rows.append((t, gpu, reading.used, reading.reserved, reading.total,
                                 self._util.get(gpu)))
            return rows
        pid = self.worker_pid.value if self.worker_pid is not None else 0
        if not pid:
            return []  # the worker has not started: nothing of it to measure yet
        rss = _rss_of_tree(pid)
        return [] if rss is None else [(t, 0, rss, None, self._ram_total, None)]


def run(queue, stop, backend: str, rate: float, t0: float, worker_pid=None) -> None:
    """Process target: sample at `rate` Hz per device until `stop` is set."""
    reader = Reader(backend, worker_pid)
    period = 1.0 / rate
    batch: list[tuple] = []
    sent = 0
    flushed_at = time.monotonic()
    next_tick = flushed_at
    while True:
        stopping = stop.is_set()
        now = time.monotonic()
        batch.extend(reader.read(now - t0))
        if batch and (stopping or now - flushed_at >= BATCH_SECONDS):
            queue.put(("samples", batch))
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
    queue.put(("sampler_done", sent))
