"""A run on a dataset, on this machine's device, held against `predict` at the longest batch the
data can form (and beside it, the typical one).

    python bench/dataset_longest_batch.py [--model tiny-llama] [--batch-size 16] [--out DIR]

The data is tools/demo_texts.py's 2,000 reviews (5 to 120 tokens, log-normal) with its
word-level tokenizer, made under DIR. Two runs of one epoch each:
- padded to max_length (128): every batch is the longest, so the probe's components (its first
  three steps) and the allocator's peak compare with the prediction directly;
- padded to each batch's longest (DataCollatorWithPadding): the probe's first steps hold
  whatever batches the shuffle gave; its components are held against the run's own prediction,
  made at the micro-batch it measured (`measured_batch`, `predicted_measured_batch`), and the
  sampled peak (NVML on a GPU, RSS on a CPU) covers every step, the longest batch's included, and
  is held against the predicted peak at it (`predicted_reach_peak`: NVML's figure on a GPU, on a
  CPU the tensors' peak plus what the process held before training).
Prints one JSON line per run: measured and predicted, bytes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

COMPARED = ("weights", "gradients", "optimizer_states", "activations", "peak_allocated",
            "peak_reserved")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    from anatomy.analysis.report import report
    from anatomy.prediction.breakdown import cpu_peak, data_reach, measured_peak, predicted
    from anatomy.store import Store
    from anatomy.views.text import measured_text_batch
    from tools import demo_texts

    folder = args.out or Path(tempfile.mkdtemp(prefix="anatomy-dataset-bench-"))
    dataset, tokenizer = demo_texts.build(folder)
    store = folder / "runs.sqlite"
    for padding in (["--padding", "max_length", "--max-length", "128"], []):
        flags = ["--model", args.model, "--batch-size", str(args.batch_size), "--epochs", "1",
                 "--dataset", str(dataset), "--tokenizer", str(tokenizer), *padding]
        subprocess.run([sys.executable, "-m", "anatomy", "run", *flags, "--store", str(store)],
                       check=True)
        said = json.loads(subprocess.run(
            [sys.executable, "-m", "anatomy", "predict", *flags, "--json"], check=True,
            capture_output=True, text=True).stdout)
        rep = report(Store(store), Store(store).runs()[0].id)
        parts, own, reach = rep.components, predicted(rep), data_reach(rep)
        batch = measured_text_batch(rep)
        longest = reach.prediction if reach else None
        expected = None if longest is None else (
            longest.nvml_peak if rep.on_gpu else cpu_peak(rep, longest).peak)
        print(json.dumps({
            "padding": padding[1] if padding else "longest", "device": rep.device_name,
            "measured": {k: getattr(parts, k) for k in COMPARED},
            "measured_batch": None if batch is None else [batch.size, batch.padded_to],
            "predicted_measured_batch": {k: getattr(own.as_components(), k) for k in COMPARED},
            "sampled_peak": measured_peak(rep),
            "predicted_reach_peak": expected,
            "predicted_longest": {**said["components"],
                                  "peak_reserved": said.get("peak_reserved"),
                                  "nvml_peak": said.get("nvml_peak")},
            "longest_batch": [len(said["dataset"]["longest_batch"]),
                              said["dataset"]["longest_padded_to"]],
            "typical_batch": [len(said["dataset"]["typical_batch"]),
                              said["dataset"]["typical_padded_to"]],
            "predicted_typical_peak": said["dataset"]["typical"]["components"]["peak"],
        }))


if __name__ == "__main__":
    main()
