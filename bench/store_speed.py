"""How fast the store takes a recording's writes and answers the Live page's reads.

    python bench/store_speed.py [--store PATH_OR_URL] [--gpus 8] [--seconds 20] [--rate 1000]

Writes `seconds` of samples for `gpus` devices at `rate` Hz in the batches the recorder makes
(0.1 s each: samples, a step, the device panel), then times the reads a Live page refresh makes
(decimated chart, latest samples, peaks, steps). A fresh SQLite file in a temporary folder unless
--store names one. Results and the machine go in docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from anatomy.store import GpuStatus, HostStatus, Sample, Step, Store


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", default=None)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        store = Store(args.store or Path(directory) / "bench.sqlite")
        run_id = store.create_run({"model": "bench"}, "nvml", "v2", 0, {})
        batches, per_batch = int(args.seconds * 10), args.rate // 10
        began = time.perf_counter()
        for b in range(batches):
            t0 = b / 10
            samples = [Sample(t0 + i / args.rate, gpu, 10**9 + (i * 7919 + gpu) % 10**8, 2 * 10**9,
                              80 * 10**9, 50) for i in range(per_batch) for gpu in range(args.gpus)]
            store.write(run_id, samples=samples,
                        steps=[Step(t0, b, batches, 1.0, 10**9, 2 * 10**9)],
                        hosts=[HostStatus(t0, 10.0, 10**10, 10**11)],
                        gpus=[GpuStatus(t0, g, 50, 300.0, 700.0, 60) for g in range(args.gpus)])
        written = time.perf_counter() - began
        count = batches * per_batch * args.gpus
        print(f"write: {count} samples in {batches} batches, {written:.2f} s "
              f"({count / written:,.0f} samples/s, {1000 * written / batches:.2f} ms a batch)")
        for attempt in range(3):
            began = time.perf_counter()
            store.decimated(run_id)
            store.latest_samples(run_id)
            store.peaks(run_id, list(range(args.gpus)))
            store.steps(run_id)
            store.run(run_id)
            print(f"live refresh reads: {1000 * (time.perf_counter() - began):.1f} ms"
                  f" (attempt {attempt + 1})")
        if args.store:
            store.delete_run(run_id)


if __name__ == "__main__":
    main()
