"""Whether one PostgreSQL run holds the writes of several hosts: `--hosts` processes (4), each a
host of `--gpus` GPUs (8) sampled at `--rate` Hz (1 kHz), write into ONE run for `--minutes`
(10) through anatomy's own write path — each host's Collector (engine/collector.py), the one a
real recording drains its sampler's queue into, fed here by a fake sample source at the rate a
sampler sends, with each rank's phase marks and steps and the device panel's readings — while
this process times the reads of a Live page refresh (dashboard/screens/live.py's live_view:
the run, its report, the progress, the latest time, the decimated chart and its figure drawn)
against the growing run.

    PYTHONPATH=. .venv/bin/python bench/store_load.py [--minutes 10] [--hosts 4] [--gpus 8]
        [--rate 1000] [--store postgresql://USER@HOST/DB]

A private cluster of Debian's PostgreSQL (tests/postgres.py) unless --store names a database.
Prints every sample expected and stored, each host's flushes (rows a flush, its seconds, the
oldest sample's age when its flush committed), each writer process's CPU (psutil), the server's
CPU, the Live refresh's seconds over the run, and the load average. Results: docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import signal
import statistics
import sys
import time
from dataclasses import dataclass, field

import psutil

from anatomy.analysis.options import RunOptions
from anatomy.analysis.report import report
from anatomy.engine import protocol
from anatomy.engine.collector import FLUSH_SECONDS, Collector
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
from anatomy.views import live as live_view
from anatomy.views.figures import gpus as gpu_figures
from anatomy.views.figures import svg
from anatomy.vocabulary import Edge, Phase, Status

GIB = 2**30
STEP_SECONDS = 0.5  # each rank's optimizer step
STATUS_SECONDS = 0.25  # the device panel's readings (the sampler's few a second)
REFRESH_EVERY = 2.0  # the Live page redraws each second; timed every other one here
START_DELAY = 0.5  # the hosts, ready, begin together at this common time 0


@dataclass
class HostResult:
    host: int
    generated: int = 0
    flushes: int = 0
    flush_seconds: list[float] = field(default_factory=list)
    flush_rows: list[int] = field(default_factory=list)
    lag_seconds: list[float] = field(default_factory=list)  # oldest sample's age at its commit
    cpu_seconds: float = 0.0


def _host(url: str, run_id: int, host: int, gpus: int, rate: int, seconds: float, start,
          zero_at, results) -> None:
    """One host's recording: its Collector, fed the samples its sampler would send, from the
    moment every host is ready (`start` set, the common time 0 in `zero_at`)."""
    store = Store(url)
    collector = Collector(store, run_id)
    result = HostResult(host)
    ranks = [host * gpus + g for g in range(gpus)]
    devices = [device_key(host, g) for g in range(gpus)]
    results.put(host)  # ready
    start.wait()
    zero = zero_at.value
    while time.monotonic() < zero:
        time.sleep(0.01)
    for rank in ranks:
        collector.handle(protocol.Phase(PhaseMark(Edge.START, Phase.TRAINING, 0.0, rank),
                                        protocol.Source(rank=rank)))
    sent = 0  # ticks of every device sent
    steps = status = 0
    while True:
        now = time.monotonic() - zero
        due = int(min(now, seconds) * rate)
        if due > sent:
            batch = [Sample(i / rate, d, 20 * GIB + ((i * 7919 + d) % 4096) * 2**20, 2 * GIB,
                            80 * GIB, 90) for i in range(sent, due) for d in devices]
            collector.handle(protocol.Samples(batch))
            result.generated += len(batch)
            sent = due
        while (steps + 1) * STEP_SECONDS <= min(now, seconds):
            steps += 1
            for rank in ranks:
                collector.handle(protocol.StepReport(
                    Step(steps * STEP_SECONDS, steps, None, 2.0 / steps, 18 * GIB, 22 * GIB),
                    protocol.Source(rank=rank)))
        while (status + 1) * STATUS_SECONDS <= min(now, seconds):
            status += 1
            t = status * STATUS_SECONDS
            collector.handle(protocol.DeviceStatus(
                HostStatus(t, 40.0, 100 * GIB, 1000 * GIB),
                [GpuStatus(t, d, 90, 650.0, 700.0, 70) for d in devices],
                [GpuProcess(t, d, 1000 + d, "python", 20 * GIB) for d in devices]))
        last = now >= seconds
        if last:
            for rank in ranks:
                collector.handle(protocol.Phase(PhaseMark(Edge.END, Phase.TRAINING, seconds, rank),
                                                protocol.Source(rank=rank)))
        pending = collector.rows.samples
        if pending and (last or time.monotonic() - zero - pending[0].t >= FLUSH_SECONDS):
            rows, oldest = len(pending), pending[0].t
            began = time.perf_counter()
            collector.flush()
            result.flush_seconds.append(time.perf_counter() - began)
            result.flush_rows.append(rows)
            result.lag_seconds.append(time.monotonic() - zero - oldest)
            result.flushes += 1
        if last:
            break
        time.sleep(FLUSH_SECONDS / 2)  # as the recording's loop waits on its queue
    collector.flush()
    result.cpu_seconds = sum(psutil.Process().cpu_times()[:2])
    results.put(result)


def live_refresh(store: Store, run_id: int) -> tuple[float, float]:
    """One refresh of the Live page's fragment, without Streamlit: (seconds reading the store and
    building the report, seconds drawing its chart)."""
    began = time.perf_counter()
    run = store.run(run_id)
    run.source.words()
    rep = report(store, run_id, run, counted=False)
    live_view.phase_metrics(rep)
    live_view.progress(rep, store.last_step(run_id))
    live_view.stage(rep)
    now = store.last_time(run_id)
    samples = store.decimated(run_id, gpu_figures.buckets(rep))
    steps = store.steps(run_id)
    read = time.perf_counter() - began
    figure = gpu_figures.memory_chart(rep, samples, steps, now, "run")
    try:
        svg.picture(figure)
    except svg.Unsupported:  # the small multiples of many GPUs stay interactive
        figure.to_json()
    return read, time.perf_counter() - began - read


def _server_pids(url: str) -> set[int]:
    """The server's processes: each backend serving this database, and the postmaster's others."""
    import psycopg
    with psycopg.connect(url) as db:
        parent = psutil.Process(db.execute("SELECT pg_backend_pid()").fetchone()[0]).ppid()
    return {parent, *(p.pid for p in psutil.Process(parent).children())}


def _quantiles(values: list[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return (f"median {statistics.median(ordered):.3f}, p90 {p90:.3f}, max {ordered[-1]:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--store", default=None, help="a database's URL (default: a private"
                                                       " cluster of Debian's PostgreSQL)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the private cluster goes with it
    cluster = None
    url = args.store
    if url is None:
        from tests.postgres import Cluster, binaries
        cluster = Cluster(binaries())
        url = cluster.new_database()
    try:
        _bench(args, url)
    finally:
        if cluster is not None:
            cluster.remove()


def _bench(args, url: str) -> None:
    seconds = args.minutes * 60
    world = args.hosts * args.gpus
    store = Store(url)
    facts = RunFacts.of(world_size=world, hosts=tuple(f"host-{h}" for h in range(args.hosts)),
                        rank_hosts=tuple(r // args.gpus for r in range(world)),
                        gpus=tuple(r % args.gpus for r in range(world)), gpu_name="NVIDIA H100")
    run_id = store.create_run(RunOptions(preset="bert-large-uncased").to_dict(), "nvml", "v2", 0,
                              facts, name="load bench")
    context = mp.get_context("spawn")
    results = context.Queue()
    start = context.Event()
    zero_at = context.Value("d", 0.0)
    hosts = [context.Process(target=_host, args=(url, run_id, h, args.gpus, args.rate, seconds,
                                                 start, zero_at, results), name=f"host-{h}")
             for h in range(args.hosts)]
    for process in hosts:
        process.start()
    for _ in hosts:
        results.get(timeout=600)
    zero = zero_at.value = time.monotonic() + START_DELAY
    start.set()
    server = {pid: 0.0 for pid in _server_pids(url)}
    loads, refreshes = [os.getloadavg()], []
    print(f"run {run_id}: {args.hosts} hosts x {args.gpus} GPUs x {args.rate} Hz for"
          f" {seconds:.0f} s into {store.path}; load average at the start"
          f" {' '.join(f'{v:.2f}' for v in loads[0])}", flush=True)
    next_refresh, next_load = zero, zero + 60
    done: list[HostResult] = []
    while len(done) < len(hosts):  # read as they come: a host exits once its result is read
        try:
            done.append(results.get_nowait())
        except queue.Empty:
            pass
        now = time.monotonic()
        if now >= next_refresh and now > zero:
            read, draw = live_refresh(store, run_id)
            refreshes.append((now - zero, read, draw))
            next_refresh = now + REFRESH_EVERY
        if now >= next_load:
            loads.append(os.getloadavg())
            t, read, draw = refreshes[-1]
            print(f"  {t:5.0f} s: {store.sample_count(run_id):,} samples stored; refresh"
                  f" {read:.3f} s reading +"
                  f" {draw:.3f} s drawing; load {loads[-1][0]:.2f}", flush=True)
            next_load += 60
        for pid in list(server):
            try:
                server[pid] = max(server[pid], sum(psutil.Process(pid).cpu_times()[:2]))
            except psutil.Error:
                pass
        if len(refreshes) % 5 == 0:
            for pid in _server_pids(url) - set(server):
                server[pid] = 0.0
        time.sleep(0.2)
    done.sort(key=lambda r: r.host)
    for process in hosts:
        process.join()
    loads.append(os.getloadavg())
    stored = store.sample_count(run_id)
    expected = world * int(seconds * args.rate)
    store.finish(run_id, Status.COMPLETED)
    generated = sum(r.generated for r in done)
    print(f"\nsamples: expected {expected:,}, sent {generated:,}, stored {stored:,}"
          f" ({'every one' if stored == expected == generated else 'MISSING'})")
    print(f"steps stored: {store.step_count(run_id, None):,}"
          f" (expected {world * int(seconds / STEP_SECONDS):,})")
    for result in done:
        print(f"host {result.host}: {result.flushes} flushes, rows a flush"
              f" {_quantiles([float(r) for r in result.flush_rows])}; seconds a flush"
              f" {_quantiles(result.flush_seconds)}; oldest sample's age at commit"
              f" {_quantiles(result.lag_seconds)} s; CPU {result.cpu_seconds:.1f} s"
              f" = {100 * result.cpu_seconds / seconds:.0f} % of a core")
    print(f"server (postgres processes): CPU {sum(server.values()):.1f} s ="
          f" {100 * sum(server.values()) / seconds:.0f} % of a core")
    reads = [r[1] for r in refreshes]
    totals = [r[1] + r[2] for r in refreshes]
    print(f"Live refresh ({len(refreshes)} taken): reading {_quantiles(reads)} s; reading +"
          f" drawing {_quantiles(totals)} s; last quarter {_quantiles(totals[-len(totals) // 4:])}"
          f" s; over 1 s: {sum(t > 1 for t in totals)}")
    ones = [load[0] for load in loads]
    print(f"load average (1 min) over the run: {min(ones):.2f}-{max(ones):.2f}; at the end"
          f" {' '.join(f'{v:.2f}' for v in loads[-1])}")


if __name__ == "__main__":
    main()
