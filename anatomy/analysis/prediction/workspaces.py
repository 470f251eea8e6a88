"""cuDNN's convolution workspaces, measured on this machine's GPU, in place of the convolution
margin (docs/PREDICTION.md, "The convolutions' workspaces").

cuDNN's heuristics pick each convolution's engine, and with it the workspace it asks the caching
allocator for, by the convolution's shapes and the batch size: neither PyTorch's source nor a CPU
gives the sizes, and at the capacity's edge they decide which batch sizes run (a refused one
releases the allocator's cache, and its convolution runs without one from then on:
`replay.Workspace`). Measured alone, forward then backward, each distinct convolution asks for
the workspaces it asks for inside the run, to the byte (RegNet-Y-040 343 of 345 calls, ResNet-50
159 of 159 on the H200). So `predict --max-batch-size --measure-convolutions`, on the machine
whose GPU the run will use:

1. traces the run once more with a seam that logs its distinct convolutions (`Logged`);
2. measures each alone on the GPU at a few batch sizes around the margin's answer, in a child
   process with its own CUDA context (`measure`: nothing stays on the device);
3. traces again with a placeholder workspace per call and part (`Placeholders`), which each
   replayed batch size gets the measured bytes for (`Table.size`: linear in the batch size
   between two measured sizes, exact for 142 of 156 RegNet and 65 of 65 ResNet-50 workspaces;
   outside them the nearest's bytes per sample).

Only 2-D convolutions that are not transposed are measured; a run with any other keeps the
margin.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field

PLACEHOLDER = 512  # a placeholder workspace's bytes in the traces at batch sizes 2 and 3
MEASURE_TIMEOUT_S = 900


class WorkspaceError(RuntimeError):
    """The workspaces could not be measured here: one line saying why."""


def layer_key(input_shape, weight_shape, stride, padding, dilation, groups, dtype) -> tuple:
    """A convolution as the measurement names it: its input but the batch, its weight, stride,
    padding, dilation, groups and dtype."""
    return (tuple(int(n) for n in input_shape[1:]), tuple(int(n) for n in weight_shape),
            tuple(int(n) for n in stride), tuple(int(n) for n in padding),
            tuple(int(n) for n in dilation), int(groups), str(dtype).removeprefix("torch."))


def call_key(func, args) -> tuple[tuple, tuple[str, ...], bool] | None:
    """A traced convolution call's layer, the parts of it that may take a workspace (forward;
    backward: the data's gradient, the filter's), and whether the data's gradient is made; None
    for one the measurement does not make (transposed, not 2-D)."""
    import torch

    if func is torch.ops.aten.convolution.default:
        if args[6] or args[1].dim() != 4:
            return None
        return (layer_key(args[0].shape, args[1].shape, args[3], args[4], args[5], args[8],
                          args[0].dtype), ("forward",), True)
    if args[7] or args[2].dim() != 4:
        return None
    mask = args[10]
    parts = (("data",) if mask[0] else ()) + (("filter",) if mask[1] else ())
    return (layer_key(args[1].shape, args[2].shape, args[4], args[5], args[6], args[9],
                      args[1].dtype), parts, bool(mask[0]))


@dataclass
class Table:
    """Measured workspaces: layer key -> batch size -> (forward's, backward's) bytes, in the order
    the kernels asked for them. A backward's are the data's gradient's then the filter's; one
    alone is the filter's (aten's cuDNN backward runs them in that order; RegNet's 1 × 1
    convolutions ask for the filter's only)."""

    layers: dict[tuple, dict[int, tuple[tuple[int, ...], tuple[int, ...]]]] = \
        field(default_factory=dict)

    def parts(self, key: tuple, batch: int, data_wanted: bool) -> dict[str, tuple[int, ...]]:
        forward, backward = self.layers[key][batch]
        return {"forward": forward, "data": backward[:-1] if data_wanted else (),
                "filter": backward[-1:]}

    def most(self, key: tuple, part: str, data_wanted: bool) -> int:
        """The most workspaces `part` asked for at any measured size: placeholders to make."""
        return max(len(self.parts(key, b, data_wanted)[part]) for b in self.layers[key])

    def at(self, key: tuple, part: str, index: int, batch: int, data_wanted: bool) -> int:
        """The `index`th workspace of `part` at a measured `batch` (0: it asked for none)."""
        sizes = self.parts(key, batch, data_wanted)[part]
        return sizes[index] if index < len(sizes) else 0

    def around(self, key: tuple, batch: int) -> tuple[int | None, int | None]:
        """The measured sizes nearest below and above `batch` (None where there is none)."""
        batches = sorted(self.layers[key])
        lower = [b for b in batches if b < batch]
        upper = [b for b in batches if b > batch]
        return (lower[-1] if lower else None), (upper[0] if upper else None)

    def size(self, key: tuple, part: str, index: int, batch: int, data_wanted: bool) -> int:
        """The `index`th workspace of `part` at `batch`: measured there, else linear in the batch
        size between the two measured sizes around it, else the nearest's bytes per sample."""
        if batch in self.layers[key]:
            return self.at(key, part, index, batch, data_wanted)
        b1, b2 = self.around(key, batch)
        if b1 is None or b2 is None:
            nearest = b1 if b2 is None else b2
            return round(self.at(key, part, index, nearest, data_wanted) * batch / nearest)
        w1, w2 = (self.at(key, part, index, b, data_wanted) for b in (b1, b2))
        return round(w1 + (w2 - w1) * (batch - b1) / (b2 - b1))


