"""The test suite's CPU, test by test: where `make test`'s time goes (issue 18).

    PYTEST_ADDOPTS="-p bench.suite_cpu" SUITE_CPU=/tmp/suite-cpu make test   # record
    python bench/suite_cpu.py /tmp/suite-cpu                                 # by file
    python bench/suite_cpu.py /tmp/suite-cpu --tests 40                      # and the 40 longest

As a pytest plugin it writes one JSON line per test (into $SUITE_CPU, a file per xdist worker):
its wall time, and the CPU of the worker itself and of the children it reaped meanwhile
(getrusage's RUSAGE_SELF and RUSAGE_CHILDREN). A child's CPU counts when it is reaped, so a
process a session or module fixture started counts in the test that ends it. The report sums
them by file and says how long each worker was busy. docs/BENCHMARKS.md (and the sessions it links
in docs/measurements/) has the figures.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import time
from pathlib import Path

import pytest


def _cpu() -> tuple[float, float]:
    own, children = (resource.getrusage(who) for who in
                     (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    start, (own, children) = time.time(), _cpu()
    yield
    end, (own_after, children_after) = time.time(), _cpu()
    folder = Path(os.environ.get("SUITE_CPU", "suite-cpu"))
    folder.mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(folder / f"{worker}.jsonl", "a") as out:
        out.write(json.dumps({"test": item.nodeid, "worker": worker, "start": start, "end": end,
                              "own": own_after - own, "children": children_after - children})
                  + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--tests", type=int, default=0, help="also the N longest tests")
    args = parser.parse_args()
    rows = [json.loads(line) for path in sorted(args.folder.glob("*.jsonl"))
            for line in path.read_text().splitlines()]
    first, last = min(r["start"] for r in rows), max(r["end"] for r in rows)
    print(f"{len(rows)} tests in {last - first:.0f} s; CPU: workers "
          f"{sum(r['own'] for r in rows):.0f} s, their children {sum(r['children'] for r in rows):.0f} s")
    for worker in sorted({r["worker"] for r in rows}):
        mine = [r for r in rows if r["worker"] == worker]
        print(f"  {worker}: busy {sum(r['end'] - r['start'] for r in mine):.0f} s, "
              f"ended at {max(r['end'] for r in mine) - first:.0f} s, "
              f"CPU {sum(r['own'] + r['children'] for r in mine):.0f} s")
    files: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    for r in rows:
        total = files[r["test"].split("::")[0]]
        total[0] += 1
        total[1] += r["end"] - r["start"]
        total[2] += r["own"]
        total[3] += r["children"]
    print(f"{'file':56} {'tests':>5} {'wall s':>7} {'own':>6} {'child':>6} {'CPU s':>6}")
    for name, (count, wall, own, children) in sorted(files.items(),
                                                     key=lambda kv: -(kv[1][2] + kv[1][3])):
        print(f"{name:56} {count:5d} {wall:7.1f} {own:6.1f} {children:6.1f} {own + children:6.1f}")
    for r in sorted(rows, key=lambda r: r["start"] - r["end"])[:args.tests]:
        print(f"{r['end'] - r['start']:6.1f} s wall {r['own'] + r['children']:6.1f} s CPU "
              f"{r['worker']} {r['test']}")


if __name__ == "__main__":
    main()
