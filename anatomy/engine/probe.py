"""The component probe: over the first steps of training it reads tensor sizes and the caching
allocator at the moments that matter (anatomy/analysis/components.py names the components).

It runs inside the training process and imports torch when it is built.
"""

from __future__ import annotations

import weakref
from dataclasses import replace
from typing import NamedTuple

from anatomy.analysis.components import MEASURED_STEPS, Components
from anatomy.vocabulary import Moment

__all__ = ["MEASURED_STEPS", "BatchShape", "ComponentProbe", "SeenBatch", "StepPeaks",
           "alike_steps", "optimizer_state_bytes"]


def _local(tensor):
    """The tensor this process holds: an FSDP2 parameter, gradient or optimizer state is a
    DTensor whose storage is its local shard."""
    return getattr(tensor, "_local_tensor", tensor)


def _tensor_bytes(tensors) -> int:
    """Bytes of distinct storages: views and shared weights are counted once (of a sharded
    tensor, this rank's shard)."""
    seen: dict[int, int] = {}
    for tensor in tensors:
        storage = _local(tensor).untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def optimizer_state_bytes(optimizer) -> int:
    import torch

    return _tensor_bytes(value for state in optimizer.state.values() for value in state.values()
                         if isinstance(value, torch.Tensor) and value.numel() > 1)


def _samples(args, kwargs) -> int | None:
    """The samples of a forward pass's micro-batch: its labels' first dimension (one label, or
    one row of them, per sample), else the smallest first dimension of its inputs (some inputs
    fold more into the first: MusicGen takes its ids as batch × codebooks rows); None where no
    input has one."""
    labels = kwargs.get("labels")
    if getattr(labels, "ndim", 0) >= 1:
        return int(labels.shape[0])
    found = [int(value.shape[0]) for value in (*args, *kwargs.values())
             if getattr(value, "ndim", 0) >= 1 and hasattr(value, "shape")]
    return min(found, default=None)


class BatchShape(NamedTuple):
    """A forward pass's micro-batch as the model got it: its samples, the length its token ids
    were padded to (None: no token ids, an image's batch), and each sequence's own tokens, longest
    first, where the batch held padding (None: it held none, or no attention mask said). A
    dataset's collator pads each batch to its own longest: the prediction that describes the
    measured activations is the one of this batch."""

    samples: int | None
    padded_to: int | None = None
    lengths: tuple[int, ...] | None = None


class SeenBatch:
    """A micro-batch as a forward pass saw it, its shape read when the probe's result is taken:
    a GPU's attention mask is copied into pinned host memory behind the work already queued (no
    allocation on the device inside the step it measures, and no waiting for it: the callback
    adds no synchronisation to a user's training), then summed on the host."""

    def __init__(self, args, kwargs):
        import torch

        self.samples = _samples(args, kwargs)
        ids, mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
        self.padded_to = int(ids.shape[1]) if getattr(ids, "ndim", 0) == 2 else None
        self._mask = self._copied = None
        if self.padded_to is not None and getattr(mask, "ndim", 0) == 2 and \
                tuple(mask.shape) == tuple(ids.shape):
            if mask.device.type == "cuda":
                self._mask = torch.empty(mask.shape, dtype=mask.dtype, pin_memory=True)
                self._mask.copy_(mask.detach(), non_blocking=True)
                self._copied = torch.cuda.Event()
                self._copied.record()
            else:
                self._mask = mask.detach()
        self._shape: BatchShape | None = None

    def shape(self) -> BatchShape:
        if self._shape is None:
            lengths = None
            if self._mask is not None:
                if self._copied is not None:
                    self._copied.synchronize()
                found = sorted((int(n) for n in self._mask.sum(dim=1).tolist()), reverse=True)
                lengths = tuple(found) if any(n < self.padded_to for n in found) else None
            self._shape, self._mask = BatchShape(self.samples, self.padded_to, lengths), None
        return self._shape


class StepPeaks(NamedTuple):
    """A GPU step's allocator readings (bytes), and the micro-batches it trained: its peaks since
    the step before, and the allocator before and after its optimizer step."""

    shapes: tuple[BatchShape, ...]
    allocated: int
    reserved: int
    before_optimizer: int | None = None
    after_optimizer: int | None = None
    # an evaluation came since the last step, or before: its batches' peaks, and the cache it
    # left reserved, are in this step's figures
    after_evaluation: bool = False


def alike_steps(steps: list[StepPeaks], kept: BatchShape | None) -> list[StepPeaks]:
    """The steps whose every micro-batch has the shape of the one the activations were measured
    on: their peaks describe the batch the prediction is made for. Every step where all had one
    shape (the dummy data, padding to max length alike), or where none is (a shape not read).
    Steps before the training's first evaluation where it had any: an evaluation's peak is no
    training step's, and its cache stays reserved after it."""
    steps = [step for step in steps if not step.after_evaluation] or steps
    alike = [step for step in steps if all(shape == kept for shape in step.shapes)]
    return alike or steps


