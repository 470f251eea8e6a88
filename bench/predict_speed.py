"""How long `anatomy predict` takes for 7 B-parameter decoders (the published configurations in
bench/models/: Llama-2-7B, Mistral-7B), from a cold shell and in a process that has torch and
transformers loaded (the dashboard, the sweep), with and without the disk cache of recordings,
next to the full trace the depth extrapolation replaces; and a 10^6-layer configuration refused.

    PYTHONPATH=. python bench/predict_speed.py [--repeat 3] [--full-repeat 1] [--model PATH ...]

Each figure is measured `--repeat` times (the full traces `--full-repeat` times: they are the
slow "before"); the table gives the minimum (the machine is shared: the least disturbed run) and
the median, wall-clock and CPU seconds (user + system of the process: what the work costs
whatever else runs). Every prediction is for an H200 (`--device cuda --gpu-model "NVIDIA H200"`),
batch 4 × 512 tokens, bf16. Results in docs/BENCHMARKS.md ("Predict, for a 7 B model").
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("bench/models/llama-2-7b.json", "bench/models/mistral-7b.json")
GPU = "NVIDIA H200"
OPTIONS = ["--batch-size", "4", "--seq-len", "512", "--precision", "bf16", "--device", "cuda",
           "--gpu-model", GPU]
# The full trace, as before the extrapolation: the same command with the layers' check saying no.
FULL_TRACE = ("import sys; from anatomy.prediction import recordings; "
              "recordings._repeats = lambda *a: False; from anatomy.cli.entry import main; "
              "sys.exit(main(sys.argv[1:]))")


def shell(command: list[str], cache: str, expect: int = 0) -> tuple[float, float]:
    """Wall and CPU seconds of a fresh process (its exit status must be `expect`)."""
    env = {**os.environ, "ANATOMY_CACHE": cache,
           "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != expect:
        raise SystemExit(f"{' '.join(command)}: exit {done.returncode}\n{done.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def in_process(work) -> tuple[float, float]:
    started, cpu = time.perf_counter(), time.process_time()
    work()
    return time.perf_counter() - started, time.process_time() - cpu


def summary(name: str, runs: list[tuple[float, float]]) -> dict | None:
    if not runs:
        return None
    walls, cpus = [r[0] for r in runs], [r[1] for r in runs]
    return {"case": name, "runs": len(runs), "wall_min": round(min(walls), 2),
            "wall_median": round(statistics.median(walls), 2), "cpu_min": round(min(cpus), 2),
            "cpu_median": round(statistics.median(cpus), 2)}


def cold(model: str, repeat: int, full_repeat: int) -> list[dict]:
    predict = [sys.executable, "-m", "anatomy", "predict", "--model", model, *OPTIONS]
    empty, cached = [], []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as cache:
            empty.append(shell(predict, cache))  # a cold shell, an empty cache
            cached.append(shell(predict, cache))  # a cold shell, the recording on disk
    full = [shell([sys.executable, "-c", FULL_TRACE, "predict", "--model", model, *OPTIONS],
                  "off") for _ in range(full_repeat)]
    name = Path(model).stem
    return [summary(f"{name}: cold shell, empty cache", empty),
            summary(f"{name}: cold shell, recording cached on disk", cached),
            summary(f"{name}: cold shell, full trace (before)", full)]


def warm(model: str, repeat: int, full_repeat: int) -> list[dict]:
    """In this process, torch and transformers loaded, no disk cache: each prediction new
    options (another batch size: another recording)."""
    from anatomy.analysis.options import RunOptions
    from anatomy.prediction import memory, recordings
    from anatomy.prediction import predict as predict_run

    def once(batch: int) -> tuple[float, float]:
        memory._cached_recording.cache_clear()
        options = RunOptions(model=model, batch_size=batch, seq_len=512, precision="bf16")
        return in_process(lambda: predict_run(options, device="cuda", gpu_name=GPU))

    once(1)  # the model's own modules imported (transformers loads them on first use)
    extrapolated = [once(batch) for batch in range(2, 2 + repeat)]
    repeats = recordings._repeats
    recordings._repeats = lambda *a: False
    try:
        full = [once(batch) for batch in range(2, 2 + full_repeat)]
    finally:
        recordings._repeats = repeats
    name = Path(model).stem
    return [summary(f"{name}: warm process, new options", extrapolated),
            summary(f"{name}: warm process, full trace (before)", full)]


def refused(model: str, repeat: int) -> list[dict]:
    from anatomy.analysis.options import RunOptions
    from anatomy.prediction import PredictionError, predict

    deep = Path(tempfile.mkdtemp()) / "deep.json"
    deep.write_text(json.dumps({**json.loads((ROOT / model).read_text()),
                                "num_hidden_layers": 1_000_000}))

    def work():
        try:
            predict(RunOptions(model=str(deep), batch_size=4, seq_len=512), device="cuda",
                    gpu_name=GPU)
        except PredictionError:
            return
        raise AssertionError("a 10^6-layer model was predicted")

    command = [sys.executable, "-m", "anatomy", "predict", "--model", str(deep), *OPTIONS]
    return [summary("10^6 layers: refused, warm process",
                    [in_process(work) for _ in range(repeat)]),
            summary("10^6 layers: refused, cold shell",
                    [shell(command, "off", expect=2) for _ in range(repeat)])]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--full-repeat", type=int, default=1)
    parser.add_argument("--model", nargs="+", default=list(MODELS))
    args = parser.parse_args()
    load = os.getloadavg()
    rows = []
    for model in args.model:
        rows += cold(model, args.repeat, args.full_repeat)
    os.environ["ANATOMY_CACHE"] = "off"
    sys.path.insert(0, str(ROOT))
    import torch  # noqa: F401 - what a warm process (the dashboard) has loaded already
    from transformers import Trainer  # noqa: F401

    for model in args.model:
        rows += warm(model, args.repeat, args.full_repeat)
    rows += refused(args.model[0], args.repeat)
    print(f"machine: {os.cpu_count()} CPUs, load average {load[0]:.1f} at the start, "
          f"{os.getloadavg()[0]:.1f} at the end")
    print("| case | runs | wall min (s) | wall median | CPU min (s) | CPU median |")
    print("|---|---:|---:|---:|---:|---:|")
    rows = [row for row in rows if row is not None]  # a case asked 0 times: not measured
    for row in rows:
        print(f"| {row['case']} | {row['runs']} | {row['wall_min']} | {row['wall_median']} | "
              f"{row['cpu_min']} | {row['cpu_median']} |")
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
