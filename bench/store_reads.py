"""The Live page's refresh against a run that already holds the load bench's whole run (4 hosts ×
8 GPUs × 1 kHz × 10 minutes: 19.2 M samples), the reads alone: bench/store_load.py times them
while four writers share the machine, this with nothing writing, so that what the reads cost is
not the writers' noise.

    PYTHONPATH=. .venv/bin/python bench/store_reads.py [--engine postgresql|sqlite]
        [--minutes 10] [--hosts 4] [--gpus 8] [--rate 1000] [--refreshes 10]

The run is filled through Store.write (PostgreSQL's COPY, SQLite's executemany, the buckets in
the same transactions), a second of every host's samples a batch, with each rank's steps and the
device panel's rows as store_load.py writes them; then --refreshes refreshes of the Live page
(store_load.live_refresh: the run, its report, the progress, the latest time, the decimated chart
and its figure), each store read's seconds summed by method. A private cluster of Debian's
PostgreSQL (tests/postgres.py) or a SQLite file in a temporary folder. Results:
docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from store_load import GIB, STATUS_SECONDS, STEP_SECONDS, live_refresh

from anatomy.analysis.options import RunOptions
from anatomy.store import (
    GpuProcess,
    GpuStatus,
    HostStatus,
    PhaseMark,
    RunFacts,
    Sample,
    Step,
    Store,
    device_key,
)
from anatomy.vocabulary import Edge, Phase


def fill(store: Store, hosts: int, gpus: int, rate: int, seconds: int) -> int:
    world = hosts * gpus
    facts = RunFacts.of(world_size=world, hosts=tuple(f"host-{h}" for h in range(hosts)),
                        rank_hosts=tuple(r // gpus for r in range(world)),
                        gpus=tuple(r % gpus for r in range(world)), gpu_name="NVIDIA H100")
    run_id = store.create_run(RunOptions(preset="bert-large-uncased").to_dict(), "nvml", "v2", 0,
                              facts, name="read bench")
    store.write(run_id, phases=[PhaseMark(Edge.START, Phase.TRAINING, 0.0, r) for r in range(world)])
    for second in range(seconds):
        for host in range(hosts):
            devices = [device_key(host, g) for g in range(gpus)]
            ranks = [host * gpus + g for g in range(gpus)]
            ticks = range(second * rate, (second + 1) * rate)
            steps = [Step(k * STEP_SECONDS, k, None, 2.0 / k, 18 * GIB, 22 * GIB, rank)
                     for k in range(int(second / STEP_SECONDS) + 1,
                                    int((second + 1) / STEP_SECONDS) + 1) for rank in ranks]
            panel = [second + k * STATUS_SECONDS for k in range(1, int(1 / STATUS_SECONDS) + 1)]
            store.write(run_id,
                        samples=[Sample(i / rate, d, 20 * GIB + ((i * 7919 + d) % 4096) * 2**20,
                                        2 * GIB, 80 * GIB, 90) for i in ticks for d in devices],
                        steps=steps, hosts=[HostStatus(t, 40.0, 100 * GIB, 1000 * GIB) for t in panel],
                        gpus=[GpuStatus(t, d, 90, 650.0, 700.0, 70) for t in panel for d in devices],
                        processes=[GpuProcess(t, d, 1000 + d, "python", 20 * GIB) for t in panel
                                   for d in devices])
        if (second + 1) % 60 == 0:
            print(f"  filled {second + 1} s", flush=True)
    return run_id


READS = ("run", "phases", "ranks", "last_time", "decimated", "peaks", "readings_before", "step_span",
         "step_count", "last_step", "steps", "messages")


def timed(store: Store, spent: dict[str, float]) -> None:
    """Each public read of `store` adds its seconds to spent[its name] (nested reads count in
    their caller's only)."""
    depth = [0]
    for name in READS:
        method = getattr(store, name)

        @functools.wraps(method)
        def wrapper(*args, _method=method, _name=name, **kwargs):
            depth[0] += 1
            began = time.perf_counter()
            try:
                return _method(*args, **kwargs)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    spent[_name] += time.perf_counter() - began
        setattr(store, name, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("postgresql", "sqlite"), default="postgresql")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--refreshes", type=int, default=10)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the private cluster goes with it
    with tempfile.TemporaryDirectory() as folder:
        cluster = None
        if args.engine == "postgresql":
            from tests.postgres import Cluster, binaries
            cluster = Cluster(binaries())
            where = cluster.new_database()
        else:
            where = Path(folder) / "reads.sqlite"
        try:
            _bench(args, Store(where))
        finally:
            if cluster is not None:
                cluster.remove()


def _bench(args, store: Store) -> None:
    began = time.perf_counter()
    run_id = fill(store, args.hosts, args.gpus, args.rate, int(args.minutes * 60))
    print(f"{store.engine_name}: {store.sample_count(run_id):,} samples filled in"
          f" {time.perf_counter() - began:.0f} s; load average {os.getloadavg()[0]:.2f}", flush=True)
    live_refresh(store, run_id)  # the first: the server's and the OS's caches warmed
    refreshes(store, run_id, args.refreshes, "")
    # The same reads as a store without the coarse buckets makes them (one written before them,
    # opened read-only): the chart and the peaks from the 0.1 s buckets, as main read them.
    store._top_level = lambda db, run_id: None
    refreshes(store, run_id, args.refreshes, " from the 0.1 s buckets alone")


def refreshes(store: Store, run_id: int, count: int, how: str) -> None:
    spent: dict[str, float] = defaultdict(float)
    timed(store, spent)
    totals = []
    for _ in range(count):
        totals.append(live_refresh(store, run_id))
    for name in READS:  # unwrapped again
        del store.__dict__[name]
    reads = sorted(r for r, _ in totals)
    whole = sorted(r + d for r, d in totals)
    print(f"Live refresh{how} ({count}): reading median {statistics.median(reads):.3f} s,"
          f" max {reads[-1]:.3f}; reading + drawing median {statistics.median(whole):.3f} s,"
          f" max {whole[-1]:.3f}; load average {os.getloadavg()[0]:.2f}")
    for name, seconds in sorted(spent.items(), key=lambda item: -item[1]):
        print(f"  {name}: {seconds / count:.3f} s a refresh")

if __name__ == "__main__":
    main()
