"""cuDNN's convolution workspaces at the capacity's edge, from runs the H200 recorded: what they do
to the caching allocator, and whether the simulated allocator reproduces the edges once the
trace has them (docs/measurements/prediction-2026-12-02-convolution-workspaces.md). CPU only.

`--ablate` replays every recorded run's actions (bench/peak_snapshot.py's events) through the
simulated allocator at the run's ceiling twice: as recorded, and without the workspaces (an
allocation freed at once: alloc, free_requested, free_completed) and the refused attempts cuDNN
caught; the run's fatal request is tried in both.

`--oracle LABEL` takes one recorded run's workspaces as ratios to a tensor of each convolution
(forward: its output; backward: its output gradient, data then filter), aligned with the trace's
convolutions call by call, and traces the configuration again with them (tracing/cuda.py's
`convolution_workspaces`, replay.Workspace: a refused one releases the cache and its
convolution runs without one from then on); then each size of `--sizes` is replayed at the
capacity, with and without them. The ratios are the H200's at the recorded batch size only
(cuDNN picks engines by shape): an oracle for the mechanism, not a prediction.

`--measured WS.json --run "MODEL PRECISION OPTIM"` takes instead each distinct convolution's
workspaces measured alone (bench/convolution_workspace_sizes.py, keyed by the layer and the
batch size): the trace asks for a placeholder per part (forward, data, filter) of each call, and
each replayed batch size gets the measured bytes in its place (`--between`: between measured
sizes linear in the batch size, or in bytes per sample; outside them, the nearest's bytes per
sample). It compares them with the archives' runs of that configuration at measured sizes, call
by call; replays `--sizes`; `--span LOW-HIGH` maps each size's outcome; `--search` runs What
fits' search with them (the edge margin, no convolution margin).

    python bench/convolution_workspaces.py --ablate docs/data/h200-2026-12-02/allocator-events-8.tgz \\
        docs/data/h200-2026-12-02/convolution-edge-runs.tgz
    python bench/convolution_workspaces.py docs/data/h200-2026-12-02/allocator-events-8.tgz \\
        --oracle "regnet-y-040 fp32 b1325 sgd" --sizes 1325,1334,1336,1340
    python bench/convolution_workspaces.py docs/data/h200-2026-12-02/convolution-edge-runs.tgz \\
        --measured docs/data/h200-2026-12-02-s28/ws-resnet.json --run "resnet-50 bf16 adamw_torch" \\
        --sizes 3254,3301 --search
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import sys
import tarfile
import tempfile
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from peak_snapshot import replay_recorded  # noqa: E402
from prediction_grid import Config  # noqa: E402

from anatomy.prediction.workspaces import Table  # noqa: E402

MIB = 2**20
GPU = "NVIDIA H200"


def recorded_runs(archives: list[Path], into: Path) -> dict[str, tuple[dict, dict]]:
    """label -> (result, events) of every run with its actions in the archives."""
    runs = {}
    for archive in archives:
        with tarfile.open(archive) as tar:
            tar.extractall(into / archive.stem, filter="data")
    for path in sorted(into.rglob("*.events.json.gz")):
        result = json.loads(path.with_name(path.name.replace(".events.json.gz", ".result.json"))
                            .read_text())
        with gzip.open(path, "rt") as file:
            runs[result["label"]] = (result, json.load(file))
    return runs


def workspaces(events: list) -> set[int]:
    """Indices of the allocations freed at once: a kernel's workspace."""
    return {i for i, e in enumerate(events[:-2]) if e[0] == "alloc"
            and events[i + 1][0] == "free_requested" and events[i + 1][1] == e[1]
            and events[i + 2][0] == "free_completed"}


def outcomes(folder: Path) -> dict[int, dict]:
    """Every extracted run's result (with its actions or not), by batch size, by model and
    precision: {"regnet-y-040 fp32": {1312: result}}."""
    found: dict = {}
    for path in folder.rglob("*.result.json"):
        result = json.loads(path.read_text())
        words = result["label"].split()
        found.setdefault(" ".join(words[:2]), {})[result["config"]["batch_size"]] = result
    return found


