"""cuDNN's convolution workspaces at the capacity's edge, from runs the H200 recorded: what they do
to the caching allocator, and whether the simulated allocator reproduces the edges once the
trace has them (docs/PREDICTION.md, "The convolutions' workspaces"). CPU only.

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

    python bench/convolution_workspaces.py --ablate docs/data/h200-2026-12-02/allocator-events-8.tgz \\
        docs/data/h200-2026-12-02/convolution-edge-runs.tgz
    python bench/convolution_workspaces.py docs/data/h200-2026-12-02/allocator-events-8.tgz \\
        --oracle "regnet-y-040 fp32 b1325 sgd" --sizes 1325,1334,1336,1340
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

        from anatomy.analysis.prediction.replay import Workspace

        if func is torch.ops.aten.convolution.default:
            kind, grad_output = "forward", out
            key = (tuple(args[0].shape[1:]), tuple(args[1].shape), tuple(args[3]),
                   tuple(args[4]), args[8], str(args[0].dtype))
            self.calls.append((kind, tuple(args[0].shape), tuple(args[1].shape),
                               tuple(out.shape), args[0].dtype, None))
        else:
            kind, grad_output = "backward", args[0]
            key = (tuple(args[1].shape[1:]), tuple(args[2].shape), tuple(args[4]),
                   tuple(args[5]), args[-2], str(args[1].dtype))
            self.calls.append((kind, tuple(args[1].shape), tuple(args[2].shape),
                               tuple(args[0].shape), args[1].dtype, tuple(args[-1])))
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


def workspace_table(recording: dict, calls: list[tuple], batch: int, traced: int
                    ) -> dict[int, tuple[list, list]]:
    """Step by step, each traced convolution's recorded workspace as a ratio: forward, to its
    output (found by its size in a convolution's frame); backward, (data, filter) to its output
    gradient, found after the call's gradients (by their sizes), before the next allocation."""
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
        ratios = []
        for k in range(len(forward)):
            q = output(p, k)
            if q >= len(events):
                return steps
            end = min(output(q + 1, k + 1) if k + 1 < len(forward) else len(events),
                      next((j for j in range(q + 1, len(events)) if events[j][0] == "alloc"
                            and not in_convolution(j)), len(events)))
            size = next((events[j][2] for j in range(q + 1, end)
                         if j in held and in_convolution(j)), 0)
            ratios.append(size / events[q][2] if events[q][2] else 0.0)
            p = q + 1
        end = output(p, 0)
        gradients = []
        for _, input_shape, weight_shape, output_shape, dtype, mask in backward:
            wanted = [_bytes(input_shape, dtype, batch, traced) if mask[0] else None,
                      math.prod(weight_shape) * _bytes((1,), dtype, 1, 1) if mask[1] else None]
            found, matched = [], True
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
                    found += [events[j][2] for j in range(p, q) if j in held]
                p = q + 1
            if not matched:
                gradients.append(None)
                continue
            r = p
            while r < end and not (events[r][0] == "alloc" and r not in held):
                if events[r][0] == "alloc":
                    found.append(events[r][2])
                r += 1
            base = _bytes(output_shape, dtype, batch, traced)
            sizes = (found + [0, 0])[:2] if mask[0] else [0, (found + [0])[0]]
            gradients.append((sizes[0] / base, sizes[1] / base))
        steps[len(steps) + 1] = (ratios, gradients)
        p = end
    return steps


def oracle(runs: dict[str, tuple[dict, dict]], label: str, sizes: list[int]) -> None:
    os.environ["ANATOMY_CACHE"] = "off"  # traced twice: without, then with the workspaces
    from anatomy.analysis.prediction import memory
    from anatomy.analysis.prediction.memory import BatchSizes, calibration_for, capacity_for
    from anatomy.analysis.prediction.tracing import cuda

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("archives", nargs="+", type=Path,
                        help="allocator-events*.tgz / convolution-edge-runs*.tgz")
    parser.add_argument("--ablate", action="store_true",
                        help="each run replayed with and without its workspaces")
    parser.add_argument("--oracle", metavar="LABEL", help="the run whose workspaces to trace")
    parser.add_argument("--sizes", default="", help="batch sizes to replay, comma-separated")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        runs = recorded_runs(args.archives, Path(folder))
        if args.ablate:
            ablate(runs)
        if args.oracle:
            oracle(runs, args.oracle, [int(s) for s in args.sizes.split(",") if s])
    return 0


if __name__ == "__main__":
    sys.exit(main())
