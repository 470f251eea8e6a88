"""Recording a run's training without its memory: the model built on the meta device, then the
Trainer's step on fake tensors, each part of the step traced once.

A recording (prediction/replay.py's `Recording`) holds the timeline in segments, each traced
once because every repetition of it allocates and frees the same storages (the replay lays them
out for as many steps and micro-batches as a run takes):

- `weights`: the weights as the worker allocates them: the model (and LoRA's adapters) built on
  the meta device, then each storage made in `Module.to`'s order (`models.materialise`);
- `setup`: what the Trainer makes before the first step (checkpointing hooks, the optimizer with
  the states some optimizers create at once, fp16's loss scaler);
- `batches`: the step's micro-batches, fetched before the first runs;
- `first micro-batch`: forward and backward without gradients (set to None after each step);
- `later micro-batch`: the same with the gradients there to accumulate into (accumulation only);
- `first optimizer step`: clipping, the step that creates the optimizer's states, zero_grad;
- `optimizer step`: the same once the states exist.
"""

from __future__ import annotations

import gc
import logging as pylogging
import warnings
from collections.abc import Callable
from contextlib import ExitStack, nullcontext
from dataclasses import replace
from importlib import import_module
from typing import NamedTuple

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from anatomy.analysis import models
from anatomy.analysis.models import ModelSpec
from anatomy.prediction.device_constants import DeviceCalibration
from anatomy.prediction.layers import TEMPLATE
from anatomy.prediction.replay import Recording
from anatomy.prediction.tracing import depth
from anatomy.prediction.tracing.cuda import CudaKernels
from anatomy.prediction.tracing.fake_kernels import FakeKernels, self_swaps
from anatomy.prediction.tracing.tracker import (
    LiveTensors,
    SavedForBackward,
    Timeline,
    local,
)
from anatomy.prediction.tracing.trainer_step import StepOptions, TrainerStep
from anatomy.prediction.tracing.values import DataValues, real_paths
from anatomy.strategies import TracedRank
from anatomy.vocabulary import Phase


def _distinct_bytes(tensors) -> int:
    seen = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        seen[id(storage)] = (storage, storage.nbytes())
    return sum(size for _, size in seen.values())


def to_fake(model, mode: FakeTensorMode, device: str = "cpu", on_made=None) -> None:
    """Meta parameters and buffers become fake ones on `device`, sharing their storages (so a
    tracker that followed the meta build knows them) and their ties. A tensor the model made on
    a device of its own choosing (DiffLlama's λ on the CPU) becomes a fake one too, and is told
    to `on_made`: the build's tracker did not see it."""
    made: dict[int, torch.Tensor] = {}
    target = torch.device(device)

    def fake_of(tensor):
        if tensor.device.type == "meta":
            return FakeTensor(mode, tensor, target)
        fake = FakeTensor(mode, tensor.to("meta"), target)
        if on_made is not None:
            on_made(fake)
        return fake

    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None:
                continue
            if id(param) not in made:
                made[id(param)] = torch.nn.Parameter(fake_of(param.detach()),
                                                     requires_grad=param.requires_grad)
            module._parameters[name] = made[id(param)]
        for name, buffer in list(module._buffers.items()):
            if buffer is None:
                continue
            if id(buffer) not in made:
                made[id(buffer)] = fake_of(buffer)
            module._buffers[name] = made[id(buffer)]


class RankTrace(NamedTuple):
    """What a strategy's tracer (its `tracer` module here, e.g. fsdp.py) gives the trace of one
    rank's step, from its `rank(world_size, tracker, precision)` context."""

    prepare: Callable  # the model wrapped for the strategy, before the optimizer is made
    buffers: Callable[[], dict[str, frozenset[int]]]  # its buffers' storages, by the strategy's names


