"""The workspace band (device_constants.py's `workspace_band`) from the cuDNN workspaces a GPU
measured for whole networks (bench/convolution_workspace_sizes.py's JSON): each network traced
at each measured batch size without its workspaces and with them in each call's place
(prediction/workspaces.Placeholders, as `predict --measure-convolutions` places them), both
replayed through the simulated caching allocator with no device around it; what the workspaces
add to the reserve, over the convolutions' share of the allocated peak. The band is the largest.

    PYTHONPATH=. python bench/workspace_band.py            # the H200's, printed
    PYTHONPATH=. python bench/workspace_band.py --write    # into prediction/calibration/<gpu>.json

About 15 minutes on a 2-core machine (RegNet-Y-040 at 666 and 999 is most of it).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from measured_prediction import table_of  # noqa: E402

from anatomy.analysis.options import RunOptions  # noqa: E402
from anatomy.prediction import memory, workspaces  # noqa: E402
from anatomy.prediction.device_constants import load  # noqa: E402

DATA = HERE.parent / "docs" / "data"
MIB = 2**20
# (measured file, its entry, bench model, optimizer, batch sizes): the sizes measured away from
# the capacity's edge where there are any (cuDNN's first engines, as a run far from it gets).
FITTING_SET = (
    ("h200-2026-12-02-s28/ws-oos.json", "resnet-50 fp32", "resnet-50", "sgd", (64, 256)),
    ("h200-2026-12-02-s28/ws-oos.json", "mobilenet-v2 fp32", "mobilenet-v2", "sgd", (64, 256)),
    ("h200-2026-12-02-s28/ws-oos.json", "efficientnet-b0 bf16", "efficientnet-b0",
     "adamw_torch", (64, 256)),
    ("h200-2026-12-02-s29/ws-regnet-y-040-fp32.json", "regnet-y-040 fp32", "regnet-y-040",
     "sgd", (666, 999)),
    ("h200-2026-12-02-s28/ws-resnet.json", "resnet-50 bf16", "resnet-50", "adamw_torch",
     (3254,)),
)


def added(path: Path, run: str, model: str, optim: str, batch: int, calibration) -> dict:
    """What the measured workspaces add to the reserve of `run` at `batch`."""
    options = RunOptions(model=f"bench/models/{model}.json", precision=run.split()[1],
                         optim=optim, batch_size=batch)
    plain = memory.BatchSizes(options, "cuda", calibration)
    without = plain.measure(batch)
    placeholders = workspaces.Placeholders(table_of(path, run))
    with_them = memory.BatchSizes(options, "cuda", calibration,
                                  workspaces=placeholders).measure(batch)
    share = plain.convolution_share
    extra = with_them.peak_reserved - without.peak_reserved
    return {"label": f"{run} b{batch}", "peak": without.peak_allocated, "share": share,
            "reserve": without.peak_reserved, "with": with_them.peak_reserved,
            "band": extra / (share * without.peak_allocated)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu-model", default="NVIDIA H200")
    parser.add_argument("--write", action="store_true",
                        help="write the band into the GPU's calibration file")
    args = parser.parse_args()
    calibration = load(args.gpu_model)
    rows = []
    for name, run, model, optim, batches in FITTING_SET:
        for batch in batches:
            row = added(DATA / name, run, model, optim, batch, calibration)
            rows.append(row)
            print(f"{row['label']}: peak {row['peak'] / MIB:,.0f} MiB, reserve "
                  f"{row['reserve'] / MIB:,.0f} -> {row['with'] / MIB:,.0f} MiB with the "
                  f"workspaces, convolutions' share {row['share']:.3f}: "
                  f"{row['band']:.3f} of share x peak", flush=True)
    band = max(row["band"] for row in rows)
    print(f"workspace band: {band:.3f}")
    if args.write:
        print("wrote", replace(calibration, workspace_band=round(band, 3),
                               workspace_band_fitting_set=tuple(r["label"] for r in rows)).save())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
