"""cuDNN's convolution workspaces, measured on this machine's GPU, in place of the convolution
margin (docs/measurements/prediction-2026-12-02-convolution-workspaces.md).

cuDNN's heuristics pick each convolution's engine, and with it the workspace it asks the caching
allocator for, by the convolution's shapes and the batch size: neither PyTorch's source nor a CPU
gives the sizes, and at the capacity's edge they decide which batch sizes run (a refused one
releases the allocator's cache, and its convolution runs without one from then on:
`replay.Workspace`). Measured alone, forward then backward, each distinct convolution asks for
the workspaces it asks for inside the run, to the byte (RegNet-Y-040 343 of 345 calls, ResNet-50
159 of 159 on the H200). So `predict --max-batch-size --measure-convolutions`, on the machine
whose GPU the run will use:

1. traces the run once more with a seam (`Placeholders`) that logs its distinct convolutions
   and puts placeholder workspaces in each call's place, which each replayed batch size gets
   its own measured bytes for (`Table.size`);
2. measures each alone on the GPU, in a child process with its own CUDA context that stays for
   the search (`Measurer`: nothing stays on the device once it ends): first at the margin's two
   answers, then at every batch size the search asks about near the edge. cuDNN's heuristics
   change engines between neighbouring sizes (ResNet-50 fp32's strided 3 × 3 asks 5.010 × its
   output at 1,709 and 1,712, 5.001 × at 1,702 and 1,716), and a few MiB decide whether a
   6 GB workspace finds its block: the H200's edge there is ragged (1,709 ran, 1,710 did not,
   1,711 ran, 1,712 did not), which no line between two measured sizes can tell.

Only 2-D convolutions that are not transposed are measured; a run with any other keeps the
margin.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

PLACEHOLDER = 512  # a placeholder workspace's bytes in the traces at batch sizes 2 and 3
MEASURE_TIMEOUT_S = 900  # one request's: every convolution at its batch sizes
SPARE = 2  # placeholders per part beyond none: a size measured later may ask for more


class WorkspaceError(RuntimeError):
    """The workspaces could not be measured here: one line saying why."""


CONTIGUOUS, CHANNELS_LAST = "contiguous", "channels_last"


def layer_key(input_shape, weight_shape, stride, padding, dilation, groups, dtype,
              layout: str = CONTIGUOUS, gradient: str | None = None) -> tuple:
    """A convolution as the measurement names it: its input but the batch, its weight, stride,
    padding, dilation, groups and dtype, the input's memory layout and, for a backward call,
    its output gradient's (None for a forward call). cuDNN's engines, and with them the
    workspaces, follow the layouts: ConvNeXt's convolutions take channels-last inputs (its
    blocks permute), and measured on contiguous ones they asked the H200 for 2 GB where the run
    asked for nothing, and nothing where the run asked for 2.7 GB."""
    return (tuple(int(n) for n in input_shape[1:]), tuple(int(n) for n in weight_shape),
            tuple(int(n) for n in stride), tuple(int(n) for n in padding),
            tuple(int(n) for n in dilation), int(groups), str(dtype).removeprefix("torch."),
            layout, gradient)


def layout_of(tensor) -> str:
    """Channels-last where the strides are (and not also contiguous), as cuDNN's
    suggest_memory_format reads them; contiguous otherwise."""
    import torch

    if tensor.dim() == 4 and not tensor.is_contiguous() \
            and tensor.is_contiguous(memory_format=torch.channels_last):
        return CHANNELS_LAST
    return CONTIGUOUS


def call_key(func, args) -> tuple[tuple, tuple[str, ...], bool] | None:
    """A traced convolution call's layer, the parts of it that may take a workspace (forward;
    backward: the data's gradient, the filter's), and whether the data's gradient is made; None
    for one the measurement does not make (transposed, not 2-D)."""
    import torch

    if func is torch.ops.aten.convolution.default:
        if args[6] or args[1].dim() != 4:
            return None
        return (layer_key(args[0].shape, args[1].shape, args[3], args[4], args[5], args[8],
                          args[0].dtype, layout_of(args[0])), ("forward",), True)
    if args[7] or args[2].dim() != 4:
        return None
    mask = args[10]
    parts = (("data",) if mask[0] else ()) + (("filter",) if mask[1] else ())
    return (layer_key(args[1].shape, args[2].shape, args[4], args[5], args[6], args[9],
                      args[1].dtype, layout_of(args[1]), layout_of(args[0])), parts,
            bool(mask[0]))


@dataclass
class Table:
    """Measured workspaces: layer key -> batch size -> (forward's, backward's) bytes, in the order
    the kernels asked for them. A backward's are the data's gradient's then the filter's; one
    alone is the filter's (aten's cuDNN backward runs them in that order; RegNet's 1 × 1
    convolutions ask for the filter's only)."""

    layers: dict[tuple, dict[int, tuple[tuple[int, ...], tuple[int, ...]]]] = \
        field(default_factory=dict)

    def merge(self, other: Table) -> None:
        for key, batches in other.layers.items():
            self.layers.setdefault(key, {}).update(batches)

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