def record(spec: ModelSpec, options: StepOptions, *, kernels: str = "cuda",
           calibration: DeviceCalibration | None = None, steps: int = 2, lora_rank: int = 0,
           lora_targets: tuple[str, ...] = (), rank: TracedRank | None = None,
           blocks: tuple[int, ...] = (), workspaces=None, lora_dropout: float = 0.0,
           weights: str = "fp32") -> Recording:
    """Trace the run's build and one of each segment of its steps; `kernels` "cuda" (the CUDA
    emulation, with `calibration`'s constants) or "cpu". `rank`: the step of rank 0 of
    `rank.world` under a strategy, followed by its tracer (`rank.tracer`, a module of this
    package: weights, gradients and states those the rank holds, its buffers named).
    With `blocks` (the block of each layer, prediction/blocks.py), each event is tagged with
    the block of repeated layers it belongs to (tracing/depth.py), for prediction/layers.py;
    `tuple(range(layers.DEPTH))` where they are all alike. `workspaces`: the CUDA emulation's
    `convolution_workspaces` (prediction/workspaces.py), none by default."""
    from transformers import logging

    logging.set_verbosity_error()
    timeline = Timeline()
    tracker = LiveTensors(timeline, device="meta")
    segments: dict[str, tuple[int, int]] = {}

    def segment(name: str, start: int) -> None:
        # Storages in reference cycles go when the garbage collector runs: here, at the end of
        # each segment (the real run's collector runs every few hundred objects), so that two
        # recordings of a run are the same events in the same order.
        gc.collect()
        segments[name] = (start, len(timeline.events))

    collecting = gc.isenabled()
    gc.disable()
    gc.collect()
    gc.freeze()  # what exists now is no garbage: the collections below scan the trace's objects
    # FakeTensorMode logs the traceback of an operator its meta kernel refuses before raising
    # it; the prediction says that in one line (PredictionError): not the user's traceback.
    fake_log = pylogging.getLogger("torch._subclasses.fake_tensor")
    fake_level = fake_log.level
    fake_log.setLevel(pylogging.CRITICAL)
    try:
        with warnings.catch_warnings():  # peft's and transformers' advice is for real runs
            warnings.simplefilter("ignore")
            if rank is None:
                return _record(spec, options, kernels, calibration, steps, lora_rank,
                               lora_targets, timeline, tracker, segment, segments,
                               blocks=blocks, workspaces=workspaces, lora_dropout=lora_dropout,
                               weights=weights)
            tracer = import_module(f"{__package__}.{rank.tracer}")
            with tracer.rank(rank.world, tracker, options.precision) as traced:
                recording = _record(spec, options, kernels, calibration, steps, lora_rank,
                                    lora_targets, timeline, tracker, segment, segments,
                                    traced.prepare, lora_dropout=lora_dropout, weights=weights)
                return replace(recording, rank_buffers=traced.buffers())
    finally:
        fake_log.setLevel(fake_level)
        gc.unfreeze()
        if collecting:
            gc.enable()