def ablate(runs: dict[str, tuple[dict, dict]]) -> None:
    for label, (result, recording) in runs.items():
        events = recording["events"]
        held = workspaces(events)
        refusals = [i for i, e in enumerate(events) if e[0] == "oom"]
        fatal = refusals[-1:] if result["status"] == "oom" else []
        kept = [e for i, e in enumerate(events) if i not in held
                and (e[0] != "oom" or i in fatal)]
        ceiling = result["memory"]["ceiling"]
        largest = max((events[i][2] for i in held), default=0)
        print(f"{label}: ran {result['status']} (alloc_retries "
              f"{result['memory'].get('alloc_retries')}); {len(held)} workspaces, the largest "
              f"{largest / MIB:,.0f} MiB; simulated as recorded: "
              f"{replay_recorded(events, ceiling)['status']}, without them: "
              f"{replay_recorded(kept, ceiling)['status']}")


# --- the oracle: one recorded run's workspaces in the trace ---

class Convolutions:
    """tracing/cuda.py's `convolution_workspaces`: logs the trace's convolution calls; with a
    table, the recorded workspaces of the call at the same place in the pass."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.table: tuple[list, list] | None = None
        self.count = {"forward": 0, "backward": 0}

    def __call__(self, func, args, out) -> list[int]:
        import torch

        from anatomy.prediction.replay import Workspace

        if func is torch.ops.aten.convolution.default:
            kind, grad_output = "forward", out
            key = (tuple(args[0].shape[1:]), tuple(args[1].shape), tuple(args[3]),
                   tuple(args[4]), args[8], str(args[0].dtype))
            self.calls.append((kind, tuple(args[0].shape), tuple(args[1].shape),
                               tuple(out.shape), args[0].dtype, None,
                               layer_key(args[0].shape, args[1].shape, *args[3:6], args[8])))
        else:
            kind, grad_output = "backward", args[0]
            key = (tuple(args[1].shape[1:]), tuple(args[2].shape), tuple(args[4]),
                   tuple(args[5]), args[-2], str(args[1].dtype))
            self.calls.append((kind, tuple(args[1].shape), tuple(args[2].shape),
                               tuple(args[0].shape), args[1].dtype, tuple(args[-1]),
                               layer_key(args[1].shape, args[2].shape, *args[4:7], args[9])))
        if self.table is None:
            return []
        forward, backward = self.table
        ratios = forward if kind == "forward" else backward
        index = self.count[kind] % len(ratios)
        self.count[kind] += 1
        parts = [(kind, ratios[index])] if kind == "forward" else \
            list(zip(("data", "filter"), ratios[index] or (0.0, 0.0)))
        base = grad_output.numel() * grad_output.element_size()
        return [Workspace(round(ratio * base), (part, *key)) for part, ratio in parts
                if round(ratio * base)]


def _bytes(shape, dtype, batch: int, traced: int) -> int:
    import torch

    element = {torch.float32: 4, torch.bfloat16: 2, torch.float16: 2}[dtype]
    return math.prod(shape) // traced * batch * element


def layer_key(input_shape, weight_shape, stride, padding, dilation, groups) -> tuple:
    """A convolution as bench/convolution_workspace_sizes.py names it: its input but the batch,
    its weight, stride, padding, dilation and groups."""
    return (tuple(input_shape[1:]), tuple(weight_shape), tuple(stride), tuple(padding),
            tuple(dilation), groups)


def recorded_workspaces(recording: dict, calls: list[tuple], batch: int, traced: int
                        ) -> dict[int, tuple[list[int], list]]:
    """Step by step, each traced convolution's recorded workspaces in bytes: forward, the one in
    a convolution's frame after its output (found by its size), 0 where none; backward, (the
    data's, the filter's) lists, found after the call's gradients (by their sizes), before the
    next allocation; None where its gradients were not found."""
    events, frames = recording["events"], recording["frames"]
    held = workspaces(events)

    def in_convolution(j: int) -> bool:
        frame = events[j][4]
        return frame is not None and frame < len(frames) and "_conv_forward" in frames[frame]

    forward = [c for c in calls if c[0] == "forward"]
    backward = [c for c in calls if c[0] == "backward"]

    def output(p: int, k: int) -> int:
        want = _bytes(forward[k][3], forward[k][4], batch, traced)
        while p < len(events) and not (events[p][0] == "alloc" and p not in held
                                       and in_convolution(p) and events[p][2] == want):
            p += 1
        return p

    steps, p = {}, output(0, 0)
    while p < len(events):
        sizes = []
        for k in range(len(forward)):
            q = output(p, k)
            if q >= len(events):
                return steps
            end = min(output(q + 1, k + 1) if k + 1 < len(forward) else len(events),
                      next((j for j in range(q + 1, len(events)) if events[j][0] == "alloc"
                            and not in_convolution(j)), len(events)))
            sizes.append(next((events[j][2] for j in range(q + 1, end)
                               if j in held and in_convolution(j)), 0))
            p = q + 1
        end = output(p, 0)
        gradients = []
        for _, input_shape, weight_shape, _, dtype, mask, *_ in backward:
            wanted = [_bytes(input_shape, dtype, batch, traced) if mask[0] else None,
                      math.prod(weight_shape) * _bytes((1,), dtype, 1, 1) if mask[1] else None]
            data, matched = [], True
            for n, want in enumerate(wanted):
                if want is None:
                    continue
                q = p
                while q < end and not (events[q][0] == "alloc" and q not in held
                                       and events[q][2] == want):
                    q += 1
                if q >= end:
                    matched = False
                    break
                if n == 1 and wanted[0] is not None:
                    data += [events[j][2] for j in range(p, q) if j in held]
                p = q + 1
            if not matched:
                gradients.append(None)
                continue
            r, last = p, []
            while r < end and not (events[r][0] == "alloc" and r not in held):
                if events[r][0] == "alloc":
                    last.append(events[r][2])
                r += 1
            gradients.append((data, last) if mask[1] else (last, []))
        steps[len(steps) + 1] = (sizes, gradients)
        p = end
    return steps


def workspace_table(recording: dict, calls: list[tuple], batch: int, traced: int
                    ) -> dict[int, tuple[list, list]]:
    """Step by step, each traced convolution's recorded workspace as a ratio: forward, to its
    output; backward, (data, filter) to its output gradient (recorded_workspaces)."""
    forward = [c for c in calls if c[0] == "forward"]
    backward = [c for c in calls if c[0] == "backward"]
    steps = {}
    for step, (sizes, gradients) in recorded_workspaces(recording, calls, batch, traced).items():
        ratios = [size / _bytes(call[3], call[4], batch, traced) if size else 0.0
                  for size, call in zip(sizes, forward)]
        parts = []
        for found, call in zip(gradients, backward):
            if found is None:
                parts.append(None)
                continue
            base, found = _bytes(call[3], call[4], batch, traced), found[0] + found[1]
            pair = (found + [0, 0])[:2] if call[5][0] else [0, (found + [0])[0]]
            parts.append((pair[0] / base, pair[1] / base))
        steps[step] = (ratios, parts)
    return steps


def oracle(runs: dict[str, tuple[dict, dict]], label: str, sizes: list[int]) -> None:
    os.environ["ANATOMY_CACHE"] = "off"  # traced twice: without, then with the workspaces
    from anatomy.prediction import memory
    from anatomy.prediction.memory import BatchSizes, calibration_for, capacity_for
    from anatomy.prediction.tracing import cuda

    result, recording = runs[label]
    config = replace(Config.from_label(label), batch_size=memory.LINEAR_FROM)
    calibration = calibration_for("cuda", GPU)
    capacity = capacity_for("cuda", calibration.total_bytes, calibration)
    convolutions = Convolutions()
    cuda.CudaKernels.convolution_workspaces = convolutions
    try:
        memory._cached_recording.cache_clear()
        plain = BatchSizes(config.options(), "cuda", calibration)
        per_pass = len(convolutions.calls) // 4  # two recordings, forward and backward each
        steps = workspace_table(recording, convolutions.calls[:2 * per_pass],
                                result["config"]["batch_size"], memory.LINEAR_FROM)
        step = min(steps, key=lambda s: (sum(g is None for g in steps[s][1]), abs(s - 2)))
        convolutions.table = steps[step]
        memory._cached_recording.cache_clear()
        with_them = BatchSizes(config.options(), "cuda", calibration)
    finally:
        cuda.CudaKernels.convolution_workspaces = None
        memory._cached_recording.cache_clear()
    unmatched = sum(g is None for g in steps[step][1])
    print(f"{label} ({result['status']}): {per_pass} convolutions a pass, workspaces of step "
          f"{step}, {unmatched} backward calls not found; capacity {capacity / MIB:,.0f} MiB")
    for batch in sizes:
        cells = []
        for name, made in (("without workspaces", plain), ("with the recorded ones", with_them)):
            cells.append(f"{name}: peak {made.measure(batch).peak_allocated / MIB:,.0f} MiB, "
                         + ("out of memory" if made.out_of_memory(batch, capacity) else "fits"))
        print(f"  b{batch}: " + "; ".join(cells), flush=True)


# --- measured alone: each distinct convolution's workspaces, by batch size, in the trace ---

class MeasuredWorkspaces(Table):
    """bench/convolution_workspace_sizes.py's sizes for one model and precision, as the
    prediction's table (prediction/workspaces.Table: layer -> batch -> forward's and backward's
    bytes; its keys here without the dtype), with the per-sample rule beside its linear one."""

    def __init__(self, path: Path, run: str):
        super().__init__()
        for row in json.loads(path.read_text())[run]:
            layer = row["layer"]
            key = layer_key([0, *layer["input"]], layer["weight"], layer["stride"],
                            layer["padding"], layer["dilation"], layer["groups"])
            self.layers[key] = {int(b): (tuple(m["forward"]), tuple(m["backward"]))
                                for b, m in row["batches"].items()}

    def size(self, key: tuple, part: str, index: int, batch: int, data_wanted: bool,
             rule: str = "linear") -> int:
        """The workspace at `batch`: Table's (linear in the batch size between two measured
        sizes), or with `rule` "per-sample" linear in bytes per sample between them."""
        b1, b2 = self.around(key, batch)
        if rule != "per-sample" or batch in self.layers[key] or b1 is None or b2 is None:
            return super().size(key, part, index, batch, data_wanted)
        w1, w2 = (self.at(key, part, index, b, data_wanted) for b in (b1, b2))
        return round((w1 / b1 + (w2 / b2 - w1 / b1) * (batch - b1) / (b2 - b1)) * batch)


class MeasuredSeam:
    """tracing/cuda.py's `convolution_workspaces`: each convolution call asks for a placeholder
    workspace per part it may have (replay.Workspace, keyed by the part and the layer), the same
    at the traced sizes 2 and 3, so that it stays one in the linear recording; MeasuredSizes
    puts the measured bytes at each replayed batch size in its place."""

    PLACEHOLDER = 512

    def __init__(self, measured: MeasuredWorkspaces):
        self.measured = measured
        self.calls: list[tuple] = []
        self.unknown: set[tuple] = set()

    def __call__(self, func, args, out) -> list:
        import torch

        from anatomy.prediction.replay import Workspace

        if func is torch.ops.aten.convolution.default:
            key = layer_key(args[0].shape, args[1].shape, *args[3:6], args[8])
            parts, data_wanted = ["forward"], True
        else:
            key = layer_key(args[1].shape, args[2].shape, *args[4:7], args[9])
            data_wanted = bool(args[-1][0])
            parts = (["data"] if data_wanted else []) + (["filter"] if args[-1][1] else [])
        self.calls.append((func, key))
        if key not in self.measured.layers:
            self.unknown.add(key)
            return []
        most = {part: max(len(self.measured.parts(key, b, data_wanted)[part])
                          for b in self.measured.layers[key]) for part in parts}
        return [Workspace(self.PLACEHOLDER, (part, index, data_wanted, key))
                for part in parts for index in range(most[part])]


def measured_sizes(measured: MeasuredWorkspaces, rule: str):
    """memory.BatchSizes whose recordings carry, at each batch size, the measured workspaces."""
    from anatomy.prediction import memory, replay

    class MeasuredSizes(memory.BatchSizes):
        def _recording(self, batch: int) -> replay.Recording:
            recording = super()._recording(batch)
            events = [(kind, tid, replay.Workspace(measured.size(
                value.key[3], value.key[0], value.key[1], batch, value.key[2], rule), value.key))
                if isinstance(value, replay.Workspace) else (kind, tid, value)
                for kind, tid, value in recording.events]
            return replace(recording, events=events)

    return MeasuredSizes


def interpolation_check(measured: MeasuredWorkspaces) -> None:
    """Each measured size between two others, from its neighbours: how far each rule lands."""
    for rule in ("linear", "per-sample"):
        exact = total = 0
        worst = (0, None)
        for key, by_batch in measured.layers.items():
            batches = sorted(by_batch)
            for b1, b, b2 in zip(batches, batches[1:], batches[2:]):
                for part in ("forward", "data", "filter"):
                    sizes = measured.parts(key, b, True)[part]
                    for index, real in enumerate(sizes):
                        trimmed = MeasuredWorkspaces.__new__(MeasuredWorkspaces)
                        trimmed.layers = {key: {x: by_batch[x] for x in (b1, b2)}}
                        guess = trimmed.size(key, part, index, b, True, rule)
                        total += 1
                        exact += guess == real
                        if abs(guess - real) > abs(worst[0]):
                            worst = (guess - real, f"{key[0]} w{key[1]} {part} at {b}")
        print(f"interpolation {rule}: {exact} of {total} workspaces exact from their "
              f"neighbours; the furthest {worst[0] / MIB:+,.1f} MiB ({worst[1]})")


def compare(runs: dict[str, tuple[dict, dict]], run: str, measured: MeasuredWorkspaces,
            calls: list[tuple]) -> None:
    """Each recorded run of `run` at a measured batch size: its workspaces call by call (step
    2) against the measured ones."""
    from anatomy.prediction import memory

    forward = [c for c in calls if c[0] == "forward"]
    backward = [c for c in calls if c[0] == "backward"]
    for label, (result, recording) in runs.items():
        batch = result["config"]["batch_size"]
        if not label.startswith(run.split()[0] + " " + run.split()[1]) or \
                any(batch not in by_batch for by_batch in measured.layers.values()):
            continue
        steps = recorded_workspaces(recording, calls, batch, memory.LINEAR_FROM)
        step = 2 if 2 in steps else min(steps)
        sizes, gradients = steps[step]
        same = differ = 0
        lines = []
        for n, (size, call) in enumerate(zip(sizes, forward)):
            alone = sum(measured.parts(call[6], batch, True)["forward"])
            same, differ = (same + 1, differ) if size == alone else (same, differ + 1)
            if size != alone:
                lines.append(f"    forward {n} {call[6][0]} w{call[6][1]}: in the run "
                             f"{size:,}, alone {alone:,} ({(size - alone) / MIB:+,.1f} MiB)")
        missing = sum(found is None for found in gradients)
        for n, (found, call) in enumerate(zip(gradients, backward)):
            if found is None:
                continue
            parts = measured.parts(call[6], batch, call[5][0])
            for name, run_sizes, alone in (("data", found[0], parts["data"]),
                                           ("filter", found[1], parts["filter"])):
                if sorted(run_sizes) == sorted(alone):
                    same += 1
                elif sum(run_sizes) + sum(alone) == 0:
                    same += 1
                else:
                    differ += 1
                    lines.append(f"    backward {n} {name} {call[6][0]} w{call[6][1]}: in the "
                                 f"run {run_sizes}, alone {alone} "
                                 f"({(sum(run_sizes) - sum(alone)) / MIB:+,.1f} MiB)")
        print(f"{label} ({result['status']}), step {step} of {sorted(steps)}: {same} "
              f"workspaces (a call's forward, data or filter) as measured alone, {differ} not"
              + (f"; {missing} backward calls not in the run" if missing else ""))
        for line in lines:
            print(line)


def replay_measured(runs: dict[str, tuple[dict, dict]], results: dict, run: str, path: Path,
                    sizes: list[int], rule: str, search: bool, span: str = "") -> None:
    os.environ["ANATOMY_CACHE"] = "off"
    from anatomy.prediction import memory
    from anatomy.prediction.memory import BatchSizes, calibration_for, capacity_for
    from anatomy.prediction.tracing import cuda

    measured = MeasuredWorkspaces(path, " ".join(run.split()[:2]))
    interpolation_check(measured)
    config = replace(Config.from_label(run), batch_size=memory.LINEAR_FROM)
    calibration = calibration_for("cuda", GPU)
    capacity = capacity_for("cuda", calibration.total_bytes, calibration)
    logged, seam = Convolutions(), MeasuredSeam(measured)
    memory._cached_recording.cache_clear()
    cuda.CudaKernels.convolution_workspaces = logged
    try:
        plain = BatchSizes(config.options(), "cuda", calibration)
        memory._cached_recording.cache_clear()
        cuda.CudaKernels.convolution_workspaces = seam
        made = measured_sizes(measured, rule)(config.options(), "cuda", calibration)
        per_pass = len(logged.calls) // 4
        compare(runs, run, measured, logged.calls[:2 * per_pass])
        print(f"{run}: {per_pass} convolutions a pass, {len(measured.layers)} measured, "
              f"{len(seam.unknown)} not; capacity {capacity / MIB:,.0f} MiB; between measured "
              f"sizes: {rule}")
        recorded = results.get(" ".join(run.split()[:2]), {})
        for batch in sizes:
            cells = [f"{name}: peak {s.measure(batch).peak_allocated / MIB:,.0f} MiB, "
                     + ("out of memory" if s.out_of_memory(batch, capacity) else "fits")
                     for name, s in (("without workspaces", plain), ("measured alone", made))]
            real = recorded.get(batch)
            if real is not None:
                cells.append(f"the run: {real['status']}" + (
                    f", peak {real['memory']['peak_allocated'] / MIB:,.1f} MiB"
                    if real["status"] == "completed" else ""))
            print(f"  b{batch}: " + "; ".join(cells), flush=True)
        if span:  # each size of a span: fits (.) or not (x), at the capacity and with the pad
            low, high = (int(b) for b in span.split("-"))
            pad = round(calibration.edge_margin * capacity)
            for name, room in (("at the capacity", capacity),
                               ("less the 0.05 % pad", capacity - pad)):
                print(f"  {low}..{high} {name}: " + "".join(
                    "x" if made.out_of_memory(b, room) else "." for b in range(low, high + 1)))
        if search:  # "What fits": doubling and bisection, the edge margin, no convolution margin
            original = memory.BatchSizes
            memory.BatchSizes = measured_sizes(measured, rule)
            try:
                fit = memory.max_batch_size(
                    config.options(), device="cuda", total=calibration.total_bytes,
                    calibration=replace(calibration, convolution_margin=0.0))
            finally:
                memory.BatchSizes = original
            print(f"  search: fits {fit.batch_size}, may fit {fit.may_fit} (tried "
                  f"{', '.join(map(str, fit.searched))})")
    finally:
        cuda.CudaKernels.convolution_workspaces = None
        memory._cached_recording.cache_clear()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("archives", nargs="*", type=Path,
                        help="allocator-events*.tgz / convolution-edge-runs*.tgz")
    parser.add_argument("--ablate", action="store_true",
                        help="each run replayed with and without its workspaces")
    parser.add_argument("--oracle", metavar="LABEL", help="the run whose workspaces to trace")
    parser.add_argument("--sizes", default="", help="batch sizes to replay, comma-separated")
    parser.add_argument("--measured", metavar="WS.json", type=Path,
                        help="bench/convolution_workspace_sizes.py's sizes, traced for --run")
    parser.add_argument("--run", help='with --measured: "<bench model> <precision> <optim>"')
    parser.add_argument("--between", choices=("linear", "per-sample"), default="linear",
                        help="with --measured: the workspaces between measured batch sizes")
    parser.add_argument("--search", action="store_true",
                        help="with --measured: What fits' search, without the convolution margin")
    parser.add_argument("--span", default="", metavar="LOW-HIGH",
                        help="with --measured: each size from LOW to HIGH, fits (.) or not (x)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        runs = recorded_runs(args.archives, Path(folder))
        if args.ablate:
            ablate(runs)
        if args.oracle:
            oracle(runs, args.oracle, [int(s) for s in args.sizes.split(",") if s])
        if args.measured:
            replay_measured(runs, outcomes(Path(folder)), args.run, args.measured,
                            [int(s) for s in args.sizes.split(",") if s], args.between,
                            args.search, args.span)
    return 0


if __name__ == "__main__":
    sys.exit(main())
