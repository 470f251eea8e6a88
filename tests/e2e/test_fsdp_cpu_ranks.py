"""FSDP2 predicted per rank = measured per rank, without a GPU (issue 21): two real CPU ranks
over gloo shard the model with accelerate's `fsdp2_prepare_model` and train two steps, every
storage followed by the prediction's live-tensor tracker; the prediction traces rank 0 of two on
fake tensors with torch's fake process group. The Trainer cannot take this path on CPU ranks
(accelerate 1.15 gives FSDP to GPU ranks only: AcceleratorState makes a CPU run MULTI_CPU), so
the ranks run the prediction's own TrainerStep — the Trainer's step, without its loop — on the
same model and step."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from anatomy import strategies
from anatomy.analysis import models
from anatomy.prediction import replay
from anatomy.prediction.tracing.trainer_step import StepOptions
from tests.helpers import free_port

STEPS = 2
WORLD = 2
TOLERANCE = 1024  # bytes: the single-process check's (tests/e2e/test_prediction_exactness.py)
# (model, precision, checkpointing, accumulation): a layer model and a decoder, fp32 and bf16
# (bf16: FSDP all-gathers 16-bit parameters and reduce-scatters 16-bit gradients).
CASES = [("tiny", "fp32", False, 1), ("tiny-llama", "bf16", True, 2)]


def _options(case: tuple) -> StepOptions:
    _, precision, checkpointing, accumulation = case
    return StepOptions(precision, checkpointing, accumulation, "adamw_torch", 2, 16)


def measured_rank(rank: int, port: int, cases: list, out) -> None:
    """One real rank, for each case in turn: the model built whole, sharded, two steps, its true
    live-tensor figures sent back as (case, rank, peak, weights at the end of the build,
    activations). One pair of ranks runs every case: a rank's start (torch, transformers,
    accelerate imported) costs more than a tiny case."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    for name in ("all_gather_single", "reduce_scatter_single"):
        setattr(dist, name, _unseen(getattr(dist, name)))
    try:
        for case in cases:
            out.put((case, rank, *_measured(case)))
    finally:
        dist.destroy_process_group()


def _unseen(collective):
    """`collective` as these ranks run it: on copies their tracker never sees, finished before it
    returns (FSDP2 waits on no handle then). What the backend makes inside its call is left out
    (gloo reduce-scatters by all-reducing a copy of its input: one more unsharded gradient buffer
    that NCCL, which the prediction is for, and the fake group do not make). And gloo's worker
    thread keeps the tensors it was given until it drops its work, a moment after the caller's
    wait returns: had it held the tracked buffers, their frees would land wherever that moment
    fell in the timeline (seen: one run in three 63 KB over, one a rank's activations 0.8 MB)."""
    import inspect

    import torch
    from torch.utils._python_dispatch import _disable_current_modes

    signature = inspect.signature(collective)

    def call(*args, async_op=False, **kwargs):
        with _disable_current_modes():
            bound = signature.bind(*args, **kwargs)
            given = {name: value for name, value in bound.arguments.items()
                     if isinstance(value, torch.Tensor)}
            copies = {name: value.detach().clone() for name, value in given.items()}
            bound.arguments.update(copies)
            collective(*bound.args, **bound.kwargs)
            for name, tensor in given.items():
                tensor.detach().copy_(copies[name])
        return None
    return call


def _measured(case: tuple) -> tuple[int, int, int]:
    """One case on this rank: (peak, weights at the end of the build, activations)."""
    import torch

    from anatomy.prediction.tracing import fsdp
    from anatomy.prediction.tracing.tracker import LiveTensors, Timeline
    from anatomy.prediction.tracing.trainer_step import TrainerStep

    options = _options(case)
    spec = models.resolve(case[0])
    timeline = Timeline()
    tracker = LiveTensors(timeline)
    torch.manual_seed(0)
    with tracker:
        model, _ = models.build_model(spec, "cpu", pretrained=False)
    timeline.mark("weights")
    timeline.mark(replay.TRAINING_BEGINS)
    step = [0]

    def mark(label: str) -> None:
        timeline.events.append((replay.MARK, step[0], label))

    def begin(number: int) -> None:
        step[0] = number
        mark("batches")

    device_mesh = fsdp.mesh("cpu")
    with tracker, fsdp.following(tracker):
        TrainerStep(model, spec, options, device="cpu", on_mark=mark,
                    prepare=lambda m: fsdp.shard(m, options.precision, device_mesh)
                    ).run(STEPS, begin)
    measured = replay.measure(timeline.events, cuda=False)
    return measured.peak_allocated, measured.weights_allocated, measured.activations(STEPS)


def _ranks_measured() -> dict[tuple, list[tuple]]:
    """Every case's figures from one pair of real ranks: {case: [(rank, peak, weights,
    activations), one per rank]}; both ranks exited cleanly."""
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    port = free_port()
    ranks = [context.Process(target=measured_rank, args=(r, port, CASES, out))
             for r in range(WORLD)]
    for process in ranks:
        process.start()
    try:
        results = [out.get(timeout=600) for _ in range(WORLD * len(CASES))]
    finally:
        for process in ranks:
            process.join(timeout=60)
            if process.is_alive():
                process.kill()
    assert [p.exitcode for p in ranks] == [0] * WORLD
    measured: dict[tuple, list[tuple]] = {}
    for case, *figures in results:
        measured.setdefault(tuple(case), []).append(tuple(figures))
    assert sorted(measured) == sorted(CASES)
    return {case: sorted(figures) for case, figures in measured.items()}


def test_fsdp_ranks_on_the_cpu_are_predicted_to_the_byte():
    """Every case, on one pair of ranks (one test, not one per case: pytest-xdist may give a
    case's test to another worker, which would start ranks of its own)."""
    from anatomy.prediction.tracing.record import record

    for case, measured in _ranks_measured().items():
        name, accumulation, options = case[0], case[3], _options(case)
        assert [rank for rank, *_ in measured] == list(range(WORLD)), case
        recording = record(models.resolve(name), options, kernels="cpu", steps=STEPS,
                           rank=strategies.named("fsdp").recording_key(WORLD))
        predicted = replay.measure(replay.stream(recording, STEPS, accumulation), cuda=False)
        training = predicted.peak_allocated - predicted.weights_allocated
        for rank, peak, weights, activations in measured:
            assert training == pytest.approx(peak - weights, abs=TOLERANCE), (case, rank)
            assert predicted.activations(STEPS) == pytest.approx(activations, abs=TOLERANCE), \
                (case, rank)
        # A rank holds a shard: less than one process's whole training.
        alone = record(models.resolve(name), options, kernels="cpu", steps=STEPS)
        assert recording.weights_bytes < alone.weights_bytes, case
