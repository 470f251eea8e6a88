"""A store of GPU-like runs for screenshots and the dashboard's latency benchmark, on a machine
without a GPU: the four bert-large runs recorded on an H200 (docs/data/h200-show*.json) and the
batch-size sweep (docs/data/h200-sweep.json), rebuilt from what those files hold.

What the files hold is kept exactly (options, environment, each phase's start, end and memory,
the summary, the measured components, the profile). What they do not hold is drawn in between and
says so in the run's tags ("seeded"): the curve between the phase figures, each step's time and
loss (the summary's loss is their mean), and the device panel's readings (utilisation, power,
temperature, host CPU and RAM), with typical H200 values. Real runs replace all of it: record them
on a GPU (`python -m anatomy run …`), export them, and pass the file to tools/screenshots.py.

    PYTHONPATH=. python -m tools.demo_store STORE.sqlite
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from anatomy.store import (
    GpuProcess,
    GpuStatus,
    HostStatus,
    Message,
    PhaseMark,
    RunFacts,
    Sample,
    Step,
    Store,
)

DATA = Path(__file__).resolve().parent.parent / "docs" / "data"
RATE = 200  # Hz, the runs' sample rate
MIB = 2**20
WORKER_PID = 48213  # the run's training process, as the device panel lists it


def _curve(phases: list[dict], end: float) -> list[tuple[float, int]]:
    """(t, bytes) at RATE Hz: each phase's memory held from its start to its end, reached over the
    0.8 s before its start (torch loading, the model loading); the training phase's reached over
    its first steps and held (the caching allocator keeps it); nothing once the worker ended."""
    training = phases[-1]
    rise = min(0.6, (training["end_s"] - training["start_s"]) / 4)
    points = []
    for i in range(int(end * RATE) + 1):
        t = i / RATE
        memory, before = 0.0, 0
        for phase in phases:
            start, level = phase["start_s"], phase["memory_bytes"]
            climb = rise if phase is training else 0.8
            if phase is training and t >= start:
                memory = before + (level - before) * min(1.0, (t - start) / climb)
            elif t >= start:
                memory = level
            elif phase is not training and t >= start - climb:
                memory = before + (level - before) * (t - (start - climb)) / climb
                break
            else:
                break
            before = level
        if t > training["end_s"] + 0.3 + (1.5 if end - training["end_s"] > 1 else 0):
            memory = 0  # the worker has ended: its memory is let go
        points.append((t, int(memory)))
    return points


def _device(shown: dict, points: list[tuple[float, int]], rng: random.Random
            ) -> tuple[list[HostStatus], list[GpuStatus], list[GpuProcess]]:
    """The device panel every 0.5 s, with an H200's typical figures: idle until training, then
    busy; the VM's 16 cores and 125 GiB; the run's process holding what NVML counts."""
    training = shown["phases"][-1]
    hosts, gpus, processes = [], [], []
    used_at = dict(points)
    for k in range(int(points[-1][0] * 2) + 1):
        t = k / 2
        busy = training["start_s"] <= t <= training["end_s"]
        loading = shown["phases"][0]["end_s"] < t < training["start_s"]
        cpu = (9.0 if busy else 7.5 if loading else 1.5) * rng.uniform(0.8, 1.2)
        hosts.append(HostStatus(t, round(cpu, 1), int((11.0 + (2.5 if t > 2 else 0)) * 2**30),
                                125 * 2**30))
        warm = min(1.0, max(0.0, (t - training["start_s"]) / 3))
        gpus.append(GpuStatus(t, shown["gpu"], int(96 * rng.uniform(0.97, 1.0)) if busy else 0,
                              round((560 if busy else 118 if t > 2 else 74)
                                    * rng.uniform(0.95, 1.05), 1), 700.0,
                              int(33 + 14 * warm)))
        used = used_at.get(round(t * RATE) / RATE, 0)
        if used:
            processes.append(GpuProcess(t, shown["gpu"], WORKER_PID, "python", used))
    return hosts, gpus, processes


def _steps(shown: dict, rng: random.Random) -> list[Step]:
    training = shown["phases"][-1]
    count = shown["summary"]["steps"]
    start, stop = training["start_s"], training["end_s"]
    first = (stop - start) * 0.2  # step 1 builds the optimizer states and warms cuBLAS
    rest = (stop - start - first) / max(1, count - 1)
    components = shown["components"] or {}
    held = sum(components.get(k, 0) for k in ("weights", "gradients", "optimizer_states"))
    reserved = components.get("peak_reserved")
    mean = shown["summary"]["loss"]
    steps = []
    for k in range(1, count + 1):
        t = start + first + rest * (k - 1) * rng.uniform(0.97, 1.03)
        loss = mean * (1.25 - 0.5 * (k - 1) / max(1, count - 1)) * rng.uniform(0.9, 1.1)
        steps.append(Step(round(t, 4), k, count, round(loss, 4), held or None, reserved))
    return steps


def _add_run(store: Store, shown: dict, rng: random.Random) -> int:
    run_id = store.create_run(shown["options"], shown["backend"], shown["memory_api"],
                              shown["gpu"], shown["environment"], name=shown["name"])
    phases = shown["phases"]
    training_end = phases[-1]["end_s"]
    profiling = shown["options"].get("profile_steps") and shown["operations"] is not None
    end = training_end + (1.5 if profiling else 0.0) + 0.4
    points = _curve(phases, end)
    total = RunFacts.from_dict(shown["environment"]).gpu_total
    samples = [Sample(t, shown["gpu"], used, 615 * MIB, total, None) for t, used in points]
    marks = []
    for phase in phases:
        marks += [PhaseMark("start", phase["name"], phase["start_s"]),
                  PhaseMark("end", phase["name"], phase["end_s"])]
    if profiling:
        # torch.profiler's steps after training: the run's recorded peak was reached there.
        extra = shown["summary"]["peak_bytes"] - phases[-1]["memory_bytes"]
        marks += [PhaseMark("start", "profiling", training_end + 0.05),
                  PhaseMark("end", "profiling", training_end + 1.5)]
        samples = [s._replace(used=s.used + extra)
                   if training_end + 0.05 < s.t <= training_end + 1.5 else s for s in samples]
    messages = [Message(m["t"], m["level"], m["text"]) for m in shown["messages"]]
    hosts, gpus, processes = _device(shown, points, rng)
    store.write(run_id, samples=samples, phases=marks, steps=_steps(shown, rng),
                messages=messages, hosts=hosts, gpus=gpus, processes=processes)
    summary = {k: v for k, v in shown["summary"].items()
               if k not in ("peak_mb", "peak_bytes", "memory_mb")}
    if shown["components"] is not None:
        summary["components"] = {k: v for k, v in shown["components"].items()
                                 if k not in ("context", "non_torch", "peak")}
    if shown["operations"] is not None:
        summary["operations"] = shown["operations"]
    store.update_run(run_id, summary=summary, samples_sent=len(samples),
                     created_at=shown["created_at"], ended_at=shown["ended_at"],
                     worker_pid=WORKER_PID)
    store.set_tags(run_id, ["h200", "seeded"])
    store.finish(run_id, shown["status"])
    store.update_run(run_id, ended_at=shown["ended_at"])
    return run_id


def _add_sweep(store: Store, base: dict, rng: random.Random) -> int:
    """The batch-size sweep's runs, each with the curve its peak and speed imply."""
    sweep = json.loads((DATA / "h200-sweep.json").read_text())
    options = {**base["options"], "max_steps": 5, "profile_steps": 0}
    sweep_id = store.create_sweep("batch_size on bert-large-uncased", options,
                                  {"batch_size": [r["values"]["batch_size"] for r in sweep["runs"]]},
                                  True, len(sweep["runs"]))
    key = store.sweep(sweep_id).key
    for row in sweep["runs"]:
        shown = json.loads(json.dumps(base))
        size = row["values"]["batch_size"]
        shown["options"] = {**options, "batch_size": size}
        shown["operations"] = None
        shown["components"] = None
        shown["messages"] = []
        peak = row["peak_mb"] * MIB
        shown["summary"] = {"time_s": row["time_s"], "samples_per_second": row["samples_per_second"],
                            "steps": 5, "loss": 0.7, "peak_bytes": peak}
        shown["phases"][-1] = {**shown["phases"][-1], "memory_bytes": peak,
                               "end_s": shown["phases"][-1]["start_s"] + (row["time_s"] or 1.0)}
        shown["status"] = row["status"]
        run_id = _add_run(store, shown, rng)
        store.update_run(run_id, sweep=key)
        if row["status"] == "oom":
            store.update_run(run_id, summary={}, error="CUDA out of memory. Tried to allocate "
                             "1.50 GiB (recorded on the H200; seeded here)")
    store.update_sweep(sweep_id, status="completed", ended_at=base["ended_at"] + 600)
    return sweep_id


def build(path: str | Path, sweep: bool = True) -> Store:
    store = Store(path)
    rng = random.Random(1)
    shown = [json.loads((DATA / f"h200-show{i}.json").read_text()) for i in range(1, 5)]
    for run in shown:
        _add_run(store, run, rng)
    if sweep:
        _add_sweep(store, shown[0], rng)
    return store


if __name__ == "__main__":
    store = build(sys.argv[1])
    print(f"{len(store.runs())} runs in {store.path}")
