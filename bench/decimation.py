"""How long the chart's decimated read takes for a long run (the live page refreshes every second).

    python bench/decimation.py [--samples 1000000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from anatomy.analysis.options import RunOptions
from anatomy.store import Sample, Store


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        store = Store(Path(directory) / "bench.sqlite")
        run_id = store.create_run(RunOptions().to_dict(), "nvml", "v2", 0, {})
        chunk = 100_000
        for start in range(0, args.samples, chunk):
            store.write(run_id, samples=[
                Sample(i / 200, 0, 10**9 + (i * 7919) % 10**8, 0, 10**11, None)
                for i in range(start, min(args.samples, start + chunk))])
        for attempt in range(3):
            began = time.perf_counter()
            points = store.decimated(run_id)
            print(f"decimated: {len(points)} points from {args.samples} samples in "
                  f"{time.perf_counter() - began:.3f} s (attempt {attempt + 1})")


if __name__ == "__main__":
    main()