class ComponentProbe:
    """Hooks on the model plus callback entry points; `result()` gives bytes by component.

    `batch_size`: the samples of a full micro-batch (per device). A partial one (an epoch's last,
    where the data does not divide by it) holds fewer activations than the step the prediction
    describes: its figures are kept only while no full micro-batch has been measured."""

    def __init__(self, model, use_cuda: bool, batch_size: int | None = None):
        import torch

        self.torch, self.model, self.use_cuda = torch, model, use_cuda
        self.batch_size = batch_size
        self.weights = _tensor_bytes(model.parameters())
        self.activations: int | None = None
        self.gradients: int | None = None
        self.optimizer_states: int | None = None
        self.moments: dict[Moment, int] = {}
        self.forwards = 0
        self.micro_batch: int | None = None  # the samples `activations` were measured on
        self.measured: SeenBatch | None = None  # the micro-batch `activations` were measured on
        self._seen: SeenBatch | None = None  # the current forward pass's
        self._step_batches: list[SeenBatch] = []  # the current step's micro-batches
        self._before_optimizer: int | None = None
        # A GPU's steps, each its own peaks: its micro-batches, the allocator's peaks, before and
        # after its optimizer step (StepPeaks, once their shapes are read).
        self._steps: list[tuple[list[SeenBatch], int, int, int | None, int | None, bool]] = []
        self._evaluated = False  # the model has read a batch out of training mode
        self._before = 0
        self._saved: dict[int, tuple[int, weakref.ref]] = {}  # address: bytes, the storage
        self._saving = None
        self._handles = [model.register_forward_pre_hook(self._forward_begins, with_kwargs=True),
                         model.register_forward_hook(self._forward_ends)]
        if use_cuda:
            torch.cuda.reset_peak_memory_stats()

    def _allocated(self) -> int:
        return self.torch.cuda.memory_allocated() if self.use_cuda else 0

    def _forward_begins(self, module, args, kwargs):
        if not module.training:
            self._evaluated = True
            return
        self._seen = SeenBatch(args, kwargs)
        self._step_batches.append(self._seen)
        self._before = self._allocated()
        if not self.use_cuda:
            self._saved = {}

            def pack(tensor):
                storage = _local(tensor).untyped_storage()
                self._saved[storage.data_ptr()] = (storage.nbytes(), weakref.ref(storage))
                return tensor

            self._saving = self.torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
            self._saving.__enter__()

    def _forward_ends(self, module, args, output):
        if not module.training:
            return
        self.forwards += 1
        kept = self._kept(self._seen.samples)
        if self.use_cuda:
            held = self._allocated() - self._before
            if kept:
                self.moments[Moment.END_OF_FORWARD] = self._allocated()
        else:
            self._saving.__exit__(None, None, None)
            self._saving = None
            parameters = {_local(p).untyped_storage().data_ptr()
                          for p in self.model.parameters()}
            # What autograd still holds: a storage saved for a part of the graph the forward
            # pass dropped is freed by now, and its address may hold another saved storage
            # (counted once by address, it made the figure depend on the allocator's reuse)
            held = sum(size for ptr, (size, storage) in self._saved.items()
                       if ptr not in parameters and storage() is not None)
        # The latest forward pass, not the largest: the first one also allocates cuBLAS's
        # workspace (32 MiB on Hopper), which is not an activation and stays for good.
        if kept:
            self.activations, self.measured = held, self._seen
            self.micro_batch = self._seen.samples

    def _kept(self, samples: int | None) -> bool:
        """Whether a forward pass of `samples` describes the step better than the one kept: a
        full micro-batch always (the latest), a partial one only where none was full yet (the
        largest)."""
        if samples is None or self.batch_size is None:
            return True
        full = self.micro_batch is not None and self.micro_batch >= self.batch_size
        return samples >= self.batch_size or (not full and samples >= (self.micro_batch or 0))

    def before_optimizer_step(self) -> None:
        # The weights as training holds them: FSDP shards them when training starts, after the
        # probe was made (a rank then holds its local shards); elsewhere they are unchanged.
        self.weights = _tensor_bytes(self.model.parameters())
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        self.gradients = max(self.gradients or 0, _tensor_bytes(grads))
        if self.use_cuda:
            self._before_optimizer = self._allocated()

    def after_optimizer_step(self, optimizer) -> None:
        if optimizer is not None:
            self.optimizer_states = optimizer_state_bytes(optimizer)
        if self.use_cuda:
            # Each step's peaks apart: with a collator that pads each batch to its own longest,
            # the first steps' batches differ, and the peak of one is no other's.
            self._steps.append(self._step_peaks(self._before_optimizer, self._allocated()))
            self.torch.cuda.reset_peak_memory_stats()
        self._step_batches, self._before_optimizer = [], None

    def _step_peaks(self, before: int | None = None, after: int | None = None) -> tuple:
        cuda = self.torch.cuda
        return (self._step_batches, cuda.max_memory_allocated(), cuda.max_memory_reserved(),
                before, after, self._evaluated)

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self._saving is not None:
            self._saving.__exit__(None, None, None)
            self._saving = None

    def result(self) -> Components:
        shape = self.measured.shape() if self.measured is not None else BatchShape(None)
        measured = Components(weights=self.weights, activations=self.activations,
                              gradients=self.gradients, optimizer_states=self.optimizer_states,
                              steps_measured=MEASURED_STEPS, micro_batch=self.micro_batch,
                              padded_to=shape.padded_to, sequence_lengths=shape.lengths)
        if not self.use_cuda:
            return measured
        # A step that had not reached its optimizer step (training ended within it) counts too.
        unfinished = [self._step_peaks(self._before_optimizer)] \
            if self._step_batches or not self._steps else []
        steps = alike_steps([StepPeaks(tuple(seen.shape() for seen in batches), *peaks)
                             for batches, *peaks in self._steps + unfinished],
                            shape if self.measured is not None else None)
        peak_allocated = max(step.allocated for step in steps)
        peak_reserved = max(step.reserved for step in steps)
        moments = dict(self.moments)
        for moment, field in ((Moment.END_OF_BACKWARD, "before_optimizer"),
                              (Moment.AFTER_OPTIMIZER_STEP, "after_optimizer")):
            found = [getattr(step, field) for step in steps if getattr(step, field) is not None]
            if found:
                moments[moment] = max(found)
        return replace(measured, allocator_cache=peak_reserved - peak_allocated,
                       peak_allocated=peak_allocated, peak_reserved=peak_reserved,
                       moments={moment.value: held for moment, held in moments.items()})
