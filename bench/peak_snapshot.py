"""What was alive at the allocator's peak of a real run, next to what the trace has alive at its
predicted peak: the diagnosis of a configuration the prediction misses (docs/PREDICTION.md).

On a GPU, each configuration trains as bench/prediction_grid.py's runs do, in a fresh process,
with the caching allocator's history recorded; `<out>/<label>.json` holds the blocks alive at the
peak with their Python frames (`--cpp`: and the C++ frames that name the kernel, for blocks the
autograd thread allocates, which have no Python frame). Anywhere (a CPU is enough), `--compare`
traces the same configuration and lists, by size, the blocks alive at the predicted peak that the
real peak lacks and the reverse. `--replay` feeds every action each recorded run's allocator
took (`<label>.events.json.gz`) to the simulated allocator (anatomy/prediction/
allocator.py) at that run's ceiling: whether it runs out of memory at the same request, and the
reserve it ends with, next to the run's.

    python bench/peak_snapshot.py --out $OUT/snap "deit-base bf16 b64 adamw_torch" ...
    python bench/peak_snapshot.py --cpp --out $OUT/snap "efficientnet-b0 bf16 b64 adamw_torch"
    python bench/peak_snapshot.py --compare $OUT/snap
    python bench/peak_snapshot.py --replay $OUT/snap
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import asdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from prediction_grid import Config, Fresh  # noqa: E402

MIB = 2**20


def record(labels: list[str], out: Path, stacks: str = "python") -> None:
    out.mkdir(parents=True, exist_ok=True)
    fresh = Fresh(None, 0)
    for label in labels:
        config = Config.from_label(label)
        path = out / f"{label.replace(' ', '_')}.json"
        result = fresh.run("train_with_history", config.run_options(), "cuda", str(path),
                           stacks)
        (out / f"{label.replace(' ', '_')}.result.json").write_text(
            json.dumps({"label": label, "config": asdict(config), **result}))
        measured = result.get("measured", {})
        print(f"{label}: {result['status']}, peak allocated "
              f"{(measured.get('peak_allocated') or 0) / MIB:,.1f} MiB", flush=True)


def predicted_live(config: Config) -> tuple[int, list[int]]:
    """The trace's peak for `config` (for an H200) and the sizes of the storages alive then."""
    from anatomy.prediction import memory, replay
    from anatomy.prediction.step import TracedRun
    from anatomy.prediction.tracing.tracker import ALLOC, FREE

    options = config.options()
    steps = memory.steps_measured(options)
    calibration = memory.calibration_for("cuda", "NVIDIA H200")
    recording = memory._recording(TracedRun.of(options), "cuda", calibration, steps)
    events = list(replay.stream(recording, steps, options.grad_accum))
    live: dict[int, int] = {}
    total = peak = 0
    at_peak: dict[int, int] = {}
    for kind, tid, size in events:
        if kind == ALLOC:
            live[tid] = size
            total += size
            if total > peak:
                peak, at_peak = total, dict(live)
        elif kind == FREE and tid in live:
            total -= live.pop(tid)
    return peak, sorted(at_peak.values())


