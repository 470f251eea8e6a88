"""How long a run takes to reach training, and where the seconds go (issue 19, point 6: a 1 B
model reaches training within 15 s).

    PYTHONPATH=. python bench/startup.py [--model tinyllama-1.1b] [--runs 3] [--steps 3]

Two measurements, each repeated `--runs` times:
- `runs`: anatomy's own run (RunManager, batch 1 × 128 tokens, 2 steps), each phase's start in
  seconds from the run's start, as the GPU test reads them;
- `steps`: the worker's path step by step in a fresh process of its own (torch imported, the
  CUDA context, transformers imported, the head's class, the config, the model on the meta
  device, its storage on the device, its random values, the Trainer built): seconds each.
On a machine without CUDA both run on the CPU. Results in docs/BENCHMARKS.md ("Start-up").
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

STEPS = r"""
import json, sys, time
t = time.perf_counter()
marks = []
def mark(name):
    global t
    now = time.perf_counter(); marks.append((name, round(now - t, 3))); t = now
from anatomy.analysis import models
from anatomy.analysis.transformers_index import index_once
index_once()
spec = models.resolve(sys.argv[1]); mark("anatomy, model resolved")
import torch; mark("import torch")
device = "cuda" if torch.cuda.is_available() else "cpu"
torch.ones((1, 1)).to(device)
if device == "cuda": torch.cuda.synchronize()
mark("first tensor (CUDA context)")
import transformers; mark("import transformers")
head = models.head_class(spec); mark("head class")
config = models.head_config(head, models.transformers_config(spec)); mark("config")
with torch.device("meta"):
    model = head._from_config(config, dtype=torch.float32)
mark("model on meta")
models.materialise(model, device)
if device == "cuda": torch.cuda.synchronize()
mark("storage on the device")
models.initialise(model)
if device == "cuda": torch.cuda.synchronize()
mark("random values")
from transformers import Trainer, TrainingArguments
mark("import Trainer")
with __import__("tempfile").TemporaryDirectory() as out:
    Trainer(model=model, args=TrainingArguments(output_dir=out, per_device_train_batch_size=1,
            max_steps=2, report_to=[], bf16=False))
mark("Trainer built")
print(json.dumps(marks))
"""


def runs(model: str, count: int) -> list[dict[str, float]]:
    from anatomy.analysis.options import RunOptions
    from anatomy.analysis.report import report
    from anatomy.engine.manager import RunManager
    from anatomy.store import PHASES, Store

    found = []
    with tempfile.TemporaryDirectory() as folder:
        store = Store(Path(folder) / "anatomy.sqlite")
        manager = RunManager(store)
        try:
            for _ in range(count):
                run_id = manager.start(RunOptions(preset=model, batch_size=1, seq_len=128,
                                                  max_steps=2))
                status = manager.wait(run_id, timeout=600)
                rep = report(store, run_id)
                found.append({"status": status, **{str(name.value): round(rep.phase(name).start_s, 2)
                                                   for name in PHASES}})
                print(json.dumps(found[-1]), flush=True)
        finally:
            manager.stop_all()
    return found


def steps(model: str, count: int) -> None:
    for _ in range(count):
        done = subprocess.run([sys.executable, "-c", STEPS, model], capture_output=True,
                              text=True, cwd=ROOT, timeout=600)
        if done.returncode:
            print(done.stderr[-2000:], file=sys.stderr)
            continue
        marks = json.loads(done.stdout.strip().splitlines()[-1])
        print("  ".join(f"{name} {seconds:.2f}" for name, seconds in marks),
              f"| total {sum(s for _, s in marks):.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tinyllama-1.1b")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    print(f"steps of the worker's path, {args.model}, fresh process each (seconds):")
    steps(args.model, args.steps)
    print(f"anatomy runs of {args.model}, each phase's start (seconds from the run's start):")
    runs(args.model, args.runs)


if __name__ == "__main__":
    main()
