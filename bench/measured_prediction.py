"""`predict --max-batch-size --measure-convolutions`'s own path, on a machine without the GPU: the
workspaces a GPU measured (bench/convolution_workspace_sizes.py's JSON) handed to
`max_batch_size` as its `measure`, in place of the child that measures them (docs/PREDICTION.md,
"The convolutions' workspaces"). Every size the search asks about is answered from the measured
sizes (linear between them), as the child's table would be.

    PYTHONPATH=. python bench/measured_prediction.py docs/data/h200-2026-12-02-s28/ws-oos.json \\
        "resnet-50 fp32" bench/models/resnet-50.json sgd [--gpu-model "NVIDIA H200"]

`--here` (on the GPU): `predict --max-batch-size --measure-convolutions`'s own search, measuring
on this machine's GPU as it goes, and every size it measured written to the JSON file named
first (this format, for the replay above):

    python bench/measured_prediction.py --here $OUT/ws.json "resnet-50 fp32" \\
        bench/models/resnet-50.json sgd
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from anatomy.analysis.options import RunOptions
from anatomy.prediction import memory, workspaces
from anatomy.prediction.device_constants import load

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def table_of(path: Path, run: str) -> workspaces.Table:
    dtype = DTYPES[run.split()[1]]
    table = workspaces.Table()
    for row in json.loads(path.read_text())[run]:
        layer = row["layer"]
        # Files from before the layouts were measured: contiguous, forward and backward alike.
        layouts = [(layer["layout"], layer["gradient"])] if "layout" in layer else \
            [(workspaces.CONTIGUOUS, None), (workspaces.CONTIGUOUS, workspaces.CONTIGUOUS)]
        for layout, gradient in layouts:
            key = workspaces.layer_key([0, *layer["input"]], layer["weight"], layer["stride"],
                                       layer["padding"], layer["dilation"], layer["groups"],
                                       dtype, layout, gradient)
            table.layers[key] = {int(b): (tuple(m["forward"]), tuple(m["backward"]))
                                 for b, m in row["batches"].items()}
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("measured", type=Path, help="convolution_workspace_sizes.py's JSON")
    parser.add_argument("run", help='its entry: "<bench model> <precision>"')
    parser.add_argument("model", help="the model's config")
    parser.add_argument("optim")
    parser.add_argument("--gpu-model", default="NVIDIA H200")
    parser.add_argument("--here", action="store_true",
                        help="measure on this machine's GPU, and write what it measured to "
                             "`measured`")
    args = parser.parse_args()
    if args.here:
        return here(args)
    table = table_of(args.measured, args.run)

    def measure(keys, batches):
        missing = [k for k in keys if k not in table.layers]
        print(f"asked for {len(keys)} convolutions at {batches}; not measured: {len(missing)}",
              file=sys.stderr)
        if missing:
            raise workspaces.WorkspaceError(f"{len(missing)} of the convolutions were not measured")
        return table

    calibration = load(args.gpu_model)
    started = time.monotonic()
    fit = memory.max_batch_size(
        RunOptions(model=args.model, precision=args.run.split()[1], optim=args.optim),
        device="cuda", total=calibration.total_bytes, calibration=calibration, measure=measure)
    print(fit.line(args.gpu_model), f"({time.monotonic() - started:.0f} s)")
    return 0


def here(args) -> int:
    import torch

    measurer = workspaces.Measurer(0)
    seen = workspaces.Table()

    def measure(keys, batches):
        started = time.monotonic()
        table = measurer(keys, batches)
        seen.merge(table)
        print(f"measured {len(keys)} convolutions at {batches} "
              f"({time.monotonic() - started:.1f} s)", file=sys.stderr, flush=True)
        return table

    gpu = torch.cuda.get_device_properties(0)
    calibration = load(gpu.name)
    started = time.monotonic()
    try:
        fit = memory.max_batch_size(
            RunOptions(model=args.model, precision=args.run.split()[1], optim=args.optim),
            device="cuda", total=calibration.total_bytes, calibration=calibration,
            measure=measure)
    finally:
        measurer.close()
    print(fit.line(gpu.name), f"({time.monotonic() - started:.0f} s)")
    print(json.dumps({"max_batch_size": fit.batch_size, "may_fit": fit.may_fit,
                      "tried": list(fit.searched)}))
    rows = [{"layer": {"input": list(key[0]), "weight": list(key[1]), "stride": list(key[2]),
                       "padding": list(key[3]), "dilation": list(key[4]), "groups": key[5],
                       "layout": key[7], "gradient": key[8]},
             "batches": {str(b): {"forward": list(f), "backward": list(w)}
                         for b, (f, w) in sorted(batches.items())}}
            for key, batches in seen.layers.items()]
    args.measured.write_text(json.dumps({args.run: rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