class Logged:
    """tracing/cuda.py's `convolution_workspaces` for a first trace: the run's distinct
    convolutions, none given a workspace."""

    def __init__(self):
        self.keys: dict[tuple, None] = {}
        self.unmeasurable = 0

    def __call__(self, func, args, out) -> list:
        found = call_key(func, args)
        if found is None:
            self.unmeasurable += 1
        else:
            self.keys.setdefault(found[0])
        return []


class Placeholders:
    """tracing/cuda.py's `convolution_workspaces` with a table: a placeholder workspace
    (replay.Workspace of PLACEHOLDER bytes, keyed by its part, index and layer) per workspace
    the call's parts asked for, the same at the traced sizes 2 and 3 (so each stays one in the
    linear recording); `fill` gives each its measured bytes at a batch size."""

    def __init__(self, table: Table):
        self.table = table

    def __call__(self, func, args, out) -> list:
        from anatomy.analysis.prediction.replay import Workspace

        found = call_key(func, args)
        if found is None or found[0] not in self.table.layers:
            return []
        key, parts, data_wanted = found
        return [Workspace(PLACEHOLDER, (part, index, data_wanted, key)) for part in parts
                for index in range(self.table.most(key, part, data_wanted))]

    def fill(self, events: list, batch: int) -> list:
        from anatomy.analysis.prediction.replay import Workspace

        return [(kind, tid, Workspace(self.table.size(value.key[3], value.key[0], value.key[1],
                                                      batch, value.key[2]), value.key))
                if isinstance(value, Workspace) and len(value.key) == 4 else (kind, tid, value)
                for kind, tid, value in events]


def measure(keys: list[tuple], batches: list[int], gpu: int = 0,
            timeout: float = MEASURE_TIMEOUT_S) -> Table:
    """Each convolution of `keys` alone at each batch size, forward then backward, on this
    machine's GPU `gpu` (torch's index), in a child process (its CUDA context, and every tensor
    it made, gone when it ends). WorkspaceError in one line where it cannot."""
    request = json.dumps({"keys": [list(k) for k in keys], "batches": batches, "gpu": gpu})
    try:
        done = subprocess.run([sys.executable, "-m", "anatomy.analysis.prediction.workspaces"],
                              input=request, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise WorkspaceError(f"measuring the convolutions took more than {timeout:.0f} s") \
            from None
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise WorkspaceError(f"measuring the convolutions on the GPU failed: {last[:300]}")
    table = Table()
    try:
        for row in json.loads(done.stdout.strip().splitlines()[-1]):
            table.layers[_key_of(row["key"])] = {
                int(b): (tuple(m[0]), tuple(m[1])) for b, m in row["batches"].items()}
    except (IndexError, ValueError, KeyError, TypeError):
        raise WorkspaceError("measuring the convolutions on the GPU gave no table") from None
    missing = [key for key in keys if key not in table.layers]
    if missing:
        raise WorkspaceError(f"{len(missing)} of the convolutions were not measured")
    return table


def _key_of(listed: list) -> tuple:
    """A key back from JSON's lists."""
    return tuple(tuple(part) if isinstance(part, list) else part for part in listed)


def _measure_here(keys: list[tuple], batches: list[int], gpu: int = 0) -> list[dict]:
    """In the child: each convolution alone, the caching allocator's history recorded; its
    workspaces are the allocations freed right after they are made."""
    import torch
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        raise WorkspaceError("no CUDA GPU here")
    torch.cuda.set_device(gpu)
    torch.cuda.memory._record_memory_history(context=None, stacks="python",
                                             max_entries=1_000_000)

    def trace() -> list[dict]:
        return torch.cuda.memory._snapshot()["device_traces"][0]

    def freed_at_once(events: list[dict]) -> list[int]:
        return [e["size"] for e, after in zip(events, events[1:])
                if e["action"] == "alloc" and after["action"] == "free_requested"
                and after["addr"] == e["addr"]]

    rows = []
    for key in keys:
        shape, weight, stride, padding, dilation, groups, dtype = key
        kind = getattr(torch, dtype)
        row = {"key": list(key), "batches": {}}
        for batch in batches:
            x = torch.randn(batch, *shape, device="cuda", dtype=kind, requires_grad=True)
            w = torch.randn(*weight, device="cuda", dtype=kind, requires_grad=True)
            torch.cuda.synchronize()
            start = len(trace())
            y = F.conv2d(x, w, None, stride, padding, dilation, groups)
            torch.cuda.synchronize()
            middle = len(trace())
            y.backward(torch.ones_like(y))
            torch.cuda.synchronize()
            events = trace()
            row["batches"][batch] = [freed_at_once(events[start:middle]),
                                     freed_at_once(events[middle:])]
            del x, w, y
            torch.cuda.empty_cache()
        rows.append(row)
    return rows


if __name__ == "__main__":  # the child of `measure`: its request on standard input
    try:
        asked = json.loads(sys.stdin.read())
        keys = [_key_of(k) for k in asked["keys"]]
        batches = [int(b) for b in asked["batches"]]
        gpu = int(asked.get("gpu", 0))
    except (ValueError, KeyError, TypeError, AttributeError):
        print("expects on standard input what prediction/workspaces.measure sends: "
              '{"keys": [...], "batches": [...], "gpu": 0}', file=sys.stderr)
        sys.exit(2)
    try:
        measured = _measure_here(keys, batches, gpu)
    except (WorkspaceError, RuntimeError, ValueError, TypeError, AttributeError) as error:
        print(str(error).splitlines()[0] if str(error) else type(error).__name__,
              file=sys.stderr)
        sys.exit(1)
    print(json.dumps(measured))
