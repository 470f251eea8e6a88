"""The workspace each convolution of a model asks for on this GPU, by batch size: what a table of
cuDNN's workspaces (docs/measurements/prediction-2026-12-02-convolution-workspaces.md) would hold, and whether
a convolution's workspace grows with the batch, stays put, or jumps (cuDNN's heuristics pick
engines by shape). On a GPU (a CPU lists the convolutions: --dry-run).

Each distinct 2-D convolution of the model (found by running it on the meta device at 224 × 224
or its config's image size) runs alone, forward then backward, on random tensors at each batch
size, in the run's dtype (bf16: what autocast gives cuDNN), with torch's defaults (heuristics
mode, TF32 allowed), the caching allocator's history recorded: its workspaces are the
allocations freed at once (forward: one; backward: the data's, then the filter's). The GPU is
otherwise idle and large: every first engine's workspace fits, as in a run's first step.

    python bench/convolution_workspace_sizes.py --out $OUT/workspaces.json \\
        "regnet-y-040 fp32" --batches 1312,1325,1328,1334,1340
    python bench/convolution_workspace_sizes.py --dry-run "resnet-50 bf16"
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from prediction_grid import bench_model  # noqa: E402

MIB = 2**20


def convolutions(model: str) -> list[dict]:
    """The model's distinct 2-D convolutions, in the order a forward pass makes them first, as
    aten.convolution receives them (the trace's keys: a padding of "same" or "valid" made
    numbers, an input padded where "same" is uneven): the input's shape but the batch, the
    weight's, stride, padding, dilation and groups."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from anatomy.analysis import models

    spec = models.resolve(bench_model(model))
    head = models.head_class(spec)
    config = models.head_config(head, models.transformers_config(spec))
    with torch.device("meta"):
        network = head._from_config(config)
    seen: dict[str, dict] = {}

    class Calls(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.convolution.default and args[1].dim() == 4:
                layer = {"input": list(args[0].shape[1:]), "weight": list(args[1].shape),
                         "stride": list(args[3]), "padding": list(args[4]),
                         "dilation": list(args[5]), "groups": args[8]}
                seen.setdefault(json.dumps(layer, sort_keys=True), layer)
            return func(*args, **(kwargs or {}))

    side = spec.image_size or 224
    with torch.no_grad(), Calls():
        network(pixel_values=torch.empty(1, 3, side, side, device="meta"))
    return list(seen.values())


def _freed_at_once(trace: list[dict]) -> list[int]:
    """Sizes of the allocations freed right after (a kernel's workspace), in order."""
    return [e["size"] for e, after in zip(trace, trace[1:])
            if e["action"] == "alloc" and after["action"] == "free_requested"
            and after["addr"] == e["addr"]]


def _trace() -> list[dict]:
    import torch

    return torch.cuda.memory._snapshot()["device_traces"][0]


def measure(layer: dict, batch: int, dtype) -> dict:
    import torch
    import torch.nn.functional as F

    x = torch.randn(batch, *layer["input"], device="cuda", dtype=dtype, requires_grad=True)
    w = torch.randn(*layer["weight"], device="cuda", dtype=dtype, requires_grad=True)
    torch.cuda.synchronize()
    phases = {}
    for phase in ("forward", "backward"):
        start = len(_trace())  # the history is recorded throughout (main): this phase's part
        if phase == "forward":
            y = F.conv2d(x, w, None, layer["stride"], layer["padding"], layer["dilation"],
                         layer["groups"])
        else:
            y.backward(torch.ones_like(y))
        torch.cuda.synchronize()
        phases[phase] = _freed_at_once(_trace()[start:])
    output = y.numel() * y.element_size()
    del x, w, y
    torch.cuda.empty_cache()
    return {**phases, "output": output}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help='"<bench model> <fp32|bf16|fp16>", or with its '
                        'own batch sizes: "<bench model> <precision>:<b1>,<b2>,..."')
    parser.add_argument("--batches", default="64,256,1024", help="comma-separated")
    parser.add_argument("--out", type=Path, help="the sizes, as JSON")
    parser.add_argument("--dry-run", action="store_true", help="list the convolutions only")
    args = parser.parse_args()
    import torch

    batches = [int(b) for b in args.batches.split(",")]
    if not args.dry_run:  # room for every measurement's actions: none wraps around
        torch.cuda.memory._record_memory_history(context=None, stacks="python",
                                                 max_entries=10_000_000)
    found: dict = {}
    started = time.monotonic()
    for spec in args.runs:
        run, _, own = spec.partition(":")
        model, precision = run.split()
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
        layers = convolutions(model)
        print(f"{run}: {len(layers)} distinct convolutions", flush=True)
        rows = found[run] = []
        for layer in layers:
            row = {"layer": layer, "batches": {}}
            if not args.dry_run:
                for batch in [int(b) for b in own.split(",")] if own else batches:
                    row["batches"][batch] = measure(layer, batch, dtype)
                cells = []
                for batch, m in row["batches"].items():
                    ws = (m["forward"][:1] or [0]) + (m["backward"] + [0, 0])[:2]
                    cells.append(f"b{batch}: " + "/".join(f"{s / MIB:,.1f}" for s in ws)
                                 + f" MiB ({ws[0] / m['output']:.3f}x out)")
                print(f"  {layer['input']} w{layer['weight']} s{layer['stride']} "
                      f"g{layer['groups']}: " + "; ".join(cells), flush=True)
            rows.append(row)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(found, indent=1))
    print(f"{time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
