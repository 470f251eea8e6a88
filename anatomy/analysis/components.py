"""Measured memory components of a training run: where the training phase's memory goes.

The worker's probe (anatomy/engine/probe.py) reads tensor sizes and the caching allocator over the
first steps, at the moments that matter:

- weights: bytes of the parameters;
- gradients: bytes of the `.grad` tensors just before the first optimizer step;
- optimizer_states: bytes of the optimizer's state tensors just after it;
- activations: memory held between the end of the forward pass and the start of the backward
  pass (the allocator's growth over the forward pass on a GPU; on a CPU, where torch keeps no
  allocator statistics, the unique storages autograd saved for the backward pass and still holds
  at the end of the forward pass), of the latest full micro-batch (an epoch's last may hold
  fewer samples: `micro_batch` says which the run had, `partial_micro_batch` where none was full);
- temporary: what the allocator's peak holds beyond the components that can be alive together
  (`rest_of_peak`: workspaces, the optimizer's scratch, transient buffers of the backward pass);
- allocator_cache: memory the caching allocator reserved but did not hand out at its peak;
- peak_allocated / peak_reserved: the allocator's own peaks.

The CUDA context and the non-PyTorch rest come from the NVML samples (`with_nvml`).
Importing this module imports no torch: the CLI and the pages read stored components.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from anatomy.analysis.lengths import TextBatch
from anatomy.store import Components, TrainingData
from anatomy.vocabulary import TENSOR_PARTS, Backend, Part, Phase

__all__ = ["MEASURED_STEPS", "ORDER", "TENSOR_PARTS", "Components", "measured_batch",
           "partial_micro_batch", "rest_of_peak", "with_nvml"]

MEASURED_STEPS = 3  # step 1 creates the optimizer's states; steps 2-3 are the steady state
ORDER = tuple(Part)  # as tables list them


def rest_of_peak(weights: int, optimizer_states: int, activations: int, gradients: int,
                 peak: int) -> int:
    """The peak beyond the components alive at it. Activations and gradients are never all alive
    at once (activations are freed in the backward pass as gradients appear), so the peak holds
    weights + optimizer states + the larger of the two. The same arithmetic serves the measured
    and the predicted side, so the two can be compared."""
    return max(0, peak - (weights + optimizer_states + max(activations, gradients)))


def partial_micro_batch(measured: Components | None, batch_size: int | None) -> int | None:
    """The samples of the micro-batch a run's activations were measured on, where the run never
    had a full one of `batch_size` (its data held fewer samples): a smaller step than the one a
    prediction describes. None where it had one, or did not say (a run stored before)."""
    samples = None if measured is None else measured.micro_batch
    if samples is None or batch_size is None or samples >= batch_size:
        return None
    return samples


def measured_batch(measured: Components | None, data: TrainingData | None) -> TextBatch | None:
    """The micro-batch of a run on a dataset that its activations were measured on, as the
    collator padded it: its samples, the length they were padded to, each sequence's own tokens
    (all of them where it held no padding) and the tokenizer's inputs. A user's training (no
    `data`) whose collator padded the batch the callback measured: that batch, with its
    attention mask (a batch without padding is the dummy data's). None where the run did not say
    (a run stored before the probe read it, the dummy data)."""
    if measured is None or measured.padded_to is None or not measured.micro_batch:
        return None
    if data is None:
        if not measured.sequence_lengths:
            return None
        return TextBatch(tuple(sorted(measured.sequence_lengths, reverse=True)),
                         measured.padded_to, ("attention_mask",), "right")
    lengths = measured.sequence_lengths or (measured.padded_to,) * measured.micro_batch
    inputs = data.inputs if data.inputs is not None else ("attention_mask",)
    return TextBatch(tuple(sorted(lengths, reverse=True)), measured.padded_to, inputs,
                     data.padding_side or "right")


def with_nvml(measured: Components, memory: Mapping[str, int | None], peak: int | None,
              backend: Backend) -> Components:
    """The measured components completed with what only the samples know: the CUDA context
    (kernel phase − baseline) and, at the training phase's peak, what PyTorch's allocator does
    not hold (lazily loaded kernels, library workspaces outside the allocator). `memory` is the
    memory at the end of each phase, by name."""
    out = measured
    if out.peak_allocated is not None:  # computed when read: every stored run uses today's rule
        out = replace(out, temporary=rest_of_peak(
            out.weights or 0, out.optimizer_states or 0, out.activations or 0, out.gradients or 0,
            out.peak_allocated))
    kernel, baseline = memory.get(Phase.KERNEL), memory.get(Phase.BASELINE)
    if backend == Backend.NVML and kernel is not None and baseline is not None:
        out = replace(out, context=kernel - baseline)
        if peak is not None and out.peak_reserved is not None:
            out = replace(out, non_torch=max(0, peak - kernel - out.peak_reserved))
    if peak is not None and baseline is not None:
        out = replace(out, peak=peak - baseline)
    return out
