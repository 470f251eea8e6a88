"""The convolution margin (device_constants.py's `convolution_margin`) from the largest-batch
checks of models with convolutions: each run at the capacity's edge replayed through the
simulated allocator as the prediction sees it now; the margin is the smallest that, times the
share of the forward passes' results a run's convolutions make, keeps every run that ran out of
memory and that the edge margin does not already keep from being taken to fit (plus 0.05 % of
the capacity), on the convolution networks (`--least-share`). CPU only.

    python bench/convolution_margin.py docs/data/h200-2026-12-02/fits-rejudged-actions-3.jsonl
    python bench/convolution_margin.py --write ...   # into prediction/calibration/<gpu>.json
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from prediction_grid import Config, edge_margin, edge_point  # noqa: E402

GPU = "NVIDIA H200"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checks", nargs="+", type=Path, help="bench/prediction_grid.py's "
                        "largest-batch checks (kind 'fits', with their runs)")
    parser.add_argument("--least-share", type=float, default=0.1,
                        help="fit on models whose convolutions make at least this share of the "
                        "forward passes' results (the convolution networks; a ViT's patch "
                        "embedding makes under 1 %%)")
    parser.add_argument("--write", action="store_true", help="write the margin into the GPU's "
                        "calibration file")
    args = parser.parse_args()
    from anatomy.prediction import BatchSizes, device_constants
    from anatomy.prediction.memory import calibration_for

    checks = {}
    for path in args.checks:
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row.get("kind") == "fits":
                checks[row["label"]] = row  # the last file's check of a configuration
    known = device_constants.load(GPU)
    failed, held, labels = [], [], []
    for label, row in checks.items():
        config = Config(**row["config"])
        share = BatchSizes(config.options(), "cuda", calibration_for("cuda", GPU)
                           ).convolution_share
        if share < args.least_share:
            continue
        labels.append(label)
        capacity = row["prediction"]["capacity"]
        for run in row["runs"]:
            point = edge_point(replace(config, batch_size=run["batch_size"]),
                               run["batch_size"], GPU, capacity)
            holds = point["holds_with"]
            (held if run["status"] == "completed" else failed).append((holds, share))
            print(f"{label} b{run['batch_size']}: {run['status']}; held with a margin of "
                  + ("none" if holds < 0 else f"{holds:.3%}")
                  + f"; convolutions' share {share:.3f}", flush=True)
    beyond = [(holds, share) for holds, share in failed if holds >= known.edge_margin]
    if not beyond:
        print("every run with convolutions that ran out of memory is kept by the edge margin")
        return 1
    margin = round(max(edge_margin([holds]) / share for holds, share in beyond), 4)
    wrong = sum(1 for holds, share in held
                if holds < max(known.edge_margin, margin * share))
    print(f"convolution margin: {margin:.2%} of the capacity times the convolutions' share, "
          f"fitted on {', '.join(labels)} ({len(failed)} out of memory, {len(beyond)} beyond the "
          f"edge margin; {len(held)} completed, {wrong} of which it would take for too large)")
    if args.write:
        print("wrote", replace(known, convolution_margin=margin,
                               convolution_fitting_set=tuple(sorted(labels))).save())
    return 0


if __name__ == "__main__":
    sys.exit(main())
