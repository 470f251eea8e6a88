"""A user's own files on the GPU, measured next to predicted: a Qwen3 config as transformers
saves it (bench/models/qwen3-0.6b-saved.json), JSON lines of 40 texts of 20 to 410 tokens and a
tokenizer saved with save_pretrained (tests/conftest.py make_text_data), all by relative paths
from the user's folder. For each case: the run's allocator peak (torch.cuda.max_memory_allocated,
the probe's), the run's own prediction at the micro-batch it measured, and `predict` at the
data's longest batch.

    PYTHONPATH=. python3 bench/users_files_gpu.py [--dummy] [$OUT/users-files.json]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from anatomy.analysis.report import report
from anatomy.prediction.breakdown import NoPrediction, predicted
from anatomy.store import Store
from tests.conftest import PROJECT, make_text_data

CASES = {
    "bf16 weights, LoRA r16": ["--precision", "bf16", "--weights", "bf16", "--lora-rank", "16"],
    "bf16 mixed precision, full": ["--precision", "bf16"],
    "bf16 mixed precision, LoRA r16": ["--precision", "bf16", "--lora-rank", "16"],
    "bf16 weights, LoRA r16, checkpointing": ["--precision", "bf16", "--weights", "bf16",
                                               "--lora-rank", "16", "--gradient-checkpointing"],
}


def main() -> int:
    named = [a for a in sys.argv[1:] if not a.startswith("--")]
    out = Path(named[0]) if named else None
    folder = Path(tempfile.mkdtemp(prefix="users-files-"))
    (folder / "my-qwen3").mkdir()
    (folder / "my-qwen3" / "config.json").write_text(
        (PROJECT / "bench" / "models" / "qwen3-0.6b-saved.json").read_text())
    make_text_data(folder / "data", tuple(range(20, 420, 10)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, (str(PROJECT), os.environ.get("PYTHONPATH"))))}
    rows = []
    # `--dummy`: the same cases on the dummy data at the longest text's length (no padding, no
    # attention mask): what of a miss is the dataset's, what the model's
    data = ["--seq-len", "410"] if "--dummy" in sys.argv else \
        ["--dataset", "data/texts.jsonl", "--tokenizer", "data/tokenizer"]
    for number, (case, more) in enumerate(CASES.items(), start=1):
        flags = ["--model", "my-qwen3", *data, "--batch-size", "8", "--max-steps", "5", *more]
        run = subprocess.run([sys.executable, "-m", "anatomy", "run", *flags, "--store",
                              "u.sqlite"], cwd=folder, env=env, capture_output=True, text=True)
        if run.returncode != 0:
            print(case, "failed:", run.stderr.strip().splitlines()[-1:], file=sys.stderr)
            continue
        rep = report(Store(folder / "u.sqlite"), number)
        own = predicted(rep)
        said = subprocess.run([sys.executable, "-m", "anatomy", "predict", *flags, "--json"],
                              cwd=folder, env=env, capture_output=True, text=True)
        longest = json.loads(said.stdout)["components"]["peak"] if said.returncode == 0 else None
        row = {"case": case, "data": "dummy" if "--dummy" in sys.argv else "texts.jsonl",
               "gpu": rep.environment.gpu_name,
               "measured_peak_allocated": rep.components.peak_allocated,
               "predicted_at_measured_batch": None if isinstance(own, NoPrediction) else own.peak,
               "predicted_at_longest_batch": longest}
        if row["predicted_at_measured_batch"]:
            row["error_percent"] = round(100 * (row["predicted_at_measured_batch"]
                                                / row["measured_peak_allocated"] - 1), 3)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if out is not None:
        out.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