class Placeholders:
    """tracing/cuda.py's `convolution_workspaces`: the run's distinct convolutions logged as the
    trace meets them (`keys`; `unmeasurable`: transposed or not 2-D ones, given none), and
    placeholder workspaces (replay.Workspace of PLACEHOLDER bytes, keyed by its part, index and
    layer) per part of each call, as many as the part asked for at any size measured by then and
    at least SPARE, the same at the traced sizes 2 and 3 (so each stays one in the linear
    recording); `fill` gives each its bytes at a batch size from the table, measured after the
    trace (0: the allocator skips it)."""

    def __init__(self, table: Table | None = None):
        self.table = Table() if table is None else table
        self.keys: dict[tuple, None] = {}
        self.unmeasurable = 0
        self.made: dict[tuple, int] = {}  # (layer, part, data wanted) -> placeholders

    def __call__(self, func, args, out) -> list:
        from anatomy.prediction.replay import Workspace

        found = call_key(func, args)
        if found is None:
            self.unmeasurable += 1
            return []
        key, parts, data_wanted = found
        self.keys.setdefault(key)
        made = []
        for part in parts:
            measured = self.table.most(key, part, data_wanted) if key in self.table.layers else 0
            count = max(SPARE, measured)
            self.made[(key, part, data_wanted)] = count
            made += [Workspace(PLACEHOLDER, (part, index, data_wanted, key))
                     for index in range(count)]
        return made

    def short(self, batch: int) -> bool:
        """Whether a part at `batch` asked for more workspaces than the trace has places for
        (then the placeholders are traced again)."""
        return any(len(self.table.parts(key, batch, data_wanted)[part]) > count
                   for (key, part, data_wanted), count in self.made.items()
                   if batch in self.table.layers.get(key, {}))

    def fill(self, events: list, batch: int) -> list:
        from anatomy.prediction.replay import Workspace

        return [(kind, tid, Workspace(self.table.size(value.key[3], value.key[0], value.key[1],
                                                      batch, value.key[2]), value.key))
                if isinstance(value, Workspace) and len(value.key) == 4 else (kind, tid, value)
                for kind, tid, value in events]

def measure(keys: list[tuple], batches: list[int], gpu: int = 0,
            timeout: float = MEASURE_TIMEOUT_S) -> Table:
    """Each convolution of `keys` alone at each batch size, once (`Measurer`)."""
    with Measurer(gpu, timeout) as measurer:
        return measurer(keys, batches)


