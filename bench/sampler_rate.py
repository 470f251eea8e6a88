"""How many samples per second the sampler sustains, per device, at each asked-for rate.

    python bench/sampler_rate.py [--seconds 3] [--rates 200,1000,2000]

Runs the real sampler process (spawn, real NVML where there is a GPU; else RSS of this process)
and counts what reaches the queue. Results and the machine go in docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import time

from anatomy.analysis.machine import Machine
from anatomy.engine import protocol, sampler
from anatomy.engine.devices import machine


def measure(info: Machine, rate: int, seconds: float) -> dict:
    context = mp.get_context("spawn")
    backend = info.backend
    gpus = [d.nvml_index for d in info.devices] or [0]  # every GPU a run can use (NVML indices)
    queue, stop = context.Queue(), context.Event()
    pid = context.Value("i", os.getpid())
    t0 = time.monotonic()
    process = context.Process(target=sampler.run,
                              args=(queue, stop, backend, rate, t0, gpus, pid))
    process.start()
    rows, batches, sent, statuses = [], 0, None, 0
    deadline = time.monotonic() + seconds
    while sent is None:
        if time.monotonic() > deadline:
            stop.set()
        try:
            message = queue.get(timeout=0.1)
        except Exception:
            continue
        if isinstance(message, protocol.Samples):
            rows.extend(message.samples)
            batches += 1
        elif isinstance(message, getattr(protocol, "DeviceStatus", ())):
            statuses += 1  # the device panel's readings, every sampler.STATUS_SECONDS
        elif isinstance(message, protocol.SamplerDone):
            sent = message.sent
    process.join()
    devices = len({r.gpu for r in rows}) or 1
    times = sorted({r.t for r in rows})
    span = times[-1] - times[0] if len(times) > 1 else 0
    gaps = [b - a for a, b in zip(times, times[1:])]
    return {"backend": backend, "asked_hz": rate, "devices": devices,
            "achieved_hz_per_device": round((len(times) - 1) / span, 1) if span else None,
            "max_gap_ms": round(1000 * max(gaps), 2) if gaps else None,
            "p99_gap_ms": round(1000 * sorted(gaps)[int(0.99 * len(gaps))], 2) if gaps else None,
            "samples": len(rows), "sent": sent, "batches": batches, "device_statuses": statuses}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rates", default="200,1000,2000")
    args = parser.parse_args()
    info = machine()
    print(json.dumps({"machine": platform.node(), "cpus": os.cpu_count(),
                      "gpu": info.devices[0].name if info.has_gpu else None}))
    for rate in (int(r) for r in args.rates.split(",")):
        print(json.dumps(measure(info, rate, args.seconds)))


if __name__ == "__main__":
    main()