def compare(folder: Path) -> None:
    for path in sorted(folder.glob("*.result.json")):
        result = json.loads(path.read_text())
        snap = json.loads(path.with_name(path.name.replace(".result", "")).read_text())
        config = Config(**result["config"])
        peak, sizes = predicted_live(config)
        real = Counter(-(-b["size"] // 512) * 512 for b in snap["blocks"])
        trace = Counter(-(-s // 512) * 512 for s in sizes)
        print(f"\n## {result['label']}: measured peak "
              f"{result['measured']['peak_allocated'] / MIB:,.1f} MiB; alive at the real peak "
              f"{sum(b['size'] for b in snap['blocks']) / MIB:,.1f} MiB in "
              f"{len(snap['blocks'])} blocks (+ {snap['alive_before_history'] / MIB:,.1f} "
              f"before the history); traced alive at its peak {sum(sizes) / MIB:,.1f} MiB in "
              f"{len(sizes)}")
        only_real = real - trace
        only_trace = trace - real
        frames = {}
        for block in snap["blocks"]:
            frames.setdefault(-(-block["size"] // 512) * 512, block["frames"])
        print(f"only in the real peak: {sum(s * n for s, n in only_real.items()) / MIB:,.1f} MiB")
        for size, n in sorted(only_real.items(), key=lambda kv: -kv[0] * kv[1])[:15]:
            print(f"  {n} x {size / MIB:,.3f} MiB  {' <- '.join(frames.get(size, [])[:3])}")
        print(f"only in the traced peak: {sum(s * n for s, n in only_trace.items()) / MIB:,.1f}"
              " MiB")
        for size, n in sorted(only_trace.items(), key=lambda kv: -kv[0] * kv[1])[:15]:
            print(f"  {n} x {size / MIB:,.3f} MiB")
        last = snap["blocks"][-1]["frames"] if snap["blocks"] else []
        print(f"the real peak's last block: {' <- '.join(last[:3])}")


def first_refusal(events: list) -> tuple[int, int] | None:
    """(index, size) of the first request a recorded run's allocator refused, or None."""
    return next(((i, e[2]) for i, e in enumerate(events) if e[0] == "oom"), None)


def replay_recorded(events: list, ceiling: int) -> dict:
    """A run's recorded allocator actions ([action, address, size, stream, frame] rows, as
    gpu_child._write_events writes them) replayed through the simulated allocator with the
    run's ceiling: "completed", or "oom" with the index and size of the request it refused (a
    request the run refused, its `oom` action, is tried too); the reserve at the end."""
    from anatomy.prediction.allocator import CachingAllocator, OutOfMemory

    allocator = CachingAllocator(ceiling)
    live = {}
    for index, (action, address, size, *_) in enumerate(events):
        try:
            if action == "alloc":
                live[address] = allocator.malloc(size)
            elif action == "oom":
                allocator.malloc(size)
                return {"status": "held what the run refused", "at": index, "size": size,
                        "reserved": allocator.stats.reserved}
        except OutOfMemory:
            return {"status": "oom", "at": index, "size": size,
                    "reserved": allocator.stats.reserved}
        if action == "free_completed" and address in live:
            allocator.free(live.pop(address))
    return {"status": "completed", "reserved": allocator.stats.reserved}


def replay(folder: Path) -> None:
    import gzip

    for path in sorted(folder.glob("*.result.json")):
        result = json.loads(path.read_text())
        events = json.load(gzip.open(path.with_name(path.name.replace(".result.json",
                                                                      ".events.json.gz")), "rt"))
        memory = result["memory"]
        refused = first_refusal(events["events"])
        simulated = replay_recorded(events["events"], memory["ceiling"])
        print(f"{result['label']}: ran {result['status']}"
              f"{f' (refused {refused[1]:,} B at action {refused[0]})' if refused else ''}"
              f", reserve {memory['reserved']:,} B; simulated {simulated['status']}"
              + (f" ({simulated['size']:,} B at action {simulated['at']})"
                 if "at" in simulated else "") + f", reserve {simulated['reserved']:,} B")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("labels", nargs="*", help="configurations as the grid labels them")
    parser.add_argument("--out", type=Path, help="record them here (on a GPU)")
    parser.add_argument("--compare", type=Path, help="a folder recorded before")
    parser.add_argument("--replay", type=Path,
                        help="a folder recorded before: its actions through the simulated "
                             "allocator")
    parser.add_argument("--cpp", action="store_true",
                        help="record C++ stacks too (slower): they name the kernel of a block")
    args = parser.parse_args()
    if args.out:
        record(args.labels, args.out, "all" if args.cpp else "python")
    if args.compare:
        compare(args.compare)
    if args.replay:
        replay(args.replay)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
