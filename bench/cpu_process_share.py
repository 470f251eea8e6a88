"""What a CPU run's process holds beside its tensors at its peak, measured: the prediction's
capacity on a CPU (prediction/memory.py's `CPU_PROCESS`) is the RAM (or the container's limit)
less it.

    PYTHONPATH=. python bench/cpu_process_share.py --out /tmp/share [--write]

Runs `anatomy run` on this CPU for each configuration of `RUNS` (small models, batch sizes whose
tensors range from a few hundred MiB to a few GiB), then reads each run's share as the Anatomy
page does (prediction/breakdown.py's `process_share`: its RSS peak less its tensors' predicted
peak). The share grows with the tensors (glibc keeps part of what they freed): a line with the
steepest growth two runs of one model show, raised until no run lies above it, is the share a
prediction keeps free (`fit`). Prints a markdown table; `--write` writes the line to
anatomy/prediction/cpu_process.json; `--runs-in STORE` reads the runs of an earlier
measurement instead of running them again. Results in docs/measurements/prediction-cpu-process-share.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUTPUT = HERE.parent / "anatomy" / "prediction" / "cpu_process.json"
MIB = 2**20
# (model, batch size, sequence length): tensors from ~0.2 to ~2.4 GiB.
RUNS = [("tiny", 8, 512), ("tiny", 32, 512), ("tiny", 64, 512), ("tiny-gpt2", 8, 512),
        ("tiny-gpt2", 64, 512), ("tiny-llama", 32, 256)]


def run_all(store_path: Path) -> None:
    for model, batch, seq in RUNS:
        subprocess.run([sys.executable, "-m", "anatomy", "run", "--model", model, "--batch-size",
                        str(batch), "--seq-len", str(seq), "--max-steps", "2", "--store",
                        str(store_path)], cwd=HERE.parent, check=True, capture_output=True)


def measure(store_path: Path) -> list[dict]:
    """Each completed CPU run of the store: its tensors' predicted peak, its RSS peak, and what
    its process held beside the tensors."""
    from anatomy.analysis.report import report
    from anatomy.prediction.breakdown import prediction_for, process_share
    from anatomy.store import Store

    store = Store(store_path, read_only=True)
    rows = []
    for run in reversed(store.runs()):
        rep = report(store, run.id)
        prediction = prediction_for(rep)
        if rep.status != "completed" or prediction is None:
            continue
        share = process_share(rep, prediction)
        if share is not None:
            rows.append({"model": rep.model, "tensors": prediction.peak,
                         "run": f"{rep.model} b{rep.ran_with.batch_size} s{rep.ran_with.seq_len}",
                         "peak": rep.summary.peak_bytes, "share": share})
    return rows


def fit(rows: list[dict]) -> tuple[int, float]:
    """(fixed bytes, fraction of the tensors): share = fixed + fraction × tensors. The fraction
    is the steepest growth of the share with the tensors between two runs of one model (a
    model's larger runs grow at least so); the fixed part is raised until no run lies above."""
    slopes = [(b["share"] - a["share"]) / (b["tensors"] - a["tensors"])
              for a in rows for b in rows
              if a["model"] == b["model"] and b["tensors"] > a["tensors"]]
    fraction = round(max([0.0, *slopes]), 3)
    return max(round(r["share"] - fraction * r["tensors"]) for r in rows), fraction


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="a folder for the runs' store")
    parser.add_argument("--write", action="store_true", help=f"write {OUTPUT.name}")
    parser.add_argument("--runs-in", type=Path, help="a store of an earlier measurement's runs")
    args = parser.parse_args()
    store_path = args.runs_in
    if store_path is None:
        args.out.mkdir(parents=True, exist_ok=True)
        store_path = args.out / "cpu-process-share.sqlite"
        run_all(store_path)
    rows = measure(store_path)
    fixed, fraction = fit(rows)
    print("| run | tensors' peak (MiB, predicted) | RSS peak (MiB) | beside the tensors (MiB) |"
          " the line (MiB) |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['run']} | {r['tensors'] / MIB:,.0f} | {r['peak'] / MIB:,.0f} | "
              f"{r['share'] / MIB:,.0f} | {(fixed + fraction * r['tensors']) / MIB:,.0f} |")
    print(f"\nshare = {fixed / MIB:,.0f} MiB + {fraction} × the tensors' peak")
    if args.write:
        import torch
        import transformers

        # The run's other processes (companions_bytes, the fronts' own) are measured apart:
        # every figure this bench does not fit is kept as it is.
        kept = json.loads(OUTPUT.read_text())
        OUTPUT.write_text(json.dumps({
            **kept, "fixed_bytes": fixed, "tensor_fraction": fraction,
            "measured": f"bench/cpu_process_share.py on {platform.machine()} Linux "
                        f"{platform.release()}, Python {platform.python_version()}, torch "
                        f"{torch.__version__}, transformers {transformers.__version__}",
            "runs": [r["run"] for r in rows]}, indent=2) + "\n")
        print(f"wrote {OUTPUT}")


if __name__ == "__main__":
    main()