class Measurer:
    """Each convolution alone at the batch sizes asked for, forward then backward, on this
    machine's GPU `gpu` (torch's index), in one child process kept for every request (its CUDA
    context, and every tensor it made, gone when it is closed; it ends by itself when this
    process does, its standard input closed). WorkspaceError in one line where it cannot."""

    def __init__(self, gpu: int = 0, timeout: float = MEASURE_TIMEOUT_S):
        self.gpu, self.timeout = gpu, timeout
        self._child: subprocess.Popen | None = None
        self._errors = None

    def __enter__(self) -> Measurer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __call__(self, keys: list[tuple], batches: list[int]) -> Table:
        child = self._started()
        request = json.dumps({"keys": [list(k) for k in keys], "batches": batches,
                              "gpu": self.gpu})
        try:
            child.stdin.write(request + "\n")
            child.stdin.flush()
        except OSError:
            raise self._failed() from None
        ready, _, _ = select.select([child.stdout], [], [], self.timeout)
        if not ready:
            self.close()
            raise WorkspaceError(f"measuring the convolutions took more than {self.timeout:.0f} s")
        line = child.stdout.readline()
        if not line:
            raise self._failed()
        table = Table()
        try:
            for row in json.loads(line):
                table.layers[_key_of(row["key"])] = {
                    int(b): (tuple(m[0]), tuple(m[1])) for b, m in row["batches"].items()}
        except (ValueError, KeyError, TypeError, IndexError):
            self.close()
            raise WorkspaceError("measuring the convolutions on the GPU gave no table") from None
        missing = [key for key in keys if key not in table.layers]
        if missing:
            raise WorkspaceError(f"{len(missing)} of the convolutions were not measured")
        return table

    def _started(self) -> subprocess.Popen:
        if self._child is None:
            self._errors = tempfile.TemporaryFile(mode="w+")
            self._child = subprocess.Popen(
                [sys.executable, "-m", "anatomy.prediction.workspaces"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._errors, text=True)
        return self._child

    def _failed(self) -> WorkspaceError:
        errors = self._errors
        self.close(keep_errors=True)
        errors.seek(0)
        last = (errors.read().strip().splitlines() or ["no output"])[-1]
        errors.close()
        self._errors = None
        return WorkspaceError(f"measuring the convolutions on the GPU failed: {last[:300]}")

    def close(self, keep_errors: bool = False) -> None:
        child, self._child = self._child, None
        if child is not None:
            try:
                child.stdin.close()
            except OSError:
                pass
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            child.stdout.close()
        if self._errors is not None and not keep_errors:
            self._errors.close()
            self._errors = None


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

    def made(shape, kind, layout: str):
        memory_format = torch.channels_last if layout == CHANNELS_LAST else \
            torch.contiguous_format
        return torch.empty(shape, device="cuda", dtype=kind,
                           memory_format=memory_format).normal_()

    rows = []
    for key in keys:
        shape, weight, stride, padding, dilation, groups, dtype, layout, gradient = key
        kind = getattr(torch, dtype)
        row = {"key": list(key), "batches": {}}
        for batch in batches:
            x = made((batch, *shape), kind, layout).requires_grad_()
            w = torch.randn(*weight, device="cuda", dtype=kind, requires_grad=True)
            torch.cuda.synchronize()
            start = len(trace())
            y = F.conv2d(x, w, None, stride, padding, dilation, groups)
            torch.cuda.synchronize()
            middle = len(trace())
            # The output gradient as the run hands it over (a forward call's key: y's own).
            y.backward(torch.ones_like(y) if gradient is None else
                       made(y.shape, kind, gradient).fill_(1))
            torch.cuda.synchronize()
            events = trace()
            row["batches"][batch] = [freed_at_once(events[start:middle]),
                                     freed_at_once(events[middle:])]
            del x, w, y
            torch.cuda.empty_cache()
        rows.append(row)
    # Off between requests: the next starts an empty history (a ring of max_entries).
    torch.cuda.memory._record_memory_history(enabled=None)
    return rows


def _serve(requests, out, errors) -> int:
    """The child of `Measurer`: a request per line (`{"keys", "batches", "gpu"}`), a table per
    line back, until its input ends."""
    served = 0
    for text in requests:
        if not text.strip():
            continue
        try:
            asked = json.loads(text)
            keys = [_key_of(k) for k in asked["keys"]]
            batches = [int(b) for b in asked["batches"]]
            gpu = int(asked.get("gpu", 0))
        except (ValueError, KeyError, TypeError, AttributeError):
            served = -1
            break
        try:
            measured = _measure_here(keys, batches, gpu)
        except (WorkspaceError, RuntimeError, ValueError, TypeError, AttributeError) as error:
            print(str(error).splitlines()[0] if str(error) else type(error).__name__,
                  file=errors)
            return 1
        print(json.dumps(measured), file=out, flush=True)
        served += 1
    if served <= 0:
        print("expects on standard input what prediction/workspaces.Measurer sends, a line each: "
              '{"keys": [...], "batches": [...], "gpu": 0}', file=errors)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(_serve(sys.stdin, sys.stdout, sys.stderr))
