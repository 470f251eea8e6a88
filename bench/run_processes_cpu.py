"""The CPU seconds each process of one `anatomy run` spends: the front (the CLI, with the
collector's threads), the sampler and the training worker — what a user pays for the recording
beside the training, and what most of the test suite's end-to-end tests start.

    PYTHONPATH=. python bench/run_processes_cpu.py [--repeats 3] [-- RUN FLAGS]
    PYTHONPATH=. python bench/run_processes_cpu.py --sampler 20   # the sampler's loop alone
    PYTHONPATH=. python bench/run_processes_cpu.py --look STORE   # one look of `run`'s front

Each repeat runs the tiny run the suite starts (tests/conftest.py's TINY) into a fresh store
and follows its process tree (psutil, every 0.1 s), keeping each process's last user + system
CPU; a process is the worker when it has libtorch mapped, the sampler when it is the other
spawned child (multiprocessing's resource tracker is named apart). Prints each repeat and the
median by role. CPU seconds, not wall: the machine may be shared; the front's and the
sampler's grow with the run's wall time (they follow it), the worker's is mostly its imports.
`--sampler SECONDS` measures the sampler's loop alone, free of the machine's load on the run's
length: the sampler process as a run starts it (spawned, its lifeline, 50 Hz, CPU RSS) following
a sleeping process, its CPU seconds a second from its first sample on (its imports apart).
`--look STORE` measures what `anatomy run` does five times a second while it follows a run (cli/run.py's
`_news`) on the first run of STORE, against the same reads each on a connection of its own and
its samples counted (what the front did before): CPU ms a look.
Results in docs/BENCHMARKS.md ("A run's own processes").
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

TINY = ["--model", "tiny", "--batch-size", "4", "--seq-len", "32", "--dataset-size", "16",
        "--sample-rate", "50"]
ROLES = ("front", "sampler", "worker", "tracker")


def _role(process: psutil.Process, root: int, torch: bool) -> str:
    if process.pid == root:
        return "front"
    if torch:
        return "worker"
    return "tracker" if "resource_tracker" in " ".join(process.cmdline()) else "sampler"


def one_run(flags: list[str]) -> tuple[dict[str, float], float]:
    """Each role's CPU seconds for one run, and the run's wall time."""
    with tempfile.TemporaryDirectory() as where:
        started = time.monotonic()
        # Its own device locks: another run on this machine does not refuse it as busy.
        environment = {**os.environ, "ANATOMY_LOCK_DIR": where}
        run = subprocess.Popen([sys.executable, "-m", "anatomy", "run", *flags, "--store",
                                str(Path(where) / "s.sqlite")], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, env=environment)
        root = psutil.Process(run.pid)
        seen: dict[int, tuple[psutil.Process, float, bool]] = {}
        while run.poll() is None:
            try:
                tree = [root, *root.children(recursive=True)]
            except psutil.Error:
                break
            for process in tree:
                try:
                    cpu = process.cpu_times()
                    torch = seen.get(process.pid, (None, 0.0, False))[2] or any(
                        "libtorch_cpu" in m.path for m in process.memory_maps())
                    seen[process.pid] = (process, cpu.user + cpu.system, torch)
                except psutil.Error:
                    pass
            time.sleep(0.1)
        wall = time.monotonic() - started
        if run.wait() != 0:
            sys.exit(f"the run failed: {run.stderr.read().decode()[-2000:]}")
    cpu = dict.fromkeys(ROLES, 0.0)
    for process, seconds, torch in seen.values():
        try:
            role = _role(process, run.pid, torch)
        except psutil.Error:
            role = "sampler"  # gone before it was named: the only short-lived untorched child
        cpu[role] += seconds
    return cpu, wall


def sampler_loop(seconds: float) -> tuple[float, float]:
    """The sampler's imports' CPU seconds, and its loop's CPU seconds a second of sampling."""
    import multiprocessing

    from anatomy.engine.recording import spawn_sampler

    context = multiprocessing.get_context("spawn")
    queue, stop = context.Queue(), context.Event()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        process, first_word = spawn_sampler(context, queue, stop, "cpu-rss", 50.0,
                                            time.monotonic(), [0], context.Value("i", sleeper.pid))
        assert first_word, "the sampler said nothing"
        watched = psutil.Process(process.pid)
        first = sum(watched.cpu_times()[:2])
        time.sleep(seconds)
        last = sum(watched.cpu_times()[:2])
        stop.set()
        while process.is_alive():  # what it sent is read, so that it can end
            try:
                queue.get(timeout=1)
            except Exception:  # noqa: BLE001 - nothing more: it has ended
                pass
        process.join()
    finally:
        sleeper.kill()
        sleeper.wait()
    return first, (last - first) / seconds


def follow_look(path: str, looks: int = 100) -> tuple[float, float]:
    """CPU ms of one look of the front at run 1 of `path`: each read on its own connection and
    the samples counted, and as `anatomy run` looks now."""
    from anatomy.analysis.report import report
    from anatomy.cli.render import PhaseEnds
    from anatomy.cli.run import _news
    from anatomy.store import Store

    store = Store(path, read_only=True)

    def apart() -> None:
        rep = report(store, 1)
        store.last_step(1)
        PhaseEnds(store).new(rep)

    def now() -> None:
        _news(store, 1, PhaseEnds(store))

    figures = []
    for look in (apart, now):
        look()
        started = time.process_time()
        for _ in range(looks):
            look()
        figures.append((time.process_time() - started) / looks * 1000)
    return figures[0], figures[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sampler", type=float, metavar="SECONDS",
                        help="the sampler's loop alone, for this long")
    parser.add_argument("--look", metavar="STORE", help="one look of `run`'s front at STORE's run 1")
    parser.add_argument("flags", nargs="*", help="the run's flags (default: the suite's TINY)")
    args = parser.parse_args()
    if args.look:
        apart, now = follow_look(args.look)
        print(f"a look: {apart:.1f} CPU ms each read apart and counted, {now:.1f} as `run` looks")
        return
    if args.sampler:
        for _ in range(args.repeats):
            started, a_second = sampler_loop(args.sampler)
            print(f"sampler: {started:.2f} CPU s until its first word, then {a_second:.3f} CPU s "
                  f"a second ({100 * a_second:.1f} % of a core)")
        return
    runs = [one_run(args.flags or TINY) for _ in range(args.repeats)]
    for cpu, wall in runs:
        print("  ".join(f"{role} {cpu[role]:5.2f}" for role in ROLES) + f"  (wall {wall:.1f} s)")
    print("median CPU s: " + "  ".join(
        f"{role} {statistics.median(c[role] for c, _ in runs):.2f}" for role in ROLES))


if __name__ == "__main__":
    main()
