"""The component probe: over the first steps of training it reads tensor sizes and the caching
allocator at the moments that matter (anatomy/analysis/components.py names the components).

It runs inside the training process and imports torch when it is built.
"""

from __future__ import annotations

import weakref
from dataclasses import replace

from anatomy.analysis.components import MEASURED_STEPS, Components
from anatomy.vocabulary import Moment

__all__ = ["MEASURED_STEPS", "ComponentProbe", "optimizer_state_bytes"]


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
        self._samples: int | None = None  # the current forward pass's
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
            return
        self._samples = _samples(args, kwargs)
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
        kept = self._kept(self._samples)
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
            self.activations, self.micro_batch = held, self._samples

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
            self.moments[Moment.END_OF_BACKWARD] = max(
                self.moments.get(Moment.END_OF_BACKWARD, 0), self._allocated())

    def after_optimizer_step(self, optimizer) -> None:
        if optimizer is not None:
            self.optimizer_states = optimizer_state_bytes(optimizer)
        if self.use_cuda:
            self.moments[Moment.AFTER_OPTIMIZER_STEP] = max(
                self.moments.get(Moment.AFTER_OPTIMIZER_STEP, 0), self._allocated())

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self._saving is not None:
            self._saving.__exit__(None, None, None)
            self._saving = None

    def result(self) -> Components:
        measured = Components(weights=self.weights, activations=self.activations,
                              gradients=self.gradients, optimizer_states=self.optimizer_states,
                              steps_measured=MEASURED_STEPS, micro_batch=self.micro_batch)
        if not self.use_cuda:
            return measured
        cuda = self.torch.cuda
        peak_allocated, peak_reserved = cuda.max_memory_allocated(), cuda.max_memory_reserved()
        return replace(measured, allocator_cache=peak_reserved - peak_allocated,
                       peak_allocated=peak_allocated, peak_reserved=peak_reserved,
                       moments={moment.value: held for moment, held in self.moments.items()})