def _record(spec, options, kernels, calibration, steps, lora_rank, lora_targets, timeline,
            tracker, segment, segments, prepare=None, blocks=(), workspaces=None,
            lora_dropout=0.0, weights="fp32") -> Recording:
    with real_paths():
        start = 0
        model, _ = models.build_model(spec, "meta", lora_rank=lora_rank,
                                      lora_targets=lora_targets, lora_dropout=lora_dropout,
                                      pretrained=False, weights=weights,
                                      attention=options.attention, frozen=options.frozen)
        with tracker:  # the weights as the worker allocates them (models.materialise)
            models.materialise(model, "meta", fresh=True)
        mode = FakeTensorMode(allow_non_fake_inputs=False)
        tracker.device = "cpu"
        to_fake(model, mode, on_made=tracker.track)
        segment(Phase.WEIGHTS, start)
        parameters = sum(p.numel() for p in model.parameters())
        weights_bytes = _distinct_bytes(model.parameters())
        cuda = CudaKernels(calibration, tracker) if kernels == "cuda" else None
        if cuda is not None and workspaces is not None:
            cuda.convolution_workspaces = workspaces
        tags, lists = None, []
        if blocks:
            lists = depth.stacks(model, len(blocks))
            tags = depth.LayerTags()
            tags.install(lists, blocks)
            timeline.layers = tags
            tags.tag_weights(lists, timeline, tracker.storage_tid, segments[Phase.WEIGHTS])
        with ExitStack() as stack:
            stack.enter_context(mode)
            stack.enter_context(self_swaps())
            stack.enter_context(FakeKernels())
            stack.enter_context(DataValues())
            if cuda is not None:
                stack.enter_context(cuda)
            stack.enter_context(tracker)

            start = len(timeline.events)
            with depth.following_states(tags) if tags else nullcontext():
                step = TrainerStep(model, spec, options, device="cpu",
                                   foreach=cuda is not None, on_mark=timeline.mark,
                                   checkpoint_context=cuda.recomputation if cuda else None,
                                   prepare=prepare)
            segment("setup", start)
            trainable = [p for p in model.parameters() if p.requires_grad]
            if prepare is not None:  # a rank holds its shards from here on
                weights_bytes = _distinct_bytes(local(p) for p in model.parameters())

            start = len(timeline.events)
            batches, items = step.batches()
            segment("batches", start)
            batch_tids = [tracker.storage_tid(t) for b in batches for t in b.values()]

            saved = SavedForBackward(model, tracker)
            start = len(timeline.events)
            step.micro_batch(batches[0], items)
            segment("first micro-batch", start)
            grads_first = {i: tracker.storage_tid(local(p.grad)) for i, p in enumerate(trainable)
                           if p.grad is not None}
            # what the backward pass gave a gradient (LED's global-attention projections get
            # none without global attention; the optimizer keeps states for them all the same)
            with_gradient = {id(trainable[i]) for i in grads_first}
            if options.grad_accum > 1:
                start = len(timeline.events)
                step.micro_batch(batches[1], items)
                segment("later micro-batch", start)
            saved.close()
            gradient_bytes = _distinct_bytes(local(p.grad) for p in trainable
                                             if p.grad is not None)

            start = len(timeline.events)
            step.optimizer_step()
            segment("first optimizer step", start)
            state_bytes = _distinct_bytes(
                local(v) for state in step.optimizer.state.values() for v in state.values()
                if isinstance(v, torch.Tensor) and v.numel() > 1)

            grads_later: dict[int, int] = {}
            if steps > 1:
                # The gradients a later step's backward pass makes (the replay lays out their
                # allocations), here without events, for the optimizer step to use and free.
                with torch.no_grad():
                    for i in grads_first:
                        trainable[i].grad = torch.empty_like(trainable[i])
                        grads_later[i] = tracker.adopt(local(trainable[i].grad))
                start = len(timeline.events)
                step.optimizer_step()
                segment("optimizer step", start)
            template = [layer for layers_ in lists for layer, block in zip(layers_, blocks)
                        if block == TEMPLATE]
            per_layer = _layer_share(template, step.optimizer, saved, tags, with_gradient) \
                if lists and tags else {}
        del batches, items, step
        if tags is not None:
            tags.remove()
            timeline.layers = None

    return Recording(
        events=timeline.events, persistent=set(timeline.persistent), segments=segments,
        grads_first=grads_first, grads_later=grads_later, batch_tids=batch_tids,
        parameters=parameters, trainable_parameters=sum(p.numel() for p in trainable),
        weights_bytes=weights_bytes, gradient_bytes=gradient_bytes,
        optimizer_state_bytes=state_bytes,
        attention_kernels=tuple(cuda.sdpa_calls) if cuda is not None else (),
        convolution_share=cuda.convolution_share() if cuda is not None else 0.0,
        saved_bytes=saved.bytes,
        max_tid=timeline._next, tags=timeline.tags if tags else [], growth=timeline.growth,
        loose=timeline.loose,
        depth=max(blocks) + 1 if lists and tags else 0, per_layer=per_layer)


def _layer_share(layers, optimizer, saved: SavedForBackward, tags: depth.LayerTags,
                 with_gradient: set[int]) -> dict[str, int]:
    """What one repeated block (`layers`: the template's layers of each stack) adds to a
    recording's counts: its gradients those of its parameters that the trace gave one
    (`with_gradient`, their ids); of what autograd saved, the storages the template's forward
    pass made (each layer saves its own and, as its input, the previous layer's output: one
    layer's worth each)."""
    parameters = [p for layer in layers for p in layer.parameters()]
    trainable = [p for p in parameters if p.requires_grad]
    states = [v for p in parameters for v in optimizer.state.get(p, {}).values()
              if isinstance(v, torch.Tensor) and v.numel() > 1]
    return {"parameters": sum(p.numel() for p in parameters),
            "trainable_parameters": sum(p.numel() for p in trainable),
            "weights_bytes": _distinct_bytes(parameters),
            "gradient_bytes": _distinct_bytes(p for p in trainable if id(p) in with_gradient),
            "optimizer_state_bytes": _distinct_bytes(states),
            "saved_bytes": sum(size for key, size in saved.kept.items()
                               if (tags.of_tid.get(key) or (None, None))[1] == TEMPLATE)}
